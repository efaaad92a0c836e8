//! `/v1/tokens`: client tokens (PRODUCT.md §3), minted and revoked with the
//! admin token. What a token opens is decided in the edge layer.

use axum::body::Bytes;
use axum::extract::State;
use axum::extract::rejection::BytesRejection;
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};

use super::extract::json_object;
use super::{ApiError, AppState, Path};
use crate::tokens::{TokenError, TokenRequest};

impl From<TokenError> for ApiError {
    fn from(e: TokenError) -> Self {
        let msg = e.to_string();
        match e {
            TokenError::BadRequest(_) => Self::bad_request("invalid_token_request", msg),
            TokenError::Forbidden(_) => Self::new(StatusCode::FORBIDDEN, "forbidden", msg),
            TokenError::Invalid(_) | TokenError::Expired | TokenError::Revoked => {
                Self::new(StatusCode::INTERNAL_SERVER_ERROR, "token_error", msg)
            }
        }
    }
}

/// `POST /v1/tokens`: mint a client token → 201 `{token, expires_at_ms,
/// token_id}`.
pub(super) async fn mint(
    State(s): State<AppState>,
    body: Result<Bytes, BytesRejection>,
) -> Result<Response, ApiError> {
    let body = body?;
    let req: TokenRequest = json_object(&body).map_err(|e| {
        ApiError::bad_request(
            "invalid_token_request",
            format!(
                "{e}; expected {{\"type\": \"assistant\", \"id\": \"alice\" (or \"id_prefix\"), \
                 \"scopes\": [\"send\", \"events\", \"inputs\", \"files\"], \"ttl_s\": 3600}}"
            ),
        )
    })?;
    if s.node.catalog().get(&req.ty).is_none() {
        return Err(ApiError::not_found(
            "unknown_type",
            format!("unknown actor type `{}`", req.ty),
        ));
    }
    let (ty, id, prefix) = (req.ty.clone(), req.id.clone(), req.id_prefix.clone());
    let scopes = format!("{:?}", req.scopes).to_lowercase();
    let minted = s.node.tokens().mint(req)?;
    tracing::info!(token_id = %minted.token_id, ty, id, id_prefix = prefix, scopes, expires_at_ms = minted.expires_at_ms, "client token minted");
    Ok((StatusCode::CREATED, axum::Json(minted)).into_response())
}

/// `DELETE /v1/tokens/{id}`: revoke a token by its `token_id`.
pub(super) async fn revoke(
    State(s): State<AppState>,
    Path(id): Path<String>,
) -> Result<Response, ApiError> {
    let id = crate::tokens::canonical_token_id(&id)?;
    let new = s.node.tokens().revoke(&id).await?;
    tracing::info!(token_id = %id, "client token revoked");
    Ok(
        axum::Json(serde_json::json!({ "token_id": id, "revoked": true, "new": new }))
            .into_response(),
    )
}
