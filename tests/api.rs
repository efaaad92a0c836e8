//! Every endpoint over real HTTP against a real `marmot` process, including
//! bad input: each bad request gets a 4xx JSON error naming the problem,
//! changes nothing, and the node keeps serving. The command line is in
//! `tests/cli.rs`.

mod common;
#[path = "api/openapi.rs"]
mod openapi;

use common::{Marmot, Resp, TESTKIT, tempdir};
use reqwest::Method;
use serde_json::{Value, json};

fn assert_error(r: &Resp, status: u16, code: &str) {
    assert_eq!(
        r.status,
        status,
        "expected {status} {code}, got {} {}",
        r.status,
        String::from_utf8_lossy(&r.body)
    );
    assert_eq!(r.code(), code, "body: {}", r.json);
    assert!(
        r.json["error"]["message"]
            .as_str()
            .is_some_and(|m| !m.is_empty()),
        "error without a message: {}",
        r.json
    );
    assert!(r.headers.contains_key("x-request-id"));
}

#[tokio::test]
async fn health_ready_metrics_and_request_ids() {
    let dir = tempdir();
    let m = Marmot::start(&dir.path().join("data")).await;
    let api = m.client();
    let r = api.get("/healthz").await;
    assert_eq!(r.status, 200);
    assert!(r.headers.contains_key("x-request-id"));
    assert_eq!(api.get("/readyz").await.json["status"], "ready");
    let r = api
        .req(
            Method::GET,
            "/healthz",
            None,
            &[("x-request-id", "abc-123")],
        )
        .await;
    assert_eq!(
        r.headers["x-request-id"], "abc-123",
        "a caller's request id is echoed"
    );
    let r = api.get("/metrics").await;
    assert_eq!(r.status, 200);
    // What prometheus-client writes, labelled as such.
    assert!(
        r.headers["content-type"]
            .to_str()
            .unwrap()
            .starts_with("application/openmetrics-text; version=1.0.0"),
        "{:?}",
        r.headers
    );
    let text = String::from_utf8(r.body).unwrap();
    assert!(text.ends_with("# EOF\n"), "{text}");
    for name in [
        "marmot_actors_active",
        "marmot_actors_hibernated",
        "marmot_commits_total",
        "marmot_turn_duration_seconds",
        "marmot_wake_duration_seconds",
        "marmot_commit_batch_size",
        // Counters by reason exist before their first increment.
        "marmot_sandbox_traps_total{reason=\"cpu\"} 0",
        "marmot_webhooks_received_total{outcome=\"rejected\"} 0",
        "marmot_turns_total{kind=\"alarm\",outcome=\"trap\"} 0",
    ] {
        assert!(text.contains(name), "metrics lack {name}:\n{text}");
    }
    // The process as the kernel sees it, read at the scrape.
    for (name, at_least) in [
        ("marmot_process_resident_memory_bytes", 4e6),
        ("marmot_process_anonymous_memory_bytes", 1e6),
        ("marmot_process_open_fds", 3.0),
    ] {
        let v = common::sample(&text, name);
        assert!(v.is_some_and(|v| v >= at_least), "{name}: {v:?}");
    }
    assert_error(&api.get("/nope").await, 404, "not_found");
    assert_error(
        &api.req(Method::PATCH, "/healthz", None, &[]).await,
        405,
        "method_not_allowed",
    );
}

/// A failed turn's log line carries the request id its client was
/// answered with, so an error reply (which names no message) leads to the
/// line that says why.
#[tokio::test]
async fn a_turns_log_lines_name_the_request_that_caused_it() {
    let dir = tempdir();
    let m = Marmot::start(&dir.path().join("data")).await;
    let api = m.client();
    assert_eq!(api.deploy("kit", TESTKIT, json!({})).await.status, 201);
    let body = serde_json::to_vec(&json!({"op": "set_then_trap", "key": "k", "value": 1})).unwrap();
    let r = api
        .req(
            Method::POST,
            "/v1/actors/kit/k",
            Some(("application/json", body)),
            &[("x-request-id", "req-trap-4242")],
        )
        .await;
    assert_eq!(r.status, 500, "{}", r.json);
    assert_eq!(r.headers["x-request-id"], "req-trap-4242");
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
    loop {
        let log = m.log_text();
        let line = log.lines().find(|l| l.contains("turn trapped"));
        if let Some(line) = line {
            assert!(line.contains("req-trap-4242"), "{line}");
            assert!(line.contains("actor_id=\"k\""), "{line}");
            break;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "no trap logged:\n{log}"
        );
        tokio::time::sleep(std::time::Duration::from_millis(50)).await;
    }
}

#[tokio::test]
async fn deploy_versions_and_type_inspection() {
    let dir = tempdir();
    let m = Marmot::start(&dir.path().join("data")).await;
    let api = m.client();
    // The test component deployed bare, without a manifest.
    let put_bare = || {
        api.req(
            Method::PUT,
            "/v1/types/kit",
            Some(("application/wasm", TESTKIT.to_vec())),
            &[],
        )
    };

    let r = put_bare().await;
    assert_eq!(r.status, 201, "{}", r.json);
    assert_eq!(r.json["type"], "kit");
    assert_eq!(r.json["version"], 1);
    assert_eq!(r.json["kind"], "wasm");
    assert_eq!(r.json["sha256"].as_str().unwrap().len(), 64);

    // Identical code and config: no new version.
    let r = put_bare().await;
    assert_eq!(r.status, 200);
    assert_eq!(r.json["version"], 1);
    assert_eq!(r.json["created"], false);

    // A manifest with config makes version 2; secrets are never shown back.
    let r = api
        .deploy(
            "kit",
            TESTKIT,
            json!({"idle_timeout_ms": 5000, "webhook_secret": "whsec_c2VjcmV0c2VjcmV0c2VjcmV0"}),
        )
        .await;
    assert_eq!(r.status, 201, "{}", r.json);
    assert_eq!(r.json["version"], 2);

    let t = api.get("/v1/types/kit").await;
    assert_eq!(t.status, 200);
    assert_eq!(t.json["version"], 2);
    assert_eq!(t.json["versions"].as_array().unwrap().len(), 2);
    assert_eq!(t.json["config"]["idle_timeout_ms"], 5000);
    assert_eq!(t.json["config"]["webhook_secret"], "<redacted>");
    assert!(
        !t.body.windows(6).any(|w| w == b"c2VjcmV0"),
        "secret leaked"
    );
    // The bare component again keeps the config (it dropped it: the type's
    // webhooks were then refused); only a manifest changes it.
    let r = put_bare().await;
    assert_eq!(
        (r.status, &r.json["version"]),
        (200, &json!(2)),
        "{}",
        r.json
    );
    let t = api.get("/v1/types/kit").await;
    assert_eq!(t.json["config"]["idle_timeout_ms"], 5000, "{}", t.json);
    assert_eq!(t.json["config"]["webhook_secret"], "<redacted>");

    let list = api.get("/v1/types").await;
    assert_eq!(list.json["types"][0]["type"], "kit");
    // It takes no parameters: one is refused, not ignored (`?limit=0`
    // listed everything).
    assert_error(&api.get("/v1/types?limit=0").await, 400, "invalid_query");
    assert_error(&api.get("/v1/types/nope").await, 404, "unknown_type");
    assert_error(
        &api.get("/v1/types/Bad%20Name").await,
        400,
        "invalid_type_name",
    );
}

#[tokio::test]
async fn bad_deploys_are_rejected_and_change_nothing() {
    let dir = tempdir();
    let m = Marmot::start(&dir.path().join("data")).await;
    let api = m.client();
    assert_eq!(api.deploy("kit", TESTKIT, json!({})).await.status, 201);
    let before = api.get("/v1/types/kit").await.json;

    let put = |ct: &'static str, body: Vec<u8>| {
        let api = api.clone();
        async move {
            api.req(Method::PUT, "/v1/types/kit", Some((ct, body)), &[])
                .await
        }
    };
    assert_error(
        &put("application/wasm", b"definitely not wasm".to_vec()).await,
        400,
        "invalid_code",
    );
    let core = put("application/wasm", b"\0asm\x01\0\0\0".to_vec()).await;
    assert_error(&core, 400, "invalid_code");
    assert!(
        core.json["error"]["message"]
            .as_str()
            .unwrap()
            .contains("core WebAssembly module")
    );
    let mut truncated = TESTKIT.to_vec();
    truncated.truncate(TESTKIT.len() / 2);
    assert_error(
        &put("application/wasm", truncated).await,
        400,
        "invalid_code",
    );
    // A valid but empty component exports nothing: wrong world.
    let empty = put("application/wasm", b"\0asm\x0d\0\x01\0".to_vec()).await;
    assert_error(&empty, 400, "invalid_code");
    assert!(
        empty.json["error"]["message"]
            .as_str()
            .unwrap()
            .contains("marmot:actor")
    );
    assert_error(
        &put("application/json", b"{not json".to_vec()).await,
        400,
        "invalid_manifest",
    );
    assert_error(
        &put(
            "application/json",
            br#"{"kind":"cobol","code":"x"}"#.to_vec(),
        )
        .await,
        400,
        "invalid_manifest",
    );
    assert_error(
        &put(
            "application/json",
            br#"{"kind":"wasm","code_base64":"!!"}"#.to_vec(),
        )
        .await,
        400,
        "invalid_manifest",
    );
    assert_error(
        &api.deploy("kit", TESTKIT, json!({"no_such_setting": 1}))
            .await,
        400,
        "invalid_manifest",
    );
    assert_error(
        &api.deploy("kit", TESTKIT, json!({"max_memory_bytes": 1u64 << 40}))
            .await,
        400,
        "invalid_config",
    );
    for too_long in [
        json!({"turn_timeout_ms": u64::MAX}),
        json!({"cpu_slice_ms": 86_400_001}),
        json!({"idle_timeout_ms": u64::MAX}),
    ] {
        let r = api.deploy("kit", TESTKIT, too_long.clone()).await;
        assert_error(&r, 400, "invalid_config");
        assert!(
            r.json["error"]["message"]
                .as_str()
                .unwrap()
                .contains("at most"),
            "{too_long}"
        );
    }
    // Code whose memory does not fit the type's limit cannot start: it is
    // refused here, not deployed to trap on every message.
    let small = api
        .deploy("kit", TESTKIT, json!({"max_memory_bytes": 1u64 << 20}))
        .await;
    assert_error(&small, 400, "invalid_code");
    let message = small.json["error"]["message"].as_str().unwrap();
    assert!(message.contains("bytes of memory to start"), "{message}");
    // A config is an object: serde alone would read `[60000]` as
    // `idle_timeout_ms` and `[null, null]` as nothing set.
    for config in [
        json!([60000]),
        json!([null, null]),
        json!(null),
        json!({"budget": [1]}),
    ] {
        let r = api.deploy("kit", TESTKIT, config.clone()).await;
        assert_error(&r, 400, "invalid_manifest");
        assert!(
            r.json["error"]["message"]
                .as_str()
                .unwrap()
                .contains("must be an object"),
            "{config}: {}",
            r.json
        );
    }
    assert_error(
        &put("text/plain", b"x".to_vec()).await,
        415,
        "unsupported_media_type",
    );
    assert_error(
        &api.req(
            Method::PUT,
            "/v1/types/Not-Valid",
            Some(("application/wasm", TESTKIT.to_vec())),
            &[],
        )
        .await,
        400,
        "invalid_type_name",
    );

    assert_eq!(
        api.get("/v1/types/kit").await.json,
        before,
        "a bad deploy changed the type"
    );
    assert_error(
        &api.get("/v1/types/Not-Valid").await,
        400,
        "invalid_type_name",
    );
    // The node still serves, and its log says what was refused (an
    // operator saw nothing of a failed deploy).
    assert_eq!(api.add("kit", "a", 1).await.status, 200);
    let log = m.log_text();
    assert!(
        log.lines()
            .any(|l| l.contains("deploy refused") && l.contains("at most")),
        "{log}"
    );
    assert!(
        log.lines()
            .any(|l| l.contains("deploy refused") && l.contains("invalid_manifest")),
        "{log}"
    );
}

#[tokio::test]
async fn messages_state_events_listing_and_delete() {
    let (_dir, _node, api) = common::kit_node(json!({})).await;

    let r = api
        .op("kit", "alice", json!({"op": "add", "key": "n", "by": 2}))
        .await;
    assert_eq!(r.status, 200);
    assert_eq!(r.json["value"], 2);
    assert!(r.headers.contains_key("x-marmot-message-id"));
    assert_eq!(api.add("kit", "alice", 3).await.json["value"], 5);
    let r = api
        .op(
            "kit",
            "alice",
            json!({"op": "emit", "kind": "hello", "data": {"x": 1}}),
        )
        .await;
    assert_eq!(r.json["seq"], 1);
    api.op(
        "kit",
        "alice",
        json!({"op": "emit", "kind": "again", "data": [1, 2]}),
    )
    .await;
    api.op(
        "kit",
        "alice",
        json!({"op": "set", "key": "bin/x", "value": "v"}),
    )
    .await;

    let info = api.get("/v1/actors/kit/alice").await;
    assert_eq!(info.status, 200);
    assert_eq!(info.json["status"], "active");
    assert_eq!(info.json["turns"], 5);
    // A turn that writes nothing counts too (only committed ones did).
    let r = api
        .op("kit", "alice", json!({"op": "get", "key": "n"}))
        .await;
    assert_eq!(r.status, 200, "{}", r.json);
    let again = api.get("/v1/actors/kit/alice").await.json;
    assert_eq!(again["turns"], 6, "{again}");
    assert!(again["last_turn_at_ms"].as_u64() >= info.json["last_turn_at_ms"].as_u64());
    assert_eq!(info.json["version"], 1);
    assert_eq!(info.json["last_event_seq"], 2);
    assert_eq!(info.json["state_keys"], 2);

    let state = api.get("/v1/actors/kit/alice/state").await;
    assert_eq!(
        state.json["entries"],
        json!([{"key": "bin/x", "value": "v"}, {"key": "n", "value": 5}])
    );
    let state = api.get("/v1/actors/kit/alice/state?prefix=bin/").await;
    assert_eq!(state.json["entries"].as_array().unwrap().len(), 1);
    let one = api.get("/v1/actors/kit/alice/state/n").await;
    assert_eq!(one.status, 200);
    assert_eq!(one.body, b"5");
    let nested = api.get("/v1/actors/kit/alice/state/bin/x").await;
    assert_eq!(nested.json, "v");
    assert_error(
        &api.get("/v1/actors/kit/alice/state/missing").await,
        404,
        "key_not_found",
    );

    let ev = api.get("/v1/actors/kit/alice/events").await;
    assert_eq!(ev.json["events"][0]["seq"], 1);
    assert_eq!(ev.json["events"][0]["kind"], "hello");
    assert_eq!(ev.json["events"][0]["data"], json!({"x": 1}));
    let ev = api.get("/v1/actors/kit/alice/events?after=1").await;
    assert_eq!(ev.json["events"].as_array().unwrap().len(), 1);
    assert_eq!(ev.json["events"][0]["kind"], "again");
    assert_eq!(ev.json["next_after"], 2);

    // Listing with prefix and cursor.
    for id in ["bob", "bobby", "carol"] {
        api.add("kit", id, 1).await;
    }
    let all = api.get("/v1/actors/kit?limit=2").await;
    let ids: Vec<&str> = all.json["actors"]
        .as_array()
        .unwrap()
        .iter()
        .map(|a| a["id"].as_str().unwrap())
        .collect();
    assert_eq!(ids, ["alice", "bob"]);
    let cursor = all.json["next_cursor"].as_str().unwrap().to_owned();
    let rest = api
        .get(&format!("/v1/actors/kit?limit=10&cursor={cursor}"))
        .await;
    let ids: Vec<&str> = rest.json["actors"]
        .as_array()
        .unwrap()
        .iter()
        .map(|a| a["id"].as_str().unwrap())
        .collect();
    assert_eq!(ids, ["bobby", "carol"]);
    assert!(rest.json["next_cursor"].is_null());
    let bobs = api.get("/v1/actors/kit?prefix=bob").await;
    assert_eq!(bobs.json["actors"].as_array().unwrap().len(), 2);

    // Delete removes state and events; the next message starts afresh.
    assert_eq!(api.delete("/v1/actors/kit/alice").await.status, 200);
    assert_error(
        &api.get("/v1/actors/kit/alice").await,
        404,
        "actor_not_found",
    );
    assert_error(
        &api.get("/v1/actors/kit/alice/state").await,
        404,
        "actor_not_found",
    );
    assert_error(
        &api.delete("/v1/actors/kit/alice").await,
        404,
        "actor_not_found",
    );
    assert_eq!(
        api.op("kit", "alice", json!({"op": "get", "key": "n"}))
            .await
            .json["value"],
        Value::Null
    );
    let info = api.get("/v1/actors/kit/alice").await;
    assert_eq!(info.json["last_event_seq"], 0);
    // Ids may hold any UTF-8 but control characters, up to 256 bytes.
    let odd = "ticket%2F42%20%C3%BC";
    assert_eq!(api.add("kit", odd, 1).await.status, 200);
    assert_eq!(
        api.get(&format!("/v1/actors/kit/{odd}")).await.json["id"],
        "ticket/42 ü"
    );
}

#[tokio::test]
async fn bad_messages_are_rejected_and_change_nothing() {
    let (_dir, _node, api) = common::kit_node(json!({})).await;
    api.add("kit", "a", 1).await;
    let before = api.get("/v1/actors/kit/a").await.json;

    assert_error(&api.op("nope", "a", json!({})).await, 404, "unknown_type");
    assert_error(
        &api.op("kit", "a%0Ab", json!({})).await,
        400,
        "invalid_actor_id",
    );
    // Percent-encoded bytes that are not UTF-8: an id no actor may have.
    assert_error(
        &api.op("kit", "a%FFb", json!({})).await,
        400,
        "invalid_actor_id",
    );
    assert_error(
        &api.op("k%FFt", "a", json!({})).await,
        400,
        "invalid_type_name",
    );
    let long = "x".repeat(257);
    assert_error(
        &api.op("kit", &long, json!({})).await,
        400,
        "invalid_actor_id",
    );
    let big = vec![b'1'; (1 << 20) + 1];
    assert_error(
        &api.req(
            Method::POST,
            "/v1/actors/kit/a",
            Some(("application/json", big)),
            &[],
        )
        .await,
        413,
        "payload_too_large",
    );
    let key = "k".repeat(300);
    assert_error(
        &api.post_with(
            "/v1/actors/kit/a",
            &json!({"op": "add", "key": "n", "by": 1}),
            &[("idempotency-key", &key)],
        )
        .await,
        400,
        "invalid_idempotency_key",
    );
    assert_error(
        &api.post_json("/v1/actors/kit/a?wait=maybe", &json!({}))
            .await,
        400,
        "invalid_query",
    );
    assert_error(
        &api.post_json("/v1/actors/kit/a?bogus=1", &json!({})).await,
        400,
        "invalid_query",
    );
    assert_error(
        &api.req(Method::PUT, "/v1/actors/kit/a", None, &[]).await,
        405,
        "method_not_allowed",
    );
    assert_error(
        &api.get("/v1/actors/kit/a/events?after=-1").await,
        400,
        "invalid_query",
    );
    assert_error(
        &api.get("/v1/actors/kit/ghost").await,
        404,
        "actor_not_found",
    );
    assert_error(&api.get("/v1/actors/nope").await, 404, "unknown_type");
    // The guest rejects malformed JSON itself: a failed turn, nothing stored.
    assert_error(
        &api.req(
            Method::POST,
            "/v1/actors/kit/a",
            Some(("application/json", b"{".to_vec())),
            &[],
        )
        .await,
        500,
        "actor_error",
    );

    let after = api.get("/v1/actors/kit/a").await.json;
    assert_eq!(
        before["turns"], after["turns"],
        "bad input changed the actor"
    );
    assert_eq!(
        api.get("/v1/actors/kit").await.json["actors"]
            .as_array()
            .unwrap()
            .len(),
        1
    );
    assert_eq!(api.add("kit", "a", 1).await.json["value"], 2);
}

/// A body refused by its head (declared too large, no credential) is
/// still read, up to a point, so that the client gets the answer: one
/// closed at once saw "broken pipe" while writing, not the 413 (a CI run).
#[tokio::test]
async fn a_body_refused_by_its_head_still_gets_its_answer() {
    let dir = tempdir();
    let m = Marmot::start_serve(&dir.path().join("data"), "an-admin-token-of-some-length").await;
    let api = m.client();
    assert_eq!(api.deploy("kit", TESTKIT, json!({})).await.status, 201);
    let anonymous = common::Api {
        bearer: None,
        ..api.clone()
    };
    let big = vec![b'1'; 4 << 20];
    for round in 0..20 {
        // Too large by its length; sent without a credential.
        for (client, status) in [(&api, 413), (&anonymous, 401)] {
            let body = Some(("application/json", big.clone()));
            let r = client
                .req(Method::POST, "/v1/actors/kit/a", body, &[])
                .await;
            assert_eq!(r.status, status, "round {round}: {}", r.json);
        }
        // Sent without a length: refused once past the limit.
        let chunks = big
            .chunks(64 << 10)
            .map(|c| Ok::<_, std::io::Error>(c.to_vec()))
            .collect::<Vec<_>>();
        let r = api
            .http
            .post(format!("{}/v1/actors/kit/a", api.url))
            .bearer_auth(api.bearer.as_deref().unwrap())
            .header("content-type", "application/json")
            .body(reqwest::Body::wrap_stream(futures::stream::iter(chunks)))
            .send()
            .await
            .unwrap_or_else(|e| panic!("round {round}: {e:?}"));
        assert_eq!(r.status(), 413, "round {round}");
    }
    assert_eq!(api.get("/v1/actors/kit/a").await.status, 404);
}

#[tokio::test]
async fn idempotency_keys_return_the_first_reply() {
    let (_dir, _node, api) = common::kit_node(json!({})).await;
    let add = json!({"op": "add", "key": "n", "by": 10});

    let first = api
        .post_with("/v1/actors/kit/a", &add, &[("idempotency-key", "k1")])
        .await;
    assert_eq!(first.json["value"], 10);
    assert!(!first.headers.contains_key("idempotent-replayed"));
    let again = api
        .post_with("/v1/actors/kit/a", &add, &[("idempotency-key", "k1")])
        .await;
    assert_eq!(again.status, 200);
    assert_eq!(again.json["value"], 10, "the stored reply comes back");
    assert_eq!(again.headers["idempotent-replayed"], "true");
    assert_eq!(
        again.headers["x-marmot-message-id"],
        first.headers["x-marmot-message-id"]
    );
    // The same key with another body is another request: refused, not
    // answered with the first reply, and nothing runs.
    let add_more = json!({"op": "add", "key": "n", "by": 99});
    let reused = api
        .post_with("/v1/actors/kit/a", &add_more, &[("idempotency-key", "k1")])
        .await;
    assert_error(&reused, 422, "idempotency_key_reused");
    let first_id = first.headers["x-marmot-message-id"].to_str().unwrap();
    assert!(
        reused.json["error"]["message"]
            .as_str()
            .unwrap()
            .contains(first_id),
        "the error names the message that took the key: {}",
        reused.json
    );
    // The same bytes as another media type reach the actor as another
    // value (an object, or a string): another request too.
    let as_text = api
        .req(
            Method::POST,
            "/v1/actors/kit/a",
            Some(("text/plain", serde_json::to_vec(&add).unwrap())),
            &[("idempotency-key", "k1")],
        )
        .await;
    assert_error(&as_text, 422, "idempotency_key_reused");
    // One key per request.
    let two = api
        .post_with(
            "/v1/actors/kit/a",
            &add,
            &[("idempotency-key", "k1"), ("idempotency-key", "k9")],
        )
        .await;
    assert_error(&two, 400, "invalid_idempotency_key");
    let other = api
        .post_with("/v1/actors/kit/a", &add, &[("idempotency-key", "k2")])
        .await;
    assert_eq!(other.json["value"], 20);

    // Durable messages: the same key enqueues once.
    let q1 = api
        .post_with(
            "/v1/actors/kit/b?wait=false",
            &add,
            &[("idempotency-key", "d1")],
        )
        .await;
    assert_eq!(q1.status, 202);
    let q2 = api
        .post_with(
            "/v1/actors/kit/b?wait=false",
            &add,
            &[("idempotency-key", "d1")],
        )
        .await;
    assert_eq!(q2.status, 202);
    assert_eq!(q1.json["message_id"], q2.json["message_id"]);
    for path in ["/v1/actors/kit/b?wait=false", "/v1/actors/kit/b"] {
        let reused = api
            .post_with(path, &add_more, &[("idempotency-key", "d1")])
            .await;
        assert_error(&reused, 422, "idempotency_key_reused");
    }
    api.wait_info("kit", "b", "the queued message to run", |i| {
        i["pending_messages"] == 0 && i["turns"] == 1
    })
    .await;
    // A waiting sender with the same key gets the durable turn's reply.
    let sync = api
        .post_with("/v1/actors/kit/b", &add, &[("idempotency-key", "d1")])
        .await;
    assert_eq!(sync.json["value"], 10);
    let reused = api
        .post_with("/v1/actors/kit/b", &add_more, &[("idempotency-key", "d1")])
        .await;
    assert_error(&reused, 422, "idempotency_key_reused");
    assert_eq!(
        api.op("kit", "b", json!({"op": "get", "key": "n"}))
            .await
            .json["value"],
        10
    );
}

/// A key expires after `limits.idempotency_ttl_ms` whether or not its
/// actor stayed awake: one still in the awake actor's memory was taken
/// as current (found by a probe: 422 for a new body, 8 s after a 5 s TTL).
#[tokio::test]
async fn an_idempotency_key_expires_while_its_actor_is_awake() {
    let dir = tempdir();
    let config = "[limits]\nidempotency_ttl_ms = 1000\n";
    let m = Marmot::start_opts(&dir.path().join("data"), &[], Some(config)).await;
    let api = m.client();
    assert_eq!(api.deploy("kit", TESTKIT, json!({})).await.status, 201);
    let add = |by: i64| json!({"op": "add", "key": "n", "by": by});
    let first = api
        .post_with("/v1/actors/kit/a", &add(1), &[("idempotency-key", "k")])
        .await;
    assert_eq!(first.json["value"], 1, "{}", first.json);
    tokio::time::sleep(std::time::Duration::from_millis(1_500)).await;
    // Awake still (its idle timeout is far), and the key has expired: a
    // new request.
    let later = api
        .post_with("/v1/actors/kit/a", &add(10), &[("idempotency-key", "k")])
        .await;
    assert_eq!(later.status, 200, "{}", later.json);
    assert_eq!(later.json["value"], 11, "{}", later.json);
    assert!(!later.headers.contains_key("idempotent-replayed"));
}

#[tokio::test]
async fn failed_turns_commit_nothing() {
    let (_dir, _node, api) = common::kit_node(json!({})).await;
    api.op(
        "kit",
        "a",
        json!({"op": "set", "key": "k", "value": "before"}),
    )
    .await;

    let trap = api
        .op(
            "kit",
            "a",
            json!({"op": "set_then_trap", "key": "k", "value": "after"}),
        )
        .await;
    assert_error(&trap, 500, "actor_trapped");
    let msg = trap.json["error"]["message"].as_str().unwrap();
    assert!(
        msg.contains("trapping after a write"),
        "the panic message is reported: {msg}"
    );
    let fail = api
        .op(
            "kit",
            "a",
            json!({"op": "set_then_fail", "key": "k", "value": "after"}),
        )
        .await;
    assert_error(&fail, 500, "actor_error");
    assert!(
        fail.json["error"]["message"]
            .as_str()
            .unwrap()
            .contains("failing after a write")
    );

    // Neither the write nor the event of the failed turns is visible, even
    // to the same actor's next turn (which runs on a fresh instance after the trap).
    assert_eq!(
        api.op("kit", "a", json!({"op": "get", "key": "k"}))
            .await
            .json["value"],
        "before"
    );
    assert_eq!(api.get("/v1/actors/kit/a/state/k").await.json, "before");
    assert_eq!(
        api.get("/v1/actors/kit/a/events").await.json["events"],
        json!([])
    );
    let info = api.get("/v1/actors/kit/a").await.json;
    // `turns` counts the turns that succeeded: the set and the read (read
    // and write-free turns were not counted; a probe). Failed turns do not
    // count: they commit nothing.
    assert_eq!(info["turns"], 2, "failed turns are not counted");

    // Statuses chosen by the actor pass through; a capability refusing a
    // call answers with a clear error instead of trapping.
    assert_eq!(
        api.op("kit", "a", json!({"op": "status", "status": 418}))
            .await
            .status,
        418
    );
    let un = api
        .op(
            "kit",
            "a",
            json!({"op": "chat", "request": {"provider": "none", "model": "m",
                   "messages": [{"role": "user", "content": "hi"}]}}),
        )
        .await;
    assert!(
        un.json["error"]
            .as_str()
            .unwrap()
            .starts_with("not found: no provider `none`"),
        "{}",
        un.json
    );
}

#[tokio::test]
async fn delete_type_needs_force_while_actors_exist() {
    let (_dir, _node, api) = common::kit_node(json!({})).await;
    api.add("kit", "a", 1).await;
    assert_error(&api.delete("/v1/types/kit").await, 409, "type_has_actors");
    assert_eq!(
        api.op("kit", "a", json!({"op": "get", "key": "n"}))
            .await
            .json["value"],
        1
    );
    let r = api.delete("/v1/types/kit?force=true").await;
    assert_eq!(r.status, 200, "{}", r.json);
    assert_eq!(r.json["actors_deleted"], 1);
    assert_error(&api.get("/v1/types/kit").await, 404, "unknown_type");
    assert_error(&api.op("kit", "a", json!({})).await, 404, "unknown_type");
    assert_error(&api.delete("/v1/types/kit").await, 404, "unknown_type");
    // Redeploying starts from nothing.
    api.deploy("kit", TESTKIT, json!({})).await;
    assert_eq!(
        api.op("kit", "a", json!({"op": "get", "key": "n"}))
            .await
            .json["value"],
        Value::Null
    );
    // An empty type deletes without force.
    api.deploy("empty", TESTKIT, json!({})).await;
    assert_eq!(api.delete("/v1/types/empty").await.status, 200);
    // A turn a forced delete cuts (after 5 s) is answered as the type's
    // messages are from then on: it was a 503 `storage_error` (found by a
    // probe).
    api.deploy("cut", TESTKIT, json!({})).await;
    let busy = {
        let api = api.clone();
        tokio::spawn(async move { api.op("cut", "b", json!({"op": "busy", "ms": 10000})).await })
    };
    tokio::time::sleep(std::time::Duration::from_millis(500)).await;
    assert_eq!(api.delete("/v1/types/cut?force=true").await.status, 200);
    let r = busy.await.unwrap();
    assert_error(&r, 404, "unknown_type");
    assert!(
        r.json["error"]["message"]
            .as_str()
            .unwrap()
            .contains("`cut`"),
        "{}",
        r.json
    );
}

/// A node alone has one place: moving an actor is refused (it exists or
/// not), and a region hint on a message changes nothing.
#[tokio::test]
async fn a_node_alone_moves_no_actor() {
    let (_dir, _node, api) = common::kit_node(json!({})).await;
    assert_eq!(api.add("kit", "a", 1).await.status, 200);
    let r = api
        .post_json(
            "/v1/actors/kit/a?region=eu",
            &json!({"op": "add", "key": "n", "by": 1}),
        )
        .await;
    assert_eq!(
        (r.status, r.json["value"].clone()),
        (200, json!(2)),
        "{}",
        r.json
    );
    assert_error(
        &api.req(Method::POST, "/v1/actors/kit/a/move?region=eu", None, &[])
            .await,
        409,
        "not_in_cluster",
    );
    assert_error(
        &api.req(Method::POST, "/v1/actors/kit/a/move", None, &[])
            .await,
        400,
        "invalid_query",
    );
    // The peers' catalog carries signing secrets; alone, no peer asks.
    assert_error(&api.get("/v1/cluster/catalog").await, 409, "not_in_cluster");
}

/// Guarantee 10, bounded output: a turn that writes a value, an event or
/// more state than the node's limits allow fails with an error naming the
/// limit, commits nothing, and the actor and node keep serving.
#[tokio::test]
async fn values_events_and_state_past_the_limits_are_refused_and_change_nothing() {
    let dir = tempdir();
    let config =
        "[limits]\nmax_value_bytes = 1000\nmax_event_bytes = 600\nmax_state_bytes = 4000\n";
    let m = Marmot::start_opts(&dir.path().join("data"), &[], Some(config)).await;
    let api = m.client();
    assert_eq!(api.deploy("kit", TESTKIT, json!({})).await.status, 201);
    let refused = |r: &Resp, what: &str| {
        assert_error(r, 500, "actor_error");
        let message = r.json["error"]["message"].as_str().unwrap();
        assert!(
            message.starts_with("limit exceeded") && message.contains(what),
            "{message}"
        );
    };
    let r = api
        .op("kit", "a", json!({"op": "big", "key": "v", "bytes": 1001}))
        .await;
    refused(&r, "limit of 1000 bytes");
    let r = api
        .op(
            "kit",
            "a",
            json!({"op": "emit", "kind": "k", "data": "x".repeat(700)}),
        )
        .await;
    refused(&r, "limit of 600 bytes");
    // Values within the limit each, until the actor's state would pass it.
    for i in 0..4 {
        let r = api
            .op(
                "kit",
                "a",
                json!({"op": "big", "key": format!("s{i}"), "bytes": 900}),
            )
            .await;
        assert_eq!(r.status, 200, "{}", r.json);
    }
    let r = api
        .op("kit", "a", json!({"op": "big", "key": "s4", "bytes": 900}))
        .await;
    refused(&r, "over the limit of 4000 bytes");

    let r = api
        .op("kit", "a", json!({"op": "list", "prefix": ""}))
        .await;
    assert_eq!(
        r.json["keys"],
        json!(["s0", "s1", "s2", "s3"]),
        "{}",
        r.json
    );
    let events = api.get("/v1/actors/kit/a/events").await.json;
    assert_eq!(events["events"], json!([]), "{events}");
    // Smaller writes still go through (a replaced value frees its room).
    let r = api
        .op("kit", "a", json!({"op": "big", "key": "s3", "bytes": 10}))
        .await;
    assert_eq!(r.status, 200, "{}", r.json);
    let r = api
        .op("kit", "a", json!({"op": "big", "key": "s4", "bytes": 10}))
        .await;
    assert_eq!(r.status, 200, "{}", r.json);
    assert_eq!(api.add("kit", "b", 1).await.json["value"], 1);
}

/// `?limit=0` is refused on every listing (a page of nothing is a
/// mistake), a larger ask than a page holds gets a full page, and ids in
/// the path or query that only look like delivery ids are a 404 or 400,
/// never a dropped connection.
#[tokio::test]
async fn page_sizes_and_cursors_are_checked() {
    let (_dir, _node, api) = common::kit_node(json!({})).await;
    for i in 0..3 {
        assert_eq!(api.add("kit", &format!("a{i}"), 1).await.status, 200);
    }
    for listing in [
        "/v1/actors/kit",
        "/v1/actors/kit/a0/state",
        "/v1/actors/kit/a0/events",
        "/v1/actors/kit/a0/files",
        "/v1/deliveries",
    ] {
        assert_error(
            &api.get(&format!("{listing}?limit=0")).await,
            400,
            "invalid_limit",
        );
        let r = api.get(&format!("{listing}?limit=1000000")).await;
        assert_eq!(r.status, 200, "{listing}: {}", r.json);
        // In the API's words, naming the parameter (it was "Failed to
        // deserialize query string: limit: invalid digit found in string").
        for (query, says) in [
            ("limit=-1", "query parameter `limit` must be a whole number"),
            (
                "limit=1.5",
                "query parameter `limit` must be a whole number",
            ),
            ("limit=", "query parameter `limit` must be a whole number"),
            (
                "limit=99999999999999999999",
                "query parameter `limit` is too large",
            ),
            ("colour=red", "unknown query parameter `colour`; expected"),
        ] {
            let r = api.get(&format!("{listing}?{query}")).await;
            assert_error(&r, 400, "invalid_query");
            let message = r.json["error"]["message"].as_str().unwrap();
            assert!(message.starts_with(says), "{listing}?{query}: {message}");
        }
    }
    let page = api.get("/v1/actors/kit?limit=2").await.json;
    assert_eq!(page["actors"].as_array().unwrap().len(), 2);
    let all = api.get("/v1/actors/kit?limit=1000000").await.json;
    assert_eq!(all["actors"].as_array().unwrap().len(), 3);

    // 32 bytes after `msg_`, with a two-byte character across byte 16.
    let tricky = format!("msg_{}%C3%A9{}", "a".repeat(15), "a".repeat(15));
    assert_error(
        &api.post_json(&format!("/v1/deliveries/{tricky}/retry"), &json!({}))
            .await,
        404,
        "delivery_not_found",
    );
    assert_error(
        &api.get(&format!("/v1/deliveries?after={tricky}")).await,
        400,
        "invalid_cursor",
    );
    assert_eq!(api.get("/readyz").await.status, 200);
}

/// Every JSON request body is an object. Serde alone also reads a struct
/// from an array of its fields in order, so each of these arrays was
/// taken (a secret, a provider, a token…); now each is a 400 that says
/// what the body is, and nothing is stored.
#[tokio::test]
async fn json_bodies_must_be_objects() {
    let (dir, _node, api) = common::kit_node(json!({})).await;
    let backup_to = dir.path().join("backup-from-an-array");
    let cases = [
        (
            Method::PUT,
            "/v1/secrets/k",
            json!(["v", ["api.example.com"]]),
            "invalid_secret",
        ),
        (
            Method::PUT,
            "/v1/providers/p",
            json!(["openai-chat", "http://127.0.0.1:9/v1"]),
            "invalid_provider",
        ),
        (
            Method::PUT,
            "/v1/subscriptions/s",
            json!(["http://127.0.0.1:9/hook"]),
            "invalid_subscription",
        ),
        (
            Method::POST,
            "/v1/tokens",
            json!(["kit", "a", null, ["send"], 60]),
            "invalid_token_request",
        ),
        (
            Method::PUT,
            "/v1/types/t2",
            json!(["js", "export default {}"]),
            "invalid_manifest",
        ),
        (
            Method::POST,
            "/v1/actors/kit/a/eval",
            json!(["1 + 1"]),
            "invalid_body",
        ),
        (
            Method::POST,
            "/v1/backup",
            json!([backup_to]),
            "invalid_backup",
        ),
    ];
    for (method, path, body, code) in cases {
        let r = api
            .req(
                method,
                path,
                Some(("application/json", serde_json::to_vec(&body).unwrap())),
                &[],
            )
            .await;
        assert_error(&r, 400, code);
        assert!(
            r.json["error"]["message"]
                .as_str()
                .unwrap()
                .contains("must be a JSON object, not an array"),
            "{path}: {}",
            r.json
        );
    }
    assert_eq!(api.get("/v1/secrets").await.json["secrets"], json!([]));
    assert_eq!(
        api.get("/v1/subscriptions").await.json["subscriptions"],
        json!([])
    );
    let providers = api.get("/v1/providers").await.json;
    assert!(
        !providers["providers"]
            .as_array()
            .unwrap()
            .iter()
            .any(|p| p["name"] == "p"),
        "{providers}"
    );
    assert_eq!(api.get("/v1/types/t2").await.status, 404);
    assert!(!backup_to.exists());
}

/// JSON has one kind of number: a whole number written as a float
/// (`3600.0`, `6e1`, as Python's `json.dumps` writes a float) is the
/// integer a field asks for, as JSON Schema's `integer` says; a fraction is
/// still refused, with serde's error naming where.
#[tokio::test]
async fn whole_numbers_written_as_floats_are_integers() {
    let (_dir, _node, api) = common::kit_node(json!({})).await;
    let token = |ttl: serde_json::Value| {
        let api = &api;
        async move {
            api.post_json(
                "/v1/tokens",
                &json!({"type": "kit", "id": "a", "scopes": ["send"], "ttl_s": ttl}),
            )
            .await
        }
    };
    let now_ms = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_millis() as i64;
    for (ttl, secs) in [(json!(3600.0), 3600), (json!(6e1), 60)] {
        let r = token(ttl.clone()).await;
        assert_eq!(r.status, 201, "{ttl}: {}", r.json);
        let expires = r.json["expires_at_ms"].as_i64().unwrap();
        assert!(
            (expires - now_ms - secs * 1000).abs() < 60_000,
            "{ttl}: {}",
            r.json
        );
    }
    let r = token(json!(3600.5)).await;
    assert_error(&r, 400, "invalid_token_request");
    let message = r.json["error"]["message"].as_str().unwrap();
    assert!(
        message.contains("floating point `3600.5`") && message.contains("column"),
        "{message}"
    );
    // Deep in a type's config too.
    let r = api
        .deploy_manifest(
            "floaty",
            &json!({"kind": "js", "code": "export default { onMessage() { return 1; } };",
                    "config": {"idle_timeout_ms": 5000.0}}),
        )
        .await;
    assert_eq!(r.status, 201, "{}", r.json);
}

/// A value that does not fit its field is named by its path in the body,
/// so a long manifest's error says where to look; where serde's text could
/// quote a secret, the field and its place are named instead of the value.
#[tokio::test]
async fn a_value_of_the_wrong_type_names_its_field() {
    let (_dir, _node, api) = common::kit_node(json!({})).await;
    let r = api
        .deploy_manifest(
            "named",
            &json!({"kind": "js", "code": "export default { onMessage() { return 1; } };",
                    "config": {"allowed_hosts": ["a.example.com", 7]}}),
        )
        .await;
    assert_error(&r, 400, "invalid_manifest");
    let message = r.json["error"]["message"].as_str().unwrap();
    assert!(message.contains("`config.allowed_hosts[1]`"), "{message}");
    assert_eq!(api.get("/v1/types/named").await.status, 404);

    let r = api
        .put_json(
            "/v1/secrets/S",
            &json!({"value": "hunter2-value", "hosts": "hunter2-host"}),
        )
        .await;
    assert_error(&r, 400, "invalid_secret");
    let message = r.json["error"]["message"].as_str().unwrap();
    assert!(message.contains("`hosts` (line 1"), "{message}");
    assert!(!message.contains("hunter2"), "{message}");

    let r = api
        .put_json(
            "/v1/providers/p",
            &json!({"format": "openai-chat", "base_url": 5}),
        )
        .await;
    assert_error(&r, 400, "invalid_provider");
    let message = r.json["error"]["message"].as_str().unwrap();
    assert!(message.contains("`base_url` (line 1"), "{message}");

    // A missing or unknown field at the top is named by serde itself.
    let r = api
        .post_json(
            "/v1/tokens",
            &json!({"type": "kit", "id": "a", "scopes": ["send"]}),
        )
        .await;
    assert_error(&r, 400, "invalid_token_request");
    let message = r.json["error"]["message"].as_str().unwrap();
    assert!(message.starts_with("missing field `ttl_s`"), "{message}");
}

/// The examples a new user copies answer a body they cannot read with a
/// 400 that says what they expected, not a failed turn (500), and write
/// nothing.
#[tokio::test]
async fn the_examples_refuse_bodies_they_cannot_read() {
    let dir = tempdir();
    let m = Marmot::start(&dir.path().join("data")).await;
    let api = m.client();
    assert_eq!(
        api.deploy("counter", common::COUNTER, json!({}))
            .await
            .status,
        201
    );
    assert_eq!(
        api.deploy("notes", common::NOTES, json!({})).await.status,
        201
    );
    for (path, body, expected) in [
        (
            "/v1/actors/counter/a",
            json!(null),
            "expected {\"by\": integer}",
        ),
        (
            "/v1/actors/counter/a",
            json!({"by": "two"}),
            "expected {\"by\": integer}",
        ),
        (
            "/v1/actors/notes/a",
            json!({"op": "shout"}),
            "not a notes operation",
        ),
        ("/v1/actors/notes/a", json!([1]), "not a notes operation"),
    ] {
        let r = api.post_json(path, &body).await;
        assert_eq!(r.status, 400, "{path} {body}: {}", r.json);
        assert!(
            r.json["error"]
                .as_str()
                .is_some_and(|e| e.starts_with(expected)),
            "{path} {body}: {}",
            r.json
        );
    }
    for path in ["/v1/actors/counter/a/state", "/v1/actors/notes/a/state"] {
        assert_eq!(api.get(path).await.json["entries"], json!([]), "{path}");
    }
    assert_eq!(
        api.post_json("/v1/actors/counter/a", &json!({"by": 2}))
            .await
            .json,
        json!({"n": 2})
    );
    // A count past i64 is refused and changes nothing (a release build
    // wrapped it around to the most negative count).
    let r = api
        .post_json("/v1/actors/counter/a", &json!({"by": i64::MAX}))
        .await;
    assert_eq!(r.status, 400, "{}", r.json);
    assert!(
        r.json["error"].as_str().unwrap().contains("64-bit"),
        "{}",
        r.json
    );
    assert_eq!(
        api.post_json("/v1/actors/counter/a", &json!({"by": 0}))
            .await
            .json,
        json!({"n": 2})
    );
}

/// A reply status HTTP cannot carry as an answer (1xx, or past 599) fails
/// the turn, so nothing it did is committed: a 101 broke the connection
/// after the turn had committed, and a client that retried repeated it.
#[tokio::test]
async fn a_reply_status_outside_200_to_599_fails_the_turn() {
    let (_dir, _node, api) = common::kit_node(json!({})).await;
    for status in [99, 100, 101, 103, 600, 999, 1000] {
        let r = api
            .op(
                "kit",
                "a",
                json!({"op": "status", "status": status, "key": "effect"}),
            )
            .await;
        assert_eq!(r.status, 500, "{status}: {}", r.json);
        let message = r.json["error"]["message"].as_str().unwrap_or_default();
        assert!(
            message.contains(&format!("status {status} is not one")),
            "{status}: {}",
            r.json
        );
        let v = api
            .op("kit", "a", json!({"op": "get", "key": "effect"}))
            .await;
        assert_eq!(v.json["value"], Value::Null, "{status} committed its turn");
    }
    for status in [200, 299, 404, 599] {
        let r = api
            .op("kit", "b", json!({"op": "status", "status": status}))
            .await;
        assert_eq!(r.status, status, "{}", r.json);
        assert_eq!(r.json["status"], status);
    }
}
