//! Pre-initializing the JavaScript engine with Wizer.
//!
//! The engine's `wizer-initialize` export sets up the QuickJS runtime, the
//! `marmot` API and the prelude. Running it once and snapshotting the
//! resulting memory means every JavaScript sandbox starts initialized: a
//! fresh eval costs an instantiation instead of a runtime start-up.
//!
//! The snapshot depends only on the engine's bytes and this wasmtime, so it
//! is built on first use and cached next to the compiled code.

use std::path::Path;

use sha2::{Digest, Sha256};
use wasmtime::Store;
use wasmtime::component::{Component, Instance, Lift, Linker, WasmList};
use wasmtime_wizer::{ComponentInstanceState, Wizer};

use super::{CodeError, Host};

/// Build the snapshot of `engine_wasm`, or read it from `cache_dir`.
pub(super) async fn snapshot(
    engine: &wasmtime::Engine,
    linker: &Linker<Host>,
    host: Host,
    engine_wasm: &[u8],
    cache_dir: &Path,
    engine_hash: &str,
) -> Result<Vec<u8>, CodeError> {
    let sha = hex::encode(Sha256::digest(engine_wasm));
    let path = cache_dir.join(format!(
        "quickjs-{}-{engine_hash}.snapshot.wasm",
        &sha[..16]
    ));
    if let Ok(bytes) = std::fs::read(&path) {
        return Ok(bytes);
    }
    let fail = |what: &str, e: wasmtime::Error| CodeError::Invalid(format!("{what}: {e:#}"));
    let mut wizer = Wizer::new();
    wizer.init_func("wizer-initialize").keep_init_func(true);
    let (cx, instrumented) = wizer
        .instrument_component(engine_wasm)
        .map_err(|e| fail("instrumenting the JavaScript engine", e))?;
    let component = Component::new(engine, &instrumented)
        .map_err(|e| fail("compiling the JavaScript engine for pre-initialization", e))?;
    let mut store = Store::new(engine, host);
    // Initialization is trusted code with no deadline of its own.
    store.set_epoch_deadline(u64::MAX / 2);
    let instance = linker
        .instantiate_async(&mut store, &component)
        .await
        .map_err(|e| fail("instantiating the JavaScript engine", e))?;
    let init = instance
        .get_typed_func::<(), ()>(&mut store, "wizer-initialize")
        .map_err(|e| fail("the JavaScript engine has no wizer-initialize", e))?;
    init.call_async(&mut store, ())
        .await
        .map_err(|e| fail("initializing the JavaScript engine", e))?;
    let snapshot = wizer
        .snapshot_component(
            &cx,
            &mut Access {
                store: &mut store,
                instance,
            },
        )
        .await
        .map_err(|e| fail("snapshotting the JavaScript engine", e))?;
    if let Err(e) = super::write_atomic(&path, &snapshot) {
        tracing::warn!(path = %path.display(), error = %e, "failed to cache the engine snapshot");
    }
    Ok(snapshot)
}

/// Lets Wizer read the instrumented instance's memories and globals through
/// the accessor functions its instrumentation exports.
struct Access<'a> {
    store: &'a mut Store<Host>,
    instance: Instance,
}

impl Access<'_> {
    async fn call<R: Lift + Send + Sync + 'static>(&mut self, instance: &str, func: &str) -> R {
        let (_, exported) = self
            .instance
            .get_export(&mut *self.store, None, instance)
            .expect("the instrumented engine exports the wizer accessors");
        let (_, index) = self
            .instance
            .get_export(&mut *self.store, Some(&exported), func)
            .expect("the instrumented engine exports each accessor");
        let f = self
            .instance
            .get_typed_func::<(), (R,)>(&mut *self.store, index)
            .expect("accessor type");
        f.call_async(&mut *self.store, ())
            .await
            .expect("accessors do not trap")
            .0
    }
}

impl ComponentInstanceState for Access<'_> {
    async fn call_func_ret_list_u8(
        &mut self,
        instance: &str,
        func: &str,
        contents: impl FnOnce(&[u8]) + Send,
    ) {
        let list: WasmList<u8> = self.call(instance, func).await;
        contents(list.as_le_slice(&*self.store));
    }

    async fn call_func_ret_s32(&mut self, instance: &str, func: &str) -> i32 {
        self.call(instance, func).await
    }

    async fn call_func_ret_s64(&mut self, instance: &str, func: &str) -> i64 {
        self.call(instance, func).await
    }

    async fn call_func_ret_f32(&mut self, instance: &str, func: &str) -> u32 {
        self.call::<f32>(instance, func).await.to_bits()
    }

    async fn call_func_ret_f64(&mut self, instance: &str, func: &str) -> u64 {
        self.call::<f64>(instance, func).await.to_bits()
    }
}
