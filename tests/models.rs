//! The model gateway end to end: providers configured over the API, guests
//! calling `model.chat` against a local server that speaks the vendors'
//! wire formats (`marmot::fake_provider`), streamed and not; retries,
//! `Retry-After`, fallbacks; the key held by the host.

mod common;

use std::net::IpAddr;
use std::time::{Duration, Instant};

use common::{Api, Marmot, TESTKIT, metric, tempdir};
use marmot::fake_provider::{Behaviour, FakeProvider, Scripted};
use serde_json::{Value, json};

const FORMATS: [&str; 3] = ["openai-chat", "openai-responses", "anthropic-messages"];

/// Quick retries, so tests do not wait for production back-offs.
const CONFIG: &str =
    "[models]\nmax_attempts = 3\nbackoff_ms = 10\nmax_backoff_ms = 40\nmax_retry_after_ms = 3000\n";

struct Rig {
    _dir: tempfile::TempDir,
    node: Marmot,
    api: Api,
    fake: FakeProvider,
}

impl Rig {
    /// A node with the test actor as `kit`, and a strict fake provider on
    /// loopback configured once per format (`p-openai-chat`, …).
    async fn new() -> Self {
        let dir = tempdir();
        let node = Marmot::start_opts(&dir.path().join("data"), &[], Some(CONFIG)).await;
        let api = node.client();
        assert_eq!(api.deploy("kit", TESTKIT, json!({})).await.status, 201);
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let fake = FakeProvider::start(listener, Behaviour::Strict, None);
        for f in FORMATS {
            let r = put_provider(
                &api,
                &format!("p-{f}"),
                json!({"format": f, "base_url": fake.base_url("127.0.0.1")}),
            )
            .await;
            assert_eq!(r.status, 201, "{}", r.json);
        }
        Rig {
            _dir: dir,
            node,
            api,
            fake,
        }
    }

    async fn chat(&self, request: Value) -> Value {
        self.api
            .op("kit", "a", json!({"op": "chat", "request": request}))
            .await
            .json
    }
}

async fn put_provider(api: &Api, name: &str, spec: Value) -> common::Resp {
    api.req(
        reqwest::Method::PUT,
        &format!("/v1/providers/{name}"),
        Some(("application/json", serde_json::to_vec(&spec).unwrap())),
        &[],
    )
    .await
}

fn weather_tool() -> Value {
    json!([{"name": "weather", "description": "Current weather in a city",
            "input_schema": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}}])
}

#[tokio::test]
async fn providers_are_configured_checked_and_listed_without_keys() {
    let dir = tempdir();
    let node = Marmot::start(&dir.path().join("data")).await;
    let api = node.client();
    let r = put_provider(
        &api,
        "openai",
        json!({"format": "openai-chat", "key_secret": "OPENAI_KEY",
        "prices": {"gpt-x": {"input_per_mtok": 1.0, "output_per_mtok": 2.0}}}),
    )
    .await;
    assert_eq!(r.status, 201, "{}", r.json);
    assert_eq!(
        r.json["base_url"],
        Value::Null,
        "as given; the default applies"
    );
    let r = put_provider(
        &api,
        "openai",
        json!({"format": "openai-chat", "key_secret": "OPENAI_KEY"}),
    )
    .await;
    assert_eq!(r.status, 200, "a replacement");
    // A key whose secret exists goes only where the secret may: one that
    // may not go to the provider's host is refused here, not at each call.
    let r = api
        .req(
            reqwest::Method::PUT,
            "/v1/secrets/LOCAL_KEY",
            Some((
                "application/json",
                br#"{"value": "sk-local-123", "hosts": ["models.internal.test"]}"#.to_vec(),
            )),
            &[],
        )
        .await;
    assert_eq!(r.status, 201, "{}", r.json);
    let before = api.get("/v1/providers").await.json;
    let r = put_provider(
        &api,
        "openai",
        json!({"format": "openai-chat", "key_secret": "LOCAL_KEY"}),
    )
    .await;
    assert_eq!(
        (r.status, r.code()),
        (400, "invalid_provider"),
        "{}",
        r.json
    );
    let msg = r.json["error"]["message"].as_str().unwrap();
    assert!(
        msg.contains(
            "may be sent only to models.internal.test, not to base_url's host `api.openai.com`"
        ),
        "{msg}"
    );
    assert!(!String::from_utf8_lossy(&r.body).contains("sk-local-123"));
    for (name, spec, code) in [
        ("x", json!({"format": "gemini"}), "invalid_provider"),
        (
            "x",
            json!({"format": "openai-chat", "base_url": "http://10.0.0.1/v1", "key_secret": "K"}),
            "invalid_provider",
        ),
        (
            "x",
            json!({"format": "openai-chat", "api_key": "sk-live-123"}),
            "invalid_provider",
        ),
        (
            "x",
            json!({"format": "openai-chat", "headers": {"authorization": "Bearer sk"}}),
            "invalid_provider",
        ),
        (
            "bad name",
            json!({"format": "openai-chat"}),
            "invalid_provider_name",
        ),
        ("openai", json!({"format": 7}), "invalid_provider"),
    ] {
        let r = put_provider(&api, &name.replace(' ', "%20"), spec.clone()).await;
        assert_eq!((r.status, r.code()), (400, code), "{spec}: {}", r.json);
        assert!(!String::from_utf8_lossy(&r.body).contains("sk-live-123"));
    }
    assert_eq!(
        api.get("/v1/providers").await.json,
        before,
        "bad input changed nothing"
    );
    let list = &before["providers"];
    assert_eq!(list.as_array().unwrap().len(), 1);
    assert_eq!(list[0]["name"], "openai");
    assert_eq!(list[0]["key_secret"], "OPENAI_KEY");
    assert_eq!(
        api.get("/v1/providers/openai").await.json["format"],
        "openai-chat"
    );
    assert_eq!(
        api.get("/v1/providers/nope").await.code(),
        "provider_not_found"
    );
    assert_eq!(api.delete("/v1/providers/openai").await.status, 200);
    assert_eq!(api.delete("/v1/providers/openai").await.status, 404);

    // A provider survives a restart.
    let r = put_provider(
        &api,
        "local",
        json!({"format": "anthropic-messages", "base_url": "http://127.0.0.1:1/v1"}),
    )
    .await;
    assert_eq!(r.status, 201);
    let mut node = node;
    node.restart().await;
    let api = node.client();
    assert_eq!(
        api.get("/v1/providers/local").await.json["format"],
        "anthropic-messages"
    );
}

/// Answer every request on `listener` with status 200, `content_type`
/// and `body`, after reading the request whole; how many it answered.
fn canned(
    listener: tokio::net::TcpListener,
    content_type: &'static str,
    body: String,
) -> std::sync::Arc<std::sync::atomic::AtomicUsize> {
    let response = format!(
        "HTTP/1.1 200 OK\r\ncontent-type: {content_type}\r\ncontent-length: {}\r\n\
         connection: close\r\n\r\n{body}",
        body.len()
    );
    raw(listener, response)
}

/// Write `response` as it is to every request on `listener`, after
/// reading the request whole, then close; how many it answered.
fn raw(
    listener: tokio::net::TcpListener,
    response: String,
) -> std::sync::Arc<std::sync::atomic::AtomicUsize> {
    paced(listener, vec![response], Duration::ZERO)
}

/// [`raw`], with the response in `pieces` written `every` apart.
fn paced(
    listener: tokio::net::TcpListener,
    pieces: Vec<String>,
    every: Duration,
) -> std::sync::Arc<std::sync::atomic::AtomicUsize> {
    use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};
    let count = std::sync::Arc::new(std::sync::atomic::AtomicUsize::new(0));
    let counted = count.clone();
    tokio::spawn(async move {
        while let Ok((mut s, _)) = listener.accept().await {
            counted.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
            let pieces = pieces.clone();
            tokio::spawn(async move {
                let mut got = Vec::new();
                let mut buf = [0u8; 8192];
                let head_end = loop {
                    let Ok(n) = s.read(&mut buf).await else {
                        return;
                    };
                    if n == 0 {
                        return;
                    }
                    got.extend_from_slice(&buf[..n]);
                    if let Some(i) = got.windows(4).position(|w| w == b"\r\n\r\n") {
                        break i + 4;
                    }
                };
                let head = String::from_utf8_lossy(&got[..head_end]).to_ascii_lowercase();
                let len: usize = head
                    .lines()
                    .find_map(|l| l.strip_prefix("content-length:"))
                    .and_then(|v| v.trim().parse().ok())
                    .unwrap_or(0);
                while got.len() < head_end + len {
                    let Ok(n) = s.read(&mut buf).await else {
                        return;
                    };
                    if n == 0 {
                        return;
                    }
                    got.extend_from_slice(&buf[..n]);
                }
                for (i, piece) in pieces.iter().enumerate() {
                    if i > 0 {
                        tokio::time::sleep(every).await;
                    }
                    if s.write_all(piece.as_bytes()).await.is_err() {
                        return;
                    }
                }
            });
        }
    });
    count
}

/// A stream that only ever sends keep-alive comments (a gateway waiting
/// on a busy upstream) times out after `models.timeout_ms` with no event,
/// as a timeout: it was never timed out, since bytes kept coming, and held
/// a run, its fallback and its cancel for the turn's whole limit (found
/// by a probe).
#[tokio::test]
async fn a_stream_of_keep_alives_alone_times_out() {
    let dir = tempdir();
    let config = format!("{CONFIG}timeout_ms = 800\n");
    let node = Marmot::start_opts(&dir.path().join("data"), &[], Some(&config)).await;
    let api = node.client();
    assert_eq!(api.deploy("kit", TESTKIT, json!({})).await.status, 201);
    let head = "HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\n\
                transfer-encoding: chunked\r\n\r\n";
    // Comments, or the same empty event again and again (found by a
    // re-probe).
    let empty = format!(
        "data: {}\n\n",
        json!({"id": "c", "object": "chat.completion.chunk", "model": "m1", "choices": []})
    );
    for (name, keep_alive) in [
        ("busy", ": PROVIDER PROCESSING\n\n"),
        ("empty", empty.as_str()),
    ] {
        let mut pieces = vec![head.to_owned()];
        pieces.extend((0..80).map(|_| format!("{:x}\r\n{keep_alive}\r\n", keep_alive.len())));
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let url = format!("http://{}/v1", listener.local_addr().unwrap());
        paced(listener, pieces, Duration::from_millis(100));
        let r = put_provider(
            &api,
            name,
            json!({"format": "openai-chat", "base_url": url}),
        )
        .await;
        assert_eq!(r.status, 201, "{}", r.json);
        let started = Instant::now();
        let r = api
            .op(
                "kit",
                "a",
                json!({"op": "chat", "request": {"provider": name, "model": "m1", "stream": true,
                        "messages": [{"role": "user", "content": "hi"}]}}),
            )
            .await
            .json;
        let e = r["error"].as_str().unwrap_or_default();
        assert!(e.contains("moved on no further"), "{name}: {r}");
        assert!(
            started.elapsed() < Duration::from_secs(5),
            "{name}: the keep-alives held the call for {:?}",
            started.elapsed()
        );
    }
    // The same text again and again is an answer, not a keep-alive, for
    // longer than the timeout (a model repeating "\n" was cut).
    let chunk = |delta: Value, finish: Value| {
        format!(
            "data: {}\n\n",
            json!({"id": "c", "object": "chat.completion.chunk", "model": "m1",
                   "choices": [{"index": 0, "delta": delta, "finish_reason": finish}]})
        )
    };
    let framed = |data: &str| format!("{:x}\r\n{data}\r\n", data.len());
    let mut pieces = vec![head.to_owned()];
    let newline = chunk(json!({"content": "\n"}), Value::Null);
    pieces.extend((0..15).map(|_| framed(&newline)));
    pieces.push(framed(&format!(
        "{}data: [DONE]\n\n",
        chunk(json!({}), json!("stop"))
    )));
    pieces.push("0\r\n\r\n".to_owned());
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let url = format!("http://{}/v1", listener.local_addr().unwrap());
    paced(listener, pieces, Duration::from_millis(100));
    let r = put_provider(
        &api,
        "repeats",
        json!({"format": "openai-chat", "base_url": url}),
    )
    .await;
    assert_eq!(r.status, 201, "{}", r.json);
    let r = api
        .op(
            "kit",
            "a",
            json!({"op": "chat", "request": {"provider": "repeats", "model": "m1", "stream": true,
                    "messages": [{"role": "user", "content": "hi"}]}}),
        )
        .await
        .json;
    assert_eq!(r["answer"]["message"]["content"], "\n".repeat(15), "{r}");
}

/// An Anthropic stream whose connection fails after the answer is whole
/// (after `message_delta`, before `message_stop` and the chunked body's
/// end): the answer is kept. It was an error, the answer paid for and
/// asked again.
#[tokio::test]
async fn a_stream_cut_after_its_answer_was_whole_keeps_it() {
    let rig = Rig::new().await;
    let ev = |name: &str, data: Value| format!("event: {name}\ndata: {data}\n\n");
    let events = [
        ev(
            "message_start",
            json!({"type": "message_start", "message": {"id": "m", "type": "message",
            "role": "assistant", "model": "m1", "content": [], "stop_reason": null,
            "usage": {"input_tokens": 3, "output_tokens": 0}}}),
        ),
        ev(
            "content_block_start",
            json!({"type": "content_block_start", "index": 0,
            "content_block": {"type": "text", "text": ""}}),
        ),
        ev(
            "content_block_delta",
            json!({"type": "content_block_delta", "index": 0,
            "delta": {"type": "text_delta", "text": "whole before the cut"}}),
        ),
        ev(
            "content_block_stop",
            json!({"type": "content_block_stop", "index": 0}),
        ),
        ev(
            "message_delta",
            json!({"type": "message_delta",
            "delta": {"stop_reason": "end_turn"}, "usage": {"output_tokens": 4}}),
        ),
    ]
    .concat();
    // Chunked, and closed without the last chunk: a failed connection.
    let cut = format!(
        "HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\n\
         transfer-encoding: chunked\r\n\r\n{:x}\r\n{events}\r\n",
        events.len()
    );
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let url = format!("http://{}/v1", listener.local_addr().unwrap());
    let answered = raw(listener, cut);
    let r = put_provider(
        &rig.api,
        "cut",
        json!({"format": "anthropic-messages", "base_url": url}),
    )
    .await;
    assert_eq!(r.status, 201, "{}", r.json);
    let r = rig
        .chat(json!({"provider": "cut", "model": "m1", "stream": true,
                     "messages": [{"role": "user", "content": "hi"}]}))
        .await;
    assert_eq!(
        r["answer"]["message"]["content"], "whole before the cut",
        "{r}"
    );
    assert_eq!(r["answer"]["usage"]["output_tokens"], 4, "{r}");
    assert_eq!(
        answered.load(std::sync::atomic::Ordering::SeqCst),
        1,
        "asked again"
    );
}

/// A streamed answer larger than the node takes
/// (`egress.max_response_bytes`, 16 MiB) fails saying so, as a refusal
/// (not retried). It was "a streamed event's data is not a JSON object"
/// (the event the cap cut), which the agent harness retried at full cost.
#[tokio::test]
async fn a_stream_larger_than_the_node_takes_fails_as_too_large() {
    let rig = Rig::new().await;
    let text = "x".repeat(10_000);
    let piece = format!(
        "data: {}\n\n",
        json!({"id": "c", "object": "chat.completion.chunk", "model": "m1",
               "choices": [{"index": 0, "delta": {"content": text}, "finish_reason": null}]})
    );
    let events = piece.repeat((17 << 20) / piece.len());
    let big = format!(
        "HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\n\
         transfer-encoding: chunked\r\n\r\n{:x}\r\n{events}\r\n0\r\n\r\n",
        events.len()
    );
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let url = format!("http://{}/v1", listener.local_addr().unwrap());
    let answered = raw(listener, big);
    let r = put_provider(
        &rig.api,
        "big",
        json!({"format": "openai-chat", "base_url": url}),
    )
    .await;
    assert_eq!(r.status, 201, "{}", r.json);
    let r = rig
        .chat(json!({"provider": "big", "model": "m1", "stream": true,
                     "messages": [{"role": "user", "content": "hi"}]}))
        .await;
    let e = r["error"].as_str().unwrap_or_default();
    assert!(e.contains("larger than"), "{r}");
    assert!(e.contains("provider_refused") && !e.contains("JSON"), "{r}");
    assert_eq!(
        answered.load(std::sync::atomic::Ordering::SeqCst),
        1,
        "asked again"
    );
}

/// A streamed call answered with something other than an event stream:
/// JSON (a server that ignores `stream: true`) is taken as the whole
/// answer; anything else (a web page: a wrong base_url) is refused at
/// once, saying so. Both were "the stream ended before the model
/// finished", retried.
#[tokio::test]
async fn a_streamed_call_answered_without_a_stream() {
    let rig = Rig::new().await;
    let json_server = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let json_url = format!("http://{}/v1", json_server.local_addr().unwrap());
    let answer = json!({"id": "c1", "object": "chat.completion", "model": "m1",
        "choices": [{"index": 0, "message": {"role": "assistant", "content": "not streamed"},
                     "finish_reason": "stop"}],
        "usage": {"prompt_tokens": 3, "completion_tokens": 2, "total_tokens": 5}});
    canned(json_server, "application/json", answer.to_string());
    let html_server = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let html_url = format!("http://{}/v1", html_server.local_addr().unwrap());
    let pages = canned(
        html_server,
        "text/html; charset=utf-8",
        "<html>hello</html>".into(),
    );
    for (name, url) in [("ignores", &json_url), ("page", &html_url)] {
        let r = put_provider(
            &rig.api,
            name,
            json!({"format": "openai-chat", "base_url": url}),
        )
        .await;
        assert_eq!(r.status, 201, "{}", r.json);
    }
    let ask = |provider: &str| {
        json!({"provider": provider, "model": "m1", "stream": true,
               "messages": [{"role": "user", "content": "hi"}]})
    };
    let r = rig.chat(ask("ignores")).await;
    assert_eq!(r["answer"]["message"]["content"], "not streamed", "{r}");
    assert_eq!(r["answer"]["usage"]["output_tokens"], 2, "{r}");
    let r = rig.chat(ask("page")).await;
    let e = r["error"].as_str().unwrap_or_default();
    assert!(e.contains("Content-Type `text/html; charset=utf-8`"), "{r}");
    assert!(e.contains("base_url"), "{r}");
    assert_eq!(
        pages.load(std::sync::atomic::Ordering::SeqCst),
        1,
        "retried"
    );
}

/// A 200 whose body is an error object (an OpenAI-compatible server's
/// unknown model) fails with the provider's own message, classed by its
/// type and not asked again; it was "malformed response: no choices",
/// retried. (Streamed, the server answers the same JSON.)
#[tokio::test]
async fn a_200_that_is_an_error_object_is_the_providers_error() {
    let rig = Rig::new().await;
    let server = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let url = format!("http://{}/v1", server.local_addr().unwrap());
    let body = json!({"error": {"message": "model `m9` not found", "type": "invalid_request_error",
                                "code": "model_not_found"}});
    let answered = canned(server, "application/json", body.to_string());
    let r = put_provider(
        &rig.api,
        "odd",
        json!({"format": "openai-chat", "base_url": url}),
    )
    .await;
    assert_eq!(r.status, 201, "{}", r.json);
    for stream in [false, true] {
        let r = rig
            .chat(json!({"provider": "odd", "model": "m9", "stream": stream,
                         "messages": [{"role": "user", "content": "hi"}]}))
            .await;
        let e = r["error"].as_str().unwrap_or_default();
        assert!(
            e.contains("model `m9` not found") && e.contains("model_not_found"),
            "{r}"
        );
    }
    assert_eq!(
        answered.load(std::sync::atomic::Ordering::SeqCst),
        2,
        "retried"
    );
}

#[tokio::test]
async fn one_shape_over_every_format_streamed_or_not() {
    let rig = Rig::new().await;
    for f in FORMATS {
        for stream in [false, true] {
            let what = format!("{f}, stream {stream}");
            let n = rig.fake.requests().len();
            rig.fake.push([Scripted::ToolCalls {
                text: "Checking.".into(),
                calls: vec![("call_w1".into(), "weather".into(), json!({"city": "Paris"}))],
            }]);
            let mut messages = vec![json!({"role": "user", "content": "Weather in Paris?"})];
            let r = rig
                .chat(
                    json!({"provider": format!("p-{f}"), "model": "m1", "system": "Be brief.",
                             "messages": messages, "tools": weather_tool(), "stream": stream}),
                )
                .await;
            let a = &r["answer"];
            assert_eq!(a["stop_reason"], "tool_use", "{what}: {r}");
            assert_eq!(a["provider"], format!("p-{f}"));
            assert_eq!(a["message"]["role"], "assistant");
            assert_eq!(a["message"]["content"], "Checking.", "{what}: {r}");
            let call = &a["message"]["tool_calls"][0];
            assert_eq!(call["name"], "weather");
            assert_eq!(call["arguments"], json!({"city": "Paris"}), "{what}");
            assert!(
                a["usage"]["input_tokens"].as_u64().unwrap() > 0,
                "{what}: {r}"
            );
            assert!(a["usage"]["output_tokens"].as_u64().unwrap() > 0, "{what}");

            // The answer goes back into the conversation as it is, with the
            // tool's result; a stale call without a result (a run cut off
            // mid-call) and an id Anthropic would refuse come along. The
            // fake refuses what the real APIs refuse, so this passing means
            // neither reached it.
            messages.push(a["message"].clone());
            messages.push(
                json!({"role": "tool", "tool_call_id": call["id"], "content": {"temp_c": 21}}),
            );
            messages.push(json!({"role": "user", "content": "And earlier?"}));
            messages.push(json!({"role": "assistant", "content": "", "tool_calls": [
                {"id": "toolu.orphan|1", "name": "weather", "arguments": {"city": "Rome"}}]}));
            messages.push(
                json!({"role": "assistant", "content": "Looking.", "tool_calls": [
                {"id": "fc.odd:id/2", "name": "weather", "arguments": {"city": "Oslo"}}]}),
            );
            messages.push(json!({"role": "tool", "tool_call_id": "fc.odd:id/2", "content": "3 C"}));
            rig.fake.push([Scripted::Text("Paris is 21 C.".into())]);
            let r = rig
                .chat(json!({"provider": format!("p-{f}"), "model": "m1", "messages": messages,
                             "tools": weather_tool(), "stream": stream, "provider_options": {"top_p": 0.9}}))
                .await;
            assert_eq!(
                r["answer"]["message"]["content"], "Paris is 21 C.",
                "{what}: {r}"
            );
            assert_eq!(r["answer"]["stop_reason"], "end_turn", "{what}");
            let seen = rig.fake.requests();
            assert_eq!(seen.len(), n + 2, "{what}: no retries");
            let sent = serde_json::to_string(&seen[n + 1].body).unwrap();
            assert!(
                !sent.contains("orphan"),
                "{what}: an orphaned call was sent: {sent}"
            );
            assert!(!sent.contains("Rome"), "{what}");
            assert!(!sent.contains("fc.odd"), "{what}: ids are normalized");
            assert_eq!(
                seen[n + 1].body["top_p"],
                0.9,
                "{what}: provider_options pass through"
            );
            assert_eq!(
                seen[n + 1]
                    .body
                    .get("stream")
                    .and_then(Value::as_bool)
                    .unwrap_or(false),
                stream
            );
        }
    }

    // Bad requests are refused before anything is sent.
    let n = rig.fake.requests().len();
    for (req, why) in [
        (
            json!({"provider": "p-openai-chat", "model": "m", "messages": []}),
            "invalid",
        ),
        (
            json!({"provider": "p-openai-chat", "model": "m", "messages": [{"role": "user", "content": "x"}],
                "tools": [{"name": "bad name"}]}),
            "invalid",
        ),
        (
            json!({"provider": "nope", "model": "m", "messages": [{"role": "user", "content": "x"}]}),
            "not found",
        ),
        (
            json!({"provider": "p-openai-responses", "model": "m", "stop": ["x"],
                "messages": [{"role": "user", "content": "x"}]}),
            "invalid",
        ),
    ] {
        let r = rig.chat(req.clone()).await;
        assert!(
            r["error"].as_str().unwrap_or("").starts_with(why),
            "{req}: {r}"
        );
    }
    assert_eq!(rig.fake.requests().len(), n);
}

#[tokio::test]
async fn retries_honour_retry_after_and_fallbacks_cover_an_overloaded_provider() {
    let rig = Rig::new().await;
    let ask = |provider: &str, stream: bool, fallbacks: Value| {
        json!({"provider": provider, "model": "m1", "stream": stream, "fallbacks": fallbacks,
               "messages": [{"role": "user", "content": "hi"}]})
    };

    // 429 with Retry-After: 1 s, then an answer: one retry, after the wait.
    let n = rig.fake.requests().len();
    rig.fake.push([
        Scripted::Error {
            status: 429,
            retry_after: Some("1".into()),
        },
        Scripted::Text("hello".into()),
    ]);
    let t = Instant::now();
    let r = rig.chat(ask("p-openai-chat", false, json!([]))).await;
    assert_eq!(r["answer"]["message"]["content"], "hello", "{r}");
    assert!(
        t.elapsed() >= Duration::from_millis(950),
        "Retry-After was not honoured: {:?}",
        t.elapsed()
    );
    assert_eq!(rig.fake.requests().len(), n + 2);

    // 529 on every attempt at the primary, before any token: the fallback
    // answers, and the answer says what was tried.
    rig.fake.push([
        Scripted::Error {
            status: 529,
            retry_after: None,
        },
        Scripted::Error {
            status: 529,
            retry_after: None,
        },
        Scripted::Error {
            status: 529,
            retry_after: None,
        },
        Scripted::Text("from the fallback".into()),
    ]);
    let r = rig
        .chat(ask(
            "p-anthropic-messages",
            true,
            json!([{"provider": "p-openai-chat", "model": "m2"}]),
        ))
        .await;
    let a = &r["answer"];
    assert_eq!(a["message"]["content"], "from the fallback", "{r}");
    assert_eq!(a["provider"], "p-openai-chat");
    assert_eq!(a["attempts"][0]["provider"], "p-anthropic-messages");
    assert!(
        a["attempts"][0]["error"]
            .as_str()
            .unwrap()
            .contains("overloaded"),
        "{r}"
    );
    let last = rig.fake.requests().last().unwrap().clone();
    assert_eq!(
        (last.path.as_str(), last.body["model"].as_str()),
        ("/v1/chat/completions", Some("m2"))
    );

    // A wait longer than the node allows: straight to the fallback.
    rig.fake.push([
        Scripted::Error {
            status: 429,
            retry_after: Some("3600".into()),
        },
        Scripted::Text("no waiting".into()),
    ]);
    let t = Instant::now();
    let r = rig
        .chat(ask(
            "p-openai-chat",
            false,
            json!([{"provider": "p-openai-responses", "model": "m2"}]),
        ))
        .await;
    assert_eq!(r["answer"]["message"]["content"], "no waiting", "{r}");
    assert!(t.elapsed() < Duration::from_secs(3));

    // Never retried: a bad request, a context overflow, a bad key.
    for status in [400, 401] {
        let n = rig.fake.requests().len();
        rig.fake.push([Scripted::Error {
            status,
            retry_after: None,
        }]);
        let r = rig.chat(ask("p-openai-chat", false, json!([]))).await;
        assert!(r["error"].is_string(), "{r}");
        assert_eq!(rig.fake.requests().len(), n + 1, "{status} was retried");
    }

    // An error event after 200, before any token: retried like a 5xx.
    rig.fake.push([
        Scripted::MidStreamError {
            text: String::new(),
        },
        Scripted::Text("second try".into()),
    ]);
    let r = rig.chat(ask("p-anthropic-messages", true, json!([]))).await;
    assert_eq!(r["answer"]["message"]["content"], "second try", "{r}");

    // After tokens went out, the call fails instead of starting over (or
    // falling back) under the client's eyes.
    let n = rig.fake.requests().len();
    rig.fake.push([Scripted::MidStreamError {
        text: "Half an ans".into(),
    }]);
    let r = rig
        .chat(ask(
            "p-openai-chat",
            true,
            json!([{"provider": "p-openai-responses", "model": "m2"}]),
        ))
        .await;
    let e = r["error"].as_str().unwrap_or_default();
    assert!(e.contains("mid-stream"), "{r}");
    assert_eq!(rig.fake.requests().len(), n + 1);

    // Every provider down: the error names each attempt.
    for _ in 0..6 {
        rig.fake.push([Scripted::Error {
            status: 503,
            retry_after: None,
        }]);
    }
    let r = rig
        .chat(ask(
            "p-openai-chat",
            false,
            json!([{"provider": "p-anthropic-messages", "model": "m2"}]),
        ))
        .await;
    let e = r["error"].as_str().unwrap_or_default();
    assert!(
        e.contains("p-openai-chat") && e.contains("p-anthropic-messages"),
        "{r}"
    );
    assert_eq!(rig.fake.pending(), 0);

    // A primary this node cannot call (its provider deleted, its key's
    // secret gone): the fallback answers, and the answer says why.
    rig.fake.push([Scripted::Text("covered".into())]);
    let r = rig
        .chat(ask(
            "p-gone",
            false,
            json!([{"provider": "p-openai-chat", "model": "m2"}]),
        ))
        .await;
    assert_eq!(r["answer"]["message"]["content"], "covered", "{r}");
    let why = r["answer"]["attempts"][0]["error"].as_str().unwrap();
    assert!(why.contains("no provider `p-gone`"), "{r}");
    // None of them can be called: each one's reason.
    let r = rig
        .chat(ask(
            "p-gone",
            false,
            json!([{"provider": "p-gone-too", "model": "m2"}]),
        ))
        .await;
    let e = r["error"].as_str().unwrap_or_default();
    assert!(e.contains("`p-gone`") && e.contains("`p-gone-too`"), "{r}");
    assert_eq!(rig.fake.pending(), 0);

    let metrics = String::from_utf8(rig.api.get("/metrics").await.body).unwrap();
    assert!(
        metrics.contains(
            "marmot_model_calls_total{provider=\"p-openai-chat\",outcome=\"rate_limited\"}"
        ),
        "{metrics}"
    );
    assert!(
        metrics
            .contains("marmot_model_tokens_total{provider=\"p-openai-chat\",outcome=\"output\"}")
    );
    drop(rig.node);
}

/// Guarantee 5: an actor whose turn waits on a model call is busy, not
/// idle. A call slower than the type's idle timeout neither hibernates the
/// actor nor is cut short; once the turn is over, the actor hibernates on
/// time.
#[tokio::test]
async fn an_actor_waiting_on_a_slow_model_call_does_not_hibernate() {
    let rig = Rig::new().await;
    let r = rig
        .api
        .deploy("sleepy", TESTKIT, json!({"idle_timeout_ms": 200}))
        .await;
    assert_eq!(r.status, 201, "{}", r.json);
    rig.fake
        .set_timing(Duration::from_millis(1200), Duration::ZERO);
    rig.fake.push([Scripted::Text("slow, but here".into())]);
    let hibernations = |api: &Api| {
        let api = api.clone();
        async move {
            let text = String::from_utf8(api.get("/metrics").await.body).unwrap();
            metric(&text, "marmot_hibernations_total")
        }
    };
    let before = hibernations(&rig.api).await;
    let r = rig
        .api
        .op(
            "sleepy",
            "a",
            json!({"op": "chat", "request": {"provider": "p-openai-chat", "model": "m1",
                   "messages": [{"role": "user", "content": "hi"}]}}),
        )
        .await;
    assert_eq!(r.status, 200, "{}", r.json);
    assert_eq!(
        r.json["answer"]["message"]["content"], "slow, but here",
        "{}",
        r.json
    );
    assert_eq!(
        hibernations(&rig.api).await,
        before,
        "an actor hibernated while its model call was in flight"
    );
    rig.api
        .wait_info("sleepy", "a", "hibernation", |i| {
            i["status"] == "hibernated"
        })
        .await;
}

#[tokio::test]
async fn streamed_deltas_reach_the_live_event_stream_and_javascript_has_model_chat() {
    let rig = Rig::new().await;
    let js = r#"
import { model, events } from "marmot";
export default {
  async onMessage(body) {
    const r = await model.chat({ provider: "p-anthropic-messages", model: "m1", stream: true,
                                 messages: [{ role: "user", content: body.ask }] });
    events.emit("answered", { text: r.message.content });
    return { text: r.message.content, stop: r.stop_reason };
  },
};
"#;
    let r = rig.api.deploy_js("jsbot", js).await;
    assert_eq!(r.status, 201, "{}", r.json);
    rig.fake
        .set_timing(Duration::ZERO, Duration::from_millis(30));
    rig.fake.push([Scripted::Text("one two three four".into())]);
    let mut sse = rig.api.sse("/v1/actors/jsbot/u1/events", None).await;
    let api = rig.api.clone();
    let call = tokio::spawn(async move {
        api.post_json("/v1/actors/jsbot/u1", &json!({"ask": "count"}))
            .await
    });
    let mut text = String::new();
    let mut event = None;
    while let Some(f) = sse.next_frame(Duration::from_secs(10)).await {
        match f.event.as_deref() {
            Some("delta") => {
                assert!(event.is_none(), "deltas come before the committed event");
                assert!(f.id.is_none(), "live frames have no id");
                let d = f.json();
                assert_eq!(d["call"], 0);
                text.push_str(d["text"].as_str().unwrap_or(""));
            }
            None if f.data.is_some() => {
                event = Some(f.json());
                break;
            }
            _ => {}
        }
    }
    assert_eq!(text, "one two three four");
    assert_eq!(event.unwrap()["data"]["text"], "one two three four");
    let r = call.await.unwrap();
    assert_eq!(
        r.json,
        json!({"text": "one two three four", "stop": "end_turn"})
    );
}

const KEY: &str = "sk-test-5f1b2c7d9e0a4b6c8d2e4f6a";

#[tokio::test]
async fn the_key_is_sent_by_the_host_to_its_hosts_only_and_never_comes_back() {
    let ip: IpAddr = "127.0.0.2".parse().unwrap();
    let (tls, ca) = common::test_tls(&[&ip.to_string()]);
    let dir = tempdir();
    let ca_file = dir.path().join("ca.pem");
    std::fs::write(&ca_file, ca).unwrap();
    let config = format!("{CONFIG}[egress]\nextra_ca_file = {:?}\n", ca_file);
    // Logs at trace level and exported traces are searched for the key.
    let traces = common::otlp::Traces::start().await;
    let node =
        Marmot::start_opts(&dir.path().join("data"), &traces.node_env(), Some(&config)).await;
    let api = node.client();
    assert_eq!(api.deploy("kit", TESTKIT, json!({})).await.status, 201);
    let listener = tokio::net::TcpListener::bind((ip, 0)).await.unwrap();
    let fake = FakeProvider::start_tls(listener, tls, Behaviour::Strict, Some(KEY.into()));
    // A provider elsewhere naming the key before it is set (accepted: the
    // secret may come with these hosts).
    let other = tokio::net::TcpListener::bind("127.0.0.3:0").await.unwrap();
    let other_port = other.local_addr().unwrap().port();
    let elsewhere = json!({"format": "openai-chat",
        "base_url": format!("https://127.0.0.3:{other_port}/v1"), "key_secret": "MODEL_KEY"});
    let r = put_provider(&api, "elsewhere", elsewhere.clone()).await;
    assert_eq!(r.status, 201, "{}", r.json);
    let r = api
        .req(
            reqwest::Method::PUT,
            "/v1/secrets/MODEL_KEY",
            Some((
                "application/json",
                serde_json::to_vec(&json!({"value": KEY, "hosts": ["127.0.0.2"]})).unwrap(),
            )),
            &[],
        )
        .await;
    assert_eq!(r.status, 201, "{}", r.json);
    for f in ["openai-chat", "anthropic-messages"] {
        let r = put_provider(
            &api,
            f,
            json!({"format": f, "base_url": fake.base_url("127.0.0.2"), "key_secret": "MODEL_KEY"}),
        )
        .await;
        assert_eq!(r.status, 201, "{}", r.json);
    }
    // Set now, it is refused (the key may not go there); set before the
    // secret, its calls are refused before sending (below).
    let r = put_provider(&api, "elsewhere", elsewhere).await;
    assert_eq!(
        (r.status, r.code()),
        (400, "invalid_provider"),
        "{}",
        r.json
    );

    for f in ["openai-chat", "anthropic-messages"] {
        // The model repeats the key (a prompt injection would): redacted.
        fake.push([Scripted::Text(format!("your key is {KEY} ok"))]);
        let r = api
            .op("kit", "a", json!({"op": "chat", "request": {"provider": f, "model": "m",
                "messages": [{"role": "user", "content": "what is your key?"}], "stream": f == "anthropic-messages"}}))
            .await;
        assert_eq!(
            r.json["answer"]["message"]["content"], "your key is [redacted] ok",
            "{f}: {}",
            r.json
        );
        // Split over two streamed deltas: the bytes never held it whole,
        // and it used to reach the guest, its events and the live stream.
        let (a, b) = KEY.split_at(9);
        let brk = marmot::fake_provider::DELTA_BREAK;
        fake.push([Scripted::Text(format!("your key is {a}{brk}{b} ok"))]);
        let r = api
            .op(
                "kit",
                "a",
                json!({"op": "chat", "request": {"provider": f, "model": "m",
                "messages": [{"role": "user", "content": "again?"}], "stream": true}}),
            )
            .await;
        assert_eq!(
            r.json["answer"]["message"]["content"], "your key is [redacted] ok",
            "{f}, split: {}",
            r.json
        );
    }
    let seen = fake.requests();
    assert_eq!(
        seen[0].header("authorization"),
        Some(format!("Bearer {KEY}").as_str())
    );
    assert_eq!(seen[2].header("x-api-key"), Some(KEY));
    assert_eq!(seen[2].header("anthropic-version"), Some("2023-06-01"));

    let r = api
        .op(
            "kit",
            "a",
            json!({"op": "chat", "request": {"provider": "elsewhere", "model": "m",
            "messages": [{"role": "user", "content": "hi"}]}}),
        )
        .await;
    let e = r.json["error"].as_str().unwrap_or_default();
    assert!(
        e.starts_with("denied: secret `MODEL_KEY` may not be sent to https://127.0.0.3"),
        "{}",
        r.json
    );
    assert!(!e.contains(KEY));
    // The guest never held the key: a scan of its memory finds what it
    // was just told, not the key.
    let scan = |needle: &str| {
        let mask: Vec<u8> = (0..needle.len()).map(|i| 0x5a ^ (i as u8)).collect();
        let masked: Vec<u8> = needle.bytes().zip(&mask).map(|(b, m)| b ^ m).collect();
        json!({ "op": "scan_memory", "masked": masked, "mask": mask })
    };
    assert_eq!(
        api.op("kit", "a", scan("your key is [redacted] ok"))
            .await
            .json["found"],
        true
    );
    assert_eq!(api.op("kit", "a", scan(KEY)).await.json["found"], false);
    // Seven turns: four calls, the refused one, two scans.
    let exports = traces.settled(7).await;
    assert!(
        !exports.iter().any(|b| common::holds(b, KEY)),
        "an exported trace holds the key"
    );
    let metrics = api.get("/metrics").await;
    assert!(!String::from_utf8_lossy(&metrics.body).contains(KEY));
    let listed = api.get("/v1/providers").await;
    assert!(!String::from_utf8_lossy(&listed.body).contains(KEY));
    let mut node = node;
    node.kill9();
    assert!(!node.log_text().contains(KEY), "the log holds the key");
    let db = common::database_bytes(&dir.path().join("data"));
    assert!(
        !common::holds(&db, KEY),
        "the database or its journal holds the key"
    );
    drop(other);
}

#[tokio::test]
async fn budgets_hold_under_concurrent_runs_and_usage_is_recorded() {
    const MAX_TOKENS: u64 = 3000;
    let rig = Rig::new().await;
    let r = rig
        .api
        .deploy(
            "capped",
            TESTKIT,
            json!({"budget": {"max_tokens": MAX_TOKENS, "actor_max_tokens": 1500}}),
        )
        .await;
    assert_eq!(r.status, 201, "{}", r.json);
    // Calls overlap: each answer takes 300 ms.
    rig.fake
        .set_timing(Duration::from_millis(300), Duration::ZERO);
    rig.fake
        .push((0..20).map(|i| Scripted::Text(format!("answer {i}"))));
    let calls = (0..20).map(|i| {
        let api = rig.api.clone();
        async move {
            api.op(
                "capped",
                &format!("u{i}"),
                json!({"op": "chat", "request": {"provider": "p-openai-chat", "model": "m",
                       "max_output_tokens": 100, "messages": [{"role": "user", "content": "hello"}]}}),
            )
            .await
            .json
        }
    });
    let results = futures::future::join_all(calls).await;
    let answered: Vec<&Value> = results.iter().filter(|r| r["answer"].is_object()).collect();
    let refused: Vec<&Value> = results.iter().filter(|r| r["error"].is_string()).collect();
    assert_eq!(answered.len() + refused.len(), 20);
    assert!(!refused.is_empty() && !answered.is_empty(), "{results:?}");
    for r in &refused {
        let e = r["error"].as_str().unwrap();
        assert!(
            e.starts_with("limit exceeded: budget_exceeded: the type may use 3000 tokens"),
            "{e}"
        );
    }
    // Refused calls never reached the provider.
    assert_eq!(rig.fake.requests().len(), answered.len());
    let spent: u64 = answered
        .iter()
        .map(|r| {
            r["answer"]["usage"]["input_tokens"].as_u64().unwrap()
                + r["answer"]["usage"]["output_tokens"].as_u64().unwrap()
        })
        .sum();
    let ty = rig.api.get("/v1/types/capped").await.json;
    let used = ty["usage"]["input_tokens"].as_u64().unwrap()
        + ty["usage"]["output_tokens"].as_u64().unwrap();
    assert_eq!(used, spent, "{ty}");
    assert!(used <= MAX_TOKENS);
    assert_eq!(ty["usage"]["calls"], answered.len() as u64);
    // Per actor: u0's one call counts if it was answered, and not if it
    // was refused.
    let info = rig.api.get("/v1/actors/capped/u0").await.json;
    let calls = u64::from(results[0]["answer"].is_object());
    assert_eq!(info["usage"]["calls"], calls, "{info}");

    // Per actor: a call that could take this actor past its own limit is
    // refused, whatever the type has left.
    rig.fake.set_timing(Duration::ZERO, Duration::ZERO);
    rig.fake.push([Scripted::Text("ok".into())]);
    let ask = |max: u64| {
        json!({"op": "chat", "request": {"provider": "p-openai-chat", "model": "m",
        "max_output_tokens": max, "messages": [{"role": "user", "content": "hi"}]}})
    };
    let r = rig.api.op("capped2", "solo", ask(1)).await;
    assert_eq!(r.status, 404, "no such type yet");
    let r = rig
        .api
        .deploy(
            "capped2",
            TESTKIT,
            json!({"budget": {"actor_max_tokens": 1000}}),
        )
        .await;
    assert_eq!(r.status, 201);
    assert!(rig.api.op("capped2", "solo", ask(100)).await.json["answer"].is_object());
    let e = rig.api.op("capped2", "solo", ask(900)).await.json;
    assert!(
        e["error"]
            .as_str()
            .unwrap()
            .contains("this actor may use 1000 tokens"),
        "{e}"
    );

    // A dollar budget needs prices.
    let r = rig
        .api
        .deploy("dollars", TESTKIT, json!({"budget": {"max_cost_usd": 1.5}}))
        .await;
    assert_eq!(r.status, 201);
    let e = rig.api.op("dollars", "x", ask(10)).await.json;
    assert!(
        e["error"]
            .as_str()
            .unwrap()
            .contains("has no price for model `m`"),
        "{e}"
    );
    // A deleted primary is stepped over, priced or not: the priced
    // fallback answers.
    let r = put_provider(
        &rig.api,
        "priced",
        json!({"format": "openai-chat", "base_url": rig.fake.base_url("127.0.0.1"),
               "prices": {"m": {"input_per_mtok": 1.0, "output_per_mtok": 2.0}}}),
    )
    .await;
    assert_eq!(r.status, 201, "{}", r.json);
    let request = json!({"provider": "p-gone", "model": "m", "max_output_tokens": 10,
        "fallbacks": [{"provider": "priced", "model": "m"}],
        "messages": [{"role": "user", "content": "hi"}]});
    let r = rig
        .api
        .op("dollars", "x", json!({"op": "chat", "request": request}))
        .await
        .json;
    assert_eq!(r["answer"]["provider"], "priced", "{r}");
    assert!(r["answer"]["usage"]["cost_usd"].as_f64() > Some(0.0), "{r}");

    // The usage of a turn that fails after its call still counts.
    let js = r#"
import { model } from "marmot";
export default { async onMessage() {
  await model.chat({ provider: "p-openai-chat", model: "m", messages: [{ role: "user", content: "x" }] });
  throw new Error("after the call");
} };
"#;
    let r = rig.api.deploy_js("failing", js).await;
    assert_eq!(r.status, 201, "{}", r.json);
    rig.fake.push([Scripted::Text("spent".into())]);
    let r = rig.api.post_json("/v1/actors/failing/f", &json!({})).await;
    assert_eq!(r.status, 500, "{}", r.json);
    let deadline = Instant::now() + Duration::from_secs(5);
    loop {
        let ty = rig.api.get("/v1/types/failing").await.json;
        if ty["usage"]["calls"] == 1 {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "the failed turn's usage was not recorded: {ty}"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }

    // A call cut off by the turn's timeout gives its reservation back: the
    // budget fits one call at a time, and the next call is admitted.
    let r = rig
        .api
        .deploy(
            "slowcap",
            TESTKIT,
            json!({"turn_timeout_ms": 300, "budget": {"max_tokens": 1500}}),
        )
        .await;
    assert_eq!(r.status, 201, "{}", r.json);
    rig.fake.set_timing(Duration::from_secs(3), Duration::ZERO);
    let r = rig.api.op("slowcap", "s", ask(900)).await;
    assert_eq!(r.json["error"]["code"], "turn_timeout", "{}", r.json);
    rig.fake.set_timing(Duration::ZERO, Duration::ZERO);
    rig.fake.push([Scripted::Text("ok".into())]);
    let r = rig.api.op("slowcap", "s", ask(900)).await;
    assert!(
        r.json["answer"].is_object(),
        "the reservation leaked: {}",
        r.json
    );

    // Committed usage survives a restart and still counts.
    let mut node = rig.node;
    node.restart().await;
    let api = node.client();
    let ty = api.get("/v1/types/capped").await.json;
    assert_eq!(
        ty["usage"]["input_tokens"].as_u64().unwrap()
            + ty["usage"]["output_tokens"].as_u64().unwrap(),
        spent
    );
    let e = api
        .op(
            "capped",
            "late",
            json!({"op": "chat", "request": {"provider": "p-openai-chat", "model": "m",
        "max_output_tokens": MAX_TOKENS, "messages": [{"role": "user", "content": "hi"}]}}),
        )
        .await
        .json;
    assert!(
        e["error"].as_str().unwrap().contains("budget_exceeded"),
        "{e}"
    );
    drop(rig.fake);
}
