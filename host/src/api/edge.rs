//! The outermost layer: request ids and bearer auth, in one hand-written
//! tower service so a request pays for one boxed future, not a middleware
//! stack.
//!
//! Auth: the admin token opens everything; a client token
//! ([`crate::tokens`]) opens exactly the verbs and actor it names (401 when
//! it is invalid, expired or revoked, 403 when it is valid for something
//! else). `EventSource` cannot send headers, so a client token may also
//! come as `?access_token=` on an events stream — never the admin token,
//! which must not end up in URLs and logs. Refusals are counted by code
//! (`requests_refused`) and logged with the token's id, never a credential.

use std::convert::Infallible;
use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};

use axum::extract::Request;
use axum::http::{HeaderValue, StatusCode, header};
use axum::response::{IntoResponse, Response};
use tower::{Layer, Service};

use super::ApiError;
use super::bodies::BodyBudget;
use super::clients::ClientGate;
use crate::metrics::{Metrics, RefusalLabels};
use crate::tokens::{Grant, TokenError, Tokens};

/// Adds [`Edge`].
#[derive(Clone)]
pub(super) struct EdgeLayer {
    token: Option<Arc<str>>,
    tokens: Arc<Tokens>,
    gate: Arc<ClientGate>,
    bodies: Arc<BodyBudget>,
    metrics: Arc<Metrics>,
}

impl EdgeLayer {
    /// Require `token` (when set), or a client token that allows the
    /// request (within `gate`'s rate limits), on everything but health
    /// checks and inbound webhooks; answer CORS as `gate` says; hold what
    /// an authorized request's body is charged against `bodies` until its
    /// response is made.
    pub(super) fn new(
        token: Option<Arc<str>>,
        tokens: Arc<Tokens>,
        gate: ClientGate,
        bodies: Arc<BodyBudget>,
        metrics: Arc<Metrics>,
    ) -> Self {
        Self {
            token,
            tokens,
            gate: Arc::new(gate),
            bodies,
            metrics,
        }
    }
}

impl<S> Layer<S> for EdgeLayer {
    type Service = Edge<S>;

    fn layer(&self, inner: S) -> Edge<S> {
        Edge {
            inner,
            token: self.token.clone(),
            tokens: self.tokens.clone(),
            gate: self.gate.clone(),
            bodies: self.bodies.clone(),
            metrics: self.metrics.clone(),
        }
    }
}

/// Carries the caller's `x-request-id` (if sane) or makes one, echoes it on
/// the response, and checks `Authorization: Bearer`.
#[derive(Clone)]
pub(super) struct Edge<S> {
    inner: S,
    token: Option<Arc<str>>,
    tokens: Arc<Tokens>,
    gate: Arc<ClientGate>,
    bodies: Arc<BodyBudget>,
    metrics: Arc<Metrics>,
}

impl<S> Service<Request> for Edge<S>
where
    S: Service<Request, Response = Response, Error = Infallible> + Clone + Send + 'static,
    S::Future: Send + 'static,
{
    type Response = Response;
    type Error = Infallible;
    type Future = Pin<Box<dyn Future<Output = Result<Response, Infallible>> + Send>>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Infallible>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, mut req: Request) -> Self::Future {
        let id = request_id(&req);
        req.headers_mut().insert("x-request-id", id.clone());
        // Kept for the CORS headers of the response.
        let origin = req.headers().get(header::ORIGIN).cloned();
        let gate = self.gate.clone();
        let mut charge = None;
        let mut client = None;
        let early = gate
            .preflight(req.method(), req.headers())
            .map(Ok)
            .or_else(|| match self.authorize(&req) {
                Ok(grant) => {
                    client = grant;
                    None
                }
                Err(e) => Some(Err(e)),
            })
            .or_else(|| match self.bodies.admit(&req) {
                Ok(c) => {
                    charge = c;
                    None
                }
                Err(e) => Some(Err(e)),
            });
        if let Some(early) = early {
            let mut resp = early.unwrap_or_else(IntoResponse::into_response);
            resp.headers_mut().insert("x-request-id", id);
            if resp.status() == StatusCode::UNAUTHORIZED {
                // RFC 9110: a 401 names the scheme it wants.
                resp.headers_mut().insert(
                    header::WWW_AUTHENTICATE,
                    HeaderValue::from_static("Bearer realm=\"marmot\""),
                );
            }
            if has_body(&req) {
                // The body is not taken: the connection cannot carry
                // another request, and a client that reused it would see
                // its next request fail.
                resp.headers_mut()
                    .insert(header::CONNECTION, HeaderValue::from_static("close"));
                linger(req);
            }
            gate.decorate(origin.as_ref(), &mut resp);
            return Box::pin(std::future::ready(Ok(resp)));
        }
        if let Some(grant) = client {
            // Only nodes mark what they pass on for a turn (and skip the
            // checks and limits its sender already passed).
            let h = req.headers_mut();
            h.remove(crate::cluster::FROM_ACTOR);
            h.remove(crate::cluster::CALL_CHAIN);
            h.remove(crate::cluster::CALL_KEY);
            // What the request was allowed by: a stream it opens ends when
            // the token expires or is revoked.
            req.extensions_mut().insert(grant);
        }
        if let Some(c) = &charge {
            req = req.map(|body| c.guard(body));
        }
        // Drive the instance that was polled ready; leave a fresh clone behind.
        let clone = self.inner.clone();
        let mut inner = std::mem::replace(&mut self.inner, clone);
        // `request_id` keeps only visible ASCII.
        let logged = std::sync::Arc::from(id.to_str().unwrap_or_default());
        Box::pin(async move {
            // The body is held until the response is made.
            let charge = charge;
            let mut resp = crate::telemetry::with_request_id(logged, inner.call(req)).await?;
            if charge.as_ref().is_some_and(|c| c.left_unread()) {
                // The rest of the body is read and dropped, if at all.
                resp.headers_mut()
                    .insert(header::CONNECTION, HeaderValue::from_static("close"));
            }
            resp.headers_mut().insert("x-request-id", id);
            gate.decorate(origin.as_ref(), &mut resp);
            Ok(resp)
        })
    }
}

impl<S> Edge<S> {
    /// Whether the request may go on; with the grant of the client token
    /// it comes with (not the admin's, not open). A refusal is counted
    /// (`requests_refused`) and logged, never with the credential.
    fn authorize(&self, req: &Request) -> Result<Option<Grant>, ApiError> {
        let Some(token) = &self.token else {
            return Ok(None);
        };
        let path = req.uri().path();
        if is_open(path) {
            return Ok(None);
        }
        let mut verified = None;
        let r = self.check(req, token, &mut verified);
        if let Err(e) = &r {
            self.metrics
                .requests_refused
                .get_or_create(&RefusalLabels { code: e.code })
                .inc();
            let token_id = verified.as_ref().map(|g: &Grant| g.jti.as_str());
            // Anyone can knock: a missing or bad credential is a debug
            // line (the counter shows a flood); a valid token used for
            // something it does not allow is an app bug or a probe.
            if e.status == StatusCode::FORBIDDEN {
                tracing::info!(method = %req.method(), path, token_id, code = e.code, why = %e.message, "request refused");
            } else {
                tracing::debug!(method = %req.method(), path, token_id, code = e.code, why = %e.message, "request refused");
            }
        }
        r
    }

    fn check(
        &self,
        req: &Request,
        token: &str,
        verified: &mut Option<Grant>,
    ) -> Result<Option<Grant>, ApiError> {
        let path = req.uri().path();
        let mut values = req.headers().get_all(header::AUTHORIZATION).iter();
        let value = values.next();
        if values.next().is_some() {
            return Err(ApiError::bad_request(
                "invalid_authorization",
                "send one Authorization header, not several",
            ));
        }
        let header = value.and_then(|v| v.to_str().ok()).and_then(bearer);
        let presented = match header {
            Some(p) => p,
            None if is_event_stream(path) => query_token(req).unwrap_or(""),
            None => "",
        };
        if header.is_some() && constant_time_eq(presented.as_bytes(), token.as_bytes()) {
            return Ok(None);
        }
        if Tokens::looks_like_token(presented) {
            let grant = verified.insert(self.tokens.verify(presented).map_err(refusal)?);
            let (ty, id) = grant.allows(req.method(), path).map_err(refusal)?;
            self.gate.admit(grant, &ty, &id)?;
            return Ok(Some(grant.clone()));
        }
        // A token in the query of another route is not read: said, as it
        // read "missing or wrong" of a valid token (a probe). (The admin
        // token in an event stream's query is only "wrong": it is never
        // taken there, and naming it would help a guesser.)
        if header.is_none() && query_token(req).is_some() && !is_event_stream(path) {
            return Err(ApiError::new(
                StatusCode::UNAUTHORIZED,
                "unauthorized",
                "`?access_token=` is taken only on an actor's event stream \
                 (`/v1/actors/{type}/{id}/events`); send `Authorization: Bearer …`",
            ));
        }
        Err(ApiError::new(
            StatusCode::UNAUTHORIZED,
            "unauthorized",
            "missing or wrong bearer token",
        ))
    }
}

/// Whether `path` is an actor's event log, `/v1/actors/{type}/{id}/events`
/// (ids put a `/` in the path percent-encoded): the one route that takes a
/// client token as `?access_token=`, for `EventSource`. A file of that name
/// (`…/files/outputs/events`) is not.
fn is_event_stream(path: &str) -> bool {
    path.strip_prefix("/v1/actors/")
        .map(|rest| rest.split('/').collect::<Vec<_>>())
        .is_some_and(|parts| matches!(parts.as_slice(), [_, _, "events"]))
}

/// The credentials of an `Authorization` value of the `Bearer` scheme,
/// whose name is case-insensitive (RFC 9110 §11.1).
fn bearer(value: &str) -> Option<&str> {
    let (scheme, credentials) = value.split_once(' ')?;
    scheme
        .eq_ignore_ascii_case("bearer")
        .then(|| credentials.trim_start_matches(' '))
}

/// Whether `path` is served without a token: health checks, the API
/// description (it holds nothing secret) and inbound webhooks (they come
/// from third parties and are authenticated by their signature instead).
/// The OpenAPI document marks the same operations open.
pub(super) fn is_open(path: &str) -> bool {
    path == "/healthz"
        || path == "/readyz"
        || path == "/v1/openapi.json"
        || path.starts_with("/v1/hooks/")
}

/// Read what is left of `req`'s refused body and drop it
/// ([`super::bodies::linger`]), so that its client gets the answer, where
/// it may be ([`super::bodies::may_linger`]); a body declared past the
/// bound is not waited for either: the connection closes at once.
fn linger(req: Request) {
    let declared = req
        .headers()
        .get(header::CONTENT_LENGTH)
        .and_then(|v| v.to_str().ok()?.trim().parse::<u64>().ok());
    if !super::bodies::may_linger(&req) || declared.is_some_and(|n| n > super::bodies::LINGER_BYTES)
    {
        return;
    }
    super::bodies::linger(req.into_body());
}

/// Whether `req` declares a body (a non-zero length, or chunks).
fn has_body(req: &Request) -> bool {
    let h = req.headers();
    h.contains_key(header::TRANSFER_ENCODING)
        || h.get(header::CONTENT_LENGTH)
            .is_some_and(|v| v.as_bytes() != b"0")
}

/// `?access_token=` of the request, if any.
fn query_token(req: &Request) -> Option<&str> {
    req.uri()
        .query()?
        .split('&')
        .find_map(|kv| kv.strip_prefix("access_token="))
}

/// The answer to a client token that does not open the request.
fn refusal(e: TokenError) -> ApiError {
    let msg = e.to_string();
    match e {
        TokenError::Forbidden(_) => ApiError::new(StatusCode::FORBIDDEN, "forbidden", msg),
        TokenError::Expired => ApiError::new(StatusCode::UNAUTHORIZED, "token_expired", msg),
        TokenError::Revoked => ApiError::new(StatusCode::UNAUTHORIZED, "token_revoked", msg),
        TokenError::Invalid(_) | TokenError::BadRequest(_) => {
            ApiError::new(StatusCode::UNAUTHORIZED, "invalid_token", msg)
        }
    }
}

fn request_id(req: &Request) -> HeaderValue {
    req.headers()
        .get("x-request-id")
        .filter(|v| {
            v.len() <= 128
                && v.to_str()
                    .is_ok_and(|s| !s.is_empty() && s.bytes().all(|b| b.is_ascii_graphic()))
        })
        .cloned()
        .unwrap_or_else(|| {
            HeaderValue::from_str(&format!("{:016x}", rand::random::<u64>()))
                .expect("hex is a valid header value")
        })
}

fn constant_time_eq(a: &[u8], b: &[u8]) -> bool {
    if a.len() != b.len() {
        return false;
    }
    a.iter().zip(b).fold(0u8, |acc, (x, y)| acc | (x ^ y)) == 0
}
