//! A hostile actor for the tests: its `report-memory-origin`, which the
//! host calls before a fresh instance's first turn, never returns. The
//! host must stop it with the CPU meter or the turn timeout and refuse the
//! instance, as it does a turn that spins.
//!
//! Everything else is an ordinary actor: it is `export_actor!` written out
//! by hand, with a different `report-memory-origin`.

use marmot_guest::__private::{self, dispatch};
use marmot_guest::bindings::marmot::actor::types::{
    Alarm, Context as RawContext, InputAnswer, Message as RawMessage, Reply as RawReply,
    Webhook as RawWebhook,
};
use marmot_guest::{Actor, Context, Message, Reply, Result};

/// Replies `ok` to every message (it never gets to).
pub struct Spinner;

impl Actor for Spinner {
    fn on_message(_ctx: &Context, _msg: Message) -> Result<Reply> {
        Ok(Reply::text("ok"))
    }
}

/// The component's exports.
pub struct Export;

impl __private::Guest for Export {
    fn on_message(ctx: RawContext, msg: RawMessage) -> std::result::Result<RawReply, String> {
        dispatch::on_message::<Spinner>(ctx, msg)
    }
    fn on_alarm(ctx: RawContext, alarm: Alarm) -> std::result::Result<(), String> {
        dispatch::on_alarm::<Spinner>(ctx, alarm)
    }
    fn on_webhook(ctx: RawContext, req: RawWebhook) -> std::result::Result<(), String> {
        dispatch::on_webhook::<Spinner>(ctx, req)
    }
    fn on_input(ctx: RawContext, input: InputAnswer) -> std::result::Result<(), String> {
        dispatch::on_input::<Spinner>(ctx, input)
    }
    fn on_upgrade(ctx: RawContext, from_version: u32) -> std::result::Result<(), String> {
        dispatch::on_upgrade::<Spinner>(ctx, from_version)
    }
}

impl __private::MemoryOrigin for Export {
    fn report_memory_origin() {
        let mut n = 0u64;
        loop {
            n = std::hint::black_box(n.wrapping_add(1));
        }
    }
}

#[cfg(target_family = "wasm")]
__private::__export_actor_world!(Export with_types_in marmot_guest::bindings);
#[cfg(target_family = "wasm")]
__private::__export_memory_origin!(Export with_types_in marmot_guest::bindings::origin);
