//! Durable waits for a person or a system: approvals, questions, results of
//! tools that run on the client.
//!
//! [`request`] records a pending request as part of the turn and returns its
//! id; the turn ends as usual. Whoever answers posts JSON to
//! `POST /v1/actors/{type}/{id}/inputs/{input_id}`, and the actor's
//! [`on_input`](crate::Actor::on_input) runs with it — once, even across
//! restarts. With a deadline, an unanswered request ends in an `on_input`
//! turn with `expired: true` instead. Clients see requests as
//! `input_requested` events and in `GET …/inputs`.
//!
//! ```no_run
//! use marmot_guest::inputs;
//!
//! # fn f() -> marmot_guest::Result<()> {
//! let schema = serde_json::json!({
//!     "type": "object",
//!     "required": ["approved"],
//!     "properties": { "approved": { "type": "boolean" } }
//! });
//! let id = inputs::request_with("approval", "Refund $40?", Some(&schema), Some(3_600_000))?;
//! # let _ = id; Ok(()) }
//! ```

use crate::Result;
use crate::bindings::marmot::actor::inputs as host;

/// Ask for input of `kind` with `prompt`; returns the input id.
pub fn request(kind: &str, prompt: &str) -> Result<String> {
    request_with(kind, prompt, None, None)
}

/// Ask for input whose answer must match the JSON Schema `schema` (the
/// subset the host checks: `type`, `enum`, `const`, `properties`,
/// `required`, `additionalProperties`, `items`, lengths and bounds,
/// `anyOf`), expiring after `expires_in_ms` if given.
pub fn request_with(
    kind: &str,
    prompt: &str,
    schema: Option<&serde_json::Value>,
    expires_in_ms: Option<u64>,
) -> Result<String> {
    let req = host::InputRequest {
        kind: kind.to_owned(),
        prompt: prompt.to_owned(),
        schema: schema.map(|s| s.to_string()),
        expires_in_ms,
    };
    Ok(host::request(&req)?)
}

/// Withdraw pending request `id` of this actor (nobody needs to answer it
/// any more): `cancelled` once the turn commits, with an `input_cancelled`
/// event, and an answer to it is refused with 409. `NotFound` for an id
/// that is not this actor's pending request.
pub fn cancel(id: &str) -> Result<()> {
    Ok(host::cancel(id)?)
}
