//! Pre-initializing the JavaScript engine with Wizer.
//!
//! The engine's `wizer-initialize` export sets up the QuickJS runtime, the
//! `marmot` API and the prelude. Running it once and snapshotting the
//! resulting memory means every JavaScript sandbox starts initialized: a
//! fresh eval costs an instantiation instead of a runtime start-up.
//!
//! A JavaScript type version gets a snapshot of its own, taken after
//! `wizer-preload` has also loaded its module and run the module's top
//! level: its sandboxes wake with the module evaluated (see "One snapshot
//! per JavaScript type version" in docs/design.md). Both snapshots come
//! from one [`Preinit`], the engine instrumented by Wizer and compiled once.

use std::time::Duration;

use wasmtime::Store;
use wasmtime::component::{Component, Instance, Lift, Linker, WasmList};
use wasmtime_wizer::{ComponentContext, ComponentInstanceState, Wizer};

use super::bindings::PreloadFailure;
use super::{CodeError, Host, LimitTrap};

/// The engine instrumented by Wizer, and compiled: what each snapshot
/// starts from.
pub(super) struct Preinit {
    wizer: Wizer,
    cx: ComponentContext<'static>,
    component: Component,
}

/// Why a snapshot with a module preloaded was not taken.
#[derive(Debug)]
pub(super) enum PreloadError {
    /// The module's top level used what only a turn may use (randomness,
    /// timers, the `marmot` API): it would do so again.
    Refused(String),
    /// No turn could run the module: its top level threw, ran out of the
    /// type's memory or past its CPU slice (the slice is wall time while
    /// the guest runs, so a top level near it on a busy machine may fit
    /// when deployed again; one that never ends never will), or its default
    /// export has no handler.
    Invalid(String),
    /// The top level ran past the turn timeout (waiting, not computing).
    TooSlow(String),
    /// Taking the snapshot itself failed.
    Failed(CodeError),
}

/// Limits of a preload: the user's code runs in it.
pub(super) struct PreloadLimits {
    /// Wall-clock bound on the module's top level.
    pub timeout: Duration,
}

impl Preinit {
    /// Instrument `engine_wasm` and compile it with `compile`.
    pub(super) fn new(
        engine_wasm: &'static [u8],
        compile: impl FnOnce(&[u8]) -> Result<Component, CodeError>,
    ) -> Result<Self, CodeError> {
        let mut wizer = Wizer::new();
        wizer.init_func("wizer-initialize").keep_init_func(true);
        let (cx, instrumented) = wizer.instrument_component(engine_wasm).map_err(|e| {
            CodeError::Invalid(format!("instrumenting the JavaScript engine: {e:#}"))
        })?;
        let component = compile(&instrumented)?;
        Ok(Self {
            wizer,
            cx,
            component,
        })
    }

    /// The engine's own snapshot: `wizer-initialize` in a fresh instance.
    pub(super) async fn engine(
        &self,
        linker: &Linker<Host>,
        host: Host,
    ) -> Result<Vec<u8>, CodeError> {
        let (mut store, instance) = self.initialized(linker, host).await?;
        self.take(&mut store, instance).await
    }

    /// The snapshot of one JavaScript type version: `wizer-initialize`,
    /// then `wizer-preload`, which asks `host` for the module and runs its
    /// top level under the type's CPU and memory limits (from `host`) and
    /// `limits`.
    pub(super) async fn type_version(
        &self,
        linker: &Linker<Host>,
        host: Host,
        limits: PreloadLimits,
    ) -> Result<Vec<u8>, PreloadError> {
        let (mut store, instance) = self.preload(linker, host, limits).await?;
        self.take(&mut store, instance)
            .await
            .map_err(PreloadError::Failed)
    }

    /// Run `wizer-preload` as [`Self::type_version`] does, without taking a
    /// snapshot: for a check of the module's top level (`host`'s
    /// environment says so to the engine, see `PRELOAD_CHECK_ENV` in
    /// `actors/quickjs`).
    pub(super) async fn check_top_level(
        &self,
        linker: &Linker<Host>,
        host: Host,
        limits: PreloadLimits,
    ) -> Result<(), PreloadError> {
        self.preload(linker, host, limits).await.map(drop)
    }

    async fn preload(
        &self,
        linker: &Linker<Host>,
        host: Host,
        limits: PreloadLimits,
    ) -> Result<(Store<Host>, Instance), PreloadError> {
        let (mut store, instance) = self
            .initialized(linker, host)
            .await
            .map_err(PreloadError::Failed)?;
        let preload = instance
            .get_typed_func::<(), (Result<(), PreloadFailure>,)>(&mut store, "wizer-preload")
            .map_err(|e| {
                PreloadError::Failed(CodeError::Invalid(format!(
                    "the JavaScript engine has no wizer-preload: {e:#}"
                )))
            })?;
        // From here on the user's code runs: metered like a turn.
        store.limiter(|h| &mut h.limits);
        super::meter_cpu(&mut store);
        let ran = tokio::time::timeout(limits.timeout, preload.call_async(&mut store, ())).await;
        match ran {
            Err(_) => {
                return Err(PreloadError::TooSlow(
                    "the module's top level timed out".into(),
                ));
            }
            // The top level ran under the type's own limits, as every
            // sandbox's first turn would run it: past them here, it is past
            // them there, and no turn could ever run (it used to be deployed,
            // and every first turn failed the same way, a CPU-bound one
            // after burning its whole slice).
            Ok(Err(trap))
                if matches!(
                    trap.downcast_ref(),
                    Some(LimitTrap::Cpu(_) | LimitTrap::CpuInAll(_))
                ) =>
            {
                // The limit's own words, without the wasm backtrace.
                let limit = trap
                    .downcast_ref::<LimitTrap>()
                    .map(ToString::to_string)
                    .unwrap_or_default();
                return Err(PreloadError::Invalid(format!(
                    "the module's top level does not finish within the type's CPU slice \
                     (`cpu_slice_ms`): {limit}"
                )));
            }
            Ok(Err(trap)) if format!("{trap:#}").contains("growing memory") => {
                return Err(PreloadError::Invalid(format!(
                    "the module's top level does not fit the type's memory limit ({})",
                    trap.root_cause()
                )));
            }
            Ok(Err(trap)) => return Err(PreloadError::Refused(format!("{trap:#}"))),
            Ok(Ok((Err(PreloadFailure::Refused(why)),))) => {
                return Err(PreloadError::Refused(why));
            }
            Ok(Ok((Err(PreloadFailure::Invalid(why)),))) => {
                return Err(PreloadError::Invalid(why));
            }
            Ok(Ok((Ok(()),))) => {}
        }
        Ok((store, instance))
    }

    /// A fresh instance of the instrumented engine after `wizer-initialize`.
    async fn initialized(
        &self,
        linker: &Linker<Host>,
        host: Host,
    ) -> Result<(Store<Host>, Instance), CodeError> {
        let fail =
            |what: &str, e: wasmtime::Error| CodeError::from_failure(format!("{what}: {e:#}"));
        let mut store = Store::new(self.component.engine(), host);
        // Initialization is trusted code with no deadline of its own.
        store.set_epoch_deadline(u64::MAX / 2);
        let instance = linker
            .instantiate_async(&mut store, &self.component)
            .await
            .map_err(|e| fail("instantiating the JavaScript engine", e))?;
        let init = instance
            .get_typed_func::<(), ()>(&mut store, "wizer-initialize")
            .map_err(|e| fail("the JavaScript engine has no wizer-initialize", e))?;
        init.call_async(&mut store, ())
            .await
            .map_err(|e| fail("initializing the JavaScript engine", e))?;
        Ok((store, instance))
    }

    async fn take(
        &self,
        store: &mut Store<Host>,
        instance: Instance,
    ) -> Result<Vec<u8>, CodeError> {
        self.wizer
            .snapshot_component(&self.cx, &mut Access { store, instance })
            .await
            .map_err(|e| CodeError::Invalid(format!("snapshotting the JavaScript engine: {e:#}")))
    }
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
