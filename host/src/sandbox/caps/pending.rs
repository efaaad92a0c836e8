//! Capabilities whose host support has not landed yet. They keep their final
//! WIT shape and answer `error::unsupported`, so guests written against them
//! compile and fail clearly instead of trapping.

use crate::sandbox::bindings::GuestError;
use crate::sandbox::bindings::marmot::actor::{files, js, model};
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
        self.enter()?;
        unsupported("model.chat")
    }
}

impl files::Host for Host {
    async fn read(&mut self, _path: String) -> wasmtime::Result<Result<Vec<u8>, GuestError>> {
        self.enter()?;
        unsupported("files.read")
    }

    async fn write(
        &mut self,
        _path: String,
        _data: Vec<u8>,
    ) -> wasmtime::Result<Result<(), GuestError>> {
        self.enter()?;
        unsupported("files.write")
    }

    async fn list(
        &mut self,
        _prefix: String,
    ) -> wasmtime::Result<Result<Vec<files::FileInfo>, GuestError>> {
        self.enter()?;
        unsupported("files.list")
    }

    async fn delete(&mut self, _path: String) -> wasmtime::Result<Result<bool, GuestError>> {
        self.enter()?;
        unsupported("files.delete")
    }
}

impl js::Host for Host {
    async fn eval(
        &mut self,
        _req: js::EvalRequest,
    ) -> wasmtime::Result<Result<js::EvalResult, GuestError>> {
        self.enter()?;
        unsupported("js.eval")
    }
}
