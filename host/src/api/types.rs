//! `/v1/types`: deploy, inspect and delete actor types.

use axum::body::Bytes;
use axum::extract::State;
use axum::extract::rejection::BytesRejection;
use axum::http::{HeaderMap, StatusCode, header};
use axum::response::{IntoResponse, Response};
use base64::Engine as _;
use serde::Deserialize;

use super::extract::{KnownType, json_object};
use super::{ApiError, AppState, Path, Query};
use crate::config::TypeConfig;
use crate::ids::validate_type_name;
use crate::storage::schema::CodeKind;

/// The JSON deploy manifest.
#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct Manifest {
    kind: String,
    #[serde(default)]
    code: Option<String>,
    #[serde(default)]
    code_base64: Option<String>,
    #[serde(default)]
    agent: Option<serde_json::Value>,
    #[serde(default, deserialize_with = "config_object")]
    config: TypeConfig,
}

/// `config`, which must be an object, as must every struct in it: serde
/// would otherwise also read a struct from an array of its fields in order
/// (`"config": [60000]`), which no one means.
fn config_object<'de, D: serde::Deserializer<'de>>(d: D) -> Result<TypeConfig, D::Error> {
    use serde::de::Error;
    let sent = serde_json::Value::deserialize(d)?;
    if !sent.is_object() {
        return Err(D::Error::custom("`config` must be an object"));
    }
    // Named from the top of the manifest; `json_object` sees that the
    // message locates itself and does not prefix it again.
    let config: TypeConfig = serde_path_to_error::deserialize(sent.clone()).map_err(|e| {
        let at = e.path().to_string();
        match at.as_str() {
            "." => D::Error::custom(e.into_inner()),
            _ => D::Error::custom(format_args!("`config.{at}`: {}", e.into_inner())),
        }
    })?;
    let read = serde_json::to_value(&config).map_err(D::Error::custom)?;
    if let Some(at) = crate::json::array_for_object(&sent, &read) {
        return Err(D::Error::custom(format_args!(
            "`config{}` must be an object",
            at.replace('/', ".")
        )));
    }
    Ok(config)
}

pub(super) async fn deploy(
    State(s): State<AppState>,
    Path(ty): Path<String>,
    headers: HeaderMap,
    body: Result<Bytes, BytesRejection>,
) -> Result<Response, ApiError> {
    // Refused here, before the node sees it: logged as the node logs what
    // it refuses (an operator saw nothing of a failed deploy: a probe).
    let refused = |e: &ApiError| {
        tracing::info!(ty, code = e.code, error = %e.message, "deploy refused");
    };
    validate_type_name(&ty)
        .map_err(ApiError::from)
        .inspect_err(refused)?;
    let body = body.map_err(ApiError::from).inspect_err(refused)?;
    let parsed = deployable(&s, &ty, &headers, &body).inspect_err(refused)?;
    let (kind, code, config) = parsed;
    // Fanned out by the node that took it: under that node's number. Only
    // in a cluster: on a node alone a client chose its version number
    // this way (u32::MAX, and the next deploy wrapped to 0: a probe).
    let numbered = (headers.contains_key(super::cluster::FANOUT_FROM)
        && s.node.cluster().is_some())
    .then(|| headers.get(super::cluster::TYPE_VERSION))
    .flatten()
    .and_then(|v| v.to_str().ok()?.parse::<u32>().ok())
    .filter(|v| *v > 0);
    let deployed = match numbered {
        Some(v) => s.node.deploy_numbered(&ty, kind, code, config, v).await?,
        None => s.node.deploy(&ty, kind, code, config).await?,
    };
    Ok(super::put_reply(deployed.created, deployed))
}

/// What a deploy's request asks to deploy: its kind, code and config.
fn deployable(
    s: &AppState,
    ty: &str,
    headers: &HeaderMap,
    body: &Bytes,
) -> Result<(CodeKind, Vec<u8>, TypeConfig), ApiError> {
    let content_type = headers
        .get(header::CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .map(|v| {
            v.split(';')
                .next()
                .unwrap_or("")
                .trim()
                .to_ascii_lowercase()
        })
        .unwrap_or_default();
    // A bare component or module keeps the type's config: redeploying the
    // code must not drop its webhook secret, allow-list or rate limit (it
    // did, silently). A JSON manifest states the config, `{}` clearing it.
    let current_config = || {
        s.node
            .catalog()
            .get(ty)
            .and_then(|e| e.version(e.latest_version()))
            .map(|v| v.config)
            .unwrap_or_default()
    };
    Ok(match content_type.as_str() {
        "application/wasm" | "application/octet-stream" => {
            (CodeKind::Wasm, body.to_vec(), current_config())
        }
        "application/json" => {
            let m: Manifest = json_object(body).map_err(|e| {
                ApiError::bad_request("invalid_manifest", format!("invalid deploy manifest: {e}"))
            })?;
            match m.kind.as_str() {
                "wasm" => {
                    if m.code.is_some() || m.agent.is_some() {
                        return Err(ApiError::bad_request(
                            "invalid_manifest",
                            "a `wasm` manifest carries its component in `code_base64`",
                        ));
                    }
                    let b64 = m.code_base64.ok_or_else(|| {
                        ApiError::bad_request(
                            "invalid_manifest",
                            "`code_base64` is required for kind `wasm`",
                        )
                    })?;
                    let code = base64::engine::general_purpose::STANDARD
                        .decode(b64.trim())
                        .map_err(|e| {
                            ApiError::bad_request(
                                "invalid_manifest",
                                format!("`code_base64` is not valid base64: {e}"),
                            )
                        })?;
                    (CodeKind::Wasm, code, m.config)
                }
                "js" => {
                    if m.code_base64.is_some() || m.agent.is_some() {
                        return Err(ApiError::bad_request(
                            "invalid_manifest",
                            "a `js` manifest carries its module source in `code`",
                        ));
                    }
                    let code = m.code.ok_or_else(|| {
                        ApiError::bad_request(
                            "invalid_manifest",
                            "`code` is required for kind `js`",
                        )
                    })?;
                    (CodeKind::Js, code.into_bytes(), m.config)
                }
                "agent" => {
                    if m.code.is_some() || m.code_base64.is_some() {
                        return Err(ApiError::bad_request(
                            "invalid_manifest",
                            "an `agent` manifest carries its settings in `agent`, and no code",
                        ));
                    }
                    let agent = m.agent.ok_or_else(|| {
                        ApiError::bad_request(
                            "invalid_manifest",
                            "`agent` is required for kind `agent`",
                        )
                    })?;
                    let manifest = crate::agents::check(&agent, &m.config)
                        .map_err(|e| ApiError::bad_request("invalid_manifest", e))?;
                    (CodeKind::Agent, manifest.into_bytes(), m.config)
                }
                other => {
                    return Err(ApiError::bad_request(
                        "invalid_manifest",
                        format!("unknown kind `{other}`; expected `wasm`, `js` or `agent`"),
                    ));
                }
            }
        }
        "text/javascript" | "application/javascript" => {
            (CodeKind::Js, body.to_vec(), current_config())
        }
        "" => {
            return Err(ApiError::new(
                StatusCode::UNSUPPORTED_MEDIA_TYPE,
                "unsupported_media_type",
                "set Content-Type to application/wasm, text/javascript or application/json",
            ));
        }
        other => {
            return Err(ApiError::new(
                StatusCode::UNSUPPORTED_MEDIA_TYPE,
                "unsupported_media_type",
                format!(
                    "content type `{other}` is not deployable; use application/wasm, \
                     text/javascript or application/json"
                ),
            ));
        }
    })
}

fn type_json(s: &AppState, entry: &crate::catalog::TypeEntry) -> serde_json::Value {
    let rec = entry.record();
    let versions: Vec<serde_json::Value> = rec
        .versions
        .iter()
        .map(|v| {
            serde_json::json!({
                "version": v.version,
                "kind": v.kind.as_str(),
                "sha256": v.sha256,
                "code_bytes": v.code_bytes,
                "deployed_at_ms": v.deployed_at_ms,
                "config": v.config.redacted(),
            })
        })
        .collect();
    let latest = rec.latest();
    serde_json::json!({
        "type": rec.name,
        "version": latest.version,
        "kind": latest.kind.as_str(),
        "created_at_ms": rec.created_at_ms,
        "config": latest.config.redacted(),
        "active_actors": s.node.registry().count_type(&rec.name),
        "usage": s.node.type_usage(&rec.name).unwrap_or_default(),
        "versions": versions,
    })
}

/// `GET /v1/types` takes no parameters (all types, in one page): one it
/// was given is refused rather than ignored (`?limit=0` listed all).
#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct ListParams {}

pub(super) async fn list(State(s): State<AppState>, Query(_): Query<ListParams>) -> Response {
    let types: Vec<serde_json::Value> = s
        .node
        .catalog()
        .all()
        .iter()
        .map(|e| {
            let rec = e.record();
            let latest = rec.latest();
            serde_json::json!({
                "type": rec.name,
                "version": latest.version,
                "kind": latest.kind.as_str(),
                "sha256": latest.sha256,
            })
        })
        .collect();
    axum::Json(serde_json::json!({ "types": types })).into_response()
}

pub(super) async fn get(
    State(s): State<AppState>,
    KnownType(entry): KnownType,
) -> Result<Response, ApiError> {
    Ok(axum::Json(type_json(&s, &entry)).into_response())
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct DeleteParams {
    #[serde(default)]
    force: bool,
}

pub(super) async fn delete(
    State(s): State<AppState>,
    Path(ty): Path<String>,
    Query(q): Query<DeleteParams>,
) -> Result<Response, ApiError> {
    validate_type_name(&ty)?;
    let deleted = s.node.delete_type(&ty, q.force).await?;
    Ok(
        axum::Json(serde_json::json!({ "type": ty, "deleted": true, "actors_deleted": deleted }))
            .into_response(),
    )
}
