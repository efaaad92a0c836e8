//! Settling a slot this node has just come to own.
//!
//! A backup checks that it is still the slot's backup on its writer
//! thread, then commits the batch — a millisecond or two with the fsync.
//! If the view makes it the owner in between (a failover, a handoff), an
//! actor of the slot loaded at once would read a transaction without that
//! batch, which then lands underneath the live instance: its next turn
//! writes over it. So a node serves a slot it owns at an epoch only after
//! one writer barrier since it saw that epoch: the barrier passes behind
//! every batch accepted before it (and commits nothing itself). Requests
//! settle a slot in the route layer; `Node::follow_slots` settles the slots
//! it sees gained before it starts their actors; in-node callers that load
//! an actor themselves settle its slot first (an alarm falling due in the
//! moment between the view's change and `follow_slots` noticing it, an
//! actor call from a turn, recovery at start-up: see
//! [`Cluster::unsettled`]).

use std::collections::BTreeSet;
use std::sync::atomic::{AtomicU64, Ordering};

use super::records::SLOTS;
use super::{Cluster, Route};
use crate::ids::ActorKey;
use crate::storage::Writer;

/// Per slot, the epoch from which this node has settled it (0: none), and
/// the latest epoch an in-node caller started settling it at.
pub(super) struct Settled {
    epochs: Box<[AtomicU64]>,
    started: Box<[AtomicU64]>,
}

impl Default for Settled {
    fn default() -> Self {
        let zeros = || (0..SLOTS).map(|_| AtomicU64::new(0)).collect();
        Self {
            epochs: zeros(),
            started: zeros(),
        }
    }
}

impl Cluster {
    /// Whether this node, owning `slot` at `epoch`, has settled it: every
    /// batch it accepted as the slot's backup has committed.
    pub fn settled(&self, slot: u32, epoch: u64) -> bool {
        self.inner
            .settled
            .epochs
            .get(slot as usize)
            .is_some_and(|e| e.load(Ordering::Acquire) >= epoch)
    }

    /// The slot of `key` and its epoch if this node owns it, has served it
    /// and has not settled it at that epoch. A caller inside the node that
    /// would load the actor (an alarm, an actor call from a turn) settles
    /// it first, as the route layer does for requests.
    pub fn unsettled(&self, key: &ActorKey) -> Option<(u32, u64)> {
        match self.route(key) {
            Route::Local {
                slot,
                epoch,
                used: true,
            } if !self.settled(slot, epoch) => Some((slot, epoch)),
            _ => None,
        }
    }

    /// Settle the slot of `key` first if it is [`Self::unsettled`]: what an
    /// in-node caller that is about to load the actor waits for.
    pub async fn settle_before_loading(&self, writer: &Writer, key: &ActorKey) {
        if let Some(slot) = self.unsettled(key) {
            self.settle_slots(writer, &[slot]).await;
        }
    }

    /// Whether the caller is the first to start settling `slot` at `epoch`
    /// (callers that only need it settled eventually start one barrier,
    /// not one each).
    pub fn start_settling(&self, slot: u32, epoch: u64) -> bool {
        self.inner
            .settled
            .started
            .get(slot as usize)
            .is_some_and(|e| e.fetch_max(epoch, Ordering::AcqRel) < epoch)
    }

    /// Let every batch this node accepted as the backup of `slots` land
    /// before their actors load here, each owned at its epoch: one barrier
    /// through `writer`, then each slot is settled.
    pub async fn settle_slots(&self, writer: &Writer, slots: &[(u32, u64)]) {
        writer.barrier().await;
        for &(slot, epoch) in slots {
            self.mark_settled(slot, epoch);
        }
    }

    /// `slot`, owned here at `epoch`, is settled (a writer barrier passed
    /// after this node saw the epoch).
    fn mark_settled(&self, slot: u32, epoch: u64) {
        if let Some(e) = self.inner.settled.epochs.get(slot as usize) {
            e.fetch_max(epoch, Ordering::AcqRel);
        }
    }

    /// Of `slots`, those this node owns now, with their epochs.
    pub fn owned_epochs(&self, slots: &BTreeSet<u32>) -> Vec<(u32, u64)> {
        let v = self.inner.view();
        let me = &self.inner.config.node_id;
        slots
            .iter()
            .filter_map(|&slot| {
                let r = &v.slots.get(slot as usize)?.as_ref()?.record;
                (&r.owner == me).then_some((slot, r.epoch))
            })
            .collect()
    }
}
