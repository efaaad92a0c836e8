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
        let ttl = self.env.config.inputs.settled_ttl_ms;
        let now = now_ms();
        let num = self.record().num;
        match self.env.storage.reader().and_then(|r| r.inputs(num)) {
            Ok(all) => extras.inputs.extend(
                all.into_iter()
                    .filter(|(other, r)| {
                        other != id
                            && r.status
                                .settled_at_ms()
                                .is_some_and(|t| t.saturating_add(ttl) < now)
                    })
                    .map(|(other, _)| (other, None)),
            ),
            Err(e) => tracing::warn!(actor = %self.key, error = %e, "cannot prune settled inputs"),
        }
        self.carry.note_input_settled();
    }
}
