//! Shared harness for the integration tests: real `marmot` processes on
//! loopback, real data directories, real HTTP.

#![allow(dead_code, reason = "each test binary uses a different subset")]

pub mod agent;
pub mod cluster;
pub mod disk;
pub mod history;
pub mod js;
pub mod otlp;

use std::io::Write as _;
use std::net::TcpListener;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use serde_json::Value;

/// The test actor (`tests/guests/testkit`).
pub const TESTKIT: &[u8] = include_bytes!(env!("MARMOT_GUEST_MARMOT_TESTKIT"));
/// An actor whose `report-memory-origin` never returns
/// (`tests/guests/spinning-origin`).
pub const SPINNING_ORIGIN: &[u8] = include_bytes!(env!("MARMOT_GUEST_MARMOT_SPINNING_ORIGIN"));
/// The counter example.
pub const COUNTER: &[u8] = include_bytes!(env!("MARMOT_GUEST_COUNTER"));
/// The notes example.
pub const NOTES: &[u8] = include_bytes!(env!("MARMOT_GUEST_NOTES"));

/// A `marmot dev` process.
pub struct Marmot {
    child: Option<Child>,
    pub url: String,
    pub port: u16,
    pub data: PathBuf,
    env: Vec<(String, String)>,
    log: PathBuf,
    config: Option<PathBuf>,
    /// Start without `--no-examples`.
    examples: bool,
    /// Run `marmot serve` with this admin token instead of `marmot dev`.
    admin_token: Option<String>,
}

/// A new master key for the secret store (`marmot secrets new-key`).
pub fn new_master_key() -> String {
    let out = Command::new(env!("CARGO_BIN_EXE_marmot"))
        .args(["secrets", "new-key"])
        .output()
        .expect("run marmot secrets new-key");
    assert!(out.status.success(), "marmot secrets new-key failed");
    String::from_utf8(out.stdout).unwrap().trim().to_owned()
}

/// The compiled-code cache shared by the test run's nodes.
pub fn shared_cache_dir() -> PathBuf {
    let dir = PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join("marmot-code-cache");
    std::fs::create_dir_all(&dir).unwrap();
    dir
}

/// A loopback port nothing listens on, for a node to bind later.
///
/// Asking the kernel for port 0 and releasing it is racy: the kernel hands
/// the same ephemeral ports to outgoing connections (and to the next test
/// asking), so a node could find its port taken — or a test could talk to
/// another test's node. Ports come instead from below the kernel's
/// ephemeral range, which outgoing connections never use, from a counter
/// shared by the tests of this binary (started at a place that depends on
/// the process id, so consecutive test binaries start elsewhere), each
/// checked free by a bind.
pub fn free_port() -> u16 {
    use std::sync::atomic::{AtomicU32, Ordering};
    static NEXT: AtomicU32 = AtomicU32::new(0);
    let low = std::fs::read_to_string("/proc/sys/net/ipv4/ip_local_port_range")
        .ok()
        .and_then(|r| r.split_whitespace().next()?.parse::<u32>().ok())
        .unwrap_or(32768);
    // [10000, low): 22,768 ports with Linux's default range.
    let span = low.saturating_sub(10_000).max(1000);
    let start = std::process::id() * 97;
    for _ in 0..span {
        let n = NEXT.fetch_add(1, Ordering::Relaxed);
        let port = 10_000 + (start.wrapping_add(n)) % span;
        if TcpListener::bind(("127.0.0.1", port as u16)).is_ok() {
            return port as u16;
        }
    }
    panic!("no free loopback port below {low}");
}

impl Marmot {
    /// Start a node on `data` (without the examples) and wait until ready.
    pub async fn start(data: &Path) -> Self {
        Self::start_with_env(data, &[]).await
    }

    pub async fn start_with_env(data: &Path, env: &[(&str, &str)]) -> Self {
        Self::start_opts(data, env, None).await
    }

    /// Start with environment variables and an optional TOML config.
    pub async fn start_opts(data: &Path, env: &[(&str, &str)], config: Option<&str>) -> Self {
        let m = Self::spawn_opts(data, env, config);
        let mut m = m;
        m.wait_ready().await;
        m
    }

    /// Spawn without waiting for readiness.
    pub fn spawn_opts(data: &Path, env: &[(&str, &str)], config: Option<&str>) -> Self {
        let mut m = Self::new(data, env, config);
        m.spawn();
        m
    }

    /// Spawn on a chosen `port` (the config may name it, e.g. a cluster
    /// node's advertise URL) without waiting for readiness.
    pub fn spawn_on(port: u16, data: &Path, env: &[(&str, &str)], config: Option<&str>) -> Self {
        let mut m = Self::new(data, env, config);
        m.port = port;
        m.spawn();
        m
    }

    /// [`Self::spawn_on`] as `marmot serve` with `admin_token`.
    pub fn spawn_serve_on(
        port: u16,
        data: &Path,
        env: &[(&str, &str)],
        config: Option<&str>,
        admin_token: &str,
    ) -> Self {
        let mut m = Self::new(data, env, config);
        m.port = port;
        m.admin_token = Some(admin_token.to_owned());
        m.spawn();
        m
    }

    /// Start a node on `data` as `marmot dev` does by default: with the
    /// bundled examples.
    pub async fn start_with_examples(data: &Path) -> Self {
        let mut m = Self::new(data, &[], None);
        m.examples = true;
        m.spawn();
        m.wait_ready().await;
        m
    }

    /// `marmot serve` (bearer auth on) on `data` with `admin_token`; its
    /// [`client`](Self::client) presents the token.
    pub async fn start_serve(data: &Path, admin_token: &str) -> Self {
        let mut m = Self::new(data, &[], Some(""));
        m.admin_token = Some(admin_token.to_owned());
        m.spawn();
        m.wait_ready().await;
        m
    }

    /// A node on `data`, not started yet.
    fn new(data: &Path, env: &[(&str, &str)], config: Option<&str>) -> Self {
        let config_path = config.map(|text| {
            let p = data.with_extension("toml");
            std::fs::write(&p, text).unwrap();
            p
        });
        Self {
            config: config_path,
            child: None,
            url: String::new(),
            port: free_port(),
            data: data.to_owned(),
            env: env
                .iter()
                .map(|(k, v)| (k.to_string(), v.to_string()))
                .collect(),
            log: data.with_extension("log"),
            examples: false,
            admin_token: None,
        }
    }

    fn spawn(&mut self) {
        self.url = format!("http://127.0.0.1:{}", self.port);
        let log = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(&self.log)
            .unwrap();
        let mut cmd = Command::new(env!("CARGO_BIN_EXE_marmot"));
        if let Some(token) = &self.admin_token {
            cmd.arg("serve")
                .env("MARMOT_ADMIN_TOKEN", token)
                .env("MARMOT_MASTER_KEY", new_master_key());
        } else {
            cmd.arg("dev");
            if !self.examples {
                cmd.arg("--no-examples");
            }
        }
        cmd.arg("--listen")
            .arg(format!("127.0.0.1:{}", self.port))
            .arg("--data")
            .arg(&self.data)
            .env("MARMOT_LOG", "info,marmot=debug")
            // One compiled-code cache for every node of the test run: the
            // JavaScript engine is snapshotted and compiled once, not per test.
            .env("MARMOT_CACHE_DIR", shared_cache_dir())
            .stdout(Stdio::null())
            .stderr(log);
        if let Some(c) = &self.config {
            cmd.arg("--config").arg(c);
        }
        for (k, v) in &self.env {
            cmd.env(k, v);
        }
        self.child = Some(cmd.spawn().expect("spawn marmot"));
    }

    /// Wait until `/readyz` says ready.
    pub async fn wait_ready(&mut self) {
        let deadline = Instant::now() + Duration::from_secs(60);
        let client = reqwest::Client::new();
        loop {
            if let Some(c) = self.child.as_mut()
                && let Ok(Some(status)) = c.try_wait()
            {
                panic!(
                    "marmot exited early with {status}; log:\n{}",
                    self.log_text()
                );
            }
            if let Ok(r) = client.get(format!("{}/readyz", self.url)).send().await
                && r.status() == 200
            {
                return;
            }
            assert!(
                Instant::now() < deadline,
                "marmot did not become ready; log:\n{}",
                self.log_text()
            );
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }

    /// SIGKILL the process (like a power cut for the process).
    pub fn kill9(&mut self) {
        if let Some(mut c) = self.child.take() {
            let _ = c.kill();
            let _ = c.wait();
        }
    }

    /// Ask the process to stop (SIGTERM, as a service manager does); see
    /// [`Self::wait_exit`].
    pub fn sigterm(&self) {
        let pid = self.pid().expect("the node is running");
        let status = std::process::Command::new("kill")
            .args(["-TERM", &pid.to_string()])
            .status()
            .unwrap();
        assert!(status.success(), "kill -TERM {pid}");
    }

    /// The process id, while running.
    pub fn pid(&self) -> Option<u32> {
        self.child.as_ref().map(|c| c.id())
    }

    /// Set (`Some`) or remove an environment variable for the next start.
    pub fn set_env(&mut self, key: &str, value: Option<&str>) {
        self.env.retain(|(k, _)| k != key);
        if let Some(v) = value {
            self.env.push((key.to_owned(), v.to_owned()));
        }
    }

    /// Wait for the process to exit on its own (e.g. fault-injected abort).
    pub fn wait_exit(&mut self, timeout: Duration) -> bool {
        let deadline = Instant::now() + timeout;
        while Instant::now() < deadline {
            if let Some(c) = self.child.as_mut()
                && let Ok(Some(_)) = c.try_wait()
            {
                self.child = None;
                return true;
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        false
    }

    /// Start again on the same data directory and port.
    pub async fn restart(&mut self) {
        self.kill9();
        self.spawn();
        self.wait_ready().await;
    }

    /// Start the process again without waiting for readiness.
    pub fn respawn(&mut self) {
        self.kill9();
        self.spawn();
    }

    pub fn log_text(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }

    pub fn client(&self) -> Api {
        Api {
            http: reqwest::Client::new(),
            url: self.url.clone(),
            bearer: self.admin_token.clone(),
        }
    }
}

impl Drop for Marmot {
    fn drop(&mut self) {
        self.kill9();
    }
}

/// A small JSON client for the API.
#[derive(Clone)]
pub struct Api {
    pub http: reqwest::Client,
    pub url: String,
    /// Sent as `Authorization: Bearer …` unless a request sets its own.
    pub bearer: Option<String>,
}

/// A response: status, headers, body parsed as JSON (or `Value::Null`).
#[derive(Debug)]
pub struct Resp {
    pub status: u16,
    pub headers: reqwest::header::HeaderMap,
    pub body: Vec<u8>,
    pub json: Value,
}

impl Resp {
    /// The error code of a JSON error response.
    pub fn code(&self) -> &str {
        self.json["error"]["code"].as_str().unwrap_or("")
    }
}

impl Api {
    pub async fn req(
        &self,
        method: reqwest::Method,
        path: &str,
        body: Option<(&str, Vec<u8>)>,
        headers: &[(&str, &str)],
    ) -> Resp {
        let mut r = self.http.request(method, format!("{}{path}", self.url));
        if let Some(token) = &self.bearer
            && !headers
                .iter()
                .any(|(k, _)| k.eq_ignore_ascii_case("authorization"))
        {
            r = r.bearer_auth(token);
        }
        if let Some((ct, b)) = body {
            r = r.header("content-type", ct).body(b);
        }
        for (k, v) in headers {
            r = r.header(*k, *v);
        }
        let resp = r.send().await.expect("request");
        let status = resp.status().as_u16();
        let headers = resp.headers().clone();
        let body = resp.bytes().await.unwrap().to_vec();
        let json = serde_json::from_slice(&body).unwrap_or(Value::Null);
        Resp {
            status,
            headers,
            body,
            json,
        }
    }

    pub async fn get(&self, path: &str) -> Resp {
        self.req(reqwest::Method::GET, path, None, &[]).await
    }

    pub async fn post_json(&self, path: &str, body: &Value) -> Resp {
        self.req(
            reqwest::Method::POST,
            path,
            Some(("application/json", serde_json::to_vec(body).unwrap())),
            &[],
        )
        .await
    }

    pub async fn put_json(&self, path: &str, body: &Value) -> Resp {
        self.req(
            reqwest::Method::PUT,
            path,
            Some(("application/json", serde_json::to_vec(body).unwrap())),
            &[],
        )
        .await
    }

    /// `POST path` with a JSON `body` and owned `headers` (a signed
    /// webhook's, from [`signed`]).
    pub async fn post_hook(&self, path: &str, body: &[u8], headers: &[(String, String)]) -> Resp {
        let h: Vec<(&str, &str)> = headers
            .iter()
            .map(|(k, v)| (k.as_str(), v.as_str()))
            .collect();
        self.req(
            reqwest::Method::POST,
            path,
            Some(("application/json", body.to_vec())),
            &h,
        )
        .await
    }

    /// `POST path` with `body`, signed with `secret` as Standard Webhooks
    /// would: delivery `id`, timestamp `ts`.
    pub async fn post_signed(
        &self,
        path: &str,
        secret: &str,
        id: &str,
        ts: i64,
        body: &[u8],
    ) -> Resp {
        self.post_hook(path, body, &signed(secret, id, ts, body))
            .await
    }

    pub async fn post_with(&self, path: &str, body: &Value, headers: &[(&str, &str)]) -> Resp {
        self.req(
            reqwest::Method::POST,
            path,
            Some(("application/json", serde_json::to_vec(body).unwrap())),
            headers,
        )
        .await
    }

    /// [`Self::post_with`], `None` when the request or its answer was cut
    /// off (a node killed meanwhile).
    pub async fn try_post_with(
        &self,
        path: &str,
        body: &Value,
        headers: &[(&str, &str)],
    ) -> Option<Resp> {
        let mut r = self
            .http
            .post(format!("{}{path}", self.url))
            .header("content-type", "application/json")
            .body(serde_json::to_vec(body).unwrap());
        for (k, v) in headers {
            r = r.header(*k, *v);
        }
        let resp = r.send().await.ok()?;
        let status = resp.status().as_u16();
        let headers = resp.headers().clone();
        let body = resp.bytes().await.ok()?.to_vec();
        let json = serde_json::from_slice(&body).unwrap_or(Value::Null);
        Some(Resp {
            status,
            headers,
            body,
            json,
        })
    }

    pub async fn delete(&self, path: &str) -> Resp {
        self.req(reqwest::Method::DELETE, path, None, &[]).await
    }

    /// Deploy a component with a JSON config.
    pub async fn deploy(&self, ty: &str, code: &[u8], config: Value) -> Resp {
        use base64::Engine as _;
        let manifest = serde_json::json!({
            "kind": "wasm",
            "code_base64": base64::engine::general_purpose::STANDARD.encode(code),
            "config": config,
        });
        self.deploy_manifest(ty, &manifest).await
    }

    /// Deploy type `ty` from a JSON manifest (`{"kind": …, …}`).
    pub async fn deploy_manifest(&self, ty: &str, manifest: &Value) -> Resp {
        self.req(
            reqwest::Method::PUT,
            &format!("/v1/types/{ty}"),
            Some(("application/json", serde_json::to_vec(manifest).unwrap())),
            &[],
        )
        .await
    }

    /// Deploy a JavaScript module as type `ty`.
    pub async fn deploy_js(&self, ty: &str, source: &str) -> Resp {
        self.req(
            reqwest::Method::PUT,
            &format!("/v1/types/{ty}"),
            Some(("text/javascript", source.as_bytes().to_vec())),
            &[],
        )
        .await
    }

    /// Add `by` to the testkit integer `n` of (ty, id).
    pub async fn add(&self, ty: &str, id: &str, by: i64) -> Resp {
        self.op(
            ty,
            id,
            serde_json::json!({"op": "add", "key": "n", "by": by}),
        )
        .await
    }

    /// Send a testkit op to (ty, id).
    pub async fn op(&self, ty: &str, id: &str, op: Value) -> Resp {
        self.post_json(&format!("/v1/actors/{ty}/{id}"), &op).await
    }

    /// Wait until `f` holds for the actor's info, or panic.
    pub async fn wait_info(
        &self,
        ty: &str,
        id: &str,
        what: &str,
        f: impl Fn(&Value) -> bool,
    ) -> Value {
        let deadline = Instant::now() + Duration::from_secs(30);
        loop {
            let r = self.get(&format!("/v1/actors/{ty}/{id}")).await;
            if r.status == 200 && f(&r.json) {
                return r.json;
            }
            assert!(
                Instant::now() < deadline,
                "timed out waiting for {what}; last info: {}",
                r.json
            );
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }
}

/// A node (in a fresh data directory) with the test actor deployed as `kit`
/// with `config`. Keep the directory alive as long as the node.
pub async fn kit_node(config: Value) -> (tempfile::TempDir, Marmot, Api) {
    let dir = tempdir();
    let m = Marmot::start(&dir.path().join("data")).await;
    let api = m.client();
    let r = api.deploy("kit", TESTKIT, config).await;
    assert_eq!(r.status, 201, "deploy: {}", r.json);
    (dir, m, api)
}

/// Seconds since the Unix epoch, as webhook timestamps count them.
/// Every page of the listing at `path` (its query kept), following
/// `next_after`: the items under `field`, and how many pages held them.
pub async fn all_pages(api: &Api, path: &str, field: &str) -> (Vec<Value>, usize) {
    let sep = if path.contains('?') { '&' } else { '?' };
    let (mut items, mut pages, mut after) = (Vec::new(), 0, None::<String>);
    loop {
        let url = match &after {
            Some(a) => format!("{path}{sep}after={a}"),
            None => path.to_owned(),
        };
        let r = api.get(&url).await;
        assert_eq!(r.status, 200, "{url}: {}", r.json);
        let got = r.json[field].as_array().cloned().unwrap_or_default();
        assert!(!got.is_empty(), "{url}: an empty page");
        items.extend(got);
        pages += 1;
        match r.json["next_after"].as_str() {
            Some(next) => after = Some(next.to_owned()),
            None => return (items, pages),
        }
    }
}

/// Run `marmot ARGS` against the node at `url` (with `token`, if any),
/// and return what it printed, once it succeeded.
pub fn cli_ok(url: &str, token: Option<&str>, args: &[&str]) -> String {
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_marmot"));
    cmd.args(args).args(["--url", url]);
    if let Some(t) = token {
        cmd.args(["--token", t]);
    }
    let out = cmd.output().unwrap();
    assert!(
        out.status.success(),
        "marmot {args:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8(out.stdout).unwrap()
}

pub fn now_s() -> i64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_secs() as i64
}

/// Standard Webhooks headers for `body`, signed with `secret`.
pub fn signed(secret: &str, id: &str, ts: i64, body: &[u8]) -> Vec<(String, String)> {
    let sig = marmot::webhooks::sign(&marmot::webhooks::secret_key(secret), id, ts, body);
    vec![
        ("webhook-id".into(), id.into()),
        ("webhook-timestamp".into(), ts.to_string()),
        ("webhook-signature".into(), sig),
        ("content-type".into(), "application/json".into()),
    ]
}

/// The kinds of an event page's events, in order.
pub fn event_kinds(page: &Value) -> Vec<String> {
    page["events"]
        .as_array()
        .unwrap()
        .iter()
        .map(|e| e["kind"].as_str().unwrap().to_owned())
        .collect()
}

/// A fresh temporary data directory.
/// Every byte the node keeps of its database in `data`: the database file
/// and its journal files, one after the other (for tests that look for what
/// must never be stored in plain text).
pub fn database_bytes(data: &std::path::Path) -> Vec<u8> {
    let mut bytes = std::fs::read(data.join("marmot.redb")).unwrap();
    for name in ["marmot.redb-journal-0", "marmot.redb-journal-1"] {
        bytes.extend(std::fs::read(data.join(name)).unwrap());
    }
    bytes
}

/// A test cannot run here for want of `need` (one of `etcd`, `tmpfs`,
/// `netns`), for the reason `why`. Where the machine was declared to have
/// it (`MARMOT_TEST_REQUIRE`, a comma-separated list that `scripts/test`
/// sets from what it installed and probed) this fails the test, so a CI
/// run never passes by skipping. Elsewhere the test skips, saying so on
/// the process's real stderr, past the harness's capture, so that the
/// skip shows in the log of a passing run.
pub fn skip(need: &str, why: &str) {
    let required = std::env::var("MARMOT_TEST_REQUIRE").unwrap_or_default();
    if required.split(',').any(|n| n.trim() == need) {
        panic!(
            "{why}; MARMOT_TEST_REQUIRE says this machine has `{need}`, so this is a failure, not a skip"
        );
    }
    let test = std::thread::current().name().unwrap_or("a test").to_owned();
    let _ = writeln!(std::io::stderr(), "SKIPPED {test}: {why} (needs `{need}`)");
}

/// Whether `hay` holds the bytes of `needle`.
pub fn holds(hay: &[u8], needle: &str) -> bool {
    hay.windows(needle.len()).any(|w| w == needle.as_bytes())
}

/// A directory for one test's data and logs, removed when dropped — kept
/// when `MARMOT_TEST_KEEP` is set, to read the nodes' logs after a failure
/// (each node logs to `<data>.log`).
pub fn tempdir() -> tempfile::TempDir {
    let keep = std::env::var_os("MARMOT_TEST_KEEP").is_some();
    let dir = tempfile::Builder::new()
        .prefix("marmot-test-")
        .disable_cleanup(keep)
        .tempdir()
        .unwrap();
    if keep {
        eprintln!("keeping {}", dir.path().display());
    }
    dir
}

/// One server-sent-events frame.
#[derive(Debug, Default, Clone)]
pub struct Frame {
    pub id: Option<String>,
    pub event: Option<String>,
    pub data: Option<String>,
    pub retry: Option<u64>,
    pub comment: Option<String>,
}

impl Frame {
    /// The data as JSON.
    pub fn json(&self) -> Value {
        serde_json::from_str(self.data.as_deref().unwrap_or("null")).unwrap()
    }
}

/// An open `text/event-stream` response, read frame by frame.
pub struct SseStream {
    resp: reqwest::Response,
    buf: Vec<u8>,
}

impl Api {
    /// Open an event stream on `path`; panics unless the node answers 200.
    pub async fn sse(&self, path: &str, last_event_id: Option<&str>) -> SseStream {
        let resp = self.sse_response(path, last_event_id).await;
        assert_eq!(resp.status(), 200, "{}", resp.text().await.unwrap());
        assert_eq!(
            resp.headers()["content-type"].to_str().unwrap(),
            "text/event-stream"
        );
        SseStream {
            resp,
            buf: Vec::new(),
        }
    }

    /// The raw response to an event-stream request.
    pub async fn sse_response(&self, path: &str, last_event_id: Option<&str>) -> reqwest::Response {
        let mut req = self
            .http
            .get(format!("{}{path}", self.url))
            .header("accept", "text/event-stream");
        if let Some(id) = last_event_id {
            req = req.header("last-event-id", id);
        }
        req.send().await.unwrap()
    }
}

impl SseStream {
    /// The next frame (comments included), or `None` when the stream ends or
    /// nothing arrives within `timeout`.
    pub async fn next_frame(&mut self, timeout: Duration) -> Option<Frame> {
        let deadline = tokio::time::Instant::now() + timeout;
        loop {
            if let Some(end) = self.buf.windows(2).position(|w| w == b"\n\n") {
                let raw: Vec<u8> = self.buf.drain(..end + 2).collect();
                let text = String::from_utf8(raw).unwrap();
                let mut f = Frame::default();
                for line in text.lines().filter(|l| !l.is_empty()) {
                    let (field, value) = line.split_once(':').unwrap_or((line, ""));
                    let value = value.strip_prefix(' ').unwrap_or(value).to_owned();
                    match field {
                        "" => f.comment = Some(value),
                        "id" => f.id = Some(value),
                        "event" => f.event = Some(value),
                        "data" => {
                            f.data = Some(match f.data.take() {
                                Some(d) => format!("{d}\n{value}"),
                                None => value,
                            })
                        }
                        "retry" => f.retry = value.parse().ok(),
                        _ => {}
                    }
                }
                return Some(f);
            }
            match tokio::time::timeout_at(deadline, self.resp.chunk()).await {
                Ok(Ok(Some(chunk))) => self.buf.extend_from_slice(&chunk),
                _ => return None,
            }
        }
    }

    /// Whether the server ends the stream within `timeout` (frames before
    /// the end are read and dropped): a stream still open then, or one
    /// that failed, is `false`.
    pub async fn ends_within(&mut self, timeout: Duration) -> bool {
        let deadline = tokio::time::Instant::now() + timeout;
        loop {
            match tokio::time::timeout_at(deadline, self.resp.chunk()).await {
                Ok(Ok(Some(_))) => {}
                Ok(Ok(None)) => return true,
                Ok(Err(_)) | Err(_) => return false,
            }
        }
    }

    /// The next frame that carries an event (skips comments and hints).
    pub async fn next_event(&mut self, timeout: Duration) -> Option<Frame> {
        let deadline = tokio::time::Instant::now() + timeout;
        loop {
            let left = deadline.saturating_duration_since(tokio::time::Instant::now());
            let f = self.next_frame(left).await?;
            if f.data.is_some() {
                return Some(f);
            }
        }
    }
}

/// The value of the unlabelled sample `name` in Prometheus metrics `text`
/// (0 when absent).
pub fn metric(text: &str, name: &str) -> f64 {
    sample(text, name).unwrap_or(0.0)
}

/// The value of the unlabelled sample `name` in Prometheus metrics `text`,
/// if it is there (a check for 0 should not pass on a missing metric).
pub fn sample(text: &str, name: &str) -> Option<f64> {
    text.lines()
        .find(|l| l.starts_with(name) && l[name.len()..].starts_with(' '))
        .and_then(|l| l.rsplit(' ').next())
        .and_then(|v| v.parse().ok())
}

/// A fresh test CA and a server certificate it signed for `names` (DNS
/// names or IP addresses): (server config, the CA's PEM for clients).
pub fn test_tls(names: &[&str]) -> (std::sync::Arc<rustls::ServerConfig>, String) {
    use rcgen::{BasicConstraints, CertificateParams, CertifiedIssuer, DnType, IsCa, KeyPair};
    let mut ca = CertificateParams::new(Vec::<String>::new()).unwrap();
    ca.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
    ca.distinguished_name
        .push(DnType::CommonName, "marmot test CA");
    let ca = CertifiedIssuer::self_signed(ca, KeyPair::generate().unwrap()).unwrap();
    let key = KeyPair::generate().unwrap();
    let cert = CertificateParams::new(names.iter().map(|n| n.to_string()).collect::<Vec<_>>())
        .unwrap()
        .signed_by(&key, &ca)
        .unwrap();
    let config = rustls::ServerConfig::builder()
        .with_no_client_auth()
        .with_single_cert(
            vec![cert.der().clone()],
            rustls::pki_types::PrivateKeyDer::Pkcs8(key.serialize_der().into()),
        )
        .unwrap();
    (std::sync::Arc::new(config), ca.pem())
}

/// `schema` with every `$ref` into `#/components/schemas` replaced by
/// what it names (the checker reads no `$ref`).
fn inlined(schema: &Value, doc: &Value) -> Value {
    match schema {
        Value::Object(m) => {
            if let Some(r) = m.get("$ref").and_then(Value::as_str) {
                let name = r
                    .strip_prefix("#/components/schemas/")
                    .unwrap_or_else(|| panic!("a $ref outside the components: {r}"));
                let target = &doc["components"]["schemas"][name];
                assert!(!target.is_null(), "$ref to a missing schema: {r}");
                return inlined(target, doc);
            }
            Value::Object(
                m.iter()
                    .map(|(k, v)| (k.clone(), inlined(v, doc)))
                    .collect(),
            )
        }
        Value::Array(a) => Value::Array(a.iter().map(|v| inlined(v, doc)).collect()),
        other => other.clone(),
    }
}

/// Asserts that `r`, the answer to `method path` (the document's spelling
/// of the path), has a status the document lists with a JSON body, and a
/// body its schema takes. Returns the body.
pub fn documented(doc: &Value, method: &str, path: &str, r: &Resp) -> Value {
    let what = format!(
        "{method} {path}: {} {}",
        r.status,
        String::from_utf8_lossy(&r.body)
    );
    let response = &doc["paths"][path][method]["responses"][r.status.to_string()];
    assert!(!response.is_null(), "undocumented status: {what}");
    let schema = &response["content"]["application/json"]["schema"];
    assert!(
        schema.is_object() && schema != &serde_json::json!({}),
        "no schema for the body: {what}"
    );
    let schema = inlined(schema, doc);
    if let Err(e) = marmot_core::schema::check(&schema, &r.json) {
        panic!("{what}\ndoes not match the document: {e}\nschema: {schema}");
    }
    r.json.clone()
}
