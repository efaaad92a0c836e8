//! The node's HTTP listener, and what each connection may hold.
//!
//! `axum::serve` gives no hand on hyper's settings, and hyper's defaults
//! let a request head grow to ~400 KB per connection, for as long as the
//! client keeps sending, on as many connections as the open-files limit
//! allows. Measured with `marmot dev` defaults: 2,000 connections, each
//! sending 300 KB of header lines and never finishing its head, took the
//! node from 99 MB to 1,029 MB of RSS, and held it — in a 1 GiB cgroup, the
//! kernel kills the node. So the node runs its own accept loop with:
//!
//! * a **head limit** ([`MAX_HEAD_BYTES`]): hyper's buffer for one
//!   connection stops there, and a longer head gets 431;
//! * a **head timeout** ([`HEAD_TIMEOUT`]): a head not complete within it
//!   closes the connection; it also ends a keep-alive connection idle that
//!   long between requests;
//! * a **connection cap** (`limits.max_connections`, by default what a
//!   sixteenth of the host's memory holds at a planned worst case of
//!   64 KiB each: a full head buffer, the response being written, the task
//!   and the kernel's socket; the pool plan computes it): at the cap the
//!   node stops accepting, and new connections wait in the kernel's
//!   backlog until one closes.

use std::sync::Arc;
use std::time::Duration;

use axum::Router;
use hyper::server::conn::http1;
use hyper_util::rt::{TokioIo, TokioTimer};
use hyper_util::server::graceful::GracefulShutdown;
use hyper_util::service::TowerToHyperService;
use prometheus_client::metrics::gauge::Gauge;
use tokio::net::TcpListener;
use tokio::sync::Semaphore;

/// Longest request head (request line and headers) a connection may send.
pub const MAX_HEAD_BYTES: usize = 32 << 10;

/// Longest wait for a complete request head, and for the next request on
/// an idle keep-alive connection.
pub const HEAD_TIMEOUT: Duration = Duration::from_secs(30);

/// What the listener allows.
#[derive(Debug, Clone, Copy)]
pub struct ListenLimits {
    /// Open connections at most.
    pub max_connections: usize,
    /// See [`MAX_HEAD_BYTES`].
    pub max_head_bytes: usize,
    /// See [`HEAD_TIMEOUT`].
    pub head_timeout: Duration,
}

impl ListenLimits {
    /// The defaults, with `max_connections` open connections at most.
    pub fn new(max_connections: usize) -> Self {
        Self {
            max_connections,
            max_head_bytes: MAX_HEAD_BYTES,
            head_timeout: HEAD_TIMEOUT,
        }
    }
}

/// Serve `app` on `listener` within `limits` until `shutdown` resolves,
/// then let open connections finish their requests. `open` counts the
/// connections.
pub async fn serve_app(
    app: Router,
    listener: TcpListener,
    limits: ListenLimits,
    open: Gauge,
    shutdown: impl std::future::Future<Output = ()>,
) -> std::io::Result<()> {
    let slots = Arc::new(Semaphore::new(
        limits.max_connections.clamp(1, Semaphore::MAX_PERMITS),
    ));
    let mut http = http1::Builder::new();
    http.timer(TokioTimer::new())
        .header_read_timeout(limits.head_timeout)
        .max_buf_size(limits.max_head_bytes.max(8192));
    let graceful = GracefulShutdown::new();
    tokio::pin!(shutdown);
    loop {
        // A slot first: at the cap, connections wait in the backlog.
        let slot = tokio::select! {
            slot = slots.clone().acquire_owned() => slot.expect("never closed"),
            () = &mut shutdown => break,
        };
        let tcp = tokio::select! {
            accepted = listener.accept() => match accepted {
                Ok((tcp, _)) => tcp,
                Err(e) => {
                    accept_failed(e).await;
                    continue;
                }
            },
            () = &mut shutdown => break,
        };
        // Small writes (SSE frames, short replies) go out at once.
        let _ = tcp.set_nodelay(true);
        let service = TowerToHyperService::new(app.clone());
        let conn = graceful.watch(http.serve_connection(TokioIo::new(tcp), service));
        open.inc();
        let open = open.clone();
        tokio::spawn(async move {
            // Errors are the client's (a reset, a bad or slow head).
            let _ = conn.await;
            open.dec();
            drop(slot);
        });
    }
    drop(listener);
    graceful.shutdown().await;
    Ok(())
}

/// After a failed accept: go on at once when only that connection failed;
/// otherwise (out of file descriptors, say) say so and wait a moment, as
/// the failure would repeat at once.
async fn accept_failed(e: std::io::Error) {
    use std::io::ErrorKind::{ConnectionAborted, ConnectionRefused, ConnectionReset};
    if matches!(
        e.kind(),
        ConnectionAborted | ConnectionRefused | ConnectionReset
    ) {
        return;
    }
    tracing::error!(error = %e, "accepting a connection failed; retrying in a second");
    tokio::time::sleep(Duration::from_secs(1)).await;
}
