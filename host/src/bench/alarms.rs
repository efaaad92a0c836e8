//! Alarm lag: how late alarms run when many are due each second.
//!
//! Every actor of the `notes` example gets notes with reminders at fixed
//! times spread evenly over the measured window (`--rate` per second for
//! `--duration` seconds). All actors are hibernated first, so the first
//! reminder of each actor also wakes it. The notes actor records, with the
//! guest's wall clock, how late each reminder ran (`late_us` in its
//! `reminder` event): lag = turn start − due time, the same interval the
//! node's `alarm_lag_seconds` metric observes.

use std::sync::Arc;
use std::time::{Duration, Instant};

use bytes::Bytes;
use futures::StreamExt as _;

use super::{BenchArgs, Percentiles, deploy_awake, progress, ready_node};
use crate::clock::now_ms;
use crate::config::NodeConfig;
use crate::ids::ActorKey;
use crate::node::Node;
use crate::storage::schema::CodeKind;

/// Messages in flight while setting up.
const SETUP_CONCURRENCY: usize = 256;

fn key(i: usize) -> ActorKey {
    ActorKey::new("notes", &format!("u{i}")).expect("valid key")
}

/// Send `bodies(i)` for every job `i`, `SETUP_CONCURRENCY` at a time.
async fn send_all(
    node: &Arc<Node>,
    what: &str,
    jobs: usize,
    body: impl Fn(usize) -> (usize, String),
) -> anyhow::Result<Duration> {
    let t = Instant::now();
    let mut done = 0;
    let mut stream = futures::stream::iter(0..jobs)
        .map(|j| {
            let (actor, body) = body(j);
            let node = node.clone();
            async move { node.send(&key(actor), Bytes::from(body), None, None).await }
        })
        .buffer_unordered(SETUP_CONCURRENCY);
    while let Some(r) = stream.next().await {
        let reply = r?;
        anyhow::ensure!(
            reply.status == 200,
            "setup turn failed: {}",
            String::from_utf8_lossy(&reply.body)
        );
        done += 1;
        progress(what, done, jobs);
    }
    Ok(t.elapsed())
}

/// `alarm-lag`: `rate` alarms per second for `duration` seconds across
/// `actors` actors.
pub(super) async fn lag(args: &BenchArgs) -> anyhow::Result<()> {
    let actors = args.actors.unwrap_or(10_000).max(1);
    let rate = args.rate.unwrap_or(10_000).max(1);
    let total = (rate * args.duration).max(1) as usize;
    let per_actor = total.div_ceil(actors);
    anyhow::ensure!(
        per_actor <= 1000,
        "{per_actor} alarms per actor exceeds the per-actor cap; use more --actors"
    );
    let dir = tempfile::Builder::new().prefix("marmot-bench-").tempdir()?;
    let node = ready_node(NodeConfig::for_dir(dir.path().join("data"))).await?;
    deploy_awake(&node, "notes", CodeKind::Wasm, crate::guests::NOTES).await?;

    // Alarm j belongs to actor j % actors and is that actor's note
    // j / actors + 1.
    let took = send_all(&node, "creating notes", total, |j| {
        (j % actors, r#"{"op":"add","text":"bench"}"#.to_owned())
    })
    .await?;
    // Reminders go out at the same pace as the notes did; leave room for
    // that and for hibernating everyone.
    let start = now_ms() + (took.as_millis() as u64) * 3 / 2 + 3_000;
    let interval_us = 1_000_000.0 / rate as f64;
    let due = |j: usize| start + (j as f64 * interval_us / 1000.0) as u64;
    send_all(&node, "setting reminders", total, |j| {
        let id = j / actors + 1;
        (
            j % actors,
            format!(r#"{{"op":"remind","id":{id},"at":{}}}"#, due(j)),
        )
    })
    .await?;
    let deadline = Instant::now() + Duration::from_secs(60);
    while node.registry().active_count() > 0 && Instant::now() < deadline {
        node.registry().hibernate_all();
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let hibernated_in_time = now_ms() < start;
    if !hibernated_in_time {
        eprintln!("  note: the window started before every actor was hibernated");
    }

    // Wait for the window to pass and the reminders to drain.
    let end = due(total - 1);
    let wait = end.saturating_sub(now_ms()) + 1_000;
    eprintln!(
        "  window: {total} alarms over {} s, starting in {} ms",
        args.duration,
        start.saturating_sub(now_ms())
    );
    tokio::time::sleep(Duration::from_millis(wait)).await;
    let mut late: Vec<Duration> = Vec::with_capacity(total);
    let mut early = 0usize;
    let mut missing = 0usize;
    let mut last_fired_ms = 0u64;
    let drain_deadline = Instant::now() + Duration::from_secs(60);
    for i in 0..actors {
        let expected = total / actors + usize::from(i < total % actors);
        loop {
            let events = node
                .events(&key(i), 0, 10_000, usize::MAX)?
                .unwrap_or_default();
            let fired: Vec<_> = events
                .iter()
                .filter(|(_, e)| e.kind == "reminder")
                .collect();
            if fired.len() < expected && Instant::now() < drain_deadline {
                tokio::time::sleep(Duration::from_millis(50)).await;
                continue;
            }
            missing += expected.saturating_sub(fired.len());
            for (_, e) in fired {
                let v: serde_json::Value = serde_json::from_slice(&e.data)?;
                let us = v["late_us"].as_i64().unwrap_or(0);
                if us < 0 {
                    early += 1;
                } else {
                    late.push(Duration::from_micros(us as u64));
                }
                last_fired_ms = last_fired_ms.max(e.at_ms);
            }
            break;
        }
    }
    let p = Percentiles::of(&mut late);
    let span_s = (last_fired_ms.saturating_sub(start)).max(1) as f64 / 1000.0;
    println!(
        "scenario alarm-lag ({total} alarms at {rate}/s across {actors} hibernated actors, notes example)"
    );
    println!("  lag (due → turn start)                   {}", p.line());
    println!(
        "  fired={} early={early} missing={missing} throughput={:.0} alarms/s",
        late.len(),
        late.len() as f64 / span_s
    );
    let text = node.metrics().render();
    if let Some(line) = text
        .lines()
        .find(|l| l.starts_with("marmot_alarm_lag_seconds_count"))
    {
        println!("  node metric: {line}");
    }
    Ok(())
}
