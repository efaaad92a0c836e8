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
//!   and the kernel's socket; the pool plan computes it). At the cap, a new
//!   connection closes the one *idle* longest — no request in flight and no
//!   response being sent: a keep-alive connection between requests, or one
//!   still sending its head, as nginx does with its keep-alive connections
//!   — and when none is idle it waits in the kernel's backlog until one
//!   closes. Without that, a thousand connections that never finish their
//!   heads kept every other client out for the whole head timeout.

use std::collections::HashMap;
use std::pin::Pin;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll};
use std::time::{Duration, Instant};

use axum::Router;
use axum::body::Body;
use axum::extract::Request;
use hyper::body::{Frame, Incoming, SizeHint};
use hyper::server::conn::http1;
use hyper_util::rt::{TokioIo, TokioTimer};
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::gauge::Gauge;
use tokio::net::TcpListener;
use tokio::sync::{Notify, Semaphore, watch};
use tower::ServiceExt;

/// Longest request head (request line and headers) a connection may send.
pub const MAX_HEAD_BYTES: usize = 32 << 10;

/// Longest wait for a complete request head, and for the next request on
/// an idle keep-alive connection.
pub const HEAD_TIMEOUT: Duration = Duration::from_secs(30);

/// Longest a shutdown waits for open connections to finish their
/// requests; then they are closed. A client that stopped reading an event
/// stream kept its response unfinished, and the node from stopping, for as
/// long as it liked (a supervisor's SIGKILL ended it, flush or not).
pub const SHUTDOWN_GRACE: Duration = Duration::from_secs(20);

/// What the listener allows.
#[derive(Debug, Clone, Copy)]
pub struct ListenLimits {
    /// Open connections at most.
    pub max_connections: usize,
    /// See [`MAX_HEAD_BYTES`].
    pub max_head_bytes: usize,
    /// See [`HEAD_TIMEOUT`].
    pub head_timeout: Duration,
    /// See [`SHUTDOWN_GRACE`].
    pub shutdown_grace: Duration,
}

impl ListenLimits {
    /// The defaults, with `max_connections` open connections at most.
    pub fn new(max_connections: usize) -> Self {
        Self {
            max_connections,
            max_head_bytes: MAX_HEAD_BYTES,
            head_timeout: HEAD_TIMEOUT,
            shutdown_grace: SHUTDOWN_GRACE,
        }
    }
}

/// What the listener counts.
#[derive(Clone, Default)]
pub struct ListenMetrics {
    /// Connections open.
    pub open: Gauge,
    /// Idle connections closed to make room for a new one.
    pub evicted: Counter,
}

/// One open connection, as the accept loop sees it.
struct Tracked {
    /// Requests in flight: from the head being read to the end of the
    /// response body.
    busy: AtomicUsize,
    /// When it last became idle (ms since the listener started).
    idle_since_ms: AtomicU64,
    /// Asks it to close once idle (at once if it is).
    close: Notify,
}

/// The open connections.
struct Connections {
    started: Instant,
    open: Mutex<HashMap<u64, Arc<Tracked>>>,
}

impl Connections {
    fn now_ms(&self) -> u64 {
        self.started.elapsed().as_millis() as u64
    }

    /// Ask the connection idle longest, if any, to close.
    fn evict_idlest(&self) {
        let open = self.open.lock().unwrap();
        let idlest = open
            .values()
            .filter(|c| c.busy.load(Ordering::Acquire) == 0)
            .min_by_key(|c| c.idle_since_ms.load(Ordering::Relaxed));
        if let Some(c) = idlest {
            c.close.notify_one();
        }
    }
}

/// Serve `app` on `listener` within `limits` until `shutdown` resolves,
/// then let open connections finish their requests. `before` sees each
/// request before it is routed (and may answer it instead).
pub async fn serve_app(
    app: Router,
    listener: TcpListener,
    limits: ListenLimits,
    metrics: ListenMetrics,
    shutdown: impl std::future::Future<Output = ()>,
    before: impl Fn(&mut Request<Body>) -> Option<axum::response::Response> + Send + Sync + 'static,
) -> std::io::Result<()> {
    let before = Arc::new(before);
    let slots = Arc::new(Semaphore::new(
        limits.max_connections.clamp(1, Semaphore::MAX_PERMITS),
    ));
    let mut http = http1::Builder::new();
    http.timer(TokioTimer::new())
        .header_read_timeout(limits.head_timeout)
        .max_buf_size(limits.max_head_bytes.max(8192));
    let connections = Arc::new(Connections {
        started: Instant::now(),
        open: Mutex::default(),
    });
    let (closing, closed) = watch::channel(Stage::Serving);
    let mut next_id = 0u64;
    tokio::pin!(shutdown);
    loop {
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
        // A slot for it: at the cap, the idlest connection makes room;
        // when none is idle, this one waits (and the backlog behind it).
        let slot = match slots.clone().try_acquire_owned() {
            Ok(slot) => slot,
            Err(_) => {
                connections.evict_idlest();
                tokio::select! {
                    slot = slots.clone().acquire_owned() => slot.expect("never closed"),
                    () = &mut shutdown => break,
                }
            }
        };
        // Small writes (SSE frames, short replies) go out at once.
        let _ = tcp.set_nodelay(true);
        let id = next_id;
        next_id += 1;
        let tracked = Arc::new(Tracked {
            busy: AtomicUsize::new(0),
            idle_since_ms: AtomicU64::new(connections.now_ms()),
            close: Notify::new(),
        });
        connections.open.lock().unwrap().insert(id, tracked.clone());
        let service = hyper::service::service_fn({
            let (app, tracked, connections) = (app.clone(), tracked.clone(), connections.clone());
            let before = before.clone();
            move |req: Request<Incoming>| {
                let guard = Busy::enter(&tracked, &connections);
                let app = app.clone();
                let mut req = req.map(Body::new);
                let early = before(&mut req);
                async move {
                    let response = match early {
                        Some(r) => r,
                        None => app.oneshot(req).await?,
                    };
                    Ok::<_, std::convert::Infallible>(
                        response.map(|body| Body::new(Tracking { body, _busy: guard })),
                    )
                }
            }
        });
        let conn = http.serve_connection(TokioIo::new(tcp), service);
        metrics.open.inc();
        let (metrics, connections, mut closed, mut forced) = (
            metrics.clone(),
            connections.clone(),
            closed.clone(),
            closed.clone(),
        );
        tokio::spawn(async move {
            tokio::pin!(conn);
            let mut asked = false;
            loop {
                let evicted = tokio::select! {
                    // Errors are the client's (a reset, a bad or slow head).
                    _ = conn.as_mut() => break,
                    () = tracked.close.notified(), if !asked => true,
                    _ = closed.wait_for(|c| *c != Stage::Serving), if !asked => false,
                    _ = forced.wait_for(|c| *c == Stage::Closing) => break,
                };
                // Asked to close. The connection is polled only here, so
                // nothing can start between this look and the drop: with
                // nothing in flight (between requests, or amid a head that
                // hyper would wait for) it closes now; else after its
                // request.
                if tracked.busy.load(Ordering::Acquire) == 0 {
                    if evicted {
                        metrics.evicted.inc();
                    }
                    break;
                }
                asked = true;
                conn.as_mut().graceful_shutdown();
            }
            connections.open.lock().unwrap().remove(&id);
            metrics.open.dec();
            drop(slot);
        });
    }
    drop((listener, closed));
    // Every connection finishes what it is doing, then closes; those still
    // open after the grace are closed.
    let _ = closing.send(Stage::Draining);
    if tokio::time::timeout(limits.shutdown_grace, closing.closed())
        .await
        .is_err()
    {
        let open = connections.open.lock().unwrap().len();
        tracing::warn!(
            connections = open,
            grace_ms = limits.shutdown_grace.as_millis() as u64,
            "stopping: closing connections whose requests did not finish within the grace"
        );
        let _ = closing.send(Stage::Closing);
        closing.closed().await;
    }
    Ok(())
}

/// Where a shutdown of the listener stands.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Stage {
    /// Not begun.
    Serving,
    /// Connections finish their requests.
    Draining,
    /// Connections close now.
    Closing,
}

/// A request in flight on its connection, from its head to the end (or
/// drop) of its response body.
struct Busy {
    tracked: Arc<Tracked>,
    connections: Arc<Connections>,
}

impl Busy {
    fn enter(tracked: &Arc<Tracked>, connections: &Arc<Connections>) -> Self {
        tracked.busy.fetch_add(1, Ordering::AcqRel);
        Self {
            tracked: tracked.clone(),
            connections: connections.clone(),
        }
    }
}

impl Drop for Busy {
    fn drop(&mut self) {
        let t = &self.tracked;
        t.idle_since_ms
            .store(self.connections.now_ms(), Ordering::Relaxed);
        t.busy.fetch_sub(1, Ordering::AcqRel);
    }
}

/// A response body that keeps its request counted until it is done.
struct Tracking {
    body: Body,
    _busy: Busy,
}

impl hyper::body::Body for Tracking {
    type Data = bytes::Bytes;
    type Error = axum::Error;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Self::Data>, Self::Error>>> {
        Pin::new(&mut self.body).poll_frame(cx)
    }

    fn is_end_stream(&self) -> bool {
        self.body.is_end_stream()
    }

    fn size_hint(&self) -> SizeHint {
        self.body.size_hint()
    }
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

#[cfg(test)]
mod tests {
    use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};

    use super::*;

    /// A response that never ends (a client that stopped reading an event
    /// stream) holds a shutdown for the grace, no longer.
    #[tokio::test]
    async fn a_response_that_never_ends_is_closed_after_the_grace() {
        let app = Router::new().route(
            "/",
            axum::routing::get(|| async {
                Body::from_stream(futures::stream::pending::<
                    Result<bytes::Bytes, std::io::Error>,
                >())
            }),
        );
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let mut limits = ListenLimits::new(16);
        limits.shutdown_grace = Duration::from_millis(300);
        let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
        let served = tokio::spawn(serve_app(
            app,
            listener,
            limits,
            ListenMetrics::default(),
            async {
                let _ = stopped.await;
            },
            |_| None,
        ));
        let mut tcp = tokio::net::TcpStream::connect(addr).await.unwrap();
        tcp.write_all(b"GET / HTTP/1.1\r\nhost: x\r\n\r\n")
            .await
            .unwrap();
        // The response's head: the request is in flight.
        let mut buf = [0u8; 1024];
        let n = tcp.read(&mut buf).await.unwrap();
        assert!(buf[..n].starts_with(b"HTTP/1.1 200"), "{:?}", &buf[..n]);
        let asked = Instant::now();
        stop.send(()).unwrap();
        tokio::time::timeout(Duration::from_secs(10), served)
            .await
            .expect("the shutdown waited past its grace")
            .unwrap()
            .unwrap();
        assert!(asked.elapsed() >= Duration::from_millis(300));
        assert!(
            matches!(tcp.read(&mut buf).await, Ok(0) | Err(_)),
            "the connection stayed open"
        );
    }
}
