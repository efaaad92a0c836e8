//! The node's bound on the request bodies it holds at once.
//!
//! A request's body stays in memory from the moment it is read until the
//! response: in the actor's mailbox while earlier messages run, then in the
//! turn. Each is bounded (`limits.max_message_bytes`, 1 MiB), but their
//! number only by connections, so a thousand clients posting large bodies
//! to a few slow actors once held more than a small host has, and the
//! kernel killed the node. The edge now charges every request its declared
//! body size (`Content-Length`, at most the route's limit; that limit for a
//! body of unknown length) against `limits.request_body_budget_bytes`,
//! holds the charge until the response is made, and answers 503
//! `overloaded` with `Retry-After` at once when it does not fit. Requests
//! without a body are never refused, nor are the cluster's own
//! (`/v1/cluster/…`: replication between nodes, sized by its protocol).

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

use axum::extract::Request;
use axum::http::{Method, StatusCode, header};
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::gauge::Gauge;

use super::ApiError;

/// Bytes of request bodies held, against the budget.
pub(super) struct BodyBudget {
    limit: u64,
    /// The largest message body (most routes' limit).
    message: u64,
    /// The largest deploy body (`PUT /v1/types/{type}`).
    code: u64,
    held: AtomicU64,
    held_gauge: Gauge,
    refused: Counter,
}

/// A request's charge, given back when dropped.
pub(super) struct Charge {
    budget: Arc<BodyBudget>,
    bytes: u64,
}

impl BodyBudget {
    /// A budget of `limit` bytes, for routes taking bodies up to `message`
    /// bytes, and deploys up to `code`.
    pub(super) fn new(
        limit: u64,
        message: u64,
        code: u64,
        held_gauge: Gauge,
        refused: Counter,
    ) -> Arc<Self> {
        Arc::new(Self {
            limit,
            message,
            code,
            held: AtomicU64::new(0),
            held_gauge,
            refused,
        })
    }

    /// Charge `req` for its body, or refuse it.
    pub(super) fn charge(self: &Arc<Self>, req: &Request) -> Result<Option<Charge>, ApiError> {
        let path = req.uri().path();
        if path.starts_with("/v1/cluster/") {
            return Ok(None);
        }
        let route_limit = if req.method() == Method::PUT && path.starts_with("/v1/types/") {
            self.code
        } else {
            self.message
        };
        let bytes = match req.headers().get(header::CONTENT_LENGTH) {
            Some(v) => v
                .to_str()
                .ok()
                .and_then(|s| s.trim().parse::<u64>().ok())
                .unwrap_or(route_limit),
            None if req.headers().contains_key(header::TRANSFER_ENCODING) => route_limit,
            None => 0,
        }
        .min(route_limit)
        // One body larger than the whole budget still goes through alone.
        .min(self.limit);
        if bytes == 0 {
            return Ok(None);
        }
        let fits = self
            .held
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |held| {
                held.checked_add(bytes).filter(|&n| n <= self.limit)
            });
        match fits {
            Ok(_) => {
                self.held_gauge.inc_by(bytes as i64);
                Ok(Some(Charge {
                    budget: self.clone(),
                    bytes,
                }))
            }
            Err(held) => {
                self.refused.inc();
                let mut e = ApiError::new(
                    StatusCode::SERVICE_UNAVAILABLE,
                    "overloaded",
                    format!(
                        "the node holds {held} bytes of request bodies already and this one \
                         declares {bytes}: past its budget of {} bytes \
                         (limits.request_body_budget_bytes); retry later",
                        self.limit
                    ),
                );
                e.retry_after = Some(1);
                Err(e)
            }
        }
    }
}

impl Drop for Charge {
    fn drop(&mut self) {
        self.budget.held.fetch_sub(self.bytes, Ordering::AcqRel);
        self.budget.held_gauge.dec_by(self.bytes as i64);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use axum::body::Body;

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

    #[test]
    fn bodies_are_charged_until_their_response_and_refused_past_the_budget() {
        let gauge = Gauge::default();
        let refused = Counter::default();
        let budget = BodyBudget::new(100, 50, 80, gauge.clone(), refused.clone());
        let a = budget.charge(&post(Some("40"), false)).unwrap().unwrap();
        // Unknown length: charged as the route's largest body.
        let b = budget.charge(&post(None, true)).unwrap().unwrap();
        assert_eq!(gauge.get(), 90);
        let err = budget.charge(&post(Some("20"), false)).err().unwrap();
        assert_eq!(err.status, StatusCode::SERVICE_UNAVAILABLE);
        assert_eq!(err.retry_after, Some(1));
        assert_eq!(refused.get(), 1);
        // No body, never refused.
        assert!(budget.charge(&post(None, false)).unwrap().is_none());
        assert!(budget.charge(&post(Some("0"), false)).unwrap().is_none());
        drop(a);
        // A declared length past the route's limit is charged the limit
        // (the route then answers 413).
        let c = budget
            .charge(&post(Some("99999999"), false))
            .unwrap()
            .unwrap();
        assert_eq!(gauge.get(), 100);
        drop((b, c));
        assert_eq!(gauge.get(), 0);
        // Deploys take larger bodies; the cluster's own requests are not
        // charged.
        let d = budget.charge(&to("PUT", "/v1/types/t", None, true));
        assert_eq!(gauge.get(), 80, "{:?}", d.as_ref().err());
        let r = budget.charge(&to("POST", "/v1/cluster/replicate", Some("999"), false));
        assert!(r.unwrap().is_none());
        drop(d);
        assert_eq!(budget.held.load(Ordering::Relaxed), 0);
    }

    #[test]
    fn a_body_larger_than_the_whole_budget_goes_through_alone() {
        let budget = BodyBudget::new(30, 50, 80, Gauge::default(), Counter::default());
        let a = budget.charge(&post(Some("50"), false)).unwrap().unwrap();
        assert!(budget.charge(&post(Some("1"), false)).is_err());
        drop(a);
        assert!(budget.charge(&post(Some("1"), false)).unwrap().is_some());
    }
}
