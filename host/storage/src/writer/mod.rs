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

mod apply;
#[cfg(test)]
mod disk_tests;
#[cfg(test)]
mod input_tests;
#[cfg(test)]
mod move_tests;
mod moves;
mod ops;
mod outgoing;
#[cfg(test)]
mod relay_tests;
#[cfg(test)]
mod release_tests;
mod replica;
#[cfg(test)]
mod replica_tests;
mod tables;
#[cfg(test)]
mod tests;
mod tracker;

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, OnceLock, mpsc};
use std::time::{Duration, Instant};

use marmot_core::config::StorageConfig;
use marmot_core::ids::ActorKey;
use marmot_core::throttle::LogThrottle;
use tokio::sync::{Notify, oneshot};

pub use ops::{EnqueueOutcome, Fence, TurnCommit, WriteOp};
pub use replica::{Placement, Release, ReplicaApplied, Replication};
pub use tracker::{CommitFailed, CommitTracker};

use ops::{Applied, Reply, fail_op};
use tables::Tables;

use super::blobs::Unreferenced;
use super::db::{DbCell, is_io_failure};
use super::schema::*;
use super::{StorageError, Subscriptions};
use crate::{LOG_TARGET, WriterMetrics};

/// How far committed rows that leave the node by themselves (outbound
/// webhooks, relayed sends) are released: rows up to these seqs may go.
/// Without replication a row is released by its commit; with it, once the
/// backups of its batch acknowledged.
#[derive(Debug, Default)]
pub struct Released {
    /// Outbox rows up to this seq.
    pub deliveries: AtomicU64,
    /// Relay rows up to this seq.
    pub relays: AtomicU64,
}

/// Handle to the writer thread.
pub struct Writer {
    tx: mpsc::Sender<WriteOp>,
    /// Where committed writes go besides this disk (a cluster).
    replication: Arc<OnceLock<Arc<dyn Replication>>>,
    released: Arc<Released>,
    /// Actors on disk, kept current by the writer.
    actor_count: Arc<AtomicU64>,
    /// Fault injection for tests: fail this many upcoming commits.
    fail_commits: Arc<AtomicU64>,
}

impl Writer {
    pub(super) fn start(
        db: Arc<DbCell>,
        config: &StorageConfig,
        metrics: WriterMetrics,
        subscriptions: Arc<Subscriptions>,
        outbox_ready: Arc<Notify>,
        relay_ready: Arc<Notify>,
        unreferenced: Arc<Unreferenced>,
    ) -> Result<Self, StorageError> {
        let (tx, rx) = mpsc::channel();
        let (next_num, actor_count, next_inbox_seq, next_delivery_seq, next_relay_seq) = {
            use redb::{ReadableDatabase, ReadableTable, ReadableTableMetadata};
            let r = db.get()?.begin_read()?;
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
            let relay = r.open_table(RELAY)?;
            let next_relay = relay.last()?.map(|(k, _)| k.value() + 1).unwrap_or(1);
            (next_num, count, max_seq + 1, next_delivery, next_relay)
        };
        let actor_count = Arc::new(AtomicU64::new(actor_count));
        let fail_commits = Arc::new(AtomicU64::new(0));
        let replication = Arc::new(OnceLock::new());
        // What is on disk at start was committed: released.
        let released = Arc::new(Released {
            deliveries: AtomicU64::new(next_delivery_seq - 1),
            relays: AtomicU64::new(next_relay_seq - 1),
        });
        let mut state = WriterState {
            db,
            rx,
            max_batch: config.max_batch.max(1),
            quick_repair: config.quick_repair,
            next_num,
            next_inbox_seq,
            next_delivery_seq,
            next_relay_seq,
            actor_count: actor_count.clone(),
            fail_commits: fail_commits.clone(),
            metrics,
            subscriptions,
            outbox_ready,
            outbox_touched: false,
            relay_ready,
            relay_touched: false,
            unreferenced,
            subscriptions_touched: false,
            replication: replication.clone(),
            drafts: Default::default(),
            joined: Default::default(),
            joined_in_batch: Vec::new(),
            batch_placements: Default::default(),
            copy_of: Default::default(),
            released: released.clone(),
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
            replication,
            released,
            actor_count,
            fail_commits,
        })
    }

    /// Ship committed writes to the backups of their slots from now on.
    /// Installed once; returns false if one was installed before.
    pub fn replicate(&self, replication: Arc<dyn Replication>) -> bool {
        self.replication.set(replication).is_ok()
    }

    /// Whether this node sends what `key` committed (its outbound webhook
    /// deliveries, its relayed messages): always alone; in a cluster while
    /// it owns the actor's slot and may act on it (a backup keeps copies
    /// and sends nothing; nobody sends while the actor is being moved, nor
    /// from a node whose membership lease lapsed).
    pub fn sends_for(&self, key: &ActorKey) -> bool {
        self.replication.get().is_none_or(|r| r.sends_for(key))
    }

    /// How far rows that leave the node by themselves are released.
    pub fn released(&self) -> &Arc<Released> {
        &self.released
    }

    /// Make the next `n` commits fail as if the disk had failed (tests).
    #[doc(hidden)]
    pub fn inject_commit_failures(&self, n: u64) {
        self.fail_commits.store(n, Ordering::SeqCst);
    }

    /// Queue an operation. If the writer is gone the operation is dropped,
    /// which completes its reply channel with an error for the waiter.
    pub fn submit(&self, op: WriteOp) {
        if let Err(mpsc::SendError(op)) = self.tx.send(op) {
            fail_op(op, CommitFailed::ShuttingDown);
        }
    }

    /// Queue an operation and wait for its result.
    pub async fn call<T>(&self, make: impl FnOnce(Reply<T>) -> WriteOp) -> Result<T, StorageError> {
        let (done, rx) = oneshot::channel();
        self.submit(make(done));
        rx.await.map_err(|_| StorageError::WriterGone)?
    }

    /// Wait until everything submitted so far is durable and released
    /// (in a cluster: on the backups too, or failed).
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

/// How long a batch of early-answered creations waits for the first turns
/// of its new actors (which take tens to hundreds of microseconds) before
/// it commits alone.
#[cfg(not(test))]
const FIRST_TURN_WINDOW: Duration = Duration::from_millis(2);
/// Long in unit tests, so that a test's first turn always makes it.
#[cfg(test)]
const FIRST_TURN_WINDOW: Duration = Duration::from_secs(5);

/// How often a faulted writer with nothing to do tries a commit.
const PROBE_EVERY: Duration = Duration::from_secs(1);

/// The "storage commit failed" line's throttle.
static COMMIT_FAILED_LOG: LogThrottle = LogThrottle::new(Duration::from_secs(5));

/// What the writer loop does next. (The op moves straight into the batch;
/// boxing it would cost an allocation per op.)
#[allow(clippy::large_enum_variant)]
enum Next {
    Op(WriteOp),
    Probe,
    Closed,
}

struct WriterState {
    db: Arc<DbCell>,
    rx: mpsc::Receiver<WriteOp>,
    max_batch: usize,
    quick_repair: bool,
    next_num: u64,
    next_inbox_seq: u64,
    next_delivery_seq: u64,
    next_relay_seq: u64,
    actor_count: Arc<AtomicU64>,
    fail_commits: Arc<AtomicU64>,
    metrics: WriterMetrics,
    subscriptions: Arc<Subscriptions>,
    outbox_ready: Arc<Notify>,
    /// The batch being applied added or changed outbox rows.
    outbox_touched: bool,
    relay_ready: Arc<Notify>,
    /// The batch being applied added relay rows.
    relay_touched: bool,
    /// Where blobs left without a reference by a commit go, once it
    /// succeeded (see [`Unreferenced`]).
    unreferenced: Arc<Unreferenced>,
    /// The batch changed subscriptions.
    subscriptions_touched: bool,
    replication: Arc<OnceLock<Arc<dyn Replication>>>,
    /// The batch's writes to replicated slots.
    drafts: replica::Drafts,
    /// Slots whose snapshot went to a node catching up to become their
    /// backup: (slot, session).
    joined: std::collections::HashSet<(u32, i64)>,
    /// Those of the batch being applied (kept if it commits).
    joined_in_batch: Vec<(u32, i64)>,
    /// Where the batch's actors and slots are kept, asked once per batch.
    batch_placements: replica::BatchPlacements,
    released: Arc<Released>,
    /// The slot whose copy this node's rows of an actor are, where a move
    /// said so (installed by a move into it, or kept for it as the actor
    /// left another): a backup's late "moved out" for another slot leaves
    /// them alone (`replica.rs`, `ReplicaOp::Moved`).
    copy_of: std::collections::HashMap<ActorKey, u32>,
}

impl WriterState {
    fn run(&mut self) {
        let mut batch: Vec<WriteOp> = Vec::with_capacity(self.max_batch);
        loop {
            batch.clear();
            match self.next_op() {
                Next::Op(op) => batch.push(op),
                Next::Probe => {
                    self.probe();
                    continue;
                }
                Next::Closed => return,
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

    /// The next operation; while the disk is faulted, a probe of it after
    /// [`PROBE_EVERY`] without one, so that the node notices by itself that
    /// writes work again.
    fn next_op(&mut self) -> Next {
        if self.db.fault().is_none() {
            return self.rx.recv().map_or(Next::Closed, Next::Op);
        }
        match self.rx.recv_timeout(PROBE_EVERY) {
            Ok(op) => Next::Op(op),
            Err(mpsc::RecvTimeoutError::Disconnected) => Next::Closed,
            Err(mpsc::RecvTimeoutError::Timeout) => Next::Probe,
        }
    }

    /// Try a small real commit while the disk is faulted: reopening the
    /// database if it is closed, then writing [`DISK_PROBE_KEY`].
    fn probe(&mut self) {
        let result = self.open_db().and_then(|db| {
            let txn = db.begin_write()?;
            {
                let mut meta = txn.open_table(META)?;
                let now = marmot_core::clock::now_ms().to_le_bytes();
                meta.insert(DISK_PROBE_KEY, now.as_slice())?;
            }
            txn.commit()?;
            Ok(())
        });
        match result {
            Ok(()) => self.disk_recovered(),
            Err(e) => {
                tracing::debug!(target: LOG_TARGET, error = %e, "storage still failing");
                if is_io_failure(&e) {
                    self.reopen_db();
                }
            }
        }
    }

    /// The open database, reopened first if a disk failure closed it.
    fn open_db(&mut self) -> Result<Arc<redb::Database>, StorageError> {
        if let Ok(db) = self.db.get() {
            return Ok(db);
        }
        let db = self.db.reopen()?;
        self.metrics.reopens.inc();
        tracing::debug!(target: LOG_TARGET, "database reopened after a disk failure");
        Ok(db)
    }

    /// Close the database and open it again at once, so that reads go on
    /// between failing commits. If it cannot be opened yet (a reader still
    /// holds the old handle, or the file cannot be read), the next commit or
    /// probe tries again.
    fn reopen_db(&mut self) {
        self.db.close();
        if let Err(e) = self.open_db() {
            tracing::debug!(target: LOG_TARGET, error = %e, "cannot reopen the database yet");
        }
    }

    /// A commit failed because the disk did: refuse writes until a commit
    /// succeeds, and reopen the database (redb fails every transaction after
    /// an I/O error until it is reopened, which repairs it from its last
    /// durable commit).
    fn disk_failed(&mut self, e: &StorageError) {
        if self.db.fault().is_none() {
            tracing::error!(target: LOG_TARGET, error = %e, "the disk failed: refusing writes until a commit succeeds; reads continue");
        }
        self.db.set_fault(Some(e.to_string()));
        self.metrics.disk_faulted.set(1);
        self.reopen_db();
    }

    fn disk_recovered(&mut self) {
        if self.db.fault().is_some() {
            tracing::info!(target: LOG_TARGET, "storage recovered: commits succeed again");
            self.db.set_fault(None);
            self.metrics.disk_faulted.set(0);
        }
    }

    /// A batch of barriers alone writes nothing: no transaction (and no
    /// fsync, nor a commit that would tell a faulted disk it recovered),
    /// only their place in the release order, behind every earlier batch.
    fn pass_barriers(&mut self, batch: &mut Vec<WriteOp>) {
        let waiters: Vec<_> = batch
            .drain(..)
            .filter_map(|op| match op {
                WriteOp::Barrier { done } => Some(done),
                _ => None,
            })
            .collect();
        let release = move |_: Result<(), String>| {
            for done in waiters {
                let _ = done.send(());
            }
        };
        match self.replication.get() {
            Some(r) => r.ship(Vec::new(), Box::new(release)),
            None => release(Ok(())),
        }
    }

    /// The batch holds only early-answered creations: keep its transaction
    /// open a moment for the new actors' first turns, so that a creation
    /// and its first turn share one commit (and one fsync). Stops at the
    /// first op that is not an early creation (taking what else is queued
    /// then), at [`FIRST_TURN_WINDOW`], or when the batch is full. Returns
    /// the error of an op that failed to apply.
    fn await_first_turns(
        &mut self,
        tables: &mut Tables<'_>,
        applied: &mut Vec<Applied>,
        created: &mut i64,
    ) -> Option<StorageError> {
        let deadline = Instant::now() + FIRST_TURN_WINDOW;
        let mut other_seen = false;
        while applied.len() < self.max_batch {
            let op = match self.rx.try_recv() {
                Ok(op) => op,
                Err(mpsc::TryRecvError::Empty) if !other_seen => {
                    // Woken by the next op the moment it is sent.
                    let left = deadline.saturating_duration_since(Instant::now());
                    match self.rx.recv_timeout(left) {
                        Ok(op) => op,
                        // The window is over, or the channel closed.
                        Err(_) => break,
                    }
                }
                Err(_) => break,
            };
            let (a, r) = self.apply(tables, op, created);
            other_seen |= !matches!(a, Applied::Answered(_));
            applied.push(a);
            if let Err(e) = r {
                return Some(e);
            }
        }
        None
    }

    /// Apply every op in one transaction and commit it. If any op fails to
    /// apply, or the commit fails, the whole batch fails: a half-applied
    /// transaction is never committed.
    fn commit_batch(&mut self, batch: &mut Vec<WriteOp>) {
        if batch.iter().all(|op| matches!(op, WriteOp::Barrier { .. })) {
            self.pass_barriers(batch);
            return;
        }
        let started = Instant::now();
        let mut applied: Vec<Applied> = Vec::with_capacity(batch.len());
        // Actor numbers are not given back when a batch fails: an early
        // answer may have handed one out, and a number is never reused.
        let saved = (
            self.next_inbox_seq,
            self.next_delivery_seq,
            self.next_relay_seq,
        );
        self.outbox_touched = false;
        self.relay_touched = false;
        self.drafts.clear();
        self.joined_in_batch.clear();
        self.batch_placements.clear();
        let mut shipments = Vec::new();
        self.subscriptions_touched = false;
        let mut created: i64 = 0;
        let mut error: Option<StorageError> = None;
        let mut unreferenced = Vec::new();
        let db = match self.open_db() {
            Ok(db) => db,
            Err(e) => {
                let why = CommitFailed::Storage(e.to_string());
                for op in batch.drain(..) {
                    Applied::from_unapplied(op).complete(Some(&why));
                }
                self.metrics.commit_failures.inc();
                return;
            }
        };
        match db.begin_write() {
            Ok(mut txn) => {
                txn.set_quick_repair(self.quick_repair);
                {
                    let mut tables = Tables::of(&txn);
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
                    if error.is_none() && applied.iter().all(|a| matches!(a, Applied::Answered(_)))
                    {
                        error = self.await_first_turns(&mut tables, &mut applied, &mut created);
                    }
                    if error.is_none() && !self.drafts.is_empty() {
                        match self.seal_drafts(&mut tables) {
                            Ok(s) => shipments = s,
                            Err(e) => error = Some(e),
                        }
                    }
                    unreferenced = std::mem::take(&mut tables.unreferenced);
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
        drop(db);
        let n = applied.len();
        match error {
            None => {
                self.disk_recovered();
                self.joined.extend(self.joined_in_batch.drain(..));
                self.metrics.commits.inc();
                self.metrics.commit_batch_size.observe(n as f64);
                self.metrics
                    .commit_seconds
                    .observe(started.elapsed().as_secs_f64());
                if created != 0 {
                    let c = self.actor_count.load(Ordering::Relaxed) as i64 + created;
                    self.actor_count.store(c.max(0) as u64, Ordering::Relaxed);
                }
                if !unreferenced.is_empty() {
                    self.unreferenced.add(unreferenced);
                }
                // A backup's acknowledgements go at once; everything else
                // once the backups have it (if any): replies, streams,
                // alarms, and the rows that leave by themselves.
                let mut applied = applied;
                if applied.iter().any(|a| matches!(a, Applied::Durable(_))) {
                    let (durable, rest): (Vec<Applied>, Vec<Applied>) = applied
                        .into_iter()
                        .partition(|a| matches!(a, Applied::Durable(_)));
                    for a in durable {
                        a.complete(None);
                    }
                    applied = rest;
                }
                let released = self.released.clone();
                let (deliveries, relays) = (self.next_delivery_seq - 1, self.next_relay_seq - 1);
                let wake = [
                    self.outbox_touched.then(|| self.outbox_ready.clone()),
                    self.relay_touched.then(|| self.relay_ready.clone()),
                ];
                let release = move |r: Result<(), String>| {
                    if let Err(why) = r {
                        let why = CommitFailed::Storage(why);
                        for a in applied {
                            a.complete(Some(&why));
                        }
                        return;
                    }
                    released.deliveries.fetch_max(deliveries, Ordering::AcqRel);
                    released.relays.fetch_max(relays, Ordering::AcqRel);
                    for ready in wake.into_iter().flatten() {
                        ready.notify_one();
                    }
                    for a in applied {
                        a.complete(None);
                    }
                };
                match self.replication.get() {
                    Some(r) => r.ship(shipments, Box::new(release)),
                    None => release(Ok(())),
                }
            }
            Some(e) => {
                self.metrics.commit_failures.inc();
                // (Every batch fails while the disk is full: one line a
                // few seconds, saying how many it held back.)
                if let Some(held_back) = COMMIT_FAILED_LOG.admit() {
                    tracing::error!(target: LOG_TARGET, error = %e, ops = n, held_back, "storage commit failed; failing every operation in the batch");
                }
                (
                    self.next_inbox_seq,
                    self.next_delivery_seq,
                    self.next_relay_seq,
                ) = saved;
                if is_io_failure(&e) {
                    self.disk_failed(&e);
                }
                if self.subscriptions_touched {
                    // Subscription changes were applied in memory as they
                    // were written: go back to what is on disk.
                    match self.open_db().and_then(|db| Subscriptions::load(&db)) {
                        Ok(s) => self.subscriptions.replace(s.snapshot().as_ref().clone()),
                        Err(e) => {
                            tracing::error!(target: LOG_TARGET, error = %e, "cannot reload subscriptions")
                        }
                    }
                }
                let why = CommitFailed::Storage(e.to_string());
                for a in applied {
                    a.complete(Some(&why));
                }
            }
        }
    }
}
