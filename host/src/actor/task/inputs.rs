//! Answers to input requests: checked against the request's schema, run
//! as an `on-input` turn whose commit settles the request once.

use std::sync::Arc;

use super::super::{AnswerDelivery, TurnError};
use super::{ActorTask, CommitExtras};
use crate::clock::now_ms;
use crate::sandbox::{InputAnswer, TurnInput};
use crate::storage::schema::{InputRecord, InputStatus};

impl ActorTask {
    /// Run `on-input` with an answer. The request must still be pending and
    /// the answer must match its schema; the turn's commit marks it answered
    /// (and cancels its expiry) with the handler's effects, so a request is
    /// settled once. A failed turn leaves it pending.
    pub(super) async fn on_answer(&mut self, d: AnswerDelivery) {
        let AnswerDelivery {
            input_id,
            response,
            reply,
        } = d;
        if let Err(e) = self.ready(false).await {
            let _ = reply.send(Err(e));
            return;
        }
        let input = match self.pending_input(&input_id).await {
            Ok(r) => r,
            Err(e) => {
                let _ = reply.send(Err(e));
                return;
            }
        };
        let answer: serde_json::Value = match serde_json::from_slice(&response) {
            Ok(v) => v,
            Err(e) => {
                // (It used to blame the input's schema, which may not exist.)
                let why = if e.to_string().starts_with("recursion limit exceeded") {
                    "the answer nests more than 128 levels deep".to_owned()
                } else {
                    format!("the answer must be JSON: {e}")
                };
                let _ = reply.send(Err(TurnError::InvalidAnswer(why)));
                return;
            }
        };
        if let Err(why) = crate::inputs::validate(input.schema.as_deref(), &answer) {
            let _ = reply.send(Err(TurnError::InvalidAnswer(format!(
                "the answer does not match the input's schema: {why}"
            ))));
            return;
        }
        if let Err(e) = self.ensure_version().await {
            self.release_when_durable(self.submitted_seq, Err(e), reply);
            return;
        }
        let turn_input = TurnInput::Input(InputAnswer {
            id: input_id.clone(),
            kind: input.kind.clone(),
            response: response.clone(),
            expired: false,
        });
        let version = self.record().version;
        let turn_id = format!("input:{input_id}");
        match self
            .run_turn("input", version, turn_id, turn_input, Arc::from([]))
            .await
        {
            Ok((_, finished)) => {
                let mut extras = CommitExtras::default();
                let status = InputStatus::Answered {
                    at_ms: now_ms(),
                    response,
                };
                self.settle_input(&mut extras, &input_id, input, status);
                self.submit(
                    finished,
                    extras,
                    Box::new(move |r| {
                        let _ = reply.send(r.map_err(TurnError::from));
                    }),
                );
            }
            Err(e) => self.release_when_durable(self.submitted_seq, Err(e), reply),
        }
    }

    /// Input request `id`, if it is still pending. Input requests change
    /// only in this actor's commits: once those are durable, disk is current.
    pub(super) async fn pending_input(&mut self, id: &str) -> Result<InputRecord, TurnError> {
        self.shared
            .tracker
            .wait_committed(self.submitted_seq, self.generation)
            .await;
        self.ready(false).await?;
        let num = self.record().num;
        match self.env.storage.reader()?.input(num, id)? {
            None => Err(TurnError::InputNotFound(id.to_owned())),
            Some(r) if r.status == InputStatus::Pending => Ok(r),
            Some(r) => Err(TurnError::InputSettled {
                id: id.to_owned(),
                status: r.status.label(),
            }),
        }
    }

    /// Add to `extras` what settling input `id` commits: its new status, an
    /// `input_answered` or `input_expired` event, the removal of its expiry
    /// alarm, and the pruning of requests settled longer than the TTL ago.
    pub(super) fn settle_input(
        &mut self,
        extras: &mut CommitExtras,
        id: &str,
        mut input: InputRecord,
        status: InputStatus,
    ) {
        let event = match status {
            InputStatus::Expired { .. } => "input_expired",
            _ => "input_answered",
        };
        let data = serde_json::json!({ "id": id, "kind": input.kind });
        extras
            .events
            .push((event.to_owned(), serde_json::to_vec(&data).expect("json")));
        if input.expires_at_ms.is_some() && extras.alarm.is_none() {
            extras.alarm = Some((crate::alarms::input_expiry_alarm(id), None));
        }
        input.status = status;
        extras.inputs.push((id.to_owned(), Some(input)));
        self.carry.note_input_settled();
    }

    /// Add to `inputs`, the input requests a commit writes, the removal of
    /// those settled longer than `inputs.settled_ttl_ms` ago and of the
    /// oldest beyond `inputs.max_settled_per_actor`, if the commit settles
    /// any (an answer, an expiry, a cancellation). Reads keys of the status
    /// index only, so settling stays cheap however many are kept.
    pub(super) fn prune_settled_inputs(&self, inputs: &mut Vec<(String, Option<InputRecord>)>) {
        let settling = inputs
            .iter()
            .filter(|(_, r)| r.as_ref().is_some_and(|r| r.status != InputStatus::Pending))
            .count() as u64;
        if settling == 0 {
            return;
        }
        // Disk shows committed settlements only: with more of the actor's
        // commits in flight the count may pass the cap by as many, until
        // the next settlement. (Those in flight are still pending on disk,
        // so they are never pruned.)
        let cfg = &self.env.config.inputs;
        let before = now_ms().saturating_sub(cfg.settled_ttl_ms);
        let keep = cfg.max_settled_per_actor.saturating_sub(settling);
        let num = self.record().num;
        match self
            .env
            .storage
            .reader()
            .and_then(|r| r.inputs_to_prune(num, before, keep))
        {
            Ok(ids) => {
                let prune: Vec<_> = ids
                    .into_iter()
                    .filter(|id| !inputs.iter().any(|(w, _)| w == id))
                    .map(|id| (id, None))
                    .collect();
                inputs.extend(prune);
            }
            Err(e) => tracing::warn!(actor = %self.key, error = %e, "cannot prune settled inputs"),
        }
    }
}
