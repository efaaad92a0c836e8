//! Running one turn in an instance: the one call the actor layer makes per
//! turn once it has an instance ([`Instance::run`]).
//!
//! The call owns everything about the store for the turn's duration: it
//! moves the turn's state in, arms the CPU meter and epoch deadline,
//! enforces the wall-clock limit, takes the state back out, forwards what
//! the guest printed to the log, and classifies how the turn ended. The
//! actor gets back the turn's effects ([`FinishedTurn`]) or why there are
//! none ([`TurnFailure`]), with its caches ([`Carry`]) either way.

use std::future::Future;
use std::sync::Arc;
use std::time::{Duration, Instant};

use bytes::Bytes;
use wasmtime::component::TypedFunc;
use wasmtime::{Func, Store};

use super::bindings::marmot::actor::types::{Alarm, InputAnswer, Webhook};
use super::bindings::{Context, Handlers, JsRuntime, Message};
use super::caps::log::LogBudget;
use super::caps::model::TurnUsage;
use super::guest_memory::MemoryExhausted;
use super::host::{Host, LimitTrap};
use super::prefault::{Sample, WriteSet};
use super::trim::{MemoryOrigin, Pristine};
use super::turn::{Carry, FinishedTurn, TurnLimits, TurnStart, TurnState};
use crate::ids::ActorKey;
use crate::storage::{Storage, StorageError};

/// What a turn runs.
pub enum TurnInput {
    /// `on-message`.
    Message(Message),
    /// `on-upgrade` from a version.
    Upgrade(u32),
    /// `on-alarm`.
    Alarm(Alarm),
    /// `on-input`.
    Input(InputAnswer),
    /// `on-webhook`.
    Webhook(Webhook),
    /// A script, in a fresh JavaScript sandbox bound to the actor.
    Eval(String),
}

/// One turn, as the actor hands it to its instance.
pub struct TurnRequest {
    /// Who the turn runs for and where it starts.
    pub start: TurnStart,
    /// The handler to run and its argument.
    pub input: TurnInput,
    /// What the actor carried over from its earlier turns.
    pub carry: Carry,
}

/// A handler's reply to a message.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct GuestReply {
    /// HTTP status chosen by the actor.
    pub status: u16,
    /// Body.
    pub body: Bytes,
    /// Content type chosen by the actor.
    pub content_type: Option<String>,
}

/// What `POST …/eval` returns.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
pub struct EvalReply {
    /// The result as JSON text (`None`: undefined, or the script failed).
    pub result: Option<String>,
    /// What the script wrote with `console`.
    pub logs: Vec<String>,
    /// The error, with its stack, when the script failed or hit a limit.
    pub error: Option<String>,
}

/// What a successful turn returned.
#[derive(Debug)]
pub enum TurnOutput {
    /// `on-message` replied.
    Reply(GuestReply),
    /// Any other handler finished.
    Done,
    /// A script ran; when it threw, nothing it wrote is kept.
    Eval(EvalReply),
}

/// Why a turn has no effects.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum TurnFailure {
    /// The handler returned an error.
    Guest(String),
    /// The guest trapped; its instance must not run again.
    Trap {
        /// What stopped it.
        kind: TrapKind,
        /// The trap, with what the guest's stderr said about a panic.
        message: String,
    },
    /// The turn ran past its wall-clock limit; its instance must not run
    /// again.
    Timeout(Duration),
    /// No room to run (no fiber stack free): the guest never ran.
    NoRoom(String),
    /// The guest grew its memory past what the node's guest memory budget
    /// had left ([`MemoryExhausted`]): it trapped, and its instance must
    /// not run again. Not the guest's fault alone, so not a trap to report
    /// as one: the caller may retry once other actors gave theirs back.
    ///
    /// [`MemoryExhausted`]: super::guest_memory::MemoryExhausted
    NodeMemory(String),
    /// The host lost the turn state (a host bug): the actor's caches went
    /// with it, and the instance must not run again.
    LostState,
    /// A host call failed on the node's storage (a full disk under a
    /// file's blob): the guest was stopped where it was, so its instance
    /// must not run again, but it is the node's failure, not a trap of the
    /// guest (it was reported, counted and logged as one).
    Storage(String),
}

/// How a turn ended.
pub struct TurnOutcome {
    /// Its output and effects, or why there are none.
    pub result: Result<(TurnOutput, FinishedTurn), TurnFailure>,
    /// The actor's caches, with the turn's writes folded in if it
    /// succeeded (`None` after [`TurnFailure::LostState`], or a timeout
    /// while a child script held the turn).
    pub carry: Option<Carry>,
    /// Time spent running guest code and synchronous host calls: waits for
    /// other actors or the network are not counted.
    pub cpu: Duration,
    /// Model usage, whatever the result: calls made are paid for.
    pub usage: TurnUsage,
    /// What an eval that hit a limit wrote with `console` first (its reply,
    /// which would have carried them, never came).
    pub eval_logs: Vec<String>,
}

impl TurnOutcome {
    /// Whether the instance may run another turn.
    pub fn instance_usable(&self) -> bool {
        !matches!(
            self.result,
            Err(TurnFailure::Trap { .. }
                | TurnFailure::NodeMemory(_)
                | TurnFailure::Timeout(_)
                | TurnFailure::LostState
                | TurnFailure::Storage(_))
        )
    }
}

/// A call outside a turn trapped: the instance must not run again.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
#[error("the instance trapped outside a turn")]
pub struct InstanceLost;

/// Why a guest call was stopped, for metrics and messages.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum TrapKind {
    /// Ran too long without a host call.
    Cpu,
    /// Tried to grow memory past its limit.
    Memory,
    /// Recursed past the stack limit.
    StackOverflow,
    /// Any other trap (a panic, unreachable, a bad access).
    Trap,
}

impl TrapKind {
    /// Classify a trap.
    pub fn of(err: &wasmtime::Error) -> Self {
        if let Some(LimitTrap::Cpu(_) | LimitTrap::CpuInAll(_)) = err.downcast_ref::<LimitTrap>() {
            return TrapKind::Cpu;
        }
        if let Some(t) = err.downcast_ref::<wasmtime::Trap>()
            && *t == wasmtime::Trap::StackOverflow
        {
            return TrapKind::StackOverflow;
        }
        if format!("{err:#}").contains("growing memory") {
            return TrapKind::Memory;
        }
        TrapKind::Trap
    }

    /// Metric label.
    pub fn label(self) -> &'static str {
        match self {
            TrapKind::Cpu => "cpu",
            TrapKind::Memory => "memory",
            TrapKind::StackOverflow => "stack_overflow",
            TrapKind::Trap => "trap",
        }
    }
}

/// A live instance and its store.
pub struct Instance {
    store: Store<Host>,
    handlers: Handlers,
    /// The JavaScript engine's extra entry points.
    js: Option<JsRuntime>,
    /// Its `report-memory-origin`, if the code has one.
    origin: Option<TypedFunc<(), ()>>,
    /// A host function of this store that returns where its frame is,
    /// made on the first trim (see [`stack`](super::stack)).
    stack_probe: Option<wasmtime::TypedFunc<(), u64>>,
    /// What trims of this instance compare with, once it has been trimmed.
    pub(super) pristine: Option<Arc<Pristine>>,
    /// Where this fresh instance reports the pages its first turn wrote.
    learn: Option<(Arc<WriteSet>, Sample)>,
    /// Pages the last trim gave back, populated again before the next
    /// turn (start, length).
    pub(super) refault: Vec<(usize, usize)>,
    /// Pages populated since [`take_prefaulted`](Self::take_prefaulted).
    prefaulted: usize,
    turn_timeout: Duration,
    limits: Arc<TurnLimits>,
    storage: Arc<Storage>,
    /// Counts a JavaScript sandbox against the node's cap; dropped after
    /// the store.
    _js_slot: Option<super::pool::JsSlot>,
}

/// The exports of an instance the host calls.
pub(super) struct Exports {
    pub(super) handlers: Handlers,
    /// The JavaScript engine's extra entry points.
    pub(super) js: Option<JsRuntime>,
    /// Its `report-memory-origin`, if the code has one.
    pub(super) origin: Option<TypedFunc<(), ()>>,
}

impl Instance {
    pub(super) fn new(
        store: Store<Host>,
        exports: Exports,
        turn_timeout: Duration,
        limits: Arc<TurnLimits>,
        storage: Arc<Storage>,
        js_slot: Option<super::pool::JsSlot>,
    ) -> Self {
        let Exports {
            handlers,
            js,
            origin,
        } = exports;
        Self {
            store,
            handlers,
            js,
            origin,
            stack_probe: None,
            pristine: None,
            learn: None,
            refault: Vec::new(),
            prefaulted: 0,
            turn_timeout,
            limits,
            storage,
            _js_slot: js_slot,
        }
    }

    /// Check that `source` compiles as the JavaScript module `name` (the
    /// engine only), within the turn timeout.
    pub(crate) async fn check_js(&mut self, name: &str, source: &str) -> Result<(), String> {
        let js = self
            .js
            .as_ref()
            .expect("the JavaScript engine exports js-runtime");
        let check = js.call_check(&mut self.store, name, source);
        match tokio::time::timeout(self.turn_timeout, check).await {
            Ok(Ok(r)) => r,
            Ok(Err(trap)) => Err(format!(
                "compiling the module stopped the engine: {}",
                trap_message(&trap)
            )),
            Err(_) => Err("compiling the module took too long".into()),
        }
    }

    /// Where the guest's memory is mapped (`Ok(None)`: it cannot say).
    /// Asked once: the memory never moves. `Err`: the call trapped, and
    /// the instance must not run again.
    pub(super) async fn memory_origin(&mut self) -> Result<Option<MemoryOrigin>, InstanceLost> {
        // The import takes an answer only while asked, and the answer is
        // wasmtime's (see `trim::link`), so deployed code may be asked too.
        // Its export is guest code: under the CPU meter and the turn
        // timeout, and with no turn, so every capability traps.
        let Some(report) = self.origin else {
            return Ok(None);
        };
        if let Some(origin) = self.store.data().memory_origin {
            return Ok(Some(origin));
        }
        let host = self.store.data_mut();
        host.cpu.start();
        host.origin_asked = true;
        let called =
            tokio::time::timeout(self.turn_timeout, report.call_async(&mut self.store, ())).await;
        self.store.data_mut().origin_asked = false;
        match called {
            Ok(Ok(())) => Ok(self.store.data().memory_origin),
            Ok(Err(_)) | Err(_) => Err(InstanceLost),
        }
    }

    /// An address on the fiber stack this store keeps between calls: a
    /// call made now, into a host function of the store, runs on that
    /// stack and returns where its frame is (see [`stack`](super::stack)).
    /// No guest code runs. `Err`: the call failed, and the instance must
    /// not run again.
    pub(super) async fn stack_point(&mut self) -> Result<usize, InstanceLost> {
        let probe = match &self.stack_probe {
            Some(probe) => probe.clone(),
            None => {
                let f = Func::wrap(&mut self.store, || {
                    let here = 0u8;
                    std::hint::black_box(&raw const here) as u64
                });
                let probe = f.typed::<(), u64>(&self.store).map_err(|_| InstanceLost)?;
                self.stack_probe.insert(probe).clone()
            }
        };
        let point = probe
            .call_async(&mut self.store, ())
            .await
            .map_err(|_| InstanceLost)?;
        Ok(point as usize)
    }

    /// Before the first turn of a fresh instance of code that can say
    /// where its memory is: populate the pages `writes` says such a turn
    /// writes, or have this turn teach it. `Err`: asking the code where
    /// its memory is trapped or timed out, and the instance must not run.
    pub(super) async fn prefault(&mut self, writes: &Arc<WriteSet>) -> Result<(), InstanceLost> {
        if !super::prefault::enabled() {
            return Ok(());
        }
        let Some(origin) = self.memory_origin().await? else {
            return Ok(());
        };
        if let Some(sample) = writes.sample() {
            self.learn = Some((writes.clone(), sample));
            return Ok(());
        }
        match writes.prefault(origin) {
            Ok(pages) => self.prefaulted += pages,
            Err(e) => tracing::debug!(error = %e, "prefaulting a fresh sandbox failed"),
        }
        Ok(())
    }

    /// Bytes this instance's guest has grown its memory by, charged to the
    /// node's guest memory budget until the instance is dropped.
    pub fn grown_bytes(&self) -> u64 {
        self.store.data().limits.held()
    }

    /// Whether this instance's memory grew past half its limit since it
    /// was made.
    pub fn grew_past_half(&self) -> bool {
        let limits = &self.store.data().limits;
        limits.grown() > limits.max_memory() as u64 / 2
    }

    /// Whether this is a JavaScript sandbox (an instance of the built-in
    /// engine).
    pub fn is_js(&self) -> bool {
        self.js.is_some()
    }

    /// Pages populated before a turn wrote them (see [`prefault`]) since
    /// the last call.
    ///
    /// [`prefault`]: super::prefault
    pub fn take_prefaulted(&mut self) -> usize {
        std::mem::take(&mut self.prefaulted)
    }

    /// Run one turn to its end.
    pub async fn run(&mut self, req: TurnRequest) -> TurnOutcome {
        let TurnRequest {
            start,
            input,
            carry,
        } = req;
        let ctx = Context {
            actor_type: start.key.ty().to_owned(),
            id: start.key.id().to_owned(),
            version: start.version,
            turn_id: start.turn_id.clone(),
        };
        let turn = TurnState::new(start, carry, &self.limits, &self.storage);
        // A trimmed sandbox that runs again copies what it gave back:
        // copied up front, the pages cost no fault and no TLB flush.
        if !self.refault.is_empty() {
            match super::prefault::populate(&std::mem::take(&mut self.refault)) {
                Ok(pages) => self.prefaulted += pages,
                Err(e) => {
                    tracing::debug!(error = %e, "populating a trimmed JavaScript sandbox failed")
                }
            }
        }
        let (turn, result, cpu, eval_logs) = self.drive(turn, ctx, input).await;
        let Some(turn) = turn else {
            // A timeout while a child script held the turn drops it with
            // the child: still a timeout, but the caches are gone too.
            let failure = match result {
                Err(t @ TurnFailure::Timeout(_)) => t,
                _ => TurnFailure::LostState,
            };
            return TurnOutcome {
                result: Err(failure),
                carry: None,
                cpu,
                usage: TurnUsage::default(),
                eval_logs,
            };
        };
        let mut turn = turn;
        let usage = turn.model.take_usage();
        let (result, carry) = match result {
            // The script threw: like a failed turn, nothing it wrote stays.
            Ok(out @ TurnOutput::Eval(EvalReply { error: Some(_), .. })) => {
                (Ok((out, FinishedTurn::default())), turn.abandon())
            }
            Ok(out) => {
                let (carry, finished) = turn.finish();
                (Ok((out, finished)), carry)
            }
            Err(failure) => (Err(failure), turn.abandon()),
        };
        TurnOutcome {
            result,
            carry: Some(carry),
            cpu,
            usage,
            eval_logs,
        }
    }

    /// Run `code` as a child script inside its caller's turn `turn`: what
    /// the script writes joins that turn if it succeeds, and is rolled back
    /// if it throws or hits a limit. Returns the turn (`None` only if the
    /// host lost it), the outcome, and what the script logged before a
    /// limit stopped it.
    pub(crate) async fn run_child(
        &mut self,
        turn: TurnState,
        code: String,
    ) -> (
        Option<TurnState>,
        Result<EvalReply, TurnFailure>,
        Vec<String>,
    ) {
        let ctx = Context {
            actor_type: turn.key.ty().to_owned(),
            id: turn.key.id().to_owned(),
            version: turn.version,
            turn_id: turn.turn_id.clone(),
        };
        let savepoint = turn.savepoint();
        let (back, result, _cpu, logs) = self.drive(turn, ctx, TurnInput::Eval(code)).await;
        let Some(mut turn) = back else {
            return (None, Err(TurnFailure::LostState), logs);
        };
        let result = match result {
            Ok(TurnOutput::Eval(reply)) => {
                if reply.error.is_some() {
                    turn.rollback(savepoint);
                }
                Ok(reply)
            }
            Ok(_) => unreachable!("an eval returns an eval result"),
            Err(failure) => {
                turn.rollback(savepoint);
                Err(failure)
            }
        };
        (Some(turn), result, logs)
    }

    /// Put `turn` in the store, call the handler under the CPU meter and
    /// the wall-clock limit, take the turn back, forward the guest's output
    /// and classify the outcome; with the CPU used, and for an eval that
    /// failed, what it logged.
    async fn drive(
        &mut self,
        turn: TurnState,
        ctx: Context,
        input: TurnInput,
    ) -> (
        Option<TurnState>,
        Result<TurnOutput, TurnFailure>,
        Duration,
        Vec<String>,
    ) {
        let key = turn.key.clone();
        let version = turn.version;
        let Self {
            store,
            handlers,
            js,
            turn_timeout,
            ..
        } = self;
        let host = store.data_mut();
        host.turn = Some(turn);
        host.cpu.start();
        store.set_epoch_deadline(1);
        let eval = matches!(input, TurnInput::Eval(_));
        let call = call_handler(store, handlers, js.as_ref(), &ctx, input);
        let (result, cpu) = metered(tokio::time::timeout(*turn_timeout, call)).await;
        let turn = store.data_mut().turn.take();
        // Asked before the turn: the size is the memory's at the start.
        if let Some((writes, sample)) = self.learn.take()
            && matches!(result, Ok(Ok(Ok(_))))
            && let Some(origin) = store.data().memory_origin
            && let Err(e) = writes.learn(sample, origin)
        {
            tracing::debug!(error = %e, "sampling a fresh sandbox's pages failed");
        }
        // An eval's stdout holds its console lines (the guest echoes them
        // there), which are the script's, not the node's log.
        let echoed = eval.then(|| store.data().stdout.drain().0);
        let budget = turn.as_ref().map(|t| t.log.budget().clone());
        if let Some(t) = turn.as_ref().filter(|t| t.log.over_cap() > 0) {
            t.log.budget().over_turn_limit(key.ty(), t.log.over_cap());
        }
        let stderr_tail = forward_output(&key, version, store.data(), budget.as_deref());
        let result = match result {
            Ok(Ok(Ok(TurnOutput::Eval(mut reply)))) => {
                reply.error = reply.error.map(bounded_error);
                Ok(TurnOutput::Eval(reply))
            }
            Ok(Ok(Ok(out))) => Ok(out),
            Ok(Ok(Err(msg))) => Err(TurnFailure::Guest(bounded_error(msg))),
            Ok(Err(trap)) => Err(if let Some(e) = trap.downcast_ref::<MemoryExhausted>() {
                TurnFailure::NodeMemory(e.to_string())
            } else if let Some(e) = trap.downcast_ref::<StorageError>() {
                TurnFailure::Storage(e.to_string())
            } else if is_resource_exhaustion(&format!("{trap:#}")) {
                TurnFailure::NoRoom(format!("{trap:#}"))
            } else {
                let mut message = trap_message(&trap);
                if let Some(tail) = stderr_tail {
                    message = format!("{message}; guest stderr: {tail}");
                }
                TurnFailure::Trap {
                    kind: TrapKind::of(&trap),
                    message,
                }
            }),
            Err(_elapsed) => Err(TurnFailure::Timeout(*turn_timeout)),
        };
        let logs = match echoed {
            Some(out) if result.is_err() => super::output::eval_lines(&out),
            _ => Vec::new(),
        };
        (turn, result, cpu, logs)
    }
}

/// The most of a guest's error message the host keeps. A message goes to
/// the client, the log and a `turn_failed` or `alarm_failed` event, none of
/// which it may flood: a 5 MB `Error` message was all three.
const MAX_ERROR_BYTES: usize = 16 << 10;

/// `message`, cut at [`MAX_ERROR_BYTES`] (on a character boundary) with a
/// note of how much was cut.
fn bounded_error(mut message: String) -> String {
    if message.len() <= MAX_ERROR_BYTES {
        return message;
    }
    let cut = message.floor_char_boundary(MAX_ERROR_BYTES);
    let dropped = message.len() - cut;
    message.truncate(cut);
    message.push_str(&format!("… ({dropped} more bytes of the message cut)"));
    message
}

/// Whether a reply can go out as the actor wrote it; why not fails the
/// turn, so nothing it did is committed. A 1xx status broke the client's
/// connection after the turn had committed (a client that retried repeated
/// its effects), one past 599 was sent as written, one outside 100–999
/// became a 200, and a content type that is not a header value became
/// `application/json`.
fn check_reply(status: u16, content_type: Option<&str>) -> Result<(), String> {
    if !(200..=599).contains(&status) {
        return Err(format!(
            "the reply's status {status} is not one an actor may answer with (200 to 599)"
        ));
    }
    if let Some(ct) = content_type
        && reqwest::header::HeaderValue::from_str(ct).is_err()
    {
        return Err(format!(
            "the reply's content type {:?} is not a valid header value",
            ct.chars().take(64).collect::<String>()
        ));
    }
    Ok(())
}

/// Call the handler `input` asks for.
async fn call_handler(
    store: &mut Store<Host>,
    handlers: &Handlers,
    js: Option<&JsRuntime>,
    ctx: &Context,
    input: TurnInput,
) -> wasmtime::Result<Result<TurnOutput, String>> {
    let done = |r: Result<(), String>| r.map(|()| TurnOutput::Done);
    match input {
        TurnInput::Message(m) => Ok(handlers
            .call_on_message(&mut *store, ctx, &m)
            .await?
            .and_then(|reply| {
                check_reply(reply.status, reply.content_type.as_deref())?;
                Ok(TurnOutput::Reply(GuestReply {
                    status: reply.status,
                    body: Bytes::from(reply.body),
                    content_type: reply.content_type,
                }))
            })),
        TurnInput::Upgrade(from) => handlers
            .call_on_upgrade(&mut *store, ctx, from)
            .await
            .map(done),
        TurnInput::Alarm(alarm) => handlers
            .call_on_alarm(&mut *store, ctx, &alarm)
            .await
            .map(done),
        TurnInput::Input(input) => handlers
            .call_on_input(&mut *store, ctx, &input)
            .await
            .map(done),
        TurnInput::Webhook(hook) => handlers
            .call_on_webhook(&mut *store, ctx, &hook)
            .await
            .map(done),
        TurnInput::Eval(code) => {
            let js = js.expect("eval runs in the JavaScript engine, which exports js-runtime");
            let o = js.call_eval(&mut *store, &code).await?;
            Ok(Ok(TurnOutput::Eval(EvalReply {
                result: o.result,
                logs: o.logs,
                error: o.error,
            })))
        }
    }
}

/// Run `fut`, adding up the time spent inside its polls: guest code and
/// synchronous host calls, but not the time it waits (on another actor, the
/// network, or a yield to the scheduler).
async fn metered<F: Future>(fut: F) -> (F::Output, Duration) {
    let mut fut = std::pin::pin!(fut);
    let mut busy = Duration::ZERO;
    let out = std::future::poll_fn(|cx| {
        let t = Instant::now();
        let r = fut.as_mut().poll(cx);
        busy += t.elapsed();
        r
    })
    .await;
    (out, busy)
}

/// Failures that mean "no room right now", not bad code: an instance pool
/// or the fiber stacks are exhausted, or the kernel refused memory,
/// mappings or a file descriptor (a module's first instance makes its
/// memory image in a memfd: at the open-files limit that fails).
pub(super) fn is_resource_exhaustion(msg: &str) -> bool {
    msg.contains("concurrent") || msg.contains("pooling") || is_host_shortage(msg)
}

/// The kernel refused memory, mappings or a file descriptor: the host's
/// shortage, whatever the code (unlike a pool's limits, which code that
/// asks for too much also meets).
pub(super) fn is_host_shortage(msg: &str) -> bool {
    msg.contains("Cannot allocate memory")
        || msg.contains("os error 12")
        || msg.contains("cannot create a memfd")
        || msg.contains("Too many open files")
        || msg.contains("os error 24")
}

/// Send what the guest printed to the node's logs, as far as its type's
/// log budget allows; return what stderr says about a panic (or its last
/// line), for error reports.
fn forward_output(
    key: &ActorKey,
    version: u32,
    host: &Host,
    budget: Option<&LogBudget>,
) -> Option<String> {
    let mut stderr_lines: Vec<String> = Vec::new();
    for (stream, out) in [("stdout", &host.stdout), ("stderr", &host.stderr)] {
        if out.is_empty() {
            continue;
        }
        let (bytes, dropped) = out.drain();
        let text = String::from_utf8_lossy(&bytes);
        for line in text.lines().filter(|l| !l.trim().is_empty()) {
            if budget.is_none_or(|b| b.take(key.ty(), line.len())) {
                tracing::info!(target: "marmot::guest", actor = %key, version, stream, "{line}");
            }
            if stream == "stderr" {
                stderr_lines.push(line.to_owned());
            }
        }
        if dropped > 0 {
            // Reported with the type's other drops, not once per turn.
            match budget {
                Some(b) => b.over_turn_limit(key.ty(), 1),
                None => {
                    tracing::warn!(target: "marmot::guest", actor = %key, stream, dropped, "guest output over the per-turn cap was dropped")
                }
            }
        }
    }
    // Rust panics print `thread '…' panicked at file:line:col:` and then
    // the message; prefer those over the trailing backtrace hint.
    let summary = match stderr_lines.iter().rposition(|l| l.contains("panicked at")) {
        Some(i) => stderr_lines[i..]
            .iter()
            .filter(|l| !l.starts_with("note: "))
            .cloned()
            .collect::<Vec<_>>()
            .join(" "),
        None => stderr_lines
            .iter()
            .rev()
            .find(|l| !l.starts_with("note: "))
            .cloned()
            .unwrap_or_default(),
    };
    (!summary.is_empty()).then(|| summary.chars().take(500).collect())
}

fn trap_message(err: &wasmtime::Error) -> String {
    if let Some(t) = err.downcast_ref::<LimitTrap>() {
        return t.to_string();
    }
    if let Some(t) = err.downcast_ref::<wasmtime::Trap>() {
        return t.to_string();
    }
    let root = err.root_cause().to_string();
    if root.contains("growing memory") {
        return format!("memory limit exceeded: {root}");
    }
    root.chars().take(500).collect()
}
