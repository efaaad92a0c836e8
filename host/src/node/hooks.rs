//! Inbound webhooks: [`crate::webhooks::inbound`] verifies and routes a
//! hook against its type's config; the node stores it (a durable inbox row,
//! de-duplicated by the sender's delivery id) and counts the outcome.

use axum::http::HeaderMap;
use bytes::Bytes;

use super::Node;
use crate::actor::TurnError;
use crate::metrics::HookLabels;
use crate::storage::EnqueueOutcome;
use crate::webhooks::inbound::{self, Accepted, HookError};

/// Why a hook was not accepted. Nothing was stored.
#[derive(Debug, thiserror::Error)]
pub enum WebhookError {
    /// No such type.
    #[error("unknown actor type `{0}`")]
    UnknownType(String),
    /// Refused before storing (name, signature, route).
    #[error(transparent)]
    Refused(#[from] HookError),
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
        let outcome = match &result {
            Ok(a) if a.duplicate => "duplicate",
            Ok(_) => "accepted",
            Err(_) => "rejected",
        };
        self.metrics
            .webhooks_received
            .get_or_create(&HookLabels { outcome })
            .inc();
        match &result {
            Ok(a) => tracing::info!(actor_type = ty, actor_id = %a.actor_id, hook = name,
                delivery_id = %a.delivery_id, duplicate = a.duplicate, "webhook accepted"),
            Err(e) => tracing::info!(actor_type = ty, hook = name, error = %e, "webhook rejected"),
        }
        result
    }

    async fn accept_webhook_inner(
        &self,
        ty: &str,
        id: &str,
        name: &str,
        headers: &HeaderMap,
        body: Bytes,
    ) -> Result<Accepted, WebhookError> {
        crate::ids::validate_hook_name(name).map_err(|e| HookError::BadName(e.to_string()))?;
        let unknown = || WebhookError::UnknownType(ty.to_owned());
        let entry = self.catalog.get(ty).ok_or_else(unknown)?;
        let config = entry
            .version(entry.latest_version())
            .map(|v| v.config)
            .ok_or_else(unknown)?;
        let hooks = &self.config.webhooks;
        let (key, delivery_id, message) =
            inbound::prepare(&config, ty, id, name, headers, body, hooks.tolerance_s)?;
        let (message_id, duplicate) = match self
            .enqueue_record(&key, message, hooks.dedupe_ttl_ms)
            .await?
        {
            EnqueueOutcome::Queued { message_id } => (message_id, false),
            EnqueueOutcome::Duplicate { message_id } => (message_id, true),
        };
        Ok(Accepted {
            actor_id: key.id().to_owned(),
            delivery_id,
            message_id,
            duplicate,
        })
    }
}
