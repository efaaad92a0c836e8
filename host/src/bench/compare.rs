//! `vs-workerd`: Marmot and Cloudflare's workerd side by side.
//!
//! Three servers run at once, each in its own process on loopback: Marmot
//! with the Rust counter (`examples/counter`), Marmot with the same counter
//! in JavaScript, and workerd with the counter as a Durable Object on local
//! SQLite ([`super::peer`]). The same `wrk -t1` script drives all three with
//! the same paths and bodies, one at a time, alternating A B C A B C … so
//! drift on a noisy machine hits every side alike. Each scenario prints
//! every run, then the median per side and the ratios to workerd.
//!
//! Both Marmot servers run with the **default configuration** and default
//! type settings, as a new user's `marmot dev` would: nothing is sized for
//! the benchmark, so the numbers include whatever the defaults cost.

use std::time::Duration;

use super::http::{LoadResult, Target, create_typed, have_wrk, wrk_load};
use super::peer::Workerd;
use super::server::{ServerProc, cpu_of, pss_of, rss_of};
use super::{BenchArgs, Percentiles};

/// One server under test.
struct Side {
    name: &'static str,
    addr: std::net::SocketAddr,
    pid: u32,
}

/// A scenario's runs: per side, (turns/s, latency, CPU µs per request).
struct Runs {
    scenario: String,
    per_side: Vec<Vec<(f64, Percentiles, f64)>>,
}

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(f64::total_cmp);
    match v.len() {
        0 => 0.0,
        n if n % 2 == 1 => v[n / 2],
        n => (v[n / 2 - 1] + v[n / 2]) / 2.0,
    }
}

fn ms(d: Duration) -> f64 {
    d.as_secs_f64() * 1e3
}

/// Wait until every side is idle (under 4% of a core for half a second —
/// CPU time moves in 10 ms steps —, at most 10 s): a peer still working
/// through the tail of its previous run must not slow down the next side's
/// run.
async fn settle(sides: &[Side]) -> anyhow::Result<()> {
    let window = Duration::from_millis(500);
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    loop {
        let before: Vec<Duration> = sides
            .iter()
            .map(|s| cpu_of(s.pid))
            .collect::<anyhow::Result<_>>()?;
        tokio::time::sleep(window).await;
        let busy: Duration = sides
            .iter()
            .zip(before)
            .map(|(s, b)| cpu_of(s.pid).map(|a| a.saturating_sub(b)))
            .sum::<anyhow::Result<Duration>>()?;
        if busy <= window / 25 || std::time::Instant::now() > deadline {
            return Ok(());
        }
    }
}

/// Run `rounds` rounds of `target(side, round)` over every side.
async fn alternate(
    sides: &[Side],
    scenario: &str,
    rounds: usize,
    conns: usize,
    duration: Duration,
    target: impl Fn(&Side, usize) -> Target,
) -> anyhow::Result<Runs> {
    let mut per_side: Vec<Vec<(f64, Percentiles, f64)>> =
        sides.iter().map(|_| Vec::new()).collect();
    for round in 0..rounds {
        for (i, side) in sides.iter().enumerate() {
            let t = target(side, round);
            settle(sides).await?;
            if t.actors > 1 {
                // Every actor awake when the run starts. A side sits idle
                // while the other two run (~25 s, near Marmot's 30 s idle
                // timeout; workerd may evict idle objects too), so without
                // this pass a run mixed in however many wakes that gap
                // happened to cause, and at 10,000 actors a run is only
                // ~5 turns per actor: the steady state across many actors
                // is what the scenario measures, wakes have their own.
                create_typed(t.addr, "counter", t.actors).await?;
                settle(sides).await?;
            }
            let cpu0 = cpu_of(side.pid)?;
            let r: LoadResult = wrk_load(&t, conns, duration).await?;
            let cpu = cpu_of(side.pid)? - cpu0;
            let cpu_us = cpu.as_secs_f64() * 1e6 / (r.requests.max(1) as f64);
            println!(
                "  {scenario:<7} round {}  {:<10} {:>8.0}/s  p50 {:>7.2} ms  p90 {:>7.2} ms  p99 {:>7.2} ms  CPU {:>6.0} µs/req  errors {}",
                round + 1,
                side.name,
                r.rate(),
                ms(r.latency.p50),
                ms(r.latency.p90),
                ms(r.latency.p99),
                cpu_us,
                r.errors
            );
            per_side[i].push((r.rate(), r.latency, cpu_us));
        }
    }
    Ok(Runs {
        scenario: scenario.to_owned(),
        per_side,
    })
}

/// Median rate and p50/p99 (ms) per side.
fn summary(runs: &Runs) -> Vec<(f64, f64, f64)> {
    runs.per_side
        .iter()
        .map(|v| {
            (
                median(v.iter().map(|r| r.0).collect()),
                median(v.iter().map(|r| ms(r.1.p50)).collect()),
                median(v.iter().map(|r| ms(r.1.p99)).collect()),
            )
        })
        .collect()
}

/// This process's soft limit of open files (children inherit it).
fn open_files_limit() -> Option<u64> {
    std::fs::read_to_string("/proc/self/limits")
        .ok()?
        .lines()
        .find(|l| l.starts_with("Max open files"))?
        .split_whitespace()
        .nth(3)?
        .parse()
        .ok()
}

/// `vs-workerd`.
pub(super) async fn vs_workerd(args: &BenchArgs) -> anyhow::Result<()> {
    anyhow::ensure!(
        have_wrk(),
        "vs-workerd needs wrk (Debian package `wrk`); scripts/bench-vs-workerd installs it"
    );
    let bin = Workerd::locate(args.workerd.as_deref())?;
    let actors = args.actors.unwrap_or(10_000).max(1);
    // workerd holds a SQLite database and its WAL open per object.
    if let Some(limit) = open_files_limit()
        && limit < 2 * actors as u64 + 1024
    {
        eprintln!(
            "warning: {limit} open files allowed; workerd needs ~2 per object and will fail requests \
             (run `ulimit -n 1048576` first; scripts/bench-vs-workerd does)"
        );
    }
    let rounds = args.rounds.max(1);
    let duration = Duration::from_secs(args.duration.max(1));
    let dir = tempfile::Builder::new().prefix("marmot-bench-").tempdir()?;
    let counters = |n: usize| {
        move |s: &Side, _round: usize| Target {
            addr: s.addr,
            prefix: "/v1/actors/counter/a".into(),
            actors: n,
        }
    };
    let warm_up = Duration::from_secs(2);
    let mut all = Vec::new();

    // One hot actor, then creation, on one set of servers.
    let servers = Servers::start(&dir.path().join("a"), &bin).await?;
    println!(
        "peer: workerd {} (Durable Objects, enableSql, localDisk storage); marmot: default configuration; load: wrk -t1 -c{} (spread: -c32 and -c64 over {actors} actors created first), {}s per run, {rounds} rounds, alternating",
        servers.workerd.version,
        args.connections,
        duration.as_secs()
    );
    let sides = servers.sides();
    eprintln!("  warming up (hot)…");
    alternate(&sides, "warm-up", 1, args.connections, warm_up, counters(1)).await?;
    all.push(
        alternate(
            &sides,
            "hot",
            rounds,
            args.connections,
            duration,
            counters(1),
        )
        .await?,
    );
    // A brand-new actor per request, one connection: creation latency. Short
    // runs keep every side under its active cap (no eviction mixed in).
    all.push(
        alternate(
            &sides,
            "create",
            rounds,
            1,
            Duration::from_secs(3),
            |s, round| Target {
                addr: s.addr,
                prefix: format!("/v1/actors/counter/new-{round}-"),
                actors: 0,
            },
        )
        .await?,
    );
    servers.stop();

    // Across many actors, on fresh servers, every actor created first.
    let servers = Servers::start(&dir.path().join("b"), &bin).await?;
    let sides = servers.sides();
    for s in &sides {
        eprintln!("  creating {actors} actors on {}…", s.name);
        create_typed(s.addr, "counter", actors).await?;
    }
    alternate(
        &sides,
        "warm-up",
        1,
        args.connections,
        warm_up,
        counters(actors),
    )
    .await?;
    // Round robin over every actor at the two concurrencies of the issue
    // that set this workload (-c32, -c64), whatever `--connections` says.
    for conns in [32, 64] {
        all.push(
            alternate(
                &sides,
                &format!("spread{conns}"),
                rounds,
                conns,
                duration,
                counters(actors),
            )
            .await?,
        );
    }
    // Each side read just after a pass over its actors: by now the first
    // sides have sat idle long enough to hibernate everything.
    let mut memory: Vec<(u64, u64)> = Vec::new();
    for s in &sides {
        settle(&sides).await?;
        create_typed(s.addr, "counter", actors).await?;
        memory.push((rss_of(s.pid)?, pss_of(s.pid)?));
    }
    servers.stop();

    println!();
    println!(
        "summary (median of {rounds} rounds; ratio = Marmot ÷ workerd, higher is better for turns/s)"
    );
    println!(
        "  {:<8} {:>22} {:>22} {:>22} {:>9} {:>9}",
        "scenario", "marmot", "marmot-js", "workerd", "ratio", "ratio-js"
    );
    for runs in &all {
        let s = summary(runs);
        let cell =
            |(rate, p50, p99): (f64, f64, f64)| format!("{rate:.0}/s p50 {p50:.1} p99 {p99:.1}");
        println!(
            "  {:<8} {:>22} {:>22} {:>22} {:>8.1}× {:>8.1}×",
            runs.scenario,
            cell(s[0]),
            cell(s[1]),
            cell(s[2]),
            s[0].0 / s[2].0.max(1e-9),
            s[1].0 / s[2].0.max(1e-9),
        );
    }
    let mb = |b: u64| b as f64 / (1024.0 * 1024.0);
    for (what, pick) in [
        ("RSS", (|m: &(u64, u64)| m.0) as fn(&(u64, u64)) -> u64),
        ("PSS", |m| m.1),
    ] {
        let [rust, js, wd] = [pick(&memory[0]), pick(&memory[1]), pick(&memory[2])];
        println!(
            "  {what} with {actors} actors active: marmot {:.0} MB, marmot-js {:.0} MB, workerd {:.0} MB (workerd ÷ marmot {:.2}×, ÷ marmot-js {:.2}×)",
            mb(rust),
            mb(js),
            mb(wd),
            wd as f64 / rust.max(1) as f64,
            wd as f64 / js.max(1) as f64,
        );
    }
    Ok(())
}

/// The three servers under test.
struct Servers {
    rust: ServerProc,
    js: ServerProc,
    workerd: Workerd,
}

impl Servers {
    /// Marmot with the Rust counter, Marmot with the JavaScript counter (both
    /// with the default configuration and type settings) and workerd, with
    /// data under `dir`.
    async fn start(dir: &std::path::Path, bin: &std::path::Path) -> anyhow::Result<Self> {
        let defaults = serde_json::json!({});
        std::fs::create_dir_all(dir)?;
        let rust = ServerProc::start(&dir.join("rust"), "").await?;
        rust.deploy_counter(defaults.clone()).await?;
        let js = ServerProc::start(&dir.join("js"), "").await?;
        js.deploy_js("counter", super::inproc::JS_COUNTER, defaults)
            .await?;
        let wd_dir = dir.join("workerd");
        std::fs::create_dir_all(&wd_dir)?;
        let workerd = Workerd::start(bin, &wd_dir).await?;
        Ok(Self { rust, js, workerd })
    }

    fn sides(&self) -> [Side; 3] {
        [
            Side {
                name: "marmot",
                addr: self.rust.addr,
                pid: self.rust.pid(),
            },
            Side {
                name: "marmot-js",
                addr: self.js.addr,
                pid: self.js.pid(),
            },
            Side {
                name: "workerd",
                addr: self.workerd.addr,
                pid: self.workerd.pid(),
            },
        ]
    }

    fn stop(self) {
        self.rust.stop();
        self.js.stop();
        drop(self.workerd);
    }
}
