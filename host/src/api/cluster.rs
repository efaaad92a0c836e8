//! The API in a cluster: any node serves any request.
//!
//! * Requests for one actor go to the owner of the actor's slot
//!   (`routing.rs`).
//! * Writes every node must apply (types, secrets, providers,
//!   subscriptions, token revocations) run here, then on every other live
//!   member; a node that was away takes the types it missed from a peer
//!   (`GET /v1/cluster/catalog`).
//! * Listing a type's actors merges every node's page.
//! * `GET /v1/cluster`: members and slots.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use axum::body::Body;
use axum::extract::{Request, State};
use axum::http::{HeaderMap, HeaderValue, Method, StatusCode};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};

use super::routing::{forwardable, send, too_large};
use super::{ApiError, AppState};

/// On a write applied on every node: the node that received it.
pub(super) const FANOUT_FROM: &str = "x-marmot-fanout-from";
/// On a deploy another node fans out: the version number it gave it.
pub(super) const TYPE_VERSION: &str = "x-marmot-type-version";
/// On a fanned-out subscription `PUT`: its creation time on the node that
/// took the request, for the others to keep as theirs.
pub(super) const SUBSCRIPTION_CREATED_AT: &str = "x-marmot-subscription-created-at";

/// `GET /v1/cluster`.
pub(super) async fn status(State(s): State<AppState>) -> Response {
    match s.node.cluster() {
        Some(c) => axum::Json(c.status()).into_response(),
        None => axum::Json(serde_json::json!({
            "clustered": false,
            "message": "this node runs alone (no [cluster] section in its config)",
        }))
        .into_response(),
    }
}

/// `GET /v1/cluster/catalog`: every type's current version with its code
/// and config, and the shared state (secrets sealed, providers,
/// subscriptions, revocations), for a node returning to the cluster.
///
/// It carries what the API never shows (subscriptions' signing secrets,
/// types' `webhook_secret`), because a returning peer needs them: a node
/// that runs alone has no peer to serve, and refuses.
pub(super) async fn catalog(State(s): State<AppState>) -> Result<Response, ApiError> {
    use base64::Engine as _;
    if s.node.cluster().is_none() {
        return Err(ApiError::new(
            StatusCode::CONFLICT,
            "not_in_cluster",
            "this node runs alone (no [cluster] section in its config): the catalog is for peers",
        ));
    }
    let types: Vec<_> = s
        .node
        .catalog_export()?
        .into_iter()
        .map(|e| {
            serde_json::json!({
                "type": e.ty,
                "version": e.version,
                "kind": e.kind,
                "code_base64": base64::engine::general_purpose::STANDARD.encode(&e.code),
                "config": e.config,
            })
        })
        .collect();
    let shared = s.node.shared_state()?;
    Ok(axum::Json(serde_json::json!({ "types": types, "shared": shared })).into_response())
}

/// Catch up with what changed while this node was away: take the catalog
/// of a live peer, deploy the types that differ (a deploy of identical
/// code and config is a no-op) and make the shared state the peer's.
/// Runs as the node starts serving; the node is ready (`/readyz`) once it
/// is done, or has failed and said why.
pub async fn sync_catalog(node: &crate::node::Node) {
    let Some(cluster) = node.cluster() else {
        return;
    };
    if let Err(e) = catch_up(node, cluster).await {
        tracing::error!(
            error = format!("{e:#}"),
            "cannot catch up with the cluster from a peer; serving with this node's own types and shared state"
        );
    }
    cluster.set_caught_up();
}

async fn catch_up(
    node: &crate::node::Node,
    cluster: &crate::cluster::Cluster,
) -> anyhow::Result<usize> {
    use anyhow::Context as _;
    use base64::Engine as _;
    let client = crate::cluster::peer_client();
    for peer in cluster.peers() {
        let mut req = client
            .get(format!("{}/v1/cluster/catalog", peer.advertise))
            .timeout(Duration::from_secs(10));
        if let Some(t) = &node.config().admin_token {
            req = req.bearer_auth(t);
        }
        let mut body: serde_json::Value = match req.send().await.and_then(|r| r.error_for_status())
        {
            Ok(r) => r.json().await?,
            Err(e) if e.status() == Some(reqwest::StatusCode::UNAUTHORIZED) => {
                tracing::error!(peer = %peer.node_id,
                    "the peer refused this node's admin token: the nodes' admin tokens differ \
                     (every node of a cluster needs the same `admin_token`); requests forwarded \
                     between them fail with 502 peer_refused_credentials");
                continue;
            }
            Err(e) => {
                tracing::warn!(peer = %peer.node_id, error = %e, "cannot read a peer's catalog; trying the next");
                continue;
            }
        };
        let mut changed = 0;
        for t in body["types"].as_array().into_iter().flatten() {
            let ty = t["type"].as_str().context("catalog entry without a type")?;
            let kind = serde_json::from_value(t["kind"].clone())?;
            let config = serde_json::from_value(t["config"].clone())?;
            let code = base64::engine::general_purpose::STANDARD
                .decode(t["code_base64"].as_str().unwrap_or_default())?;
            let version = t["version"]
                .as_u64()
                .and_then(|v| u32::try_from(v).ok())
                .filter(|v| *v > 0)
                .context("catalog entry without a version")?;
            match node.deploy_from_peer(ty, kind, code, config, version).await {
                Ok(d) => changed += usize::from(d.created),
                // Diverged (deployed here while the cluster was out of
                // reach): said, and the other types still taken.
                Err(e @ crate::node::DeployError::VersionConflict(_)) => {
                    tracing::error!(peer = %peer.node_id, ty, error = %e,
                        "this node's versions of a type differ from the cluster's");
                }
                // One type this node cannot install (the node is busy, its
                // limits differ) leaves the others, and the shared state
                // (token revocations above all), still to be taken.
                Err(e) => {
                    tracing::error!(peer = %peer.node_id, ty, error = %e,
                        "cannot install a type of the cluster's catalog; it is not served here until it is deployed again");
                }
            }
        }
        let shared: crate::node::SharedState = serde_json::from_value(body["shared"].take())
            .with_context(|| format!("{}'s shared state", peer.node_id))?;
        let adopted = node
            .adopt_shared_state(&shared)
            .await
            .with_context(|| format!("taking {}'s shared state", peer.node_id))?;
        tracing::info!(peer = %peer.node_id, types = changed, secrets = adopted.secrets,
            providers = adopted.providers, subscriptions = adopted.subscriptions,
            revocations = adopted.revocations, "in step with the cluster");
        return Ok(changed);
    }
    Ok(0)
}

/// Largest request of batches (or of blobs sent ahead of them) a backup
/// takes.
pub(super) const MAX_REPLICA_BYTES: usize = 512 << 20;

/// `POST /v1/cluster/replicate`: apply an owner's batches as their slots'
/// backup.
pub(super) async fn replicate(
    State(s): State<AppState>,
    body: Result<axum::body::Bytes, axum::extract::rejection::BytesRejection>,
) -> Result<Response, ApiError> {
    let body = body?;
    let batches: Vec<crate::storage::schema::ReplicaBatch> =
        postcard::from_bytes(&body).map_err(|e| {
            ApiError::bad_request("invalid_batches", format!("not replicated batches: {e}"))
        })?;
    let outcomes =
        s.node.apply_replicas(batches).await.map_err(|e| {
            ApiError::new(StatusCode::BAD_REQUEST, "not_replicating", format!("{e:#}"))
        })?;
    let names: Vec<&str> = outcomes
        .iter()
        .map(|o| match o {
            crate::storage::ReplicaApplied::Applied => "applied",
            crate::storage::ReplicaApplied::Repeat => "repeat",
            crate::storage::ReplicaApplied::Refused => "refused",
            crate::storage::ReplicaApplied::Gap => "gap",
        })
        .collect();
    Ok(axum::Json(serde_json::json!({ "outcomes": names })).into_response())
}

/// `POST /v1/cluster/blobs/missing`: which of these blobs (postcard
/// SHA-256s) this node lacks, as postcard; it holds the others for the
/// rows about to name them.
pub(super) async fn blobs_missing(
    State(s): State<AppState>,
    body: Result<axum::body::Bytes, axum::extract::rejection::BytesRejection>,
) -> Result<Response, ApiError> {
    let body = body?;
    let shas: Vec<[u8; 32]> = postcard::from_bytes(&body).map_err(|e| {
        ApiError::bad_request("invalid_blobs", format!("not a list of blob names: {e}"))
    })?;
    let missing =
        s.node.blobs_missing(shas).await.map_err(|e| {
            ApiError::new(StatusCode::BAD_REQUEST, "not_replicating", format!("{e:#}"))
        })?;
    let body = postcard::to_stdvec(&missing).map_err(|e| {
        ApiError::new(
            StatusCode::INTERNAL_SERVER_ERROR,
            "internal",
            format!("cannot encode the answer: {e}"),
        )
    })?;
    Ok((
        [(axum::http::header::CONTENT_TYPE, "application/octet-stream")],
        body,
    )
        .into_response())
}

/// `POST /v1/cluster/blobs`: blobs (postcard `[(sha, bytes)]`) sent ahead
/// of the replicated or moved-in rows that name them; answered once they
/// are durable here.
pub(super) async fn put_blobs(
    State(s): State<AppState>,
    body: Result<axum::body::Bytes, axum::extract::rejection::BytesRejection>,
) -> Result<Response, ApiError> {
    let body = body?;
    let blobs: Vec<([u8; 32], Vec<u8>)> = postcard::from_bytes(&body)
        .map_err(|e| ApiError::bad_request("invalid_blobs", format!("not blobs: {e}")))?;
    let stored =
        s.node.take_blobs(blobs).await.map_err(|e| {
            ApiError::new(StatusCode::BAD_REQUEST, "not_replicating", format!("{e:#}"))
        })?;
    Ok(axum::Json(serde_json::json!({ "stored": stored })).into_response())
}

/// One page request of `GET /v1/actors/{type}`.
pub(super) struct ListQuery<'q> {
    pub prefix: &'q str,
    pub cursor: Option<&'q str>,
    pub limit: usize,
}

/// Merge this node's page of a type's actors (`local`) with every other
/// live member's, in id order. A request another node sent for its own
/// merge (marked [`FANOUT_FROM`]) gets this node's page only. Members that
/// do not answer are named in `unreachable_nodes`.
pub(super) async fn list_everywhere(
    s: &AppState,
    ty: &str,
    q: ListQuery<'_>,
    headers: &HeaderMap,
    local: serde_json::Value,
) -> serde_json::Value {
    let Some(cluster) = s.node.cluster() else {
        return local;
    };
    if headers.contains_key(FANOUT_FROM) {
        return local;
    }
    let mut pages = vec![local];
    let mut unreachable = Vec::new();
    let mut forwarded = forwardable(headers);
    if let Ok(v) = HeaderValue::from_str(cluster.node_id()) {
        forwarded.insert(FANOUT_FROM, v);
    }
    for peer in cluster.peers() {
        let mut req = s
            .peers
            .get(format!("{}/v1/actors/{ty}", peer.advertise))
            .headers(forwarded.clone())
            .query(&[("prefix", q.prefix), ("limit", &q.limit.to_string())]);
        if let Some(c) = q.cursor {
            req = req.query(&[("cursor", c)]);
        }
        match req.send().await.and_then(|r| r.error_for_status()) {
            Ok(r) => match r.json::<serde_json::Value>().await {
                Ok(page) => pages.push(page),
                Err(_) => unreachable.push(peer.node_id),
            },
            Err(_) => unreachable.push(peer.node_id),
        }
    }
    merge_pages(pages, q.limit, unreachable)
}

/// Pages of ids in order, each of at most `limit` items after the same
/// cursor, as one page: the first `limit` ids, none past the lowest cursor
/// (a node's scan stopped there: it may have more before a later id); a
/// cursor when any node has more.
fn merge_pages(
    pages: Vec<serde_json::Value>,
    limit: usize,
    unreachable: Vec<String>,
) -> serde_json::Value {
    let lowest: Option<String> = pages
        .iter()
        .filter_map(|p| p["next_cursor"].as_str())
        .min()
        .map(str::to_owned);
    let mut all: Vec<serde_json::Value> = pages
        .into_iter()
        .flat_map(|mut p| match p["actors"].take() {
            serde_json::Value::Array(a) => a,
            _ => Vec::new(),
        })
        .collect();
    all.sort_by(|a, b| a["id"].as_str().cmp(&b["id"].as_str()));
    all.dedup_by(|a, b| a["id"] == b["id"]);
    if let Some(lowest) = &lowest {
        all.retain(|a| a["id"].as_str().is_some_and(|id| id <= lowest.as_str()));
    }
    let next_cursor = if all.len() > limit {
        all.truncate(limit);
        all.last().map(|a| a["id"].clone())
    } else {
        lowest.map(serde_json::Value::from)
    };
    let mut out = serde_json::json!({ "actors": all, "next_cursor": next_cursor });
    if !unreachable.is_empty() {
        out["unreachable_nodes"] = unreachable.into();
    }
    out
}

/// Whether every node must apply this request.
pub(super) fn is_cluster_write(method: &Method, path: &str) -> bool {
    if method == Method::GET || method == Method::HEAD || method == Method::OPTIONS {
        return false;
    }
    [
        "/v1/types/",
        "/v1/secrets/",
        "/v1/providers/",
        "/v1/subscriptions/",
    ]
    .iter()
    .any(|p| path.starts_with(p))
        || (method == Method::DELETE && path.starts_with("/v1/tokens/"))
}

/// One queue per peer for cluster-wide writes: each peer gets them one at
/// a time, in the order this node applied them. Sent side by side, a write
/// and the delete after it reached a paused peer in either order, and it
/// kept what the cluster had deleted (found by a re-probe).
#[derive(Default)]
pub(super) struct FanoutQueues(std::sync::Mutex<HashMap<String, Arc<tokio::sync::Mutex<()>>>>);

impl FanoutQueues {
    /// Peer `node_id`'s queue.
    fn of(&self, node_id: &str) -> Arc<tokio::sync::Mutex<()>> {
        self.0
            .lock()
            .expect("fan-out queues lock")
            .entry(node_id.to_owned())
            .or_default()
            .clone()
    }
}

/// How long a peer has to apply a cluster-wide write (a deploy compiles
/// the code there).
const FANOUT_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(60);

/// Apply a cluster-wide write here, then on every other live member.
pub(super) async fn fan_out(
    s: &AppState,
    cluster: &crate::cluster::Cluster,
    req: Request,
    next: Next,
) -> Response {
    if req.headers().contains_key(FANOUT_FROM) {
        // One hop: another node already fans it out.
        return next.run(req).await;
    }
    // Not before this node has caught up (just started, or back after its
    // lease was lost): a deploy it applied 2 ms before its catch-up made
    // one version number two codes, its own and everyone else's (a probe).
    // Nor while its lease is not confirmed alive: back from a pause, it
    // took a deploy before it noticed that it had lost its lease, so
    // before it started catching up again (a re-probe).
    if !cluster.caught_up() || !cluster.alive() {
        return catching_up();
    }
    // A delete that must find no actors asks every node first: each
    // answered for its own disk, so one that held none deleted the type on
    // every node that held none too, and the type lived on where actors
    // were (a probe).
    if req.method() == Method::DELETE
        && let Some(ty) = req.uri().path().strip_prefix("/v1/types/")
        && !req
            .uri()
            .query()
            .is_some_and(|q| q.split('&').any(|kv| kv == "force=true"))
        && let Err(refused) = no_actors_anywhere(s, cluster, ty, req.headers()).await
    {
        return refused;
    }
    let limit = s.node.config().limits.max_code_bytes / 3 * 4 + 64 * 1024;
    let (parts, body) = req.into_parts();
    let bytes = match axum::body::to_bytes(body, limit).await {
        Ok(b) => b,
        // Cut for the body budget or its deadline: 503 / 408, not 413.
        Err(e) => {
            return super::bodies::cut_answer(&e)
                .map(IntoResponse::into_response)
                .unwrap_or_else(too_large);
        }
    };
    let (method, uri) = (parts.method.clone(), parts.uri.clone());
    let mut headers = forwardable(&parts.headers);
    if let Ok(v) = HeaderValue::from_str(cluster.node_id()) {
        headers.insert(FANOUT_FROM, v);
    }
    let resp = next
        .run(Request::from_parts(parts, Body::from(bytes.clone())))
        .await;
    if !resp.status().is_success() {
        return resp;
    }
    // A deploy's version number is the one this node gave it, on every
    // node.
    let resp = if uri.path().starts_with("/v1/types/") && method == Method::PUT {
        let (resp, version) = deployed_version(resp).await;
        if let Some(v) = version {
            headers.insert(TYPE_VERSION, HeaderValue::from(v));
        }
        resp
    } else {
        resp
    };
    let (resp, bytes) = if method == Method::PUT && uri.path().starts_with("/v1/subscriptions/") {
        let (resp, bytes, created_at_ms) = with_generated_secret(resp, bytes).await;
        // The subscription's creation time is this node's on every node
        // (each stamped its own, so they could not tell, catching up,
        // whether one was made again while they were away).
        if let Some(v) = created_at_ms.and_then(|t| HeaderValue::from_str(&t.to_string()).ok()) {
            headers.insert(SUBSCRIPTION_CREATED_AT, v);
        }
        (resp, bytes)
    } else {
        (resp, bytes)
    };
    let path = uri.path_and_query().map_or("/", |p| p.as_str()).to_owned();
    // Every peer at once, each within FANOUT_TIMEOUT, in a task of its own:
    // one by one inside the client's request, a stopped peer held the rest
    // for ever, and a client that gave up left them never asked, their
    // types differing from this node's (found by a probe).
    // Each peer's place in its queue is taken as the task below starts,
    // right after this node applied the write (the lock is fair: first
    // asked, first served), so before any later write's.
    let sends = cluster.peers().into_iter().map(|peer| {
        let (s, method, path) = (s.clone(), method.clone(), path.clone());
        let (headers, bytes) = (headers.clone(), bytes.clone());
        let queue = s.fanout.of(&peer.node_id).lock_owned();
        let cluster = cluster.clone();
        async move {
            let _turn = queue.await;
            let sent = send(&s, method.clone(), &peer.advertise, &path, headers, bytes);
            // A peer that stops answering and leaves the membership takes
            // the write when it joins again (`sync_catalog`): waited for,
            // a paused peer held a secret's rotation 60 s (found by a
            // probe).
            let left = cluster.until_no_peer(|m| m.node_id == peer.node_id);
            let sent = tokio::select! {
                sent = tokio::time::timeout(FANOUT_TIMEOUT, sent) => sent,
                () = left => {
                    tracing::info!(peer = %peer.node_id, path = %path,
                        "a peer left the cluster while a cluster-wide write waited for it; it catches up when it joins again");
                    return None;
                }
            };
            match sent {
                Ok(Ok(r)) if r.status().is_success() => None,
                // Already gone there (a repeat after a partial delete).
                Ok(Ok(r)) if method == Method::DELETE && r.status() == StatusCode::NOT_FOUND => {
                    None
                }
                Ok(Ok(r)) => Some(format!("{} answered {}", peer.node_id, r.status())),
                Ok(Err(e)) => Some(format!("{}: {e}", peer.node_id)),
                Err(_) => Some(format!(
                    "{} did not answer within {} s",
                    peer.node_id,
                    FANOUT_TIMEOUT.as_secs()
                )),
            }
        }
    });
    let all = tokio::spawn(futures::future::join_all(sends));
    let failed: Vec<String> = match all.await {
        Ok(outcomes) => outcomes.into_iter().flatten().collect(),
        Err(e) => vec![format!("the fan-out failed: {e}")],
    };
    if failed.is_empty() {
        return resp;
    }
    tracing::warn!(path = %uri.path(), ?failed, "a cluster-wide write did not reach every node");
    ApiError::new(
        StatusCode::BAD_GATEWAY,
        "fanout_incomplete",
        format!(
            "applied on this node but not on: {}; repeat the request once they are back \
             (through one of them, for a delete: this node has nothing left to delete)",
            failed.join("; ")
        ),
    )
    .into_response()
}

/// 503 while this node catches up with the cluster's types.
pub(super) fn catching_up() -> Response {
    let mut resp = ApiError::new(
        StatusCode::SERVICE_UNAVAILABLE,
        "catching_up",
        "this node is catching up with the cluster's types; retry in a moment, or through \
         another node",
    )
    .into_response();
    resp.headers_mut().insert(
        axum::http::header::RETRY_AFTER,
        HeaderValue::from_static("1"),
    );
    resp
}

/// Whether every other member holds no actor of `ty` (`ty` as in the
/// request's path, percent-encoded): a 409 naming one that does, or a 503
/// naming one that cannot tell.
async fn no_actors_anywhere(
    s: &AppState,
    cluster: &crate::cluster::Cluster,
    ty: &str,
    headers: &HeaderMap,
) -> Result<(), Response> {
    let mut forwarded = forwardable(headers);
    if let Ok(v) = HeaderValue::from_str(cluster.node_id()) {
        forwarded.insert(FANOUT_FROM, v);
    }
    for peer in cluster.peers() {
        let asked = s
            .peers
            .get(format!("{}/v1/actors/{ty}?limit=1", peer.advertise))
            .headers(forwarded.clone())
            .timeout(std::time::Duration::from_secs(10))
            .send()
            .await;
        let holds = match asked {
            // Unknown there: nothing of it there.
            Ok(r) if r.status() == StatusCode::NOT_FOUND => Some(false),
            Ok(r) if r.status().is_success() => r
                .json::<serde_json::Value>()
                .await
                .ok()
                .and_then(|v| v["actors"].as_array().map(|a| !a.is_empty())),
            _ => None,
        };
        match holds {
            Some(false) => {}
            Some(true) => {
                return Err(ApiError::new(
                    StatusCode::CONFLICT,
                    "type_has_actors",
                    format!(
                        "type `{ty}` still has actors (on {}); delete them first or pass \
                         ?force=true",
                        peer.node_id
                    ),
                )
                .into_response());
            }
            None => {
                return Err(ApiError::new(
                    StatusCode::SERVICE_UNAVAILABLE,
                    "unavailable",
                    format!(
                        "cannot tell whether {} holds actors of type `{ty}`; nothing was \
                         deleted: retry once it answers, or pass ?force=true",
                        peer.node_id
                    ),
                )
                .into_response());
            }
        }
    }
    Ok(())
}

/// The version a deploy's answer names, and the answer rebuilt.
async fn deployed_version(resp: Response) -> (Response, Option<u32>) {
    let (parts, body) = resp.into_parts();
    let Ok(out) = axum::body::to_bytes(body, 1 << 20).await else {
        return (Response::from_parts(parts, Body::empty()), None);
    };
    let version = serde_json::from_slice::<serde_json::Value>(&out)
        .ok()
        .and_then(|v| v["version"].as_u64())
        .and_then(|v| u32::try_from(v).ok());
    (Response::from_parts(parts, Body::from(out)), version)
}

/// A subscription whose signing secret this node generated goes to the
/// other nodes *with* that secret, so that every node signs its webhooks
/// alike (each would generate its own otherwise). Returns the response
/// (read and rebuilt), the request body to send on, and the
/// subscription's creation time here.
async fn with_generated_secret(
    resp: Response,
    request: axum::body::Bytes,
) -> (Response, axum::body::Bytes, Option<u64>) {
    let (parts, body) = resp.into_parts();
    let Ok(out) = axum::body::to_bytes(body, 1 << 20).await else {
        let e = ApiError::new(
            StatusCode::INTERNAL_SERVER_ERROR,
            "internal",
            "cannot read the subscription just saved",
        );
        return (e.into_response(), request, None);
    };
    let saved = serde_json::from_slice::<serde_json::Value>(&out).ok();
    let created_at_ms = saved.as_ref().and_then(|v| v["created_at_ms"].as_u64());
    let secret = saved.and_then(|v| v["secret"].as_str().map(str::to_owned));
    let request = match (
        secret,
        serde_json::from_slice::<serde_json::Value>(&request),
    ) {
        (Some(secret), Ok(serde_json::Value::Object(mut spec))) => {
            spec.insert("secret".into(), secret.into());
            serde_json::to_vec(&spec).map_or(request, Into::into)
        }
        _ => request,
    };
    (
        Response::from_parts(parts, Body::from(out)),
        request,
        created_at_ms,
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pages_merge_in_id_order_with_a_cursor_when_any_node_has_more() {
        let page = |ids: &[&str], more: bool| {
            serde_json::json!({
                "actors": ids.iter().map(|i| serde_json::json!({"id": i})).collect::<Vec<_>>(),
                "next_cursor": if more { ids.last().copied() } else { None },
            })
        };
        let m = merge_pages(
            vec![page(&["a", "d"], true), page(&["b", "c"], true)],
            2,
            vec![],
        );
        assert_eq!(m["actors"], serde_json::json!([{"id": "a"}, {"id": "b"}]));
        assert_eq!(m["next_cursor"], "b");
        // A node whose scan stopped at "b" (it listed none of what it
        // read): nothing past "b" yet, the next page goes on from there.
        let stopped = serde_json::json!({"actors": [], "next_cursor": "b"});
        let m = merge_pages(vec![stopped, page(&["a", "c"], false)], 5, vec![]);
        assert_eq!(m["actors"], serde_json::json!([{"id": "a"}]));
        assert_eq!(m["next_cursor"], "b");
        let m = merge_pages(
            vec![page(&["a"], false), page(&["b"], false)],
            5,
            vec!["n3".into()],
        );
        assert_eq!(m["actors"].as_array().unwrap().len(), 2);
        assert!(m["next_cursor"].is_null());
        assert_eq!(m["unreachable_nodes"], serde_json::json!(["n3"]));
    }

    #[test]
    fn cluster_wide_writes_are_the_admin_writes() {
        assert!(is_cluster_write(&Method::PUT, "/v1/types/kit"));
        assert!(is_cluster_write(&Method::DELETE, "/v1/secrets/KEY"));
        assert!(is_cluster_write(&Method::DELETE, "/v1/tokens/abc"));
        assert!(!is_cluster_write(&Method::POST, "/v1/tokens"));
        assert!(!is_cluster_write(&Method::GET, "/v1/types/kit"));
        assert!(!is_cluster_write(&Method::POST, "/v1/actors/kit/a"));
    }
}
