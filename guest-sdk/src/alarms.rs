//! Durable wake-ups.
//!
//! An alarm is set or cancelled as part of the turn: it exists only if the
//! turn commits. When it is due (never before) the actor's
//! [`on_alarm`](crate::Actor::on_alarm) runs with its payload. Setting an
//! alarm with a name already in use replaces it, so an actor can re-arm its
//! alarm on every turn without piling up wake-ups.
//!
//! ```no_run
//! use marmot_guest::alarms::{self, Schedule};
//!
//! # fn f() -> marmot_guest::Result<()> {
//! alarms::set("reminder", Schedule::After(60_000), &serde_json::json!({ "n": 1 }))?;
//! alarms::set("digest", Schedule::cron_in("0 9 * * 1-5", "Europe/Berlin"), &())?;
//! # Ok(()) }
//! ```

use serde::Serialize;

use crate::Result;
use crate::bindings::marmot::actor::alarms as host;

/// When an alarm fires.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Schedule {
    /// Once, at this time (milliseconds since the Unix epoch).
    At(u64),
    /// Once, this many milliseconds from now.
    After(u64),
    /// Periodically, on a cron pattern (5 fields, or 6 with seconds first;
    /// `@hourly` and friends work) in an IANA time zone, UTC when `None`.
    Cron {
        /// The pattern.
        expr: String,
        /// The time zone.
        tz: Option<String>,
    },
}

impl Schedule {
    /// A cron schedule in UTC.
    pub fn cron(expr: impl Into<String>) -> Self {
        Self::Cron {
            expr: expr.into(),
            tz: None,
        }
    }

    /// A cron schedule in a time zone such as `Europe/Berlin`.
    pub fn cron_in(expr: impl Into<String>, tz: impl Into<String>) -> Self {
        Self::Cron {
            expr: expr.into(),
            tz: Some(tz.into()),
        }
    }
}

impl From<Schedule> for host::Schedule {
    fn from(s: Schedule) -> Self {
        match s {
            Schedule::At(t) => host::Schedule::At(t),
            Schedule::After(d) => host::Schedule::After(d),
            Schedule::Cron { expr, tz } => host::Schedule::Cron(host::Cron { expr, tz }),
        }
    }
}

impl From<host::Schedule> for Schedule {
    fn from(s: host::Schedule) -> Self {
        match s {
            host::Schedule::At(t) => Schedule::At(t),
            host::Schedule::After(d) => Schedule::After(d),
            host::Schedule::Cron(c) => Schedule::Cron {
                expr: c.expr,
                tz: c.tz,
            },
        }
    }
}

/// A pending alarm.
#[derive(Debug, Clone)]
pub struct AlarmInfo {
    /// Its name.
    pub name: String,
    /// When it fires.
    pub schedule: Schedule,
    /// When it is next due (milliseconds since the Unix epoch).
    pub next_due: u64,
    /// The payload it was set with.
    pub payload: Vec<u8>,
}

/// Set (or replace) the alarm `name`, with `payload` serialized as JSON.
/// A bad cron pattern or time zone is an error here, not at firing time.
pub fn set<T: Serialize + ?Sized>(name: &str, schedule: Schedule, payload: &T) -> Result<()> {
    let bytes = serde_json::to_vec(payload)?;
    set_raw(name, schedule, &bytes)
}

/// Set (or replace) the alarm `name` with a payload of raw bytes.
pub fn set_raw(name: &str, schedule: Schedule, payload: &[u8]) -> Result<()> {
    Ok(host::set(name, &schedule.into(), payload)?)
}

/// Cancel the alarm `name`; whether it was pending.
pub fn cancel(name: &str) -> Result<bool> {
    Ok(host::cancel(name)?)
}

/// The actor's pending alarms, by name.
pub fn list() -> Result<Vec<AlarmInfo>> {
    Ok(host::list()?
        .into_iter()
        .map(|a| AlarmInfo {
            name: a.name,
            schedule: a.schedule.into(),
            next_due: a.next_due,
            payload: a.payload,
        })
        .collect())
}
