//! Each format against response and stream samples shaped like the
//! providers' API references.

use serde_json::{Value, json};

use super::*;
use crate::models::chat::{ChatRequest, Content, Delta, Message, StopReason, sendable};
use crate::models::errors::ErrorKind;
use crate::models::sse::SseParser;

fn request(stream: bool) -> ChatRequest {
    ChatRequest::parse(
        &json!({
            "provider": "p", "model": "m", "system": "Be brief.",
            "messages": [
                {"role": "user", "content": "weather in Paris?"},
                {"role": "assistant", "content": "Checking.", "tool_calls": [
                    {"id": "toolu.01|x", "name": "weather", "arguments": {"city": "Paris"}}]},
                {"role": "tool", "tool_call_id": "toolu.01|x", "content": {"c": 21}},
                {"role": "user", "content": "thanks", "cache_control": {"type": "ephemeral"}}
            ],
            "tools": [{"name": "weather", "description": "Current weather",
                       "input_schema": {"type": "object", "properties": {"city": {"type": "string"}}}}],
            "tool_choice": "required",
            "max_output_tokens": 100,
            "stream": stream,
            "provider_options": {"top_p": 0.5}
        })
        .to_string(),
    )
    .unwrap()
}

fn encode(f: Format, stream: bool) -> Value {
    let r = request(stream);
    f.encode(&r, "m", &sendable(&r.messages), &EncodeOptions::default())
        .unwrap()
}

/// Feed SSE text to a format's stream decoder in small chunks.
fn fold(f: Format, sse: &str) -> (Result<Decoded, ProviderError>, Vec<Delta>) {
    let mut parser = SseParser::default();
    let mut dec = f.stream();
    let mut deltas = Vec::new();
    for chunk in sse.as_bytes().chunks(7) {
        for ev in parser.push(chunk).unwrap() {
            match dec.event(&ev, &mut deltas) {
                Ok(Flow::More) => {}
                Ok(Flow::Done) => return (dec.finish().and_then(|b| f.decode(b)), deltas),
                Err(e) => return (Err(e), deltas),
            }
        }
    }
    (dec.finish().and_then(|b| f.decode(b)), deltas)
}

fn sse(events: &[(&str, Value)]) -> String {
    events
        .iter()
        .map(|(e, d)| {
            if e.is_empty() {
                format!("data: {d}\n\n")
            } else {
                format!("event: {e}\ndata: {d}\n\n")
            }
        })
        .collect()
}

#[test]
fn openai_chat_requests() {
    let b = encode(Format::OpenAiChat, true);
    assert_eq!(
        b["messages"][0],
        json!({"role": "system", "content": "Be brief."})
    );
    let call = &b["messages"][2]["tool_calls"][0];
    let id = call["id"].as_str().unwrap();
    assert!(id.starts_with("call_") && !id.contains('|'), "{id}");
    assert_eq!(call["function"]["arguments"], r#"{"city":"Paris"}"#);
    assert_eq!(b["messages"][3]["tool_call_id"], id);
    assert_eq!(b["messages"][3]["content"], r#"{"c":21}"#);
    assert_eq!(b["messages"][4]["cache_control"]["type"], "ephemeral");
    assert_eq!(b["tools"][0]["function"]["parameters"]["type"], "object");
    assert_eq!(b["tool_choice"], "required");
    assert_eq!(b["max_tokens"], 100);
    assert_eq!(b["stream_options"]["include_usage"], true);
    assert_eq!(b["top_p"], 0.5, "provider_options pass through");
    let r = request(false);
    let b = Format::OpenAiChat
        .encode(
            &r,
            "m",
            &sendable(&r.messages),
            &EncodeOptions {
                max_completion_tokens: true,
            },
        )
        .unwrap();
    assert_eq!(b["max_completion_tokens"], 100);
    assert!(b.get("stream").is_none());
}

#[test]
fn openai_chat_responses_and_streams_agree() {
    let whole = json!({
        "id": "chatcmpl-1", "object": "chat.completion", "created": 1, "model": "gpt-x",
        "system_fingerprint": "fp_1",
        "choices": [{"index": 0, "finish_reason": "tool_calls", "message": {
            "role": "assistant", "content": "Let me look.",
            "tool_calls": [{"id": "call_1", "type": "function",
                            "function": {"name": "weather", "arguments": "{\"city\":\"Paris\"}"}}]}}],
        "usage": {"prompt_tokens": 12, "completion_tokens": 7, "total_tokens": 19,
                  "prompt_tokens_details": {"cached_tokens": 4}}
    });
    let d = Format::OpenAiChat.decode(whole).unwrap();
    assert_eq!(d.stop_reason, StopReason::ToolUse);
    assert_eq!(d.usage.input_tokens, 12);
    assert_eq!(d.usage.output_tokens, 7);
    assert_eq!(d.usage.extra["prompt_tokens_details"]["cached_tokens"], 4);
    assert_eq!(d.provider_fields["system_fingerprint"], "fp_1");
    let Message::Assistant {
        content,
        tool_calls,
        ..
    } = &d.message
    else {
        panic!()
    };
    assert_eq!(content, &Content::Text("Let me look.".into()));
    assert_eq!(tool_calls[0].arguments, json!({"city": "Paris"}));

    let chunk = |delta: Value, finish: Value| {
        (
            "",
            json!({"id": "chatcmpl-1", "object": "chat.completion.chunk", "created": 1,
                    "model": "gpt-x", "system_fingerprint": "fp_1",
                    "choices": [{"index": 0, "delta": delta, "finish_reason": finish}]}),
        )
    };
    let stream = sse(&[
        chunk(json!({"role": "assistant", "content": ""}), Value::Null),
        chunk(json!({"content": "Let me"}), Value::Null),
        chunk(json!({"content": " look."}), Value::Null),
        chunk(
            json!({"tool_calls": [{"index": 0, "id": "call_1", "type": "function",
                                    "function": {"name": "weather", "arguments": ""}}]}),
            Value::Null,
        ),
        chunk(
            json!({"tool_calls": [{"index": 0, "function": {"arguments": "{\"city\":"}}]}),
            Value::Null,
        ),
        chunk(
            json!({"tool_calls": [{"index": 0, "function": {"arguments": "\"Paris\"}"}}]}),
            Value::Null,
        ),
        chunk(json!({}), json!("tool_calls")),
        (
            "",
            json!({"id": "chatcmpl-1", "object": "chat.completion.chunk", "created": 1, "model": "gpt-x",
                    "choices": [], "usage": {"prompt_tokens": 12, "completion_tokens": 7, "total_tokens": 19,
                    "prompt_tokens_details": {"cached_tokens": 4}}}),
        ),
    ]) + "data: [DONE]\n\n";
    let (streamed, deltas) = fold(Format::OpenAiChat, &stream);
    assert_eq!(streamed.unwrap(), d);
    assert_eq!(
        deltas[..2],
        [
            Delta::Text {
                text: "Let me".into()
            },
            Delta::Text {
                text: " look.".into()
            }
        ]
    );
    assert_eq!(deltas.len(), 5);

    // An error in the middle of a 200 stream.
    let broken = sse(&[
        chunk(json!({"content": "Hel"}), Value::Null),
        (
            "",
            json!({"error": {"message": "The server had an error", "type": "server_error"}}),
        ),
    ]);
    let (r, deltas) = fold(Format::OpenAiChat, &broken);
    assert_eq!(r.unwrap_err().kind, ErrorKind::Server);
    assert_eq!(deltas.len(), 1);
    // A stream cut before finish_reason is an error, not a short answer.
    let cut = sse(&[chunk(json!({"content": "Hel"}), Value::Null)]);
    assert!(fold(Format::OpenAiChat, &cut).0.is_err());
}

/// Servers that are `openai-chat` but not OpenAI: Ollama sends each tool
/// call whole, with no `index` or with 0 for every one, some servers
/// repeat a call's name in every fragment, and LiteLLM's Ollama sends the
/// arguments as an object. Each call stays a call with its own name and
/// arguments (two were merged into one named `filesfiles`, and object
/// arguments became `{}`: found by a probe).
#[test]
fn openai_chat_streams_from_other_servers_keep_their_calls_apart() {
    let chunk = |delta: Value, finish: Value| {
        (
            "",
            json!({"id": "c", "object": "chat.completion.chunk", "model": "llama",
                    "choices": [{"index": 0, "delta": delta, "finish_reason": finish}]}),
        )
    };
    let call = |id: &str, index: Option<u64>, name: &str, args: Value| {
        let mut c = json!({"id": id, "type": "function",
                           "function": {"name": name, "arguments": args}});
        if let Some(i) = index {
            c["index"] = i.into();
        }
        chunk(json!({"tool_calls": [c]}), Value::Null)
    };
    let calls = |stream: String| {
        let (d, _) = fold(Format::OpenAiChat, &stream);
        let Message::Assistant { tool_calls, .. } = d.unwrap().message else {
            panic!()
        };
        tool_calls
            .into_iter()
            .map(|c| (c.id, c.name, c.arguments))
            .collect::<Vec<_>>()
    };
    let want = vec![
        (
            "call_a".to_owned(),
            "files".to_owned(),
            json!({"path": "n1"}),
        ),
        (
            "call_b".to_owned(),
            "files".to_owned(),
            json!({"path": "n2"}),
        ),
    ];
    for index in [None, Some(0)] {
        let stream = sse(&[
            call("call_a", index, "files", json!("{\"path\":\"n1\"}")),
            call("call_b", index, "files", json!({"path": "n2"})),
            chunk(json!({}), json!("tool_calls")),
        ]);
        assert_eq!(calls(stream), want, "index {index:?}");
    }
    // The name repeated with every fragment of one call.
    let stream = sse(&[
        call("call_a", Some(0), "files", json!("{\"path\":")),
        chunk(
            json!({"tool_calls": [{"index": 0, "function": {"name": "files", "arguments": "\"n1\"}"}}]}),
            Value::Null,
        ),
        call("call_b", Some(1), "files", json!("{\"path\":\"n2\"}")),
        chunk(json!({}), json!("tool_calls")),
    ]);
    assert_eq!(calls(stream), want);
    // Index 0 for every call, the id repeated in every fragment.
    let stream = sse(&[
        call("call_a", Some(0), "files", json!("{\"path\":\"n1\"}")),
        call("call_b", Some(0), "files", json!("{\"path\":")),
        call("call_b", Some(0), "", json!("\"n2\"}")),
        chunk(json!({}), json!("tool_calls")),
    ]);
    assert_eq!(calls(stream), want);
    // Index 0 for both, their fragments interleaved, each with its id
    // (found by a re-probe).
    let stream = sse(&[
        call("call_a", Some(0), "files", json!("{\"path\":")),
        call("call_b", Some(0), "files", json!("{\"path\":")),
        call("call_a", Some(0), "", json!("\"n1\"}")),
        call("call_b", Some(0), "", json!("\"n2\"}")),
        chunk(json!({}), json!("tool_calls")),
    ]);
    assert_eq!(calls(stream), want);
    // Two whole calls in one chunk, index 0 and no ids, object arguments.
    let both = chunk(
        json!({"tool_calls": [
            {"index": 0, "function": {"name": "files", "arguments": {"path": "n1"}}},
            {"index": 0, "function": {"name": "files", "arguments": {"path": "n2"}}}]}),
        Value::Null,
    );
    let (d, _) = fold(
        Format::OpenAiChat,
        &sse(&[both, chunk(json!({}), json!("tool_calls"))]),
    );
    let Message::Assistant { tool_calls, .. } = d.unwrap().message else {
        panic!()
    };
    let args: Vec<_> = tool_calls.iter().map(|c| c.arguments.clone()).collect();
    assert_eq!(args, [json!({"path": "n1"}), json!({"path": "n2"})]);
    // Whole answers with object arguments.
    let whole = json!({"id": "c", "model": "llama", "choices": [{"index": 0,
        "finish_reason": "tool_calls", "message": {"role": "assistant", "content": null,
        "tool_calls": [{"id": "call_a", "type": "function",
                        "function": {"name": "files", "arguments": {"path": "n1"}}}]}}]});
    let Message::Assistant { tool_calls, .. } = Format::OpenAiChat.decode(whole).unwrap().message
    else {
        panic!()
    };
    assert_eq!(tool_calls[0].arguments, json!({"path": "n1"}));
}

/// A tool result that is a list of records (not parts) reaches every
/// format as its JSON text; parts other than text are not dropped where a
/// format takes only text.
#[test]
fn tool_results_that_are_lists_are_sent_whole() {
    let listing = json!([{"path": "outputs/r.txt", "size": 2}]);
    for (content, text) in [
        (listing.clone(), listing.to_string()),
        (json!([]), "[]".to_owned()),
        (
            json!(["2026-12-08", "2026-12-09"]),
            r#"["2026-12-08","2026-12-09"]"#.to_owned(),
        ),
        (
            json!([{"type": "text", "text": "a"}, {"type": "text", "text": "b"}]),
            "ab".to_owned(),
        ),
    ] {
        let r = ChatRequest::parse(
            &json!({
                "provider": "p", "model": "m",
                "messages": [
                    {"role": "user", "content": "list"},
                    {"role": "assistant", "content": "", "tool_calls": [
                        {"id": "c1", "name": "files", "arguments": {}}]},
                    {"role": "tool", "tool_call_id": "c1", "content": content},
                ],
            })
            .to_string(),
        )
        .unwrap();
        let sent = |f: Format| {
            f.encode(&r, "m", &sendable(&r.messages), &EncodeOptions::default())
                .unwrap()
        };
        let chat = sent(Format::OpenAiChat);
        assert_eq!(chat["messages"][2]["content"], text.as_str(), "{content}");
        let responses = sent(Format::OpenAiResponses);
        assert_eq!(responses["input"][2]["output"], text.as_str(), "{content}");
        let anthropic = sent(Format::AnthropicMessages);
        let result = &anthropic["messages"][2]["content"][0]["content"];
        match result.as_str() {
            Some(t) => assert_eq!(t, text, "{content}"),
            None => assert!(result[0]["type"] == "text", "{content}: {result}"),
        }
    }
    // An empty list as a message's content is no content, not the text
    // "[]" (which the model read as said by the user and by itself).
    let r = ChatRequest::parse(
        &json!({"provider": "p", "model": "m", "messages": [
            {"role": "user", "content": []},
            {"role": "assistant", "content": [], "tool_calls": [{"id": "c1", "name": "f", "arguments": {}}]},
            {"role": "tool", "tool_call_id": "c1", "content": "ok"},
        ]})
        .to_string(),
    )
    .unwrap();
    for f in [
        Format::OpenAiChat,
        Format::OpenAiResponses,
        Format::AnthropicMessages,
    ] {
        let b = f
            .encode(&r, "m", &sendable(&r.messages), &EncodeOptions::default())
            .unwrap();
        assert!(!b.to_string().contains(r#""[]""#), "{f:?}: {b}");
    }
    // Records that happen to have a `type` are not Anthropic blocks.
    let events = json!([{"type": "event", "date": "2026-12-08"}]);
    let r = ChatRequest::parse(
        &json!({"provider": "p", "model": "m", "messages": [
            {"role": "user", "content": "when?"},
            {"role": "assistant", "content": "", "tool_calls": [{"id": "c1", "name": "pick", "arguments": {}}]},
            {"role": "tool", "tool_call_id": "c1", "content": events},
        ]})
        .to_string(),
    )
    .unwrap();
    let b = Format::AnthropicMessages
        .encode(&r, "m", &sendable(&r.messages), &EncodeOptions::default())
        .unwrap();
    assert_eq!(
        b["messages"][2]["content"][0]["content"],
        events.to_string()
    );
    // Parts that are not all text keep their JSON where only text goes.
    let image =
        json!([{"type": "text", "text": "see"}, {"type": "image", "source": {"data": "x"}}]);
    let c: Content = serde_json::from_value(image.clone()).unwrap();
    assert_eq!(c.tool_text(), image.to_string());
}

#[test]
fn anthropic_requests() {
    let b = encode(Format::AnthropicMessages, false);
    assert_eq!(b["system"], "Be brief.");
    assert_eq!(b["max_tokens"], 100);
    let msgs = b["messages"].as_array().unwrap();
    // user, assistant (text + tool_use), user (tool_result + text): merged.
    assert_eq!(msgs.len(), 3, "{b:#}");
    assert_eq!(msgs[1]["content"][1]["type"], "tool_use");
    let id = msgs[1]["content"][1]["id"].as_str().unwrap();
    assert!(
        id.bytes()
            .all(|c| c.is_ascii_alphanumeric() || c == b'_' || c == b'-')
    );
    assert_eq!(msgs[1]["content"][1]["input"], json!({"city": "Paris"}));
    assert_eq!(msgs[2]["role"], "user");
    assert_eq!(msgs[2]["content"][0]["tool_use_id"], id);
    assert_eq!(msgs[2]["content"][1]["text"], "thanks");
    assert_eq!(msgs[2]["cache_control"]["type"], "ephemeral");
    assert_eq!(b["tool_choice"], json!({"type": "any"}));
    assert_eq!(b["tools"][0]["input_schema"]["type"], "object");
}

#[test]
fn anthropic_responses_and_streams_agree() {
    let whole = json!({
        "id": "msg_1", "type": "message", "role": "assistant", "model": "claude-x",
        "content": [
            {"type": "thinking", "thinking": "Paris, so weather.", "signature": "sig"},
            {"type": "text", "text": "Let me look."},
            {"type": "tool_use", "id": "toolu_1", "name": "weather", "input": {"city": "Paris"}}],
        "stop_reason": "tool_use", "stop_sequence": null,
        "usage": {"input_tokens": 10, "output_tokens": 7, "cache_read_input_tokens": 2,
                  "cache_creation_input_tokens": 0}
    });
    let d = Format::AnthropicMessages.decode(whole).unwrap();
    assert_eq!(d.stop_reason, StopReason::ToolUse);
    assert_eq!(d.usage.input_tokens, 12);
    let Message::Assistant {
        provider_items,
        tool_calls,
        ..
    } = &d.message
    else {
        panic!()
    };
    assert_eq!(provider_items[0]["type"], "thinking", "kept to send back");
    assert_eq!(tool_calls[0].id, "toolu_1");

    let stream = sse(&[
        (
            "message_start",
            json!({"type": "message_start", "message": {
            "id": "msg_1", "type": "message", "role": "assistant", "model": "claude-x",
            "content": [], "stop_reason": null, "stop_sequence": null,
            "usage": {"input_tokens": 10, "output_tokens": 1, "cache_read_input_tokens": 2,
                      "cache_creation_input_tokens": 0}}}),
        ),
        (
            "content_block_start",
            json!({"type": "content_block_start", "index": 0,
            "content_block": {"type": "thinking", "thinking": "", "signature": ""}}),
        ),
        (
            "content_block_delta",
            json!({"type": "content_block_delta", "index": 0,
            "delta": {"type": "thinking_delta", "thinking": "Paris, so weather."}}),
        ),
        (
            "content_block_delta",
            json!({"type": "content_block_delta", "index": 0,
            "delta": {"type": "signature_delta", "signature": "sig"}}),
        ),
        (
            "content_block_stop",
            json!({"type": "content_block_stop", "index": 0}),
        ),
        ("ping", json!({"type": "ping"})),
        (
            "content_block_start",
            json!({"type": "content_block_start", "index": 1,
            "content_block": {"type": "text", "text": ""}}),
        ),
        (
            "content_block_delta",
            json!({"type": "content_block_delta", "index": 1,
            "delta": {"type": "text_delta", "text": "Let me look."}}),
        ),
        (
            "content_block_stop",
            json!({"type": "content_block_stop", "index": 1}),
        ),
        (
            "content_block_start",
            json!({"type": "content_block_start", "index": 2,
            "content_block": {"type": "tool_use", "id": "toolu_1", "name": "weather", "input": {}}}),
        ),
        (
            "content_block_delta",
            json!({"type": "content_block_delta", "index": 2,
            "delta": {"type": "input_json_delta", "partial_json": "{\"city\": \"Pa"}}),
        ),
        (
            "content_block_delta",
            json!({"type": "content_block_delta", "index": 2,
            "delta": {"type": "input_json_delta", "partial_json": "ris\"}"}}),
        ),
        (
            "content_block_stop",
            json!({"type": "content_block_stop", "index": 2}),
        ),
        (
            "message_delta",
            json!({"type": "message_delta",
            "delta": {"stop_reason": "tool_use", "stop_sequence": null}, "usage": {"output_tokens": 7}}),
        ),
        ("message_stop", json!({"type": "message_stop"})),
    ]);
    let (streamed, deltas) = fold(Format::AnthropicMessages, &stream);
    assert_eq!(streamed.unwrap(), d);
    // Cut just before `message_stop`: the stop reason and usage came, the
    // answer is whole. Cut before them, it is not.
    let before_stop =
        stream.trim_end_matches("event: message_stop\ndata: {\"type\":\"message_stop\"}\n\n");
    assert_ne!(before_stop.len(), stream.len());
    let (r, _) = fold(Format::AnthropicMessages, before_stop);
    assert_eq!(r.unwrap(), d);
    let before_delta = &before_stop[..before_stop.find("event: message_delta").unwrap()];
    let (r, _) = fold(Format::AnthropicMessages, before_delta);
    assert!(r.is_err());
    assert!(deltas.contains(&Delta::Text {
        text: "Let me look.".into()
    }));
    assert!(deltas.contains(&Delta::ToolCall {
        index: 0,
        id: Some("toolu_1".into()),
        name: Some("weather".into()),
        arguments: String::new()
    }));
    // A tool block that starts with its whole input and has no deltas
    // (some gateways send it so) keeps it: it became `{}`.
    let start_whole = sse(&[
        (
            "message_start",
            json!({"type": "message_start", "message": {"id": "m", "content": [], "usage": {}}}),
        ),
        (
            "content_block_start",
            json!({"type": "content_block_start", "index": 0,
            "content_block": {"type": "tool_use", "id": "toolu_1", "name": "weather",
                              "input": {"city": "Paris"}}}),
        ),
        (
            "content_block_stop",
            json!({"type": "content_block_stop", "index": 0}),
        ),
        (
            "message_delta",
            json!({"type": "message_delta", "delta": {"stop_reason": "tool_use"}}),
        ),
        ("message_stop", json!({"type": "message_stop"})),
    ]);
    let (r, _) = fold(Format::AnthropicMessages, &start_whole);
    let Message::Assistant { tool_calls, .. } = r.unwrap().message else {
        panic!()
    };
    assert_eq!(tool_calls[0].arguments, json!({"city": "Paris"}));

    let overloaded = sse(&[
        (
            "message_start",
            json!({"type": "message_start", "message": {"id": "m", "content": [], "usage": {}}}),
        ),
        (
            "error",
            json!({"type": "error", "error": {"type": "overloaded_error", "message": "Overloaded"}}),
        ),
    ]);
    let (r, _) = fold(Format::AnthropicMessages, &overloaded);
    assert_eq!(r.unwrap_err().kind, ErrorKind::Overloaded);

    // A call cut by `max_tokens` mid-input: its arguments are the text
    // the model wrote, and the answer says why it stopped.
    let cut = sse(&[
        (
            "message_start",
            json!({"type": "message_start", "message": {"id": "m", "content": [], "usage": {}}}),
        ),
        (
            "content_block_start",
            json!({"type": "content_block_start", "index": 0,
            "content_block": {"type": "tool_use", "id": "toolu_2", "name": "multiply", "input": {}}}),
        ),
        (
            "content_block_delta",
            json!({"type": "content_block_delta", "index": 0,
            "delta": {"type": "input_json_delta", "partial_json": "{\"a\": 3, \"b"}}),
        ),
        (
            "content_block_stop",
            json!({"type": "content_block_stop", "index": 0}),
        ),
        (
            "message_delta",
            json!({"type": "message_delta", "delta": {"stop_reason": "max_tokens"},
                   "usage": {"output_tokens": 20}}),
        ),
        ("message_stop", json!({"type": "message_stop"})),
    ]);
    let (r, _) = fold(Format::AnthropicMessages, &cut);
    let d = r.unwrap();
    assert_eq!(d.stop_reason, StopReason::MaxTokens);
    let Message::Assistant { tool_calls, .. } = &d.message else {
        panic!()
    };
    assert_eq!(tool_calls[0].arguments, json!("{\"a\": 3, \"b"));
}

#[test]
fn openai_responses_requests() {
    let b = encode(Format::OpenAiResponses, true);
    assert_eq!(b["instructions"], "Be brief.");
    assert_eq!(b["store"], false);
    let input = b["input"].as_array().unwrap();
    assert_eq!(
        input[0]["content"][0],
        json!({"type": "input_text", "text": "weather in Paris?"})
    );
    assert_eq!(input[1]["content"][0]["type"], "output_text");
    assert_eq!(input[2]["type"], "function_call");
    assert_eq!(input[3]["type"], "function_call_output");
    assert_eq!(input[3]["call_id"], input[2]["call_id"]);
    assert_eq!(b["tools"][0]["name"], "weather");
    assert_eq!(b["max_output_tokens"], 100);
    let mut r = request(false);
    r.stop = vec!["END".into()];
    let e = Format::OpenAiResponses
        .encode(&r, "m", &sendable(&r.messages), &EncodeOptions::default())
        .unwrap_err();
    assert!(e.contains("stop"));
}

#[test]
fn openai_responses_responses_and_streams_agree() {
    let response = json!({
        "id": "resp_1", "object": "response", "created_at": 1, "status": "completed", "model": "gpt-x",
        "output": [
            {"type": "reasoning", "id": "rs_1", "summary": []},
            {"type": "message", "id": "msg_1", "role": "assistant", "status": "completed",
             "content": [{"type": "output_text", "text": "Let me look.", "annotations": []}]},
            {"type": "function_call", "id": "fc_1", "call_id": "call_1", "name": "weather",
             "arguments": "{\"city\":\"Paris\"}", "status": "completed"}],
        "usage": {"input_tokens": 12, "output_tokens": 7, "total_tokens": 19,
                  "output_tokens_details": {"reasoning_tokens": 3}},
        "incomplete_details": null, "error": null
    });
    let d = Format::OpenAiResponses.decode(response.clone()).unwrap();
    assert_eq!(d.stop_reason, StopReason::ToolUse);
    assert_eq!(d.usage.output_tokens, 7);
    let Message::Assistant {
        provider_items,
        tool_calls,
        content,
        ..
    } = &d.message
    else {
        panic!()
    };
    assert_eq!(provider_items[0]["type"], "reasoning");
    assert_eq!(tool_calls[0].id, "call_1");
    assert_eq!(content.text(), "Let me look.");

    let stream = sse(&[
        (
            "response.created",
            json!({"type": "response.created", "response": {"id": "resp_1", "status": "in_progress", "output": []}}),
        ),
        (
            "response.output_text.delta",
            json!({"type": "response.output_text.delta", "item_id": "msg_1", "output_index": 1, "content_index": 0, "delta": "Let me"}),
        ),
        (
            "response.output_text.delta",
            json!({"type": "response.output_text.delta", "item_id": "msg_1", "output_index": 1, "content_index": 0, "delta": " look."}),
        ),
        (
            "response.output_item.added",
            json!({"type": "response.output_item.added", "output_index": 2,
            "item": {"type": "function_call", "id": "fc_1", "call_id": "call_1", "name": "weather", "arguments": ""}}),
        ),
        (
            "response.function_call_arguments.delta",
            json!({"type": "response.function_call_arguments.delta", "output_index": 2, "item_id": "fc_1", "delta": "{\"city\":\"Paris\"}"}),
        ),
        (
            "response.completed",
            json!({"type": "response.completed", "response": response}),
        ),
    ]);
    let (streamed, deltas) = fold(Format::OpenAiResponses, &stream);
    assert_eq!(streamed.unwrap(), d);
    assert_eq!(deltas.len(), 4);

    let failed = sse(&[(
        "response.failed",
        json!({"type": "response.failed", "response": {"id": "r", "status": "failed",
               "error": {"code": "server_error", "message": "boom"}}}),
    )]);
    assert_eq!(
        fold(Format::OpenAiResponses, &failed).0.unwrap_err().kind,
        ErrorKind::Server
    );
}
