//! The model gateway: LLM calls by provider name, for guests (`model.chat`)
//! and the agent harness.
//!
//! * [`chat`]: the one request/response shape guests speak (passing
//!   through what it has no field for), and the cleaning every conversation
//!   gets before it is sent (orphaned tool calls out, tool-call ids every
//!   format accepts).
//! * [`wire`]: the providers' formats: OpenAI Chat Completions (and every
//!   compatible server), OpenAI Responses, Anthropic Messages; streamed and
//!   not.
//! * [`providers`]: the configured providers (`/v1/providers`).
//! * [`gateway`]: one call: the key added by the host from the secret
//!   store, retries honouring `Retry-After`, fallbacks before the first
//!   streamed byte.
//! * [`errors`]: classifying what providers answer.
//! * [`budget`]: per-type and per-actor spending limits, reserved before a
//!   call and settled after it.
//!
//! Calls leave through the egress layer, so the address policy, rustls and
//! the scrubbing of secrets apply to them as to guests' own fetches.

pub mod budget;
pub mod chat;
pub mod errors;
pub mod gateway;
pub mod providers;
mod scrub;
mod sse;
pub mod wire;

pub use chat::{ChatRequest, Delta};
pub use gateway::{Gateway, ModelError};
pub use providers::{ProviderConfigError, ProviderSpec, Providers};
