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

use std::collections::HashMap;
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
    let live: Vec<&str> = view.members.keys().map(String::as_str).collect();
    if live.is_empty() {
        return Vec::new();
    }
    let mut writes = Vec::new();
    for slot in 0..SLOTS {
        let mut ranked = live.clone();
        ranked.sort_by_key(|n| std::cmp::Reverse(score(slot, n)));
        let (best, second) = (ranked[0], ranked.get(1).map(|n| (*n).to_owned()));
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
                Some(b) if is_live(b) && gone(&r.owner) => Some(SlotRecord {
                    owner: b.clone(),
                    epoch: r.epoch + 1,
                    used: true,
                    backup: None,
                    joining: None,
                    avoid: None,
                }),
                _ => None,
            }
        } else {
            // The runner-up among the live members other than the owner
            // (and the node the owner could not reach).
            let candidate = ranked
                .iter()
                .find(|n| **n != r.owner && Some(**n) != r.avoid.as_deref())
                .map(|n| (*n).to_owned());
            match (&r.backup, &r.joining) {
                (Some(b), _) if !is_live(b) && gone(b) => Some(SlotRecord {
                    backup: None,
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
                _ => None,
            }
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

/// One round: compute the writes, apply them in compare-and-swap batches.
async fn assign(inner: &Inner, gone_since: &mut HashMap<String, Instant>) -> anyhow::Result<()> {
    let writes = {
        let v = inner.view();
        let now = Instant::now();
        gone_since.retain(|n, _| !v.members.contains_key(n));
        decide(&v, &mut |node| {
            let since = *gone_since.entry(node.to_owned()).or_insert(now);
            now.duration_since(since) >= GRACE
        })
    };
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
        let keys = Keys::new("/m");
        let mut v = View::default();
        for (i, m) in members.iter().enumerate() {
            let rec = MemberRecord {
                node_id: (*m).into(),
                region: "r".into(),
                advertise: format!("http://127.0.0.1:{}", 1000 + i),
                incarnation: 1,
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
        let v = view(&["a", &joining], &[(3, avoided)]);
        assert_eq!(
            for_3(decide(&v, &mut |_| true)),
            None,
            "only the avoided node left"
        );
    }
}
