//! `marmot:actor/actors`: messages to other actors.
//!
//! `call` waits for the other actor's reply (released once its turn is
//! durable). Turns of one actor never overlap, so an actor cannot be
//! re-entered: a call back into any actor already waiting in the same call
//! chain fails at once with `denied` instead of deadlocking. `send` is
//! one-way and durable: the message is queued in the recipient's inbox by
//! the sending turn's own commit, so it is sent if and only if that turn
//! commits, exactly once.

use std::sync::Arc;

use crate::clock::now_ms;
use crate::ids::ActorKey;
use crate::sandbox::bindings::GuestError;
use crate::sandbox::bindings::marmot::actor::actors;
use crate::sandbox::bindings::marmot::actor::types::Reply;
use crate::sandbox::host::Host;

/// Most actors in one call chain (A calls B calls C …, A included).
pub const MAX_CALL_DEPTH: usize = 8;

fn target(ty: &str, id: &str) -> Result<ActorKey, GuestError> {
    ActorKey::new(ty, id).map_err(|e| GuestError::Invalid(e.to_string()))
}

impl actors::Host for Host {
    async fn call(
        &mut self,
        actor_type: String,
        id: String,
        body: Vec<u8>,
    ) -> wasmtime::Result<Result<Reply, GuestError>> {
        let calls = self.actors.clone();
        let turn = self.enter()?;
        let to = match target(&actor_type, &id) {
            Ok(k) => k,
            Err(e) => return Ok(Err(e)),
        };
        let Some(calls) = calls else {
            return Ok(Err(GuestError::Unsupported(
                "actors.call is not available in this sandbox".into(),
            )));
        };
        if to == turn.key || turn.chain.contains(&to) {
            let path: Vec<String> = turn
                .chain
                .iter()
                .chain([&turn.key, &to])
                .map(ToString::to_string)
                .collect();
            return Ok(Err(GuestError::Denied(format!(
                "call cycle {}: an actor waiting for a reply cannot take another turn",
                path.join(" → ")
            ))));
        }
        if turn.chain.len() + 1 >= MAX_CALL_DEPTH {
            return Ok(Err(GuestError::LimitExceeded(format!(
                "a call chain may hold at most {MAX_CALL_DEPTH} actors"
            ))));
        }
        if body.len() > turn.limits.max_message_bytes {
            return Ok(Err(GuestError::LimitExceeded(format!(
                "a message of {} bytes exceeds the limit of {} bytes",
                body.len(),
                turn.limits.max_message_bytes
            ))));
        }
        let chain: Arc<[ActorKey]> = turn
            .chain
            .iter()
            .cloned()
            .chain([turn.key.clone()])
            .collect();
        // The request may carry state of this actor's earlier turns, still
        // in flight to disk: only send it once they are durable.
        if let Some(before) = turn.durable_before.clone() {
            before
                .tracker
                .wait_committed(before.seq, before.generation)
                .await;
            if before.tracker.min_generation() > before.generation {
                return Ok(Err(GuestError::Internal(
                    "an earlier commit of this actor failed; the call was not made".into(),
                )));
            }
        }
        Ok(calls.call(to, body, chain).await.map(|r| Reply {
            status: r.status,
            body: r.body,
            content_type: r.content_type,
        }))
    }

    async fn send(
        &mut self,
        actor_type: String,
        id: String,
        body: Vec<u8>,
    ) -> wasmtime::Result<Result<(), GuestError>> {
        let calls = self.actors.clone();
        let turn = self.enter()?;
        let to = match target(&actor_type, &id) {
            Ok(k) => k,
            Err(e) => return Ok(Err(e)),
        };
        let Some(calls) = calls else {
            return Ok(Err(GuestError::Unsupported(
                "actors.send is not available in this sandbox".into(),
            )));
        };
        if !calls.type_exists(&actor_type) {
            return Ok(Err(GuestError::NotFound(format!(
                "unknown actor type `{actor_type}`"
            ))));
        }
        Ok(turn.actor_send(to, body, now_ms()).map_err(Into::into))
    }
}
