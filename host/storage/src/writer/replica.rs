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
//! It keeps copies of the slot's outbound webhook deliveries and relayed
//! sends, and what became of each (`outgoing.rs`), but sends none of them
//! until it owns the slot.

use std::collections::BTreeMap;
use std::sync::Arc;

use marmot_core::ids::ActorKey;
use redb::ReadableTable;

use super::WriterState;
use super::ops::TurnCommit;
use super::outgoing::outgoing_ops;
use super::tables::Tables;
use super::tracker::CommitTracker;
use crate::StorageError;
use crate::schema::*;

/// Where committed writes go besides this node's disk: the backups of
/// their slots. Installed once, when the node joins a cluster.
pub trait Replication: Send + Sync {
    /// Where `key`'s rows are kept (`Elsewhere` also while the actor is
    /// being moved: nothing of it commits until it lives in its new slot).
    fn placement(&self, key: &ActorKey) -> Placement;

    /// Where the rows of `slot`'s actors are kept.
    fn slot_placement(&self, slot: u32) -> Placement;

    /// The slot of `key`.
    fn slot_of(&self, key: &ActorKey) -> u32;

    /// Whether this node keeps the rows of `slot` (owns it, backs it up or
    /// is catching up to): an actor moved there keeps its rows here.
    fn holds(&self, slot: u32) -> bool;

    /// Whether this node may send what `key` committed now (outbound
    /// webhooks, relayed messages): it owns the actor's slot, and may act
    /// on that (a node whose membership lease lapsed releases nothing).
    fn sends_for(&self, key: &ActorKey) -> bool {
        self.placement(key) != Placement::Elsewhere
    }

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
    /// This node owns the slot, which has no backup yet but a node
    /// catching up to become it: once the writer took the slot's snapshot
    /// ([`super::WriteOp::Snapshot`]) writes go to that node like to a
    /// backup, before that they are part of the snapshot.
    Joining {
        /// The actor's slot.
        slot: u32,
        /// Its epoch.
        epoch: u64,
        /// Which catching-up this is (a new one needs a new snapshot).
        session: i64,
    },
}

/// Releases (`Ok`) or fails a shipped batch's operations.
pub type Release = Box<dyn FnOnce(Result<(), String>) + Send>;

/// A batch's writes to one slot, while the batch is applied.
pub(super) struct Draft {
    epoch: u64,
    ops: Vec<ReplicaOp>,
    /// Starts with the slot's snapshot, taken for this catching-up session.
    snapshot: Option<i64>,
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

/// Where the actors and slots the batch being applied touched are kept, as
/// [`Replication`] first answered for this batch (cleared at each batch).
///
/// The cluster's view changes while a batch is applied — a handoff fences
/// a slot, a move starts. An op is checked (refused if its actor is another
/// node's) and then recorded for the backup; asking the view twice let a
/// write pass the check, find the slot fenced when it was recorded, and so
/// commit here undrafted: released without its backup, then lost when the
/// slot went to that backup (seen once in the rebalance test). One answer
/// per batch makes both steps agree; a view that changed meanwhile is
/// seen by the next batch, as if the change had come a moment later.
#[derive(Default)]
pub(super) struct BatchPlacements {
    keys: std::collections::HashMap<ActorKey, Placement>,
    slots: std::collections::HashMap<u32, Placement>,
}

impl BatchPlacements {
    pub(super) fn clear(&mut self) {
        self.keys.clear();
        self.slots.clear();
    }
}

impl WriterState {
    /// Where `key`'s rows are kept (a joining node counts as the backup
    /// once the slot's snapshot is taken), as first asked in this batch.
    pub(super) fn placement(&mut self, key: &ActorKey) -> Placement {
        let raw = self.raw_placement(key);
        self.taken(raw)
    }

    /// Where the rows of `slot` are kept (see [`Self::placement`]).
    pub(super) fn slot_placement(&mut self, slot: u32) -> Placement {
        let raw = self.raw_slot_placement(slot);
        self.taken(raw)
    }

    /// [`Replication::placement`], once per batch (None: not replicating).
    fn raw_placement(&mut self, key: &ActorKey) -> Option<Placement> {
        let r = self.replication.get()?;
        let memo = &mut self.batch_placements.keys;
        Some(match memo.get(key) {
            Some(&p) => p,
            None => *memo.entry(key.clone()).or_insert_with(|| r.placement(key)),
        })
    }

    /// [`Replication::slot_placement`], once per batch.
    pub(super) fn raw_slot_placement(&mut self, slot: u32) -> Option<Placement> {
        let r = self.replication.get()?;
        Some(
            *self
                .batch_placements
                .slots
                .entry(slot)
                .or_insert_with(|| r.slot_placement(slot)),
        )
    }

    /// `placement`, with a joining node as the backup once the slot's
    /// snapshot is taken.
    pub(super) fn taken(&self, placement: Option<Placement>) -> Placement {
        match placement {
            None => Placement::Here,
            Some(Placement::Joining {
                slot,
                epoch,
                session,
            }) => {
                let taken = self.joined.contains(&(slot, session))
                    || self.drafts.get(&slot).is_some_and(|d| d.snapshot.is_some());
                if taken {
                    Placement::Replicated { slot, epoch }
                } else {
                    Placement::Here
                }
            }
            Some(p) => p,
        }
    }

    /// Record `op` for the backup of `key`'s slot.
    pub(super) fn record(&mut self, key: &ActorKey, op: impl FnOnce() -> ReplicaOp) {
        let placement = self.placement(key);
        self.record_at(placement, op);
    }

    /// Record `op` for the backup of the slot `placement` names.
    pub(super) fn record_at(&mut self, placement: Placement, op: impl FnOnce() -> ReplicaOp) {
        if let Placement::Replicated { slot, epoch } = placement {
            let draft = self.drafts.entry(slot).or_insert_with(|| Draft {
                epoch,
                ops: Vec::new(),
                snapshot: None,
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
            let last = read_mark(tables.replica_lsn()?, slot)?;
            let mark = ReplicaMark {
                epoch: d.epoch.max(last.epoch),
                lsn: last.lsn + 1,
            };
            tables
                .replica_lsn()?
                .insert(slot, encode(&mark).as_slice())?;

            out.push(ReplicaBatch {
                slot,
                mark,
                ops: d.ops,
                snapshot: d.snapshot,
            });
        }
        Ok(out)
    }

    /// Take a snapshot of `slot` (owned here at `epoch`) for the node
    /// catching up to become its backup: every actor of the slot with all
    /// its rows, first in this batch's shipment of the slot. From here on
    /// the slot's writes go to that node too. Returns the actors.
    pub(super) fn snapshot(
        &mut self,
        tables: &mut Tables<'_>,
        slots: &[(u32, u64, i64)],
    ) -> Result<usize, StorageError> {
        let Some(r) = self.replication.get().cloned() else {
            return Ok(0);
        };
        // One pass over the actors for every slot asked.
        let wanted: BTreeMap<u32, (u64, i64)> = slots
            .iter()
            .map(|&(s, e, session)| (s, (e, session)))
            .collect();
        let in_slots = |k: &ActorKey| wanted.contains_key(&r.slot_of(k));
        let actors = tables.actors_where(in_slots)?;
        let mut ops: BTreeMap<u32, Vec<ReplicaOp>> = BTreeMap::new();
        for (key, record) in &actors {
            let image = tables.actor_image(key, record.clone())?;
            ops.entry(r.slot_of(key))
                .or_default()
                .push(ReplicaOp::Install(Box::new(image)));
        }
        // The slots' outgoing rows (also those of actors deleted since
        // their events were emitted).
        let outgoing = tables.outgoing_where(in_slots)?;
        let slot_of = |ty: &str, id: &str| ActorKey::new(ty, id).map(|k| r.slot_of(&k)).ok();
        for (_, d) in outgoing.deliveries {
            if let Some(slot) = slot_of(&d.actor_type, &d.actor_id) {
                let op = outgoing_ops(vec![d], Vec::new());
                ops.entry(slot).or_default().extend(op);
            }
        }
        for (_, m) in outgoing.relays {
            if let Some(slot) = m.from.as_ref().and_then(|(ty, id)| slot_of(ty, id)) {
                let op = outgoing_ops(Vec::new(), vec![m]);
                ops.entry(slot).or_default().extend(op);
            }
        }
        for (&slot, &(epoch, session)) in &wanted {
            // Writes of the slot already drafted in this batch are in the
            // snapshot (it reads this transaction).
            self.joined_in_batch.push((slot, session));
            self.drafts.insert(
                slot,
                Draft {
                    epoch,
                    ops: ops.remove(&slot).unwrap_or_default(),
                    snapshot: Some(session),
                },
            );
        }
        Ok(actors.len())
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
        let last = read_mark(tables.replica_lsn()?, batch.slot)?;
        if batch.mark <= last {
            return Ok(ReplicaApplied::Repeat);
        }
        if batch.snapshot.is_none()
            && (batch.mark.lsn != last.lsn + 1 || batch.mark.epoch < last.epoch)
        {
            // A batch is missing (the owner committed one it never
            // shipped): this copy cannot follow without a snapshot.
            return Ok(ReplicaApplied::Gap);
        }
        // Checked here, on the writer thread: once this node serves the
        // slot as its new owner it refuses older epochs, and anything it
        // applied before then is in what its actors load (the node passes
        // a writer barrier before serving a slot gained: the host's
        // `cluster/takeover.rs`).
        if !accept() {
            return Ok(ReplicaApplied::Refused);
        }
        if batch.snapshot.is_some()
            && let Some(r) = self.replication.get().cloned()
        {
            // What this node held of the slot (an old copy) goes first.
            let in_slot = |k: &ActorKey| r.slot_of(k) == batch.slot;
            for (key, _) in tables.actors_where(in_slot)? {
                if tables.delete_actor(&key)? {
                    *created -= 1;
                }
            }
            let outgoing = tables.outgoing_where(in_slot)?;
            tables.drop_outgoing(&outgoing)?;
        }
        for op in &batch.ops {
            self.apply_replica_op(tables, batch.slot, op, created)?;
        }
        tables
            .replica_lsn()?
            .insert(batch.slot, encode(&batch.mark).as_slice())?;
        Ok(ReplicaApplied::Applied)
    }

    /// Apply `op` of a batch of `slot` (this node backs the slot up).
    fn apply_replica_op(
        &mut self,
        tables: &mut Tables<'_>,
        slot: u32,
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
                created_at_ms,
            } => {
                let key = key(actor_type, actor_id)?;
                self.get_or_create_at(tables, &key, *version, *created_at_ms, created)?;
            }
            ReplicaOp::Turn(t) => {
                self.replay_turn(tables, t, created)?;
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
                        .idempotency()?
                        .insert((num, k.as_str()), encode(rec).as_slice())?;
                    tables
                        .idem_expiry()?
                        .insert((rec.expires_at_ms, num, k.as_str()), ())?;
                }
                tables
                    .inbox()?
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
                let k = key(actor_type, actor_id)?;
                self.copy_of.remove(&k);
                if tables.delete_actor(&k)? {
                    *created -= 1;
                }
            }
            ReplicaOp::Install(image) => {
                self.install(tables, image, created)?;
                self.copy_of
                    .insert(key(&image.actor_type, &image.actor_id)?, slot);
            }
            ReplicaOp::Delivery { .. } | ReplicaOp::Relay { .. } => {
                self.put_outgoing(tables, op)?;
            }
            ReplicaOp::Moved {
                actor_type,
                actor_id,
                to,
            } => {
                // The actor left `slot`. This node's rows of it may be a
                // newer copy, though: moved on again, it was moved into a
                // slot this node keeps, before this op (held up behind its
                // owner's other writes) arrived. Dropped, they were the
                // actor's only rows there; it then started empty (a probe:
                // counters back at 1 under moves 20 ms apart).
                let k = key(actor_type, actor_id)?;
                if self.copy_of.get(&k).is_none_or(|s| *s == slot) {
                    self.moved_out(tables, &k, *to, created)?;
                }
            }
            ReplicaOp::Stale {
                actor_type,
                actor_id,
                created_at_ms,
            } => {
                let key = key(actor_type, actor_id)?;
                super::moves::dropped_if_stale(tables, &key, *created_at_ms, created)?;
            }
        }
        Ok(())
    }

    /// Write a turn's writes as the owner committed them, under this
    /// node's number for the actor. Returns the number.
    fn replay_turn(
        &mut self,
        tables: &mut Tables<'_>,
        t: &ReplicaTurn,
        created: &mut i64,
    ) -> Result<u64, StorageError> {
        let k = ActorKey::new(&t.actor_type, &t.actor_id).map_err(|e| {
            StorageError::Unavailable(format!("a replicated write names no actor: {e}"))
        })?;
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
        Ok(num)
    }

    /// Write every row of an actor from a snapshot: its rows as one turn's
    /// writes, then its idempotency records, queued messages and outgoing
    /// rows.
    pub(super) fn install(
        &mut self,
        tables: &mut Tables<'_>,
        image: &ActorImage,
        created: &mut i64,
    ) -> Result<(), StorageError> {
        let all = ReplicaTurn {
            actor_type: image.actor_type.clone(),
            actor_id: image.actor_id.clone(),
            record: Some(image.record.clone()),
            state: image
                .state
                .iter()
                .map(|(k, v)| (k.clone(), Some(v.clone())))
                .collect(),
            events: image.events.clone(),
            trim_events_below: None,
            idempotency: None,
            inbox_done: None,
            inbox_update: None,
            alarms: some(&image.alarms),
            inputs: some(&image.inputs),
            files: some(&image.files),
            usage: image.usage,
        };
        let num = self.replay_turn(tables, &all, created)?;
        for (key, rec) in &image.idempotency {
            tables
                .idempotency()?
                .insert((num, key.as_str()), encode(rec).as_slice())?;
            tables
                .idem_expiry()?
                .insert((rec.expires_at_ms, num, key.as_str()), ())?;
        }
        for (seq, message) in &image.inbox {
            tables
                .inbox()?
                .insert((num, *seq), encode(message).as_slice())?;
            self.next_inbox_seq = self.next_inbox_seq.max(seq + 1);
        }
        self.install_outgoing(tables, image)
    }
}

/// Rows as writes of them.
fn some<T: Clone>(rows: &[(String, T)]) -> Vec<(String, Option<T>)> {
    rows.iter()
        .map(|(k, v)| (k.clone(), Some(v.clone())))
        .collect()
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
