//! Messages to other actors.
//!
//! [`call`] waits for the other actor's reply, which is released only once
//! the other actor's turn is durable. An actor waiting for a reply cannot
//! take another turn, so a call back into any actor already waiting in the
//! same chain (A → B → A) fails at once with a `denied` error rather than
//! deadlocking. [`send`] is one-way: the message is queued durably with
//! this turn's commit (and not at all if the turn fails), exactly once.

use serde::Serialize;
use serde::de::DeserializeOwned;

use crate::Result;
use crate::bindings::marmot::actor::actors as host;

/// Another actor's reply.
#[derive(Debug, Clone)]
pub struct CallReply {
    /// The status it chose.
    pub status: u16,
    /// Its body.
    pub body: Vec<u8>,
    /// Its content type.
    pub content_type: Option<String>,
}

impl CallReply {
    /// The body parsed from JSON.
    pub fn json<T: DeserializeOwned>(&self) -> Result<T> {
        Ok(serde_json::from_slice(&self.body)?)
    }
}

/// Send `body` (as JSON) to actor (`actor_type`, `id`) and wait for its
/// reply.
pub fn call<T: Serialize + ?Sized>(actor_type: &str, id: &str, body: &T) -> Result<CallReply> {
    let bytes = serde_json::to_vec(body)?;
    let r = host::call(actor_type, id, &bytes)?;
    Ok(CallReply {
        status: r.status,
        body: r.body,
        content_type: r.content_type,
    })
}

/// Send `body` (as JSON) to actor (`actor_type`, `id`) one way; it is
/// queued when this turn commits.
pub fn send<T: Serialize + ?Sized>(actor_type: &str, id: &str, body: &T) -> Result<()> {
    let bytes = serde_json::to_vec(body)?;
    Ok(host::send(actor_type, id, &bytes)?)
}
