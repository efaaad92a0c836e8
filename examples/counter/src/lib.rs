//! A durable counter: each message adds `by` (default 1) and replies with the count.
//!
//! Build:  cargo build -p counter --target wasm32-wasip2 --release
//! Deploy: marmot deploy counter target/wasm32-wasip2/release/counter.wasm
//! Call:   marmot call counter alice '{"by": 2}'    # → {"n":2}
//!         marmot call counter alice '{"by": 0}'    # read without writing
//!
//! `marmot dev` deploys it for you as the `counter` type.
//!
//! Verified webhooks count too (`POST /v1/hooks/counter/alice/{name}` with
//! the body `{"by": 2}`, once the type has a `webhook_secret`).

use marmot_guest::{Actor, Context, Message, Reply, Result, Webhook, events, state};
use serde::Deserialize;

#[derive(Default, Deserialize)]
struct Add {
    by: Option<i64>,
}

struct Counter;

/// What an addition that would pass a 64-bit count says (a release build
/// wrapped it around to the most negative count).
const OVERFLOW: &str = "the count would pass the range of a 64-bit integer; nothing was added";

/// Add `by` to the count and return the new count (`None`, and nothing
/// written, if it would overflow).
fn add(by: i64) -> Result<Option<i64>> {
    let Some(n) = state::get_json::<i64>("n")?.unwrap_or(0).checked_add(by) else {
        return Ok(None);
    };
    if by == 0 {
        // A read: the turn writes nothing and needs no commit.
        return Ok(Some(n));
    }
    state::set_json("n", &n)?;
    if n % 100 == 0 {
        events::emit("milestone", &serde_json::json!({ "n": n }))?;
    }
    Ok(Some(n))
}

impl Actor for Counter {
    fn on_message(_ctx: &Context, msg: Message) -> Result<Reply> {
        // A body that is not `{"by": n}` is the caller's mistake: a 400
        // that says so, not a failed turn (a 500).
        let by: Add = match msg.json_or_default() {
            Ok(by) => by,
            Err(e) => {
                let error = format!("expected {{\"by\": integer}}: {e}");
                return Ok(Reply::json(&serde_json::json!({ "error": error }))?.with_status(400));
            }
        };
        match add(by.by.unwrap_or(1))? {
            Some(n) => Reply::json(&serde_json::json!({ "n": n })),
            None => Ok(Reply::json(&serde_json::json!({ "error": OVERFLOW }))?.with_status(400)),
        }
    }

    fn on_webhook(_ctx: &Context, hook: Webhook) -> Result<()> {
        let by: Add = if hook.body.is_empty() {
            Add::default()
        } else {
            serde_json::from_slice(&hook.body)?
        };
        add(by.by.unwrap_or(1))?.ok_or(OVERFLOW)?;
        Ok(())
    }
}

marmot_guest::export_actor!(Counter);
