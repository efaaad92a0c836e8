//! `marmot:actor/model`: LLM calls through the node's model gateway.
//!
//! The guest sends the normalized chat request as JSON text and gets the
//! normalized answer back; the host adds the provider's key (it never
//! enters the sandbox), retries, falls back, and, for `"stream": true`,
//! sends the token deltas to the actor's live event stream as they arrive
//! (`event: delta` frames: `{"call": n, "type": "text", "text": …}`, where
//! `n` counts the turn's model calls). Like a fetch, a call is a side
//! effect outside the turn's transaction, keeps the actor awake and is not
//! CPU time.

use std::sync::Arc;

use super::Cap;
use crate::ids::ActorKey;
use crate::models::errors::ErrorKind;
use crate::models::{ChatRequest, Delta, Gateway, ModelError};
use crate::sandbox::bindings::GuestError;
use crate::sandbox::bindings::marmot::actor::model;
use crate::sandbox::host::Host;
use crate::streams::EventBus;

/// What an instance's model calls go through.
#[derive(Clone)]
pub struct ModelAccess {
    /// The gateway.
    pub gateway: Arc<Gateway>,
    /// Where live deltas go.
    pub bus: Arc<EventBus>,
}

/// The model part of a turn.
#[derive(Default)]
pub struct ModelCtx {
    /// Calls made so far (numbers the live frames).
    calls: u32,
}

impl model::Host for Host {
    async fn chat(&mut self, request: String) -> wasmtime::Result<Result<String, GuestError>> {
        let turn = self.enter(Cap::Model)?;
        let key = turn.key.clone();
        let call = turn.model.calls;
        turn.model.calls += 1;
        let Some(access) = self.models.clone() else {
            return Ok(Err(GuestError::Unsupported(
                "model calls are not available in this sandbox".into(),
            )));
        };
        let req = match ChatRequest::parse(&request) {
            Ok(r) => r,
            Err(why) => return Ok(Err(GuestError::Invalid(why))),
        };
        let mut live = LiveDeltas {
            bus: access.bus.clone(),
            key: key.clone(),
            call,
        };
        let started = std::time::Instant::now();
        match access
            .gateway
            .chat(&req, &mut |d: &Delta| live.send(d))
            .await
        {
            Ok(resp) => {
                tracing::debug!(
                    actor = %key,
                    provider = %resp.provider,
                    model = %resp.model,
                    input_tokens = resp.usage.input_tokens,
                    output_tokens = resp.usage.output_tokens,
                    ms = started.elapsed().as_millis() as u64,
                    "model call"
                );
                Ok(Ok(serde_json::to_string(&resp).expect("a response encodes")))
            }
            Err(e) => {
                tracing::info!(actor = %key, provider = %req.provider, model = %req.model, error = %e, "model call failed");
                Ok(Err(guest_error(e)))
            }
        }
    }
}

/// Sends one call's deltas as live frames.
struct LiveDeltas {
    bus: Arc<EventBus>,
    key: ActorKey,
    call: u32,
}

impl LiveDeltas {
    fn send(&mut self, d: &Delta) {
        let mut v = serde_json::to_value(d).expect("a delta encodes");
        v["call"] = self.call.into();
        self.bus.live(&self.key, Arc::from(v.to_string()));
    }
}

/// The guest's view of a failure; the message starts with a code the
/// guest can act on (`context_length_exceeded: …`, `rate_limited: …`).
fn guest_error(e: ModelError) -> GuestError {
    let text = e.to_string();
    match e {
        ModelError::Invalid(_) => GuestError::Invalid(text),
        ModelError::NotFound(_) => GuestError::NotFound(text),
        ModelError::Denied(_) => GuestError::Denied(text),
        ModelError::Failed { kind, .. } => match kind {
            ErrorKind::Invalid | ErrorKind::ContextLength => GuestError::Invalid(text),
            ErrorKind::RateLimited | ErrorKind::QuotaExhausted => GuestError::LimitExceeded(text),
            ErrorKind::Auth | ErrorKind::Refused => GuestError::Denied(text),
            ErrorKind::NotFound => GuestError::NotFound(text),
            ErrorKind::Overloaded | ErrorKind::Server | ErrorKind::Connection => {
                GuestError::Internal(text)
            }
        },
    }
}
