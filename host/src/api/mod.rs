//! The HTTP API (v1) of PRODUCT.md §3.
//!
//! Handlers are thin: they validate input, call [`Node`], and map results
//! and errors to HTTP through [`ApiError`]. Cross-cutting concerns (request
//! ids, bearer auth, body limits, JSON 404/405) are layers here.

mod actors;
mod error;
mod system;
mod types;

use std::sync::Arc;

use axum::Router;
use axum::extract::{DefaultBodyLimit, FromRequestParts, Request, State};
use axum::http::{HeaderValue, StatusCode, header};
use axum::middleware::{self, Next};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post, put};

pub use error::ApiError;

use crate::node::Node;

/// Path parameters with JSON errors.
#[derive(FromRequestParts)]
#[from_request(via(axum::extract::Path), rejection(ApiError))]
pub(crate) struct Path<T>(pub T);

/// Query parameters with JSON errors.
#[derive(FromRequestParts)]
#[from_request(via(axum::extract::Query), rejection(ApiError))]
pub(crate) struct Query<T>(pub T);

/// Shared handler state.
#[derive(Clone)]
pub struct AppState {
    node: Arc<Node>,
    token: Option<Arc<str>>,
}

/// The router, with `admin_token` required on everything but health checks
/// when it is set.
pub fn router(node: Arc<Node>) -> Router {
    let token = node.config().admin_token.clone().map(Arc::from);
    let limits = node.config().limits.clone();
    let state = AppState { node, token };
    // Manifests carry base64 code: allow for its 4/3 expansion.
    let code_limit = limits.max_code_bytes / 3 * 4 + 64 * 1024;
    let v1 = Router::new()
        .route("/types", get(types::list))
        .route(
            "/types/{type}",
            put(types::deploy)
                .layer(DefaultBodyLimit::max(code_limit))
                .get(types::get)
                .delete(types::delete),
        )
        .route("/actors/{type}", get(actors::list))
        .route(
            "/actors/{type}/{id}",
            post(actors::send).get(actors::info).delete(actors::delete),
        )
        .route("/actors/{type}/{id}/state", get(actors::state))
        .route("/actors/{type}/{id}/state/{*key}", get(actors::state_key))
        .route("/actors/{type}/{id}/events", get(actors::events))
        .route("/actors/{type}/{id}/alarms", get(not_yet))
        .route("/actors/{type}/{id}/inputs", get(not_yet))
        .route("/actors/{type}/{id}/inputs/{input}", post(not_yet))
        .route("/actors/{type}/{id}/eval", post(not_yet))
        .route("/actors/{type}/{id}/files/{*path}", get(not_yet))
        .route("/actors/{type}/{id}/move", post(not_yet))
        .route("/hooks/{type}/{id}/{name}", post(not_yet))
        .route("/secrets", get(not_yet))
        .route("/secrets/{name}", put(not_yet).delete(not_yet))
        .route("/subscriptions", get(not_yet))
        .route(
            "/subscriptions/{name}",
            put(not_yet).get(not_yet).delete(not_yet),
        )
        .route("/deliveries", get(not_yet))
        .route("/deliveries/{id}/retry", post(not_yet))
        .layer(DefaultBodyLimit::max(limits.max_message_bytes));
    Router::new()
        .route("/healthz", get(system::healthz))
        .route("/readyz", get(system::readyz))
        .route("/metrics", get(system::metrics))
        .nest("/v1", v1)
        .fallback(not_found)
        .method_not_allowed_fallback(method_not_allowed)
        .layer(middleware::from_fn_with_state(state.clone(), auth))
        .layer(middleware::from_fn(request_id))
        .with_state(state)
}

async fn not_found() -> ApiError {
    ApiError::not_found("not_found", "no such endpoint")
}

async fn method_not_allowed() -> ApiError {
    ApiError::new(
        StatusCode::METHOD_NOT_ALLOWED,
        "method_not_allowed",
        "method not allowed on this endpoint",
    )
}

async fn not_yet() -> ApiError {
    ApiError::new(
        StatusCode::NOT_IMPLEMENTED,
        "not_supported",
        "this endpoint is part of the Marmot API but not supported by this node yet",
    )
}

/// Carry the caller's `x-request-id` (if sane) or make one; echo it back.
async fn request_id(mut req: Request, next: Next) -> Response {
    let id = req
        .headers()
        .get("x-request-id")
        .filter(|v| {
            v.len() <= 128
                && v.to_str()
                    .is_ok_and(|s| s.bytes().all(|b| b.is_ascii_graphic()))
        })
        .cloned()
        .unwrap_or_else(|| {
            HeaderValue::from_str(&format!("{:016x}", rand::random::<u64>()))
                .expect("hex is a valid header value")
        });
    req.headers_mut().insert("x-request-id", id.clone());
    let mut resp = next.run(req).await;
    resp.headers_mut().insert("x-request-id", id);
    resp
}

/// Bearer auth for everything but health checks.
async fn auth(State(state): State<AppState>, req: Request, next: Next) -> Response {
    let Some(token) = &state.token else {
        return next.run(req).await;
    };
    let path = req.uri().path();
    if path == "/healthz" || path == "/readyz" {
        return next.run(req).await;
    }
    let presented = req
        .headers()
        .get(header::AUTHORIZATION)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.strip_prefix("Bearer "))
        .unwrap_or("");
    if constant_time_eq(presented.as_bytes(), token.as_bytes()) {
        return next.run(req).await;
    }
    ApiError::new(
        StatusCode::UNAUTHORIZED,
        "unauthorized",
        "missing or wrong bearer token",
    )
    .into_response()
}

fn constant_time_eq(a: &[u8], b: &[u8]) -> bool {
    if a.len() != b.len() {
        return false;
    }
    a.iter().zip(b).fold(0u8, |acc, (x, y)| acc | (x ^ y)) == 0
}

/// Serve the API on `listener` until `shutdown` resolves.
pub async fn serve(
    node: Arc<Node>,
    listener: tokio::net::TcpListener,
    shutdown: impl std::future::Future<Output = ()> + Send + 'static,
) -> std::io::Result<()> {
    axum::serve(listener, router(node))
        .with_graceful_shutdown(shutdown)
        .await
}
