//! A model provider for tests and `marmot dev`: a real HTTP server that
//! speaks OpenAI Chat Completions (`POST /v1/chat/completions`), OpenAI
//! Responses (`POST /v1/responses`) and Anthropic Messages (`POST
//! /v1/messages`), streamed (server-sent events, as the vendors send them)
//! or not, and answers from a script.
//!
//! It checks requests the way the real APIs do where Marmot could get them
//! wrong: the key header, tool calls without results (400, like OpenAI and
//! Anthropic), tool-call ids (Anthropic's `^[a-zA-Z0-9_-]+$`, OpenAI's 40
//! characters), called tools' names (`^[a-zA-Z0-9_-]{1,64}$`), alternating
//! roles and `max_tokens` (Anthropic). It shares
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
use axum::http::HeaderMap;
use axum::response::{IntoResponse, Response};
use axum::routing::post;
use serde_json::{Value, json};

mod frames;
mod reading;

pub use frames::DELTA_BREAK;
use frames::{answer_with, error, sse, start_frames, stream_response, text_frames};
use reading::{check, echo};

/// How many requests [`FakeProvider::requests`] keeps.
pub const KEPT_REQUESTS: usize = 10_000;

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
    /// An error status whose error object has this type and message.
    ErrorSaying {
        /// Status.
        status: u16,
        /// The error's `type`.
        kind: String,
        /// Its `message`.
        message: String,
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

    /// The requests so far (the newest [`KEPT_REQUESTS`]: `marmot dev`
    /// and the benches run it for long).
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
    {
        let mut seen = s.seen.lock().unwrap();
        if seen.len() >= KEPT_REQUESTS {
            seen.drain(..KEPT_REQUESTS / 2);
        }
        seen.push(Seen {
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
    }
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
        Scripted::ErrorSaying {
            status,
            kind,
            message,
        } => error(vendor, status, &kind, &message, None),
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
