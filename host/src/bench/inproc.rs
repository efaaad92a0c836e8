//! Wake latency: hibernated actor → reply, in-process and over HTTP.

use std::sync::Arc;
use std::time::{Duration, Instant};

use bytes::Bytes;

use super::http::Conn;
use super::{BenchArgs, Percentiles, progress};
use crate::config::{NodeConfig, TypeConfig};
use crate::ids::ActorKey;
use crate::node::Node;

const READ: &[u8] = br#"{"by":0}"#;
const WRITE: &[u8] = br#"{"by":1}"#;

async fn start_node() -> anyhow::Result<(tempfile::TempDir, Arc<Node>)> {
    let dir = tempfile::Builder::new().prefix("marmot-bench-").tempdir()?;
    let node = Node::start(NodeConfig::for_dir(dir.path().join("data"))).await?;
    while !node.is_ready() {
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    let config = TypeConfig {
        idle_timeout_ms: Some(3_600_000),
        ..TypeConfig::default()
    };
    node.deploy(
        "counter",
        crate::storage::schema::CodeKind::Wasm,
        crate::guests::COUNTER.to_vec(),
        config,
    )
    .await?;
    Ok((dir, node))
}

fn key(i: usize) -> ActorKey {
    ActorKey::new("counter", &format!("a{i}")).expect("valid key")
}

async fn create(node: &Arc<Node>, n: usize) -> anyhow::Result<()> {
    for i in 0..n {
        node.send(&key(i), Bytes::from_static(WRITE), None, None)
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
    async fn send(&mut self, i: usize, body: &'static [u8]) -> anyhow::Result<()> {
        match self {
            Target::InProcess(node) => {
                node.send(&key(i), Bytes::from_static(body), None, None)
                    .await?;
            }
            Target::Http(conn) => {
                conn.post(&format!("/v1/actors/counter/a{i}"), body).await?;
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
    n: usize,
    title: &str,
) -> anyhow::Result<()> {
    let mut passes: Vec<(&str, Vec<Duration>)> = Vec::new();
    for (label, body, hibernate_first) in [
        ("warm read-only turn (active actor)", READ, false),
        ("wake → reply, read-only turn", READ, true),
        ("wake → reply, durable write (fsync)", WRITE, true),
    ] {
        if hibernate_first {
            hibernate_all(node).await;
        }
        let mut lat = Vec::with_capacity(n);
        for i in 0..n {
            let actor = if hibernate_first { i } else { 0 };
            let t = Instant::now();
            target.send(actor, body).await?;
            lat.push(t.elapsed());
        }
        passes.push((label, lat));
    }
    println!("scenario {title}");
    for (label, mut lat) in passes {
        println!("  {label:<40} {}", Percentiles::of(&mut lat).line());
    }
    Ok(())
}

/// In-process: `Node::send` to hibernated actors.
pub(super) async fn wake(args: &BenchArgs) -> anyhow::Result<()> {
    let n = args.actors.unwrap_or(2000);
    let (_dir, node) = start_node().await?;
    create(&node, n).await?;
    let title = format!("wake (in-process, {n} actors, sequential)");
    measure(&node, Target::InProcess(node.clone()), n, &title).await
}

/// Over HTTP: the same node served on loopback, one keep-alive connection.
pub(super) async fn wake_http(args: &BenchArgs) -> anyhow::Result<()> {
    let n = args.actors.unwrap_or(2000);
    let (_dir, node) = start_node().await?;
    create(&node, n).await?;
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
    let addr = listener.local_addr()?;
    let server = tokio::spawn(crate::api::serve(
        node.clone(),
        listener,
        std::future::pending(),
    ));
    let conn = Conn::connect(addr).await?;
    let title = format!("wake-http (loopback HTTP/1.1, {n} actors, sequential)");
    let result = measure(&node, Target::Http(conn), n, &title).await;
    server.abort();
    result
}
