//! `/v1/subscriptions` and `/v1/deliveries`: outbound webhooks (see
//! [`crate::webhooks::outbound`]).

use axum::body::Bytes;
use axum::extract::State;
use axum::extract::rejection::BytesRejection;
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use serde::Deserialize;

use super::extract::{Page, json_object};
use super::{ApiError, AppState, Path, Query};
use crate::clock::now_ms;
use crate::storage::WriteOp;
use crate::storage::schema::{DeliveryStatus, delivery_seq};
use crate::webhooks::outbound::{self, SubscriptionSpec};

fn subscription_name(name: &str) -> Result<(), ApiError> {
    crate::ids::validate_subscription_name(name)
        .map_err(|e| ApiError::bad_request("invalid_subscription_name", e.to_string()))
}

/// `PUT /v1/subscriptions/{name}`: create (201) or replace (200). A
/// generated secret is returned once, here.
pub(super) async fn put(
    State(s): State<AppState>,
    Path(name): Path<String>,
    headers: axum::http::HeaderMap,
    body: Result<Bytes, BytesRejection>,
) -> Result<Response, ApiError> {
    subscription_name(&name)?;
    let body = body?;
    let mut spec: SubscriptionSpec = json_object(&body)
        .map_err(|e| ApiError::bad_request("invalid_subscription", e.to_string()))?;
    // A replace that names no secret keeps the one the receiver has (it
    // used to get a new one, and every delivery then failed to verify),
    // and the subscription keeps its creation time.
    let existing = s
        .node
        .storage()
        .subscriptions()
        .snapshot()
        .get(&name)
        .cloned();
    if spec.secret.is_none()
        && let Some(old) = &existing
    {
        spec.secret = Some(old.secret.clone());
    }
    let (mut record, generated) = spec
        .into_record(now_ms())
        .map_err(|e| ApiError::bad_request("invalid_subscription", e))?;
    match &existing {
        Some(old) => record.created_at_ms = old.created_at_ms,
        // New here: the creation time the node that took the request gave
        // it, when it fans out to this one.
        None => {
            if let Some(t) = headers
                .get(super::cluster::SUBSCRIPTION_CREATED_AT)
                .and_then(|v| v.to_str().ok())
                .and_then(|v| v.parse().ok())
            {
                record.created_at_ms = t;
            }
        }
    }
    let mut out = outbound::subscription_json(&name, &record);
    let n = name.clone();
    let created = s
        .node
        .storage()
        .writer()
        .call(|done| WriteOp::PutSubscription {
            name: n,
            record,
            done,
        })
        .await?;
    if let Some(secret) = generated {
        out["secret"] = secret.into();
    }
    tracing::info!(subscription = %name, created, "webhook subscription saved");
    Ok(super::put_reply(created, out))
}

pub(super) async fn list(State(s): State<AppState>) -> Result<Response, ApiError> {
    let subs = s.node.storage().subscriptions().snapshot();
    let items: Vec<_> = subs
        .iter()
        .map(|(n, r)| outbound::subscription_json(n, r))
        .collect();
    Ok(axum::Json(serde_json::json!({ "subscriptions": items })).into_response())
}

pub(super) async fn get(
    State(s): State<AppState>,
    Path(name): Path<String>,
) -> Result<Response, ApiError> {
    subscription_name(&name)?;
    let subs = s.node.storage().subscriptions().snapshot();
    match subs.get(&name) {
        Some(r) => Ok(axum::Json(outbound::subscription_json(&name, r)).into_response()),
        None => Err(ApiError::not_found(
            "subscription_not_found",
            format!("no subscription `{name}`"),
        )),
    }
}

pub(super) async fn delete(
    State(s): State<AppState>,
    Path(name): Path<String>,
) -> Result<Response, ApiError> {
    subscription_name(&name)?;
    let n = name.clone();
    let existed = s
        .node
        .storage()
        .writer()
        .call(|done| WriteOp::DeleteSubscription { name: n, done })
        .await?;
    if !existed {
        return Err(ApiError::not_found(
            "subscription_not_found",
            format!("no subscription `{name}`"),
        ));
    }
    Ok(axum::Json(serde_json::json!({ "deleted": true })).into_response())
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct DeliveryParams {
    /// `pending`, `failed`, `dead`, or absent for all.
    #[serde(default)]
    status: Option<String>,
    #[serde(default)]
    subscription: Option<String>,
    /// A delivery id to continue after.
    #[serde(default)]
    after: Option<String>,
    #[serde(default)]
    limit: Option<usize>,
}

/// `GET /v1/deliveries`: deliveries not yet delivered, oldest first.
pub(super) async fn deliveries(
    State(s): State<AppState>,
    Query(q): Query<DeliveryParams>,
) -> Result<Response, ApiError> {
    if let Some(st) = &q.status
        && !["pending", "failed", "dead"].contains(&st.as_str())
    {
        return Err(ApiError::bad_request(
            "invalid_status",
            "status must be pending, failed or dead",
        ));
    }
    let after = match &q.after {
        None => 0,
        Some(id) => delivery_seq(id).ok_or_else(|| {
            ApiError::bad_request("invalid_cursor", "after must be a delivery id")
        })?,
    };
    let limit = Page::LIST.size(q.limit)?;
    // In a cluster, a node lists the rows of the slots it owns or backs up
    // (the backup's copies say what became of each row). A copy it kept of
    // a slot it has neither since a failover is not listed: the slot's
    // nodes have sent those rows, which showed here as failed for good,
    // and could not be retried anywhere (found by a cluster probe).
    let cluster = s.node.cluster();
    let held = |d: &crate::storage::schema::DeliveryRecord| {
        cluster.is_none_or(|c| {
            crate::ids::ActorKey::new(&d.actor_type, &d.actor_id)
                .is_ok_and(|k| c.holds(c.slot_of(&k)))
        })
    };
    let (rows, next) = s.node.storage().reader()?.deliveries(after, limit, |d| {
        q.status.as_deref().is_none_or(|st| d.label() == st)
            && q.subscription
                .as_deref()
                .is_none_or(|n| d.subscription == n)
            && held(d)
    })?;
    // An opaque cursor: only its seq part matters.
    let next_after = next.map(|seq| format!("msg_{seq:016x}{:016x}", 0));
    let items: Vec<_> = rows
        .iter()
        .map(|(_, d)| outbound::delivery_json(d))
        .collect();
    Ok(
        axum::Json(serde_json::json!({ "deliveries": items, "next_after": next_after }))
            .into_response(),
    )
}

/// `POST /v1/deliveries/{id}/retry`: attempt again now, with a fresh
/// schedule (replay from the dead-letter list, or hurry a retry).
pub(super) async fn retry(
    State(s): State<AppState>,
    Path(id): Path<String>,
) -> Result<Response, ApiError> {
    let not_found = || ApiError::not_found("delivery_not_found", format!("no delivery `{id}`"));
    delivery_seq(&id).ok_or_else(not_found)?;
    // A delivery goes only to the subscription it was queued for: refused
    // (and kept) if that no longer wants it (a replace narrowed its filter),
    // or was deleted meanwhile.
    let queued = s
        .node
        .storage()
        .reader()?
        .delivery_by_id(&id)?
        .ok_or_else(not_found)?;
    let subs = s.node.storage().subscriptions().snapshot();
    if !subs
        .get(&queued.subscription)
        .is_some_and(|sub| sub.wants(&queued))
    {
        return Err(ApiError::new(
            StatusCode::CONFLICT,
            "subscription_gone",
            format!(
                "delivery `{id}` was queued for subscription `{}`, which was deleted or \
                 no longer wants it (its filter changed): there is nowhere to retry it to",
                queued.subscription
            ),
        ));
    }
    let i = id.clone();
    let rec = s
        .node
        .storage()
        .writer()
        .call(|done| WriteOp::RetryDelivery { id: i, done })
        .await?
        .ok_or_else(not_found)?;
    debug_assert_eq!(rec.status, DeliveryStatus::Pending);
    tracing::info!(webhook_id = %id, "webhook delivery queued again by request");
    Ok((
        StatusCode::ACCEPTED,
        axum::Json(outbound::delivery_json(&rec)),
    )
        .into_response())
}
