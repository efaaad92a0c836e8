//! What browser and app clients meet at the edge besides auth: CORS, and
//! rate limits on client-token requests (per token and per actor, GCRA
//! from `governor`) answered with 429 and `Retry-After`. Requests with the
//! admin token come from the operator's own backend and are not limited.

use std::num::NonZeroU32;
use std::time::Duration;

use axum::http::{HeaderMap, HeaderValue, Method, StatusCode, header};
use axum::response::{IntoResponse, Response};
use governor::clock::{Clock, DefaultClock};
use governor::{DefaultKeyedRateLimiter, Quota, RateLimiter};

use super::ApiError;
use crate::config::ClientsConfig;
use crate::tokens::Grant;

/// Headers a browser may send cross-origin: besides auth and bodies,
/// what resumes a stream and what conditional and ranged downloads of
/// artifacts use.
const ALLOW_HEADERS: &str = "authorization, content-type, idempotency-key, last-event-id, if-match, if-none-match, if-range, range, x-request-id";
/// Headers a browser may read cross-origin: what the API's own
/// responses say beyond the body (downloads' ETag and ranges, replays,
/// message ids, retry hints).
const EXPOSE_HEADERS: &str = "x-request-id, retry-after, etag, accept-ranges, content-range, \
                              content-length, idempotent-replayed, x-marmot-message-id";
/// Keyed limiter states kept before idle ones are dropped.
const PRUNE_AT: usize = 100_000;

/// CORS and client rate limits of a node.
pub(super) struct ClientGate {
    /// Allowed origins; `None` when any is (`*`).
    origins: Option<Vec<HeaderValue>>,
    cors: bool,
    per_token: Option<DefaultKeyedRateLimiter<String>>,
    per_actor: Option<DefaultKeyedRateLimiter<(String, String)>>,
}

fn limiter<K: std::hash::Hash + Eq + Clone>(
    rate: u32,
    burst: u32,
) -> Option<DefaultKeyedRateLimiter<K>> {
    let rate = NonZeroU32::new(rate)?;
    let burst = NonZeroU32::new(burst).unwrap_or(rate);
    Some(RateLimiter::keyed(
        Quota::per_second(rate).allow_burst(burst),
    ))
}

impl ClientGate {
    pub(super) fn new(config: &ClientsConfig) -> Self {
        let any = config.cors_origins.iter().any(|o| o == "*");
        let origins = (!any).then(|| {
            config
                .cors_origins
                .iter()
                .filter_map(|o| HeaderValue::from_str(o).ok())
                .collect()
        });
        Self {
            origins,
            cors: !config.cors_origins.is_empty(),
            per_token: limiter(config.token_rate_per_s, config.token_burst),
            per_actor: limiter(config.actor_rate_per_s, config.actor_burst),
        }
    }

    /// The value of `Access-Control-Allow-Origin` for a request from
    /// `origin`, if it is allowed.
    fn allowed_origin(&self, origin: Option<&HeaderValue>) -> Option<HeaderValue> {
        if !self.cors {
            return None;
        }
        let origin = origin?;
        match &self.origins {
            None => Some(origin.clone()),
            Some(list) => list.iter().find(|o| *o == origin).cloned(),
        }
    }

    /// The answer to a CORS preflight (`OPTIONS` with
    /// `Access-Control-Request-Method`), which carries no credentials and
    /// so comes before auth; `None` for any other request.
    pub(super) fn preflight(&self, method: &Method, headers: &HeaderMap) -> Option<Response> {
        if method != Method::OPTIONS || !headers.contains_key(header::ACCESS_CONTROL_REQUEST_METHOD)
        {
            return None;
        }
        let Some(origin) = self.allowed_origin(headers.get(header::ORIGIN)) else {
            return Some(
                ApiError::new(
                    StatusCode::FORBIDDEN,
                    "cors_origin_not_allowed",
                    "this origin may not call the API (clients.cors_origins)",
                )
                .into_response(),
            );
        };
        let mut resp = StatusCode::NO_CONTENT.into_response();
        let h = resp.headers_mut();
        h.insert(header::ACCESS_CONTROL_ALLOW_ORIGIN, origin);
        h.insert(
            header::ACCESS_CONTROL_ALLOW_METHODS,
            HeaderValue::from_static("GET, POST, PUT, DELETE"),
        );
        h.insert(
            header::ACCESS_CONTROL_ALLOW_HEADERS,
            HeaderValue::from_static(ALLOW_HEADERS),
        );
        h.insert(
            header::ACCESS_CONTROL_MAX_AGE,
            HeaderValue::from_static("600"),
        );
        h.insert(header::VARY, HeaderValue::from_static("origin"));
        Some(resp)
    }

    /// Add CORS headers to the response to a request from `origin` (its
    /// `Origin` header; only browsers send one).
    pub(super) fn decorate(&self, origin: Option<&HeaderValue>, resp: &mut Response) {
        if !self.cors {
            return;
        }
        let h = resp.headers_mut();
        if let Some(origin) = self.allowed_origin(origin) {
            h.insert(header::ACCESS_CONTROL_ALLOW_ORIGIN, origin);
            h.insert(
                header::ACCESS_CONTROL_EXPOSE_HEADERS,
                HeaderValue::from_static(EXPOSE_HEADERS),
            );
        }
        // With CORS on, every answer depends on the Origin (a shared cache
        // must not hand one origin's answer, or one without the headers,
        // to another); a preflight's answer says it already.
        let varies = h
            .get_all(header::VARY)
            .iter()
            .any(|v| v.as_bytes().eq_ignore_ascii_case(b"origin"));
        if !varies {
            h.append(header::VARY, HeaderValue::from_static("origin"));
        }
    }

    /// Count a client-token request against its token and its actor
    /// (`ty`, `id`): 429 with `Retry-After` past either limit.
    pub(super) fn admit(&self, grant: &Grant, ty: &str, id: &str) -> Result<(), ApiError> {
        let mut wait = Duration::ZERO;
        if let Some(l) = &self.per_token {
            if let Err(not_until) = l.check_key(&grant.jti) {
                wait = wait.max(not_until.wait_time_from(DefaultClock::default().now()));
            }
            if l.len() > PRUNE_AT {
                l.retain_recent();
            }
        }
        if wait.is_zero()
            && let Some(l) = &self.per_actor
        {
            let key = (ty.to_owned(), id.to_owned());
            if let Err(not_until) = l.check_key(&key) {
                wait = wait.max(not_until.wait_time_from(DefaultClock::default().now()));
            }
            if l.len() > PRUNE_AT {
                l.retain_recent();
            }
        }
        if wait.is_zero() {
            return Ok(());
        }
        let secs = wait.as_secs() + u64::from(wait.subsec_nanos() > 0);
        let mut e = ApiError::new(
            StatusCode::TOO_MANY_REQUESTS,
            "rate_limited",
            format!("too many requests with this client token or to this actor; retry in {secs} s"),
        );
        e.retry_after = Some(u32::try_from(secs.max(1)).unwrap_or(u32::MAX));
        Err(e)
    }
}
