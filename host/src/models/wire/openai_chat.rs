//! OpenAI Chat Completions, and every server that speaks it.

use serde_json::{Map, Value, json};

use super::{
    Decoded, EncodeOptions, Flow, StreamDecoder, event_json, malformed, take, take_str, tokens,
};
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
    options: &EncodeOptions,
) -> Value {
    let mut out = Vec::with_capacity(messages.len() + 1);
    if let Some(system) = req.system_text() {
        out.push(json!({ "role": "system", "content": system }));
    }
    for m in messages {
        out.push(message(m));
    }
    let mut body = Map::new();
    body.insert("model".into(), model.into());
    body.insert("messages".into(), out.into());
    if !req.tools.is_empty() {
        let tools: Vec<Value> = req
            .tools
            .iter()
            .map(|t| {
                let mut f = Map::new();
                f.insert("name".into(), t.name.clone().into());
                if !t.description.is_empty() {
                    f.insert("description".into(), t.description.clone().into());
                }
                f.insert("parameters".into(), t.input_schema.clone());
                f.extend(t.extra.clone());
                json!({ "type": "function", "function": f })
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
                json!({ "type": "function", "function": { "name": name } }),
            );
        }
        None => {}
    }
    if let Some(n) = req.max_output_tokens {
        let key = if options.max_completion_tokens {
            "max_completion_tokens"
        } else {
            "max_tokens"
        };
        body.insert(key.into(), n.into());
    }
    if let Some(t) = req.temperature {
        body.insert("temperature".into(), t.into());
    }
    if !req.stop.is_empty() {
        body.insert("stop".into(), req.stop.clone().into());
    }
    if req.stream {
        body.insert("stream".into(), true.into());
        body.insert("stream_options".into(), json!({ "include_usage": true }));
    }
    Value::Object(body)
}

fn message(m: &Message) -> Value {
    let mut o = Map::new();
    match m {
        Message::System { content, extra } => {
            o.insert("role".into(), "system".into());
            o.insert("content".into(), content_value(content));
            o.extend(extra.clone());
        }
        Message::User { content, extra } => {
            o.insert("role".into(), "user".into());
            o.insert("content".into(), content_value(content));
            o.extend(extra.clone());
        }
        Message::Assistant {
            content,
            tool_calls,
            extra,
            ..
        } => {
            o.insert("role".into(), "assistant".into());
            o.insert(
                "content".into(),
                if content.is_empty() {
                    Value::Null
                } else {
                    content_value(content)
                },
            );
            if !tool_calls.is_empty() {
                let calls: Vec<Value> = tool_calls
                    .iter()
                    .map(|c| {
                        json!({ "id": c.id, "type": "function",
                                "function": { "name": c.name, "arguments": arguments_text(&c.arguments) } })
                    })
                    .collect();
                o.insert("tool_calls".into(), calls.into());
            }
            o.extend(extra.clone());
        }
        Message::Tool {
            tool_call_id,
            content,
            is_error,
            extra,
        } => {
            o.insert("role".into(), "tool".into());
            o.insert("tool_call_id".into(), tool_call_id.clone().into());
            let text = content.tool_text();
            let text = if *is_error {
                format!("Error: {text}")
            } else {
                text
            };
            o.insert("content".into(), text.into());
            o.extend(extra.clone());
        }
    }
    Value::Object(o)
}

fn content_value(c: &Content) -> Value {
    match c {
        Content::Text(t) => t.clone().into(),
        Content::Parts(p) => p.clone().into(),
        Content::Json(v) => v.to_string().into(),
    }
}

pub(super) fn decode(mut body: Map<String, Value>) -> Result<Decoded, ProviderError> {
    let id = take_str(&mut body, "id");
    let model = take_str(&mut body, "model");
    let mut choices = match take(&mut body, "choices") {
        Value::Array(c) if !c.is_empty() => c,
        _ => return Err(malformed("no choices")),
    };
    let Value::Object(mut choice) = choices.swap_remove(0) else {
        return Err(malformed("a choice is not an object"));
    };
    let finish = take_str(&mut choice, "finish_reason");
    let Value::Object(mut msg) = take(&mut choice, "message") else {
        return Err(malformed("the choice has no message"));
    };
    let text = take_str(&mut msg, "content").unwrap_or_default();
    let refusal = take_str(&mut msg, "refusal");
    let mut calls = Vec::new();
    if let Value::Array(tc) = take(&mut msg, "tool_calls") {
        for c in tc {
            let id = c.get("id").and_then(Value::as_str).unwrap_or_default();
            let f = c.get("function").cloned().unwrap_or(Value::Null);
            let name = f.get("name").and_then(Value::as_str).unwrap_or_default();
            let arguments = match f.get("arguments") {
                // Servers that send the object itself (LiteLLM's Ollama).
                Some(v @ Value::Object(_)) => v.clone(),
                args => arguments_value(args.and_then(Value::as_str).unwrap_or("")),
            };
            calls.push(ToolCall {
                id: id.to_owned(),
                name: name.to_owned(),
                arguments,
            });
        }
    }
    msg.remove("role");
    let stop_reason = match (finish.as_deref(), &refusal) {
        (_, Some(_)) => StopReason::Refusal,
        (Some("stop"), _) => StopReason::EndTurn,
        (Some("tool_calls" | "function_call"), _) => StopReason::ToolUse,
        (Some("length"), _) => StopReason::MaxTokens,
        (Some("content_filter"), _) => StopReason::ContentFilter,
        _ if !calls.is_empty() => StopReason::ToolUse,
        _ => StopReason::Other,
    };
    let text = match refusal {
        Some(r) if text.is_empty() => r,
        _ => text,
    };
    let mut usage = Usage::default();
    if let Value::Object(mut u) = take(&mut body, "usage") {
        usage.input_tokens = tokens(&u, "prompt_tokens");
        usage.output_tokens = tokens(&u, "completion_tokens");
        for k in ["prompt_tokens", "completion_tokens", "total_tokens"] {
            u.remove(k);
        }
        usage.extra = u;
    }
    body.remove("object");
    body.remove("created");
    Ok(Decoded {
        id,
        model,
        message: Message::Assistant {
            content: Content::Text(text),
            tool_calls: calls,
            provider_items: Vec::new(),
            extra: msg,
        },
        stop_reason,
        provider_stop_reason: finish,
        usage,
        provider_fields: body,
    })
}

/// Chunks (`chat.completion.chunk`) folded into one `chat.completion`.
#[derive(Default)]
pub(super) struct Stream {
    id: Option<Value>,
    model: Option<Value>,
    text: String,
    refusal: Option<String>,
    /// Tool calls by their `index`: (id, name, arguments text).
    calls: Vec<(String, String, String)>,
    finish: Option<Value>,
    usage: Option<Value>,
    /// Any other top-level fields (system_fingerprint…), last seen.
    rest: Map<String, Value>,
}

impl Stream {
    /// The slot of a tool call fragment with `index` and `id` (`whole`:
    /// its arguments are an object, which comes whole). OpenAI numbers a
    /// call's fragments by `index` and sends its id in the first; Ollama
    /// sends each call whole, with its own id or none, and no index or 0
    /// for every one. A fragment goes to the call with its id, if any;
    /// else to its index's (or the last), unless that call has another id,
    /// or is whole and this one is too: then it starts a new call (two
    /// calls were merged into one named `filesfiles`, and neither ran:
    /// found by a probe).
    fn call_slot(
        &mut self,
        index: Option<u64>,
        id: Option<&str>,
        whole: bool,
    ) -> Result<usize, ProviderError> {
        let by_id = id.and_then(|id| self.calls.iter().position(|c| c.0 == id));
        let at = match index {
            Some(i) => usize::try_from(i).unwrap_or(usize::MAX),
            // OpenAI numbers even calls with the same id apart: by index
            // first, then by id.
            None => match by_id {
                Some(at) => return Ok(at),
                None => self.calls.len().saturating_sub(1),
            },
        };
        let taken = |slot: &(String, String, String)| {
            id.is_some_and(|id| !slot.0.is_empty() && slot.0 != id) || (whole && !slot.2.is_empty())
        };
        let at = match self.calls.get(at) {
            Some(slot) if taken(slot) => by_id.unwrap_or(self.calls.len()),
            _ => at,
        };
        if at > 1024 {
            return Err(malformed("a tool call index above 1024"));
        }
        while self.calls.len() <= at {
            self.calls.push(Default::default());
        }
        Ok(at)
    }
}

impl StreamDecoder for Stream {
    fn event(&mut self, ev: &SseEvent, deltas: &mut Vec<Delta>) -> Result<Flow, ProviderError> {
        if ev.data.trim() == "[DONE]" {
            return Ok(Flow::Done);
        }
        let mut chunk = event_json(ev)?;
        if let Some(e) = chunk.get("error") {
            return Err(ProviderError::from_stream_event(e));
        }
        if let Some(v) = chunk.remove("id") {
            self.id = Some(v);
        }
        if let Some(v) = chunk.remove("model") {
            self.model = Some(v);
        }
        match chunk.remove("usage") {
            Some(Value::Null) | None => {}
            Some(u) => self.usage = Some(u),
        }
        if let Some(Value::Array(choices)) = chunk.remove("choices") {
            for c in choices
                .iter()
                .filter(|c| c.get("index").and_then(Value::as_u64).unwrap_or(0) == 0)
            {
                if let Some(f) = c.get("finish_reason").filter(|f| !f.is_null()) {
                    self.finish = Some(f.clone());
                }
                let Some(d) = c.get("delta") else { continue };
                if let Some(t) = d.get("content").and_then(Value::as_str)
                    && !t.is_empty()
                {
                    self.text.push_str(t);
                    deltas.push(Delta::Text { text: t.to_owned() });
                }
                if let Some(r) = d.get("refusal").and_then(Value::as_str) {
                    self.refusal.get_or_insert_with(String::new).push_str(r);
                }
                for tc in d
                    .get("tool_calls")
                    .and_then(Value::as_array)
                    .into_iter()
                    .flatten()
                {
                    let id = tc
                        .get("id")
                        .and_then(Value::as_str)
                        .filter(|i| !i.is_empty());
                    let f = tc.get("function");
                    let whole = f
                        .and_then(|f| f.get("arguments"))
                        .is_some_and(Value::is_object);
                    let index =
                        self.call_slot(tc.get("index").and_then(Value::as_u64), id, whole)?;
                    let slot = &mut self.calls[index];
                    let name = f.and_then(|f| f.get("name")).and_then(Value::as_str);
                    let object;
                    let args = match f.and_then(|f| f.get("arguments")) {
                        Some(Value::String(a)) => a.as_str(),
                        // The whole object at once (LiteLLM's Ollama): it
                        // was dropped, and the tool ran with `{}`.
                        Some(v @ Value::Object(_)) => {
                            object = v.to_string();
                            object.as_str()
                        }
                        _ => "",
                    };
                    if let Some(id) = id
                        && slot.0.is_empty()
                    {
                        slot.0 = id.to_owned();
                    }
                    // A name comes whole in a call's first fragment; some
                    // servers repeat it in every one (it grew to
                    // `filesfiles…`).
                    if let Some(n) = name
                        && slot.1 != n
                    {
                        slot.1.push_str(n);
                    }
                    slot.2.push_str(args);
                    deltas.push(Delta::ToolCall {
                        index,
                        id: id.map(str::to_owned),
                        name: name.map(str::to_owned),
                        arguments: args.to_owned(),
                    });
                }
            }
        }
        chunk.remove("object");
        chunk.remove("created");
        self.rest.extend(chunk);
        Ok(Flow::More)
    }

    fn finish(self: Box<Self>) -> Result<Value, ProviderError> {
        if self.finish.is_none() {
            return Err(malformed("the stream ended before the model finished"));
        }
        let calls: Vec<Value> = self
            .calls
            .into_iter()
            .map(|(id, name, args)| {
                json!({ "id": id, "type": "function", "function": { "name": name, "arguments": args } })
            })
            .collect();
        let mut message = json!({ "role": "assistant", "content": self.text });
        if !calls.is_empty() {
            message["tool_calls"] = calls.into();
        }
        if let Some(r) = self.refusal {
            message["refusal"] = r.into();
        }
        let mut body = self.rest;
        body.insert("id".into(), self.id.unwrap_or(Value::Null));
        body.insert("model".into(), self.model.unwrap_or(Value::Null));
        body.insert(
            "choices".into(),
            json!([{ "index": 0, "message": message, "finish_reason": self.finish }]),
        );
        if let Some(u) = self.usage {
            body.insert("usage".into(), u);
        }
        Ok(Value::Object(body))
    }
}
