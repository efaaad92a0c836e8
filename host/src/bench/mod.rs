//! `marmot bench`: named, reproducible benchmark scenarios.
//!
//! Every scenario prints a machine line, percentiles (p50/p90/p99) and
//! throughput. HTTP scenarios run the node as a separate `marmot dev` process
//! (this same binary) on loopback and drive it with `wrk` when it is
//! installed, else with a built-in closed-loop HTTP/1.1 client; the report
//! says which. Benchmarks are measurements, never pass/fail tests.

mod agent;
mod alarms;
mod backlog;
mod cluster;
mod compare;
mod egress;
mod files;
mod http;
mod inproc;
mod inputs;
mod peer;
mod rss;
mod server;
mod smaps;
mod sse;
mod torture;
mod webhooks;

use std::time::Duration;

use clap::{Args, ValueEnum};

/// `marmot bench` arguments.
#[derive(Args, Clone)]
pub struct BenchArgs {
    /// Scenario to run.
    #[arg(value_enum)]
    pub scenario: Scenario,
    /// Actors to spread over (defaults per scenario).
    #[arg(long, value_parser = at_least_one)]
    pub actors: Option<usize>,
    /// Seconds of measured load for throughput scenarios.
    #[arg(long, default_value_t = 10, value_parser = clap::value_parser!(u64).range(1..))]
    pub duration: u64,
    /// Concurrent connections for throughput scenarios.
    #[arg(long, default_value_t = 64, value_parser = at_least_one)]
    pub connections: usize,
    /// Alarms due per second (alarm-lag, default 10,000) or events per
    /// second (sse-fanout, default 100).
    #[arg(long, value_parser = clap::value_parser!(u64).range(1..))]
    pub rate: Option<u64>,
    /// Live event streams (sse-fanout).
    #[arg(long, default_value_t = 1000, value_parser = at_least_one)]
    pub streams: usize,
    /// Load generator for HTTP throughput scenarios.
    #[arg(long, value_enum, default_value_t = LoadGen::Auto)]
    pub load: LoadGen,
    /// http-hot / http-spread / create: JavaScript counter actors instead
    /// of Rust.
    #[arg(long)]
    pub js: bool,
    /// http-hot / http-spread: seconds every actor sits idle between the
    /// warm-up and the measured load (as each side of `vs-workerd` does
    /// while the others run), so that idle JavaScript sandboxes are
    /// trimmed first.
    #[arg(long, default_value_t = 0)]
    pub idle: u64,
    /// http-hot / http-spread: versions of the counter's type, each deployed
    /// with a config of its own before the load (a type redeployed often
    /// must not make its messages slower).
    #[arg(long, default_value_t = 1, value_parser = at_least_one)]
    pub versions: usize,
    /// vs-workerd: the workerd binary (`scripts/bench-vs-workerd` installs
    /// it from npm).
    #[arg(long, env = "MARMOT_WORKERD")]
    pub workerd: Option<std::path::PathBuf>,
    /// vs-workerd: measured rounds per scenario (A B A B …).
    #[arg(long, default_value_t = 2, value_parser = at_least_one)]
    pub rounds: usize,
    /// torture: `kill -9` cycles.
    #[arg(long, default_value_t = 1000)]
    pub cycles: usize,
    /// cluster: `kill -9` failovers timed after the load.
    #[arg(long, default_value_t = 3)]
    pub failovers: usize,
    /// cluster: actors moved to the other region and back, timed.
    #[arg(long, default_value_t = 20)]
    pub moves: usize,
}

/// A count that must be at least 1: a zero was taken (`--actors 0`
/// printed `n=0 p50=0.0µs`, `--duration 0` became 1 s, `--connections 0`
/// started a node and failed on wrk's usage text).
fn at_least_one(s: &str) -> Result<usize, String> {
    match s.parse::<usize>() {
        Ok(0) => Err("must be at least 1".into()),
        Ok(n) => Ok(n),
        Err(e) => Err(e.to_string()),
    }
}

/// The scenarios.
#[derive(Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum Scenario {
    /// Wake latency hibernated → reply, in-process (read-only and writing turns).
    Wake,
    /// Wake latency hibernated → reply over HTTP on loopback.
    WakeHttp,
    /// Wake latency of JavaScript actors, in-process.
    JsWake,
    /// Fresh-sandbox JavaScript evals, in-process.
    JsEval,
    /// Durable turns/s over HTTP on one hot actor.
    HttpHot,
    /// Durable turns/s over HTTP across many actors (default 10,000).
    HttpSpread,
    /// First messages to brand-new actors over HTTP: one connection, then
    /// `--connections`.
    Create,
    /// RSS with many active actors (default 10,000).
    RssActive,
    /// RSS added by many hibernated actors on disk (default 1,000,000).
    RssHibernated,
    /// RSS with many active JavaScript actors (default 1,000).
    JsRss,
    /// Alarm lag at `--rate` alarms/s across many hibernated actors
    /// (default 10,000 actors, 10,000/s).
    AlarmLag,
    /// Live event streams: one actor's events to many SSE clients (default
    /// 1,000 streams; `--rate 100`).
    SseFanout,
    /// Signed webhooks ingested across many actors (default 10,000), then
    /// replayed to measure de-duplication.
    WebhookIngest,
    /// What the `http` capability adds to a request, side by side with
    /// plain reqwest to the same local server (`--actors` = rounds).
    Fetch,
    /// File writes (committed with their turns) and downloads, small and
    /// large (`--actors` = small files written).
    Files,
    /// A healthy webhook subscription's deliveries alone, then behind
    /// another's backlog for a receiver that never answers (`--actors` =
    /// rows of 100 KB, default 1,000), with the node's CPU.
    WebhookBacklog,
    /// Input requests answered one after another while the actor's settled
    /// ones pile up (`--actors` = requests, default 2,000): an answer's
    /// cost per block, which should not grow.
    Inputs,
    /// The built-in agent harness against the fake provider: overhead per
    /// step, `--actors` (default 1,000) concurrent runs with answers
    /// streamed over ~200 ms (node CPU and RSS), then hibernated.
    Agent,
    /// Side by side with Cloudflare's workerd (Durable Objects on local
    /// SQLite), same load generator, alternating runs, with ratios.
    VsWorkerd,
    /// Routing in a cluster (two nodes on a local etcd) side by side with a
    /// node alone: turns/s and latency for actors the receiving node owns
    /// and for actors it forwards (`--actors` per side, default 1,000).
    Cluster,
    /// Crash torture, not a measurement: `--cycles` (default 1,000) `kill -9`s
    /// under mixed load (`--connections` clients; `--actors` per block of 20
    /// cycles, default 16), every acknowledged effect checked after each
    /// restart.
    Torture,
    /// Every scenario above but vs-workerd and torture, one after another.
    All,
}

/// Which load generator drives HTTP throughput scenarios.
#[derive(Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum LoadGen {
    /// `wrk` if installed, else built-in.
    Auto,
    /// `wrk` (Debian package `wrk`).
    Wrk,
    /// The built-in closed-loop client.
    Builtin,
}

/// Run a scenario. SIGINT or SIGTERM stops it cleanly: the scenario is
/// dropped, so the nodes, load generators and data directories it made go
/// with it (a `kill` left `marmot dev`, `wrk` and their files behind).
pub async fn run(args: BenchArgs) -> anyhow::Result<()> {
    use tokio::signal::unix::{SignalKind, signal};
    let mut term = signal(SignalKind::terminate())?;
    let mut int = signal(SignalKind::interrupt())?;
    tokio::select! {
        r = scenarios(args) => r,
        _ = term.recv() => anyhow::bail!("stopped by SIGTERM; what the benchmark started is cleaned up"),
        _ = int.recv() => anyhow::bail!("interrupted; what the benchmark started is cleaned up"),
    }
}

async fn scenarios(args: BenchArgs) -> anyhow::Result<()> {
    println!("{}", machine_line());
    let scenarios: Vec<Scenario> = match args.scenario {
        Scenario::All => vec![
            Scenario::Wake,
            Scenario::WakeHttp,
            Scenario::JsWake,
            Scenario::JsEval,
            Scenario::HttpHot,
            Scenario::HttpSpread,
            Scenario::Create,
            Scenario::RssActive,
            Scenario::RssHibernated,
            Scenario::JsRss,
            Scenario::AlarmLag,
            Scenario::SseFanout,
            Scenario::WebhookIngest,
            Scenario::Fetch,
            Scenario::Files,
            Scenario::WebhookBacklog,
            Scenario::Inputs,
            Scenario::Agent,
        ],
        s => vec![s],
    };
    for s in scenarios {
        match s {
            Scenario::Wake => inproc::wake(&args).await?,
            Scenario::WakeHttp => inproc::wake_http(&args).await?,
            Scenario::JsWake => inproc::js_wake(&args).await?,
            Scenario::JsEval => inproc::js_eval(&args).await?,
            Scenario::HttpHot => http::throughput(&args, 1).await?,
            Scenario::HttpSpread => http::throughput(&args, args.actors.unwrap_or(10_000)).await?,
            Scenario::Create => http::create(&args).await?,
            Scenario::RssActive => rss::active(&args).await?,
            Scenario::RssHibernated => rss::hibernated(&args).await?,
            Scenario::JsRss => rss::js_active(&args).await?,
            Scenario::AlarmLag => alarms::lag(&args).await?,
            Scenario::SseFanout => sse::fanout(&args).await?,
            Scenario::WebhookIngest => webhooks::ingest(&args).await?,
            Scenario::Fetch => egress::fetch(&args).await?,
            Scenario::Files => files::files(&args).await?,
            Scenario::WebhookBacklog => backlog::backlog(&args).await?,
            Scenario::Inputs => inputs::inputs(&args).await?,
            Scenario::Agent => agent::agent(&args).await?,
            Scenario::VsWorkerd => compare::vs_workerd(&args).await?,
            Scenario::Torture => torture::torture(&args).await?,
            Scenario::Cluster => cluster::cluster(&args).await?,
            Scenario::All => unreachable!(),
        }
    }
    Ok(())
}

/// Start an in-process node on `config` and wait until it is ready.
async fn ready_node(
    config: crate::config::NodeConfig,
) -> anyhow::Result<std::sync::Arc<crate::node::Node>> {
    let node = crate::node::Node::start(config).await?;
    while !node.is_ready() {
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    Ok(node)
}

/// Deploy `code` as type `ty` with actors that stay awake for the whole run.
async fn deploy_awake(
    node: &std::sync::Arc<crate::node::Node>,
    ty: &str,
    kind: crate::storage::schema::CodeKind,
    code: &[u8],
) -> anyhow::Result<()> {
    let config = crate::config::TypeConfig {
        idle_timeout_ms: Some(3_600_000),
        ..Default::default()
    };
    node.deploy(ty, kind, code.to_vec(), config).await?;
    Ok(())
}

/// `cores=… cpu=… kernel=… workers=…`: the node's worker threads too,
/// since they move the numbers (`TOKIO_WORKER_THREADS`; see "One worker
/// thread per core" in docs/design.md). A node the bench starts as its
/// own process inherits the same setting.
pub fn machine_line() -> String {
    let cores = std::thread::available_parallelism().map_or(0, |n| n.get());
    let cpu = std::fs::read_to_string("/proc/cpuinfo")
        .ok()
        .and_then(|s| {
            s.lines()
                .find(|l| l.starts_with("model name"))
                .and_then(|l| l.split(':').nth(1))
                .map(|m| m.trim().to_owned())
        })
        .unwrap_or_else(|| "unknown".into());
    let kernel = std::fs::read_to_string("/proc/sys/kernel/osrelease")
        .map(|s| s.trim().to_owned())
        .unwrap_or_else(|_| "unknown".into());
    let workers = tokio::runtime::Handle::try_current().map_or(0, |h| h.metrics().num_workers());
    format!(
        "machine: cores={cores} cpu=\"{cpu}\" kernel={kernel} workers={workers} marmot={}",
        env!("CARGO_PKG_VERSION")
    )
}

/// Latency percentiles of a sample.
#[derive(Clone, Copy, Debug)]
pub struct Percentiles {
    /// Sample size.
    pub n: usize,
    /// Median.
    pub p50: Duration,
    /// 90th percentile.
    pub p90: Duration,
    /// 99th percentile.
    pub p99: Duration,
    /// Slowest.
    pub max: Duration,
}

impl Percentiles {
    /// Percentiles of `samples` (sorted in place).
    pub fn of(samples: &mut [Duration]) -> Self {
        samples.sort_unstable();
        let at = |q: f64| {
            if samples.is_empty() {
                Duration::ZERO
            } else {
                samples[((samples.len() as f64 * q) as usize).min(samples.len() - 1)]
            }
        };
        Self {
            n: samples.len(),
            p50: at(0.50),
            p90: at(0.90),
            p99: at(0.99),
            max: samples.last().copied().unwrap_or_default(),
        }
    }

    /// `p50=… p90=… p99=… max=…` in microseconds.
    pub fn line(&self) -> String {
        format!(
            "n={} p50={:.1}µs p90={:.1}µs p99={:.1}µs max={:.1}µs",
            self.n,
            us(self.p50),
            us(self.p90),
            us(self.p99),
            us(self.max)
        )
    }
}

fn us(d: Duration) -> f64 {
    d.as_secs_f64() * 1e6
}

/// Print a progress line in place (stderr), for long runs.
pub fn progress_line(what: &str, done: usize, total: usize) {
    progress(what, done, total);
}

pub(crate) fn progress(what: &str, done: usize, total: usize) {
    use std::io::Write as _;
    if total >= 100 && (done.is_multiple_of((total / 100).max(1)) || done == total) {
        eprint!("\r  {what}: {done}/{total}");
        if done == total {
            eprintln!();
        }
        let _ = std::io::stderr().flush();
    }
}
