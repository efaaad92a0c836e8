//! `GET /v1/actors/{type}/{id}/alarms`: an actor's alarms, a page at a
//! time.

use axum::extract::State;
use axum::response::{IntoResponse, Response};
use serde::Deserialize;

use super::actors::json_or_base64;
use super::extract::{ActorPath, Page};
use super::{ApiError, AppState, Query};
use crate::storage::schema::AlarmSchedule;

/// `?after=NAME&limit=N` of the alarm listing.
#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct AlarmParams {
    /// The last name of the previous page.
    #[serde(default)]
    after: Option<String>,
    #[serde(default)]
    limit: Option<usize>,
}

/// The most bytes of stored alarms one page of the listing holds (at least
/// one alarm): 1,000 alarms with 64 KiB payloads made a 65 MB answer, built
/// whole in memory for each reader (a probe).
const ALARM_PAGE_BYTES: usize = 8 << 20;

/// `GET …/alarms`: an actor's alarms by name, a page at a time.
pub(super) async fn list(
    State(s): State<AppState>,
    ActorPath(key): ActorPath,
    Query(q): Query<AlarmParams>,
) -> Result<Response, ApiError> {
    let limit = Page::ALARMS.size(q.limit)?;
    let after = q.after.as_deref().unwrap_or("");
    let Some((alarms, more)) = s.node.alarms_page(&key, after, limit, ALARM_PAGE_BYTES)? else {
        return Err(ApiError::actor_not_found(&key));
    };
    /// An alarm as the API shows it (its payload as stored, at any depth;
    /// keys in the order they always had).
    #[derive(serde::Serialize)]
    struct AlarmJson<'a> {
        attempts: u32,
        name: &'a str,
        next_due_ms: u64,
        #[serde(skip_serializing_if = "Option::is_none")]
        payload: Option<&'a serde_json::value::RawValue>,
        #[serde(skip_serializing_if = "Option::is_none")]
        payload_base64: Option<String>,
        schedule: serde_json::Value,
        set_at_ms: u64,
    }
    #[derive(serde::Serialize)]
    struct Alarms<'a> {
        alarms: Vec<AlarmJson<'a>>,
        #[serde(skip_serializing_if = "Option::is_none")]
        next_after: Option<&'a str>,
    }
    let shown: Vec<_> = alarms
        .iter()
        .map(|(name, a)| {
            let schedule = match &a.schedule {
                AlarmSchedule::At(t) => serde_json::json!({ "at": t }),
                AlarmSchedule::After(d) => serde_json::json!({ "after": d }),
                AlarmSchedule::Cron { expr, tz } => serde_json::json!({ "cron": expr, "tz": tz }),
            };
            let (payload, payload_base64) = json_or_base64(&a.payload);
            AlarmJson {
                attempts: a.attempts,
                name,
                next_due_ms: a.next_due_ms,
                payload,
                payload_base64,
                schedule,
                set_at_ms: a.set_at_ms,
            }
        })
        .collect();
    let page = Alarms {
        alarms: shown,
        next_after: more
            .then(|| alarms.last().map(|(name, _)| name.as_str()))
            .flatten(),
    };
    Ok(axum::Json(page).into_response())
}
