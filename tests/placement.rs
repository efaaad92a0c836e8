//! Actors near their users, in a cluster of real nodes on etcd: a new
//! actor lives in the region asked, and a move takes all of it to another
//! region — also under load, and when the mover dies half-way.

mod common;

use std::collections::BTreeSet;
use std::process::Command;
use std::time::{Duration, Instant};

use common::cluster::*;
use common::{TESTKIT, metric};
use serde_json::{Value, json};

/// A new actor lives in the region its first message names (else the
/// receiving node's), and a move takes all of it — state, events, alarms,
/// idempotency records — to the other region, whichever node is asked.
#[tokio::test]
async fn actors_live_in_the_region_asked_and_move_with_all_their_data() {
    let Some(c) = Cluster::start().await else {
        return;
    };
    assert_eq!(c.api(0).deploy("kit", TESTKIT, json!({})).await.status, 201);
    let add = json!({"op": "add", "key": "n", "by": 1});

    // Placement at creation: `?region=` through a node of the other
    // region, and the receiving node's region without one.
    for i in 0..6 {
        let id = format!("far-{i}");
        let r = c
            .api(0)
            .post_json(&format!("/v1/actors/kit/{id}?region=us"), &add)
            .await;
        assert_eq!(r.status, 200, "{}", r.json);
        assert_eq!(owner_of(&c, 1, &id).await, "n3", "{id} asked for us");
        let id = format!("near-{i}");
        assert_eq!(
            c.api(2)
                .post_json(&format!("/v1/actors/kit/{id}"), &add)
                .await
                .status,
            200
        );
        assert_eq!(
            owner_of(&c, 0, &id).await,
            "n3",
            "{id} was created through n3 (us)"
        );
        let id = format!("home-{i}");
        assert_eq!(
            c.api(1)
                .post_json(&format!("/v1/actors/kit/{id}"), &add)
                .await
                .status,
            200
        );
        assert_eq!(
            region_of(&owner_of(&c, 2, &id).await),
            "eu",
            "{id} was created through n2 (eu)"
        );
    }
    // A region no node is in: refused, nothing created.
    let r = c
        .api(0)
        .post_json("/v1/actors/kit/lost?region=mars", &add)
        .await;
    assert_eq!(r.status, 400, "{}", r.json);
    assert_eq!(r.json["error"]["code"], "unknown_region");
    assert_eq!(c.api(1).get("/v1/actors/kit/lost").await.status, 404);
    // A long name is not repeated whole.
    let long = "m".repeat(5000);
    for path in [
        format!("/v1/actors/kit/lost?region={long}"),
        format!("/v1/actors/kit/mover/move?region={long}"),
    ] {
        let r = c.api(0).post_json(&path, &add).await;
        let message = r.json["error"]["message"].as_str().unwrap_or_default();
        assert!(
            message.len() < 300 && message.contains("mmm…"),
            "{}",
            r.json
        );
    }
    // An existing actor stays where it is whatever a message asks.
    let r = c
        .api(1)
        .post_json("/v1/actors/kit/far-0?region=eu", &add)
        .await;
    assert_eq!(r.json["value"], 2, "{}", r.json);
    assert_eq!(owner_of(&c, 0, "far-0").await, "n3");

    // An actor with state, an event, an alarm and an idempotency record.
    let api = c.api(0);
    assert_eq!(api.add("kit", "mover", 5).await.status, 200);
    let home = owner_of(&c, 0, "mover").await;
    assert_eq!(region_of(&home), "eu");
    assert_eq!(
        c.api(1)
            .op(
                "kit",
                "mover",
                json!({"op": "emit", "kind": "before-move", "data": {}})
            )
            .await
            .status,
        200
    );
    let r = c
        .api(1)
        .op(
            "kit",
            "mover",
            json!({"op": "alarm_set", "name": "later", "after": 2500}),
        )
        .await;
    assert_eq!(r.status, 200, "{}", r.json);
    assert_eq!(keyed(&c, 0).await.json["value"], 15);
    // And a file large enough to be a blob: its bytes go ahead of the rows.
    let big = json!({"op": "file_write", "path": "big.bin", "bytes": 300_000});
    assert_eq!(
        c.api(1).op("kit", "mover", big).await.json,
        json!({"ok": true})
    );
    let before = c.api(0).get("/v1/actors/kit/mover/files/big.bin").await;
    assert_eq!((before.status, before.body.len()), (200, 300_000));

    let r = c
        .api(1)
        .post_json("/v1/actors/kit/mover/move?region=us", &json!({}))
        .await;
    assert_eq!(r.status, 200, "{}", r.json);
    assert_eq!(r.json["moved"], true, "{}", r.json);
    assert_eq!(r.json["node"], "n3", "{}", r.json);
    // The answers a cluster adds to (or adds fields to) are as documented.
    let doc = c.api(0).get("/v1/openapi.json").await.json;
    common::documented(&doc, "post", "/v1/actors/{type}/{id}/move", &r);
    for i in 0..3 {
        assert_eq!(owner_of(&c, i, "mover").await, "n3");
    }
    let info = c.api(0).get("/v1/actors/kit/mover").await;
    let info = common::documented(&doc, "get", "/v1/actors/{type}/{id}", &info);
    assert_eq!(info["region"], "us", "{info}");
    let status = c.api(0).get("/v1/cluster").await;
    let status = common::documented(&doc, "get", "/v1/cluster", &status);
    assert_eq!(status["members"].as_array().unwrap().len(), 3, "{status}");
    // Everything came along: the repeat of a keyed request is answered
    // from its record (not applied again), the state and the event are
    // there, and the alarm fires on the new owner.
    assert_eq!(keyed(&c, 2).await.json["value"], 15, "applied twice");
    let r = c
        .api(1)
        .op("kit", "mover", json!({"op": "get", "key": "n"}))
        .await;
    assert_eq!(r.json["value"], 15, "{}", r.json);
    let events = c.api(0).get("/v1/actors/kit/mover/events").await;
    let events = String::from_utf8_lossy(&events.body).into_owned();
    assert!(events.contains("before-move"), "{events}");
    let file = c.api(1).get("/v1/actors/kit/mover/files/big.bin").await;
    assert_eq!(file.status, 200);
    assert!(file.body == before.body, "the moved file's bytes differ");
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        let r = c
            .api(1)
            .op("kit", "mover", json!({"op": "get", "key": "fired"}))
            .await;
        if r.json["value"].as_array().is_some_and(|a| a.len() == 1) {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "the alarm never fired after the move: {}",
            r.json
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let h = NODES.iter().position(|(n, _)| *n == home).unwrap();
    let text =
        String::from_utf8_lossy(&c.nodes[h].client().get("/metrics").await.body).into_owned();
    assert_eq!(metric(&text, "marmot_cluster_moves_total"), 1.0, "{text}");

    // Asked again (with the CLI): already there. Back to eu: with its data.
    let out = Command::new(env!("CARGO_BIN_EXE_marmot"))
        .args([
            "cluster",
            "move",
            "kit",
            "mover",
            "--region",
            "us",
            "--url",
            &c.nodes[2].url,
        ])
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success() && text.contains("already"), "{text}");
    let out = Command::new(env!("CARGO_BIN_EXE_marmot"))
        .args(["cluster", "status", "--url", &c.nodes[2].url])
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(
        text.contains("actors placed outside their hash slot"),
        "{text}"
    );
    let r = c
        .api(2)
        .post_json("/v1/actors/kit/mover/move?region=us", &json!({}))
        .await;
    assert_eq!(
        (r.status, r.json["moved"].clone()),
        (200, json!(false)),
        "{}",
        r.json
    );
    let r = c
        .api(2)
        .post_json("/v1/actors/kit/mover/move?region=eu", &json!({}))
        .await;
    assert_eq!(r.json["moved"], true, "{}", r.json);
    assert_eq!(region_of(&owner_of(&c, 2, "mover").await), "eu");
    let file = c.api(2).get("/v1/actors/kit/mover/files/big.bin").await;
    assert!(
        file.body == before.body,
        "the file's bytes differ after the move back"
    );
    assert_eq!(
        c.api(1)
            .op("kit", "mover", json!({"op": "get", "key": "n"}))
            .await
            .json["value"],
        15
    );

    // Bad moves change nothing.
    let r = c
        .api(0)
        .post_json("/v1/actors/kit/nobody/move?region=us", &json!({}))
        .await;
    assert_eq!(r.status, 404, "{}", r.json);
    let r = c
        .api(0)
        .post_json("/v1/actors/kit/mover/move?region=mars", &json!({}))
        .await;
    assert_eq!(r.status, 400, "{}", r.json);
    let r = c
        .api(0)
        .post_json("/v1/actors/kit/mover/move", &json!({}))
        .await;
    assert_eq!(r.status, 400, "{}", r.json);
}

/// First messages to new actors, sent at once through nodes of both
/// regions: the one through the other region places the actor there while
/// the others arrive. Each is served, and each applied once. Those that
/// came while the actor was being placed got 409 `move_conflict` (a probe:
/// 106 of 360). They carry an `Idempotency-Key`: one served on the slot's
/// owner as the placing fences the actor is routed again only then
/// (without, it is a 503 `actor_moved`, nothing applied).
#[tokio::test]
async fn first_messages_racing_through_both_regions_are_each_served_once() {
    let Some(c) = Cluster::start().await else {
        return;
    };
    assert_eq!(c.api(0).deploy("kit", TESTKIT, json!({})).await.status, 201);
    for i in 0..16 {
        let id = format!("race-{i}");
        let sends = (0..6).map(|j| {
            let (api, id) = (c.api(j % 3), id.clone());
            async move {
                let key = format!("{id}-{j}");
                api.post_with(
                    &format!("/v1/actors/kit/{id}"),
                    &json!({"op": "add", "key": "n", "by": 1}),
                    &[("idempotency-key", &key)],
                )
                .await
            }
        });
        for r in futures::future::join_all(sends).await {
            assert_eq!(r.status, 200, "{id}: {}", r.json);
        }
        let r = c
            .api(i % 3)
            .op("kit", &id, json!({"op": "get", "key": "n"}))
            .await;
        assert_eq!(r.json["value"], 6, "{id}: {}", r.json);
    }
}

/// etcd keeps placement entries only for actors that exist: deleting a
/// placed actor removes its entry at once (so the id can be placed anew),
/// and the sweep removes an entry whose actor is gone otherwise.
#[tokio::test]
async fn placement_entries_go_with_their_actors() {
    let Some(c) = Cluster::start_with(&[("MARMOT_PLACEMENT_SWEEP_SECS", "3")], "").await else {
        return;
    };
    assert_eq!(c.api(0).deploy("kit", TESTKIT, json!({})).await.status, 201);
    let placed = |i: usize| {
        let api = c.api(i);
        async move { api.get("/v1/cluster").await.json["actors_placed"].clone() }
    };
    let add = json!({"op": "add", "key": "n", "by": 1});
    let ids: Vec<String> = (0..4).map(|i| format!("gone-{i}")).collect();
    for id in &ids {
        let r = c
            .api(0)
            .post_json(&format!("/v1/actors/kit/{id}?region=us"), &add)
            .await;
        assert_eq!(r.status, 200, "{}", r.json);
    }
    let entries = placed(2).await.as_u64().unwrap();
    assert!(entries > 0, "no actor needed an entry to live in us");
    for id in &ids {
        let r = c.api(1).delete(&format!("/v1/actors/kit/{id}")).await;
        assert_eq!(r.json["deleted"], true, "{}", r.json);
    }
    // The owner (n3, the only node in us) waited for its view.
    assert_eq!(placed(2).await, 0, "a deleted actor kept its entry");
    // The id is new again: it goes where its next first message says.
    let r = c
        .api(2)
        .post_json("/v1/actors/kit/gone-0?region=eu", &add)
        .await;
    assert_eq!((r.status, r.json["value"].clone()), (200, json!(1)));
    assert_eq!(region_of(&owner_of(&c, 2, "gone-0").await), "eu");

    // An entry whose actor does not exist (as a crash between a delete and
    // its forget would leave) goes at the sweep after next; an entry whose
    // actor exists stays. Here the owner of the actor's hash slot also
    // keeps a copy from before (as a move out that crashed before its drop
    // would leave): dropped first, not served once the entry is gone.
    let mut stray = None;
    for i in 0..40 {
        let id = format!("stray-{i}");
        assert_eq!(c.api(0).add("kit", &id, 1).await.status, 200);
        // Neither its owner nor its backup is n3, the stray entry's node.
        let info = c.api(0).get(&format!("/v1/actors/kit/{id}")).await.json;
        if info["node"] != "n3" && info["backup"] != "n3" {
            stray = Some(id);
            break;
        }
    }
    let stray = stray.expect("every actor landed on n3");
    let r = c
        .api(0)
        .post_json("/v1/actors/kit/kept?region=us", &add)
        .await;
    assert_eq!(r.status, 200, "{}", r.json);
    let slot = r.headers["x-marmot-slot"].to_str().unwrap().to_owned();
    let before = placed(2).await.as_u64().unwrap();
    // The layout's key: type and id percent-encoded.
    let entry_key = format!("/marmot/placements/kit/{}", stray.replace('-', "%2D"));
    let mut etcd = etcd_client::Client::connect([c.etcd.url.as_str()], None)
        .await
        .unwrap();
    etcd.put(entry_key.clone(), format!("{{\"slot\": {slot}}}"), None)
        .await
        .unwrap();
    let deadline = Instant::now() + Duration::from_secs(20);
    let mut seen = false;
    loop {
        let now = placed(2).await.as_u64().unwrap();
        seen |= now > before;
        if seen && now == before {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "the sweep never removed the stray entry ({now})"
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    let entry = etcd.get(entry_key, None).await.unwrap();
    assert!(entry.kvs().is_empty(), "still in etcd");
    for i in 0..3 {
        let r = c.api(i).get(&format!("/v1/actors/kit/{stray}")).await;
        assert_eq!(r.status, 404, "the copy from before is served: {}", r.json);
        let page = c.api(i).get("/v1/actors/kit?prefix=stray-").await.json;
        assert!(
            !page.to_string().contains(&format!("\"{stray}\"")),
            "{page}"
        );
    }
    assert_eq!(
        placed(2).await.as_u64().unwrap(),
        before,
        "kept lost its entry"
    );
    let text = String::from_utf8_lossy(&c.api(2).get("/metrics").await.body).into_owned();
    assert!(
        metric(&text, "marmot_cluster_placements_forgotten_total") >= (entries + 1) as f64,
        "{text}"
    );
    // The sweep leaves actors that exist where they are.
    let r = c.api(0).post_json("/v1/actors/kit/gone-0", &add).await;
    assert_eq!(r.json["value"], 2, "{}", r.json);
}

/// Moves under load: actors go back and forth between the regions while
/// clients write to them through every node (retrying with the same
/// idempotency key): every acknowledged write is there exactly once.
#[tokio::test]
async fn moves_under_load_lose_and_double_nothing() {
    use common::history::History;
    use std::sync::Arc;
    let Some(c) = Cluster::start().await else {
        return;
    };
    assert_eq!(c.api(0).deploy("kit", TESTKIT, json!({})).await.status, 201);
    const ACTORS: usize = 4;
    for a in 0..ACTORS {
        assert_eq!(c.api(0).add("kit", &format!("m-{a}"), 1).await.status, 200);
    }
    let history = Arc::new(History::named("moves_under_load"));
    let actors: Vec<String> = (0..ACTORS).map(|a| format!("m-{a}")).collect();
    let writers = Writers::start(&c, &history, &actors, 4, 40);
    let mut moves = 0;
    let started = Instant::now();
    for round in 0..5 {
        for a in 0..ACTORS {
            let region = if (round + a) % 2 == 0 { "us" } else { "eu" };
            let r = c
                .api(round + a)
                .post_json(
                    &format!("/v1/actors/kit/m-{a}/move?region={region}"),
                    &json!({}),
                )
                .await;
            assert_eq!(r.status, 200, "m-{a} to {region}: {}", r.json);
            moves += usize::from(r.json["moved"] == true);
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }
    let took = started.elapsed();
    writers.stop().await;
    let total: usize = history.acked().values().map(BTreeSet::len).sum();
    assert!(moves >= 15, "only {moves} moves happened");
    assert!(total > 50, "the load stalled: {total}");
    let summary = history.check(&seen(&c, 1, &actors).await);
    eprintln!("{moves} moves in {took:?} under load; {summary:?}");
}

/// Requests running or queued when their actor moves: their commits are
/// refused on the old owner (nothing applied), and the router sends those
/// the client made safe to retry (an Idempotency-Key) again to where the
/// actor went. The client sees one 200, and each write is applied once.
/// One without a key is not run again behind the client's back (its guest
/// may have had effects outside its turn): a 503 `actor_moved` says to
/// retry, and nothing of it was applied.
#[tokio::test]
async fn requests_caught_by_a_move_are_served_where_the_actor_went() {
    let Some(c) = Cluster::start().await else {
        return;
    };
    assert_eq!(c.api(0).deploy("kit", TESTKIT, json!({})).await.status, 201);
    let r = c
        .api(0)
        .post_json(
            "/v1/actors/kit/caught?region=eu",
            &json!({"op": "add", "key": "n", "by": 1}),
        )
        .await;
    assert_eq!(r.status, 200, "{}", r.json);
    let from = owner_of(&c, 0, "caught").await;
    assert_eq!(region_of(&from), "eu");
    let f = NODES.iter().position(|(n, _)| *n == from).unwrap();

    // One turn running (it commits after 1.5 s) and two queued behind it,
    // all sent to the owner, when the move starts.
    let send = |id: &'static str, keyed: bool| {
        let api = c.api(f);
        tokio::spawn(async move {
            let key = [("idempotency-key", id)];
            api.post_with(
                "/v1/actors/kit/caught",
                &json!({"op": "record", "id": id, "busy_ms": 1500}),
                if keyed { &key[..] } else { &[] },
            )
            .await
        })
    };
    let running = send("running", true);
    tokio::time::sleep(Duration::from_millis(300)).await;
    let queued = send("queued", true);
    let unkeyed = send("unkeyed", false);
    tokio::time::sleep(Duration::from_millis(100)).await;
    let moved = c
        .api(f)
        .post_json("/v1/actors/kit/caught/move?region=us", &json!({}))
        .await;
    assert_eq!(moved.status, 200, "{}", moved.json);
    assert_eq!(moved.json["moved"], true, "{}", moved.json);

    for (name, r) in [("running", running), ("queued", queued)] {
        let r = r.await.unwrap();
        assert_eq!(r.status, 200, "the {name} request: {}", r.json);
        assert_eq!(r.json["seen"], 1, "the {name} request: {}", r.json);
        assert_eq!(
            r.headers["x-marmot-node"], "n3",
            "the {name} request was served where the actor went"
        );
    }
    let r = unkeyed.await.unwrap();
    assert_eq!(
        (r.status, r.code()),
        (503, "actor_moved"),
        "the request without a key: {}",
        r.json
    );
    assert!(r.headers.contains_key("retry-after"));
    // Each applied once, where the actor lives now; the unkeyed one not.
    assert_eq!(owner_of(&c, 0, "caught").await, "n3");
    let r = c
        .api(1)
        .get("/v1/actors/kit/caught/state/seen/unkeyed")
        .await;
    assert_eq!(r.status, 404, "{}", r.json);
    for (key, want) in [("seen/running", 1), ("seen/queued", 1), ("total", 2)] {
        let r = c
            .api(1)
            .get(&format!("/v1/actors/kit/caught/state/{key}"))
            .await;
        assert_eq!(r.json, want, "{key}: {}", r.json);
    }
    let metrics = String::from_utf8_lossy(&c.api(f).get("/metrics").await.body).into_owned();
    assert!(
        metric(
            &metrics,
            "marmot_cluster_forwards_total{outcome=\"rerouted\"}"
        ) >= 1.0,
        "{metrics}"
    );
}

/// `actors.call`s caught by their callee's move are sent again where it
/// went when they are keyed (the caller's request has an
/// `Idempotency-Key`), and each takes effect once; an unkeyed one fails,
/// as a client's unkeyed request does. They failed with "belongs to another
/// node now", and a durable caller's message was dropped (found by a
/// probe).
#[tokio::test]
async fn calls_caught_by_a_move_follow_the_callee_when_keyed() {
    let Some(c) = Cluster::start().await else {
        return;
    };
    assert_eq!(c.api(0).deploy("kit", TESTKIT, json!({})).await.status, 201);
    let caller = r#"
import { actors } from "marmot";
export default {
  async onMessage(m) {
    try {
      return await actors.call("kit", "callee", { op: "record", id: m.id, busy_ms: 1500 });
    } catch (e) {
      return { code: e.code, message: e.message };
    }
  },
};
"#;
    assert_eq!(c.api(0).deploy_js("caller", caller).await.status, 201);
    let r = c
        .api(0)
        .post_json(
            "/v1/actors/kit/callee?region=eu",
            &json!({"op": "add", "key": "n", "by": 1}),
        )
        .await;
    assert_eq!(r.status, 200, "{}", r.json);
    let from = owner_of(&c, 0, "callee").await;
    let f = NODES.iter().position(|(n, _)| *n == from).unwrap();

    // One call running (its turn commits after 1.5 s) and two queued
    // behind it when the move starts; callers on every node.
    let call = |i: usize, id: &'static str, keyed: bool| {
        let api = c.api(i);
        tokio::spawn(async move {
            let key = [("idempotency-key", id)];
            api.post_with(
                &format!("/v1/actors/caller/{id}"),
                &json!({"id": id}),
                if keyed { &key[..] } else { &[] },
            )
            .await
        })
    };
    let running = call(0, "running", true);
    tokio::time::sleep(Duration::from_millis(300)).await;
    let queued = call(1, "queued", true);
    let unkeyed = call(2, "unkeyed", false);
    tokio::time::sleep(Duration::from_millis(100)).await;
    let moved = c
        .api(f)
        .post_json("/v1/actors/kit/callee/move?region=us", &json!({}))
        .await;
    assert_eq!(moved.status, 200, "{}", moved.json);

    for (name, r) in [("running", running), ("queued", queued)] {
        let r = r.await.unwrap();
        assert_eq!(r.status, 200, "the {name} call: {}", r.json);
        assert_eq!(r.json["seen"], 1, "the {name} call: {}", r.json);
    }
    let r = unkeyed.await.unwrap();
    assert_eq!(r.json["code"], "internal", "the unkeyed call: {}", r.json);
    assert_eq!(owner_of(&c, 0, "callee").await, "n3");
    for (key, want) in [("seen/running", 1), ("seen/queued", 1), ("total", 2)] {
        let r = c
            .api(1)
            .get(&format!("/v1/actors/kit/callee/state/{key}"))
            .await;
        assert_eq!(r.json, want, "{key}: {}", r.json);
    }
}

/// A call (unkeyed) to an actor being moved, from a caller on the mover's
/// node, waits for the move there and is answered where the actor went:
/// a first version of "stop waiting for a node that left" stopped waiting
/// for this node's own API after half a second.
#[tokio::test]
async fn a_call_to_an_actor_being_moved_waits_for_the_move() {
    let Some(c) = Cluster::start_with(&[("MARMOT_FAULT_MOVE_DELAY_MS", "2500")], "").await else {
        return;
    };
    assert_eq!(c.api(0).deploy("kit", TESTKIT, json!({})).await.status, 201);
    let caller = r#"
import { actors } from "marmot";
export default {
  async onMessage(m) {
    try { return await actors.call("kit", "moving", { op: "add", key: "n", by: 1 }); }
    catch (e) { return { code: e.code, message: e.message }; }
  },
};
"#;
    assert_eq!(c.api(0).deploy_js("caller", caller).await.status, 201);
    assert_eq!(c.api(0).add("kit", "moving", 5).await.status, 200);
    let mover = owner_of(&c, 0, "moving").await;
    assert_eq!(region_of(&mover), "eu");
    let m = NODES.iter().position(|(n, _)| *n == mover).unwrap();
    // The caller on the same node (it lives where its first message went).
    let r = c
        .api(m)
        .post_json("/v1/actors/caller/beside?region=eu", &json!({}))
        .await;
    assert_eq!(r.status, 200, "{}", r.json);
    let api = c.api(m);
    let moving = tokio::spawn(async move {
        api.post_json("/v1/actors/kit/moving/move?region=us", &json!({}))
            .await
    });
    // The copy is on n3 and the switch held back for 2.5 s.
    tokio::time::sleep(Duration::from_millis(500)).await;
    let r = c
        .api(m)
        .post_json("/v1/actors/caller/beside", &json!({}))
        .await;
    assert_eq!(r.status, 200, "{}", r.json);
    assert_eq!(r.json, json!({"value": 7}), "{}", r.json);
    let moved = moving.await.unwrap();
    assert_eq!(moved.status, 200, "{}", moved.json);
}

/// kill -9 of the node moving an actor, between the copy to the new owner
/// and the switch: the actor stays where it was, with its data — the
/// slot's next owner finds the mover's fence stale and undoes it — and the
/// copy on the new owner is never served.
#[tokio::test]
async fn a_mover_killed_before_the_switch_leaves_the_actor_where_it_was() {
    let Some(mut c) = Cluster::start_with(&[("MARMOT_FAULT_MOVE_DELAY_MS", "1500")], "").await
    else {
        return;
    };
    assert_eq!(c.api(0).deploy("kit", TESTKIT, json!({})).await.status, 201);
    assert_eq!(c.api(0).add("kit", "stuck", 5).await.status, 200);
    let info = c.api(0).get("/v1/actors/kit/stuck").await.json;
    let mover = info["node"].as_str().unwrap().to_owned();
    let backup = info["backup"].as_str().expect("a backup").to_owned();
    assert_eq!(region_of(&mover), "eu");
    let m = NODES.iter().position(|(n, _)| *n == mover).unwrap();
    let b = NODES.iter().position(|(n, _)| *n == backup).unwrap();

    let api = c.api(m);
    let moving = tokio::spawn(async move {
        api.try_post_with("/v1/actors/kit/stuck/move?region=us", &json!({}), &[])
            .await
    });
    // The copy is on n3 and the switch is held back: a request now waits.
    tokio::time::sleep(Duration::from_millis(500)).await;
    let status = c.api(b).get("/v1/cluster").await.json;
    assert_eq!(status["actors_moving"], 1, "{status:#}");
    c.nodes[m].kill9();
    let r = moving.await.unwrap();
    assert!(
        r.is_none_or(|r| r.status != 200),
        "the move cannot have finished"
    );

    // Its slot fails over to its backup, which undoes the stale fence and
    // serves the actor with its data.
    let r = add_when_served(&c, b, "stuck").await;
    assert_eq!(r.status, 200, "{}", r.json);
    assert_eq!(r.json["value"], 6, "{}", r.json);
    assert_eq!(owner_of(&c, b, "stuck").await, backup);
    let status = c.api(b).get("/v1/cluster").await.json;
    assert_eq!(status["actors_moving"], 0, "{status:#}");

    // The mover comes back: one actor, one state, whichever node is asked.
    c.nodes[m].restart().await;
    for i in 0..3 {
        wait_value(&c, i, "stuck", "n", 6).await;
    }
    assert_eq!(c.api(m).add("kit", "stuck", 1).await.json["value"], 7);
    assert_eq!(owner_of(&c, 2, "stuck").await, backup);
}

/// A node stopped (SIGTERM) while a rebalance gives it slots back leaves
/// owning nothing: it says it is leaving, the controller and the other
/// owners give it no more, and it hands on what still came. It handed
/// over only the slots it owned when the stop began; those a rebalance
/// gave it after failed over once its lease ran out (a probe: 502s and
/// ~2 s without answers), and its unused slots were nobody's for the
/// controller's grace.
#[tokio::test]
async fn a_node_stopped_during_a_rebalance_leaves_owning_nothing() {
    let Some(mut c) = Cluster::start().await else {
        return;
    };
    assert_eq!(c.api(0).deploy("kit", TESTKIT, json!({})).await.status, 201);
    let actors: Vec<String> = (0..24).map(|a| format!("sr-{a}")).collect();
    for a in &actors {
        assert_eq!(c.api(0).add("kit", a, 1).await.status, 200);
    }
    let mut on_n2 = None;
    for a in &actors {
        if owner_of(&c, 0, a).await == "n2" {
            on_n2 = Some(a.clone());
        }
    }
    let on_n2 = on_n2.expect("an actor on n2");
    // n2 dies, its used slots fail over, and it comes back with none.
    c.nodes[1].kill9();
    assert_eq!(add_when_served(&c, 0, &on_n2).await.status, 200);
    c.nodes[1].restart().await;
    c.wait_status(|s| {
        s["slots_degraded"] == 0
            && s["members"]
                .as_array()
                .is_some_and(|m| m.iter().any(|m| m["node_id"] == "n2" && m["alive"] == true))
    })
    .await;
    // A rebalance starts giving n2 its slots back; n2 is stopped as the
    // first arrives.
    let slot_writes = c.etcd.watch("/marmot/slots/").await;
    let r = c
        .api(2)
        .post_json("/v1/cluster/rebalance", &json!({}))
        .await;
    assert_eq!(r.status, 202, "{}", r.json);
    let deadline = Instant::now() + Duration::from_secs(30);
    while !slot_writes
        .writes()
        .iter()
        .any(|(_, r)| r["owner"] == "n2" && r["used"] == true)
    {
        assert!(Instant::now() < deadline, "the rebalance gave n2 nothing");
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    c.nodes[1].sigterm();
    assert!(c.nodes[1].wait_exit(Duration::from_secs(20)), "n2 stopped");
    // Within a second of its exit (its lease and the controller's grace
    // take longer), no slot is left with it.
    let exited = Instant::now();
    loop {
        let s = c.api(0).get("/v1/cluster").await.json;
        if s["slots_unavailable"] == 0 {
            break;
        }
        assert!(
            exited.elapsed() < Duration::from_secs(1),
            "slots left with the stopped node: {s:#}"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    for a in &actors {
        let r = c.api(0).add("kit", a, 1).await;
        assert_eq!(r.status, 200, "{a}: {}", r.json);
    }
}

/// A node comes back after its used slots failed over: `rebalance` moves
/// each used slot whose preferred node (in its region) is the returning
/// one back to it — it first catches up as the slot's backup, then the
/// owner hands the slot over — while clients keep writing through every
/// node: no acknowledged write lost or applied twice, every actor's data
/// where the slot table says.
#[tokio::test]
async fn a_rebalance_gives_a_returning_node_its_slots_back_and_loses_no_write() {
    use common::history::History;
    use std::sync::Arc;
    let Some(mut c) = Cluster::start().await else {
        return;
    };
    assert_eq!(c.api(0).deploy("kit", TESTKIT, json!({})).await.status, 201);
    const ACTORS: usize = 24;
    let actors: Vec<String> = (0..ACTORS).map(|a| format!("rb-{a}")).collect();
    for a in &actors {
        assert_eq!(c.api(0).add("kit", a, 1).await.status, 200);
    }
    let on_n2: Vec<&String> = {
        let mut v = Vec::new();
        for a in &actors {
            if owner_of(&c, 0, a).await == "n2" {
                v.push(a);
            }
        }
        v
    };
    assert!(!on_n2.is_empty(), "no actor on n2");
    let used_by = |status: &Value, node: &str| {
        status["members"]
            .as_array()
            .unwrap()
            .iter()
            .find(|m| m["node_id"] == node && m["alive"] == true)
            .and_then(|m| m["slots_used"].as_u64())
    };
    // n2 dies; its used slots fail over; it comes back with none.
    c.nodes[1].kill9();
    assert_eq!(add_when_served(&c, 0, on_n2[0]).await.status, 200);
    c.nodes[1].restart().await;
    let status = c
        .wait_status(|s| used_by(s, "n2").is_some() && s["slots_degraded"] == 0)
        .await;
    assert_eq!(used_by(&status, "n2"), Some(0), "{status:#}");

    let history = Arc::new(History::named("rebalance_under_load"));
    let writers = Writers::start(&c, &history, &actors, 3, 20);
    tokio::time::sleep(Duration::from_millis(300)).await;
    // Every slot record written from here on (not the gauge between polls).
    let slot_writes = c.etcd.watch("/marmot/slots/").await;
    let started = Instant::now();
    // Asked with the CLI, which prints how many used slots will move.
    let out = Command::new(env!("CARGO_BIN_EXE_marmot"))
        .args(["cluster", "rebalance", "--url", &c.nodes[2].url])
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&out.stdout);
    let to_move: u64 = text
        .strip_prefix("rebalance asked for: ")
        .and_then(|t| t.split_whitespace().next())
        .and_then(|n| n.parse().ok())
        .unwrap_or_else(|| panic!("{text} {}", String::from_utf8_lossy(&out.stderr)));
    assert!(out.status.success() && to_move > 0, "{text}");
    // Done when the controller forgets the request (once this node's view
    // has it: the watch brings it).
    let deadline = Instant::now() + Duration::from_secs(60);
    let mut seen_asked = false;
    let status = loop {
        let s = c.api(0).get("/v1/cluster").await.json;
        seen_asked |= !s["rebalance"].is_null() || used_by(&s, "n2").is_some_and(|n| n > 0);
        if seen_asked && s["rebalance"].is_null() && s["slots_degraded"] == 0 {
            break s;
        }
        assert!(Instant::now() < deadline, "rebalance never ended: {s:#}");
        tokio::time::sleep(Duration::from_millis(100)).await;
    };
    let took = started.elapsed();
    tokio::time::sleep(Duration::from_millis(300)).await;
    writers.stop().await;
    assert!(used_by(&status, "n2").unwrap() > 0, "{status:#}");
    // The old backup stays until the new one has caught up: no record of a
    // used slot was ever written without a backup. The control: the watch
    // saw the moves (each moved slot's record is written).
    let writes = slot_writes.writes();
    let written: std::collections::BTreeSet<&str> =
        writes.iter().map(|(k, _)| k.as_str()).collect();
    assert!(
        written.len() as u64 >= to_move,
        "the watch saw {} slots written, the rebalance moved {to_move}",
        written.len()
    );
    for (key, record) in &writes {
        assert!(
            !(record["used"] == true && record["backup"].is_null()),
            "{key} ran without a backup during the rebalance: {record}"
        );
    }
    let handoffs: f64 = {
        let mut n = 0.0;
        for i in 0..3 {
            let text = String::from_utf8_lossy(&c.api(i).get("/metrics").await.body).into_owned();
            n += common::metric(&text, "marmot_cluster_handoffs_total");
        }
        n
    };
    assert!(handoffs >= 1.0, "no slot was handed over");
    // Every actor n2 had before is on an eu node, with its data.
    for a in &on_n2 {
        let node = owner_of(&c, 2, a).await;
        assert_ne!(node, "n3", "{a} left its region");
    }
    let total: usize = history.acked().values().map(BTreeSet::len).sum();
    assert!(total > 30, "the load stalled: {total}");
    let summary = history.check(&seen(&c, 1, &actors).await);
    eprintln!("rebalance: {handoffs} handoffs in {took:?} under load; {summary:?}");
}

/// A slot keeps its region when failovers take it to another one, and
/// its backup goes back to its region as soon as a node there is live:
/// eu's slots lose their eu backup while n1 restarts (n3, in us, is the
/// only other node), and get it back once n1 is up, so n2's death fails
/// them over to n1, in eu. That backup stayed in us until an operator's
/// rebalance, and the failover took them to us (found by a cluster probe).
/// When both eu nodes die they do fail over to us; a rebalance once both
/// are back brings every eu actor home with its data. A slot's region used
/// to be its owner's, so the rebalance found nothing to move and eu's
/// actors stayed in us for good (found by probing a cluster).
#[tokio::test]
async fn slots_that_failovers_took_to_another_region_go_home_on_a_rebalance() {
    let Some(mut c) = Cluster::start().await else {
        return;
    };
    assert_eq!(c.api(0).deploy("kit", TESTKIT, json!({})).await.status, 201);
    let actors: Vec<String> = (0..12).map(|a| format!("home-{a}")).collect();
    for a in &actors {
        assert_eq!(c.api(0).add("kit", a, 1).await.status, 200);
        assert_eq!(region_of(&owner_of(&c, 0, a).await), "eu", "{a}");
    }
    let settled = |s: &Value| {
        s["slots_degraded"] == 0
            && s["members"]
                .as_array()
                .is_some_and(|m| m.iter().filter(|m| m["alive"] == true).count() == 3)
    };
    // n1 dies and comes back: the eu slots are all n2's, backed up in us
    // meanwhile, then in eu again.
    c.nodes[0].kill9();
    for a in &actors {
        assert_eq!(add_when_served(&c, 2, a).await.status, 200, "{a}");
    }
    c.nodes[0].restart().await;
    c.wait_status(settled).await;
    let deadline = Instant::now() + Duration::from_secs(30);
    for a in &actors {
        loop {
            let info = c.api(2).get(&format!("/v1/actors/kit/{a}")).await.json;
            if info["backup"] == "n1" {
                break;
            }
            assert!(Instant::now() < deadline, "{a} kept a backup in us: {info}");
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }
    // n2 dies: they fail over to n1, in their region.
    c.nodes[1].kill9();
    for a in &actors {
        assert_eq!(add_when_served(&c, 2, a).await.status, 200, "{a}");
        assert_eq!(owner_of(&c, 2, a).await, "n1", "{a} left its region");
    }
    // n1 dies too: now they fail over to us.
    c.nodes[0].kill9();
    for a in &actors {
        assert_eq!(add_when_served(&c, 2, a).await.status, 200, "{a}");
    }
    for a in &actors {
        assert_eq!(
            owner_of(&c, 2, a).await,
            "n3",
            "{a} did not fail over to us"
        );
    }
    c.nodes[0].restart().await;
    c.nodes[1].restart().await;
    c.wait_status(settled).await;
    // The rebalance finds them away from home, and moves them back.
    let r = c
        .api(1)
        .post_json("/v1/cluster/rebalance", &json!({}))
        .await;
    let doc = c.api(0).get("/v1/openapi.json").await.json;
    common::documented(&doc, "post", "/v1/cluster/rebalance", &r);
    assert!(
        r.json["slots_to_move"].as_u64().unwrap_or(0) > 0,
        "{}",
        r.json
    );
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        let s = c.api(0).get("/v1/cluster").await.json;
        if s["rebalance"].is_null() && settled(&s) {
            break;
        }
        assert!(Instant::now() < deadline, "rebalance never ended: {s:#}");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    for a in &actors {
        assert_eq!(
            region_of(&owner_of(&c, 2, a).await),
            "eu",
            "{a} stayed in us"
        );
        wait_value(&c, 2, a, "n", 4).await;
    }
}
