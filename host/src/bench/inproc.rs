//! Latency scenarios on a node inside this process: wake (hibernated →
//! reply) for Rust and JavaScript actors, in-process and over loopback HTTP,
//! and fresh-sandbox JavaScript evals.

use std::sync::Arc;
use std::time::{Duration, Instant};

use bytes::Bytes;

use super::http::Conn;
use super::{BenchArgs, Percentiles, deploy_awake, progress, ready_node};
use crate::config::NodeConfig;
use crate::ids::ActorKey;
use crate::node::Node;
use crate::storage::schema::CodeKind;

const READ: &[u8] = br#"{"by":0}"#;
const WRITE: &[u8] = br#"{"by":1}"#;

/// The counter as a JavaScript actor (same protocol as `examples/counter`).
pub(super) const JS_COUNTER: &str = r#"import { state } from "marmot";
export default {
  onMessage(body) {
    const by = body?.by ?? 1;
    const n = (state.get("n") ?? 0) + by;
    if (by !== 0) state.set("n", n);
    return { n };
  },
};
"#;

async fn start_node() -> anyhow::Result<(tempfile::TempDir, Arc<Node>)> {
    let dir = tempfile::Builder::new().prefix("marmot-bench-").tempdir()?;
    let node = ready_node(NodeConfig::for_dir(dir.path().join("data"))).await?;
    deploy_awake(&node, "counter", CodeKind::Wasm, crate::guests::COUNTER).await?;
    deploy_awake(&node, "jscounter", CodeKind::Js, JS_COUNTER.as_bytes()).await?;
    Ok((dir, node))
}

fn key(ty: &str, i: usize) -> ActorKey {
    ActorKey::new(ty, &format!("a{i}")).expect("valid key")
}

async fn create(node: &Arc<Node>, ty: &str, n: usize) -> anyhow::Result<()> {
    for i in 0..n {
        node.send(&key(ty, i), Bytes::from_static(WRITE), None, None)
            .await?;
        progress("creating actors", i + 1, n);
    }
    Ok(())
}

async fn hibernate_all(node: &Arc<Node>) {
    let deadline = Instant::now() + Duration::from_secs(60);
    while node.registry().active_count() > 0 && Instant::now() < deadline {
        node.registry().hibernate_all();
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// Where the measured messages go.
enum Target {
    InProcess(Arc<Node>),
    Http(Conn),
}

impl Target {
    async fn send(&mut self, ty: &str, i: usize, body: &'static [u8]) -> anyhow::Result<()> {
        match self {
            Target::InProcess(node) => {
                node.send(&key(ty, i), Bytes::from_static(body), None, None)
                    .await?;
            }
            Target::Http(conn) => {
                conn.post(&format!("/v1/actors/{ty}/a{i}"), body).await?;
            }
        }
        Ok(())
    }
}

/// Warm turns on one active actor, then wake every actor twice (read-only,
/// then writing), hibernating all of them before each pass.
async fn measure(
    node: &Arc<Node>,
    mut target: Target,
    ty: &str,
    n: usize,
    title: &str,
) -> anyhow::Result<()> {
    let me = std::process::id();
    let mut passes: Vec<(&str, Vec<Duration>, Cost, String)> = Vec::new();
    for (label, body, hibernate_first) in [
        ("warm read-only turn (active actor)", READ, false),
        ("wake → reply, read-only turn", READ, true),
        ("wake → reply, durable write (fsync)", WRITE, true),
    ] {
        if hibernate_first {
            hibernate_all(node).await;
        }
        let mut lat = Vec::with_capacity(n);
        let split = Split::now(node);
        let before = Cost::now(me)?;
        for i in 0..n {
            let actor = if hibernate_first { i } else { 0 };
            let t = Instant::now();
            target.send(ty, actor, body).await?;
            lat.push(t.elapsed());
            progress(label, i + 1, n);
        }
        let cost = Cost::now(me)?.since(&before, n);
        passes.push((label, lat, cost, Split::now(node).since(&split)));
    }
    // What stays resident once every actor sleeps again (pools keep
    // memory they may reuse).
    hibernate_all(node).await;
    let rss = super::server::rss_of(me)?;
    let pss = super::server::pss_of(me)?;
    println!("scenario {title}");
    for (label, mut lat, cost, split) in passes {
        println!("  {label:<40} {}", Percentiles::of(&mut lat).line());
        println!(
            "  {:<40} CPU {:.1}µs, {:.1} minor page faults per message (this process: node and client)",
            "", cost.cpu_us, cost.faults
        );
        if let Some(shootdowns) = cost.shootdowns {
            println!(
                "  {:<40} {shootdowns:.2} TLB shootdowns per message (whole machine, /proc/interrupts)",
                ""
            );
        }
        println!("  {:<40} {split}", "");
    }
    println!(
        "  RSS of this process after hibernating all: {:.1} MB (PSS {:.1} MB)",
        rss as f64 / (1024.0 * 1024.0),
        pss as f64 / (1024.0 * 1024.0)
    );
    Ok(())
}

/// [`measure`] with `Node::send` called from a task on the node's runtime,
/// where every caller inside a node runs (HTTP handlers, alarms, webhooks,
/// actor calls). Called from the bench's own thread instead, each message
/// would also wake a parked thread twice, once to start the actor's task and
/// once for the reply: ~90 µs per message on a 2-core VM, which measures
/// the harness rather than the wake.
async fn measure_in_process(
    node: Arc<Node>,
    ty: &'static str,
    n: usize,
    title: String,
) -> anyhow::Result<()> {
    tokio::spawn(async move {
        let target = Target::InProcess(node.clone());
        measure(&node, target, ty, n, &title).await
    })
    .await?
}

/// Where a pass's time went, from the node's own histograms: sums and
/// counts of wakes (task start to instance ready: the record read,
/// instantiation, prefaulting) and of guest turns.
struct Split {
    wake: (f64, f64),
    turn: (f64, f64),
}

impl Split {
    fn now(node: &Node) -> Self {
        let text = node.metrics().render();
        let sum_count = |metric: &str| {
            let get = |part: &str| super::http::sample(&text, &format!("{metric}_{part}"));
            (get("sum").unwrap_or(0.0), get("count").unwrap_or(0.0))
        };
        Self {
            wake: sum_count("marmot_wake_duration_seconds"),
            turn: sum_count("marmot_turn_duration_seconds"),
        }
    }

    /// The means since `before`, as one line.
    fn since(&self, before: &Self) -> String {
        let mean = |(sum, n): (f64, f64), (sum0, n0): (f64, f64)| {
            let n = n - n0;
            if n > 0.0 {
                format!("{:.1}µs over {n:.0}", (sum - sum0) * 1e6 / n)
            } else {
                "none".to_owned()
            }
        };
        format!(
            "mean wake (record read to instance ready) {}, mean guest turn {}",
            mean(self.wake, before.wake),
            mean(self.turn, before.turn)
        )
    }
}

/// What a pass cost this process: CPU time and minor page faults, totals
/// and then per message.
struct Cost {
    cpu_us: f64,
    faults: f64,
    /// The whole machine's (see [`super::server::tlb_shootdowns`]).
    shootdowns: Option<f64>,
}

impl Cost {
    fn now(pid: u32) -> anyhow::Result<Self> {
        Ok(Self {
            cpu_us: super::server::cpu_of(pid)?.as_secs_f64() * 1e6,
            faults: super::server::minor_faults_of(pid)? as f64,
            shootdowns: super::server::tlb_shootdowns().map(|n| n as f64),
        })
    }

    /// Per message, over `n` messages since `before`.
    fn since(&self, before: &Self, n: usize) -> Self {
        let n = n.max(1) as f64;
        Self {
            cpu_us: (self.cpu_us - before.cpu_us) / n,
            faults: (self.faults - before.faults) / n,
            shootdowns: self
                .shootdowns
                .zip(before.shootdowns)
                .map(|(now, then)| (now - then) / n),
        }
    }
}

/// In-process: `Node::send` to hibernated Rust actors.
pub(super) async fn wake(args: &BenchArgs) -> anyhow::Result<()> {
    let n = args.actors.unwrap_or(2000);
    let (_dir, node) = start_node().await?;
    create(&node, "counter", n).await?;
    let title = format!("wake (Rust actor, in-process, {n} actors, sequential)");
    measure_in_process(node, "counter", n, title).await
}

/// In-process: `Node::send` to hibernated JavaScript actors.
pub(super) async fn js_wake(args: &BenchArgs) -> anyhow::Result<()> {
    let n = args.actors.unwrap_or(2000);
    let (_dir, node) = start_node().await?;
    create(&node, "jscounter", n).await?;
    let title = format!("js-wake (JavaScript actor, in-process, {n} actors, sequential)");
    measure_in_process(node, "jscounter", n, title).await
}

/// Over HTTP: the same node served on loopback, one keep-alive connection.
pub(super) async fn wake_http(args: &BenchArgs) -> anyhow::Result<()> {
    let n = args.actors.unwrap_or(2000);
    let (_dir, node) = start_node().await?;
    create(&node, "counter", n).await?;
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
    let addr = listener.local_addr()?;
    let server = tokio::spawn(crate::api::serve(
        node.clone(),
        listener,
        std::future::pending(),
    ));
    let conn = Conn::connect(addr).await?;
    let title = format!("wake-http (loopback HTTP/1.1, {n} actors, sequential)");
    let result = measure(&node, Target::Http(conn), "counter", n, &title).await;
    server.abort();
    result
}

/// Fresh-sandbox evals bound to one actor, in-process.
pub(super) async fn js_eval(args: &BenchArgs) -> anyhow::Result<()> {
    let n = args.actors.unwrap_or(2000);
    let (_dir, node) = start_node().await?;
    create(&node, "counter", 1).await?;
    let k = key("counter", 0);
    // The first eval builds (or loads) the engine snapshot.
    node.eval(&k, "0".into()).await?;
    println!("scenario js-eval (fresh QuickJS sandbox per eval, in-process, {n} evals)");
    for (label, code) in [
        ("1 + 1", "1 + 1"),
        ("read state", "marmot.state.get('n')"),
        (
            "JSON + array work",
            "JSON.stringify(Array.from({length: 100}, (_, i) => ({i, sq: i * i}))).length",
        ),
        (
            "write state (commits)",
            "marmot.state.set('n', (marmot.state.get('n') ?? 0) + 1)",
        ),
    ] {
        let mut lat = Vec::with_capacity(n);
        for _ in 0..n {
            let t = Instant::now();
            let out = node.eval(&k, code.to_owned()).await?;
            anyhow::ensure!(out.error.is_none(), "eval failed: {:?}", out.error);
            lat.push(t.elapsed());
        }
        println!("  {label:<40} {}", Percentiles::of(&mut lat).line());
    }
    Ok(())
}
