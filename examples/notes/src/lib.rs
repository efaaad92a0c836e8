//! Per-user notes: one actor per user id, each holding that user's notes,
//! with optional reminders (durable alarms).
//!
//! Build:  cargo build -p notes --target wasm32-wasip2 --release
//! Deploy: marmot deploy notes target/wasm32-wasip2/release/notes.wasm
//! Call:   marmot call notes alice '{"op": "add", "text": "buy milk"}'
//!         marmot call notes alice '{"op": "list"}'
//!         marmot call notes alice '{"op": "remind", "id": 1, "after_ms": 60000}'
//!         marmot alarms notes alice
//!         marmot call notes alice '{"op": "delete", "id": 1}'
//!
//! A reminder fires once, even across restarts, and shows up as a
//! `reminder` event (`GET /v1/actors/notes/alice/events`). `marmot dev`
//! deploys this actor for you as the `notes` type.

use marmot_guest::alarms::{self, Schedule};
use marmot_guest::{Actor, Alarm, Context, Message, Reply, Result, events, state};
use serde::{Deserialize, Serialize};

#[derive(Deserialize)]
#[serde(tag = "op", rename_all = "snake_case")]
enum Op {
    /// Add a note; `remind_at` (ms since the epoch) also sets a reminder.
    Add {
        text: String,
        remind_at: Option<u64>,
    },
    List,
    Get {
        id: u64,
    },
    Delete {
        id: u64,
    },
    /// Remind about note `id` at `at` (ms since the epoch) or after
    /// `after_ms`; replaces an earlier reminder for the same note.
    Remind {
        id: u64,
        at: Option<u64>,
        after_ms: Option<u64>,
    },
}

#[derive(Serialize, Deserialize)]
struct Note {
    id: u64,
    text: String,
}

/// What a reminder alarm carries.
#[derive(Serialize, Deserialize)]
struct Reminder {
    id: u64,
}

/// Notes live under `note/<zero-padded id>` so that listing is ordered.
fn key(id: u64) -> String {
    format!("note/{id:016}")
}

/// One reminder per note: setting it again replaces it.
fn alarm_name(id: u64) -> String {
    format!("remind/{id}")
}

fn error(status: u16, message: &str) -> Result<Reply> {
    Ok(Reply::json(&serde_json::json!({ "error": message }))?.with_status(status))
}

fn remind(id: u64, schedule: Schedule) -> Result<()> {
    alarms::set(&alarm_name(id), schedule, &Reminder { id })
}

fn now_us() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_micros() as u64)
}

struct Notes;

impl Actor for Notes {
    fn on_message(_ctx: &Context, msg: Message) -> Result<Reply> {
        // A body that is not an operation is the caller's mistake: a 400
        // that says so, not a failed turn (a 500).
        let op = match msg.json::<Op>() {
            Ok(op) => op,
            Err(e) => return error(400, &format!("not a notes operation: {e}")),
        };
        match op {
            Op::Add { text, remind_at } => {
                if text.trim().is_empty() {
                    return error(400, "empty note");
                }
                let id = state::get_json::<u64>("next_id")?.unwrap_or(1);
                state::set_json("next_id", &(id + 1))?;
                let note = Note { id, text };
                state::set_json(&key(id), &note)?;
                events::emit("note_added", &note)?;
                if let Some(at) = remind_at {
                    remind(id, Schedule::At(at))?;
                }
                Reply::json(&note)
            }
            Op::List => {
                let notes = state::list_all("note/")
                    .into_iter()
                    .map(|(_, v)| serde_json::from_slice::<Note>(&v))
                    .collect::<std::result::Result<Vec<_>, _>>()?;
                Reply::json(&notes)
            }
            Op::Get { id } => match state::get_json::<Note>(&key(id))? {
                Some(note) => Reply::json(&note),
                None => error(404, "no such note"),
            },
            Op::Delete { id } => {
                let existed = state::delete(&key(id));
                if existed {
                    alarms::cancel(&alarm_name(id))?;
                    events::emit("note_deleted", &serde_json::json!({ "id": id }))?;
                }
                Reply::json(&serde_json::json!({ "deleted": existed }))
            }
            Op::Remind { id, at, after_ms } => {
                if state::get_json::<Note>(&key(id))?.is_none() {
                    return error(404, "no such note");
                }
                let schedule = match (at, after_ms) {
                    (Some(at), None) => Schedule::At(at),
                    (None, Some(ms)) => Schedule::After(ms),
                    _ => return error(400, "give one of `at` or `after_ms`"),
                };
                remind(id, schedule)?;
                Reply::json(&serde_json::json!({ "reminder": alarm_name(id) }))
            }
        }
    }

    /// A reminder is due: record it as an event with how late it ran.
    fn on_alarm(_ctx: &Context, alarm: Alarm) -> Result<()> {
        let Reminder { id } = serde_json::from_slice(&alarm.payload)?;
        let Some(note) = state::get_json::<Note>(&key(id))? else {
            return Ok(()); // deleted since; nothing to remind about
        };
        // Negative would mean early, which the platform never does.
        let late_us = now_us() as i64 - (alarm.due_at * 1000) as i64;
        events::emit(
            "reminder",
            &serde_json::json!({ "id": id, "text": note.text, "due_at": alarm.due_at, "late_us": late_us }),
        )?;
        Ok(())
    }
}

marmot_guest::export_actor!(Notes);
