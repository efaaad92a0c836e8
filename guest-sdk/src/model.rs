//! LLM calls by provider name. The request and the answer are Marmot's
//! normalized chat shape (docs/models.md), the same for every provider
//! format; the host adds the key, retries and falls back, and the key
//! never enters the sandbox.
//!
//! ```no_run
//! # fn run() -> marmot_guest::Result<()> {
//! use serde_json::json;
//! let answer = marmot_guest::model::chat(&json!({
//!     "provider": "openai",
//!     "model": "gpt-5-mini",
//!     "messages": [{"role": "user", "content": "Say hi"}],
//! }))?;
//! let text = answer["message"]["content"].as_str().unwrap_or_default();
//! # Ok(()) }
//! ```
//!
//! A call is outside the turn's transaction, like a fetch: a turn that
//! fails after it has still made (and paid for) the call.

use serde::Serialize;
use serde_json::Value;

use crate::Result;
use crate::bindings::marmot::actor::model as host;

/// One chat call: `request` serializes to the normalized request; the
/// answer is the normalized response (`message`, `stop_reason`, `usage`…).
/// A failure's message starts with what went wrong
/// (`invalid: context_length_exceeded: …`, `limit exceeded: rate_limited: …`).
pub fn chat(request: &impl Serialize) -> Result<Value> {
    let text = serde_json::to_string(request)?;
    let answer = host::chat(&text)?;
    Ok(serde_json::from_str(&answer)?)
}
