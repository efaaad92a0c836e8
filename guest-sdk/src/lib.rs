//! Write [Marmot](https://github.com/marmot-rt/marmot) actors in Rust.
//!
//! A Marmot actor is a WebAssembly component addressed by `(type, id)`. It
//! wakes on a message, an alarm, a webhook or an answered input, runs one
//! *turn*, and goes back to sleep. Everything a turn writes — state, events —
//! commits atomically when the handler returns `Ok`; an `Err` or a panic
//! commits nothing.
//!
//! Implement [`Actor`] for a type and export it with [`export_actor!`]:
//!
//! ```
//! use marmot_guest::{Actor, Context, Message, Reply, Result, state};
//! use serde::Deserialize;
//!
//! #[derive(Default, Deserialize)]
//! struct Add {
//!     by: Option<i64>,
//! }
//!
//! struct Counter;
//!
//! impl Actor for Counter {
//!     fn on_message(_ctx: &Context, msg: Message) -> Result<Reply> {
//!         let add: Add = msg.json_or_default()?;
//!         let n = state::get_json::<i64>("n")?.unwrap_or(0) + add.by.unwrap_or(1);
//!         state::set_json("n", &n)?;
//!         Reply::json(&serde_json::json!({ "n": n }))
//!     }
//! }
//!
//! marmot_guest::export_actor!(Counter);
//! ```
//!
//! Build with `cargo build --target wasm32-wasip2 --release` and deploy the
//! `.wasm` file with `marmot deploy counter target/wasm32-wasip2/release/counter.wasm`.

#![deny(missing_docs)]

pub mod actors;
pub mod alarms;
#[doc(hidden)]
pub mod bindings;
mod error;
pub mod events;
pub mod files;
mod handler;
pub mod http;
pub mod inputs;
pub mod js;
pub mod log;
mod message;
pub mod model;
pub mod state;
pub mod turn;

pub use error::{Error, Result};
pub use handler::{Actor, Alarm, Context, InputAnswer, Webhook};
pub use message::{Message, Reply};

/// Host-side failures as the host reports them.
pub use bindings::marmot::actor::types::Error as HostError;

/// The capabilities as generated from WIT, for what the modules above do
/// not cover.
pub mod raw {
    pub use crate::bindings::marmot::actor::{files, http, js, model, turn};
}

#[doc(hidden)]
pub mod __private {
    pub use crate::bindings::__export_actor_world;
    pub use crate::bindings::exports::marmot::actor::handlers::Guest;
    pub use crate::bindings::origin::{__export_memory_origin, Guest as MemoryOrigin};
    pub use crate::handler::dispatch;

    /// `report-memory-origin`: tell the host where this instance's memory
    /// is, so that it can copy up front the pages a first turn writes. The
    /// host takes that from the list's lift, not from anything said here,
    /// so the list is empty and the call reads and writes no memory.
    pub fn report_memory_origin() {
        crate::bindings::origin::memory_origin(&[], 0, 0);
    }
}

/// Export `$ty`, which implements [`Actor`], as this component's handlers.
///
/// Call it once per crate, at the top level.
#[macro_export]
macro_rules! export_actor {
    ($ty:ty) => {
        // Public, so that built for the host (where nothing is exported)
        // the actor's code is still reachable and linted as live code.
        #[doc(hidden)]
        pub struct __MarmotActorExport;

        impl $crate::__private::Guest for __MarmotActorExport {
            fn on_message(
                ctx: $crate::bindings::marmot::actor::types::Context,
                msg: $crate::bindings::marmot::actor::types::Message,
            ) -> ::core::result::Result<$crate::bindings::marmot::actor::types::Reply, ::std::string::String> {
                $crate::__private::dispatch::on_message::<$ty>(ctx, msg)
            }
            fn on_alarm(
                ctx: $crate::bindings::marmot::actor::types::Context,
                alarm: $crate::bindings::marmot::actor::types::Alarm,
            ) -> ::core::result::Result<(), ::std::string::String> {
                $crate::__private::dispatch::on_alarm::<$ty>(ctx, alarm)
            }
            fn on_webhook(
                ctx: $crate::bindings::marmot::actor::types::Context,
                req: $crate::bindings::marmot::actor::types::Webhook,
            ) -> ::core::result::Result<(), ::std::string::String> {
                $crate::__private::dispatch::on_webhook::<$ty>(ctx, req)
            }
            fn on_input(
                ctx: $crate::bindings::marmot::actor::types::Context,
                input: $crate::bindings::marmot::actor::types::InputAnswer,
            ) -> ::core::result::Result<(), ::std::string::String> {
                $crate::__private::dispatch::on_input::<$ty>(ctx, input)
            }
            fn on_upgrade(
                ctx: $crate::bindings::marmot::actor::types::Context,
                from_version: u32,
            ) -> ::core::result::Result<(), ::std::string::String> {
                $crate::__private::dispatch::on_upgrade::<$ty>(ctx, from_version)
            }
        }

        impl $crate::__private::MemoryOrigin for __MarmotActorExport {
            fn report_memory_origin() {
                $crate::__private::report_memory_origin()
            }
        }

        // Component exports exist only on wasm. Built for the host (a
        // workspace-wide `cargo build` or `clippy`), the crate compiles and
        // links but exports nothing: the linker cannot take symbol names
        // such as `marmot:actor/handlers@0.1.0#on-message`.
        #[cfg(target_family = "wasm")]
        $crate::__private::__export_actor_world!(__MarmotActorExport with_types_in $crate::bindings);
        #[cfg(target_family = "wasm")]
        $crate::__private::__export_memory_origin!(__MarmotActorExport with_types_in $crate::bindings::origin);
    };
}
