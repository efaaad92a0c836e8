//! OpenAI Responses, used statelessly: the whole conversation is sent each
//! time (`store: false` unless `provider_options` says otherwise), since
//! the actor's own log is the transcript.

use serde_json::{Map, Value, json};

use super::{Decoded, Flow, StreamDecoder, event_json, malformed, take, take_str, tokens};
use crate::models::chat::{
    ChatRequest, Content, Delta, Message, StopReason, ToolCall, ToolChoice, Usage, arguments_text,
    arguments_value,
};
use crate::models::errors::ProviderError;
use crate::models::sse::SseEvent;

pub(super) fn encode(
    req: &ChatRequest,
    model: &str,
    messages: &[Message],
) -> Result<Value, String> {
    if !req.stop.is_empty() {
        return Err("the openai-responses format has no stop sequences; leave `stop` out".into());
    }
    let mut input = Vec::with_capacity(messages.len());
    for m in messages {
        match m {
            Message::System { .. } => {}
            Message::User { content, extra } => {
                let mut o = Map::new();
                o.insert("role".into(), "user".into());
                o.insert("content".into(), parts(content, "input_text"));
                o.extend(extra.clone());
                input.push(Value::Object(o));
            }
            Message::Assistant {
                content,
                tool_calls,
                provider_items,
                extra,
            } => {
                input.extend(provider_items.iter().cloned());
                if !content.is_empty() {
                    let mut o = Map::new();
                    o.insert("type".into(), "message".into());
                    o.insert("role".into(), "assistant".into());
                    o.insert("content".into(), parts(content, "output_text"));
                    o.extend(extra.clone());
                    input.push(Value::Object(o));
                }
                for c in tool_calls {
                    input.push(
                        json!({ "type": "function_call", "call_id": c.id, "name": c.name,
                                       "arguments": arguments_text(&c.arguments) }),
                    );
                }
            }
            Message::Tool {
                tool_call_id,
                content,
                is_error,
                extra,
            } => {
                let text = content.tool_text();
                let mut o = Map::new();
                o.insert("type".into(), "function_call_output".into());
                o.insert("call_id".into(), tool_call_id.clone().into());
                o.insert(
                    "output".into(),
                    if *is_error {
                        format!("Error: {text}")
                    } else {
                        text
                    }
                    .into(),
                );
                o.extend(extra.clone());
                input.push(Value::Object(o));
            }
        }
    }
    let mut body = Map::new();
    body.insert("model".into(), model.into());
    if let Some(s) = req.system_text() {
        body.insert("instructions".into(), s.into());
    }
    body.insert("input".into(), input.into());
    body.insert("store".into(), false.into());
    if !req.tools.is_empty() {
        let tools: Vec<Value> = req
            .tools
            .iter()
            .map(|t| {
                let mut o = Map::new();
                o.insert("type".into(), "function".into());
                o.insert("name".into(), t.name.clone().into());
                if !t.description.is_empty() {
                    o.insert("description".into(), t.description.clone().into());
                }
                o.insert("parameters".into(), t.input_schema.clone());
                o.insert("strict".into(), false.into());
                o.extend(t.extra.clone());
                Value::Object(o)
            })
            .collect();
        body.insert("tools".into(), tools.into());
    }
    match &req.tool_choice {
        Some(ToolChoice::Mode(m)) => {
            body.insert("tool_choice".into(), m.clone().into());
        }
        Some(ToolChoice::Named { name }) => {
            body.insert(
                "tool_choice".into(),
                json!({ "type": "function", "name": name }),
            );
        }
        None => {}
    }
    if let Some(n) = req.max_output_tokens {
        body.insert("max_output_tokens".into(), n.into());
    }
    if let Some(t) = req.temperature {
        body.insert("temperature".into(), t.into());
    }
    if req.stream {
        body.insert("stream".into(), true.into());
    }
    Ok(Value::Object(body))
}

/// Content as the format's parts: text becomes `{type, text}` with the
/// role's text type; other parts pass through.
fn parts(c: &Content, text_type: &str) -> Value {
    match c {
        Content::Parts(p) => p
            .iter()
            .map(
                |part| match (part.get("type").and_then(Value::as_str), part.get("text")) {
                    (Some("text"), Some(t)) => json!({ "type": text_type, "text": t }),
                    _ => part.clone(),
                },
            )
            .collect::<Vec<_>>()
            .into(),
        c => json!([{ "type": text_type, "text": c.text() }]),
    }
}

pub(super) fn decode(mut body: Map<String, Value>) -> Result<Decoded, ProviderError> {
    let status = take_str(&mut body, "status");
    if status.as_deref() == Some("failed") {
        let e = body.get("error").cloned().unwrap_or(Value::Null);
        return Err(ProviderError::from_stream_event(&e));
    }
    let id = take_str(&mut body, "id");
    let model = take_str(&mut body, "model");
    let Value::Array(output) = take(&mut body, "output") else {
        return Err(malformed("no output"));
    };
    let mut text = String::new();
    let mut refused = false;
    let mut calls = Vec::new();
    let mut items = Vec::new();
    for item in output {
        match item.get("type").and_then(Value::as_str) {
            Some("message") => {
                for part in item
                    .get("content")
                    .and_then(Value::as_array)
                    .into_iter()
                    .flatten()
                {
                    match part.get("type").and_then(Value::as_str) {
                        Some("output_text") => {
                            text.push_str(part.get("text").and_then(Value::as_str).unwrap_or(""))
                        }
                        Some("refusal") => {
                            refused = true;
                            text.push_str(part.get("refusal").and_then(Value::as_str).unwrap_or(""))
                        }
                        _ => {}
                    }
                }
            }
            Some("function_call") => calls.push(ToolCall {
                id: item
                    .get("call_id")
                    .and_then(Value::as_str)
                    .unwrap_or_default()
                    .into(),
                name: item
                    .get("name")
                    .and_then(Value::as_str)
                    .unwrap_or_default()
                    .into(),
                arguments: arguments_value(
                    item.get("arguments").and_then(Value::as_str).unwrap_or(""),
                ),
            }),
            // Reasoning items and everything newer: kept, to be sent back.
            _ => items.push(item),
        }
    }
    let incomplete = match take(&mut body, "incomplete_details") {
        Value::Object(d) => d.get("reason").and_then(Value::as_str).map(str::to_owned),
        _ => None,
    };
    let stop_reason = match (status.as_deref(), incomplete.as_deref()) {
        (_, Some("max_output_tokens")) => StopReason::MaxTokens,
        (_, Some("content_filter")) => StopReason::ContentFilter,
        _ if refused => StopReason::Refusal,
        _ if !calls.is_empty() => StopReason::ToolUse,
        (Some("completed"), _) => StopReason::EndTurn,
        _ => StopReason::Other,
    };
    let mut usage = Usage::default();
    if let Value::Object(mut u) = take(&mut body, "usage") {
        usage.input_tokens = tokens(&u, "input_tokens");
        usage.output_tokens = tokens(&u, "output_tokens");
        for k in ["input_tokens", "output_tokens", "total_tokens"] {
            u.remove(k);
        }
        usage.extra = u;
    }
    for k in ["object", "created_at", "error"] {
        body.remove(k);
    }
    Ok(Decoded {
        id,
        model,
        message: Message::Assistant {
            content: Content::Text(text),
            tool_calls: calls,
            provider_items: items,
            extra: Map::new(),
        },
        stop_reason,
        provider_stop_reason: incomplete.or(status),
        usage,
        provider_fields: body,
    })
}

/// The stream's deltas for live frames; its `response.completed` (or
/// `.incomplete`) event carries the whole response.
#[derive(Default)]
pub(super) struct Stream {
    response: Option<Value>,
    /// Function calls by output index → delta index.
    calls: Vec<(u64, usize)>,
}

impl StreamDecoder for Stream {
    fn event(&mut self, ev: &SseEvent, deltas: &mut Vec<Delta>) -> Result<Flow, ProviderError> {
        let data = event_json(ev)?;
        let kind = data
            .get("type")
            .and_then(Value::as_str)
            .unwrap_or(ev.event.as_str())
            .to_owned();
        let s = |k: &str| data.get(k).and_then(Value::as_str).unwrap_or("").to_owned();
        match kind.as_str() {
            "error" => return Err(ProviderError::from_stream_event(&Value::Object(data))),
            "response.failed" => {
                let e = data
                    .get("response")
                    .and_then(|r| r.get("error"))
                    .cloned()
                    .unwrap_or(Value::Null);
                return Err(ProviderError::from_stream_event(&e));
            }
            "response.output_text.delta" => deltas.push(Delta::Text { text: s("delta") }),
            "response.output_item.added" => {
                let item = data.get("item").cloned().unwrap_or(Value::Null);
                if item.get("type").and_then(Value::as_str) == Some("function_call") {
                    let out = data
                        .get("output_index")
                        .and_then(Value::as_u64)
                        .unwrap_or(0);
                    let index = self.calls.len();
                    self.calls.push((out, index));
                    deltas.push(Delta::ToolCall {
                        index,
                        id: item
                            .get("call_id")
                            .and_then(Value::as_str)
                            .map(str::to_owned),
                        name: item.get("name").and_then(Value::as_str).map(str::to_owned),
                        arguments: String::new(),
                    });
                }
            }
            "response.function_call_arguments.delta" => {
                let out = data
                    .get("output_index")
                    .and_then(Value::as_u64)
                    .unwrap_or(0);
                if let Some(&(_, index)) = self.calls.iter().find(|(o, _)| *o == out) {
                    deltas.push(Delta::ToolCall {
                        index,
                        id: None,
                        name: None,
                        arguments: s("delta"),
                    });
                }
            }
            "response.completed" | "response.incomplete" => {
                let mut data = data;
                self.response = Some(take(&mut data, "response"));
                return Ok(Flow::Done);
            }
            _ => {}
        }
        Ok(Flow::More)
    }

    fn finish(self: Box<Self>) -> Result<Value, ProviderError> {
        match self.response {
            Some(r @ Value::Object(_)) => Ok(r),
            _ => Err(malformed("the stream ended before response.completed")),
        }
    }
}
