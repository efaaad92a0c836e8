//! `marmot bench files`: file writes (committed with their turns) and
//! downloads over loopback HTTP, small (inline) and large (blob) files.

use std::sync::Arc;
use std::time::{Duration, Instant};

use bytes::Bytes;

use super::{BenchArgs, Percentiles, ready_node};
use crate::config::{NodeConfig, TypeConfig};
use crate::ids::ActorKey;
use crate::node::Node;
use crate::storage::schema::CodeKind;

const FILER: &str = r#"import { files } from "marmot";
export default {
  onMessage(body) {
    files.write(body.path, "x".repeat(body.size));
    return { ok: true };
  },
};
"#;

/// Concurrent writers (one actor each).
const WRITERS: usize = 16;

pub(super) async fn files(args: &BenchArgs) -> anyhow::Result<()> {
    let dir = tempfile::Builder::new().prefix("marmot-bench-").tempdir()?;
    let node = ready_node(NodeConfig::for_dir(dir.path().join("data"))).await?;
    let config = TypeConfig {
        idle_timeout_ms: Some(3_600_000),
        ..Default::default()
    };
    node.deploy("filer", CodeKind::Js, FILER.as_bytes().to_vec(), config)
        .await?;
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
    let addr = listener.local_addr()?;
    tokio::spawn(crate::api::serve(
        node.clone(),
        listener,
        std::future::pending(),
    ));
    let http = reqwest::Client::builder().no_proxy().build()?;
    println!(
        "scenario files (JavaScript actors, {WRITERS} writers at once, downloads over loopback HTTP)"
    );
    let scale = args.actors.unwrap_or(2000).max(WRITERS);
    for (label, size, count) in [
        ("4 KiB (inline)", 4 << 10, scale),
        ("1 MiB (blob)", 1 << 20, (scale / 10).max(WRITERS)),
    ] {
        let (elapsed, mut lat) = write_all(&node, size, count).await?;
        let secs = elapsed.as_secs_f64();
        println!(
            "  write {label:<15} {:>7.0} files/s {:>7.1} MB/s  turn+commit {}",
            count as f64 / secs,
            (count * size) as f64 / secs / 1e6,
            Percentiles::of(&mut lat).line()
        );
        let mut lat = Vec::with_capacity(count);
        let started = Instant::now();
        for i in 0..count {
            let url = format!("http://{addr}/v1/actors/filer/w{}/files/f{i}", i % WRITERS);
            let t = Instant::now();
            let body = http.get(&url).send().await?.bytes().await?;
            lat.push(t.elapsed());
            anyhow::ensure!(body.len() == size, "read {} bytes, not {size}", body.len());
        }
        let secs = started.elapsed().as_secs_f64();
        println!(
            "  read  {label:<15} {:>7.0} files/s {:>7.1} MB/s  download {}",
            count as f64 / secs,
            (count * size) as f64 / secs / 1e6,
            Percentiles::of(&mut lat).line()
        );
    }
    Ok(())
}

/// Write `count` files of `size` bytes, spread over the writers; the time
/// until all are durable, and each write's latency.
async fn write_all(
    node: &Arc<Node>,
    size: usize,
    count: usize,
) -> anyhow::Result<(Duration, Vec<Duration>)> {
    let started = Instant::now();
    let mut tasks = Vec::new();
    for w in 0..WRITERS {
        let node = node.clone();
        tasks.push(tokio::spawn(async move {
            let key = ActorKey::new("filer", &format!("w{w}"))?;
            let mut lat = Vec::new();
            for i in (w..count).step_by(WRITERS) {
                let body = serde_json::to_vec(
                    &serde_json::json!({ "path": format!("f{i}"), "size": size }),
                )?;
                let t = Instant::now();
                let r = node.send(&key, Bytes::from(body), None, None).await?;
                anyhow::ensure!(
                    r.status == 200,
                    "write failed: {}",
                    String::from_utf8_lossy(&r.body)
                );
                lat.push(t.elapsed());
            }
            anyhow::Ok(lat)
        }));
    }
    let mut all = Vec::with_capacity(count);
    for t in tasks {
        all.extend(t.await??);
    }
    Ok((started.elapsed(), all))
}
