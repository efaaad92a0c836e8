//! Messages whose senders wait for the reply, idempotency keys, evals of
//! model-written scripts, and deleting the actor.

use std::sync::atomic::Ordering;

use bytes::Bytes;
use tokio::sync::oneshot;

use super::super::{Delivery, EvalReply, TurnError, TurnReply};
use super::{ActorTask, CommitExtras, TurnTrace};
use crate::clock::now_ms;
use crate::sandbox::{FinishedTurn, Message, TurnInput, TurnOutput};
use crate::storage::WriteOp;
use crate::storage::schema::{IdemOutcome, IdemRecord, StoredReply, request_fingerprint};

impl ActorTask {
    pub(super) async fn on_message(&mut self, d: Delivery) {
        let Delivery {
            message_id,
            body,
            content_type,
            idempotency_key,
            chain,
            reply,
            trace,
            request_id,
            sent_at,
        } = d;
        // Turns run in arrival order: durable messages waiting for a retry
        // (for a version whose upgrade works, say) go first, now, as a
        // fixed deploy may let them. If they still cannot run, neither can
        // this one: it is refused as they were held. (It ran before them,
        // and ran the fixed upgrade: found by a probe.)
        if self.shared.inbox_deferred.load(Ordering::Acquire) {
            Box::pin(self.drain_inbox()).await;
            if self.shared.inbox_deferred.load(Ordering::Acquire)
                && let Some(e) = self.inbox_held.clone()
            {
                let _ = reply.send(Err(e));
                return;
            }
        }
        self.next_trace = TurnTrace {
            parent: trace,
            since: Some(sent_at),
            request_id,
        };
        if let Err(e) = self.ready_for_turn().await {
            let _ = reply.send(Err(e));
            return;
        }
        let request = idempotency_key
            .as_ref()
            .map(|_| request_fingerprint(content_type.as_deref(), &body));
        if let Some(k) = &idempotency_key {
            match self.idempotency(k) {
                Ok(None) => {}
                Ok(Some((seq, rec))) => {
                    self.replay(seq, rec, request, reply);
                    return;
                }
                Err(e) => {
                    let _ = reply.send(Err(e));
                    return;
                }
            }
        }
        if let Err(e) = self.ensure_version_for(chain.clone()).await {
            // The upgrade turn ran on state that may not be durable yet.
            self.release_when_durable(self.submitted_seq, Err(e), reply);
            return;
        }
        let msg = Message {
            id: message_id.clone(),
            body: body.to_vec(),
            content_type,
        };
        let version = self.record().version;
        let turn_id = message_id.clone();
        // Asked again under the same key after this turn failed (its node
        // crashed, say), it runs again: its calls carry keys made from the
        // key, so each callee answers the repeat with its first reply (a
        // client's retry applied a callee's effect twice: found by a
        // probe). A call's own key is such a key too.
        self.next_direct = Some(idempotency_key.as_ref().map(|k| format!("key:{k}")));
        let result = self
            .run_turn("message", version, turn_id, TurnInput::Message(msg), chain)
            .await
            .map(|(out, finished)| match out {
                TurnOutput::Reply(r) => (
                    TurnReply {
                        status: r.status,
                        body: r.body,
                        content_type: r.content_type,
                        message_id,
                        replayed: false,
                    },
                    finished,
                ),
                TurnOutput::Done | TurnOutput::Eval(_) => unreachable!("on-message always replies"),
            });
        // A call's key needs keeping only if the turn changed something: a
        // read-only turn run again has no effect to repeat (and a read-only
        // service called by every recovered turn would commit, and keep its
        // replies a day, for nothing).
        let keep_key = idempotency_key
            .as_deref()
            .is_some_and(|k| !k.starts_with(crate::sandbox::CALL_KEY_PREFIX));
        match result {
            Ok((out, finished)) if finished.is_empty() && !keep_key && self.persisted.is_some() => {
                // A read-only turn needs no commit of its own, but what it
                // read may come from turns still being committed: release
                // the reply once those are durable. (The first turn of a
                // new actor commits all the same: its record.)
                self.finish_unchanged(finished);
                self.release_when_durable(self.submitted_seq, Ok(out), reply);
            }
            Ok((out, finished)) => {
                let extras = CommitExtras {
                    idempotency: idempotency_key.map(|k| {
                        (
                            k,
                            self.idem_record(
                                IdemOutcome::Done {
                                    message_id: out.message_id.clone(),
                                    reply: StoredReply {
                                        status: out.status,
                                        body: out.body.to_vec(),
                                        content_type: out.content_type.clone(),
                                    },
                                },
                                request,
                            ),
                        )
                    }),
                    ..Default::default()
                };
                self.submit(
                    finished,
                    extras,
                    Box::new(move |r| {
                        let _ = reply.send(r.map(|()| out).map_err(TurnError::from));
                    }),
                );
            }
            // An error (or a trap message) can reveal state written by
            // earlier turns: it leaves only once those are durable.
            Err(e) => self.release_when_durable(self.submitted_seq, Err(e), reply),
        }
    }

    /// A turn that changed nothing commits nothing; the blobs it stored and
    /// then let go (a child script's files, rolled back when it threw) are
    /// removed now. They stayed on disk, counted by no quota, until the
    /// hourly sweep (found by a probe: 26 MB from ten such turns). It is
    /// a turn all the same: counted in the activity statistics (kept in
    /// memory, written with the record's next durable change), which
    /// counted only turns that committed (a probe).
    fn finish_unchanged(&mut self, finished: FinishedTurn) {
        crate::sandbox::release_blobs(self.env.storage.clone(), finished.blob_holds);
        if let Some(record) = self.record.as_mut() {
            record.turns += 1;
            record.last_turn_at_ms = now_ms();
            self.shared.note_turn(record.turns, record.last_turn_at_ms);
        }
    }

    /// The idempotency record for `key`: pending in memory (with the seq
    /// of its commit) or on disk (seq 0).
    pub(super) fn idempotency(
        &mut self,
        key: &str,
    ) -> Result<Option<(u64, IdemRecord)>, TurnError> {
        let now = now_ms();
        if let Some((seq, rec)) = self.idem_pending.get(key) {
            // Expired like one on disk: whether a key still holds must not
            // depend on whether its actor stayed awake.
            return Ok((rec.expires_at_ms > now).then(|| (*seq, rec.clone())));
        }
        let num = self.record().num;
        let rec = self.env.storage.reader()?.idempotency(num, key)?;
        Ok(rec.filter(|r| r.expires_at_ms > now).map(|r| (0, r)))
    }

    /// Answer a repeated idempotency key without running the turn again,
    /// or refuse it if it took another body (`request`). A reply whose
    /// commit is still in flight is released only once durable.
    fn replay(
        &self,
        seq: u64,
        rec: IdemRecord,
        request: Option<[u8; 32]>,
        reply: oneshot::Sender<Result<TurnReply, TurnError>>,
    ) {
        if rec.refuses(request.as_ref()) {
            let first = rec.outcome.into_message_id();
            self.release_when_durable(seq, Err(TurnError::IdempotencyKeyReused(first)), reply);
            return;
        }
        let result = match rec.outcome {
            IdemOutcome::Done { message_id, reply } => Ok(TurnReply {
                status: reply.status,
                body: Bytes::from(reply.body),
                content_type: reply.content_type,
                message_id,
                replayed: true,
            }),
            IdemOutcome::Queued { .. } => Err(TurnError::IdempotencyInProgress),
            IdemOutcome::Failed { error, .. } => Err(TurnError::PreviouslyFailed(error)),
        };
        self.release_when_durable(seq, result, reply);
    }

    /// The idempotency record of an outcome of the request with body
    /// fingerprint `request`, expiring after the node's TTL.
    pub(super) fn idem_record(
        &self,
        outcome: IdemOutcome,
        request: Option<[u8; 32]>,
    ) -> IdemRecord {
        IdemRecord {
            outcome,
            expires_at_ms: now_ms().saturating_add(self.env.config.limits.idempotency_ttl_ms),
            request_sha256: request,
        }
    }

    /// Run a model-written script against this actor's state. Its writes
    /// commit only if it succeeds; its reply leaves once they are durable.
    pub(super) async fn on_eval(
        &mut self,
        code: String,
        reply: oneshot::Sender<Result<EvalReply, TurnError>>,
    ) {
        if let Err(e) = self.ready(true).await {
            let _ = reply.send(Err(e));
            return;
        }
        // An eval runs with the type's latest config (its hosts, secrets,
        // limits) on upgraded state, like any turn: on the version the
        // actor last ran, an actor asleep through a deploy that revoked a
        // host still reached it from evals, and wrote old-shaped state
        // that its `onUpgrade` then migrated as if it were its own (found
        // by a probe).
        if let Err(e) = self.ensure_version().await {
            self.release_when_durable(self.submitted_seq, Err(e), reply);
            return;
        }
        let version = self.record().version;
        let turn_id = crate::ids::new_message_id();
        let outcome = self
            .run_turn(
                "eval",
                version,
                turn_id,
                TurnInput::Eval(code),
                std::sync::Arc::from([]),
            )
            .await;
        let logs = std::mem::take(&mut self.failed_eval_logs);
        match outcome {
            Ok((TurnOutput::Eval(out), finished))
                if !finished.is_empty() || self.persisted.is_none() =>
            {
                self.submit(
                    finished,
                    CommitExtras::default(),
                    Box::new(move |r| {
                        let _ = reply.send(r.map(|()| out).map_err(TurnError::from));
                    }),
                );
            }
            Ok((TurnOutput::Eval(out), finished)) => {
                self.finish_unchanged(finished);
                self.release_when_durable(self.submitted_seq, Ok(out), reply)
            }
            Ok(_) => unreachable!("an eval turn returns an eval result"),
            // A limit or a trap: the script failed; report it like a throw,
            // with what it logged until then.
            Err(e @ (TurnError::Trap { .. } | TurnError::Timeout(_))) => {
                let out = EvalReply {
                    result: None,
                    logs,
                    error: Some(e.to_string()),
                };
                self.release_when_durable(self.submitted_seq, Ok(out), reply);
            }
            Err(e) => self.release_when_durable(self.submitted_seq, Err(e), reply),
        }
    }

    /// Answer the deletes asked ahead of the mailbox: one delete for all
    /// of them (the first hears whether the actor existed; any others,
    /// asked meanwhile, that it is gone).
    pub(super) async fn run_deletes(&mut self) {
        let waiting = self.shared.take_deletes();
        if waiting.is_empty() {
            return;
        }
        let r = self.delete().await;
        for (i, reply) in waiting.into_iter().enumerate() {
            let _ = reply.send(if i == 0 {
                r.clone()
            } else {
                r.clone().map(|_| false)
            });
        }
    }

    /// Delete the actor's durable data; the task stays up as a fresh actor.
    pub(super) async fn delete(&mut self) -> Result<bool, TurnError> {
        self.shared
            .tracker
            .wait_committed(self.submitted_seq, self.generation)
            .await;
        let key = self.key.clone();
        let existed = self
            .env
            .storage
            .writer()
            .call(|done| WriteOp::DeleteActor { key, done })
            .await?;
        self.reset();
        // Streams watching it end (its log is gone).
        self.env.event_bus.publish(&self.key, 0);
        // Debug: a type's deletion deletes every actor of it (and logs
        // once); a delete by request is logged by the node.
        tracing::debug!(actor = %self.key, existed, "actor deleted");
        Ok(existed)
    }
}
