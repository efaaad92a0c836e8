//! Rebalancing: an operator's request (`POST /v1/cluster/rebalance`, kept
//! in etcd until the controller has moved every used slot to the preferred
//! node of its region: `controller::rebalance`), and handing a slot to its
//! backup while both are alive, on the owner's side.
//!
//! The controller asks (`SlotRecord::handoff`); the owner
//! fences the slot — its writer refuses the slot's commits, and requests
//! for it wait — lets every commit made before reach the backup (a barrier
//! through the writer: its release follows theirs), then writes the switch
//! itself by compare-and-swap: the backup becomes the owner at epoch + 1
//! and this node its backup, with the same rows and replication marks, so
//! the new owner's first batch follows on. If this node dies half-way, the
//! backup takes over by an ordinary failover; if the switch fails, the
//! fence is lifted and the slot goes on here.

use std::collections::BTreeSet;
use std::sync::Mutex;
use std::sync::atomic::{AtomicUsize, Ordering};

use etcd_client::PutOptions;

use super::records::{RebalanceRecord, SlotRecord};
use super::{Cluster, ETCD_CALL, controller, within};

/// Slots being handed over, read on every commit: a count first, so that
/// the common case (none) takes no lock.
#[derive(Default)]
pub(super) struct Draining {
    count: AtomicUsize,
    slots: Mutex<BTreeSet<u32>>,
}

impl Draining {
    pub(super) fn contains(&self, slot: u32) -> bool {
        self.count.load(Ordering::Acquire) > 0 && self.lock().contains(&slot)
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, BTreeSet<u32>> {
        self.slots.lock().unwrap_or_else(|p| p.into_inner())
    }
}

impl Cluster {
    /// Ask the controller to rebalance; how many used slots are not on
    /// the preferred node of their region now.
    pub async fn request_rebalance(&self) -> anyhow::Result<usize> {
        let record = RebalanceRecord {
            requested_at_ms: crate::clock::now_ms(),
            by: self.inner.config.node_id.clone(),
        };
        let mut client = self.inner.client.clone();
        let put = client.put(
            self.inner.keys.rebalance(),
            serde_json::to_vec(&record)?,
            None::<PutOptions>,
        );
        within(ETCD_CALL, put).await?;
        Ok(self.slots_to_move())
    }

    /// Used slots not on the preferred node of their region.
    pub fn slots_to_move(&self) -> usize {
        controller::slots_to_move(&self.inner.view())
    }

    /// The rebalance under way, as `GET /v1/cluster` shows it.
    pub(super) fn rebalance_status(&self, v: &super::View) -> serde_json::Value {
        match &v.rebalance {
            None => serde_json::Value::Null,
            Some((r, _)) => serde_json::json!({
                "requested_at_ms": r.requested_at_ms,
                "by": r.by,
                "slots_to_move": controller::slots_to_move(v),
                "handoffs": v.slots.iter().flatten().filter(|e| e.record.handoff.is_some()).count(),
            }),
        }
    }

    /// Slots this node owns that the controller asks it to hand to their
    /// backup, and are not being handed over yet: (slot, epoch, to).
    pub fn handoffs_asked(&self) -> Vec<(u32, u64, String)> {
        // A stopping node hands its slots over itself, naming no backup
        // (a rebalance's handoff would name it).
        if self.is_leaving() {
            return Vec::new();
        }
        let mut asked = self
            .owned_slots_to(|_, r| r.handoff.clone().filter(|to| r.backup.as_ref() == Some(to)));
        asked.retain(|(slot, _, _)| !self.inner.draining.contains(*slot));
        asked
    }

    /// (slot, epoch, to) for each slot this node owns for which `to_of`
    /// names a node.
    fn owned_slots_to(
        &self,
        to_of: impl Fn(&super::View, &SlotRecord) -> Option<String>,
    ) -> Vec<(u32, u64, String)> {
        let v = self.inner.view();
        let me = &self.inner.config.node_id;
        v.slots
            .iter()
            .enumerate()
            .filter_map(|(slot, e)| {
                let r = &e.as_ref()?.record;
                let to = (r.owner == *me).then(|| to_of(&v, r)).flatten()?;
                Some((slot as u32, r.epoch, to))
            })
            .collect()
    }

    /// Fence `slot` for a handoff; `false` if it is fenced already.
    pub fn start_drain(&self, slot: u32) -> bool {
        let d = &self.inner.draining;
        let added = d.lock().insert(slot);
        if added {
            d.count.fetch_add(1, Ordering::AcqRel);
        }
        added
    }

    /// Lift `slot`'s fence.
    pub fn end_drain(&self, slot: u32) {
        let d = &self.inner.draining;
        if d.lock().remove(&slot) {
            d.count.fetch_sub(1, Ordering::AcqRel);
        }
        self.inner.changed.notify_waiters();
    }

    /// Whether `slot` is being handed over by this node (requests for it
    /// wait for the switch).
    pub fn draining(&self, slot: u32) -> bool {
        self.inner.draining.contains(slot)
    }

    /// At a graceful stop: the slots this node owns whose backup is a live
    /// member, to hand over before it leaves: (slot, epoch, backup).
    pub fn slots_to_hand_over_at_stop(&self) -> Vec<(u32, u64, String)> {
        self.owned_slots_to(|v, r| r.backup.clone().filter(|to| v.members.contains_key(to)))
    }

    /// Switch `slot` (owned here at `epoch`, drained) to its backup `to` as
    /// this node stops: `to` owns it at epoch + 1, without a backup until
    /// the controller finds it one. This node is leaving: named the
    /// backup, it would stall the new owner's commits until dropped. It is
    /// the slot's `avoid`, because the controller, which still counts it
    /// live until its member key goes, would otherwise choose it again (it
    /// did: ~2.3 s without answers after every graceful stop).
    pub async fn hand_off_at_stop(&self, slot: u32, epoch: u64, to: &str) -> anyhow::Result<bool> {
        let me = self.inner.config.node_id.clone();
        self.rewrite_slot(slot, epoch, None, |r| {
            (r.backup.as_deref() == Some(to)).then(|| SlotRecord {
                owner: to.to_owned(),
                epoch: epoch + 1,
                used: r.used,
                backup: None,
                joining: None,
                avoid: Some(me.clone()),
                handoff: None,
                region: r.region.clone(),
            })
        })
        .await
    }

    /// Switch `slot` (owned here at `epoch`, drained) to its backup `to`,
    /// this node becoming the backup. `false` if the slot changed meanwhile
    /// (the handoff was withdrawn, the backup dropped).
    pub async fn hand_off(&self, slot: u32, epoch: u64, to: &str) -> anyhow::Result<bool> {
        let me = self.inner.config.node_id.clone();
        self.rewrite_slot(slot, epoch, None, |r| {
            (r.handoff.as_deref() == Some(to) && r.backup.as_deref() == Some(to)).then(|| {
                SlotRecord {
                    owner: to.to_owned(),
                    epoch: epoch + 1,
                    used: true,
                    backup: Some(me.clone()),
                    joining: None,
                    avoid: None,
                    handoff: None,
                    region: r.region.clone(),
                }
            })
        })
        .await
    }
}
