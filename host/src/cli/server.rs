//! `marmot dev` and `marmot serve`.

use std::path::PathBuf;
use std::sync::Arc;

use anyhow::Context as _;
use clap::Args;

use crate::config::{NodeConfig, TypeConfig};
use crate::node::Node;
use crate::storage::schema::CodeKind;

/// `marmot dev`.
#[derive(Args)]
pub struct DevArgs {
    /// Address to listen on (loopback only: auth is off).
    #[arg(long, env = "MARMOT_LISTEN", default_value = "127.0.0.1:7878")]
    listen: String,
    /// Data directory.
    #[arg(long = "data", env = "MARMOT_DATA_DIR", default_value = ".marmot")]
    data: PathBuf,
    /// Config file (TOML) for limits and defaults; auth stays off.
    #[arg(long, env = "MARMOT_CONFIG")]
    config: Option<PathBuf>,
    /// Compiled-code cache (default: <data>/cache).
    #[arg(long, env = "MARMOT_CACHE_DIR")]
    cache_dir: Option<PathBuf>,
    /// Do not deploy the example actors (they are deployed only where no
    /// type of their name exists).
    #[arg(long)]
    no_examples: bool,
}

/// `marmot serve`.
#[derive(Args)]
pub struct ServeArgs {
    /// Config file (TOML).
    #[arg(long, env = "MARMOT_CONFIG")]
    config: Option<PathBuf>,
    /// Address to listen on (overrides the config file).
    #[arg(long, env = "MARMOT_LISTEN")]
    listen: Option<String>,
    /// Data directory (overrides the config file).
    #[arg(long = "data", env = "MARMOT_DATA_DIR")]
    data: Option<PathBuf>,
    /// Compiled-code cache (overrides the config file).
    #[arg(long, env = "MARMOT_CACHE_DIR")]
    cache_dir: Option<PathBuf>,
}

pub(super) async fn dev(args: DevArgs) -> anyhow::Result<()> {
    let listen = super::parse_listen(&args.listen)?;
    if !listen.ip().is_loopback() {
        anyhow::bail!(
            "`marmot dev` runs with auth off and only listens on loopback; \
             use `marmot serve` with an admin token to listen on {}",
            listen.ip()
        );
    }
    let base = match &args.config {
        Some(path) => NodeConfig::from_file(path)?,
        None => NodeConfig::default(),
    };
    // Listen first: a port in use is said before a data directory is made
    // and the examples are deployed into it (it used to be after).
    let listener = bind(listen).await?;
    // What `dev` decides itself, said when the file says otherwise (it
    // was dropped without a word, and the data went to `.marmot`).
    let defaults = NodeConfig::default();
    for (key, set, instead) in [
        (
            "listen",
            base.listen != defaults.listen,
            "--listen / MARMOT_LISTEN",
        ),
        (
            "data_dir",
            base.data_dir != defaults.data_dir,
            "--data / MARMOT_DATA_DIR",
        ),
        (
            "admin_token",
            base.admin_token.is_some(),
            "`marmot serve` (auth is off in dev)",
        ),
    ] {
        if set {
            tracing::warn!(
                key,
                "`marmot dev` ignores `{key}` in its config file; use {instead}"
            );
        }
    }
    let mut config = NodeConfig {
        listen,
        data_dir: args.data,
        cache_dir: args.cache_dir.or(base.cache_dir.clone()),
        admin_token: None,
        ..base
    };
    // Without a configured master key, keep one in the data directory.
    config.secrets.generate_key = true;
    // Model servers on this machine (Ollama, llama.cpp, vLLM) are the
    // usual thing to develop against; guests' own fetches stay closed.
    if config.models.allow_private.is_empty() {
        config.models.allow_private = vec!["127.0.0.0/8".into(), "::1/128".into()];
    }
    if !args.no_examples {
        super::assistant::prepare_config(&mut config);
    }
    let node = start_node(config, &listener).await?;
    if !args.no_examples {
        for (name, code) in crate::guests::EXAMPLES {
            // A type of that name is the user's (or an example from an
            // earlier start): never replace it.
            if let Some(existing) = node.catalog().get(name) {
                tracing::info!(
                    ty = name,
                    version = existing.latest_version(),
                    "a type of this name exists, so the bundled example is not deployed \
                     (delete the type to get the example back)"
                );
                continue;
            }
            let d = node
                .deploy(name, CodeKind::Wasm, code.to_vec(), TypeConfig::default())
                .await
                .with_context(|| format!("failed to deploy the `{name}` example"))?;
            tracing::info!(
                ty = name,
                version = d.version,
                new = d.created,
                "example ready"
            );
        }
    }
    // Kept alive while the node serves.
    let _fake = if args.no_examples {
        None
    } else {
        super::assistant::deploy(&node).await?
    };
    let addr = listener.local_addr()?;
    let data_dir = node.config().data_dir.display().to_string();
    if super::logs_are_json() {
        // One JSON object per line: the greeting is a record too.
        tracing::info!(%addr, data_dir, auth = false, "marmot dev listening");
    } else {
        let mut greeting =
            format!("\nmarmot dev listening on http://{addr} (auth off, data in {data_dir})\n");
        // (Not the examples' calls when they are not deployed.)
        if !args.no_examples {
            greeting.push_str(&format!(
                "try:\n  curl -s -X POST http://{addr}/v1/actors/counter/alice -d '{{\"by\": 2}}'\n  \
                 curl -s http://{addr}/v1/actors/counter/alice\n  \
                 curl -s -X POST http://{addr}/v1/actors/assistant/alice -d '{{\"input\": \"Write a report to outputs/report.md\"}}'\n"
            ));
        }
        // Not `eprintln!`, which panics when stderr is a pipe whose reader
        // left (`marmot dev 2>&1 | head -2` stopped the node with a panic).
        use std::io::Write as _;
        let _ = writeln!(std::io::stderr(), "{greeting}");
    }
    run_server(node, listener).await
}

pub(super) async fn serve(args: ServeArgs) -> anyhow::Result<()> {
    let mut config = match &args.config {
        Some(path) => NodeConfig::from_file(path)?,
        None => NodeConfig::default(),
    };
    if let Some(l) = &args.listen {
        config.listen = super::parse_listen(l)?;
    }
    if let Some(d) = args.data {
        config.data_dir = d;
    }
    if let Some(c) = args.cache_dir {
        config.cache_dir = Some(c);
    }
    if let Ok(t) = std::env::var("MARMOT_ADMIN_TOKEN")
        && !t.is_empty()
    {
        config.admin_token = Some(t);
    }
    if config.admin_token.is_none() {
        anyhow::bail!(
            "`marmot serve` requires an admin token: set MARMOT_ADMIN_TOKEN or `admin_token` \
             in the config file (use `marmot dev` for a local node without auth)"
        );
    }
    let listen = config.listen;
    // Listen first: in a cluster, the node is routed to as soon as it
    // joins.
    let listener = bind(listen).await?;
    let node = start_node(config, &listener).await?;
    tracing::info!(addr = %listener.local_addr()?, "marmot serve listening");
    run_server(node, listener).await
}

/// Start the node that is to serve on `listener` (bound, not yet
/// accepting): in a cluster, once its `advertise` URL is known to reach.
async fn start_node(
    config: NodeConfig,
    listener: &tokio::net::TcpListener,
) -> anyhow::Result<Arc<Node>> {
    if let Some(cluster) = &config.cluster {
        crate::cluster::check_advertise(&cluster.advertise, listener).await?;
    }
    Node::start(config).await
}

/// Connections the kernel queues for the accept loop (capped by
/// `net.core.somaxconn`, 4,096 on current kernels). The standard library's
/// 128 overflowed under a burst of new connections to an idle node (a
/// probe: 3,646 overflows in 6,000 connects, 22 of them stalled 1 s for a
/// SYN retry).
const LISTEN_BACKLOG: u32 = 4096;

/// How long a graceful stop of a lone node waits for its idle actors to
/// hibernate ([`Node::hibernate_idle`]).
const STOP_HIBERNATE: std::time::Duration = std::time::Duration::from_secs(5);

async fn bind(addr: std::net::SocketAddr) -> anyhow::Result<tokio::net::TcpListener> {
    let listen = || -> std::io::Result<tokio::net::TcpListener> {
        let socket = match addr {
            std::net::SocketAddr::V4(_) => tokio::net::TcpSocket::new_v4()?,
            std::net::SocketAddr::V6(_) => tokio::net::TcpSocket::new_v6()?,
        };
        // As the standard library's `bind` does: a restart need not wait
        // for the old connections' TIME_WAIT.
        socket.set_reuseaddr(true)?;
        socket.bind(addr)?;
        socket.listen(LISTEN_BACKLOG)
    };
    listen().with_context(|| format!("cannot listen on {addr}"))
}

async fn run_server(node: Arc<Node>, listener: tokio::net::TcpListener) -> anyhow::Result<()> {
    if node.cluster().is_some() {
        // While serving (peers starting at the same time ask this node
        // too): `/readyz` says not ready until it is done.
        let n = node.clone();
        tokio::spawn(async move {
            crate::api::cluster::sync_catalog(&n).await;
            // Again each time it joins after losing its lease: the
            // cluster-wide writes made meanwhile did not reach it (a node
            // paused past its lease kept a deleted secret and an old
            // version until it restarted: found by a re-probe).
            let Some(mut rejoins) = n.cluster().map(|c| c.rejoins()) else {
                return;
            };
            while rejoins.changed().await.is_ok() {
                crate::api::cluster::sync_catalog(&n).await;
            }
        });
    }
    let stopping = node.clone();
    let shutdown = async move {
        shutdown_signal().await;
        // In a cluster: its slots go to their backups while it still
        // answers (requests caught by the switch are routed on).
        stopping.hand_over_slots_at_stop().await;
    };
    crate::api::serve(node.clone(), listener, shutdown).await?;
    if node.cluster().is_none() {
        // (A cluster node handed its actors over already.)
        node.hibernate_idle(STOP_HIBERNATE).await;
    }
    tracing::info!("shutting down: flushing storage");
    node.flush().await;
    if let Some(c) = node.cluster() {
        // The member key goes now rather than when the lease runs out.
        c.leave().await;
    }
    node.close_storage().await;
    Ok(())
}

/// The first SIGINT or SIGTERM: stop gracefully (new connections are
/// refused, requests in flight finish). A second one stops at once: a
/// turn in flight may run for up to its time limit (15 min by default),
/// and an operator who asks again means it. That is a crash as far as the
/// data goes, which every commit is ready for: what was acknowledged is
/// on disk, and turns cut short commit nothing (their callers retry).
async fn shutdown_signal() {
    stop_signal().await;
    tracing::info!("stopping: finishing the requests in flight (signal again to stop at once)");
    tokio::spawn(async {
        let signal = stop_signal().await;
        tracing::warn!("second signal: stopping at once; turns in flight commit nothing");
        // As a shell reports a process killed by it.
        std::process::exit(128 + signal);
    });
}

/// Wait for SIGINT or SIGTERM; its number.
async fn stop_signal() -> i32 {
    const SIGINT: i32 = 2;
    const SIGTERM: i32 = 15;
    let ctrl_c = async {
        let _ = tokio::signal::ctrl_c().await;
    };
    #[cfg(unix)]
    let term = async {
        match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()) {
            Ok(mut s) => {
                s.recv().await;
            }
            Err(_) => std::future::pending::<()>().await,
        }
    };
    #[cfg(not(unix))]
    let term = std::future::pending::<()>();
    tokio::select! {
        () = ctrl_c => SIGINT,
        () = term => SIGTERM,
    }
}
