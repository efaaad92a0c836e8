//! Replication in the writer: what a committed batch ships to the backups
//! of its slots, and how a backup applies what it receives.
//!
//! The owner records, as it applies each op, the writes to the rows of
//! actors whose slot has a backup ([`Replication::slot`]), grouped by
//! slot; the batch's transaction also advances each slot's mark in
//! [`REPLICA_LSN`], so marks only grow and survive restarts. After the
//! commit the batches go to [`Replication::ship`] with the batch's
//! completions: nothing of the batch is released (replies, events to
//! streams, outbound webhooks, relayed sends) until the replication
//! releases it — the output gate covers the backup.
//!
//! A backup applies a [`ReplicaBatch`] in one transaction, with its own
//! actor numbers, once: a batch at or below the slot's mark is a repeat.
//! The owner's outbound webhooks and relayed sends stay the owner's: it
//! delivers what it committed.

use std::collections::BTreeMap;
use std::sync::Arc;

use marmot_core::ids::ActorKey;
use redb::ReadableTable;

use super::WriterState;
use super::ops::TurnCommit;
use super::tables::Tables;
use super::tracker::CommitTracker;
use crate::StorageError;
use crate::schema::*;

/// Where committed writes go besides this node's disk: the backups of
/// their slots. Installed once, when the node joins a cluster.
pub trait Replication: Send + Sync {
    /// Where `key`'s rows are kept.
    fn placement(&self, key: &ActorKey) -> Placement;

    /// Ship a committed batch's writes (one [`ReplicaBatch`] per slot,
    /// possibly none) and call `release` once this batch may be released:
    /// after every batch shipped before it, and once each of its backups
    /// acknowledged (or the slot has no backup any more). `Err(why)` fails
    /// the batch's operations instead: its slot moved to another node
    /// before its backup had it. Called on the writer thread, in commit
    /// order.
    fn ship(&self, batches: Vec<ReplicaBatch>, release: Release);
}

/// Where an actor's rows are kept, as the writer commits them.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Placement {
    /// Here alone.
    Here,
    /// Here, and on the backup of `slot`, owned here at `epoch`.
    Replicated {
        /// The actor's slot.
        slot: u32,
        /// Its epoch.
        epoch: u64,
    },
    /// Another node owns the actor's slot: this node's commits for it are
    /// refused (the fence is in storage, like Durable Objects': a stale
    /// instance stops at its next write).
    Elsewhere,
    /// This node owns the slot, but it has no backup and the cluster's
    /// policy refuses writes without one.
    NoBackup,
}

/// Releases (`Ok`) or fails a shipped batch's operations.
pub type Release = Box<dyn FnOnce(Result<(), String>) + Send>;

/// A batch's writes to one slot, while the batch is applied.
pub(super) struct Draft {
    epoch: u64,
    ops: Vec<ReplicaOp>,
}

/// The outcome of a replicated batch on a backup.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ReplicaApplied {
    /// Applied now.
    Applied,
    /// Applied before (at or below the slot's mark): nothing done.
    Repeat,
    /// Refused: this node is not the slot's backup at the batch's epoch.
    Refused,
    /// Refused: an earlier batch of the slot is missing here.
    Gap,
}

impl WriterState {
    /// Where `key`'s rows are kept.
    pub(super) fn placement(&self, key: &ActorKey) -> Placement {
        self.replication
            .get()
            .map_or(Placement::Here, |r| r.placement(key))
    }

    /// Record `op` for the backup of `key`'s slot.
    pub(super) fn record(&mut self, key: &ActorKey, op: impl FnOnce() -> ReplicaOp) {
        if let Placement::Replicated { slot, epoch } = self.placement(key) {
            let draft = self.drafts.entry(slot).or_insert_with(|| Draft {
                epoch,
                ops: Vec::new(),
            });
            draft.epoch = draft.epoch.max(epoch);
            draft.ops.push(op());
        }
    }

    /// Advance the marks of the slots this batch wrote, in its transaction,
    /// and return its batches to ship.
    pub(super) fn seal_drafts(
        &mut self,
        tables: &mut Tables<'_>,
    ) -> Result<Vec<ReplicaBatch>, StorageError> {
        let drafts = std::mem::take(&mut self.drafts);
        let mut out = Vec::with_capacity(drafts.len());
        for (slot, d) in drafts {
            let last = read_mark(&tables.replica_lsn, slot)?;
            let mark = ReplicaMark {
                epoch: d.epoch.max(last.epoch),
                lsn: last.lsn + 1,
            };
            tables.replica_lsn.insert(slot, encode(&mark).as_slice())?;
            out.push(ReplicaBatch {
                slot,
                mark,
                ops: d.ops,
                blobs: Vec::new(),
            });
        }
        Ok(out)
    }

    /// Apply a batch shipped by the owner of its slot, if `accept` (still
    /// its backup at the batch's epoch) and it is not a repeat.
    pub(super) fn apply_replica(
        &mut self,
        tables: &mut Tables<'_>,
        batch: &ReplicaBatch,
        accept: &(dyn Fn() -> bool + Send),
        created: &mut i64,
    ) -> Result<ReplicaApplied, StorageError> {
        let last = read_mark(&tables.replica_lsn, batch.slot)?;
        if batch.mark.lsn <= last.lsn {
            return Ok(ReplicaApplied::Repeat);
        }
        if batch.mark.lsn != last.lsn + 1 || batch.mark.epoch < last.epoch {
            // A batch is missing (the owner committed one it never
            // shipped): this copy cannot follow without a snapshot.
            return Ok(ReplicaApplied::Gap);
        }
        // Checked here, on the writer thread: once this node serves the
        // slot as its new owner it refuses older epochs, and anything it
        // applied before then is in what its actors load.
        if !accept() {
            return Ok(ReplicaApplied::Refused);
        }
        for op in &batch.ops {
            self.apply_replica_op(tables, op, created)?;
        }
        tables
            .replica_lsn
            .insert(batch.slot, encode(&batch.mark).as_slice())?;
        Ok(ReplicaApplied::Applied)
    }

    fn apply_replica_op(
        &mut self,
        tables: &mut Tables<'_>,
        op: &ReplicaOp,
        created: &mut i64,
    ) -> Result<(), StorageError> {
        let key = |ty: &str, id: &str| {
            ActorKey::new(ty, id).map_err(|e| {
                StorageError::Unavailable(format!("a replicated write names no actor: {e}"))
            })
        };
        match op {
            ReplicaOp::Create {
                actor_type,
                actor_id,
                version,
                ..
            } => {
                self.get_or_create(tables, &key(actor_type, actor_id)?, *version, created)?;
            }
            ReplicaOp::Turn(t) => {
                let k = key(&t.actor_type, &t.actor_id)?;
                let version = t.record.as_ref().map_or(1, |r| r.version);
                let num = self.get_or_create(tables, &k, version, created)?.num;
                let commit = TurnCommit {
                    key: k,
                    tracker: Arc::new(CommitTracker::default()),
                    generation: 0,
                    seq: 0,
                    num,
                    record: t.record.clone().map(|r| ActorRecord { num, ..r }),
                    state: t
                        .state
                        .iter()
                        .map(|(k, v)| (k.clone(), v.clone().map(Into::into)))
                        .collect(),
                    events: t.events.clone(),
                    trim_events_below: t.trim_events_below,
                    idempotency: t.idempotency.clone(),
                    inbox_done: t.inbox_done,
                    inbox_update: t.inbox_update.clone(),
                    alarms: t.alarms.clone(),
                    inputs: t.inputs.clone(),
                    sends: Vec::new(),
                    relay_sends: false,
                    files: t.files.clone(),
                    usage: t.usage,
                    traceparent: None,
                    on_durable: Box::new(|_| {}),
                };
                // The actor record exists already (created above).
                let mut ignored = 0;
                tables.write_turn(&commit, &mut ignored)?;
            }
            ReplicaOp::Enqueue {
                actor_type,
                actor_id,
                seq,
                message,
                idempotency,
            } => {
                let num = self
                    .get_or_create(tables, &key(actor_type, actor_id)?, 1, created)?
                    .num;
                if let (Some(k), Some(rec)) = (&message.idempotency_key, idempotency) {
                    tables
                        .idempotency
                        .insert((num, k.as_str()), encode(rec).as_slice())?;
                    tables
                        .idem_expiry
                        .insert((rec.expires_at_ms, num, k.as_str()), ())?;
                }
                tables
                    .inbox
                    .insert((num, *seq), encode(message).as_slice())?;
                // Messages queued here later (as the new owner) come after.
                self.next_inbox_seq = self.next_inbox_seq.max(seq + 1);
            }
            ReplicaOp::Usage {
                actor_type,
                actor_id,
                usage,
            } => {
                let k = key(actor_type, actor_id)?;
                let num = self.get_or_create(tables, &k, 1, created)?.num;
                tables.add_usage(num, k.ty(), *usage)?;
            }
            ReplicaOp::Delete {
                actor_type,
                actor_id,
            } => {
                if tables.delete_actor(&key(actor_type, actor_id)?)? {
                    *created -= 1;
                }
            }
        }
        Ok(())
    }
}

fn read_mark(
    table: &redb::Table<'_, u32, &'static [u8]>,
    slot: u32,
) -> Result<ReplicaMark, StorageError> {
    Ok(match table.get(slot)? {
        Some(v) => decode("replica mark", v.value())?,
        None => ReplicaMark::default(),
    })
}

/// The replication record of a committed turn.
pub(super) fn turn_op(t: &TurnCommit) -> ReplicaOp {
    ReplicaOp::Turn(Box::new(ReplicaTurn {
        actor_type: t.key.ty().to_owned(),
        actor_id: t.key.id().to_owned(),
        record: t.record.clone(),
        state: t
            .state
            .iter()
            .map(|(k, v)| (k.clone(), v.as_ref().map(|b| b.to_vec())))
            .collect(),
        events: t.events.clone(),
        trim_events_below: t.trim_events_below,
        idempotency: t.idempotency.clone(),
        inbox_done: t.inbox_done,
        inbox_update: t.inbox_update.clone(),
        alarms: t.alarms.clone(),
        inputs: t.inputs.clone(),
        files: t.files.clone(),
        usage: t.usage,
    }))
}

/// A batch's drafts by slot (ordered, so shipments are too).
pub(super) type Drafts = BTreeMap<u32, Draft>;
