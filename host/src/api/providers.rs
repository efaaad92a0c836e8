//! `/v1/providers`: the model providers (PRODUCT.md §5). A provider names
//! the secret holding its key; the key itself never appears here.

use axum::body::Bytes;
use axum::extract::State;
use axum::extract::rejection::BytesRejection;
use axum::response::{IntoResponse, Response};

use super::extract::{BodyError, json_object};
use super::{ApiError, AppState, Path};
use crate::models::{ProviderConfigError, ProviderSpec};

impl From<ProviderConfigError> for ApiError {
    fn from(e: ProviderConfigError) -> Self {
        let msg = e.to_string();
        match e {
            ProviderConfigError::Name(e) => e.into(),
            ProviderConfigError::Invalid(_) => Self::bad_request("invalid_provider", msg),
            ProviderConfigError::NotFound(_) => Self::not_found("provider_not_found", msg),
            ProviderConfigError::Storage(e) => e.into(),
        }
    }
}

/// `PUT /v1/providers/{name}`: set (201) or replace (200).
pub(super) async fn put(
    State(s): State<AppState>,
    Path(name): Path<String>,
    body: Result<Bytes, BytesRejection>,
) -> Result<Response, ApiError> {
    crate::ids::validate_provider_name(&name)?;
    let body = body?;
    let spec: ProviderSpec = json_object(&body).map_err(|e| {
        // Unknown and missing fields are named; a wrongly typed value is
        // only located (it may be a key pasted into the wrong field).
        let (field, e) = match e {
            BodyError::NotObject(_) => {
                return ApiError::bad_request("invalid_provider", e.to_string());
            }
            BodyError::Json { field, error } => (field, error),
        };
        let text = e.to_string();
        let what = if e.is_syntax() || e.is_eof() {
            "the body is not JSON".to_owned()
        } else if text.starts_with("unknown field") || text.starts_with("missing field") {
            text
        } else {
            format!(
                "a field has the wrong type: {}",
                BodyError::located(field.as_deref(), &e)
            )
        };
        ApiError::bad_request(
            "invalid_provider",
            format!(
                "{what}; expected {{\"format\": \"openai-chat\" | \"openai-responses\" | \
                 \"anthropic-messages\", \"base_url\": \"https://…\", \"key_secret\": \"NAME\"}}"
            ),
        )
    })?;
    let (info, created) = s.node.models().providers().put(&name, spec).await?;
    Ok(super::put_reply(created, info))
}

/// `GET /v1/providers`.
pub(super) async fn list(State(s): State<AppState>) -> Result<Response, ApiError> {
    let providers = s.node.models().providers().list()?;
    Ok(axum::Json(serde_json::json!({ "providers": providers })).into_response())
}

/// `GET /v1/providers/{name}`.
pub(super) async fn get_one(
    State(s): State<AppState>,
    Path(name): Path<String>,
) -> Result<Response, ApiError> {
    crate::ids::validate_provider_name(&name)?;
    let one = s
        .node
        .models()
        .providers()
        .list()?
        .into_iter()
        .find(|p| p.name == name)
        .ok_or(ProviderConfigError::NotFound(name))?;
    Ok(axum::Json(one).into_response())
}

/// `DELETE /v1/providers/{name}`.
pub(super) async fn delete(
    State(s): State<AppState>,
    Path(name): Path<String>,
) -> Result<Response, ApiError> {
    if !s.node.models().providers().delete(&name).await? {
        return Err(ProviderConfigError::NotFound(name).into());
    }
    Ok(axum::Json(serde_json::json!({ "name": name, "deleted": true })).into_response())
}
