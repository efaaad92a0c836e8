//! The controller: one node, elected by a key under its own lease, is the
//! only writer of slot assignments. Every write is a compare-and-swap on the
//! slot's `mod_revision`, and a change of owner increments the epoch, so a
//! stale controller (paused, partitioned) cannot overwrite a newer
//! decision: its compare fails.
//!
//! Per slot, each round ([`decide`]):
//! * an unassigned or unused slot goes to the rendezvous choice among live
//!   members, with the runner-up as its backup (no data yet, so both may
//!   change freely; a dead owner's slots wait [`GRACE`] past its lease);
//! * a used slot whose owner is gone (past its lease and [`GRACE`]) goes to
//!   its backup, at epoch + 1: a failover. The backup has every write the
//!   owner released (the output gate waits for it), and it refuses writes
//!   of the old epoch from then on;
//! * a used slot whose backup is gone loses it (degraded): the owner
//!   releases its output on its own disk alone until a new backup caught
//!   up;
//! * a used slot without a backup gets a *joining* node (the runner-up):
//!   its owner ships it a snapshot of the slot and then every write, and
//!   names it the backup once it has the snapshot. A joining node that
//!   dies is dropped.
//!
//! While a rebalance is asked for ([`rebalance`]), used slots whose owner
//! is not the preferred node of its region move there too — the preferred
//! node first catches up as the backup, then the owner hands the slot over
//! — a few slots at a time; the controller deletes the request when every
//! slot is where it should be.

use std::collections::{BTreeSet, HashMap};
use std::sync::Arc;
use std::time::{Duration, Instant};

use etcd_client::{Compare, CompareOp, PutOptions, Txn, TxnOp};

use super::Inner;
use super::records::{SLOTS, SlotRecord, score};
use super::view::View;

/// How long a member must have been gone (its lease already expired)
/// before the controller moves its slots or drops it as a backup.
const GRACE: Duration = Duration::from_secs(2);

/// Slot writes per etcd transaction (etcd allows 128 operations).
const WRITES_PER_TXN: usize = 64;

/// Slots a rebalance moves at once (each catching-up backup takes a
/// snapshot of its slot, and the slot runs without a backup meanwhile).
const REBALANCE_AT_ONCE: usize = 8;

pub(super) async fn run(inner: Arc<Inner>) {
    let mut gone_since: HashMap<String, Instant> = HashMap::new();
    loop {
        let changed = inner.changed.notified();
        if inner.lease.alive() {
            match campaign(&inner).await {
                Ok(true) => {
                    if let Err(e) = assign(&inner, &mut gone_since).await {
                        tracing::warn!(error = %e, "slot assignment round failed");
                    }
                }
                Ok(false) => gone_since.clear(),
                Err(e) => tracing::debug!(error = %e, "controller campaign failed"),
            }
        }
        // Again on any change, and at least every second (grace periods).
        let _ = tokio::time::timeout(Duration::from_secs(1), changed).await;
    }
}

/// Become the controller if nobody is, or stay it. `true`: this node is.
async fn campaign(inner: &Inner) -> anyhow::Result<bool> {
    let me = &inner.config.node_id;
    let key = inner.keys.controller();
    let lease = inner.lease.id.load(std::sync::atomic::Ordering::Acquire);
    let txn = Txn::new()
        .when([Compare::create_revision(key.clone(), CompareOp::Equal, 0)])
        .and_then([TxnOp::put(
            key.clone(),
            me.as_bytes(),
            Some(PutOptions::new().with_lease(lease)),
        )])
        .or_else([TxnOp::get(key, None)]);
    let resp = super::within(super::ETCD_CALL, inner.client.clone().txn(txn)).await?;
    if resp.succeeded() {
        tracing::info!("this node is the cluster controller");
        return Ok(true);
    }
    // Ours only under this very lease: a previous incarnation's key is
    // not ours.
    Ok(resp.op_responses().into_iter().any(|r| match r {
        etcd_client::TxnOpResponse::Get(g) => g
            .kvs()
            .first()
            .is_some_and(|kv| kv.value() == me.as_bytes() && kv.lease() == lease),
        _ => false,
    }))
}

/// A change the controller makes to one slot.
#[derive(Debug, Clone, PartialEq, Eq)]
struct Write {
    slot: u32,
    /// The `mod_revision` compared against (`None`: create).
    revision: Option<i64>,
    record: SlotRecord,
    /// A used slot moved to its backup.
    failover: bool,
}

/// This round's writes for `view`. `gone` says whether a member that is
/// not live any more has been gone past the grace period.
fn decide(view: &View, gone: &mut impl FnMut(&str) -> bool) -> Vec<Write> {
    // Who may be given slots: the live members but those leaving (which
    // still own theirs until they hand them over, or fail over).
    let live = takers(view);
    if live.is_empty() {
        return Vec::new();
    }
    let region_of = |n: &str| view.members.get(n).map(|m| m.region.clone());
    let mut writes = Vec::new();
    for slot in 0..SLOTS {
        let mut ranked = live.clone();
        ranked.sort_by_key(|n| std::cmp::Reverse(score(slot, n)));
        let best = ranked[0];
        let second = backup_for(view, &ranked, best, None, None);
        let entry = &view.slots[slot as usize];
        let Some(e) = entry else {
            writes.push(Write {
                slot,
                revision: None,
                record: SlotRecord {
                    owner: best.to_owned(),
                    epoch: 1,
                    used: false,
                    backup: second,
                    joining: None,
                    avoid: None,
                    handoff: None,
                    region: region_of(best),
                },
                failover: false,
            });
            continue;
        };
        let r = &e.record;
        let is_live = |n: &str| view.members.contains_key(n);
        let next = if !r.used {
            if r.owner != best && (is_live(&r.owner) || gone(&r.owner)) {
                Some(SlotRecord {
                    owner: best.to_owned(),
                    epoch: r.epoch + 1,
                    used: false,
                    backup: second,
                    joining: None,
                    avoid: None,
                    handoff: None,
                    region: region_of(best),
                })
            } else if r.owner == best && r.region != region_of(best) {
                // A record from before slots kept their region.
                Some(SlotRecord {
                    backup: second,
                    region: region_of(best),
                    ..r.clone()
                })
            } else if r.owner == best && r.backup != second {
                // Unused: nothing to copy, the backup follows the members.
                Some(SlotRecord {
                    backup: second,
                    ..r.clone()
                })
            } else {
                None
            }
        } else if !is_live(&r.owner) {
            match &r.backup {
                // To another region, if that is where the backup was: the
                // slot keeps its own, to go back to.
                Some(b) if is_live(b) && gone(&r.owner) => Some(SlotRecord {
                    owner: b.clone(),
                    epoch: r.epoch + 1,
                    used: true,
                    backup: None,
                    joining: None,
                    avoid: None,
                    handoff: None,
                    region: r.region.clone(),
                }),
                _ => None,
            }
        } else {
            // The runner-up among the live members other than the owner
            // (and the node the owner could not reach), in the slot's
            // region if it can be.
            let candidate = backup_for(
                view,
                &ranked,
                &r.owner,
                r.avoid.as_deref(),
                r.region.as_deref(),
            );
            match (&r.backup, &r.joining) {
                (Some(b), _) if !is_live(b) && gone(b) => Some(SlotRecord {
                    backup: None,
                    ..r.clone()
                }),
                // A rebalance's node catching up beside the backup died.
                (Some(_), Some(j)) if !is_live(j) && gone(j) => Some(SlotRecord {
                    joining: None,
                    ..r.clone()
                }),
                (Some(_), _) => None,
                (None, Some(j)) if !is_live(j) && gone(j) => Some(SlotRecord {
                    joining: None,
                    ..r.clone()
                }),
                (None, None) if candidate.is_some() => Some(SlotRecord {
                    joining: candidate,
                    ..r.clone()
                }),
                // The node avoided (the owner could not reach it, or it
                // handed the slot over as it stopped) has left: whatever
                // comes back under its id is a new start, and may be
                // chosen again. Kept, it could never be: in a cluster of
                // two, the slot stayed without a backup for good.
                _ if r.avoid.as_deref().is_some_and(|a| !is_live(a)) => Some(SlotRecord {
                    avoid: None,
                    ..r.clone()
                }),
                _ => None,
            }
            // A record from before slots kept their region gets its owner's.
            .or_else(|| {
                r.region.is_none().then(|| SlotRecord {
                    region: region_of(&r.owner),
                    ..r.clone()
                })
            })
        };
        if let Some(record) = next {
            writes.push(Write {
                slot,
                revision: Some(e.mod_revision),
                failover: r.used && record.owner != r.owner,
                record,
            });
        }
    }
    writes
}

/// The backup for a slot owned by `owner`: the first of `ranked` (live
/// members by rendezvous score) other than `owner` and `avoid`, in the
/// slot's `region` (else `owner`'s) if one is — so that a failover keeps
/// the slot's actors near their users, or brings them back there — else
/// in any.
fn backup_for(
    view: &View,
    ranked: &[&str],
    owner: &str,
    avoid: Option<&str>,
    region: Option<&str>,
) -> Option<String> {
    let region = region.or_else(|| view.members.get(owner).map(|m| m.region.as_str()));
    let fits = |n: &&&str| **n != owner && Some(**n) != avoid;
    let same_region = |n: &&&str| view.members.get(**n).map(|m| m.region.as_str()) == region;
    ranked
        .iter()
        .filter(fits)
        .find(same_region)
        .or_else(|| ranked.iter().find(fits))
        .map(|n| (*n).to_owned())
}

/// The live members slots may be given to (not those leaving).
fn takers(view: &View) -> Vec<&str> {
    view.members
        .values()
        .filter(|m| m.takes_slots())
        .map(|m| m.node_id.as_str())
        .collect()
}

/// The node `slot` should live on among the live members of `region`:
/// their rendezvous choice (so a new node takes about its share).
fn preferred<'v>(view: &'v View, slot: u32, region: &str) -> Option<&'v str> {
    view.members
        .values()
        .filter(|m| m.region == region && m.takes_slots())
        .max_by_key(|m| score(slot, &m.node_id))
        .map(|m| m.node_id.as_str())
}

/// A rebalance's writes this round, for the slots `decide` left alone, and
/// how many used slots are not where they should be yet (0: done).
///
/// A used slot whose owner is not the preferred node of the slot's region
/// (its owner's, if no node of its own is live) moves there without ever being on fewer disks than its acknowledged
/// writes need: the preferred node first catches up beside the slot's
/// backup (from a snapshot; every batch waits for both meanwhile) and
/// replaces it, then the owner is asked to hand the slot over (`handoff`),
/// which it does itself once the backup has every commit. At most
/// [`REBALANCE_AT_ONCE`] slots are catching up or being handed over at once.
/// A slot stays in its region, or goes back to it after a failover took
/// it elsewhere: actors placed near their users stay there; and a slot on
/// its preferred node whose backup is in another region gets one in its
/// own when a node there is live (so that a failover keeps it near its
/// users too).
fn rebalance(view: &View, decided: &BTreeSet<u32>) -> (Vec<Write>, usize) {
    let live = |n: &str| view.members.contains_key(n);
    let mut busy = view
        .slots
        .iter()
        .flatten()
        .filter(|e| e.record.joining.is_some() || e.record.handoff.is_some())
        .count();
    let mut writes = Vec::new();
    let mut to_move = 0;
    for slot in 0..SLOTS {
        let Some(e) = view.slots[slot as usize].as_ref() else {
            continue;
        };
        let r = &e.record;
        if decided.contains(&slot) || !r.used {
            continue;
        }
        let home = r
            .region
            .as_deref()
            .filter(|h| preferred(view, slot, h).is_some());
        let Some(region) = home.or_else(|| view.members.get(&r.owner).map(|m| m.region.as_str()))
        else {
            continue;
        };
        let Some(target) = preferred(view, slot, region) else {
            continue;
        };
        let write = |record: SlotRecord| Write {
            slot,
            revision: Some(e.mod_revision),
            record,
            failover: false,
        };
        if let Some(h) = &r.handoff {
            if r.backup.as_deref() == Some(h.as_str()) && live(h) && h == target {
                to_move += 1;
            } else {
                // Its node is no longer the backup, live, or preferred.
                writes.push(write(SlotRecord {
                    handoff: None,
                    ..r.clone()
                }));
            }
            continue;
        }
        // Where the slot's backup should be: in the region too, if it can.
        let in_region = |n: &str| view.members.get(n).is_some_and(|m| m.region == region);
        let new_backup = if target == r.owner {
            let mut ranked = takers(view);
            ranked.sort_by_key(|n| std::cmp::Reverse(score(slot, n)));
            match backup_for(view, &ranked, &r.owner, None, Some(region)) {
                Some(b) if in_region(&b) && r.backup.as_deref().is_some_and(|o| !in_region(o)) => b,
                _ => continue,
            }
        } else {
            target.to_owned()
        };
        to_move += 1;
        // Catching up (a snapshot under way), or degraded (`decide` finds
        // it a joining node first): wait.
        let Some(backup) = r
            .backup
            .as_deref()
            .filter(|b| live(b) && r.joining.is_none())
        else {
            continue;
        };
        if busy >= REBALANCE_AT_ONCE {
            continue;
        }
        busy += 1;
        writes.push(write(if backup == target && target != r.owner {
            SlotRecord {
                handoff: Some(target.to_owned()),
                ..r.clone()
            }
        } else {
            // The old backup stays until the new one has caught up.
            SlotRecord {
                joining: Some(new_backup),
                avoid: None,
                ..r.clone()
            }
        }));
    }
    (writes, to_move)
}

/// Used slots not on the preferred node of their region (a rebalance would
/// move them).
pub(super) fn slots_to_move(view: &View) -> usize {
    rebalance(view, &BTreeSet::new()).1
}

/// One round: compute the writes, apply them in compare-and-swap batches.
async fn assign(inner: &Inner, gone_since: &mut HashMap<String, Instant>) -> anyhow::Result<()> {
    let (writes, rebalanced) = {
        let v = inner.view();
        let now = Instant::now();
        gone_since.retain(|n, _| !v.members.contains_key(n));
        let mut writes = decide(&v, &mut |node| {
            let since = *gone_since.entry(node.to_owned()).or_insert(now);
            now.duration_since(since) >= GRACE
        });
        let mut rebalanced = None;
        if let Some((_, revision)) = &v.rebalance {
            let decided: BTreeSet<u32> = writes.iter().map(|w| w.slot).collect();
            let (more, to_move) = rebalance(&v, &decided);
            writes.extend(more);
            if to_move == 0 && writes.is_empty() {
                rebalanced = Some(*revision);
            }
        }
        (writes, rebalanced)
    };
    if let Some(revision) = rebalanced {
        // Done: forget the request (unless asked again meanwhile).
        let key = inner.keys.rebalance();
        let txn = Txn::new()
            .when([Compare::mod_revision(
                key.clone(),
                CompareOp::Equal,
                revision,
            )])
            .and_then([TxnOp::delete(key, None)]);
        super::within(super::ETCD_CALL, inner.client.clone().txn(txn)).await?;
        tracing::info!("rebalance done: every used slot is on the preferred node of its region");
        return Ok(());
    }
    if writes.is_empty() {
        return Ok(());
    }
    let mut applied = 0;
    let mut failovers = 0;
    for chunk in writes.chunks(WRITES_PER_TXN) {
        let mut compares = Vec::with_capacity(chunk.len() + 1);
        let mut puts = Vec::with_capacity(chunk.len());
        // Still the controller: the election key is ours.
        compares.push(Compare::lease(
            inner.keys.controller(),
            CompareOp::Equal,
            inner.lease.id.load(std::sync::atomic::Ordering::Acquire),
        ));
        for w in chunk {
            let key = inner.keys.slot(w.slot);
            compares.push(match w.revision {
                None => Compare::create_revision(key.clone(), CompareOp::Equal, 0),
                Some(r) => Compare::mod_revision(key.clone(), CompareOp::Equal, r),
            });
            puts.push(TxnOp::put(key, serde_json::to_vec(&w.record)?, None));
        }
        let txn = Txn::new().when(compares).and_then(puts);
        let resp = super::within(super::ETCD_CALL, inner.client.clone().txn(txn)).await?;
        if resp.succeeded() {
            applied += chunk.len();
            for w in chunk.iter().filter(|w| w.failover) {
                failovers += 1;
                tracing::debug!(slot = w.slot, to = %w.record.owner, epoch = w.record.epoch,
                    "failover: the slot's owner is gone; its backup takes over");
            }
        } else {
            // Someone else wrote meanwhile (an owner marked a slot used):
            // the watch brings it, the next round decides again.
            break;
        }
    }
    if failovers > 0 {
        tracing::warn!(
            slots = failovers,
            "failover: owners gone past their lease; their backups took over their used slots"
        );
    }
    if applied > 0 {
        tracing::info!(slots = applied, failovers, "assigned slots");
    }
    inner
        .failovers
        .fetch_add(failovers, std::sync::atomic::Ordering::Relaxed);
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::cluster::records::{Keys, MemberRecord};

    fn view(members: &[&str], slots: &[(u32, SlotRecord)]) -> View {
        let members: Vec<(&str, &str)> = members.iter().map(|m| (*m, "r")).collect();
        view_in(&members, slots)
    }

    /// Members (id, region) and slots.
    fn view_in(members: &[(&str, &str)], slots: &[(u32, SlotRecord)]) -> View {
        let keys = Keys::new("/m");
        let mut v = View::default();
        for (i, (m, region)) in members.iter().enumerate() {
            let rec = MemberRecord {
                node_id: (*m).into(),
                region: (*region).into(),
                advertise: format!("http://127.0.0.1:{}", 1000 + i),
                incarnation: 1,
                leaving: false,
            };
            v.apply(
                &keys,
                &keys.member(m),
                Some(&serde_json::to_vec(&rec).unwrap()),
                1,
            );
        }
        for (s, rec) in slots {
            v.apply(
                &keys,
                &keys.slot(*s),
                Some(&serde_json::to_vec(rec).unwrap()),
                5,
            );
        }
        v
    }

    fn slot(owner: &str, backup: Option<&str>, used: bool, epoch: u64) -> SlotRecord {
        SlotRecord {
            owner: owner.into(),
            epoch,
            used,
            backup: backup.map(Into::into),
            joining: None,
            avoid: None,
            handoff: None,
            region: Some("r".into()),
        }
    }

    /// [`slot`] of `region`.
    fn slot_of(region: &str, owner: &str, backup: Option<&str>) -> SlotRecord {
        SlotRecord {
            region: Some(region.into()),
            ..slot(owner, backup, true, 3)
        }
    }

    #[test]
    fn new_slots_get_an_owner_and_a_different_backup() {
        let writes = decide(&view(&["a", "b", "c"], &[]), &mut |_| true);
        assert_eq!(writes.len(), SLOTS as usize);
        for w in &writes {
            let b = w.record.backup.as_deref().expect("a backup");
            assert_ne!(b, w.record.owner);
        }
        // Alone: no backup to give.
        let writes = decide(&view(&["a"], &[]), &mut |_| true);
        assert!(writes.iter().all(|w| w.record.backup.is_none()));
        // In the owner's region when a node there is live (a failover then
        // keeps the slot near its users), else anywhere.
        let v = view_in(&[("a", "eu"), ("b", "eu"), ("c", "us")], &[]);
        for w in decide(&v, &mut |_| true) {
            let b = w.record.backup.expect("a backup");
            match w.record.owner.as_str() {
                "c" => assert_ne!(b, "c"),
                _ => assert_ne!(b, "c", "slot {} backed up across regions", w.slot),
            }
        }
    }

    /// A member that is leaving (a graceful stop) keeps the slots it owns,
    /// but is given none: not as owner, backup, joining node or a
    /// rebalance's target.
    #[test]
    fn a_leaving_member_is_given_nothing() {
        let mut v = view_in(&[("a", "eu"), ("b", "eu"), ("c", "eu")], &[]);
        v.members.get_mut("c").unwrap().leaving = true;
        for w in decide(&v, &mut |_| true) {
            assert_ne!(w.record.owner, "c", "slot {}", w.slot);
            assert_ne!(w.record.backup.as_deref(), Some("c"), "slot {}", w.slot);
        }
        // Its used slots stay its own (they are handed over, or fail over
        // once it is gone); one without a backup gets another joining node.
        let slots: Vec<_> = (0..SLOTS)
            .map(|s| (s, slot("c", None, true, 2)))
            .chain([(7, slot("a", None, true, 2))])
            .collect();
        let mut v = view_in(&[("a", "eu"), ("b", "eu"), ("c", "eu")], &slots);
        v.members.get_mut("c").unwrap().leaving = true;
        for w in decide(&v, &mut |_| true) {
            assert_eq!(w.record.owner, if w.slot == 7 { "a" } else { "c" });
            assert_ne!(w.record.joining.as_deref(), Some("c"), "slot {}", w.slot);
        }
        // A rebalance sends no slot to it.
        let slots: Vec<_> = (0..SLOTS)
            .map(|s| (s, slot("a", Some("b"), true, 2)))
            .collect();
        let mut v = view_in(&[("a", "eu"), ("b", "eu"), ("c", "eu")], &slots);
        v.members.get_mut("c").unwrap().leaving = true;
        let (writes, _) = rebalance(&v, &BTreeSet::new());
        for w in writes {
            assert_ne!(w.record.handoff.as_deref(), Some("c"), "slot {}", w.slot);
            assert_ne!(w.record.joining.as_deref(), Some("c"), "slot {}", w.slot);
        }
    }

    #[test]
    fn a_used_slot_fails_over_to_its_backup_only_after_the_grace_period() {
        let slots = [(3, slot("gone", Some("b"), true, 4))];
        let v = view(&["a", "b"], &slots);
        let for_3 = |ws: Vec<Write>| ws.into_iter().find(|w| w.slot == 3);
        assert_eq!(for_3(decide(&v, &mut |_| false)), None, "within the grace");
        let w = for_3(decide(&v, &mut |_| true)).expect("a failover");
        assert_eq!(w.record, slot("b", None, true, 5));
        assert!(w.failover);
        // No live backup: the slot waits for its owner.
        let v = view(&["a"], &slots);
        assert_eq!(for_3(decide(&v, &mut |_| true)), None);
        // A dead backup of a live owner is dropped (degraded), epoch kept.
        let v = view(&["a"], &[(3, slot("a", Some("gone"), true, 4))]);
        let w = for_3(decide(&v, &mut |_| true)).expect("backup dropped");
        assert_eq!(w.record, slot("a", None, true, 4));
        assert!(!w.failover);
        // A used slot never moves to a node without its data: a slot
        // without a backup gets a joining node, which is not promoted.
        let v = view(&["a", "b", "c"], &[(3, slot("a", None, true, 4))]);
        let w = for_3(decide(&v, &mut |_| true)).expect("a joining node");
        assert_eq!(w.record.owner, "a");
        assert!(w.record.backup.is_none());
        let joining = w.record.joining.clone().expect("joining");
        assert_ne!(joining, "a");
        let v = view(&["b", "c"], &[(3, w.record.clone())]);
        assert_eq!(
            for_3(decide(&v, &mut |_| true)),
            None,
            "a joining node took over"
        );
        // A node the owner could not reach is not chosen again.
        let avoided = SlotRecord {
            avoid: Some(joining.clone()),
            ..slot("a", None, true, 4)
        };
        let v = view(&["a", "b", "c"], &[(3, avoided.clone())]);
        let w = for_3(decide(&v, &mut |_| true)).expect("another joining node");
        assert_ne!(w.record.joining, Some(joining.clone()));
        let v = view(&["a", &joining], &[(3, avoided.clone())]);
        assert_eq!(
            for_3(decide(&v, &mut |_| true)),
            None,
            "only the avoided node left"
        );
        // Once it has left, it is avoided no more: back, it is chosen.
        let v = view(&["a"], &[(3, avoided)]);
        let w = for_3(decide(&v, &mut |_| false)).expect("the avoid cleared");
        assert_eq!(w.record.avoid, None);
        assert_eq!(w.record.joining, None);
        let v = view(&["a", &joining], &[(3, w.record)]);
        let w = for_3(decide(&v, &mut |_| true)).expect("a joining node");
        assert_eq!(w.record.joining, Some(joining));
    }

    /// A rebalance moves each used slot to the preferred node of its
    /// owner's region — through its backup, never straight — a few at a
    /// time, and withdraws a handoff that no longer fits.
    #[test]
    fn a_rebalance_moves_used_slots_to_their_regions_preferred_node_via_the_backup() {
        let members = [("a", "eu"), ("b", "eu"), ("c", "us")];
        let none = BTreeSet::new();
        // Slots where `b` is eu's preferred node, owned by `a`.
        let v = view_in(&members, &[]);
        let to_b: Vec<u32> = (0..SLOTS)
            .filter(|s| preferred(&v, *s, "eu") == Some("b"))
            .take(20)
            .collect();
        let stay = (0..SLOTS)
            .find(|s| preferred(&v, *s, "eu") == Some("a"))
            .unwrap();
        // Backed up by `c` (another region): `b` first catches up.
        let (s0, s1) = (to_b[0], to_b[1]);
        let v = view_in(
            &members,
            &[
                (s0, slot("a", Some("c"), true, 3)),
                (s1, slot("a", Some("b"), true, 3)),
                (stay, slot("a", Some("b"), true, 3)),
            ],
        );
        let (writes, to_move) = rebalance(&v, &none);
        assert_eq!(to_move, 2, "{writes:?}");
        let w0 = writes.iter().find(|w| w.slot == s0).expect("s0 moves");
        assert_eq!(
            w0.record,
            SlotRecord {
                joining: Some("b".into()),
                ..slot("a", Some("c"), true, 3)
            },
            "the old backup stays while the new one catches up"
        );
        // Backed up by `b` already: the owner is asked to hand it over.
        let w1 = writes.iter().find(|w| w.slot == s1).expect("s1 moves");
        assert_eq!(
            w1.record,
            SlotRecord {
                handoff: Some("b".into()),
                ..slot("a", Some("b"), true, 3)
            }
        );
        assert!(!writes.iter().any(|w| w.slot == stay || w.failover));
        // On its preferred node, but backed up in another region while a
        // node of its own is live: it gets a backup in its region.
        let v = view_in(&members, &[(stay, slot("a", Some("c"), true, 3))]);
        let (writes, to_move) = rebalance(&v, &none);
        assert_eq!(to_move, 1);
        assert_eq!(
            writes[0].record,
            SlotRecord {
                joining: Some("b".into()),
                ..slot("a", Some("c"), true, 3)
            }
        );
        // A slot of the us region stays there, even with eu nodes around.
        let v = view_in(&members, &[(s0, slot("c", Some("a"), true, 3))]);
        assert_eq!(rebalance(&v, &none), (vec![], 0));
        // A handoff whose node is no longer the backup is withdrawn.
        let stale = SlotRecord {
            handoff: Some("b".into()),
            ..slot("a", Some("c"), true, 3)
        };
        let v = view_in(&members, &[(s1, stale)]);
        let (writes, _) = rebalance(&v, &none);
        assert_eq!(writes[0].record, slot("a", Some("c"), true, 3));
        // Slots `decide` writes this round are left to it.
        let v = view_in(&members, &[(s1, slot("a", Some("b"), true, 3))]);
        assert!(rebalance(&v, &BTreeSet::from([s1])).0.is_empty());
        // A few at a time: 20 slots to move, 8 started, all counted.
        let many: Vec<(u32, SlotRecord)> = to_b
            .iter()
            .map(|s| (*s, slot("a", Some("c"), true, 3)))
            .collect();
        let v = view_in(&members, &many);
        let (writes, to_move) = rebalance(&v, &none);
        assert_eq!((writes.len(), to_move), (REBALANCE_AT_ONCE, 20));
        assert_eq!(slots_to_move(&v), 20);
    }

    /// A slot keeps its region through a failover to another one (no node
    /// of its own was live), gets a backup back home once one is, and a
    /// rebalance brings it home. It used to take its owner's region: a
    /// second failover left eu's actors in us for good, and a rebalance
    /// found nothing to move (found by probing a cluster).
    #[test]
    fn a_slot_that_failed_over_to_another_region_goes_home() {
        let members = [("a", "eu"), ("b", "eu"), ("c", "us")];
        let for_3 = |ws: Vec<Write>| ws.into_iter().find(|w| w.slot == 3);
        // Owner gone, backed up in us: the failover keeps "eu".
        let v = view_in(&members, &[(3, slot_of("eu", "gone", Some("c")))]);
        let w = for_3(decide(&v, &mut |_| true)).expect("a failover");
        assert_eq!((w.record.owner.as_str(), w.failover), ("c", true));
        assert_eq!(w.record.region.as_deref(), Some("eu"));
        // Owned in us without a backup: the backup that joins is in eu.
        let v = view_in(&members, &[(3, slot_of("eu", "c", None))]);
        let w = for_3(decide(&v, &mut |_| true)).expect("a joining node");
        let joining = w.record.joining.expect("joining");
        assert!(["a", "b"].contains(&joining.as_str()), "{joining}");
        // A rebalance moves it to eu's preferred node, through its backup.
        let home = preferred(&v, 3, "eu").unwrap();
        let v = view_in(&members, &[(3, slot_of("eu", "c", Some(home)))]);
        let (writes, to_move) = rebalance(&v, &BTreeSet::new());
        assert_eq!(to_move, 1);
        assert_eq!(writes[0].record.handoff.as_deref(), Some(home));
        // With no node of its region live it stays where it is.
        let v = view_in(
            &[("c", "us"), ("d", "us")],
            &[(3, slot_of("eu", "c", Some("d")))],
        );
        let target = preferred(&v, 3, "us").unwrap();
        let (_, to_move) = rebalance(&v, &BTreeSet::new());
        assert_eq!(to_move, usize::from(target != "c"));
        // A record from before slots kept their region gets its owner's.
        let legacy = SlotRecord {
            region: None,
            ..slot("a", Some("b"), true, 3)
        };
        let v = view_in(&members, &[(3, legacy.clone())]);
        let w = for_3(decide(&v, &mut |_| true)).expect("region filled in");
        assert_eq!(
            w.record,
            SlotRecord {
                region: Some("eu".into()),
                ..legacy
            }
        );
    }
}
