//! Trimming the idle instance: when to ask the sandbox layer to give back
//! the fiber stack pages its store keeps between calls, and for a
//! JavaScript sandbox the snapshot pages its turns copied but left as they
//! found them (see "Trimming idle JavaScript sandboxes" in docs/design.md).

use std::time::{Duration, Instant};

use super::ActorTask;

/// Idle time before the first trim of an activation.
const TRIM_AFTER: Duration = Duration::from_secs(2);
/// The longest the delay grows to.
const TRIM_AFTER_MAX: Duration = Duration::from_secs(300);

/// When the actor's sandbox is next trimmed.
///
/// A trim costs the sandbox's next turn the pages it copies again. That
/// turn now copies them up front (see `sandbox/prefault.rs`), without the
/// page fault and, on a virtual machine, the TLB shootdown each once cost
/// (some 800 µs of CPU per trim and turn after it, measured with `marmot
/// bench http-spread --js --actors 10000`), but the copies remain. An actor
/// that was trimmed and then called again, rather than left to hibernate,
/// was not done: its delay doubles (2 s, 4 s, 8 s, …, 5 min) for the rest
/// of its activation. So an actor called every 10 s is trimmed three times,
/// then not again, and one called and then left alone is trimmed once, 2 s
/// after its turn.
pub(super) struct TrimClock {
    /// A turn ran in the live instance since its last trim.
    pending: bool,
    /// How long the sandbox must be idle before it is trimmed.
    after: Duration,
    /// It was trimmed, and no turn followed yet.
    trimmed: bool,
}

impl TrimClock {
    pub(super) fn new() -> Self {
        Self {
            pending: false,
            after: TRIM_AFTER,
            trimmed: false,
        }
    }

    /// A turn runs in the live instance.
    pub(super) fn turn(&mut self) {
        self.pending = true;
        if std::mem::take(&mut self.trimmed) {
            self.after = (self.after * 2).min(TRIM_AFTER_MAX);
        }
    }

    /// When a trim is due after the actor's last activity, if one is.
    pub(super) fn due(&self, last_activity: Instant) -> Option<Instant> {
        self.pending.then(|| last_activity + self.after)
    }
}

impl ActorTask {
    /// Trim the idle instance if a trim is due.
    pub(super) async fn trim_if_due(&mut self, now: Instant) {
        if self
            .trim_clock
            .due(self.last_activity)
            .is_none_or(|due| now < due)
        {
            return;
        }
        self.trim_clock.pending = false;
        // Idle now, its writes durable: a cache the node cannot afford
        // goes too.
        self.trim_cache();
        let Some(live) = self.live.as_mut() else {
            return;
        };
        let js = live.pre.trims_snapshot_pages();
        let trimmed = match self.env.sandbox.trim(&live.pre, &mut live.inst).await {
            Ok(Some(trimmed)) => trimmed,
            Ok(None) => return,
            Err(e) => {
                tracing::warn!(actor = %self.key, error = %e, "dropping the sandbox");
                self.live = None;
                return;
            }
        };
        self.trim_clock.trimmed = true;
        if js {
            self.env.metrics.js_trims.inc();
            self.env
                .metrics
                .js_trimmed_pages
                .inc_by(trimmed.released as u64);
        }
        self.env
            .metrics
            .trimmed_stack_pages
            .inc_by(trimmed.stack as u64);
        tracing::trace!(
            actor = %self.key,
            private = trimmed.private,
            released = trimmed.released,
            stack = trimmed.stack,
            "trimmed the idle instance"
        );
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_turn_after_a_trim_makes_trims_rarer() {
        let t0 = Instant::now();
        let mut c = TrimClock::new();
        assert_eq!(c.due(t0), None, "nothing ran");
        c.turn();
        assert_eq!(c.due(t0), Some(t0 + TRIM_AFTER));
        // Turns without a trim between them leave the delay as it is.
        c.turn();
        assert_eq!(c.after, TRIM_AFTER);
        // Trimmed, then called again: the delay doubles.
        c.pending = false;
        c.trimmed = true;
        assert_eq!(c.due(t0), None, "nothing ran since the trim");
        c.turn();
        assert_eq!(c.due(t0), Some(t0 + TRIM_AFTER * 2));
        // It never grows past the cap.
        for _ in 0..20 {
            c.trimmed = true;
            c.turn();
        }
        assert_eq!(c.after, TRIM_AFTER_MAX);
    }
}
