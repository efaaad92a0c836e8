//! Durable alarms: schedules, cron, and when an alarm is next due.
//!
//! An alarm is a row written in the turn's transaction (so setting one is as
//! atomic as a state write) plus an entry in a due index. The
//! [`scheduler`] keeps only alarms due soon in memory and delivers each to
//! its actor when due, never early. The alarm turn's commit deletes a
//! one-shot alarm or advances a periodic one in the same transaction as the
//! handler's effects, so a crash between firing and committing re-runs the
//! turn (at least once) but its effect lands once.
//!
//! Periodic alarms advance from *now*, not from the missed due time: after
//! downtime a cron alarm fires once, then continues on schedule, and a
//! handler slower than its period never overlaps itself.

pub mod scheduler;

use std::str::FromStr;

use chrono::{TimeZone, Utc};
use croner::Cron;
use croner::parser::{CronParser, Seconds};

use crate::storage::schema::AlarmSchedule;

/// Longest alarm name, in bytes.
pub const MAX_ALARM_NAME: usize = 128;

/// The platform's own alarm that expires an input request (internal alarm
/// names start with NUL; see [`is_internal`]).
const INPUT_EXPIRY: &str = "\0input:";

/// Whether `name` is one of the platform's own alarms.
pub use crate::storage::schema::is_internal_alarm as is_internal;

/// The alarm that expires input request `id`.
pub fn input_expiry_alarm(id: &str) -> String {
    format!("{INPUT_EXPIRY}{id}")
}

/// The input request an expiry alarm is for.
pub fn expiring_input(name: &str) -> Option<&str> {
    name.strip_prefix(INPUT_EXPIRY)
}

/// Why an alarm cannot be set; shown to the guest.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ScheduleError {
    /// Bad name.
    #[error("alarm name must be 1 to {MAX_ALARM_NAME} bytes without control characters")]
    Name,
    /// Bad cron pattern.
    #[error("invalid cron pattern `{expr}`: {why}")]
    Cron {
        /// The pattern.
        expr: String,
        /// Why.
        why: String,
    },
    /// Unknown time zone.
    #[error("unknown time zone `{0}` (use an IANA name such as Europe/Berlin)")]
    TimeZone(String),
    /// The pattern never matches again.
    #[error("cron pattern `{0}` has no future occurrence")]
    NoOccurrence(String),
    /// Due after the latest instant an alarm may be set for.
    #[error(
        "an alarm may be due at most at {MAX_DUE_MS} ms since the epoch (the latest instant a \
         JavaScript Date holds), not at {0}"
    )]
    TooLate(u64),
}

/// The latest instant an alarm may be due: the latest a JavaScript `Date`
/// holds, which the JavaScript API already enforced. Past it, a Rust guest
/// set alarms the listing showed as numbers JSON clients read wrong
/// (found by a probe: `18446744073709551615`).
pub const MAX_DUE_MS: u64 = 8_640_000_000_000_000;

/// Check an alarm name.
pub fn check_name(name: &str) -> Result<(), ScheduleError> {
    if name.is_empty() || name.len() > MAX_ALARM_NAME || name.chars().any(char::is_control) {
        return Err(ScheduleError::Name);
    }
    Ok(())
}

fn parse_cron(expr: &str) -> Result<Cron, ScheduleError> {
    CronParser::builder()
        .seconds(Seconds::Optional)
        .build()
        .parse(expr)
        .map_err(|e| ScheduleError::Cron {
            expr: expr.to_owned(),
            why: e.to_string(),
        })
}

fn parse_tz(tz: Option<&str>) -> Result<chrono_tz::Tz, ScheduleError> {
    match tz {
        None => Ok(chrono_tz::UTC),
        Some(name) => {
            chrono_tz::Tz::from_str(name).map_err(|_| ScheduleError::TimeZone(name.to_owned()))
        }
    }
}

/// The first occurrence of a cron schedule strictly after `after_ms`,
/// evaluated in its time zone (DST gaps and repeats as croner defines them).
pub fn cron_next(expr: &str, tz: Option<&str>, after_ms: u64) -> Result<u64, ScheduleError> {
    let cron = parse_cron(expr)?;
    let tz = parse_tz(tz)?;
    let start = Utc
        .timestamp_millis_opt(after_ms as i64)
        .single()
        .ok_or_else(|| ScheduleError::NoOccurrence(expr.to_owned()))?
        .with_timezone(&tz);
    let next = cron
        .find_next_occurrence(&start, false)
        .map_err(|_| ScheduleError::NoOccurrence(expr.to_owned()))?;
    Ok(next.timestamp_millis().max(0) as u64)
}

/// When a newly set alarm is first due.
pub fn first_due(schedule: &AlarmSchedule, now_ms: u64) -> Result<u64, ScheduleError> {
    let due = match schedule {
        AlarmSchedule::At(t) => *t,
        AlarmSchedule::After(d) => now_ms.saturating_add(*d),
        AlarmSchedule::Cron { expr, tz } => cron_next(expr, tz.as_deref(), now_ms)?,
    };
    match due {
        due if due > MAX_DUE_MS => Err(ScheduleError::TooLate(due)),
        due => Ok(due),
    }
}

/// When a periodic alarm that fired at `due_ms` is due next: the first
/// occurrence after both its due time and `now_ms`, so missed ticks
/// collapse into the one that just ran. `None` for one-shot alarms.
pub fn next_after_firing(
    schedule: &AlarmSchedule,
    due_ms: u64,
    now_ms: u64,
) -> Result<Option<u64>, ScheduleError> {
    match schedule {
        AlarmSchedule::At(_) | AlarmSchedule::After(_) => Ok(None),
        AlarmSchedule::Cron { expr, tz } => {
            cron_next(expr, tz.as_deref(), due_ms.max(now_ms)).map(Some)
        }
    }
}

/// Delay before retry `attempt` (1-based) of a failed alarm: exponential
/// from `base_ms`, capped at an hour, with ±20 % jitter.
pub fn retry_delay_ms(base_ms: u64, attempt: u32) -> u64 {
    let exp = base_ms.saturating_mul(1u64 << attempt.saturating_sub(1).min(20));
    let capped = exp.min(3_600_000);
    let jitter = (capped / 5).max(1);
    capped - jitter + rand::random_range(0..=2 * jitter)
}

#[cfg(test)]
mod tests {
    use super::*;

    const MIN: u64 = 60_000;

    fn ms(s: &str) -> u64 {
        chrono::DateTime::parse_from_rfc3339(s)
            .unwrap()
            .timestamp_millis() as u64
    }

    #[test]
    fn cron_in_utc_and_time_zones() {
        let t = ms("2026-03-01T10:07:30Z");
        assert_eq!(
            cron_next("*/5 * * * *", None, t).unwrap(),
            ms("2026-03-01T10:10:00Z")
        );
        // 09:00 in Berlin is 08:00 UTC in winter.
        assert_eq!(
            cron_next("0 9 * * *", Some("Europe/Berlin"), t).unwrap(),
            ms("2026-03-02T08:00:00Z")
        );
        // Seconds are optional.
        assert_eq!(
            cron_next("*/10 * * * * *", None, t).unwrap(),
            ms("2026-03-01T10:07:40Z")
        );
        assert_eq!(
            cron_next("@hourly", None, t).unwrap(),
            ms("2026-03-01T11:00:00Z")
        );
    }

    /// An alarm is due at most at the latest instant a JavaScript Date
    /// holds, for every guest (the JavaScript API checked it alone).
    #[test]
    fn alarms_are_due_at_most_at_the_latest_date() {
        let now = ms("2026-03-01T10:07:30Z");
        assert_eq!(
            first_due(&AlarmSchedule::At(MAX_DUE_MS), now),
            Ok(MAX_DUE_MS)
        );
        for late in [
            AlarmSchedule::At(MAX_DUE_MS + 1),
            AlarmSchedule::At(u64::MAX),
            AlarmSchedule::After(u64::MAX),
            AlarmSchedule::After(MAX_DUE_MS),
        ] {
            let e = first_due(&late, now).unwrap_err();
            assert!(matches!(e, ScheduleError::TooLate(_)), "{late:?}: {e}");
        }
        assert_eq!(first_due(&AlarmSchedule::After(MIN), now), Ok(now + MIN));
    }

    #[test]
    fn dst_transitions() {
        // Berlin skips 02:00–03:00 on 2026-03-29: a 02:30 job runs at the
        // next valid time, once, and never twice on the day clocks go back.
        let before_spring = ms("2026-03-29T00:00:00Z");
        let next = cron_next("30 2 * * *", Some("Europe/Berlin"), before_spring).unwrap();
        // 03:00 CEST, the first instant after the gap: that day's run.
        assert_eq!(next, ms("2026-03-29T01:00:00Z"), "the run in the gap");
        let after = cron_next("30 2 * * *", Some("Europe/Berlin"), next).unwrap();
        assert_eq!(after, ms("2026-03-30T00:30:00Z"), "02:30 CEST the next day");
        let before_fall = ms("2026-10-24T00:00:00Z");
        let a = cron_next("30 2 * * *", Some("Europe/Berlin"), before_fall).unwrap();
        let b = cron_next("30 2 * * *", Some("Europe/Berlin"), a).unwrap();
        let c = cron_next("30 2 * * *", Some("Europe/Berlin"), b).unwrap();
        assert_eq!(a, ms("2026-10-24T00:30:00Z"), "02:30 CEST");
        // 02:30 comes twice on the 25th (CEST, then CET): one run.
        assert_eq!(b, ms("2026-10-25T00:30:00Z"), "the first 02:30");
        assert_eq!(c, ms("2026-10-26T01:30:00Z"), "02:30 CET, no double run");
    }

    #[test]
    fn bad_patterns_and_zones_are_errors() {
        assert!(matches!(
            cron_next("61 * * * *", None, 0),
            Err(ScheduleError::Cron { .. })
        ));
        assert!(matches!(
            cron_next("every day", None, 0),
            Err(ScheduleError::Cron { .. })
        ));
        assert!(matches!(
            cron_next("* * * * *", Some("Mars/Olympus"), 0),
            Err(ScheduleError::TimeZone(_))
        ));
        assert!(check_name("").is_err());
        assert!(check_name("a\nb").is_err());
        assert!(check_name(&"x".repeat(129)).is_err());
        assert!(check_name("tick").is_ok());
    }

    #[test]
    fn missed_ticks_collapse() {
        let sched = AlarmSchedule::Cron {
            expr: "* * * * *".into(),
            tz: None,
        };
        let due = ms("2026-01-01T00:00:00Z");
        // The node was down for 1,000 minutes: the next due is after now,
        // not the tick after the one that was missed.
        let now = due + 1000 * MIN + 5_000;
        let next = next_after_firing(&sched, due, now).unwrap().unwrap();
        assert_eq!(next, due + 1001 * MIN);
        assert_eq!(
            next_after_firing(&AlarmSchedule::After(5), due, now).unwrap(),
            None
        );
    }

    #[test]
    fn retries_back_off_with_jitter() {
        for attempt in 1..10 {
            let d = retry_delay_ms(1000, attempt);
            let nominal = (1000u64 << (attempt - 1)).min(3_600_000);
            assert!(
                d >= nominal * 4 / 5 && d <= nominal * 6 / 5 + 1,
                "{attempt}: {d}"
            );
        }
    }
}

/// Cron strings and time zones from guests: an error, never a panic.
#[cfg(test)]
mod props {
    use proptest::prelude::*;

    use super::*;

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(1000))]

        #[test]
        fn arbitrary_cron_strings_and_zones_never_panic(
            expr in prop_oneof![
                ".{0,40}",
                "([0-9*/,?LW#-]{1,6} ){4,6}[0-9A-Z*/,?LW#-]{0,6}",
            ],
            tz in proptest::option::of(prop_oneof![".{0,30}", "(Europe|America|Asia)/[A-Za-z_]{1,12}"]),
            after_ms in any::<u64>(),
            name in ".{0,300}",
        ) {
            if let Ok(next) = cron_next(&expr, tz.as_deref(), after_ms) {
                // A next occurrence is after the start, in the epoch's range.
                prop_assert!(next > after_ms.min(i64::MAX as u64) || after_ms > i64::MAX as u64);
            }
            let _ = check_name(&name);
        }
    }
}
