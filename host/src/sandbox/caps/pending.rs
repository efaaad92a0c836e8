//! Capabilities whose host support has not landed yet. They keep their final
//! WIT shape and answer `error::unsupported`, so guests written against them
//! compile and fail clearly instead of trapping.

use super::Cap;
use crate::sandbox::bindings::GuestError;
use crate::sandbox::bindings::marmot::actor::model;
use crate::sandbox::host::Host;

fn unsupported<T>(what: &str) -> wasmtime::Result<Result<T, GuestError>> {
    Ok(Err(GuestError::Unsupported(format!(
        "{what} is not supported by this node yet"
    ))))
}

impl model::Host for Host {
    async fn chat(
        &mut self,
        _req: model::ChatRequest,
    ) -> wasmtime::Result<Result<String, GuestError>> {
        self.enter(Cap::Model)?;
        unsupported("model.chat")
    }
}
