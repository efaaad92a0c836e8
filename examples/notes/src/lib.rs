//! Per-user notes: one actor per user id, each holding that user's notes.
//!
//! Build:  cargo build -p notes --target wasm32-wasip2 --release
//! Deploy: marmot deploy notes target/wasm32-wasip2/release/notes.wasm
//! Call:   marmot call notes alice '{"op": "add", "text": "buy milk"}'
//!         marmot call notes alice '{"op": "list"}'
//!         marmot call notes alice '{"op": "delete", "id": 1}'
//!
//! `marmot dev` deploys it for you as the `notes` type.

use marmot_guest::{Actor, Context, Message, Reply, Result, events, state};
use serde::{Deserialize, Serialize};

#[derive(Deserialize)]
#[serde(tag = "op", rename_all = "snake_case")]
enum Op {
    Add { text: String },
    List,
    Get { id: u64 },
    Delete { id: u64 },
}

#[derive(Serialize, Deserialize)]
struct Note {
    id: u64,
    text: String,
}

/// Notes live under `note/<zero-padded id>` so that listing is ordered.
fn key(id: u64) -> String {
    format!("note/{id:016}")
}

struct Notes;

impl Actor for Notes {
    fn on_message(_ctx: &Context, msg: Message) -> Result<Reply> {
        match msg.json::<Op>()? {
            Op::Add { text } => {
                if text.trim().is_empty() {
                    return Ok(
                        Reply::json(&serde_json::json!({"error": "empty note"}))?.with_status(400)
                    );
                }
                let id = state::get_json::<u64>("next_id")?.unwrap_or(1);
                state::set_json("next_id", &(id + 1))?;
                let note = Note { id, text };
                state::set_json(&key(id), &note)?;
                events::emit("note_added", &note)?;
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
                None => Ok(
                    Reply::json(&serde_json::json!({"error": "no such note"}))?.with_status(404)
                ),
            },
            Op::Delete { id } => {
                let existed = state::delete(&key(id));
                if existed {
                    events::emit("note_deleted", &serde_json::json!({ "id": id }))?;
                }
                Reply::json(&serde_json::json!({ "deleted": existed }))
            }
        }
    }
}

marmot_guest::export_actor!(Notes);
