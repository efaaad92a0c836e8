//! Agent runs through the API: an input starts (or queues) a run and the
//! caller waits for its end, or is told what it waits for; a run is
//! cancelled by its id. What a client may send an agent is checked here,
//! before it is stored. The waiting is the node's (`node/runs.rs`).

use axum::body::Bytes;
use axum::extract::State;
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};

use super::{ApiError, AppState, Path};
use crate::node::RunWaitError;

/// What a client may send an agent.
pub(super) enum AgentRequest {
    /// `{"input": "…"}`: start a run, or queue behind the active one.
    Input,
    /// `{"cancel": "<run_id>"}`: a turn of the harness answers it.
    Cancel,
}

/// Read a client's message to an agent; anything else is refused here,
/// before it is stored (the harness would only answer it with an error).
pub(super) fn agent_request(body: &[u8]) -> Result<AgentRequest, ApiError> {
    let refused = |why: &str| {
        ApiError::bad_request(
            "invalid_input",
            format!(
                "{why}: send {{\"input\": \"…\"}} to start or continue a conversation, \
                 or {{\"cancel\": \"<run_id>\"}}"
            ),
        )
    };
    let m = match serde_json::from_slice(body) {
        Ok(serde_json::Value::Object(m)) => m,
        Ok(_) => return Err(refused("the message is not a JSON object")),
        Err(e) => return Err(refused(&format!("the message is not JSON ({e})"))),
    };
    // The harness's own continuations carry these; a client's message
    // with them was taken for a continuation and dropped.
    if let Some(k) = ["_agent_step", "_agent_exec"]
        .into_iter()
        .find(|k| m.contains_key(*k))
    {
        return Err(refused(&format!("`{k}` is the harness's own field")));
    }
    match (m.get("input"), m.get("cancel")) {
        (Some(serde_json::Value::String(_)), _) => Ok(AgentRequest::Input),
        (Some(_), _) => Err(refused("`input` must be a string")),
        (None, Some(serde_json::Value::String(_))) => Ok(AgentRequest::Cancel),
        (None, Some(_)) => Err(refused("`cancel` must be a run id, a string")),
        (None, None) => Err(refused("the message has neither `input` nor `cancel`")),
    }
}

/// An agent's input: queued durably (the message id is the run id); with
/// `wait`, answered when the run ends.
pub(super) async fn run(
    s: &AppState,
    key: &crate::ids::ActorKey,
    body: Bytes,
    idempotency_key: Option<String>,
    wait: bool,
) -> Result<Response, ApiError> {
    let after = s.node.actor_info(key)?.map_or(0, |i| i.last_event_seq);
    let (run_id, duplicate) = s.node.start_run(key, body, idempotency_key.clone()).await?;
    if !wait {
        return Ok((
            StatusCode::ACCEPTED,
            axum::Json(serde_json::json!({ "run_id": run_id, "message_id": run_id })),
        )
            .into_response());
    }
    // A repeated Idempotency-Key names a run that may have ended already
    // (even so long ago that its end left the log).
    let after = if duplicate { 0 } else { after };
    let known = if duplicate {
        s.node.run_state(key, &run_id, idempotency_key.as_deref())?
    } else {
        crate::node::RunState::Going
    };
    let end = match s.node.wait_run(key, &run_id, after, known).await {
        Ok(end) => end,
        // The run is queued durably and goes on; only the wait for its end
        // cannot be had here. Said so, with its id: a 503 told the client
        // the input failed, and its plain retry started a second run (a
        // probe, with every stream slot taken).
        Err(e @ (RunWaitError::ShuttingDown | RunWaitError::TooManyStreams(_))) => {
            let body = serde_json::json!({ "run_id": run_id, "message_id": run_id,
                "status": "accepted",
                "detail": format!("the run is queued and goes on, but this node cannot wait \
                    for its end now ({e}): follow it in the actor's events, or repeat the \
                    request with the same Idempotency-Key to wait again") });
            return Ok((StatusCode::ACCEPTED, axum::Json(body)).into_response());
        }
        Err(RunWaitError::Turn(e)) => return Err(e.into()),
        Err(RunWaitError::Storage(e)) => return Err(e.into()),
        Err(e @ RunWaitError::Deleted) => {
            return Err(ApiError::new(
                StatusCode::GONE,
                "actor_deleted",
                e.to_string(),
            ));
        }
        Err(e @ RunWaitError::OutcomeExpired(_)) => {
            return Err(ApiError::new(
                StatusCode::GONE,
                "run_outcome_expired",
                e.to_string(),
            ));
        }
    };
    let d = &end.data;
    if end.paused() {
        // Waiting for a person: say for what, rather than hold the request
        // open until someone answers (the run goes on; a repeat with the
        // same Idempotency-Key waits again).
        let body = serde_json::json!({ "run_id": run_id, "status": "waiting",
            "waiting_for": waiting_for(&end.kind, d) });
        return Ok((StatusCode::ACCEPTED, axum::Json(body)).into_response());
    }
    if end.queued_behind_a_wait() {
        // Queued behind a run that waits for a person: as long as that.
        let ahead = &d["behind"];
        let kind = ahead["kind"].as_str().unwrap_or_default();
        let body = serde_json::json!({ "run_id": run_id, "status": "queued",
            "behind": { "run_id": ahead["data"]["run_id"],
                "waiting_for": waiting_for(kind, &ahead["data"]) } });
        return Ok((StatusCode::ACCEPTED, axum::Json(body)).into_response());
    }
    let (status, body) = match end.kind.as_str() {
        "run_finished" => (
            StatusCode::OK,
            serde_json::json!({ "run_id": run_id, "output": d["output"], "usage": d["usage"], "steps": d["steps"] }),
        ),
        "turn_failed" => (
            StatusCode::BAD_GATEWAY,
            serde_json::json!({ "run_id": run_id, "error": { "code": "run_failed",
                "reason": "turn_failed", "message": d["error"]["message"] } }),
        ),
        "budget_exceeded" => (
            StatusCode::PAYMENT_REQUIRED,
            serde_json::json!({ "run_id": run_id, "usage": d["usage"], "error": {
                "code": "budget_exceeded",
                "message": d["error"].as_str().unwrap_or("the budget is spent") } }),
        ),
        _ => {
            let cancelled = d["reason"] == "cancelled";
            (
                if cancelled {
                    StatusCode::CONFLICT
                } else {
                    StatusCode::BAD_GATEWAY
                },
                serde_json::json!({ "run_id": run_id, "usage": d["usage"], "error": {
                    "code": if cancelled { "run_cancelled" } else { "run_failed" },
                    "reason": d["reason"], "message": d["error"] } }),
            )
        }
    };
    Ok((status, axum::Json(body)).into_response())
}

/// What a run waits for, from the event that asked (`kind`, `d`).
fn waiting_for(kind: &str, d: &serde_json::Value) -> serde_json::Value {
    let waits_for = match kind {
        "approval_requested" => "approval",
        "tool_uncertain" => "confirmation",
        _ => "client_tool",
    };
    serde_json::json!({ "kind": waits_for, "input_id": d["input_id"],
        "tool": d["name"], "call_id": d["call_id"], "arguments": d["arguments"] })
}

/// `POST /v1/actors/{type}/{id}/runs/{run_id}/cancel`: stop an agent's run
/// at its next step (a step in progress finishes first).
pub(super) async fn cancel_run(
    State(s): State<AppState>,
    Path((ty, id, run_id)): Path<(String, String, String)>,
) -> Result<Response, ApiError> {
    let key = crate::ids::ActorKey::new(&ty, &id)?;
    if s.node.catalog().get(&ty).is_none() {
        return Err(ApiError::not_found(
            "unknown_type",
            format!("unknown actor type `{ty}`"),
        ));
    }
    if !s.node.is_agent(&ty) {
        return Err(ApiError::new(
            StatusCode::CONFLICT,
            "not_an_agent",
            format!("type `{ty}` is not an agent; runs belong to types of kind `agent`"),
        ));
    }
    if run_id.is_empty() || run_id.len() > 64 || !run_id.bytes().all(|b| b.is_ascii_alphanumeric())
    {
        return Err(ApiError::bad_request(
            "invalid_run_id",
            "a run id is the message id that started it",
        ));
    }
    // No actor, no run: and the cancel would make the actor.
    if s.node.actor_info(&key)?.is_none() {
        return Err(ApiError::actor_not_found(&key));
    }
    // A run that cannot end any more (it did, or it never was) is said so;
    // a cancel that races the run's end is answered 202 and does nothing.
    if !s.node.run_is_live(&key, &run_id, None)? {
        let ended = s.node.run_end(&key, &run_id).map_err(|e| match e {
            crate::node::RunWaitError::Storage(e) => ApiError::from(e),
            e => ApiError::new(StatusCode::INTERNAL_SERVER_ERROR, "internal", e.to_string()),
        })?;
        return Err(match ended {
            Some(kind) => ApiError::new(
                StatusCode::CONFLICT,
                "run_ended",
                format!("run `{run_id}` of {key} has already ended ({kind})"),
            ),
            None => ApiError::not_found(
                "run_not_found",
                format!("{key} has no run `{run_id}` that could be cancelled"),
            ),
        });
    }
    let body = serde_json::to_vec(&serde_json::json!({ "cancel": run_id })).expect("JSON encodes");
    s.node
        .enqueue(&key, body.into(), Some("application/json".into()), None)
        .await?;
    Ok((
        StatusCode::ACCEPTED,
        axum::Json(serde_json::json!({ "run_id": run_id, "cancelling": true })),
    )
        .into_response())
}
