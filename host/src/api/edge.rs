//! The outermost layer: request ids and bearer auth, in one hand-written
//! tower service so a request pays for one boxed future, not a middleware
//! stack.

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

/// Adds [`Edge`].
#[derive(Clone)]
pub(super) struct EdgeLayer {
    token: Option<Arc<str>>,
}

impl EdgeLayer {
    /// Require `token` (when set) on everything but health checks.
    pub(super) fn new(token: Option<Arc<str>>) -> Self {
        Self { token }
    }
}

impl<S> Layer<S> for EdgeLayer {
    type Service = Edge<S>;

    fn layer(&self, inner: S) -> Edge<S> {
        Edge {
            inner,
            token: self.token.clone(),
        }
    }
}

/// Carries the caller's `x-request-id` (if sane) or makes one, echoes it on
/// the response, and checks `Authorization: Bearer`.
#[derive(Clone)]
pub(super) struct Edge<S> {
    inner: S,
    token: Option<Arc<str>>,
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
        if !self.authorized(&req) {
            let mut resp = ApiError::new(
                StatusCode::UNAUTHORIZED,
                "unauthorized",
                "missing or wrong bearer token",
            )
            .into_response();
            resp.headers_mut().insert("x-request-id", id);
            return Box::pin(std::future::ready(Ok(resp)));
        }
        // Drive the instance that was polled ready; leave a fresh clone behind.
        let clone = self.inner.clone();
        let mut inner = std::mem::replace(&mut self.inner, clone);
        Box::pin(async move {
            let mut resp = inner.call(req).await?;
            resp.headers_mut().insert("x-request-id", id);
            Ok(resp)
        })
    }
}

impl<S> Edge<S> {
    fn authorized(&self, req: &Request) -> bool {
        let Some(token) = &self.token else {
            return true;
        };
        let path = req.uri().path();
        // Inbound webhooks come from third parties and are authenticated
        // by their signature instead.
        if path == "/healthz" || path == "/readyz" || path.starts_with("/v1/hooks/") {
            return true;
        }
        let presented = req
            .headers()
            .get(header::AUTHORIZATION)
            .and_then(|v| v.to_str().ok())
            .and_then(|v| v.strip_prefix("Bearer "))
            .unwrap_or("");
        constant_time_eq(presented.as_bytes(), token.as_bytes())
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
