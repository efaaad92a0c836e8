//! The data every store carries, and the guard every host call passes.

use std::sync::Arc;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use wasmtime::StoreLimitsBuilder;
use wasmtime::component::ResourceTable;
use wasmtime_wasi::{WasiCtx, WasiCtxBuilder, WasiCtxView, WasiView};

use super::InstanceSpec;
use super::caps::actors::ActorCalls;
use super::caps::http::HttpAccess;
use super::caps::js::JsAccess;
use super::caps::model::ModelAccess;
use super::caps::{Cap, CapSet};
use super::cpu_meter::CpuMeter;
use super::guest_memory::{GuestLimits, GuestMemory};
use super::output::GuestOutput;
use super::turn::TurnState;
use crate::config::ResolvedTypeConfig;

/// What a trap was caused by, when the host caused it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum LimitTrap {
    /// The guest ran too long without calling the host.
    #[error("CPU limit exceeded: the guest ran {0} ms without calling the host")]
    Cpu(u64),
    /// A run whose CPU slice is its whole run (an eval) used it up; host
    /// calls do not start it again.
    #[error("CPU limit exceeded: the script ran {0} ms of CPU in all")]
    CpuInAll(u64),
    /// A host call was made outside a turn (a bug in the host).
    #[error("host call outside a turn")]
    NoTurn,
    /// A script called a capability its caller did not grant it.
    #[error("capability `{0}` is not granted to this script")]
    NotGranted(&'static str),
}

/// Store data for one actor instance.
pub struct Host {
    wasi: WasiCtx,
    pub(super) table: ResourceTable,
    /// The store's memory and table limits, and its charge against the
    /// node's guest memory budget.
    pub(super) limits: GuestLimits,
    /// The running turn, if any.
    pub(super) turn: Option<TurnState>,
    /// The CPU the guest has run since its last host call (or in all).
    pub(super) cpu: CpuMeter,
    /// Captured stdout and stderr.
    pub(super) stdout: GuestOutput,
    pub(super) stderr: GuestOutput,
    /// Abort the process when a guest logs exactly this (crash tests).
    pub(super) fault_abort_marker: Option<Arc<str>>,
    /// For the JavaScript engine: the module it runs.
    pub(super) js_module: Option<Arc<JsModule>>,
    /// Other actors, for `actors.call` and `actors.send`.
    pub(super) actors: Option<Arc<dyn ActorCalls>>,
    /// The network, as far as the type may reach it.
    pub(super) http: Option<HttpAccess>,
    /// The model gateway.
    pub(super) models: Option<ModelAccess>,
    /// Child JavaScript sandboxes (`js.eval`).
    pub(super) js: Option<JsAccess>,
    /// What this instance's guest may call (all, but in a child sandbox).
    pub(super) granted: CapSet,
    /// Where the guest's memory is, once asked (code that exports
    /// `report-memory-origin`: see [`trim`](super::trim) and
    /// [`prefault`](super::prefault)).
    pub(super) memory_origin: Option<super::trim::MemoryOrigin>,
    /// The host is asking the guest where its memory is: the only time
    /// the answer is taken.
    pub(super) origin_asked: bool,
}

/// A JavaScript module as the engine receives it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct JsModule {
    /// File name shown in stack traces.
    pub name: String,
    /// Source text.
    pub source: String,
}

impl Host {
    /// Store data for an instance given `spec`, which may call `granted`
    /// and start child JavaScript sandboxes through `js`; what its guest
    /// grows is charged to `guest_memory`, if given.
    pub(super) fn new(
        spec: InstanceSpec<'_>,
        js: Option<JsAccess>,
        granted: CapSet,
        tick_ms: u64,
        output_capacity: usize,
        fault_abort_marker: Option<Arc<str>>,
        guest_memory: Option<Arc<GuestMemory>>,
    ) -> Self {
        let config: &ResolvedTypeConfig = spec.config;
        let stdout = GuestOutput::new(output_capacity);
        let stderr = GuestOutput::new(output_capacity);
        let mut wasi = WasiCtxBuilder::new();
        wasi.stdout(stdout.clone()).stderr(stderr.clone());
        if crate::clock::offset_ms() != 0 {
            wasi.wall_clock(GuestWallClock);
        }
        for (k, v) in &config.env {
            wasi.env(k, v);
        }
        let limits = StoreLimitsBuilder::new()
            .memory_size(config.max_memory_bytes as usize)
            .trap_on_grow_failure(true)
            .instances(64)
            .tables(64)
            .memories(8)
            .build();
        let limits = GuestLimits::new(limits, config.max_memory_bytes as usize, guest_memory);
        let cpu = CpuMeter::new(
            config.cpu_slice,
            !config.cpu_slice_is_total,
            Duration::from_millis(tick_ms.max(1)),
        );
        Self {
            wasi: wasi.build(),
            table: ResourceTable::new(),
            limits,
            turn: None,
            cpu,
            stdout,
            stderr,
            fault_abort_marker,
            js_module: spec.js_module,
            actors: spec.actors,
            http: spec.http,
            models: spec.models,
            js,
            granted,
            memory_origin: None,
            origin_asked: false,
        }
    }

    /// The checkpoint every guest-facing host call passes first: it proves a
    /// turn is running, resets the CPU meter (the limit is per host-call-free
    /// stretch, except a script's) and hands out the turn.
    pub(super) fn enter(&mut self, cap: Cap) -> wasmtime::Result<&mut TurnState> {
        self.host_call_ends_stretch();
        if !self.granted.has(cap) {
            return Err(wasmtime::Error::new(LimitTrap::NotGranted(cap.name())));
        }
        self.turn
            .as_mut()
            .ok_or_else(|| wasmtime::Error::new(LimitTrap::NoTurn))
    }

    /// A host call (or the wait for one) ends a stretch of guest CPU: the
    /// meter starts again, unless the slice is the whole run's.
    pub(super) fn host_call_ends_stretch(&mut self) {
        self.cpu.host_call();
    }
}

impl WasiView for Host {
    fn ctx(&mut self) -> WasiCtxView<'_> {
        WasiCtxView {
            ctx: &mut self.wasi,
            table: &mut self.table,
        }
    }
}

/// The shifted clock for guests' WASI `wall-clock`.
struct GuestWallClock;

impl wasmtime_wasi::HostWallClock for GuestWallClock {
    fn resolution(&self) -> Duration {
        Duration::from_millis(1)
    }

    fn now(&self) -> Duration {
        let real = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .unwrap_or_default();
        let offset = crate::clock::offset_ms();
        if offset >= 0 {
            real + Duration::from_millis(offset as u64)
        } else {
            real.saturating_sub(Duration::from_millis(offset.unsigned_abs()))
        }
    }
}
