//! Webhooks in: verified before anything is stored, acknowledged once
//! durably queued, de-duplicated by delivery id, routed by payload field.

mod common;

use std::time::{Duration, Instant};

use common::{Api, COUNTER, Marmot, TESTKIT, kit_node, tempdir};
use reqwest::Method;
use serde_json::{Value, json};

/// A refused delivery: what, path, body, headers, status, error code.
type Case<'a> = (
    &'a str,
    &'a str,
    Vec<u8>,
    Vec<(String, String)>,
    u16,
    &'a str,
);

fn now_s() -> i64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_secs() as i64
}

/// Standard Webhooks headers for `body`, signed with `secret`.
fn signed(secret: &str, id: &str, ts: i64, body: &[u8]) -> Vec<(String, String)> {
    let sig = marmot::webhooks::sign(&marmot::webhooks::secret_key(secret), id, ts, body);
    vec![
        ("webhook-id".into(), id.into()),
        ("webhook-timestamp".into(), ts.to_string()),
        ("webhook-signature".into(), sig),
        ("content-type".into(), "application/json".into()),
    ]
}

async fn post_hook(
    api: &Api,
    path: &str,
    body: &[u8],
    headers: &[(String, String)],
) -> common::Resp {
    let h: Vec<(&str, &str)> = headers
        .iter()
        .map(|(k, v)| (k.as_str(), v.as_str()))
        .collect();
    api.req(
        Method::POST,
        path,
        Some(("application/json", body.to_vec())),
        &h,
    )
    .await
}

async fn hooks(api: &Api, id: &str) -> Vec<Value> {
    let r = api
        .op("kit", id, json!({"op": "get", "key": "hooks"}))
        .await;
    r.json["value"].as_array().cloned().unwrap_or_default()
}

async fn wait_hooks(api: &Api, id: &str, n: usize) -> Vec<Value> {
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        let h = hooks(api, id).await;
        if h.len() >= n {
            return h;
        }
        assert!(Instant::now() < deadline, "{} of {n} hooks ran", h.len());
        tokio::time::sleep(Duration::from_millis(25)).await;
    }
}

async fn kit_with_secret(extra: Value) -> (tempfile::TempDir, Marmot, Api, String) {
    let secret = marmot::webhooks::new_secret();
    let mut config = json!({"webhook_secret": secret});
    config
        .as_object_mut()
        .unwrap()
        .extend(extra.as_object().unwrap().clone());
    let (dir, m, api) = kit_node(config).await;
    (dir, m, api, secret)
}

#[tokio::test]
async fn signed_hooks_run_once_and_redeliveries_are_dropped() {
    let (_dir, _m, api, secret) = kit_with_secret(json!({})).await;
    let body = br#"{"event": "ticket.created", "n": 1}"#;
    let r = post_hook(
        &api,
        "/v1/hooks/kit/t1/support",
        body,
        &signed(&secret, "msg_1", now_s(), body),
    )
    .await;
    assert_eq!(r.status, 202, "{}", r.json);
    assert_eq!(r.json["actor"], "t1");
    assert_eq!(r.json["delivery_id"], "msg_1");
    assert_eq!(r.json["duplicate"], false);
    // The actor was idle: its turn ran before the 202, in the same commit
    // as the delivery's de-duplication record.
    let h = hooks(&api, "t1").await;
    assert_eq!(h.len(), 1, "{h:?}");
    assert_eq!(h[0]["name"], "support");
    assert_eq!(h[0]["body"], json!({"event": "ticket.created", "n": 1}));
    assert_eq!(h[0]["webhook_id"], "msg_1");

    // The sender retries the same message later: new timestamp and
    // signature, same id. Acknowledged, not run again.
    let r = post_hook(
        &api,
        "/v1/hooks/kit/t1/support",
        body,
        &signed(&secret, "msg_1", now_s() + 30, body),
    )
    .await;
    assert_eq!(r.status, 202);
    assert_eq!(r.json["duplicate"], true);
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert_eq!(hooks(&api, "t1").await.len(), 1);
    let text = String::from_utf8(api.get("/metrics").await.body).unwrap();
    assert!(
        text.contains(r#"marmot_webhooks_received_total{outcome="accepted"} 1"#),
        "{text}"
    );
    assert!(text.contains(r#"marmot_webhooks_received_total{outcome="duplicate"} 1"#));
    assert!(
        text.contains("marmot_webhooks_run_directly_total 1"),
        "the idle actor ran it at once: {text}"
    );
}

#[tokio::test]
async fn the_counter_example_counts_signed_hooks() {
    let (_dir, _m, api) = kit_node(json!({})).await;
    let secret = marmot::webhooks::new_secret();
    let r = api
        .deploy("counter", COUNTER, json!({"webhook_secret": secret}))
        .await;
    assert_eq!(r.status, 201, "{}", r.json);
    for (i, body) in [&br#"{"by": 3}"#[..], b""].into_iter().enumerate() {
        let id = format!("msg_{i}");
        let r = post_hook(
            &api,
            "/v1/hooks/counter/alice/shop",
            body,
            &signed(&secret, &id, now_s(), body),
        )
        .await;
        assert_eq!(r.status, 202, "{}", r.json);
    }
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        let r = api
            .req(
                Method::POST,
                "/v1/actors/counter/alice",
                Some(("application/json", br#"{"by": 0}"#.to_vec())),
                &[],
            )
            .await;
        if r.json["n"] == 4 {
            break;
        }
        assert!(Instant::now() < deadline, "counter is {}", r.json);
        tokio::time::sleep(Duration::from_millis(25)).await;
    }
}

#[tokio::test]
async fn bad_expired_replayed_or_tampered_hooks_are_rejected_and_store_nothing() {
    let (_dir, _m, api, secret) = kit_with_secret(json!({})).await;
    api.deploy("plain", TESTKIT, json!({})).await;
    let body = br#"{"n": 1}"#;
    let good = signed(&secret, "msg_x", now_s(), body);
    let other = marmot::webhooks::new_secret();
    let without = |name: &str| -> Vec<(String, String)> {
        good.iter().filter(|(k, _)| k != name).cloned().collect()
    };
    let cases: Vec<Case<'_>> = vec![
        (
            "unsigned",
            "/v1/hooks/kit/a/h",
            body.to_vec(),
            vec![],
            401,
            "invalid_signature",
        ),
        (
            "tampered body",
            "/v1/hooks/kit/a/h",
            br#"{"n": 2}"#.to_vec(),
            good.clone(),
            401,
            "invalid_signature",
        ),
        (
            "wrong secret",
            "/v1/hooks/kit/a/h",
            body.to_vec(),
            signed(&other, "msg_x", now_s(), body),
            401,
            "invalid_signature",
        ),
        (
            "expired",
            "/v1/hooks/kit/a/h",
            body.to_vec(),
            signed(&secret, "msg_old", now_s() - 3600, body),
            401,
            "invalid_timestamp",
        ),
        (
            "from the future",
            "/v1/hooks/kit/a/h",
            body.to_vec(),
            signed(&secret, "msg_new", now_s() + 3600, body),
            401,
            "invalid_timestamp",
        ),
        (
            "missing id",
            "/v1/hooks/kit/a/h",
            body.to_vec(),
            without("webhook-id"),
            401,
            "invalid_signature",
        ),
        (
            "signature for another id",
            "/v1/hooks/kit/a/h",
            body.to_vec(),
            {
                let mut h = good.clone();
                h[0].1 = "msg_y".into();
                h
            },
            401,
            "invalid_signature",
        ),
        (
            "type without a secret",
            "/v1/hooks/plain/a/h",
            body.to_vec(),
            good.clone(),
            403,
            "webhooks_not_configured",
        ),
        (
            "unknown type",
            "/v1/hooks/nope/a/h",
            body.to_vec(),
            good.clone(),
            404,
            "unknown_type",
        ),
        (
            "bad hook name",
            "/v1/hooks/kit/a/h%20x",
            body.to_vec(),
            good.clone(),
            400,
            "invalid_hook_name",
        ),
        (
            "bad actor id",
            "/v1/hooks/kit/a%01b/h",
            body.to_vec(),
            good.clone(),
            400,
            "invalid_actor_id",
        ),
        (
            "no route",
            "/v1/hooks/kit/_/h",
            body.to_vec(),
            good.clone(),
            400,
            "no_route",
        ),
    ];
    for (what, path, body, headers, status, code) in cases {
        let r = post_hook(&api, path, &body, &headers).await;
        assert_eq!(r.status, status, "{what}: {}", r.json);
        assert_eq!(r.code(), code, "{what}: {}", r.json);
    }
    // Nothing was stored: the actor does not even exist.
    assert_eq!(api.get("/v1/actors/kit/a").await.status, 404);
    // A rejected delivery id is not burnt: the genuine one still goes in.
    let r = post_hook(&api, "/v1/hooks/kit/a/h", body, &good).await;
    assert_eq!(r.status, 202, "{}", r.json);
    assert_eq!(r.json["duplicate"], false);
    assert_eq!(wait_hooks(&api, "a", 1).await.len(), 1);
}

#[tokio::test]
async fn github_signatures_are_accepted_and_deliveries_deduped() {
    let (_dir, _m, api, secret) = kit_with_secret(json!({})).await;
    let body = br#"{"action": "opened", "number": 7}"#;
    let sig = {
        use hmac::Mac;
        let mut mac = hmac::Hmac::<sha2::Sha256>::new_from_slice(secret.as_bytes()).unwrap();
        mac.update(body);
        format!("sha256={}", hex::encode(mac.finalize().into_bytes()))
    };
    let headers = vec![
        ("x-hub-signature-256".to_owned(), sig.clone()),
        ("x-github-delivery".to_owned(), "d-1".to_owned()),
        ("x-github-event".to_owned(), "pull_request".to_owned()),
        ("authorization".to_owned(), "token do-not-leak".to_owned()),
    ];
    let r = post_hook(&api, "/v1/hooks/kit/repo/github", body, &headers).await;
    assert_eq!(r.status, 202, "{}", r.json);
    assert_eq!(r.json["delivery_id"], "d-1");
    let r = post_hook(&api, "/v1/hooks/kit/repo/github", body, &headers).await;
    assert_eq!(r.json["duplicate"], true);
    let h = wait_hooks(&api, "repo", 1).await;
    assert_eq!(h[0]["github_delivery"], "d-1");
    assert_eq!(
        h[0]["has_authorization"], false,
        "credentials never reach the actor"
    );
    let mut bad = headers.clone();
    bad[0].1 = format!("sha256={}", "0".repeat(64));
    bad[1].1 = "d-2".into();
    let r = post_hook(&api, "/v1/hooks/kit/repo/github", body, &bad).await;
    assert_eq!(r.status, 401);
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert_eq!(hooks(&api, "repo").await.len(), 1);
}

#[tokio::test]
async fn hooks_are_routed_to_the_actor_named_in_the_payload() {
    let (_dir, _m, api, secret) =
        kit_with_secret(json!({"webhook_routes": {"zendesk": "/ticket/id"}})).await;
    for (n, ticket) in [(1, json!(4521)), (2, json!("4521")), (3, json!("98"))] {
        let body = serde_json::to_vec(&json!({"ticket": {"id": ticket}, "n": n})).unwrap();
        let r = post_hook(
            &api,
            "/v1/hooks/kit/_/zendesk",
            &body,
            &signed(&secret, &format!("msg_{n}"), now_s(), &body),
        )
        .await;
        assert_eq!(r.status, 202, "{}", r.json);
    }
    let h = wait_hooks(&api, "4521", 2).await;
    assert_eq!(h[0]["body"]["n"], 1);
    assert_eq!(h[1]["body"]["n"], 2);
    assert_eq!(wait_hooks(&api, "98", 1).await.len(), 1);
    let body = br#"{"other": 1}"#;
    let r = post_hook(
        &api,
        "/v1/hooks/kit/_/zendesk",
        body,
        &signed(&secret, "msg_9", now_s(), body),
    )
    .await;
    assert_eq!(r.status, 422);
    assert_eq!(r.code(), "route_field_missing");
    // Bad routing config is refused at deploy.
    let r = api
        .deploy(
            "bad",
            TESTKIT,
            json!({"webhook_routes": {"x": "ticket.id"}, "webhook_secret": secret}),
        )
        .await;
    assert_eq!(r.status, 400, "{}", r.json);
    let r = api
        .deploy("bad", TESTKIT, json!({"webhook_secret": "hunter2"}))
        .await;
    assert_eq!(r.status, 400, "{}", r.json);
    assert!(
        r.json["error"]["message"]
            .as_str()
            .unwrap()
            .contains("whsec_")
    );
    // The secret is never shown back.
    let t = api.get("/v1/types/kit").await.json;
    assert!(!t.to_string().contains(&secret[6..]), "{t}");
}

#[tokio::test]
async fn a_slow_hook_is_acknowledged_without_waiting_for_it_and_runs_once() {
    // The actor is idle, so the hook is handed to it to run at once; its
    // handler takes longer than the node waits (1 s), so the node queues
    // it durably and answers. The turn already running then commits, and
    // the queued row must not run it a second time.
    let (_dir, _m, api, secret) = kit_with_secret(json!({})).await;
    let body = br#"{"busy_ms": 1600}"#;
    let started = Instant::now();
    let r = post_hook(
        &api,
        "/v1/hooks/kit/slow/h",
        body,
        &signed(&secret, "msg_slow", now_s(), body),
    )
    .await;
    assert_eq!(r.status, 202, "{}", r.json);
    let waited = started.elapsed();
    assert!(
        waited >= Duration::from_millis(900) && waited < Duration::from_millis(1500),
        "acknowledged after {waited:?}"
    );
    assert_eq!(wait_hooks(&api, "slow", 1).await.len(), 1);
    tokio::time::sleep(Duration::from_millis(500)).await;
    assert_eq!(hooks(&api, "slow").await.len(), 1, "ran twice");
    let text = String::from_utf8(api.get("/metrics").await.body).unwrap();
    assert!(
        text.contains("marmot_webhooks_run_directly_total 0"),
        "{text}"
    );
}

#[tokio::test]
async fn an_acknowledged_hook_survives_kill_9() {
    let secret = marmot::webhooks::new_secret();
    let dir = tempdir();
    let mut m = Marmot::start(&dir.path().join("data")).await;
    let api = m.client();
    api.deploy("kit", TESTKIT, json!({"webhook_secret": secret}))
        .await;
    // A slow message first, so the hook is still queued at the kill.
    let r = api
        .post_json(
            "/v1/actors/kit/a?wait=false",
            &json!({"op": "busy", "ms": 1500}),
        )
        .await;
    assert_eq!(r.status, 202);
    // Let the slow turn start: the actor is busy when the hook arrives.
    tokio::time::sleep(Duration::from_millis(200)).await;
    let body = br#"{"n": 1}"#;
    let started = Instant::now();
    let r = post_hook(
        &api,
        "/v1/hooks/kit/a/h",
        body,
        &signed(&secret, "msg_k", now_s(), body),
    )
    .await;
    assert_eq!(r.status, 202);
    // A busy actor does not hold up the sender: the hook is queued and
    // acknowledged at once, not run first.
    assert!(
        started.elapsed() < Duration::from_millis(1000),
        "acknowledged after {:?}",
        started.elapsed()
    );
    let text = String::from_utf8(api.get("/metrics").await.body).unwrap();
    assert!(
        text.contains("marmot_webhooks_run_directly_total 0"),
        "{text}"
    );
    m.kill9();
    m.restart().await;
    let api = m.client();
    let h = wait_hooks(&api, "a", 1).await;
    assert_eq!(h[0]["webhook_id"], "msg_k");
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert_eq!(hooks(&api, "a").await.len(), 1);
    // Still a duplicate after the restart.
    let r = post_hook(
        &api,
        "/v1/hooks/kit/a/h",
        body,
        &signed(&secret, "msg_k", now_s(), body),
    )
    .await;
    assert_eq!(r.json["duplicate"], true);
}

// ---------------------------------------------------------------------------
// Webhooks out.

use std::sync::Arc;
use std::sync::Mutex;
use std::sync::atomic::{AtomicU16, AtomicUsize, Ordering};

/// One request the receiver got.
#[derive(Debug, Clone)]
struct Received {
    id: String,
    timestamp: String,
    signature: String,
    body: Vec<u8>,
}

/// A local webhook receiver whose answers the test controls.
#[derive(Default)]
struct ReceiverState {
    got: Mutex<Vec<Received>>,
    /// Answer 500 to this many requests first.
    fail_first: AtomicUsize,
    /// Status for everything else (200 when 0).
    status: AtomicU16,
    delay_ms: AtomicUsize,
    in_flight: AtomicUsize,
    max_in_flight: AtomicUsize,
}

struct Receiver {
    url: String,
    state: Arc<ReceiverState>,
    task: tokio::task::JoinHandle<()>,
}

impl Drop for Receiver {
    fn drop(&mut self) {
        self.task.abort();
    }
}

impl Receiver {
    async fn start() -> Self {
        Self::start_on(0).await
    }

    async fn start_on(port: u16) -> Self {
        let state = Arc::new(ReceiverState::default());
        let listener = tokio::net::TcpListener::bind(("127.0.0.1", port))
            .await
            .unwrap();
        let url = format!("http://{}/hook", listener.local_addr().unwrap());
        let st = state.clone();
        let app = axum::Router::new().route(
            "/hook",
            axum::routing::post(
                move |headers: axum::http::HeaderMap, body: axum::body::Bytes| {
                    let st = st.clone();
                    async move {
                        let now = st.in_flight.fetch_add(1, Ordering::SeqCst) + 1;
                        st.max_in_flight.fetch_max(now, Ordering::SeqCst);
                        let delay = st.delay_ms.load(Ordering::SeqCst);
                        if delay > 0 {
                            tokio::time::sleep(Duration::from_millis(delay as u64)).await;
                        }
                        let h = |n: &str| {
                            headers
                                .get(n)
                                .map(|v| v.to_str().unwrap().to_owned())
                                .unwrap_or_default()
                        };
                        st.got.lock().unwrap().push(Received {
                            id: h("webhook-id"),
                            timestamp: h("webhook-timestamp"),
                            signature: h("webhook-signature"),
                            body: body.to_vec(),
                        });
                        st.in_flight.fetch_sub(1, Ordering::SeqCst);
                        let failing = st
                            .fail_first
                            .fetch_update(Ordering::SeqCst, Ordering::SeqCst, |n| n.checked_sub(1))
                            .is_ok();
                        let status = match st.status.load(Ordering::SeqCst) {
                            _ if failing => 500,
                            0 => 200,
                            s => s,
                        };
                        (
                            axum::http::StatusCode::from_u16(status).unwrap(),
                            "nope".to_owned(),
                        )
                    }
                },
            ),
        );
        let task = tokio::spawn(async move {
            axum::serve(listener, app).await.unwrap();
        });
        Self { url, state, task }
    }

    fn got(&self) -> Vec<Received> {
        self.state.got.lock().unwrap().clone()
    }

    async fn wait_for(&self, n: usize) -> Vec<Received> {
        let deadline = Instant::now() + Duration::from_secs(20);
        loop {
            let got = self.got();
            if got.len() >= n {
                return got;
            }
            assert!(
                Instant::now() < deadline,
                "receiver got {} of {n} requests",
                got.len()
            );
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }
}

async fn subscribe(api: &Api, name: &str, spec: Value) -> common::Resp {
    api.req(
        Method::PUT,
        &format!("/v1/subscriptions/{name}"),
        Some(("application/json", serde_json::to_vec(&spec).unwrap())),
        &[],
    )
    .await
}

async fn emit_kind(api: &Api, id: &str, kind: &str, n: i64) {
    let r = api
        .op(
            "kit",
            id,
            json!({"op": "emit", "kind": kind, "data": {"n": n}}),
        )
        .await;
    assert_eq!(r.status, 200, "{}", r.json);
}

fn check_signature(secret: &str, r: &Received) {
    let verified = marmot::webhooks::verify_standard(
        &marmot::webhooks::secret_key(secret),
        &r.id,
        &r.timestamp,
        &r.signature,
        &r.body,
        now_s(),
        300,
    );
    assert_eq!(verified, Ok(()), "signature of {r:?}");
}

async fn fast_retry_node(config: Option<&str>) -> (tempfile::TempDir, Marmot, Api) {
    let dir = tempdir();
    let m = Marmot::start_opts(
        &dir.path().join("data"),
        &[("MARMOT_WEBHOOK_RETRY_BASE_MS", "40")],
        config,
    )
    .await;
    let api = m.client();
    assert_eq!(api.deploy("kit", TESTKIT, json!({})).await.status, 201);
    (dir, m, api)
}

#[tokio::test]
async fn a_failing_receiver_gets_the_event_again_with_the_same_id_and_valid_signatures() {
    let rx = Receiver::start().await;
    rx.state.fail_first.store(3, Ordering::SeqCst);
    let (_dir, _m, api) = fast_retry_node(None).await;
    let secret = marmot::webhooks::new_secret();
    let r = subscribe(
        &api,
        "orders",
        json!({"url": rx.url, "events": ["order.*"], "secret": secret}),
    )
    .await;
    assert_eq!(r.status, 201, "{}", r.json);
    assert!(
        r.json.get("secret").is_none(),
        "a given secret is not echoed"
    );
    emit_kind(&api, "a", "order.paid", 7).await;
    emit_kind(&api, "a", "note", 8).await; // not subscribed
    let got = rx.wait_for(4).await;
    tokio::time::sleep(Duration::from_millis(300)).await;
    let got_all = rx.got();
    assert_eq!(got_all.len(), 4, "3 failures + 1 success, nothing else");
    assert!(got.iter().all(|r| r.id == got[0].id), "stable webhook-id");
    assert!(got[0].id.starts_with("msg_"));
    assert!(got.iter().all(|r| r.body == got[0].body), "same bytes");
    for r in &got {
        check_signature(&secret, r);
    }
    let body: Value = serde_json::from_slice(&got[0].body).unwrap();
    assert_eq!(body["type"], "order.paid");
    assert!(body["timestamp"].as_str().unwrap().ends_with('Z'));
    assert_eq!(
        body["data"],
        json!({"actor_type": "kit", "actor_id": "a", "seq": 1, "kind": "order.paid",
               "data": {"n": 7}, "at_ms": body["data"]["at_ms"]})
    );
    let d = api.get("/v1/deliveries").await.json;
    assert_eq!(d["deliveries"], json!([]), "delivered rows are gone: {d}");
    let text = String::from_utf8(api.get("/metrics").await.body).unwrap();
    assert!(
        text.contains(r#"marmot_webhook_deliveries_total{outcome="failed"} 3"#),
        "{text}"
    );
    assert!(text.contains(r#"marmot_webhook_deliveries_total{outcome="delivered"} 1"#));
}

#[tokio::test]
async fn dead_letters_are_kept_and_can_be_replayed() {
    let rx = Receiver::start().await;
    rx.state.status.store(503, Ordering::SeqCst);
    let (_dir, m, api) = fast_retry_node(Some("[webhooks]\nmax_attempts = 3\n")).await;
    let r = subscribe(&api, "all", json!({"url": rx.url})).await;
    assert_eq!(r.status, 201);
    let secret = r.json["secret"].as_str().unwrap().to_owned();
    assert!(
        secret.starts_with("whsec_"),
        "a generated secret is shown once"
    );
    emit_kind(&api, "a", "order.paid", 1).await;
    let deadline = Instant::now() + Duration::from_secs(20);
    let dead = loop {
        let d = api.get("/v1/deliveries?status=dead").await.json;
        if let Some(x) = d["deliveries"].as_array().and_then(|a| a.first()) {
            break x.clone();
        }
        assert!(Instant::now() < deadline, "never dead: {d}");
        tokio::time::sleep(Duration::from_millis(25)).await;
    };
    assert_eq!(dead["attempts"], 3);
    assert_eq!(dead["status"], "dead");
    assert_eq!(dead["subscription"], "all");
    assert_eq!(dead["actor"], json!({"type": "kit", "id": "a"}));
    assert_eq!(dead["next_attempt_ms"], Value::Null);
    assert_eq!(dead["last_error"], "HTTP 503: nope");
    assert_eq!(rx.got().len(), 3);
    assert!(m.log_text().contains("dead-letter"));
    let text = String::from_utf8(api.get("/metrics").await.body).unwrap();
    assert!(text.contains(r#"marmot_webhook_deliveries_total{outcome="dead"} 1"#));

    // The receiver is fixed; replay the dead delivery.
    rx.state.status.store(200, Ordering::SeqCst);
    let id = dead["id"].as_str().unwrap();
    let r = api
        .req(
            Method::POST,
            &format!("/v1/deliveries/{id}/retry"),
            None,
            &[],
        )
        .await;
    assert_eq!(r.status, 202, "{}", r.json);
    let got = rx.wait_for(4).await;
    assert_eq!(got[3].id, id, "the replay carries the same webhook-id");
    check_signature(&secret, &got[3]);
    let deadline = Instant::now() + Duration::from_secs(10);
    while !api.get("/v1/deliveries").await.json["deliveries"]
        .as_array()
        .unwrap()
        .is_empty()
    {
        assert!(Instant::now() < deadline);
        tokio::time::sleep(Duration::from_millis(25)).await;
    }
    let r = api
        .req(
            Method::POST,
            &format!("/v1/deliveries/{id}/retry"),
            None,
            &[],
        )
        .await;
    assert_eq!(r.status, 404, "delivered: nothing left to replay");
    let r = api
        .req(Method::POST, "/v1/deliveries/msg_nope/retry", None, &[])
        .await;
    assert_eq!(r.code(), "delivery_not_found");
}

#[tokio::test]
async fn only_committed_events_go_out_and_pending_ones_survive_kill_9() {
    // The receiver is down at first: its port is reserved but closed.
    let port = common::free_port();
    let url = format!("http://127.0.0.1:{port}/hook");
    let dir = tempdir();
    let mut m = Marmot::start_with_env(
        &dir.path().join("data"),
        &[("MARMOT_WEBHOOK_RETRY_BASE_MS", "40")],
    )
    .await;
    let api = m.client();
    api.deploy("kit", TESTKIT, json!({})).await;
    assert_eq!(
        subscribe(&api, "all", json!({"url": url, "types": ["kit"]}))
            .await
            .status,
        201
    );
    emit_kind(&api, "a", "first", 1).await;
    // A failed turn emits an event that never commits.
    api.op(
        "kit",
        "a",
        json!({"op": "set_then_fail", "key": "k", "value": 1}),
    )
    .await;
    emit_kind(&api, "a", "second", 2).await;
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let d = api.get("/v1/deliveries?status=failed").await.json;
        if d["deliveries"].as_array().unwrap().len() == 2 {
            assert!(
                d["deliveries"][0]["last_error"]
                    .as_str()
                    .unwrap()
                    .contains("connection failed")
            );
            break;
        }
        assert!(Instant::now() < deadline, "{d}");
        tokio::time::sleep(Duration::from_millis(25)).await;
    }
    m.kill9();
    let rx = Receiver::start_on(port).await;
    m.restart().await;
    let got = rx.wait_for(2).await;
    tokio::time::sleep(Duration::from_millis(300)).await;
    let kinds: Vec<String> = rx
        .got()
        .iter()
        .map(|r| {
            serde_json::from_slice::<Value>(&r.body).unwrap()["type"]
                .as_str()
                .unwrap()
                .to_owned()
        })
        .collect();
    let mut sorted = kinds.clone();
    sorted.sort();
    assert_eq!(
        sorted,
        ["first", "second"],
        "committed events only, once each"
    );
    assert_ne!(got[0].id, got[1].id);
}

#[tokio::test]
async fn deliveries_to_one_host_are_bounded() {
    let rx = Receiver::start().await;
    rx.state.delay_ms.store(150, Ordering::SeqCst);
    let (_dir, _m, api) = fast_retry_node(Some("[webhooks]\nper_destination = 2\n")).await;
    subscribe(&api, "all", json!({"url": rx.url})).await;
    let sends = (0..8).map(|i| {
        let api = api.clone();
        async move { emit_kind(&api, &format!("a{i}"), "k", i).await }
    });
    futures::future::join_all(sends).await;
    rx.wait_for(8).await;
    let max = rx.state.max_in_flight.load(Ordering::SeqCst);
    assert!(max <= 2, "{max} deliveries in flight to one host");
    assert!(max >= 1);
}

#[tokio::test]
async fn subscriptions_are_validated_and_never_show_their_secret() {
    let (_dir, _m, api) = kit_node(json!({})).await;
    for (spec, name) in [
        (json!({"url": "ftp://x/"}), "s"),
        (json!({"url": "http://x/", "events": []}), "s"),
        (json!({"url": "http://x/", "secret": "hunter2"}), "s"),
        (json!({"url": "http://x/", "oops": 1}), "s"),
        (json!({"url": "http://x/"}), "bad name"),
    ] {
        let r = subscribe(&api, name, spec.clone()).await;
        assert_eq!(r.status, 400, "{spec}: {}", r.json);
    }
    let r = subscribe(
        &api,
        "s",
        json!({"url": "https://example.com/h", "events": ["a.*"]}),
    )
    .await;
    assert_eq!(r.status, 201);
    let secret = r.json["secret"].as_str().unwrap().to_owned();
    let r = subscribe(&api, "s", json!({"url": "https://example.com/h2"})).await;
    assert_eq!(r.status, 200, "replaced");
    let one = api.get("/v1/subscriptions/s").await.json;
    assert_eq!(one["url"], "https://example.com/h2");
    assert_eq!(one["events"], json!(["*"]));
    let all = api.get("/v1/subscriptions").await;
    assert!(!String::from_utf8_lossy(&all.body).contains(&secret[6..]));
    assert!(!String::from_utf8_lossy(&all.body).contains("secret"));
    assert_eq!(api.get("/v1/subscriptions/none").await.status, 404);
    assert_eq!(api.delete("/v1/subscriptions/s").await.status, 200);
    assert_eq!(api.delete("/v1/subscriptions/s").await.status, 404);
    assert_eq!(api.get("/v1/deliveries?status=weird").await.status, 400);
}
