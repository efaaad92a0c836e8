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
    node.deploy("counter", crate::guests::COUNTER.to_vec(), config)
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

/// In-process: `Node::send` to hibernated actors.
pub(super) async fn wake(args: &BenchArgs) -> anyhow::Result<()> {
    let n = args.actors.unwrap_or(2000);
    let (_dir, node) = start_node().await?;
    create(&node, n).await?;

    let mut warm = Vec::with_capacity(n);
    for _ in 0..n {
        let t = Instant::now();
        node.send(&key(0), Bytes::from_static(READ), None, None)
            .await?;
        warm.push(t.elapsed());
    }

    hibernate_all(&node).await;
    let mut read = Vec::with_capacity(n);
    for i in 0..n {
        let t = Instant::now();
        node.send(&key(i), Bytes::from_static(READ), None, None)
            .await?;
        read.push(t.elapsed());
    }

    hibernate_all(&node).await;
    let mut write = Vec::with_capacity(n);
    for i in 0..n {
        let t = Instant::now();
        node.send(&key(i), Bytes::from_static(WRITE), None, None)
            .await?;
        write.push(t.elapsed());
    }
    println!("scenario wake (in-process, {n} actors, sequential)");
    println!(
        "  warm read-only turn (active actor)      {}",
        Percentiles::of(&mut warm).line()
    );
    println!(
        "  wake → reply, read-only turn            {}",
        Percentiles::of(&mut read).line()
    );
    println!(
        "  wake → reply, durable write (fsync)     {}",
        Percentiles::of(&mut write).line()
    );
    Ok(())
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
    let mut conn = Conn::connect(addr).await?;

    let mut warm = Vec::with_capacity(n);
    for _ in 0..n {
        let t = Instant::now();
        conn.post("/v1/actors/counter/a0", READ).await?;
        warm.push(t.elapsed());
    }
    hibernate_all(&node).await;
    let mut read = Vec::with_capacity(n);
    for i in 0..n {
        let path = format!("/v1/actors/counter/a{i}");
        let t = Instant::now();
        conn.post(&path, READ).await?;
        read.push(t.elapsed());
    }
    hibernate_all(&node).await;
    let mut write = Vec::with_capacity(n);
    for i in 0..n {
        let path = format!("/v1/actors/counter/a{i}");
        let t = Instant::now();
        conn.post(&path, WRITE).await?;
        write.push(t.elapsed());
    }
    server.abort();
    println!("scenario wake-http (loopback HTTP/1.1, {n} actors, sequential)");
    println!(
        "  warm read-only turn (active actor)      {}",
        Percentiles::of(&mut warm).line()
    );
    println!(
        "  wake → reply, read-only turn            {}",
        Percentiles::of(&mut read).line()
    );
    println!(
        "  wake → reply, durable write (fsync)     {}",
        Percentiles::of(&mut write).line()
    );
    Ok(())
}
