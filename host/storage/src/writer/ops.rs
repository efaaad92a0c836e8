//! What the writer is asked to do: one [`WriteOp`] per request, and what
//! each op leaves to complete once its commit is durable ([`Applied`]).

use std::sync::Arc;

use bytes::Bytes;
use marmot_core::ids::ActorKey;
use tokio::sync::oneshot;

use super::tracker::{CommitFailed, CommitTracker};
use crate::StorageError;
use crate::schema::*;

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
    /// Queue `sends` in the relay table instead of the recipients'
    /// inboxes: in a cluster a recipient may live on another node, so a
    /// relay hands each message to its owner after the commit.
    pub relay_sends: bool,
    /// Files written (`Some`) or deleted (`None`); a blob a record names
    /// was stored before the commit.
    pub files: Vec<(String, Option<FileRecord>)>,
    /// Model usage of the turn, added to the actor's and its type's.
    pub usage: Option<UsageRecord>,
    /// The turn's W3C `traceparent` (traces on): outbound webhooks of its
    /// events continue its trace.
    pub traceparent: Option<String>,
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
        /// Whether it had the same body (always, for a webhook, and for a
        /// record that predates fingerprints): a different one means the
        /// key was reused for another request, which is refused.
        same_request: bool,
    },
}

pub(super) type Reply<T> = oneshot::Sender<Result<T, StorageError>>;

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
        /// With a fence, the answer comes as soon as the op is applied,
        /// before the commit, so the actor's first turn can share the
        /// creation's commit; the commit is reported to the fence's tracker
        /// like one of the activation's own (a failure fails its
        /// generation, so nothing built on the answer ever commits).
        /// Without, the answer waits for durability.
        early: Option<Fence>,
        /// Completion.
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
    /// Delete a type, its code and (when `with_actors`) all its actors;
    /// without them, nothing is deleted if it has any (`Err` with their
    /// number, counted in the deleting commit).
    DeleteType {
        /// The type.
        name: String,
        /// Also delete its actors.
        with_actors: bool,
        /// Completion: actors deleted, or (refused) how many it has.
        done: Reply<Result<u64, u64>>,
    },
    /// Remove dead deliveries of events made before `created_before_ms`
    /// (the dead-letter list's retention), a bounded number per call.
    PruneDeadDeliveries {
        /// The cut-off.
        created_before_ms: u64,
        /// Completion: rows removed.
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
        /// The row's `(attempts, next_attempt_ms)` as the attempt read it:
        /// a failure is not written over a row changed since (retried
        /// meanwhile). `None`: written whatever the row holds now.
        read_as: Option<(u32, u64)>,
        /// Completion.
        done: Reply<()>,
    },
    /// Make a delivery due again now, with a fresh retry schedule (replay).
    RetryDelivery {
        /// Its public id (`webhook-id`).
        id: String,
        /// Completion: the row, if it exists.
        done: Reply<Option<DeliveryRecord>>,
    },
    /// Write a secret record (`Some`) or remove it (`None`).
    PutSecret {
        /// Its name.
        name: String,
        /// The record.
        record: Option<SecretRecord>,
        /// Completion: whether a record existed before.
        done: Reply<bool>,
    },
    /// Write a model provider (`Some`) or remove it (`None`).
    PutProvider {
        /// Its name.
        name: String,
        /// The record.
        record: Option<ProviderRecord>,
        /// Completion: whether a record existed before.
        done: Reply<bool>,
    },
    /// Revoke a client token until it expires.
    RevokeToken {
        /// The token's id (`jti`).
        jti: String,
        /// When the token expires (ms).
        expires_at_ms: u64,
        /// Now (ms): revocations of tokens expired by then are dropped.
        now_ms: u64,
        /// Completion: whether it was not revoked before.
        done: Reply<bool>,
    },
    /// Add model usage to an actor and its type without a turn (the usage
    /// of a turn that failed: the calls were made and paid for).
    RecordUsage {
        /// The actor.
        key: ActorKey,
        /// Its number.
        num: u64,
        /// What to add.
        usage: UsageRecord,
        /// Completion.
        done: Reply<()>,
    },
    /// Raise an actor's turn count and last turn's time to these, where
    /// its record is behind (an awake actor's, kept in memory between
    /// record writes, at a stop that cannot wait for it to hibernate).
    /// A lone node's: nothing of it is replicated.
    RecordStats {
        /// The actor.
        key: ActorKey,
        /// Turns it has run.
        turns: u64,
        /// When the last one ran (ms since the epoch).
        last_turn_at_ms: u64,
        /// Completion.
        done: Reply<()>,
    },
    /// Apply a batch the owner of its slot shipped to this node, its
    /// backup, if `accept` holds when it is applied.
    Replica {
        /// The batch.
        batch: ReplicaBatch,
        /// Whether this node is (still) the slot's backup at the batch's
        /// epoch; asked on the writer thread, just before applying.
        accept: Box<dyn Fn() -> bool + Send>,
        /// Completion.
        done: Reply<super::ReplicaApplied>,
    },
    /// Ship a snapshot of `slot` (owned here at `epoch`) to the node
    /// catching up to become its backup (`session`: see
    /// [`super::Placement::Joining`]); from then on the slot's writes go
    /// to it too.
    Snapshot {
        /// (slot, epoch, session) of each slot.
        slots: Vec<(u32, u64, i64)>,
        /// Completion (once the commit is released): actors in the
        /// snapshot.
        done: Reply<usize>,
    },
    /// Read all of an actor's rows (`None`: it does not exist), in the
    /// writer's transaction: with the actor fenced (a move under way),
    /// nothing of it can commit after the read.
    ReadImage {
        /// The actor.
        key: ActorKey,
        /// Completion (once durable).
        done: Reply<Option<Box<ActorImage>>>,
    },
    /// An actor moved here, into `slot` (owned here): its rows replace any
    /// copy held, and go to the slot's backup.
    MoveIn {
        /// The actor's rows.
        image: Box<ActorImage>,
        /// Its new slot.
        slot: u32,
        /// Completion (once durable here and on the slot's backup).
        done: Reply<()>,
    },
    /// An actor moved out of `from` (owned here) to `to`: its rows go,
    /// here (unless this node keeps `to`'s rows too) and on `from`'s
    /// backup.
    MoveOut {
        /// The actor.
        key: ActorKey,
        /// The slot it left.
        from: u32,
        /// The slot it lives in now.
        to: u32,
        /// Completion: whether rows went here.
        done: Reply<bool>,
    },
    /// The copy of an actor this node keeps in `slot` (owned here) from
    /// before, created at `created_at_ms`, is stale: its rows go, here and
    /// on the slot's backup, if they are that copy. Refused if the slot is
    /// another node's now.
    DropStale {
        /// The actor.
        key: ActorKey,
        /// The slot the copy is in.
        slot: u32,
        /// When the stale copy was created.
        created_at_ms: u64,
        /// Completion: whether rows went here.
        done: Reply<bool>,
    },
    /// Forget relayed messages their recipients' owners have queued.
    RelayDone {
        /// Their relay seqs.
        seqs: Vec<u64>,
        /// Completion.
        done: Reply<()>,
    },
    /// Completes once everything queued before it is durable.
    Barrier {
        /// Completion.
        done: oneshot::Sender<()>,
    },
    /// Block the writer until the sender is dropped or sends, so that what
    /// is submitted meanwhile lands in one batch (tests).
    #[cfg(test)]
    Hold {
        /// Released by a send or a drop.
        until: std::sync::mpsc::Receiver<()>,
    },
}

impl WriteOp {
    /// The actor whose rows the op writes, if it is one actor's.
    pub(super) fn actor(&self) -> Option<&ActorKey> {
        match self {
            WriteOp::Turn(t) => Some(&t.key),
            WriteOp::GetOrCreate { key, .. }
            | WriteOp::Enqueue { key, .. }
            | WriteOp::DeleteActor { key, .. }
            | WriteOp::RecordUsage { key, .. }
            | WriteOp::RecordStats { key, .. } => Some(key),
            _ => None,
        }
    }
}

pub(super) fn fail_op(op: WriteOp, why: CommitFailed) {
    Applied::from_unapplied(op).complete(Some(&why));
}

impl Applied {
    /// The completion of an op refused here (`why`: another node owns its
    /// actor, `elsewhere`, or its slot has no backup).
    pub(super) fn refuse(op: WriteOp, why: &str, elsewhere: bool) -> Applied {
        let why = format!("{why}; the write was refused");
        let refused = if elsewhere {
            CommitFailed::Moved(why.clone())
        } else {
            CommitFailed::Refused(why.clone())
        };
        let why = || {
            if elsewhere {
                StorageError::CommitFailed(refused.clone())
            } else {
                StorageError::Unavailable(why.clone())
            }
        };
        match op {
            WriteOp::Turn(t) => {
                t.tracker.mark_failed(t.generation, &refused);
                Applied::Refused(t.on_durable, refused)
            }
            WriteOp::GetOrCreate { done, early, .. } => {
                if let Some(f) = early {
                    f.fail(&refused);
                }
                Applied::reply(done, Err(why()))
            }
            WriteOp::Enqueue { done, .. } => Applied::reply(done, Err(why())),
            WriteOp::DeleteActor { done, .. } => Applied::reply(done, Err(why())),
            WriteOp::RecordUsage { done, .. } | WriteOp::RecordStats { done, .. } => {
                Applied::reply(done, Err(why()))
            }
            other => Applied::from_unapplied(other),
        }
    }

    /// The completion of an op that was never applied.
    pub(super) fn from_unapplied(op: WriteOp) -> Applied {
        match op {
            WriteOp::Turn(t) => Applied::Turn {
                tracker: t.tracker,
                generation: t.generation,
                seq: t.seq,
                on_durable: t.on_durable,
            },
            WriteOp::GetOrCreate { done, early, .. } => {
                // Never applied, so nothing was created: the activation
                // that counted the creation as one of its commits must
                // reload, as when the creation is refused.
                if let Some(f) = early {
                    f.fail(&CommitFailed::ShuttingDown);
                }
                Applied::reply(done, Err(StorageError::WriterGone))
            }
            WriteOp::Enqueue { done, .. } => Applied::reply(done, Err(StorageError::WriterGone)),
            WriteOp::DeleteActor { done, .. } => {
                Applied::reply(done, Err(StorageError::WriterGone))
            }
            WriteOp::PutType { done, .. } => Applied::reply(done, Err(StorageError::WriterGone)),
            WriteOp::DeleteType { done, .. } => Applied::reply(done, Err(StorageError::WriterGone)),
            WriteOp::SweepIdempotency { done, .. } | WriteOp::PruneDeadDeliveries { done, .. } => {
                Applied::reply(done, Err(StorageError::WriterGone))
            }
            WriteOp::PutSubscription { done, .. } | WriteOp::DeleteSubscription { done, .. } => {
                Applied::reply(done, Err(StorageError::WriterGone))
            }
            WriteOp::DeliveryAttempted { done, .. } => {
                Applied::reply(done, Err(StorageError::WriterGone))
            }
            WriteOp::PutSecret { done, .. }
            | WriteOp::PutProvider { done, .. }
            | WriteOp::RevokeToken { done, .. } => {
                Applied::reply(done, Err(StorageError::WriterGone))
            }
            WriteOp::RecordUsage { done, .. }
            | WriteOp::RecordStats { done, .. }
            | WriteOp::RelayDone { done, .. } => {
                Applied::reply(done, Err(StorageError::WriterGone))
            }
            WriteOp::Replica { done, .. } => Applied::reply(done, Err(StorageError::WriterGone)),
            WriteOp::Snapshot { done, .. } => Applied::reply(done, Err(StorageError::WriterGone)),
            WriteOp::ReadImage { done, .. } => Applied::reply(done, Err(StorageError::WriterGone)),
            WriteOp::MoveIn { done, .. } => Applied::reply(done, Err(StorageError::WriterGone)),
            WriteOp::MoveOut { done, .. } => Applied::reply(done, Err(StorageError::WriterGone)),
            WriteOp::DropStale { done, .. } => Applied::reply(done, Err(StorageError::WriterGone)),
            WriteOp::RetryDelivery { done, .. } => {
                Applied::reply(done, Err(StorageError::WriterGone))
            }
            #[cfg(test)]
            WriteOp::Hold { .. } => Applied::Reply(Box::new(|_| {})),
            WriteOp::Barrier { done } => Applied::Reply(Box::new(move |_| {
                let _ = done.send(());
            })),
        }
    }
}

/// Sends an op's result, or the commit's failure, to its waiter.
type ReplyFn = Box<dyn FnOnce(Option<&CommitFailed>) + Send>;

/// How an early answer reports its commit to the activation that got it:
/// as commit `seq` of its tracker when durable, or by failing `generation`.
pub struct Fence {
    /// The activation's commit tracker.
    pub tracker: Arc<CommitTracker>,
    /// Its generation.
    pub generation: u64,
    /// The sequence number the creation takes among its commits.
    pub seq: u64,
}

impl Fence {
    /// The creation did not commit (`why`): the activation that counted it
    /// must reload.
    pub(super) fn fail(&self, why: &CommitFailed) {
        self.tracker.mark_failed(self.generation, why);
    }
}

/// What applying one op produced, released (or failed) after the commit.
pub(super) enum Applied {
    Turn {
        tracker: Arc<CommitTracker>,
        generation: u64,
        seq: u64,
        on_durable: OnDurable,
    },
    /// Refused before it was applied, for the reason given.
    Refused(OnDurable, CommitFailed),
    /// Answered already (an early `GetOrCreate`); a failed commit fails
    /// this generation.
    Answered(Fence),
    /// Anything else: a closure that sends the op's result, or the commit's
    /// failure, to its waiter.
    Reply(ReplyFn),
    /// Like `Reply`, but answered as soon as the commit is durable here,
    /// not held for the replication: a backup's acknowledgement of an
    /// owner's batch (held behind this node's own shipments, two nodes
    /// backing up each other would wait for each other forever).
    Durable(ReplyFn),
}

impl Applied {
    pub(super) fn reply<T: Send + 'static>(done: Reply<T>, value: Result<T, StorageError>) -> Self {
        Applied::Reply(Box::new(move |failed| {
            let result = match (failed, value) {
                (Some(why), _) => Err(StorageError::CommitFailed(why.clone())),
                (None, v) => v,
            };
            let _ = done.send(result);
        }))
    }

    pub(super) fn complete(self, failed: Option<&CommitFailed>) {
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
                    tracker.mark_failed(generation, why);
                    on_durable(Err(why.clone()));
                }
            },
            Applied::Refused(on_durable, why) => on_durable(Err(why)),
            Applied::Answered(f) => match failed {
                None => f.tracker.mark_committed(f.seq),
                Some(why) => f.fail(why),
            },
            Applied::Reply(f) | Applied::Durable(f) => f(failed),
        }
    }
}
