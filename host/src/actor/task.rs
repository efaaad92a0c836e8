//! The task that owns one active actor.
//!
//! Turns are pipelined: after a successful turn the task hands its writes
//! to the storage writer together with the reply, and goes straight on to
//! the next envelope. The reply is released by the writer once the commit is
//! durable (the output gate), so the actor never waits for an fsync but no
//! caller ever sees an effect that could still be lost. If a commit fails,
//! the writer raises the actor's minimum generation; the task notices before
//! its next turn and reloads everything from disk.

use std::collections::HashMap;
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

use bytes::Bytes;
use tokio::sync::{mpsc, oneshot};
use tracing::Instrument;

use super::registry::{SLOT_JS, SLOT_NONE, SLOT_WASM, Shared};
use super::{AlarmDelivery, AnswerDelivery, Delivery, Envelope, EvalReply, TurnError, TurnReply};
use crate::alarms::scheduler::{AlarmTicket, Notice};
use crate::clock::now_ms;
use crate::ids::ActorKey;
use crate::node::Node;
use crate::sandbox::bindings::marmot::actor::types::{Alarm, InputAnswer, Webhook};
use crate::sandbox::bindings::{Context, Message};
use crate::sandbox::host::CallChain;
use crate::sandbox::turn::{Carry, FinishedTurn, TurnState};
use crate::sandbox::{Instance, TrapKind};
use crate::storage::schema::{
    ActorRecord, AlarmRecord, CodeKind, EventRecord, IdemOutcome, IdemRecord, InboxKind,
    InboxRecord, InputRecord, InputStatus, StoredReply,
};
use crate::storage::{CommitFailed, TurnCommit, WriteOp};

/// Cap on the state cache of one actor before committed entries are dropped.
const STATE_CACHE_BYTES: usize = 8 << 20;
/// Commits of one actor that may be in flight before its next turn waits:
/// bounds the memory a fast actor can pile up while the disk is slow.
const MAX_COMMITS_IN_FLIGHT: u64 = 256;
/// First delay before retrying a durable message that could not start.
const INBOX_RETRY_MS: u64 = 200;
/// Delay before delivering again an alarm whose turn could not start.
const ALARM_RETRY_MS: u64 = 500;
/// Inbox rows read per batch.
const INBOX_BATCH: usize = 64;

struct Live {
    inst: Instance,
    version: u32,
    turn_timeout: Duration,
    _slot: SlotHeld,
}

/// Marks the actor as holding an instance slot (for
/// [`Registry::make_room`](super::registry::Registry::make_room)) for as
/// long as its [`Live`] instance exists.
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
    }
}

/// What a turn runs.
enum TurnInput {
    /// A message, and the callers waiting above it (`actors.call`).
    Message(Message, CallChain),
    /// `on-upgrade` from a version, on behalf of the callers of the message
    /// that triggered it (empty for other deliveries).
    Upgrade(u32, CallChain),
    /// A script in a fresh JavaScript sandbox bound to this actor.
    Eval(String),
    Alarm(Alarm),
    Input(InputAnswer),
    Webhook(Webhook),
}

/// What a successful turn returned.
enum TurnOutput {
    Reply(TurnReply),
    Done,
    Eval(EvalReply),
}

/// Where a commit's outcome goes.
type OnDurable = Box<dyn FnOnce(Result<(), CommitFailed>) + Send>;

/// Extra rows a commit carries besides the turn's own writes.
#[derive(Default)]
struct CommitExtras {
    /// Bookkeeping only (no handler ran): not counted as a turn.
    bookkeeping: bool,
    /// Write the actor record even if only its statistics changed.
    force_record: bool,
    idempotency: Option<(String, IdemRecord)>,
    inbox_done: Option<u64>,
    inbox_update: Option<(u64, InboxRecord)>,
    events: Vec<(String, Vec<u8>)>,
    /// An alarm moved or removed by its own firing, unless the turn itself
    /// wrote the same alarm.
    alarm: Option<(String, Option<AlarmRecord>)>,
    /// Input requests settled (`Some`) or pruned (`None`).
    inputs: Vec<(String, Option<InputRecord>)>,
}

pub(crate) struct ActorTask {
    node: Arc<Node>,
    key: ActorKey,
    shared: Arc<Shared>,
    /// The actor's record; `None` until loaded (or when it does not exist).
    record: Option<ActorRecord>,
    /// The record as last written (or read) on disk.
    persisted: Option<ActorRecord>,
    live: Option<Live>,
    /// What turns read (state, alarms, input counts), including changes
    /// not yet durable.
    carry: Carry,
    /// When the oldest event on the log was written, if known: spares a disk
    /// read per commit when retention by age is on.
    oldest_event_at_ms: Option<u64>,
    /// Commits from generations below the tracker's minimum are refused.
    generation: u64,
    /// Last turn sequence number handed out.
    seq: u64,
    /// Last turn sequence number submitted for commit.
    submitted_seq: u64,
    /// Highest inbox seq run in this activation.
    inbox_cursor: u64,
    /// Idempotency records written by commits that may not be durable yet.
    idem_pending: HashMap<String, (u64, IdemOutcome)>,
    woke_at: Instant,
    wake_recorded: bool,
    /// Current back-off for retrying the inbox.
    inbox_retry_ms: u64,
    last_activity: Instant,
}

impl ActorTask {
    pub(crate) fn new(node: Arc<Node>, key: ActorKey, shared: Arc<Shared>) -> Self {
        let now = Instant::now();
        Self {
            node,
            key,
            shared,
            record: None,
            persisted: None,
            live: None,
            carry: Carry::default(),
            oldest_event_at_ms: None,
            generation: 0,
            seq: 0,
            submitted_seq: 0,
            inbox_cursor: 0,
            idem_pending: HashMap::new(),
            woke_at: now,
            wake_recorded: false,
            inbox_retry_ms: INBOX_RETRY_MS,
            last_activity: now,
        }
    }

    /// Mark the actor busy (or idle again) for [`Registry::make_room`]
    /// (super::registry::Registry::make_room), and as just used.
    fn set_busy(&self, busy: bool) {
        self.shared.busy.store(busy, Ordering::Relaxed);
        self.shared.last_used_ms.store(now_ms(), Ordering::Relaxed);
    }

    fn idle_timeout(&self) -> Duration {
        let ty = &self.shared.ty;
        ty.version(ty.latest_version())
            .map(|v| {
                v.config
                    .resolve(&self.node.config.defaults, v.kind == CodeKind::Js)
                    .idle_timeout
            })
            .unwrap_or(Duration::from_millis(
                self.node.config.defaults.idle_timeout_ms,
            ))
    }

    pub(crate) async fn run(mut self, mut rx: mpsc::Receiver<Envelope>) {
        let idle = self.idle_timeout();
        let sleep = tokio::time::sleep(idle);
        tokio::pin!(sleep);
        loop {
            if self.shared.inbox_dirty.swap(false, Ordering::AcqRel) {
                self.set_busy(true);
                Box::pin(self.drain_inbox()).await;
                self.set_busy(false);
                self.last_activity = Instant::now();
            }
            tokio::select! {
                biased;
                env = rx.recv() => {
                    let Some(env) = env else { break };
                    let housekeeping = matches!(env, Envelope::TrimEvents);
                    // Boxed so the task's resting size stays small: an idle
                    // actor is a few hundred bytes here, not the 4 KB of a
                    // turn in progress (10,000 actors: 35 MB).
                    self.set_busy(true);
                    Box::pin(self.handle(env)).await;
                    self.set_busy(false);
                    self.last_activity = Instant::now();
                    // A deleted type's actors leave as soon as they are idle,
                    // and so does an actor woken only for housekeeping.
                    if (self.shared.ty.is_deleted() || (housekeeping && self.live.is_none()))
                        && Box::pin(self.try_hibernate(&mut rx)).await
                    {
                        return;
                    }
                }
                () = self.shared.hibernate.notified() => {
                    if Box::pin(self.try_hibernate(&mut rx)).await {
                        return;
                    }
                }
                () = &mut sleep => {
                    let deadline = self.last_activity + idle;
                    if Instant::now() >= deadline {
                        if Box::pin(self.try_hibernate(&mut rx)).await {
                            return;
                        }
                        sleep.as_mut().reset((Instant::now() + idle).into());
                    } else {
                        sleep.as_mut().reset(deadline.into());
                    }
                }
            }
        }
    }

    async fn try_hibernate(&mut self, rx: &mut mpsc::Receiver<Envelope>) -> bool {
        // Activity statistics are written lazily; bring them to disk now.
        if let (Some(r), Some(p)) = (&self.record, &self.persisted)
            && r != p
            && self.shared.tracker.min_generation() <= self.generation
        {
            self.submit(
                FinishedTurn::unchanged(r),
                CommitExtras {
                    force_record: true,
                    bookkeeping: true,
                    ..Default::default()
                },
                Box::new(|_| {}),
            );
        }
        // Everything this activation produced must be durable before its
        // in-memory view is dropped.
        self.shared
            .tracker
            .wait_committed(self.submitted_seq, self.generation)
            .await;
        if !self.node.registry.try_leave(&self.key, &self.shared, rx) {
            return false;
        }
        self.node.metrics.actors_active.dec();
        self.node.metrics.hibernations.inc();
        tracing::debug!(actor = %self.key, "hibernated");
        true
    }

    async fn handle(&mut self, env: Envelope) {
        match env {
            Envelope::Message(d) => self.on_message(*d).await,
            Envelope::InboxPoke => {}
            Envelope::Delete(reply) => {
                let r = self.delete().await;
                let _ = reply.send(r);
            }
            Envelope::Eval(code, reply) => self.on_eval(code, reply).await,
            Envelope::Alarm(d) => self.on_alarm(*d).await,
            Envelope::Answer(d) => self.on_answer(*d).await,
            Envelope::TrimEvents => {
                if self.ready(false).await.is_ok() && self.record().first_event_seq > 0 {
                    // `submit` applies retention to every commit.
                    self.submit(
                        FinishedTurn::unchanged(self.record()),
                        CommitExtras {
                            bookkeeping: true,
                            ..Default::default()
                        },
                        Box::new(|_| {}),
                    );
                }
            }
            Envelope::Recover(permit) => {
                self.shared.inbox_dirty.store(false, Ordering::Release);
                self.drain_inbox().await;
                drop(permit);
            }
        }
    }

    /// Checks before any turn: the type still exists, no commit failed
    /// underneath us, and the actor's record is loaded (created if asked).
    async fn ready(&mut self, create: bool) -> Result<(), TurnError> {
        if self.shared.ty.is_deleted() {
            return Err(TurnError::UnknownType(self.key.ty().to_owned()));
        }
        let min = self.shared.tracker.min_generation();
        if min > self.generation {
            tracing::warn!(actor = %self.key, "a commit failed; reloading the actor from disk");
            self.generation = min;
            // Every commit of the old generation has either landed or will
            // be refused, so what is committed now is final: nothing older
            // is left to wait for.
            self.submitted_seq = self.shared.tracker.committed_seq();
            self.seq = self.seq.max(self.submitted_seq);
            self.reset();
        }
        if self.record.is_none() {
            if self.shared.after_crash.swap(false, Ordering::AcqRel) {
                // The previous activation died (a host bug); its last
                // commits may still be queued. Read only what they left.
                self.node.storage.writer().barrier().await;
            }
            let on_disk = self.node.storage.reader()?.actor(&self.key)?;
            self.record = match on_disk {
                Some(r) => Some(r),
                None if create => {
                    let key = self.key.clone();
                    let version = self.shared.ty.latest_version();
                    Some(
                        self.node
                            .storage
                            .writer()
                            .call(|done| WriteOp::GetOrCreate { key, version, done })
                            .await?,
                    )
                }
                None => return Err(TurnError::NotFound),
            };
            self.persisted = self.record.clone();
        }
        Ok(())
    }

    /// Forget the in-memory view; the next turn reloads from disk.
    fn reset(&mut self) {
        self.record = None;
        self.persisted = None;
        self.live = None;
        self.carry = Carry::default();
        self.oldest_event_at_ms = None;
        self.idem_pending.clear();
        self.inbox_cursor = 0;
        self.shared.inbox_dirty.store(true, Ordering::Release);
    }

    fn record(&self) -> &ActorRecord {
        self.record.as_ref().expect("record loaded by ready()")
    }

    async fn on_message(&mut self, d: Delivery) {
        let Delivery {
            message_id,
            body,
            content_type,
            idempotency_key,
            chain,
            reply,
        } = d;
        if let Err(e) = self.ready(true).await {
            let _ = reply.send(Err(e));
            return;
        }
        if let Some(k) = &idempotency_key {
            match self.idempotency(k) {
                Ok(None) => {}
                Ok(Some((seq, outcome))) => {
                    self.replay(seq, outcome, reply);
                    return;
                }
                Err(e) => {
                    let _ = reply.send(Err(e));
                    return;
                }
            }
        }
        if let Err(e) = self.ensure_version_for(chain.clone()).await {
            // The upgrade turn ran on state that may not be durable yet.
            self.release_when_durable(self.submitted_seq, Err(e), reply);
            return;
        }
        let msg = Message {
            id: message_id.clone(),
            body: body.to_vec(),
            content_type,
        };
        let version = self.record().version;
        match self
            .run_turn(
                "message",
                version,
                &message_id,
                TurnInput::Message(msg, chain),
            )
            .await
        {
            Ok((TurnOutput::Reply(out), finished))
                if finished.is_empty() && idempotency_key.is_none() =>
            {
                // A read-only turn needs no commit of its own, but what it
                // read may come from turns still being committed: release
                // the reply once those are durable.
                self.release_when_durable(self.submitted_seq, Ok(out), reply);
            }
            Ok((TurnOutput::Reply(out), finished)) => {
                let extras = CommitExtras {
                    idempotency: idempotency_key.map(|k| {
                        (
                            k,
                            self.idem_record(IdemOutcome::Done {
                                message_id: message_id.clone(),
                                reply: StoredReply {
                                    status: out.status,
                                    body: out.body.to_vec(),
                                    content_type: out.content_type.clone(),
                                },
                            }),
                        )
                    }),
                    ..Default::default()
                };
                self.submit(
                    finished,
                    extras,
                    Box::new(move |r| {
                        let _ = reply.send(r.map(|()| out).map_err(TurnError::from));
                    }),
                );
            }
            Ok((TurnOutput::Done | TurnOutput::Eval(_), _)) => {
                unreachable!("on-message always replies")
            }
            // An error (or a trap message) can reveal state written by
            // earlier turns: it leaves only once those are durable.
            Err(e) => self.release_when_durable(self.submitted_seq, Err(e), reply),
        }
    }

    /// The idempotency record for `key`: pending in memory or on disk.
    fn idempotency(&mut self, key: &str) -> Result<Option<(u64, IdemOutcome)>, TurnError> {
        if let Some((seq, o)) = self.idem_pending.get(key) {
            return Ok(Some((*seq, o.clone())));
        }
        let num = self.record().num;
        let rec = self.node.storage.reader()?.idempotency(num, key)?;
        Ok(rec
            .filter(|r| r.expires_at_ms > now_ms())
            .map(|r| (0, r.outcome)))
    }

    /// Answer a repeated idempotency key without running the turn again.
    /// A reply whose commit is still in flight is released only once durable.
    fn replay(
        &self,
        seq: u64,
        outcome: IdemOutcome,
        reply: oneshot::Sender<Result<TurnReply, TurnError>>,
    ) {
        let result = match outcome {
            IdemOutcome::Done { message_id, reply } => Ok(TurnReply {
                status: reply.status,
                body: Bytes::from(reply.body),
                content_type: reply.content_type,
                message_id,
                replayed: true,
            }),
            IdemOutcome::Queued { .. } => Err(TurnError::IdempotencyInProgress),
            IdemOutcome::Failed { error, .. } => Err(TurnError::PreviouslyFailed(error)),
        };
        self.release_when_durable(seq, result, reply);
    }

    /// Send `result` once turn `seq` of this actor is durable (at once if it
    /// already is); if that commit failed, send the failure instead.
    fn release_when_durable<T: Send + 'static>(
        &self,
        seq: u64,
        result: Result<T, TurnError>,
        reply: oneshot::Sender<Result<T, TurnError>>,
    ) {
        if seq == 0 || self.shared.tracker.committed_seq() >= seq {
            let _ = reply.send(result);
            return;
        }
        let tracker = self.shared.tracker.clone();
        let generation = self.generation;
        tokio::spawn(async move {
            tracker.wait_committed(seq, generation).await;
            let result = if tracker.min_generation() > generation {
                Err(TurnError::Storage(CommitFailed::Superseded.to_string()))
            } else {
                result
            };
            let _ = reply.send(result);
        });
    }

    fn idem_record(&self, outcome: IdemOutcome) -> IdemRecord {
        IdemRecord {
            outcome,
            expires_at_ms: now_ms() + self.node.config.limits.idempotency_ttl_ms,
        }
    }

    /// Run `on-upgrade` once if the type has a newer version than the one the
    /// actor's state belongs to.
    async fn ensure_version(&mut self) -> Result<(), TurnError> {
        self.ensure_version_for(Arc::from([])).await
    }

    /// [`Self::ensure_version`] on behalf of the callers in `chain`.
    async fn ensure_version_for(&mut self, chain: CallChain) -> Result<(), TurnError> {
        let latest = self.shared.ty.latest_version();
        let from = self.record().version;
        if from >= latest {
            return Ok(());
        }
        let turn_id = format!("upgrade-{from}-{latest}");
        match self
            .run_turn("upgrade", latest, &turn_id, TurnInput::Upgrade(from, chain))
            .await
        {
            Ok((_, finished)) => {
                tracing::info!(actor = %self.key, from, to = latest, "actor upgraded");
                self.record.as_mut().expect("record").version = latest;
                self.submit(finished, CommitExtras::default(), Box::new(|_| {}));
                Ok(())
            }
            Err(e) if not_started(&e) => Err(e),
            Err(e) => Err(TurnError::UpgradeFailed {
                to: latest,
                reason: e.to_string(),
            }),
        }
    }

    /// A fresh JavaScript sandbox for an eval, with the eval limits.
    async fn eval_instance(node: Arc<Node>) -> Result<(Instance, Duration), TurnError> {
        let node = &node;
        let engine = match node.sandbox.js_engine_if_ready() {
            Some(e) => e,
            None => {
                let sandbox = node.sandbox.clone();
                tokio::task::spawn_blocking(move || sandbox.js_engine())
                    .await
                    .map_err(|e| TurnError::Code(format!("engine compile panicked: {e}")))?
                    .map_err(|e| TurnError::Code(e.to_string()))?
            }
        };
        let config = node.eval_config();
        let host = || node.sandbox.new_host(&config).with_actors(node.clone());
        match instantiate_with_room(node, &engine, true, host).await {
            Ok(inst) => Ok((inst, config.turn_timeout)),
            Err(StartError::Full(msg)) => {
                tracing::warn!(error = %msg, "no JavaScript sandbox free for an eval");
                Err(TurnError::Overloaded)
            }
            Err(StartError::Failed(msg)) => Err(TurnError::Code(format!(
                "cannot start the JavaScript sandbox: {msg}"
            ))),
        }
    }

    /// Run a model-written script against this actor's state. Its writes
    /// commit only if it succeeds; its reply leaves once they are durable.
    async fn on_eval(
        &mut self,
        code: String,
        reply: oneshot::Sender<Result<EvalReply, TurnError>>,
    ) {
        if let Err(e) = self.ready(true).await {
            let _ = reply.send(Err(e));
            return;
        }
        let version = self.record().version;
        let turn_id = crate::ids::new_message_id();
        match self
            .run_turn("eval", version, &turn_id, TurnInput::Eval(code))
            .await
        {
            Ok((TurnOutput::Eval(out), finished)) if !finished.is_empty() => {
                self.submit(
                    finished,
                    CommitExtras::default(),
                    Box::new(move |r| {
                        let _ = reply.send(r.map(|()| out).map_err(TurnError::from));
                    }),
                );
            }
            Ok((TurnOutput::Eval(out), _)) => {
                self.release_when_durable(self.submitted_seq, Ok(out), reply)
            }
            Ok(_) => unreachable!("an eval turn returns an eval result"),
            // A limit or a trap: the script failed; report it like a throw.
            Err(e @ (TurnError::Trap { .. } | TurnError::Timeout(_))) => {
                let out = EvalReply {
                    result: None,
                    logs: Vec::new(),
                    error: Some(e.to_string()),
                };
                self.release_when_durable(self.submitted_seq, Ok(out), reply);
            }
            Err(e) => self.release_when_durable(self.submitted_seq, Err(e), reply),
        }
    }

    /// Make sure an instance of `version` is live.
    async fn instance(&mut self, version: u32) -> Result<&mut Live, TurnError> {
        if self.live.as_ref().is_some_and(|l| l.version == version) {
            return Ok(self.live.as_mut().expect("checked"));
        }
        self.live = None;
        let node = &self.node;
        let prepared = self
            .shared
            .ty
            .prepared(version, &node.storage, &node.sandbox, &node.config.defaults)
            .await
            .map_err(|e| TurnError::Code(e.to_string()))?;
        let host = || {
            node.sandbox
                .new_host(&prepared.config)
                .with_js_module(prepared.js_module.clone())
                .with_actors(node.clone())
        };
        let js = prepared.js_module.is_some();
        let inst = match instantiate_with_room(node, &prepared.pre, js, host).await {
            Ok(i) => i,
            Err(StartError::Full(msg)) => {
                tracing::warn!(actor = %self.key, error = %msg, "no instance slot free");
                return Err(TurnError::Overloaded);
            }
            Err(StartError::Failed(msg)) => {
                return Err(TurnError::Trap {
                    kind: "trap",
                    message: format!("instantiation failed: {msg}"),
                });
            }
        };
        if !self.wake_recorded {
            self.wake_recorded = true;
            node.metrics
                .wake_seconds
                .observe(self.woke_at.elapsed().as_secs_f64());
        }
        self.live = Some(Live {
            inst,
            version,
            turn_timeout: prepared.config.turn_timeout,
            _slot: SlotHeld::new(&self.shared, js),
        });
        Ok(self.live.as_mut().expect("just set"))
    }

    /// Run one handler. On success the turn's writes are in the returned
    /// [`FinishedTurn`] (and in the cache); on failure they are gone.
    async fn run_turn(
        &mut self,
        kind: &'static str,
        version: u32,
        turn_id: &str,
        input: TurnInput,
    ) -> Result<(TurnOutput, FinishedTurn), TurnError> {
        let started = Instant::now();
        let key = self.key.clone();
        let span = tracing::info_span!(
            "turn",
            actor_type = key.ty(),
            actor_id = key.id(),
            version,
            kind,
            turn_id
        );
        // An eval runs in a fresh sandbox; everything else in the actor's
        // live instance.
        let mut fresh: Option<(Instance, Duration)> = None;
        let started_instance = match &input {
            TurnInput::Eval(_) => Self::eval_instance(self.node.clone())
                .await
                .map(|i| fresh = Some(i)),
            _ => self.instance(version).await.map(drop),
        };
        if let Err(e) = started_instance {
            self.node.metrics.turn(kind, "not_started");
            return Err(e);
        }
        let is_fresh = fresh.is_some();
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
        let mut turn = TurnState::new(
            key.clone(),
            rec.num,
            version,
            self.seq,
            std::mem::take(&mut self.carry),
            rec.state_bytes,
            rec.state_keys,
            rec.last_event_seq,
            self.node.turn_limits.clone(),
            self.node.storage.clone(),
        );
        if let TurnInput::Message(_, chain) | TurnInput::Upgrade(_, chain) = &input {
            turn.chain = chain.clone();
        }
        // `actors.call` waits for this actor's earlier turns to be durable.
        turn.durable_before = Some(crate::sandbox::turn::DurableBefore {
            tracker: self.shared.tracker.clone(),
            seq: self.submitted_seq,
            generation: self.generation,
        });
        let (inst, turn_timeout) = match &mut fresh {
            Some((inst, timeout)) => (inst, *timeout),
            None => {
                let live = self.live.as_mut().expect("instance made live above");
                (&mut live.inst, live.turn_timeout)
            }
        };
        let Instance {
            store,
            handlers,
            js,
        } = inst;
        store.data_mut().turn = Some(turn);
        store.data_mut().cpu_ticks = 0;
        store.set_epoch_deadline(1);
        let ctx = Context {
            actor_type: key.ty().to_owned(),
            id: key.id().to_owned(),
            version,
            turn_id: turn_id.to_owned(),
        };
        let call = async {
            match input {
                TurnInput::Message(m, _) => handlers
                    .call_on_message(&mut *store, &ctx, &m)
                    .await
                    .map(|r| {
                        r.map(|reply| {
                            TurnOutput::Reply(TurnReply {
                                status: reply.status,
                                body: Bytes::from(reply.body),
                                content_type: reply.content_type,
                                message_id: m.id.clone(),
                                replayed: false,
                            })
                        })
                    }),
                TurnInput::Upgrade(from, _) => handlers
                    .call_on_upgrade(&mut *store, &ctx, from)
                    .await
                    .map(|r| r.map(|()| TurnOutput::Done)),
                TurnInput::Alarm(alarm) => handlers
                    .call_on_alarm(&mut *store, &ctx, &alarm)
                    .await
                    .map(|r| r.map(|()| TurnOutput::Done)),
                TurnInput::Input(input) => handlers
                    .call_on_input(&mut *store, &ctx, &input)
                    .await
                    .map(|r| r.map(|()| TurnOutput::Done)),
                TurnInput::Webhook(hook) => handlers
                    .call_on_webhook(&mut *store, &ctx, &hook)
                    .await
                    .map(|r| r.map(|()| TurnOutput::Done)),
                TurnInput::Eval(code) => {
                    let js = js
                        .as_ref()
                        .expect("the JavaScript engine exports js-runtime");
                    js.call_eval(&mut *store, &code).await.map(|o| {
                        Ok(TurnOutput::Eval(EvalReply {
                            result: o.result,
                            logs: o.logs,
                            error: o.error,
                        }))
                    })
                }
            }
        };
        let result = tokio::time::timeout(turn_timeout, call)
            .instrument(span.clone())
            .await;
        let turn = store.data_mut().turn.take();
        let stderr_tail = forward_output(&key, version, store.data());
        self.node
            .metrics
            .turn_seconds
            .observe(started.elapsed().as_secs_f64());
        let Some(turn) = turn else {
            // Only a host bug gets here. The instance is suspect and the
            // cache (with writes not yet durable) went with the turn state:
            // wait until disk holds everything, then carry on from disk.
            if !is_fresh {
                self.live = None;
            }
            self.shared
                .tracker
                .wait_committed(self.submitted_seq, self.generation)
                .await;
            tracing::error!(actor = %self.key, "host lost the turn state; continuing from disk");
            return Err(TurnError::Trap {
                kind: "trap",
                message: "host lost the turn state".into(),
            });
        };
        match result {
            Ok(Ok(Ok(TurnOutput::Eval(reply)))) if reply.error.is_some() => {
                // The script threw: like a failed turn, nothing it wrote stays.
                self.carry = turn.abandon();
                self.trim_cache();
                self.node.metrics.turn(kind, "error");
                Ok((TurnOutput::Eval(reply), FinishedTurn::default()))
            }
            Ok(Ok(Ok(out))) => {
                let (carry, finished) = turn.finish();
                self.carry = carry;
                self.trim_cache();
                self.node.metrics.turn(kind, "ok");
                Ok((out, finished))
            }
            Ok(Ok(Err(msg))) => {
                self.carry = turn.abandon();
                self.trim_cache();
                self.node.metrics.turn(kind, "error");
                span.in_scope(
                    || tracing::info!(error = %msg, "turn failed: the actor returned an error"),
                );
                Err(TurnError::ActorError(msg))
            }
            Ok(Err(trap)) if is_resource_exhaustion(&format!("{trap:#}")) => {
                // No fiber stack was free: the guest never ran.
                self.carry = turn.abandon();
                self.node.metrics.turn(kind, "not_started");
                tracing::warn!(actor = %self.key, error = %trap, "no room to run a turn");
                Err(TurnError::Overloaded)
            }
            Ok(Err(trap)) => {
                self.carry = turn.abandon();
                self.trim_cache();
                if !is_fresh {
                    self.live = None;
                }
                let kind_of = TrapKind::of(&trap);
                self.node.metrics.trap(kind_of.label());
                self.node.metrics.turn(kind, "trap");
                let mut message = trap_message(&trap);
                if let Some(tail) = stderr_tail {
                    message = format!("{message}; guest stderr: {tail}");
                }
                span.in_scope(|| tracing::warn!(reason = kind_of.label(), error = %message, "turn trapped; instance discarded"));
                Err(TurnError::Trap {
                    kind: kind_of.label(),
                    message,
                })
            }
            Err(_elapsed) => {
                self.carry = turn.abandon();
                self.trim_cache();
                if !is_fresh {
                    self.live = None;
                }
                self.node.metrics.trap("timeout");
                self.node.metrics.turn(kind, "timeout");
                span.in_scope(|| {
                    tracing::warn!("turn exceeded its wall-clock limit; instance discarded")
                });
                Err(TurnError::Timeout(turn_timeout.as_millis() as u64))
            }
        }
    }

    fn trim_cache(&mut self) {
        self.carry
            .cache
            .trim(STATE_CACHE_BYTES, self.shared.tracker.committed_seq());
    }

    /// Turn a finished turn into one commit and hand it to the writer.
    fn submit(&mut self, finished: FinishedTurn, mut extras: CommitExtras, on_durable: OnDurable) {
        let max_events = self.node.config.limits.max_events_per_actor;
        let now = now_ms();
        let age_trim = self.age_trim_point();
        let record = self.record.as_mut().expect("record loaded");
        if !extras.bookkeeping {
            record.turns += 1;
            record.last_turn_at_ms = now;
        }
        record.state_bytes = finished.state_bytes;
        record.state_keys = finished.state_keys;
        let mut events = Vec::with_capacity(finished.events.len() + extras.events.len());
        for (kind, data) in finished.events.into_iter().chain(extras.events.drain(..)) {
            record.last_event_seq += 1;
            events.push((
                record.last_event_seq,
                EventRecord {
                    kind,
                    data,
                    at_ms: now,
                },
            ));
        }
        if record.first_event_seq == 0 && !events.is_empty() {
            record.first_event_seq = events[0].0;
            self.oldest_event_at_ms = Some(now);
        }
        // Retention: at most `max_events` events, none past the age limit.
        let mut trim_events_below = age_trim;
        if record.last_event_seq >= record.first_event_seq + max_events
            && record.first_event_seq > 0
        {
            let first = record.last_event_seq + 1 - max_events;
            if trim_events_below.is_none_or(|t| t < first) {
                trim_events_below = Some(first);
                self.oldest_event_at_ms = None;
            }
        }
        if let Some(first) = trim_events_below {
            record.first_event_seq = first;
        }
        let last_event_seq = record.last_event_seq;
        let seq = if self.seq > self.submitted_seq {
            self.seq
        } else {
            // A commit without a turn of its own (recovery bookkeeping).
            self.seq += 1;
            self.seq
        };
        self.submitted_seq = seq;
        if let Some((k, rec)) = &extras.idempotency {
            if self.idem_pending.len() > 1024 {
                let committed = self.shared.tracker.committed_seq();
                self.idem_pending.retain(|_, (s, _)| *s > committed);
            }
            self.idem_pending
                .insert(k.clone(), (seq, rec.outcome.clone()));
        }
        let write_record = extras.force_record
            || self
                .persisted
                .as_ref()
                .is_none_or(|p| !p.same_durable_fields(record));
        self.shared.note_turn(record.turns, record.last_turn_at_ms);
        let record = write_record.then(|| record.clone());
        if record.is_some() {
            self.persisted = record.clone();
        }
        let mut alarms = finished.alarm_writes;
        if let Some((name, rec)) = extras.alarm.take()
            && !alarms.iter().any(|(n, _)| *n == name)
        {
            if let Some(known) = &mut self.carry.alarms {
                match &rec {
                    Some(r) => known.insert(name.clone(), r.clone()),
                    None => known.remove(&name),
                };
            }
            alarms.push((name, rec));
        }
        let mut inputs = finished.input_writes;
        inputs.append(&mut extras.inputs);
        let sends = finished.sends;
        let on_durable = if sends.is_empty() {
            on_durable
        } else {
            // The recipients' inboxes got rows in this commit: wake them.
            let node = self.node.clone();
            let to: Vec<ActorKey> = sends.iter().map(|(k, ..)| k.clone()).collect();
            // This runs on the writer thread: wake the recipients from a
            // task instead, so the next commit batch does not wait for them.
            let runtime = tokio::runtime::Handle::current();
            Box::new(move |r: Result<(), CommitFailed>| {
                if r.is_ok() {
                    runtime.spawn(async move {
                        for key in &to {
                            // The writer drops sends to a type deleted since.
                            if node.catalog.get(key.ty()).is_some() {
                                node.metrics.inbox_depth.inc();
                                node.registry.poke(&node, key);
                            }
                        }
                    });
                }
                on_durable(r);
            })
        };
        let on_durable = self.notify_scheduler(&alarms, on_durable);
        let on_durable = if events.is_empty() {
            on_durable
        } else {
            // Live streams read committed events only: tell them once durable.
            let bus = self.node.event_bus.clone();
            let key = self.key.clone();
            Box::new(move |r: Result<(), CommitFailed>| {
                if r.is_ok() {
                    bus.publish(&key, last_event_seq);
                }
                on_durable(r);
            })
        };
        let commit = TurnCommit {
            key: self.key.clone(),
            tracker: self.shared.tracker.clone(),
            generation: self.generation,
            seq,
            num: self.record().num,
            record,
            state: finished.writes,
            events,
            trim_events_below,
            idempotency: extras.idempotency,
            inbox_done: extras.inbox_done,
            inbox_update: extras.inbox_update,
            alarms,
            inputs,
            sends,
            on_durable,
        };
        self.node
            .storage
            .writer()
            .submit(WriteOp::Turn(Box::new(commit)));
    }

    /// Where retention by age cuts the log: the first seq to keep, if some
    /// events are past the cut-off. Only durable events can be that old
    /// (anything in flight was written just now), so the disk is enough.
    fn age_trim_point(&mut self) -> Option<u64> {
        let cutoff = self.node.event_cutoff_ms();
        let rec = self.record.as_ref()?;
        let (num, first, last) = (rec.num, rec.first_event_seq, rec.last_event_seq);
        if cutoff == 0 || first == 0 || first > last {
            return None;
        }
        if self.oldest_event_at_ms.is_some_and(|t| t >= cutoff) {
            return None;
        }
        let reader = match self.node.storage.reader() {
            Ok(r) => r,
            Err(e) => {
                tracing::warn!(actor = %self.key, error = %e, "cannot read events for retention");
                return None;
            }
        };
        let mut keep_from = first;
        let mut after = first - 1;
        loop {
            let page = match reader.events(num, after, 1024) {
                Ok(p) => p,
                Err(e) => {
                    tracing::warn!(actor = %self.key, error = %e, "cannot read events for retention");
                    return None;
                }
            };
            let Some((last_read, _)) = page.last() else {
                // Everything durable is past retention.
                self.oldest_event_at_ms = None;
                break;
            };
            let last_read = *last_read;
            if let Some((seq, e)) = page.iter().find(|(_, e)| e.at_ms >= cutoff) {
                keep_from = *seq;
                self.oldest_event_at_ms = Some(e.at_ms);
                break;
            }
            keep_from = last_read + 1;
            after = last_read;
        }
        (keep_from > first).then_some(keep_from)
    }

    /// Tell the scheduler about alarms a commit sets, moves or removes,
    /// once it is durable (before that the change may still vanish).
    fn notify_scheduler(
        &self,
        alarms: &[(String, Option<AlarmRecord>)],
        on_durable: OnDurable,
    ) -> OnDurable {
        if alarms.is_empty() {
            return on_durable;
        }
        let changes: Vec<(String, Option<u64>)> = alarms
            .iter()
            .map(|(name, rec)| (name.clone(), rec.as_ref().map(|r| r.next_due_ms)))
            .collect();
        let scheduler = self.node.scheduler.clone();
        let num = self.record().num;
        Box::new(move |r| {
            if r.is_ok() {
                for (name, due_ms) in changes {
                    scheduler.notify(Notice::Set { num, name, due_ms });
                }
            }
            on_durable(r);
        })
    }

    /// Run a due alarm's turn. Its commit deletes a one-shot alarm or moves
    /// a periodic one to its next occurrence, in the same transaction as the
    /// handler's effects; a failed attempt is retried with back-off and,
    /// after the last, given up with an `alarm_failed` event. The ticket
    /// (and its scheduler permit) is held until that commit is durable.
    async fn on_alarm(&mut self, d: AlarmDelivery) {
        let AlarmDelivery {
            name,
            due_ms,
            mut ticket,
        } = d;
        match self.ready(false).await {
            Ok(()) => {}
            // Deleted with its alarms, or its type is gone: nothing to run.
            Err(TurnError::NotFound | TurnError::UnknownType(_)) => {
                ticket.settle();
                return;
            }
            Err(e) => {
                tracing::warn!(actor = %self.key, alarm = %name, error = %e, "alarm cannot run now; will retry");
                ticket.retry_later(ALARM_RETRY_MS);
                return;
            }
        }
        let alarm = match self.current_alarm(&name) {
            Ok(a) => a,
            Err(e) => {
                tracing::warn!(actor = %self.key, alarm = %name, error = %e, "cannot read the alarm; will retry");
                ticket.retry_later(ALARM_RETRY_MS);
                return;
            }
        };
        let now = now_ms();
        // Cancelled, or moved to later since the scheduler saw it (the
        // commit that moved it told the scheduler the new time).
        let Some(mut rec) = alarm.filter(|r| r.next_due_ms <= now) else {
            ticket.settle();
            return;
        };
        let due = rec.next_due_ms;
        if due != due_ms {
            tracing::debug!(actor = %self.key, alarm = %name, "alarm moved earlier; firing at its current time");
        }
        // The platform's own alarm that expires an input request: moot if
        // the request was answered meanwhile.
        let expiring = match crate::alarms::expiring_input(&name) {
            None => None,
            Some(id) => match self.pending_input(id).await {
                Ok(input) => Some((id.to_owned(), input)),
                Err(_) => {
                    let extras = CommitExtras {
                        bookkeeping: true,
                        alarm: Some((name, None)),
                        ..Default::default()
                    };
                    self.submit_alarm(FinishedTurn::unchanged(self.record()), extras, ticket);
                    return;
                }
            },
        };
        if due < self.node.boot_ms {
            // Due before this node started: its turn may be what brought the
            // node down. Count the attempt durably before running it again.
            let max = self.node.config.recovery.max_attempts;
            if rec.boot_attempts >= max {
                let error = format!(
                    "the turn was started {} times after crashes and never finished",
                    rec.boot_attempts
                );
                self.node.metrics.turns_failed_recovery.inc();
                tracing::error!(actor = %self.key, alarm = %name, attempts = rec.boot_attempts,
                    "alarm keeps crashing the node; giving up this occurrence");
                let mut extras = self.give_up_alarm(&name, &rec, due, "recovery_exhausted", &error);
                if let Some((id, input)) = expiring {
                    self.settle_input(
                        &mut extras,
                        &id,
                        input,
                        InputStatus::Expired { at_ms: now_ms() },
                    );
                }
                self.submit_alarm(FinishedTurn::unchanged(self.record()), extras, ticket);
                return;
            }
            rec.boot_attempts += 1;
            let (tx, rx) = oneshot::channel();
            self.submit(
                FinishedTurn::unchanged(self.record()),
                CommitExtras {
                    bookkeeping: true,
                    alarm: Some((name.clone(), Some(rec.clone()))),
                    ..Default::default()
                },
                Box::new(move |r| {
                    let _ = tx.send(r);
                }),
            );
            if !matches!(rx.await, Ok(Ok(()))) {
                // Not counted, so not run.
                ticket.retry_later(ALARM_RETRY_MS);
                return;
            }
        }
        self.node
            .metrics
            .alarm_lag_seconds
            .observe(now.saturating_sub(due) as f64 / 1000.0);
        if let Err(e) = self.ensure_version().await {
            tracing::warn!(actor = %self.key, alarm = %name, error = %e, "alarm waits for the upgrade");
            ticket.retry_later(if not_started(&e) {
                ALARM_RETRY_MS
            } else {
                5_000
            });
            return;
        }
        let (kind, turn_id, input) = match &expiring {
            Some((id, input)) => (
                "input",
                format!("input-expired:{id}"),
                TurnInput::Input(InputAnswer {
                    id: id.clone(),
                    kind: input.kind.clone(),
                    response: Vec::new(),
                    expired: true,
                }),
            ),
            None => (
                "alarm",
                format!("alarm:{name}:{due}"),
                TurnInput::Alarm(Alarm {
                    name: name.clone(),
                    payload: rec.payload.clone(),
                    due_at: due,
                }),
            ),
        };
        let version = self.record().version;
        let result = self.run_turn(kind, version, &turn_id, input).await;
        let max_attempts = self.node.config.alarms.max_attempts.max(1);
        let (finished, extras) = match result {
            Ok((_, finished)) => {
                let next = self.after_firing(&name, &rec, due);
                let mut extras = CommitExtras {
                    alarm: Some((name, next)),
                    ..Default::default()
                };
                if let Some((id, input)) = expiring {
                    self.settle_input(
                        &mut extras,
                        &id,
                        input,
                        InputStatus::Expired { at_ms: now_ms() },
                    );
                }
                (finished, extras)
            }
            Err(e) if not_started(&e) => {
                ticket.retry_later(ALARM_RETRY_MS);
                return;
            }
            Err(e) if rec.attempts + 1 < max_attempts => {
                rec.attempts += 1;
                let base = self.node.config.alarms.retry_base_ms;
                let delay = crate::alarms::retry_delay_ms(base, rec.attempts);
                rec.next_due_ms = now_ms() + delay;
                tracing::info!(actor = %self.key, alarm = %name, attempt = rec.attempts,
                    retry_in_ms = delay, error = %e, "alarm turn failed; will retry");
                let extras = CommitExtras {
                    bookkeeping: true,
                    alarm: Some((name, Some(rec))),
                    ..Default::default()
                };
                (FinishedTurn::unchanged(self.record()), extras)
            }
            Err(e) => {
                rec.attempts += 1;
                self.node.metrics.alarms_failed.inc();
                tracing::warn!(actor = %self.key, alarm = %name, attempts = rec.attempts,
                    error = %e, "alarm given up after its last attempt");
                let mut extras = self.give_up_alarm(&name, &rec, due, e.code(), &e.to_string());
                if let Some((id, input)) = expiring {
                    // Given up, but no longer waiting either.
                    self.settle_input(
                        &mut extras,
                        &id,
                        input,
                        InputStatus::Expired { at_ms: now_ms() },
                    );
                }
                (FinishedTurn::unchanged(self.record()), extras)
            }
        };
        self.submit_alarm(finished, extras, ticket);
    }

    /// Commit an alarm's outcome; the ticket is settled once it is durable
    /// and otherwise asks for the alarm again.
    fn submit_alarm(
        &mut self,
        finished: FinishedTurn,
        extras: CommitExtras,
        mut ticket: AlarmTicket,
    ) {
        self.submit(
            finished,
            extras,
            Box::new(move |r| match r {
                Ok(()) => ticket.settle(),
                Err(_) => ticket.retry_later(ALARM_RETRY_MS),
            }),
        );
    }

    /// Give up an alarm's current occurrence: a visible `alarm_failed`
    /// event, and the alarm removed (one-shot) or moved on (periodic).
    fn give_up_alarm(
        &self,
        name: &str,
        rec: &AlarmRecord,
        due: u64,
        code: &str,
        error: &str,
    ) -> CommitExtras {
        let data = serde_json::json!({
            "alarm": name,
            "due_at": due,
            "attempts": rec.attempts + rec.boot_attempts,
            "error": { "code": code, "message": error },
        });
        CommitExtras {
            bookkeeping: true,
            alarm: Some((name.to_owned(), self.after_firing(name, rec, due))),
            events: vec![(
                "alarm_failed".to_owned(),
                serde_json::to_vec(&data).expect("json"),
            )],
            ..Default::default()
        }
    }

    /// Run `on-input` with an answer. The request must still be pending and
    /// the answer must match its schema; the turn's commit marks it answered
    /// (and cancels its expiry) with the handler's effects, so a request is
    /// settled once. A failed turn leaves it pending.
    async fn on_answer(&mut self, d: AnswerDelivery) {
        let AnswerDelivery {
            input_id,
            response,
            reply,
        } = d;
        if let Err(e) = self.ready(false).await {
            let _ = reply.send(Err(e));
            return;
        }
        let input = match self.pending_input(&input_id).await {
            Ok(r) => r,
            Err(e) => {
                let _ = reply.send(Err(e));
                return;
            }
        };
        let answer: serde_json::Value = match serde_json::from_slice(&response) {
            Ok(v) => v,
            Err(e) => {
                let _ = reply.send(Err(TurnError::InvalidAnswer(format!("not JSON: {e}"))));
                return;
            }
        };
        if let Err(why) = crate::inputs::validate(input.schema.as_deref(), &answer) {
            let _ = reply.send(Err(TurnError::InvalidAnswer(why)));
            return;
        }
        if let Err(e) = self.ensure_version().await {
            self.release_when_durable(self.submitted_seq, Err(e), reply);
            return;
        }
        let turn_input = TurnInput::Input(InputAnswer {
            id: input_id.clone(),
            kind: input.kind.clone(),
            response: response.clone(),
            expired: false,
        });
        let version = self.record().version;
        let turn_id = format!("input:{input_id}");
        match self.run_turn("input", version, &turn_id, turn_input).await {
            Ok((_, finished)) => {
                let mut extras = CommitExtras::default();
                let status = InputStatus::Answered {
                    at_ms: now_ms(),
                    response,
                };
                self.settle_input(&mut extras, &input_id, input, status);
                self.submit(
                    finished,
                    extras,
                    Box::new(move |r| {
                        let _ = reply.send(r.map_err(TurnError::from));
                    }),
                );
            }
            Err(e) => self.release_when_durable(self.submitted_seq, Err(e), reply),
        }
    }

    /// Input request `id`, if it is still pending. Input requests change
    /// only in this actor's commits: once those are durable, disk is current.
    async fn pending_input(&mut self, id: &str) -> Result<InputRecord, TurnError> {
        self.shared
            .tracker
            .wait_committed(self.submitted_seq, self.generation)
            .await;
        self.ready(false).await?;
        let num = self.record().num;
        match self.node.storage.reader()?.input(num, id)? {
            None => Err(TurnError::InputNotFound(id.to_owned())),
            Some(r) if r.status == InputStatus::Pending => Ok(r),
            Some(r) => Err(TurnError::InputSettled {
                id: id.to_owned(),
                status: r.status.label(),
            }),
        }
    }

    /// Add to `extras` what settling input `id` commits: its new status, an
    /// `input_answered` or `input_expired` event, the removal of its expiry
    /// alarm, and the pruning of requests settled longer than the TTL ago.
    fn settle_input(
        &mut self,
        extras: &mut CommitExtras,
        id: &str,
        mut input: InputRecord,
        status: InputStatus,
    ) {
        let event = match status {
            InputStatus::Expired { .. } => "input_expired",
            _ => "input_answered",
        };
        let data = serde_json::json!({ "id": id, "kind": input.kind });
        extras
            .events
            .push((event.to_owned(), serde_json::to_vec(&data).expect("json")));
        if input.expires_at_ms.is_some() && extras.alarm.is_none() {
            extras.alarm = Some((crate::alarms::input_expiry_alarm(id), None));
        }
        input.status = status;
        extras.inputs.push((id.to_owned(), Some(input)));
        let ttl = self.node.config.inputs.settled_ttl_ms;
        let now = now_ms();
        let num = self.record().num;
        match self.node.storage.reader().and_then(|r| r.inputs(num)) {
            Ok(all) => extras.inputs.extend(
                all.into_iter()
                    .filter(|(other, r)| {
                        other != id
                            && r.status
                                .settled_at_ms()
                                .is_some_and(|t| t.saturating_add(ttl) < now)
                    })
                    .map(|(other, _)| (other, None)),
            ),
            Err(e) => tracing::warn!(actor = %self.key, error = %e, "cannot prune settled inputs"),
        }
        if let Some(p) = &mut self.carry.pending_inputs {
            *p = p.saturating_sub(1);
        }
    }

    /// Alarm `name` as the actor sees it now, including commits in flight.
    fn current_alarm(&mut self, name: &str) -> Result<Option<AlarmRecord>, TurnError> {
        if self.carry.alarms.is_none() {
            // Nothing in this activation touched alarms yet, so nothing
            // about them is in flight: disk is current.
            let rows = self.node.storage.reader()?.alarms(self.record().num)?;
            self.carry.alarms = Some(rows.into_iter().collect());
        }
        Ok(self
            .carry
            .alarms
            .as_ref()
            .and_then(|a| a.get(name))
            .cloned())
    }

    /// What becomes of an alarm after the occurrence due at `due` is over:
    /// gone if it was one-shot, else moved to its next occurrence after now.
    fn after_firing(&self, name: &str, rec: &AlarmRecord, due: u64) -> Option<AlarmRecord> {
        match crate::alarms::next_after_firing(&rec.schedule, due, now_ms()) {
            Ok(Some(next)) => Some(AlarmRecord {
                next_due_ms: next,
                attempts: 0,
                boot_attempts: 0,
                ..rec.clone()
            }),
            Ok(None) => None,
            Err(e) => {
                // Only a schedule that has run out (a cron with a year
                // field in the past) gets here; validated when set.
                tracing::warn!(actor = %self.key, alarm = %name, error = %e, "periodic alarm has no next occurrence; removed");
                None
            }
        }
    }

    /// Run every durable message in the inbox, oldest first.
    async fn drain_inbox(&mut self) {
        loop {
            match self.ready(false).await {
                Ok(()) => {}
                Err(TurnError::NotFound | TurnError::UnknownType(_)) => return,
                Err(e) => {
                    tracing::warn!(actor = %self.key, error = %e, "cannot run the inbox now; will retry");
                    self.retry_inbox_later();
                    return;
                }
            }
            let num = self.record().num;
            let rows = match self
                .node
                .storage
                .reader()
                .and_then(|r| r.inbox(num, self.inbox_cursor, INBOX_BATCH))
            {
                Ok(rows) => rows,
                Err(e) => {
                    tracing::error!(actor = %self.key, error = %e, "failed to read the inbox");
                    return;
                }
            };
            if rows.is_empty() {
                return;
            }
            for (seq, row) in rows {
                self.inbox_cursor = seq;
                if !self.run_inbox_message(seq, row).await {
                    // It could not start (no instance slot, code or storage
                    // unavailable): keep it, and everything after it, queued.
                    self.inbox_cursor = seq - 1;
                    self.retry_inbox_later();
                    return;
                }
                self.inbox_retry_ms = INBOX_RETRY_MS;
                if self.shared.tracker.min_generation() > self.generation {
                    // A commit failed: start over from what is on disk.
                    break;
                }
            }
        }
    }

    /// Look at the inbox again after a back-off (doubling up to 30 s).
    fn retry_inbox_later(&mut self) {
        let delay = self.inbox_retry_ms;
        self.inbox_retry_ms = (delay * 2).min(30_000);
        let node = self.node.clone();
        let key = self.key.clone();
        tokio::spawn(async move {
            tokio::time::sleep(Duration::from_millis(delay)).await;
            node.registry.poke(&node, &key);
        });
    }

    /// Run one durable message. Returns false when it could not start (it
    /// stays queued), true when it ran or was settled.
    async fn run_inbox_message(&mut self, seq: u64, mut row: InboxRecord) -> bool {
        let max_attempts = self.node.config.recovery.max_attempts;
        if seq <= self.node.boot_inbox_seq {
            // Present at boot: it may be what crashed the node. Count the
            // attempt durably before running it again.
            if row.attempts >= max_attempts {
                self.node.metrics.turns_failed_recovery.inc();
                tracing::error!(actor = %self.key, message_id = %row.message_id, attempts = row.attempts,
                    "durable message keeps crashing the node; giving up");
                let error = format!(
                    "the turn was started {} times after crashes and never finished",
                    row.attempts
                );
                self.fail_inbox_message(seq, row, "recovery_exhausted", error);
                return true;
            }
            row.attempts += 1;
            let (tx, rx) = oneshot::channel();
            self.submit(
                FinishedTurn::unchanged(self.record()),
                CommitExtras {
                    inbox_update: Some((seq, row.clone())),
                    bookkeeping: true,
                    ..Default::default()
                },
                Box::new(move |r| {
                    let _ = tx.send(r);
                }),
            );
            match rx.await {
                Ok(Ok(())) => {}
                // The attempt did not reach disk: do not run it uncounted.
                _ => return false,
            }
        }
        if let Some(k) = &row.idempotency_key {
            // A waiting sender may have run a message with the same key
            // between the enqueue and now; its effect must not repeat.
            if let Ok(Some((_, IdemOutcome::Done { message_id, .. }))) = self.idempotency(k)
                && message_id != row.message_id
            {
                self.submit(
                    FinishedTurn::unchanged(self.record()),
                    CommitExtras {
                        inbox_done: Some(seq),
                        bookkeeping: true,
                        ..Default::default()
                    },
                    done_inbox(&self.node),
                );
                return true;
            }
        }
        if let Err(e) = self.ensure_version().await {
            if not_started(&e) {
                return false;
            }
            self.fail_inbox_message(seq, row, e.code(), e.to_string());
            return true;
        }
        let (kind, input) = match &row.kind {
            InboxKind::Message => (
                "message",
                TurnInput::Message(
                    Message {
                        id: row.message_id.clone(),
                        body: row.body.clone(),
                        content_type: row.content_type.clone(),
                    },
                    CallChain::from([]),
                ),
            ),
            InboxKind::Webhook { name, headers } => (
                "webhook",
                TurnInput::Webhook(Webhook {
                    name: name.clone(),
                    headers: headers.clone(),
                    body: row.body.clone(),
                }),
            ),
        };
        let version = self.record().version;
        let result = self
            .run_turn(kind, version, &row.message_id, input)
            .await
            .map(|(out, finished)| match out {
                // A webhook has no caller waiting: what its idempotency
                // record keeps is an empty 200.
                TurnOutput::Done => (
                    TurnReply {
                        status: 200,
                        body: Bytes::new(),
                        content_type: None,
                        message_id: row.message_id.clone(),
                        replayed: false,
                    },
                    finished,
                ),
                TurnOutput::Reply(out) => (out, finished),
                TurnOutput::Eval(_) => unreachable!("inbox rows are never evals"),
            });
        match result {
            Ok((out, finished)) => {
                let idempotency = row.idempotency_key.clone().map(|k| {
                    (
                        k,
                        self.idem_record(IdemOutcome::Done {
                            message_id: row.message_id.clone(),
                            reply: StoredReply {
                                status: out.status,
                                body: out.body.to_vec(),
                                content_type: out.content_type,
                            },
                        }),
                    )
                });
                self.submit(
                    finished,
                    CommitExtras {
                        idempotency,
                        inbox_done: Some(seq),
                        ..Default::default()
                    },
                    done_inbox(&self.node),
                );
            }
            Err(e) if not_started(&e) => return false,
            Err(e) => self.fail_inbox_message(seq, row, e.code(), e.to_string()),
        }
        true
    }

    /// A durable message failed: record a visible `turn_failed` event and
    /// take it out of the inbox, in one commit.
    fn fail_inbox_message(&mut self, seq: u64, row: InboxRecord, code: &str, error: String) {
        let data = serde_json::json!({
            "message_id": row.message_id,
            "error": { "code": code, "message": error },
            "attempts": row.attempts,
        });
        let idempotency = row.idempotency_key.clone().map(|k| {
            (
                k,
                self.idem_record(IdemOutcome::Failed {
                    message_id: row.message_id.clone(),
                    error: error.clone(),
                }),
            )
        });
        self.submit(
            FinishedTurn::unchanged(self.record()),
            CommitExtras {
                idempotency,
                inbox_done: Some(seq),
                bookkeeping: true,
                events: vec![(
                    "turn_failed".to_owned(),
                    serde_json::to_vec(&data).expect("json"),
                )],
                ..Default::default()
            },
            done_inbox(&self.node),
        );
    }

    /// Delete the actor's durable data; the task stays up as a fresh actor.
    async fn delete(&mut self) -> Result<bool, TurnError> {
        self.shared
            .tracker
            .wait_committed(self.submitted_seq, self.generation)
            .await;
        let key = self.key.clone();
        let existed = self
            .node
            .storage
            .writer()
            .call(|done| WriteOp::DeleteActor { key, done })
            .await?;
        self.reset();
        // Streams watching it end (its log is gone).
        self.node.event_bus.publish(&self.key, 0);
        tracing::info!(actor = %self.key, existed, "actor deleted");
        Ok(existed)
    }
}

impl FinishedTurn {
    /// Whether the turn wrote nothing: no state, events, alarms, input
    /// requests or messages to other actors.
    fn is_empty(&self) -> bool {
        self.writes.is_empty()
            && self.events.is_empty()
            && self.alarm_writes.is_empty()
            && self.input_writes.is_empty()
            && self.sends.is_empty()
    }

    /// A commit that changes no state (bookkeeping only).
    fn unchanged(record: &ActorRecord) -> Self {
        Self {
            writes: Vec::new(),
            events: Vec::new(),
            state_bytes: record.state_bytes,
            state_keys: record.state_keys,
            alarm_writes: Vec::new(),
            input_writes: Vec::new(),
            sends: Vec::new(),
        }
    }
}

/// Instantiation failures that mean "no room right now", not bad code: the
/// pool is full or the kernel refused memory or mappings.
/// Why an instance could not be created.
enum StartError {
    /// Its pool stayed full (or memory ran out) while we waited for room.
    Full(String),
    /// Anything else.
    Failed(String),
}

/// Back-off (ms) between attempts to get a slot in a full instance pool:
/// about two seconds in all before the turn is refused with 503.
const ROOM_BACKOFF_MS: [u64; 11] = [1, 2, 4, 8, 16, 32, 64, 128, 256, 512, 1024];

/// Instantiate `pre`; if its pool is full, ask the least recently used
/// actors of the same engine to hibernate (5% of the pool) and try again
/// with back-off. JavaScript sandboxes are fewer than the active-actor cap
/// (`limits.max_js_sandboxes`), so this is how JavaScript actors beyond it
/// take turns: the idle ones make way, as under the active cap.
async fn instantiate_with_room(
    node: &Arc<Node>,
    pre: &crate::sandbox::Prepared,
    js: bool,
    host: impl Fn() -> crate::sandbox::host::Host,
) -> Result<Instance, StartError> {
    let slot = if js { SLOT_JS } else { SLOT_WASM };
    let mut backoff = ROOM_BACKOFF_MS.iter();
    let mut waiting = None;
    loop {
        let e = match node.sandbox.instantiate(pre, host()).await {
            Ok(i) => return Ok(i),
            Err(e) => format!("{e:#}"),
        };
        if !is_resource_exhaustion(&e) {
            return Err(StartError::Failed(e));
        }
        let Some(&ms) = backoff.next() else {
            return Err(StartError::Full(e));
        };
        let waiting = waiting.get_or_insert_with(|| node.registry.wait_for_room(slot));
        node.registry
            .make_room(node, slot, node.sandbox.pool_size(js) / 20, waiting);
        tokio::time::sleep(Duration::from_millis(ms)).await;
    }
}

fn is_resource_exhaustion(msg: &str) -> bool {
    msg.contains("concurrent")
        || msg.contains("pooling")
        || msg.contains("Cannot allocate memory")
        || msg.contains("os error 12")
}

/// Errors that mean no handler ran, so a durable message must stay queued
/// rather than be settled as failed.
fn not_started(e: &TurnError) -> bool {
    matches!(
        e,
        TurnError::Overloaded | TurnError::Code(_) | TurnError::Storage(_)
    )
}

fn done_inbox(node: &Arc<Node>) -> OnDurable {
    let node = node.clone();
    Box::new(move |r| {
        if r.is_ok() {
            node.metrics.inbox_depth.dec();
        }
    })
}

/// Send what the guest printed to the node's logs; return what stderr says
/// about a panic (or its last line), for error reports.
fn forward_output(key: &ActorKey, version: u32, host: &crate::sandbox::Host) -> Option<String> {
    let mut stderr_lines: Vec<String> = Vec::new();
    for (stream, out) in [("stdout", &host.stdout), ("stderr", &host.stderr)] {
        if out.is_empty() {
            continue;
        }
        let (bytes, dropped) = out.drain();
        let text = String::from_utf8_lossy(&bytes);
        for line in text.lines().filter(|l| !l.trim().is_empty()) {
            tracing::info!(target: "marmot::guest", actor = %key, version, stream, "{line}");
            if stream == "stderr" {
                stderr_lines.push(line.to_owned());
            }
        }
        if dropped > 0 {
            tracing::warn!(target: "marmot::guest", actor = %key, stream, dropped, "guest output over the per-turn cap was dropped");
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
    if let Some(t) = err.downcast_ref::<crate::sandbox::LimitTrap>() {
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
