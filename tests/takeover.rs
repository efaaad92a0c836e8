//! A node that takes a slot over serves it with every batch it accepted as
//! the slot's backup — also one still committing when its view made it the
//! owner (`cluster/takeover.rs`). Real nodes on etcd; the backup's commit
//! is held with a test-only fault (`MARMOT_FAULT_REPLICA_STALL_FILE`).

mod common;

use std::path::PathBuf;
use std::time::{Duration, Instant};

use common::TESTKIT;
use common::cluster::*;
use serde_json::{Value, json};

#[tokio::test]
async fn a_new_owner_loads_what_it_accepted_as_backup_even_if_still_committing() {
    let Some(mut t) = Takeover::start("").await else {
        return;
    };
    t.fail_over_holding_the_batch().await;
    let api = t.c.api(t.backup);
    let read = tokio::spawn(async move {
        api.op("kit", "alice", json!({"op": "get", "key": "n"}))
            .await
    });
    tokio::time::sleep(Duration::from_millis(1000)).await;
    t.release();

    // The first read loaded the actor after the held batch landed.
    let read = read.await.unwrap();
    assert_eq!(read.status, 200, "{}", read.json);
    assert_eq!(
        read.json["value"], 8,
        "the new owner loaded the actor before the batch it had accepted landed"
    );
    let r = t.c.api(t.backup).add("kit", "alice", 1).await;
    assert_eq!(r.status, 200, "{}", r.json);
    assert_eq!(r.json["value"], 9, "{}", r.json);
}

/// An alarm of an actor whose slot this node has just taken over, falling
/// due while the batch it accepted as the slot's backup is still
/// committing, fires only once that batch has landed: the alarm settles
/// the slot first, as a request does. (Before, an in-node caller loaded the
/// actor at once, from a read without the batch, and its turn wrote over
/// it.)
#[tokio::test]
async fn an_alarm_falling_due_before_the_new_owner_settled_its_slot_waits_for_it() {
    // Every node reads its due index often, so the backup holds the alarm
    // (committed on the owner, shipped to it) long before it falls due.
    let Some(mut t) = Takeover::start("\n[alarms]\nreload_ms = 200\n").await else {
        return;
    };
    // Its turn adds 1 to `n`, reading it first.
    const AFTER_MS: u64 = 4000;
    let set_at = Instant::now();
    let r =
        t.c.api(t.owner)
            .op(
                "kit",
                "alice",
                json!({"op": "alarm_set", "name": "t", "after": AFTER_MS, "payload": {"add": "n"}}),
            )
            .await;
    assert_eq!(r.status, 200, "{}", r.json);
    t.fail_over_holding_the_batch().await;
    // The alarm falls due on the new owner while the batch is still held.
    let due = set_at + Duration::from_millis(AFTER_MS);
    let hold_until = due.max(Instant::now()) + Duration::from_millis(1500);
    tokio::time::sleep_until(hold_until.into()).await;
    t.release();

    // The alarm ran once, on `n = 8`; then a request adds 1 more.
    let api = t.c.api(t.backup);
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let r = api
            .op("kit", "alice", json!({"op": "get", "key": "fired"}))
            .await;
        let fired = r.json["value"].as_array().map_or(0, Vec::len);
        if fired > 0 {
            assert_eq!(fired, 1, "{}", r.json);
            break;
        }
        assert!(
            Instant::now() < deadline,
            "the alarm never fired on the new owner"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let r = api.add("kit", "alice", 1).await;
    assert_eq!(r.status, 200, "{}", r.json);
    assert_eq!(
        r.json["value"], 10,
        "7, the batch the backup accepted (8), the alarm's add (9), this add: {}",
        r.json
    );
}

/// A cluster whose backups hold a batch they accept while `stall` exists,
/// and the actor `kit/alice` at `n = 7` on `owner`, backed up on `backup`
/// (node indexes).
struct Takeover {
    c: Cluster,
    _flags: tempfile::TempDir,
    stall: PathBuf,
    owner: usize,
    backup: usize,
}

impl Takeover {
    /// `config`: more node configuration, after the `[cluster]` table.
    async fn start(config: &str) -> Option<Self> {
        let flags = common::tempdir();
        let stall = flags.path().join("stall");
        let stall_env = stall.to_str().unwrap().to_owned();
        let env = [("MARMOT_FAULT_REPLICA_STALL_FILE", stall_env.as_str())];
        let c = Cluster::start_with(&env, config).await?;
        assert_eq!(c.api(0).deploy("kit", TESTKIT, json!({})).await.status, 201);
        let r = c.api(0).add("kit", "alice", 7).await;
        assert_eq!(r.status, 200, "{}", r.json);
        let info = c.api(0).get("/v1/actors/kit/alice").await.json;
        let index = |node: &Value| {
            let id = node.as_str().expect("a node id");
            NODES.iter().position(|(n, _)| *n == id).unwrap()
        };
        let (owner, backup) = (index(&info["node"]), index(&info["backup"]));
        Some(Self {
            c,
            _flags: flags,
            stall,
            owner,
            backup,
        })
    }

    /// The owner commits `n = 8` and ships it; the backup accepts the
    /// batch and holds it before its commit; the owner dies before it hears
    /// back. Returns once the backup has taken the slot over, the batch
    /// still held.
    async fn fail_over_holding_the_batch(&mut self) {
        let before = slots_used(&self.c, self.backup).await;
        std::fs::write(&self.stall, b"").unwrap();
        let owner_api = self.c.api(self.owner);
        let add = json!({"op": "add", "key": "n", "by": 1});
        let pending = tokio::spawn(async move {
            owner_api
                .try_post_with("/v1/actors/kit/alice", &add, &[])
                .await
        });
        let mut held = self.stall.clone().into_os_string();
        held.push(".held");
        let held = PathBuf::from(held);
        let deadline = Instant::now() + Duration::from_secs(30);
        while !held.exists() {
            assert!(Instant::now() < deadline, "the backup never held the batch");
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        self.c.nodes[self.owner].kill9();
        let _ = pending.await;
        let deadline = Instant::now() + Duration::from_secs(30);
        while slots_used(&self.c, self.backup).await <= before {
            assert!(Instant::now() < deadline, "the backup never took over");
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }

    /// Let the held batch commit.
    fn release(&self) {
        std::fs::remove_file(&self.stall).unwrap();
    }
}

/// The used slots node `i` owns, as it sees them (not an actor's path: no
/// turn, nothing that waits for its writer).
async fn slots_used(c: &Cluster, i: usize) -> u64 {
    let s = c.api(i).get("/v1/cluster").await.json;
    s["members"]
        .as_array()
        .unwrap()
        .iter()
        .find(|m| m["node_id"] == NODES[i].0)
        .and_then(|m| m["slots_used"].as_u64())
        .unwrap_or(0)
}
