//! Webhook ingest: signed Standard Webhooks deliveries to many actors.
//!
//! `--connections` closed-loop clients post deliveries, each with its own
//! `webhook-id` and a fresh signature, to `/v1/hooks/counter/a{i}/bench`
//! across `--actors` counters (default 10,000). A 202 means the delivery was
//! verified and is durable: run already by an idle actor (one commit with
//! its de-duplication record) or queued in the inbox, whose turns run
//! concurrently; the throughput reported is ingest *and* processing. The
//! run then waits for the inboxes to drain, checks that the counters add up
//! to exactly the deliveries acknowledged, and replays deliveries already
//! accepted (same `webhook-id`, new timestamp and signature) to measure the
//! de-duplication path and check that replays change nothing.

use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use anyhow::Context as _;

use super::http::{Conn, commit_line, commit_stats, create_actors, metrics, sample};
use super::server::ServerProc;
use super::{BenchArgs, Percentiles};
use crate::webhooks::{new_secret, secret_key, sign};

const BODY: &[u8] = br#"{"by":1}"#;

/// Post the delivery `msg_{conn}_{i}` to actor `a{actor}`; its status.
async fn deliver(
    c: &mut Conn,
    key: &[u8],
    conn: usize,
    i: usize,
    actor: usize,
) -> anyhow::Result<u16> {
    let id = format!("msg_{conn}_{i}");
    let ts = (crate::clock::now_ms() / 1000) as i64;
    let signature = sign(key, &id, ts, BODY);
    let ts = ts.to_string();
    let path = format!("/v1/hooks/counter/a{actor}/bench");
    let (status, _) = c
        .request_with(
            "POST",
            &path,
            &[
                ("content-type", "application/json"),
                ("webhook-id", &id),
                ("webhook-timestamp", &ts),
                ("webhook-signature", &signature),
            ],
            BODY,
        )
        .await?;
    Ok(status)
}

/// Which actor a connection's `i`-th delivery goes to.
fn actor_of(conn: usize, i: usize, actors: usize) -> usize {
    (conn * 7919 + i) % actors
}

struct Phase {
    /// Which deliveries were answered 202, per connection.
    accepted: Vec<Vec<usize>>,
    errors: usize,
    elapsed: Duration,
    latency: Percentiles,
}

/// Every connection posts deliveries `0..` until `deadline` (`Ok`), or
/// replays the deliveries listed for it (`Err`).
async fn load(
    addr: SocketAddr,
    key: Arc<Vec<u8>>,
    actors: usize,
    conns: usize,
    until: Result<Instant, Arc<Vec<Vec<usize>>>>,
) -> anyhow::Result<Phase> {
    let started = Instant::now();
    let mut tasks = Vec::new();
    for conn in 0..conns {
        let key = key.clone();
        let until = until.clone();
        tasks.push(tokio::spawn(async move {
            let mut c = Conn::connect(addr).await?;
            let mut lat = Vec::new();
            let mut ok = Vec::new();
            let mut errors = 0usize;
            let mut n = 0;
            loop {
                let i = match &until {
                    Ok(deadline) if Instant::now() >= *deadline => break,
                    Ok(_) => n,
                    Err(replay) => match replay[conn].get(n) {
                        Some(&i) => i,
                        None => break,
                    },
                };
                n += 1;
                let s = Instant::now();
                match deliver(&mut c, &key, conn, i, actor_of(conn, i, actors)).await? {
                    202 => {
                        lat.push(s.elapsed());
                        ok.push(i);
                    }
                    _ => errors += 1,
                }
            }
            anyhow::Ok((lat, ok, errors))
        }));
    }
    let mut accepted = Vec::new();
    let mut all = Vec::new();
    let mut errors = 0;
    for t in tasks {
        let (lat, ok, e) = t.await??;
        accepted.push(ok);
        all.extend(lat);
        errors += e;
    }
    Ok(Phase {
        accepted,
        errors,
        elapsed: started.elapsed(),
        latency: Percentiles::of(&mut all),
    })
}

/// A gauge or counter from the node's metrics.
async fn metric(addr: SocketAddr, name: &str) -> anyhow::Result<f64> {
    sample(&metrics(addr).await?, name).with_context(|| format!("no metric {name}"))
}

/// Wait until every durable message has run; how long that took.
async fn drain(addr: SocketAddr) -> anyhow::Result<Duration> {
    let started = Instant::now();
    while metric(addr, "marmot_inbox_depth").await? > 0.0 {
        anyhow::ensure!(
            started.elapsed() < Duration::from_secs(600),
            "the inboxes did not drain in 10 minutes"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    Ok(started.elapsed())
}

/// The sum of all counters.
async fn total(addr: SocketAddr, actors: usize) -> anyhow::Result<i64> {
    let next = Arc::new(AtomicUsize::new(0));
    let mut tasks = Vec::new();
    for _ in 0..32.min(actors) {
        let next = next.clone();
        tasks.push(tokio::spawn(async move {
            let mut c = Conn::connect(addr).await?;
            let mut sum = 0i64;
            loop {
                let i = next.fetch_add(1, Ordering::Relaxed);
                if i >= actors {
                    return anyhow::Ok(sum);
                }
                let body = c
                    .post(&format!("/v1/actors/counter/a{i}"), br#"{"by":0}"#)
                    .await?;
                let v: serde_json::Value = serde_json::from_slice(&body)?;
                sum += v["n"].as_i64().context("counter reply without n")?;
            }
        }));
    }
    let mut sum = 0;
    for t in tasks {
        sum += t.await??;
    }
    Ok(sum)
}

/// `webhook-ingest`.
pub(super) async fn ingest(args: &BenchArgs) -> anyhow::Result<()> {
    let actors = args.actors.unwrap_or(10_000).max(1);
    let conns = args.connections.max(1);
    let dir = tempfile::Builder::new().prefix("marmot-bench-").tempdir()?;
    let config = super::server::limits_for(actors);
    let server = ServerProc::start(&dir.path().join("data"), &config).await?;
    let secret = new_secret();
    server
        .deploy_counter(serde_json::json!({
            "idle_timeout_ms": 3_600_000,
            "webhook_secret": secret,
        }))
        .await?;
    create_actors(server.addr, actors).await?;
    let key = Arc::new(secret_key(&secret));

    eprintln!("  posting webhooks for {}s…", args.duration);
    let cpu0 = server.cpu_time()?;
    let stats0 = commit_stats(server.addr).await?;
    let writer0 = server.writer_cpu_time()?;
    let written0 = server.written_bytes()?;
    let deadline = Instant::now() + Duration::from_secs(args.duration);
    let ingest = load(server.addr, key.clone(), actors, conns, Ok(deadline)).await?;
    let stats = commit_stats(server.addr).await? - stats0;
    let writer = server.writer_cpu_time()?.saturating_sub(writer0);
    let written = server.written_bytes()?.saturating_sub(written0);
    let backlog = drain(server.addr).await?;
    // After the drain: the on-webhook turns of the backlog count too.
    let cpu1 = server.cpu_time()?;
    let accepted: usize = ingest.accepted.iter().map(Vec::len).sum();
    println!(
        "scenario webhook-ingest ({actors} actors, {conns} connections, built-in client, {}s)",
        ingest.elapsed.as_secs()
    );
    println!(
        "  accepted (202, verified; run or queued, durable) per s: {:.0}   errors: {}",
        accepted as f64 / ingest.elapsed.as_secs_f64(),
        ingest.errors
    );
    let direct = metric(server.addr, "marmot_webhooks_run_directly_total").await?;
    println!(
        "  run before the 202 (idle actor, one commit): {:.1}%; the rest went through the inbox",
        direct * 100.0 / accepted.max(1) as f64
    );
    println!("  202 latency {}", ingest.latency.line());
    if accepted > 0 {
        println!(
            "  node CPU per webhook: {:.1}µs (verify + store + on-webhook turn)",
            (cpu1 - cpu0).as_secs_f64() * 1e6 / accepted as f64
        );
    }
    if let Some(line) = commit_line(stats, writer, written, ingest.elapsed) {
        println!("{line}");
    }
    println!(
        "  processed per s: {:.0} (on-webhook turns; inboxes drained {:.0} ms after the load stopped)",
        accepted as f64 / (ingest.elapsed + backlog).as_secs_f64(),
        backlog.as_secs_f64() * 1e3
    );

    // Every acknowledged delivery counted exactly once.
    let before = total(server.addr, actors).await?;
    let expected = (actors + accepted) as i64; // one message each to create them
    println!(
        "  counters add up: {} (sum {before}, expected {expected})",
        if before == expected { "yes" } else { "NO" }
    );

    // Replays of accepted deliveries are de-duplicated.
    let chosen: Vec<Vec<usize>> = ingest
        .accepted
        .iter()
        .map(|ok| ok.iter().copied().take(2_000).collect())
        .collect();
    let replays: usize = chosen.iter().map(Vec::len).sum();
    eprintln!("  replaying {replays} accepted deliveries…");
    let replay = load(server.addr, key, actors, conns, Err(Arc::new(chosen))).await?;
    drain(server.addr).await?;
    let after = total(server.addr, actors).await?;
    println!(
        "  replays (duplicate, 202 without storing) per s: {:.0}   latency {}",
        replay.latency.n as f64 / replay.elapsed.as_secs_f64(),
        replay.latency.line()
    );
    println!(
        "  replays changed nothing: {} (sum {after})",
        if after == before { "yes" } else { "NO" }
    );
    let duplicates = metric(
        server.addr,
        "marmot_webhooks_received_total{outcome=\"duplicate\"}",
    )
    .await
    .unwrap_or(0.0);
    println!("  node counted {duplicates:.0} duplicates of {replays} replays");
    server.stop();
    Ok(())
}
