//! The WebAssembly sandbox: one wasmtime [`Engine`] per node, one
//! [`Prepared`] (an `InstancePre`) per deployed type version, and one cheap
//! pooled instance per active actor.
//!
//! * Compiled code is cached on disk, keyed by the code's SHA-256 and the
//!   engine's compatibility hash, and loaded with `deserialize_file` (mmap)
//!   so waking never compiles.
//! * One pooling allocator for Rust actors and JavaScript sandboxes alike,
//!   sized at start-up for the node's active-actor cap within what the host
//!   allows ([`pool`]); memory is reserved up front and reset (freed) when
//!   an instance is dropped.
//! * CPU: an epoch ticker thread advances the engine every `tick`; each store
//!   yields to tokio on every tick and traps once a guest runs `cpu_slice`
//!   of its thread's CPU without calling the host ([`cpu_meter`]). Memory: `StoreLimits` per store, and one
//!   budget for what all live guests grow ([`guest_memory`]).

mod advise;
mod bindings;
mod caps;
mod cgroup;
mod code_cache;
mod cpu_meter;
mod guest_memory;
mod host;
mod js_engine;
mod output;
mod pool;
mod prefault;
mod run;
mod snapshot;
mod stack;
#[cfg(test)]
mod test_mapping;
mod trim;
mod turn;

use std::hash::{Hash, Hasher};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::AtomicU32;
use std::time::Duration;

use sha2::{Digest, Sha256};
use wasmtime::component::types::ComponentItem;
use wasmtime::component::{Component, ComponentExportIndex, HasSelf, InstancePre, Linker};
use wasmtime::{
    Config, Engine, InstanceAllocationStrategy, PoolingAllocationConfig, Store, UpdateDeadline,
};

pub use bindings::{Alarm, GuestError, InputAnswer, Message, Webhook};
pub use caps::actors::{
    ActorCalls, ActorLimits, CALL_KEY_PREFIX, CallChain, CallReply, DurableBefore, InboxClaim,
    call_refused, stored_call_key,
};
pub use caps::alarms::AlarmLimits;
pub use caps::events::EventLimits;
pub use caps::files::FileLimits;
pub use caps::http::{HttpAccess, HttpGrant};
pub use caps::inputs::InputLimits;
pub use caps::log::{LogBudget, LogLimits};
pub use caps::model::{ModelAccess, TurnUsage};
pub use caps::state::StateLimits;
pub use code_cache::{Swept, UNUSED_FOR as CODE_CACHE_UNUSED_FOR};
#[cfg(test)]
pub(crate) use cpu_meter::thread_cpu_time;
pub use guest_memory::GuestMemory;
pub use host::{JsModule, LimitTrap};
pub use pool::{HostLimits, PoolPlan};
pub use run::{
    EvalReply, GuestReply, Instance, InstanceLost, TurnFailure, TurnInput, TurnOutput, TurnRequest,
};
pub use stack::ASYNC_STACK_SIZE;
pub use trim::{Trimmed, page_size};
pub use turn::{ActorCounts, Carry, FinishedTurn, TurnLimits, TurnStart, release_blobs};

use caps::CapSet;
use caps::js::JsAccess;
use code_cache::CacheUse;
use host::Host;

use crate::config::ResolvedTypeConfig;
use crate::storage::Storage;

/// Compiled code linked against the host, ready to instantiate.
pub struct Prepared {
    pre: InstancePre<Host>,
    handlers: bindings::HandlersIndices,
    js: Option<bindings::JsRuntimeIndices>,
    /// Its `report-memory-origin`, if it has one (the built-in engines,
    /// and actors built with the Rust SDK): where a fresh instance's
    /// memory is, for [`prefault`] and [`trim`].
    origin: Option<ComponentExportIndex>,
    /// Trims give back snapshot pages, not only stacks: the built-in
    /// JavaScript engine (or a snapshot of it).
    trims_snapshot: bool,
    /// What [`Sandbox::trim`] compares its instances with.
    pristine: tokio::sync::Mutex<PristineSlot>,
    /// The pages a fresh instance writes, populated before its first turn
    /// (see [`prefault`]); used only with `origin`.
    writes: Arc<prefault::WriteSet>,
    /// The code-cache file the code was mapped from, kept fresh while this
    /// lives (see `code_cache.rs`).
    _file: Option<CacheUse>,
}

/// The pristine instance of a [`Prepared`], while trimmed instances hold
/// it.
#[derive(Default)]
struct PristineSlot {
    live: std::sync::Weak<trim::Pristine>,
    /// Making one failed for a reason that will not go away.
    impossible: bool,
}

impl Prepared {
    /// Whether this is the JavaScript engine (it exports `js-runtime`).
    pub fn is_js_engine(&self) -> bool {
        self.js.is_some()
    }

    /// Whether trims of idle instances ([`Sandbox::trim`]) give back
    /// snapshot pages too, not only their stacks: the built-in JavaScript
    /// engine's.
    pub fn trims_snapshot_pages(&self) -> bool {
        self.trims_snapshot && self.origin.is_some()
    }
}

/// What an instance is given besides its code.
pub struct InstanceSpec<'a> {
    /// The type's settings: memory, CPU slice, turn timeout, environment.
    pub config: &'a ResolvedTypeConfig,
    /// For JavaScript types: the module the engine runs.
    pub js_module: Option<Arc<JsModule>>,
    /// How its turns reach other actors (`None`: they cannot).
    pub actors: Option<Arc<dyn ActorCalls>>,
    /// What its turns may reach over HTTP (`None`: nothing).
    pub http: Option<HttpAccess>,
    /// Its turns' model calls (`None`: none).
    pub models: Option<ModelAccess>,
}

/// Why an instance could not be created.
#[derive(Debug, thiserror::Error)]
pub enum InstantiateError {
    /// The instance pool is full, or the kernel refused memory or
    /// mappings: try again once instances have been dropped.
    #[error("no room for another instance: {0}")]
    NoRoom(String),
    /// As many JavaScript sandboxes are live as the node allows: try again
    /// once one has been dropped.
    #[error("all {0} JavaScript sandboxes are in use")]
    TooManyJs(u32),
    /// Anything else.
    #[error("{0}")]
    Failed(String),
}

/// How to build the engine.
#[derive(Debug, Clone)]
pub struct SandboxConfig {
    /// Instances that may be live at once (active actors plus headroom),
    /// JavaScript sandboxes included: the pool's slots.
    pub max_instances: u32,
    /// Largest linear memory of any instance.
    pub max_memory_bytes: u64,
    /// JavaScript sandboxes that may be live at once (active JavaScript
    /// actors plus running evals), at most `max_instances`.
    pub max_js_instances: u32,
    /// Epoch tick.
    pub tick: Duration,
    /// Directory for compiled code.
    pub cache_dir: PathBuf,
    /// Bytes of stdout/stderr kept per turn.
    pub output_capacity: usize,
    /// Abort the process when a guest logs exactly this (crash tests only).
    pub fault_abort_marker: Option<Arc<str>>,
    /// Limits of every capability inside a turn.
    pub turn_limits: TurnLimits,
    /// Limits of a script run by `js.eval` (CPU, memory, time).
    pub eval: ResolvedTypeConfig,
    /// Bytes all live guests together may grow their memories by.
    pub guest_memory_budget: u64,
}

/// Why code cannot be deployed.
#[derive(Debug, thiserror::Error)]
pub enum CodeError {
    /// Not WebAssembly at all.
    #[error("not a WebAssembly binary (expected the `\\0asm` header)")]
    NotWasm,
    /// A core module where a component is needed.
    #[error(
        "this is a core WebAssembly module, not a component; build the actor for \
         `--target wasm32-wasip2` with the marmot guest SDK"
    )]
    CoreModule,
    /// Malformed or failed validation.
    #[error("invalid component: {0}")]
    Invalid(String),
    /// Does not fit the `marmot:actor` world.
    #[error("component does not fit the marmot:actor@0.1.0 world: {0}")]
    WrongWorld(String),
    /// A JavaScript module that does not compile.
    #[error("invalid JavaScript module: {0}")]
    Script(String),
    /// Nothing wrong with the code: the node had no sandbox free to check
    /// it in (every one busy with a turn). Retry.
    #[error("the node is busy: {0}; retry shortly")]
    Busy(String),
}

impl CodeError {
    /// What compiling or starting code failed with: the node's want of
    /// room (memory, mappings, file descriptors: `cannot create a memfd`
    /// at the open-files limit) is [`CodeError::Busy`], not bad code — a
    /// deploy was refused as `invalid_code` for the node's shortage
    /// (found by a probe).
    pub(crate) fn from_failure(msg: String) -> Self {
        if run::is_host_shortage(&msg) {
            Self::Busy(msg)
        } else {
            Self::Invalid(msg)
        }
    }
}

/// Dropped instances whose memory is decommitted together. Until a batch
/// is full its instances' pages stay resident and their slots taken: at
/// most `DECOMMIT_BATCH - 1` instances per core (per shard of wasmtime's
/// queue), flushed early when the pool runs short.
const DECOMMIT_BATCH: usize = 16;

/// The instance pool of `n` slots, each memory at most `max_memory_bytes`.
fn pooling(n: u32, max_memory_bytes: usize) -> PoolingAllocationConfig {
    let mut pool = PoolingAllocationConfig::new();
    pool.total_component_instances(n)
        .total_core_instances(n.saturating_mul(8))
        // One memory slot per instance slot, no more. A memory slot keeps
        // its copy-on-write image mapped after its instance is gone
        // (wasmtime's warm slots): four mappings for good once a Rust
        // actor used it. The pool plan counts one memory per slot (see
        // `pool`), and with twice as many a node at the default active
        // cap, churning through more actors than the cap, ran out of
        // `vm.max_map_count` and aborted: each thread takes never-used
        // memory slots of its own shard before warm ones of another. A
        // component with several memories takes several slots.
        .total_memories(n)
        .total_tables(n.saturating_mul(4))
        // A store keeps its fiber stack between calls, so every live
        // instance needs one. Each pooled stack is two memory mappings,
        // mapped up front (see `pool`).
        .total_stacks(n)
        .max_memory_size(max_memory_bytes)
        .max_core_instances_per_component(32)
        .max_memories_per_component(4)
        .max_tables_per_component(16)
        .max_unused_warm_slots(256)
        // Decommit the memory of several dropped instances in one
        // `process_madvise`: one TLB shootdown (an IPI to every other
        // core, a VM exit under a hypervisor) per batch instead of per
        // instance. See "Batched decommits" in docs/design.md.
        .decommit_batch_size(DECOMMIT_BATCH);
    pool
}

/// The wasmtime engine with its linker.
struct EngineParts {
    engine: Engine,
    linker: Linker<Host>,
    /// Compatibility hash, part of compiled-code cache names.
    hash: String,
    /// Cranelift's incremental cache (written and released after each
    /// compile).
    compile_cache: Arc<js_engine::CompileCache>,
}

impl EngineParts {
    fn new(config: &SandboxConfig) -> anyhow::Result<Self> {
        let pool = pooling(
            config.max_instances.max(16),
            config.max_memory_bytes as usize,
        );
        let mut wc = Config::new();
        wc.epoch_interruption(true)
            .allocation_strategy(InstanceAllocationStrategy::Pooling(pool))
            // Reserve exactly the memory limit: instances never move, and
            // 10k+ slots fit the address space. Costs explicit bounds checks.
            .memory_reservation(config.max_memory_bytes)
            .memory_reservation_for_growth(0)
            .memory_guard_size(64 << 10)
            // QuickJS's own stack limit (256 KiB of the guest's shadow
            // stack, `MAX_JS_STACK` in actors/quickjs) must be reached
            // before the wasm stack runs out, for every shape of recursion:
            // then deep recursion is a RangeError the code may catch, not a
            // trap. The parser takes the most wasm stack for the least
            // shadow stack, ~1.8 KB against ~160 bytes a nesting level, so
            // it reaches the limit ~1,600 levels down having used ~3 MB
            // (docs/design.md, "Deep recursion"). The rest is the host's.
            .max_wasm_stack(stack::ASYNC_STACK_SIZE - (512 << 10))
            .async_stack_size(stack::ASYNC_STACK_SIZE)
            // A stack goes back to the pool decommitted (zeroed by the
            // kernel): a hibernated actor keeps no stack pages resident,
            // and no guest reads another's old stack.
            .async_stack_zeroing(true)
            .cranelift_opt_level(wasmtime::OptLevel::Speed)
            // Compile on the deploying thread: parallel compilation leaves
            // ~60 MB behind in idle worker threads after a deploy.
            .parallel_compilation(false)
            // Memory images are mapped copy-on-write: a JavaScript sandbox
            // maps the ~580 KB snapshot heap instead of copying it (eval
            // p50 494 → 229 µs), and instances of one Rust type share their
            // data pages (PSS per active counter 62 → 50 KB, wake time
            // unchanged). It costs mappings: 4 per live Rust instance
            // instead of 2, 3 per sandbox (see `pool`).
            .memory_init_cow(true);
        // A JavaScript type version's snapshot is the engine with other
        // data: compiling it reuses every function compiled before.
        let compile_cache = Arc::new(js_engine::CompileCache::open(
            config.cache_dir.join("cranelift-incremental.cache"),
        ));
        wc.enable_incremental_compilation(compile_cache.clone())
            .map_err(anyhow::Error::from)?;
        // `MARMOT_WASM_PERFMAP=1`: name guest functions for `perf`
        // (/tmp/perf-PID.map), to profile where a turn's guest time goes.
        if std::env::var_os("MARMOT_WASM_PERFMAP").is_some_and(|v| v == "1") {
            wc.profiler(wasmtime::ProfilingStrategy::PerfMap);
        }
        let engine = Engine::new(&wc).map_err(anyhow::Error::from)?;
        let mut linker: Linker<Host> = Linker::new(&engine);
        wasmtime_wasi::p2::add_to_linker_async(&mut linker).map_err(anyhow::Error::from)?;
        bindings::JsEngine::add_to_linker::<Host, HasSelf<Host>>(&mut linker, |h| h)
            .map_err(anyhow::Error::from)?;
        trim::link(&mut linker).map_err(anyhow::Error::from)?;
        let hash = {
            let mut h = std::collections::hash_map::DefaultHasher::new();
            engine.precompile_compatibility_hash().hash(&mut h);
            format!("{:016x}", h.finish())
        };
        Ok(Self {
            engine,
            linker,
            hash,
            compile_cache,
        })
    }
}

/// The engine, its linker, its instance pool and the compiled-code cache.
///
/// One engine and one pool for Rust actors and JavaScript sandboxes: every
/// pool slot costs memory mappings up front (its fiber stack), so two
/// pools each sized for the active cap did not fit Linux's default
/// `vm.max_map_count`, and a JavaScript pool sized below it made active
/// JavaScript actors evict each other. JavaScript sandboxes are counted
/// against their own cap (`max_js_instances`, from memory) instead.
pub struct Sandbox {
    parts: EngineParts,
    /// JavaScript sandboxes live now, against `config.max_js_instances`.
    js_live: Arc<AtomicU32>,
    config: SandboxConfig,
    tick_ms: u64,
    /// What turns read committed state from.
    storage: Arc<Storage>,
    turn_limits: Arc<TurnLimits>,
    /// The built-in JavaScript engine and its snapshots.
    js: js_engine::JsEngines,
    /// The built-in agent harness, compiled on first use.
    agent_engine: std::sync::Mutex<Option<Arc<Prepared>>>,
    /// Which compiled-code cache files this node uses.
    cache: code_cache::CodeCache,
    /// What live guests have grown their memories by, against the budget.
    guest_memory: Arc<GuestMemory>,
}

impl Sandbox {
    /// What guests' log output is charged to, per type (also what the
    /// node logs of a guest's doing: the messages of failed turns).
    pub fn log_budget(&self) -> &LogBudget {
        &self.turn_limits.log.budget
    }

    /// Instances the pool holds at once (`js == false`), or JavaScript
    /// sandboxes that may be live at once.
    pub fn pool_size(&self, js: bool) -> usize {
        if js {
            self.config.max_js_instances as usize
        } else {
            self.config.max_instances as usize
        }
    }

    /// The node's budget for guest memory growth.
    pub fn guest_memory(&self) -> &Arc<GuestMemory> {
        &self.guest_memory
    }

    /// JavaScript sandboxes live now, counted against the cap.
    pub fn js_sandboxes(&self) -> u32 {
        self.js_live.load(std::sync::atomic::Ordering::Relaxed)
    }

    /// Build the engine and start its epoch ticker. Turns read what is
    /// committed from `storage`.
    pub fn new(config: SandboxConfig, storage: Arc<Storage>) -> anyhow::Result<Arc<Self>> {
        let parts = EngineParts::new(&config)?;
        std::fs::create_dir_all(&config.cache_dir).map_err(|e| {
            anyhow::anyhow!(
                "failed to create compiled-code cache `{}`: {e}",
                config.cache_dir.display()
            )
        })?;
        let tick_ms = config.tick.as_millis().max(1) as u64;
        let turn_limits = Arc::new(config.turn_limits.clone());
        let cache = code_cache::CodeCache::new(config.cache_dir.clone());
        let guest_memory = GuestMemory::new(config.guest_memory_budget);
        let sandbox = Arc::new(Self {
            parts,
            js_live: Arc::new(AtomicU32::new(0)),
            config,
            tick_ms,
            storage,
            turn_limits,
            js: js_engine::JsEngines::default(),
            agent_engine: std::sync::Mutex::new(None),
            cache,
            guest_memory,
        });
        let engine = sandbox.parts.engine.weak();
        let tick = sandbox.config.tick;
        std::thread::Builder::new()
            .name("marmot-epoch".into())
            .spawn(move || {
                while let Some(engine) = engine.upgrade() {
                    engine.increment_epoch();
                    drop(engine);
                    std::thread::sleep(tick);
                }
            })?;
        Ok(sandbox)
    }

    /// Compile `code` (or load it from the cache) and check that it fits the
    /// actor world. Blocking: call from a blocking thread.
    pub fn prepare(&self, code: &[u8]) -> Result<Prepared, CodeError> {
        let (component, file) = self.compile(code)?;
        self.link(&component, file)
    }

    /// The built-in agent harness (`actors/agent`), compiled (or loaded
    /// from the cache) on first use and shared by every agent type, which
    /// differ only in their manifest. Blocking.
    pub fn agent_engine(&self) -> Result<Arc<Prepared>, CodeError> {
        let mut slot = self.agent_engine.lock().expect("agent engine lock");
        if let Some(p) = &*slot {
            return Ok(p.clone());
        }
        let p = Arc::new(self.prepare(crate::guests::AGENT)?);
        *slot = Some(p.clone());
        Ok(p)
    }

    /// Link the built-in JavaScript engine (or a snapshot of it): like
    /// [`link`](Self::link), and trims of its sandboxes give back the
    /// snapshot pages their turns left unchanged. Never for deployed code:
    /// only the engine's turns write pages back as they found them.
    fn link_js_engine(
        &self,
        component: &Component,
        file: Option<CacheUse>,
    ) -> Result<Prepared, CodeError> {
        let mut prepared = self.link(component, file)?;
        if !prepared.is_js_engine() {
            return Err(CodeError::WrongWorld(
                "the built-in JavaScript engine does not export js-runtime".into(),
            ));
        }
        prepared.trims_snapshot = true;
        Ok(prepared)
    }

    /// Link compiled code against the host and check it fits the actor
    /// world; `file` is the cache file it was mapped from, if any.
    fn link(&self, component: &Component, file: Option<CacheUse>) -> Result<Prepared, CodeError> {
        let pre = self
            .parts
            .linker
            .instantiate_pre(component)
            .map_err(|e| CodeError::WrongWorld(format!("{e:#}")))?;
        let handlers = bindings::HandlersIndices::new(&pre)
            .map_err(|e| CodeError::WrongWorld(format!("{e:#}")))?;
        // Only the built-in engine exports `js-runtime`.
        let js = bindings::JsRuntimeIndices::new(&pre).ok();
        // Any code may export `report-memory-origin` (the SDK's actors do):
        // the host takes the answer from wasmtime, not from the guest.
        // A function of another shape by that name is left alone.
        let origin = match component.get_export(None, trim::ORIGIN_EXPORT) {
            Some((ComponentItem::ComponentFunc(f), index))
                if f.params().len() == 0 && f.results().len() == 0 && !f.async_() =>
            {
                Some(index)
            }
            _ => None,
        };
        Ok(Prepared {
            pre,
            handlers,
            js,
            origin,
            trims_snapshot: false,
            pristine: Default::default(),
            writes: Default::default(),
            _file: file,
        })
    }

    /// Remove the compiled-code cache files that no node sharing the
    /// directory has used for `unused_for` ([`CODE_CACHE_UNUSED_FOR`] in production),
    /// after marking this node's own as used. Blocking.
    pub fn sweep_code_cache(&self, unused_for: Duration) -> std::io::Result<Swept> {
        self.cache.sweep(std::time::SystemTime::now(), unused_for)
    }

    /// The limits of a script run by `js.eval`.
    pub fn eval_config(&self) -> &ResolvedTypeConfig {
        &self.config.eval
    }

    /// Compiled `code`, from the cache or compiled now, with its cache
    /// file's use.
    fn compile(&self, code: &[u8]) -> Result<(Component, Option<CacheUse>), CodeError> {
        check_header(code)?;
        let sha = hex::encode(Sha256::digest(code));
        let path = self
            .config
            .cache_dir
            .join(format!("{sha}-{}.cwasm", self.parts.hash));
        match self.load_cached(&path) {
            Some((c, file)) => Ok((c, Some(file))),
            None => self.compile_into(code, &path),
        }
    }

    /// Compile `code` and cache the result at `path`; the code returned is
    /// the cached file's, mapped: pages the kernel may drop and read again,
    /// as after a restart. The compiled code in memory was anonymous, ~4 MB
    /// of engine code per JavaScript type held for as long as the type is
    /// deployed (found by a probe: 5 MB per type, actors asleep or not).
    fn compile_into(
        &self,
        code: &[u8],
        path: &Path,
    ) -> Result<(Component, Option<CacheUse>), CodeError> {
        let component = Component::new(&self.parts.engine, code)
            .map_err(|e| CodeError::from_failure(format!("{e:#}")))?;
        self.parts.compile_cache.release();
        match component.serialize() {
            Ok(bytes) => {
                let stored = self.cache.store(path, &bytes, "compiled code");
                drop(bytes);
                if let Some((mapped, file)) = self.load_cached(path) {
                    return Ok((mapped, Some(file)));
                }
                return Ok((component, stored));
            }
            Err(e) => tracing::warn!(error = %e, "failed to serialize compiled code"),
        }
        Ok((component, None))
    }

    /// Compiled code from the cache at `path` (mapped, not read), if there
    /// is any; an entry that does not load is removed.
    fn load_cached(&self, path: &Path) -> Option<(Component, CacheUse)> {
        if !path.exists() {
            return None;
        }
        // The file was written by this node from a successful `serialize`,
        // under a name that includes the engine's compatibility hash;
        // wasmtime re-checks that hash on load.
        #[allow(unsafe_code, reason = "loading our own compiled-code cache")]
        let loaded = unsafe { Component::deserialize_file(&self.parts.engine, path) };
        match loaded {
            Ok(c) => Some((c, self.cache.used(path))),
            Err(e) => {
                tracing::warn!(path = %path.display(), error = %e, "discarding unusable compiled-code cache entry");
                let _ = std::fs::remove_file(path);
                None
            }
        }
    }

    /// Instantiate `pre` in a fresh store: an actor's instance, with every
    /// capability and child JavaScript sandboxes.
    pub async fn instantiate(
        self: &Arc<Self>,
        pre: &Prepared,
        spec: InstanceSpec<'_>,
    ) -> Result<Instance, InstantiateError> {
        let js = Some(JsAccess {
            sandbox: self.clone(),
        });
        self.instantiate_with(pre, spec, js, CapSet::ALL).await
    }

    /// Give back what `inst`, an idle instance of `pre`, holds but does
    /// not need until its next call: the pages of the fiber stack its
    /// store keeps (see [`stack`]), and for the built-in JavaScript engine
    /// the snapshot pages its turns copied but left as they were (see
    /// [`trim`]). `Ok(None)`: nothing could be done here. `Err`: a call
    /// into the store failed, and `inst` must not run again.
    pub async fn trim(
        &self,
        pre: &Prepared,
        inst: &mut Instance,
    ) -> Result<Option<Trimmed>, InstanceLost> {
        let origin = match pre.trims_snapshot_pages() {
            true => inst.memory_origin().await?,
            false => None,
        };
        if origin.is_some() && inst.pristine.is_none() {
            inst.pristine = self.pristine(pre).await;
        }
        // The store's latest call, so the stack it ran on is the one the
        // store keeps (see `stack`).
        let stack = stack::bounds(inst.stack_point().await?, stack::ASYNC_STACK_SIZE);
        let trimmed = match (origin, inst.pristine.clone()) {
            (Some(origin), Some(pristine)) => {
                trim::trim(origin, &pristine, stack).map(|(trimmed, runs)| {
                    inst.refault = runs;
                    trimmed
                })
            }
            _ => trim::trim_stack(stack),
        };
        match trimmed {
            Ok(trimmed) => Ok(Some(trimmed)),
            Err(e) => {
                tracing::debug!(error = %e, "trimming an idle instance failed");
                Ok(None)
            }
        }
    }

    /// The instance of `pre` that trims compare with: kept while any
    /// trimmed instance of `pre` lives, made again after. `None`: the pool
    /// has no room now, or trimming is not possible here.
    async fn pristine(&self, pre: &Prepared) -> Option<Arc<trim::Pristine>> {
        let mut slot = pre.pristine.lock().await;
        if slot.impossible {
            return None;
        }
        if let Some(p) = slot.live.upgrade() {
            return Some(p);
        }
        // Its memory may start as large as any type's.
        let mut config = self.config.eval.clone();
        config.max_memory_bytes = self.config.max_memory_bytes;
        let spec = InstanceSpec {
            config: &config,
            js_module: None,
            actors: None,
            http: None,
            models: None,
        };
        // Not counted against the JavaScript sandbox cap: it never runs,
        // and its memory is the snapshot's pages, shared.
        let made = match self
            .instantiate_in(pre, spec, None, CapSet::NONE, None)
            .await
        {
            Ok(mut inst) => match inst.memory_origin().await {
                Ok(Some(origin)) => trim::Pristine::new(inst, origin).map_err(|e| e.to_string()),
                _ => Err("the engine did not say where its memory is".into()),
            },
            Err(InstantiateError::NoRoom(_) | InstantiateError::TooManyJs(_)) => return None,
            Err(InstantiateError::Failed(e)) => Err(e),
        };
        match made {
            Ok(p) => {
                let p = Arc::new(p);
                slot.live = Arc::downgrade(&p);
                Some(p)
            }
            Err(e) => {
                tracing::warn!(error = %e, "JavaScript sandboxes will not be trimmed");
                slot.impossible = true;
                None
            }
        }
    }

    /// Instantiate `pre` for `spec`, granting `granted` and `js`.
    pub(crate) async fn instantiate_with(
        &self,
        pre: &Prepared,
        spec: InstanceSpec<'_>,
        js: Option<JsAccess>,
        granted: CapSet,
    ) -> Result<Instance, InstantiateError> {
        // JavaScript sandboxes count against their own cap before taking
        // a slot of the shared pool.
        let js_slot = match &pre.js {
            Some(_) => Some(
                pool::JsSlot::take(&self.js_live, self.config.max_js_instances)
                    .ok_or(InstantiateError::TooManyJs(self.config.max_js_instances))?,
            ),
            None => None,
        };
        let mut inst = self.instantiate_in(pre, spec, js, granted, js_slot).await?;
        if pre.origin.is_some() {
            inst.prefault(&pre.writes).await.map_err(|e| {
                InstantiateError::Failed(format!(
                    "its `{}` export trapped or did not return in time ({e})",
                    trim::ORIGIN_EXPORT
                ))
            })?;
        }
        Ok(inst)
    }

    /// Instantiate `pre`, counted in `js_slot` if it is a JavaScript
    /// sandbox that counts against the node's cap.
    async fn instantiate_in(
        &self,
        pre: &Prepared,
        spec: InstanceSpec<'_>,
        js: Option<JsAccess>,
        granted: CapSet,
        js_slot: Option<pool::JsSlot>,
    ) -> Result<Instance, InstantiateError> {
        let turn_timeout = spec.config.turn_timeout;
        let host = Host::new(
            spec,
            js,
            granted,
            self.tick_ms,
            self.config.output_capacity,
            self.config.fault_abort_marker.clone(),
            Some(self.guest_memory.clone()),
        );
        // The component knows which engine compiled it.
        let mut store = Store::new(pre.pre.component().engine(), host);
        store.limiter(|h| &mut h.limits);
        meter_cpu(&mut store);
        let loaded = async {
            let instance = pre.pre.instantiate_async(&mut store).await?;
            store.data_mut().limits.instantiated();
            let handlers = pre.handlers.load(&mut store, &instance)?;
            let js = match &pre.js {
                Some(js) => Some(js.load(&mut store, &instance)?),
                None => None,
            };
            let origin = match &pre.origin {
                Some(i) => Some(instance.get_typed_func::<(), ()>(&mut store, i)?),
                None => None,
            };
            Ok::<_, wasmtime::Error>(run::Exports {
                handlers,
                js,
                origin,
            })
        };
        match loaded.await {
            Ok(exports) => Ok(Instance::new(
                store,
                exports,
                turn_timeout,
                self.turn_limits.clone(),
                self.storage.clone(),
                js_slot,
            )),
            Err(e) => {
                let msg = format!("{e:#}");
                Err(if run::is_resource_exhaustion(&msg) {
                    InstantiateError::NoRoom(msg)
                } else {
                    InstantiateError::Failed(msg)
                })
            }
        }
    }
}

/// Yield to tokio on every epoch tick, and trap once the guest has run
/// its CPU slice without calling the host ([`cpu_meter`]).
fn meter_cpu(store: &mut Store<Host>) {
    store.epoch_deadline_callback(|mut ctx| {
        let meter = &mut ctx.data_mut().cpu;
        meter.tick().map_err(wasmtime::Error::new)?;
        let id = meter.id();
        // tokio's own yield, not wasmtime's plain one: it lets the worker
        // poll for I/O before the guest runs on. With wasmtime's, a guest
        // woke itself at once and the worker looked at its sockets only
        // every 61 polls, ~0.6 s at 10 ms a slice: two actors looping on
        // a 2-core node delayed every request by 125-450 ms (a probe).
        // Where it resumes, the meter reads the thread's CPU from.
        Ok(UpdateDeadline::YieldCustom(
            1,
            Box::pin(async move {
                tokio::task::yield_now().await;
                cpu_meter::resumed(id);
            }),
        ))
    });
    store.set_epoch_deadline(1);
}

fn check_header(code: &[u8]) -> Result<(), CodeError> {
    if code.len() < 8 || &code[..4] != b"\0asm" {
        return Err(CodeError::NotWasm);
    }
    // Core modules have version 1; components carry layer 1 in bytes 6..8.
    if code[4..8] == [1, 0, 0, 0] {
        return Err(CodeError::CoreModule);
    }
    Ok(())
}

fn write_atomic(path: &Path, bytes: &[u8]) -> std::io::Result<()> {
    let tmp = path.with_extension(format!("tmp{}", std::process::id()));
    let written = std::fs::write(&tmp, bytes).and_then(|()| std::fs::rename(&tmp, path));
    if written.is_err() {
        // A disk that filled up mid-write kept the part written, and the
        // node's own leftovers then held the space it needed to recover
        // (its readiness stayed at `disk_fault` until removed by hand).
        let _ = std::fs::remove_file(&tmp);
    }
    written
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_failed_atomic_write_leaves_no_temporary_file() {
        let dir = tempfile::tempdir().unwrap();
        // The rename fails: a directory that is not empty holds the name.
        let target = dir.path().join("entry.cwasm");
        std::fs::create_dir_all(target.join("inside")).unwrap();
        assert!(write_atomic(&target, b"code").is_err());
        let left: Vec<_> = std::fs::read_dir(dir.path())
            .unwrap()
            .map(|e| e.unwrap().file_name())
            .collect();
        assert_eq!(left, ["entry.cwasm"], "only the directory that was there");
        // And one that works replaces nothing else.
        let fine = dir.path().join("fine.cwasm");
        write_atomic(&fine, b"code").unwrap();
        assert_eq!(std::fs::read(&fine).unwrap(), b"code");
    }

    /// The pool plan counts one memory per slot (`pool::MAPS_PER_LIVE`
    /// for each): the pool must not hold more memories than slots, or
    /// memory slots beyond the count keep their images mapped and the
    /// node runs out of `vm.max_map_count`.
    #[test]
    fn the_pool_holds_no_more_memories_than_slots() {
        const SLOTS: u32 = 32;
        let (engine, module) = small_engine(SLOTS);
        let instantiate = || {
            let mut store = Store::new(&engine, ());
            wasmtime::Instance::new(&mut store, &module, &[]).map(|_| store)
        };
        // Core instances are plenty (8 per slot): memories run out first.
        let live: Vec<_> = (0..SLOTS).map(|_| instantiate().unwrap()).collect();
        let e = instantiate()
            .map(|_| ())
            .expect_err("one memory more than slots");
        let msg = format!("{e:#}");
        assert!(
            run::is_resource_exhaustion(&msg),
            "a full pool is no room, not bad code: {msg}"
        );
        drop(live);
        instantiate().expect("room again once the instances are gone");
    }

    #[test]
    fn the_hosts_shortage_is_no_fault_of_the_code() {
        for msg in [
            "instantiating: cannot create a memfd: Too many open files (os error 24)",
            "mmap failed: Cannot allocate memory (os error 12)",
        ] {
            assert!(
                matches!(CodeError::from_failure(msg.into()), CodeError::Busy(_)),
                "{msg}"
            );
        }
        // A pool's limits are what code asking too much meets too.
        for msg in [
            "memory minimum exceeds the pooling allocator's limit",
            "bad magic",
        ] {
            assert!(
                matches!(CodeError::from_failure(msg.into()), CodeError::Invalid(_)),
                "{msg}"
            );
        }
    }

    /// The engine of [`the_pool_holds_no_more_memories_than_slots`] with
    /// `slots` slots, and its one module.
    fn small_engine(slots: u32) -> (Engine, wasmtime::Module) {
        // (module (memory 1) (data (i32.const 0) "*")): a memory with a
        // data image, as a Rust actor has.
        const MODULE: &[u8] = &[
            0x00, 0x61, 0x73, 0x6d, 0x01, 0x00, 0x00, 0x00, // header
            0x05, 0x03, 0x01, 0x00, 0x01, // one memory of one page
            0x0b, 0x07, 0x01, 0x00, 0x41, 0x00, 0x0b, 0x01, 0x2a, // its data
        ];
        let mut config = Config::new();
        config
            .allocation_strategy(InstanceAllocationStrategy::Pooling(pooling(slots, 1 << 20)))
            .memory_reservation(1 << 20)
            .memory_reservation_for_growth(0)
            .memory_guard_size(64 << 10)
            .memory_init_cow(true);
        let engine = Engine::new(&config).unwrap();
        let module = wasmtime::Module::new(&engine, MODULE).unwrap();
        (engine, module)
    }

    /// A module's first instance makes its memory image in a memfd; at the
    /// open-files limit that fails, and the failure is "no room" (the
    /// turn waits, then 503), not a trap of the actor's code.
    #[cfg(target_os = "linux")]
    #[test]
    fn no_file_descriptor_left_is_no_room() {
        const CHILD: &str = "MARMOT_TEST_NO_FD_CHILD";
        const NAME: &str = "sandbox::tests::no_file_descriptor_left_is_no_room";
        if std::env::var_os(CHILD).is_none() {
            // The limit is the process's: lower it in a child of its own.
            return crate::test_child::rerun(NAME, &[(CHILD, Some("1"))]);
        }
        let (engine, module) = small_engine(16);
        let mut lim = libc::rlimit {
            rlim_cur: 0,
            rlim_max: 0,
        };
        // SAFETY: `lim` is a local `rlimit` for the kernel to fill, then read.
        #[allow(unsafe_code, reason = "lowering this child's own limit")]
        unsafe {
            assert_eq!(libc::getrlimit(libc::RLIMIT_NOFILE, &mut lim), 0);
            lim.rlim_cur = lim.rlim_max.min(128);
            assert_eq!(libc::setrlimit(libc::RLIMIT_NOFILE, &lim), 0);
        }
        // Take every descriptor left.
        let mut held = Vec::new();
        while let Ok(f) = std::fs::File::open("/dev/null") {
            held.push(f);
        }
        let mut store = Store::new(&engine, ());
        let e = wasmtime::Instance::new(&mut store, &module, &[])
            .map(|_| ())
            .expect_err("no descriptor for the memfd");
        let msg = format!("{e:#}");
        assert!(
            run::is_resource_exhaustion(&msg),
            "not taken for no room: {msg}"
        );
        drop(held);
        wasmtime::Instance::new(&mut store, &module, &[]).expect("room again");
    }

    #[test]
    fn headers() {
        assert!(matches!(
            check_header(b"hello world"),
            Err(CodeError::NotWasm)
        ));
        assert!(matches!(
            check_header(b"\0asm\x01\0\0\0"),
            Err(CodeError::CoreModule)
        ));
        assert!(check_header(b"\0asm\x0d\0\x01\0").is_ok());
    }
}
