//! Agent runs through the API: an input is queued durably (its message id
//! is the run id) and the caller waits for the event that ends the run.
//! The run itself is the agent component's; a caller that goes away does
//! not stop it.

use bytes::Bytes;
use serde_json::Value;

use super::Node;
use crate::actor::TurnError;
use crate::agents::RUN_END_EVENTS;
use crate::ids::ActorKey;
use crate::storage::schema::CodeKind;
use crate::storage::{EnqueueOutcome, Reader, StorageError};

/// How a run ended, or that it waits for a person: the event's kind and
/// data.
#[derive(Debug, Clone)]
pub struct RunEnd {
    /// `run_finished`, `run_failed` or `budget_exceeded`; `turn_failed`
    /// when the input's own turn failed; `approval_requested`,
    /// `tool_call` (of a client tool) or `tool_uncertain` while it waits
    /// for an answer ([`Self::paused`]).
    pub kind: String,
    /// The event's data (`run_id`, `output`, `usage`, `error`, `input_id`…).
    pub data: Value,
}

impl RunEnd {
    /// Whether the run did not end but waits for a person.
    pub fn paused(&self) -> bool {
        asks_a_person(&self.kind, &self.data)
    }

    /// Whether the run has not started, queued behind one that waits for a
    /// person (`data.behind`: that run's `{kind, data}` as [`Self::paused`]
    /// would have them).
    pub fn queued_behind_a_wait(&self) -> bool {
        self.kind == "input_queued"
    }
}

/// Where a run stands, by the agent's committed state.
#[derive(Debug, Clone)]
pub enum RunState {
    /// Its input is queued, or it runs.
    Going,
    /// It waits for a person: what the event that asked said.
    Waiting(RunEnd),
    /// It ended (or never was).
    Ended,
}

/// Why waiting for a run stopped without its end.
#[derive(Debug, thiserror::Error)]
pub enum RunWaitError {
    /// Queueing the input failed.
    #[error(transparent)]
    Turn(#[from] TurnError),
    /// The actor was deleted while the run went on.
    #[error("the actor was deleted before the run ended")]
    Deleted,
    /// The node is shutting down (the run resumes when it is back).
    #[error("the node is shutting down; the run resumes when it is back")]
    ShuttingDown,
    /// Waiting needs an event-stream slot and none is free.
    #[error(transparent)]
    TooManyStreams(#[from] crate::streams::TooManyStreams),
    /// The run ended so long ago that its end event left the log.
    #[error(
        "run `{0}` ended, and its outcome is no longer in the actor's event log \
         (retention dropped it); the run is not repeated"
    )]
    OutcomeExpired(String),
    /// Reading events failed.
    #[error(transparent)]
    Storage(#[from] crate::storage::StorageError),
}

/// Events read per page while waiting.
const PAGE: usize = 256;
/// And at most this many bytes of them at once (see `Node::events`).
const PAGE_BYTES: usize = 1 << 20;

/// A state value of the agent, as JSON (`null` when absent or not JSON).
fn state_json(r: &Reader, num: u64, key: &str) -> Result<Value, StorageError> {
    Ok(r.state(num, key)?
        .and_then(|v| serde_json::from_slice(&v).ok())
        .unwrap_or(Value::Null))
}

/// What the agent's `active` run (its `agent/run` record) waits for, if it
/// waits for a person: as the event that asked would say it.
fn waiting_on(r: &Reader, num: u64, active: &Value) -> Result<Option<RunEnd>, StorageError> {
    use crate::agents::{TRANSCRIPT_NEXT_KEY, TRANSCRIPT_PREFIX, WAITS_PREFIX};
    if active["waiting"] != true {
        return Ok(None);
    }
    let run_id = &active["run_id"];
    for (k, v) in r.state_range(num, WAITS_PREFIX, None, INBOX_LOOK)? {
        let w: Value = serde_json::from_slice(&v).unwrap_or(Value::Null);
        if w["run_id"] != *run_id {
            continue;
        }
        let kind = match w["for"].as_str() {
            Some("approval") => "approval_requested",
            Some("confirm") => "tool_uncertain",
            _ => "tool_call",
        };
        let input_id = k.strip_prefix(WAITS_PREFIX).unwrap_or(&k);
        // The call it is about: in the transcript's last messages (the run
        // waits on a call of its last step).
        let next = state_json(r, num, TRANSCRIPT_NEXT_KEY)?
            .as_u64()
            .unwrap_or(0);
        let mut call = Value::Null;
        for n in (next.saturating_sub(CALL_LOOK)..next).rev() {
            let m = state_json(r, num, &format!("{TRANSCRIPT_PREFIX}{n:012}"))?;
            if let Some(c) = m["tool_calls"]
                .as_array()
                .and_then(|cs| cs.iter().find(|c| c["id"] == w["call_id"]))
            {
                call = c.clone();
                break;
            }
        }
        let data = serde_json::json!({ "run_id": run_id, "input_id": input_id,
            "call_id": w["call_id"], "client": kind == "tool_call",
            "name": call["name"], "arguments": call["arguments"] });
        return Ok(Some(RunEnd {
            kind: kind.to_owned(),
            data,
        }));
    }
    Ok(None)
}

/// The agent's events of a run's progress (each carries `run_id`): any of
/// them after a request to a person means the run went on.
const RUN_EVENTS: &[&str] = &[
    "input_queued",
    "run_started",
    "model_step",
    "tool_call",
    "tool_result",
    "approval_requested",
    "tool_uncertain",
    "tool_arguments_changed",
    "model_retry",
    "step_retry",
    "compacted",
];

/// Whether the agent's event `kind` (`data`) asks a person for something
/// the run waits on: an approval, a client tool's result, or whether a
/// call cut off by a crash took effect.
fn asks_a_person(kind: &str, data: &Value) -> bool {
    match kind {
        "approval_requested" | "tool_uncertain" => true,
        "tool_call" => data["client"] == true,
        _ => false,
    }
}
/// Inbox rows looked through for a run's input.
const INBOX_LOOK: usize = 256;
/// Transcript messages looked through, newest first, for the call a run
/// waits on.
const CALL_LOOK: u64 = 16;

impl Node {
    /// Whether `ty` is an agent type.
    pub fn is_agent(&self, ty: &str) -> bool {
        self.catalog
            .get(ty)
            .is_some_and(|t| t.latest_kind() == CodeKind::Agent)
    }

    /// Queue `body` (`{"input": …}`) for the agent `key`; the run id.
    pub async fn start_run(
        &self,
        key: &ActorKey,
        body: Bytes,
        idempotency_key: Option<String>,
    ) -> Result<(String, bool), TurnError> {
        let outcome = self
            .enqueue(key, body, Some("application/json".into()), idempotency_key)
            .await?;
        Ok(match outcome {
            EnqueueOutcome::Queued { message_id } => (message_id, false),
            EnqueueOutcome::Duplicate { message_id, .. } => (message_id, true),
        })
    }

    /// Whether run `run_id` of `key` may still end: its input (queued
    /// under `idempotency_key`) has not run yet, or the agent holds it as
    /// its active or a queued run. Read before the log is searched for the
    /// run's end: a run that was not live then has its end in the log,
    /// unless retention dropped it.
    pub fn run_is_live(
        &self,
        key: &ActorKey,
        run_id: &str,
        idempotency_key: Option<&str>,
    ) -> Result<bool, crate::storage::StorageError> {
        Ok(!matches!(
            self.run_state(key, run_id, idempotency_key)?,
            RunState::Ended
        ))
    }

    /// Where run `run_id` of `key` stands by the agent's committed state
    /// (see [`Self::run_is_live`]); waiting for a person, with what for,
    /// as the event that asked would say it (which retention may have
    /// dropped from the log).
    pub fn run_state(
        &self,
        key: &ActorKey,
        run_id: &str,
        idempotency_key: Option<&str>,
    ) -> Result<RunState, crate::storage::StorageError> {
        use crate::agents::{ACTIVE_RUN_KEY, QUEUED_RUNS_KEY};
        use crate::storage::schema::IdemOutcome;
        let r = self.storage.reader()?;
        let Some(rec) = r.actor(key)? else {
            return Ok(RunState::Ended);
        };
        if let Some(k) = idempotency_key
            && let Some(i) = r.idempotency(rec.num, k)?
            && matches!(i.outcome, IdemOutcome::Queued { .. })
        {
            return Ok(RunState::Going);
        }
        // The input still in the inbox (a long inbox is taken as holding
        // it: this never says "ended" of a run that may still start).
        let inbox = r.inbox(rec.num, 0, INBOX_LOOK)?;
        if inbox.len() == INBOX_LOOK || inbox.iter().any(|(_, m)| m.message_id == run_id) {
            return Ok(RunState::Going);
        }
        let active = state_json(&r, rec.num, ACTIVE_RUN_KEY)?;
        if active["run_id"] == run_id {
            return Ok(match waiting_on(&r, rec.num, &active)? {
                Some(w) => RunState::Waiting(w),
                None => RunState::Going,
            });
        }
        let queued = state_json(&r, rec.num, QUEUED_RUNS_KEY)?
            .as_array()
            .is_some_and(|q| q.iter().any(|r| r["run_id"] == run_id));
        Ok(if queued {
            RunState::Going
        } else {
            RunState::Ended
        })
    }

    /// What the agent's active run waits for, if it waits for a person.
    fn active_wait(&self, key: &ActorKey) -> Result<Option<RunEnd>, StorageError> {
        let r = self.storage.reader()?;
        let Some(rec) = r.actor(key)? else {
            return Ok(None);
        };
        let active = state_json(&r, rec.num, crate::agents::ACTIVE_RUN_KEY)?;
        waiting_on(&r, rec.num, &active)
    }

    /// The kind of the event that ended run `run_id` of `key` (or
    /// `turn_failed`, when its input's own turn failed), if the kept log
    /// has it.
    pub fn run_end(&self, key: &ActorKey, run_id: &str) -> Result<Option<String>, RunWaitError> {
        let mut after = 0;
        while let Some(page) = self.events(key, after, PAGE, PAGE_BYTES)? {
            if page.is_empty() {
                break;
            }
            for (seq, e) in page {
                after = seq;
                let field = if RUN_END_EVENTS.contains(&e.kind.as_str()) {
                    "run_id"
                } else if e.kind == "turn_failed" {
                    "message_id"
                } else {
                    continue;
                };
                let data: Value = serde_json::from_slice(&e.data).unwrap_or(Value::Null);
                if data[field] == run_id {
                    return Ok(Some(e.kind));
                }
            }
        }
        Ok(None)
    }

    /// Wait for the end of run `run_id` of `key`, or for it to wait for a
    /// person, reading events after `after` (0: the whole kept log).
    /// `known` is where the run stood before the call ([`Self::run_state`];
    /// `Going` when unknown): if it had ended, or waited for a person, and
    /// the kept log has nothing of it, retention dropped what said so, and
    /// waiting would never end (a repeat of an old `Idempotency-Key` hung
    /// forever): the end is a 410, the wait is answered from the state.
    ///
    /// A run that asks a person (an approval, a client tool's result, a
    /// confirmation after a crash) is answered as paused ([`RunEnd::paused`])
    /// once the log shows nothing of the run after the request: a waiting
    /// caller learns what to answer instead of holding a request open
    /// until someone does (a plain client or a proxy gave up first, never
    /// told why).
    pub async fn wait_run(
        &self,
        key: &ActorKey,
        run_id: &str,
        after: u64,
        known: RunState,
    ) -> Result<RunEnd, RunWaitError> {
        // Subscribe before reading, so a commit in between wakes us.
        let mut sub = self.event_bus().subscribe(key)?;
        let mut after = after;
        let mut existed = false;
        // The run's last request to a person, while nothing of the run
        // has followed it; and whether the log shows anything of it.
        let mut paused: Option<RunEnd> = None;
        let mut seen = false;
        // The input is queued behind another run (and has not started).
        let mut queued = false;
        loop {
            sub.changed.borrow_and_update();
            match self.events(key, after, PAGE, PAGE_BYTES)? {
                Some(page) => {
                    existed = true;
                    // Read on until a page comes back empty: one may be
                    // short of `PAGE` for its bytes.
                    let full = !page.is_empty();
                    for (seq, e) in page {
                        after = seq;
                        let end = RUN_END_EVENTS.contains(&e.kind.as_str());
                        // The failure of the input turn itself (then no
                        // run began) names the message.
                        let failed = e.kind == "turn_failed";
                        let of_runs = end || failed || RUN_EVENTS.contains(&e.kind.as_str());
                        if !of_runs {
                            continue;
                        }
                        let data: Value = serde_json::from_slice(&e.data).unwrap_or(Value::Null);
                        let field = if failed { "message_id" } else { "run_id" };
                        if data[field] != run_id {
                            continue;
                        }
                        if end || failed {
                            return Ok(RunEnd { kind: e.kind, data });
                        }
                        seen = true;
                        match e.kind.as_str() {
                            "input_queued" => queued = true,
                            "run_started" => queued = false,
                            _ => {}
                        }
                        paused =
                            asks_a_person(&e.kind, &data).then_some(RunEnd { kind: e.kind, data });
                    }
                    if full {
                        continue;
                    }
                    if let Some(p) = paused {
                        return Ok(p);
                    }
                    match &known {
                        RunState::Ended => {
                            return Err(RunWaitError::OutcomeExpired(run_id.to_owned()));
                        }
                        RunState::Waiting(w) if !seen => return Ok(w.clone()),
                        _ => {}
                    }
                    // Queued behind a run that waits for a person: it will
                    // not start until someone answers (looked at again at
                    // every commit, as the run ahead may ask later).
                    if queued
                        && let Some(ahead) = self.active_wait(key)?
                        && ahead.data["run_id"] != run_id
                    {
                        return Ok(RunEnd {
                            kind: "input_queued".to_owned(),
                            data: serde_json::json!({ "run_id": run_id,
                                "behind": { "kind": ahead.kind, "data": ahead.data } }),
                        });
                    }
                }
                None if existed => return Err(RunWaitError::Deleted),
                None => {}
            }
            tokio::select! {
                r = sub.changed.changed() => if r.is_err() { return Err(RunWaitError::ShuttingDown) },
                _ = sub.closing.changed() => return Err(RunWaitError::ShuttingDown),
            }
        }
    }
}
