//! The HTTP API (v1) of PRODUCT.md §3.
//!
//! Handlers are thin: they validate input, call [`Node`], and map results
//! and errors to HTTP through [`ApiError`]. Cross-cutting concerns are
//! layers: request ids and bearer auth in [`edge`], body limits and JSON
//! 404/405 here; what a connection may hold in [`listen`].

mod actors;
mod alarms;
mod backup;
mod bodies;
mod clients;
pub(crate) mod cluster;
mod edge;
mod error;
mod extract;
mod files;
mod hooks;
pub mod listen;
mod openapi;
mod placement;
mod providers;
mod routing;
mod runs;
mod secrets;
mod streams;
mod subscriptions;
mod system;
mod target;
mod tokens;
mod types;

use std::sync::Arc;

use axum::Router;
use axum::extract::{DefaultBodyLimit, FromRequestParts};
use axum::http::StatusCode;
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

/// The answer to a PUT of a named resource: 201 when it created it, else
/// 200, with `body`.
fn put_reply(created: bool, body: impl serde::Serialize) -> axum::response::Response {
    use axum::response::IntoResponse;
    let status = if created {
        StatusCode::CREATED
    } else {
        StatusCode::OK
    };
    (status, axum::Json(body)).into_response()
}

/// Shared handler state.
#[derive(Clone)]
pub struct AppState {
    node: Arc<Node>,
    /// Reaches the other nodes of a cluster.
    peers: reqwest::Client,
    /// Signs the targets of requests forwarded to them.
    targets: Arc<target::TargetKey>,
    /// Blob downloads streaming at once (each holds a file descriptor
    /// besides its connection's): see `files::download`.
    downloads: Arc<tokio::sync::Semaphore>,
    /// Cluster-wide writes go to each peer one at a time, in the order
    /// they were applied here: see `cluster::fan_out`.
    fanout: Arc<cluster::FanoutQueues>,
}

/// The router, with `admin_token` required on everything but health checks
/// when it is set.
pub fn router(node: Arc<Node>) -> Router {
    let token = node.config().admin_token.clone().map(Arc::from);
    let tokens = node.tokens().clone();
    let clients_config = node.config().clients.clone();
    let limits = node.config().limits.clone();
    let clustered = node.cluster().is_some();
    // Manifests carry base64 code: allow for its 4/3 expansion.
    let code_limit = limits.max_code_bytes / 3 * 4 + 64 * 1024;
    let metrics = node.metrics();
    let metrics_handle = metrics.clone();
    let bodies = bodies::BodyBudget::new(
        limits.request_body_budget_bytes.unwrap_or(u64::MAX),
        limits.max_message_bytes as u64,
        code_limit as u64,
        std::time::Duration::from_millis(limits.body_timeout_ms),
        metrics.request_body_bytes.clone(),
        metrics.requests_shed.clone(),
    );
    let max_connections = limits.max_connections.unwrap_or(usize::MAX);
    let state = AppState {
        targets: Arc::new(target::TargetKey::new(node.config().admin_token.as_deref())),
        downloads: Arc::new(tokio::sync::Semaphore::new(files::streams_for(
            max_connections,
        ))),
        node,
        peers: crate::cluster::peer_client(),
        fanout: Arc::default(),
    };
    // Routes are flat (no `nest`) and the edge concerns are one hand-written
    // layer: under load, axum's nesting and two `from_fn` middlewares cost
    // about a sixth of the node's CPU per request (measured with perf).
    let router = Router::new()
        .route("/healthz", get(system::healthz))
        .route("/readyz", get(system::readyz))
        .route("/metrics", get(system::metrics))
        .route("/v1/openapi.json", get(openapi::serve))
        .route("/v1/types", get(types::list))
        .route(
            "/v1/types/{type}",
            put(types::deploy)
                .layer(DefaultBodyLimit::max(code_limit))
                .get(types::get)
                .delete(types::delete),
        )
        .route("/v1/actors/{type}", get(actors::list))
        .route(
            "/v1/actors/{type}/{id}",
            post(actors::send).get(actors::info).delete(actors::delete),
        )
        .route("/v1/actors/{type}/{id}/state", get(actors::state))
        .route(
            "/v1/actors/{type}/{id}/state/{*key}",
            get(actors::state_key),
        )
        .route("/v1/actors/{type}/{id}/events", get(actors::events))
        .route("/v1/actors/{type}/{id}/alarms", get(alarms::list))
        .route("/v1/actors/{type}/{id}/inputs", get(actors::inputs))
        .route(
            "/v1/actors/{type}/{id}/inputs/{input}",
            post(actors::answer_input),
        )
        .route("/v1/actors/{type}/{id}/eval", post(actors::eval))
        .route(
            "/v1/actors/{type}/{id}/runs/{run_id}/cancel",
            post(runs::cancel_run),
        )
        .route("/v1/actors/{type}/{id}/files", get(files::list))
        .route("/v1/actors/{type}/{id}/files/{*path}", get(files::download))
        .route("/v1/actors/{type}/{id}/move", post(placement::move_actor))
        .route("/v1/hooks/{type}/{id}/{name}", post(hooks::receive))
        .route("/v1/providers", get(providers::list))
        .route(
            "/v1/providers/{name}",
            put(providers::put)
                .get(providers::get_one)
                .delete(providers::delete),
        )
        .route("/v1/secrets", get(secrets::list))
        .route(
            "/v1/secrets/{name}",
            put(secrets::put).delete(secrets::delete),
        )
        .route("/v1/subscriptions", get(subscriptions::list))
        .route(
            "/v1/subscriptions/{name}",
            put(subscriptions::put)
                .get(subscriptions::get)
                .delete(subscriptions::delete),
        )
        .route("/v1/deliveries", get(subscriptions::deliveries))
        .route("/v1/deliveries/{id}/retry", post(subscriptions::retry))
        .route("/v1/backup", post(backup::backup))
        .route("/v1/tokens", post(tokens::mint))
        .route("/v1/tokens/{id}", axum::routing::delete(tokens::revoke))
        .route("/v1/cluster", get(cluster::status))
        .route("/v1/cluster/catalog", get(cluster::catalog))
        .route("/v1/cluster/rebalance", post(placement::rebalance))
        .route(
            "/v1/cluster/move-in",
            post(placement::move_in).layer(DefaultBodyLimit::max(cluster::MAX_REPLICA_BYTES)),
        )
        .route("/v1/cluster/drop-copy", post(placement::drop_copy))
        .route(
            "/v1/cluster/replicate",
            post(cluster::replicate).layer(DefaultBodyLimit::max(cluster::MAX_REPLICA_BYTES)),
        )
        .route(
            "/v1/cluster/blobs",
            post(cluster::put_blobs).layer(DefaultBodyLimit::max(cluster::MAX_REPLICA_BYTES)),
        )
        .route(
            "/v1/cluster/blobs/missing",
            post(cluster::blobs_missing).layer(DefaultBodyLimit::max(cluster::MAX_REPLICA_BYTES)),
        )
        .fallback(not_found)
        .method_not_allowed_fallback(method_not_allowed)
        .layer(DefaultBodyLimit::max(limits.max_message_bytes));
    // In a cluster, requests go to the owner of their actor (after auth, so
    // a node forwards only what it would have served).
    let router = if clustered {
        router.layer(axum::middleware::from_fn_with_state(
            state.clone(),
            routing::route,
        ))
    } else {
        router
    };
    router
        .layer(edge::EdgeLayer::new(
            token,
            tokens,
            clients::ClientGate::new(&clients_config),
            bodies,
            metrics_handle,
        ))
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

/// Serve the API on `listener` until `shutdown` resolves, within the
/// node's connection limits (see [`listen`]).
pub async fn serve(
    node: Arc<Node>,
    listener: tokio::net::TcpListener,
    shutdown: impl std::future::Future<Output = ()> + Send + 'static,
) -> std::io::Result<()> {
    // Open event streams would hold the graceful shutdown open forever:
    // end them as soon as it begins.
    let bus = node.event_bus().clone();
    let shutdown = async move {
        shutdown.await;
        bus.close();
    };
    let max_connections = node.config().limits.max_connections.unwrap_or(usize::MAX);
    let metrics = listen::ListenMetrics {
        open: node.metrics().http_connections.clone(),
        evicted: node.metrics().http_connections_evicted.clone(),
    };
    let limits = listen::ListenLimits::new(max_connections);
    let targets = Arc::new(target::TargetKey::new(node.config().admin_token.as_deref()));
    let app = router(node);
    listen::serve_app(app, listener, limits, metrics, shutdown, move |req| {
        target::restore(&targets, req)
    })
    .await
}
