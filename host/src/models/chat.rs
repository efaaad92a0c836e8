//! The one chat shape guests speak, whatever the provider's wire format.
//!
//! A request names a provider and a model and carries messages (`system`,
//! `user`, `assistant` with tool calls, `tool` results), tool definitions
//! with JSON Schema, and the usual knobs. What the shape has no field for
//! passes through untouched: unknown keys on a message or a tool go into the
//! provider's message or tool as they are, and `provider_options` is merged
//! into the provider's request body. Unknown content parts and provider
//! output items (reasoning, thinking blocks) are kept the same way, so a
//! transcript sent back keeps them. docs/models.md shows the shape.

use serde::{Deserialize, Serialize};
use serde_json::{Map, Value};
use sha2::{Digest, Sha256};

/// A chat call.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ChatRequest {
    /// A provider configured on the node (`PUT /v1/providers/{name}`).
    pub provider: String,
    /// The provider's model name.
    pub model: String,
    /// Instructions; `system` messages are added after it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub system: Option<String>,
    /// The conversation.
    pub messages: Vec<Message>,
    /// Tools the model may call.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub tools: Vec<Tool>,
    /// `auto`, `none`, `required`, or `{"name": …}`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tool_choice: Option<ToolChoice>,
    /// Most tokens the model may write.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_output_tokens: Option<u64>,
    /// Sampling temperature.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub temperature: Option<f64>,
    /// Stop sequences.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub stop: Vec<String>,
    /// Stream token deltas to the actor's live event stream while the call
    /// runs (the guest still gets the whole response at the end).
    #[serde(default)]
    pub stream: bool,
    /// Tried in order when the provider is unavailable before its first
    /// token (after its retries).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub fallbacks: Vec<Target>,
    /// Merged into the provider's request body as given.
    #[serde(default, skip_serializing_if = "Map::is_empty")]
    pub provider_options: Map<String, Value>,
}

/// A provider and one of its models.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Target {
    /// The provider's name on this node.
    pub provider: String,
    /// Its model.
    #[serde(alias = "name")]
    pub model: String,
}

/// One message of a conversation.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "role", rename_all = "lowercase")]
pub enum Message {
    /// Instructions.
    System {
        /// The text.
        content: Content,
        /// Passed through to the provider's message.
        #[serde(flatten)]
        extra: Map<String, Value>,
    },
    /// The user (or the system driving the model).
    User {
        /// Text or parts.
        content: Content,
        /// Passed through.
        #[serde(flatten)]
        extra: Map<String, Value>,
    },
    /// The model.
    Assistant {
        /// What it wrote.
        #[serde(default)]
        content: Content,
        /// The tools it called.
        #[serde(default, skip_serializing_if = "Vec::is_empty")]
        tool_calls: Vec<ToolCall>,
        /// Provider output the shape has no field for (reasoning items,
        /// thinking blocks), sent back to the same wire format as it came.
        #[serde(default, skip_serializing_if = "Vec::is_empty")]
        provider_items: Vec<Value>,
        /// Passed through.
        #[serde(flatten)]
        extra: Map<String, Value>,
    },
    /// A tool's result.
    Tool {
        /// The call it answers.
        tool_call_id: String,
        /// The result: text, or JSON (sent as its text).
        content: Content,
        /// The tool failed.
        #[serde(default, skip_serializing_if = "std::ops::Not::not")]
        is_error: bool,
        /// Passed through.
        #[serde(flatten)]
        extra: Map<String, Value>,
    },
}

/// A message's content: text, or a list of parts (`{"type": "text",
/// "text": …}` and anything else, passed through).
#[derive(Debug, Clone, PartialEq, Serialize)]
#[serde(untagged)]
pub enum Content {
    /// Plain text.
    Text(String),
    /// Parts: a list of objects, each with a string `type`.
    Parts(Vec<Value>),
    /// Any other JSON (a tool result given as an object, or as a list of
    /// anything but parts): sent as its JSON text.
    Json(Value),
}

/// A list is parts only if each item is an object with a string `type`:
/// a tool's result that is a list of records (a file listing, a client
/// tool's answer) was read as parts with no text, and reached the model as
/// `""`, or as blocks Anthropic refuses (found by a probe).
impl<'de> Deserialize<'de> for Content {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let is_part = |v: &Value| v.get("type").is_some_and(Value::is_string);
        Ok(match Value::deserialize(d)? {
            Value::String(t) => Content::Text(t),
            // An empty list is no parts, as it was (as text it became a
            // "[]" the model read from the user and itself).
            Value::Array(items) if items.iter().all(is_part) => Content::Parts(items),
            v => Content::Json(v),
        })
    }
}

impl Default for Content {
    fn default() -> Self {
        Content::Text(String::new())
    }
}

impl Content {
    /// The text of the content: text parts joined, JSON as its text.
    pub fn text(&self) -> String {
        match self {
            Content::Text(t) => t.clone(),
            Content::Parts(parts) => parts
                .iter()
                .filter_map(|p| p.get("text").and_then(Value::as_str))
                .collect::<Vec<_>>()
                .join(""),
            Content::Json(v) => v.to_string(),
        }
    }

    /// The content as one text for a tool result, where a format takes
    /// only text: text parts joined, anything else as its JSON text (no
    /// part dropped).
    pub fn tool_text(&self) -> String {
        let is_text =
            |p: &Value| p.get("type") == Some(&Value::from("text")) && p["text"].is_string();
        match self {
            // A tool that found nothing answered `[]`: that, not "".
            Content::Parts(parts) if parts.is_empty() || !parts.iter().all(is_text) => {
                Value::from(parts.clone()).to_string()
            }
            c => c.text(),
        }
    }

    /// Nothing in it.
    pub fn is_empty(&self) -> bool {
        match self {
            Content::Text(t) => t.is_empty(),
            Content::Parts(p) => p.is_empty(),
            Content::Json(v) => v.is_null(),
        }
    }
}

/// A tool the model called.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ToolCall {
    /// The provider's id for the call.
    pub id: String,
    /// The tool (missing or `null` in a past call: empty; `sendable`
    /// gives it a name every format takes).
    #[serde(default, deserialize_with = "null_as_empty")]
    pub name: String,
    /// Its arguments: JSON, or the text the model wrote when that was not
    /// JSON (a call cut off by `max_tokens`).
    #[serde(default)]
    pub arguments: Value,
}

/// A string that may be `null`, as empty.
fn null_as_empty<'de, D: serde::Deserializer<'de>>(d: D) -> Result<String, D::Error> {
    Ok(Option::<String>::deserialize(d)?.unwrap_or_default())
}

/// A tool the model may call.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Tool {
    /// Its name (`^[a-zA-Z0-9_-]{1,64}$`, what every format accepts).
    pub name: String,
    /// What it does, for the model.
    #[serde(default)]
    pub description: String,
    /// JSON Schema of its arguments (an object schema).
    #[serde(default = "empty_object_schema")]
    pub input_schema: Value,
    /// Passed through.
    #[serde(flatten)]
    pub extra: Map<String, Value>,
}

fn empty_object_schema() -> Value {
    serde_json::json!({ "type": "object", "properties": {} })
}

/// How the model must use tools.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(untagged)]
pub enum ToolChoice {
    /// `auto`, `none` or `required`.
    Mode(String),
    /// This tool.
    Named {
        /// The tool.
        name: String,
    },
}

/// A finished chat call.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ChatResponse {
    /// The provider that answered (a fallback, perhaps).
    pub provider: String,
    /// The model that answered, as the provider names it.
    pub model: String,
    /// The provider's response id.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub id: Option<String>,
    /// The answer: always an `assistant` message, ready to append to the
    /// conversation.
    pub message: Message,
    /// Why the model stopped.
    pub stop_reason: StopReason,
    /// The provider's own word for it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub provider_stop_reason: Option<String>,
    /// Tokens used.
    pub usage: Usage,
    /// Top-level fields of the provider's response the shape has no field
    /// for.
    #[serde(default, skip_serializing_if = "Map::is_empty")]
    pub provider_fields: Map<String, Value>,
    /// Providers tried before this answer, and why they failed.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub attempts: Vec<Attempt>,
}

/// Why a model stopped.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum StopReason {
    /// It finished.
    EndTurn,
    /// It called tools and waits for their results.
    ToolUse,
    /// It hit `max_output_tokens`.
    MaxTokens,
    /// It wrote a stop sequence.
    StopSequence,
    /// The provider filtered the output.
    ContentFilter,
    /// The model refused.
    Refusal,
    /// Anything else (`provider_stop_reason` says what).
    Other,
}

/// Tokens used by a call.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct Usage {
    /// Prompt tokens, cached ones included.
    pub input_tokens: u64,
    /// Generated tokens, reasoning included.
    pub output_tokens: u64,
    /// What the call cost in US dollars, when the provider's prices for
    /// the model are configured.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cost_usd: Option<f64>,
    /// Provider details (cache reads and writes, reasoning tokens).
    #[serde(flatten)]
    pub extra: Map<String, Value>,
}

/// A provider tried before the answer.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Attempt {
    /// The provider.
    pub provider: String,
    /// The model.
    pub model: String,
    /// What went wrong.
    pub error: String,
}

/// A piece of a streamed answer, as it arrives.
#[derive(Debug, Clone, PartialEq, Serialize)]
#[serde(tag = "type", rename_all = "snake_case")]
pub enum Delta {
    /// Text.
    Text {
        /// The new text.
        text: String,
    },
    /// A tool call being written.
    ToolCall {
        /// Which call of this response (from 0).
        index: usize,
        /// Its id, when this delta starts it.
        #[serde(skip_serializing_if = "Option::is_none")]
        id: Option<String>,
        /// The tool, when this delta starts it.
        #[serde(skip_serializing_if = "Option::is_none")]
        name: Option<String>,
        /// More of its arguments' JSON text.
        arguments: String,
    },
}

impl Delta {
    /// Whether it carries some of the answer (an empty one is the
    /// provider's keep-alive, whatever its shape).
    pub fn carries_content(&self) -> bool {
        match self {
            Delta::Text { text } => !text.is_empty(),
            Delta::ToolCall {
                id,
                name,
                arguments,
                ..
            } => id.is_some() || name.is_some() || !arguments.is_empty(),
        }
    }
}

/// The longest tool name any format accepts.
const MAX_TOOL_NAME: usize = 64;

fn valid_tool_name(name: &str) -> bool {
    !name.is_empty()
        && name.len() <= MAX_TOOL_NAME
        && name
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b == b'_' || b == b'-')
}

impl ChatRequest {
    /// Parse and check a request from JSON text.
    pub fn parse(text: &str) -> Result<Self, String> {
        let req: ChatRequest = serde_json::from_str(text).map_err(|e| {
            format!("the chat request is not valid: {e} (docs/models.md shows the shape)")
        })?;
        req.check()?;
        Ok(req)
    }

    /// Shape rules every format shares.
    pub fn check(&self) -> Result<(), String> {
        for t in std::iter::once(&self.target()).chain(&self.fallbacks) {
            if t.provider.is_empty() || t.model.is_empty() {
                return Err("provider and model must not be empty".into());
            }
        }
        if self.messages.is_empty() {
            return Err("messages must not be empty".into());
        }
        let mut names = std::collections::HashSet::new();
        for t in &self.tools {
            if !valid_tool_name(&t.name) {
                return Err(format!(
                    "tool name `{}` must be 1-64 letters, digits, `_` or `-`",
                    t.name
                ));
            }
            if !names.insert(t.name.as_str()) {
                return Err(format!("tool `{}` is defined twice", t.name));
            }
            if !t.input_schema.is_object() {
                return Err(format!(
                    "tool `{}`: input_schema must be a JSON Schema object",
                    t.name
                ));
            }
        }
        match &self.tool_choice {
            Some(ToolChoice::Mode(m)) if !matches!(m.as_str(), "auto" | "none" | "required") => {
                return Err(format!(
                    "tool_choice must be auto, none, required or {{\"name\": …}}, not `{m}`"
                ));
            }
            Some(ToolChoice::Named { name }) if !names.contains(name.as_str()) => {
                return Err(format!("tool_choice names `{name}`, which is not in tools"));
            }
            _ => {}
        }
        if self.max_output_tokens == Some(0) {
            return Err("max_output_tokens must be at least 1".into());
        }
        for m in &self.messages {
            if let Message::Tool { tool_call_id, .. } = m
                && tool_call_id.is_empty()
            {
                return Err("a tool message needs its tool_call_id".into());
            }
            // (Not its name: a model's call of a name no tool has, even an
            // empty one, is history; `sendable` makes it one every format
            // takes.)
            if let Message::Assistant { tool_calls, .. } = m
                && tool_calls.iter().any(|c| c.id.is_empty())
            {
                return Err("a tool call needs an id".into());
            }
        }
        Ok(())
    }

    /// The primary provider and model.
    pub fn target(&self) -> Target {
        Target {
            provider: self.provider.clone(),
            model: self.model.clone(),
        }
    }

    /// The system text: `system` and then every system message.
    pub fn system_text(&self) -> Option<String> {
        let parts: Vec<String> = self
            .system
            .iter()
            .cloned()
            .chain(self.messages.iter().filter_map(|m| match m {
                Message::System { content, .. } => Some(content.text()),
                _ => None,
            }))
            .filter(|s| !s.is_empty())
            .collect();
        (!parts.is_empty()).then(|| parts.join("\n\n"))
    }
}

/// The conversation as it may be sent: system messages out (every format
/// takes them apart), tool calls without a result and results without a
/// call dropped (every provider refuses them, and a run cut off mid-call
/// leaves one), and tool-call ids and names made acceptable to every
/// format.
pub fn sendable(messages: &[Message]) -> Vec<Message> {
    use std::collections::HashSet;
    let answered: HashSet<&str> = messages
        .iter()
        .filter_map(|m| match m {
            Message::Tool { tool_call_id, .. } => Some(tool_call_id.as_str()),
            _ => None,
        })
        .collect();
    let mut called: HashSet<String> = HashSet::new();
    let mut out = Vec::with_capacity(messages.len());
    for m in messages {
        match m {
            Message::System { .. } => {}
            Message::Assistant {
                content,
                tool_calls,
                provider_items,
                extra,
            } => {
                let calls: Vec<ToolCall> = tool_calls
                    .iter()
                    .filter(|c| answered.contains(c.id.as_str()))
                    .map(|c| {
                        called.insert(c.id.clone());
                        ToolCall {
                            id: wire_id(&c.id),
                            name: wire_tool_name(&c.name),
                            ..c.clone()
                        }
                    })
                    .collect();
                if content.is_empty() && calls.is_empty() && provider_items.is_empty() {
                    continue;
                }
                out.push(Message::Assistant {
                    content: content.clone(),
                    tool_calls: calls,
                    provider_items: provider_items.clone(),
                    extra: extra.clone(),
                });
            }
            Message::Tool {
                tool_call_id,
                content,
                is_error,
                extra,
            } => {
                if called.contains(tool_call_id) {
                    out.push(Message::Tool {
                        tool_call_id: wire_id(tool_call_id),
                        content: content.clone(),
                        is_error: *is_error,
                        extra: extra.clone(),
                    });
                }
            }
            Message::User { .. } => out.push(m.clone()),
        }
    }
    out
}

/// A tool-call id every format accepts: Anthropic wants
/// `^[a-zA-Z0-9_-]+$`, OpenAI at most 40 characters. Other ids (another
/// provider's, a fallback's) are replaced by a hash of themselves, so a call
/// and its result still match.
pub fn wire_id(id: &str) -> String {
    let ok = !id.is_empty()
        && id.len() <= 40
        && id
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b == b'_' || b == b'-');
    if ok {
        return id.to_owned();
    }
    let digest = Sha256::digest(id.as_bytes());
    format!("call_{}", &hex::encode(digest)[..32])
}

/// The name a past tool call is sent back under: its own when every
/// format takes it (what a tool's name must be), else its letters, digits,
/// `_` and `-` with every other character as `_`, cut to 64 (`unnamed_tool`
/// for an empty one). A model may call a name no tool has
/// (`multi_tool_use.parallel`, an empty one); its result says there is no
/// such tool, but sent back as it was, the call got every later request of
/// the conversation refused (400), and the agent could not run again (a
/// probe).
pub fn wire_tool_name(name: &str) -> String {
    if valid_tool_name(name) {
        return name.to_owned();
    }
    let kept: String = name
        .chars()
        .map(|c| {
            if c.is_ascii_alphanumeric() || c == '-' {
                c
            } else {
                '_'
            }
        })
        .take(MAX_TOOL_NAME)
        .collect();
    if kept.is_empty() {
        "unnamed_tool".to_owned()
    } else {
        kept
    }
}

/// Parse a tool call's arguments text: JSON when it is, else the text.
pub fn arguments_value(text: &str) -> Value {
    if text.trim().is_empty() {
        return Value::Object(Map::new());
    }
    serde_json::from_str(text).unwrap_or_else(|_| Value::String(text.to_owned()))
}

/// A tool call's arguments as JSON text (what OpenAI's formats want).
pub fn arguments_text(v: &Value) -> String {
    match v {
        Value::String(s) => s.clone(),
        Value::Null => "{}".into(),
        v => v.to_string(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn req(v: Value) -> Result<ChatRequest, String> {
        ChatRequest::parse(&v.to_string())
    }

    #[test]
    fn unknown_message_keys_pass_through_and_round_trip() {
        let r = req(json!({
            "provider": "p", "model": "m",
            "messages": [
                {"role": "user", "content": "hi", "cache_control": {"type": "ephemeral"}},
                {"role": "assistant", "content": "", "tool_calls": [{"id": "c1", "name": "f", "arguments": {"a": 1}}]},
                {"role": "tool", "tool_call_id": "c1", "content": {"ok": true}}
            ]
        }))
        .unwrap();
        let Message::User { extra, .. } = &r.messages[0] else {
            panic!()
        };
        assert_eq!(extra["cache_control"], json!({"type": "ephemeral"}));
        let back: Value = serde_json::to_value(&r).unwrap();
        assert_eq!(back["messages"][0]["cache_control"]["type"], "ephemeral");
        assert_eq!(back["messages"][2]["content"], json!({"ok": true}));
    }

    #[test]
    fn bad_requests_name_the_problem() {
        let base =
            json!({"provider": "p", "model": "m", "messages": [{"role": "user", "content": "x"}]});
        let with = |k: &str, v: Value| {
            let mut b = base.clone();
            b[k] = v;
            req(b).unwrap_err()
        };
        assert!(with("messages", json!([])).contains("messages"));
        assert!(with("tools", json!([{"name": "a b"}])).contains("tool name"));
        assert!(with("tools", json!([{"name": "a", "input_schema": 3}])).contains("input_schema"));
        assert!(with("tool_choice", json!("sometimes")).contains("tool_choice"));
        assert!(with("tool_choice", json!({"name": "nope"})).contains("not in tools"));
        assert!(with("max_output_tokens", json!(0)).contains("at least 1"));
        assert!(with("temprature", json!(1)).contains("unknown field"));
        assert!(with("messages", json!([{"role": "robot", "content": "x"}])).contains("not valid"));
    }

    #[test]
    fn orphaned_calls_and_results_are_not_sent() {
        let r = req(json!({
            "provider": "p", "model": "m",
            "messages": [
                {"role": "system", "content": "be brief"},
                {"role": "user", "content": "go"},
                {"role": "assistant", "content": "", "tool_calls": [
                    {"id": "a", "name": "f", "arguments": {}},
                    {"id": "b", "name": "f", "arguments": {}}]},
                {"role": "tool", "tool_call_id": "a", "content": "done"},
                {"role": "tool", "tool_call_id": "zzz", "content": "stray"},
                {"role": "assistant", "content": "", "tool_calls": [{"id": "c", "name": "f"}]}
            ]
        }))
        .unwrap();
        let sent = sendable(&r.messages);
        assert_eq!(sent.len(), 3, "{sent:?}");
        let Message::Assistant { tool_calls, .. } = &sent[1] else {
            panic!()
        };
        assert_eq!(tool_calls.len(), 1);
        assert_eq!(tool_calls[0].id, "a");
        assert!(matches!(&sent[2], Message::Tool { tool_call_id, .. } if tool_call_id == "a"));
        assert_eq!(r.system_text().as_deref(), Some("be brief"));
    }

    /// A model's call of a name no format takes (here: none, and one
    /// with a dot) is history the next request carries: it is checked
    /// and sent under a name every format takes, with its result.
    #[test]
    fn calls_of_names_no_format_takes_are_sent_under_names_they_take() {
        let r = req(json!({
            "provider": "p", "model": "m",
            "messages": [
                {"role": "user", "content": "go"},
                {"role": "assistant", "content": "", "tool_calls": [
                    {"id": "a", "name": "", "arguments": {}},
                    {"id": "b", "name": null, "arguments": {}},
                    {"id": "c", "name": "multi_tool_use.parallel", "arguments": {}},
                    {"id": "d", "name": "lookup", "arguments": {}}]},
                {"role": "tool", "tool_call_id": "a", "content": "there is no tool named ``"},
                {"role": "tool", "tool_call_id": "b", "content": "there is no tool named ``"},
                {"role": "tool", "tool_call_id": "c", "content": "no such tool"},
                {"role": "tool", "tool_call_id": "d", "content": "found"}
            ]
        }))
        .unwrap();
        r.check()
            .expect("the model's own calls are history, not bad input");
        let sent = sendable(&r.messages);
        let Message::Assistant { tool_calls, .. } = &sent[1] else {
            panic!("{sent:?}")
        };
        let names: Vec<&str> = tool_calls.iter().map(|c| c.name.as_str()).collect();
        assert_eq!(
            names,
            [
                "unnamed_tool",
                "unnamed_tool",
                "multi_tool_use_parallel",
                "lookup"
            ]
        );
        assert_eq!(sent.len(), 6, "every call keeps its result: {sent:?}");
        let long = wire_tool_name(&format!("é{}", "x".repeat(100)));
        assert_eq!(long.len(), MAX_TOOL_NAME);
        assert!(valid_tool_name(&long), "{long}");
        // A call without an id is still bad input.
        let e = req(json!({"provider": "p", "model": "m", "messages": [
            {"role": "assistant", "content": "", "tool_calls": [{"id": "", "name": "f"}]}]}))
        .unwrap_err();
        assert!(e.contains("needs an id"), "{e}");
    }

    #[test]
    fn ids_are_made_acceptable_consistently() {
        assert_eq!(wire_id("call_abc-1"), "call_abc-1");
        let odd = wire_id("fc_12.34|x");
        assert!(odd.starts_with("call_") && odd.len() <= 40, "{odd}");
        assert_eq!(odd, wire_id("fc_12.34|x"));
        let long = "x".repeat(64);
        assert!(wire_id(&long).len() <= 40);
        assert_ne!(wire_id("a.b"), wire_id("a:b"));
    }
}
