//! The node's bound on the request bodies it holds at once, and on how
//! long a body may take to arrive.
//!
//! A request's body stays in memory from the moment it is read until the
//! response: in the actor's mailbox while earlier messages run, then in the
//! turn. Each is bounded (`limits.max_message_bytes`, 1 MiB), but their
//! number only by connections, so a thousand clients posting large bodies
//! to a few slow actors once held more than a small host has, and the
//! kernel killed the node. The edge now charges every request the body
//! bytes it has *received* against `limits.request_body_budget_bytes`,
//! holds the charge until the response is made, and answers 503
//! `overloaded` with `Retry-After` when a body does not fit: at once when
//! its declared length (`Content-Length`, at most the route's limit) is
//! more than the budget has left, else when a chunk arrives that does not
//! fit. Requests without a body are never refused, nor are the cluster's
//! own (`/v1/cluster/…`: replication between nodes, sized by its
//! protocol).
//!
//! Bytes are charged as they arrive, not as declared, and a body must
//! arrive within `limits.body_timeout_ms` plus a second per 64 KiB of its
//! declared length, or of the route's largest body when it declares none
//! (408 `body_timeout` after that, and the connection closes); a webhook,
//! which anyone may send, within 5 s in all. A body that declares more
//! than its route takes is refused at once (413). Until 2026-12-06 the declared length was charged when the head
//! arrived and a body could take forever: 1,600 connections declaring
//! 1 MiB each and sending nothing held the whole default budget, with no
//! credentials (webhook routes read their body before checking it), and
//! every request with a body got 503 for as long as they stayed open.
//!
//! A body a handler does not read to its end (refused past its route's
//! limit, or not needed for the answer) is read on and dropped, within
//! 128 MiB and 2 s, while the answer goes out, and the connection closes
//! after it: closed at once, a client still sending saw "broken pipe"
//! instead of its 413, and one that reused the connection saw its next
//! request fail. Not a webhook's, which anyone may trickle, nor one whose
//! client waits to be asked for it (`Expect: 100-continue`).

use std::pin::Pin;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::task::{Context, Poll};
use std::time::Duration;

use axum::body::Body;
use axum::extract::Request;
use axum::http::{Method, StatusCode, header};
use http_body_util::BodyExt as _;
use hyper::body::{Frame, SizeHint};
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::gauge::Gauge;

use super::ApiError;

/// What a body is allowed per second on top of the timeout's slack.
const MIN_RATE_BYTES_PER_S: u64 = 64 << 10;

/// The most slack a body to an open route (a webhook) is given.
const OPEN_ROUTE_SLACK: Duration = Duration::from_secs(5);

/// How much of a body left unread is read and dropped, and for how long,
/// so that its client gets the answer: one closed at once while still
/// sending sees only "broken pipe" (reqwest did, for a 413). Twice the
/// largest route limit by default (code, 64 MiB): a bundle a little too
/// large is told so. Read into nothing, it costs time, not memory.
pub(super) const LINGER_BYTES: u64 = 128 << 20;
const LINGER_TIME: Duration = Duration::from_secs(2);

/// Read what is left of `body` and drop it, within [`LINGER_BYTES`] and
/// [`LINGER_TIME`], while its answer goes out; the connection closes if
/// the body does not end by then.
pub(super) fn linger(mut body: Body) {
    let Ok(runtime) = tokio::runtime::Handle::try_current() else {
        return;
    };
    runtime.spawn(async move {
        let drain = async {
            let mut read = 0u64;
            while read <= LINGER_BYTES {
                match body.frame().await {
                    Some(Ok(frame)) => {
                        read += frame.data_ref().map_or(0, |d| d.len() as u64);
                    }
                    _ => return,
                }
            }
        };
        let _ = tokio::time::timeout(LINGER_TIME, drain).await;
    });
}

/// Whether what is left of `req`'s body may be read on ([`linger`]): not
/// when its client waits to be asked for it (`Expect: 100-continue`), nor
/// for a webhook, which anyone may trickle.
pub(super) fn may_linger(req: &Request) -> bool {
    !req.headers().contains_key(header::EXPECT) && !req.uri().path().starts_with("/v1/hooks/")
}

/// Bytes of request bodies held, against the budget.
pub(super) struct BodyBudget {
    limit: u64,
    /// The largest message body (most routes' limit).
    message: u64,
    /// The largest deploy body (`PUT /v1/types/{type}`).
    code: u64,
    /// The least time a body is given to arrive.
    slack: Duration,
    held: AtomicU64,
    held_gauge: Gauge,
    refused: Counter,
}

/// What a request's body has been charged so far, given back when dropped
/// (once the response is made).
pub(super) struct Charge {
    budget: Arc<BodyBudget>,
    bytes: Arc<AtomicU64>,
    /// Set when the body was cut off: the connection cannot carry another
    /// request.
    cut: Arc<AtomicBool>,
    /// Set once the body has been read to its end.
    ended: Arc<AtomicBool>,
    /// What the deadline is sized by: the declared length, or the
    /// route's largest body when none is declared.
    sized_by: u64,
    /// The least time the body is given to arrive.
    slack: Duration,
    /// Whether what a handler leaves of the body is read and dropped
    /// ([`linger`], [`may_linger`]).
    linger: bool,
}

/// Why a body was cut off while it arrived.
#[derive(Debug, thiserror::Error)]
pub(super) enum BodyCut {
    #[error(
        "the node holds {held} bytes of request bodies already, and this body's next {bytes} \
         bytes do not fit its budget of {limit} bytes (limits.request_body_budget_bytes); \
         retry later"
    )]
    OverBudget { held: u64, bytes: u64, limit: u64 },
    #[error(
        "the request body did not arrive within {}s (limits.body_timeout_ms plus a second per \
         64 KiB it declares; 5 s in all for a webhook)", .0.as_secs()
    )]
    TimedOut(Duration),
}

impl BodyBudget {
    /// A budget of `limit` bytes, for routes taking bodies up to `message`
    /// bytes, and deploys up to `code`; a body is given `slack` to arrive,
    /// and more for larger routes.
    pub(super) fn new(
        limit: u64,
        message: u64,
        code: u64,
        slack: Duration,
        held_gauge: Gauge,
        refused: Counter,
    ) -> Arc<Self> {
        Arc::new(Self {
            limit,
            message,
            code,
            slack,
            held: AtomicU64::new(0),
            held_gauge,
            refused,
        })
    }

    /// Admit `req`'s body (nothing charged yet), or refuse it at once when
    /// its declared length is more than the budget has left.
    pub(super) fn admit(self: &Arc<Self>, req: &Request) -> Result<Option<Charge>, ApiError> {
        let path = req.uri().path();
        if path.starts_with("/v1/cluster/") {
            return Ok(None);
        }
        let (route_limit, setting) =
            if req.method() == Method::PUT && path.starts_with("/v1/types/") {
                (self.code, "limits.max_code_bytes")
            } else {
                (self.message, "limits.max_message_bytes")
            };
        let length = req.headers().get(header::CONTENT_LENGTH).map(|v| {
            v.to_str()
                .ok()
                .and_then(|s| s.trim().parse::<u64>().ok())
                .unwrap_or(route_limit)
        });
        // Refused before a byte of it is read (or a `100 Continue` sent):
        // it waited for the whole body, or for the body's deadline when it
        // never came, and then said only that it took too long.
        if let Some(n) = length.filter(|n| *n > route_limit) {
            return Err(ApiError::new(
                StatusCode::PAYLOAD_TOO_LARGE,
                "payload_too_large",
                format!(
                    "the request body declares {n} bytes; this route takes at most \
                     {route_limit} ({setting})"
                ),
            ));
        }
        // Anyone may post a webhook, signed with anything while its body
        // is not there to check: such a body is given a few seconds in
        // all, whatever it declares (a made-up signature held a connection
        // 46 s, then 21 s declaring 1 MiB: probes).
        let open_route = path.starts_with("/v1/hooks/");
        // The deadline is sized by what the body declares: one of a few
        // bytes was given as long as the route's largest.
        let sized_by = if open_route {
            0
        } else {
            length.unwrap_or(route_limit).min(route_limit)
        };
        let slack = if open_route {
            self.slack.min(OPEN_ROUTE_SLACK)
        } else {
            self.slack
        };
        let declared = match length {
            Some(n) => n,
            // Unknown length: judged as it arrives.
            None if req.headers().contains_key(header::TRANSFER_ENCODING) => 1,
            None => 0,
        }
        .min(route_limit)
        // One body larger than the whole budget still goes through alone.
        .min(self.limit);
        if declared == 0 {
            return Ok(None);
        }
        let held = self.held.load(Ordering::Acquire);
        if held.saturating_add(declared) > self.limit {
            self.refused.inc();
            return Err(ApiError::overloaded(format!(
                "the node holds {held} bytes of request bodies already and this one \
                 declares {declared}: past its budget of {} bytes \
                 (limits.request_body_budget_bytes); retry later",
                self.limit
            )));
        }
        Ok(Some(Charge {
            budget: self.clone(),
            bytes: Arc::default(),
            cut: Arc::default(),
            ended: Arc::default(),
            sized_by,
            slack,
            linger: may_linger(req),
        }))
    }

    /// Take `bytes` more for a body that holds `own` already, if they fit.
    fn take(&self, bytes: u64, own: u64) -> Result<(), BodyCut> {
        let taken = self
            .held
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |held| {
                let n = held.checked_add(bytes)?;
                // A body alone may use the whole budget and then some (the
                // one larger than the budget): only a shared one is cut.
                (n <= self.limit || held == own).then_some(n)
            });
        match taken {
            Ok(_) => {
                self.held_gauge.inc_by(bytes as i64);
                Ok(())
            }
            Err(held) => {
                self.refused.inc();
                Err(BodyCut::OverBudget {
                    held,
                    bytes,
                    limit: self.limit,
                })
            }
        }
    }
}

impl Charge {
    /// `body`, charged to this request as it arrives and cut off when it
    /// does not fit the budget or is late.
    pub(super) fn guard(&self, body: Body) -> Body {
        let allowed =
            self.slack + Duration::from_secs(self.sized_by.div_ceil(MIN_RATE_BYTES_PER_S));
        Body::new(Guarded {
            body,
            budget: self.budget.clone(),
            charged: self.bytes.clone(),
            cut: self.cut.clone(),
            ended: self.ended.clone(),
            allowed,
            deadline: tokio::time::Instant::now() + allowed,
            timer: None,
            linger: self.linger,
        })
    }

    /// Whether the body was cut off, or not read to its end, when the
    /// response is made: the connection cannot carry another request (a
    /// client that reused one whose 413 left the body unread saw its next
    /// request fail).
    pub(super) fn left_unread(&self) -> bool {
        self.cut.load(Ordering::Acquire) || !self.ended.load(Ordering::Acquire)
    }
}

impl Drop for Charge {
    fn drop(&mut self) {
        let bytes = self.bytes.load(Ordering::Acquire);
        self.budget.held.fetch_sub(bytes, Ordering::AcqRel);
        self.budget.held_gauge.dec_by(bytes as i64);
    }
}

/// A request body as [`Charge::guard`] hands it on.
struct Guarded {
    body: Body,
    budget: Arc<BodyBudget>,
    charged: Arc<AtomicU64>,
    cut: Arc<AtomicBool>,
    ended: Arc<AtomicBool>,
    allowed: Duration,
    deadline: tokio::time::Instant,
    /// Made the first time the body is not ready: most bodies arrive with
    /// their head and never wait.
    timer: Option<Pin<Box<tokio::time::Sleep>>>,
    /// Whether the rest is read and dropped if a handler leaves it
    /// ([`Charge::linger`]); cleared once the body ends or is late.
    linger: bool,
}

impl Drop for Guarded {
    fn drop(&mut self) {
        // A handler that answered without the whole body (past the
        // route's limit, or not needing it).
        if self.linger && !hyper::body::Body::is_end_stream(&self.body) {
            linger(std::mem::take(&mut self.body));
        }
    }
}

impl hyper::body::Body for Guarded {
    type Data = bytes::Bytes;
    type Error = axum::Error;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Self::Data>, Self::Error>>> {
        let this = &mut *self;
        let frame = match Pin::new(&mut this.body).poll_frame(cx) {
            Poll::Ready(f) => f,
            Poll::Pending => {
                let deadline = this.deadline;
                let timer = this
                    .timer
                    .get_or_insert_with(|| Box::pin(tokio::time::sleep_until(deadline)));
                return match timer.as_mut().poll(cx) {
                    Poll::Ready(()) => {
                        this.linger = false;
                        this.cut.store(true, Ordering::Release);
                        Poll::Ready(Some(Err(axum::Error::new(BodyCut::TimedOut(this.allowed)))))
                    }
                    Poll::Pending => Poll::Pending,
                };
            }
        };
        if let Some(Ok(f)) = &frame
            && let Some(data) = f.data_ref()
            && !data.is_empty()
        {
            let n = data.len() as u64;
            let own = this.charged.load(Ordering::Acquire);
            if let Err(cut) = this.budget.take(n, own) {
                this.cut.store(true, Ordering::Release);
                return Poll::Ready(Some(Err(axum::Error::new(cut))));
            }
            this.charged.fetch_add(n, Ordering::AcqRel);
        }
        if frame.is_none() || hyper::body::Body::is_end_stream(&this.body) {
            this.linger = false;
            this.ended.store(true, Ordering::Release);
        }
        Poll::Ready(frame)
    }

    fn is_end_stream(&self) -> bool {
        self.body.is_end_stream()
    }

    fn size_hint(&self) -> SizeHint {
        self.body.size_hint()
    }
}

/// The answer for a body cut off by [`Charge::guard`], if `e` (a failed
/// read of a request body, in any wrapping) is one.
pub(super) fn cut_answer(e: &(dyn std::error::Error + 'static)) -> Option<ApiError> {
    let mut source = Some(e);
    while let Some(s) = source {
        if let Some(cut) = s.downcast_ref::<BodyCut>() {
            return Some(match cut {
                BodyCut::OverBudget { .. } => ApiError::overloaded(cut.to_string()),
                BodyCut::TimedOut(_) => {
                    ApiError::new(StatusCode::REQUEST_TIMEOUT, "body_timeout", cut.to_string())
                }
            });
        }
        source = s.source();
    }
    None
}

#[cfg(test)]
mod tests {
    use super::*;

    fn post(len: Option<&str>, chunked: bool) -> Request {
        to("POST", "/v1/actors/t/a", len, chunked)
    }

    fn to(method: &str, uri: &str, len: Option<&str>, chunked: bool) -> Request {
        let mut b = Request::builder().method(method).uri(uri);
        if let Some(l) = len {
            b = b.header(header::CONTENT_LENGTH, l);
        }
        if chunked {
            b = b.header(header::TRANSFER_ENCODING, "chunked");
        }
        b.body(Body::empty()).unwrap()
    }

    fn budget(limit: u64, slack_ms: u64) -> (Arc<BodyBudget>, Gauge, Counter) {
        let (gauge, refused) = (Gauge::default(), Counter::default());
        let slack = Duration::from_millis(slack_ms);
        let b = BodyBudget::new(limit, 50, 80, slack, gauge.clone(), refused.clone());
        (b, gauge, refused)
    }

    /// Read `bytes` through `charge`'s guard, in chunks of at most 10
    /// bytes: what the handler would get.
    async fn read(charge: &Charge, bytes: usize) -> Result<usize, ApiError> {
        let chunks: Vec<Result<bytes::Bytes, std::io::Error>> = vec![b'x'; bytes]
            .chunks(10)
            .map(|c| Ok(bytes::Bytes::copy_from_slice(c)))
            .collect();
        let body = charge.guard(Body::from_stream(futures::stream::iter(chunks)));
        match axum::body::to_bytes(body, usize::MAX).await {
            Ok(b) => Ok(b.len()),
            Err(e) => Err(cut_answer(&e).expect("a cut body")),
        }
    }

    #[tokio::test]
    async fn bodies_are_charged_as_they_arrive_until_their_response() {
        let (budget, gauge, refused) = budget(80, 30_000);
        let a = budget.admit(&post(Some("40"), false)).unwrap().unwrap();
        // Admitted, nothing held until bytes arrive.
        assert_eq!(gauge.get(), 0);
        assert!(a.left_unread());
        assert_eq!(read(&a, 40).await.unwrap(), 40);
        assert!(!a.left_unread(), "read to its end");
        assert_eq!(gauge.get(), 40);
        // A declared length past what is left: refused at once.
        let err = budget.admit(&post(Some("45"), false)).err().unwrap();
        assert_eq!(err.status, StatusCode::SERVICE_UNAVAILABLE);
        assert_eq!(err.retry_after, Some(1));
        assert_eq!(refused.get(), 1);
        // Unknown length: admitted, and cut when a chunk does not fit.
        let b = budget.admit(&post(None, true)).unwrap().unwrap();
        let err = read(&b, 45).await.err().unwrap();
        assert_eq!(
            (err.status, err.code),
            (StatusCode::SERVICE_UNAVAILABLE, "overloaded")
        );
        assert!(b.left_unread());
        assert_eq!(gauge.get(), 80, "what arrived before the cut is held");
        // No body, never refused.
        assert!(budget.admit(&post(None, false)).unwrap().is_none());
        assert!(budget.admit(&post(Some("0"), false)).unwrap().is_none());
        // Given back with the response.
        drop(a);
        assert_eq!(gauge.get(), 40);
        drop(b);
        assert_eq!(gauge.get(), 0);
        // Deploys take larger bodies; the cluster's own requests are not
        // charged.
        let d = budget.admit(&to("PUT", "/v1/types/t", Some("80"), false));
        assert_eq!(
            read(d.as_ref().unwrap().as_ref().unwrap(), 80)
                .await
                .unwrap(),
            80
        );
        let r = budget.admit(&to("POST", "/v1/cluster/replicate", Some("999"), false));
        assert!(r.unwrap().is_none());
        drop(d);
        assert_eq!(budget.held.load(Ordering::Relaxed), 0);
        assert_eq!(gauge.get(), 0);
    }

    #[tokio::test]
    async fn a_body_larger_than_the_whole_budget_goes_through_alone() {
        let (budget, _, _) = budget(30, 30_000);
        let a = budget.admit(&post(Some("50"), false)).unwrap().unwrap();
        assert_eq!(read(&a, 50).await.unwrap(), 50);
        assert!(budget.admit(&post(Some("1"), false)).is_err());
        drop(a);
        assert!(budget.admit(&post(Some("1"), false)).unwrap().is_some());
    }

    /// A body that stops arriving is cut at its deadline (it used to hold
    /// its declared length of the budget for as long as the client liked).
    #[tokio::test]
    async fn a_body_that_stops_arriving_is_cut_at_its_deadline() {
        use futures::StreamExt as _;
        let (budget, gauge, _) = budget(100, 100);
        let c = budget.admit(&post(Some("50"), false)).unwrap().unwrap();
        let first = futures::stream::iter([Ok::<_, std::io::Error>(bytes::Bytes::from_static(
            b"0123456789",
        ))]);
        let body = c.guard(Body::from_stream(first.chain(futures::stream::pending())));
        let started = std::time::Instant::now();
        let e = axum::body::to_bytes(body, usize::MAX).await.err().unwrap();
        let answer = cut_answer(&e).unwrap();
        assert_eq!(
            (answer.status, answer.code),
            (StatusCode::REQUEST_TIMEOUT, "body_timeout")
        );
        // The slack plus a second per 64 KiB of the route's largest body.
        let took = started.elapsed();
        assert!(took >= Duration::from_millis(1_100), "{took:?}");
        assert!(took < Duration::from_secs(5), "{took:?}");
        assert!(c.left_unread());
        assert_eq!(gauge.get(), 10, "what arrived is held until the response");
        drop(c);
        assert_eq!(gauge.get(), 0);
    }

    /// A webhook's body, which anyone may send under a made-up signature,
    /// gets at most 5 s in all (here against 30 s configured).
    #[tokio::test]
    async fn a_webhook_body_gets_little_slack() {
        use futures::StreamExt as _;
        let (budget, _, _) = budget(100, 30_000);
        let c = budget
            .admit(&to("POST", "/v1/hooks/t/a/n", Some("50"), false))
            .unwrap()
            .unwrap();
        let stuck = futures::stream::iter([Ok::<_, std::io::Error>(bytes::Bytes::from_static(
            b"0123456789",
        ))])
        .chain(futures::stream::pending());
        let started = std::time::Instant::now();
        let e = axum::body::to_bytes(c.guard(Body::from_stream(stuck)), usize::MAX)
            .await
            .err()
            .unwrap();
        assert_eq!(cut_answer(&e).unwrap().code, "body_timeout");
        // 5 s in all, whatever it declares (a second per 64 KiB declared
        // came on top: 21 s for 1 MiB).
        let took = started.elapsed();
        assert!(took >= Duration::from_millis(4_900), "{took:?}");
        assert!(took < Duration::from_millis(5_900), "{took:?}");
    }

    /// A body that declares more than its route takes is refused before
    /// any of it is read: it waited for the whole body (or its deadline)
    /// first (found by a probe).
    #[test]
    fn a_body_declared_too_large_is_refused_at_once() {
        let (budget, gauge, refused) = budget(1000, 30_000);
        let e = budget.admit(&post(Some("51"), false)).err().unwrap();
        assert_eq!(
            (e.status, e.code),
            (StatusCode::PAYLOAD_TOO_LARGE, "payload_too_large")
        );
        assert!(e.message.contains("declares 51 bytes"), "{}", e.message);
        assert!(
            e.message.contains("at most 50 (limits.max_message_bytes)"),
            "{}",
            e.message
        );
        let e = budget
            .admit(&to("PUT", "/v1/types/t", Some("81"), false))
            .err()
            .unwrap();
        assert!(e.message.contains("limits.max_code_bytes"), "{}", e.message);
        // At the limit: admitted. Nothing was charged or counted as shed.
        assert!(budget.admit(&post(Some("50"), false)).unwrap().is_some());
        assert!(
            budget
                .admit(&to("PUT", "/v1/types/t", Some("80"), false))
                .unwrap()
                .is_some()
        );
        assert_eq!((gauge.get(), refused.get()), (0, 0));
    }
}
