//! The one error type every handler returns: `{"error": {"code", "message"}}`.

use axum::extract::rejection::{BytesRejection, PathRejection, QueryRejection};
use axum::http::{HeaderValue, StatusCode, header};
use axum::response::{IntoResponse, Response};

use crate::actor::TurnError;
use crate::node::{DeleteTypeError, DeployError};
use crate::storage::StorageError;

/// An API error.
#[derive(Debug, Clone)]
pub struct ApiError {
    /// HTTP status.
    pub status: StatusCode,
    /// Stable snake_case code.
    pub code: &'static str,
    /// Human sentence.
    pub message: String,
    /// Seconds to wait before retrying, when known.
    pub retry_after: Option<u32>,
    /// Nothing of the request was applied because its actor left this node
    /// while it ran: in a cluster the router routes it again (see
    /// [`Reroute`]).
    pub reroute: bool,
}

/// A response extension: the request changed nothing and its actor now
/// lives elsewhere (a move, a slot that changed hands), so the cluster
/// router may send it again to wherever the actor is now.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Reroute;

impl ApiError {
    /// An error with `status`, `code` and `message`.
    pub fn new(status: StatusCode, code: &'static str, message: impl Into<String>) -> Self {
        Self {
            status,
            code,
            message: message.into(),
            retry_after: None,
            reroute: false,
        }
    }

    /// 400.
    pub fn bad_request(code: &'static str, message: impl Into<String>) -> Self {
        Self::new(StatusCode::BAD_REQUEST, code, message)
    }

    /// 404.
    pub fn not_found(code: &'static str, message: impl Into<String>) -> Self {
        Self::new(StatusCode::NOT_FOUND, code, message)
    }

    /// 404 `actor_not_found`.
    pub fn actor_not_found(key: &crate::ids::ActorKey) -> Self {
        Self::not_found("actor_not_found", format!("actor {key} does not exist"))
    }

    /// 503 `overloaded`, with `Retry-After: 1`: no room now, nothing
    /// changed.
    pub fn overloaded(message: impl Into<String>) -> Self {
        let mut e = Self::new(StatusCode::SERVICE_UNAVAILABLE, "overloaded", message);
        e.retry_after = Some(1);
        e
    }
}

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        let body = serde_json::json!({
            "error": { "code": self.code, "message": self.message }
        });
        let mut resp = (self.status, axum::Json(body)).into_response();
        if let Some(s) = self.retry_after {
            resp.headers_mut()
                .insert(header::RETRY_AFTER, HeaderValue::from(s));
        }
        if self.reroute {
            resp.extensions_mut().insert(Reroute);
        }
        resp
    }
}

impl From<TurnError> for ApiError {
    fn from(e: TurnError) -> Self {
        let status = StatusCode::from_u16(e.status()).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR);
        let mut err = Self::new(status, e.code(), e.to_string());
        if matches!(
            e,
            TurnError::MailboxFull(_)
                | TurnError::InboxFull(_)
                | TurnError::Overloaded(_)
                | TurnError::NoGuestMemory(_)
                | TurnError::Storage(_)
                | TurnError::StorageMidTurn(_)
                | TurnError::Moved(_)
        ) {
            err.retry_after = Some(1);
        }
        err.reroute = matches!(e, TurnError::Moved(_));
        err
    }
}

impl From<crate::catalog::RateLimited> for ApiError {
    fn from(e: crate::catalog::RateLimited) -> Self {
        let wait = e.retry_after;
        let secs = wait.as_secs() + u64::from(wait.subsec_nanos() > 0);
        let mut err = Self::new(StatusCode::TOO_MANY_REQUESTS, "rate_limited", e.to_string());
        err.retry_after = Some(u32::try_from(secs.max(1)).unwrap_or(u32::MAX));
        err
    }
}

impl From<crate::node::AdmitError> for ApiError {
    fn from(e: crate::node::AdmitError) -> Self {
        match e {
            crate::node::AdmitError::RateLimited(r) => r.into(),
            crate::node::AdmitError::Storage(s) => s.into(),
        }
    }
}

impl From<StorageError> for ApiError {
    fn from(e: StorageError) -> Self {
        if let StorageError::CommitFailed(c @ crate::storage::CommitFailed::Moved(_)) = e {
            return TurnError::from(c).into();
        }
        let code = if let StorageError::ShuttingDown = e {
            "shutting_down"
        } else {
            tracing::error!(error = %e, "storage error while serving a request");
            "storage_error"
        };
        let mut err = Self::new(StatusCode::SERVICE_UNAVAILABLE, code, e.to_string());
        err.retry_after = Some(1);
        err
    }
}

impl From<DeployError> for ApiError {
    fn from(e: DeployError) -> Self {
        match e {
            DeployError::Name(e) => Self::bad_request("invalid_type_name", e.to_string()),
            DeployError::Config(m) => Self::bad_request("invalid_config", m),
            DeployError::Code(c @ crate::sandbox::CodeError::Busy(_)) => {
                Self::overloaded(c.to_string())
            }
            DeployError::Code(c) => Self::bad_request("invalid_code", c.to_string()),
            DeployError::TooLarge { .. } => Self::new(
                StatusCode::PAYLOAD_TOO_LARGE,
                "payload_too_large",
                e.to_string(),
            ),
            DeployError::Storage(s) => s.into(),
            DeployError::VersionConflict(m) => {
                Self::new(StatusCode::CONFLICT, "version_conflict", m)
            }
        }
    }
}

impl From<DeleteTypeError> for ApiError {
    fn from(e: DeleteTypeError) -> Self {
        match e {
            DeleteTypeError::Unknown(_) => Self::not_found("unknown_type", e.to_string()),
            DeleteTypeError::HasActors { .. } => {
                Self::new(StatusCode::CONFLICT, "type_has_actors", e.to_string())
            }
            DeleteTypeError::Storage(s) => s.into(),
        }
    }
}

impl From<crate::ids::IdError> for ApiError {
    fn from(e: crate::ids::IdError) -> Self {
        let code = match e {
            crate::ids::IdError::Type { .. } => "invalid_type_name",
            crate::ids::IdError::Id { .. } => "invalid_actor_id",
            crate::ids::IdError::IdempotencyKey { .. } => "invalid_idempotency_key",
            crate::ids::IdError::Path { .. } => "invalid_path",
            crate::ids::IdError::Name { what, .. } => match what {
                crate::ids::NameKind::Hook => "invalid_hook_name",
                crate::ids::NameKind::Subscription => "invalid_subscription_name",
                crate::ids::NameKind::Secret => "invalid_secret_name",
                crate::ids::NameKind::Provider => "invalid_provider_name",
            },
        };
        Self::bad_request(code, e.to_string())
    }
}

impl From<PathRejection> for ApiError {
    fn from(e: PathRejection) -> Self {
        use axum::extract::path::ErrorKind;
        // Percent-decoding gave bytes that are not UTF-8: the name or id
        // is invalid, told by the code its own check would give.
        if let PathRejection::FailedToDeserializePathParams(d) = &e
            && let ErrorKind::InvalidUtf8InPathParam { key } = d.kind()
        {
            let (code, what) = match key.as_str() {
                "type" => ("invalid_type_name", "the actor type"),
                "id" => ("invalid_actor_id", "the actor id"),
                _ => ("invalid_path", "a path segment"),
            };
            return Self::bad_request(code, format!("{what} is not UTF-8 once percent-decoded"));
        }
        Self::bad_request("invalid_path", e.body_text())
    }
}

impl From<QueryRejection> for ApiError {
    fn from(e: QueryRejection) -> Self {
        Self::bad_request("invalid_query", query_message(&e.body_text()))
    }
}

/// A refused query string's message in the API's words: axum's says
/// "Failed to deserialize query string: limit: invalid digit found in
/// string" of `?limit=-1`.
fn query_message(text: &str) -> String {
    let text = text
        .strip_prefix("Failed to deserialize query string: ")
        .unwrap_or(text);
    let Some((name, why)) = text.split_once(": ") else {
        return format!("invalid query string: {text}");
    };
    if why.starts_with("unknown field") {
        let expected = why.split_once(", ").map_or("", |(_, e)| e);
        return format!("unknown query parameter `{name}`; {expected}");
    }
    let why = match why {
        "invalid digit found in string" | "cannot parse integer from empty string" => {
            "must be a whole number (digits only)"
        }
        "number too large to fit in target type" => "is too large",
        other => other,
    };
    format!("query parameter `{name}` {why}")
}

impl From<BytesRejection> for ApiError {
    fn from(e: BytesRejection) -> Self {
        if let Some(cut) = super::bodies::cut_answer(&e) {
            cut
        } else if e.status() == StatusCode::PAYLOAD_TOO_LARGE {
            Self::new(
                StatusCode::PAYLOAD_TOO_LARGE,
                "payload_too_large",
                "request body exceeds the size limit",
            )
        } else {
            Self::bad_request("invalid_body", e.body_text())
        }
    }
}
