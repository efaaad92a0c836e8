//! Inbound webhooks delivered straight to their actor: the turn runs at
//! once and commits together with the delivery's de-duplication record, so
//! a webhook to an idle actor costs one commit instead of two (an inbox row,
//! then the turn that takes it out). The 202 still leaves only once that
//! commit is durable. Whatever cannot run now goes back to the node, which
//! queues it in the durable inbox as before.

use std::sync::Arc;
use std::sync::atomic::Ordering;

use super::super::{TurnError, WebhookDelivery, WebhookOutcome};
use super::inbox::{failed_turn, turn_input};
use super::{ActorTask, CommitExtras, not_started};
use crate::clock::now_ms;
use crate::storage::EnqueueOutcome;
use crate::storage::schema::{IdemOutcome, IdemRecord, StoredReply};

impl ActorTask {
    pub(super) async fn on_webhook(&mut self, d: WebhookDelivery) {
        let WebhookDelivery {
            record: row,
            dedupe_ttl_ms,
            reply,
        } = d;
        let not_run = |row| Ok(WebhookOutcome::NotRun(Box::new(row)));
        // Turns run in arrival order: durable work waiting for a retry
        // goes first, so this one queues behind it.
        if self.shared.inbox_deferred.load(Ordering::Acquire) {
            let _ = reply.send(not_run(row));
            return;
        }
        if let Err(e) = self.ready_for_turn().await {
            let _ = reply.send(match e {
                TurnError::UnknownType(_) => Err(e),
                _ => not_run(row),
            });
            return;
        }
        let Some(key) = row.idempotency_key.clone() else {
            // Webhooks always carry their de-duplication key.
            let _ = reply.send(not_run(row));
            return;
        };
        match self.idempotency(&key) {
            Ok(None) => {}
            // A redelivery of one that failed runs again.
            Ok(Some((_, rec))) if rec.outcome.redelivery_runs(&row) => {}
            Ok(Some((seq, rec))) => {
                let dup = WebhookOutcome::Done(EnqueueOutcome::Duplicate {
                    message_id: rec.outcome.into_message_id(),
                    same_request: true,
                });
                self.release_when_durable(seq, Ok(dup), reply);
                return;
            }
            Err(_) => {
                let _ = reply.send(not_run(row));
                return;
            }
        }
        let record = |outcome| IdemRecord {
            outcome,
            expires_at_ms: now_ms().saturating_add(dedupe_ttl_ms),
            // The delivery id is the webhook's identity.
            request_sha256: None,
        };
        let ran = match self.ensure_version().await {
            Ok(()) => {
                self.next_attempt = 0;
                let (kind, input) = turn_input(&row);
                let version = self.record().version;
                let id = row.message_id.clone();
                self.run_turn(kind, version, id, input, Arc::from([]))
                    .await
                    .map(|(_, finished)| finished)
            }
            Err(e) => Err(e),
        };
        let (finished, extras) = match ran {
            Err(e) if not_started(&e) => {
                let _ = reply.send(not_run(row));
                return;
            }
            Err(e) => (
                self.unchanged(),
                failed_turn(&row, e.code(), e.to_string(), record),
            ),
            // As from the inbox: what the de-duplication record keeps of a
            // webhook's turn is an empty 200.
            Ok(finished) => {
                let done = IdemOutcome::Done {
                    message_id: row.message_id.clone(),
                    reply: StoredReply {
                        status: 200,
                        body: Vec::new(),
                        content_type: None,
                    },
                };
                let extras = CommitExtras {
                    idempotency: Some((key, record(done))),
                    ..Default::default()
                };
                (finished, extras)
            }
        };
        let message_id = row.message_id.clone();
        self.submit(
            finished,
            extras,
            Box::new(move |r| {
                // A failed commit left nothing behind: queue it durably.
                let _ = reply.send(match r {
                    Ok(()) => Ok(WebhookOutcome::Done(EnqueueOutcome::Queued { message_id })),
                    Err(_) => not_run(row),
                });
            }),
        );
    }
}
