//! What the fake writes: answers and errors in each vendor's wire format,
//! whole or as server-sent events.

use std::time::Duration;

use axum::body::{Body, Bytes};
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use serde_json::{Value, json};

use super::Vendor;

pub(super) fn error(
    vendor: Vendor,
    status: u16,
    ty: &str,
    message: &str,
    retry_after: Option<String>,
) -> Response {
    let body = match vendor {
        Vendor::Anthropic => json!({"type": "error", "error": {"type": ty, "message": message}}),
        _ => json!({"error": {"message": message, "type": ty, "param": null, "code": null}}),
    };
    let mut r = (
        StatusCode::from_u16(status).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR),
        axum::Json(body),
    )
        .into_response();
    if let Some(ra) = retry_after
        && let Ok(v) = ra.parse()
    {
        r.headers_mut().insert("retry-after", v);
    }
    r
}

/// In a scripted text, a boundary between two streamed deltas that is
/// not a space (not sent): a test splits a word over deltas with it.
pub const DELTA_BREAK: char = '\u{1f}';

/// Words of `text`, each with its following space: the streamed deltas.
pub(super) fn words(text: &str) -> Vec<String> {
    let mut out = Vec::new();
    let mut cur = String::new();
    for c in text.chars() {
        if c == DELTA_BREAK {
            out.push(std::mem::take(&mut cur));
            continue;
        }
        cur.push(c);
        if c == ' ' {
            out.push(std::mem::take(&mut cur));
        }
    }
    if !cur.is_empty() {
        out.push(cur);
    }
    out
}

#[allow(clippy::too_many_arguments)]
pub(super) fn answer_with(
    vendor: Vendor,
    model: &str,
    input_tokens: u64,
    text: &str,
    calls: &[(String, String, Value)],
    stream: bool,
    delay: Duration,
) -> Response {
    let output_tokens = words(text).len() as u64 + 10 * calls.len() as u64;
    if !stream {
        let text = text.replace(DELTA_BREAK, "");
        let text = text.as_str();
        let body = match vendor {
            Vendor::Chat => {
                let mut message = json!({"role": "assistant", "content": if text.is_empty() { Value::Null } else { text.into() }});
                if !calls.is_empty() {
                    message["tool_calls"] = calls
                        .iter()
                        .map(|(id, name, args)| json!({"id": id, "type": "function", "function": {"name": name, "arguments": args.to_string()}}))
                        .collect();
                }
                json!({"id": "chatcmpl-fake", "object": "chat.completion", "created": 0, "model": model,
                       "choices": [{"index": 0, "message": message,
                                    "finish_reason": if calls.is_empty() { "stop" } else { "tool_calls" }}],
                       "usage": {"prompt_tokens": input_tokens, "completion_tokens": output_tokens,
                                 "total_tokens": input_tokens + output_tokens}})
            }
            Vendor::Anthropic => {
                let mut content = Vec::new();
                if !text.is_empty() {
                    content.push(json!({"type": "text", "text": text}));
                }
                for (id, name, args) in calls {
                    content
                        .push(json!({"type": "tool_use", "id": id, "name": name, "input": args}));
                }
                json!({"id": "msg_fake", "type": "message", "role": "assistant", "model": model,
                       "content": content, "stop_reason": if calls.is_empty() { "end_turn" } else { "tool_use" },
                       "stop_sequence": null,
                       "usage": {"input_tokens": input_tokens, "output_tokens": output_tokens}})
            }
            Vendor::Responses => responses_object(model, text, calls, input_tokens, output_tokens),
        };
        return axum::Json(body).into_response();
    }
    let mut frames = start_frames(vendor, model, input_tokens);
    frames.extend(text_frames(vendor, text));
    match vendor {
        Vendor::Chat => {
            for (i, (id, name, args)) in calls.iter().enumerate() {
                frames.push(chat_chunk(
                    model,
                    json!({"tool_calls": [{"index": i, "id": id, "type": "function",
                    "function": {"name": name, "arguments": ""}}]}),
                    Value::Null,
                ));
                let a = args.to_string();
                let (x, y) = a.split_at(a.len() / 2);
                for part in [x, y] {
                    frames.push(chat_chunk(
                        model,
                        json!({"tool_calls": [{"index": i, "function": {"arguments": part}}]}),
                        Value::Null,
                    ));
                }
            }
            let finish = if calls.is_empty() {
                "stop"
            } else {
                "tool_calls"
            };
            frames.push(chat_chunk(model, json!({}), finish.into()));
            frames.push(sse(
                None,
                json!({"id": "chatcmpl-fake", "object": "chat.completion.chunk", "created": 0,
                "model": model, "choices": [], "usage": {"prompt_tokens": input_tokens,
                "completion_tokens": output_tokens, "total_tokens": input_tokens + output_tokens}}),
            ));
            frames.push("data: [DONE]\n\n".into());
        }
        Vendor::Anthropic => {
            let first = usize::from(!text.is_empty());
            if !text.is_empty() {
                frames.push(sse(
                    Some("content_block_stop"),
                    json!({"type": "content_block_stop", "index": 0}),
                ));
            }
            for (i, (id, name, args)) in calls.iter().enumerate() {
                let index = first + i;
                frames.push(sse(
                    Some("content_block_start"),
                    json!({"type": "content_block_start", "index": index,
                    "content_block": {"type": "tool_use", "id": id, "name": name, "input": {}}}),
                ));
                let a = args.to_string();
                let (x, y) = a.split_at(a.len() / 2);
                for part in [x, y] {
                    frames.push(sse(
                        Some("content_block_delta"),
                        json!({"type": "content_block_delta", "index": index,
                        "delta": {"type": "input_json_delta", "partial_json": part}}),
                    ));
                }
                frames.push(sse(
                    Some("content_block_stop"),
                    json!({"type": "content_block_stop", "index": index}),
                ));
            }
            frames.push(sse(Some("message_delta"), json!({"type": "message_delta",
                "delta": {"stop_reason": if calls.is_empty() { "end_turn" } else { "tool_use" }, "stop_sequence": null},
                "usage": {"output_tokens": output_tokens}})));
            frames.push(sse(Some("message_stop"), json!({"type": "message_stop"})));
        }
        Vendor::Responses => {
            let first = usize::from(!text.is_empty());
            for (i, (id, name, args)) in calls.iter().enumerate() {
                frames.push(sse(Some("response.output_item.added"), json!({"type": "response.output_item.added",
                    "output_index": first + i, "item": {"type": "function_call", "id": format!("fc_{i}"),
                    "call_id": id, "name": name, "arguments": ""}})));
                frames.push(sse(Some("response.function_call_arguments.delta"), json!({"type": "response.function_call_arguments.delta",
                    "output_index": first + i, "item_id": format!("fc_{i}"), "delta": args.to_string()})));
            }
            frames.push(sse(
                Some("response.completed"),
                json!({"type": "response.completed",
                "response": responses_object(model, text, calls, input_tokens, output_tokens)}),
            ));
        }
    }
    stream_response(frames, delay)
}

pub(super) fn responses_object(
    model: &str,
    text: &str,
    calls: &[(String, String, Value)],
    input: u64,
    output: u64,
) -> Value {
    let mut items = Vec::new();
    if !text.is_empty() {
        items.push(
            json!({"type": "message", "id": "msg_fake", "role": "assistant", "status": "completed",
                          "content": [{"type": "output_text", "text": text, "annotations": []}]}),
        );
    }
    for (i, (id, name, args)) in calls.iter().enumerate() {
        items.push(
            json!({"type": "function_call", "id": format!("fc_{i}"), "call_id": id, "name": name,
                          "arguments": args.to_string(), "status": "completed"}),
        );
    }
    json!({"id": "resp_fake", "object": "response", "created_at": 0, "status": "completed", "model": model,
           "output": items, "usage": {"input_tokens": input, "output_tokens": output, "total_tokens": input + output},
           "incomplete_details": null, "error": null})
}

pub(super) fn start_frames(vendor: Vendor, model: &str, input_tokens: u64) -> Vec<String> {
    match vendor {
        Vendor::Chat => vec![chat_chunk(
            model,
            json!({"role": "assistant", "content": ""}),
            Value::Null,
        )],
        Vendor::Anthropic => vec![
            sse(
                Some("message_start"),
                json!({"type": "message_start", "message": {"id": "msg_fake", "type": "message",
                "role": "assistant", "model": model, "content": [], "stop_reason": null, "stop_sequence": null,
                "usage": {"input_tokens": input_tokens, "output_tokens": 1}}}),
            ),
            sse(Some("ping"), json!({"type": "ping"})),
        ],
        Vendor::Responses => vec![sse(
            Some("response.created"),
            json!({"type": "response.created",
            "response": {"id": "resp_fake", "status": "in_progress", "model": model, "output": []}}),
        )],
    }
}

pub(super) fn text_frames(vendor: Vendor, text: &str) -> Vec<String> {
    if text.is_empty() {
        return Vec::new();
    }
    let mut frames = Vec::new();
    if vendor == Vendor::Anthropic {
        frames.push(sse(
            Some("content_block_start"),
            json!({"type": "content_block_start", "index": 0,
            "content_block": {"type": "text", "text": ""}}),
        ));
    }
    for w in words(text) {
        frames.push(match vendor {
            Vendor::Chat => chat_chunk("fake", json!({"content": w}), Value::Null),
            Vendor::Anthropic => sse(
                Some("content_block_delta"),
                json!({"type": "content_block_delta", "index": 0,
                "delta": {"type": "text_delta", "text": w}}),
            ),
            Vendor::Responses => sse(
                Some("response.output_text.delta"),
                json!({"type": "response.output_text.delta",
                "item_id": "msg_fake", "output_index": 0, "content_index": 0, "delta": w}),
            ),
        });
    }
    frames
}

pub(super) fn chat_chunk(model: &str, delta: Value, finish: Value) -> String {
    sse(
        None,
        json!({"id": "chatcmpl-fake", "object": "chat.completion.chunk", "created": 0, "model": model,
        "choices": [{"index": 0, "delta": delta, "finish_reason": finish}]}),
    )
}

pub(super) fn sse(event: Option<&str>, data: Value) -> String {
    match event {
        Some(e) => format!("event: {e}\ndata: {data}\n\n"),
        None => format!("data: {data}\n\n"),
    }
}

pub(super) fn stream_response(frames: Vec<String>, delay: Duration) -> Response {
    let stream = futures::stream::unfold(frames.into_iter(), move |mut it| async move {
        let frame = it.next()?;
        if !delay.is_zero() {
            tokio::time::sleep(delay).await;
        }
        Some((Ok::<_, std::convert::Infallible>(Bytes::from(frame)), it))
    });
    Response::builder()
        .header("content-type", "text/event-stream")
        .header("cache-control", "no-cache")
        .body(Body::from_stream(stream))
        .expect("a valid response")
}
