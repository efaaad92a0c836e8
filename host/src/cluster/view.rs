//! This node's cached copy of the cluster's metadata: members and the slot
//! table at one etcd revision, kept current by a watch (re-listed at a
//! revision after a watch error or compaction).

use std::collections::{BTreeMap, HashMap};

use super::records::{
    Key, Keys, MemberRecord, PlacementRecord, RebalanceRecord, SLOTS, SlotRecord, hash_slot,
};
use crate::ids::ActorKey;

/// A slot's record and the etcd `mod_revision` it was written at (the
/// compare-and-swap token for the next write).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SlotEntry {
    pub record: SlotRecord,
    pub mod_revision: i64,
}

/// An actor's placement and the etcd `mod_revision` it was written at.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PlacementEntry {
    pub record: PlacementRecord,
    pub mod_revision: i64,
}

/// Members, slots and placements as of `revision`.
#[derive(Debug, Clone)]
pub struct View {
    pub revision: i64,
    pub members: BTreeMap<String, MemberRecord>,
    /// Members seen since this node started whose lease has ended, as last
    /// seen (so status shows a known node as down, with its region and
    /// address, rather than dropping it once its slots failed over).
    pub departed: BTreeMap<String, MemberRecord>,
    pub slots: Vec<Option<SlotEntry>>,
    /// Actors that live in another slot than their hash names.
    pub placements: HashMap<ActorKey, PlacementEntry>,
    pub controller: Option<String>,
    /// A rebalance asked for, and the `mod_revision` it was written at.
    pub rebalance: Option<(RebalanceRecord, i64)>,
}

impl Default for View {
    fn default() -> Self {
        Self {
            revision: 0,
            members: BTreeMap::new(),
            departed: BTreeMap::new(),
            slots: vec![None; SLOTS as usize],
            placements: HashMap::new(),
            controller: None,
            rebalance: None,
        }
    }
}

impl View {
    /// Apply a put (`Some(value)`) or delete (`None`) of `key`. Records that
    /// do not decode are ignored (and logged): a foreign writer cannot
    /// crash the node.
    pub fn apply(&mut self, keys: &Keys, key: &str, value: Option<&[u8]>, mod_revision: i64) {
        let Some(k) = keys.parse(key) else {
            return;
        };
        match (k, value) {
            (Key::Member(id), Some(v)) => match serde_json::from_slice::<MemberRecord>(v) {
                Ok(m) if m.node_id == id => {
                    self.departed.remove(id);
                    self.members.insert(id.to_owned(), m);
                }
                _ => tracing::warn!(key, "ignoring a member record that does not decode"),
            },
            (Key::Member(id), None) => {
                if let Some(m) = self.members.remove(id) {
                    self.departed.insert(id.to_owned(), m);
                }
            }
            (Key::Slot(s), Some(v)) => match serde_json::from_slice::<SlotRecord>(v) {
                Ok(record) => {
                    self.slots[s as usize] = Some(SlotEntry {
                        record,
                        mod_revision,
                    })
                }
                Err(e) => {
                    tracing::warn!(key, error = %e, "ignoring a slot record that does not decode")
                }
            },
            (Key::Slot(s), None) => self.slots[s as usize] = None,
            (Key::Placement(actor), Some(v)) => {
                match serde_json::from_slice::<PlacementRecord>(v) {
                    Ok(record) if record.slot < SLOTS => {
                        // A write this node noted at once may be newer than
                        // what the watch brings.
                        if self
                            .placements
                            .get(&actor)
                            .is_some_and(|e| e.mod_revision > mod_revision)
                        {
                            return;
                        }
                        self.placements.insert(
                            actor,
                            PlacementEntry {
                                record,
                                mod_revision,
                            },
                        );
                    }
                    _ => tracing::warn!(key, "ignoring a placement record that does not decode"),
                }
            }
            (Key::Placement(actor), None) => {
                // A delete event's revision is the delete's: an entry this
                // node wrote (and noted) after it stays.
                if self
                    .placements
                    .get(&actor)
                    .is_some_and(|e| e.mod_revision < mod_revision)
                {
                    self.placements.remove(&actor);
                }
            }
            (Key::Controller, v) => {
                self.controller = v.map(|v| String::from_utf8_lossy(v).into_owned());
            }
            (Key::Rebalance, Some(v)) => match serde_json::from_slice::<RebalanceRecord>(v) {
                Ok(r) => self.rebalance = Some((r, mod_revision)),
                Err(_) => tracing::warn!(key, "ignoring a rebalance record that does not decode"),
            },
            (Key::Rebalance, None) => self.rebalance = None,
            (Key::Meta, _) => {}
        }
    }

    /// The slot `key` lives in: its hash slot unless an entry names another.
    pub fn slot_of(&self, key: &ActorKey) -> u32 {
        self.placements
            .get(key)
            .map_or_else(|| hash_slot(key), |e| e.record.slot)
    }

    /// Before `self`, read from etcd at its revision, replaces `old`: keep
    /// the slot and placement writes `old` holds from after that revision.
    /// This node enters its own writes in its view at once (the watch
    /// brings them later); a re-list read just before one of them dropped
    /// it until the watch came, a fence included, which is what keeps the
    /// mover's own commits out while it copies the actor.
    pub fn keep_newer_writes(&mut self, old: &View) {
        for (new, old) in self.slots.iter_mut().zip(&old.slots) {
            if let Some(o) = old
                && o.mod_revision > self.revision
                && new.as_ref().is_none_or(|n| n.mod_revision < o.mod_revision)
            {
                *new = Some(o.clone());
            }
        }
        for (key, o) in &old.placements {
            if o.mod_revision > self.revision
                && self
                    .placements
                    .get(key)
                    .is_none_or(|n| n.mod_revision < o.mod_revision)
            {
                self.placements.insert(key.clone(), o.clone());
            }
        }
    }

    /// Slots per owner.
    pub fn slot_counts(&self) -> BTreeMap<String, u32> {
        let mut counts = BTreeMap::new();
        for e in self.slots.iter().flatten() {
            *counts.entry(e.record.owner.clone()).or_default() += 1;
        }
        counts
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_placement_event_older_than_the_entry_changes_nothing() {
        let keys = Keys::new("/m");
        let actor = ActorKey::new("kit", "a").unwrap();
        let key = keys.placement(&actor);
        let at = |slot: u32| serde_json::to_vec(&serde_json::json!({ "slot": slot })).unwrap();
        let mut v = View::default();
        v.apply(&keys, &key, Some(&at(7)), 10);
        // A late put and a late delete (both before 10) are ignored.
        v.apply(&keys, &key, Some(&at(3)), 8);
        v.apply(&keys, &key, None, 9);
        assert_eq!(v.placements[&actor].record.slot, 7);
        assert_eq!(v.placements[&actor].mod_revision, 10);
        // A later delete removes it; a later put brings it back.
        v.apply(&keys, &key, None, 11);
        assert!(v.placements.is_empty());
        v.apply(&keys, &key, Some(&at(5)), 12);
        assert_eq!(v.placements[&actor].record.slot, 5);
    }

    #[test]
    fn a_relist_keeps_this_nodes_writes_from_after_its_read() {
        let keys = Keys::new("/m");
        let (fenced, older) = (
            ActorKey::new("kit", "a").unwrap(),
            ActorKey::new("kit", "b").unwrap(),
        );
        let placed = |slot: u32, moving: Option<&str>| {
            serde_json::to_vec(&serde_json::json!({ "slot": slot, "moving": moving })).unwrap()
        };
        let slot = |owner: &str, epoch: u64| {
            serde_json::to_vec(&serde_json::json!({ "owner": owner, "epoch": epoch, "used": true }))
                .unwrap()
        };
        // The old view: the watch at 20, and this node's own writes at 25
        // (a fence, a slot), entered before the watch brought them.
        let mut old = View {
            revision: 20,
            ..View::default()
        };
        old.apply(
            &keys,
            &keys.placement(&fenced),
            Some(&placed(3, Some("n1"))),
            25,
        );
        old.apply(&keys, &keys.placement(&older), Some(&placed(4, None)), 12);
        old.apply(&keys, &keys.slot(1), Some(&slot("n1", 2)), 25);
        old.apply(&keys, &keys.slot(2), Some(&slot("n1", 1)), 5);
        // A re-list read at 22: before the fence; it saw slot 2 change.
        let mut fresh = View {
            revision: 22,
            ..View::default()
        };
        fresh.apply(&keys, &keys.placement(&fenced), Some(&placed(3, None)), 15);
        fresh.apply(&keys, &keys.placement(&older), Some(&placed(4, None)), 12);
        fresh.apply(&keys, &keys.slot(1), Some(&slot("n1", 1)), 5);
        fresh.apply(&keys, &keys.slot(2), Some(&slot("n2", 2)), 21);
        fresh.keep_newer_writes(&old);
        assert_eq!(
            fresh.placements[&fenced].record.moving.as_deref(),
            Some("n1")
        );
        assert_eq!(fresh.placements[&fenced].mod_revision, 25);
        assert_eq!(fresh.placements[&older].mod_revision, 12);
        assert_eq!(fresh.slots[1].as_ref().unwrap().record.epoch, 2);
        assert_eq!(fresh.slots[2].as_ref().unwrap().record.owner, "n2");
        assert_eq!(fresh.revision, 22);
    }
}
