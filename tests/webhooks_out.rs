//! Webhooks out: every committed event a subscription matches reaches its
//! receiver, signed, retried with the same id, bounded per host, kept as a
//! dead letter when it keeps failing; nothing uncommitted goes out, and
//! pending deliveries survive `kill -9`. Webhooks in are in
//! `tests/webhooks.rs`.

mod common;

use std::sync::Arc;
use std::sync::Mutex;
use std::sync::atomic::{AtomicU16, AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use common::{Api, Marmot, TESTKIT, kit_node, now_s, tempdir};
use reqwest::Method;
use serde_json::{Value, json};

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
                        // A back-off asked for, and where a redirect points.
                        let mut headers = axum::http::HeaderMap::new();
                        if status == 429 {
                            headers.insert("retry-after", "2".parse().unwrap());
                        }
                        if (300..400).contains(&status) {
                            headers.insert("location", "http://127.0.0.1:1/moved".parse().unwrap());
                        }
                        (
                            axum::http::StatusCode::from_u16(status).unwrap(),
                            headers,
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

/// A new subscription `name`, which must be created (201).
async fn subscribed(api: &Api, name: &str, spec: Value) -> common::Resp {
    let r = subscribe(api, name, spec).await;
    assert_eq!(r.status, 201, "{name}: {}", r.json);
    r
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

/// `POST /v1/deliveries/{id}/retry`.
async fn retry(api: &Api, id: &str) -> common::Resp {
    api.req(
        Method::POST,
        &format!("/v1/deliveries/{id}/retry"),
        None,
        &[],
    )
    .await
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
    retry_node("40", config).await
}

/// A node whose outbound retries start `base_ms` apart, with `kit`.
async fn retry_node(base_ms: &str, config: Option<&str>) -> (tempfile::TempDir, Marmot, Api) {
    let dir = tempdir();
    let m = Marmot::start_opts(
        &dir.path().join("data"),
        &[("MARMOT_WEBHOOK_RETRY_BASE_MS", base_ms)],
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
    let r = subscribed(
        &api,
        "orders",
        json!({"url": rx.url, "events": ["order.*"], "secret": secret}),
    )
    .await;
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
    let r = retry(&api, id).await;
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
    let r = retry(&api, id).await;
    assert_eq!(r.status, 404, "delivered: nothing left to replay");
    let r = api
        .req(Method::POST, "/v1/deliveries/msg_nope/retry", None, &[])
        .await;
    assert_eq!(r.code(), "delivery_not_found");
}

/// "Retry now" of a delivery still being retried keeps its attempts (it
/// reset them, so each call put off its dead-lettering and the logs'
/// attempt numbers started over: a probe); a dead one replayed starts
/// its schedule again (above).
#[tokio::test]
async fn retrying_a_pending_delivery_now_keeps_its_attempts() {
    let rx = Receiver::start().await;
    rx.state.status.store(503, Ordering::SeqCst);
    // The second attempt would be a minute away.
    let (_dir, _m, api) = retry_node("60000", None).await;
    assert_eq!(
        subscribe(&api, "all", json!({"url": rx.url})).await.status,
        201
    );
    emit_kind(&api, "a", "x", 1).await;
    rx.wait_for(1).await;
    let pending = |api: &Api| {
        let api = api.clone();
        async move { api.get("/v1/deliveries").await.json["deliveries"][0].clone() }
    };
    let deadline = Instant::now() + Duration::from_secs(10);
    while pending(&api).await["attempts"] != 1 {
        assert!(Instant::now() < deadline, "{}", pending(&api).await);
        tokio::time::sleep(Duration::from_millis(25)).await;
    }
    let id = pending(&api).await["id"].as_str().unwrap().to_owned();
    let r = retry(&api, &id).await;
    assert_eq!(r.status, 202, "{}", r.json);
    assert_eq!(r.json["attempts"], 1, "{}", r.json);
    // Tried now, not in a minute, and counted on from there.
    rx.wait_for(2).await;
    let deadline = Instant::now() + Duration::from_secs(10);
    while pending(&api).await["attempts"] != 2 {
        assert!(Instant::now() < deadline, "{}", pending(&api).await);
        tokio::time::sleep(Duration::from_millis(25)).await;
    }
}

/// A delivery belongs to the subscription it was queued for. Deleted,
/// that subscription's rows (pending and dead) go with it, and a new
/// subscription that takes its name (another URL, another secret) never
/// gets them: they used to go to it, whatever its filter. Replaying a dead
/// one its subscription no longer wants is a 409 that keeps it (it used to
/// be a 202 and the row vanished).
#[tokio::test]
async fn a_deleted_subscriptions_deliveries_never_reach_one_that_takes_its_name() {
    let failing = Receiver::start().await;
    failing.state.status.store(503, Ordering::SeqCst);
    let gone = Receiver::start().await;
    gone.state.status.store(410, Ordering::SeqCst);
    let fresh = Receiver::start().await;
    let (_dir, _m, api) = fast_retry_node(None).await;
    subscribed(
        &api,
        "orders",
        json!({"url": failing.url, "events": ["order.*"]}),
    )
    .await;
    subscribed(
        &api,
        "notes",
        json!({"url": gone.url, "events": ["note.*"]}),
    )
    .await;
    emit_kind(&api, "a", "order.private", 1).await;
    emit_kind(&api, "a", "note.private", 2).await;
    failing.wait_for(2).await;
    gone.wait_for(1).await;
    let dead = api.get("/v1/deliveries?status=dead").await.json;
    let dead_id = dead["deliveries"][0]["id"].as_str().unwrap().to_owned();
    assert_eq!(dead["deliveries"][0]["subscription"], "notes", "{dead}");

    for name in ["orders", "notes"] {
        let r = api.delete(&format!("/v1/subscriptions/{name}")).await;
        assert_eq!(r.status, 200, "{}", r.json);
    }
    let r = subscribed(&api, "orders", json!({"url": fresh.url, "events": ["*"]})).await;
    let secret = r.json["secret"].as_str().unwrap().to_owned();
    emit_kind(&api, "b", "order.new", 3).await;
    let got = fresh.wait_for(1).await;
    // Time for many retries of the old row (40 ms apart, doubling).
    tokio::time::sleep(Duration::from_millis(1500)).await;
    let got_all = fresh.got();
    assert_eq!(
        got_all.len(),
        1,
        "the new subscription got the old one's rows"
    );
    let body: Value = serde_json::from_slice(&got[0].body).unwrap();
    assert_eq!(body["type"], "order.new", "{body}");
    check_signature(&secret, &got[0]);
    let pending = api.get("/v1/deliveries?status=pending").await.json;
    assert_eq!(pending["deliveries"], json!([]), "{pending}");

    // The dead letters went with their subscription: nothing to replay,
    // also once another takes the name.
    subscribed(&api, "notes", json!({"url": fresh.url})).await;
    let dead = api.get("/v1/deliveries?status=dead").await.json;
    assert_eq!(dead["deliveries"], json!([]), "{dead}");
    let r = retry(&api, &dead_id).await;
    assert_eq!(r.code(), "delivery_not_found", "{}", r.json);

    // A replace that narrows the filter: its dead letter stays listed, and
    // a replay is a 409 that keeps it (it was a 202, and the row vanished).
    subscribed(
        &api,
        "narrow",
        json!({"url": gone.url, "events": ["note.*"]}),
    )
    .await;
    emit_kind(&api, "a", "note.again", 3).await;
    let deadline = Instant::now() + Duration::from_secs(20);
    let dead_id = loop {
        let d = api
            .get("/v1/deliveries?status=dead&subscription=narrow")
            .await
            .json;
        if let Some(id) = d["deliveries"][0]["id"].as_str() {
            break id.to_owned();
        }
        assert!(Instant::now() < deadline, "never dead: {d}");
        tokio::time::sleep(Duration::from_millis(25)).await;
    };
    let r = subscribe(
        &api,
        "narrow",
        json!({"url": fresh.url, "events": ["other.*"]}),
    )
    .await;
    assert_eq!(r.status, 200, "{}", r.json);
    let r = retry(&api, &dead_id).await;
    assert_eq!(r.status, 409, "{}", r.json);
    assert_eq!(r.code(), "subscription_gone");
    let dead = api
        .get("/v1/deliveries?status=dead&subscription=narrow")
        .await
        .json;
    assert_eq!(dead["deliveries"][0]["id"], dead_id.as_str(), "{dead}");
    assert!(
        fresh.got().iter().all(|g| g.id != dead_id),
        "the replay was sent"
    );
}

/// Replacing a subscription (a new URL, say) keeps it the same one: its
/// creation time and (unless the replace names one) its secret stay, and
/// what was queued for it goes to the new URL.
#[tokio::test]
async fn a_replaced_subscription_keeps_its_queued_deliveries() {
    let failing = Receiver::start().await;
    failing.state.status.store(503, Ordering::SeqCst);
    let fixed = Receiver::start().await;
    let (_dir, _m, api) = fast_retry_node(None).await;
    let r = subscribed(&api, "orders", json!({"url": failing.url})).await;
    let secret = r.json["secret"].as_str().unwrap().to_owned();
    let created = r.json["created_at_ms"].clone();
    emit_kind(&api, "a", "order.paid", 1).await;
    let first = failing.wait_for(1).await;
    tokio::time::sleep(Duration::from_millis(5)).await;
    // Naming no secret keeps the one the receiver has (it used to make a
    // new one, shown once, and the receiver refused every delivery).
    let r = subscribe(&api, "orders", json!({"url": fixed.url})).await;
    assert_eq!(r.status, 200, "{}", r.json);
    assert_eq!(r.json["created_at_ms"], created, "{}", r.json);
    assert!(r.json.get("secret").is_none(), "{}", r.json);
    let got = fixed.wait_for(1).await;
    assert_eq!(got[0].id, first[0].id, "the same delivery, to the new URL");
    check_signature(&secret, &got[0]);
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
    assert_eq!(max, 2, "deliveries in flight to one host at most");
}

/// Emits `n` events of `kind` per message.
const BULK_JS: &str = r#"
import { events } from "marmot";
export default {
  onMessage({ n, kind }) {
    for (let i = 0; i < n; i++) events.emit(kind, { i });
    return n;
  },
};
"#;

/// One `urgent` event from `bulk/u` reaches `healthy` within `limit`.
async fn urgent_arrives_within(api: &Api, healthy: &Receiver, limit: Duration) {
    let r = api
        .post_json("/v1/actors/bulk/u", &json!({"n": 1, "kind": "urgent"}))
        .await;
    assert_eq!(r.status, 200, "{}", r.json);
    let started = Instant::now();
    healthy.wait_for(1).await;
    assert!(
        started.elapsed() < limit,
        "the healthy receiver waited {:?}",
        started.elapsed()
    );
}

/// A receiver that hangs holds up only its own deliveries: with more of
/// its rows due than one read of the outbox took (512), another
/// subscription's event waited behind all of them (minutes, or for ever
/// while the hanging one kept receiving); now rows of a destination at its
/// limit are stepped over, and a walk that reads its most goes on at once.
#[tokio::test]
async fn a_hanging_receiver_holds_up_only_its_own_deliveries() {
    let hanging = Receiver::start().await;
    hanging.state.delay_ms.store(20_000, Ordering::SeqCst);
    let healthy = Receiver::start().await;
    let (_dir, _m, api) = fast_retry_node(None).await;
    assert_eq!(api.deploy_js("bulk", BULK_JS).await.status, 201);
    subscribed(
        &api,
        "slow",
        json!({"url": hanging.url, "events": ["bulk"]}),
    )
    .await;
    subscribed(
        &api,
        "fine",
        json!({"url": healthy.url, "events": ["urgent"]}),
    )
    .await;
    // More rows than one walk reads (4,096): the walk goes on past them.
    for _ in 0..10 {
        let r = api
            .post_json("/v1/actors/bulk/b", &json!({"n": 450, "kind": "bulk"}))
            .await;
        assert_eq!(r.status, 200, "{}", r.json);
    }
    let deadline = Instant::now() + Duration::from_secs(10);
    while hanging.state.in_flight.load(Ordering::SeqCst) < 4 {
        assert!(
            Instant::now() < deadline,
            "the hanging receiver got nothing"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    urgent_arrives_within(&api, &healthy, Duration::from_secs(5)).await;
    assert_eq!(hanging.state.max_in_flight.load(Ordering::SeqCst), 4);
}

/// Receivers that fail get one attempt at a time each, and half the
/// slots together: two hanging subscriptions with rows due held all four
/// slots (of `concurrency = 4`) for their whole timeout, again and again,
/// and a healthy subscription's event waited behind every one of their
/// rows (16 hanging receivers did that with the default 64 slots: a probe).
#[tokio::test]
async fn failing_receivers_leave_slots_for_the_others() {
    let hanging = Receiver::start().await;
    hanging.state.delay_ms.store(20_000, Ordering::SeqCst);
    let healthy = Receiver::start().await;
    let config = "[webhooks]\nconcurrency = 4\nper_destination = 2\ntimeout_ms = 1000\n";
    let (_dir, _m, api) = fast_retry_node(Some(config)).await;
    assert_eq!(api.deploy_js("bulk", BULK_JS).await.status, 201);
    for name in ["slow1", "slow2"] {
        subscribed(&api, name, json!({"url": hanging.url, "events": ["bulk"]})).await;
    }
    subscribed(
        &api,
        "fine",
        json!({"url": healthy.url, "events": ["urgent"]}),
    )
    .await;
    // 60 rows each: 30 s of timeouts through every slot.
    let r = api
        .post_json("/v1/actors/bulk/b", &json!({"n": 60, "kind": "bulk"}))
        .await;
    assert_eq!(r.status, 200, "{}", r.json);
    // Both have failed (timed out) at least once.
    tokio::time::sleep(Duration::from_millis(2500)).await;
    urgent_arrives_within(&api, &healthy, Duration::from_secs(4)).await;
}

/// An event's data goes out as stored, at any depth: nested past 128
/// levels it was sent (and signed, for every retry) as `null` (a probe).
#[tokio::test]
async fn deeply_nested_event_data_is_delivered_as_stored() {
    let rx = Receiver::start().await;
    let (_dir, _m, api) = fast_retry_node(None).await;
    let deep = r#"
import { events } from "marmot";
export default { onMessage(body) { events.emit("deep", body); return 1; } };
"#;
    assert_eq!(api.deploy_js("deep", deep).await.status, 201);
    let secret = marmot::webhooks::new_secret();
    subscribed(
        &api,
        "all",
        json!({"url": rx.url, "events": ["deep"], "secret": secret}),
    )
    .await;
    let nested = format!("{}{}", "[".repeat(300), "]".repeat(300));
    let r = api
        .req(
            Method::POST,
            "/v1/actors/deep/a",
            Some(("application/json", nested.clone().into_bytes())),
            &[],
        )
        .await;
    assert_eq!(r.status, 200, "{}", r.json);
    let got = rx.wait_for(1).await;
    let body = String::from_utf8(got[0].body.clone()).unwrap();
    assert!(body.contains(&format!(r#""data":{nested}"#)), "{body}");
    check_signature(&secret, &got[0]);
}

/// The per-destination limit is per subscription: two subscriptions of
/// one host each get their own slots. (Per host alone, one subscription's
/// hanging rows took every slot, and the other's waited out all of their
/// timeouts: an hour with a thousand rows.)
#[tokio::test]
async fn subscriptions_sharing_a_host_have_slots_of_their_own() {
    let hanging = Receiver::start().await;
    hanging.state.delay_ms.store(20_000, Ordering::SeqCst);
    let (_dir, _m, api) = fast_retry_node(None).await;
    for (name, kind) in [("slow", "bulk"), ("other", "urgent")] {
        subscribed(
            &api,
            name,
            json!({"url": hanging.url, "types": ["kit"], "events": [kind]}),
        )
        .await;
    }
    for i in 0..12 {
        emit_kind(&api, "a", "bulk", i).await;
    }
    let wait_in_flight = |n: usize| {
        let hanging = &hanging;
        async move {
            let deadline = Instant::now() + Duration::from_secs(10);
            while hanging.state.in_flight.load(Ordering::SeqCst) < n {
                assert!(
                    Instant::now() < deadline,
                    "{} in flight, want {n}",
                    hanging.state.in_flight.load(Ordering::SeqCst)
                );
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
        }
    };
    wait_in_flight(4).await;
    emit_kind(&api, "b", "urgent", 1).await;
    wait_in_flight(5).await;
    tokio::time::sleep(Duration::from_millis(200)).await;
    assert_eq!(hanging.state.max_in_flight.load(Ordering::SeqCst), 5);
}

/// A receiver's `Retry-After` is a floor for the next attempt (it was
/// retried on the schedule alone: a second later, when it asked for two
/// minutes), and a redirect's error says it is not followed, and where it
/// pointed (it said "HTTP 301: ").
#[tokio::test]
async fn a_receivers_retry_after_and_redirects_are_heeded() {
    let rx = Receiver::start().await;
    rx.state.status.store(429, Ordering::SeqCst);
    let (_dir, _m, api) = fast_retry_node(None).await;
    subscribed(&api, "limited", json!({"url": rx.url})).await;
    emit_kind(&api, "a", "k", 1).await;
    rx.wait_for(1).await;
    let first = Instant::now();
    // The schedule alone (40 ms doubling) would have tried 4 times by now.
    tokio::time::sleep(Duration::from_millis(1200)).await;
    assert_eq!(rx.got().len(), 1, "retried before the 2 s it asked for");
    rx.state.status.store(0, Ordering::SeqCst);
    rx.wait_for(2).await;
    assert!(
        first.elapsed() >= Duration::from_millis(1900),
        "{:?}",
        first.elapsed()
    );

    let moved = Receiver::start().await;
    moved.state.status.store(301, Ordering::SeqCst);
    subscribed(&api, "moved", json!({"url": moved.url, "events": ["m"]})).await;
    emit_kind(&api, "b", "m", 1).await;
    moved.wait_for(1).await;
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let d = api
            .get("/v1/deliveries?status=failed&subscription=moved")
            .await
            .json;
        if let Some(e) = d["deliveries"][0]["last_error"].as_str() {
            assert!(e.contains("redirects are not followed"), "{e}");
            assert!(e.contains("Location: http://127.0.0.1:1/moved"), "{e}");
            break;
        }
        assert!(Instant::now() < deadline, "{d}");
        tokio::time::sleep(Duration::from_millis(25)).await;
    }
}

#[tokio::test]
async fn subscriptions_are_validated_and_never_show_their_secret() {
    let (_dir, _m, api) = kit_node(json!({})).await;
    for (spec, name) in [
        (json!({"url": "ftp://x/"}), "s"),
        (json!({"url": "http://x/", "events": []}), "s"),
        // An empty pattern names no kind (events have kinds); `*` is all.
        (json!({"url": "http://x/", "events": [""]}), "s"),
        (json!({"url": "http://x/", "events": ["a*b"]}), "s"),
        (json!({"url": "http://"}), "s"),
        (json!({"url": "http://x/", "secret": "hunter2"}), "s"),
        (json!({"url": "http://x/", "oops": 1}), "s"),
        (json!({"url": "http://x/", "events": vec!["a"; 257]}), "s"),
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
    let one = api.get("/v1/subscriptions/s").await;
    assert_eq!(one.status, 200);
    assert_eq!(one.json["url"], "https://example.com/h2");
    assert_eq!(one.json["events"], json!(["*"]));
    let all = api.get("/v1/subscriptions").await;
    assert_eq!(all.status, 200);
    let listed = all.json["subscriptions"].as_array().unwrap();
    assert_eq!(listed.len(), 1, "{}", all.json);
    assert_eq!(listed[0]["url"], "https://example.com/h2");
    for body in [&one.body, &all.body] {
        let text = String::from_utf8_lossy(body);
        assert!(!text.contains(&secret[6..]), "{text}");
        assert!(!text.contains("secret"), "{text}");
    }
    assert_eq!(api.get("/v1/subscriptions/none").await.status, 404);
    assert_eq!(api.delete("/v1/subscriptions/s").await.status, 200);
    assert_eq!(api.delete("/v1/subscriptions/s").await.status, 404);
    assert_eq!(api.get("/v1/deliveries?status=weird").await.status, 400);
}
