//! `marmot:actor/events`: append to the actor's event log with the turn.

use crate::sandbox::bindings::GuestError;
use crate::sandbox::bindings::marmot::actor::events;
use crate::sandbox::host::Host;

impl events::Host for Host {
    fn emit(&mut self, kind: String, data: Vec<u8>) -> wasmtime::Result<Result<u64, GuestError>> {
        let turn = self.enter()?;
        Ok(turn.emit(kind, data).map_err(Into::into))
    }
}
