//! Extractors for what many handlers check first.
//!
//! Every route under `/v1/actors/{type}…` starts the same way: the type
//! name and actor id are valid (400 otherwise) and the type is deployed
//! (404 `unknown_type`). [`KnownType`] and [`ActorPath`] do that once, so a
//! handler's signature says what it may assume.

use std::collections::HashMap;
use std::sync::Arc;

use axum::extract::FromRequestParts;
use axum::http::request::Parts;

use super::{ApiError, AppState, Path};
use crate::catalog::TypeEntry;
use crate::ids::{ActorKey, validate_type_name};

/// `{type}` of a route: a valid name of a deployed type.
pub(crate) struct KnownType(pub Arc<TypeEntry>);

/// `{type}` and `{id}` of a route: a valid actor key of a deployed type.
pub(crate) struct ActorPath(pub ActorKey);

/// The route's named parameters, percent-decoded.
async fn params(parts: &mut Parts, s: &AppState) -> Result<HashMap<String, String>, ApiError> {
    let Path(params) = Path::<HashMap<String, String>>::from_request_parts(parts, s).await?;
    Ok(params)
}

fn param<'p>(params: &'p HashMap<String, String>, name: &str) -> &'p str {
    params
        .get(name)
        .map(String::as_str)
        .unwrap_or_else(|| panic!("route without a `{{{name}}}` parameter"))
}

fn known(s: &AppState, ty: &str) -> Result<Arc<TypeEntry>, ApiError> {
    s.node
        .catalog()
        .get(ty)
        .ok_or_else(|| ApiError::not_found("unknown_type", format!("unknown actor type `{ty}`")))
}

impl FromRequestParts<AppState> for KnownType {
    type Rejection = ApiError;

    async fn from_request_parts(parts: &mut Parts, s: &AppState) -> Result<Self, ApiError> {
        let params = params(parts, s).await?;
        let ty = param(&params, "type");
        validate_type_name(ty)?;
        Ok(Self(known(s, ty)?))
    }
}

impl FromRequestParts<AppState> for ActorPath {
    type Rejection = ApiError;

    async fn from_request_parts(parts: &mut Parts, s: &AppState) -> Result<Self, ApiError> {
        let params = params(parts, s).await?;
        let key = ActorKey::new(param(&params, "type"), param(&params, "id"))?;
        known(s, key.ty())?;
        Ok(Self(key))
    }
}

/// The page sizes of a listing's `?limit=`.
#[derive(Clone, Copy)]
pub(super) struct Page {
    /// Without a `limit`.
    pub default: usize,
    /// The most one page holds: a larger ask gets this many.
    pub max: usize,
}

impl Page {
    /// Actors, state, events, deliveries.
    pub const LIST: Page = Page {
        default: 100,
        max: 1000,
    };
    /// An actor's input requests: all it keeps (at most 100 pending and
    /// `inputs.max_settled_per_actor`, 1,000, settled) by default, as the
    /// listing had no pages before.
    pub const INPUTS: Page = Page {
        default: 1100,
        max: 10_000,
    };
    /// An actor's alarms: all it may have (`alarms.max_per_actor`, 1,000)
    /// by default, as the listing had no pages before.
    pub const ALARMS: Page = Page {
        default: 1000,
        max: 10_000,
    };
    /// An actor's files.
    pub const FILES: Page = Page {
        default: 1000,
        max: 10_000,
    };

    /// The page size for `?limit=asked`; a limit of 0 is refused.
    pub fn size(self, asked: Option<usize>) -> Result<usize, ApiError> {
        match asked {
            None => Ok(self.default),
            Some(0) => Err(ApiError::bad_request(
                "invalid_limit",
                "limit must be at least 1",
            )),
            Some(n) => Ok(n.min(self.max)),
        }
    }
}

/// A JSON request body read into `T`, which must be a JSON object: serde
/// also reads a struct from an array of its fields in order (so
/// `["v", ["api.example.com"]]` made a secret), which no client means.
/// A whole number written as a float (`"ttl_s": 3600.0`, an integer to JSON
/// and to JSON Schema) is read as that integer; such bodies take a second
/// read, so bodies without one cost nothing more. A value that does not fit
/// names its field (`agent.tools[2].url`), so that a long manifest's error
/// says where to look.
pub(super) fn json_object<T: serde::de::DeserializeOwned>(body: &[u8]) -> Result<T, BodyError> {
    let first = body.iter().copied().find(|b| !b.is_ascii_whitespace());
    if first != Some(b'{') {
        // Not JSON at all keeps serde's syntax error.
        serde_json::from_slice::<serde::de::IgnoredAny>(body)?;
        return Err(BodyError::NotObject(match first {
            Some(b'[') => "an array",
            Some(b'"') => "a string",
            Some(b'n') => "null",
            Some(b't' | b'f') => "a boolean",
            _ => "a number",
        }));
    }
    match read_object(body) {
        Err(BodyError::Json { field, error }) if error.is_data() => {
            let mut value: serde_json::Value = serde_json::from_slice(body)?;
            if !crate::json::integral_floats(&mut value) {
                return Err(BodyError::Json { field, error });
            }
            // If it still does not fit, the first error (with its line and
            // column in what was sent) says why.
            serde_json::from_value(value).map_err(|_| BodyError::Json { field, error })
        }
        read => read,
    }
}

/// One read of `body` into `T` that keeps the path to what did not fit.
fn read_object<T: serde::de::DeserializeOwned>(body: &[u8]) -> Result<T, BodyError> {
    let mut de = serde_json::Deserializer::from_slice(body);
    let value = serde_path_to_error::deserialize(&mut de).map_err(|e| {
        // The path of a missing or unknown field is the object holding it
        // (`.` at the top), which serde's own message already names; a
        // field's own check may have named where (`config.env`) already.
        let path = e.path().to_string();
        let error = e.into_inner();
        let located = error.to_string().starts_with(&format!("`{path}"));
        let field = Some(path).filter(|p| p != "." && !located);
        BodyError::Json { field, error }
    })?;
    de.end()?;
    Ok(value)
}

/// Why [`json_object`] refused a body.
#[derive(Debug, thiserror::Error)]
pub(super) enum BodyError {
    /// JSON, of another kind (named; never quoted: it may be a secret).
    #[error("the body must be a JSON object, not {0}")]
    NotObject(&'static str),
    /// Not JSON, or not the object expected: `field` is where in the body
    /// (`hosts`, `agent.tools[0].url`) when a value did not fit.
    #[error("{}{error}", field.as_deref().map(|f| format!("`{f}`: ")).unwrap_or_default())]
    Json {
        field: Option<String>,
        error: serde_json::Error,
    },
}

impl From<serde_json::Error> for BodyError {
    fn from(error: serde_json::Error) -> Self {
        BodyError::Json { field: None, error }
    }
}

impl BodyError {
    /// Where the value that did not fit is, for messages that may not quote
    /// serde's text (it can quote the value).
    pub(super) fn located(field: Option<&str>, error: &serde_json::Error) -> String {
        match field {
            Some(f) => format!("`{f}` (line {}, column {})", error.line(), error.column()),
            None => format!("line {}, column {}", error.line(), error.column()),
        }
    }
}
