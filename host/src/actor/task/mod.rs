//! The task that owns one active actor.
//!
//! Turns are pipelined: after a successful turn the task hands its writes
//! to the storage writer together with the reply, and goes straight on to
//! the next envelope. The reply is released by the writer once the commit is
//! durable (the output gate), so the actor never waits for an fsync but no
//! caller ever sees an effect that could still be lost. If a commit fails,
//! the writer raises the actor's minimum generation; the task notices before
//! its next turn and reloads everything from disk.
//!
//! This file has the task's life: the mailbox loop, hibernation and
//! loading. Each child file adds one `impl ActorTask` block for one
//! concern:
//!
//! | file | concern |
//! |---|---|
//! | `turn.rs` | running a handler: the instance, upgrades, the sandbox call |
//! | `commit.rs` | turning a finished turn into one commit; the output gate |
//! | `messages.rs` | messages, idempotency keys, evals, deletion |
//! | `inbox.rs` | durable messages and webhooks, crash recovery |
//! | `alarms.rs` | due alarms, retries, giving up |
//! | `inputs.rs` | answers to input requests, expiry |
//! | `trim.rs` | when the idle JavaScript sandbox gives back unchanged pages |

mod alarms;
mod commit;
mod inbox;
mod inputs;
mod messages;
mod trim;
mod turn;
mod webhooks;

use std::collections::HashMap;
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

use tokio::sync::mpsc;

use super::caches::CacheShare;
use super::env::ActorEnv;
use super::registry::Shared;
use super::{Envelope, TurnError};
use crate::clock::now_ms;
use crate::ids::ActorKey;
use crate::sandbox::{ActorCounts, Carry, FinishedTurn};
use crate::storage::schema::{ActorRecord, CodeKind, IdemRecord};
use crate::storage::{Fence, StorageError, WriteOp};
use commit::CommitExtras;
use trim::TrimClock;
use turn::Live;
pub(crate) use turn::instantiate_with_room;

/// Cap on the state cache of one actor before committed entries are
/// dropped (0 while all actors' caches hold more than the node's budget:
/// `actor/caches.rs`).
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
/// How soon a recovered turn that must run alone (see
/// [`ActorTask::alone`]) looks again for its turn.
const SUSPECT_WAIT_MS: u64 = 100;

/// One line per 5 s, saying how many it held back, for each failure every
/// actor meets at once when storage fails: with the disk full, 30 actors
/// with alarms wrote 40-90 of these a second (a re-probe).
mod throttled {
    use std::time::Duration;

    use crate::throttle::LogThrottle;

    const EVERY: Duration = Duration::from_secs(5);
    pub(super) static RELOAD: LogThrottle = LogThrottle::new(EVERY);
    pub(super) static ALARM_NOT_NOW: LogThrottle = LogThrottle::new(EVERY);
    pub(super) static ALARM_UNREADABLE: LogThrottle = LogThrottle::new(EVERY);
    pub(super) static INBOX_NOT_NOW: LogThrottle = LogThrottle::new(EVERY);
    pub(super) static INBOX_UNREADABLE: LogThrottle = LogThrottle::new(EVERY);
}

pub(crate) struct ActorTask {
    env: Arc<ActorEnv>,
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
    /// This actor's part of what all actors' state caches hold.
    cache_share: CacheShare,
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
    /// The inbox row last started by this activation: started again (its
    /// commit failed), its guest is told an earlier start was cut off.
    inbox_started: Option<u64>,
    /// Idempotency records written by commits that may not be durable yet.
    idem_pending: HashMap<String, (u64, IdemRecord)>,
    woke_at: Instant,
    wake_recorded: bool,
    /// Current back-off for retrying the inbox.
    inbox_retry_ms: u64,
    /// Why inbox rows wait for a retry (`Shared::inbox_deferred`), when
    /// a message arriving now would meet it too: it is refused with it
    /// rather than run before them.
    inbox_held: Option<TurnError>,
    /// A look at the deferred inbox is scheduled.
    inbox_retry_pending: Arc<std::sync::atomic::AtomicBool>,
    last_activity: Instant,
    /// When the idle JavaScript sandbox is next trimmed.
    trim_clock: TrimClock,
    /// Earlier starts of the delivery the next turn runs (an inbox row's
    /// counted recovery attempts); taken by that turn.
    next_attempt: u32,
    /// Set once a failed commit showed the actor's slot went to another
    /// node: why every later turn here is refused.
    lost: Option<String>,
    /// The next turn is a client's (or another actor's) direct message,
    /// which never runs again under the same turn id, but may under the
    /// same idempotency key: `Some(what names it then)`, or `Some(None)`
    /// with none; taken by that turn.
    next_direct: Option<Option<String>>,
    /// Where the next turn's span hangs, and since when its delivery
    /// waits; taken by that turn.
    next_trace: TurnTrace,
    /// What the last turn, an eval that hit a limit, logged first; taken
    /// by its reply.
    failed_eval_logs: Vec<String>,
}

/// The trace context of a turn's delivery.
#[derive(Default)]
pub(super) struct TurnTrace {
    /// The span the turn's span is a child of.
    pub(super) parent: Option<crate::telemetry::Parent>,
    /// When the delivery reached the actor (the turn's wait starts).
    pub(super) since: Option<Instant>,
    /// The client request that sent the message, if one did.
    pub(super) request_id: Option<Arc<str>>,
}

impl ActorTask {
    pub(crate) fn new(env: Arc<ActorEnv>, key: ActorKey, shared: Arc<Shared>) -> Self {
        let now = Instant::now();
        let cache_share = CacheShare::new(&env.state_caches);
        Self {
            env,
            key,
            shared,
            next_attempt: 0,
            lost: None,
            next_direct: None,
            next_trace: TurnTrace::default(),
            failed_eval_logs: Vec::new(),
            record: None,
            persisted: None,
            live: None,
            carry: Carry::default(),
            cache_share,
            oldest_event_at_ms: None,
            generation: 0,
            seq: 0,
            submitted_seq: 0,
            inbox_cursor: 0,
            inbox_started: None,
            idem_pending: HashMap::new(),
            woke_at: now,
            wake_recorded: false,
            inbox_retry_ms: INBOX_RETRY_MS,
            inbox_held: None,
            inbox_retry_pending: Default::default(),
            last_activity: now,
            trim_clock: TrimClock::new(),
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
        let defaults = &self.env.config.defaults;
        ty.version(ty.latest_version())
            .map(|v| {
                v.config
                    .resolve(defaults, v.kind == CodeKind::Js)
                    .idle_timeout
            })
            .unwrap_or(Duration::from_millis(defaults.idle_timeout_ms))
    }

    pub(crate) async fn run(mut self, mut rx: mpsc::Receiver<Envelope>) {
        // The idle timeout of the type's latest version, looked up again
        // when a deploy brings a new one: an actor awake through a deploy
        // that shortened it kept the old one (up to 7 days) for as long as
        // it stayed awake (found by a probe).
        let mut idle_of = (self.shared.ty.latest_version(), self.idle_timeout());
        let sleep = tokio::time::sleep(idle_of.1);
        tokio::pin!(sleep);
        // The actor was deleted and nothing has happened since: the
        // activation leaves as soon as it is idle, rather than sit out the
        // idle timeout as an empty actor (counted active for 30 s, then as
        // a hibernation, after a delete woke it only to delete it).
        let mut emptied = false;
        loop {
            let latest = self.shared.ty.latest_version();
            if latest != idle_of.0 {
                idle_of = (latest, self.idle_timeout());
            }
            let idle = idle_of.1;
            if self.shared.delete_asked() {
                self.set_busy(true);
                Box::pin(self.run_deletes()).await;
                self.set_busy(false);
                self.last_activity = Instant::now();
                emptied = true;
            }
            if self.shared.inbox_dirty.swap(false, Ordering::AcqRel) {
                self.set_busy(true);
                Box::pin(self.drain_inbox()).await;
                self.set_busy(false);
                self.last_activity = Instant::now();
            }
            if emptied && self.live.is_none() && Box::pin(self.try_hibernate(&mut rx, false)).await
            {
                return;
            }
            let wake = self.next_wake(idle);
            if wake < sleep.deadline().into_std() {
                sleep.as_mut().reset(wake.into());
            }
            tokio::select! {
                biased;
                () = self.shared.urgent.notified() => {}
                env = rx.recv() => {
                    let Some(env) = env else { break };
                    let housekeeping = matches!(env, Envelope::TrimEvents);
                    emptied = match env {
                        Envelope::Delete(_) => true,
                        Envelope::InboxPoke | Envelope::TrimEvents => emptied,
                        _ => false,
                    };
                    // Boxed so the task's resting size stays small: an idle
                    // actor is a few hundred bytes here, not the 4 KB of a
                    // turn in progress (10,000 actors: 35 MB).
                    self.set_busy(true);
                    Box::pin(self.handle(env)).await;
                    self.set_busy(false);
                    self.last_activity = Instant::now();
                    // A deleted type's actors leave as soon as they are idle,
                    // and so does an actor woken only for housekeeping, or
                    // only to be deleted.
                    if (self.shared.ty.is_deleted()
                        || ((housekeeping || emptied) && self.live.is_none()))
                        && Box::pin(self.try_hibernate(&mut rx, !emptied)).await
                    {
                        return;
                    }
                }
                () = self.shared.hibernate.notified() => {
                    if Box::pin(self.try_hibernate(&mut rx, true)).await {
                        return;
                    }
                }
                () = &mut sleep => {
                    let now = Instant::now();
                    // An inbox waiting for a retry keeps its actor awake,
                    // and so its back-off: woken again by the retry, a new
                    // activation started over at 200 ms, and a broken
                    // upgrade ran every 1.4 s for good (a re-probe).
                    let waiting = self.shared.inbox_deferred.load(Ordering::Acquire);
                    if now >= self.last_activity + idle && !waiting {
                        if Box::pin(self.try_hibernate(&mut rx, true)).await {
                            return;
                        }
                        sleep.as_mut().reset((Instant::now() + idle).into());
                    } else {
                        Box::pin(self.trim_if_due(now)).await;
                        sleep.as_mut().reset(self.next_wake(idle).into());
                    }
                }
            }
        }
    }

    /// When the loop must next look at the clock: to hibernate, or to
    /// trim a sandbox a turn ran in.
    fn next_wake(&self, idle: Duration) -> Instant {
        let mut hibernate = self.last_activity + idle;
        if self.shared.inbox_deferred.load(Ordering::Acquire) {
            // Awake while its inbox waits for a retry: it looks again an
            // idle period on (its deadline, long past, woke the loop at
            // once, for ever: a core per such actor, found by a re-probe).
            hibernate = hibernate.max(Instant::now() + idle);
        }
        match self.trim_clock.due(self.last_activity) {
            Some(trim) => hibernate.min(trim),
            None => hibernate,
        }
    }

    /// Leave memory if nothing is queued; `hibernation`: count it as one
    /// (not when a deleted actor's empty activation leaves).
    async fn try_hibernate(
        &mut self,
        rx: &mut mpsc::Receiver<Envelope>,
        hibernation: bool,
    ) -> bool {
        // Activity statistics are written lazily; bring them to disk now.
        if let (Some(r), Some(p)) = (&self.record, &self.persisted)
            && r != p
            && self.shared.tracker.min_generation() <= self.generation
        {
            self.submit(
                FinishedTurn::unchanged(counts(r)),
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
        if !self.env.registry.try_leave(&self.key, &self.shared, rx) {
            return false;
        }
        self.env.metrics.actors_active.dec();
        if hibernation {
            self.env.metrics.hibernations.inc();
            tracing::debug!(actor = %self.key, "hibernated");
        }
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
            Envelope::Webhook(d) => self.on_webhook(*d).await,
            Envelope::TrimEvents => {
                if self.ready(false).await.is_ok() && self.record().first_event_seq > 0 {
                    // `submit` applies retention to every commit.
                    self.submit(
                        self.unchanged(),
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
                // "Recovered" (and the node ready) means durable: a client
                // reading right after readiness sees what recovery did.
                self.shared
                    .tracker
                    .wait_committed(self.submitted_seq, self.generation)
                    .await;
                drop(permit);
            }
        }
    }

    /// Checks before any turn: the type still exists, no commit failed
    /// underneath us, and the actor's record is loaded (created if asked).
    async fn ready(&mut self, create: bool) -> Result<(), TurnError> {
        self.ready_inner(create, false).await
    }

    /// [`ready`](Self::ready) with creation, for a turn on the actor's live
    /// instance: a brand-new actor's instance is made while the writer
    /// creates its record (see [`create`](Self::create)).
    async fn ready_for_turn(&mut self) -> Result<(), TurnError> {
        self.ready_inner(true, true).await
    }

    async fn ready_inner(&mut self, create: bool, instantiate: bool) -> Result<(), TurnError> {
        if self.shared.ty.is_deleted() {
            return Err(TurnError::UnknownType(self.key.ty().to_owned()));
        }
        let min = self.shared.tracker.min_generation();
        if min > self.generation {
            if let Some(held_back) = throttled::RELOAD.admit() {
                tracing::warn!(actor = %self.key, held_back, "a commit failed; reloading the actor from disk");
            }
            self.generation = min;
            // Every commit of the old generation has either landed or will
            // be refused, so what is committed now is final: nothing older
            // is left to wait for.
            self.submitted_seq = self.shared.tracker.committed_seq();
            self.seq = self.seq.max(self.submitted_seq);
            self.reset();
            // Landed on this disk is not yet released: commits after the
            // failed one may still be on their way to the backup. Whatever
            // the reloaded actor reads and answers with (its state, an
            // idempotency key's stored reply) must be released first.
            self.env.storage.writer().barrier().await;
            self.owned_after_failure().await;
        }
        if let Some(why) = &self.lost {
            // Back here for good (a handoff back): it runs again.
            let here = self.env.cluster.as_ref().is_some_and(|(c, _)| {
                !handing_over(c, &self.key)
                    && matches!(c.route(&self.key), crate::cluster::Route::Local { .. })
            });
            if !here {
                return Err(TurnError::Moved(why.clone()));
            }
            self.lost = None;
        }
        if self.record.is_none() {
            if self.shared.after_crash.swap(false, Ordering::AcqRel) {
                // The previous activation died (a host bug); its last
                // commits may still be queued. Read only what they left.
                self.env.storage.writer().barrier().await;
            }
            let on_disk = self.env.storage.reader()?.actor(&self.key)?;
            self.record = match on_disk {
                Some(r) => Some(r),
                None if create => {
                    self.record = Some(self.create(instantiate).await?);
                    return Ok(());
                }
                None => return Err(TurnError::NotFound),
            };
            self.persisted = self.record.clone();
        }
        Ok(())
    }

    /// After a failed commit, in a cluster: whether this node still owns
    /// the actor, asked of etcd (the view may be stale: a node back from a
    /// pause learns it lost its slots from the refused commit first). One
    /// that does not runs nothing more: a paused owner back after the
    /// failover ran the turn it was cut in four more times from its own
    /// disk, each time calling the agent's tool again (found by a probe).
    async fn owned_after_failure(&mut self) {
        let Some((cluster, _)) = &self.env.cluster else {
            return;
        };
        // The view first; etcd only when it still says this node, and at
        // most once a second for the node (a full disk fails every commit
        // of every actor).
        if matches!(
            cluster.route(&self.key),
            crate::cluster::Route::Local { .. }
        ) && self.env.may_refresh_slots()
            && let Err(e) = cluster.refresh().await
        {
            tracing::warn!(actor = %self.key, error = %e, "cannot re-read the slot table after a failed commit");
        }
        // Another owner, read from etcd just now (not this node's own lease
        // unconfirmed for a moment: that is a wait, not a loss), or the
        // slot being handed over (a graceful stop fences it: run again
        // here, the cut turn sent its tool call a second time, unasked:
        // found by a re-probe).
        if handing_over(cluster, &self.key)
            || matches!(
                cluster.route(&self.key),
                crate::cluster::Route::Remote { .. }
            )
        {
            tracing::warn!(actor = %self.key, "a commit failed and the actor's slot is another node's now; it runs nothing more here");
            self.lost = Some(format!(
                "actor {} is no longer served by this node (its slot failed over); retry",
                self.key
            ));
        }
    }

    /// Create this actor's record. It is answered before the creation
    /// commits, so that the first turn's commit shares its fsync; the
    /// creation counts as one of this activation's commits: replies wait
    /// for it like for any earlier commit, and if it fails this generation
    /// is fenced and reloads. The record is not known durable: the first
    /// turn writes it (even a read-only one commits, joining the creation).
    ///
    /// With `instantiate`, the actor's instance is made while the writer
    /// thread creates the record, instead of after its answer: the first
    /// message to a new actor then waits for the longer of the two, not
    /// for both. An instance that cannot be made at once is left to the
    /// turn, which waits for room or reports why.
    async fn create(&mut self, instantiate: bool) -> Result<ActorRecord, TurnError> {
        let version = self.shared.ty.latest_version();
        self.seq += 1;
        self.submitted_seq = self.seq;
        let early = Some(Fence {
            tracker: self.shared.tracker.clone(),
            generation: self.generation,
            seq: self.seq,
        });
        let (done, answer) = tokio::sync::oneshot::channel();
        self.env.storage.writer().submit(WriteOp::GetOrCreate {
            key: self.key.clone(),
            version,
            early,
            done,
        });
        if instantiate {
            self.try_instance(version).await;
        }
        match answer.await.unwrap_or(Err(StorageError::WriterGone)) {
            Ok(record) => Ok(record),
            Err(e) => {
                // No actor, so no instance either: give its slot back.
                self.live = None;
                Err(e.into())
            }
        }
    }

    /// Forget the in-memory view; the next turn reloads from disk.
    fn reset(&mut self) {
        self.record = None;
        self.persisted = None;
        self.live = None;
        self.carry = Carry::default();
        self.cache_share.set(0);
        self.oldest_event_at_ms = None;
        self.idem_pending.clear();
        self.inbox_cursor = 0;
        self.shared.inbox_dirty.store(true, Ordering::Release);
    }

    fn record(&self) -> &ActorRecord {
        self.record.as_ref().expect("record loaded by ready()")
    }

    /// A commit that changes nothing of the actor's own (bookkeeping).
    fn unchanged(&self) -> FinishedTurn {
        FinishedTurn::unchanged(counts(self.record()))
    }
}

/// Where a turn of the actor whose record is `r` starts from.
fn counts(r: &ActorRecord) -> ActorCounts {
    ActorCounts {
        state_bytes: r.state_bytes,
        state_keys: r.state_keys,
        last_event_seq: r.last_event_seq,
    }
}

impl ActorTask {
    /// Leave to run a turn found at boot that an earlier boot had started
    /// too (`attempts` > 0): it was running when the node went down, so it
    /// or a turn beside it crashed the node. Such suspects run one at a
    /// time across the node, so that a crash counts against the one turn
    /// that ran. Counted together, every message that was merely running
    /// beside a poison one — a slow turn, a model call — was given up with
    /// it after three crashes (found by a probe). `Ok(None)`: not a
    /// `suspect`, it runs as any turn; `Err(())`: another suspect runs, try
    /// again in [`SUSPECT_WAIT_MS`].
    fn alone(&self, suspect: bool) -> Result<Option<tokio::sync::OwnedSemaphorePermit>, ()> {
        if !suspect {
            return Ok(None);
        }
        self.env
            .suspects
            .clone()
            .try_acquire_owned()
            .map(Some)
            .map_err(drop)
    }
}

/// Errors that mean no handler ran, or one ran and was stopped for want of
/// the node's memory, or the actor left the node (not the message's fault,
/// and nothing of it committed), so a durable message must stay queued
/// rather than be settled as failed.
/// Whether this node is handing `key`'s slot to another (a graceful stop,
/// a rebalance): a turn cut by the handover's fence must not run again
/// here.
fn handing_over(cluster: &crate::cluster::Cluster, key: &ActorKey) -> bool {
    cluster.is_leaving() || cluster.draining(cluster.slot_of(key))
}

fn not_started(e: &TurnError) -> bool {
    matches!(
        e,
        TurnError::Overloaded(_)
            | TurnError::NoGuestMemory(_)
            | TurnError::Code(_)
            | TurnError::Storage(_)
            | TurnError::Moved(_)
    )
}
