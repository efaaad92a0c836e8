//! `POST /v1/hooks/{type}/{id}/{name}`: inbound webhooks (see
//! [`crate::webhooks::inbound`]). Open without the admin token: the
//! signature is the authentication.

use axum::body::Bytes;
use axum::extract::State;
use axum::extract::rejection::BytesRejection;
use axum::http::{HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};

use super::{ApiError, AppState, Path};
use crate::node::WebhookError;
use crate::webhooks::VerifyError;
use crate::webhooks::inbound::HookError;

impl From<WebhookError> for ApiError {
    fn from(e: WebhookError) -> Self {
        match e {
            WebhookError::UnknownType(_) => Self::not_found("unknown_type", e.to_string()),
            WebhookError::Refused(e) => e.into(),
            WebhookError::RateLimited(e) => e.into(),
            WebhookError::Turn(e) => e.into(),
        }
    }
}

impl From<HookError> for ApiError {
    fn from(e: HookError) -> Self {
        let msg = e.to_string();
        match e {
            HookError::NotConfigured(_) => {
                Self::new(StatusCode::FORBIDDEN, "webhooks_not_configured", msg)
            }
            HookError::BadName(_) => Self::bad_request("invalid_hook_name", msg),
            HookError::Verify(VerifyError::BadTimestamp | VerifyError::OutOfTolerance(..)) => {
                Self::new(StatusCode::UNAUTHORIZED, "invalid_timestamp", msg)
            }
            HookError::Verify(_) => Self::new(StatusCode::UNAUTHORIZED, "invalid_signature", msg),
            HookError::NoRoute(_) => Self::bad_request("no_route", msg),
            HookError::RouteField(_) => {
                Self::new(StatusCode::UNPROCESSABLE_ENTITY, "route_field_missing", msg)
            }
            HookError::BadId(e) => e.into(),
        }
    }
}

pub(super) async fn receive(
    State(s): State<AppState>,
    Path((ty, id, name)): Path<(String, String, String)>,
    headers: HeaderMap,
    body: Result<Bytes, BytesRejection>,
) -> Result<Response, ApiError> {
    let body = body?;
    let a = s
        .node
        .accept_webhook(&ty, &id, &name, &headers, body)
        .await?;
    Ok((
        StatusCode::ACCEPTED,
        axum::Json(serde_json::json!({
            "actor": a.actor_id,
            "delivery_id": a.delivery_id,
            "message_id": a.message_id,
            "duplicate": a.duplicate,
        })),
    )
        .into_response())
}
