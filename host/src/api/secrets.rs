//! `/v1/secrets`: the secret store (PRODUCT.md §5). Values are write-only:
//! nothing here ever answers with one.

use axum::body::Bytes;
use axum::extract::State;
use axum::extract::rejection::BytesRejection;
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use serde::Deserialize;
use zeroize::Zeroizing;

use super::extract::{BodyError, json_object};
use super::{ApiError, AppState, Path};
use crate::secrets::SecretError;

impl From<SecretError> for ApiError {
    fn from(e: SecretError) -> Self {
        let msg = e.to_string();
        match e {
            SecretError::Name(e) => e.into(),
            SecretError::Invalid(_) => Self::bad_request("invalid_secret", msg),
            SecretError::TooLarge { .. } => {
                Self::new(StatusCode::PAYLOAD_TOO_LARGE, "secret_too_large", msg)
            }
            SecretError::NotFound(_) => Self::not_found("secret_not_found", msg),
            SecretError::Sealed { .. } => {
                tracing::error!(error = %msg, "a stored secret does not open");
                Self::new(StatusCode::INTERNAL_SERVER_ERROR, "secret_unreadable", msg)
            }
            SecretError::Storage(e) => e.into(),
        }
    }
}

/// The body of `PUT /v1/secrets/{name}`.
#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct SecretSpec {
    value: Zeroizing<String>,
    #[serde(default)]
    hosts: Vec<String>,
}

/// `PUT /v1/secrets/{name}`: set (201) or replace (200).
pub(super) async fn put(
    State(s): State<AppState>,
    Path(name): Path<String>,
    body: Result<Bytes, BytesRejection>,
) -> Result<Response, ApiError> {
    crate::ids::validate_secret_name(&name)?;
    let body = body?;
    let spec: SecretSpec = json_object(&body).map_err(|e| {
        let (field, e) = match e {
            BodyError::NotObject(_) => {
                return ApiError::bad_request("invalid_secret", e.to_string());
            }
            BodyError::Json { field, error } => (field, error),
        };
        // serde's message quotes what it choked on, which may be the value.
        let what = if e.is_syntax() || e.is_eof() {
            "the body is not JSON".to_owned()
        } else {
            format!(
                "expected {{\"value\": \"…\", \"hosts\": [\"api.example.com\"]}}; see {}",
                BodyError::located(field.as_deref(), &e)
            )
        };
        ApiError::bad_request("invalid_secret", what)
    })?;
    let (info, created) = s
        .node
        .secrets()
        .put(&name, spec.value.as_bytes(), spec.hosts)
        .await?;
    Ok(super::put_reply(created, info))
}

/// `GET /v1/secrets`: names, hosts and times.
pub(super) async fn list(State(s): State<AppState>) -> Result<Response, ApiError> {
    let secrets = s.node.secrets().list()?;
    Ok(axum::Json(serde_json::json!({ "secrets": secrets })).into_response())
}

/// `DELETE /v1/secrets/{name}`.
pub(super) async fn delete(
    State(s): State<AppState>,
    Path(name): Path<String>,
) -> Result<Response, ApiError> {
    if !s.node.secrets().delete(&name).await? {
        return Err(SecretError::NotFound(name).into());
    }
    Ok(axum::Json(serde_json::json!({ "name": name, "deleted": true })).into_response())
}
