//! `/v1/actors`: messages, inspection and deletion.

use axum::body::Bytes;
use axum::extract::State;
use axum::extract::rejection::BytesRejection;
use axum::http::{HeaderMap, HeaderValue, StatusCode, header};
use axum::response::{IntoResponse, Response};
use base64::Engine as _;
use serde::Deserialize;
use tracing::Instrument as _;

use super::extract::{ActorPath, KnownType, Page, json_object};
use super::runs::{self, AgentRequest};
use super::{ApiError, AppState, Path, Query};
use crate::ids::validate_idempotency_key;
use crate::storage::EnqueueOutcome;
use crate::storage::schema::{CodeKind, InputRecord, InputStatus};

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct SendParams {
    #[serde(default = "yes")]
    wait: bool,
    /// Where a new actor should live (used by the cluster's router; a
    /// node alone has one place).
    #[serde(default, rename = "region")]
    _region: Option<String>,
}

fn yes() -> bool {
    true
}

pub(super) async fn send(
    State(s): State<AppState>,
    ActorPath(key): ActorPath,
    Query(q): Query<SendParams>,
    headers: HeaderMap,
    body: Result<Bytes, BytesRejection>,
) -> Result<Response, ApiError> {
    let body = body?;
    if headers.get_all("idempotency-key").iter().nth(1).is_some() {
        return Err(ApiError::bad_request(
            "invalid_idempotency_key",
            "send one Idempotency-Key header, not several",
        ));
    }
    let idempotency_key = match headers.get("idempotency-key") {
        None => None,
        Some(v) => {
            let k = v.to_str().map_err(|_| {
                ApiError::bad_request(
                    "invalid_idempotency_key",
                    "Idempotency-Key must be visible ASCII",
                )
            })?;
            validate_idempotency_key(k)?;
            Some(k.to_owned())
        }
    };
    let content_type = headers
        .get(header::CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .map(str::to_owned);
    let entry = s.node.catalog().get(key.ty());
    let kind = entry.as_ref().map(|t| t.latest_kind());
    let from_actor = headers.contains_key(crate::cluster::FROM_ACTOR);
    let mut agent_input = false;
    if kind == Some(CodeKind::Agent) {
        match runs::agent_request(&body) {
            Ok(AgentRequest::Input) => agent_input = true,
            // No actor, no run to cancel: and the message would make one.
            Ok(AgentRequest::Cancel) if s.node.actor_info(&key)?.is_none() => {
                return Err(ApiError::actor_not_found(&key));
            }
            Ok(AgentRequest::Cancel) => {}
            // A run's own steps, passed on by another node.
            Err(_) if from_actor => {}
            Err(e) => return Err(e),
        }
    } else if kind == Some(CodeKind::Js) && !from_actor {
        declared_json_parses(content_type.as_deref(), &body)?;
    }
    // A message another node passes on was counted by the sending turn,
    // and a repeat of a taken Idempotency-Key runs nothing.
    if let Some(entry) = &entry
        && !from_actor
    {
        s.node.admit(entry, &key, idempotency_key.as_deref())?;
    }
    if agent_input {
        return runs::run(&s, &key, body, idempotency_key, q.wait).await;
    }
    if !q.wait {
        let outcome = s
            .node
            .enqueue(&key, body, content_type, idempotency_key)
            .await?;
        let (id, duplicate) = match outcome {
            EnqueueOutcome::Queued { message_id } => (message_id, false),
            EnqueueOutcome::Duplicate { message_id, .. } => (message_id, true),
        };
        let mut resp = (
            StatusCode::ACCEPTED,
            axum::Json(serde_json::json!({ "message_id": id })),
        )
            .into_response();
        if duplicate {
            resp.headers_mut()
                .insert("idempotent-replayed", HeaderValue::from_static("true"));
        }
        return Ok(resp);
    }
    let chain = match headers.get(crate::cluster::CALL_CHAIN) {
        None => None,
        Some(v) => Some(
            v.to_str()
                .ok()
                .and_then(crate::cluster::decode_chain)
                .ok_or_else(|| {
                    ApiError::bad_request(
                        "invalid_call_chain",
                        "x-marmot-call-chain must list actors as type/id, percent-encoded, comma separated",
                    )
                })?,
        ),
    };
    let sent = async {
        match chain {
            // A turn's `actors.call` from another node, with its key.
            Some(chain) => {
                let call_key = headers
                    .get(crate::cluster::CALL_KEY)
                    .and_then(|v| v.to_str().ok())
                    .map(crate::sandbox::stored_call_key);
                s.node
                    .send_in_chain(&key, body, content_type, chain.into(), call_key)
                    .await
            }
            None => s.node.send(&key, body, content_type, idempotency_key).await,
        }
    };
    let reply = match crate::telemetry::Parent::from_headers(&headers) {
        // The caller's trace: the turn's span becomes part of it.
        Some(parent) => {
            let span = tracing::info_span!("request", actor_type = key.ty(), actor_id = key.id());
            parent.adopt(&span);
            sent.instrument(span).await?
        }
        None => sent.await?,
    };
    let status = StatusCode::from_u16(reply.status).unwrap_or(StatusCode::OK);
    let content_type = reply
        .content_type
        .as_deref()
        .and_then(|c| HeaderValue::from_str(c).ok())
        .unwrap_or(HeaderValue::from_static("application/json"));
    let mut resp = (status, reply.body).into_response();
    let h = resp.headers_mut();
    h.insert(header::CONTENT_TYPE, content_type);
    if let Ok(v) = HeaderValue::from_str(&reply.message_id) {
        h.insert("x-marmot-message-id", v);
    }
    if reply.replayed {
        h.insert("idempotent-replayed", HeaderValue::from_static("true"));
    }
    Ok(resp)
}

/// The deepest nesting of a JSON body a JavaScript actor is sent:
/// `JSON.parse` in the sandbox runs out of stack past ~16,000 levels.
const MAX_JSON_DEPTH: usize = 10_000;

/// A JavaScript actor's handler gets a body declared JSON parsed, and a
/// turn whose body does not parse fails before the handler runs
/// (`actors/quickjs/src/engine.rs`, `message_body`, which declares JSON by
/// the same rule). So such a body is the client's error: 400, and nothing
/// is stored. serde_json reads the grammar `JSON.parse` does (RFC 8259);
/// like the guest, it passes over what a string holds (bytes that are not
/// UTF-8 there become U+FFFD in the guest, lone surrogates stay). Nor may
/// it nest deeper than [`MAX_JSON_DEPTH`] (100,000 levels were a 500
/// `actor_error` from the turn: a probe).
fn declared_json_parses(content_type: Option<&str>, body: &[u8]) -> Result<(), ApiError> {
    let Some(ct) = content_type.filter(|c| declares_json(c)) else {
        return Ok(());
    };
    if body.iter().all(u8::is_ascii_whitespace) {
        return Ok(());
    }
    serde_json::from_slice::<serde::de::IgnoredAny>(body).map_err(|e| {
        ApiError::bad_request(
            "invalid_json",
            format!("the body is declared JSON (`{ct}`) but is not: {e}"),
        )
    })?;
    if json_depth(body) > MAX_JSON_DEPTH {
        return Err(ApiError::bad_request(
            "invalid_json",
            format!(
                "the body nests deeper than {MAX_JSON_DEPTH} levels of arrays and objects, \
                 more than a JavaScript actor parses"
            ),
        ));
    }
    Ok(())
}

/// How deep `json` (valid JSON) nests arrays and objects.
fn json_depth(json: &[u8]) -> usize {
    let (mut depth, mut deepest) = (0usize, 0usize);
    let (mut in_string, mut escaped) = (false, false);
    for &b in json {
        if in_string {
            match b {
                _ if escaped => escaped = false,
                b'\\' => escaped = true,
                b'"' => in_string = false,
                _ => {}
            }
            continue;
        }
        match b {
            b'"' => in_string = true,
            b'[' | b'{' => {
                depth += 1;
                deepest = deepest.max(depth);
            }
            b']' | b'}' => depth = depth.saturating_sub(1),
            _ => {}
        }
    }
    deepest
}

/// Whether a content type says JSON: any that names it (`application/json`,
/// `application/ld+json`, `text/json; charset=utf-8`), as the JavaScript
/// runtime reads a message's.
fn declares_json(content_type: &str) -> bool {
    content_type.to_ascii_lowercase().contains("json")
}

pub(super) async fn info(
    State(s): State<AppState>,
    ActorPath(key): ActorPath,
) -> Result<Response, ApiError> {
    let Some(info) = s.node.actor_info(&key)? else {
        return Err(ApiError::actor_not_found(&key));
    };
    let Some(cluster) = s.node.cluster() else {
        return Ok(axum::Json(info).into_response());
    };
    // In a cluster: where the actor lives (this node: requests for it were
    // routed here).
    let mut info = serde_json::to_value(info)
        .map_err(|e| ApiError::new(StatusCode::INTERNAL_SERVER_ERROR, "internal", e.to_string()))?;
    if let (Some(o), crate::cluster::Route::Local { epoch, .. }) =
        (info.as_object_mut(), cluster.route(&key))
    {
        o.insert("node".into(), cluster.node_id().into());
        o.insert("region".into(), cluster.region().into());
        o.insert("epoch".into(), epoch.into());
        o.insert("backup".into(), cluster.backup_of(&key).into());
    }
    Ok(axum::Json(info).into_response())
}

pub(super) async fn delete(
    State(s): State<AppState>,
    ActorPath(key): ActorPath,
) -> Result<Response, ApiError> {
    if s.node.delete_actor(&key).await? {
        Ok(axum::Json(serde_json::json!({ "deleted": true })).into_response())
    } else {
        Err(ApiError::actor_not_found(&key))
    }
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct ListParams {
    #[serde(default)]
    prefix: String,
    #[serde(default)]
    cursor: Option<String>,
    #[serde(default)]
    limit: Option<usize>,
}

pub(super) async fn list(
    State(s): State<AppState>,
    KnownType(ty): KnownType,
    Query(q): Query<ListParams>,
    headers: HeaderMap,
) -> Result<Response, ApiError> {
    let limit = Page::LIST.size(q.limit)?;
    let page = s
        .node
        .list_actors(ty.name(), &q.prefix, q.cursor.as_deref(), limit)?;
    let local = serde_json::json!({
        "actors": page.items,
        "next_cursor": page.next_cursor,
    });
    let local = match s.node.cluster() {
        // In a cluster each node holds its own actors: merge every node's
        // page.
        Some(_) => {
            let query = super::cluster::ListQuery {
                prefix: &q.prefix,
                cursor: q.cursor.as_deref(),
                limit,
            };
            super::cluster::list_everywhere(&s, ty.name(), query, &headers, local).await
        }
        None => local,
    };
    Ok(axum::Json(local).into_response())
}

/// A state value as the API shows it: the value itself when it is JSON
/// (as stored, at any depth: see `streams::raw_json`), else base64.
#[derive(serde::Serialize)]
struct StateEntry<'a> {
    key: &'a str,
    #[serde(skip_serializing_if = "Option::is_none")]
    value: Option<&'a serde_json::value::RawValue>,
    #[serde(skip_serializing_if = "Option::is_none")]
    value_base64: Option<String>,
}

fn value_json<'a>(key: &'a str, v: &'a [u8]) -> StateEntry<'a> {
    let (value, value_base64) = json_or_base64(v);
    StateEntry {
        key,
        value,
        value_base64,
    }
}

/// A page of state entries.
#[derive(serde::Serialize)]
struct StatePage<'a> {
    entries: Vec<StateEntry<'a>>,
    next_after: Option<String>,
}

/// A page of events (keys in the order they always had).
#[derive(serde::Serialize)]
struct EventPage<'a> {
    events: Vec<super::streams::EventJson<'a>>,
    #[serde(skip_serializing_if = "Option::is_none")]
    gap: Option<serde_json::Value>,
    next_after: u64,
    #[serde(skip_serializing_if = "Option::is_none")]
    reset: Option<serde_json::Value>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct StateParams {
    #[serde(default)]
    prefix: String,
    #[serde(default)]
    after: Option<String>,
    #[serde(default)]
    limit: Option<usize>,
}

/// Bytes of values a page of state holds, at most (at least one value):
/// a page of 1,000 values of 1 MiB was one 1 GB answer, and took the
/// node's memory from 0.3 to 2 GB.
const STATE_PAGE_BYTES: usize = 8 << 20;

pub(super) async fn state(
    State(s): State<AppState>,
    ActorPath(key): ActorPath,
    Query(q): Query<StateParams>,
) -> Result<Response, ApiError> {
    let limit = Page::LIST.size(q.limit)?;
    let Some((entries, more)) =
        s.node
            .read_state(&key, &q.prefix, q.after.as_deref(), limit, STATE_PAGE_BYTES)?
    else {
        return Err(ApiError::actor_not_found(&key));
    };
    let next = more
        .then(|| entries.last().map(|(k, _)| k.clone()))
        .flatten();
    let entries: Vec<_> = entries.iter().map(|(k, v)| value_json(k, v)).collect();
    Ok(axum::Json(StatePage {
        entries,
        next_after: next,
    })
    .into_response())
}

/// The `{*key}` of `…/state/{*key}`.
#[derive(Deserialize)]
pub(super) struct StateKey {
    key: String,
}

pub(super) async fn state_key(
    State(s): State<AppState>,
    ActorPath(key): ActorPath,
    Path(StateKey { key: state_key }): Path<StateKey>,
) -> Result<Response, ApiError> {
    match s.node.read_state_key(&key, &state_key)? {
        None => Err(ApiError::actor_not_found(&key)),
        Some(None) => Err(ApiError::not_found(
            "key_not_found",
            format!("no state under `{state_key}`"),
        )),
        Some(Some(v)) => {
            let ct = if serde_json::from_slice::<serde::de::IgnoredAny>(&v).is_ok() {
                "application/json"
            } else {
                "application/octet-stream"
            };
            Ok(([(header::CONTENT_TYPE, ct)], v).into_response())
        }
    }
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct EventParams {
    #[serde(default)]
    after: u64,
    #[serde(default)]
    limit: Option<usize>,
    /// A client token for `EventSource`, which cannot send headers:
    /// checked by the edge layer, ignored here.
    #[serde(default, rename = "access_token")]
    _access_token: Option<String>,
}

/// The most bytes of events one page holds, as stored (and at least one
/// event): `limit` events of up to 256 KiB each made pages of up to
/// 256 MB. A page may therefore hold fewer than `limit` events; the next
/// starts at its `next_after`.
const EVENT_PAGE_BYTES: usize = 8 << 20;

pub(super) async fn events(
    State(s): State<AppState>,
    ActorPath(key): ActorPath,
    Query(q): Query<EventParams>,
    grant: Option<axum::Extension<crate::tokens::Grant>>,
    headers: HeaderMap,
) -> Result<Response, ApiError> {
    // One rule for the stream and the page: `Last-Event-ID`, when sent,
    // is where either starts (a malformed one is a 400, not ignored).
    let mut after = super::streams::start_after(&headers, q.after)?;
    if headers
        .get(header::ACCEPT)
        .and_then(|v| v.to_str().ok())
        .is_some_and(|v| v.contains("text/event-stream"))
    {
        let mut resp = super::streams::open(&s.node, key, after, grant.map(|g| g.0))?;
        vary_accept(&mut resp);
        return Ok(resp);
    }
    let limit = Page::LIST.size(q.limit)?;
    let Some(mut events) = s.node.events(&key, after, limit, EVENT_PAGE_BYTES)? else {
        return Err(ApiError::actor_not_found(&key));
    };
    let mut reset = None;
    if events.is_empty()
        && let Some(last) = super::streams::past_the_end(&s.node, &key, after)?
    {
        reset = Some(super::streams::reset_json(after, last));
        after = 0;
        events = s
            .node
            .events(&key, 0, limit, EVENT_PAGE_BYTES)?
            .unwrap_or_default();
    }
    let next_after = events.last().map_or(after, |(seq, _)| *seq);
    // Events retention removed since `after`: said, as the stream's `gap`
    // frame says it (the page skipped them without a word).
    let gap = events
        .first()
        .filter(|(first, _)| (after > 0 || reset.is_some()) && *first > after + 1)
        .map(|(first, _)| serde_json::json!({ "after": after, "next": first }));
    let page = EventPage {
        events: events
            .iter()
            .map(|(seq, e)| super::streams::event_json(*seq, e))
            .collect(),
        gap,
        next_after,
        reset,
    };
    let mut resp = axum::Json(page).into_response();
    vary_accept(&mut resp);
    Ok(resp)
}

/// The events route answers a page or a stream by `Accept`: say so to
/// caches.
fn vary_accept(resp: &mut Response) {
    resp.headers_mut()
        .append(header::VARY, HeaderValue::from_static("accept"));
}

/// Stored bytes as the API shows them: the value itself when it is JSON
/// (as stored, at any depth), else base64.
pub(super) fn json_or_base64(
    bytes: &[u8],
) -> (Option<&serde_json::value::RawValue>, Option<String>) {
    match super::streams::raw_json(bytes) {
        Some(j) => (Some(j), None),
        None => (
            None,
            Some(base64::engine::general_purpose::STANDARD.encode(bytes)),
        ),
    }
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct InputParams {
    /// `pending` (default), `answered`, `expired`, `cancelled` or `all`.
    #[serde(default)]
    status: Option<String>,
    /// The last id of the previous page.
    #[serde(default)]
    after: Option<String>,
    #[serde(default)]
    limit: Option<usize>,
}

/// The most bytes of stored input requests (answers included) one page
/// holds (and at least one): every answer an actor keeps (1,000 of up to
/// 256 KiB) was read and parsed at once, ~9× their size in memory, for
/// any holder of an `inputs` token (a probe: 26 MB of answers took the
/// node from 185 MB to 1 GB).
const INPUT_PAGE_BYTES: usize = 8 << 20;

/// An input request as the API shows it (its schema and answer as
/// stored; keys in the order they always had).
#[derive(serde::Serialize)]
struct InputJson<'a> {
    created_at_ms: u64,
    expires_at_ms: Option<u64>,
    id: &'a str,
    kind: &'a str,
    prompt: &'a str,
    #[serde(skip_serializing_if = "Option::is_none")]
    response: Option<&'a serde_json::value::RawValue>,
    schema: Option<&'a serde_json::value::RawValue>,
    settled_at_ms: Option<u64>,
    status: &'static str,
}

#[derive(serde::Serialize)]
struct InputPage<'a> {
    inputs: Vec<InputJson<'a>>,
    #[serde(skip_serializing_if = "Option::is_none")]
    next_after: Option<&'a str>,
}

pub(super) async fn inputs(
    State(s): State<AppState>,
    ActorPath(key): ActorPath,
    Query(q): Query<InputParams>,
) -> Result<Response, ApiError> {
    let want = q.status.as_deref().unwrap_or("pending");
    if !["pending", "answered", "expired", "cancelled", "all"].contains(&want) {
        return Err(ApiError::bad_request(
            "invalid_status",
            "status must be pending, answered, expired, cancelled or all",
        ));
    }
    let limit = Page::INPUTS.size(q.limit)?;
    let after = q.after.as_deref().unwrap_or("");
    let listed = if want == "pending" {
        // From their own index: at most 100, without answers.
        s.node.pending_inputs(&key)?.map(|mut all| {
            all.retain(|(id, _)| id.as_str() > after);
            let more = all.len() > limit;
            all.truncate(limit);
            (all, more)
        })
    } else {
        let keep = |r: &InputRecord| want == "all" || r.status.label() == want;
        s.node
            .inputs_page(&key, after, limit, INPUT_PAGE_BYTES, keep)?
    };
    let Some((inputs, more)) = listed else {
        return Err(ApiError::actor_not_found(&key));
    };
    let page = InputPage {
        inputs: inputs
            .iter()
            .map(|(id, r)| InputJson {
                created_at_ms: r.created_at_ms,
                expires_at_ms: r.expires_at_ms,
                id,
                kind: &r.kind,
                prompt: &r.prompt,
                response: match &r.status {
                    InputStatus::Answered { response, .. } => Some(
                        super::streams::raw_json(response)
                            .unwrap_or(serde_json::value::RawValue::NULL),
                    ),
                    _ => None,
                },
                schema: r
                    .schema
                    .as_deref()
                    .and_then(|t| super::streams::raw_json(t.as_bytes())),
                settled_at_ms: r.status.settled_at_ms(),
                status: r.status.label(),
            })
            .collect(),
        next_after: more
            .then(|| inputs.last().map(|(id, _)| id.as_str()))
            .flatten(),
    };
    Ok(axum::Json(page).into_response())
}

/// The `{input}` of `…/inputs/{input}`.
#[derive(Deserialize)]
pub(super) struct InputId {
    input: String,
}

/// `POST …/inputs/{input}`: the body (JSON) answers the request. 200 once
/// the actor's `on-input` turn is durable; 409 if it was already answered or
/// expired; 422 if the answer does not match the request's schema.
pub(super) async fn answer_input(
    State(s): State<AppState>,
    ActorPath(key): ActorPath,
    Path(InputId { input }): Path<InputId>,
    body: Result<Bytes, BytesRejection>,
) -> Result<Response, ApiError> {
    let body = body?;
    if input.is_empty()
        || input.len() > 64
        || !input
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b == b'_')
    {
        return Err(ApiError::not_found(
            "input_not_found",
            format!("no input request `{input}`"),
        ));
    }
    if body.len() > crate::inputs::MAX_ANSWER {
        return Err(ApiError::new(
            StatusCode::PAYLOAD_TOO_LARGE,
            "payload_too_large",
            format!(
                "an answer may be at most {} bytes",
                crate::inputs::MAX_ANSWER
            ),
        ));
    }
    if let Err(e) = serde_json::from_slice::<serde::de::IgnoredAny>(&body) {
        return Err(ApiError::new(
            StatusCode::UNPROCESSABLE_ENTITY,
            "invalid_answer",
            format!("the answer must be JSON: {e}"),
        ));
    }
    s.node.answer_input(&key, &input, body.to_vec()).await?;
    Ok(axum::Json(serde_json::json!({ "id": input, "status": "answered" })).into_response())
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct EvalBody {
    code: String,
}

/// `POST …/eval`: the body is the script (`text/javascript`, `text/plain`),
/// or `{"code": "…"}` as JSON. Always 200 with `{result, logs, error}` once
/// the script ran; `error` says why it failed (a throw, or a limit).
pub(super) async fn eval(
    State(s): State<AppState>,
    ActorPath(key): ActorPath,
    headers: HeaderMap,
    body: Result<Bytes, BytesRejection>,
) -> Result<Response, ApiError> {
    let body = body?;
    let is_json = headers
        .get(header::CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .is_some_and(declares_json);
    let code = if is_json {
        json_object::<EvalBody>(&body)
            .map_err(|e| {
                ApiError::bad_request("invalid_body", format!("expected {{\"code\": \"…\"}}: {e}"))
            })?
            .code
    } else {
        String::from_utf8(body.to_vec())
            .map_err(|_| ApiError::bad_request("invalid_body", "the script is not valid UTF-8"))?
    };
    if code.trim().is_empty() {
        return Err(ApiError::bad_request("invalid_body", "the script is empty"));
    }
    let out = s.node.eval(&key, code).await?;
    // The script's result is JSON text from `JSON.stringify`, which may
    // escape lone surrogates: U+FFFD instead, as for events. It goes out as
    // it is, at any depth (nested past 128 levels, it was `null`).
    let fixed = out
        .result
        .as_deref()
        .map(|text| crate::json::without_lone_surrogates(text).unwrap_or_else(|| text.into()));
    #[derive(serde::Serialize)]
    struct EvalJson<'a> {
        error: &'a Option<String>,
        logs: &'a [String],
        result: &'a serde_json::value::RawValue,
    }
    let result = fixed
        .as_deref()
        .and_then(|t| super::streams::raw_json(t.as_bytes()))
        .unwrap_or(serde_json::value::RawValue::NULL);
    Ok(axum::Json(EvalJson {
        error: &out.error,
        logs: &out.logs,
        result,
    })
    .into_response())
}

#[cfg(test)]
mod tests {
    use super::json_depth;

    #[test]
    fn json_depth_counts_what_nests_outside_strings() {
        assert_eq!(json_depth(b"1"), 0);
        assert_eq!(json_depth(b"[]"), 1);
        assert_eq!(json_depth(br#"{"a": [[1], {"b": []}], "c": 2}"#), 4);
        // Brackets and quotes inside strings are text.
        assert_eq!(json_depth(br#"["[[[{", "\"[[", "\\", []]"#), 2);
        let deep = format!("{}{}", "[".repeat(20_000), "]".repeat(20_000));
        assert_eq!(json_depth(deep.as_bytes()), 20_000);
    }
}
