//! `marmot:actor/inputs`: durable waits for an answer (see
//! [`crate::inputs`]).

use crate::clock::now_ms;
use crate::sandbox::bindings::GuestError;
use crate::sandbox::bindings::marmot::actor::inputs::{self, InputRequest};
use crate::sandbox::host::Host;

impl inputs::Host for Host {
    fn request(&mut self, req: InputRequest) -> wasmtime::Result<Result<String, GuestError>> {
        let turn = self.enter()?;
        Ok(turn
            .input_request(
                req.kind,
                req.prompt,
                req.schema,
                req.expires_in_ms,
                now_ms(),
            )?
            .map_err(Into::into))
    }
}
