//! Inbound webhooks: [`crate::webhooks::inbound`] verifies and routes a
//! hook against its type's config; the node hands it to its actor, which
//! runs it at once and commits the turn with the de-duplication record (by
//! the sender's delivery id), or — when the actor cannot run it now —
//! stores it as a durable inbox row; and counts the outcome.

use std::collections::HashMap;
use std::sync::{Arc, LazyLock, Mutex};

use axum::http::HeaderMap;
use bytes::Bytes;

use super::Node;
use crate::actor::{Envelope, TurnError, WebhookDelivery, WebhookOutcome};
use crate::ids::ActorKey;
use crate::metrics::HookLabels;
use crate::storage::EnqueueOutcome;
use crate::storage::schema::InboxRecord;
use crate::webhooks::inbound::{self, Accepted, HookError};

/// How long a sender waits for a webhook's turn run directly before the
/// node queues the webhook instead and acknowledges it.
const DIRECT_WAIT: std::time::Duration = std::time::Duration::from_secs(1);

/// Copies of one delivery (one actor, one delivery id) handed to the actor
/// one at a time: a copy that arrives while another is being run waits for
/// it, and then finds it recorded (a duplicate). Copies sent at once (a
/// sender retrying early, two senders) each used to be answered as new,
/// with a message id of its own, though only one ran.
#[derive(Default)]
pub(super) struct InFlight(Mutex<HashMap<(ActorKey, String), Arc<Handover>>>);

/// Held by the copy of a delivery being handed to its actor.
type Handover = tokio::sync::Mutex<()>;

/// A delivery's turn to be handed over; the next copy's when dropped.
struct InFlightTurn<'a> {
    map: &'a InFlight,
    key: (ActorKey, String),
    guard: Option<tokio::sync::OwnedMutexGuard<()>>,
}

impl InFlight {
    async fn enter(&self, key: &ActorKey, delivery: &str) -> InFlightTurn<'_> {
        let key = (key.clone(), delivery.to_owned());
        let lock = {
            let mut map = self.0.lock().expect("webhooks in flight lock");
            map.entry(key.clone()).or_default().clone()
        };
        // Made before the wait: a request dropped while it waits (its
        // client went away) still removes the entry if it was the last.
        let mut turn = InFlightTurn {
            map: self,
            key,
            guard: None,
        };
        turn.guard = Some(lock.lock_owned().await);
        turn
    }
}

impl Drop for InFlightTurn<'_> {
    fn drop(&mut self) {
        drop(self.guard.take());
        let mut map = self.map.0.lock().expect("webhooks in flight lock");
        // Only the map holds it: no copy is waiting (clones are made under
        // this lock, so none can appear between the count and the removal).
        if map
            .get(&self.key)
            .is_some_and(|l| Arc::strong_count(l) == 1)
        {
            map.remove(&self.key);
        }
    }
}

/// Why a hook was not accepted. Nothing was stored.
#[derive(Debug, thiserror::Error)]
pub enum WebhookError {
    /// No such type.
    #[error("unknown actor type `{0}`")]
    UnknownType(String),
    /// Refused before storing (name, signature, route).
    #[error(transparent)]
    Refused(#[from] HookError),
    /// Past the type's rate limit (nothing stored; the sender retries).
    #[error(transparent)]
    RateLimited(#[from] crate::catalog::RateLimited),
    /// Storing failed.
    #[error(transparent)]
    Turn(#[from] TurnError),
}

impl Node {
    /// Verify, route and durably enqueue a hook posted to
    /// `/v1/hooks/{ty}/{id}/{name}`.
    pub async fn accept_webhook(
        &self,
        ty: &str,
        id: &str,
        name: &str,
        headers: &HeaderMap,
        body: Bytes,
    ) -> Result<Accepted, WebhookError> {
        let result = self.accept_webhook_inner(ty, id, name, headers, body).await;
        match &result {
            Ok(a) => {
                let outcome = if a.duplicate { "duplicate" } else { "accepted" };
                self.metrics
                    .webhooks_received
                    .get_or_create(&HookLabels { outcome })
                    .inc();
                tracing::debug!(actor_type = ty, actor_id = %a.actor_id, hook = name,
                    delivery_id = %a.delivery_id, duplicate = a.duplicate, "webhook accepted");
            }
            Err(e) => self.webhook_rejected(ty, name, e),
        }
        result
    }

    /// Refuse what a hook's head alone shows to be refused (a bad path, a
    /// type that takes no webhooks, no signature, a stale timestamp),
    /// before its body is read; counted and logged like any refusal.
    pub fn check_webhook_head(
        &self,
        ty: &str,
        id: &str,
        name: &str,
        headers: &HeaderMap,
    ) -> Result<(), WebhookError> {
        let checked = self.webhook_endpoint(ty, id, name).and_then(|(_, config)| {
            inbound::check_head(&config, ty, headers, self.config.webhooks.tolerance_s)
                .map_err(Into::into)
        });
        if let Err(e) = &checked {
            self.webhook_rejected(ty, name, e);
        }
        checked
    }

    /// Count and log a refused hook. Per request, and anyone may post:
    /// only a refusal by an endpoint that exists (a sender with the wrong
    /// secret, a bad route) is worth an info line; the counter has the
    /// rest.
    fn webhook_rejected(&self, ty: &str, name: &str, e: &WebhookError) {
        self.metrics
            .webhooks_received
            .get_or_create(&HookLabels {
                outcome: "rejected",
            })
            .inc();
        match e {
            WebhookError::UnknownType(_)
            | WebhookError::Refused(
                HookError::NotConfigured(_) | HookError::BadName(_) | HookError::BadId(_),
            ) => tracing::debug!(actor_type = ty, hook = name, error = %e, "webhook rejected"),
            // A bad signature says a sender's secret is wrong, worth a
            // line; but anyone can send one, and 8,000 of them wrote 8,000
            // lines a second (found by a probe): one in ten seconds per
            // type at info, the rest at debug, all counted in /metrics.
            _ if rejection_worth_a_line(ty, crate::clock::now_ms()) => {
                tracing::info!(actor_type = ty, hook = name, error = %e,
                    "webhook rejected (more to this type in the next 10 s at debug; marmot_webhooks_received_total counts them)");
            }
            _ => tracing::debug!(actor_type = ty, hook = name, error = %e, "webhook rejected"),
        }
    }

    /// The type a hook to `/v1/hooks/{ty}/{id}/{name}` goes to, and its
    /// latest config, once the path is checked.
    fn webhook_endpoint(
        &self,
        ty: &str,
        id: &str,
        name: &str,
    ) -> Result<(Arc<crate::catalog::TypeEntry>, crate::config::TypeConfig), WebhookError> {
        crate::ids::validate_hook_name(name).map_err(|e| HookError::BadName(e.to_string()))?;
        // A malformed path is a 400 before anything is asked of the type
        // (whether it takes webhooks, the signature).
        crate::ids::validate_type_name(ty).map_err(HookError::BadId)?;
        if id != inbound::ROUTED {
            crate::ids::validate_actor_id(id).map_err(HookError::BadId)?;
        }
        let unknown = || WebhookError::UnknownType(ty.to_owned());
        let entry = self.catalog.get(ty).ok_or_else(unknown)?;
        let config = entry
            .version(entry.latest_version())
            .map(|v| v.config)
            .ok_or_else(unknown)?;
        Ok((entry, config))
    }

    async fn accept_webhook_inner(
        &self,
        ty: &str,
        id: &str,
        name: &str,
        headers: &HeaderMap,
        body: Bytes,
    ) -> Result<Accepted, WebhookError> {
        let (entry, config) = self.webhook_endpoint(ty, id, name)?;
        let hooks = &self.config.webhooks;
        let (key, delivery_id, message) =
            inbound::prepare(&config, ty, id, name, headers, body, hooks.tolerance_s)?;
        // Counted once verified (a forged hook costs the type nothing), and
        // not for a redelivery, which runs nothing.
        self.admit(&entry, &key, message.idempotency_key.as_deref())
            .map_err(|e| match e {
                super::AdmitError::RateLimited(r) => WebhookError::RateLimited(r),
                super::AdmitError::Storage(e) => WebhookError::Turn(e.into()),
            })?;
        let _turn = match message.idempotency_key.clone() {
            Some(id) => Some(self.webhooks_in_flight.enter(&key, &id).await),
            None => None,
        };
        let (message_id, duplicate) = match self
            .deliver_webhook(&key, message, hooks.dedupe_ttl_ms)
            .await?
        {
            EnqueueOutcome::Queued { message_id } => (message_id, false),
            EnqueueOutcome::Duplicate { message_id, .. } => (message_id, true),
        };
        Ok(Accepted {
            actor_id: key.id().to_owned(),
            delivery_id,
            message_id,
            duplicate,
        })
    }

    /// Hand a verified webhook to its actor to run at once when the actor
    /// is idle (one commit for the turn and the de-duplication record);
    /// otherwise — or when it cannot run it now (work queued ahead of it,
    /// no instance slot, a failed commit), or its turn takes longer than
    /// [`DIRECT_WAIT`] — queue it in the durable inbox, so a sender never
    /// waits on a busy actor or a slow handler. Queuing a delivery whose
    /// direct turn is still running is safe: the inbox row is skipped if
    /// that turn commits first, and the enqueue reports a duplicate if it
    /// committed already.
    async fn deliver_webhook(
        &self,
        key: &ActorKey,
        record: InboxRecord,
        dedupe_ttl_ms: u64,
    ) -> Result<EnqueueOutcome, TurnError> {
        if !self.registry().is_idle(key) {
            return self.enqueue_record(key, record, dedupe_ttl_ms).await;
        }
        let fallback = record.clone();
        let direct = self.actors.ask(key, |reply| {
            Envelope::Webhook(Box::new(WebhookDelivery {
                record,
                dedupe_ttl_ms,
                reply,
            }))
        });
        match tokio::time::timeout(DIRECT_WAIT, direct).await {
            Ok(Ok(WebhookOutcome::Done(outcome))) => {
                if let EnqueueOutcome::Queued { .. } = outcome {
                    self.metrics.webhooks_run_directly.inc();
                }
                Ok(outcome)
            }
            Ok(Ok(WebhookOutcome::NotRun(record))) => {
                self.enqueue_record(key, *record, dedupe_ttl_ms).await
            }
            Ok(Err(e @ TurnError::UnknownType(_))) => Err(e),
            Ok(Err(_)) | Err(_) => self.enqueue_record(key, fallback, dedupe_ttl_ms).await,
        }
    }
}

/// When each type's last rejected webhook got an info line (ms): one per
/// type, so junk sent to one type cannot keep another's real signature
/// failures at debug.
static REJECTION_LINES: LazyLock<Mutex<HashMap<String, u64>>> = LazyLock::new(Mutex::default);

/// Types whose last line is remembered; past it the memory starts over
/// (each type's next rejection gets its line again).
const REJECTION_TYPES: usize = 4_096;

/// Whether a webhook to type `ty` rejected at `now_ms` gets an info line:
/// the first in ten seconds for its type does.
fn rejection_worth_a_line(ty: &str, now_ms: u64) -> bool {
    let mut lines = REJECTION_LINES.lock().expect("rejection lines lock");
    if lines.len() >= REJECTION_TYPES && !lines.contains_key(ty) {
        lines.clear();
    }
    let last = lines.entry(ty.to_owned()).or_default();
    once_in(last, 10_000, now_ms)
}

/// Whether `now_ms` is `every_ms` or more past `last` (or the first time),
/// which it then becomes.
fn once_in(last: &mut u64, every_ms: u64, now_ms: u64) -> bool {
    let due = *last == 0 || now_ms.saturating_sub(*last) >= every_ms;
    if due {
        *last = now_ms;
    }
    due
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn one_line_in_ten_seconds() {
        let mut last = 0;
        let t = 1_000_000;
        assert!(once_in(&mut last, 10_000, t));
        assert!(!once_in(&mut last, 10_000, t + 1));
        assert!(!once_in(&mut last, 10_000, t + 9_999));
        assert!(once_in(&mut last, 10_000, t + 10_000));
        assert!(!once_in(&mut last, 10_000, t + 10_001));
    }

    /// Each type has its own line: junk to one does not silence another.
    #[test]
    fn one_line_per_type() {
        let t = 2_000_000;
        assert!(rejection_worth_a_line("hooks-test-junk", t));
        assert!(!rejection_worth_a_line("hooks-test-junk", t + 1));
        assert!(rejection_worth_a_line("hooks-test-real", t + 2));
        assert!(!rejection_worth_a_line("hooks-test-real", t + 3));
    }
}
