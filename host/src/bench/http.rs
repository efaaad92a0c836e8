//! HTTP throughput: durable turns per second over loopback.

use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use anyhow::Context as _;
use bytes::Bytes;
use http_body_util::{BodyExt, Full};
use hyper::Request;
use hyper_util::rt::TokioIo;

use super::server::{ServerProc, Written};
use super::{BenchArgs, LoadGen, Percentiles, progress};

/// One HTTP/1.1 keep-alive connection.
pub(super) struct Conn {
    sender: hyper::client::conn::http1::SendRequest<Full<Bytes>>,
}

impl Conn {
    pub async fn connect(addr: SocketAddr) -> anyhow::Result<Self> {
        let stream = tokio::net::TcpStream::connect(addr).await?;
        stream.set_nodelay(true)?;
        let (sender, conn) = hyper::client::conn::http1::handshake(TokioIo::new(stream)).await?;
        tokio::spawn(conn);
        Ok(Self { sender })
    }

    pub async fn request(
        &mut self,
        method: &str,
        path: &str,
        content_type: &str,
        body: &[u8],
    ) -> anyhow::Result<(u16, Bytes)> {
        self.request_with(method, path, &[("content-type", content_type)], body)
            .await
    }

    /// A request with the given headers (besides `host`).
    pub async fn request_with(
        &mut self,
        method: &str,
        path: &str,
        headers: &[(&str, &str)],
        body: &[u8],
    ) -> anyhow::Result<(u16, Bytes)> {
        let mut req = Request::builder()
            .method(method)
            .uri(path)
            .header("host", "bench");
        for (k, v) in headers {
            req = req.header(*k, *v);
        }
        let req = req.body(Full::new(Bytes::copy_from_slice(body)))?;
        self.sender.ready().await?;
        let resp = self.sender.send_request(req).await?;
        let status = resp.status().as_u16();
        let body = resp.into_body().collect().await?.to_bytes();
        Ok((status, body))
    }

    /// POST JSON and require a 2xx.
    pub async fn post(&mut self, path: &str, body: &[u8]) -> anyhow::Result<Bytes> {
        let (status, body) = self.request("POST", path, "application/json", body).await?;
        anyhow::ensure!(
            (200..300).contains(&status),
            "POST {path}: {status} {}",
            String::from_utf8_lossy(&body)
        );
        Ok(body)
    }

    pub async fn get(&mut self, path: &str) -> anyhow::Result<(u16, Bytes)> {
        self.request("GET", path, "application/json", b"").await
    }
}

/// Send one writing message to each of `n` counters, 64 at a time.
pub(super) async fn create_actors(addr: SocketAddr, n: usize) -> anyhow::Result<()> {
    create_typed(addr, "counter", n).await
}

/// Send one writing message to each of `n` actors of `ty`, 64 at a time.
pub(super) async fn create_typed(
    addr: SocketAddr,
    ty: &'static str,
    n: usize,
) -> anyhow::Result<()> {
    let next = Arc::new(AtomicUsize::new(0));
    let done = Arc::new(AtomicUsize::new(0));
    let mut tasks = Vec::new();
    for _ in 0..64.min(n) {
        let next = next.clone();
        let done = done.clone();
        tasks.push(tokio::spawn(async move {
            let mut c = Conn::connect(addr).await?;
            loop {
                let i = next.fetch_add(1, Ordering::Relaxed);
                if i >= n {
                    return anyhow::Ok(());
                }
                c.post(&format!("/v1/actors/{ty}/a{i}"), br#"{"by":1}"#)
                    .await?;
                progress("waking actors", done.fetch_add(1, Ordering::Relaxed) + 1, n);
            }
        }));
    }
    for t in tasks {
        t.await??;
    }
    Ok(())
}

/// What a load run posts `{"by":1}` to: `{prefix}{i}` for actors `i` in
/// `0..actors`, or, with `actors == 0`, a fresh actor for every request.
#[derive(Clone)]
pub(super) struct Target {
    pub addr: SocketAddr,
    /// Path up to the actor number, e.g. `/v1/actors/counter/a`.
    pub prefix: String,
    pub actors: usize,
}

/// Result of a load run.
pub(super) struct LoadResult {
    pub requests: u64,
    pub errors: u64,
    pub elapsed: Duration,
    pub latency: Percentiles,
}

impl LoadResult {
    /// Successful requests per second.
    pub fn rate(&self) -> f64 {
        self.requests as f64 / self.elapsed.as_secs_f64().max(1e-9)
    }
}

async fn builtin_load(
    target: &Target,
    conns: usize,
    duration: Duration,
) -> anyhow::Result<LoadResult> {
    let (addr, actors) = (target.addr, target.actors);
    let started = Instant::now();
    let deadline = started + duration;
    let mut tasks = Vec::new();
    for t in 0..conns {
        let prefix = target.prefix.clone();
        tasks.push(tokio::spawn(async move {
            let mut c = Conn::connect(addr).await?;
            let mut lat = Vec::new();
            let mut errors = 0u64;
            let mut i = t * 7919;
            while Instant::now() < deadline {
                i += 1;
                let n = if actors == 0 { i } else { i % actors };
                let path = format!("{prefix}{n}");
                let s = Instant::now();
                match c
                    .request("POST", &path, "application/json", br#"{"by":1}"#)
                    .await
                {
                    Ok((200, _)) => lat.push(s.elapsed()),
                    _ => errors += 1,
                }
            }
            anyhow::Ok((lat, errors))
        }));
    }
    let mut all = Vec::new();
    let mut errors = 0;
    for t in tasks {
        let (lat, e) = t.await??;
        all.extend(lat);
        errors += e;
    }
    Ok(LoadResult {
        requests: all.len() as u64,
        errors,
        elapsed: started.elapsed(),
        latency: Percentiles::of(&mut all),
    })
}

const WRK_SCRIPT: &str = r#"
local n = tonumber(os.getenv("MARMOT_BENCH_ACTORS") or "1")
local prefix = os.getenv("MARMOT_BENCH_PREFIX") or "/v1/actors/counter/a"
local threads = 0
local counter = 0
function setup(thread)
  thread:set("tid", threads)
  threads = threads + 1
end
function init(args)
  counter = (tid or 0) * 7919
end
wrk.method = "POST"
wrk.body = '{"by":1}'
wrk.headers["Content-Type"] = "application/json"
function request()
  counter = counter + 1
  if n == 0 then
    return wrk.format(nil, prefix .. counter)
  end
  return wrk.format(nil, prefix .. (counter % n))
end
function done(summary, latency, requests)
  local e = summary.errors
  io.write(string.format("MARMOT %d %d %d %d %d %d %d %d\n", summary.requests, summary.duration,
    latency:percentile(50), latency:percentile(90), latency:percentile(99),
    e.connect + e.read + e.write + e.status + e.timeout, e.status, latency.max))
end
"#;

/// Drive `target` with `wrk -t1 -c{conns}` for `duration`.
pub(super) async fn wrk_load(
    target: &Target,
    conns: usize,
    duration: Duration,
) -> anyhow::Result<LoadResult> {
    let script = std::env::temp_dir().join(format!("marmot-bench-{}.lua", std::process::id()));
    std::fs::write(&script, WRK_SCRIPT)?;
    // Removed however the load ends (an interrupted benchmark drops it).
    struct Remove<'a>(&'a std::path::Path);
    impl Drop for Remove<'_> {
        fn drop(&mut self) {
            let _ = std::fs::remove_file(self.0);
        }
    }
    let _remove = Remove(&script);
    let out = tokio::process::Command::new("wrk")
        .args([
            "-t1",
            &format!("-c{conns}"),
            &format!("-d{}s", duration.as_secs().max(1)),
            "-s",
        ])
        .arg(&script)
        .arg(format!("http://{}", target.addr))
        .env("MARMOT_BENCH_ACTORS", target.actors.to_string())
        .env("MARMOT_BENCH_PREFIX", &target.prefix)
        // Stopped with the benchmark (SIGINT, SIGTERM).
        .kill_on_drop(true)
        .output()
        .await
        .context("cannot run wrk")?;
    let stdout = String::from_utf8_lossy(&out.stdout);
    let line = stdout
        .lines()
        .find(|l| l.starts_with("MARMOT "))
        .with_context(|| {
            format!(
                "unexpected wrk output:\n{stdout}\n{}",
                String::from_utf8_lossy(&out.stderr)
            )
        })?;
    let v: Vec<u64> = line
        .split_whitespace()
        .skip(1)
        .map(|x| x.parse().unwrap_or(0))
        .collect();
    let us = Duration::from_micros;
    anyhow::ensure!(v.len() == 8, "unexpected wrk summary: {line}");
    // wrk counts non-2xx responses as requests; only successes count here.
    Ok(LoadResult {
        requests: v[0].saturating_sub(v[6]),
        errors: v[5],
        elapsed: us(v[1]),
        latency: Percentiles {
            n: v[0] as usize,
            p50: us(v[2]),
            p90: us(v[3]),
            p99: us(v[4]),
            max: us(v[7]),
        },
    })
}

pub(super) fn have_wrk() -> bool {
    std::process::Command::new("wrk")
        .arg("--version")
        .output()
        .is_ok()
}

/// Deploy the counter the scenario asked for (`--js`: the JavaScript one)
/// `versions` times, each with a config of its own, so that the type has
/// that many versions; return its type name.
async fn deploy_counter_of(
    server: &ServerProc,
    js: bool,
    versions: usize,
) -> anyhow::Result<&'static str> {
    for v in 0..versions.max(1) {
        // Identical code and config would return the current version.
        let config = serde_json::json!({"idle_timeout_ms": 3_600_000 + v});
        if js {
            server
                .deploy_js("jscounter", super::inproc::JS_COUNTER, config)
                .await?;
        } else {
            server.deploy_counter(config).await?;
        }
    }
    Ok(if js { "jscounter" } else { "counter" })
}

/// Durable turns/s over HTTP across `actors` counters.
pub(super) async fn throughput(args: &BenchArgs, actors: usize) -> anyhow::Result<()> {
    let dir = tempfile::Builder::new().prefix("marmot-bench-").tempdir()?;
    let config = super::server::limits_for(actors);
    let server = ServerProc::start(&dir.path().join("data"), &config).await?;
    let ty = deploy_counter_of(&server, args.js, args.versions).await?;
    let pss_empty = server.pss()?;
    create_typed(server.addr, ty, actors).await?;
    let pss_created = server.pss()?;
    let target = Target {
        addr: server.addr,
        prefix: format!("/v1/actors/{ty}/a"),
        actors,
    };
    let use_wrk = match args.load {
        LoadGen::Wrk => true,
        LoadGen::Builtin => false,
        LoadGen::Auto => have_wrk(),
    };
    let gen_name = if use_wrk {
        "wrk -t1"
    } else {
        "built-in client"
    };
    let run = |d: Duration| {
        let target = target.clone();
        async move {
            if use_wrk {
                wrk_load(&target, args.connections, d).await
            } else {
                builtin_load(&target, args.connections, d).await
            }
        }
    };
    // Warm-up, not measured.
    run(Duration::from_secs(2)).await?;
    let before_idle = if args.idle > 0 {
        let before = trims(server.addr).await?;
        tokio::time::sleep(Duration::from_secs(args.idle)).await;
        Some(before)
    } else {
        None
    };
    let stats0 = commit_stats(server.addr).await?;
    let trims0 = trims(server.addr).await?;
    let idle_trims = before_idle.map(|before| trims0 - before);
    let cpu0 = server.cpu_time()?;
    let writer0 = server.writer_cpu_time()?;
    let written0 = server.written_bytes()?;
    let tlb0 = super::server::tlb_shootdowns();
    let r = run(Duration::from_secs(args.duration)).await?;
    let cpu1 = server.cpu_time()?;
    let writer = server.writer_cpu_time()?.saturating_sub(writer0);
    let written = server.written_bytes()?.saturating_sub(written0);
    let tlb1 = super::server::tlb_shootdowns();
    let stats = commit_stats(server.addr).await? - stats0;
    let trims = trims(server.addr).await? - trims0;
    let pss_loaded = server.pss()?;
    let rps = r.requests as f64 / r.elapsed.as_secs_f64();
    let name = if actors == 1 {
        "http-hot"
    } else {
        "http-spread"
    };
    let kind = if args.js { "JavaScript" } else { "Rust" };
    let versions = if args.versions > 1 {
        format!(", the type deployed {} times", args.versions)
    } else {
        String::new()
    };
    println!(
        "scenario {name} ({actors} {kind} actor(s), {} connections, {gen_name}, {}s{versions})",
        args.connections,
        r.elapsed.as_secs()
    );
    println!("  durable turns/s: {rps:.0}   errors: {}", r.errors);
    println!("  latency {}", r.latency.line());
    if r.requests > 0 {
        println!(
            "  node CPU per turn: {:.1}µs (user+system, HTTP included; steadier than turns/s on a noisy machine)",
            (cpu1 - cpu0).as_secs_f64() * 1e6 / r.requests as f64
        );
        if let (Some(before), Some(after)) = (tlb0, tlb1) {
            println!(
                "  TLB shootdowns per turn: {:.2} (whole machine, /proc/interrupts)",
                after.saturating_sub(before) as f64 / r.requests as f64
            );
        }
    }
    if let Some(line) = commit_line(stats, writer, written, r.elapsed) {
        println!("{line}");
    }
    if let Some(idle_trims) = idle_trims {
        println!(
            "  idle {}s between the warm-up and the load: {idle_trims:.0} sandboxes trimmed then",
            args.idle
        );
    }
    if args.js {
        println!("  idle sandboxes trimmed during the run: {trims:.0}");
    }
    // What every active actor costs, once created and once it has taken
    // turns under load (the figure `vs-workerd` reports for the whole node).
    let per_actor = |pss: u64| pss.saturating_sub(pss_empty) as f64 / actors as f64 / 1024.0;
    println!(
        "  PSS per actor: {:.1} KB after its first turn, {:.1} KB after the load (node {:.0} MB)",
        per_actor(pss_created),
        per_actor(pss_loaded),
        pss_loaded as f64 / (1024.0 * 1024.0)
    );
    server.stop();
    Ok(())
}

/// First messages to brand-new actors over HTTP (`{"by":1}` to a fresh
/// counter per request): on one connection (latency), then on
/// `--connections` (throughput). Each side runs `--duration` seconds
/// (at most 3, so the default active cap is never reached), after a
/// warm-up on other ids.
pub(super) async fn create(args: &BenchArgs) -> anyhow::Result<()> {
    let dir = tempfile::Builder::new().prefix("marmot-bench-").tempdir()?;
    let server = ServerProc::start(&dir.path().join("data"), "").await?;
    let ty = deploy_counter_of(&server, args.js, 1).await?;
    let secs = args.duration.min(3);
    let target = |prefix: &str| Target {
        addr: server.addr,
        prefix: format!("/v1/actors/{ty}/{prefix}-"),
        actors: 0,
    };
    builtin_load(&target("warm"), 4, Duration::from_secs(1)).await?;
    let kind = if args.js { "JavaScript" } else { "Rust" };
    println!(
        "scenario create (a new {kind} counter actor per request, default config, {secs}s per run)"
    );
    // Each run its own ids (`one-`, `many-`), so that no run reaches an
    // actor an earlier one made, even with `--connections 1`.
    for (label, conns) in [
        ("one connection", 1),
        ("many connections", args.connections),
    ] {
        let stats0 = commit_stats(server.addr).await?;
        let cpu0 = server.cpu_time()?;
        let writer0 = server.writer_cpu_time()?;
        let written0 = server.written_bytes()?;
        let r = builtin_load(
            &target(label.split(' ').next().unwrap_or(label)),
            conns,
            Duration::from_secs(secs),
        )
        .await?;
        let cpu = server.cpu_time()?.saturating_sub(cpu0);
        let writer = server.writer_cpu_time()?.saturating_sub(writer0);
        let written = server.written_bytes()?.saturating_sub(written0);
        let stats = commit_stats(server.addr).await? - stats0;
        println!(
            "  {label} ({conns}): {:.0} new actors/s   errors: {}   latency {}",
            r.rate(),
            r.errors,
            r.latency.line()
        );
        let commits = stats.commits;
        if r.requests > 0 && commits > 0.0 {
            println!(
                "    commits per new actor: {:.2}   mean ops per commit: {:.1}   node CPU per new actor: {:.0}µs ({:.0}µs of it the writer's)   written to disk: {} per new actor",
                commits / r.requests as f64,
                stats.ops / commits,
                cpu.as_secs_f64() * 1e6 / r.requests as f64,
                writer.as_secs_f64() * 1e6 / r.requests as f64,
                per_op(written, r.requests as f64)
            );
        }
    }
    // More new actors than the active cap went through the pool: what it
    // holds now is what a node that keeps taking new actors holds.
    let limit = std::fs::read_to_string("/proc/sys/vm/max_map_count")
        .map(|s| s.trim().to_owned())
        .unwrap_or_else(|_| "unknown".into());
    println!(
        "  memory mappings after: {} (vm.max_map_count {limit})",
        server.map_count()?
    );
    server.stop();
    Ok(())
}

/// What the writer did over a run of `elapsed`: `commits` commits of
/// `ops` operations in all, using `writer` of CPU and sending `written` to
/// storage. `None` without commits.
///
/// The writer commits one batch at a time, so its CPU and its waits for
/// `fdatasync` bound the commits it can make a second: a writer near a
/// core's worth of time is what limits, and larger batches are how it
/// keeps up. When it is not, the disk is: a commit writes every B-tree
/// page its operations changed, once in its journal record and once more
/// into the database file at the next checkpoint (however many commits
/// changed the page meanwhile), so the bytes per operation say how many
/// pages each one dirties (4 KiB each), and the write requests how well
/// they were merged.
pub(super) fn commit_line(
    stats: CommitStats,
    writer: Duration,
    written: Written,
    elapsed: Duration,
) -> Option<String> {
    let CommitStats { commits, ops, .. } = stats;
    (commits > 0.0).then(|| {
        let mut line = format!(
            "  commits/s: {:.0}   mean ops per commit: {:.1}   writer CPU per commit: {:.0}µs ({:.0}% of a core)",
            commits / elapsed.as_secs_f64(),
            ops / commits,
            writer.as_secs_f64() * 1e6 / commits,
            writer.as_secs_f64() * 100.0 / elapsed.as_secs_f64()
        );
        if ops > 0.0 {
            line.push_str(&format!(
                "\n  written to disk: {} per op ({:.0} MB/s)",
                per_op(written, ops),
                written.bytes as f64 / 1e6 / elapsed.as_secs_f64()
            ));
        }
        line.push_str(&format!(
            "\n  journal checkpoints: {:.1}/s   commits that waited for one: {:.0}",
            stats.checkpoints / elapsed.as_secs_f64(),
            stats.waits
        ));
        line
    })
}

/// "12.0 KB in 2.9 write requests" per one of `n` operations.
fn per_op(written: Written, n: f64) -> String {
    let mut s = format!("{:.1} KB", written.bytes as f64 / 1024.0 / n);
    if let Some(requests) = written.requests {
        s.push_str(&format!(" in {:.2} write requests", requests as f64 / n));
    }
    s
}

/// The writer's counters, from the node's metrics.
#[derive(Clone, Copy, Debug, Default)]
pub(super) struct CommitStats {
    pub commits: f64,
    /// Operations committed.
    pub ops: f64,
    /// Journal checkpoints (syncs of the database file).
    pub checkpoints: f64,
    /// Commits that waited for one.
    pub waits: f64,
}

impl std::ops::Sub for CommitStats {
    type Output = CommitStats;
    fn sub(self, before: CommitStats) -> CommitStats {
        CommitStats {
            commits: self.commits - before.commits,
            ops: self.ops - before.ops,
            checkpoints: self.checkpoints - before.checkpoints,
            waits: self.waits - before.waits,
        }
    }
}

pub(super) async fn commit_stats(addr: SocketAddr) -> anyhow::Result<CommitStats> {
    let text = metrics(addr).await?;
    let find = |name: &str| sample(&text, name).unwrap_or(0.0);
    Ok(CommitStats {
        commits: find("marmot_commits_total"),
        ops: find("marmot_commit_batch_size_sum"),
        checkpoints: find("marmot_storage_journal_checkpoints_total"),
        waits: find("marmot_storage_journal_waits_total"),
    })
}

/// Idle JavaScript sandboxes the node at `addr` has trimmed so far.
pub(super) async fn trims(addr: SocketAddr) -> anyhow::Result<f64> {
    let text = metrics(addr).await?;
    Ok(sample(&text, "marmot_js_sandbox_trims_total").unwrap_or(0.0))
}

/// Fiber stack pages idle instances of the node at `addr` gave back so far.
pub(super) async fn trimmed_stack_pages(addr: SocketAddr) -> anyhow::Result<f64> {
    let text = metrics(addr).await?;
    Ok(sample(&text, "marmot_sandbox_trimmed_stack_pages_total").unwrap_or(0.0))
}

/// The node's Prometheus metrics, as text.
pub(super) async fn metrics(addr: SocketAddr) -> anyhow::Result<String> {
    let mut c = Conn::connect(addr).await?;
    let (_, body) = c.get("/metrics").await?;
    Ok(String::from_utf8_lossy(&body).into_owned())
}

/// The value of sample `name` (a metric name, with its labels if it has
/// any: `marmot_x_total{outcome="ok"}`) in metrics `text`.
pub(super) fn sample(text: &str, name: &str) -> Option<f64> {
    text.lines()
        .find(|l| l.starts_with(name) && l[name.len()..].starts_with([' ', '{']))
        .and_then(|l| l.split_whitespace().last())
        .and_then(|v| v.parse().ok())
}
