//! What the agent keeps in its actor state. Every write belongs to the
//! turn, so a step's transcript entries, run record and events commit
//! together or not at all.
//!
//! | key | value |
//! |---|---|
//! | `t/{n:012}` | one transcript message (the chat shape), in order |
//! | `agent/next` | the next transcript index |
//! | `agent/run` | the active run ([`Run`]) |
//! | `agent/queue` | inputs waiting for the active run to end |
//! | `agent/pending` | the tool call being executed ([`Pending`]) |
//! | `agent/wait/{input_id}` | what an input request is for ([`Wait`]) |
//! | `agent/approved/{call_id}` | the hash of the arguments a person approved |

use marmot_guest::{Result, state};
use serde::{Deserialize, Serialize};
use serde_json::Value;

const RUN: &str = "agent/run";
const QUEUE: &str = "agent/queue";
const PENDING: &str = "agent/pending";
const NEXT: &str = "agent/next";
const TRANSCRIPT: &str = "t/";

/// The active run.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct Run {
    pub run_id: String,
    /// The token the run's next continuation (step, exec, retry) carries.
    #[serde(default)]
    pub expect: String,
    /// Waiting for an input (approval, client tool, confirmation).
    #[serde(default)]
    pub waiting: bool,
    /// Model steps taken.
    pub steps: u32,
    pub started_at_ms: u64,
    pub input_tokens: u64,
    pub output_tokens: u64,
    #[serde(default)]
    pub cost_usd: f64,
    /// Model failures in a row (retried after a pause).
    #[serde(default)]
    pub retries: u32,
    /// The transcript was compacted since the last model step: do not
    /// compact again before the model has been tried.
    #[serde(default)]
    pub just_compacted: bool,
    /// Times the current step was sent again because its turn never
    /// completed (see `Harness::watchdog`).
    #[serde(default)]
    pub step_resends: u32,
}

/// An input queued behind the active run.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct Queued {
    pub run_id: String,
    pub input: String,
}

/// A tool call committed as started: the next turn executes it.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct Pending {
    pub run_id: String,
    pub call_id: String,
    pub name: String,
    pub arguments: Value,
    /// Sent as `idempotency-key` with its side effects: stable across
    /// re-runs.
    pub key: String,
}

/// What an input request is waiting for.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(tag = "for", rename_all = "snake_case")]
pub enum Wait {
    /// A person approves (or not) a call with exactly these arguments.
    Approval {
        run_id: String,
        call_id: String,
        args_hash: String,
    },
    /// The client runs the tool and answers with its result.
    Client { run_id: String, call_id: String },
    /// A person says whether a call cut off by a crash took effect.
    Confirm { run_id: String, call_id: String },
}

pub fn run() -> Result<Option<Run>> {
    state::get_json(RUN)
}

pub fn set_run(r: &Run) -> Result<()> {
    state::set_json(RUN, r)
}

pub fn clear_run() {
    state::delete(RUN);
}

pub fn queue() -> Result<Vec<Queued>> {
    Ok(state::get_json(QUEUE)?.unwrap_or_default())
}

pub fn set_queue(q: &[Queued]) -> Result<()> {
    if q.is_empty() {
        state::delete(QUEUE);
        Ok(())
    } else {
        state::set_json(QUEUE, q)
    }
}

pub fn pending() -> Result<Option<Pending>> {
    state::get_json(PENDING)
}

pub fn set_pending(p: Option<&Pending>) -> Result<()> {
    match p {
        Some(p) => state::set_json(PENDING, p),
        None => {
            state::delete(PENDING);
            Ok(())
        }
    }
}

pub fn wait(input_id: &str) -> Result<Option<Wait>> {
    state::get_json(&format!("agent/wait/{input_id}"))
}

pub fn set_wait(input_id: &str, w: Option<&Wait>) -> Result<()> {
    let key = format!("agent/wait/{input_id}");
    match w {
        Some(w) => state::set_json(&key, w),
        None => {
            state::delete(&key);
            Ok(())
        }
    }
}

/// The input requests the harness waits on: (input id, what for).
pub fn waits() -> Result<Vec<(String, Wait)>> {
    state::list_all("agent/wait/")
        .into_iter()
        .map(|(k, v)| {
            let id = k.trim_start_matches("agent/wait/").to_owned();
            Ok((id, serde_json::from_slice(&v)?))
        })
        .collect()
}

pub fn approved(call_id: &str) -> Result<Option<String>> {
    state::get_json(&format!("agent/approved/{call_id}"))
}

pub fn set_approved(call_id: &str, args_hash: &str) -> Result<()> {
    state::set_json(&format!("agent/approved/{call_id}"), args_hash)
}

/// Forget the approvals of a finished run's calls.
pub fn clear_approvals() {
    for (k, _) in state::list_all("agent/approved/") {
        state::delete(&k);
    }
}

/// The whole transcript, in order, with each message's key.
pub fn transcript() -> Result<Vec<(String, Value)>> {
    state::list_all(TRANSCRIPT)
        .into_iter()
        .map(|(k, v)| Ok((k, serde_json::from_slice(&v)?)))
        .collect()
}

/// Append a message.
pub fn append(message: &Value) -> Result<()> {
    let n: u64 = state::get_json(NEXT)?.unwrap_or(0);
    state::set_json(&format!("{TRANSCRIPT}{n:012}"), message)?;
    state::set_json(NEXT, &(n + 1))
}

/// Rewrite the message under `key`.
pub fn replace(key: &str, message: &Value) -> Result<()> {
    state::set_json(key, message)
}

/// Remove messages.
pub fn remove(keys: &[String]) {
    for k in keys {
        state::delete(k);
    }
}
