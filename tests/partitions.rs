//! Network faults between real processes: etcd and every node in its own
//! network namespace on a bridge this test creates, with addresses it
//! assigns (10.203.x.0/24). A partition is a blackhole route in one
//! namespace, so a node can be cut off from etcd while its peers still
//! reach it. Needs root and `ip` (iproute2) and etcd; otherwise each test
//! says what is missing and skips.

mod common;

use std::collections::{BTreeMap, BTreeSet};
use std::process::{Child, Command, Stdio};
use std::sync::Arc;
use std::time::{Duration, Instant};

use common::{Api, TESTKIT, tempdir};
use serde_json::{Value, json};

const TOKEN: &str = "partition-test-admin-token";

/// A bridge and namespaces, removed on drop.
struct Net {
    bridge: String,
    subnet: u8,
    namespaces: Vec<String>,
}

fn sh(args: &[&str]) -> bool {
    Command::new(args[0])
        .args(&args[1..])
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status()
        .is_ok_and(|s| s.success())
}

impl Net {
    /// Namespaces `0..n` on one bridge; the bridge itself (the test) is
    /// `10.203.S.1`, namespace `i` is `10.203.S.(10 + i)`.
    fn create(n: usize) -> Option<Self> {
        if Command::new("etcd").arg("--version").output().is_err() {
            common::skip(
                "etcd",
                "etcd is not installed (scripts/test installs Debian's etcd-server)",
            );
            return None;
        }
        let root = Command::new("id")
            .arg("-u")
            .output()
            .is_ok_and(|o| o.stdout.starts_with(b"0\n"));
        if !root || !sh(&["ip", "-V"]) {
            common::skip(
                "netns",
                "creating network namespaces needs root and iproute2 (`ip`)",
            );
            return None;
        }
        // Unique per test (tests of one binary run in parallel) and per
        // process.
        static NEXT: std::sync::atomic::AtomicU32 = std::sync::atomic::AtomicU32::new(0);
        let n_net = NEXT.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        let tag = (std::process::id() % 1_000) * 10 + n_net;
        let subnet = (20 + (std::process::id() + 37 * n_net) % 200) as u8;
        let bridge = format!("mbr{tag}");
        if !sh(&["ip", "link", "add", &bridge, "type", "bridge"]) {
            common::skip(
                "netns",
                "cannot create a network bridge here (root without CAP_NET_ADMIN?)",
            );
            return None;
        }
        let mut net = Self {
            bridge,
            subnet,
            namespaces: Vec::new(),
        };
        let ok = sh(&[
            "ip",
            "addr",
            "add",
            &format!("10.203.{subnet}.1/24"),
            "dev",
            &net.bridge,
        ]) && sh(&["ip", "link", "set", &net.bridge, "up"]);
        assert!(ok, "cannot set up bridge {}", net.bridge);
        for i in 0..n {
            let ns = format!("m{tag}n{i}");
            let (host, peer) = (format!("mv{tag}h{i}"), format!("mv{tag}p{i}"));
            assert!(sh(&["ip", "netns", "add", &ns]), "ip netns add {ns}");
            net.namespaces.push(ns.clone());
            let ok = sh(&[
                "ip", "link", "add", &host, "type", "veth", "peer", "name", &peer,
            ]) && sh(&["ip", "link", "set", &peer, "netns", &ns])
                && sh(&["ip", "link", "set", &host, "master", &net.bridge])
                && sh(&["ip", "link", "set", &host, "up"])
                && sh(&[
                    "ip",
                    "-n",
                    &ns,
                    "addr",
                    "add",
                    &format!("{}/24", net.ip(i)),
                    "dev",
                    &peer,
                ])
                && sh(&["ip", "-n", &ns, "link", "set", &peer, "up"])
                && sh(&["ip", "-n", &ns, "link", "set", "lo", "up"]);
            assert!(ok, "cannot wire namespace {ns}");
        }
        Some(net)
    }

    fn ip(&self, i: usize) -> String {
        format!("10.203.{}.{}", self.subnet, 10 + i)
    }

    /// Drop everything namespace `from` sends to namespace `to`.
    fn cut(&self, from: usize, to: usize) {
        self.blackhole("add", from, to);
    }

    fn heal(&self, from: usize, to: usize) {
        self.blackhole("del", from, to);
    }

    fn blackhole(&self, op: &str, from: usize, to: usize) {
        let dst = format!("{}/32", self.ip(to));
        let ns = &self.namespaces[from];
        assert!(
            sh(&["ip", "-n", ns, "route", op, "blackhole", &dst]),
            "route {op} {dst} in {ns}"
        );
    }

    /// A command run inside namespace `i`.
    fn command(&self, i: usize, program: &str) -> Command {
        let mut c = Command::new("ip");
        c.args(["netns", "exec", &self.namespaces[i], program]);
        c
    }
}

impl Drop for Net {
    fn drop(&mut self) {
        for ns in &self.namespaces {
            sh(&["ip", "netns", "del", ns]);
        }
        sh(&["ip", "link", "del", &self.bridge]);
    }
}

/// A process in a namespace, killed on drop.
struct Proc(Option<Child>);

impl Proc {
    fn kill9(&mut self) {
        if let Some(mut c) = self.0.take() {
            let _ = c.kill();
            let _ = c.wait();
        }
    }
}

impl Drop for Proc {
    fn drop(&mut self) {
        self.kill9();
    }
}

/// etcd members `members` (namespace 0, ports 2379 + 100·k) and nodes in
/// namespaces 1..=3.
struct Rig {
    dir: tempfile::TempDir,
    etcd: Vec<Proc>,
    nodes: Vec<Proc>,
    net: Net,
    endpoints: Vec<String>,
}

impl Rig {
    fn start(members: usize, lease_ttl_s: u64) -> Option<Self> {
        let net = Net::create(4)?;
        let dir = tempdir();
        let ip = net.ip(0);
        let initial: Vec<String> = (0..members)
            .map(|k| format!("e{k}=http://{ip}:{}", 2380 + 100 * k))
            .collect();
        let mut etcd = Vec::new();
        let mut endpoints = Vec::new();
        for k in 0..members {
            let client = format!("http://{ip}:{}", 2379 + 100 * k);
            let peer = format!("http://{ip}:{}", 2380 + 100 * k);
            let log = std::fs::File::create(dir.path().join(format!("etcd{k}.log"))).unwrap();
            let child = net
                .command(0, "etcd")
                .arg(format!("--name=e{k}"))
                .arg(format!(
                    "--data-dir={}",
                    dir.path().join(format!("etcd{k}")).display()
                ))
                .arg(format!("--listen-client-urls={client}"))
                .arg(format!("--advertise-client-urls={client}"))
                .arg(format!("--listen-peer-urls={peer}"))
                .arg(format!("--initial-advertise-peer-urls={peer}"))
                .arg(format!("--initial-cluster={}", initial.join(",")))
                .arg("--initial-cluster-state=new")
                .stdout(Stdio::null())
                .stderr(log)
                .spawn()
                .expect("start etcd");
            etcd.push(Proc(Some(child)));
            endpoints.push(client);
        }
        let key = common::new_master_key();
        let key_file = dir.path().join("master.key");
        std::fs::write(&key_file, &key).unwrap();
        std::fs::set_permissions(
            &key_file,
            std::os::unix::fs::PermissionsExt::from_mode(0o600),
        )
        .unwrap();
        let mut rig = Self {
            dir,
            etcd,
            nodes: Vec::new(),
            net,
            endpoints,
        };
        for n in 1..=3 {
            rig.nodes.push(rig.spawn_node(n, lease_ttl_s));
        }
        Some(rig)
    }

    fn spawn_node(&self, n: usize, lease_ttl_s: u64) -> Proc {
        let ip = self.net.ip(n);
        let etcd: Vec<String> = self.endpoints.iter().map(|e| format!("\"{e}\"")).collect();
        let data = self.dir.path().join(format!("n{n}"));
        let config = format!(
            "listen = \"{ip}:7878\"\ndata_dir = \"{}\"\nadmin_token = \"{TOKEN}\"\n\
             [secrets]\nmaster_key_file = \"{}\"\n\
             [cluster]\nnode_id = \"n{n}\"\nadvertise = \"http://{ip}:7878\"\n\
             etcd = [{}]\nlease_ttl_s = {lease_ttl_s}\n",
            data.display(),
            self.dir.path().join("master.key").display(),
            etcd.join(", ")
        );
        let path = self.dir.path().join(format!("n{n}.toml"));
        std::fs::write(&path, config).unwrap();
        let log = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(self.dir.path().join(format!("n{n}.log")))
            .unwrap();
        let child = self
            .net
            .command(n, env!("CARGO_BIN_EXE_marmot"))
            .args(["serve", "--config"])
            .arg(&path)
            .env("MARMOT_LOG", "info,marmot=debug")
            .env("MARMOT_CACHE_DIR", common::shared_cache_dir())
            .stdout(Stdio::null())
            .stderr(log)
            .spawn()
            .expect("start marmot in its namespace");
        Proc(Some(child))
    }

    /// The API of node `n` (1..=3), seen from the bridge.
    fn api(&self, n: usize) -> Api {
        let mut headers = reqwest::header::HeaderMap::new();
        headers.insert("authorization", format!("Bearer {TOKEN}").parse().unwrap());
        Api {
            http: reqwest::Client::builder()
                .default_headers(headers)
                .timeout(Duration::from_secs(10))
                .build()
                .unwrap(),
            url: format!("http://{}:7878", self.net.ip(n)),
            bearer: None,
        }
    }

    fn log(&self, what: &str) -> String {
        std::fs::read_to_string(self.dir.path().join(format!("{what}.log"))).unwrap_or_default()
    }

    /// Wait until every node is ready and every slot has an owner.
    async fn wait_formed(&self) {
        let deadline = Instant::now() + Duration::from_secs(60);
        let mut last = String::new();
        'outer: loop {
            if Instant::now() > deadline {
                let logs: Vec<String> = (1..=3)
                    .map(|n| {
                        let log = self.log(&format!("n{n}"));
                        let tail: Vec<&str> = log.lines().rev().take(8).collect();
                        format!(
                            "--- n{n}\n{}",
                            tail.into_iter().rev().collect::<Vec<_>>().join("\n")
                        )
                    })
                    .collect();
                panic!("the cluster did not form: {last}\n{}", logs.join("\n"));
            }
            tokio::time::sleep(Duration::from_millis(200)).await;
            for n in 1..=3 {
                let api = self.api(n);
                let ready = api.http.get(format!("{}/readyz", api.url)).send().await;
                match ready {
                    Ok(r) if r.status() == 200 => {}
                    other => {
                        last = format!("n{n} not ready: {other:?}");
                        continue 'outer;
                    }
                }
            }
            let s = self.api(1).get("/v1/cluster").await.json;
            last = s.to_string();
            let members = s["members"].as_array().map_or(0, |m| m.len());
            if s["slots_assigned"] == 1024 && members == 3 {
                return;
            }
        }
    }

    /// Retry `f` until it answers 200 or `within` passes.
    async fn until_ok(&self, within: Duration, f: impl AsyncFn() -> common::Resp) -> common::Resp {
        let deadline = Instant::now() + within;
        loop {
            let r = f().await;
            if r.status == 200 || Instant::now() > deadline {
                return r;
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }
}

fn owner_of(info: &Value) -> usize {
    info["node"].as_str().unwrap()[1..].parse().unwrap()
}

#[tokio::test]
async fn an_owner_cut_off_from_etcd_fences_itself_and_serves_again_after_the_heal() {
    let Some(rig) = Rig::start(1, 2) else {
        return;
    };
    rig.wait_formed().await;
    assert_eq!(
        rig.api(1).deploy("kit", TESTKIT, json!({})).await.status,
        201
    );
    // Formed as node 1 sees it; on a loaded machine the node a request
    // lands on may still be a moment behind (a 503 `slot_unavailable`,
    // which says to retry).
    let r = rig
        .until_ok(Duration::from_secs(10), async || {
            rig.api(1).add("kit", "carol", 1).await
        })
        .await;
    assert_eq!(r.status, 200, "{}", r.json);
    let o = owner_of(&rig.api(1).get("/v1/actors/kit/carol").await.json);
    let other = o % 3 + 1;

    // The owner loses etcd; its peers still reach it.
    rig.net.cut(o, 0);
    tokio::time::sleep(Duration::from_millis(3_500)).await;
    let direct = rig.api(o).add("kit", "carol", 100).await;
    assert_eq!(
        direct.status, 503,
        "served without a lease: {}",
        direct.json
    );
    assert_eq!(direct.code(), "slot_unavailable", "{}", direct.json);
    let ready = rig.api(o).get("/readyz").await;
    assert_eq!(ready.code(), "not_in_cluster", "{}", ready.json);
    let via = rig.api(other).add("kit", "carol", 1000).await;
    assert_eq!(via.status, 503, "{}", via.json);

    rig.net.heal(o, 0);
    let r = rig
        .until_ok(Duration::from_secs(30), async || {
            rig.api(other).add("kit", "carol", 1).await
        })
        .await;
    assert_eq!(r.status, 200, "{}\n{}", r.json, rig.log(&format!("n{o}")));
    assert_eq!(r.json["value"], 2, "a refused write was applied");
}

/// An owner that cannot reach its slot's backup (both still reach etcd):
/// its commits wait for the backup, then the owner drops it from the slot
/// (3 s) and releases them. The backup is not promoted (the owner is
/// alive); the third node catches up as the new backup, the unreachable
/// one is not chosen again; after the heal every node serves the one
/// state.
#[tokio::test]
async fn an_owner_cut_off_from_its_backup_drops_it_and_goes_on() {
    let Some(rig) = Rig::start(1, 2) else {
        return;
    };
    rig.wait_formed().await;
    assert_eq!(
        rig.api(1).deploy("kit", TESTKIT, json!({})).await.status,
        201
    );
    let r = rig.api(1).add("kit", "dave", 1).await;
    assert_eq!(r.status, 200, "{}", r.json);
    let info = rig.api(1).get("/v1/actors/kit/dave").await.json;
    let o = owner_of(&info);
    let b: usize = info["backup"].as_str().expect("a backup")[1..]
        .parse()
        .unwrap();
    let epoch = info["epoch"].as_u64().unwrap();

    rig.net.cut(o, b);
    rig.net.cut(b, o);
    let started = Instant::now();
    let r = rig.api(o).add("kit", "dave", 1).await;
    let waited = started.elapsed();
    assert_eq!(r.status, 200, "{}\n{}", r.json, rig.log(&format!("n{o}")));
    assert_eq!(r.json["value"], 2);
    assert!(
        waited >= Duration::from_secs(2),
        "released before the backup was dropped ({waited:?})"
    );
    let info = rig.api(o).get("/v1/actors/kit/dave").await.json;
    assert_ne!(info["backup"], format!("n{b}"), "{info}");
    assert_eq!(
        owner_of(&info),
        o,
        "the backup took over a live owner: {info}"
    );
    assert_eq!(info["epoch"].as_u64().unwrap(), epoch, "{info}");
    // The third node catches up as the new backup (the unreachable one is
    // not chosen again), and writes go on without waiting for the cut-off
    // node.
    let third = 6 - o - b;
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        let info = rig.api(o).get("/v1/actors/kit/dave").await.json;
        if info["backup"] == format!("n{third}") {
            break;
        }
        assert!(Instant::now() < deadline, "no new backup: {info}");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let started = Instant::now();
    let r = rig.api(o).add("kit", "dave", 1).await;
    assert_eq!(r.json["value"], 3, "{}", r.json);
    assert!(started.elapsed() < Duration::from_secs(2));

    rig.net.heal(o, b);
    rig.net.heal(b, o);
    let mut want = 3;
    for n in 1..=3 {
        want += 1;
        let r = rig
            .until_ok(Duration::from_secs(20), async || {
                rig.api(n).add("kit", "dave", 1).await
            })
            .await;
        assert_eq!(r.status, 200, "node {n}: {}", r.json);
        assert_eq!(r.json["value"], want, "node {n}");
    }
}

#[tokio::test]
async fn killing_the_etcd_leader_under_load_loses_no_acknowledged_write() {
    let Some(mut rig) = Rig::start(3, 5) else {
        return;
    };
    rig.wait_formed().await;
    assert_eq!(
        rig.api(1).deploy("kit", TESTKIT, json!({})).await.status,
        201
    );

    // Load: each op records a unique id on one of 12 actors, through a
    // random node, with its id as the idempotency key.
    let history = Arc::new(common::history::History::named(
        "etcd_leader_killed_under_load",
    ));
    let stop = Arc::new(std::sync::atomic::AtomicBool::new(false));
    let mut clients = Vec::new();
    for c in 0..6 {
        let apis: Vec<Api> = (1..=3).map(|n| rig.api(n)).collect();
        let (history, stop) = (history.clone(), stop.clone());
        clients.push(tokio::spawn(async move {
            let mut seq = 0;
            while !stop.load(std::sync::atomic::Ordering::Relaxed) {
                seq += 1;
                let id = format!("c{c}-{seq}");
                let actor = format!("w{}", (c * 7 + seq) % 12);
                let api = &apis[seq % 3];
                history.invoke(&actor, &id);
                let r = api
                    .try_post_with(
                        &format!("/v1/actors/kit/{actor}"),
                        &json!({"op": "record", "id": id}),
                        &[("idempotency-key", &id)],
                    )
                    .await;
                history.outcome(&actor, &id, r.as_ref());
            }
        }));
    }
    tokio::time::sleep(Duration::from_secs(2)).await;
    let leader = leader_of(&rig.endpoints).await.expect("an etcd leader");
    let acked = || history.acked().values().map(BTreeSet::len).sum::<usize>();
    let before = acked();
    rig.etcd[leader].kill9();
    tokio::time::sleep(Duration::from_secs(6)).await;
    stop.store(true, std::sync::atomic::Ordering::Relaxed);
    for c in clients {
        c.await.unwrap();
    }
    let total = acked();
    assert!(
        total > before + 50,
        "the load stalled after the leader died: {before} → {total}"
    );

    // Every acknowledged id is there exactly once, no id twice, one
    // committer per (slot, epoch).
    let mut state = BTreeMap::new();
    for actor in (0..12).map(|a| format!("w{a}")) {
        let mut seen = BTreeMap::<String, i64>::new();
        let mut after = String::new();
        loop {
            // (Through any node, once the cluster has settled after the
            // election: a node may still be renewing its lease.)
            let path =
                format!("/v1/actors/kit/{actor}/state?prefix=seen/&limit=1000&after={after}");
            let deadline = Instant::now() + Duration::from_secs(20);
            let page = loop {
                let r = rig.api(1).get(&path).await;
                if r.status == 200 || r.status == 404 {
                    break r.json;
                }
                assert!(Instant::now() < deadline, "{path}: {} {}", r.status, r.json);
                tokio::time::sleep(Duration::from_millis(100)).await;
            };
            for e in page["entries"].as_array().into_iter().flatten() {
                let k = e["key"].as_str().unwrap().trim_start_matches("seen/");
                seen.insert(k.to_owned(), e["value"].as_i64().unwrap_or(0));
            }
            match page["next_after"].as_str() {
                Some(next) => after = next.replace('/', "%2F"),
                None => break,
            }
        }
        state.insert(actor, seen);
    }
    let summary = history.check(&state);
    eprintln!(
        "etcd leader {leader} killed under load: {total} acknowledged ({before} before); {summary:?}; 0 lost, 0 doubled, one committer per (slot, epoch)"
    );
    drop(rig);
}

/// Which endpoint is the etcd leader (the gateway's maintenance status).
async fn leader_of(endpoints: &[String]) -> Option<usize> {
    let http = reqwest::Client::new();
    for (i, e) in endpoints.iter().enumerate() {
        let Ok(r) = http
            .post(format!("{e}/v3/maintenance/status"))
            .body("{}")
            .send()
            .await
        else {
            continue;
        };
        let Ok(v) = r.json::<Value>().await else {
            continue;
        };
        if v["leader"].is_string() && v["leader"] == v["header"]["member_id"] {
            return Some(i);
        }
    }
    None
}
