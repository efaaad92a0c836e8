//! SSE fan-out: one actor's events streamed live to many clients.
//!
//! A `notes` actor (think: a shared room) commits one event per note added,
//! paced at `--rate` events per second for `--duration` seconds, while
//! `--streams` clients follow its log over loopback HTTP. Latency is from
//! sending the message that produced an event to each client receiving the
//! event (so it includes the turn and its fsync'd commit).

use std::net::SocketAddr;
use std::time::{Duration, Instant};

use bytes::Bytes;
use http_body_util::{BodyExt, Empty};
use hyper::Request;
use hyper_util::rt::TokioIo;

use super::{BenchArgs, Percentiles, deploy_awake, progress, ready_node};
use crate::config::NodeConfig;
use crate::ids::ActorKey;
use crate::storage::schema::CodeKind;

/// Follow the room's events after `after` until `last`; the receive time of
/// every event. Signals `ready` once the stream is open.
async fn follow(
    addr: SocketAddr,
    after: u64,
    last: u64,
    ready: tokio::sync::mpsc::Sender<()>,
) -> anyhow::Result<Vec<(u64, Instant)>> {
    let stream = tokio::net::TcpStream::connect(addr).await?;
    stream.set_nodelay(true)?;
    let (mut sender, conn) = hyper::client::conn::http1::handshake(TokioIo::new(stream)).await?;
    tokio::spawn(conn);
    let req = Request::builder()
        .uri("/v1/actors/notes/room/events")
        .header("host", "bench")
        .header("accept", "text/event-stream")
        .header("last-event-id", after.to_string())
        .body(Empty::<Bytes>::new())?;
    let resp = sender.send_request(req).await?;
    anyhow::ensure!(resp.status() == 200, "stream refused: {}", resp.status());
    let mut body = resp.into_body();
    let mut buf: Vec<u8> = Vec::new();
    let mut got = Vec::new();
    let mut ready = Some(ready);
    while let Some(frame) = body.frame().await {
        let Ok(data) = frame?.into_data() else {
            continue;
        };
        let now = Instant::now();
        buf.extend_from_slice(&data);
        while let Some(end) = buf.windows(2).position(|w| w == b"\n\n") {
            let raw: Vec<u8> = buf.drain(..end + 2).collect();
            if let Some(r) = ready.take() {
                let _ = r.send(()).await; // the retry hint: the stream is open
            }
            let text = String::from_utf8_lossy(&raw);
            if let Some(seq) = text
                .lines()
                .find_map(|l| l.strip_prefix("id: "))
                .and_then(|s| s.parse::<u64>().ok())
            {
                got.push((seq, now));
                if seq >= last {
                    return Ok(got);
                }
            }
        }
    }
    Ok(got)
}

/// `sse-fanout`.
pub(super) async fn fanout(args: &BenchArgs) -> anyhow::Result<()> {
    let streams = args.streams.max(1);
    let rate = args.rate.unwrap_or(100).clamp(1, 10_000);
    let total = (rate * args.duration).max(1);
    let dir = tempfile::Builder::new().prefix("marmot-bench-").tempdir()?;
    let mut config = NodeConfig::for_dir(dir.path().join("data"));
    config.events.max_streams = streams + 16;
    config.limits.max_events_per_actor = total + 16;
    let node = ready_node(config).await?;
    deploy_awake(&node, "notes", CodeKind::Wasm, crate::guests::NOTES).await?;
    let room = ActorKey::new("notes", "room")?;
    let add = Bytes::from_static(br#"{"op":"add","text":"hello, room"}"#);
    node.send(&room, add.clone(), None, None).await?;
    let base = node.actor_info(&room)?.map_or(0, |i| i.last_event_seq);
    let last = base + total;

    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
    let addr = listener.local_addr()?;
    let server = tokio::spawn(crate::api::serve(
        node.clone(),
        listener,
        std::future::pending(),
    ));
    let (ready_tx, mut ready_rx) = tokio::sync::mpsc::channel(streams);
    let mut clients = Vec::with_capacity(streams);
    for _ in 0..streams {
        clients.push(tokio::spawn(follow(addr, base, last, ready_tx.clone())));
    }
    drop(ready_tx);
    for i in 0..streams {
        ready_rx
            .recv()
            .await
            .ok_or_else(|| anyhow::anyhow!("a stream failed to open"))?;
        progress("opening streams", i + 1, streams);
    }

    let interval = Duration::from_secs_f64(1.0 / rate as f64);
    let started = Instant::now();
    let mut sent_at = Vec::with_capacity(total as usize);
    for k in 0..total {
        let due = started + interval * k as u32;
        tokio::time::sleep_until(due.into()).await;
        sent_at.push(Instant::now());
        node.send(&room, add.clone(), None, None).await?;
    }
    let mut lat = Vec::with_capacity(streams * total as usize);
    let mut missing = 0usize;
    let mut last_recv = started;
    for c in clients {
        let got = tokio::time::timeout(Duration::from_secs(60), c)
            .await
            .map_err(|_| anyhow::anyhow!("streams did not drain in 60 s"))???;
        missing += (total as usize).saturating_sub(got.len());
        for (seq, at) in got {
            if let Some(sent) = seq
                .checked_sub(base + 1)
                .and_then(|i| sent_at.get(i as usize))
            {
                lat.push(at.saturating_duration_since(*sent));
                last_recv = last_recv.max(at);
            }
        }
    }
    server.abort();
    let frames = lat.len();
    let p = Percentiles::of(&mut lat);
    println!(
        "scenario sse-fanout ({total} events at {rate}/s from one actor to {streams} live streams, loopback HTTP)"
    );
    println!("  message sent → event received           {}", p.line());
    println!(
        "  frames={frames} missing={missing} delivered={:.0} frames/s",
        frames as f64 / last_recv.duration_since(started).as_secs_f64()
    );
    Ok(())
}
