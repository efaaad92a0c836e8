//! Running a handler: getting an instance (making room in a full pool),
//! upgrading the actor to its type's newest version, and the one call into
//! the sandbox per turn.

use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

use tracing::Instrument;

use super::super::env::ActorEnv;
use super::super::registry::{Room, SLOT_JS, SLOT_NONE, SLOT_WASM, Shared};
use super::super::{Shortage, TurnError};
use super::{ActorTask, CommitExtras, MAX_COMMITS_IN_FLIGHT, STATE_CACHE_BYTES, counts};
use crate::sandbox::{
    CallChain, DurableBefore, FinishedTurn, HttpAccess, Instance, InstanceSpec, InstantiateError,
    ModelAccess, Prepared, TurnFailure, TurnInput, TurnOutput, TurnRequest, TurnStart, TurnUsage,
};
use crate::storage::WriteOp;

/// The actor's instance, while it has one.
pub(super) struct Live {
    pub(super) inst: Instance,
    version: u32,
    /// What `inst` is an instance of (for trims: `trim.rs`).
    pub(super) pre: Arc<Prepared>,
    _slot: SlotHeld,
}

/// Marks the actor as holding an instance slot (for
/// [`Registry::make_room`](super::super::registry::Registry::make_room))
/// for as long as its [`Live`] instance exists.
struct SlotHeld(Arc<Shared>);

impl SlotHeld {
    fn new(shared: &Arc<Shared>, js: bool) -> Self {
        let slot = if js { SLOT_JS } else { SLOT_WASM };
        shared.slot.store(slot, Ordering::Relaxed);
        Self(shared.clone())
    }
}

impl Drop for SlotHeld {
    fn drop(&mut self) {
        self.0.slot.store(SLOT_NONE, Ordering::Relaxed);
        self.0.grown.store(0, Ordering::Relaxed);
    }
}

impl ActorTask {
    /// Run `on-upgrade` once if the type has a newer version than the one the
    /// actor's state belongs to.
    pub(super) async fn ensure_version(&mut self) -> Result<(), TurnError> {
        self.ensure_version_for(Arc::from([])).await
    }

    /// [`Self::ensure_version`] on behalf of the callers in `chain`.
    pub(super) async fn ensure_version_for(&mut self, chain: CallChain) -> Result<(), TurnError> {
        let latest = self.shared.ty.latest_version();
        let from = self.record().version;
        if from >= latest {
            return Ok(());
        }
        let turn_id = format!("upgrade-{from}-{latest}");
        match self
            .run_turn("upgrade", latest, turn_id, TurnInput::Upgrade(from), chain)
            .await
        {
            Ok((_, finished)) => {
                // One per actor on its first turn after a deploy: 10,000
                // lines for a type with 10,000 actors (counted as turns of
                // kind `upgrade`).
                tracing::debug!(actor = %self.key, from, to = latest, "actor upgraded");
                self.record.as_mut().expect("record").version = latest;
                self.submit(finished, CommitExtras::default(), Box::new(|_| {}));
                Ok(())
            }
            Err(e) if super::not_started(&e) => Err(e),
            Err(e) => Err(TurnError::UpgradeFailed {
                to: latest,
                reason: e.to_string(),
            }),
        }
    }

    /// A fresh JavaScript sandbox for an eval, with the eval limits and
    /// the network and model access of the actor's type.
    async fn eval_instance(
        env: &Arc<ActorEnv>,
        (http, models): (HttpAccess, ModelAccess),
    ) -> Result<Instance, TurnError> {
        let engine = env
            .sandbox
            .js_engine_async()
            .await
            .map_err(|e| TurnError::Code(e.to_string()))?;
        let config = env.config.limits.eval_config();
        let spec = || InstanceSpec {
            config: &config,
            js_module: None,
            actors: Some(env.clone()),
            http: Some(http.clone()),
            models: Some(models.clone()),
        };
        match instantiate_with_room(env, &engine, spec).await {
            Ok(inst) => Ok(inst),
            Err(e @ (InstantiateError::NoRoom(_) | InstantiateError::TooManyJs(_))) => {
                tracing::warn!(error = %e, "no JavaScript sandbox free for an eval");
                Err(TurnError::Overloaded(Shortage::of(&e.to_string())))
            }
            Err(InstantiateError::Failed(msg)) => Err(TurnError::Code(format!(
                "cannot start the JavaScript sandbox: {msg}"
            ))),
        }
    }

    /// The network and model access of the actor's type at `version`.
    async fn type_access(&mut self, version: u32) -> Result<(HttpAccess, ModelAccess), TurnError> {
        let env = &self.env;
        let prepared = self
            .shared
            .ty
            .prepared(version, &env.storage, &env.sandbox, &env.config.defaults)
            .await
            .map_err(|e| TurnError::Code(e.to_string()))?;
        Ok((
            env.http_access(&prepared.http),
            env.model_access(prepared.config.budget),
        ))
    }

    /// Make sure an instance of `version` is live, waiting (and making
    /// room) while the pool is full.
    async fn instance(&mut self, version: u32) -> Result<&mut Live, TurnError> {
        self.make_live(version, true).await
    }

    /// Make an instance of `version` live if one can be made at once, as a
    /// head start for the turn that follows: no waiting for room, no
    /// warning; whatever fails is left to that turn's own [`instance`]
    /// call, which reports it.
    ///
    /// [`instance`]: Self::instance
    pub(super) async fn try_instance(&mut self, version: u32) {
        let _ = self.make_live(version, false).await;
    }

    async fn make_live(&mut self, version: u32, wait: bool) -> Result<&mut Live, TurnError> {
        if self.live.as_ref().is_some_and(|l| l.version == version) {
            return Ok(self.live.as_mut().expect("checked"));
        }
        self.live = None;
        let env = &self.env;
        let prepared = self
            .shared
            .ty
            .prepared(version, &env.storage, &env.sandbox, &env.config.defaults)
            .await
            .map_err(|e| TurnError::Code(e.to_string()))?;
        let spec = || InstanceSpec {
            config: &prepared.config,
            js_module: prepared.js_module.clone(),
            actors: Some(env.clone()),
            http: Some(env.http_access(&prepared.http)),
            models: Some(env.model_access(prepared.config.budget)),
        };
        let js = prepared.js_module.is_some();
        let made = if wait {
            instantiate_with_room(env, &prepared.pre, spec).await
        } else {
            env.sandbox.instantiate(&prepared.pre, spec()).await
        };
        let inst = match made {
            Ok(i) => i,
            // Only a head start (`try_instance`): the turn's own call
            // waits for room or reports the failure.
            Err(e) if !wait => return Err(TurnError::Overloaded(Shortage::of(&e.to_string()))),
            Err(e @ (InstantiateError::NoRoom(_) | InstantiateError::TooManyJs(_))) => {
                tracing::warn!(actor = %self.key, error = %e, "no instance slot free");
                return Err(TurnError::Overloaded(Shortage::of(&e.to_string())));
            }
            Err(InstantiateError::Failed(msg)) => {
                return Err(TurnError::Trap {
                    kind: "trap",
                    message: format!("instantiation failed: {msg}"),
                });
            }
        };
        if !self.wake_recorded {
            self.wake_recorded = true;
            env.metrics
                .wake_seconds
                .observe(self.woke_at.elapsed().as_secs_f64());
        }
        self.live = Some(Live {
            inst,
            version,
            pre: prepared.pre.clone(),
            _slot: SlotHeld::new(&self.shared, js),
        });
        Ok(self.live.as_mut().expect("just set"))
    }

    /// Run one handler. On success the turn's writes are in the returned
    /// [`FinishedTurn`] (and in the carried caches); on failure they are
    /// gone.
    pub(super) async fn run_turn(
        &mut self,
        kind: &'static str,
        version: u32,
        turn_id: String,
        input: TurnInput,
        chain: CallChain,
    ) -> Result<(TurnOutput, FinishedTurn), TurnError> {
        let started = Instant::now();
        // Counted until its outcome is in hand: the caller submits the
        // commit before its next await that could wait on a stop.
        let _running = self.env.turn_running();
        let attempt = std::mem::take(&mut self.next_attempt);
        // Run again under the same id after a crash or a failure: an inbox
        // row's, an alarm's, an input's, an upgrade's, a webhook's turn.
        let calls_id = match (self.next_direct.take(), &input) {
            (_, TurnInput::Eval(_)) => None,
            (Some(direct), _) => direct,
            (None, _) => Some(turn_id.clone()),
        };
        let trace = std::mem::take(&mut self.next_trace);
        let span = tracing::info_span!(
            "turn",
            actor_type = self.key.ty(),
            actor_id = self.key.id(),
            version,
            kind,
            turn_id,
            request_id = trace.request_id.as_deref(),
            // Set on a failed turn: what trace backends filter errors by.
            otel.status_code = tracing::field::Empty,
            cpu_us = tracing::field::Empty,
            wait_us = tracing::field::Empty,
            run_us = tracing::field::Empty,
            commit_us = tracing::field::Empty,
        );
        let traced = crate::telemetry::enabled();
        if let Some(parent) = trace.parent {
            parent.adopt(&span);
        }
        // An eval runs in a fresh sandbox; everything else in the actor's
        // live instance.
        let mut fresh = None;
        let started_instance = match &input {
            TurnInput::Eval(_) => match self.type_access(version).await {
                Ok(access) => Self::eval_instance(&self.env, access)
                    .await
                    .map(|i| fresh = Some(i)),
                Err(e) => Err(e),
            },
            _ => self.instance(version).await.map(drop),
        };
        if let Err(e) = started_instance {
            self.env.metrics.turn(kind, "not_started");
            return Err(e);
        }
        if self.submitted_seq > self.shared.tracker.committed_seq() + MAX_COMMITS_IN_FLIGHT {
            // Backpressure: let the disk catch up with this actor.
            self.shared
                .tracker
                .wait_committed(
                    self.submitted_seq - MAX_COMMITS_IN_FLIGHT / 2,
                    self.generation,
                )
                .await;
        }
        self.seq += 1;
        let rec = self.record.as_ref().expect("record loaded");
        let request = TurnRequest {
            start: TurnStart {
                key: self.key.clone(),
                num: rec.num,
                version,
                seq: self.seq,
                turn_id,
                counts: counts(rec),
                chain,
                // `actors.call` waits for this actor's earlier turns to be
                // durable.
                durable_before: Some(DurableBefore {
                    tracker: self.shared.tracker.clone(),
                    seq: self.submitted_seq,
                    generation: self.generation,
                }),
                attempt,
                calls_id,
            },
            input,
            carry: std::mem::take(&mut self.carry),
        };
        let is_fresh = fresh.is_some();
        let inst = match &mut fresh {
            Some(inst) => inst,
            None => {
                let live = self.live.as_mut().expect("instance made live above");
                self.trim_clock.turn();
                &mut live.inst
            }
        };
        let run_started = Instant::now();
        let outcome = inst.run(request).instrument(span.clone()).await;
        span.record("cpu_us", outcome.cpu.as_micros() as u64);
        if outcome.result.is_err() {
            span.record("otel.status_code", "ERROR");
        }
        // A warning below names its actor itself: with the span filtered
        // out of the log (`--log warn`) it said only "turn trapped" (found
        // by a probe).
        let actor = &self.key;
        let prefaulted = match inst.is_js() {
            true => &self.env.metrics.js_prefaulted_pages,
            false => &self.env.metrics.prefaulted_pages,
        };
        prefaulted.inc_by(inst.take_prefaulted() as u64);
        if !is_fresh {
            // A fresh instance (an eval's) is dropped after its turn.
            self.shared
                .grown
                .store(inst.grown_bytes(), Ordering::Relaxed);
        }
        if traced {
            let waited = run_started - trace.since.unwrap_or(started);
            span.record("wait_us", waited.as_micros() as u64);
            span.record("run_us", run_started.elapsed().as_micros() as u64);
        }
        // The guest's run only: making the instance is `wake_seconds`.
        self.env
            .metrics
            .turn_seconds
            .observe(run_started.elapsed().as_secs_f64());
        // A JavaScript sandbox whose memory grew past half its limit starts
        // afresh at the next turn. What a turn hangs on an object of the
        // snapshot (a module-level `let buf = []` filled, then replaced by
        // `buf = []`) is never freed, the snapshot's objects being immortal
        // (vendor/rquickjs-sys/MARMOT.md): "fill, reset, fill" of 20 MiB
        // failed its third turn for memory in a 32 MiB sandbox (a probe).
        let spent = inst.is_js() && inst.grew_past_half();
        if (!outcome.instance_usable() || spent) && !is_fresh {
            if spent && outcome.instance_usable() {
                tracing::debug!(actor = %actor,
                    "JavaScript sandbox grew past half its memory limit; the next turn gets a fresh one");
            }
            self.live = None;
        }
        let usage = outcome.usage;
        self.failed_eval_logs = outcome.eval_logs;
        if outcome.result.is_err() && !usage.is_empty() {
            self.record_usage_alone(usage);
        }
        let Some(carry) = outcome.carry else {
            // The caches (with writes not yet durable) went with the turn
            // state: wait until disk holds everything, then carry on from
            // disk.
            self.shared
                .tracker
                .wait_committed(self.submitted_seq, self.generation)
                .await;
            if let Err(TurnFailure::Timeout(limit)) = outcome.result {
                self.env.metrics.trap("timeout");
                self.env.metrics.turn(kind, "timeout");
                return Err(TurnError::Timeout(limit.as_millis() as u64));
            }
            // Only a host bug gets here.
            tracing::error!(actor = %self.key, "host lost the turn state; continuing from disk");
            self.env.metrics.turn(kind, "trap");
            return Err(TurnError::Trap {
                kind: "trap",
                message: "host lost the turn state".into(),
            });
        };
        self.carry = carry;
        let metrics = &self.env.metrics;
        let result = match outcome.result {
            Ok((out @ TurnOutput::Eval(_), mut finished)) => {
                let thrown = matches!(&out, TurnOutput::Eval(r) if r.error.is_some());
                metrics.turn(kind, if thrown { "error" } else { "ok" });
                finished.usage = usage;
                Ok((out, finished))
            }
            Ok((out, mut finished)) => {
                metrics.turn(kind, "ok");
                finished.usage = usage;
                finished.span = traced.then(|| span.clone());
                Ok((out, finished))
            }
            Err(TurnFailure::Guest(msg)) => {
                metrics.turn(kind, "error");
                // The guest chose the message (up to 16 KiB): it is charged
                // to the type's log budget like its own lines (a probe threw
                // 100 KB errors in a loop: 3.8 MB/s of node log).
                if self.env.sandbox.log_budget().take(self.key.ty(), msg.len()) {
                    span.in_scope(
                        || tracing::info!(error = %msg, "turn failed: the actor returned an error"),
                    );
                }
                Err(TurnError::ActorError(msg))
            }
            Err(TurnFailure::NoRoom(msg)) => {
                // No fiber stack was free: the guest never ran.
                metrics.turn(kind, "not_started");
                tracing::warn!(actor = %self.key, error = %msg, "no room to run a turn");
                return Err(TurnError::Overloaded(Shortage::of(&msg)));
            }
            Err(TurnFailure::NodeMemory(msg)) => {
                // The turn changed nothing; idle actors holding grown
                // memory give it back, so a retry may fit.
                metrics.trap("node_memory");
                metrics.turn(kind, "overloaded");
                span.in_scope(|| tracing::warn!(actor = %actor, error = %msg, "turn stopped: the node's guest memory is exhausted; instance discarded, asking idle actors holding grown memory to hibernate"));
                let waiting = self.env.registry.wait_for_room(Room::Memory);
                let held = self.env.sandbox.pool_size(false);
                self.env
                    .registry
                    .make_room(&self.env, Room::Memory, held / 20, &waiting);
                return Err(TurnError::NoGuestMemory(msg));
            }
            Err(TurnFailure::Trap {
                kind: trap,
                message,
            }) => {
                metrics.trap(trap.label());
                metrics.turn(kind, "trap");
                span.in_scope(|| tracing::warn!(actor = %actor, reason = trap.label(), error = %message, "turn trapped; instance discarded"));
                Err(TurnError::Trap {
                    kind: trap.label(),
                    message,
                })
            }
            Err(TurnFailure::Timeout(limit)) => {
                metrics.trap("timeout");
                metrics.turn(kind, "timeout");
                span.in_scope(|| {
                    tracing::warn!(
                        actor = %actor,
                        "turn exceeded its wall-clock limit; instance discarded"
                    )
                });
                Err(TurnError::Timeout(limit.as_millis() as u64))
            }
            Err(TurnFailure::LostState) => unreachable!("handled above: no carry"),
            Err(TurnFailure::Storage(msg)) => {
                metrics.turn(kind, "storage_error");
                span.in_scope(|| tracing::warn!(actor = %actor, error = %msg, "turn stopped: a host call failed on storage; instance discarded"));
                Err(TurnError::StorageMidTurn(msg))
            }
        };
        self.trim_cache();
        result
    }

    /// Commit the model usage of a turn that failed: its calls were made
    /// and paid for, so they count against budgets all the same.
    fn record_usage_alone(&self, usage: TurnUsage) {
        let ledger = self.env.models.ledger().clone();
        let key = self.key.clone();
        let Some(num) = self.record.as_ref().map(|r| r.num) else {
            ledger.committed(&key, &usage.record, usage.held);
            return;
        };
        let storage = self.env.storage.clone();
        tokio::spawn(async move {
            let r = storage
                .writer()
                .call(|done| WriteOp::RecordUsage {
                    key: key.clone(),
                    num,
                    usage: usage.record,
                    done,
                })
                .await;
            if let Err(e) = r {
                tracing::warn!(actor = %key, error = %e, "the model usage of a failed turn was not recorded; it counts against budgets until restart");
            }
            ledger.committed(&key, &usage.record, usage.held);
        });
    }

    /// Drop cached state values whose writes are durable, if the cache is
    /// over its cap, and report what it holds to the node's total.
    pub(super) fn trim_cache(&mut self) {
        let cap = self.env.state_caches.cap(STATE_CACHE_BYTES);
        self.carry.trim(cap, self.shared.tracker.committed_seq());
        self.cache_share.set(self.carry.state_bytes() as u64);
    }
}

/// Back-off (ms) between attempts to get a slot in a full instance pool:
/// about two seconds in all before the turn is refused with 503.
const ROOM_BACKOFF_MS: [u64; 11] = [1, 2, 4, 8, 16, 32, 64, 128, 256, 512, 1024];

/// Instantiate `pre`; if the pool is full, or all JavaScript sandboxes
/// are in use, ask the least recently used idle actors holding what is
/// short to hibernate (5% of it) and try again with back-off. The pool is
/// sized for the active cap, so this is rare for the pool; JavaScript
/// sandboxes may be fewer than the active cap on a small host
/// (`limits.max_js_sandboxes`), and this is how JavaScript actors beyond
/// them take turns: the idle ones make way, as under the active cap.
pub(crate) async fn instantiate_with_room<'a>(
    env: &Arc<ActorEnv>,
    pre: &Prepared,
    spec: impl Fn() -> InstanceSpec<'a>,
) -> Result<Instance, InstantiateError> {
    let mut backoff = ROOM_BACKOFF_MS.iter();
    let mut waiting = None;
    loop {
        let (room, short_of) = match env.sandbox.instantiate(pre, spec()).await {
            Ok(i) => return Ok(i),
            Err(e @ InstantiateError::Failed(_)) => return Err(e),
            Err(e @ InstantiateError::TooManyJs(_)) => (Room::JsSandbox, e),
            Err(e @ InstantiateError::NoRoom(_)) => (Room::Instance, e),
        };
        let Some(&ms) = backoff.next() else {
            return Err(short_of);
        };
        let (_, waiting) = match &mut waiting {
            Some((r, _)) if *r != room => waiting.insert((room, env.registry.wait_for_room(room))),
            Some(w) => w,
            None => waiting.insert((room, env.registry.wait_for_room(room))),
        };
        let held = env.sandbox.pool_size(room == Room::JsSandbox);
        env.registry.make_room(env, room, held / 20, waiting);
        tokio::time::sleep(Duration::from_millis(ms)).await;
    }
}
