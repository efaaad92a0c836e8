//! `marmot:actor/alarms`: durable wake-ups, set and cancelled as part of the
//! turn (see [`crate::alarms`] for when they fire).

use std::collections::BTreeMap;

use super::super::turn::{ActorDisk, Refusal};
use super::Cap;
use crate::clock::now_ms;
use crate::sandbox::bindings::GuestError;
use crate::sandbox::bindings::marmot::actor::alarms::{self, AlarmInfo, Cron, Schedule};
use crate::sandbox::host::Host;
use crate::storage::StorageError;
use crate::storage::schema::{AlarmRecord, AlarmSchedule};

/// Limits of the alarms capability.
#[derive(Debug, Clone, Copy)]
pub struct AlarmLimits {
    /// Alarms one actor may have pending.
    pub max_alarms: usize,
    /// Largest alarm payload.
    pub max_payload_bytes: usize,
}

/// An actor's alarms, once a turn needed them: what is on disk plus the
/// changes of earlier turns of this activation (some maybe still in flight
/// to disk). Kept between turns.
pub type KnownAlarms = Option<BTreeMap<String, AlarmRecord>>;

/// The alarms part of a turn.
pub struct AlarmsCtx {
    disk: ActorDisk,
    limits: AlarmLimits,
    /// Pending alarms before this turn; `None` until first needed.
    known: KnownAlarms,
    /// This turn's sets (`Some`) and cancels (`None`).
    writes: BTreeMap<String, Option<AlarmRecord>>,
}

impl AlarmsCtx {
    pub(crate) fn new(disk: ActorDisk, limits: AlarmLimits, known: KnownAlarms) -> Self {
        Self {
            disk,
            limits,
            known,
            writes: BTreeMap::new(),
        }
    }

    /// The actor's pending alarms as this turn sees them.
    fn view(&mut self) -> Result<BTreeMap<String, AlarmRecord>, StorageError> {
        if self.known.is_none() {
            let on_disk = self.disk.reader()?.alarms(self.disk.num)?;
            self.known = Some(on_disk.into_iter().collect());
        }
        let mut view = self.known.clone().unwrap_or_default();
        for (name, rec) in &self.writes {
            match rec {
                Some(r) => {
                    view.insert(name.clone(), r.clone());
                }
                None => {
                    view.remove(name);
                }
            }
        }
        Ok(view)
    }

    /// Set (or replace) alarm `name`.
    pub fn set(
        &mut self,
        name: String,
        schedule: AlarmSchedule,
        payload: Vec<u8>,
        now_ms: u64,
    ) -> Result<Result<(), Refusal>, StorageError> {
        if let Err(e) = crate::alarms::check_name(&name) {
            return Ok(Err(Refusal::Invalid(e.to_string())));
        }
        if payload.len() > self.limits.max_payload_bytes {
            return Ok(Err(Refusal::Limit(format!(
                "alarm payload of {} bytes exceeds the limit of {} bytes",
                payload.len(),
                self.limits.max_payload_bytes
            ))));
        }
        let due = match crate::alarms::first_due(&schedule, now_ms) {
            Ok(d) => d,
            Err(e) => return Ok(Err(Refusal::Invalid(e.to_string()))),
        };
        let view = self.view()?;
        let user_alarms = view
            .keys()
            .filter(|n| !crate::alarms::is_internal(n))
            .count();
        if !view.contains_key(&name) && user_alarms >= self.limits.max_alarms {
            return Ok(Err(Refusal::Limit(format!(
                "an actor may have at most {} pending alarms",
                self.limits.max_alarms
            ))));
        }
        let rec = AlarmRecord {
            schedule,
            payload,
            next_due_ms: due,
            attempts: 0,
            boot_attempts: 0,
            set_at_ms: now_ms,
        };
        self.writes.insert(name, Some(rec));
        Ok(Ok(()))
    }

    /// Set one of the platform's own alarms (an input expiry) at `due_ms`;
    /// these are not counted against the actor's limit.
    pub(crate) fn set_internal(&mut self, name: String, due_ms: u64, now_ms: u64) {
        debug_assert!(crate::alarms::is_internal(&name));
        self.writes.insert(
            name,
            Some(AlarmRecord {
                schedule: AlarmSchedule::At(due_ms),
                payload: Vec::new(),
                next_due_ms: due_ms,
                attempts: 0,
                boot_attempts: 0,
                set_at_ms: now_ms,
            }),
        );
    }

    /// Remove one of the platform's own alarms (an input's expiry).
    pub(crate) fn cancel_internal(&mut self, name: String) {
        debug_assert!(crate::alarms::is_internal(&name));
        self.writes.insert(name, None);
    }

    /// Cancel alarm `name`; whether it was pending.
    pub fn cancel(&mut self, name: &str) -> Result<bool, StorageError> {
        if crate::alarms::is_internal(name) {
            return Ok(false);
        }
        let existed = self.view()?.contains_key(name);
        if existed {
            self.writes.insert(name.to_owned(), None);
        }
        Ok(existed)
    }

    /// Pending alarms, by name (the platform's own are not shown).
    pub fn list(&mut self) -> Result<Vec<(String, AlarmRecord)>, StorageError> {
        Ok(self
            .view()?
            .into_iter()
            .filter(|(n, _)| !crate::alarms::is_internal(n))
            .collect())
    }

    /// This turn's changes so far, for a rollback.
    pub(crate) fn savepoint(&self) -> BTreeMap<String, Option<AlarmRecord>> {
        self.writes.clone()
    }

    /// Undo the changes since `sp`.
    pub(crate) fn rollback(&mut self, sp: BTreeMap<String, Option<AlarmRecord>>) {
        self.writes = sp;
    }

    /// The turn succeeded: its changes join what is known, and are returned
    /// to commit.
    pub(crate) fn finish(mut self) -> (KnownAlarms, Vec<(String, Option<AlarmRecord>)>) {
        let writes: Vec<(String, Option<AlarmRecord>)> =
            std::mem::take(&mut self.writes).into_iter().collect();
        if let Some(known) = &mut self.known {
            for (name, rec) in &writes {
                match rec {
                    Some(r) => known.insert(name.clone(), r.clone()),
                    None => known.remove(name),
                };
            }
        }
        (self.known, writes)
    }

    /// The turn failed: its changes are dropped.
    pub(crate) fn abandon(self) -> KnownAlarms {
        self.known
    }
}

impl From<Schedule> for AlarmSchedule {
    fn from(s: Schedule) -> Self {
        match s {
            Schedule::At(t) => AlarmSchedule::At(t),
            Schedule::After(d) => AlarmSchedule::After(d),
            Schedule::Cron(Cron { expr, tz }) => AlarmSchedule::Cron { expr, tz },
        }
    }
}

impl From<AlarmSchedule> for Schedule {
    fn from(s: AlarmSchedule) -> Self {
        match s {
            AlarmSchedule::At(t) => Schedule::At(t),
            AlarmSchedule::After(d) => Schedule::After(d),
            AlarmSchedule::Cron { expr, tz } => Schedule::Cron(Cron { expr, tz }),
        }
    }
}

impl alarms::Host for Host {
    fn set(
        &mut self,
        name: String,
        schedule: Schedule,
        payload: Vec<u8>,
    ) -> wasmtime::Result<Result<(), GuestError>> {
        let turn = self.enter(Cap::Alarms)?;
        Ok(turn
            .alarms
            .set(name, schedule.into(), payload, now_ms())?
            .map_err(Into::into))
    }

    fn cancel(&mut self, name: String) -> wasmtime::Result<Result<bool, GuestError>> {
        let turn = self.enter(Cap::Alarms)?;
        Ok(Ok(turn.alarms.cancel(&name)?))
    }

    fn list(&mut self) -> wasmtime::Result<Result<Vec<AlarmInfo>, GuestError>> {
        let turn = self.enter(Cap::Alarms)?;
        Ok(Ok(turn
            .alarms
            .list()?
            .into_iter()
            .map(|(name, rec)| AlarmInfo {
                name,
                schedule: rec.schedule.into(),
                next_due: rec.next_due_ms,
                payload: rec.payload,
            })
            .collect()))
    }
}
