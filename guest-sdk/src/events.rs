//! The actor's append-only event log.
//!
//! Events commit with the turn; clients read them with
//! `GET /v1/actors/{type}/{id}/events` and outbound webhooks carry them.

use serde::Serialize;

use crate::Result;
use crate::bindings::marmot::actor::events as host;

/// Append an event of `kind` carrying `data` as JSON; returns its sequence
/// number (the actor's first event is 1).
pub fn emit<T: Serialize + ?Sized>(kind: &str, data: &T) -> Result<u64> {
    let bytes = serde_json::to_vec(data)?;
    Ok(host::emit(kind, &bytes)?)
}
