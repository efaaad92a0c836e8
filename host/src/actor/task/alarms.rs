//! Due alarms: the alarm turn, counting attempts after a crash, retries
//! with back-off, giving an occurrence up, and moving a periodic alarm on.

use std::sync::Arc;

use super::super::TurnError;
use super::{ALARM_RETRY_MS, ActorTask, CommitExtras, SUSPECT_WAIT_MS, throttled};
use crate::alarms::scheduler::{AlarmTicket, DueAlarm};
use crate::clock::now_ms;
use crate::sandbox::{Alarm, FinishedTurn, InputAnswer, TurnInput};
use crate::storage::schema::{AlarmRecord, InputStatus};

impl ActorTask {
    /// Run a due alarm's turn. Its commit deletes a one-shot alarm or moves
    /// a periodic one to its next occurrence, in the same transaction as the
    /// handler's effects; a failed attempt is retried with back-off and,
    /// after the last, given up with an `alarm_failed` event. The ticket
    /// (and its scheduler permit) is held until that commit is durable.
    pub(super) async fn on_alarm(&mut self, d: DueAlarm) {
        let DueAlarm {
            name,
            due_ms,
            mut ticket,
        } = d;
        if self.env.registry.is_stopping() {
            // The node is stopping: the alarm fires after the next start,
            // rather than start a turn the stop may cut (alarms kept
            // starting turns, and a stop lasted its whole 5 s, cutting the
            // last one: a re-probe).
            ticket.retry_later(ALARM_RETRY_MS);
            return;
        }
        match self.ready(false).await {
            Ok(()) => {}
            // Deleted with its alarms, or its type is gone: nothing to run.
            Err(TurnError::NotFound | TurnError::UnknownType(_)) => {
                ticket.settle();
                return;
            }
            Err(e) => {
                if let Some(held_back) = throttled::ALARM_NOT_NOW.admit() {
                    tracing::warn!(actor = %self.key, alarm = %name, error = %e, held_back, "alarm cannot run now; will retry");
                }
                ticket.retry_later(ALARM_RETRY_MS);
                return;
            }
        }
        let alarm = match self.current_alarm(&name) {
            Ok(a) => a,
            Err(e) => {
                if let Some(held_back) = throttled::ALARM_UNREADABLE.admit() {
                    tracing::warn!(actor = %self.key, alarm = %name, error = %e, held_back, "cannot read the alarm; will retry");
                }
                ticket.retry_later(ALARM_RETRY_MS);
                return;
            }
        };
        let now = now_ms();
        // Cancelled, or moved to later since the scheduler saw it (the
        // commit that moved it told the scheduler the new time).
        let Some(mut rec) = alarm.filter(|r| r.next_due_ms <= now) else {
            ticket.settle();
            return;
        };
        let mut due = rec.next_due_ms;
        if due != due_ms {
            tracing::debug!(actor = %self.key, alarm = %name, "alarm moved earlier; firing at its current time");
        }
        // The platform's own alarm that expires an input request: moot if
        // the request was answered meanwhile.
        let expiring = match crate::alarms::expiring_input(&name) {
            None => None,
            Some(id) => match self.pending_input(id).await {
                Ok(input) => Some((id.to_owned(), input)),
                Err(_) => {
                    let extras = CommitExtras {
                        bookkeeping: true,
                        alarm: Some((name, None)),
                        ..Default::default()
                    };
                    self.submit_alarm(self.unchanged(), extras, ticket);
                    return;
                }
            },
        };
        // Due before this node started: its turn may be what brought the
        // node down. Count the attempt durably before running it again.
        let counted = self.env.boot.after_crash && due < self.env.boot.at_ms;
        let Ok(_alone) = self.alone(counted && rec.boot_attempts > 0) else {
            ticket.retry_later(SUSPECT_WAIT_MS);
            return;
        };
        if counted {
            let max = self.env.config.recovery.max_attempts;
            if rec.boot_attempts >= max {
                let error = format!(
                    "the turn was started {} times after crashes and never finished",
                    rec.boot_attempts
                );
                self.env.metrics.turns_failed_recovery.inc();
                tracing::error!(actor = %self.key, alarm = %name, attempts = rec.boot_attempts,
                    "alarm keeps crashing the node; giving up this occurrence");
                let mut extras = self.give_up_alarm(&name, &rec, due, "recovery_exhausted", &error);
                if let Some((id, input)) = expiring {
                    self.settle_input(
                        &mut extras,
                        &id,
                        input,
                        InputStatus::Expired { at_ms: now_ms() },
                    );
                }
                self.submit_alarm(self.unchanged(), extras, ticket);
                return;
            }
            rec.boot_attempts += 1;
            let counted = self
                .submit_and_wait(CommitExtras {
                    bookkeeping: true,
                    alarm: Some((name.clone(), Some(rec.clone()))),
                    ..Default::default()
                })
                .await;
            if counted.is_err() {
                // Not counted, so not run.
                ticket.retry_later(ALARM_RETRY_MS);
                return;
            }
        }
        self.env
            .metrics
            .alarm_lag_seconds
            .observe(now.saturating_sub(due) as f64 / 1000.0);
        let before_upgrade = self.record().version;
        if let Err(e) = self.ensure_version().await {
            tracing::warn!(actor = %self.key, alarm = %name, error = %e, "alarm waits for the upgrade");
            if counted {
                self.uncount_alarm(&name, &rec).await;
            }
            ticket.retry_later(if super::not_started(&e) {
                ALARM_RETRY_MS
            } else {
                5_000
            });
            return;
        }
        // The upgrade's own turn (`on-upgrade`, an agent's new schedules)
        // may have cancelled, moved or replaced this alarm: it fires as that
        // turn left it. (It fired as read before, and its commit wrote the
        // old record back: a cancelled periodic alarm came back for good.)
        if self.record().version != before_upgrade {
            match self.current_alarm(&name) {
                Ok(Some(r)) if r.next_due_ms <= now_ms() => {
                    due = r.next_due_ms;
                    rec = r;
                }
                Ok(_) => {
                    ticket.settle();
                    return;
                }
                Err(e) => {
                    if let Some(held_back) = throttled::ALARM_UNREADABLE.admit() {
                        tracing::warn!(actor = %self.key, alarm = %name, error = %e, held_back, "cannot read the alarm; will retry");
                    }
                    ticket.retry_later(ALARM_RETRY_MS);
                    return;
                }
            }
        }
        let (kind, turn_id, input) = match &expiring {
            Some((id, input)) => (
                "input",
                format!("input-expired:{id}"),
                TurnInput::Input(InputAnswer {
                    id: id.clone(),
                    kind: input.kind.clone(),
                    response: Vec::new(),
                    expired: true,
                }),
            ),
            None => (
                "alarm",
                // The setting too: the same alarm set again for the same
                // time is another occurrence (its calls are new calls).
                format!("alarm:{name}:{due}:{}", rec.set_at_ms),
                TurnInput::Alarm(Alarm {
                    name: name.clone(),
                    payload: rec.payload.clone(),
                    due_at: due,
                }),
            ),
        };
        let version = self.record().version;
        let result = self
            .run_turn(kind, version, turn_id, input, Arc::from([]))
            .await;
        ticket.ran();
        let max_attempts = self.env.config.alarms.max_attempts.max(1);
        let (finished, extras) = match result {
            Ok((_, finished)) => {
                let next = self.after_firing(&name, &rec, due);
                let mut extras = CommitExtras {
                    alarm: Some((name, next)),
                    ..Default::default()
                };
                if let Some((id, input)) = expiring {
                    self.settle_input(
                        &mut extras,
                        &id,
                        input,
                        InputStatus::Expired { at_ms: now_ms() },
                    );
                }
                (finished, extras)
            }
            Err(e) if super::not_started(&e) => {
                if counted {
                    self.uncount_alarm(&name, &rec).await;
                }
                ticket.retry_later(ALARM_RETRY_MS);
                return;
            }
            Err(e) if rec.attempts + 1 < max_attempts => {
                rec.attempts += 1;
                let base = self.env.config.alarms.retry_base_ms;
                let delay = crate::alarms::retry_delay_ms(base, rec.attempts);
                rec.next_due_ms = now_ms() + delay;
                tracing::info!(actor = %self.key, alarm = %name, attempt = rec.attempts,
                    retry_in_ms = delay, error = %e, "alarm turn failed; will retry");
                let extras = CommitExtras {
                    bookkeeping: true,
                    alarm: Some((name, Some(rec))),
                    ..Default::default()
                };
                (self.unchanged(), extras)
            }
            Err(e) => {
                rec.attempts += 1;
                self.env.metrics.alarms_failed.inc();
                tracing::warn!(actor = %self.key, alarm = %name, attempts = rec.attempts,
                    error = %e, "alarm given up after its last attempt");
                let mut extras = self.give_up_alarm(&name, &rec, due, e.code(), &e.to_string());
                if let Some((id, input)) = expiring {
                    // Given up, but no longer waiting either.
                    self.settle_input(
                        &mut extras,
                        &id,
                        input,
                        InputStatus::Expired { at_ms: now_ms() },
                    );
                }
                (self.unchanged(), extras)
            }
        };
        self.submit_alarm(finished, extras, ticket);
    }

    /// Take back the attempt counted for a boot-due alarm whose turn did
    /// not start after all (no sandbox free, no guest memory, storage): it
    /// cannot have crashed anything. Counted, one `kill -9` while the pool
    /// was busy gave up alarms that never ran (found by a probe).
    async fn uncount_alarm(&mut self, name: &str, rec: &AlarmRecord) {
        let mut rec = rec.clone();
        rec.boot_attempts = rec.boot_attempts.saturating_sub(1);
        let _ = self
            .submit_and_wait(CommitExtras {
                bookkeeping: true,
                alarm: Some((name.to_owned(), Some(rec))),
                ..Default::default()
            })
            .await;
    }

    /// Commit an alarm's outcome; the ticket is settled once it is durable
    /// and otherwise asks for the alarm again.
    pub(super) fn submit_alarm(
        &mut self,
        finished: FinishedTurn,
        extras: CommitExtras,
        mut ticket: AlarmTicket,
    ) {
        self.submit(
            finished,
            extras,
            Box::new(move |r| match r {
                Ok(()) => ticket.settle(),
                Err(_) => ticket.retry_later(ALARM_RETRY_MS),
            }),
        );
    }

    /// Give up an alarm's current occurrence: a visible `alarm_failed`
    /// event, and the alarm removed (one-shot) or moved on (periodic).
    fn give_up_alarm(
        &self,
        name: &str,
        rec: &AlarmRecord,
        due: u64,
        code: &str,
        error: &str,
    ) -> CommitExtras {
        let mut data = serde_json::json!({
            "due_at": due,
            "attempts": rec.attempts + rec.boot_attempts,
            "error": { "code": code, "message": error },
        });
        // The platform's own alarm is named by what it is for: its name
        // (NUL-prefixed, never shown to guests) reached the event log.
        match crate::alarms::expiring_input(name) {
            Some(input) => data["input_expiry"] = input.into(),
            None if crate::alarms::is_internal(name) => data["alarm"] = serde_json::Value::Null,
            None => data["alarm"] = name.into(),
        }
        CommitExtras {
            bookkeeping: true,
            alarm: Some((name.to_owned(), self.after_firing(name, rec, due))),
            events: vec![(
                "alarm_failed".to_owned(),
                serde_json::to_vec(&data).expect("json"),
            )],
            ..Default::default()
        }
    }

    /// Alarm `name` as the actor sees it now, including commits in flight.
    fn current_alarm(&mut self, name: &str) -> Result<Option<AlarmRecord>, TurnError> {
        let num = self.record().num;
        let storage = &self.env.storage;
        Ok(self.carry.alarm(name, || storage.reader()?.alarms(num))?)
    }

    /// What becomes of an alarm after the occurrence due at `due` is over:
    /// gone if it was one-shot, else moved to its next occurrence after now.
    fn after_firing(&self, name: &str, rec: &AlarmRecord, due: u64) -> Option<AlarmRecord> {
        match crate::alarms::next_after_firing(&rec.schedule, due, now_ms()) {
            Ok(Some(next)) => Some(AlarmRecord {
                next_due_ms: next,
                attempts: 0,
                boot_attempts: 0,
                ..rec.clone()
            }),
            Ok(None) => None,
            Err(e) => {
                // Only a schedule that has run out (a cron with a year
                // field in the past) gets here; validated when set.
                tracing::warn!(actor = %self.key, alarm = %name, error = %e, "periodic alarm has no next occurrence; removed");
                None
            }
        }
    }
}
