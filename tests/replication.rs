//! What a slot's backup keeps, in a cluster of real nodes on etcd: every
//! acknowledged write (also when the backup's disk fails), and what the
//! slot's actors committed to send — outbound webhooks and relayed
//! messages, which the backup sends once it owns the slot. And the checker
//! of the recorded histories the load tests keep.

mod common;

use std::collections::{BTreeMap, BTreeSet};
use std::time::{Duration, Instant};

use common::cluster::*;
use common::{Api, TESTKIT, tempdir};
use serde_json::{Value, json};

/// A backup whose disk is full cannot take the owner's commits: they wait
/// (nothing is released before a backup has them), then the owner drops it
/// and goes on; a third node catches up as the new backup, and when the
/// owner dies that node takes over with every acknowledged write. Needs
/// root (size-limited tmpfs) and etcd; says so and skips without.
#[tokio::test]
async fn a_backup_whose_disk_fails_is_dropped_and_no_acknowledged_write_is_lost() {
    let dir = tempdir();
    let mut disks = Vec::new();
    for (id, _) in NODES {
        match common::disk::SmallDisk::mount(&dir.path().join(id), 256) {
            Some(d) => disks.push(d),
            None => return,
        }
    }
    let Some(mut c) = Cluster::start_in(dir, &[], "").await else {
        return;
    };
    assert_eq!(c.api(0).deploy("kit", TESTKIT, json!({})).await.status, 201);
    assert_eq!(c.api(0).add("kit", "disk", 5).await.status, 200);
    // A file large enough to be a blob: the third node gets it in the
    // snapshot it catches up from (a snapshot's blobs were never sent).
    let big = json!({"op": "file_write", "path": "big.bin", "bytes": 200_000});
    let r = c.api(0).op("kit", "disk", big).await;
    assert_eq!(r.json, json!({"ok": true}));
    let info = c.api(0).get("/v1/actors/kit/disk").await.json;
    let owner = info["node"].as_str().unwrap().to_owned();
    let backup = info["backup"].as_str().expect("a backup").to_owned();
    let (o, b) = (
        NODES.iter().position(|(n, _)| *n == owner).unwrap(),
        NODES.iter().position(|(n, _)| *n == backup).unwrap(),
    );
    let third = 3 - o - b;

    // The backup's disk fills up: the next write waits for it, then the
    // owner drops it and releases the write (durable on its own disk).
    let filler = disks[b].fill();
    let started = Instant::now();
    let r = c.api(o).add("kit", "disk", 1).await;
    let waited = started.elapsed();
    assert_eq!(r.status, 200, "{}", r.json);
    assert_eq!(r.json["value"], 6);
    assert!(
        waited >= Duration::from_secs(2),
        "released after {waited:?}, before the backup was dropped"
    );
    // The third node catches up and becomes the backup.
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let info = c.api(o).get("/v1/actors/kit/disk").await.json;
        if info["backup"] == NODES[third].0 {
            break;
        }
        assert!(Instant::now() < deadline, "no new backup: {info}");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    for _ in 0..5 {
        assert_eq!(c.api(o).add("kit", "disk", 1).await.status, 200);
    }
    std::fs::remove_file(filler).unwrap();

    // The owner dies: its new backup serves every acknowledged write.
    c.nodes[o].kill9();
    let r = add_when_served(&c, third, "disk").await;
    assert_eq!(r.status, 200, "{}", r.json);
    assert_eq!(r.json["value"], 12, "{}", r.json);
    let read = json!({"op": "file_read", "path": "big.bin"});
    let r = c.api(third).op("kit", "disk", read).await;
    assert_eq!(r.json["size"], 200_000, "{}", r.json);
    let r = c.api(third).get("/v1/actors/kit/disk/files/big.bin").await;
    assert_eq!((r.status, r.body.len()), (200, 200_000));
    drop(c);
}

/// The checker itself: a lost write, a doubled one, one never invoked and
/// two committers in one (slot, epoch) are each reported.
#[test]
fn the_history_checker_finds_what_it_must() {
    use common::history::{History, Line};
    let ok = |id: &str, node: &str, epoch: u64| Line::Ok {
        actor: "a".into(),
        id: id.into(),
        node: node.into(),
        slot: 7,
        epoch,
    };
    let history = |lines: Vec<Line>| {
        let h = History::default();
        for l in lines {
            if let Line::Invoke { actor, id } = &l {
                h.invoke(actor, id);
            } else {
                h.push_line(l);
            }
        }
        h
    };
    let invoke = |id: &str| Line::Invoke {
        actor: "a".into(),
        id: id.into(),
    };
    let state = |pairs: &[(&str, i64)]| {
        BTreeMap::from([(
            "a".to_owned(),
            pairs.iter().map(|(k, v)| ((*k).to_owned(), *v)).collect(),
        )])
    };
    let fine = history(vec![
        invoke("x"),
        ok("x", "n1", 1),
        invoke("y"),
        ok("y", "n2", 2),
    ]);
    assert_eq!(fine.check(&state(&[("x", 1), ("y", 1)])).ok, 2);
    let fails = |h: History, s: BTreeMap<String, BTreeMap<String, i64>>, what: &str| {
        let err =
            std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| h.check(&s))).expect_err(what);
        let msg = err.downcast_ref::<String>().cloned().unwrap_or_default();
        assert!(msg.contains(what), "{msg}");
    };
    fails(
        history(vec![invoke("x"), ok("x", "n1", 1)]),
        state(&[]),
        "lost",
    );
    fails(
        history(vec![invoke("x"), ok("x", "n1", 1)]),
        state(&[("x", 2)]),
        "applied 2 times",
    );
    fails(history(vec![]), state(&[("z", 1)]), "never invoked");
    fails(
        history(vec![
            invoke("x"),
            ok("x", "n1", 1),
            invoke("y"),
            ok("y", "n2", 1),
        ]),
        state(&[("x", 1), ("y", 1)]),
        "committed by",
    );
}

/// Outbound webhooks in a cluster: the rows an actor's turns commit, and
/// each attempt's outcome, are replicated to its slot's backup; only the
/// slot's owner delivers; after kill -9 of the owner, its backup delivers
/// what was left, with the same `webhook-id`s and no new rows.
#[tokio::test]
async fn outbound_webhooks_are_sent_by_the_slots_owner_and_after_a_failover_by_the_new_one() {
    let Some(mut c) = Cluster::start_with(
        &[("MARMOT_WEBHOOK_RETRY_BASE_MS", "100")],
        "[webhooks]\nretry_max_delay_ms = 400",
    )
    .await
    else {
        return;
    };
    assert_eq!(c.api(0).deploy("kit", TESTKIT, json!({})).await.status, 201);
    // The receiver is down (503): every delivery stays pending, retried.
    let hooks = HookReceiver::start(503).await;
    let r = put(
        &c.api(0),
        "/v1/subscriptions/audit".into(),
        json!({"url": hooks.url}),
    )
    .await;
    assert_eq!(r.status, 201, "{}", r.json);
    assert_eq!(c.api(1).add("kit", "hooked", 0).await.status, 200);
    let info = c.api(0).get("/v1/actors/kit/hooked").await.json;
    let index = |n: &str| NODES.iter().position(|(id, _)| *id == n).unwrap();
    let o = index(info["node"].as_str().unwrap());
    let b = index(info["backup"].as_str().expect("a backup"));
    let third = 3 - o - b;
    for n in 0..10 {
        let r = c
            .api(n)
            .op(
                "kit",
                "hooked",
                json!({"op": "emit", "kind": "order.paid", "data": {"n": n}}),
            )
            .await;
        assert_eq!(r.status, 200, "{}", r.json);
    }
    // Each of the 10 rows attempted (and failed) at least twice, by the
    // owner only.
    let deadline = Instant::now() + Duration::from_secs(20);
    let ids: BTreeSet<String> = loop {
        let got = hooks.got();
        let ids: BTreeSet<String> = got.iter().map(|(id, _)| id.clone()).collect();
        if ids.len() == 10 && got.len() >= 20 {
            break ids;
        }
        assert!(Instant::now() < deadline, "attempts: {got:?}");
        tokio::time::sleep(Duration::from_millis(50)).await;
    };
    let attempts = |api: Api| async move {
        let text = String::from_utf8_lossy(&api.get("/metrics").await.body).into_owned();
        text.lines()
            .filter(|l| l.starts_with("marmot_webhook_deliveries_total{"))
            .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
            .sum::<f64>()
    };
    assert!(attempts(c.api(o)).await >= 20.0);
    assert_eq!(attempts(c.api(b)).await, 0.0, "the backup sent a delivery");
    assert_eq!(
        attempts(c.api(third)).await,
        0.0,
        "another node sent a delivery"
    );
    // The backup keeps each row, and what became of it.
    let listed = c.api(b).get("/v1/deliveries").await.json;
    let on_backup: BTreeSet<String> = listed["deliveries"]
        .as_array()
        .unwrap()
        .iter()
        .map(|d| d["id"].as_str().unwrap().to_owned())
        .collect();
    assert_eq!(on_backup, ids, "{listed:#}");

    // The owner dies; the receiver comes back. The new owner delivers
    // every row, under the same ids.
    c.nodes[o].kill9();
    hooks.status.store(200, std::sync::atomic::Ordering::SeqCst);
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let delivered: BTreeSet<String> = hooks
            .got()
            .into_iter()
            .filter(|(_, status)| *status == 200)
            .map(|(id, _)| id)
            .collect();
        if delivered == ids {
            break;
        }
        assert!(
            delivered.is_subset(&ids),
            "a delivery under a new id: {delivered:?}"
        );
        assert!(
            Instant::now() < deadline,
            "delivered after failover: {} of 10",
            delivered.len()
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    // Delivered rows are gone on the new owner; nothing is sent again.
    tokio::time::sleep(Duration::from_millis(800)).await;
    let after = hooks.got().len();
    tokio::time::sleep(Duration::from_millis(800)).await;
    assert_eq!(hooks.got().len(), after, "deliveries go on after success");
    let listed = c.api(b).get("/v1/deliveries").await.json;
    assert_eq!(listed["deliveries"], json!([]), "{listed:#}");
    assert_eq!(
        attempts(c.api(third)).await,
        0.0,
        "a node that is neither sent"
    );
}

/// Relayed sends in a cluster: the relay rows a sending turn commits are
/// replicated to the sender's slot's backup. The recipient's owner dies,
/// so the sends wait; then the sender's owner dies too: the node that was
/// the backup of both hands every message over, each once.
#[tokio::test]
async fn sends_waiting_in_a_dead_owners_relay_are_handed_over_by_its_backup() {
    let Some(mut c) = Cluster::start().await else {
        return;
    };
    assert_eq!(c.api(0).deploy("kit", TESTKIT, json!({})).await.status, 201);
    // A sender and a recipient with different owners and the same backup.
    let index = |n: &Value| NODES.iter().position(|(id, _)| *id == n).unwrap();
    let mut seen: BTreeMap<usize, (usize, String)> = BTreeMap::new();
    let mut pair = None;
    for i in 0..200 {
        let id = format!("relay-{i}");
        // Through every node: actors in both regions (a backup is in its
        // owner's region when it can be).
        assert_eq!(c.api(i).add("kit", &id, 0).await.status, 200);
        let info = c.api(0).get(&format!("/v1/actors/kit/{id}")).await.json;
        let (owner, backup) = (index(&info["node"]), index(&info["backup"]));
        match seen.get(&backup) {
            Some((o, other)) if *o != owner => {
                pair = Some(((other.clone(), *o), (id, owner), backup));
                break;
            }
            _ => {
                seen.insert(backup, (owner, id));
            }
        }
    }
    let ((sender, a), (recipient, r), b) = pair.expect("two actors sharing a backup");
    let send = json!({"op": "send", "ty": "kit", "id": recipient,
                      "body": {"op": "add", "key": "s", "by": 1}});
    c.nodes[r].kill9();
    for _ in 0..3 {
        let res = c.api(b).op("kit", &sender, send.clone()).await;
        assert_eq!(res.status, 200, "{}", res.json);
    }
    c.nodes[a].kill9();
    // Both slots fail over to `b`, which hands the three messages over.
    wait_value(&c, b, &recipient, "s", 3).await;
    tokio::time::sleep(Duration::from_secs(1)).await;
    wait_value(&c, b, &recipient, "s", 3).await;
}

/// When a backup dies, its owner drops it from every slot it backed at
/// once: writes to the owner's other slots wait for the first drop (3 s)
/// and no more. Each slot used to be dropped only when a write of its own
/// had waited 3 s, so one node's death stopped every owner's writes in
/// waves, 12–18 s in all (a probe).
#[tokio::test]
async fn a_dead_backup_is_dropped_from_all_its_slots_at_once() {
    let Some(mut c) = Cluster::start().await else {
        return;
    };
    assert_eq!(c.api(0).deploy("kit", TESTKIT, json!({})).await.status, 201);
    // Actors of node 0 whose slots node 1 backs (of 1,024 slots, four
    // actors' are all but surely different).
    let mut picked: Vec<String> = Vec::new();
    for i in 0..400 {
        let id = format!("w{i}");
        assert_eq!(c.api(0).add("kit", &id, 1).await.status, 200);
        let info = c.api(0).get(&format!("/v1/actors/kit/{id}")).await.json;
        if info["node"] == NODES[0].0 && info["backup"] == NODES[1].0 {
            picked.push(id);
            if picked.len() == 4 {
                break;
            }
        }
    }
    assert_eq!(picked.len(), 4, "too few actors of node 0 backed by node 1");
    c.nodes[1].kill9();
    // The first write waits for the dead backup, then it is dropped...
    let r = c.api(0).add("kit", &picked[0], 1).await;
    assert_eq!(r.status, 200, "{}", r.json);
    // ...from the other slots too: theirs are answered at once.
    for id in &picked[1..] {
        let started = Instant::now();
        let r = c.api(0).add("kit", id, 1).await;
        assert_eq!(r.status, 200, "{}", r.json);
        assert!(
            started.elapsed() < Duration::from_millis(1500),
            "{id} waited {:?} for the dead backup",
            started.elapsed()
        );
        let info = c.api(0).get(&format!("/v1/actors/kit/{id}")).await.json;
        assert_ne!(info["backup"], NODES[1].0, "{info}");
    }
}
