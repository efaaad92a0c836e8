//! A model provider for tests and `marmot dev`: a real HTTP server that
//! speaks OpenAI Chat Completions (`POST /v1/chat/completions`), OpenAI
//! Responses (`POST /v1/responses`) and Anthropic Messages (`POST
//! /v1/messages`), streamed (server-sent events, as the vendors send them)
//! or not, and answers from a script.
//!
//! It checks requests the way the real APIs do where Marmot could get them
//! wrong: the key header, tool calls without results (400, like OpenAI and
//! Anthropic), tool-call ids (Anthropic's `^[a-zA-Z0-9_-]+$`, OpenAI's 40
//! characters), alternating roles and `max_tokens` (Anthropic). It shares
//! no code with the gateway's codecs, so the two check each other.
//!
//! Replies come from a queue of [`Scripted`] answers; with the queue empty
//! it answers with [`Behaviour`]: an echo of the last user message, or a
//! tool call when the user writes `call TOOL {json}` (or, for `marmot
//! dev`'s assistant, mentions `outputs/…` with a `files` tool offered, or a
//! ticket with a `create_ticket` tool offered).
//!
//! It also serves a tiny help desk for that demo: `POST /desk/tickets`
//! records a ticket, `GET /desk/tickets` lists them.

use std::collections::VecDeque;
use std::net::SocketAddr;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use axum::body::{Body, Bytes};
use axum::extract::State;
use axum::http::{HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::post;
use serde_json::{Value, json};

/// One scripted answer.
#[derive(Debug, Clone)]
pub enum Scripted {
    /// Text.
    Text(String),
    /// Tool calls (with optional text before them): (id, name, arguments).
    ToolCalls {
        /// Text before the calls.
        text: String,
        /// The calls.
        calls: Vec<(String, String, Value)>,
    },
    /// An error status, with a `Retry-After` header if given; the body is
    /// the vendor's error object (type `overloaded_error` for 529…).
    Error {
        /// Status.
        status: u16,
        /// `Retry-After` value.
        retry_after: Option<String>,
    },
    /// Status 200, part of the text, then an error event (streamed calls;
    /// a call that is not streamed gets a 500).
    MidStreamError {
        /// Text streamed before the error.
        text: String,
    },
    /// Wait this long before answering with the next scripted answer.
    Delay(Duration, Box<Scripted>),
}

/// What to answer when the script is empty.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Behaviour {
    /// Echo the last user message (`call TOOL {json}` calls a tool; a tool
    /// result is summarized).
    Echo,
    /// Answer 500: every call must be scripted.
    Strict,
}

/// A request the server received.
#[derive(Debug, Clone)]
pub struct Seen {
    /// Its path.
    pub path: String,
    /// Its headers (lowercase names).
    pub headers: Vec<(String, String)>,
    /// Its JSON body.
    pub body: Value,
}

impl Seen {
    /// A header's value.
    pub fn header(&self, name: &str) -> Option<&str> {
        self.headers
            .iter()
            .find(|(k, _)| k == name)
            .map(|(_, v)| v.as_str())
    }
}

/// Knobs and the script.
struct Shared {
    script: Mutex<VecDeque<Scripted>>,
    seen: Mutex<Vec<Seen>>,
    behaviour: Behaviour,
    key: Option<String>,
    /// Before the first byte of an answer.
    latency: Mutex<Duration>,
    /// Between two streamed deltas.
    token_delay: Mutex<Duration>,
    /// The demo help desk's tickets.
    desk: Mutex<Vec<Value>>,
}

/// A running fake provider.
pub struct FakeProvider {
    addr: SocketAddr,
    tls: bool,
    shared: Arc<Shared>,
    task: tokio::task::JoinHandle<()>,
}

impl Drop for FakeProvider {
    fn drop(&mut self) {
        self.task.abort();
    }
}

impl FakeProvider {
    /// Serve plain HTTP on `listener`; calls must carry `key` if given.
    pub fn start(
        listener: tokio::net::TcpListener,
        behaviour: Behaviour,
        key: Option<String>,
    ) -> Self {
        Self::start_inner(listener, None, behaviour, key)
    }

    /// Serve HTTPS with `tls` on `listener`.
    pub fn start_tls(
        listener: tokio::net::TcpListener,
        tls: Arc<tokio_rustls::rustls::ServerConfig>,
        behaviour: Behaviour,
        key: Option<String>,
    ) -> Self {
        Self::start_inner(listener, Some(tls), behaviour, key)
    }

    fn start_inner(
        listener: tokio::net::TcpListener,
        tls: Option<Arc<tokio_rustls::rustls::ServerConfig>>,
        behaviour: Behaviour,
        key: Option<String>,
    ) -> Self {
        let addr = listener.local_addr().expect("a bound listener");
        let shared = Arc::new(Shared {
            script: Mutex::new(VecDeque::new()),
            seen: Mutex::new(Vec::new()),
            behaviour,
            key,
            latency: Mutex::new(Duration::ZERO),
            token_delay: Mutex::new(Duration::ZERO),
            desk: Mutex::new(Vec::new()),
        });
        let app = axum::Router::new()
            .route("/desk/tickets", post(desk_post).get(desk_list))
            .route("/v1/chat/completions", post(openai_chat))
            .route("/v1/responses", post(openai_responses))
            .route("/v1/messages", post(anthropic))
            .with_state(shared.clone());
        let is_tls = tls.is_some();
        let task = tokio::spawn(async move {
            match tls {
                None => {
                    // Streamed frames go out at once, as a provider's do.
                    let listener = axum::serve::ListenerExt::tap_io(listener, |tcp| {
                        let _ = tcp.set_nodelay(true);
                    });
                    let _ = axum::serve(listener, app).await;
                }
                Some(cfg) => serve_tls(listener, cfg, app).await,
            }
        });
        Self {
            addr,
            tls: is_tls,
            shared,
            task,
        }
    }

    /// The base URL to configure (`…/v1`).
    pub fn base_url(&self, host: &str) -> String {
        let scheme = if self.tls { "https" } else { "http" };
        format!("{scheme}://{host}:{}/v1", self.addr.port())
    }

    /// The address it listens on.
    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// Queue answers, used in order by calls of any format.
    pub fn push(&self, answers: impl IntoIterator<Item = Scripted>) {
        self.shared.script.lock().unwrap().extend(answers);
    }

    /// Scripted answers not used yet.
    pub fn pending(&self) -> usize {
        self.shared.script.lock().unwrap().len()
    }

    /// Every request so far.
    pub fn requests(&self) -> Vec<Seen> {
        self.shared.seen.lock().unwrap().clone()
    }

    /// Wait `latency` before each answer and `token_delay` between
    /// streamed deltas.
    pub fn set_timing(&self, latency: Duration, token_delay: Duration) {
        *self.shared.latency.lock().unwrap() = latency;
        *self.shared.token_delay.lock().unwrap() = token_delay;
    }
}

async fn serve_tls(
    listener: tokio::net::TcpListener,
    cfg: Arc<tokio_rustls::rustls::ServerConfig>,
    app: axum::Router,
) {
    let acceptor = tokio_rustls::TlsAcceptor::from(cfg);
    loop {
        let Ok((tcp, _)) = listener.accept().await else {
            return;
        };
        let (acceptor, app) = (acceptor.clone(), app.clone());
        tokio::spawn(async move {
            let _ = tcp.set_nodelay(true);
            let Ok(stream) = acceptor.accept(tcp).await else {
                return;
            };
            let io = hyper_util::rt::TokioIo::new(stream);
            let service =
                hyper::service::service_fn(move |req: hyper::Request<hyper::body::Incoming>| {
                    use tower::ServiceExt as _;
                    app.clone().oneshot(req.map(Body::new))
                });
            let _ = hyper::server::conn::http1::Builder::new()
                .serve_connection(io, service)
                .await;
        });
    }
}

/// Which vendor a handler plays.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Vendor {
    Chat,
    Responses,
    Anthropic,
}

async fn desk_post(s: State<Arc<Shared>>, body: Bytes) -> Response {
    let ticket: Value = serde_json::from_slice(&body).unwrap_or(Value::Null);
    let mut desk = s.desk.lock().unwrap();
    desk.push(ticket);
    axum::Json(json!({ "id": desk.len(), "status": "open" })).into_response()
}

async fn desk_list(s: State<Arc<Shared>>) -> Response {
    axum::Json(json!({ "tickets": *s.desk.lock().unwrap() })).into_response()
}

async fn openai_chat(s: State<Arc<Shared>>, h: HeaderMap, body: Bytes) -> Response {
    handle(s.0, Vendor::Chat, "/v1/chat/completions", h, body).await
}

async fn openai_responses(s: State<Arc<Shared>>, h: HeaderMap, body: Bytes) -> Response {
    handle(s.0, Vendor::Responses, "/v1/responses", h, body).await
}

async fn anthropic(s: State<Arc<Shared>>, h: HeaderMap, body: Bytes) -> Response {
    handle(s.0, Vendor::Anthropic, "/v1/messages", h, body).await
}

async fn handle(
    s: Arc<Shared>,
    vendor: Vendor,
    path: &str,
    headers: HeaderMap,
    body: Bytes,
) -> Response {
    let Ok(body) = serde_json::from_slice::<Value>(&body) else {
        return error(
            vendor,
            400,
            "invalid_request_error",
            "body is not JSON",
            None,
        );
    };
    s.seen.lock().unwrap().push(Seen {
        path: path.to_owned(),
        headers: headers
            .iter()
            .map(|(k, v)| {
                (
                    k.as_str().to_owned(),
                    v.to_str().unwrap_or_default().to_owned(),
                )
            })
            .collect(),
        body: body.clone(),
    });
    if let Some(key) = &s.key {
        let given = match vendor {
            Vendor::Anthropic => headers.get("x-api-key").and_then(|v| v.to_str().ok()),
            _ => headers
                .get("authorization")
                .and_then(|v| v.to_str().ok())
                .and_then(|v| v.strip_prefix("Bearer ")),
        };
        if given != Some(key.as_str()) {
            return error(
                vendor,
                401,
                "authentication_error",
                "invalid x-api-key",
                None,
            );
        }
    }
    if let Err(why) = check(vendor, &body) {
        return error(vendor, 400, "invalid_request_error", &why, None);
    }
    let latency = *s.latency.lock().unwrap();
    if !latency.is_zero() {
        tokio::time::sleep(latency).await;
    }
    let mut next = s.script.lock().unwrap().pop_front();
    while let Some(Scripted::Delay(d, inner)) = next {
        tokio::time::sleep(d).await;
        next = Some(*inner);
    }
    let answer = match next {
        Some(a) => a,
        None if s.behaviour == Behaviour::Strict => {
            return error(vendor, 500, "api_error", "nothing scripted", None);
        }
        None => echo(vendor, &body),
    };
    let stream = body.get("stream").and_then(Value::as_bool).unwrap_or(false);
    let model = body
        .get("model")
        .and_then(Value::as_str)
        .unwrap_or("fake")
        .to_owned();
    let input_tokens = (body.to_string().len() / 4) as u64;
    let delay = *s.token_delay.lock().unwrap();
    match answer {
        Scripted::Error {
            status,
            retry_after,
        } => {
            let ty = match status {
                429 => "rate_limit_error",
                529 => "overloaded_error",
                _ => "api_error",
            };
            error(vendor, status, ty, "scripted error", retry_after)
        }
        Scripted::MidStreamError { text } if stream => {
            let mut frames = start_frames(vendor, &model, input_tokens);
            frames.extend(text_frames(vendor, &text));
            frames.push(match vendor {
                Vendor::Anthropic => sse(
                    Some("error"),
                    json!({"type": "error", "error": {"type": "overloaded_error", "message": "Overloaded"}}),
                ),
                Vendor::Chat => sse(
                    None,
                    json!({"error": {"message": "The server had an error while processing your request.", "type": "server_error"}}),
                ),
                Vendor::Responses => sse(
                    Some("error"),
                    json!({"type": "error", "code": "server_error", "message": "The server had an error"}),
                ),
            });
            stream_response(frames, delay)
        }
        Scripted::MidStreamError { .. } => error(vendor, 500, "api_error", "scripted", None),
        Scripted::Delay(..) => unreachable!("delays are unwrapped above"),
        Scripted::Text(text) => {
            answer_with(vendor, &model, input_tokens, &text, &[], stream, delay)
        }
        Scripted::ToolCalls { text, calls } => {
            answer_with(vendor, &model, input_tokens, &text, &calls, stream, delay)
        }
    }
}

/// The default answer.
fn echo(vendor: Vendor, body: &Value) -> Scripted {
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
fn tool_names(vendor: Vendor, body: &Value) -> Vec<String> {
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
fn last_message(vendor: Vendor, body: &Value) -> (String, String) {
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

/// The provider's rules Marmot must follow.
fn check(vendor: Vendor, body: &Value) -> Result<(), String> {
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

fn error(
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

/// Words of `text`, each with its following space: the streamed deltas.
fn words(text: &str) -> Vec<String> {
    let mut out = Vec::new();
    let mut cur = String::new();
    for c in text.chars() {
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
fn answer_with(
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

fn responses_object(
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

fn start_frames(vendor: Vendor, model: &str, input_tokens: u64) -> Vec<String> {
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

fn text_frames(vendor: Vendor, text: &str) -> Vec<String> {
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

fn chat_chunk(model: &str, delta: Value, finish: Value) -> String {
    sse(
        None,
        json!({"id": "chatcmpl-fake", "object": "chat.completion.chunk", "created": 0, "model": model,
        "choices": [{"index": 0, "delta": delta, "finish_reason": finish}]}),
    )
}

fn sse(event: Option<&str>, data: Value) -> String {
    match event {
        Some(e) => format!("event: {e}\ndata: {data}\n\n"),
        None => format!("data: {data}\n\n"),
    }
}

fn stream_response(frames: Vec<String>, delay: Duration) -> Response {
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
