//! Routing in a cluster: a request for one actor (`/v1/actors/{type}/{id}…`,
//! `/v1/hooks/{type}/{id}/…`, a delivery's retry) goes to the owner of the
//! actor's slot: served here, or forwarded with the epoch this node
//! expects. The owner refuses a forwarded request whose epoch is not its
//! own (421 `wrong_owner`, never passed to a client); the forwarder then
//! re-reads the slot table and tries again with the same request (and so
//! the same `Idempotency-Key`). Responses stream back (SSE included). A
//! request served here whose actor moved while it ran, nothing of it
//! applied, is routed again if the client made it safe to retry
//! (docs/design.md, "Requests caught by a move are sent again").

use std::time::Duration;

use axum::body::Body;
use axum::extract::{Request, State};
use axum::http::{HeaderMap, HeaderName, HeaderValue, Method, StatusCode, header};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};

use super::error::Reroute;
use super::{ApiError, AppState, placement};
use crate::cluster::Route;
use crate::ids::ActorKey;

/// On a forwarded request: the epoch the forwarder expects the owner to
/// hold the slot at.
const FORWARDED_EPOCH: &str = "x-marmot-forwarded-epoch";
/// On a forwarded request: the forwarding node.
const FORWARDED_BY: &str = "x-marmot-forwarded-by";

/// On a response for an actor: the node that served it, the epoch it held
/// the actor's slot at, and the slot.
const SERVED_BY: &str = "x-marmot-node";
const SERVED_AT: &str = "x-marmot-epoch";
const SERVED_SLOT: &str = "x-marmot-slot";

/// Routes every request gets (each after re-reading the slot table, or
/// after waiting for a move or handoff of its actor to end) before it may
/// give up.
const ATTEMPTS: usize = 3;
/// Past [`ATTEMPTS`], a request keeps following its actor for this long
/// from its arrival (an actor moved twice in a row used up the attempts,
/// and its request got a 503: a probe at ~400 moves per 30 s), up to
/// [`MAX_ROUTES`] routes in all.
const ROUTING_TIME: Duration = Duration::from_secs(10);
const MAX_ROUTES: usize = 16;
/// Times a request served here is sent again because its actor left this
/// node while it ran and nothing of it was applied ([`Reroute`]).
const REROUTES: usize = 2;

/// The actor a request path is for.
fn actor_of(path: &str) -> Option<ActorKey> {
    let rest = path
        .strip_prefix("/v1/actors/")
        .or_else(|| path.strip_prefix("/v1/hooks/"))?;
    let mut parts = rest.splitn(3, '/');
    let ty = decoded(parts.next()?)?;
    let id = decoded(parts.next()?)?;
    ActorKey::new(&ty, &id).ok()
}

/// A path segment, percent-decoded, if that is UTF-8.
fn decoded(segment: &str) -> Option<std::borrow::Cow<'_, str>> {
    percent_encoding::percent_decode_str(segment)
        .decode_utf8()
        .ok()
}

/// The type, id and name of a hook's path (`/v1/hooks/{type}/{id}/{name}`),
/// decoded.
fn hook_of(path: &str) -> Option<(String, String, String)> {
    let mut parts = path.strip_prefix("/v1/hooks/")?.splitn(3, '/');
    let mut next = || decoded(parts.next()?).map(|p| p.into_owned());
    Some((next()?, next()?, next()?))
}

/// The actor whose delivery `POST /v1/deliveries/{id}/retry` names, if
/// this node keeps a copy of the row (it owns or backs up the actor's
/// slot): the retry goes to the slot's owner, which delivers.
fn delivery_actor(s: &AppState, path: &str) -> Option<ActorKey> {
    let id = path
        .strip_prefix("/v1/deliveries/")?
        .strip_suffix("/retry")?;
    let rec = s.node.storage().reader().ok()?.delivery_by_id(id).ok()??;
    ActorKey::new(&rec.actor_type, &rec.actor_id).ok()
}

/// How long a request for an actor this node owns waits for the node to
/// catch up with the cluster's types.
const CATCH_UP_WAIT: Duration = Duration::from_secs(5);

/// Whether `cluster` says it has caught up within `wait`.
async fn caught_up_within(cluster: &crate::cluster::Cluster, wait: Duration) -> bool {
    let deadline = tokio::time::Instant::now() + wait;
    while !cluster.caught_up() {
        if tokio::time::Instant::now() >= deadline {
            return false;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    true
}

/// Routing middleware (installed only in a cluster).
pub(super) async fn route(State(s): State<AppState>, req: Request, next: Next) -> Response {
    let Some(cluster) = s.node.cluster().cloned() else {
        return next.run(req).await;
    };
    let path = req.uri().path().to_owned();
    if super::cluster::is_cluster_write(req.method(), &path) {
        return super::cluster::fan_out(&s, &cluster, req, next).await;
    }
    // A hook's head is checked before its body is read here, as on a
    // node alone (`hooks::receive`): in a cluster, unsigned senders
    // trickling bodies held connections here for the body's deadline.
    if req.method() == axum::http::Method::POST
        && let Some((ty, id, name)) = hook_of(&path)
        && let Err(e) = s.node.check_webhook_head(&ty, &id, &name, req.headers())
    {
        return ApiError::from(e).into_response();
    }
    let Some(key) = actor_of(&path).or_else(|| delivery_actor(&s, &path)) else {
        return next.run(req).await;
    };
    let expected: Option<u64> = req
        .headers()
        .get(FORWARDED_EPOCH)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.parse().ok());
    let region_header = s
        .node
        .config()
        .cluster
        .as_ref()
        .and_then(|c| c.region_header.as_deref());
    let place_in = match placement::wanted_region(
        &cluster,
        req.method(),
        &path,
        req.uri().query(),
        req.headers(),
        expected.is_some(),
        region_header,
    ) {
        Ok(r) => r,
        Err(e) => return e.into_response(),
    };
    let limit = s.node.config().limits.max_message_bytes + 64 * 1024;
    let (parts, body) = req.into_parts();
    // Kept whole, so that the request can be sent again: to the owner
    // after a stale route, or anew after its actor left while it ran.
    let body = match axum::body::to_bytes(body, limit).await {
        Ok(b) => b,
        Err(e) => {
            return super::bodies::cut_answer(&e)
                .map(IntoResponse::into_response)
                .unwrap_or_else(too_large);
        }
    };
    let mut deadline = tokio::time::Instant::now() + ROUTING_TIME;
    let mut rerouted = 0;
    for attempt in 1..=MAX_ROUTES {
        if attempt > ATTEMPTS {
            if tokio::time::Instant::now() >= deadline {
                break;
            }
            // Each route past the first few re-read the whole slot table
            // from etcd or forwarded again at once: paced, while a move or
            // failover is what keeps it routing.
            let pause = 50 * (attempt - ATTEMPTS) as u64;
            tokio::time::sleep(Duration::from_millis(pause.min(500))).await;
        }
        match cluster.route(&key) {
            Route::Local { slot, epoch, used } => {
                if expected.is_some_and(|e| e != epoch) {
                    return wrong_owner(&key, epoch);
                }
                // Not before this node has caught up with the cluster's
                // types (just started, or back after its lease was lost):
                // it answered 404 for types it had not caught up with yet,
                // and ran the older versions it had (a probe). Waited for a
                // moment (a catch-up takes seconds), then 503.
                if !cluster.caught_up() && !caught_up_within(&cluster, CATCH_UP_WAIT).await {
                    return super::cluster::catching_up();
                }
                // Being handed to its backup (a rebalance): wait for the
                // switch (milliseconds), then route again.
                if cluster.draining(slot) {
                    for _ in 0..400 {
                        tokio::time::sleep(Duration::from_millis(5)).await;
                        if !cluster.draining(slot) {
                            break;
                        }
                    }
                    continue;
                }
                // Just come to own it: what this node accepted as its
                // backup lands before any of its actors loads here.
                if used && !cluster.settled(slot, epoch) {
                    s.node.note_takeover(&cluster, slot, epoch);
                    cluster
                        .settle_slots(s.node.storage().writer(), &[(slot, epoch)])
                        .await;
                }
                // A move of the actor under way, or a new actor placed in
                // another region: route again (a forwarded request is then
                // refused below, and its sender re-reads and retries).
                match placement::before_serving(&s, &cluster, &key, slot, place_in.as_deref()).await
                {
                    Ok(false) => {}
                    Ok(true) => continue,
                    Err(e) => return e.into_response(),
                }
                if !used {
                    match cluster.claim(slot, epoch).await {
                        Ok(true) => {}
                        Ok(false) => continue,
                        Err(e) => return unavailable(&key, &format!("cannot claim its slot: {e}")),
                    }
                }
                let resp = next
                    .clone()
                    .run(Request::from_parts(parts.clone(), Body::from(body.clone())))
                    .await;
                // Nothing of it was applied, and its actor is elsewhere
                // now: route it again, as a client's retry would be — only
                // a request the client made safe to retry, since the guest
                // runs again (what it did outside its turn, a `fetch`, a
                // model call, happens twice). The view already says where
                // the actor went (the writer refused by it), or the move
                // is under way (routing waits for it).
                if resp.extensions().get::<Reroute>().is_some()
                    && rerouted < REROUTES
                    && retry_safe(&parts)
                {
                    rerouted += 1;
                    // Its turn may have run long: the time to follow the
                    // actor starts again.
                    deadline = tokio::time::Instant::now() + ROUTING_TIME;
                    s.node.metrics().cluster_forward("rerouted");
                    tracing::debug!(actor = %key, "its actor left while the request ran; routing it again");
                    continue;
                }
                return served(resp, cluster.node_id(), slot, epoch);
            }
            // A forwarded request is never forwarded again: the sender's
            // view is stale; it re-reads and retries.
            Route::Remote { epoch, .. } if expected.is_some() => {
                return wrong_owner(&key, epoch);
            }
            Route::Remote {
                epoch,
                node_id,
                advertise,
                ..
            } => {
                let mut headers = forwardable(&parts.headers);
                headers.insert(FORWARDED_EPOCH, HeaderValue::from(epoch));
                if let Some(v) = place_in
                    .as_deref()
                    .and_then(|r| HeaderValue::from_str(r).ok())
                {
                    headers.insert(placement::PLACE_IN, v);
                }
                if let Ok(v) = HeaderValue::from_str(cluster.node_id()) {
                    headers.insert(FORWARDED_BY, v);
                }
                let sent = send(
                    &s,
                    parts.method.clone(),
                    &advertise,
                    parts.uri.path_and_query().map_or("/", |p| p.as_str()),
                    headers,
                    body.clone(),
                );
                // An owner that stops answering (paused, cut off) held the
                // request for as long as its client waited, though its
                // slots failed over in seconds (found by a probe): once it
                // is no member, the request stops waiting for it.
                let sent = tokio::select! {
                    sent = sent => sent,
                    () = cluster.until_no_peer(|m| m.node_id == node_id) => {
                        s.node.metrics().cluster_forward("error");
                        if retry_safe(&parts) && rerouted < REROUTES {
                            rerouted += 1;
                            tracing::info!(actor = %key, owner = %node_id, "the owner left the cluster while the request waited; routing it where its slot fails over");
                            deadline = tokio::time::Instant::now() + ROUTING_TIME;
                            until_new_owner(&cluster, &key, &node_id, deadline).await;
                            continue;
                        }
                        tracing::warn!(actor = %key, owner = %node_id, "the owner left the cluster while the request waited");
                        let mut e = ApiError::new(
                            StatusCode::SERVICE_UNAVAILABLE,
                            "owner_left",
                            format!(
                                "actor {key} lives on node `{node_id}`, whose lease lapsed while \
                                 this request waited for it (it stopped, paused or was cut off); \
                                 whether the message ran there is unknown. Send it again with an \
                                 Idempotency-Key to have it applied once"
                            ),
                        );
                        e.retry_after = Some(1);
                        return e.into_response();
                    }
                };
                match sent {
                    // The owner's epoch differed (or its actor moved while
                    // the request ran there): re-read and route again. A
                    // 421 is between nodes; past the attempts the client
                    // gets the 503 below, with a retry hint.
                    Ok(resp) if resp.status() == StatusCode::MISDIRECTED_REQUEST => {
                        s.node.metrics().cluster_forward("stale");
                        if let Err(e) = cluster.refresh().await {
                            tracing::warn!(error = %e, "cannot re-read the slot table");
                        }
                    }
                    // The owner's edge refused credentials this node's edge
                    // accepted (not its actor, whose replies carry a message
                    // id; not a webhook's signature, which only the owner
                    // checks; not an expiry or a revocation, which the
                    // owner may just have seen first): the nodes' admin
                    // tokens differ (client tokens are signed with a key
                    // made from it). The client's were right; a 401 told it
                    // otherwise and named nobody.
                    Ok(resp)
                        if resp.status() == StatusCode::UNAUTHORIZED
                            && !resp.headers().contains_key("x-marmot-message-id")
                            && !path.starts_with("/v1/hooks/") =>
                    {
                        let (status, headers) = (resp.status(), forwardable(resp.headers()));
                        let body = resp.bytes().await.unwrap_or_default();
                        let code = serde_json::from_slice::<serde_json::Value>(&body)
                            .ok()
                            .and_then(|v| v["error"]["code"].as_str().map(str::to_owned));
                        if !matches!(code.as_deref(), Some("unauthorized" | "invalid_token")) {
                            s.node.metrics().cluster_forward("ok");
                            let mut out = Response::new(Body::from(body));
                            *out.status_mut() = status;
                            *out.headers_mut() = headers;
                            return out;
                        }
                        s.node.metrics().cluster_forward("error");
                        tracing::error!(actor = %key, owner = %node_id,
                            "the owner refused credentials this node accepted: the nodes' admin tokens differ");
                        return ApiError::new(
                            StatusCode::BAD_GATEWAY,
                            "peer_refused_credentials",
                            format!(
                                "actor {key} lives on node `{node_id}`, which refused the credentials \
                                 this node accepted: the nodes' admin tokens differ (every node of a \
                                 cluster needs the same `admin_token`)"
                            ),
                        )
                        .into_response();
                    }
                    Ok(resp) => {
                        s.node.metrics().cluster_forward("ok");
                        // A stream (events, a download) from an owner that
                        // stops answering ends once it is no member: its
                        // client resumes where the actor went. It stalled
                        // for good (found by a probe).
                        let (cluster, owner) = (cluster.clone(), node_id.clone());
                        let gone = async move {
                            cluster.until_no_peer(|m| m.node_id == owner).await;
                        };
                        return streamed(resp, gone);
                    }
                    // Nothing reached the owner, and the slot has changed
                    // hands since this node routed (a graceful stop hands
                    // its slots over, then exits): route it again.
                    Err(e) if e.is_connect() && moved_on(&cluster, &key, &node_id, epoch).await => {
                        s.node.metrics().cluster_forward("stale");
                        tracing::debug!(actor = %key, owner = %node_id, "the owner is gone and its slot moved on; routing again");
                    }
                    Err(e) => {
                        s.node.metrics().cluster_forward("error");
                        tracing::warn!(actor = %key, owner = %node_id, error = %e, "forwarding failed");
                        let mut e = ApiError::new(
                            StatusCode::BAD_GATEWAY,
                            "owner_unreachable",
                            format!(
                                "actor {key} lives on node `{node_id}`, which did not answer: {e}"
                            ),
                        );
                        // Its slot fails over to its backup if it is gone.
                        e.retry_after = Some(1);
                        return e.into_response();
                    }
                }
            }
            Route::Unavailable { why, .. } => return unavailable(&key, &why),
        }
    }
    unavailable(
        &key,
        "its slot kept changing while this node routed the request",
    )
}

/// Whether `key`'s slot is no longer `owner`'s at `epoch` once the view
/// is read again from etcd.
async fn moved_on(
    cluster: &crate::cluster::Cluster,
    key: &ActorKey,
    owner: &str,
    epoch: u64,
) -> bool {
    // An owner this node still sees as a member that is not leaving has
    // crashed, if anything: its slots move only after its lease, and
    // re-reading etcd for every request to them would not tell sooner.
    if !cluster.leaving_or_gone(owner) {
        return false;
    }
    if let Err(e) = cluster.refresh().await {
        tracing::warn!(error = %e, "cannot re-read the slot table");
        return false;
    }
    !matches!(cluster.route(key), Route::Remote { node_id, epoch: e, .. } if node_id == owner && e == epoch)
}

/// Wait (until `deadline` at most) for `key`'s slot to have an owner
/// other than `gone`, a node that left: its backup takes the slot over
/// once the lease lapses, and routing meanwhile answers 503.
async fn until_new_owner(
    cluster: &crate::cluster::Cluster,
    key: &ActorKey,
    gone: &str,
    deadline: tokio::time::Instant,
) {
    const CHECK: Duration = Duration::from_millis(250);
    while tokio::time::Instant::now() < deadline {
        match cluster.route(key) {
            Route::Unavailable { .. } => {}
            Route::Remote { node_id, .. } if node_id == gone => {}
            _ => return,
        }
        let next = deadline.min(tokio::time::Instant::now() + CHECK);
        let _ = tokio::time::timeout_at(next, cluster.changed()).await;
    }
}

/// Whether the client made `parts` safe to send again: a method HTTP
/// calls idempotent, or an `Idempotency-Key` (whose first reply a repeat
/// gets; here nothing of the first attempt was applied).
fn retry_safe(parts: &axum::http::request::Parts) -> bool {
    matches!(
        parts.method,
        Method::GET | Method::HEAD | Method::PUT | Method::DELETE | Method::OPTIONS
    ) || parts.headers.contains_key("idempotency-key")
}

pub(super) fn too_large() -> Response {
    ApiError::new(
        StatusCode::PAYLOAD_TOO_LARGE,
        "payload_too_large",
        "request body exceeds the size limit",
    )
    .into_response()
}

/// Headers a forwarded request keeps: everything but hop-by-hop ones.
pub(super) fn forwardable(headers: &HeaderMap) -> HeaderMap {
    const HOP: [HeaderName; 6] = [
        header::CONNECTION,
        header::HOST,
        header::CONTENT_LENGTH,
        header::TRANSFER_ENCODING,
        header::TE,
        header::UPGRADE,
    ];
    headers
        .iter()
        .filter(|(k, _)| !HOP.contains(k) && k.as_str() != "keep-alive")
        .map(|(k, v)| (k.clone(), v.clone()))
        .collect()
}

/// Send a request for `path` (its exact target, see `target.rs`) to the
/// node at `base`.
pub(super) async fn send(
    s: &AppState,
    method: Method,
    base: &str,
    path: &str,
    mut headers: HeaderMap,
    body: axum::body::Bytes,
) -> reqwest::Result<reqwest::Response> {
    let url = s.targets.url(&method, base, path, &mut headers);
    s.peers
        .request(method, url)
        .headers(headers)
        .body(body)
        .send()
        .await
}

/// The owner's response, streamed back as it comes, until `gone`.
fn streamed(
    resp: reqwest::Response,
    gone: impl std::future::Future<Output = ()> + Send + 'static,
) -> Response {
    use futures::StreamExt as _;
    let mut out = Response::builder().status(resp.status());
    if let Some(h) = out.headers_mut() {
        *h = forwardable(resp.headers());
        // The body passes through whole: its length too (a file forwarded
        // came chunked, and a HEAD told no size).
        if let Some(n) = resp.headers().get(header::CONTENT_LENGTH) {
            h.insert(header::CONTENT_LENGTH, n.clone());
        }
    }
    let body = resp.bytes_stream().take_until(Box::pin(gone));
    out.body(Body::from_stream(body)).unwrap_or_else(|e| {
        ApiError::new(StatusCode::BAD_GATEWAY, "owner_response", e.to_string()).into_response()
    })
}

/// `resp`, naming who served it, at which epoch of which slot (clients and
/// the fault tests' history checker see the committer).
fn served(mut resp: Response, node: &str, slot: u32, epoch: u64) -> Response {
    let h = resp.headers_mut();
    if let Ok(v) = HeaderValue::from_str(node) {
        h.insert(SERVED_BY, v);
    }
    h.insert(SERVED_AT, HeaderValue::from(epoch));
    h.insert(SERVED_SLOT, HeaderValue::from(slot));
    resp
}

fn wrong_owner(key: &ActorKey, epoch: u64) -> Response {
    ApiError::new(
        StatusCode::MISDIRECTED_REQUEST,
        "wrong_owner",
        format!("this node does not own actor {key} at the epoch the sender expected (its epoch: {epoch}); re-read the slot table and retry"),
    )
    .into_response()
}

fn unavailable(key: &ActorKey, why: &str) -> Response {
    let mut e = ApiError::new(
        StatusCode::SERVICE_UNAVAILABLE,
        "slot_unavailable",
        format!("actor {key} cannot be served now: {why}"),
    );
    e.retry_after = Some(1);
    e.into_response()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn actor_paths_name_their_actor() {
        let k = |p: &str| actor_of(p).map(|k| k.to_string());
        assert_eq!(k("/v1/actors/kit/alice").as_deref(), Some("kit/alice"));
        assert_eq!(
            k("/v1/actors/kit/al%20ice/events").as_deref(),
            Some("kit/al ice")
        );
        assert_eq!(k("/v1/hooks/kit/bob/github").as_deref(), Some("kit/bob"));
        assert_eq!(k("/v1/actors/kit"), None);
        assert_eq!(k("/v1/types/kit"), None);
    }
}
