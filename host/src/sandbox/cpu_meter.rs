//! What a guest is charged for the CPU it burns between host calls (or,
//! for a script, in all).
//!
//! The engine's epoch advances every tick and a running guest stops at the
//! next check ([`CpuMeter::tick`]) to be charged and to yield. Counting a
//! whole tick at each stop charged wall-clock time: on a machine with more
//! runnable threads than cores, a guest whose worker was descheduled for
//! most of a tick paid for all of it, and a turn well within its slice
//! trapped. So a stop charges what the worker thread itself ran since the
//! guest resumed there ([`resumed`], taken as the yield returns), from the
//! thread's CPU clock, never more than a tick; where it cannot tell (the
//! first stretch of a run, or after a host call, which may have moved the
//! guest to another thread), it charges the tick, as before. One read of
//! the clock at each resume and each stop: nothing on runs shorter than a
//! tick.

use std::cell::Cell;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use super::host::LimitTrap;

/// Meters, numbered so that a thread's mark is read only by its own.
static NEXT_ID: AtomicU64 = AtomicU64::new(1);

thread_local! {
    /// The meter whose guest last resumed on this thread, and the thread's
    /// CPU time then (ns).
    static RESUMED: Cell<Option<(u64, u64)>> = const { Cell::new(None) };
}

pub(super) struct CpuMeter {
    id: u64,
    /// CPU charged since the stretch (or the run) began.
    used: Duration,
    /// Allowed per stretch, or in all (`!per_stretch`).
    limit: Duration,
    /// Whether a host call starts the meter again.
    per_stretch: bool,
    /// The engine's epoch tick: the most one stop charges.
    tick: Duration,
}

impl CpuMeter {
    pub(super) fn new(limit: Duration, per_stretch: bool, tick: Duration) -> Self {
        Self {
            id: NEXT_ID.fetch_add(1, Ordering::Relaxed),
            used: Duration::ZERO,
            limit,
            per_stretch,
            tick,
        }
    }

    pub(super) fn id(&self) -> u64 {
        self.id
    }

    /// A run begins: nothing is charged yet.
    pub(super) fn start(&mut self) {
        self.used = Duration::ZERO;
        forget_mark();
    }

    /// A host call ends a stretch of guest CPU: the meter starts again,
    /// unless the limit is the whole run's. The guest may resume on
    /// another thread, so the mark no longer tells.
    pub(super) fn host_call(&mut self) {
        if self.per_stretch {
            self.used = Duration::ZERO;
        }
        forget_mark();
    }

    /// The guest reached an epoch check: charge what it ran since it
    /// resumed, and trap once that is over the limit.
    pub(super) fn tick(&mut self) -> Result<(), LimitTrap> {
        let mark = RESUMED.get().filter(|&(id, _)| id == self.id);
        if mark.is_some() {
            forget_mark();
        }
        let ran = mark
            .and_then(|(_, then)| thread_cpu_ns().map(|now| now.saturating_sub(then)))
            .map_or(self.tick, |ns| Duration::from_nanos(ns).min(self.tick));
        self.used += ran;
        if self.used > self.limit {
            let ms = self.used.as_millis() as u64;
            return Err(if self.per_stretch {
                LimitTrap::Cpu(ms)
            } else {
                LimitTrap::CpuInAll(ms)
            });
        }
        Ok(())
    }
}

/// The guest of meter `id` resumes on this thread (its yield returned).
pub(super) fn resumed(id: u64) {
    RESUMED.set(thread_cpu_ns().map(|now| (id, now)));
}

fn forget_mark() {
    RESUMED.set(None);
}

/// The CPU time this thread has run (`None`: the clock cannot be read).
#[cfg(test)]
pub(crate) fn thread_cpu_time() -> Option<Duration> {
    thread_cpu_ns().map(Duration::from_nanos)
}

/// This thread's CPU time, in ns.
fn thread_cpu_ns() -> Option<u64> {
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: `ts` is a valid timespec to write to; the clock id is a
    // constant every Linux kernel since 2.6.12 knows.
    #[allow(unsafe_code, reason = "reading this thread's CPU clock")]
    let rc = unsafe { libc::clock_gettime(libc::CLOCK_THREAD_CPUTIME_ID, &mut ts) };
    (rc == 0).then(|| ts.tv_sec as u64 * 1_000_000_000 + ts.tv_nsec as u64)
}

#[cfg(test)]
mod tests {
    use super::*;

    const TICK: Duration = Duration::from_millis(10);

    fn spin(d: Duration) {
        let start = thread_cpu_ns().unwrap();
        while thread_cpu_ns().unwrap() - start < d.as_nanos() as u64 {}
    }

    #[test]
    fn a_stop_without_a_mark_charges_a_whole_tick() {
        let mut m = CpuMeter::new(Duration::from_millis(25), true, TICK);
        m.start();
        assert!(m.tick().is_ok());
        assert!(m.tick().is_ok());
        assert!(
            matches!(m.tick(), Err(LimitTrap::Cpu(30))),
            "three unmarked stops are 30 ms, over 25"
        );
    }

    #[test]
    fn a_marked_stop_charges_the_threads_cpu_and_at_most_a_tick() {
        let mut m = CpuMeter::new(Duration::from_secs(1), false, TICK);
        m.start();
        resumed(m.id());
        std::thread::sleep(Duration::from_millis(30));
        m.tick().unwrap();
        assert!(
            m.used < Duration::from_millis(3),
            "time asleep is not CPU: charged {:?}",
            m.used
        );
        resumed(m.id());
        spin(Duration::from_millis(25));
        m.tick().unwrap();
        assert!(
            m.used <= Duration::from_millis(13),
            "capped at a tick: {:?}",
            m.used
        );
        assert!(m.used >= TICK, "{:?}", m.used);
    }

    #[test]
    fn a_mark_is_read_once_and_only_by_its_own_meter() {
        let mut a = CpuMeter::new(Duration::from_secs(1), true, TICK);
        let mut b = CpuMeter::new(Duration::from_secs(1), true, TICK);
        resumed(a.id());
        b.tick().unwrap();
        assert_eq!(b.used, TICK, "another meter's mark is not b's");
        a.tick().unwrap();
        assert!(a.used < Duration::from_millis(3), "a's own: {:?}", a.used);
        a.tick().unwrap();
        assert!(a.used >= TICK, "and read once: {:?}", a.used);
        resumed(a.id());
        a.host_call();
        assert_eq!(a.used, Duration::ZERO, "a host call starts a stretch");
        a.tick().unwrap();
        assert_eq!(a.used, TICK, "and the guest may be on another thread");
    }
}
