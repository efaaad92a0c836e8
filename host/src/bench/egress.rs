//! `marmot bench fetch`: what the `http` capability adds to a request, side
//! by side in one run with plain reqwest to the same local server.
//!
//! A keep-alive HTTP server on 127.0.0.2 answers `ok`. Rounds alternate:
//! reqwest straight to it; a Rust actor's turn that fetches it; the same
//! actor's turn without the fetch; and the same pair for a JavaScript
//! actor. What the capability adds is the fetching turn minus the plain
//! request minus the turn without the fetch.

use std::net::Ipv4Addr;
use std::sync::Arc;
use std::time::{Duration, Instant};

use bytes::Bytes;

use super::{BenchArgs, Percentiles, progress, ready_node};
use crate::config::{NodeConfig, TypeConfig};
use crate::ids::ActorKey;
use crate::node::Node;
use crate::storage::schema::CodeKind;

/// The test actor (it has a `fetch` op), built into the binary for this.
const TESTKIT: &[u8] = include_bytes!(env!("MARMOT_GUEST_MARMOT_TESTKIT"));

const JS_FETCHER: &str = r#"export default {
  async onMessage(body) {
    if (!body.url) return { ok: true };
    const r = await fetch(body.url);
    return { status: r.status, n: (await r.text()).length };
  },
};
"#;

const SERVER_IP: Ipv4Addr = Ipv4Addr::new(127, 0, 0, 2);

/// A keep-alive server answering `ok` to everything; its port.
async fn server() -> anyhow::Result<u16> {
    let listener = tokio::net::TcpListener::bind((SERVER_IP, 0)).await?;
    let port = listener.local_addr()?.port();
    tokio::spawn(async move {
        while let Ok((tcp, _)) = listener.accept().await {
            tokio::spawn(async move {
                let service = hyper::service::service_fn(|_req| async {
                    Ok::<_, std::convert::Infallible>(hyper::Response::new(
                        http_body_util::Full::new(Bytes::from_static(b"ok")),
                    ))
                });
                let _ = hyper::server::conn::http1::Builder::new()
                    .serve_connection(hyper_util::rt::TokioIo::new(tcp), service)
                    .await;
            });
        }
    });
    Ok(port)
}

/// One way of making the request, and its samples.
struct Side {
    name: &'static str,
    samples: Vec<Duration>,
}

pub(super) async fn fetch(args: &BenchArgs) -> anyhow::Result<()> {
    let rounds = args.actors.unwrap_or(2000).max(10);
    let port = server().await?;
    let url = format!("http://{SERVER_IP}:{port}/");
    let dir = tempfile::Builder::new().prefix("marmot-bench-").tempdir()?;
    let mut config = NodeConfig::for_dir(dir.path().join("data"));
    config.egress.allow_private = vec![format!("{SERVER_IP}/32")];
    let node = ready_node(config).await?;
    let type_config = TypeConfig {
        idle_timeout_ms: Some(3_600_000),
        allowed_hosts: vec![SERVER_IP.to_string()],
        ..Default::default()
    };
    node.deploy("kit", CodeKind::Wasm, TESTKIT.to_vec(), type_config.clone())
        .await?;
    node.deploy(
        "jsfetch",
        CodeKind::Js,
        JS_FETCHER.as_bytes().to_vec(),
        type_config,
    )
    .await?;
    let plain = reqwest::Client::builder().no_proxy().build()?;
    let kit = ActorKey::new("kit", "a")?;
    let js = ActorKey::new("jsfetch", "a")?;
    let kit_fetch = Bytes::from(serde_json::to_vec(
        &serde_json::json!({ "op": "fetch", "url": url }),
    )?);
    let kit_noop = Bytes::from_static(br#"{"op":"get","key":"x"}"#);
    let js_fetch = Bytes::from(serde_json::to_vec(&serde_json::json!({ "url": url }))?);
    let js_noop = Bytes::from_static(b"{}");

    let mut sides: Vec<Side> = [
        "reqwest, plain",
        "Rust actor turn with fetch",
        "Rust actor turn without",
        "JavaScript actor turn with fetch",
        "JavaScript actor turn without",
    ]
    .into_iter()
    .map(|name| Side {
        name,
        samples: Vec::with_capacity(rounds),
    })
    .collect();
    let send = |node: &Arc<Node>, key: &ActorKey, body: &Bytes| {
        let (node, key, body) = (node.clone(), key.clone(), body.clone());
        async move {
            let r = node
                .send(&key, body, Some("application/json".into()), None)
                .await?;
            anyhow::ensure!(r.status == 200, "the turn answered {}", r.status);
            if r.body.windows(6).any(|w| w == b"error\"") {
                anyhow::bail!("the fetch failed: {}", String::from_utf8_lossy(&r.body));
            }
            Ok(())
        }
    };
    // Warm up every path (connections, instances, caches).
    for _ in 0..50 {
        plain.get(&url).send().await?.bytes().await?;
        send(&node, &kit, &kit_fetch).await?;
        send(&node, &js, &js_fetch).await?;
    }
    for i in 0..rounds {
        let t = Instant::now();
        plain.get(&url).send().await?.bytes().await?;
        sides[0].samples.push(t.elapsed());
        for (side, key, body) in [
            (1, &kit, &kit_fetch),
            (2, &kit, &kit_noop),
            (3, &js, &js_fetch),
            (4, &js, &js_noop),
        ] {
            let t = Instant::now();
            send(&node, key, body).await?;
            sides[side].samples.push(t.elapsed());
        }
        progress("rounds", i + 1, rounds);
    }
    println!(
        "scenario fetch (local HTTP server on {SERVER_IP}, in-process node, {rounds} rounds, alternating)"
    );
    let mut p50 = Vec::new();
    for side in &mut sides {
        let p = Percentiles::of(&mut side.samples);
        println!("  {:<34} {}", side.name, p.line());
        p50.push(p.p50.as_secs_f64() * 1e6);
    }
    let added = |with: f64, without: f64| with - without - p50[0];
    println!(
        "  added by the http capability at p50: Rust {:.1}µs, JavaScript {:.1}µs (turn with fetch − turn without − plain request; target ≤ 50µs)",
        added(p50[1], p50[2]),
        added(p50[3], p50[4]),
    );
    Ok(())
}
