//! `marmot:actor/js-module`: the module the JavaScript engine runs.

use crate::sandbox::bindings::marmot::actor::js_module;
use crate::sandbox::host::Host;

impl js_module::Host for Host {
    fn source(&mut self) -> wasmtime::Result<(String, String)> {
        // Called once per instance, before the first turn runs the module.
        match &self.js_module {
            Some(m) => Ok((m.name.clone(), m.source.clone())),
            None => Err(wasmtime::format_err!(
                "this instance has no JavaScript module (not a JavaScript actor type)"
            )),
        }
    }
}
