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
/// before the controller moves its slots (a used slot's backup waits
/// longer: see `decide`).
const GRACE: Duration = Duration::from_secs(2);

/// Slot writes per etcd transaction (etcd allows 128 operations).
const WRITES_PER_TXN: usize = 64;

/// Slots a rebalance moves at once (each catching-up backup takes a
/// snapshot of its slot, and the slot runs without a backup meanwhile).
const REBALANCE_AT_ONCE: usize = 8;

/// How long a live node that its owner could not reach stays passed over
/// as the slot's backup (`avoid`): then it may be chosen again. It was for
/// as long as it stayed up, so a pause of a few seconds (a GC, a VM
/// migration) left a slot with no other candidate on one disk for good
/// (found by a probe). One still unreachable is dropped again in 3 s.
const AVOID_FOR: Duration = Duration::from_secs(30);

pub(super) async fn run(inner: Arc<Inner>) {
    let mut gone_since: HashMap<String, Instant> = HashMap::new();
    let mut avoided_since: HashMap<u32, (String, Instant)> = HashMap::new();
    loop {
        let changed = inner.changed.notified();
        if inner.lease.alive() {
            match campaign(&inner).await {
                Ok(true) => {
                    if let Err(e) = assign(&inner, &mut gone_since, &mut avoided_since).await {
                        tracing::warn!(error = %e, "slot assignment round failed");
                    }
                }
                Ok(false) => {
                    gone_since.clear();
                    avoided_since.clear();
                }
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

/// This round's writes for `view`. `gone_for(node, d)` says whether a
/// member that is not live any more has been gone for `d` or longer;
/// members hold leases of `lease_ttl`.
fn decide(
    view: &View,
    lease_ttl: Duration,
    gone_for: &mut impl FnMut(&str, Duration) -> bool,
) -> Vec<Write> {
    // What a backup that left must have been gone for before its slots
    // drop it: long enough for an owner that died at the same moment to
    // have lost its lease (and its slots to wait for the backup instead).
    // A graceful stop ends a member's lease at once, a crash only at its
    // expiry: dropped after GRACE, the stopping node's copy was thrown
    // away while the dead owner still looked alive, and the slots stayed
    // down until that owner came back (found by a probe). A live owner
    // does not wait for this: it drops a backup it cannot reach itself.
    let backup_grace = lease_ttl + GRACE;
    // Who may be given slots: the live members but those leaving (which
    // still own theirs until they hand them over, or fail over).
    let live = takers(view);
    if live.is_empty() {
        return Vec::new();
    }
    let region_of = |n: &str| view.members.get(n).map(|m| m.region.clone());
    // Catch-ups beside a live backup (a backup coming home, a rebalance)
    // go at most `REBALANCE_AT_ONCE` at a time: a node back after an
    // outage would otherwise start hundreds of snapshots at once.
    let mut beside = view
        .slots
        .iter()
        .flatten()
        .filter(|e| e.record.backup.is_some() && e.record.joining.is_some())
        .count();
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
        // Live, and stopping: nothing more is given to it.
        let leaving = |n: &str| view.members.get(n).is_some_and(|m| m.leaving);
        let next = if !r.used {
            if r.owner != best && (is_live(&r.owner) || gone_for(&r.owner, GRACE)) {
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
                Some(b) if is_live(b) && gone_for(&r.owner, GRACE) => Some(SlotRecord {
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
            let slot_region = r.region.clone().or_else(|| region_of(&r.owner));
            match (&r.backup, &r.joining) {
                (Some(b), _) if !is_live(b) && gone_for(b, backup_grace) => Some(SlotRecord {
                    backup: None,
                    ..r.clone()
                }),
                // A rebalance's node catching up beside the backup died,
                // or is stopping.
                (Some(_), Some(j)) if (!is_live(j) && gone_for(j, GRACE)) || leaving(j) => {
                    Some(SlotRecord {
                        joining: None,
                        ..r.clone()
                    })
                }
                // A backup outside the slot's region (chosen while no node
                // there was live) while one there is: that one catches up
                // beside it and takes its place, as in a rebalance, so a
                // failover keeps the actors near their users. It stayed
                // until an operator's rebalance, and a failover took them
                // to the other region (found by a cluster probe).
                (Some(b), None)
                    if r.handoff.is_none()
                        && beside < REBALANCE_AT_ONCE
                        && candidate.as_deref().is_some_and(|c| {
                            c != b && region_of(c) == slot_region && region_of(b) != slot_region
                        }) =>
                {
                    beside += 1;
                    Some(SlotRecord {
                        joining: candidate,
                        ..r.clone()
                    })
                }
                (Some(_), _) => None,
                (None, Some(j)) if (!is_live(j) && gone_for(j, GRACE)) || leaving(j) => {
                    Some(SlotRecord {
                        joining: None,
                        ..r.clone()
                    })
                }
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

/// Clear the `avoid` of slots that have passed over a live node for
/// [`AVOID_FOR`] (since this controller first saw it; `since` keeps that),
/// unless this round changes the slot already.
fn forgive_avoided(
    view: &View,
    writes: &mut Vec<Write>,
    since: &mut HashMap<u32, (String, Instant)>,
    now: Instant,
) {
    let decided: BTreeSet<u32> = writes.iter().map(|w| w.slot).collect();
    let mut seen = HashMap::new();
    for slot in 0..SLOTS {
        let Some(e) = view.slots[slot as usize].as_ref() else {
            continue;
        };
        let Some(avoided) = e.record.avoid.as_deref() else {
            continue;
        };
        if !view.members.contains_key(avoided) {
            continue;
        }
        let first = match since.get(&slot) {
            Some((n, t)) if n == avoided => *t,
            _ => now,
        };
        seen.insert(slot, (avoided.to_owned(), first));
        if now.duration_since(first) >= AVOID_FOR && !decided.contains(&slot) {
            writes.push(Write {
                slot,
                revision: Some(e.mod_revision),
                record: SlotRecord {
                    avoid: None,
                    ..e.record.clone()
                },
                failover: false,
            });
        }
    }
    *since = seen;
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
        // A stopping owner hands its slots to their backups itself.
        let owner_leaving = view.members.get(&r.owner).is_some_and(|m| m.leaving);
        if decided.contains(&slot) || !r.used || owner_leaving {
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
async fn assign(
    inner: &Inner,
    gone_since: &mut HashMap<String, Instant>,
    avoided_since: &mut HashMap<u32, (String, Instant)>,
) -> anyhow::Result<()> {
    let (writes, rebalanced) = {
        let v = inner.view();
        let now = Instant::now();
        gone_since.retain(|n, _| !v.members.contains_key(n));
        let ttl = Duration::from_secs(inner.config.lease_ttl_s);
        let mut writes = decide(&v, ttl, &mut |node, d| {
            let since = *gone_since.entry(node.to_owned()).or_insert(now);
            now.duration_since(since) >= d
        });
        forgive_avoided(&v, &mut writes, avoided_since, now);
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
mod tests;
