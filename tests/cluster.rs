//! A cluster of real nodes on one real etcd (Debian's `etcd-server`, which
//! `scripts/test` installs; without it these tests say so and skip).
//!
//! Any node serves any actor: requests are forwarded to the owner of the
//! actor's slot, so every actor lives on exactly one node whichever node is
//! asked. A dead owner's actors are unavailable (503), never served from
//! empty state elsewhere, and come back with the owner and their data.

mod common;

use std::collections::{BTreeMap, BTreeSet};
use std::net::TcpStream;
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use common::{Api, Marmot, TESTKIT, free_port, metric, tempdir};
use serde_json::{Value, json};

/// A single-member etcd on loopback ports, with its own data directory.
struct Etcd {
    child: Child,
    url: String,
    dir: std::path::PathBuf,
    ports: (u16, u16),
}

impl Etcd {
    fn start(dir: &Path) -> Option<Self> {
        if Command::new("etcd").arg("--version").output().is_err() {
            eprintln!(
                "SKIPPED: etcd is not installed (scripts/test installs Debian's etcd-server)"
            );
            return None;
        }
        Some(Self::spawn(dir, (free_port(), free_port())))
    }

    /// Start again on the same data and ports (after [`Self::kill9`]).
    fn restart(&mut self) {
        self.kill9();
        let (dir, ports) = (self.dir.clone(), self.ports);
        *self = Self::spawn(&dir, ports);
    }

    fn kill9(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }

    fn spawn(dir: &Path, (client, peer): (u16, u16)) -> Self {
        let url = format!("http://127.0.0.1:{client}");
        let peer_url = format!("http://127.0.0.1:{peer}");
        let log = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(dir.join("etcd.log"))
            .unwrap();
        let child = Command::new("etcd")
            .arg("--name=test")
            .arg(format!("--data-dir={}", dir.join("etcd").display()))
            .arg(format!("--listen-client-urls={url}"))
            .arg(format!("--advertise-client-urls={url}"))
            .arg(format!("--listen-peer-urls={peer_url}"))
            .arg(format!("--initial-advertise-peer-urls={peer_url}"))
            .arg(format!("--initial-cluster=test={peer_url}"))
            .stdout(Stdio::null())
            .stderr(log)
            .spawn()
            .expect("start etcd");
        let deadline = Instant::now() + Duration::from_secs(20);
        while TcpStream::connect(("127.0.0.1", client)).is_err() {
            assert!(Instant::now() < deadline, "etcd did not start");
            std::thread::sleep(Duration::from_millis(50));
        }
        Self {
            child,
            url,
            dir: dir.to_owned(),
            ports: (client, peer),
        }
    }
}

impl Drop for Etcd {
    fn drop(&mut self) {
        self.kill9();
    }
}

/// Three nodes (two regions) on one etcd.
struct Cluster {
    _dir: tempfile::TempDir,
    etcd: Etcd,
    nodes: Vec<Marmot>,
}

const NODES: [(&str, &str); 3] = [("n1", "eu"), ("n2", "eu"), ("n3", "us")];

/// The master key every node of the test cluster shares (a cluster's nodes
/// must: secrets are sealed under it).
const MASTER_KEY: (&str, &str) = (
    "MARMOT_MASTER_KEY",
    "C9Mh/JqnrwNn9Q8IXpMutKmk/pY/hA+w2GZaccRpfFk=",
);

impl Cluster {
    async fn start() -> Option<Self> {
        Self::start_with(&[], "").await
    }

    /// Start with extra environment variables and `[cluster]` settings for
    /// every node.
    async fn start_with(env: &[(&str, &str)], cluster: &str) -> Option<Self> {
        Self::start_in(tempdir(), env, cluster).await
    }

    /// [`Self::start_with`], the nodes' data in `dir/{node_id}`.
    async fn start_in(dir: tempfile::TempDir, env: &[(&str, &str)], cluster: &str) -> Option<Self> {
        let etcd = Etcd::start(dir.path())?;
        let mut nodes = Vec::new();
        for (id, region) in NODES {
            let port = free_port();
            let config = format!(
                "[cluster]\nnode_id = \"{id}\"\nregion = \"{region}\"\n\
                 advertise = \"http://127.0.0.1:{port}\"\netcd = [\"{}\"]\nlease_ttl_s = 2\n{cluster}\n",
                etcd.url
            );
            nodes.push(Marmot::spawn_on(
                port,
                &dir.path().join(id),
                &[&[MASTER_KEY], env].concat(),
                Some(&config),
            ));
        }
        for n in &mut nodes {
            n.wait_ready().await;
        }
        let c = Self {
            _dir: dir,
            etcd,
            nodes,
        };
        // Every node sees every member with a share of the slots.
        c.wait_status(|s| {
            s["slots_assigned"] == 1024
                && s["members"].as_array().is_some_and(|m| {
                    m.len() == 3 && m.iter().all(|m| m["slots"].as_u64().unwrap_or(0) > 200)
                })
        })
        .await;
        Some(c)
    }

    fn api(&self, i: usize) -> Api {
        self.nodes[i % self.nodes.len()].client()
    }

    /// Wait until every running node's `/v1/cluster` satisfies `f`.
    async fn wait_status(&self, f: impl Fn(&Value) -> bool) -> Value {
        let deadline = Instant::now() + Duration::from_secs(30);
        loop {
            let mut last = Value::Null;
            let mut all = true;
            for n in self.nodes.iter().filter(|n| n.pid().is_some()) {
                last = n.client().get("/v1/cluster").await.json;
                all &= f(&last);
            }
            if all {
                return last;
            }
            assert!(
                Instant::now() < deadline,
                "cluster status never matched: {last:#}"
            );
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }
}

#[tokio::test]
async fn any_node_serves_any_actor_and_each_actor_lives_on_one_node() {
    let Some(c) = Cluster::start().await else {
        return;
    };
    // A deploy on one node reaches every node.
    let r = c.api(0).deploy("kit", TESTKIT, json!({})).await;
    assert_eq!(r.status, 201, "{}", r.json);
    for i in 0..3 {
        assert_eq!(c.api(i).get("/v1/types/kit").await.status, 200, "node {i}");
    }

    // 30 actors, each written through every node in turn.
    let mut owners = BTreeMap::<String, BTreeSet<String>>::new();
    for a in 0..30 {
        let id = format!("user-{a}");
        for round in 0..3 {
            let r = c.api(a + round).add("kit", &id, 1).await;
            assert_eq!(
                r.status,
                200,
                "{id} via node {}: {}",
                (a + round) % 3,
                r.json
            );
            assert_eq!(
                r.json["value"],
                round as i64 + 1,
                "{id}: one actor, one state"
            );
        }
        for i in 0..3 {
            let info = c.api(i).get(&format!("/v1/actors/kit/{id}")).await;
            assert_eq!(info.status, 200, "{}", info.json);
            assert_eq!(info.json["turns"], 3, "{}", info.json);
            let node = info.json["node"].as_str().unwrap().to_owned();
            assert!(info.json["epoch"].as_u64().unwrap() >= 1);
            owners.entry(id.clone()).or_default().insert(node);
        }
    }
    assert!(
        owners.values().all(|n| n.len() == 1),
        "an actor answered from two nodes: {owners:?}"
    );
    let spread: BTreeSet<_> = owners.values().flatten().collect();
    assert_eq!(spread.len(), 3, "30 actors should land on all 3 nodes");

    // Listing from any node covers every node, page by page.
    let mut listed = Vec::new();
    let mut cursor: Option<String> = None;
    loop {
        let mut path = "/v1/actors/kit?prefix=user-&limit=7".to_owned();
        if let Some(c) = &cursor {
            path.push_str(&format!("&cursor={c}"));
        }
        let page = c.api(listed.len()).get(&path).await.json;
        let ids: Vec<String> = page["actors"]
            .as_array()
            .unwrap()
            .iter()
            .map(|a| a["id"].as_str().unwrap().to_owned())
            .collect();
        assert!(ids.len() <= 7);
        listed.extend(ids);
        match page["next_cursor"].as_str() {
            Some(next) => cursor = Some(next.to_owned()),
            None => break,
        }
    }
    let mut expected: Vec<String> = owners.keys().cloned().collect();
    expected.sort();
    assert_eq!(listed, expected, "every actor listed once, in order");

    // An idempotency key holds across nodes: the owner has the record.
    let key = [("idempotency-key", "k-1")];
    let first = c
        .api(0)
        .post_with(
            "/v1/actors/kit/idem",
            &json!({"op": "add", "key": "n", "by": 5}),
            &key,
        )
        .await;
    let again = c
        .api(1)
        .post_with(
            "/v1/actors/kit/idem",
            &json!({"op": "add", "key": "n", "by": 5}),
            &key,
        )
        .await;
    assert_eq!(first.json["value"], 5);
    assert_eq!(again.json["value"], 5, "ran twice");
    assert_eq!(again.headers["idempotent-replayed"], "true");

    // Events from any node, also as a live stream.
    let r = c
        .api(2)
        .op(
            "kit",
            "user-1",
            json!({"op": "emit", "kind": "hello", "data": {"x": 1}}),
        )
        .await;
    assert_eq!(r.status, 200, "{}", r.json);
    for i in 0..3 {
        let page = c.api(i).get("/v1/actors/kit/user-1/events").await;
        assert_eq!(page.status, 200);
        assert!(
            page.json["events"]
                .as_array()
                .unwrap()
                .iter()
                .any(|e| e["kind"] == "hello")
        );
    }
    let mut sse = c
        .api(1)
        .sse("/v1/actors/kit/user-1/events", Some("0"))
        .await;
    let frame = sse
        .next_event(Duration::from_secs(5))
        .await
        .expect("an SSE frame via a forwarding node");
    assert!(
        frame.data.is_some_and(|d| d.contains("hello")),
        "the event came through"
    );

    // Forwards are counted; the status and the CLI agree.
    let mut forwarded = 0.0;
    for i in 0..3 {
        let text = String::from_utf8_lossy(&c.api(i).get("/metrics").await.body).into_owned();
        forwarded += text
            .lines()
            .filter(|l| l.starts_with("marmot_cluster_forwards_total{outcome=\"ok\"}"))
            .filter_map(|l| l.split_whitespace().last()?.parse::<f64>().ok())
            .sum::<f64>();
    }
    assert!(forwarded >= 60.0, "forwards: {forwarded}");
    let out = Command::new(env!("CARGO_BIN_EXE_marmot"))
        .args(["cluster", "status", "--url", &c.nodes[0].url])
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "{text}");
    for (id, region) in NODES {
        assert!(
            text.lines()
                .any(|l| l.starts_with(id) && l.contains(region)),
            "{text}"
        );
    }
}

/// `PUT path` with a JSON body.
async fn put(api: &Api, path: String, body: Value) -> common::Resp {
    let bytes = serde_json::to_vec(&body).unwrap();
    api.req(
        reqwest::Method::PUT,
        &path,
        Some(("application/json", bytes)),
        &[],
    )
    .await
}

/// Add 1 to `id`'s `n` through node `i`, retrying while nobody serves it
/// (a failover under way) for up to 30 s: the first 200, or the last
/// answer.
async fn add_when_served(c: &Cluster, i: usize, id: &str) -> common::Resp {
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let r = c.api(i).add("kit", id, 1).await;
        if r.status == 200 || Instant::now() > deadline {
            return r;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// Poll `id`'s state key `key` through node `i` until it is `want`.
async fn wait_value(c: &Cluster, i: usize, id: &str, key: &str, want: i64) {
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let r = c
            .api(i)
            .op("kit", id, json!({"op": "get", "key": key}))
            .await;
        if r.status == 200 && r.json["value"] == want {
            return;
        }
        assert!(
            Instant::now() < deadline,
            "{id}/{key} never became {want}: {} {}",
            r.status,
            r.json
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// Turns reach actors of other nodes: `actors.call` runs the callee on its
/// owner (one activation, one state), a cycle through two nodes is refused,
/// and `actors.send` goes through the sender's relay — exactly once, also
/// when the recipient's owner is down for a while.
#[tokio::test]
async fn actors_on_different_nodes_call_and_send_to_each_other() {
    let Some(mut c) = Cluster::start().await else {
        return;
    };
    assert_eq!(c.api(0).deploy("kit", TESTKIT, json!({})).await.status, 201);
    // Two actors with different owners.
    let mut by_node = BTreeMap::<String, String>::new();
    for a in 0..40 {
        let id = format!("peer-{a}");
        assert_eq!(c.api(0).add("kit", &id, 0).await.status, 200);
        let info = c.api(0).get(&format!("/v1/actors/kit/{id}")).await.json;
        by_node
            .entry(info["node"].as_str().unwrap().to_owned())
            .or_insert(id);
        if by_node.len() == 2 {
            break;
        }
    }
    let mut pair = by_node.into_iter();
    let (caller_node, caller) = pair.next().expect("an actor");
    let (callee_node, callee) = pair.next().expect("actors on two nodes");
    let index = |n: &str| NODES.iter().position(|(id, _)| *id == n).unwrap();
    let (ci, di) = (index(&caller_node), index(&callee_node));

    // Calls, through every node: the callee's one state, on its owner.
    for i in 0..3 {
        let r = c
            .api(i)
            .op(
                "kit",
                &caller,
                json!({"op": "call", "ty": "kit", "id": callee, "body": {"op": "add", "key": "n", "by": 1}}),
            )
            .await;
        assert_eq!(r.status, 200, "{}", r.json);
        assert_eq!(r.json["status"], 200, "{}", r.json);
        assert_eq!(r.json["body"]["value"], i as i64 + 1, "{}", r.json);
    }
    // Not a second activation on the caller's node: a direct write sees
    // the calls' state.
    let r = c.api(ci).add("kit", &callee, 1).await;
    assert_eq!(r.json["value"], 4, "{}", r.json);
    // A cycle through two nodes is refused (not a deadlock).
    let r = c
        .api(ci)
        .op(
            "kit",
            &caller,
            json!({"op": "call", "ty": "kit", "id": callee,
                   "body": {"op": "call", "ty": "kit", "id": caller, "body": {"op": "get", "key": "n"}}}),
        )
        .await;
    assert_eq!(r.status, 200, "{}", r.json);
    // The callee's call back was refused: it answered 502 with why.
    assert_eq!(r.json["status"], 502, "{}", r.json);
    assert!(
        r.json["body"]["error"]
            .as_str()
            .is_some_and(|e| e.contains("cycle")),
        "{}",
        r.json
    );
    // A call to a type nobody deployed is `not-found`, as on one node.
    let r = c
        .api(ci)
        .op(
            "kit",
            &caller,
            json!({"op": "call", "ty": "nope", "id": "x", "body": {}}),
        )
        .await;
    assert_eq!(r.status, 502, "{}", r.json);

    // Sends: committed with the sending turn, handed over by its node.
    let send = |fail: bool| {
        json!({"op": "send", "ty": "kit", "id": callee, "fail": fail,
               "body": {"op": "add", "key": "s", "by": 1}})
    };
    for i in 0..5 {
        let r = c.api(i).op("kit", &caller, send(false)).await;
        assert_eq!(r.status, 200, "{}", r.json);
    }
    let r = c.api(ci).op("kit", &caller, send(true)).await;
    assert!(r.status >= 400, "a failed turn sends nothing: {}", r.json);
    wait_value(&c, di, &callee, "s", 5).await;

    // The recipient's owner dies: sends wait in the relay and arrive once
    // it is back, each once.
    c.nodes[di].kill9();
    for _ in 0..3 {
        let r = c.api(ci).op("kit", &caller, send(false)).await;
        assert_eq!(r.status, 200, "{}", r.json);
    }
    // (It can only rejoin once its old lease is gone.)
    c.wait_status(|s| {
        s["members"].as_array().is_some_and(|m| {
            m.iter()
                .any(|m| m["node_id"] == callee_node.as_str() && m["alive"] == false)
        })
    })
    .await;
    c.nodes[di].restart().await;
    wait_value(&c, ci, &callee, "s", 8).await;
    tokio::time::sleep(Duration::from_millis(500)).await;
    wait_value(&c, ci, &callee, "s", 8).await;
    let text = String::from_utf8_lossy(&c.api(ci).get("/metrics").await.body).into_owned();
    assert!(
        metric(&text, "marmot_cluster_relayed_total") >= 8.0,
        "{}",
        text.lines()
            .filter(|l| l.contains("relayed"))
            .collect::<Vec<_>>()
            .join("\n")
    );
}

#[tokio::test]
async fn a_dead_owners_actors_fail_over_to_its_backup_with_their_data() {
    let Some(mut c) = Cluster::start().await else {
        return;
    };
    assert_eq!(c.api(0).deploy("kit", TESTKIT, json!({})).await.status, 201);
    // An actor and its owner.
    let r = c.api(0).add("kit", "alice", 7).await;
    assert_eq!(r.status, 200, "{}", r.json);
    let info = c.api(0).get("/v1/actors/kit/alice").await.json;
    let owner = info["node"].as_str().unwrap().to_owned();
    let epoch = info["epoch"].as_u64().unwrap();
    let o = NODES.iter().position(|(id, _)| *id == owner).unwrap();
    let other = (o + 1) % 3;
    let secret = |v: &str| json!({"value": v, "hosts": ["api.example.com"]});
    for name in ["OLD", "KEPT"] {
        let r = put(&c.api(0), format!("/v1/secrets/{name}"), secret("v1")).await;
        assert_eq!(r.status, 201, "{}", r.json);
    }

    let backup = info["backup"].as_str().expect("a backup").to_owned();
    assert_ne!(backup, owner);
    let b = NODES.iter().position(|(id, _)| *id == backup).unwrap();

    // The owner dies. Once its lease is gone (2 s) and the grace (2 s) is
    // over, its backup owns the slot at the next epoch, with every write
    // the owner acknowledged.
    let killed = Instant::now();
    c.nodes[o].kill9();
    let r = add_when_served(&c, b, "alice").await;
    let failover = killed.elapsed();
    assert_eq!(r.status, 200, "{}", r.json);
    assert_eq!(r.json["value"], 8, "the backup took over with the state");
    eprintln!("failover: served again {failover:?} after kill -9");
    let info = c.api(other).get("/v1/actors/kit/alice").await.json;
    assert_eq!(info["node"], backup.as_str(), "{info}");
    assert_eq!(info["epoch"].as_u64().unwrap(), epoch + 1, "{info}");
    let status = c.api(other).get("/v1/cluster").await.json;
    assert!(status["max_epoch"].as_u64().unwrap() > epoch, "{status:#}");
    // A type deployed while it is away reaches the live nodes only...
    let js =
        json!({"kind": "js", "code": "export default { onMessage() { return { late: true }; } };"});
    let r = c
        .api(other)
        .req(
            reqwest::Method::PUT,
            "/v1/types/late",
            Some(("application/json", serde_json::to_vec(&js).unwrap())),
            &[],
        )
        .await;
    assert_eq!(r.status, 201, "{}", r.json);
    // ... and so do secrets, providers and subscriptions set or deleted.
    assert_eq!(
        put(&c.api(other), "/v1/secrets/NEW".into(), secret("v1"))
            .await
            .status,
        201
    );
    assert_eq!(
        put(&c.api(other), "/v1/secrets/KEPT".into(), secret("v2"))
            .await
            .status,
        200
    );
    assert_eq!(c.api(other).delete("/v1/secrets/OLD").await.status, 200);
    let provider = json!({"format": "openai-chat", "base_url": "http://127.0.0.1:9/v1"});
    let r = put(&c.api(other), "/v1/providers/local".into(), provider).await;
    assert_eq!(r.status, 201, "{}", r.json);
    let sub = json!({"url": "http://127.0.0.1:9/hook"});
    let r = put(&c.api(other), "/v1/subscriptions/audit".into(), sub).await;
    assert_eq!(r.status, 201, "{}", r.json);

    // It comes back: same data, same owner, and the catalog it missed.
    c.nodes[o].restart().await;
    assert_eq!(
        c.api(o).get("/v1/types/late").await.status,
        200,
        "catalog not synced"
    );
    let names: Vec<Value> = c.api(o).get("/v1/secrets").await.json["secrets"]
        .as_array()
        .unwrap()
        .iter()
        .map(|s| s["name"].clone())
        .collect();
    assert_eq!(names, [json!("KEPT"), json!("NEW")], "secrets not in step");
    assert_eq!(c.api(o).get("/v1/providers/local").await.status, 200);
    assert_eq!(c.api(o).get("/v1/subscriptions/audit").await.status, 200);
    // Every node holds the same shared state; the subscription's generated
    // signing secret included (each node would sign alike).
    let shared = |i: usize| {
        let api = c.api(i);
        async move {
            let mut s = api.get("/v1/cluster/catalog").await.json["shared"].take();
            // Secrets are sealed per node (own nonce): compare names only.
            for e in s["secrets"].as_array_mut().unwrap() {
                *e = e[0].clone();
            }
            // Each node stamps its own times.
            for kind in ["providers", "subscriptions"] {
                for e in s[kind].as_array_mut().unwrap() {
                    let record = e[1].as_object_mut().unwrap();
                    record.retain(|k, _| !k.ends_with("_at_ms"));
                }
            }
            s
        }
    };
    let first = shared(0).await;
    assert_eq!(first["subscriptions"].as_array().unwrap().len(), 1);
    for i in 1..3 {
        assert_eq!(shared(i).await, first, "node {i}'s shared state differs");
    }
    // The old owner's copy (7) is never served again: through it, the
    // request goes to the new owner.
    let r = c.api(o).add("kit", "alice", 1).await;
    assert_eq!(r.status, 200, "{}", r.json);
    assert_eq!(r.json["value"], 9, "{}", r.json);
    let info = c.api(o).get("/v1/actors/kit/alice").await.json;
    assert_eq!(info["node"], backup.as_str(), "{info}");

    // The slot gets a new backup: a live node catches up from a snapshot.
    let deadline = Instant::now() + Duration::from_secs(30);
    let second = loop {
        let info = c.api(b).get("/v1/actors/kit/alice").await.json;
        if let Some(n) = info["backup"].as_str() {
            break n.to_owned();
        }
        assert!(Instant::now() < deadline, "no new backup: {info}");
        tokio::time::sleep(Duration::from_millis(100)).await;
    };
    assert_ne!(second, backup);
    // And it has everything: the new owner dies too, the new backup takes
    // over with the state.
    let s = NODES.iter().position(|(id, _)| *id == second).unwrap();
    c.nodes[b].kill9();
    let r = add_when_served(&c, s, "alice").await;
    assert_eq!(r.status, 200, "{}", r.json);
    assert_eq!(
        r.json["value"], 10,
        "the caught-up backup took over with the state"
    );
    let info = c.api(s).get("/v1/actors/kit/alice").await.json;
    assert_eq!(info["node"], second.as_str(), "{info}");
}

/// A node paused longer than its lease (SIGSTOP) wakes up fenced: a request
/// that reached it while it was paused is refused, not served on stale
/// ownership; it serves again once etcd has confirmed a new lease.
#[tokio::test]
async fn an_owner_paused_past_its_lease_serves_nothing_until_it_rejoins() {
    let Some(c) = Cluster::start().await else {
        return;
    };
    assert_eq!(c.api(0).deploy("kit", TESTKIT, json!({})).await.status, 201);
    let r = c.api(0).add("kit", "bob", 1).await;
    assert_eq!(r.status, 200, "{}", r.json);
    let owner = c.api(0).get("/v1/actors/kit/bob").await.json["node"]
        .as_str()
        .unwrap()
        .to_owned();
    let o = NODES.iter().position(|(id, _)| *id == owner).unwrap();
    let pid = c.nodes[o].pid().unwrap().to_string();
    assert!(
        Command::new("kill")
            .args(["-STOP", &pid])
            .status()
            .unwrap()
            .success()
    );
    // A request straight to the paused owner waits in its accept queue.
    let direct = c.api(o);
    let queued = tokio::spawn(async move { direct.add("kit", "bob", 100).await });
    // Past the lease (2 s) the others see it gone and refuse its actors.
    tokio::time::sleep(Duration::from_millis(3_500)).await;
    let r = c.api(o + 1).add("kit", "bob", 1000).await;
    assert_eq!(r.status, 503, "{}", r.json);
    assert!(
        Command::new("kill")
            .args(["-CONT", &pid])
            .status()
            .unwrap()
            .success()
    );
    let r = queued.await.unwrap();
    assert_eq!(
        r.status, 503,
        "served on a lease that had expired: {}",
        r.json
    );
    assert_eq!(r.code(), "slot_unavailable", "{}", r.json);
    // Once it has joined again it serves, and nothing of the refused
    // requests was applied.
    let deadline = Instant::now() + Duration::from_secs(20);
    let r = loop {
        let r = c.api(o + 2).add("kit", "bob", 1).await;
        if r.status == 200 || Instant::now() > deadline {
            break r;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    };
    assert_eq!(r.status, 200, "{}", r.json);
    assert_eq!(r.json["value"], 2, "a refused request was applied");
}

/// Without etcd no node can prove its lease, so every node stops serving
/// (and says why on `/readyz`) rather than risk two owners; when etcd comes
/// back they rejoin and serve again, data intact.
#[tokio::test]
async fn when_etcd_dies_every_node_stops_serving_and_resumes_when_it_returns() {
    let Some(mut c) = Cluster::start().await else {
        return;
    };
    assert_eq!(c.api(0).deploy("kit", TESTKIT, json!({})).await.status, 201);
    for a in 0..6 {
        let r = c.api(a).add("kit", &format!("e{a}"), 1).await;
        assert_eq!(r.status, 200, "{}", r.json);
    }
    c.etcd.kill9();
    // Past the lease (2 s, minus the margin): fenced everywhere.
    tokio::time::sleep(Duration::from_millis(2_500)).await;
    for i in 0..3 {
        let ready = c.api(i).get("/readyz").await;
        assert_eq!(ready.status, 503, "node {i}: {}", ready.json);
        assert_eq!(ready.code(), "not_in_cluster", "{}", ready.json);
    }
    for a in 0..6 {
        let r = c.api(a).add("kit", &format!("e{a}"), 1).await;
        assert_eq!(r.status, 503, "e{a} served without a lease: {}", r.json);
    }
    c.etcd.restart();
    let deadline = Instant::now() + Duration::from_secs(30);
    for a in 0..6 {
        let r = loop {
            let r = c.api(a + 1).add("kit", &format!("e{a}"), 1).await;
            if r.status == 200 || Instant::now() > deadline {
                break r;
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        };
        assert_eq!(r.status, 200, "e{a}: {}", r.json);
        assert_eq!(r.json["value"], 2, "e{a}: lost or doubled");
    }
}

/// kill -9 of a node under load: every write any node acknowledged is
/// there exactly once afterwards — the ones its backups took over with
/// included — and the dead node's actors are served again within the
/// failover time (lease 2 s + grace 2 s here). The link to the backups is
/// slowed down (30 ms per shipping round), so that the kill finds commits
/// on their way: one released before its backup had it would be lost.
#[tokio::test]
async fn kill_9_of_an_owner_under_load_loses_no_acknowledged_write() {
    use common::history::History;
    use std::sync::Arc;
    let Some(mut c) = Cluster::start_with(&[("MARMOT_FAULT_REPLICATION_DELAY_MS", "30")], "").await
    else {
        return;
    };
    assert_eq!(c.api(0).deploy("kit", TESTKIT, json!({})).await.status, 201);
    const ACTORS: usize = 24;
    // Each op records a unique id on one actor, through a random live node,
    // with the id as its idempotency key; retried (same key) until it is
    // acknowledged or the load stops.
    let history = Arc::new(History::default());
    let stop = Arc::new(std::sync::atomic::AtomicBool::new(false));
    let victim = 1;
    let killed = Arc::new(std::sync::atomic::AtomicBool::new(false));
    let mut clients = Vec::new();
    for client in 0..6 {
        let apis: Vec<Api> = (0..3).map(|i| c.api(i)).collect();
        let (history, stop, killed) = (history.clone(), stop.clone(), killed.clone());
        clients.push(tokio::spawn(async move {
            let mut seq = 0;
            while !stop.load(std::sync::atomic::Ordering::Relaxed) {
                seq += 1;
                let id = format!("c{client}-{seq}");
                let actor = format!("load-{}", (client * 7 + seq) % ACTORS);
                history.invoke(&actor, &id);
                for attempt in 0.. {
                    if stop.load(std::sync::atomic::Ordering::Relaxed) {
                        break;
                    }
                    let mut n = (seq + attempt) % 3;
                    if n == victim && killed.load(std::sync::atomic::Ordering::Relaxed) {
                        n = (n + 1) % 3;
                    }
                    let r = apis[n]
                        .try_post_with(
                            &format!("/v1/actors/kit/{actor}"),
                            &json!({"op": "record", "id": id}),
                            &[("idempotency-key", &id)],
                        )
                        .await;
                    history.outcome(&actor, &id, r.as_ref());
                    if r.is_some_and(|r| r.status == 200) {
                        break;
                    }
                    tokio::time::sleep(Duration::from_millis(50)).await;
                }
            }
        }));
    }
    tokio::time::sleep(Duration::from_secs(2)).await;
    let before: usize = history.acked().values().map(BTreeSet::len).sum();
    killed.store(true, std::sync::atomic::Ordering::Relaxed);
    c.nodes[victim].kill9();
    let at_kill = Instant::now();
    // Wait until every actor answers again (the victim's through their
    // backups), then a little more load.
    for a in 0..ACTORS {
        let deadline = Instant::now() + Duration::from_secs(30);
        loop {
            let r = c.api(0).get(&format!("/v1/actors/kit/load-{a}")).await;
            if r.status == 200 || r.status == 404 {
                break;
            }
            assert!(
                Instant::now() < deadline,
                "load-{a}: {} {}",
                r.status,
                r.json
            );
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }
    let failover = at_kill.elapsed();
    // The load goes on: 20 more acknowledged writes (bounded in time; on a
    // busy machine the slowed link makes each one take a while).
    let acked = || history.acked().values().map(BTreeSet::len).sum::<usize>();
    let recovered = acked();
    let deadline = Instant::now() + Duration::from_secs(20);
    while acked() < recovered + 20 && Instant::now() < deadline {
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    stop.store(true, std::sync::atomic::Ordering::Relaxed);
    for client in clients {
        client.await.unwrap();
    }
    let total: usize = history.acked().values().map(BTreeSet::len).sum();
    let fails: Vec<String> = history
        .lines()
        .into_iter()
        .filter_map(|l| match l {
            common::history::Line::Fail { status, .. } => Some(status.to_string()),
            common::history::Line::Unknown { .. } => Some("unknown".into()),
            _ => None,
        })
        .collect();
    assert!(
        total >= recovered + 20,
        "the load stalled: {before} at the kill, {recovered} once every actor answered, {total} at the end; failures {fails:?}"
    );
    let actors: Vec<String> = (0..ACTORS).map(|a| format!("load-{a}")).collect();
    let summary = history.check(&seen(&c, 0, &actors).await);
    eprintln!(
        "{total} writes acknowledged ({summary:?}); every actor served again {failover:?} after kill -9"
    );
}

/// A used slot whose backup died runs without one: flagged in `/readyz`
/// and `GET /v1/cluster`; with `without_backup = "refuse"` its writes are
/// refused (reads go on) instead of being durable on one disk.
#[tokio::test]
async fn a_slot_without_a_backup_refuses_writes_when_told_to() {
    let Some(mut c) = Cluster::start_with(&[], "without_backup = \"refuse\"").await else {
        return;
    };
    assert_eq!(c.api(0).deploy("kit", TESTKIT, json!({})).await.status, 201);
    let r = c.api(0).add("kit", "carol", 3).await;
    assert_eq!(r.status, 200, "{}", r.json);
    let info = c.api(0).get("/v1/actors/kit/carol").await.json;
    let index = |n: &str| NODES.iter().position(|(id, _)| *id == n).unwrap();
    let o = index(info["node"].as_str().unwrap());
    let b = index(info["backup"].as_str().expect("a backup"));
    // Both other nodes die: nobody can become the backup again.
    c.nodes[b].kill9();
    c.nodes[3 - o - b].kill9();
    // Once the backup's lease is gone and the grace is over, the
    // controller drops it from the slot.
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let info = c.api(o).get("/v1/actors/kit/carol").await.json;
        if info["backup"].is_null() {
            break;
        }
        assert!(Instant::now() < deadline, "the dead backup stayed: {info}");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let r = c.api(o).add("kit", "carol", 1).await;
    assert!(
        r.status >= 500,
        "a write without a backup went through: {} {}",
        r.status,
        r.json
    );
    // A turn that writes nothing commits nothing: answered.
    let r = c
        .api(o)
        .op("kit", "carol", json!({"op": "get", "key": "n"}))
        .await;
    assert_eq!(r.status, 200, "{}", r.json);
    assert_eq!(r.json["value"], 3, "{}", r.json);
    let state = c.api(o).get("/v1/actors/kit/carol/state/n").await;
    assert_eq!(state.status, 200, "reads go on: {}", state.json);
    assert_eq!(state.json, json!(3), "{}", state.json);
    let ready = c.api(o).get("/readyz").await;
    assert_eq!(ready.status, 200);
    assert!(
        ready.json["degraded_slots"].as_u64().unwrap_or(0) >= 1,
        "{}",
        ready.json
    );
    let status = c.api(o).get("/v1/cluster").await.json;
    assert!(
        status["slots_degraded"].as_u64().unwrap_or(0) >= 1,
        "{status}"
    );
}

/// The node an actor lives on, asked through node `i`.
async fn owner_of(c: &Cluster, i: usize, id: &str) -> String {
    let info = c.api(i).get(&format!("/v1/actors/kit/{id}")).await;
    assert_eq!(info.status, 200, "{}", info.json);
    info.json["node"].as_str().unwrap().to_owned()
}

fn region_of(node: &str) -> &'static str {
    NODES.iter().find(|(n, _)| *n == node).unwrap().1
}

/// A keyed write to `mover` through node `i`.
async fn keyed(c: &Cluster, i: usize) -> common::Resp {
    c.api(i)
        .post_with(
            "/v1/actors/kit/mover",
            &json!({"op": "add", "key": "n", "by": 10}),
            &[("idempotency-key", "once")],
        )
        .await
}

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

    let r = c
        .api(1)
        .post_json("/v1/actors/kit/mover/move?region=us", &json!({}))
        .await;
    assert_eq!(r.status, 200, "{}", r.json);
    assert_eq!(r.json["moved"], true, "{}", r.json);
    assert_eq!(r.json["node"], "n3", "{}", r.json);
    for i in 0..3 {
        assert_eq!(owner_of(&c, i, "mover").await, "n3");
    }
    let info = c.api(0).get("/v1/actors/kit/mover").await.json;
    assert_eq!(info["region"], "us", "{info}");
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
    let history = Arc::new(History::default());
    let stop = Arc::new(std::sync::atomic::AtomicBool::new(false));
    let mut clients = Vec::new();
    for client in 0..4 {
        let apis: Vec<Api> = (0..3).map(|i| c.api(i)).collect();
        let (history, stop) = (history.clone(), stop.clone());
        clients.push(tokio::spawn(async move {
            let mut seq = 0;
            while !stop.load(std::sync::atomic::Ordering::Relaxed) {
                seq += 1;
                let id = format!("c{client}-{seq}");
                let actor = format!("m-{}", (client + seq) % ACTORS);
                history.invoke(&actor, &id);
                for attempt in 0..200 {
                    let r = apis[(seq + attempt) % 3]
                        .try_post_with(
                            &format!("/v1/actors/kit/{actor}"),
                            &json!({"op": "record", "id": id, "busy_ms": seq % 2 * 40}),
                            &[("idempotency-key", &id)],
                        )
                        .await;
                    history.outcome(&actor, &id, r.as_ref());
                    if r.is_some_and(|r| r.status == 200) {
                        break;
                    }
                    tokio::time::sleep(Duration::from_millis(20)).await;
                }
            }
        }));
    }
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
    stop.store(true, std::sync::atomic::Ordering::Relaxed);
    for client in clients {
        client.await.unwrap();
    }
    let total: usize = history.acked().values().map(BTreeSet::len).sum();
    assert!(moves >= 15, "only {moves} moves happened");
    assert!(total > 50, "the load stalled: {total}");
    let actors: Vec<String> = (0..ACTORS).map(|a| format!("m-{a}")).collect();
    let summary = history.check(&seen(&c, 1, &actors).await);
    eprintln!("{moves} moves in {took:?} under load; {summary:?}");
}

/// Each actor's `seen/` counters (testkit `record`), read through node `i`.
async fn seen(c: &Cluster, i: usize, actors: &[String]) -> BTreeMap<String, BTreeMap<String, i64>> {
    let mut out = BTreeMap::new();
    for actor in actors {
        let page = c
            .api(i)
            .get(&format!(
                "/v1/actors/kit/{actor}/state?prefix=seen/&limit=1000"
            ))
            .await;
        if page.status == 404 {
            continue;
        }
        assert_eq!(page.status, 200, "{}", page.json);
        let seen: BTreeMap<String, i64> = page.json["entries"]
            .as_array()
            .unwrap()
            .iter()
            .map(|e| {
                let k = e["key"].as_str().unwrap().trim_start_matches("seen/");
                (k.to_owned(), e["value"].as_i64().unwrap_or(0))
            })
            .collect();
        out.insert(actor.clone(), seen);
    }
    out
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

/// A local webhook receiver: records each request's `webhook-id` and
/// answers with the status the test sets.
struct HookReceiver {
    url: String,
    ids: std::sync::Arc<std::sync::Mutex<Vec<(String, u16)>>>,
    status: std::sync::Arc<std::sync::atomic::AtomicU16>,
    task: tokio::task::JoinHandle<()>,
}

impl HookReceiver {
    async fn start(status: u16) -> Self {
        use std::sync::atomic::{AtomicU16, Ordering};
        use std::sync::{Arc, Mutex};
        let ids: Arc<Mutex<Vec<(String, u16)>>> = Arc::default();
        let status = Arc::new(AtomicU16::new(status));
        let listener = tokio::net::TcpListener::bind(("127.0.0.1", 0))
            .await
            .unwrap();
        let url = format!("http://{}/hook", listener.local_addr().unwrap());
        let (got, answer) = (ids.clone(), status.clone());
        let app = axum::Router::new().route(
            "/hook",
            axum::routing::post(move |headers: axum::http::HeaderMap| {
                let (got, answer) = (got.clone(), answer.clone());
                async move {
                    let id = headers
                        .get("webhook-id")
                        .and_then(|v| v.to_str().ok())
                        .unwrap_or_default()
                        .to_owned();
                    let status = answer.load(Ordering::SeqCst);
                    got.lock().unwrap().push((id, status));
                    axum::http::StatusCode::from_u16(status).unwrap()
                }
            }),
        );
        let task = tokio::spawn(async move {
            axum::serve(listener, app).await.unwrap();
        });
        Self {
            url,
            ids,
            status,
            task,
        }
    }

    fn got(&self) -> Vec<(String, u16)> {
        self.ids.lock().unwrap().clone()
    }
}

impl Drop for HookReceiver {
    fn drop(&mut self) {
        self.task.abort();
    }
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
