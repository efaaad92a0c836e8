//! `marmot:actor/state`: the turn's view of the actor's key-value state.

use bytes::Bytes;

use crate::sandbox::bindings::GuestError;
use crate::sandbox::bindings::marmot::actor::state;
use crate::sandbox::host::Host;

/// Most entries one `list` call returns.
const MAX_LIST: u32 = 1000;

impl state::Host for Host {
    fn get(&mut self, key: String) -> wasmtime::Result<Option<Vec<u8>>> {
        let turn = self.enter()?;
        Ok(turn.get(&key)?.map(|b| b.to_vec()))
    }

    fn set(&mut self, key: String, value: Vec<u8>) -> wasmtime::Result<Result<(), GuestError>> {
        let turn = self.enter()?;
        Ok(turn.set(key, Bytes::from(value))?.map_err(Into::into))
    }

    fn delete(&mut self, key: String) -> wasmtime::Result<bool> {
        let turn = self.enter()?;
        Ok(turn.delete(&key)?)
    }

    fn list(
        &mut self,
        prefix: String,
        start_after: Option<String>,
        limit: u32,
    ) -> wasmtime::Result<Vec<(String, Vec<u8>)>> {
        let turn = self.enter()?;
        let entries = turn.list(
            &prefix,
            start_after.as_deref(),
            limit.min(MAX_LIST) as usize,
        )?;
        Ok(entries.into_iter().map(|(k, v)| (k, v.to_vec())).collect())
    }
}
