//! Durable messages (`?wait=false`, `actors.send`) and inbound webhooks:
//! the actor's inbox, run oldest first, with attempts after a crash counted
//! before they run and a message that keeps crashing the node given up.

use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::Duration;

use bytes::Bytes;

use super::super::TurnError;
use super::{ActorTask, CommitExtras, INBOX_BATCH, INBOX_RETRY_MS, SUSPECT_WAIT_MS, throttled};
use crate::sandbox::{GuestReply, Message, TurnInput, TurnOutput, Webhook};
use crate::storage::schema::{IdemOutcome, IdemRecord, InboxKind, InboxRecord, StoredReply};

impl ActorTask {
    /// Run every durable message in the inbox, oldest first.
    pub(super) async fn drain_inbox(&mut self) {
        // Why they waited, if they still do, is found again below (an
        // old reason refused direct messages for a shortage since gone:
        // the reviewer).
        self.inbox_held = None;
        loop {
            match self.ready(false).await {
                Ok(()) => {}
                Err(TurnError::NotFound | TurnError::UnknownType(_)) => return,
                // Another node's now (see below).
                Err(TurnError::Moved(_)) if self.served_elsewhere() => return,
                Err(e) => {
                    if let Some(held_back) = throttled::INBOX_NOT_NOW.admit() {
                        tracing::warn!(actor = %self.key, error = %e, held_back, "cannot run the inbox now; will retry");
                    }
                    self.inbox_held = Some(e);
                    self.retry_inbox_later();
                    return;
                }
            }
            let num = self.record().num;
            let rows = match self
                .env
                .storage
                .reader()
                .and_then(|r| r.inbox(num, self.inbox_cursor, INBOX_BATCH))
            {
                Ok(rows) => rows,
                Err(e) => {
                    if let Some(held_back) = throttled::INBOX_UNREADABLE.admit() {
                        tracing::error!(actor = %self.key, error = %e, held_back, "failed to read the inbox");
                    }
                    return;
                }
            };
            if rows.is_empty() {
                self.shared.inbox_deferred.store(false, Ordering::Release);
                self.inbox_held = None;
                return;
            }
            for (seq, row) in rows {
                if self.shared.delete_asked() {
                    // The loop runs the delete first, then comes back here
                    // (if the actor is still there).
                    self.shared.inbox_dirty.store(true, Ordering::Release);
                    return;
                }
                if self.served_elsewhere() {
                    // Another node owns the actor now (this one lost its
                    // slot while paused, say): its rows are that node's to
                    // run, from its own copy. Left alone until the slot
                    // comes back, if it does (its actors are poked then).
                    return;
                }
                if self.env.registry.is_stopping() {
                    // The node is stopping: what is queued runs after the
                    // next start, rather than start now and be cut.
                    return;
                }
                self.inbox_cursor = seq;
                if !self.run_inbox_message(seq, row).await {
                    // It could not start (no instance slot, code or storage
                    // unavailable): keep it, and everything after it, queued.
                    self.inbox_cursor = seq - 1;
                    self.retry_inbox_later();
                    return;
                }
                self.inbox_retry_ms = INBOX_RETRY_MS;
                if self.shared.tracker.min_generation() > self.generation {
                    // A commit failed: start over from what is on disk.
                    break;
                }
            }
        }
    }

    /// Whether another node owns this actor now, as this node's view of
    /// the cluster says, or this node is handing it over (stopping): a row
    /// started now would be cut by the handover's fence.
    fn served_elsewhere(&self) -> bool {
        self.env.cluster.as_ref().is_some_and(|(cluster, _)| {
            cluster.is_leaving()
                || matches!(
                    cluster.route(&self.key),
                    crate::cluster::Route::Remote { .. }
                )
        })
    }

    /// Look at the inbox again after a back-off (doubling up to 30 s),
    /// unless a look is scheduled already: each direct message to an
    /// actor whose inbox waits tries it again, and scheduled one more
    /// sleeping task each (the reviewer: 150,000 at 5,000 requests a
    /// second).
    fn retry_inbox_later(&mut self) {
        self.shared.inbox_deferred.store(true, Ordering::Release);
        if self.inbox_retry_pending.swap(true, Ordering::AcqRel) {
            return;
        }
        let delay = self.inbox_retry_ms;
        self.inbox_retry_ms = (delay * 2).min(30_000);
        let env = self.env.clone();
        let key = self.key.clone();
        let pending = self.inbox_retry_pending.clone();
        tokio::spawn(async move {
            tokio::time::sleep(Duration::from_millis(delay)).await;
            pending.store(false, Ordering::Release);
            env.poke(&key);
        });
    }

    /// Run one durable message. Returns false when it could not start (it
    /// stays queued), true when it ran or was settled.
    async fn run_inbox_message(&mut self, seq: u64, mut row: InboxRecord) -> bool {
        let max_attempts = self.env.config.recovery.max_attempts;
        let at_boot = seq <= self.env.boot.inbox_seq;
        let counted = self.env.boot.after_crash && at_boot;
        // Held until its turn is submitted: commits are applied in order,
        // so the next suspect's counted attempt is durable only after it.
        let Ok(_alone) = self.alone(counted && row.attempts > 0) else {
            self.inbox_retry_ms = SUSPECT_WAIT_MS;
            return false;
        };
        if counted {
            // Present at boot: it may be what crashed the node. Count the
            // attempt durably before running it again.
            if row.attempts >= max_attempts {
                self.env.metrics.turns_failed_recovery.inc();
                tracing::error!(actor = %self.key, message_id = %row.message_id, attempts = row.attempts,
                    "durable message keeps crashing the node; giving up");
                let error = format!(
                    "the turn was started {} times after crashes and never finished",
                    row.attempts
                );
                self.fail_inbox_message(seq, row, "recovery_exhausted", error);
                return true;
            }
            row.attempts += 1;
            let counted = self
                .submit_and_wait(CommitExtras {
                    inbox_update: Some((seq, row.clone())),
                    bookkeeping: true,
                    ..Default::default()
                })
                .await;
            if counted.is_err() {
                // The attempt did not reach disk: do not run it uncounted.
                return false;
            }
        }
        if let Some(k) = &row.idempotency_key {
            // A waiting sender may have run a message with the same key
            // between the enqueue and now, or this very webhook ran directly
            // while it was being queued (the node stopped waiting for it):
            // its effect must not repeat. A row and its own outcome are
            // otherwise removed and written in one commit, so an outcome
            // with the row's own id means it ran.
            let ran = match self.idempotency(k).map(|r| r.map(|(_, rec)| rec.outcome)) {
                Ok(Some(IdemOutcome::Done { .. })) => true,
                Ok(Some(IdemOutcome::Failed { message_id, .. })) => message_id == row.message_id,
                _ => false,
            };
            if ran {
                self.submit(
                    self.unchanged(),
                    CommitExtras {
                        inbox_done: Some(seq),
                        bookkeeping: true,
                        ..Default::default()
                    },
                    Box::new(drop),
                );
                return true;
            }
        }
        if let Err(e) = self.ensure_version().await {
            // A failed `on-upgrade` is a broken deploy, not this message's
            // doing: it waits (with the rest of the inbox, retried with
            // back-off) for a version whose upgrade works. It was failed
            // and dropped, though its handler never ran, and a fixed
            // deploy did not bring it back (found by a probe).
            if super::not_started(&e) || matches!(e, TurnError::UpgradeFailed { .. }) {
                if matches!(e, TurnError::UpgradeFailed { .. }) {
                    tracing::warn!(actor = %self.key, error = %e,
                        "queued messages wait for a version whose upgrade works");
                    self.inbox_held = Some(e.clone());
                }
                self.uncount(counted, seq, row).await;
                return false;
            }
            self.fail_inbox_message(seq, row, e.code(), e.to_string());
            return true;
        }
        // The guest may ask whether an earlier start was cut off: by a
        // crash (counted above), a clean stop, the loss of the node that
        // had the actor before (neither counted towards giving up), or a
        // failed commit of its own start here.
        let started_before = self.inbox_started.replace(seq) == Some(seq);
        let cut = started_before
            || (!counted
                && (at_boot
                    || self
                        .env
                        .queued_before_takeover(&self.key, row.enqueued_at_ms)));
        self.next_attempt = row.attempts + u32::from(cut);
        let (kind, input) = turn_input(&row);
        let version = self.record().version;
        let result = self
            .run_turn(kind, version, row.message_id.clone(), input, Arc::from([]))
            .await
            .map(|(out, finished)| match out {
                TurnOutput::Reply(out) => (out, finished),
                // A webhook has no caller waiting: what its idempotency
                // record keeps is an empty 200.
                TurnOutput::Done => (
                    GuestReply {
                        status: 200,
                        body: Bytes::new(),
                        content_type: None,
                    },
                    finished,
                ),
                TurnOutput::Eval(_) => unreachable!("inbox rows are never evals"),
            });
        match result {
            Ok((out, finished)) => {
                let idempotency = row.idempotency_key.clone().map(|k| {
                    (
                        k,
                        self.idem_record(
                            IdemOutcome::Done {
                                message_id: row.message_id.clone(),
                                reply: StoredReply {
                                    status: out.status,
                                    body: out.body.to_vec(),
                                    content_type: out.content_type,
                                },
                            },
                            row.request_fingerprint(),
                        ),
                    )
                });
                self.submit(
                    finished,
                    CommitExtras {
                        idempotency,
                        inbox_done: Some(seq),
                        ..Default::default()
                    },
                    Box::new(drop),
                );
            }
            Err(e) if super::not_started(&e) => {
                self.uncount(counted, seq, row).await;
                return false;
            }
            Err(e) => self.fail_inbox_message(seq, row, e.code(), e.to_string()),
        }
        true
    }

    /// Take back the attempt counted for a message present at boot whose
    /// turn did not start after all (no sandbox free, no guest memory, the
    /// code not loadable, storage): it cannot have crashed anything.
    /// Counted, one `kill -9` while the instance pool was busy gave up
    /// queued messages that never ran (a probe: 23 of 120).
    async fn uncount(&mut self, counted: bool, seq: u64, mut row: InboxRecord) {
        if !counted {
            return;
        }
        row.attempts = row.attempts.saturating_sub(1);
        let _ = self
            .submit_and_wait(CommitExtras {
                inbox_update: Some((seq, row)),
                bookkeeping: true,
                ..Default::default()
            })
            .await;
    }

    /// A durable message failed: record a visible `turn_failed` event and
    /// take it out of the inbox, in one commit.
    fn fail_inbox_message(&mut self, seq: u64, row: InboxRecord, code: &str, error: String) {
        let request = row.request_fingerprint();
        let idem = |o| self.idem_record(o, request);
        let extras = CommitExtras {
            inbox_done: Some(seq),
            ..failed_turn(&row, code, error, idem)
        };
        self.submit(self.unchanged(), extras, Box::new(drop));
    }
}

/// The turn a durable message or webhook runs, and its kind for metrics.
pub(super) fn turn_input(row: &InboxRecord) -> (&'static str, TurnInput) {
    match &row.kind {
        InboxKind::Message => (
            "message",
            TurnInput::Message(Message {
                id: row.message_id.clone(),
                body: row.body.clone(),
                content_type: row.content_type.clone(),
            }),
        ),
        InboxKind::Webhook { name, headers } => (
            "webhook",
            TurnInput::Webhook(Webhook {
                name: name.clone(),
                headers: headers.clone(),
                body: row.body.clone(),
            }),
        ),
    }
}

/// What a failed durable message or webhook commits: a visible
/// `turn_failed` event and, under its idempotency key, the failure
/// (`idem` makes the record).
pub(super) fn failed_turn(
    row: &InboxRecord,
    code: &str,
    error: String,
    idem: impl FnOnce(IdemOutcome) -> IdemRecord,
) -> CommitExtras {
    let data = serde_json::json!({
        "message_id": row.message_id,
        "error": { "code": code, "message": error },
        "attempts": row.attempts,
    });
    let idempotency = row.idempotency_key.clone().map(|k| {
        (
            k,
            idem(IdemOutcome::Failed {
                message_id: row.message_id.clone(),
                error,
            }),
        )
    });
    CommitExtras {
        idempotency,
        bookkeeping: true,
        events: vec![(
            "turn_failed".to_owned(),
            serde_json::to_vec(&data).expect("json"),
        )],
        ..Default::default()
    }
}
