//! `marmot bench webhook-backlog`: a healthy subscription's deliveries
//! with and without another subscription's backlog for a receiver that
//! never answers (`--actors` rows of 100 KB, default 1,000), side by side
//! in one run, with the node's CPU. One bad receiver's backlog should cost
//! the others little. (The delivery worker decoded every due row, payload
//! and all, at each wake-up: 200 healthy deliveries took 10.5 s instead of
//! 0.1 s behind 1,000 such rows.)

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use bytes::Bytes;

use super::server::cpu_of;
use super::{BenchArgs, ready_node};
use crate::config::{NodeConfig, TypeConfig};
use crate::ids::ActorKey;
use crate::node::Node;
use crate::storage::WriteOp;
use crate::storage::schema::{CodeKind, SubscriptionRecord};

const EMITTER: &str = r#"import { events } from "marmot";
export default {
  onMessage({ n, kind, pad }) {
    for (let i = 0; i < n; i++) events.emit(kind, { i, pad: "x".repeat(pad) });
    return n;
  },
};
"#;

/// Healthy deliveries timed in each phase.
const HEALTHY: usize = 200;

pub(super) async fn backlog(args: &BenchArgs) -> anyhow::Result<()> {
    let rows = args.actors.unwrap_or(1000);
    let dir = tempfile::Builder::new().prefix("marmot-bench-").tempdir()?;
    let node = ready_node(NodeConfig::for_dir(dir.path().join("data"))).await?;
    let config = TypeConfig {
        idle_timeout_ms: Some(3_600_000),
        ..Default::default()
    };
    node.deploy("ev", CodeKind::Js, EMITTER.as_bytes().to_vec(), config)
        .await?;
    // A receiver that takes connections and never answers.
    let hanging = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
    let hanging_addr = hanging.local_addr()?;
    tokio::spawn(async move {
        let mut held = Vec::new();
        while let Ok((c, _)) = hanging.accept().await {
            held.push(c);
        }
    });
    // One that answers 200 at once, counting.
    let got = Arc::new(AtomicUsize::new(0));
    let healthy = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
    let healthy_addr = healthy.local_addr()?;
    let counted = got.clone();
    let app = axum::Router::new().route(
        "/h",
        axum::routing::post(move || {
            counted.fetch_add(1, Ordering::Relaxed);
            async {}
        }),
    );
    tokio::spawn(async move { axum::serve(healthy, app).await });
    for (name, addr, kind) in [
        ("slow", hanging_addr, "big.*"),
        ("healthy", healthy_addr, "small.*"),
    ] {
        let record = SubscriptionRecord {
            url: format!("http://{addr}/h"),
            events: vec![kind.to_owned()],
            types: Vec::new(),
            secret: crate::webhooks::new_secret(),
            created_at_ms: crate::clock::now_ms(),
        };
        let name = name.to_owned();
        node.storage()
            .writer()
            .call(|done| WriteOp::PutSubscription { name, record, done })
            .await?;
    }
    println!(
        "scenario webhook-backlog ({HEALTHY} deliveries to a healthy receiver, then again behind \
         {rows} rows of 100 KB due to one that never answers; `--actors` sets the rows)"
    );
    let pid = std::process::id();
    let before = healthy_phase(&node, &got, "alone").await?;
    for i in 0..rows.div_ceil(100) {
        let n = (rows - i * 100).min(100);
        emit(&node, &format!("big{i}"), n, "big.x", 100_000).await?;
    }
    tokio::time::sleep(Duration::from_secs(2)).await;
    let cpu = cpu_of(pid)?;
    let behind = healthy_phase(&node, &got, "behind the backlog").await?;
    let used = cpu_of(pid)?.saturating_sub(cpu);
    println!(
        "  behind/alone: ×{:.1} the time; process CPU meanwhile {:.2} s",
        behind.as_secs_f64() / before.as_secs_f64(),
        used.as_secs_f64()
    );
    let cpu = cpu_of(pid)?;
    tokio::time::sleep(Duration::from_secs(5)).await;
    println!(
        "  idle 5 s with the backlog due: {:.2} CPU-s",
        cpu_of(pid)?.saturating_sub(cpu).as_secs_f64()
    );
    Ok(())
}

/// Emit `HEALTHY` small events and wait until the healthy receiver has
/// them all; how long that took.
async fn healthy_phase(
    node: &Arc<Node>,
    got: &AtomicUsize,
    label: &str,
) -> anyhow::Result<Duration> {
    let start = got.load(Ordering::Relaxed);
    let t = Instant::now();
    for i in 0..HEALTHY / 50 {
        emit(node, &format!("small-{label}-{i}"), 50, "small.x", 0).await?;
    }
    while got.load(Ordering::Relaxed) < start + HEALTHY {
        anyhow::ensure!(
            t.elapsed() < Duration::from_secs(600),
            "the healthy receiver got {} of {HEALTHY} in 10 minutes",
            got.load(Ordering::Relaxed) - start
        );
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    let took = t.elapsed();
    println!(
        "  {HEALTHY} healthy deliveries {label:<20} {:>8.2} s",
        took.as_secs_f64()
    );
    Ok(took)
}

/// One turn of actor `id` emitting `n` events of `kind`, each `pad` bytes.
async fn emit(node: &Arc<Node>, id: &str, n: usize, kind: &str, pad: usize) -> anyhow::Result<()> {
    let body = serde_json::to_vec(&serde_json::json!({ "n": n, "kind": kind, "pad": pad }))?;
    let r = node
        .send(&ActorKey::new("ev", id)?, Bytes::from(body), None, None)
        .await?;
    anyhow::ensure!(
        r.status == 200,
        "emit: {}",
        String::from_utf8_lossy(&r.body)
    );
    Ok(())
}
