//! Anthropic Messages.

use serde_json::{Map, Value, json};

use super::{Decoded, Flow, StreamDecoder, event_json, malformed, take, take_str, tokens};
use crate::models::chat::{
    ChatRequest, Content, Delta, Message, StopReason, ToolCall, ToolChoice, Usage, arguments_value,
};
use crate::models::errors::ProviderError;
use crate::models::sse::SseEvent;

/// The content blocks a `tool_result` may hold.
const TOOL_RESULT_BLOCKS: &[&str] = &["text", "image", "document", "search_result"];

/// `max_tokens` is required by the format; this is sent when the request
/// gives none.
const DEFAULT_MAX_TOKENS: u64 = 4096;

pub(super) fn encode(req: &ChatRequest, model: &str, messages: &[Message]) -> Value {
    // The format wants user and assistant turns alternating: consecutive
    // messages of one role (tool results and the user's next words) merge
    // into one message of several blocks.
    let mut out: Vec<(String, Vec<Value>, Map<String, Value>)> = Vec::new();
    for m in messages {
        let (role, blocks, extra) = match m {
            Message::System { .. } => continue,
            Message::User { content, extra } => ("user", blocks(content), extra.clone()),
            Message::Assistant {
                content,
                tool_calls,
                provider_items,
                extra,
            } => {
                let mut b = provider_items.clone();
                if !content.is_empty() {
                    b.extend(blocks(content));
                }
                for c in tool_calls {
                    let input = match &c.arguments {
                        Value::Object(_) => c.arguments.clone(),
                        Value::String(s) => match arguments_value(s) {
                            v @ Value::Object(_) => v,
                            _ => json!({}),
                        },
                        _ => json!({}),
                    };
                    b.push(
                        json!({ "type": "tool_use", "id": c.id, "name": c.name, "input": input }),
                    );
                }
                ("assistant", b, extra.clone())
            }
            Message::Tool {
                tool_call_id,
                content,
                is_error,
                extra,
            } => {
                let mut block = Map::new();
                block.insert("type".into(), "tool_result".into());
                block.insert("tool_use_id".into(), tool_call_id.clone().into());
                // Blocks Anthropic takes in a tool result pass through; a
                // list of anything else (records that happen to have a
                // `type`) goes as its JSON text: passed through, every
                // later call of the conversation was a 400 (found by a
                // review).
                let blocks = |p: &[Value]| {
                    p.iter().all(|b| {
                        b["type"]
                            .as_str()
                            .is_some_and(|t| TOOL_RESULT_BLOCKS.contains(&t))
                    })
                };
                block.insert(
                    "content".into(),
                    match content {
                        Content::Parts(p) if !p.is_empty() && blocks(p) => p.clone().into(),
                        c => c.tool_text().into(),
                    },
                );
                if *is_error {
                    block.insert("is_error".into(), true.into());
                }
                // Keys like `cache_control` belong on the block.
                block.extend(extra.clone());
                ("user", vec![Value::Object(block)], Map::new())
            }
        };
        match out.last_mut() {
            Some((r, b, e)) if r == role => {
                b.extend(blocks);
                e.extend(extra);
            }
            _ => out.push((role.to_owned(), blocks, extra)),
        }
    }
    let messages: Vec<Value> = out
        .into_iter()
        .map(|(role, content, extra)| {
            let mut m = Map::new();
            m.insert("role".into(), role.into());
            m.insert("content".into(), content.into());
            m.extend(extra);
            Value::Object(m)
        })
        .collect();
    let mut body = Map::new();
    body.insert("model".into(), model.into());
    body.insert(
        "max_tokens".into(),
        req.max_output_tokens.unwrap_or(DEFAULT_MAX_TOKENS).into(),
    );
    if let Some(system) = req.system_text() {
        body.insert("system".into(), system.into());
    }
    body.insert("messages".into(), messages.into());
    if !req.tools.is_empty() {
        let tools: Vec<Value> = req
            .tools
            .iter()
            .map(|t| {
                let mut o = Map::new();
                o.insert("name".into(), t.name.clone().into());
                if !t.description.is_empty() {
                    o.insert("description".into(), t.description.clone().into());
                }
                o.insert("input_schema".into(), t.input_schema.clone());
                o.extend(t.extra.clone());
                Value::Object(o)
            })
            .collect();
        body.insert("tools".into(), tools.into());
    }
    match &req.tool_choice {
        Some(ToolChoice::Mode(m)) => {
            let t = match m.as_str() {
                "required" => "any",
                "none" => "none",
                _ => "auto",
            };
            body.insert("tool_choice".into(), json!({ "type": t }));
        }
        Some(ToolChoice::Named { name }) => {
            body.insert(
                "tool_choice".into(),
                json!({ "type": "tool", "name": name }),
            );
        }
        None => {}
    }
    if let Some(t) = req.temperature {
        body.insert("temperature".into(), t.into());
    }
    if !req.stop.is_empty() {
        body.insert("stop_sequences".into(), req.stop.clone().into());
    }
    if req.stream {
        body.insert("stream".into(), true.into());
    }
    Value::Object(body)
}

fn blocks(c: &Content) -> Vec<Value> {
    match c {
        Content::Parts(p) => p.clone(),
        c => {
            let t = c.text();
            if t.is_empty() {
                Vec::new()
            } else {
                vec![json!({ "type": "text", "text": t })]
            }
        }
    }
}

pub(super) fn decode(mut body: Map<String, Value>) -> Result<Decoded, ProviderError> {
    if body.get("type").and_then(Value::as_str) == Some("error") {
        return Err(ProviderError::from_stream_event(&Value::Object(body)));
    }
    let id = take_str(&mut body, "id");
    let model = take_str(&mut body, "model");
    let Value::Array(content) = take(&mut body, "content") else {
        return Err(malformed("no content"));
    };
    let mut text = String::new();
    let mut calls = Vec::new();
    let mut items = Vec::new();
    for block in content {
        match block.get("type").and_then(Value::as_str) {
            Some("text") => text.push_str(block.get("text").and_then(Value::as_str).unwrap_or("")),
            Some("tool_use") => calls.push(ToolCall {
                id: block
                    .get("id")
                    .and_then(Value::as_str)
                    .unwrap_or_default()
                    .into(),
                name: block
                    .get("name")
                    .and_then(Value::as_str)
                    .unwrap_or_default()
                    .into(),
                arguments: block.get("input").cloned().unwrap_or_else(|| json!({})),
            }),
            // Thinking and everything newer: kept, to be sent back as is.
            _ => items.push(block),
        }
    }
    let stop = take_str(&mut body, "stop_reason");
    let stop_reason = match stop.as_deref() {
        Some("end_turn") => StopReason::EndTurn,
        Some("tool_use") => StopReason::ToolUse,
        Some("max_tokens") => StopReason::MaxTokens,
        Some("stop_sequence") => StopReason::StopSequence,
        Some("refusal") => StopReason::Refusal,
        _ => StopReason::Other,
    };
    let mut usage = Usage::default();
    if let Value::Object(mut u) = take(&mut body, "usage") {
        // Cached prompt tokens are billed apart but are prompt tokens.
        usage.input_tokens = tokens(&u, "input_tokens")
            + tokens(&u, "cache_creation_input_tokens")
            + tokens(&u, "cache_read_input_tokens");
        usage.output_tokens = tokens(&u, "output_tokens");
        u.remove("input_tokens");
        u.remove("output_tokens");
        usage.extra = u;
    }
    for k in ["type", "role"] {
        body.remove(k);
    }
    if body.get("stop_sequence").is_some_and(Value::is_null) {
        body.remove("stop_sequence");
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
        provider_stop_reason: stop,
        usage,
        provider_fields: body,
    })
}

/// `message_start`, content blocks and `message_delta` folded into one
/// message.
#[derive(Default)]
pub(super) struct Stream {
    message: Option<Map<String, Value>>,
    /// Blocks by index, with the partial JSON of a tool_use's input.
    blocks: Vec<(Value, String)>,
    /// Tool calls seen so far (their delta index).
    calls: usize,
    /// Which delta index each block's tool call has.
    call_index: Vec<Option<usize>>,
    done: bool,
}

impl StreamDecoder for Stream {
    fn event(&mut self, ev: &SseEvent, deltas: &mut Vec<Delta>) -> Result<Flow, ProviderError> {
        let data = event_json(ev)?;
        let kind = data
            .get("type")
            .and_then(Value::as_str)
            .unwrap_or(ev.event.as_str())
            .to_owned();
        match kind.as_str() {
            "error" => return Err(ProviderError::from_stream_event(&Value::Object(data))),
            "message_start" => {
                let Some(Value::Object(m)) = data.get("message") else {
                    return Err(malformed("message_start without a message"));
                };
                self.message = Some(m.clone());
            }
            "content_block_start" => {
                let index = index(&data)?;
                let block = data.get("content_block").cloned().unwrap_or(Value::Null);
                while self.blocks.len() <= index {
                    self.blocks.push((Value::Null, String::new()));
                    self.call_index.push(None);
                }
                if block.get("type").and_then(Value::as_str) == Some("tool_use") {
                    let i = self.calls;
                    self.calls += 1;
                    self.call_index[index] = Some(i);
                    deltas.push(Delta::ToolCall {
                        index: i,
                        id: block.get("id").and_then(Value::as_str).map(str::to_owned),
                        name: block.get("name").and_then(Value::as_str).map(str::to_owned),
                        arguments: String::new(),
                    });
                }
                self.blocks[index] = (block, String::new());
            }
            "content_block_delta" => {
                let index = index(&data)?;
                let call = self.call_index.get(index).copied().flatten();
                let Some((block, json)) = self.blocks.get_mut(index) else {
                    return Err(malformed("a delta for a block that never started"));
                };
                let delta = data.get("delta").cloned().unwrap_or(Value::Null);
                let s = |k: &str| delta.get(k).and_then(Value::as_str).unwrap_or("");
                match delta.get("type").and_then(Value::as_str) {
                    Some("text_delta") => {
                        append(block, "text", s("text"));
                        deltas.push(Delta::Text {
                            text: s("text").to_owned(),
                        });
                    }
                    Some("input_json_delta") => {
                        json.push_str(s("partial_json"));
                        if let Some(i) = call {
                            deltas.push(Delta::ToolCall {
                                index: i,
                                id: None,
                                name: None,
                                arguments: s("partial_json").to_owned(),
                            });
                        }
                    }
                    Some("thinking_delta") => append(block, "thinking", s("thinking")),
                    Some("signature_delta") => append(block, "signature", s("signature")),
                    Some("citations_delta") => {
                        if let (Some(c), Value::Object(b)) = (delta.get("citation"), block) {
                            let list = b.entry("citations").or_insert_with(|| json!([]));
                            if let Value::Array(l) = list {
                                l.push(c.clone());
                            }
                        }
                    }
                    _ => {}
                }
            }
            "content_block_stop" => {
                let index = index(&data)?;
                if let Some((block, json)) = self.blocks.get_mut(index)
                    && block.get("type").and_then(Value::as_str) == Some("tool_use")
                {
                    // Text that is not JSON (a call cut by `max_tokens`)
                    // is that text, as in the other formats: failing the
                    // whole answer hid the stop reason from the guest.
                    // A block that came with its whole input and no
                    // deltas (some gateways send it so) keeps it: it was
                    // reset to `{}`, and the tool ran with no arguments
                    // (found by a probe).
                    let whole = block["input"].as_object().is_some_and(|i| !i.is_empty());
                    if !(whole && json.trim().is_empty()) {
                        block["input"] = crate::models::chat::arguments_value(json);
                    }
                }
            }
            "message_delta" => {
                let Some(m) = self.message.as_mut() else {
                    return Err(malformed("message_delta before message_start"));
                };
                if let Some(Value::Object(d)) = data.get("delta") {
                    for (k, v) in d {
                        m.insert(k.clone(), v.clone());
                    }
                }
                if let Some(Value::Object(u)) = data.get("usage") {
                    let usage = m.entry("usage").or_insert_with(|| json!({}));
                    if let Value::Object(mu) = usage {
                        for (k, v) in u {
                            if !v.is_null() {
                                mu.insert(k.clone(), v.clone());
                            }
                        }
                    }
                }
            }
            "message_stop" => {
                self.done = true;
                return Ok(Flow::Done);
            }
            _ => {} // ping, and events added later
        }
        Ok(Flow::More)
    }

    fn finish(self: Box<Self>) -> Result<Value, ProviderError> {
        // Complete once `message_delta` gave the stop reason (it comes
        // after every block's stop): a stream cut just before
        // `message_stop` lost nothing, as one cut just before OpenAI's
        // `[DONE]` is taken whole (it failed the call here, and the run).
        let stopped =
            |m: &serde_json::Map<String, Value>| m.get("stop_reason").is_some_and(|r| !r.is_null());
        let Some(mut m) = self.message.filter(|m| self.done || stopped(m)) else {
            return Err(malformed("the stream ended before message_stop"));
        };
        m.insert(
            "content".into(),
            self.blocks
                .into_iter()
                .map(|(b, _)| b)
                .collect::<Vec<_>>()
                .into(),
        );
        Ok(Value::Object(m))
    }
}

fn index(data: &Map<String, Value>) -> Result<usize, ProviderError> {
    match data.get("index").and_then(Value::as_u64) {
        Some(i) if i <= 1024 => Ok(i as usize),
        _ => Err(malformed("a content block event without a sane index")),
    }
}

fn append(block: &mut Value, key: &str, more: &str) {
    if let Value::Object(b) = block {
        let v = b.entry(key).or_insert_with(|| Value::String(String::new()));
        if let Value::String(s) = v {
            s.push_str(more);
        }
    }
}
