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
//!   — and when none is idle, the one that has been sending a webhook's
//!   body longest (anyone may send one); when there is none of those
//!   either, it waits in the kernel's backlog until one closes. Without
//!   that, a thousand connections that never finish their heads kept every
//!   other client out for the whole head timeout.

use std::collections::HashMap;
use std::pin::Pin;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
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

/// At shutdown, a connection whose client has not taken the response's
/// last bytes for this long is closed. A client that stopped reading an
/// event stream kept its response unfinished, and the node from stopping,
/// for as long as it liked (a supervisor's SIGKILL ended it, flush or
/// not). Requests still being answered (a turn may run to its time limit)
/// are waited for, as before.
pub const STALLED_CLIENT: Duration = Duration::from_secs(10);

/// While serving, a connection whose client has not taken a frame of its
/// response for this long is closed. A client that stopped reading an
/// event stream (an event stream sends a comment every 15 s, so it always
/// has a frame waiting) held its stream's buffers and its connection slot
/// for ever: a probe's 1,000 such clients held ~1 GB, and 512 took every
/// slot of a node. An event stream's client resumes with `Last-Event-ID`.
pub const WRITE_STALL: Duration = Duration::from_secs(60);

/// What the listener allows.
#[derive(Debug, Clone, Copy)]
pub struct ListenLimits {
    /// Open connections at most.
    pub max_connections: usize,
    /// See [`MAX_HEAD_BYTES`].
    pub max_head_bytes: usize,
    /// See [`HEAD_TIMEOUT`].
    pub head_timeout: Duration,
    /// See [`STALLED_CLIENT`].
    pub stalled_client: Duration,
    /// See [`WRITE_STALL`].
    pub write_stall: Duration,
}

impl ListenLimits {
    /// The defaults, with `max_connections` open connections at most.
    pub fn new(max_connections: usize) -> Self {
        Self {
            max_connections,
            max_head_bytes: MAX_HEAD_BYTES,
            head_timeout: HEAD_TIMEOUT,
            stalled_client: STALLED_CLIENT,
            write_stall: WRITE_STALL,
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
    /// Since when a frame of its response waits for the client to take it
    /// (ms since the listener started, 0 when none does): the response
    /// body gave hyper a frame, and hyper has not asked for the next.
    frame_waiting_since_ms: AtomicU64,
    /// Closes it at once (its client stopped reading, at shutdown).
    drop_now: Notify,
    /// A request body is still coming in.
    receiving: AtomicBool,
    /// Since when a body to an open route (a webhook, which anyone may
    /// send) has been coming in (ms since the listener started, 0 when
    /// none is).
    open_body_since_ms: AtomicU64,
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

    /// Close the connections whose client has left a frame of their
    /// response untaken for longer than `stalled`, and, once the shutdown
    /// (begun at `draining_since_ms`) is that old, those still sending a
    /// request body: no turn has its input yet, and a slow sender held the
    /// shutdown for its body's time limit (17 minutes for a deploy).
    /// (`None` while serving: only the first kind, see [`WRITE_STALL`].)
    fn drop_stalled(&self, stalled: Duration, draining_since_ms: Option<u64>) {
        let now = self.now_ms();
        let stalled = stalled.as_millis() as u64;
        let uploads_too = draining_since_ms.is_some_and(|d| now.saturating_sub(d) > stalled);
        for c in self.open.lock().unwrap().values() {
            let since = c.frame_waiting_since_ms.load(Ordering::Acquire);
            let busy = c.busy.load(Ordering::Acquire) > 0;
            if busy && since != 0 && now.saturating_sub(since) > stalled {
                let when = if draining_since_ms.is_some() {
                    "stopping"
                } else {
                    "serving"
                };
                tracing::warn!(
                    waited_ms = now - since,
                    "{when}: closing a connection whose client stopped reading its response"
                );
                c.drop_now.notify_one();
            } else if busy && uploads_too && c.receiving.load(Ordering::Acquire) {
                tracing::warn!("stopping: closing a connection whose request body is still coming");
                c.drop_now.notify_one();
            }
        }
    }

    /// Ask the connection idle longest, if any, to close; when none is
    /// idle, close the one that has been sending a webhook's body longest,
    /// if any: anyone may send one, unsigned until its body is there, so
    /// connections sending them slowly held every slot, and kept clients
    /// with credentials out for as long as they kept it up (found by a
    /// probe: 20 s for an admin's request, 30 connections). Whether one
    /// was closed that way.
    fn evict_idlest(&self) -> bool {
        let open = self.open.lock().unwrap();
        let idlest = open
            .values()
            .filter(|c| c.busy.load(Ordering::Acquire) == 0)
            .min_by_key(|c| c.idle_since_ms.load(Ordering::Relaxed));
        if let Some(c) = idlest {
            c.close.notify_one();
            return false;
        }
        let slowest = open
            .values()
            .map(|c| (c, c.open_body_since_ms.load(Ordering::Acquire)))
            .filter(|(_, since)| *since != 0)
            .min_by_key(|(_, since)| *since);
        if let Some((c, since)) = slowest {
            tracing::debug!(
                sending_ms = self.now_ms().saturating_sub(since),
                "at the connection cap with none idle: closing the one sending a webhook body longest"
            );
            c.drop_now.notify_one();
            return true;
        }
        false
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
    let (closing, closed) = watch::channel(false);
    let mut next_id = 0u64;
    tokio::pin!(shutdown);
    let mut sweep = tokio::time::interval((limits.write_stall / 4).max(Duration::from_millis(10)));
    sweep.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    'accept: loop {
        let tcp = tokio::select! {
            accepted = listener.accept() => match accepted {
                Ok((tcp, _)) => tcp,
                Err(e) => {
                    accept_failed(e).await;
                    continue;
                }
            },
            _ = sweep.tick() => {
                connections.drop_stalled(limits.write_stall, None);
                continue;
            }
            () = &mut shutdown => break,
        };
        // A slot for it: at the cap, the idlest connection makes room;
        // when none is idle, this one waits (and the backlog behind it).
        let slot = match slots.clone().try_acquire_owned() {
            Ok(slot) => slot,
            Err(_) => {
                if connections.evict_idlest() {
                    metrics.evicted.inc();
                }
                loop {
                    tokio::select! {
                        slot = slots.clone().acquire_owned() => break slot.expect("never closed"),
                        // Stalled clients holding every slot are closed.
                        _ = sweep.tick() => connections.drop_stalled(limits.write_stall, None),
                        () = &mut shutdown => break 'accept,
                    }
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
            frame_waiting_since_ms: AtomicU64::new(0),
            drop_now: Notify::new(),
            receiving: AtomicBool::new(false),
            open_body_since_ms: AtomicU64::new(0),
            close: Notify::new(),
        });
        connections.open.lock().unwrap().insert(id, tracked.clone());
        let service = hyper::service::service_fn({
            let (app, tracked, connections) = (app.clone(), tracked.clone(), connections.clone());
            let before = before.clone();
            move |req: Request<Incoming>| {
                let guard = Busy::enter(&tracked, &connections);
                let app = app.clone();
                let open_route = req.uri().path().starts_with("/v1/hooks/");
                let now = open_route.then(|| connections.now_ms());
                let mut req = req.map(|body| Body::new(Receiving::new(body, &tracked, now)));
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
        let (metrics, connections, mut closed) =
            (metrics.clone(), connections.clone(), closed.clone());
        tokio::spawn(async move {
            tokio::pin!(conn);
            let mut asked = false;
            loop {
                let evicted = tokio::select! {
                    // Errors are the client's (a reset, a bad or slow head).
                    _ = conn.as_mut() => break,
                    () = tracked.close.notified(), if !asked => true,
                    _ = closed.wait_for(|c| *c), if !asked => false,
                    () = tracked.drop_now.notified() => break,
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
    // Every connection finishes what it is doing, then closes; one whose
    // client stopped taking its response is closed.
    let _ = closing.send(true);
    let draining_since = connections.now_ms();
    let mut look = tokio::time::interval(Duration::from_millis(250));
    loop {
        tokio::select! {
            () = closing.closed() => break,
            _ = look.tick() => connections.drop_stalled(limits.stalled_client, Some(draining_since)),
        }
    }
    Ok(())
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
        tracked.frame_waiting_since_ms.store(0, Ordering::Release);
        Self {
            tracked: tracked.clone(),
            connections: connections.clone(),
        }
    }
}

impl Drop for Busy {
    fn drop(&mut self) {
        let t = &self.tracked;
        t.frame_waiting_since_ms.store(0, Ordering::Release);
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
        let polled = Pin::new(&mut self.body).poll_frame(cx);
        // Set while a frame it gave waits for hyper to ask for the next.
        let busy = &self._busy;
        let waiting_since = match &polled {
            Poll::Ready(Some(Ok(_))) => busy.connections.now_ms().max(1),
            _ => 0,
        };
        busy.tracked
            .frame_waiting_since_ms
            .store(waiting_since, Ordering::Release);
        polled
    }

    fn is_end_stream(&self) -> bool {
        self.body.is_end_stream()
    }

    fn size_hint(&self) -> SizeHint {
        self.body.size_hint()
    }
}

/// A request's body, marking its connection as receiving until it ends
/// (or is dropped).
struct Receiving {
    body: Incoming,
    tracked: Arc<Tracked>,
}

impl Receiving {
    /// `open_since_ms`: when the body began, for an open route's.
    fn new(body: Incoming, tracked: &Arc<Tracked>, open_since_ms: Option<u64>) -> Self {
        use hyper::body::Body as _;
        let coming = !body.is_end_stream();
        tracked.receiving.store(coming, Ordering::Release);
        let open_since = open_since_ms.filter(|_| coming).map_or(0, |ms| ms.max(1));
        tracked
            .open_body_since_ms
            .store(open_since, Ordering::Release);
        Self {
            body,
            tracked: tracked.clone(),
        }
    }

    fn done(&self) {
        self.tracked.receiving.store(false, Ordering::Release);
        self.tracked.open_body_since_ms.store(0, Ordering::Release);
    }
}

impl hyper::body::Body for Receiving {
    type Data = bytes::Bytes;
    type Error = hyper::Error;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Self::Data>, Self::Error>>> {
        let polled = Pin::new(&mut self.body).poll_frame(cx);
        if matches!(polled, Poll::Ready(None | Some(Err(_)))) {
            self.done();
        }
        polled
    }

    fn is_end_stream(&self) -> bool {
        self.body.is_end_stream()
    }

    fn size_hint(&self) -> SizeHint {
        self.body.size_hint()
    }
}

impl Drop for Receiving {
    fn drop(&mut self) {
        self.done();
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

    /// Serve `app` with stalled clients closed after 300 ms at shutdown;
    /// the server's task, and what stops it.
    async fn serve(
        app: Router,
    ) -> (
        std::net::SocketAddr,
        tokio::task::JoinHandle<std::io::Result<()>>,
        tokio::sync::oneshot::Sender<()>,
    ) {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let mut limits = ListenLimits::new(16);
        limits.stalled_client = Duration::from_millis(300);
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
        (addr, served, stop)
    }

    /// A client that stopped reading a response that goes on (an event
    /// stream) is closed at shutdown once it has left a frame untaken for
    /// the limit: it held the node's shutdown for as long as it liked.
    #[tokio::test]
    async fn a_client_that_stopped_reading_is_closed_at_shutdown() {
        let app = Router::new().route(
            "/",
            axum::routing::get(|| async {
                let chunk = bytes::Bytes::from(vec![b'x'; 64 << 10]);
                Body::from_stream(futures::stream::repeat_with(move || {
                    Ok::<_, std::io::Error>(chunk.clone())
                }))
            }),
        );
        let (addr, served, stop) = serve(app).await;
        let socket = tokio::net::TcpSocket::new_v4().unwrap();
        socket.set_recv_buffer_size(4096).unwrap();
        let mut tcp = socket.connect(addr).await.unwrap();
        tcp.write_all(b"GET / HTTP/1.1\r\nhost: x\r\n\r\n")
            .await
            .unwrap();
        // The response's head: then the client reads nothing more.
        let mut buf = [0u8; 1024];
        let n = tcp.read(&mut buf).await.unwrap();
        assert!(buf[..n].starts_with(b"HTTP/1.1 200"), "{:?}", &buf[..n]);
        tokio::time::sleep(Duration::from_millis(200)).await;
        stop.send(()).unwrap();
        tokio::time::timeout(Duration::from_secs(10), served)
            .await
            .expect("the shutdown waited for a client that stopped reading")
            .unwrap()
            .unwrap();
    }

    /// While serving, a client that has not taken a frame of its response
    /// for the write-stall limit is closed, and its slot goes to a new
    /// connection: stalled event streams held their buffers and slots for
    /// ever (a probe: 512 of them took every slot of a node).
    #[tokio::test]
    async fn a_client_that_stopped_reading_is_closed_while_serving() {
        let app = Router::new()
            .route(
                "/",
                axum::routing::get(|| async {
                    let chunk = bytes::Bytes::from(vec![b'x'; 64 << 10]);
                    Body::from_stream(futures::stream::repeat_with(move || {
                        Ok::<_, std::io::Error>(chunk.clone())
                    }))
                }),
            )
            .route("/ok", axum::routing::get(|| async { "ok" }));
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let mut limits = ListenLimits::new(1);
        limits.write_stall = Duration::from_millis(400);
        tokio::spawn(serve_app(
            app,
            listener,
            limits,
            ListenMetrics::default(),
            std::future::pending(),
            |_| None,
        ));
        let socket = tokio::net::TcpSocket::new_v4().unwrap();
        socket.set_recv_buffer_size(4096).unwrap();
        let mut stalled = socket.connect(addr).await.unwrap();
        stalled
            .write_all(b"GET / HTTP/1.1\r\nhost: x\r\n\r\n")
            .await
            .unwrap();
        let mut buf = [0u8; 1024];
        let n = stalled.read(&mut buf).await.unwrap();
        assert!(buf[..n].starts_with(b"HTTP/1.1 200"));
        // The only slot is the stalled client's: a new one gets it once
        // the stalled one is closed.
        let mut next = tokio::net::TcpStream::connect(addr).await.unwrap();
        next.write_all(b"GET /ok HTTP/1.1\r\nhost: x\r\nconnection: close\r\n\r\n")
            .await
            .unwrap();
        let mut answer = String::new();
        tokio::time::timeout(Duration::from_secs(10), next.read_to_string(&mut answer))
            .await
            .expect("the stalled client kept the slot")
            .unwrap();
        assert!(answer.starts_with("HTTP/1.1 200"), "{answer}");
    }

    /// A client still sending its request body when the shutdown began is
    /// closed once the shutdown is the limit old: no turn has its input
    /// yet, and a slow sender held the node for its body's time limit.
    #[tokio::test]
    async fn a_client_still_sending_its_body_is_closed_at_shutdown() {
        let app = Router::new().route(
            "/",
            axum::routing::post(|body: axum::body::Bytes| async move { body.len().to_string() }),
        );
        let (addr, served, stop) = serve(app).await;
        let mut tcp = tokio::net::TcpStream::connect(addr).await.unwrap();
        tcp.write_all(b"POST / HTTP/1.1\r\nhost: x\r\ncontent-length: 1000000\r\n\r\n")
            .await
            .unwrap();
        let drip = tokio::spawn(async move {
            for _ in 0..100 {
                if tcp.write_all(b" ").await.is_err() {
                    return true;
                }
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
            false
        });
        tokio::time::sleep(Duration::from_millis(200)).await;
        let asked = Instant::now();
        stop.send(()).unwrap();
        tokio::time::timeout(Duration::from_secs(5), served)
            .await
            .expect("the shutdown waited for a slow upload")
            .unwrap()
            .unwrap();
        assert!(asked.elapsed() >= Duration::from_millis(300));
        assert!(drip.await.unwrap(), "the uploader was not cut off");
    }

    /// A request still being answered at shutdown (a long turn) is waited
    /// for, however long: only a client that stopped reading is cut off.
    #[tokio::test]
    async fn a_request_being_answered_at_shutdown_is_finished() {
        let app = Router::new().route(
            "/",
            axum::routing::get(|| async {
                tokio::time::sleep(Duration::from_millis(1500)).await;
                "done"
            }),
        );
        let (addr, served, stop) = serve(app).await;
        let mut tcp = tokio::net::TcpStream::connect(addr).await.unwrap();
        tcp.write_all(b"GET / HTTP/1.1\r\nhost: x\r\n\r\n")
            .await
            .unwrap();
        tokio::time::sleep(Duration::from_millis(100)).await;
        stop.send(()).unwrap();
        let mut got = Vec::new();
        tokio::time::timeout(Duration::from_secs(10), tcp.read_to_end(&mut got))
            .await
            .unwrap()
            .unwrap();
        let got = String::from_utf8_lossy(&got);
        assert!(
            got.starts_with("HTTP/1.1 200") && got.ends_with("done"),
            "{got}"
        );
        served.await.unwrap().unwrap();
    }
}
