//! The providers' wire formats: each turns a [`ChatRequest`] into its
//! request body, its response body back into the common shape, and its
//! stream of server-sent events into deltas and, at the end, the same
//! response body a non-streamed call would have returned (so one decoder
//! serves both).
//!
//! Built from the providers' API references: OpenAI Chat Completions
//! (`POST {base}/chat/completions`), OpenAI Responses (`POST
//! {base}/responses`), Anthropic Messages (`POST {base}/messages`).

mod anthropic;
mod openai_chat;
mod openai_responses;

use serde_json::{Map, Value};

use super::chat::{ChatRequest, Delta, Message, StopReason, Usage};
use super::errors::{ErrorKind, ProviderError};
use super::sse::SseEvent;

/// A provider's wire format.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Format {
    /// OpenAI Chat Completions and every server that copies it (vLLM,
    /// llama.cpp, Ollama, LiteLLM).
    OpenAiChat,
    /// OpenAI Responses.
    OpenAiResponses,
    /// Anthropic Messages.
    AnthropicMessages,
}

impl Format {
    /// Every format, by its configuration name.
    pub const ALL: [(&'static str, Format); 3] = [
        ("openai-chat", Format::OpenAiChat),
        ("openai-responses", Format::OpenAiResponses),
        ("anthropic-messages", Format::AnthropicMessages),
    ];

    /// The format called `name`.
    pub fn parse(name: &str) -> Option<Format> {
        Self::ALL.iter().find(|(n, _)| *n == name).map(|(_, f)| *f)
    }

    /// Where the call goes, below the provider's base URL.
    pub fn path(self) -> &'static str {
        match self {
            Format::OpenAiChat => "chat/completions",
            Format::OpenAiResponses => "responses",
            Format::AnthropicMessages => "messages",
        }
    }

    /// Headers the format needs besides the key (`content-type` is added
    /// by the gateway).
    pub fn headers(self) -> &'static [(&'static str, &'static str)] {
        match self {
            Format::AnthropicMessages => &[("anthropic-version", "2023-06-01")],
            _ => &[],
        }
    }

    /// The header that carries the key, and its value.
    pub fn auth_header(self, key: &str) -> (&'static str, String) {
        match self {
            Format::AnthropicMessages => ("x-api-key", key.to_owned()),
            _ => ("authorization", format!("Bearer {key}")),
        }
    }

    /// The request body for `req`, whose messages are `messages` (made
    /// sendable), for `model`.
    pub fn encode(
        self,
        req: &ChatRequest,
        model: &str,
        messages: &[Message],
        options: &EncodeOptions,
    ) -> Result<Value, String> {
        let mut body = match self {
            Format::OpenAiChat => openai_chat::encode(req, model, messages, options),
            Format::OpenAiResponses => openai_responses::encode(req, model, messages)?,
            Format::AnthropicMessages => anthropic::encode(req, model, messages),
        };
        if let Value::Object(b) = &mut body {
            for (k, v) in &req.provider_options {
                b.insert(k.clone(), v.clone());
            }
        }
        Ok(body)
    }

    /// A whole response body, decoded.
    pub fn decode(self, body: Value) -> Result<Decoded, ProviderError> {
        let Value::Object(body) = body else {
            return Err(malformed("the response is not a JSON object"));
        };
        match self {
            Format::OpenAiChat => openai_chat::decode(body),
            Format::OpenAiResponses => openai_responses::decode(body),
            Format::AnthropicMessages => anthropic::decode(body),
        }
    }

    /// A decoder for a streamed response.
    pub fn stream(self) -> Box<dyn StreamDecoder> {
        match self {
            Format::OpenAiChat => Box::<openai_chat::Stream>::default(),
            Format::OpenAiResponses => Box::<openai_responses::Stream>::default(),
            Format::AnthropicMessages => Box::<anthropic::Stream>::default(),
        }
    }
}

/// Settings of a provider that change how requests are written.
#[derive(Debug, Clone, Default)]
pub struct EncodeOptions {
    /// Send `max_completion_tokens` rather than `max_tokens` (OpenAI's own
    /// API wants the first for reasoning models; compatible servers know
    /// only the second).
    pub max_completion_tokens: bool,
}

/// A decoded response.
#[derive(Debug, Clone, PartialEq)]
pub struct Decoded {
    /// The provider's response id.
    pub id: Option<String>,
    /// The model that answered.
    pub model: Option<String>,
    /// The assistant message.
    pub message: Message,
    /// Why it stopped.
    pub stop_reason: StopReason,
    /// The provider's word for it.
    pub provider_stop_reason: Option<String>,
    /// Tokens.
    pub usage: Usage,
    /// Unconsumed top-level fields.
    pub provider_fields: Map<String, Value>,
}

/// What a streamed event meant.
#[derive(Debug, PartialEq, Eq)]
pub enum Flow {
    /// More to come.
    More,
    /// The response is complete (later bytes are ignored).
    Done,
}

/// Turns one provider's server-sent events into deltas and a response.
pub trait StreamDecoder: Send {
    /// One event; deltas it carries go to `deltas`. An error event is an
    /// `Err` (with the provider's kind: overloaded, rate limited…).
    fn event(&mut self, ev: &SseEvent, deltas: &mut Vec<Delta>) -> Result<Flow, ProviderError>;
    /// The stream ended (or said it was done): the response body a
    /// non-streamed call would have returned.
    fn finish(self: Box<Self>) -> Result<Value, ProviderError>;
}

/// A response that is not what the format promises.
fn malformed(what: &str) -> ProviderError {
    ProviderError::new(
        ErrorKind::Server,
        None,
        format!("malformed response: {what}"),
    )
}

/// Parse one event's JSON data.
fn event_json(ev: &SseEvent) -> Result<Map<String, Value>, ProviderError> {
    match serde_json::from_str::<Value>(&ev.data) {
        Ok(Value::Object(m)) => Ok(m),
        _ => Err(malformed("a streamed event's data is not a JSON object")),
    }
}

/// Take `key` out of `m`.
fn take(m: &mut Map<String, Value>, key: &str) -> Value {
    m.remove(key).unwrap_or(Value::Null)
}

fn take_str(m: &mut Map<String, Value>, key: &str) -> Option<String> {
    match m.remove(key) {
        Some(Value::String(s)) => Some(s),
        _ => None,
    }
}

/// A usage object's token count.
fn tokens(m: &Map<String, Value>, key: &str) -> u64 {
    m.get(key).and_then(Value::as_u64).unwrap_or(0)
}

#[cfg(test)]
mod tests;
