//! Actors near their users, in the API (docs/design.md "Placement and
//! moves"):
//!
//! * A message that may create an actor names the region it should live
//!   in: `?region=`, else the edge's header (`cluster.region_header`), else
//!   the region of the node that received it (passed on to the owner in
//!   [`PLACE_IN`]). The owner of the actor's hash slot places a new actor
//!   whose slot is elsewhere in that region before its first write; an
//!   actor that exists stays where it is.
//! * `POST /v1/actors/{type}/{id}/move?region=` moves one actor, on the
//!   owner of the slot it lives in (the router sends it there).
//! * While an actor moves, its requests wait on the mover.

use std::time::{Duration, Instant};

use axum::extract::State;
use axum::http::{HeaderMap, Method, StatusCode};
use axum::response::{IntoResponse, Response};
use serde::Deserialize;

use super::extract::ActorPath;
use super::{ApiError, AppState, Query};
use crate::cluster::Cluster;
use crate::ids::ActorKey;
use crate::node::{DropCopy, MoveError, MoveIn, Moved};

/// On a forwarded request that may create its actor: the region it should
/// live in, as the receiving node decided.
pub(super) const PLACE_IN: &str = "x-marmot-place-in";

/// The longest a request waits for a move of its actor.
const MOVE_WAIT: Duration = Duration::from_secs(30);

/// The region a request that may create `path`'s actor wants it in, if it
/// may create one (`Err`: a `?region=` no live node is in).
pub(super) fn wanted_region(
    cluster: &Cluster,
    method: &Method,
    path: &str,
    query: Option<&str>,
    headers: &HeaderMap,
    forwarded: bool,
    region_header: Option<&str>,
) -> Result<Option<String>, ApiError> {
    let creates = method == Method::POST
        && (path.starts_with("/v1/hooks/")
            || path
                .strip_prefix("/v1/actors/")
                .is_some_and(|rest| rest.split('/').count() == 2));
    if !creates {
        return Ok(None);
    }
    let header = |name: &str| {
        headers
            .get(name)
            .and_then(|v| v.to_str().ok())
            .map(str::trim)
            .filter(|v| !v.is_empty())
            .map(str::to_owned)
    };
    if forwarded {
        return Ok(header(PLACE_IN));
    }
    let asked = query.and_then(|q| {
        url::form_urlencoded::parse(q.as_bytes())
            .find(|(k, _)| k == "region")
            .map(|(_, v)| v.into_owned())
    });
    let hinted = region_header.and_then(header);
    if asked.is_none() && hinted.is_none() {
        return Ok(Some(cluster.region().to_owned()));
    }
    let live = cluster.regions();
    if let Some(region) = asked {
        if !live.contains(&region) {
            let known: Vec<&str> = live.iter().map(String::as_str).collect();
            return Err(ApiError::bad_request(
                "unknown_region",
                format!(
                    "no live node is in region `{}` (regions: {})",
                    crate::cluster::shown_region(&region),
                    known.join(", ")
                ),
            ));
        }
        return Ok(Some(region));
    }
    // The edge's hint counts only when it names a region of the cluster.
    if let Some(region) = hinted.filter(|r| live.contains(r)) {
        return Ok(Some(region));
    }
    Ok(Some(cluster.region().to_owned()))
}

/// On the owner of `key`'s slot, before serving a request for it: wait
/// for a move of the actor, or place it in `place_in` if it is new there.
/// `true`: route the request again (the actor may live elsewhere now).
pub(super) async fn before_serving(
    s: &AppState,
    cluster: &Cluster,
    key: &ActorKey,
    slot: u32,
    place_in: Option<&str>,
) -> Result<bool, ApiError> {
    if cluster.moving(key).is_some() {
        settle_move(s, cluster, key).await;
        return Ok(true);
    }
    match place_in {
        Some(region) => place_if_new(s, cluster, key, slot, region).await,
        None => Ok(false),
    }
}

/// Wait while this node moves `key`; undo the fence of a move whose mover
/// is gone. Called by the owner of the slot the actor lives in.
async fn settle_move(s: &AppState, cluster: &Cluster, key: &ActorKey) {
    let deadline = Instant::now() + MOVE_WAIT;
    while cluster.moving(key).is_some() && Instant::now() < deadline {
        if !s.node.is_moving(key) {
            if let Err(e) = s.node.undo_stale_move(key).await {
                tracing::warn!(actor = %key, error = %e, "cannot undo a stale move");
            }
            return;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

/// On the owner of `key`'s hash slot: place `key` in `region` if it is new
/// and its slot is in another region. `true` if it now lives elsewhere.
async fn place_if_new(
    s: &AppState,
    cluster: &Cluster,
    key: &ActorKey,
    slot: u32,
    region: &str,
) -> Result<bool, ApiError> {
    if cluster.placed(key) || cluster.region_of_slot(slot).as_deref() == Some(region) {
        return Ok(false);
    }
    // First messages to a new actor racing through nodes of other regions
    // each come here to place it: the first places it; the others wait for
    // that and are routed again, to wherever it went. They got 409
    // `move_conflict` (a probe: 106 of 360 such requests).
    if s.node.is_moving(key) {
        wait_for_mover(s, key).await;
        return Ok(true);
    }
    if s.node.actor_exists(key)? {
        return Ok(false);
    }
    match s.node.place_new(key, region).await {
        Ok(moved) => Ok(moved),
        Err(MoveError::Busy(_)) => {
            wait_for_mover(s, key).await;
            Ok(true)
        }
        Err(e) => Err(move_error(key, e)),
    }
}

/// Wait (at most [`MOVE_WAIT`]) while this node moves or places `key`.
async fn wait_for_mover(s: &AppState, key: &ActorKey) {
    let deadline = Instant::now() + MOVE_WAIT;
    while s.node.is_moving(key) && Instant::now() < deadline {
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct MoveParams {
    region: String,
}

/// `POST /v1/actors/{type}/{id}/move?region=`.
pub(super) async fn move_actor(
    State(s): State<AppState>,
    ActorPath(key): ActorPath,
    Query(q): Query<MoveParams>,
) -> Result<Response, ApiError> {
    let moved = s
        .node
        .move_actor(&key, &q.region)
        .await
        .map_err(|e| move_error(&key, e))?;
    let cluster = s
        .node
        .cluster()
        .ok_or_else(|| move_error(&key, MoveError::NoCluster))?;
    let slot = cluster.slot_of(&key);
    let node = match cluster.route_slot(slot) {
        crate::cluster::Route::Local { .. } => Some(cluster.node_id().to_owned()),
        crate::cluster::Route::Remote { node_id, .. } => Some(node_id),
        crate::cluster::Route::Unavailable { .. } => None,
    };
    Ok(axum::Json(serde_json::json!({
        "moved": matches!(moved, Moved::To { .. }),
        "region": q.region,
        "slot": slot,
        "node": node,
    }))
    .into_response())
}

/// `POST /v1/cluster/move-in`: an actor's rows from the node moving it.
pub(super) async fn move_in(
    State(s): State<AppState>,
    body: Result<axum::body::Bytes, axum::extract::rejection::BytesRejection>,
) -> Result<Response, ApiError> {
    let body = body?;
    let request: MoveIn = postcard::from_bytes(&body)
        .map_err(|e| ApiError::bad_request("invalid_move", format!("not a moved actor: {e}")))?;
    let key = ActorKey::new(&request.image.actor_type, &request.image.actor_id)
        .map_err(|e| ApiError::bad_request("invalid_move", e.to_string()))?;
    s.node
        .accept_move(request)
        .await
        .map_err(|e| move_error(&key, e))?;
    Ok(axum::Json(serde_json::json!({ "installed": true })).into_response())
}

/// `POST /v1/cluster/drop-copy`: which copy of an actor this node keeps
/// from before, or drop that copy, ahead of the removal of its placement
/// entry.
pub(super) async fn drop_copy(
    State(s): State<AppState>,
    body: Result<axum::body::Bytes, axum::extract::rejection::BytesRejection>,
) -> Result<Response, ApiError> {
    let body = body?;
    let request: DropCopy = postcard::from_bytes(&body)
        .map_err(|e| ApiError::bad_request("invalid_drop", format!("not a dropped copy: {e}")))?;
    let key = ActorKey::new(&request.actor_type, &request.actor_id)
        .map_err(|e| ApiError::bad_request("invalid_drop", e.to_string()))?;
    let created_at_ms = s
        .node
        .accept_drop_copy(&request)
        .await
        .map_err(|e| move_error(&key, e))?;
    Ok(axum::Json(serde_json::json!({ "created_at_ms": created_at_ms })).into_response())
}

fn move_error(key: &ActorKey, e: MoveError) -> ApiError {
    match e {
        MoveError::NotFound(_) => ApiError::actor_not_found(key),
        MoveError::NoRegion(..) => ApiError::bad_request("unknown_region", e.to_string()),
        MoveError::RegionUnavailable(_) => {
            let mut err = ApiError::new(
                StatusCode::SERVICE_UNAVAILABLE,
                "region_unavailable",
                e.to_string(),
            );
            err.retry_after = Some(1);
            err
        }
        MoveError::NoCluster => {
            ApiError::new(StatusCode::CONFLICT, "not_in_cluster", e.to_string())
        }
        MoveError::Busy(_) => {
            let mut err = ApiError::new(StatusCode::CONFLICT, "move_conflict", e.to_string());
            err.retry_after = Some(1);
            err
        }
        MoveError::Failed(_) => {
            let mut err = ApiError::new(
                StatusCode::SERVICE_UNAVAILABLE,
                "move_failed",
                e.to_string(),
            );
            err.retry_after = Some(1);
            err
        }
    }
}

/// `POST /v1/cluster/rebalance`: move every used slot to the preferred
/// node of its region (after adding a node, or when one came back), a few
/// at a time, with no acknowledged write lost: 202 with how many slots are
/// to move now (`GET /v1/cluster` shows the progress); 409 alone.
pub(super) async fn rebalance(State(s): State<AppState>) -> Result<Response, ApiError> {
    let Some(cluster) = s.node.cluster() else {
        return Err(ApiError::new(
            StatusCode::CONFLICT,
            "not_in_cluster",
            "this node is not in a cluster: there is nothing to rebalance",
        ));
    };
    let to_move = cluster.request_rebalance().await.map_err(|e| {
        ApiError::new(
            StatusCode::SERVICE_UNAVAILABLE,
            "etcd_unavailable",
            format!("cannot ask for a rebalance: {e:#}"),
        )
    })?;
    tracing::info!(slots_to_move = to_move, "rebalance asked for");
    Ok((
        StatusCode::ACCEPTED,
        axum::Json(serde_json::json!({"requested": true, "slots_to_move": to_move})),
    )
        .into_response())
}
