//! Webhooks in: verified before anything is stored, acknowledged once
//! durably queued, de-duplicated by delivery id, routed by payload field.
//! Webhooks out are in `tests/webhooks_out.rs`.

mod common;

use std::time::{Duration, Instant};

use common::{Api, COUNTER, Marmot, TESTKIT, kit_node, now_s, signed, tempdir};
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
    let r = api
        .post_signed("/v1/hooks/kit/t1/support", &secret, "msg_1", now_s(), body)
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
    let r = api
        .post_signed(
            "/v1/hooks/kit/t1/support",
            &secret,
            "msg_1",
            now_s() + 30,
            body,
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
        common::sample(&text, "marmot_webhooks_run_directly_total") == Some(1.0),
        "the idle actor ran it at once: {text}"
    );
}

/// A hook whose turn failed is not a duplicate: its sender was told 202
/// and saw nothing fail, so a redelivery (a provider's "resend") runs it
/// again, whether the actor is idle or busy; once one run succeeds, later
/// copies are duplicates. Each redelivery used to be dropped as a
/// duplicate of the failure, so the delivery was lost for good (a probe).
#[tokio::test]
async fn a_hook_whose_turn_failed_runs_again_when_redelivered() {
    let (_dir, _m, api, secret) = kit_with_secret(json!({})).await;
    let path = "/v1/hooks/kit/f1/support";
    let send = |body: &'static [u8]| {
        let (api, secret) = (api.clone(), secret.clone());
        async move { api.post_signed(path, &secret, "msg_f", now_s(), body).await }
    };
    for _ in 0..2 {
        let r = send(br#"{"fail": true}"#).await;
        assert_eq!(
            (r.status, &r.json["duplicate"]),
            (202, &json!(false)),
            "{}",
            r.json
        );
    }
    assert!(hooks(&api, "f1").await.is_empty());
    let failed = common::event_kinds(&api.get("/v1/actors/kit/f1/events").await.json);
    assert_eq!(failed, ["turn_failed", "turn_failed"]);

    // Redelivered while the actor is busy: queued, not dropped.
    let slow = {
        let (api, secret) = (api.clone(), secret.clone());
        tokio::spawn(async move {
            api.post_signed(path, &secret, "msg_busy", now_s(), br#"{"busy_ms": 600}"#)
                .await
        })
    };
    tokio::time::sleep(Duration::from_millis(150)).await;
    let r = send(br#"{"n": 1}"#).await;
    assert_eq!(
        (r.status, &r.json["duplicate"]),
        (202, &json!(false)),
        "{}",
        r.json
    );
    assert_eq!(slow.await.unwrap().status, 202);
    let h = wait_hooks(&api, "f1", 2).await;
    assert_eq!(h[1]["webhook_id"], "msg_f", "{h:?}");
    // It ran: the next copy is a duplicate, and runs nothing.
    let r = send(br#"{"n": 1}"#).await;
    assert_eq!(r.json["duplicate"], true, "{}", r.json);
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert_eq!(hooks(&api, "f1").await.len(), 2);
}

/// Copies of one delivery sent at once (a sender retrying early): one is
/// new, every other is a duplicate of it, all name its message id, and it
/// runs once. Each copy used to be answered as new, with an id of its own.
#[tokio::test]
async fn copies_of_one_delivery_sent_at_once_are_answered_as_one() {
    let (_dir, _m, api, secret) = kit_with_secret(json!({})).await;
    for round in 0..10 {
        let id = format!("msg_same_{round}");
        let copies = (0..20).map(|_| {
            let (api, secret, id) = (api.clone(), secret.clone(), id.clone());
            tokio::spawn(async move {
                let body = br#"{"event": "ticket.created"}"#;
                api.post_signed("/v1/hooks/kit/t2/support", &secret, &id, now_s(), body)
                    .await
            })
        });
        let mut fresh = 0;
        let mut ids = std::collections::BTreeSet::new();
        for c in copies.collect::<Vec<_>>() {
            let r = c.await.unwrap();
            assert_eq!(r.status, 202, "{}", r.json);
            if r.json["duplicate"] == false {
                fresh += 1;
            }
            ids.insert(r.json["message_id"].as_str().unwrap().to_owned());
        }
        assert_eq!((fresh, ids.len()), (1, 1), "round {round}: {ids:?}");
    }
    let h = wait_hooks(&api, "t2", 10).await;
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert_eq!(hooks(&api, "t2").await.len(), 10, "{h:?}");
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
        let r = api
            .post_signed("/v1/hooks/counter/alice/shop", &secret, &id, now_s(), body)
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
            404,
            "no_webhook_endpoint",
        ),
        (
            "unknown type (the same answer: anyone may post here)",
            "/v1/hooks/nope/a/h",
            body.to_vec(),
            good.clone(),
            404,
            "no_webhook_endpoint",
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
        let r = api.post_hook(path, &body, &headers).await;
        assert_eq!(r.status, status, "{what}: {}", r.json);
        assert_eq!(r.code(), code, "{what}: {}", r.json);
    }
    // Nothing was stored: the actor does not even exist.
    assert_eq!(api.get("/v1/actors/kit/a").await.status, 404);
    // A rejected delivery id is not burnt: the genuine one still goes in.
    let r = api.post_hook("/v1/hooks/kit/a/h", body, &good).await;
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
    let r = api
        .post_hook("/v1/hooks/kit/repo/github", body, &headers)
        .await;
    assert_eq!(r.status, 202, "{}", r.json);
    assert_eq!(r.json["delivery_id"], "d-1");
    let r = api
        .post_hook("/v1/hooks/kit/repo/github", body, &headers)
        .await;
    assert_eq!(r.json["duplicate"], true);
    // Only the body is signed: the same body under another delivery id is
    // a replay of the same delivery, not a new one.
    let mut replayed = headers.clone();
    replayed[1].1 = "d-forged".into();
    let r = api
        .post_hook("/v1/hooks/kit/repo/github", body, &replayed)
        .await;
    assert_eq!(r.status, 202, "{}", r.json);
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
    let r = api.post_hook("/v1/hooks/kit/repo/github", body, &bad).await;
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
        let r = api
            .post_signed(
                "/v1/hooks/kit/_/zendesk",
                &secret,
                &format!("msg_{n}"),
                now_s(),
                &body,
            )
            .await;
        assert_eq!(r.status, 202, "{}", r.json);
    }
    let h = wait_hooks(&api, "4521", 2).await;
    assert_eq!(h[0]["body"]["n"], 1);
    assert_eq!(h[1]["body"]["n"], 2);
    assert_eq!(wait_hooks(&api, "98", 1).await.len(), 1);
    let body = br#"{"other": 1}"#;
    let r = api
        .post_signed("/v1/hooks/kit/_/zendesk", &secret, "msg_9", now_s(), body)
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
    let r = api
        .post_signed("/v1/hooks/kit/slow/h", &secret, "msg_slow", now_s(), body)
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
        common::sample(&text, "marmot_webhooks_run_directly_total") == Some(0.0),
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
    let r = api
        .post_signed("/v1/hooks/kit/a/h", &secret, "msg_k", now_s(), body)
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
        common::sample(&text, "marmot_webhooks_run_directly_total") == Some(0.0),
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
    let r = api
        .post_signed("/v1/hooks/kit/a/h", &secret, "msg_k", now_s(), body)
        .await;
    assert_eq!(r.json["duplicate"], true);
}

/// What a hook's head shows is refused before its body is read: a sender
/// that declares a body and sends none gets its answer at once, where it
/// used to wait out the body deadline (600 such senders, unsigned,
/// trickling bytes, kept every other client out ~46 s: a probe). A signed
/// head still waits for its body, as it must.
#[tokio::test]
async fn a_hook_refused_by_its_head_is_answered_before_its_body() {
    use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};
    let (_dir, m, _api, _secret) = kit_with_secret(json!({})).await;
    let head = |path: &str, extra: &str| {
        format!(
            "POST {path} HTTP/1.1\r\nhost: marmot\r\ncontent-type: application/json\r\n\
             content-length: 100000\r\n{extra}\r\n"
        )
    };
    let stale = format!(
        "webhook-id: m1\r\nwebhook-timestamp: {}\r\nwebhook-signature: v1,AAAA\r\n",
        now_s() - 3600
    );
    let fresh = format!(
        "webhook-id: m1\r\nwebhook-timestamp: {}\r\nwebhook-signature: v1,AAAA\r\n",
        now_s()
    );
    for (path, extra, status) in [
        ("/v1/hooks/kit/a/push", String::new(), Some(401)),
        ("/v1/hooks/kit/a/push", stale, Some(401)),
        ("/v1/hooks/nosuch/a/push", fresh.clone(), Some(404)),
        ("/v1/hooks/kit/a/bad%20name", fresh.clone(), Some(400)),
        // Signed and fresh: it waits for the body it declared.
        ("/v1/hooks/kit/a/push", fresh, None),
    ] {
        let mut s = tokio::net::TcpStream::connect(("127.0.0.1", m.port))
            .await
            .unwrap();
        s.write_all(head(path, &extra).as_bytes()).await.unwrap();
        let mut buf = vec![0; 4096];
        let read = tokio::time::timeout(Duration::from_secs(2), s.read(&mut buf)).await;
        match (status, read) {
            (Some(want), Ok(Ok(n))) => {
                let text = String::from_utf8_lossy(&buf[..n]);
                assert!(
                    text.starts_with(&format!("HTTP/1.1 {want}")),
                    "{path} {extra:?}: {text}"
                );
            }
            (None, Err(_)) => {}
            (want, got) => panic!("{path} {extra:?}: wanted {want:?}, got {got:?}"),
        }
    }
}

/// Webhook bodies coming in slowly, which anyone may send, do not keep
/// clients with credentials out at the connection cap: the one sending
/// longest makes room. An admin's request waited for the webhooks'
/// deadlines, 20 s with 30 connections declaring 1 MiB (found by a probe).
#[tokio::test]
async fn slow_webhook_bodies_give_way_at_the_connection_cap() {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let dir = tempdir();
    let m = Marmot::start_opts(
        &dir.path().join("data"),
        &[],
        Some("[limits]\nmax_connections = 4\n"),
    )
    .await;
    let api = m.client();
    let secret = marmot::webhooks::new_secret();
    let r = api
        .deploy("kit", TESTKIT, json!({"webhook_secret": secret}))
        .await;
    assert_eq!(r.status, 201, "{}", r.json);
    drop(api);
    let mut slow = Vec::new();
    for i in 0..4 {
        let mut c = tokio::net::TcpStream::connect(("127.0.0.1", m.port))
            .await
            .unwrap();
        let head = format!(
            "POST /v1/hooks/kit/h{i}/gh HTTP/1.1\r\nhost: x\r\ncontent-type: application/json\r\n\
             webhook-id: w{i}\r\nwebhook-timestamp: {}\r\nwebhook-signature: v1,AAAA\r\n\
             content-length: 1000000\r\n\r\n{{",
            now_s()
        );
        c.write_all(head.as_bytes()).await.unwrap();
        slow.push(c);
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    tokio::time::sleep(Duration::from_millis(300)).await;
    let started = Instant::now();
    let mut c = tokio::net::TcpStream::connect(("127.0.0.1", m.port))
        .await
        .unwrap();
    c.write_all(b"GET /healthz HTTP/1.1\r\nhost: x\r\nconnection: close\r\n\r\n")
        .await
        .unwrap();
    let mut out = Vec::new();
    tokio::time::timeout(Duration::from_secs(10), c.read_to_end(&mut out))
        .await
        .expect("never served")
        .unwrap();
    let took = started.elapsed();
    let said = String::from_utf8_lossy(&out);
    assert!(said.starts_with("HTTP/1.1 200"), "{said}");
    assert!(took < Duration::from_millis(1_500), "waited {took:?}");
    // The one sending longest was closed, the others still send.
    let mut buf = [0u8; 64];
    let first = tokio::time::timeout(Duration::from_secs(2), slow[0].read(&mut buf)).await;
    assert!(matches!(first, Ok(Ok(0)) | Ok(Err(_))), "{first:?}");
    let second = tokio::time::timeout(Duration::from_millis(200), slow[1].read(&mut buf)).await;
    assert!(second.is_err(), "a younger one was closed too");
}
