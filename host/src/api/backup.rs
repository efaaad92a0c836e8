//! `POST /v1/backup`: a consistent backup of the node's data, written
//! while it serves, into a new directory on the node's machine.

use axum::body::Bytes;
use axum::extract::State;
use axum::extract::rejection::BytesRejection;
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use serde::Deserialize;

use super::extract::json_object;
use super::{ApiError, AppState};
use crate::storage::StorageError;

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct BackupSpec {
    /// An absolute path that does not exist yet.
    to: std::path::PathBuf,
}

pub(super) async fn backup(
    State(s): State<AppState>,
    body: Result<Bytes, BytesRejection>,
) -> Result<Response, ApiError> {
    let body = body?;
    let spec: BackupSpec = json_object(&body).map_err(|e| {
        ApiError::bad_request(
            "invalid_backup",
            format!("{e}; expected {{\"to\": \"/absolute/new/directory\"}}"),
        )
    })?;
    if !spec.to.is_absolute() {
        return Err(ApiError::bad_request(
            "invalid_backup",
            "`to` must be an absolute path on the node's machine",
        ));
    }
    if spec.to.exists() {
        return Err(ApiError::new(
            StatusCode::CONFLICT,
            "backup_exists",
            format!(
                "`{}` already exists; choose a new directory",
                spec.to.display()
            ),
        ));
    }
    match s.node.backup(spec.to).await {
        Ok(report) => Ok(axum::Json(report).into_response()),
        Err(StorageError::Io { what, source }) => {
            let text = format!("{what}: {source}");
            Err(match source.kind() {
                // Another backup into the same place (or one cut off).
                std::io::ErrorKind::AlreadyExists => {
                    ApiError::new(StatusCode::CONFLICT, "backup_exists", text)
                }
                // Not a place a directory can be made (`x/..`, a file in
                // the way).
                std::io::ErrorKind::InvalidInput => ApiError::bad_request("invalid_backup", text),
                // The destination's disk filled (what was written is gone).
                std::io::ErrorKind::StorageFull => {
                    ApiError::new(StatusCode::INSUFFICIENT_STORAGE, "backup_failed", text)
                }
                _ => ApiError::new(StatusCode::INTERNAL_SERVER_ERROR, "backup_failed", text),
            })
        }
        Err(e) => Err(e.into()),
    }
}
