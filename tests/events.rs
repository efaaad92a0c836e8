//! Event logs as clients see them: pages, live SSE streams (resume, gaps,
//! heartbeats, limits, shutdown), retention by count and age, and
//! `marmot events --follow`.

mod common;

use std::io::BufRead as _;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use common::{Api, Marmot, TESTKIT, kit_node, tempdir};
use serde_json::{Value, json};

const WAIT: Duration = Duration::from_secs(10);

async fn emit(api: &Api, id: &str, n: i64) -> u64 {
    let r = api
        .op(
            "kit",
            id,
            json!({"op": "emit", "kind": "step", "data": {"n": n}}),
        )
        .await;
    assert_eq!(r.status, 200, "{}", r.json);
    r.json["seq"].as_u64().unwrap()
}

/// Read event frames until seq `last`; return their seqs.
async fn read_until(s: &mut common::SseStream, last: u64) -> Vec<u64> {
    let mut seqs = Vec::new();
    while seqs.last() != Some(&last) {
        let f = s
            .next_event(WAIT)
            .await
            .unwrap_or_else(|| panic!("stream stalled after {seqs:?}, waiting for {last}"));
        let seq: u64 = f.id.as_deref().unwrap().parse().unwrap();
        assert_eq!(f.json()["seq"], seq, "id is the seq");
        seqs.push(seq);
    }
    seqs
}

#[tokio::test]
async fn a_stream_follows_committed_events_without_keeping_the_actor_awake() {
    let (_dir, _m, api) = kit_node(json!({"idle_timeout_ms": 300})).await;
    emit(&api, "a", 1).await;
    emit(&api, "a", 2).await;
    let mut s = api.sse("/v1/actors/kit/a/events", None).await;
    let hint = s.next_frame(WAIT).await.unwrap();
    assert_eq!(hint.retry, Some(1000), "the stream opens with a retry hint");
    let first = s.next_event(WAIT).await.unwrap();
    assert_eq!(first.id.as_deref(), Some("1"));
    let v = first.json();
    assert_eq!(v["kind"], "step");
    assert_eq!(v["data"], json!({"n": 1}));
    assert!(v["at_ms"].as_u64().unwrap() > 0);
    assert_eq!(read_until(&mut s, 2).await, [2]);

    // Live: a new event arrives once its turn is committed.
    let seq = emit(&api, "a", 3).await;
    assert_eq!(read_until(&mut s, seq).await, [3]);

    // The open stream does not keep the actor awake...
    api.wait_info("kit", "a", "hibernation with a stream open", |i| {
        i["status"] == "hibernated"
    })
    .await;
    // ...and still sees what the next wake commits.
    emit(&api, "a", 4).await;
    assert_eq!(read_until(&mut s, 4).await, [4]);
    // A failed turn commits no event and sends nothing.
    api.op(
        "kit",
        "a",
        json!({"op": "set_then_fail", "key": "k", "value": 1}),
    )
    .await;
    emit(&api, "a", 5).await;
    let f = s.next_event(WAIT).await.unwrap();
    assert_eq!(
        f.json()["data"],
        json!({"n": 5}),
        "nothing uncommitted leaks"
    );
    let text = String::from_utf8(api.get("/metrics").await.body).unwrap();
    assert!(
        common::sample(&text, "marmot_event_streams") == Some(1.0),
        "{text}"
    );
}

#[tokio::test]
async fn resume_after_kill_9_yields_exactly_the_events_after_last_event_id() {
    let dir = tempdir();
    let mut m = Marmot::start(&dir.path().join("data")).await;
    let api = m.client();
    api.deploy("kit", TESTKIT, json!({})).await;
    for n in 1..=10 {
        emit(&api, "a", n).await;
    }
    let mut s = api.sse("/v1/actors/kit/a/events", None).await;
    assert_eq!(read_until(&mut s, 6).await, [1, 2, 3, 4, 5, 6]);
    m.kill9();
    // The stream breaks with the process.
    while s.next_frame(WAIT).await.is_some() {}
    m.restart().await;
    let api = m.client();
    let mut s = api.sse("/v1/actors/kit/a/events", Some("6")).await;
    assert_eq!(read_until(&mut s, 10).await, [7, 8, 9, 10]);
    emit(&api, "a", 11).await;
    assert_eq!(read_until(&mut s, 11).await, [11]);
    assert!(
        s.next_event(Duration::from_millis(300)).await.is_none(),
        "nothing repeats"
    );
    // `?after=` works too; Last-Event-ID wins when both are given.
    let mut s = api.sse("/v1/actors/kit/a/events?after=9", None).await;
    assert_eq!(read_until(&mut s, 11).await, [10, 11]);
    let mut s = api.sse("/v1/actors/kit/a/events?after=2", Some("10")).await;
    assert_eq!(read_until(&mut s, 11).await, [11]);
}

#[tokio::test]
async fn streams_get_heartbeats_and_bad_requests_get_errors() {
    let config = "[events]\nheartbeat_ms = 150\nmax_streams = 2\n";
    let dir = tempdir();
    let m = Marmot::start_opts(&dir.path().join("data"), &[], Some(config)).await;
    let api = m.client();
    api.deploy("kit", TESTKIT, json!({})).await;
    // A stream may be opened before the actor exists; it waits for it.
    let mut s = api.sse("/v1/actors/kit/later/events", None).await;
    s.next_frame(WAIT).await.unwrap(); // retry hint
    let mut pings = 0;
    let until = Instant::now() + Duration::from_millis(700);
    while Instant::now() < until {
        if let Some(f) = s.next_frame(Duration::from_millis(400)).await {
            assert_eq!(f.comment.as_deref(), Some("ping"), "{f:?}");
            pings += 1;
        }
    }
    assert!(pings >= 2, "{pings} heartbeats in 700 ms");
    emit(&api, "later", 1).await;
    assert_eq!(read_until(&mut s, 1).await, [1]);

    let _second = api.sse("/v1/actors/kit/b/events", None).await;
    let r = api.sse_response("/v1/actors/kit/c/events", None).await;
    assert_eq!(r.status(), 503);
    let body: Value = r.json().await.unwrap();
    assert_eq!(body["error"]["code"], "too_many_streams");
    drop(s);
    tokio::time::sleep(Duration::from_millis(100)).await;
    let _third = api.sse("/v1/actors/kit/c/events", None).await;

    let r = api
        .sse_response("/v1/actors/kit/a/events", Some("x1"))
        .await;
    assert_eq!(r.status(), 400);
    let body: Value = r.json().await.unwrap();
    assert_eq!(body["error"]["code"], "invalid_last_event_id");
    // The page reads it by the same rule: where it starts, or a 400.
    let first = emit(&api, "a", 1).await;
    let second = emit(&api, "a", 2).await;
    let page = |last: String| {
        let api = &api;
        async move {
            api.req(
                reqwest::Method::GET,
                "/v1/actors/kit/a/events",
                None,
                &[("last-event-id", last.as_str())],
            )
            .await
        }
    };
    let r = page("{}".into()).await;
    assert_eq!(r.status, 400, "{}", r.json);
    assert_eq!(r.json["error"]["code"], "invalid_last_event_id");
    let r = page(first.to_string()).await;
    assert_eq!(r.status, 200, "{}", r.json);
    let seqs: Vec<u64> = r.json["events"]
        .as_array()
        .unwrap()
        .iter()
        .map(|e| e["seq"].as_u64().unwrap())
        .collect();
    assert_eq!(
        (seqs, r.json["next_after"].as_u64()),
        (vec![second], Some(second))
    );
    // An empty one is none, as the SSE standard has it (it was a 400).
    let r = page(String::new()).await;
    assert_eq!(r.status, 200, "{}", r.json);
    assert_eq!(r.json["events"].as_array().unwrap().len(), 2, "{}", r.json);
    let r = api.sse_response("/v1/actors/nope/a/events", None).await;
    assert_eq!(r.status(), 404);
}

/// A client that kept `Last-Event-ID` 5 of an actor that was deleted and
/// made again (its new log starts at 1) is told, and starts over, rather
/// than waiting until the new log passes 5 and missing everything before.
#[tokio::test]
async fn a_resume_past_the_logs_end_starts_over_with_a_reset() {
    let (_dir, _m, api) = kit_node(json!({})).await;
    for n in 1..=5 {
        emit(&api, "r", n).await;
    }
    assert_eq!(api.delete("/v1/actors/kit/r").await.status, 200);
    assert_eq!(emit(&api, "r", 10).await, 1, "the new log starts at 1");

    let page = api.get("/v1/actors/kit/r/events?after=5").await;
    assert_eq!(page.status, 200, "{}", page.json);
    // A page or a stream by `Accept`: caches are told.
    assert_eq!(page.headers["vary"], "accept");
    assert_eq!(page.json["reset"], json!({"after": 5, "last": 1}));
    assert_eq!(page.json["events"][0]["data"], json!({"n": 10}));
    assert_eq!(page.json["next_after"], 1);
    // Up to the end is no reset: a client that has seen everything waits.
    let page = api.get("/v1/actors/kit/r/events?after=1").await;
    assert_eq!(page.json["events"], json!([]));
    assert!(page.json.get("reset").is_none(), "{}", page.json);

    let mut s = api.sse("/v1/actors/kit/r/events", Some("5")).await;
    let reset = s.next_event(WAIT).await.unwrap();
    assert_eq!(reset.event.as_deref(), Some("reset"));
    assert_eq!(reset.id, None, "a reset is not an event of the log");
    assert_eq!(reset.json(), json!({"after": 5, "last": 1}));
    assert_eq!(read_until(&mut s, 1).await, [1]);
    let seq = emit(&api, "r", 11).await;
    assert_eq!(read_until(&mut s, seq).await, [2], "and it follows on");
    // A stream that waits for the actor (deleted, the client reconnecting
    // at once) and sees it made again reads the new log from its start.
    assert_eq!(api.delete("/v1/actors/kit/r").await.status, 200);
    let mut waiting = api.sse("/v1/actors/kit/r/events", Some("5")).await;
    for n in 1..=7 {
        emit(&api, "r", n).await;
    }
    let reset = waiting.next_event(WAIT).await.unwrap();
    assert_eq!(reset.event.as_deref(), Some("reset"), "{reset:?}");
    assert_eq!(reset.json()["after"], 5);
    assert_eq!(read_until(&mut waiting, 7).await, [1, 2, 3, 4, 5, 6, 7]);
    for n in 8..=9 {
        emit(&api, "r", n).await;
    }
    // Resuming at the end is not past it.
    let mut s = api.sse("/v1/actors/kit/r/events", Some("9")).await;
    emit(&api, "r", 12).await;
    let next = s.next_event(WAIT).await.unwrap();
    assert_eq!((next.event, next.id.as_deref()), (None, Some("10")));
}

#[tokio::test]
async fn deleting_the_actor_or_stopping_the_node_ends_its_streams() {
    let (_dir, mut m, api) = kit_node(json!({})).await;
    emit(&api, "a", 1).await;
    let mut s = api.sse("/v1/actors/kit/a/events", None).await;
    assert_eq!(read_until(&mut s, 1).await, [1]);
    assert_eq!(api.delete("/v1/actors/kit/a").await.status, 200);
    assert!(s.ends_within(WAIT).await, "the stream outlived its actor");

    // So does deleting its type with its actors (the stream went on, and
    // followed a new actor of the same name from the old log's seq).
    // Also a stream waiting for an actor never created (it went back to
    // waiting, and pinged for ever).
    emit(&api, "c", 1).await;
    let mut s = api.sse("/v1/actors/kit/c/events", None).await;
    assert_eq!(read_until(&mut s, 1).await, [1]);
    let mut unborn = api.sse("/v1/actors/kit/unborn/events", None).await;
    let r = api.delete("/v1/types/kit?force=true").await;
    assert_eq!(r.status, 200, "{}", r.json);
    assert!(s.ends_within(WAIT).await, "the stream outlived its type");
    assert!(
        unborn.ends_within(WAIT).await,
        "a stream of an actor never created outlived its type"
    );
    assert_eq!(api.deploy("kit", TESTKIT, json!({})).await.status, 201);

    // A graceful stop is not held up by open streams.
    emit(&api, "b", 1).await;
    let mut s = api.sse("/v1/actors/kit/b/events", None).await;
    assert_eq!(read_until(&mut s, 1).await, [1]);
    m.sigterm();
    assert!(
        m.wait_exit(Duration::from_secs(10)),
        "SIGTERM with an open stream must still stop the node"
    );
}

/// Large events come a bounded number of bytes at a time: a page (and
/// what a live stream reads at once) used to be `limit` events whatever
/// their size, up to 256 MB, held for as long as a slow client took.
#[tokio::test]
async fn pages_of_large_events_are_bounded_in_bytes_and_lose_nothing() {
    let (_dir, _m, api) = kit_node(json!({})).await;
    let pad = "x".repeat(200_000);
    for n in 1..=60 {
        let r = api
            .op(
                "kit",
                "big",
                json!({"op": "emit", "kind": "big", "data": {"n": n, "pad": pad}}),
            )
            .await;
        assert_eq!(r.status, 200, "{}", r.json);
    }
    // 60 events of ~200 kB: more than one page's 8 MiB.
    let mut seen = Vec::new();
    let mut after = 0;
    let mut pages = 0;
    loop {
        let r = api
            .get(&format!(
                "/v1/actors/kit/big/events?after={after}&limit=1000"
            ))
            .await;
        assert_eq!(r.status, 200);
        let events = r.json["events"].as_array().unwrap();
        if events.is_empty() {
            break;
        }
        pages += 1;
        assert!(events.len() < 60, "one page held {} events", events.len());
        seen.extend(events.iter().map(|e| e["data"]["n"].as_u64().unwrap()));
        after = r.json["next_after"].as_u64().unwrap();
    }
    assert_eq!(seen, (1..=60).collect::<Vec<_>>());
    assert!(pages >= 2, "{pages}");
    // A live stream from the start gets every one, in order.
    let mut s = api.sse("/v1/actors/kit/big/events", None).await;
    assert_eq!(read_until(&mut s, 60).await, (1..=60).collect::<Vec<_>>());
}

#[tokio::test]
async fn events_past_retention_are_hidden_at_once_then_deleted() {
    let config = "[events]\nmax_age_ms = 4000\n";
    let dir = tempdir();
    let data = dir.path().join("data");
    let mut m = Marmot::start_opts(&data, &[], Some(config)).await;
    let api = m.client();
    api.deploy("kit", TESTKIT, json!({"idle_timeout_ms": 60000}))
        .await;
    for n in 1..=3 {
        emit(&api, "a", n).await;
    }
    emit(&api, "b", 1).await;
    assert_eq!(
        api.get("/v1/actors/kit/a/events").await.json["events"]
            .as_array()
            .unwrap()
            .len(),
        3
    );
    // Ten seconds later (by the node's clock) the events are past 4 s.
    m.set_env("MARMOT_CLOCK_OFFSET_MS", Some("10000"));
    m.restart().await;
    let api = m.client();
    let page = api.get("/v1/actors/kit/a/events").await.json;
    assert_eq!(page["events"], json!([]), "hidden before any sweep: {page}");
    // The sweep trims both logs without keeping the actors awake: each is
    // woken for a bookkeeping commit and goes back to sleep right after it
    // (the info can show the commit a moment before the actor has left),
    // well inside its 60 s idle timeout.
    for id in ["a", "b"] {
        api.wait_info(
            "kit",
            id,
            "old events to be deleted and the actor back asleep",
            |i| {
                i["first_event_seq"] == i["last_event_seq"].as_u64().unwrap() + 1
                    && i["status"] == "hibernated"
            },
        )
        .await;
    }
    // A client resuming from before the cut learns about the gap.
    let seq = emit(&api, "a", 4).await;
    assert_eq!(seq, 4, "seqs continue after trimming");
    let mut s = api.sse("/v1/actors/kit/a/events", Some("1")).await;
    let gap = s.next_event(WAIT).await.unwrap();
    assert_eq!(gap.event.as_deref(), Some("gap"));
    assert_eq!(gap.json(), json!({"after": 1, "next": 4}));
    assert_eq!(gap.id, None, "a gap frame does not move the resume point");
    assert_eq!(read_until(&mut s, 4).await, [4]);
    // The page says it too (it skipped them without a word).
    let page = api.get("/v1/actors/kit/a/events?after=1").await.json;
    assert_eq!(page["gap"], json!({"after": 1, "next": 4}), "{page}");
    assert_eq!(page["events"][0]["seq"], 4, "{page}");
    let page = api.get("/v1/actors/kit/a/events?after=3").await.json;
    assert!(page.get("gap").is_none(), "{page}");
}

#[tokio::test]
async fn the_event_log_keeps_the_newest_events_up_to_its_count_limit() {
    let config = "[limits]\nmax_events_per_actor = 5\n";
    let dir = tempdir();
    let m = Marmot::start_opts(&dir.path().join("data"), &[], Some(config)).await;
    let api = m.client();
    api.deploy("kit", TESTKIT, json!({})).await;
    for n in 1..=12 {
        emit(&api, "a", n).await;
    }
    let page = api.get("/v1/actors/kit/a/events").await.json;
    let seqs: Vec<u64> = page["events"]
        .as_array()
        .unwrap()
        .iter()
        .map(|e| e["seq"].as_u64().unwrap())
        .collect();
    assert_eq!(seqs, [8, 9, 10, 11, 12]);
    let info = api.get("/v1/actors/kit/a").await.json;
    assert_eq!(info["first_event_seq"], 8);
    assert_eq!(info["last_event_seq"], 12);
}

#[tokio::test]
async fn marmot_events_follow_prints_old_and_new_events() {
    let (_dir, m, api) = kit_node(json!({})).await;
    emit(&api, "a", 1).await;
    emit(&api, "a", 2).await;
    let mut child = Command::new(env!("CARGO_BIN_EXE_marmot"))
        .args([
            "events", "kit", "a", "--follow", "--after", "1", "--url", &m.url,
        ])
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let stdout = child.stdout.take().unwrap();
    let (tx, rx) = std::sync::mpsc::channel::<String>();
    std::thread::spawn(move || {
        for line in std::io::BufReader::new(stdout).lines() {
            if tx.send(line.unwrap()).is_err() {
                return;
            }
        }
    });
    let line = rx.recv_timeout(WAIT).expect("the old event");
    let v: Value = serde_json::from_str(&line).unwrap();
    assert_eq!(v["seq"], 2);
    assert_eq!(v["data"], json!({"n": 2}));
    emit(&api, "a", 3).await;
    let line = rx.recv_timeout(WAIT).expect("the new event");
    assert_eq!(serde_json::from_str::<Value>(&line).unwrap()["seq"], 3);
    let _ = child.kill();
    let _ = child.wait();

    // Without --follow it prints the log and exits.
    let out = Command::new(env!("CARGO_BIN_EXE_marmot"))
        .args(["events", "kit", "a", "--url", &m.url])
        .output()
        .unwrap();
    assert!(out.status.success());
    let lines: Vec<Value> = String::from_utf8(out.stdout)
        .unwrap()
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    assert_eq!(lines.len(), 3);
    assert_eq!(lines[2]["seq"], 3);
}
