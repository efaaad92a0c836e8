//! Health, readiness and metrics.

use axum::extract::State;
use axum::http::{StatusCode, header};
use axum::response::{IntoResponse, Response};

use super::{ApiError, AppState};

pub(super) async fn healthz() -> Response {
    axum::Json(serde_json::json!({ "status": "ok" })).into_response()
}

/// Ready once crash recovery is done, and while commits succeed: a node
/// whose disk fails (full, failed fsync) answers 503 `disk_fault` here, keeps
/// serving reads and becomes ready again by itself when a commit succeeds.
pub(super) async fn readyz(State(s): State<AppState>) -> Response {
    if !s.node.is_ready() {
        return ApiError::new(
            StatusCode::SERVICE_UNAVAILABLE,
            "not_ready",
            "crash recovery is still running",
        )
        .into_response();
    }
    if let Some(c) = s.node.cluster()
        && !c.caught_up()
    {
        return ApiError::new(
            StatusCode::SERVICE_UNAVAILABLE,
            "catching_up",
            "taking the types deployed while this node was away from a peer",
        )
        .into_response();
    }
    if let Some(c) = s.node.cluster()
        && !c.alive()
    {
        let mut err = ApiError::new(
            StatusCode::SERVICE_UNAVAILABLE,
            "not_in_cluster",
            "this node's cluster membership lease is not confirmed alive (etcd unreachable?); it serves none of its slots",
        );
        err.retry_after = Some(1);
        return err.into_response();
    }
    if let Some(why) = s.node.storage().disk_fault() {
        let mut err = ApiError::new(
            StatusCode::SERVICE_UNAVAILABLE,
            "disk_fault",
            format!("writes are refused until the disk works again: {why}"),
        );
        err.retry_after = Some(1);
        return err.into_response();
    }
    match s.node.cluster().map(|c| c.owned_used().1) {
        // Ready, but flagged: used slots of this node have no backup.
        Some(degraded) if degraded > 0 => axum::Json(serde_json::json!({
            "status": "ready",
            "degraded_slots": degraded,
            "message": "some slots this node owns have no backup: their commits are durable on this node's disk alone (or refused, with cluster.without_backup = \"refuse\")",
        }))
        .into_response(),
        _ => axum::Json(serde_json::json!({ "status": "ready" })).into_response(),
    }
}

/// `GET /metrics`. `prometheus-client` writes OpenMetrics 1.0 (counters'
/// samples end in `_total`, the body in `# EOF`), so that is what the
/// response says: labelled `text/plain; version=0.0.4`, a strict parser of
/// that older format found 26 mismatched TYPE lines. Prometheus reads both.
pub(super) async fn metrics(State(s): State<AppState>) -> Response {
    (
        [(
            header::CONTENT_TYPE,
            "application/openmetrics-text; version=1.0.0; charset=utf-8",
        )],
        s.node.render_metrics(),
    )
        .into_response()
}
