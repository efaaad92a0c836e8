//! `marmot:actor/alarms`: durable wake-ups, set and cancelled as part of the
//! turn (see [`crate::alarms`] for when they fire).

use crate::clock::now_ms;
use crate::sandbox::bindings::GuestError;
use crate::sandbox::bindings::marmot::actor::alarms::{self, AlarmInfo, Cron, Schedule};
use crate::sandbox::host::Host;
use crate::storage::schema::AlarmSchedule;

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
        let turn = self.enter()?;
        Ok(turn
            .alarm_set(name, schedule.into(), payload, now_ms())?
            .map_err(Into::into))
    }

    fn cancel(&mut self, name: String) -> wasmtime::Result<Result<bool, GuestError>> {
        let turn = self.enter()?;
        Ok(Ok(turn.alarm_cancel(&name)?))
    }

    fn list(&mut self) -> wasmtime::Result<Result<Vec<AlarmInfo>, GuestError>> {
        let turn = self.enter()?;
        Ok(Ok(turn
            .alarm_list()?
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
