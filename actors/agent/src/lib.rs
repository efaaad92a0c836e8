//! Marmot's built-in agent harness: a durable LLM run loop as an ordinary
//! `marmot:actor` component, written on the guest SDK.
//!
//! One actor is one agent (a user, a ticket, a thread). A run is a chain
//! of turns, each committing before the next starts (docs/agent.md):
//!
//! * `{"input": "…"}` starts a run (its id is the message id), or queues
//!   the input behind the active run;
//! * a **step** turn calls the model once and commits its answer
//!   (`model_step`), or, when the answer called tools, prepares the next
//!   call: an approval or a client tool becomes an input request; any other
//!   tool is committed as started (`tool_call`, `agent/pending`);
//! * an **exec** turn runs that one tool and commits its result
//!   (`tool_result`). A crash while it runs leaves the exec message in the
//!   inbox; its re-run sees `turn::attempt() > 0` and does not blindly
//!   repeat the call: an idempotent tool runs again, a tool with a
//!   `reconcile` request asks the endpoint first, any other parks on an
//!   input request asking a person whether the call happened.
//!
//! Turns chain by sending a message to this actor itself (`actors::send`,
//! durable, committed with the turn), so a `kill -9` at any point resumes
//! from the last committed step.

mod manifest;
mod run;
mod store;
mod tools;
mod transcript;

use marmot_guest::{Actor, Alarm, Context, InputAnswer, Message, Reply, Result, Webhook};
use serde::Deserialize;

/// What the harness is sent. Tried in this order: a message that also
/// carries the internal fields is a client's input (it was taken for a
/// continuation with a wrong nonce and dropped, its caller waiting).
#[derive(Deserialize)]
#[serde(untagged)]
enum Request {
    /// A user's (or a system's) input.
    Input { input: String },
    /// Stop a run.
    Cancel { cancel: String },
    /// Internal: the next step of a run.
    Step {
        #[serde(rename = "_agent_step")]
        run_id: String,
        nonce: String,
    },
    /// Internal: run the pending tool call.
    Exec {
        #[serde(rename = "_agent_exec")]
        run_id: String,
        call_id: String,
        nonce: String,
        /// Sent again by the watchdog: an earlier turn may have made the
        /// call (treated as a re-run after a crash).
        #[serde(default)]
        resent: bool,
    },
}

struct Agent;

impl Actor for Agent {
    fn on_message(ctx: &Context, msg: Message) -> Result<Reply> {
        // A client's bad message is refused by the API before it is stored;
        // this answers another actor's, in the API's error shape.
        let Ok(req) = msg.json::<Request>() else {
            return Ok(Reply::json(&serde_json::json!({ "error": {
                "code": "invalid_input",
                "message": "send {\"input\": \"…\"} to start or continue a conversation, or {\"cancel\": \"<run_id>\"}"
            }}))?
            .with_status(400));
        };
        let agent = run::Harness::new(ctx)?;
        match req {
            Request::Input { input } => {
                agent.ensure_schedules()?;
                let queued = agent.start_or_queue(&msg.id, input)?;
                Reply::json(&serde_json::json!({ "run_id": msg.id, "queued": queued }))
            }
            Request::Cancel { cancel } => {
                let cancelled = agent.cancel(&cancel)?;
                Reply::json(&serde_json::json!({ "run_id": cancel, "cancelled": cancelled }))
            }
            Request::Step { run_id, nonce } => {
                agent.step(&run_id, &nonce)?;
                Reply::json(&serde_json::json!({}))
            }
            Request::Exec {
                run_id,
                call_id,
                nonce,
                resent,
            } => {
                let attempt = marmot_guest::turn::attempt();
                let attempt = if resent { attempt.max(1) } else { attempt };
                agent.exec(&run_id, &call_id, &nonce, attempt)?;
                Reply::json(&serde_json::json!({}))
            }
        }
    }

    /// A schedule of the manifest, a paused step (the model was
    /// unavailable), a step's watchdog or a run's deadline is due.
    fn on_alarm(ctx: &Context, alarm: Alarm) -> Result<()> {
        if let Some(name) = alarm.name.strip_prefix(run::SCHEDULE_ALARM) {
            run::Harness::new(ctx)?.scheduled(name, &ctx.turn_id)?;
        } else if let Some(run_id) = alarm.name.strip_prefix("agent-retry/") {
            let payload: serde_json::Value = serde_json::from_slice(&alarm.payload)?;
            let nonce = payload["nonce"].as_str().unwrap_or_default();
            run::Harness::new(ctx)?.step(run_id, nonce)?;
        } else if let Some(run_id) = alarm.name.strip_prefix(run::DEADLINE_ALARM) {
            run::Harness::new(ctx)?.deadline(run_id)?;
        } else if let Some(run_id) = alarm.name.strip_prefix(run::WATCHDOG_ALARM) {
            let payload: serde_json::Value = serde_json::from_slice(&alarm.payload)?;
            let nonce = payload["nonce"].as_str().unwrap_or_default();
            let call_id = payload["call_id"].as_str();
            run::Harness::new(ctx)?.watchdog(run_id, nonce, call_id)?;
        }
        Ok(())
    }

    fn on_input(ctx: &Context, input: InputAnswer) -> Result<()> {
        run::Harness::new(ctx)?.answer(input)
    }

    /// A webhook the manifest maps to an input.
    fn on_webhook(ctx: &Context, req: Webhook) -> Result<()> {
        let agent = run::Harness::new(ctx)?;
        agent.ensure_schedules()?;
        agent.webhook(&req.name, &req.body, &ctx.turn_id)
    }

    /// A new version (perhaps a new manifest): schedules follow it.
    fn on_upgrade(ctx: &Context, _from_version: u32) -> Result<()> {
        run::Harness::new(ctx)?.ensure_schedules()
    }
}

marmot_guest::export_actor!(Agent);
