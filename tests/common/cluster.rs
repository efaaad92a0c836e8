//! A cluster of real nodes on one real etcd (Debian's `etcd-server`, which
//! `scripts/test` installs; without it the tests say so and skip), and
//! what the cluster tests share: three nodes in two regions, helpers that
//! wait out failovers, a local webhook receiver.

use std::collections::BTreeMap;
use std::net::TcpStream;
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use super::{Api, Marmot, free_port, tempdir};
use serde_json::{Value, json};

/// A single-member etcd on loopback ports, with its own data directory.
pub struct Etcd {
    pub child: Child,
    pub url: String,
    pub dir: std::path::PathBuf,
    pub ports: (u16, u16),
}

impl Etcd {
    pub fn start(dir: &Path) -> Option<Self> {
        if Command::new("etcd").arg("--version").output().is_err() {
            super::skip(
                "etcd",
                "etcd is not installed (scripts/test installs Debian's etcd-server)",
            );
            return None;
        }
        Some(Self::spawn(dir, (free_port(), free_port())))
    }

    /// Start again on the same data and ports (after [`Self::kill9`]).
    pub fn restart(&mut self) {
        self.kill9();
        let (dir, ports) = (self.dir.clone(), self.ports);
        *self = Self::spawn(&dir, ports);
    }

    pub fn kill9(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }

    pub fn spawn(dir: &Path, (client, peer): (u16, u16)) -> Self {
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

/// Every write under a key prefix from the moment [`Etcd::watch`]
/// returns, as etcd's watch reports them (its JSON gateway): nothing
/// between two polls is missed. Stops when dropped.
pub struct Watch {
    seen: std::sync::Arc<std::sync::Mutex<Vec<(String, Value)>>>,
    task: tokio::task::JoinHandle<()>,
}

impl Watch {
    /// The writes so far: key and value (parsed as JSON; `null` for a
    /// deletion or a value that is not JSON), in revision order.
    pub fn writes(&self) -> Vec<(String, Value)> {
        self.seen.lock().unwrap().clone()
    }
}

impl Drop for Watch {
    fn drop(&mut self) {
        self.task.abort();
    }
}

impl Etcd {
    /// Watch every key under `prefix`; returns once etcd has created the
    /// watch.
    pub async fn watch(&self, prefix: &str) -> Watch {
        use base64::Engine as _;
        let b64 = base64::engine::general_purpose::STANDARD;
        let mut end = prefix.as_bytes().to_vec();
        *end.last_mut().unwrap() += 1;
        let body = serde_json::json!({"create_request": {
            "key": b64.encode(prefix), "range_end": b64.encode(&end)}});
        let mut resp = reqwest::Client::new()
            .post(format!("{}/v3/watch", self.url))
            .json(&body)
            .send()
            .await
            .unwrap();
        assert!(resp.status().is_success(), "etcd watch: {}", resp.status());
        let seen = std::sync::Arc::new(std::sync::Mutex::new(Vec::new()));
        let (created_tx, created) = tokio::sync::oneshot::channel();
        let kept = seen.clone();
        let task = tokio::spawn(async move {
            let mut created_tx = Some(created_tx);
            let mut buf = Vec::new();
            while let Ok(Some(chunk)) = resp.chunk().await {
                buf.extend_from_slice(&chunk);
                while let Some(end) = buf.iter().position(|&b| b == b'\n') {
                    let line: Vec<u8> = buf.drain(..=end).collect();
                    let Ok(msg) = serde_json::from_slice::<Value>(&line) else {
                        continue;
                    };
                    let result = &msg["result"];
                    if result["created"] == true {
                        created_tx.take().map(|tx| tx.send(()));
                    }
                    for e in result["events"].as_array().into_iter().flatten() {
                        let decode = |v: &Value| {
                            v.as_str()
                                .and_then(|t| b64.decode(t).ok())
                                .unwrap_or_default()
                        };
                        let key = String::from_utf8(decode(&e["kv"]["key"])).unwrap();
                        let value = serde_json::from_slice(&decode(&e["kv"]["value"]))
                            .unwrap_or(Value::Null);
                        kept.lock().unwrap().push((key, value));
                    }
                }
            }
        });
        tokio::time::timeout(Duration::from_secs(10), created)
            .await
            .expect("etcd created the watch")
            .unwrap();
        Watch { seen, task }
    }
}

impl Drop for Etcd {
    fn drop(&mut self) {
        self.kill9();
    }
}

/// Three nodes (two regions) on one etcd.
pub struct Cluster {
    _dir: tempfile::TempDir,
    pub etcd: Etcd,
    pub nodes: Vec<Marmot>,
}

pub const NODES: [(&str, &str); 3] = [("n1", "eu"), ("n2", "eu"), ("n3", "us")];

/// The master key every node of the test cluster shares (a cluster's nodes
/// must: secrets are sealed under it).
pub const MASTER_KEY: (&str, &str) = (
    "MARMOT_MASTER_KEY",
    "C9Mh/JqnrwNn9Q8IXpMutKmk/pY/hA+w2GZaccRpfFk=",
);

impl Cluster {
    pub async fn start() -> Option<Self> {
        Self::start_with(&[], "").await
    }

    /// Start with extra environment variables and `[cluster]` settings for
    /// every node.
    pub async fn start_with(env: &[(&str, &str)], cluster: &str) -> Option<Self> {
        Self::start_in(tempdir(), env, cluster).await
    }

    /// [`Self::start_with`], the nodes' data in `dir/{node_id}`.
    pub async fn start_in(
        dir: tempfile::TempDir,
        env: &[(&str, &str)],
        cluster: &str,
    ) -> Option<Self> {
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

    /// Send node `i` signal `sig` (`-STOP`, `-CONT`, …) with `kill`.
    pub fn signal(&self, i: usize, sig: &str) {
        let pid = self.nodes[i].pid().unwrap().to_string();
        let sent = std::process::Command::new("kill")
            .args([sig, &pid])
            .status()
            .unwrap();
        assert!(sent.success(), "kill {sig} {pid}");
    }

    pub fn api(&self, i: usize) -> Api {
        self.nodes[i % self.nodes.len()].client()
    }

    /// Wait until every running node's `/v1/cluster` satisfies `f`.
    pub async fn wait_status(&self, f: impl Fn(&Value) -> bool) -> Value {
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

/// `PUT path` with a JSON body.
pub async fn put(api: &Api, path: String, body: Value) -> super::Resp {
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
pub async fn add_when_served(c: &Cluster, i: usize, id: &str) -> super::Resp {
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
pub async fn wait_value(c: &Cluster, i: usize, id: &str, key: &str, want: i64) {
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

/// The node an actor lives on, asked through node `i`.
pub async fn owner_of(c: &Cluster, i: usize, id: &str) -> String {
    let info = c.api(i).get(&format!("/v1/actors/kit/{id}")).await;
    assert_eq!(info.status, 200, "{}", info.json);
    info.json["node"].as_str().unwrap().to_owned()
}

pub fn region_of(node: &str) -> &'static str {
    NODES.iter().find(|(n, _)| *n == node).unwrap().1
}

/// A keyed write to `mover` through node `i`.
pub async fn keyed(c: &Cluster, i: usize) -> super::Resp {
    c.api(i)
        .post_with(
            "/v1/actors/kit/mover",
            &json!({"op": "add", "key": "n", "by": 10}),
            &[("idempotency-key", "once")],
        )
        .await
}

/// Each actor's `seen/` counters (testkit `record`), read through node `i`.
pub async fn seen(
    c: &Cluster,
    i: usize,
    actors: &[String],
) -> BTreeMap<String, BTreeMap<String, i64>> {
    let mut out = BTreeMap::new();
    for actor in actors {
        // A 503 (the node between leases, a failover finishing) is retried.
        let deadline = Instant::now() + Duration::from_secs(15);
        let page = loop {
            let page = c
                .api(i)
                .get(&format!(
                    "/v1/actors/kit/{actor}/state?prefix=seen/&limit=1000"
                ))
                .await;
            if page.status != 503 || Instant::now() > deadline {
                break page;
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        };
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

/// A local webhook receiver: records each request's `webhook-id` and
/// answers with the status the test sets.
pub struct HookReceiver {
    pub url: String,
    pub ids: std::sync::Arc<std::sync::Mutex<Vec<(String, u16)>>>,
    pub status: std::sync::Arc<std::sync::atomic::AtomicU16>,
    pub task: tokio::task::JoinHandle<()>,
}

impl HookReceiver {
    pub async fn start(status: u16) -> Self {
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

    pub fn got(&self) -> Vec<(String, u16)> {
        self.ids.lock().unwrap().clone()
    }
}

impl Drop for HookReceiver {
    fn drop(&mut self) {
        self.task.abort();
    }
}

/// Clients writing unique ids (testkit `record`, half of them holding their
/// turn `busy_ms` before committing) to `actors` through every node until
/// stopped: each id retried with itself as idempotency key until
/// acknowledged, every attempt recorded in `history`.
pub struct Writers {
    stop: std::sync::Arc<std::sync::atomic::AtomicBool>,
    tasks: Vec<tokio::task::JoinHandle<()>>,
}

impl Writers {
    pub fn start(
        c: &Cluster,
        history: &std::sync::Arc<super::history::History>,
        actors: &[String],
        clients: usize,
        busy_ms: u64,
    ) -> Self {
        use std::sync::atomic::Ordering;
        let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
        let tasks = (0..clients)
            .map(|client| {
                let apis: Vec<Api> = (0..3).map(|i| c.api(i)).collect();
                let (history, stop, actors) = (history.clone(), stop.clone(), actors.to_vec());
                tokio::spawn(async move {
                    let mut seq = 0;
                    while !stop.load(Ordering::Relaxed) {
                        seq += 1;
                        let id = format!("c{client}-{seq}");
                        let actor = &actors[(client * 7 + seq) % actors.len()];
                        history.invoke(actor, &id);
                        for attempt in 0..200 {
                            let r = apis[(seq + attempt) % 3]
                                .try_post_with(
                                    &format!("/v1/actors/kit/{actor}"),
                                    &json!({"op": "record", "id": id, "busy_ms": seq as u64 % 2 * busy_ms}),
                                    &[("idempotency-key", &id)],
                                )
                                .await;
                            history.outcome(actor, &id, r.as_ref());
                            if r.is_some_and(|r| r.status == 200) {
                                break;
                            }
                            tokio::time::sleep(Duration::from_millis(20)).await;
                        }
                    }
                })
            })
            .collect();
        Self { stop, tasks }
    }

    /// Stop, and wait for each client's last write to end.
    pub async fn stop(self) {
        self.stop.store(true, std::sync::atomic::Ordering::Relaxed);
        for t in self.tasks {
            t.await.unwrap();
        }
    }
}
