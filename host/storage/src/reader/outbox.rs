//! The outbox (webhook deliveries) and the relay (messages to other
//! nodes' actors), read.

use std::ops::ControlFlow;

use redb::{ReadableTable, ReadableTableMetadata};

use super::Reader;
use crate::StorageError;
use crate::schema::*;

/// Outbox rows by seq, and the seq to continue after (`None`: the end).
pub type DeliveryPage = (Vec<(u64, DeliveryRecord)>, Option<u64>);

/// What [`Reader::scan_deliveries_due`] found.
#[derive(Debug, Default)]
pub struct DueScan {
    /// The rows taken, whole, in due order.
    pub taken: Vec<(u64, DeliveryRecord)>,
    /// Where the next walk continues, if this one did not reach the end.
    pub resume: Option<(u64, u64)>,
}

/// Webhook deliveries waiting or done.
impl Reader {
    /// Walk the outbox rows due by `now_ms` in due order, from `from` (a
    /// key of the due index; `(0, 0)` is the start), showing each row's
    /// [`DeliveryHead`] to `visit`, which takes the row (`Continue(true)`),
    /// steps over it, or ends the walk. At most `examine` rows are read.
    /// Returns the rows taken, whole, and the key to continue from when
    /// the budget ran out first or `visit` ended the walk. Only taken rows
    /// are read whole, the others' heads from [`OUTBOX_HEADS`]: a walk over
    /// thousands of rows due to a receiver at its limit used to read every
    /// payload, on every wake-up of the worker.
    pub fn scan_deliveries_due(
        &self,
        now_ms: u64,
        from: (u64, u64),
        examine: usize,
        mut visit: impl FnMut(u64, &DeliveryHead) -> ControlFlow<(), bool>,
    ) -> Result<DueScan, StorageError> {
        let due = self.txn.open_table(OUTBOX_DUE)?;
        let heads = self.txn.open_table(OUTBOX_HEADS)?;
        let outbox = self.txn.open_table(OUTBOX)?;
        let mut scan = DueScan::default();
        for (examined, row) in due.range(from..=(now_ms, u64::MAX))?.enumerate() {
            let (k, _) = row?;
            if examined == examine {
                scan.resume = Some(k.value());
                break;
            }
            let (_, seq) = k.value();
            // Only the rows taken are read whole: the others cost their
            // head (a hundred bytes), not their payload.
            if let Some(v) = heads.get(seq)? {
                let head: DeliveryHead = decode("delivery head", v.value())?;
                match visit(seq, &head) {
                    ControlFlow::Continue(false) => {}
                    ControlFlow::Continue(true) => {
                        if let Some(v) = outbox.get(seq)? {
                            scan.taken.push((seq, decode("delivery", v.value())?));
                        }
                    }
                    ControlFlow::Break(()) => {
                        // The next walk starts at this row, not at the
                        // start (past every row of a hanging destination
                        // again).
                        scan.resume = Some(k.value());
                        break;
                    }
                }
            }
        }
        Ok(scan)
    }

    /// Outbox rows due by `now_ms` that `mine` accepts (in a cluster, the
    /// rows of slots this node owns: a backup's copies wait), earliest
    /// first, at most `limit`: one walk of [`Self::scan_deliveries_due`]
    /// (the delivery worker walks with its own choices).
    #[cfg(test)]
    pub fn deliveries_due(
        &self,
        now_ms: u64,
        limit: usize,
        mine: impl Fn(&DeliveryHead) -> bool,
    ) -> Result<Vec<(u64, DeliveryRecord)>, StorageError> {
        if limit == 0 {
            return Ok(Vec::new());
        }
        let mut n = 0;
        let scan = self.scan_deliveries_due(now_ms, (0, 0), usize::MAX, |_, head| {
            if n == limit {
                return ControlFlow::Break(());
            }
            let take = mine(head);
            n += usize::from(take);
            ControlFlow::Continue(take)
        })?;
        Ok(scan.taken)
    }

    /// Panics unless [`OUTBOX_HEADS`] holds exactly the head of every
    /// [`OUTBOX`] row, under the same seq (the writer keeps them in step).
    #[cfg(test)]
    pub fn assert_outbox_heads_in_step(&self) {
        let outbox = self.txn.open_table(OUTBOX).unwrap();
        let rows: Vec<(u64, DeliveryHead)> = (outbox.iter().unwrap())
            .map(|row| {
                let (k, v) = row.unwrap();
                let rec: DeliveryRecord = decode("delivery", v.value()).unwrap();
                (k.value(), rec.head())
            })
            .collect();
        let heads = self.txn.open_table(OUTBOX_HEADS).unwrap();
        let kept: Vec<(u64, DeliveryHead)> = (heads.iter().unwrap())
            .map(|row| {
                let (k, v) = row.unwrap();
                (k.value(), decode("delivery head", v.value()).unwrap())
            })
            .collect();
        assert_eq!(kept, rows, "outbox heads out of step with the outbox");
    }

    /// When the first pending delivery due after `after_ms` is due.
    pub fn next_delivery_due_after(&self, after_ms: u64) -> Result<Option<u64>, StorageError> {
        let due = self.txn.open_table(OUTBOX_DUE)?;
        let next = due.range((after_ms.saturating_add(1), 0)..)?.next();
        Ok(match next {
            Some(row) => Some(row?.0.value().0),
            None => None,
        })
    }

    /// Pending deliveries (the webhook queue's depth).
    pub fn pending_deliveries(&self) -> Result<u64, StorageError> {
        Ok(self.txn.open_table(OUTBOX_DUE)?.len()?)
    }

    /// Outbox rows after `after_seq`, oldest first, that `keep` accepts; at
    /// most `limit`, scanning at most 10,000 rows.
    pub fn deliveries(
        &self,
        after_seq: u64,
        limit: usize,
        keep: impl Fn(&DeliveryRecord) -> bool,
    ) -> Result<DeliveryPage, StorageError> {
        let t = self.txn.open_table(OUTBOX)?;
        let mut out = Vec::new();
        let mut scanned = 0;
        for row in t.range(after_seq.saturating_add(1)..)? {
            let (k, v) = row?;
            let seq = k.value();
            scanned += 1;
            let rec: DeliveryRecord = decode("delivery", v.value())?;
            if keep(&rec) {
                out.push((seq, rec));
                if out.len() == limit {
                    return Ok((out, Some(seq)));
                }
            }
            if scanned == 10_000 {
                return Ok((out, Some(seq)));
            }
        }
        Ok((out, None))
    }

    /// The outbox row whose `webhook-id` is `id`.
    pub fn delivery_by_id(&self, id: &str) -> Result<Option<DeliveryRecord>, StorageError> {
        let ids = self.txn.open_table(OUTBOX_IDS)?;
        match ids.get(id)? {
            Some(seq) => self.delivery(seq.value()),
            None => Ok(None),
        }
    }

    /// One outbox row.
    pub fn delivery(&self, seq: u64) -> Result<Option<DeliveryRecord>, StorageError> {
        let t = self.txn.open_table(OUTBOX)?;
        match t.get(seq)? {
            Some(v) => Ok(Some(decode("delivery", v.value())?)),
            None => Ok(None),
        }
    }
}

/// Messages sent by this node's actors in a cluster, waiting to be handed
/// to their recipients' owners.
impl Reader {
    /// Up to `limit` relayed messages that `mine` accepts (in a cluster,
    /// those sent by actors of slots this node owns, to recipients it may
    /// try now), oldest first.
    pub fn relay_page(
        &self,
        limit: usize,
        mine: impl Fn(&RelayRecord) -> bool,
    ) -> Result<Vec<(u64, RelayRecord)>, StorageError> {
        let relay = self.txn.open_table(RELAY)?;
        let mut out = Vec::new();
        for row in relay.iter()? {
            if out.len() == limit {
                break;
            }
            let (k, v) = row?;
            let rec = decode("relay", v.value())?;
            if mine(&rec) {
                out.push((k.value(), rec));
            }
        }
        Ok(out)
    }
}
