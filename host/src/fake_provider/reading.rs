//! What the fake reads from a request: its checks (the ones the real
//! APIs make) and the default echo answer.

use serde_json::{Value, json};

use super::{Scripted, Vendor};

/// The default answer.
pub(super) fn echo(vendor: Vendor, body: &Value) -> Scripted {
    let (last_role, last_text) = last_message(vendor, body);
    if last_role == "tool" {
        return Scripted::Text(format!("Done. The tool said: {last_text}"));
    }
    let call = |name: &str, args: Value| Scripted::ToolCalls {
        text: String::new(),
        calls: vec![(
            format!("call_{}", rand::random::<u32>()),
            name.to_owned(),
            args,
        )],
    };
    if let Some(rest) = last_text.trim().strip_prefix("call ") {
        let (name, args) = rest.split_once(' ').unwrap_or((rest, "{}"));
        return call(
            name,
            serde_json::from_str(args).unwrap_or_else(|_| json!({})),
        );
    }
    let tools = tool_names(vendor, body);
    if tools.iter().any(|t| t == "files")
        && let Some(path) = last_text
            .split_whitespace()
            .find(|w| w.starts_with("outputs/"))
    {
        let path = path.trim_end_matches(['.', ',', ';', ':', ')']);
        let report = format!("# Report\n\nAsked for: {last_text}\n");
        return call(
            "files",
            json!({ "op": "write", "path": path, "content": report }),
        );
    }
    if tools.iter().any(|t| t == "create_ticket") && last_text.to_lowercase().contains("ticket") {
        let title: String = last_text.chars().take(80).collect();
        return call("create_ticket", json!({ "title": title }));
    }
    Scripted::Text(format!("You said: {last_text}"))
}

/// The names of the tools a request offers.
pub(super) fn tool_names(vendor: Vendor, body: &Value) -> Vec<String> {
    body["tools"]
        .as_array()
        .into_iter()
        .flatten()
        .filter_map(|t| match vendor {
            Vendor::Chat => t["function"]["name"].as_str(),
            _ => t["name"].as_str(),
        })
        .map(str::to_owned)
        .collect()
}

/// The last message's role (`tool` for any tool result) and its text.
pub(super) fn last_message(vendor: Vendor, body: &Value) -> (String, String) {
    let list = match vendor {
        Vendor::Responses => body.get("input"),
        _ => body.get("messages"),
    };
    let Some(last) = list.and_then(Value::as_array).and_then(|l| l.last()) else {
        return ("user".into(), String::new());
    };
    let text_of = |v: &Value| -> String {
        match v {
            Value::String(s) => s.clone(),
            Value::Array(parts) => parts
                .iter()
                .filter_map(|p| {
                    p.get("text")
                        .or_else(|| p.get("content"))
                        .and_then(Value::as_str)
                })
                .collect::<Vec<_>>()
                .join(""),
            _ => String::new(),
        }
    };
    match vendor {
        Vendor::Responses
            if last.get("type").and_then(Value::as_str) == Some("function_call_output") =>
        {
            (
                "tool".into(),
                last["output"].as_str().unwrap_or("").to_owned(),
            )
        }
        Vendor::Anthropic
            if last["content"]
                .as_array()
                .is_some_and(|c| c.iter().any(|b| b["type"] == "tool_result")) =>
        {
            ("tool".into(), text_of(&last["content"]))
        }
        _ => (
            last["role"].as_str().unwrap_or("user").to_owned(),
            text_of(&last["content"]),
        ),
    }
}

/// A called tool's name as both vendors require it in the conversation
/// sent back (a model may well have called another).
fn tool_name_ok(name: &Value) -> bool {
    name.as_str().is_some_and(|n| {
        (1..=64).contains(&n.len())
            && n.bytes()
                .all(|b| b.is_ascii_alphanumeric() || b == b'_' || b == b'-')
    })
}

/// The provider's rules Marmot must follow.
pub(super) fn check(vendor: Vendor, body: &Value) -> Result<(), String> {
    if body.get("model").and_then(Value::as_str).is_none() {
        return Err("model: field required".into());
    }
    match vendor {
        Vendor::Anthropic => {
            if body.get("max_tokens").and_then(Value::as_u64).is_none() {
                return Err("max_tokens: field required".into());
            }
            let msgs = body["messages"]
                .as_array()
                .ok_or("messages: field required")?;
            let mut expect = "user";
            let mut open: Vec<String> = Vec::new();
            for (i, m) in msgs.iter().enumerate() {
                if m["role"] != expect {
                    return Err(format!(
                        "messages.{i}: roles must alternate between \"user\" and \"assistant\""
                    ));
                }
                let blocks = m["content"].as_array().cloned().unwrap_or_default();
                if expect == "user" {
                    for id in &open {
                        if !blocks
                            .iter()
                            .any(|b| b["type"] == "tool_result" && b["tool_use_id"] == id.as_str())
                        {
                            return Err(format!(
                                "messages.{i}: tool_use ids were found without tool_result blocks immediately after: {id}"
                            ));
                        }
                    }
                    open.clear();
                } else {
                    for b in blocks.iter().filter(|b| b["type"] == "tool_use") {
                        let id = b["id"].as_str().unwrap_or("");
                        if id.is_empty()
                            || !id
                                .bytes()
                                .all(|c| c.is_ascii_alphanumeric() || c == b'_' || c == b'-')
                        {
                            return Err(format!(
                                "messages.{i}.content: tool_use.id: String should match pattern '^[a-zA-Z0-9_-]+$'"
                            ));
                        }
                        if !tool_name_ok(&b["name"]) {
                            return Err(format!(
                                "messages.{i}.content: tool_use.name: String should match pattern '^[a-zA-Z0-9_-]{{1,64}}$'"
                            ));
                        }
                        open.push(id.to_owned());
                    }
                }
                expect = if expect == "user" {
                    "assistant"
                } else {
                    "user"
                };
            }
            if !open.is_empty() {
                return Err(
                    "tool_use ids were found without tool_result blocks immediately after".into(),
                );
            }
        }
        Vendor::Chat => {
            let msgs = body["messages"]
                .as_array()
                .ok_or("messages: field required")?;
            let mut open: Vec<String> = Vec::new();
            for m in msgs {
                match m["role"].as_str() {
                    Some("tool") => {
                        let id = m["tool_call_id"].as_str().unwrap_or("");
                        if !open.iter().any(|o| o == id) {
                            return Err("Invalid parameter: messages with role 'tool' must be a response to a preceeding message with 'tool_calls'.".into());
                        }
                        open.retain(|o| o != id);
                    }
                    _ if !open.is_empty() => {
                        return Err("An assistant message with 'tool_calls' must be followed by tool messages responding to each 'tool_call_id'.".into());
                    }
                    Some("assistant") => {
                        for c in m["tool_calls"].as_array().into_iter().flatten() {
                            let id = c["id"].as_str().unwrap_or("");
                            if id.len() > 40 {
                                return Err("Invalid 'messages.tool_calls.id': string too long. Expected a string with maximum length 40".into());
                            }
                            if !tool_name_ok(&c["function"]["name"]) {
                                return Err("Invalid 'messages.tool_calls.function.name': string does not match pattern. Expected a string that matches the pattern '^[a-zA-Z0-9_-]{1,64}$'.".into());
                            }
                            open.push(id.to_owned());
                        }
                    }
                    _ => {}
                }
            }
            if !open.is_empty() {
                return Err("An assistant message with 'tool_calls' must be followed by tool messages responding to each 'tool_call_id'.".into());
            }
        }
        Vendor::Responses => {
            let items = body["input"].as_array().ok_or("input: field required")?;
            let mut calls: Vec<&str> = Vec::new();
            for it in items {
                match it["type"].as_str() {
                    Some("function_call") => calls.push(it["call_id"].as_str().unwrap_or("")),
                    Some("function_call_output") => {
                        let id = it["call_id"].as_str().unwrap_or("");
                        if !calls.contains(&id) {
                            return Err(format!(
                                "No tool call found for function call output with call_id {id}."
                            ));
                        }
                    }
                    _ => {}
                }
            }
        }
    }
    Ok(())
}
