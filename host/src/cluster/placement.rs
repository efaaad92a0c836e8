//! Actors placed near their users: which slot an actor lives in (its hash
//! slot unless a placement entry says otherwise), which slots a region
//! has, and the two compare-and-swap writes of a move — its start (the
//! actor is fenced where it is) and its switch (the actor lives in its new
//! slot from that revision on). An entry that would name the actor's hash
//! slot is deleted instead: etcd holds only the exceptions.
//! docs/design.md "Placement and moves".

use std::collections::BTreeSet;
use std::time::Duration;

use etcd_client::{Compare, CompareOp, Txn, TxnOp};

use super::records::{PlacementRecord, hash_slot, score};
use super::view::{PlacementEntry, SlotEntry, View};
use super::{Cluster, ETCD_CALL, within};
use crate::ids::ActorKey;

/// A move this node started: the revision of its placement entry, which
/// the switch (or the undo) compares against.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct MoveStarted {
    /// The slot the actor leaves.
    pub from: u32,
    /// Its epoch.
    pub epoch: u64,
    revision: i64,
}

impl Cluster {
    /// The slot `key` lives in.
    pub fn slot_of(&self, key: &ActorKey) -> u32 {
        self.inner.view().slot_of(key)
    }

    /// The node moving `key` out of its slot, while a move is under way.
    pub fn moving(&self, key: &ActorKey) -> Option<String> {
        let v = self.inner.view();
        v.placements.get(key).and_then(|e| e.record.moving.clone())
    }

    /// Whether `key` has a placement entry (it was placed or moved once).
    pub fn placed(&self, key: &ActorKey) -> bool {
        self.inner.view().placements.contains_key(key)
    }

    /// Whether this node answers for `key` in a listing: it owns the
    /// actor's slot, or backs it up while its owner is gone (a failover
    /// under way). Copies a node keeps otherwise — of a slot it used to
    /// own or back up, rows a crashed move left — are not the actor's.
    pub fn lists(&self, key: &ActorKey) -> bool {
        let v = self.inner.view();
        let slot = v.slot_of(key);
        let me = &self.inner.config.node_id;
        v.slots[slot as usize].as_ref().is_some_and(|e| {
            &e.record.owner == me
                || (e.record.backup.as_ref() == Some(me)
                    && !v.members.contains_key(&e.record.owner))
        })
    }

    /// The slot `key` lives in without a placement entry.
    pub fn hash_slot(&self, key: &ActorKey) -> u32 {
        hash_slot(key)
    }

    /// Placement entries of slots this node owns, with no move under way:
    /// (actor, the entry's revision). The sweep of entries whose actor is
    /// gone starts from these.
    pub fn placements_owned(&self) -> Vec<(ActorKey, i64)> {
        let v = self.inner.view();
        let me = &self.inner.config.node_id;
        v.placements
            .iter()
            .filter(|(_, e)| {
                e.record.moving.is_none()
                    && v.slots[e.record.slot as usize]
                        .as_ref()
                        .is_some_and(|s| &s.record.owner == me)
            })
            .map(|(k, e)| (k.clone(), e.mod_revision))
            .collect()
    }

    /// The regions of the live members.
    pub fn regions(&self) -> BTreeSet<String> {
        let v = self.inner.view();
        v.members.values().map(|m| m.region.clone()).collect()
    }

    /// The region of `slot`: its owner's, while the owner is a live member
    /// and the slot is at home there. A slot a failover took to another
    /// region is in neither: it runs in one and a rebalance takes it back
    /// to the other, so an actor that asks for either is placed in a slot
    /// at home in its region.
    pub fn region_of_slot(&self, slot: u32) -> Option<String> {
        let v = self.inner.view();
        region_at_home(&v, v.slots[slot as usize].as_ref()?).map(str::to_owned)
    }

    /// The slot of `region` that `key` goes to when placed there: of the
    /// slots at home in `region` with a live owner there, the one with the
    /// highest rendezvous score for the actor (so the choice spreads
    /// actors over the region's nodes). `None`: no live node there.
    pub fn slot_in_region(&self, key: &ActorKey, region: &str) -> Option<u32> {
        let v = self.inner.view();
        let name = format!("{}\0{}", key.ty(), key.id());
        v.slots
            .iter()
            .enumerate()
            .filter_map(|(i, e)| (region_at_home(&v, e.as_ref()?)? == region).then_some(i as u32))
            .max_by_key(|slot| score(*slot, &name))
    }

    /// Start moving `key` out of `slot` (owned here at `epoch`): its
    /// placement entry names this node as moving it, which fences the
    /// actor — its requests wait, its commits are refused — on every node.
    /// Written only if the slot is still this node's at `epoch` and the
    /// entry is as this node last saw it; `None` otherwise.
    pub async fn start_move(
        &self,
        key: &ActorKey,
        slot: u32,
        epoch: u64,
    ) -> anyhow::Result<Option<MoveStarted>> {
        let inner = &self.inner;
        let (slot_revision, entry) = {
            let v = inner.view();
            let Some(e) = v.slots[slot as usize]
                .as_ref()
                .filter(|e| e.record.owner == inner.config.node_id && e.record.epoch == epoch)
            else {
                return Ok(None);
            };
            (e.mod_revision, v.placements.get(key).cloned())
        };
        if entry
            .as_ref()
            .is_some_and(|e| e.record.slot != slot || e.record.moving.is_some())
        {
            return Ok(None);
        }
        let record = PlacementRecord {
            slot,
            moving: Some(inner.config.node_id.clone()),
        };
        let slot_key = inner.keys.slot(slot);
        let guard = Compare::mod_revision(slot_key, CompareOp::Equal, slot_revision);
        let revision = self
            .write_placement(key, entry, record, Some(guard))
            .await?;
        Ok(revision.map(|revision| MoveStarted {
            from: slot,
            epoch,
            revision,
        }))
    }

    /// End the move `started`: the actor lives in `to` from now on (the
    /// switch), or stays where it was (`to == started.from`, an undo).
    /// `false`: someone else ended it meanwhile (the slot's next owner
    /// undid it after this node lost the slot).
    pub async fn end_move(
        &self,
        key: &ActorKey,
        started: MoveStarted,
        to: u32,
    ) -> anyhow::Result<bool> {
        let entry = PlacementEntry {
            record: PlacementRecord {
                slot: started.from,
                moving: Some(self.inner.config.node_id.clone()),
            },
            mod_revision: started.revision,
        };
        self.settle(key, entry, to).await
    }

    /// Undo a move some other node started out of `slot`, which this node
    /// now owns (that node lost the slot before the switch: the actor's
    /// rows in `slot` are what counts).
    pub async fn undo_stale_move(&self, key: &ActorKey, slot: u32) -> anyhow::Result<bool> {
        let entry = self.inner.view().placements.get(key).cloned();
        let Some(entry) = entry.filter(|e| e.record.slot == slot && e.record.moving.is_some())
        else {
            return Ok(false);
        };
        self.settle(key, entry, slot).await
    }

    /// Replace `expected` (a fence) by "`key` lives in `slot`": an entry
    /// naming `slot`, or none when `slot` is the actor's hash slot.
    async fn settle(
        &self,
        key: &ActorKey,
        expected: PlacementEntry,
        slot: u32,
    ) -> anyhow::Result<bool> {
        if slot == hash_slot(key) {
            return self.delete_placement(key, expected).await;
        }
        let record = PlacementRecord { slot, moving: None };
        Ok(self
            .write_placement(key, Some(expected), record, None)
            .await?
            .is_some())
    }

    /// Delete `key`'s entry by compare-and-swap against `expected`. A
    /// delete is not noted in the view at once (a late watch event of an
    /// earlier write would bring the entry back): this waits until the
    /// watch has passed the delete, or re-reads the view.
    async fn delete_placement(
        &self,
        key: &ActorKey,
        expected: PlacementEntry,
    ) -> anyhow::Result<bool> {
        let inner = &self.inner;
        let etcd_key = inner.keys.placement(key);
        let txn = Txn::new()
            .when([Compare::mod_revision(
                etcd_key.clone(),
                CompareOp::Equal,
                expected.mod_revision,
            )])
            .and_then([TxnOp::delete(etcd_key, None)]);
        let resp = within(ETCD_CALL, inner.client.clone().txn(txn)).await?;
        if !resp.succeeded() {
            inner.relist().await?;
            return Ok(false);
        }
        let revision = resp.header().map_or(0, |h| h.revision());
        let caught_up = tokio::time::timeout(Duration::from_secs(2), async {
            loop {
                let changed = inner.changed.notified();
                if inner.view().revision >= revision {
                    return;
                }
                changed.await;
            }
        })
        .await;
        if caught_up.is_err() {
            inner.relist().await?;
        }
        Ok(true)
    }

    /// Write `key`'s placement by compare-and-swap against `expected` (its
    /// entry as last seen; `None`: it has none) and `guard`; note it in the
    /// view at once. The new revision, or `None` if a compare failed (the
    /// view is re-read then).
    async fn write_placement(
        &self,
        key: &ActorKey,
        expected: Option<PlacementEntry>,
        record: PlacementRecord,
        guard: Option<Compare>,
    ) -> anyhow::Result<Option<i64>> {
        let inner = &self.inner;
        let etcd_key = inner.keys.placement(key);
        let mut compares = vec![match &expected {
            Some(e) => Compare::mod_revision(etcd_key.clone(), CompareOp::Equal, e.mod_revision),
            None => Compare::create_revision(etcd_key.clone(), CompareOp::Equal, 0),
        }];
        compares.extend(guard);
        let txn = Txn::new().when(compares).and_then([TxnOp::put(
            etcd_key,
            serde_json::to_vec(&record)?,
            None,
        )]);
        let resp = within(ETCD_CALL, inner.client.clone().txn(txn)).await?;
        if !resp.succeeded() {
            inner.relist().await?;
            return Ok(None);
        }
        let revision = resp.header().map_or(0, |h| h.revision());
        {
            let mut v = inner.view.write().unwrap_or_else(|p| p.into_inner());
            let newer = v
                .placements
                .get(key)
                .is_some_and(|e| e.mod_revision >= revision);
            if !newer {
                v.placements.insert(
                    key.clone(),
                    PlacementEntry {
                        record,
                        mod_revision: revision,
                    },
                );
            }
        }
        inner.changed.notify_waiters();
        Ok(Some(revision))
    }
}

/// The region a slot is in and belongs to, when they are the same (see
/// [`Cluster::region_of_slot`]).
fn region_at_home<'v>(v: &'v View, e: &SlotEntry) -> Option<&'v str> {
    let running = v.members.get(&e.record.owner)?.region.as_str();
    match e.record.region.as_deref() {
        Some(home) if home != running => None,
        _ => Some(running),
    }
}
