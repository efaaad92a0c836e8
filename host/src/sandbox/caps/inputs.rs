//! `marmot:actor/inputs`: durable waits for an answer (see
//! [`crate::inputs`]).

use super::super::turn::{ActorDisk, Refusal, TurnState};
use super::Cap;
use crate::clock::now_ms;
use crate::sandbox::bindings::GuestError;
use crate::sandbox::bindings::marmot::actor::inputs::{self, InputRequest};
use crate::sandbox::host::Host;
use crate::storage::StorageError;
use crate::storage::schema::{InputRecord, InputStatus};

/// Limits of the inputs capability.
#[derive(Debug, Clone, Copy)]
pub struct InputLimits {
    /// Input requests one actor may have pending.
    pub max_pending: u64,
}

/// The inputs part of a turn.
pub struct InputsCtx {
    disk: ActorDisk,
    limits: InputLimits,
    /// Pending requests before this turn; `None` until first needed. Kept
    /// between turns.
    pending: Option<u64>,
    /// Requests this turn made.
    created: Vec<(String, InputRecord)>,
    /// Requests pending before this turn that it cancelled, as written.
    cancelled: Vec<(String, InputRecord)>,
}

impl InputsCtx {
    pub(crate) fn new(disk: ActorDisk, limits: InputLimits, pending: Option<u64>) -> Self {
        Self {
            disk,
            limits,
            pending,
            created: Vec::new(),
            cancelled: Vec::new(),
        }
    }

    /// Requests pending before this turn.
    fn pending(&mut self) -> Result<u64, StorageError> {
        match self.pending {
            Some(p) => Ok(p),
            None => {
                let p = self.disk.reader()?.pending_input_count(self.disk.num)?;
                self.pending = Some(p);
                Ok(p)
            }
        }
    }

    /// How many requests and cancellations a rollback to this point keeps.
    pub(crate) fn savepoint(&self) -> (usize, usize) {
        (self.created.len(), self.cancelled.len())
    }

    /// Drop the requests and cancellations made since `sp`.
    pub(crate) fn rollback(&mut self, sp: (usize, usize)) {
        self.created.truncate(sp.0);
        self.cancelled.truncate(sp.1);
    }

    /// The turn succeeded: the pending count after it, and the records it
    /// writes (its requests, and what it cancelled).
    pub(crate) fn finish(self) -> (Option<u64>, Vec<(String, InputRecord)>) {
        let created = self
            .created
            .iter()
            .filter(|(_, r)| r.status == InputStatus::Pending)
            .count() as u64;
        let cancelled = self.cancelled.len() as u64;
        let mut writes = self.created;
        writes.extend(self.cancelled);
        (
            self.pending
                .map(|p| (p + created).saturating_sub(cancelled)),
            writes,
        )
    }

    /// The turn failed: its requests are dropped.
    pub(crate) fn abandon(self) -> Option<u64> {
        self.pending
    }
}

impl TurnState {
    /// Ask for input: a pending request committed with the turn, expired by
    /// one of the platform's alarms if it has a deadline, announced with an
    /// `input_requested` event. Returns its id.
    pub fn input_request(
        &mut self,
        kind: String,
        prompt: String,
        schema: Option<String>,
        expires_in_ms: Option<u64>,
        now_ms: u64,
    ) -> Result<Result<String, Refusal>, StorageError> {
        if let Err(e) =
            crate::inputs::check_request(&kind, &prompt, schema.as_deref(), expires_in_ms)
        {
            return Ok(Err(Refusal::Invalid(e)));
        }
        let pending = self.inputs.pending()?;
        let max = self.inputs.limits.max_pending;
        if pending + self.inputs.created.len() as u64 >= max {
            return Ok(Err(Refusal::Limit(format!(
                "an actor may have at most {max} pending input requests"
            ))));
        }
        let id = crate::inputs::new_id();
        let expires_at_ms = expires_in_ms.map(|ms| now_ms + ms);
        let announce = serde_json::json!({
            "id": id,
            "kind": kind,
            "prompt": prompt,
            "schema": schema.as_deref().and_then(|s| serde_json::from_str::<serde_json::Value>(s).ok()),
            "expires_at_ms": expires_at_ms,
        });
        if let Err(r) = self
            .events
            .emit("input_requested".into(), announce.to_string().into_bytes())
        {
            return Ok(Err(r));
        }
        if let Some(due) = expires_at_ms {
            self.alarms
                .set_internal(crate::alarms::input_expiry_alarm(&id), due, now_ms);
        }
        self.inputs.created.push((
            id.clone(),
            InputRecord {
                kind,
                prompt,
                schema,
                created_at_ms: now_ms,
                expires_at_ms,
                status: InputStatus::Pending,
            },
        ));
        Ok(Ok(id))
    }

    /// Withdraw pending request `id` of this actor (made by an earlier turn
    /// or this one): `cancelled` once the turn commits, with an
    /// `input_cancelled` event, and its expiry alarm gone. (The writer keeps
    /// a settlement that reached disk first: see `writer/tables.rs`.)
    pub fn input_cancel(
        &mut self,
        id: &str,
        now_ms: u64,
    ) -> Result<Result<(), Refusal>, StorageError> {
        let not_pending = || {
            Ok(Err(Refusal::NotFound(format!(
                "no pending input request `{id}` of this actor"
            ))))
        };
        // Found first, changed only once the event is taken: a refused
        // event changes nothing.
        let made_here = self.inputs.created.iter().position(|(i, _)| i == id);
        let record = match made_here {
            Some(i) => self.inputs.created[i].1.clone(),
            None if self.inputs.cancelled.iter().any(|(i, _)| i == id) => return not_pending(),
            None => match self.inputs.disk.reader()?.input(self.inputs.disk.num, id)? {
                Some(r) => r,
                None => return not_pending(),
            },
        };
        if record.status != InputStatus::Pending {
            return not_pending();
        }
        let data = serde_json::json!({ "id": id, "kind": record.kind });
        if let Err(r) = self
            .events
            .emit("input_cancelled".into(), data.to_string().into_bytes())
        {
            return Ok(Err(r));
        }
        if record.expires_at_ms.is_some() {
            self.alarms
                .cancel_internal(crate::alarms::input_expiry_alarm(id));
        }
        let status = InputStatus::Cancelled { at_ms: now_ms };
        match made_here {
            Some(i) => self.inputs.created[i].1.status = status,
            None => self
                .inputs
                .cancelled
                .push((id.to_owned(), InputRecord { status, ..record })),
        }
        Ok(Ok(()))
    }
}

impl inputs::Host for Host {
    fn cancel(&mut self, id: String) -> wasmtime::Result<Result<(), GuestError>> {
        let turn = self.enter(Cap::Inputs)?;
        Ok(turn.input_cancel(&id, now_ms())?.map_err(Into::into))
    }

    fn request(&mut self, req: InputRequest) -> wasmtime::Result<Result<String, GuestError>> {
        let turn = self.enter(Cap::Inputs)?;
        Ok(turn
            .input_request(
                req.kind,
                req.prompt,
                req.schema,
                req.expires_in_ms,
                now_ms(),
            )?
            .map_err(Into::into))
    }
}
