//! Activation and hibernation, ordering, upgrades, and the limits that keep
//! one actor from hurting the node (guarantees 1, 5, 10).

mod common;

use std::time::{Duration, Instant};

use common::{COUNTER, Marmot, SPINNING_ORIGIN, TESTKIT, tempdir};
use serde_json::json;

#[tokio::test]
async fn idle_actors_hibernate_and_wake_with_state_intact() {
    let dir = tempdir();
    let m = Marmot::start(&dir.path().join("data")).await;
    let api = m.client();
    api.deploy("kit", TESTKIT, json!({"idle_timeout_ms": 300}))
        .await;
    api.add("kit", "sleepy", 7).await;
    assert_eq!(
        api.get("/v1/actors/kit/sleepy").await.json["status"],
        "active"
    );
    let started = Instant::now();
    api.wait_info("kit", "sleepy", "hibernation", |i| {
        i["status"] == "hibernated"
    })
    .await;
    assert!(
        started.elapsed() >= Duration::from_millis(200),
        "hibernated before its idle timeout"
    );
    let metrics = String::from_utf8(api.get("/metrics").await.body).unwrap();
    assert!(
        metrics
            .lines()
            .any(|l| l.starts_with("marmot_hibernations_total ") && !l.ends_with(" 0"))
    );
    assert!(
        common::sample(&metrics, "marmot_actors_active") == Some(0.0),
        "{metrics}"
    );

    // Deleting a hibernated actor wakes it only to delete it: it does not
    // stay counted active until its idle timeout, nor count a hibernation.
    api.add("kit", "doomed", 1).await;
    api.wait_info("kit", "doomed", "hibernation", |i| {
        i["status"] == "hibernated"
    })
    .await;
    let gauges = || async {
        let m = String::from_utf8(api.get("/metrics").await.body).unwrap();
        (
            common::metric(&m, "marmot_actors_active"),
            common::metric(&m, "marmot_actors_hibernated"),
            common::metric(&m, "marmot_hibernations_total"),
        )
    };
    let (_, hibernated, hibernations) = gauges().await;
    assert_eq!(api.delete("/v1/actors/kit/doomed").await.status, 200);
    let deadline = Instant::now() + Duration::from_secs(5);
    loop {
        let now = gauges().await;
        if now == (0.0, hibernated - 1.0, hibernations) {
            break;
        }
        assert!(Instant::now() < deadline, "gauges after a delete: {now:?}");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }

    // The next message wakes it from disk.
    let r = api
        .op("kit", "sleepy", json!({"op": "add", "key": "n", "by": 1}))
        .await;
    assert_eq!(r.json["value"], 8);
    assert_eq!(
        api.get("/v1/actors/kit/sleepy").await.json["status"],
        "active"
    );

    // A busy actor does not hibernate: a turn longer than the idle timeout.
    // Its idle time starts when the turn ends, so it sleeps a whole idle
    // timeout later, not at once.
    let r = api
        .op("kit", "busy", json!({"op": "busy", "ms": 700}))
        .await;
    assert_eq!(r.status, 200);
    let replied = Instant::now();
    assert_eq!(
        api.get("/v1/actors/kit/busy").await.json["status"],
        "active"
    );
    api.wait_info("kit", "busy", "hibernation", |i| {
        i["status"] == "hibernated"
    })
    .await;
    assert!(
        replied.elapsed() >= Duration::from_millis(200),
        "hibernated {:?} after a turn longer than its idle timeout",
        replied.elapsed()
    );
}

#[tokio::test]
async fn least_recently_used_actors_hibernate_at_the_cap() {
    let dir = tempdir();
    let config = "[limits]\nmax_active_actors = 20\n";
    let m = Marmot::start_opts(&dir.path().join("data"), &[], Some(config)).await;
    let api = m.client();
    api.deploy("kit", TESTKIT, json!({})).await;
    for i in 0..60 {
        let r = api
            .op(
                "kit",
                &format!("u{i:02}"),
                json!({"op": "add", "key": "n", "by": i}),
            )
            .await;
        assert_eq!(r.status, 200);
    }
    // Eviction is asynchronous; give it a moment.
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let metrics = String::from_utf8(api.get("/metrics").await.body).unwrap();
        let active: f64 = metrics
            .lines()
            .find(|l| l.starts_with("marmot_actors_active "))
            .and_then(|l| l.split_whitespace().nth(1))
            .unwrap()
            .parse()
            .unwrap();
        if active <= 20.0 {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "still {active} active actors over a cap of 20"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    // The oldest went to sleep first; the newest are awake.
    assert_eq!(
        api.get("/v1/actors/kit/u00").await.json["status"],
        "hibernated"
    );
    assert_eq!(api.get("/v1/actors/kit/u59").await.json["status"], "active");
    for i in 0..60 {
        let r = api
            .op("kit", &format!("u{i:02}"), json!({"op": "get", "key": "n"}))
            .await;
        assert_eq!(r.json["value"], i, "state survives eviction");
    }
}

#[tokio::test]
async fn turns_of_one_actor_never_overlap_and_keep_arrival_order() {
    let (_dir, _node, api) = common::kit_node(json!({})).await;
    // Concurrent read-modify-writes: overlapping turns would lose updates.
    let replies = futures::future::join_all((0..200).map(|_| api.add("kit", "hot", 1))).await;
    assert!(replies.iter().all(|r| r.status == 200));
    let mut values: Vec<i64> = replies
        .iter()
        .map(|r| r.json["value"].as_i64().unwrap())
        .collect();
    values.sort_unstable();
    assert_eq!(
        values,
        (1..=200).collect::<Vec<_>>(),
        "every turn saw the previous one's write"
    );
    // Messages from one sender run in the order they were accepted.
    for i in 0..30 {
        let r = api
            .post_json(
                "/v1/actors/kit/ordered?wait=false",
                &json!({"op": "append", "key": "l", "value": i}),
            )
            .await;
        assert_eq!(r.status, 202);
    }
    api.op(
        "kit",
        "ordered",
        json!({"op": "append", "key": "l", "value": 30}),
    )
    .await;
    let l = api
        .op("kit", "ordered", json!({"op": "get", "key": "l"}))
        .await
        .json["value"]
        .clone();
    assert_eq!(l, json!((0..=30).collect::<Vec<_>>()));
}

#[tokio::test]
async fn new_versions_apply_at_the_next_turn_and_on_upgrade_runs_once() {
    let dir = tempdir();
    let m = Marmot::start(&dir.path().join("data")).await;
    let api = m.client();
    assert_eq!(
        api.deploy("up", COUNTER, json!({"idle_timeout_ms": 300}))
            .await
            .json["version"],
        1
    );
    api.post_json("/v1/actors/up/a", &json!({"by": 5})).await;
    api.post_json("/v1/actors/up/b", &json!({"by": 6})).await;
    api.wait_info("up", "b", "hibernation", |i| i["status"] == "hibernated")
        .await;
    let r = api.post_json("/v1/actors/up/a", &json!({"by": 1})).await;
    assert_eq!(r.json["n"], 6);

    assert_eq!(
        api.deploy("up", TESTKIT, json!({"idle_timeout_ms": 300}))
            .await
            .json["version"],
        2
    );
    let who = api.op("up", "a", json!({"op": "whoami"})).await;
    assert_eq!(who.json["version"], 2);
    assert_eq!(who.json["upgraded_from"], json!([1]));
    assert_eq!(
        api.op("up", "a", json!({"op": "get", "key": "n"}))
            .await
            .json["value"],
        6,
        "state carried over"
    );
    assert_eq!(
        api.op("up", "a", json!({"op": "whoami"})).await.json["upgraded_from"],
        json!([1]),
        "once"
    );
    // A hibernated actor upgrades when it wakes.
    let who = api.op("up", "b", json!({"op": "whoami"})).await;
    assert_eq!(who.json["upgraded_from"], json!([1]));
    assert_eq!(api.get("/v1/actors/up/b").await.json["version"], 2);

    assert_eq!(
        api.deploy("up", TESTKIT, json!({"idle_timeout_ms": 301}))
            .await
            .json["version"],
        3
    );
    assert_eq!(
        api.op("up", "a", json!({"op": "whoami"})).await.json["upgraded_from"],
        json!([1, 2])
    );
    // A brand-new actor starts on the newest version with nothing to migrate.
    let who = api.op("up", "fresh", json!({"op": "whoami"})).await;
    assert_eq!(who.json["version"], 3);
    assert!(who.json["upgraded_from"].is_null());
}

#[tokio::test]
async fn cpu_memory_and_wall_limits_stop_only_the_offender() {
    let dir = tempdir();
    let m = Marmot::start(&dir.path().join("data")).await;
    let api = m.client();
    api.deploy(
        "kit",
        TESTKIT,
        json!({"cpu_slice_ms": 300, "max_memory_bytes": 16u64 << 20}),
    )
    .await;
    api.deploy("slow", TESTKIT, json!({"turn_timeout_ms": 300}))
        .await;
    api.op(
        "kit",
        "neighbour",
        json!({"op": "add", "key": "n", "by": 1}),
    )
    .await;

    let spin = {
        let api = api.clone();
        tokio::spawn(async move {
            let started = Instant::now();
            let r = api.op("kit", "spinner", json!({"op": "spin"})).await;
            (r, started.elapsed())
        })
    };
    // While one actor spins, another still gets its turns promptly.
    tokio::time::sleep(Duration::from_millis(50)).await;
    let started = Instant::now();
    let r = api
        .op(
            "kit",
            "neighbour",
            json!({"op": "add", "key": "n", "by": 1}),
        )
        .await;
    assert_eq!(r.json["value"], 2);
    assert!(
        started.elapsed() < Duration::from_millis(250),
        "neighbour waited {:?}",
        started.elapsed()
    );
    let (r, took) = spin.await.unwrap();
    assert_eq!(r.status, 500);
    assert_eq!(r.code(), "cpu_limit_exceeded", "{}", r.json);
    assert!(took < Duration::from_secs(3), "spin ran {took:?}");
    assert!(
        r.json["error"]["message"]
            .as_str()
            .unwrap()
            .contains("CPU limit")
    );
    // The spinner gets a fresh instance next time.
    assert_eq!(api.add("kit", "spinner", 1).await.json["value"], 1);

    let r = api.op("kit", "hog", json!({"op": "alloc", "mb": 64})).await;
    assert_eq!(r.status, 500);
    assert_eq!(r.code(), "memory_limit_exceeded", "{}", r.json);
    // With the limit, not only what was asked (which read as the limit).
    let message = r.json["error"]["message"].as_str().unwrap();
    assert!(
        message.contains("passes the limit of") && message.contains("config.max_memory_bytes"),
        "{message}"
    );
    assert_eq!(
        api.op("kit", "hog", json!({"op": "alloc", "mb": 4}))
            .await
            .status,
        200
    );

    let r = api.op("slow", "s", json!({"op": "busy", "ms": 3000})).await;
    assert_eq!(r.status, 504);
    assert_eq!(r.code(), "turn_timeout");
    assert_eq!(
        api.op("slow", "s", json!({"op": "add", "key": "n", "by": 1}))
            .await
            .status,
        200
    );

    let metrics = String::from_utf8(api.get("/metrics").await.body).unwrap();
    for reason in ["cpu", "memory", "timeout"] {
        assert!(
            metrics.contains(&format!(
                "marmot_sandbox_traps_total{{reason=\"{reason}\"}} 1"
            )),
            "trap reason {reason} not counted:\n{metrics}"
        );
    }
}

#[tokio::test]
async fn a_full_mailbox_answers_429_and_the_node_keeps_serving() {
    let dir = tempdir();
    let config = "[limits]\nmailbox_capacity = 4\n";
    let m = Marmot::start_opts(&dir.path().join("data"), &[], Some(config)).await;
    let api = m.client();
    api.deploy("kit", TESTKIT, json!({})).await;
    let replies = futures::future::join_all(
        (0..20).map(|_| api.op("kit", "jam", json!({"op": "busy", "ms": 100}))),
    )
    .await;
    let full: Vec<_> = replies.iter().filter(|r| r.status == 429).collect();
    assert!(
        !full.is_empty(),
        "no 429 with 20 concurrent messages and a mailbox of 4"
    );
    assert!(
        full.iter()
            .all(|r| r.code() == "mailbox_full" && r.headers.contains_key("retry-after"))
    );
    assert!(replies.iter().filter(|r| r.status == 200).count() >= 4);
    assert_eq!(api.add("kit", "other", 1).await.status, 200);
}

#[tokio::test]
async fn guest_output_reaches_the_log_with_the_actor_named() {
    let (_dir, m, api) = common::kit_node(json!({})).await;
    api.op(
        "kit",
        "talker",
        json!({"op": "print", "text": "hello-from-the-guest"}),
    )
    .await;
    tokio::time::sleep(Duration::from_millis(100)).await;
    let log = m.log_text();
    let line = log
        .lines()
        .find(|l| l.contains("hello-from-the-guest"))
        .expect("guest stdout in the node log");
    assert!(line.contains("kit/talker"), "{line}");
}

#[tokio::test]
async fn sandboxes_have_no_ambient_authority() {
    let dir = tempdir();
    let m = Marmot::start(&dir.path().join("data")).await;
    let api = m.client();
    api.deploy("kit", TESTKIT, json!({"env": {"GREETING": "hi"}}))
        .await;
    // Something is listening on loopback: the guest still cannot reach it.
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let port = listener.local_addr().unwrap().port();
    let r = api
        .op("kit", "a", json!({"op": "ambient", "port": port}))
        .await;
    assert_eq!(r.status, 200, "{}", r.json);
    assert_eq!(r.json["file_ok"], false, "the guest read a host file");
    assert_eq!(r.json["dir_ok"], false, "the guest listed the host's root");
    assert_eq!(
        r.json["cwd_ok"], false,
        "the guest listed a working directory"
    );
    assert_eq!(r.json["net_ok"], false, "the guest opened a TCP connection");
    assert_eq!(
        r.json["env"],
        json!(["GREETING"]),
        "only the type's env is visible"
    );
    listener.set_nonblocking(true).unwrap();
    assert!(listener.accept().is_err(), "a connection reached the host");
}

#[tokio::test]
async fn idle_actors_give_back_their_stack_and_stay_awake() {
    let (_dir, _m, api) = common::kit_node(json!({})).await;
    let stack_pages = |m: &str| common::metric(m, "marmot_sandbox_trimmed_stack_pages_total");
    for id in ["s1", "s2"] {
        assert_eq!(api.add("kit", id, 5).await.json["value"], 5);
    }
    // Idle 2 s, each is trimmed: its store's fiber stack pages go back.
    let deadline = Instant::now() + Duration::from_secs(20);
    let m = loop {
        let m = String::from_utf8(api.get("/metrics").await.body).unwrap();
        if stack_pages(&m) >= 2.0 {
            break m;
        }
        assert!(Instant::now() < deadline, "no stack given back: {m}");
        tokio::time::sleep(Duration::from_millis(100)).await;
    };
    assert_eq!(
        common::metric(&m, "marmot_hibernations_total"),
        0.0,
        "trims are not hibernations"
    );
    // The same instances run again on the stacks they gave back, with
    // everything their turns left in memory and in state.
    for id in ["s1", "s2"] {
        assert_eq!(api.add("kit", id, 2).await.json["value"], 7);
        assert_eq!(
            api.get(&format!("/v1/actors/kit/{id}")).await.json["status"],
            "active"
        );
    }
}

/// An actor built with the SDK says where its memory is (wasmtime's view,
/// not the guest's word), so the node learns which pages a fresh
/// instance's first turn writes and copies them before the next fresh
/// instances run: those start exactly as the image says, with nothing of
/// any other instance, and their turns see what they wrote.
#[tokio::test]
async fn fresh_instances_start_with_the_pages_first_turns_write() {
    let (_dir, _m, api) = common::kit_node(json!({})).await;
    // A byte string given masked, so that only a turn that wrote it puts
    // it in a guest's memory.
    let scan = |needle: &str| {
        let mask: Vec<u8> = (0..needle.len()).map(|i| 0x5a ^ (i as u8)).collect();
        let masked: Vec<u8> = needle.bytes().zip(&mask).map(|(b, m)| b ^ m).collect();
        json!({ "op": "scan_memory", "masked": masked, "mask": mask })
    };
    for k in 0..16 {
        let id = format!("fresh-{k}");
        // The first turn, in a fresh instance (populated from the 9th on).
        if k > 0 {
            let previous = format!("marker-of-fresh-{}-5150", k - 1);
            let r = api.op("kit", &id, scan(&previous)).await;
            assert_eq!(r.status, 200, "{}", r.json);
            assert_eq!(r.json["found"], false, "{id} sees another instance's data");
        }
        let marker = format!("marker-of-fresh-{k}-5150");
        let r = api
            .op(
                "kit",
                &id,
                json!({ "op": "set", "key": "m", "value": marker }),
            )
            .await;
        assert_eq!(r.status, 200, "{}", r.json);
        // This instance keeps the marker in its memory while the next
        // fresh instance starts, and the scan finds it here: so "not found"
        // there means it is not there.
        let r = api
            .op("kit", &id, json!({ "op": "remember", "text": marker }))
            .await;
        assert_eq!(r.status, 200, "{}", r.json);
        let r = api.op("kit", &id, scan(&marker)).await;
        assert_eq!(r.json["found"], true, "{id} cannot find its own marker");
        assert_eq!(api.add("kit", &id, k + 1).await.json["value"], k + 1);
        assert_eq!(api.add("kit", &id, 1).await.json["value"], k + 2);
    }
    let m = String::from_utf8(api.get("/metrics").await.body).unwrap();
    assert!(
        common::metric(&m, "marmot_sandbox_prefaulted_pages_total") > 0.0,
        "no fresh instance had its pages populated: {m}"
    );
    assert_eq!(
        common::metric(&m, "marmot_js_sandbox_prefaulted_pages_total"),
        0.0
    );
}

/// Deployed code may export `report-memory-origin`, which the host calls
/// before a fresh instance's first turn. One that never returns is
/// stopped by the CPU meter, as a spinning turn is, and since a deploy
/// starts an instance of the code, it is refused there (it used to be
/// deployed, and every message to it failed): in about the CPU slice,
/// naming the export, with other actors served meanwhile.
#[tokio::test]
async fn a_report_of_memory_origin_that_never_returns_is_stopped() {
    let dir = tempdir();
    let m = Marmot::start(&dir.path().join("data")).await;
    let api = m.client();
    api.deploy("kit", TESTKIT, json!({})).await;
    assert_eq!(api.add("kit", "neighbour", 1).await.json["value"], 1);

    let deploy = {
        let api = api.clone();
        tokio::spawn(async move {
            let started = Instant::now();
            let r = api
                .deploy("spinner", SPINNING_ORIGIN, json!({"cpu_slice_ms": 300}))
                .await;
            (r, started.elapsed())
        })
    };
    tokio::time::sleep(Duration::from_millis(50)).await;
    let started = Instant::now();
    assert_eq!(api.add("kit", "neighbour", 1).await.json["value"], 2);
    assert!(
        started.elapsed() < Duration::from_millis(250),
        "neighbour waited {:?}",
        started.elapsed()
    );
    let (r, took) = deploy.await.unwrap();
    assert_eq!(r.status, 400, "{}", r.json);
    assert_eq!(r.code(), "invalid_code", "{}", r.json);
    assert!(
        r.json["error"]["message"]
            .as_str()
            .is_some_and(|m| m.contains("report-memory-origin")),
        "{}",
        r.json
    );
    assert!(took < Duration::from_secs(3), "it ran {took:?}");
    assert_eq!(api.get("/v1/types/spinner").await.status, 404);
    assert_eq!(api.add("kit", "neighbour", 1).await.json["value"], 3);
}

/// A deploy that shortens the idle timeout applies to actors awake
/// through it from their next turn: they kept the old one (up to 7 days)
/// for as long as they stayed awake (found by a probe).
#[tokio::test]
async fn a_shorter_idle_timeout_applies_to_actors_awake_through_the_deploy() {
    let dir = tempdir();
    let m = Marmot::start(&dir.path().join("data")).await;
    let api = m.client();
    api.deploy("kit", TESTKIT, json!({"idle_timeout_ms": 3_600_000}))
        .await;
    api.add("kit", "a", 1).await;
    api.deploy("kit", TESTKIT, json!({"idle_timeout_ms": 300}))
        .await;
    assert_eq!(api.add("kit", "a", 1).await.json["value"], 2);
    let started = Instant::now();
    api.wait_info("kit", "a", "hibernation", |i| i["status"] == "hibernated")
        .await;
    assert!(started.elapsed() < Duration::from_secs(10));
}

/// The headers a node uses to install a peer's deploy under the peer's
/// version number mean nothing on a node alone: a client picked version
/// 4294967295 with them, and the next deploy wrapped to 0 (found by a
/// probe).
#[tokio::test]
async fn a_client_cannot_choose_a_types_version_number() {
    let dir = tempdir();
    let m = Marmot::start(&dir.path().join("data")).await;
    let api = m.client();
    let r = api
        .req(
            reqwest::Method::PUT,
            "/v1/types/kit",
            Some(("application/wasm", TESTKIT.to_vec())),
            &[
                ("x-marmot-fanout-from", "n9"),
                ("x-marmot-type-version", "4294967295"),
            ],
        )
        .await;
    assert_eq!(r.status, 201, "{}", r.json);
    assert_eq!(r.json["version"], 1, "{}", r.json);
}
