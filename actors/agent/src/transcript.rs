//! What the harness reads from the transcript and rewrites in it: the
//! next tool call to run, unique call ids, a call's name and arguments.

use marmot_guest::Result;
use serde_json::{Value, json};

use crate::store;

/// Tool-call ids key results, approvals and idempotency keys, so they must
/// be unique in the conversation; some OpenAI-compatible servers send
/// empty ids or the same ids at every step. Such ids are replaced (the
/// gateway maps ids to what each provider accepts).
pub fn unique_call_ids(message: &mut Value, transcript: &[(String, Value)]) {
    // (`get_mut`: indexing a map mutably would add a null `tool_calls`.)
    let Some(calls) = message.get_mut("tool_calls").and_then(Value::as_array_mut) else {
        return;
    };
    let mut seen: std::collections::HashSet<String> = transcript
        .iter()
        .filter_map(|(_, m)| m["tool_calls"].as_array())
        .flatten()
        .filter_map(|c| c["id"].as_str().map(str::to_owned))
        .collect();
    for (i, c) in calls.iter_mut().enumerate() {
        let id = c["id"].as_str().unwrap_or_default().to_owned();
        if id.is_empty() || seen.contains(&id) {
            let mut fresh = format!("call_m{}_{i}", transcript.len());
            while seen.contains(&fresh) {
                fresh.push('x');
            }
            c["id"] = json!(fresh);
            seen.insert(fresh);
        } else {
            seen.insert(id);
        }
    }
}

/// The first call of the newest assistant message that has no result yet:
/// (call id, tool name, arguments).
pub fn next_call(transcript: &[(String, Value)]) -> Option<(String, String, Value)> {
    open_calls(transcript).into_iter().next().map(|c| {
        (
            c["id"].as_str().unwrap_or("").to_owned(),
            c["name"].as_str().unwrap_or("").to_owned(),
            c["arguments"].clone(),
        )
    })
}

/// Where call `call_id` is among the calls of the newest assistant
/// message (from 0).
pub fn call_position(transcript: &[(String, Value)], call_id: &str) -> Option<usize> {
    let (_, m) = transcript.iter().rfind(|(_, m)| m["role"] == "assistant")?;
    m["tool_calls"]
        .as_array()?
        .iter()
        .position(|c| c["id"] == call_id)
}

/// The calls of the newest assistant message that have no result yet, in
/// order.
pub fn open_calls(transcript: &[(String, Value)]) -> Vec<&Value> {
    let Some(i) = transcript
        .iter()
        .rposition(|(_, m)| m["role"] == "assistant")
    else {
        return Vec::new();
    };
    let answered: Vec<&str> = transcript[i + 1..]
        .iter()
        .filter(|(_, m)| m["role"] == "tool")
        .filter_map(|(_, m)| m["tool_call_id"].as_str())
        .collect();
    transcript[i].1["tool_calls"]
        .as_array()
        .into_iter()
        .flatten()
        .filter(|c| !answered.contains(&c["id"].as_str().unwrap_or("")))
        .collect()
}

/// The tool a call of the transcript names.
pub fn call_name(call_id: &str) -> Result<Option<String>> {
    for (_, m) in store::transcript()?.iter().rev() {
        if let Some(c) = m["tool_calls"]
            .as_array()
            .and_then(|cs| cs.iter().find(|c| c["id"] == call_id))
        {
            return Ok(c["name"].as_str().map(str::to_owned));
        }
    }
    Ok(None)
}

/// Rewrite a call's arguments (a person edited them before approving).
pub fn set_call_arguments(call_id: &str, args: &Value) -> Result<()> {
    for (key, mut m) in store::transcript()?.into_iter().rev() {
        if let Some(c) = m["tool_calls"]
            .as_array_mut()
            .and_then(|cs| cs.iter_mut().find(|c| c["id"] == call_id))
        {
            c["arguments"] = args.clone();
            return store::replace(&key, &m);
        }
    }
    Ok(())
}

pub fn content_text(v: &Value) -> String {
    match v {
        Value::String(s) => s.clone(),
        Value::Array(parts) => parts
            .iter()
            .filter_map(|p| p["text"].as_str())
            .collect::<Vec<_>>()
            .join(""),
        Value::Null => String::new(),
        v => v.to_string(),
    }
}
