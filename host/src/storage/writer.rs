//! The group-commit writer: the only code that writes to redb.
//!
//! Turns from many actors queue [`WriteOp`]s on one channel. A dedicated
//! thread takes everything queued (up to `max_batch`), applies it in one
//! write transaction, commits it with fsync, and only then completes each
//! operation. Under light load a turn waits for about one fsync; under heavy
//! load batches grow and throughput follows the CPU rather than the disk.
//!
//! Completion is the *output gate*: a reply is handed to its caller from the
//! operation's completion, so nothing leaves the node before it is durable.
//!
//! Actors do not wait for their own commits before running the next turn
//! (that would cap one actor at one fsync per turn). Instead every turn
//! carries a [`CommitTracker`] generation: when a commit fails, every actor
//! in the batch has its minimum generation raised, later operations from the
//! old generation are refused, and the actor reloads from disk before its
//! next turn. Nothing computed from lost writes can ever commit or be
//! released.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Instant;

use bytes::Bytes;
use redb::{ReadableTable, WriteTransaction};
use tokio::sync::{Notify, mpsc, oneshot};

use super::schema::*;
use super::{StorageError, Subscriptions, decode_type, encode_type};
use crate::clock::now_ms;
use crate::config::StorageConfig;
use crate::ids::ActorKey;
use crate::metrics::Metrics;

/// A commit failed; nothing in it was written.
#[derive(Debug, Clone, thiserror::Error)]
pub enum CommitFailed {
    /// The transaction failed to apply or commit.
    #[error("commit failed: {0}")]
    Storage(String),
    /// An earlier commit of the same actor failed, so this turn, which ran on
    /// top of it, was refused.
    #[error("an earlier commit of this actor failed; the turn was discarded")]
    Superseded,
    /// The writer is shutting down.
    #[error("node is shutting down")]
    ShuttingDown,
}

/// Per-actor commit bookkeeping shared between an actor and the writer.
#[derive(Debug, Default)]
pub struct CommitTracker {
    /// Turns from generations below this are refused (an earlier commit failed).
    min_generation: AtomicU64,
    /// Highest turn sequence number known durable.
    committed_seq: AtomicU64,
    /// Signalled after every commit that includes this actor.
    committed: Notify,
}

impl CommitTracker {
    /// The lowest generation the writer still accepts.
    pub fn min_generation(&self) -> u64 {
        self.min_generation.load(Ordering::Acquire)
    }

    /// Highest turn sequence number known durable.
    pub fn committed_seq(&self) -> u64 {
        self.committed_seq.load(Ordering::Acquire)
    }

    /// Wait until turn `seq` is durable or the generation was superseded.
    pub async fn wait_committed(&self, seq: u64, generation: u64) {
        loop {
            let notified = self.committed.notified();
            tokio::pin!(notified);
            notified.as_mut().enable();
            if self.committed_seq() >= seq || self.min_generation() > generation {
                return;
            }
            notified.await;
        }
    }

    /// Refuse every later commit of this actor (its type is being deleted).
    pub fn fence(&self) {
        self.mark_failed(u64::MAX - 1);
    }

    fn mark_committed(&self, seq: u64) {
        self.committed_seq.fetch_max(seq, Ordering::AcqRel);
        self.committed.notify_waiters();
    }

    fn mark_failed(&self, generation: u64) {
        self.min_generation
            .fetch_max(generation + 1, Ordering::AcqRel);
        self.committed.notify_waiters();
    }
}

/// Called once the operation's commit is durable, or failed.
pub type OnDurable = Box<dyn FnOnce(Result<(), CommitFailed>) + Send>;

/// Everything one successful turn writes, committed atomically.
pub struct TurnCommit {
    /// The actor.
    pub key: ActorKey,
    /// Its commit bookkeeping.
    pub tracker: Arc<CommitTracker>,
    /// The generation the turn ran in.
    pub generation: u64,
    /// The turn's sequence number within the actor's activation.
    pub seq: u64,
    /// The actor number.
    pub num: u64,
    /// The actor record after the turn, when it changed in a way that must
    /// be durable with the turn (state size, event seqs, version). Activity
    /// statistics alone do not force a write.
    pub record: Option<ActorRecord>,
    /// State writes (`None` deletes).
    pub state: Vec<(String, Option<Bytes>)>,
    /// Events to append, with their seqs.
    pub events: Vec<(u64, EventRecord)>,
    /// Delete events with seq below this (retention).
    pub trim_events_below: Option<u64>,
    /// An idempotency record to write.
    pub idempotency: Option<(String, IdemRecord)>,
    /// An inbox row this turn consumed.
    pub inbox_done: Option<u64>,
    /// An inbox row to rewrite (recovery attempt counter).
    pub inbox_update: Option<(u64, InboxRecord)>,
    /// Alarms set or moved (`Some`) or removed (`None`).
    pub alarms: Vec<(String, Option<AlarmRecord>)>,
    /// Input requests written (`Some`) or removed (`None`).
    pub inputs: Vec<(String, Option<InputRecord>)>,
    /// Messages to other actors (`actors.send`): (recipient, its type's
    /// version for a new actor, the inbox row), queued in this commit.
    pub sends: Vec<(ActorKey, InboxRecord)>,
    /// Completion.
    pub on_durable: OnDurable,
}

/// Result of a durable enqueue.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum EnqueueOutcome {
    /// Stored; the actor must be poked.
    Queued {
        /// The message id.
        message_id: String,
    },
    /// An earlier message with the same idempotency key exists.
    Duplicate {
        /// Its message id.
        message_id: String,
    },
}

type Reply<T> = oneshot::Sender<Result<T, StorageError>>;

/// One unit of work for the writer.
pub enum WriteOp {
    /// Commit a turn.
    Turn(Box<TurnCommit>),
    /// Look up an actor, creating it (with `version`) when absent.
    GetOrCreate {
        /// The actor.
        key: ActorKey,
        /// Version for a new actor.
        version: u32,
        /// Completion (after durable).
        done: Reply<ActorRecord>,
    },
    /// Durably enqueue a `?wait=false` message, creating the actor if needed.
    Enqueue {
        /// The actor.
        key: ActorKey,
        /// Version for a new actor.
        version: u32,
        /// The message.
        message: InboxRecord,
        /// How long an idempotency record lives.
        idempotency_ttl_ms: u64,
        /// Completion (after durable).
        done: Reply<EnqueueOutcome>,
    },
    /// Delete an actor and everything it owns.
    DeleteActor {
        /// The actor.
        key: ActorKey,
        /// Completion: whether it existed.
        done: Reply<bool>,
    },
    /// Write a type record, with new code if given.
    PutType {
        /// The record.
        record: TypeRecord,
        /// (version, bytes) of newly deployed code.
        code: Option<(u32, Vec<u8>)>,
        /// Completion.
        done: Reply<()>,
    },
    /// Delete a type, its code and (when `with_actors`) all its actors.
    DeleteType {
        /// The type.
        name: String,
        /// Also delete its actors.
        with_actors: bool,
        /// Completion: actors deleted.
        done: Reply<u64>,
    },
    /// Forget idempotency records that expired before `now_ms`.
    SweepIdempotency {
        /// The cut-off.
        now_ms: u64,
        /// Completion: records removed.
        done: Reply<u64>,
    },
    /// Create or replace an outbound webhook subscription.
    PutSubscription {
        /// Its name.
        name: String,
        /// The subscription.
        record: SubscriptionRecord,
        /// Completion: whether it was new.
        done: Reply<bool>,
    },
    /// Delete a subscription (its undelivered rows are dropped when due).
    DeleteSubscription {
        /// Its name.
        name: String,
        /// Completion: whether it existed.
        done: Reply<bool>,
    },
    /// Record a delivery attempt: `None` delivered (the row goes), else the
    /// row as it is now (rescheduled or dead).
    DeliveryAttempted {
        /// Outbox seq.
        seq: u64,
        /// The row after the attempt.
        update: Option<DeliveryRecord>,
        /// Completion.
        done: Reply<()>,
    },
    /// Make a delivery due again now, with a fresh retry schedule (replay).
    RetryDelivery {
        /// Outbox seq.
        seq: u64,
        /// Its public id (must match the row).
        id: String,
        /// Completion: the row, if it exists.
        done: Reply<Option<DeliveryRecord>>,
    },
    /// Completes once everything queued before it is durable.
    Barrier {
        /// Completion.
        done: oneshot::Sender<()>,
    },
}

/// Handle to the writer thread.
pub struct Writer {
    tx: mpsc::UnboundedSender<WriteOp>,
    /// Actors on disk, kept current by the writer.
    actor_count: Arc<AtomicU64>,
    /// Fault injection for tests: fail this many upcoming commits.
    fail_commits: Arc<AtomicU64>,
}

impl Writer {
    pub(super) fn start(
        db: Arc<redb::Database>,
        config: &StorageConfig,
        metrics: Arc<Metrics>,
        subscriptions: Arc<Subscriptions>,
        outbox_ready: Arc<Notify>,
    ) -> Result<Self, StorageError> {
        let (tx, rx) = mpsc::unbounded_channel();
        let (next_num, actor_count, next_inbox_seq, next_delivery_seq) = {
            use redb::{ReadableDatabase, ReadableTableMetadata};
            let r = db.begin_read()?;
            let keys = r.open_table(ACTOR_KEYS)?;
            let next_num = keys.last()?.map(|(k, _)| k.value() + 1).unwrap_or(1);
            let count = r.open_table(ACTORS)?.len()?;
            let inbox = r.open_table(INBOX)?;
            let mut max_seq = 0;
            for row in inbox.iter()? {
                max_seq = max_seq.max(row?.0.value().1);
            }
            let outbox = r.open_table(OUTBOX)?;
            let next_delivery = outbox.last()?.map(|(k, _)| k.value() + 1).unwrap_or(1);
            (next_num, count, max_seq + 1, next_delivery)
        };
        let actor_count = Arc::new(AtomicU64::new(actor_count));
        let fail_commits = Arc::new(AtomicU64::new(0));
        let mut state = WriterState {
            db,
            rx,
            max_batch: config.max_batch.max(1),
            quick_repair: config.quick_repair,
            next_num,
            next_inbox_seq,
            next_delivery_seq,
            actor_count: actor_count.clone(),
            fail_commits: fail_commits.clone(),
            metrics,
            subscriptions,
            outbox_ready,
            outbox_touched: false,
            subscriptions_touched: false,
        };
        std::thread::Builder::new()
            .name("marmot-writer".into())
            .spawn(move || {
                // Every waiter depends on this thread: if it dies, nothing
                // would ever be acknowledged again. Crash loudly instead;
                // recovery on restart loses nothing acknowledged.
                let run = std::panic::AssertUnwindSafe(|| state.run());
                if std::panic::catch_unwind(run).is_err() {
                    eprintln!("marmot: the storage writer panicked; aborting");
                    std::process::abort();
                }
            })
            .map_err(|e| StorageError::Io {
                what: "failed to start the storage writer thread".into(),
                source: e,
            })?;
        Ok(Self {
            tx,
            actor_count,
            fail_commits,
        })
    }

    /// Make the next `n` commits fail as if the disk had failed (tests).
    #[doc(hidden)]
    pub fn inject_commit_failures(&self, n: u64) {
        self.fail_commits.store(n, Ordering::SeqCst);
    }

    /// Queue an operation. If the writer is gone the operation is dropped,
    /// which completes its reply channel with an error for the waiter.
    pub fn submit(&self, op: WriteOp) {
        if let Err(mpsc::error::SendError(op)) = self.tx.send(op) {
            fail_op(op, CommitFailed::ShuttingDown);
        }
    }

    /// Queue an operation and wait for its result.
    pub async fn call<T>(&self, make: impl FnOnce(Reply<T>) -> WriteOp) -> Result<T, StorageError> {
        let (done, rx) = oneshot::channel();
        self.submit(make(done));
        rx.await.map_err(|_| StorageError::WriterGone)?
    }

    /// Wait until everything submitted so far is durable.
    pub async fn barrier(&self) {
        let (done, rx) = oneshot::channel();
        self.submit(WriteOp::Barrier { done });
        let _ = rx.await;
    }

    /// Actors on disk.
    pub fn actor_count(&self) -> u64 {
        self.actor_count.load(Ordering::Relaxed)
    }

    /// Wait for queued work to be durable. The thread itself exits when the
    /// last handle is dropped.
    pub async fn flush(&self) {
        self.barrier().await;
    }
}

fn fail_op(op: WriteOp, why: CommitFailed) {
    Applied::from_unapplied(op).complete(Some(&why));
}

impl Applied {
    /// The completion of an op that was never applied.
    fn from_unapplied(op: WriteOp) -> Applied {
        match op {
            WriteOp::Turn(t) => Applied::Turn {
                tracker: t.tracker,
                generation: t.generation,
                seq: t.seq,
                on_durable: t.on_durable,
            },
            WriteOp::GetOrCreate { done, .. } => {
                Applied::reply(done, Err(StorageError::WriterGone))
            }
            WriteOp::Enqueue { done, .. } => Applied::reply(done, Err(StorageError::WriterGone)),
            WriteOp::DeleteActor { done, .. } => {
                Applied::reply(done, Err(StorageError::WriterGone))
            }
            WriteOp::PutType { done, .. } => Applied::reply(done, Err(StorageError::WriterGone)),
            WriteOp::DeleteType { done, .. } => Applied::reply(done, Err(StorageError::WriterGone)),
            WriteOp::SweepIdempotency { done, .. } => {
                Applied::reply(done, Err(StorageError::WriterGone))
            }
            WriteOp::PutSubscription { done, .. } | WriteOp::DeleteSubscription { done, .. } => {
                Applied::reply(done, Err(StorageError::WriterGone))
            }
            WriteOp::DeliveryAttempted { done, .. } => {
                Applied::reply(done, Err(StorageError::WriterGone))
            }
            WriteOp::RetryDelivery { done, .. } => {
                Applied::reply(done, Err(StorageError::WriterGone))
            }
            WriteOp::Barrier { done } => Applied::Reply(Box::new(move |_| {
                let _ = done.send(());
            })),
        }
    }
}

struct WriterState {
    db: Arc<redb::Database>,
    rx: mpsc::UnboundedReceiver<WriteOp>,
    max_batch: usize,
    quick_repair: bool,
    next_num: u64,
    next_inbox_seq: u64,
    next_delivery_seq: u64,
    actor_count: Arc<AtomicU64>,
    fail_commits: Arc<AtomicU64>,
    metrics: Arc<Metrics>,
    subscriptions: Arc<Subscriptions>,
    outbox_ready: Arc<Notify>,
    /// The batch being applied added or changed outbox rows.
    outbox_touched: bool,
    /// The batch changed subscriptions.
    subscriptions_touched: bool,
}

/// Sends an op's result, or the commit's failure, to its waiter.
type ReplyFn = Box<dyn FnOnce(Option<&CommitFailed>) + Send>;

/// What applying one op produced, released (or failed) after the commit.
enum Applied {
    Turn {
        tracker: Arc<CommitTracker>,
        generation: u64,
        seq: u64,
        on_durable: OnDurable,
    },
    Refused(OnDurable),
    /// Anything else: a closure that sends the op's result, or the commit's
    /// failure, to its waiter.
    Reply(ReplyFn),
}

impl Applied {
    fn reply<T: Send + 'static>(done: Reply<T>, value: Result<T, StorageError>) -> Self {
        Applied::Reply(Box::new(move |failed| {
            let result = match (failed, value) {
                (Some(why), _) => Err(StorageError::CommitFailed(why.clone())),
                (None, v) => v,
            };
            let _ = done.send(result);
        }))
    }

    fn complete(self, failed: Option<&CommitFailed>) {
        match self {
            Applied::Turn {
                tracker,
                generation,
                seq,
                on_durable,
            } => match failed {
                None => {
                    tracker.mark_committed(seq);
                    on_durable(Ok(()));
                }
                Some(why) => {
                    tracker.mark_failed(generation);
                    on_durable(Err(why.clone()));
                }
            },
            Applied::Refused(on_durable) => on_durable(Err(CommitFailed::Superseded)),
            Applied::Reply(f) => f(failed),
        }
    }
}

impl WriterState {
    fn run(&mut self) {
        let mut batch: Vec<WriteOp> = Vec::with_capacity(self.max_batch);
        loop {
            batch.clear();
            match self.rx.blocking_recv() {
                Some(op) => batch.push(op),
                None => return,
            }
            while batch.len() < self.max_batch {
                match self.rx.try_recv() {
                    Ok(op) => batch.push(op),
                    Err(_) => break,
                }
            }
            self.commit_batch(&mut batch);
        }
    }

    /// Apply every op in one transaction and commit it. If any op fails to
    /// apply, or the commit fails, the whole batch fails: a half-applied
    /// transaction is never committed.
    fn commit_batch(&mut self, batch: &mut Vec<WriteOp>) {
        let started = Instant::now();
        let n = batch.len();
        let mut applied: Vec<Applied> = Vec::with_capacity(n);
        let saved = (self.next_num, self.next_inbox_seq, self.next_delivery_seq);
        self.outbox_touched = false;
        self.subscriptions_touched = false;
        let mut created: i64 = 0;
        let mut error: Option<StorageError> = None;
        match self.db.begin_write() {
            Ok(mut txn) => {
                txn.set_quick_repair(self.quick_repair);
                match Tables::open(&txn) {
                    Ok(mut tables) => {
                        for op in batch.drain(..) {
                            if error.is_some() {
                                // Not applied; only its waiter needs an answer.
                                applied.push(Applied::from_unapplied(op));
                                continue;
                            }
                            let (a, r) = self.apply(&mut tables, op, &mut created);
                            applied.push(a);
                            if let Err(e) = r {
                                error = Some(e);
                            }
                        }
                    }
                    Err(e) => {
                        error = Some(e);
                        applied.extend(batch.drain(..).map(Applied::from_unapplied));
                    }
                }
                let injected = self
                    .fail_commits
                    .fetch_update(Ordering::SeqCst, Ordering::SeqCst, |n| n.checked_sub(1))
                    .is_ok();
                if error.is_none() && injected {
                    error = Some(StorageError::Db(redb::Error::Io(std::io::Error::other(
                        "injected commit failure",
                    ))));
                } else if error.is_none()
                    && let Err(e) = txn.commit()
                {
                    error = Some(e.into());
                }
            }
            Err(e) => {
                error = Some(e.into());
                applied.extend(batch.drain(..).map(Applied::from_unapplied));
            }
        }
        match error {
            None => {
                self.metrics.commits.inc();
                self.metrics.commit_batch_size.observe(n as f64);
                self.metrics
                    .commit_seconds
                    .observe(started.elapsed().as_secs_f64());
                if created != 0 {
                    let c = self.actor_count.load(Ordering::Relaxed) as i64 + created;
                    self.actor_count.store(c.max(0) as u64, Ordering::Relaxed);
                }
                if self.outbox_touched {
                    self.outbox_ready.notify_one();
                }
                for a in applied {
                    a.complete(None);
                }
            }
            Some(e) => {
                self.metrics.commit_failures.inc();
                tracing::error!(error = %e, ops = n, "storage commit failed; failing every operation in the batch");
                (self.next_num, self.next_inbox_seq, self.next_delivery_seq) = saved;
                if self.subscriptions_touched {
                    // Subscription changes were applied in memory as they
                    // were written: go back to what is on disk.
                    match Subscriptions::load(&self.db) {
                        Ok(s) => self.subscriptions.replace(s.snapshot().as_ref().clone()),
                        Err(e) => tracing::error!(error = %e, "cannot reload subscriptions"),
                    }
                }
                let why = CommitFailed::Storage(e.to_string());
                for a in applied {
                    a.complete(Some(&why));
                }
            }
        }
    }

    fn apply(
        &mut self,
        tables: &mut Tables<'_>,
        op: WriteOp,
        created: &mut i64,
    ) -> (Applied, Result<(), StorageError>) {
        fn done<T: Send + 'static>(
            reply: Reply<T>,
            r: Result<T, StorageError>,
        ) -> (Applied, Result<(), StorageError>) {
            match r {
                Ok(v) => (Applied::reply(reply, Ok(v)), Ok(())),
                Err(e) => {
                    let msg = e.to_string();
                    (
                        Applied::reply(
                            reply,
                            Err(StorageError::CommitFailed(CommitFailed::Storage(msg))),
                        ),
                        Err(e),
                    )
                }
            }
        }
        match op {
            WriteOp::Turn(t) => self.apply_turn(tables, *t, created),
            WriteOp::GetOrCreate {
                key,
                version,
                done: d,
            } => {
                let r = self.get_or_create(tables, &key, version, created);
                done(d, r)
            }
            WriteOp::Enqueue {
                key,
                version,
                message,
                idempotency_ttl_ms,
                done: d,
            } => {
                let r = self
                    .get_or_create(tables, &key, version, created)
                    .and_then(|rec| self.enqueue(tables, rec.num, message, idempotency_ttl_ms));
                done(d, r)
            }
            WriteOp::DeleteActor { key, done: d } => {
                let r = tables.delete_actor(&key);
                if let Ok(true) = r {
                    *created -= 1;
                }
                done(d, r)
            }
            WriteOp::PutType {
                record,
                code,
                done: d,
            } => done(d, tables.put_type(&record, code)),
            WriteOp::DeleteType {
                name,
                with_actors,
                done: d,
            } => {
                let r = tables.delete_type(&name, with_actors);
                if let Ok(n) = r {
                    *created -= n as i64;
                }
                done(d, r)
            }
            WriteOp::SweepIdempotency { now_ms, done: d } => {
                done(d, tables.sweep_idempotency(now_ms))
            }
            WriteOp::PutSubscription {
                name,
                record,
                done: d,
            } => {
                let r = tables
                    .subscriptions
                    .insert(name.as_str(), encode(&record).as_slice())
                    .map(|old| old.is_none())
                    .map_err(StorageError::from);
                if r.is_ok() {
                    self.subscriptions.set(&name, Some(record));
                    self.subscriptions_touched = true;
                }
                done(d, r)
            }
            WriteOp::DeleteSubscription { name, done: d } => {
                let r = tables
                    .subscriptions
                    .remove(name.as_str())
                    .map(|old| old.is_some())
                    .map_err(StorageError::from);
                if r.is_ok() {
                    self.subscriptions.set(&name, None);
                    self.subscriptions_touched = true;
                }
                done(d, r)
            }
            WriteOp::DeliveryAttempted {
                seq,
                update,
                done: d,
            } => {
                self.outbox_touched = true;
                done(d, tables.write_delivery(seq, update.as_ref()))
            }
            WriteOp::RetryDelivery { seq, id, done: d } => {
                self.outbox_touched = true;
                let r = tables.retry_delivery(seq, &id);
                done(d, r)
            }
            WriteOp::Barrier { done } => (
                Applied::Reply(Box::new(move |_| {
                    let _ = done.send(());
                })),
                Ok(()),
            ),
        }
    }

    fn apply_turn(
        &mut self,
        tables: &mut Tables<'_>,
        t: TurnCommit,
        created: &mut i64,
    ) -> (Applied, Result<(), StorageError>) {
        if t.generation < t.tracker.min_generation() {
            return (Applied::Refused(t.on_durable), Ok(()));
        }
        let r = tables
            .write_turn(&t, created)
            .and_then(|()| self.write_outbox(tables, &t))
            .and_then(|()| {
                for (key, message) in &t.sends {
                    // The type was checked at send time but may have been
                    // deleted since: drop the message rather than create an
                    // actor of a type that no longer exists.
                    let ty = match tables.types.get(key.ty())? {
                        Some(v) => decode_type(v.value())?,
                        None => {
                            tracing::warn!(from = %t.key, to = %key,
                                "message to an actor of a deleted type dropped");
                            continue;
                        }
                    };
                    let version = ty.latest().version;
                    let rec = self.get_or_create(tables, key, version, created)?;
                    self.enqueue(tables, rec.num, message.clone(), 0)?;
                }
                Ok(())
            });
        let applied = Applied::Turn {
            tracker: t.tracker,
            generation: t.generation,
            seq: t.seq,
            on_durable: t.on_durable,
        };
        (applied, r)
    }

    fn get_or_create(
        &mut self,
        tables: &mut Tables<'_>,
        key: &ActorKey,
        version: u32,
        created: &mut i64,
    ) -> Result<ActorRecord, StorageError> {
        if let Some(v) = tables.actors.get((key.ty(), key.id()))? {
            return Ok(decode("actor", v.value())?);
        }
        let rec = ActorRecord::new(self.next_num, now_ms(), version);
        self.next_num += 1;
        tables
            .actors
            .insert((key.ty(), key.id()), encode(&rec).as_slice())?;
        tables.actor_keys.insert(rec.num, (key.ty(), key.id()))?;
        *created += 1;
        Ok(rec)
    }

    /// Outbox rows for the events of a turn that subscriptions want, in the
    /// turn's transaction: an event commits if and only if its deliveries do.
    fn write_outbox(
        &mut self,
        tables: &mut Tables<'_>,
        t: &TurnCommit,
    ) -> Result<(), StorageError> {
        if t.events.is_empty() {
            return Ok(());
        }
        let subs = self.subscriptions.snapshot();
        if subs.is_empty() {
            return Ok(());
        }
        for (seq, ev) in &t.events {
            let mut payload = None;
            for (name, sub) in subs.iter() {
                if !sub.matches(t.key.ty(), &ev.kind) {
                    continue;
                }
                let payload = payload
                    .get_or_insert_with(|| event_payload(&t.key, *seq, ev))
                    .clone();
                let dseq = self.next_delivery_seq;
                self.next_delivery_seq += 1;
                let rec = DeliveryRecord {
                    subscription: name.clone(),
                    webhook_id: delivery_id(dseq),
                    actor_type: t.key.ty().to_owned(),
                    actor_id: t.key.id().to_owned(),
                    event_seq: *seq,
                    kind: ev.kind.clone(),
                    payload,
                    created_at_ms: ev.at_ms,
                    attempts: 0,
                    next_attempt_ms: ev.at_ms,
                    last_error: None,
                    status: DeliveryStatus::Pending,
                };
                tables.write_delivery(dseq, Some(&rec))?;
                self.outbox_touched = true;
            }
        }
        Ok(())
    }

    fn enqueue(
        &mut self,
        tables: &mut Tables<'_>,
        num: u64,
        message: InboxRecord,
        ttl_ms: u64,
    ) -> Result<EnqueueOutcome, StorageError> {
        if let Some(key) = &message.idempotency_key {
            let existing = match tables.idempotency.get((num, key.as_str()))? {
                Some(v) => Some(decode::<IdemRecord>("idempotency", v.value())?),
                None => None,
            };
            if let Some(rec) = existing.filter(|r| r.expires_at_ms > message.enqueued_at_ms) {
                let message_id = match rec.outcome {
                    IdemOutcome::Queued { message_id }
                    | IdemOutcome::Done { message_id, .. }
                    | IdemOutcome::Failed { message_id, .. } => message_id,
                };
                return Ok(EnqueueOutcome::Duplicate { message_id });
            }
            let rec = IdemRecord {
                outcome: IdemOutcome::Queued {
                    message_id: message.message_id.clone(),
                },
                expires_at_ms: message.enqueued_at_ms + ttl_ms,
            };
            tables
                .idempotency
                .insert((num, key.as_str()), encode(&rec).as_slice())?;
            tables
                .idem_expiry
                .insert((rec.expires_at_ms, num, key.as_str()), ())?;
        }
        let seq = self.next_inbox_seq;
        self.next_inbox_seq += 1;
        tables
            .inbox
            .insert((num, seq), encode(&message).as_slice())?;
        Ok(EnqueueOutcome::Queued {
            message_id: message.message_id,
        })
    }
}

/// Every table, opened once per batch: opening a redb table per operation
/// costs a lookup and, on close, a root update.
struct Tables<'t> {
    types: redb::Table<'t, &'static str, &'static [u8]>,
    code: redb::Table<'t, (&'static str, u32), &'static [u8]>,
    actors: redb::Table<'t, (&'static str, &'static str), &'static [u8]>,
    actor_keys: redb::Table<'t, u64, (&'static str, &'static str)>,
    state: redb::Table<'t, (u64, &'static str), &'static [u8]>,
    events: redb::Table<'t, (u64, u64), &'static [u8]>,
    idempotency: redb::Table<'t, (u64, &'static str), &'static [u8]>,
    idem_expiry: redb::Table<'t, (u64, u64, &'static str), ()>,
    inbox: redb::Table<'t, (u64, u64), &'static [u8]>,
    alarms: redb::Table<'t, (u64, &'static str), &'static [u8]>,
    alarm_due: redb::Table<'t, (u64, u64, &'static str), ()>,
    inputs: redb::Table<'t, (u64, &'static str), &'static [u8]>,
    subscriptions: redb::Table<'t, &'static str, &'static [u8]>,
    outbox: redb::Table<'t, u64, &'static [u8]>,
    outbox_due: redb::Table<'t, (u64, u64), ()>,
}

impl<'t> Tables<'t> {
    fn open(txn: &'t WriteTransaction) -> Result<Self, StorageError> {
        Ok(Self {
            types: txn.open_table(TYPES)?,
            code: txn.open_table(CODE)?,
            actors: txn.open_table(ACTORS)?,
            actor_keys: txn.open_table(ACTOR_KEYS)?,
            state: txn.open_table(STATE)?,
            events: txn.open_table(EVENTS)?,
            idempotency: txn.open_table(IDEMPOTENCY)?,
            idem_expiry: txn.open_table(IDEM_EXPIRY)?,
            inbox: txn.open_table(INBOX)?,
            alarms: txn.open_table(ALARMS)?,
            alarm_due: txn.open_table(ALARM_DUE)?,
            inputs: txn.open_table(INPUTS)?,
            subscriptions: txn.open_table(SUBSCRIPTIONS)?,
            outbox: txn.open_table(OUTBOX)?,
            outbox_due: txn.open_table(OUTBOX_DUE)?,
        })
    }

    /// Write everything a turn produced.
    fn write_turn(&mut self, t: &TurnCommit, created: &mut i64) -> Result<(), StorageError> {
        let num = t.num;
        if let Some(record) = &t.record {
            let was = self
                .actors
                .insert((t.key.ty(), t.key.id()), encode(record).as_slice())?;
            if was.is_none() {
                drop(was);
                *created += 1;
                self.actor_keys.insert(num, (t.key.ty(), t.key.id()))?;
            }
        }
        for (k, v) in &t.state {
            match v {
                Some(v) => {
                    self.state.insert((num, k.as_str()), v.as_ref())?;
                }
                None => {
                    self.state.remove((num, k.as_str()))?;
                }
            }
        }
        for (seq, ev) in &t.events {
            self.events.insert((num, *seq), encode(ev).as_slice())?;
        }
        if let Some(below) = t.trim_events_below {
            let old = seqs(&self.events, num, below)?;
            for seq in old {
                self.events.remove((num, seq))?;
            }
        }
        if let Some((key, rec)) = &t.idempotency {
            self.idempotency
                .insert((num, key.as_str()), encode(rec).as_slice())?;
            self.idem_expiry
                .insert((rec.expires_at_ms, num, key.as_str()), ())?;
        }
        if let Some(seq) = t.inbox_done {
            self.inbox.remove((num, seq))?;
        }
        if let Some((seq, rec)) = &t.inbox_update {
            self.inbox.insert((num, *seq), encode(rec).as_slice())?;
        }
        for (name, rec) in &t.alarms {
            self.write_alarm(num, name, rec.as_ref())?;
        }
        for (id, rec) in &t.inputs {
            match rec {
                Some(r) => {
                    self.inputs
                        .insert((num, id.as_str()), encode(r).as_slice())?;
                }
                None => {
                    self.inputs.remove((num, id.as_str()))?;
                }
            }
        }
        Ok(())
    }

    /// Write or remove one outbox row, keeping the due index in step.
    fn write_delivery(
        &mut self,
        seq: u64,
        rec: Option<&DeliveryRecord>,
    ) -> Result<(), StorageError> {
        let old = self
            .outbox
            .get(seq)?
            .map(|v| decode::<DeliveryRecord>("delivery", v.value()))
            .transpose()?;
        if let Some(old) = old
            && old.status == DeliveryStatus::Pending
        {
            self.outbox_due.remove((old.next_attempt_ms, seq))?;
        }
        match rec {
            Some(r) => {
                self.outbox.insert(seq, encode(r).as_slice())?;
                if r.status == DeliveryStatus::Pending {
                    self.outbox_due.insert((r.next_attempt_ms, seq), ())?;
                }
            }
            None => {
                self.outbox.remove(seq)?;
            }
        }
        Ok(())
    }

    /// Make row `seq` (whose public id is `id`) due now with a fresh
    /// schedule.
    fn retry_delivery(
        &mut self,
        seq: u64,
        id: &str,
    ) -> Result<Option<DeliveryRecord>, StorageError> {
        let Some(mut rec) = self
            .outbox
            .get(seq)?
            .map(|v| decode::<DeliveryRecord>("delivery", v.value()))
            .transpose()?
            .filter(|r| r.webhook_id == id)
        else {
            return Ok(None);
        };
        rec.status = DeliveryStatus::Pending;
        rec.attempts = 0;
        rec.next_attempt_ms = now_ms();
        self.write_delivery(seq, Some(&rec))?;
        Ok(Some(rec))
    }

    /// Set, move or remove one alarm, keeping the due index in step.
    fn write_alarm(
        &mut self,
        num: u64,
        name: &str,
        rec: Option<&AlarmRecord>,
    ) -> Result<(), StorageError> {
        let old = self
            .alarms
            .get((num, name))?
            .map(|v| decode::<AlarmRecord>("alarm", v.value()))
            .transpose()?;
        if let Some(old) = old {
            self.alarm_due.remove((old.next_due_ms, num, name))?;
        }
        match rec {
            Some(r) => {
                self.alarms.insert((num, name), encode(r).as_slice())?;
                self.alarm_due.insert((r.next_due_ms, num, name), ())?;
            }
            None => {
                self.alarms.remove((num, name))?;
            }
        }
        Ok(())
    }

    fn put_type(
        &mut self,
        record: &TypeRecord,
        code: Option<(u32, Vec<u8>)>,
    ) -> Result<(), StorageError> {
        self.types
            .insert(record.name.as_str(), encode_type(record).as_slice())?;
        if let Some((version, bytes)) = code {
            self.code
                .insert((record.name.as_str(), version), bytes.as_slice())?;
        }
        Ok(())
    }

    fn delete_type(&mut self, name: &str, with_actors: bool) -> Result<u64, StorageError> {
        let mut deleted = 0;
        if with_actors {
            let mut ids = Vec::new();
            for row in self.actors.range((name, "")..)? {
                let (k, _) = row?;
                let (ty, id) = k.value();
                if ty != name {
                    break;
                }
                ids.push(id.to_owned());
            }
            for id in ids {
                if self.delete_actor(&ActorKey::new_unchecked(name, &id))? {
                    deleted += 1;
                }
            }
        }
        let mut versions = Vec::new();
        for row in self.code.range((name, 0)..=(name, u32::MAX))? {
            versions.push(row?.0.value().1);
        }
        for v in versions {
            self.code.remove((name, v))?;
        }
        self.types.remove(name)?;
        Ok(deleted)
    }

    fn sweep_idempotency(&mut self, now_ms: u64) -> Result<u64, StorageError> {
        let mut expired: Vec<(u64, u64, String)> = Vec::new();
        for row in self.idem_expiry.range((0, 0, "")..(now_ms, 0, ""))? {
            let (k, _) = row?;
            let (at, num, key) = k.value();
            expired.push((at, num, key.to_owned()));
            if expired.len() >= 10_000 {
                break;
            }
        }
        let mut removed = 0;
        for (at, num, key) in &expired {
            self.idem_expiry.remove((*at, *num, key.as_str()))?;
            // Only remove the record if it still carries this expiry (a
            // newer record for the same key has a later one).
            let current = self
                .idempotency
                .get((*num, key.as_str()))?
                .map(|v| decode::<IdemRecord>("idempotency", v.value()))
                .transpose()?;
            if current.is_some_and(|r| r.expires_at_ms == *at) {
                self.idempotency.remove((*num, key.as_str()))?;
                removed += 1;
            }
        }
        Ok(removed)
    }

    /// Remove an actor and every row it owns. Returns whether it existed.
    fn delete_actor(&mut self, key: &ActorKey) -> Result<bool, StorageError> {
        let rec: ActorRecord = {
            let Some(v) = self.actors.remove((key.ty(), key.id()))? else {
                return Ok(false);
            };
            decode("actor", v.value())?
        };
        let num = rec.num;
        self.actor_keys.remove(num)?;
        for k in string_keys(&self.state, num)? {
            self.state.remove((num, k.as_str()))?;
        }
        for k in string_keys(&self.idempotency, num)? {
            self.idempotency.remove((num, k.as_str()))?;
        }
        for name in string_keys(&self.alarms, num)? {
            self.write_alarm(num, &name, None)?;
        }
        for id in string_keys(&self.inputs, num)? {
            self.inputs.remove((num, id.as_str()))?;
        }
        for s in seqs(&self.events, num, u64::MAX)? {
            self.events.remove((num, s))?;
        }
        for s in seqs(&self.inbox, num, u64::MAX)? {
            self.inbox.remove((num, s))?;
        }
        Ok(true)
    }
}

/// Seqs of actor `num` below `below` in an `(actor, seq)` table.
fn seqs(
    t: &redb::Table<'_, (u64, u64), &'static [u8]>,
    num: u64,
    below: u64,
) -> Result<Vec<u64>, StorageError> {
    let mut v = Vec::new();
    for row in t.range((num, 0)..(num, below))? {
        v.push(row?.0.value().1);
    }
    if below == u64::MAX && t.get((num, u64::MAX))?.is_some() {
        v.push(u64::MAX);
    }
    Ok(v)
}

/// Keys of actor `num` in an `(actor, key)` table.
fn string_keys(
    t: &redb::Table<'_, (u64, &'static str), &'static [u8]>,
    num: u64,
) -> Result<Vec<String>, StorageError> {
    let mut v = Vec::new();
    for row in t.range((num, "")..)? {
        let (k, _) = row?;
        let (n, key) = k.value();
        if n != num {
            break;
        }
        v.push(key.to_owned());
    }
    Ok(v)
}

/// The body of a delivery: Standard Webhooks' `{type, timestamp, data}`,
/// built once at commit so every attempt sends the same bytes.
fn event_payload(key: &ActorKey, seq: u64, ev: &EventRecord) -> Vec<u8> {
    let data: serde_json::Value =
        serde_json::from_slice(&ev.data).unwrap_or(serde_json::Value::Null);
    let timestamp = chrono::DateTime::from_timestamp_millis(ev.at_ms as i64)
        .map(|t| t.to_rfc3339_opts(chrono::SecondsFormat::Millis, true))
        .unwrap_or_default();
    let body = serde_json::json!({
        "type": ev.kind,
        "timestamp": timestamp,
        "data": {
            "actor_type": key.ty(),
            "actor_id": key.id(),
            "seq": seq,
            "kind": ev.kind,
            "data": data,
            "at_ms": ev.at_ms,
        },
    });
    serde_json::to_vec(&body).expect("JSON values serialize")
}
