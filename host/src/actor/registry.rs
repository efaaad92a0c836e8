//! Who is awake: the map from actor key to its running task.

use std::collections::HashMap;
use std::hash::BuildHasher;
use std::sync::atomic::{AtomicBool, AtomicU8, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};

use tokio::sync::{Notify, mpsc};

use super::env::ActorEnv;
use super::task::ActorTask;
use super::{Envelope, TurnError};
use crate::catalog::TypeEntry;
use crate::clock::now_ms;
use crate::ids::ActorKey;
use crate::storage::CommitTracker;

const SHARDS: usize = 64;

/// What an active actor shares with the rest of the node.
pub(crate) struct Shared {
    /// Commit bookkeeping with the writer.
    pub tracker: Arc<CommitTracker>,
    /// The actor's type.
    pub ty: Arc<TypeEntry>,
    /// Last time a message was delivered (for LRU eviction).
    pub last_used_ms: AtomicU64,
    /// Set when durable messages were added to the inbox.
    pub inbox_dirty: AtomicBool,
    /// Inbox rows wait for a retry (a version whose upgrade works, say):
    /// what arrives now must not run before them, and a deploy looks again
    /// at once.
    pub inbox_deferred: AtomicBool,
    /// Asks the task to hibernate as soon as it is idle.
    pub hibernate: Notify,
    /// The previous activation's task died without leaving cleanly.
    pub after_crash: AtomicBool,
    /// Which instance pool the actor holds a slot of now (`SLOT_*`).
    pub slot: AtomicU8,
    /// A turn (or other work) is in progress: asking it to hibernate would
    /// free nothing soon.
    pub busy: AtomicBool,
    /// Bytes its instance has grown its memory by, charged to the node's
    /// guest memory budget (as of its last turn).
    pub grown: AtomicU64,
    /// Activity statistics of this activation: (turns, last turn at ms),
    /// ahead of what is on disk until the next record write.
    stats: Mutex<(u64, u64)>,
    /// Deletes asked of this activation, run ahead of the mailbox and the
    /// inbox (a full mailbox, or a turn that keeps queueing messages for
    /// itself, must not keep an actor from being deleted).
    deletes: Mutex<Vec<DeleteReply>>,
    /// Wakes the task for [`deletes`](Self::deletes).
    pub urgent: Notify,
}

/// Where a delete's outcome goes: whether the actor existed.
pub(crate) type DeleteReply = tokio::sync::oneshot::Sender<Result<bool, TurnError>>;

/// Counts an activation as waiting for an instance slot while it lives.
pub(crate) struct WaitingForRoom(Arc<AtomicUsize>);

impl Drop for WaitingForRoom {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::Relaxed);
    }
}

/// [`Shared::slot`]: no instance.
pub(crate) const SLOT_NONE: u8 = 0;
/// [`Shared::slot`]: an instance of a Rust (component) actor.
pub(crate) const SLOT_WASM: u8 = 1;
/// [`Shared::slot`]: a JavaScript sandbox.
pub(crate) const SLOT_JS: u8 = 2;

/// What a waking actor is short of.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Room {
    /// A slot of the instance pool: any idle actor holding an instance may
    /// make way.
    Instance = 0,
    /// A JavaScript sandbox (all that the node allows are live): an idle
    /// JavaScript actor makes way.
    JsSandbox = 1,
    /// The node's guest memory budget: an idle actor whose instance grew
    /// its memory makes way.
    Memory = 2,
}

impl Room {
    /// Whether the actor sharing `s` frees this kind of room.
    fn freed_by(self, s: &Shared) -> bool {
        let slot = s.slot.load(Ordering::Relaxed);
        match self {
            Room::Instance => slot != SLOT_NONE,
            Room::JsSandbox => slot == SLOT_JS,
            Room::Memory => slot != SLOT_NONE && s.grown.load(Ordering::Relaxed) > 0,
        }
    }
}

impl Shared {
    /// Record the actor's activity statistics.
    pub fn note_turn(&self, turns: u64, last_turn_at_ms: u64) {
        *self.stats.lock().expect("stats lock") = (turns, last_turn_at_ms);
    }

    /// Whether a delete waits.
    pub fn delete_asked(&self) -> bool {
        !self.deletes.lock().expect("deletes lock").is_empty()
    }

    /// The deletes asked so far, to answer.
    pub fn take_deletes(&self) -> Vec<DeleteReply> {
        std::mem::take(&mut *self.deletes.lock().expect("deletes lock"))
    }
}

struct Handle {
    tx: mpsc::Sender<Envelope>,
    shared: Arc<Shared>,
}

/// The active actors of a node.
pub struct Registry {
    shards: Box<[Mutex<HashMap<ActorKey, Handle>>]>,
    hasher: std::collections::hash_map::RandomState,
    active: AtomicUsize,
    evicting: AtomicBool,
    /// A [`Registry::make_room`] pass is running, per [`Room`].
    making_room: [AtomicBool; 3],
    /// Activations waiting for room, per [`Room`].
    waiting_for_room: [Arc<AtomicUsize>; 3],
    max_active: usize,
    mailbox_capacity: usize,
    /// A graceful stop has begun: queued work starts no new turn.
    stopping: AtomicBool,
}

impl Registry {
    /// An empty registry.
    pub fn new(max_active: usize, mailbox_capacity: usize) -> Self {
        Self {
            shards: (0..SHARDS).map(|_| Mutex::new(HashMap::new())).collect(),
            hasher: Default::default(),
            active: AtomicUsize::new(0),
            evicting: AtomicBool::new(false),
            making_room: Default::default(),
            waiting_for_room: Default::default(),
            max_active,
            mailbox_capacity,
            stopping: AtomicBool::new(false),
        }
    }

    /// A graceful stop begins: an actor's queued work (its inbox) starts
    /// no new turn from now on; it runs after the next start.
    pub fn begin_stop(&self) {
        self.stopping.store(true, Ordering::Release);
    }

    /// Whether a graceful stop has begun ([`Self::begin_stop`]).
    pub fn is_stopping(&self) -> bool {
        self.stopping.load(Ordering::Acquire)
    }

    fn shard(&self, key: &ActorKey) -> MutexGuard<'_, HashMap<ActorKey, Handle>> {
        self.shards[self.hasher.hash_one(key) as usize % SHARDS]
            .lock()
            .expect("registry shard lock")
    }

    /// Actors awake now.
    pub fn active_count(&self) -> usize {
        self.active.load(Ordering::Relaxed)
    }

    /// Whether `key` is awake.
    pub fn is_active(&self, key: &ActorKey) -> bool {
        self.shard(key).contains_key(key)
    }

    /// Whether `key` would start a delivery at once: hibernated, or awake
    /// with no turn running, nothing in its mailbox and no durable work
    /// queued. A hint: it may get busy right after.
    pub fn is_idle(&self, key: &ActorKey) -> bool {
        let shard = self.shard(key);
        let Some(h) = shard.get(key) else {
            return true;
        };
        !h.shared.busy.load(Ordering::Relaxed)
            && !h.shared.inbox_dirty.load(Ordering::Acquire)
            && h.tx.capacity() == h.tx.max_capacity()
    }

    /// `Some((turns, last_turn_at_ms))` of an awake actor that has run a
    /// writing turn in this activation.
    pub fn live_stats(&self, key: &ActorKey) -> Option<Option<(u64, u64)>> {
        let shard = self.shard(key);
        let h = shard.get(key)?;
        let s = *h.shared.stats.lock().expect("stats lock");
        Some((s.0 > 0).then_some(s))
    }

    /// Deliver `envelope` to the actor, waking it if it is hibernated.
    pub(crate) fn deliver(
        &self,
        env: &Arc<ActorEnv>,
        key: &ActorKey,
        envelope: Envelope,
    ) -> Result<(), TurnError> {
        let mut shard = self.shard(key);
        let mut after_crash = false;
        let envelope = match shard.get(key) {
            Some(h) => match h.tx.try_send(envelope) {
                Ok(()) => {
                    h.shared.last_used_ms.store(now_ms(), Ordering::Relaxed);
                    return Ok(());
                }
                Err(mpsc::error::TrySendError::Full(_)) => {
                    env.metrics.mailbox_full.inc();
                    return Err(TurnError::MailboxFull(self.mailbox_capacity));
                }
                // The task died without deregistering (it panicked): replace it.
                Err(mpsc::error::TrySendError::Closed(envelope)) => {
                    tracing::error!(actor = %key, "actor task died; starting a new activation");
                    shard.remove(key);
                    self.active.fetch_sub(1, Ordering::Relaxed);
                    env.metrics.actors_active.dec();
                    after_crash = true;
                    envelope
                }
            },
            None => envelope,
        };
        let ty = env
            .catalog
            .get(key.ty())
            .ok_or_else(|| TurnError::UnknownType(key.ty().to_owned()))?;
        self.wake(env, shard, key, ty, Some(envelope), after_crash);
        Ok(())
    }

    /// Ask the actor to delete itself, ahead of whatever its mailbox and
    /// inbox hold, however full. A hibernated one is woken first: it looks
    /// at its inbox as it wakes, and stops between rows for the delete.
    pub(crate) fn delete(
        &self,
        env: &Arc<ActorEnv>,
        key: &ActorKey,
        reply: DeleteReply,
    ) -> Result<(), TurnError> {
        let Err(reply) = self.ask_delete(key, reply) else {
            return Ok(());
        };
        self.deliver(env, key, Envelope::InboxPoke)?;
        match self.ask_delete(key, reply) {
            Ok(()) => Ok(()),
            // Gone again at once (its type was deleted): as a message.
            Err(reply) => self.deliver(env, key, Envelope::Delete(reply)),
        }
    }

    /// Hand `reply` to the live activation of `key`, or back if there is
    /// none.
    fn ask_delete(&self, key: &ActorKey, reply: DeleteReply) -> Result<(), DeleteReply> {
        let shard = self.shard(key);
        match shard.get(key) {
            Some(h) if !h.tx.is_closed() => {
                // Under the shard's lock: `try_leave` looks under it too, so
                // the task cannot leave with the delete unanswered.
                h.shared.deletes.lock().expect("deletes lock").push(reply);
                h.shared.urgent.notify_one();
                Ok(())
            }
            _ => Err(reply),
        }
    }

    /// Tell the actor its inbox has new rows, waking it if needed.
    pub(crate) fn poke(&self, env: &Arc<ActorEnv>, key: &ActorKey) {
        let mut shard = self.shard(key);
        let mut after_crash = false;
        if let Some(h) = shard.get(key) {
            // Already set: the task has not looked since the poke that set
            // it, which woke it (or found it busy), and it will look before
            // it waits again. A poke per queued row would fill its mailbox
            // while a turn runs, and refuse the messages and the delete
            // behind them with 429.
            if h.shared.inbox_dirty.swap(true, Ordering::AcqRel) && !h.tx.is_closed() {
                return;
            }
            // A full mailbox means the task is busy and will see the flag.
            match h.tx.try_send(Envelope::InboxPoke) {
                Ok(()) | Err(mpsc::error::TrySendError::Full(_)) => return,
                Err(mpsc::error::TrySendError::Closed(_)) => {
                    tracing::error!(actor = %key, "actor task died; starting a new activation");
                    shard.remove(key);
                    self.active.fetch_sub(1, Ordering::Relaxed);
                    env.metrics.actors_active.dec();
                    after_crash = true;
                }
            }
        }
        let Some(ty) = env.catalog.get(key.ty()) else {
            tracing::warn!(actor = %key, "durable message for a type that no longer exists");
            return;
        };
        self.wake(env, shard, key, ty, None, after_crash);
    }

    fn wake(
        &self,
        env: &Arc<ActorEnv>,
        mut shard: MutexGuard<'_, HashMap<ActorKey, Handle>>,
        key: &ActorKey,
        ty: Arc<TypeEntry>,
        first: Option<Envelope>,
        after_crash: bool,
    ) {
        let (tx, rx) = mpsc::channel(self.mailbox_capacity);
        if let Some(env) = first
            && tx.try_send(env).is_err()
        {
            unreachable!("a new mailbox has room");
        }
        let shared = Arc::new(Shared {
            tracker: Arc::new(CommitTracker::default()),
            ty,
            last_used_ms: AtomicU64::new(now_ms()),
            // A waking actor always looks at its inbox once.
            inbox_dirty: AtomicBool::new(true),
            inbox_deferred: AtomicBool::new(false),
            hibernate: Notify::new(),
            after_crash: AtomicBool::new(after_crash),
            slot: AtomicU8::new(SLOT_NONE),
            busy: AtomicBool::new(false),
            grown: AtomicU64::new(0),
            stats: Mutex::new((0, 0)),
            deletes: Mutex::new(Vec::new()),
            urgent: Notify::new(),
        });
        shard.insert(
            key.clone(),
            Handle {
                tx,
                shared: shared.clone(),
            },
        );
        drop(shard);
        let active = self.active.fetch_add(1, Ordering::Relaxed) + 1;
        env.metrics.actors_active.inc();
        let task = ActorTask::new(env.clone(), key.clone(), shared);
        tokio::spawn(task.run(rx));
        if active > self.max_active {
            self.evict(env);
        }
    }

    /// Remove `key` if its mailbox is empty and nothing new arrived; called
    /// by the actor's own task. Returns whether it left.
    pub(crate) fn try_leave(
        &self,
        key: &ActorKey,
        shared: &Arc<Shared>,
        rx: &mut mpsc::Receiver<Envelope>,
    ) -> bool {
        let mut shard = self.shard(key);
        if !rx.is_empty() || shared.inbox_dirty.load(Ordering::Acquire) || shared.delete_asked() {
            return false;
        }
        if shard
            .get(key)
            .is_some_and(|h| Arc::ptr_eq(&h.shared, shared))
        {
            shard.remove(key);
        }
        rx.close();
        drop(shard);
        self.active.fetch_sub(1, Ordering::Relaxed);
        true
    }

    /// Ask the least recently used idle actors to hibernate until the node
    /// is back under its cap (with 5% headroom so this does not run on every
    /// wake).
    pub(crate) fn evict(&self, env: &Arc<ActorEnv>) {
        if self.evicting.swap(true, Ordering::AcqRel) {
            return;
        }
        let env = env.clone();
        tokio::spawn(async move {
            let reg = &env.registry;
            let target = reg.max_active - reg.max_active / 20;
            let active = reg.active_count();
            if active > target {
                reg.hibernate_oldest(active - target, |_| true);
            }
            reg.evicting.store(false, Ordering::Release);
        });
    }

    /// Count the caller as waiting for `room` until the returned guard is
    /// dropped.
    pub(crate) fn wait_for_room(&self, room: Room) -> WaitingForRoom {
        let n = self.waiting_for_room[room as usize].clone();
        n.fetch_add(1, Ordering::Relaxed);
        WaitingForRoom(n)
    }

    /// The instance pool is full, all JavaScript sandboxes are in use, or
    /// the guest memory budget is spent (`room`): ask the least recently
    /// used *idle* actors holding what is short to hibernate — `batch` of
    /// them, or one per waiting activation if more wait — so waking actors
    /// find room. The caller shows it is counted among the waiting.
    pub(crate) fn make_room(
        &self,
        env: &Arc<ActorEnv>,
        room: Room,
        batch: usize,
        _waiting: &WaitingForRoom,
    ) {
        let i = room as usize;
        if self.making_room[i].swap(true, Ordering::AcqRel) {
            return;
        }
        let count = batch.max(self.waiting_for_room[i].load(Ordering::Relaxed));
        let env = env.clone();
        tokio::spawn(async move {
            let reg = &env.registry;
            reg.hibernate_oldest(count.max(1), |s| {
                room.freed_by(s) && !s.busy.load(Ordering::Relaxed)
            });
            reg.making_room[i].store(false, Ordering::Release);
        });
    }

    /// Ask the `n` least recently used actors matching `select` to hibernate
    /// (each goes as soon as it is idle).
    ///
    /// Two passes over the active actors, the first collecting only when
    /// each was last used, so that no reference to each is taken and
    /// dropped (an eighth of a pass over 10,000 actors in `perf`).
    fn hibernate_oldest(&self, n: usize, select: impl Fn(&Shared) -> bool) {
        if n == 0 {
            return;
        }
        let mut used: Vec<u64> = Vec::with_capacity(self.active_count());
        for shard in self.shards.iter() {
            let shard = shard.lock().expect("registry shard lock");
            used.extend(
                shard
                    .values()
                    .filter(|h| select(&h.shared))
                    .map(|h| h.shared.last_used_ms.load(Ordering::Relaxed)),
            );
        }
        // The n-th oldest use: those at or before it go (an actor used
        // since the first pass is no longer among the oldest, and stays).
        let cutoff = match used.len() > n {
            true => *used.select_nth_unstable(n - 1).1,
            false => u64::MAX,
        };
        let mut left = n;
        for shard in self.shards.iter() {
            let shard = shard.lock().expect("registry shard lock");
            for h in shard.values() {
                if left == 0 {
                    return;
                }
                if h.shared.last_used_ms.load(Ordering::Relaxed) <= cutoff && select(&h.shared) {
                    h.shared.hibernate.notify_one();
                    left -= 1;
                }
            }
        }
    }

    /// Refuse all further commits of live actors of `ty` (it is being
    /// deleted): a turn still running when the type goes must not write
    /// rows for it afterwards.
    pub(crate) fn fence_type(&self, ty: &str) {
        for shard in self.shards.iter() {
            let shard = shard.lock().expect("registry shard lock");
            for (k, h) in shard.iter() {
                if k.ty() == ty {
                    h.shared.tracker.fence(ty);
                }
            }
        }
    }

    /// The active instances of the actors `which` selects hold rows that
    /// moved away or were replaced (a move, a slot lost): refuse what they
    /// have not committed yet, make them reload before their next turn,
    /// and ask them to hibernate when idle.
    pub(crate) fn invalidate_where(&self, which: impl Fn(&ActorKey) -> bool) {
        for shard in self.shards.iter() {
            let shard = shard.lock().expect("registry shard lock");
            for (k, h) in shard.iter() {
                if which(k) {
                    h.shared.tracker.invalidate();
                    h.shared.hibernate.notify_one();
                }
            }
        }
    }

    /// Ask every active actor of `ty` to hibernate when idle.
    pub(crate) fn hibernate_type(&self, ty: &str) {
        for shard in self.shards.iter() {
            let shard = shard.lock().expect("registry shard lock");
            for (k, h) in shard.iter() {
                if k.ty() == ty {
                    h.shared.hibernate.notify_one();
                }
            }
        }
    }

    /// Have the active actors of `ty` whose inbox waits for a retry look
    /// again now (a new version of the type may be what it waited for:
    /// a fixed deploy left queued messages to their back-off, up to 30 s).
    pub(crate) fn retry_deferred_of_type(&self, env: &Arc<ActorEnv>, ty: &str) {
        let mut deferred = Vec::new();
        for shard in self.shards.iter() {
            let shard = shard.lock().expect("registry shard lock");
            deferred.extend(
                shard
                    .iter()
                    .filter(|(k, h)| {
                        k.ty() == ty && h.shared.inbox_deferred.load(Ordering::Acquire)
                    })
                    .map(|(k, _)| k.clone()),
            );
        }
        for key in deferred {
            self.poke(env, &key);
        }
    }

    /// Ask every active actor to hibernate when idle (benchmarks, shutdown).
    pub fn hibernate_all(&self) {
        for shard in self.shards.iter() {
            for h in shard.lock().expect("registry shard lock").values() {
                h.shared.hibernate.notify_one();
            }
        }
    }

    /// `(key, turns, last_turn_at_ms)` of each awake actor that has run
    /// a turn in this activation.
    pub fn awake_stats(&self) -> Vec<(ActorKey, u64, u64)> {
        let mut out = Vec::new();
        for shard in self.shards.iter() {
            for (k, h) in shard.lock().expect("registry shard lock").iter() {
                let (turns, last) = *h.shared.stats.lock().expect("stats lock");
                if turns > 0 {
                    out.push((k.clone(), turns, last));
                }
            }
        }
        out
    }

    /// Awake actors with no turn running.
    pub fn idle_count(&self) -> usize {
        self.shards
            .iter()
            .map(|s| {
                s.lock()
                    .expect("registry shard lock")
                    .values()
                    .filter(|h| !h.shared.busy.load(Ordering::Relaxed))
                    .count()
            })
            .sum()
    }

    /// Active actors of `ty`.
    pub(crate) fn count_type(&self, ty: &str) -> usize {
        self.shards
            .iter()
            .map(|s| {
                s.lock()
                    .expect("registry shard lock")
                    .keys()
                    .filter(|k| k.ty() == ty)
                    .count()
            })
            .sum()
    }
}
