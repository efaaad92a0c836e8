//! `marmot:actor/log`: structured guest logs, tagged with the actor.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;

use super::Cap;
use crate::metrics::ReasonLabels;
use crate::sandbox::bindings::marmot::actor::log::{self, Level};
use crate::sandbox::host::Host;

/// Limits of the log capability.
#[derive(Debug, Clone)]
pub struct LogLimits {
    /// Log lines one turn may write.
    pub max_lines: u32,
    /// Longest log line kept.
    pub max_line_bytes: usize,
    /// What each type may write across its turns.
    pub budget: Arc<LogBudget>,
}

/// Guest log bytes each type may write per second, across all its actors
/// and turns (a token bucket per type). The per-turn cap alone let a
/// type write its 1,000 lines of 8 KiB in every turn, thousands of turns
/// a second: model-written code could fill the node's disk with logs.
/// Lines past the budget are dropped, counted
/// (`guest_log_lines_dropped{reason="rate"}`) and reported in one line per
/// type at most every [`LogBudget::REPORT_EVERY`]; so are turns that hit
/// their own line or output cap (`reason="turn_limit"`, counted per line).
#[derive(Debug)]
pub struct LogBudget {
    bytes_per_s: f64,
    burst: f64,
    types: Mutex<HashMap<String, Bucket>>,
    over_rate: Counter,
    over_turn_limit: Counter,
}

#[derive(Debug)]
struct Bucket {
    tokens: f64,
    at: Instant,
    /// Since the last report: lines dropped over the rate, turns that hit
    /// their own cap; and when that was.
    dropped: (u64, u64),
    reported: Option<Instant>,
}

impl LogBudget {
    /// How long a burst may be: this many seconds' worth of the rate.
    const BURST_S: f64 = 16.0;
    /// A line costs at least this (a record's fields and framing).
    const MIN_LINE: usize = 128;
    /// Reports of dropped lines, per type, at most this often.
    pub const REPORT_EVERY: Duration = Duration::from_secs(10);
    /// Types remembered at most (a bucket that is full again is forgotten).
    const MAX_TYPES: usize = 4096;

    /// `bytes_per_s` per type; drops are counted in `dropped`.
    pub fn new(bytes_per_s: u64, dropped: Family<ReasonLabels, Counter>) -> Self {
        // One at a time: the guard the first lookup returns would block
        // the second (a new label takes the family's write lock).
        let over_rate = dropped
            .get_or_create(&ReasonLabels { reason: "rate" })
            .clone();
        let over_turn_limit = dropped
            .get_or_create(&ReasonLabels {
                reason: "turn_limit",
            })
            .clone();
        Self {
            bytes_per_s: bytes_per_s as f64,
            burst: bytes_per_s as f64 * Self::BURST_S,
            types: Mutex::default(),
            over_rate,
            over_turn_limit,
        }
    }

    /// Whether a line of `bytes` from a turn of `ty` may be written.
    pub(crate) fn take(&self, ty: &str, bytes: usize) -> bool {
        self.charge(ty, Some(bytes))
    }

    /// A turn of `ty` hit its own cap (lines, printed output) and dropped
    /// `lines`: counted, and reported with the rest — once per turn, not
    /// once per line or as a warning of its own (a flood of its own).
    pub(crate) fn over_turn_limit(&self, ty: &str, lines: u64) {
        self.over_turn_limit.inc_by(lines);
        self.charge(ty, None);
    }

    fn charge(&self, ty: &str, line: Option<usize>) -> bool {
        let now = Instant::now();
        let mut types = self.types.lock().unwrap_or_else(|p| p.into_inner());
        if !types.contains_key(ty) {
            if types.len() >= Self::MAX_TYPES {
                let (rate, burst) = (self.bytes_per_s, self.burst);
                types.retain(|_, b| b.tokens + b.at.elapsed().as_secs_f64() * rate < burst);
            }
            types.insert(
                ty.to_owned(),
                Bucket {
                    tokens: self.burst,
                    at: now,
                    dropped: (0, 0),
                    reported: None,
                },
            );
        }
        let b = types.get_mut(ty).expect("just inserted");
        b.tokens = (b.tokens + (now - b.at).as_secs_f64() * self.bytes_per_s).min(self.burst);
        b.at = now;
        let taken = match line {
            Some(bytes) => {
                let cost = bytes.max(Self::MIN_LINE) as f64;
                let taken = b.tokens >= cost;
                if taken {
                    b.tokens -= cost;
                } else {
                    b.dropped.0 += 1;
                    self.over_rate.inc();
                }
                taken
            }
            None => {
                b.dropped.1 += 1;
                false
            }
        };
        if b.dropped != (0, 0) && b.reported.is_none_or(|at| now - at >= Self::REPORT_EVERY) {
            tracing::warn!(
                actor_type = ty,
                lines_over_rate = b.dropped.0,
                turns_over_their_cap = b.dropped.1,
                budget_bytes_per_s = self.bytes_per_s as u64,
                "guest log output of this type dropped: over the type's bytes per second \
                 (limits.guest_log_bytes_per_s), or over a turn's lines or printed output \
                 (limits.max_log_lines_per_turn, 64 KiB)"
            );
            b.dropped = (0, 0);
            b.reported = Some(now);
        }
        taken
    }
}

/// The log part of a turn: how much it has written.
pub struct LogCtx {
    limits: LogLimits,
    lines: u32,
}

impl LogCtx {
    pub(crate) fn new(limits: LogLimits) -> Self {
        Self { limits, lines: 0 }
    }

    /// Lines the turn dropped past its own cap.
    pub(crate) fn over_cap(&self) -> u64 {
        u64::from(self.lines.saturating_sub(self.limits.max_lines))
    }

    /// The budget the turn's lines are charged to (its printed output's
    /// too).
    pub(crate) fn budget(&self) -> &Arc<LogBudget> {
        &self.limits.budget
    }
}

impl log::Host for Host {
    fn log(
        &mut self,
        level: Level,
        message: String,
        fields: Vec<(String, String)>,
    ) -> wasmtime::Result<()> {
        if let Some(marker) = &self.fault_abort_marker
            && **marker == *message
        {
            // Fault injection for crash tests: die mid-turn like a real crash.
            eprintln!("marmot: fault injection: aborting on guest log marker");
            std::process::abort();
        }
        let turn = self.enter(Cap::Log)?;
        let log = &mut turn.log;
        log.lines += 1;
        if log.lines > log.limits.max_lines {
            // Counted here, charged to the budget once the turn ends.
            return Ok(());
        }
        let size = message.len() + fields.iter().map(|(k, v)| k.len() + v.len()).sum::<usize>();
        if !log
            .limits
            .budget
            .take(turn.key.ty(), size.min(2 * log.limits.max_line_bytes))
        {
            return Ok(());
        }
        let max = log.limits.max_line_bytes;
        let message = truncate(message, max);
        let fields = if fields.is_empty() {
            String::new()
        } else {
            let f: Vec<String> = fields.iter().map(|(k, v)| format!("{k}={v:?}")).collect();
            truncate(f.join(" "), max)
        };
        let actor = &turn.key;
        let version = turn.version;
        match level {
            Level::Trace => {
                tracing::trace!(target: "marmot::guest", %actor, version, %fields, "{message}")
            }
            Level::Debug => {
                tracing::debug!(target: "marmot::guest", %actor, version, %fields, "{message}")
            }
            Level::Info => {
                tracing::info!(target: "marmot::guest", %actor, version, %fields, "{message}")
            }
            Level::Warn => {
                tracing::warn!(target: "marmot::guest", %actor, version, %fields, "{message}")
            }
            Level::Error => {
                tracing::error!(target: "marmot::guest", %actor, version, %fields, "{message}")
            }
        }
        Ok(())
    }
}

/// Cut `s` to at most `max` bytes on a character boundary.
pub(crate) fn truncate(mut s: String, max: usize) -> String {
    if s.len() > max {
        let mut cut = max;
        while !s.is_char_boundary(cut) {
            cut -= 1;
        }
        s.truncate(cut);
        s.push('…');
    }
    s
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn each_type_has_its_own_burst_and_drops_are_counted() {
        let dropped = Family::<ReasonLabels, Counter>::default();
        // 16 s of 1,000 bytes: 125 lines at the least cost of 128 bytes.
        let budget = LogBudget::new(1000, dropped.clone());
        let passed = (0..200).filter(|_| budget.take("a", 10)).count();
        assert!((125..=126).contains(&passed), "{passed}");
        assert!(budget.take("b", 8000), "another type's budget is its own");
        budget.over_turn_limit("a", 7);
        let count = |reason| dropped.get_or_create(&ReasonLabels { reason }).get();
        assert!((74..=75).contains(&count("rate")), "{}", count("rate"));
        assert_eq!(count("turn_limit"), 7);
    }
}
