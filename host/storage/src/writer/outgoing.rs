//! An actor's outgoing rows in the writer: outbound webhook deliveries
//! ([`OUTBOX`]) and messages waiting for the relay ([`RELAY`]).
//!
//! Each node numbers these rows with its own seqs; a row's public id (its
//! `webhook-id`, its message's id) is the same on every node that keeps a
//! copy, so the owner of the sending actor's slot tells the slot's backup
//! what became of a row by its id ([`ReplicaOp::Delivery`],
//! [`ReplicaOp::Relay`]). Only the owner sends them (the workers ask
//! [`super::Writer::sends_for`]); the backup's copies are there for the day
//! it becomes the owner. A move carries the actor's rows, a slot's snapshot
//! the slot's.

use marmot_core::clock::now_ms;
use marmot_core::ids::ActorKey;
use redb::ReadableTable;

use super::WriterState;
use super::tables::Tables;
use crate::StorageError;
use crate::schema::*;

/// Dead rows removed by one [`WriterState::prune_dead_deliveries`].
const PRUNE_AT_ONCE: usize = 10_000;

/// Outgoing rows, with their seqs on this node.
#[derive(Default)]
pub(super) struct Outgoing {
    pub(super) deliveries: Vec<(u64, DeliveryRecord)>,
    pub(super) relays: Vec<(u64, RelayRecord)>,
}

impl Tables<'_> {
    /// One outbox row.
    pub(super) fn delivery(&mut self, seq: u64) -> Result<Option<DeliveryRecord>, StorageError> {
        match self.outbox()?.get(seq)? {
            Some(v) => Ok(Some(decode("delivery", v.value())?)),
            None => Ok(None),
        }
    }

    /// Write or remove outbox row `seq`, keeping its head, the due index
    /// and the ids in step.
    pub(super) fn write_delivery(
        &mut self,
        seq: u64,
        rec: Option<&DeliveryRecord>,
    ) -> Result<(), StorageError> {
        let mut same_head = false;
        if let Some(old) = self.delivery(seq)? {
            if old.status == DeliveryStatus::Pending {
                self.outbox_due()?.remove((old.next_attempt_ms, seq))?;
            }
            same_head = rec.is_some_and(|r| r.head() == old.head());
            if rec.is_none_or(|r| r.webhook_id != old.webhook_id) {
                self.outbox_ids()?.remove(old.webhook_id.as_str())?;
            }
        }
        match rec {
            Some(r) => {
                self.outbox()?.insert(seq, encode(r).as_slice())?;
                if !same_head {
                    self.outbox_heads()?
                        .insert(seq, encode(&r.head()).as_slice())?;
                }
                if r.status == DeliveryStatus::Pending {
                    self.outbox_due()?.insert((r.next_attempt_ms, seq), ())?;
                }
                self.outbox_ids()?.insert(r.webhook_id.as_str(), seq)?;
            }
            None => {
                self.outbox()?.remove(seq)?;
                self.outbox_heads()?.remove(seq)?;
            }
        }
        Ok(())
    }

    /// The seqs and heads of the outbox rows `pick` selects, read from
    /// [`OUTBOX_HEADS`] (not the rows and their payloads).
    fn delivery_heads_where(
        &mut self,
        pick: impl Fn(&DeliveryHead) -> bool,
    ) -> Result<Vec<(u64, DeliveryHead)>, StorageError> {
        let mut out = Vec::new();
        for row in self.outbox_heads()?.iter()? {
            let (k, v) = row?;
            let head: DeliveryHead = decode("delivery head", v.value())?;
            if pick(&head) {
                out.push((k.value(), head));
            }
        }
        Ok(out)
    }

    /// Write or remove the outbox row whose `webhook-id` is `id`, under
    /// its seq here or (new) the next one.
    pub(super) fn put_delivery(
        &mut self,
        id: &str,
        rec: Option<&DeliveryRecord>,
        next_seq: &mut u64,
    ) -> Result<(), StorageError> {
        let seq = match self.outbox_ids()?.get(id)? {
            Some(v) => v.value(),
            None if rec.is_none() => return Ok(()),
            None => {
                *next_seq += 1;
                *next_seq - 1
            }
        };
        self.write_delivery(seq, rec)
    }

    /// Make the delivery `id` due now with a fresh schedule; the row, if
    /// it exists.
    pub(super) fn retry_delivery(
        &mut self,
        id: &str,
    ) -> Result<Option<(u64, DeliveryRecord)>, StorageError> {
        let Some(seq) = self.outbox_ids()?.get(id)?.map(|v| v.value()) else {
            return Ok(None);
        };
        let Some(mut rec) = self.delivery(seq)? else {
            return Ok(None);
        };
        // A dead delivery replayed gets its whole schedule again; one still
        // being retried is only tried now, its attempts kept (they were
        // reset too, so each call put off its dead-lettering and the
        // attempt numbers in the logs started over: a probe).
        if rec.status == DeliveryStatus::Dead {
            rec.attempts = 0;
        }
        rec.status = DeliveryStatus::Pending;
        // Never the due time it had: an attempt in flight tells a retry by
        // it (`delivery_attempted`), so 1 ms later when it was now.
        let now = now_ms();
        rec.next_attempt_ms = if rec.next_attempt_ms == now {
            now + 1
        } else {
            now
        };
        self.write_delivery(seq, Some(&rec))?;
        Ok(Some((seq, rec)))
    }

    /// Add relay row `seq`.
    pub(super) fn insert_relay(&mut self, seq: u64, rec: &RelayRecord) -> Result<(), StorageError> {
        self.relay()?.insert(seq, encode(rec).as_slice())?;
        self.relay_ids()?
            .insert(rec.message.message_id.as_str(), seq)?;
        Ok(())
    }

    /// Remove relay row `seq`; the row, if it was there.
    pub(super) fn remove_relay(&mut self, seq: u64) -> Result<Option<RelayRecord>, StorageError> {
        let rec: RelayRecord = {
            let Some(v) = self.relay()?.remove(seq)? else {
                return Ok(None);
            };
            decode("relay", v.value())?
        };
        self.relay_ids()?.remove(rec.message.message_id.as_str())?;
        Ok(Some(rec))
    }

    /// Add (`Some`) or remove the relay row of message `id`, under its seq
    /// here or (new) the next one.
    pub(super) fn put_relay(
        &mut self,
        id: &str,
        rec: Option<&RelayRecord>,
        next_seq: &mut u64,
    ) -> Result<(), StorageError> {
        let seq = self.relay_ids()?.get(id)?.map(|v| v.value());
        match (seq, rec) {
            (Some(seq), None) => {
                self.remove_relay(seq)?;
            }
            (Some(seq), Some(rec)) => self.insert_relay(seq, rec)?,
            (None, Some(rec)) => {
                self.insert_relay(*next_seq, rec)?;
                *next_seq += 1;
            }
            (None, None) => {}
        }
        Ok(())
    }

    /// The outgoing rows of the actors `pick` selects: one pass over each
    /// table (relay rows written before their sender was recorded belong
    /// to no actor).
    pub(super) fn outgoing_where(
        &mut self,
        pick: impl Fn(&ActorKey) -> bool,
    ) -> Result<Outgoing, StorageError> {
        let picked = |ty: &str, id: &str| ActorKey::new(ty, id).is_ok_and(|k| pick(&k));
        let mut out = Outgoing::default();
        for (seq, _) in self.delivery_heads_where(|h| picked(&h.actor_type, &h.actor_id))? {
            if let Some(rec) = self.delivery(seq)? {
                out.deliveries.push((seq, rec));
            }
        }
        for row in self.relay()?.iter()? {
            let (k, v) = row?;
            let rec: RelayRecord = decode("relay", v.value())?;
            if rec.from.as_ref().is_some_and(|(ty, id)| picked(ty, id)) {
                out.relays.push((k.value(), rec));
            }
        }
        Ok(out)
    }

    /// Remove `rows`.
    pub(super) fn drop_outgoing(&mut self, rows: &Outgoing) -> Result<(), StorageError> {
        for (seq, _) in &rows.deliveries {
            self.write_delivery(*seq, None)?;
        }
        for (seq, _) in &rows.relays {
            self.remove_relay(*seq)?;
        }
        Ok(())
    }
}

impl WriterState {
    /// Record what became of delivery `id` for the backup of its actor's
    /// slot.
    fn record_delivery(&mut self, of: &DeliveryHead, record: Option<DeliveryRecord>) {
        if let Ok(key) = ActorKey::new(&of.actor_type, &of.actor_id) {
            self.record(&key, || ReplicaOp::Delivery {
                webhook_id: of.webhook_id.clone(),
                record,
            });
        }
    }

    /// A new outbox row `seq` (written by its actor's turn).
    pub(super) fn add_delivery(
        &mut self,
        tables: &mut Tables<'_>,
        seq: u64,
        rec: DeliveryRecord,
    ) -> Result<(), StorageError> {
        tables.write_delivery(seq, Some(&rec))?;
        self.outbox_touched = true;
        self.record_delivery(&rec.head(), Some(rec));
        Ok(())
    }

    /// The outcome of an attempt at row `seq` (`None`: delivered, or no
    /// longer wanted). A row that is gone, or was replaced, was moved away
    /// or dropped while it was attempted: nothing to write. A failure is
    /// not written over a row changed since the attempt read it as
    /// `read_as` (its attempts and due time): a retry asked for meanwhile
    /// stands. (One asked for during the last allowed attempt was answered
    /// 202 and then undone: the row went dead; a probe.)
    pub(super) fn delivery_attempted(
        &mut self,
        tables: &mut Tables<'_>,
        seq: u64,
        update: Option<DeliveryRecord>,
        read_as: Option<(u32, u64)>,
    ) -> Result<(), StorageError> {
        let Some(old) = tables.delivery(seq)? else {
            return Ok(());
        };
        if let Some(u) = &update
            && (u.webhook_id != old.webhook_id
                || read_as.is_some_and(|r| r != (old.attempts, old.next_attempt_ms)))
        {
            return Ok(());
        }
        self.outbox_touched = true;
        tables.write_delivery(seq, update.as_ref())?;
        self.record_delivery(&old.head(), update);
        Ok(())
    }

    /// Remove every outbox row of subscription `name` (pending or dead),
    /// for the backups of their actors' slots too.
    pub(super) fn drop_deliveries_of(
        &mut self,
        tables: &mut Tables<'_>,
        name: &str,
    ) -> Result<(), StorageError> {
        let rows = tables.delivery_heads_where(|h| h.subscription == name)?;
        self.drop_deliveries(tables, &rows)
    }

    /// Remove outbox `rows` (seq and head), for the backups of their
    /// actors' slots too.
    fn drop_deliveries(
        &mut self,
        tables: &mut Tables<'_>,
        rows: &[(u64, DeliveryHead)],
    ) -> Result<(), StorageError> {
        for (seq, head) in rows {
            tables.write_delivery(*seq, None)?;
            self.record_delivery(head, None);
        }
        if !rows.is_empty() {
            self.outbox_touched = true;
        }
        Ok(())
    }

    /// Remove the dead rows of events made before `before_ms`, for the
    /// backups of their actors' slots too: at most [`PRUNE_AT_ONCE`] per
    /// call. Rows are walked in seq order, about the order they were made
    /// in, and the walk ends at the first row made since `before_ms` (a
    /// copy that came later with an older event waits for a later walk).
    pub(super) fn prune_dead_deliveries(
        &mut self,
        tables: &mut Tables<'_>,
        before_ms: u64,
    ) -> Result<u64, StorageError> {
        let mut dead = Vec::new();
        for row in tables.outbox()?.iter()? {
            let (k, v) = row?;
            let rec: DeliveryRecord = decode("delivery", v.value())?;
            if rec.created_at_ms >= before_ms || dead.len() == PRUNE_AT_ONCE {
                break;
            }
            if rec.status == DeliveryStatus::Dead {
                dead.push((k.value(), rec.head()));
            }
        }
        self.drop_deliveries(tables, &dead)?;
        Ok(dead.len() as u64)
    }

    /// Make delivery `id` due now (replay); the row, if it exists.
    pub(super) fn retry_delivery(
        &mut self,
        tables: &mut Tables<'_>,
        id: &str,
    ) -> Result<Option<DeliveryRecord>, StorageError> {
        let Some((_, rec)) = tables.retry_delivery(id)? else {
            return Ok(None);
        };
        self.outbox_touched = true;
        self.record_delivery(&rec.head(), Some(rec.clone()));
        Ok(Some(rec))
    }

    /// Queue a message `from` sent for the relay.
    pub(super) fn add_relay(
        &mut self,
        tables: &mut Tables<'_>,
        from: &ActorKey,
        rec: RelayRecord,
    ) -> Result<(), StorageError> {
        tables.insert_relay(self.next_relay_seq, &rec)?;
        self.next_relay_seq += 1;
        self.relay_touched = true;
        self.record(from, || ReplicaOp::Relay {
            message_id: rec.message.message_id.clone(),
            record: Some(rec),
        });
        Ok(())
    }

    /// Forget relayed messages handed over.
    pub(super) fn relay_done(
        &mut self,
        tables: &mut Tables<'_>,
        seqs: &[u64],
    ) -> Result<(), StorageError> {
        for &seq in seqs {
            let Some(rec) = tables.remove_relay(seq)? else {
                continue;
            };
            if let Some(key) = rec
                .from
                .as_ref()
                .and_then(|(ty, id)| ActorKey::new(ty, id).ok())
            {
                self.record(&key, || ReplicaOp::Relay {
                    message_id: rec.message.message_id.clone(),
                    record: None,
                });
            }
        }
        Ok(())
    }

    /// Apply a replicated outgoing row (on a backup, or a move's target).
    pub(super) fn put_outgoing(
        &mut self,
        tables: &mut Tables<'_>,
        op: &ReplicaOp,
    ) -> Result<(), StorageError> {
        match op {
            ReplicaOp::Delivery { webhook_id, record } => {
                tables.put_delivery(webhook_id, record.as_ref(), &mut self.next_delivery_seq)?;
                self.outbox_touched = true;
            }
            ReplicaOp::Relay { message_id, record } => {
                tables.put_relay(message_id, record.as_ref(), &mut self.next_relay_seq)?;
                self.relay_touched = true;
            }
            _ => {}
        }
        Ok(())
    }

    /// The outgoing rows of `image`'s actor, to install.
    pub(super) fn install_outgoing(
        &mut self,
        tables: &mut Tables<'_>,
        image: &ActorImage,
    ) -> Result<(), StorageError> {
        for r in &image.deliveries {
            tables.put_delivery(&r.webhook_id, Some(r), &mut self.next_delivery_seq)?;
            self.outbox_touched = true;
        }
        for r in &image.relays {
            tables.put_relay(&r.message.message_id, Some(r), &mut self.next_relay_seq)?;
            self.relay_touched = true;
        }
        Ok(())
    }
}

/// Rows as the replication ops that write them.
pub(super) fn outgoing_ops(
    deliveries: Vec<DeliveryRecord>,
    relays: Vec<RelayRecord>,
) -> impl Iterator<Item = ReplicaOp> {
    let d = deliveries.into_iter().map(|r| ReplicaOp::Delivery {
        webhook_id: r.webhook_id.clone(),
        record: Some(r),
    });
    let r = relays.into_iter().map(|r| ReplicaOp::Relay {
        message_id: r.message.message_id.clone(),
        record: Some(r),
    });
    d.chain(r)
}
