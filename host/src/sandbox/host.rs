//! The data every store carries, and the guard every host call passes.

use std::sync::Arc;

use wasmtime::component::ResourceTable;
use wasmtime::{StoreLimits, StoreLimitsBuilder};
use wasmtime_wasi::{WasiCtx, WasiCtxBuilder, WasiCtxView, WasiView};

use super::output::GuestOutput;
use super::turn::TurnState;
use crate::config::ResolvedTypeConfig;

/// What a trap was caused by, when the host caused it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum LimitTrap {
    /// The guest ran too long without calling the host.
    #[error("CPU limit exceeded: the guest ran {0} ms without calling the host")]
    Cpu(u64),
    /// A host call was made outside a turn (a bug in the host).
    #[error("host call outside a turn")]
    NoTurn,
}

/// Store data for one actor instance.
pub struct Host {
    wasi: WasiCtx,
    table: ResourceTable,
    pub(crate) limits: StoreLimits,
    /// The running turn, if any.
    pub(crate) turn: Option<TurnState>,
    /// Epoch ticks the guest has run since its last host call.
    pub(crate) cpu_ticks: u64,
    /// Ticks allowed between host calls.
    pub(crate) cpu_tick_limit: u64,
    /// Milliseconds per tick (for messages).
    pub(crate) tick_ms: u64,
    /// Captured stdout and stderr.
    pub(crate) stdout: GuestOutput,
    pub(crate) stderr: GuestOutput,
    /// Abort the process when a guest logs exactly this (crash tests).
    pub(crate) fault_abort_marker: Option<Arc<str>>,
    /// For the JavaScript engine: the module it runs.
    pub(crate) js_module: Option<Arc<JsModule>>,
    /// Other actors, for `actors.call` and `actors.send`.
    pub(crate) actors: Option<Arc<dyn ActorCalls>>,
}

/// The callers above a turn, outermost first: a turn that was started by
/// `actors.call` from A, itself called from B, has chain `[B, A]`.
pub type CallChain = Arc<[crate::ids::ActorKey]>;

/// A reply from another actor.
#[derive(Debug, Clone)]
pub struct CallReply {
    /// Its status.
    pub status: u16,
    /// Its body.
    pub body: Vec<u8>,
    /// Its content type.
    pub content_type: Option<String>,
}

/// What turns may ask of other actors; the node implements it. A narrow
/// trait keeps the sandbox free of the actor runtime.
pub trait ActorCalls: Send + Sync {
    /// Send `body` to `to` as a message and wait for its (durable) reply.
    /// `chain` holds the callers above the call, the caller last.
    fn call(
        &self,
        to: crate::ids::ActorKey,
        body: Vec<u8>,
        chain: CallChain,
    ) -> futures::future::BoxFuture<'static, Result<CallReply, super::bindings::GuestError>>;

    /// Whether type `ty` is deployed.
    fn type_exists(&self, ty: &str) -> bool;
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
    /// Store data for an instance of a type configured as `config`.
    pub fn new(
        config: &ResolvedTypeConfig,
        tick_ms: u64,
        output_capacity: usize,
        fault_abort_marker: Option<Arc<str>>,
    ) -> Self {
        let stdout = GuestOutput::new(output_capacity);
        let stderr = GuestOutput::new(output_capacity);
        let mut wasi = WasiCtxBuilder::new();
        wasi.stdout(stdout.clone()).stderr(stderr.clone());
        if crate::clock::offset_ms() != 0 {
            wasi.wall_clock(crate::clock::GuestWallClock);
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
        let cpu_tick_limit = (config.cpu_slice.as_millis() as u64)
            .div_ceil(tick_ms.max(1))
            .max(1);
        Self {
            wasi: wasi.build(),
            table: ResourceTable::new(),
            limits,
            turn: None,
            cpu_ticks: 0,
            cpu_tick_limit,
            tick_ms,
            stdout,
            stderr,
            fault_abort_marker,
            js_module: None,
            actors: None,
        }
    }

    /// Give the JavaScript engine in this store its module.
    pub fn with_js_module(mut self, module: Option<Arc<JsModule>>) -> Self {
        self.js_module = module;
        self
    }

    /// Let turns reach other actors.
    pub fn with_actors(mut self, actors: Arc<dyn ActorCalls>) -> Self {
        self.actors = Some(actors);
        self
    }

    /// The checkpoint every guest-facing host call passes first: it proves a
    /// turn is running, resets the CPU meter (the limit is per host-call-free
    /// stretch) and hands out the turn.
    pub(crate) fn enter(&mut self) -> wasmtime::Result<&mut TurnState> {
        self.cpu_ticks = 0;
        self.turn
            .as_mut()
            .ok_or_else(|| wasmtime::Error::new(LimitTrap::NoTurn))
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
