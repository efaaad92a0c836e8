//! Health, readiness and metrics.

use axum::extract::State;
use axum::http::{StatusCode, header};
use axum::response::{IntoResponse, Response};

use super::{ApiError, AppState};

pub(super) async fn healthz() -> Response {
    axum::Json(serde_json::json!({ "status": "ok" })).into_response()
}

pub(super) async fn readyz(State(s): State<AppState>) -> Response {
    if s.node.is_ready() {
        axum::Json(serde_json::json!({ "status": "ready" })).into_response()
    } else {
        ApiError::new(
            StatusCode::SERVICE_UNAVAILABLE,
            "not_ready",
            "crash recovery is still running",
        )
        .into_response()
    }
}

pub(super) async fn metrics(State(s): State<AppState>) -> Response {
    (
        [(
            header::CONTENT_TYPE,
            "text/plain; version=0.0.4; charset=utf-8",
        )],
        s.node.metrics().render(),
    )
        .into_response()
}
