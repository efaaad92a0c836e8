//! `POST /v1/hooks/{type}/{id}/{name}`: inbound webhooks (see
//! [`crate::webhooks::inbound`]). Open without the admin token: the
//! signature is the authentication.

use axum::body::Bytes;
use axum::extract::rejection::BytesRejection;
use axum::extract::{FromRequest as _, Request, State};
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};

use super::{ApiError, AppState, Path};
use crate::node::WebhookError;
use crate::webhooks::VerifyError;
use crate::webhooks::inbound::HookError;

impl From<WebhookError> for ApiError {
    fn from(e: WebhookError) -> Self {
        match e {
            WebhookError::UnknownType(_) => no_endpoint(&e),
            WebhookError::Refused(e) => e.into(),
            WebhookError::RateLimited(e) => e.into(),
            WebhookError::Turn(e) => e.into(),
        }
    }
}

/// What a hook to a type that does not exist, or takes no webhooks, is
/// told: the same 404 for both, since anyone may post here and must not
/// learn which types a node has (2026-12-06; it said `unknown_type` for
/// one and 403 `webhooks_not_configured` for the other). The node's
/// debug log says which.
fn no_endpoint(e: &dyn std::fmt::Display) -> ApiError {
    tracing::debug!(why = %e, "webhook to no endpoint");
    ApiError::not_found(
        "no_webhook_endpoint",
        "no webhook endpoint here: the type does not exist or takes no webhooks \
         (its config has no `webhook_secret`)",
    )
}

impl From<HookError> for ApiError {
    fn from(e: HookError) -> Self {
        let msg = e.to_string();
        match e {
            HookError::NotConfigured(_) => no_endpoint(&e),
            HookError::BadName(_) => Self::bad_request("invalid_hook_name", msg),
            HookError::Verify(
                VerifyError::BadTimestamp
                | VerifyError::Milliseconds
                | VerifyError::OutOfTolerance(..),
            ) => Self::new(StatusCode::UNAUTHORIZED, "invalid_timestamp", msg),
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
    request: Request,
) -> Result<Response, ApiError> {
    // What the head shows is refused before a byte of the body is read.
    s.node
        .check_webhook_head(&ty, &id, &name, request.headers())?;
    let headers = request.headers().clone();
    let body: Result<Bytes, BytesRejection> = Bytes::from_request(request, &()).await;
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
