//! `marmot:actor/turn`: what a guest may know about the running turn.

use crate::sandbox::bindings::marmot::actor::turn;
use crate::sandbox::host::{Host, LimitTrap};

impl turn::Host for Host {
    async fn attempt(&mut self) -> wasmtime::Result<u32> {
        // No capability to grant: a child script sees its caller's turn.
        let turn = self
            .turn
            .as_ref()
            .ok_or_else(|| wasmtime::Error::new(LimitTrap::NoTurn))?;
        Ok(turn.attempt)
    }
}
