//! Helpers for the agent tests (`tests/agent.rs`, `tests/agent_recovery.rs`):
//! a node with the fake provider and a ticket server the agent's http tool
//! posts to.

use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use marmot::fake_provider::{Behaviour, FakeProvider, Scripted};
use serde_json::{Value, json};

use super::{Api, Marmot, Resp, TESTKIT, tempdir};

/// The ticket server: `POST /tickets` records the request under its
/// `idempotency-key` (after `delay`, so a test can kill the node while the
/// request is in flight); `GET /tickets/by-key/{key}` says whether one
/// arrived.
#[derive(Default)]
pub struct Tickets {
    pub posts: Mutex<Vec<(String, Value)>>,
    pub delay_ms: Mutex<u64>,
}

impl Tickets {
    pub async fn start() -> (Arc<Self>, u16) {
        use axum::extract::{Path, State};
        use axum::routing::{get, post};
        let t = Arc::new(Tickets::default());
        let app = axum::Router::new()
            .route(
                "/tickets",
                post(
                    |State(t): State<Arc<Tickets>>,
                     h: axum::http::HeaderMap,
                     body: axum::body::Bytes| async move {
                        let key = h
                            .get("idempotency-key")
                            .and_then(|v| v.to_str().ok())
                            .unwrap_or("")
                            .to_owned();
                        let body: Value = serde_json::from_slice(&body).unwrap_or(Value::Null);
                        let n = {
                            let mut p = t.posts.lock().unwrap();
                            p.push((key, body));
                            p.len()
                        };
                        let delay = *t.delay_ms.lock().unwrap();
                        tokio::time::sleep(Duration::from_millis(delay)).await;
                        axum::Json(json!({ "id": n }))
                    },
                ),
            )
            .route(
                "/tickets/by-key/{key}",
                get(
                    |State(t): State<Arc<Tickets>>, Path(key): Path<String>| async move {
                        let p = t.posts.lock().unwrap();
                        match p.iter().position(|(k, _)| *k == key) {
                            Some(i) => (
                                axum::http::StatusCode::OK,
                                axum::Json(json!({ "id": i + 1 })),
                            ),
                            None => (axum::http::StatusCode::NOT_FOUND, axum::Json(json!({}))),
                        }
                    },
                ),
            )
            .with_state(t.clone());
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let port = listener.local_addr().unwrap().port();
        tokio::spawn(async move { axum::serve(listener, app).await.unwrap() });
        (t, port)
    }

    pub fn posts(&self) -> Vec<(String, Value)> {
        self.posts.lock().unwrap().clone()
    }
}

pub struct Rig {
    pub dir: tempfile::TempDir,
    pub node: Marmot,
    pub api: Api,
    pub fake: FakeProvider,
    pub tickets: Arc<Tickets>,
    pub port: u16,
}

const CONFIG: &str = "[egress]\nallow_private = [\"127.0.0.1/32\"]\n[models]\nbackoff_ms = 10\n[limits]\nmax_value_bytes = 65536\n";

impl Rig {
    pub async fn new() -> Self {
        Self::with_limits("").await
    }

    /// A rig whose node has these extra `[limits]` lines.
    pub async fn with_limits(limits: &str) -> Self {
        let dir = tempdir();
        let config = format!("{CONFIG}{limits}");
        let node = Marmot::start_opts(&dir.path().join("data"), &[], Some(&config)).await;
        let api = node.client();
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let fake = FakeProvider::start(listener, Behaviour::Echo, None);
        let r = put(
            &api,
            "/v1/providers/fake",
            json!({"format": "openai-chat", "base_url": fake.base_url("127.0.0.1")}),
        )
        .await;
        assert_eq!(r.status, 201, "{}", r.json);
        let (tickets, port) = Tickets::start().await;
        assert_eq!(api.deploy("billing", TESTKIT, json!({})).await.status, 201);
        Rig {
            dir,
            node,
            api,
            fake,
            tickets,
            port,
        }
    }

    /// Deploy an agent type `ty` with these tools.
    pub async fn agent(&self, ty: &str, tools: Value) -> Resp {
        let manifest = json!({
            "kind": "agent",
            "agent": {
                "instructions": "You are a test agent.",
                "model": {"provider": "fake", "name": "m1"},
                "tools": tools,
                "limits": {"max_steps": 10},
            },
            "config": {"allowed_hosts": ["127.0.0.1"]},
        });
        put(&self.api, &format!("/v1/types/{ty}"), manifest).await
    }

    /// Have the model call the code tool once with `code`, then answer
    /// "done"; run an input on `ty`/`id` and return the reply.
    pub async fn run_script(&self, ty: &str, id: &str, code: &str) -> Resp {
        self.fake.push([
            Scripted::ToolCalls {
                text: String::new(),
                calls: vec![("call_js".into(), "code".into(), json!({"code": code}))],
            },
            Scripted::Text("done".into()),
        ]);
        self.api
            .post_json(&format!("/v1/actors/{ty}/{id}"), &json!({"input": "go"}))
            .await
    }

    pub fn ticket_tool(&self, extra: Value) -> Value {
        let mut t = json!({"kind": "http", "name": "create_ticket", "description": "Open a ticket",
                           "method": "POST", "url": format!("http://127.0.0.1:{}/tickets", self.port),
                           "input_schema": {"type": "object", "properties": {"title": {"type": "string"}}}});
        for (k, v) in extra.as_object().unwrap() {
            t[k] = v.clone();
        }
        t
    }

    pub async fn events(&self, ty: &str, id: &str) -> Vec<Value> {
        let r = self
            .api
            .get(&format!("/v1/actors/{ty}/{id}/events?limit=1000"))
            .await;
        r.json["events"].as_array().cloned().unwrap_or_default()
    }

    /// Wait for an event of `kind` (the `n`th, from 1) and return it.
    pub async fn wait_event(&self, ty: &str, id: &str, kind: &str, n: usize) -> Value {
        let deadline = Instant::now() + Duration::from_secs(20);
        loop {
            let evs = self.events(ty, id).await;
            if let Some(e) = evs.iter().filter(|e| e["kind"] == kind).nth(n - 1) {
                return e.clone();
            }
            assert!(Instant::now() < deadline, "no {kind} #{n}: {evs:#?}");
            tokio::time::sleep(Duration::from_millis(25)).await;
        }
    }
}

pub async fn put(api: &Api, path: &str, body: Value) -> Resp {
    api.put_json(path, &body).await
}

pub fn kinds(events: &[Value]) -> Vec<String> {
    events
        .iter()
        .map(|e| e["kind"].as_str().unwrap_or("").to_owned())
        .filter(|k| k != "input_requested" && k != "input_answered")
        .collect()
}
