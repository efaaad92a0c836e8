//! A durable counter: each message adds `by` (default 1) and replies with the count.
//!
//! Build:  cargo build -p counter --target wasm32-wasip2 --release
//! Deploy: marmot deploy counter target/wasm32-wasip2/release/counter.wasm
//! Call:   marmot call counter alice '{"by": 2}'    # → {"n":2}
//!         marmot call counter alice '{"by": 0}'    # read without writing
//!
//! `marmot dev` deploys it for you as the `counter` type.

use marmot_guest::{Actor, Context, Message, Reply, Result, events, state};
use serde::Deserialize;

#[derive(Default, Deserialize)]
struct Add {
    by: Option<i64>,
}

struct Counter;

impl Actor for Counter {
    fn on_message(_ctx: &Context, msg: Message) -> Result<Reply> {
        let add: Add = msg.json_or_default()?;
        let by = add.by.unwrap_or(1);
        let n = state::get_json::<i64>("n")?.unwrap_or(0) + by;
        if by == 0 {
            // A read: the turn writes nothing and needs no commit.
            return Reply::json(&serde_json::json!({ "n": n }));
        }
        state::set_json("n", &n)?;
        if n % 100 == 0 {
            events::emit("milestone", &serde_json::json!({ "n": n }))?;
        }
        Reply::json(&serde_json::json!({ "n": n }))
    }
}

marmot_guest::export_actor!(Counter);
