//! The controller's decisions, on views built by hand.

use super::*;
use crate::cluster::records::{Keys, MemberRecord};

/// The members' lease.
const TTL: Duration = Duration::from_secs(5);

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
    let writes = decide(&view(&["a", "b", "c"], &[]), TTL, &mut |_, _| true);
    assert_eq!(writes.len(), SLOTS as usize);
    for w in &writes {
        let b = w.record.backup.as_deref().expect("a backup");
        assert_ne!(b, w.record.owner);
    }
    // Alone: no backup to give.
    let writes = decide(&view(&["a"], &[]), TTL, &mut |_, _| true);
    assert!(writes.iter().all(|w| w.record.backup.is_none()));
    // In the owner's region when a node there is live (a failover then
    // keeps the slot near its users), else anywhere.
    let v = view_in(&[("a", "eu"), ("b", "eu"), ("c", "us")], &[]);
    for w in decide(&v, TTL, &mut |_, _| true) {
        let b = w.record.backup.expect("a backup");
        match w.record.owner.as_str() {
            "c" => assert_ne!(b, "c"),
            _ => assert_ne!(b, "c", "slot {} backed up across regions", w.slot),
        }
    }
}

/// Members a, b and c (region eu), c leaving, and `slots`.
fn c_leaving(slots: &[(u32, SlotRecord)]) -> View {
    let mut v = view_in(&[("a", "eu"), ("b", "eu"), ("c", "eu")], slots);
    v.members.get_mut("c").expect("c").leaving = true;
    v
}

/// A member that is leaving (a graceful stop) keeps the slots it owns,
/// but is given none: not as owner, backup, joining node or a
/// rebalance's target.
#[test]
fn a_leaving_member_is_given_nothing() {
    let v = c_leaving(&[]);
    for w in decide(&v, TTL, &mut |_, _| true) {
        assert_ne!(w.record.owner, "c", "slot {}", w.slot);
        assert_ne!(w.record.backup.as_deref(), Some("c"), "slot {}", w.slot);
    }
    // Its used slots stay its own (they are handed over, or fail over
    // once it is gone); one without a backup gets another joining node.
    let slots: Vec<_> = (0..SLOTS)
        .map(|s| (s, slot("c", None, true, 2)))
        .chain([(7, slot("a", None, true, 2))])
        .collect();
    let v = c_leaving(&slots);
    for w in decide(&v, TTL, &mut |_, _| true) {
        assert_eq!(w.record.owner, if w.slot == 7 { "a" } else { "c" });
        assert_ne!(w.record.joining.as_deref(), Some("c"), "slot {}", w.slot);
    }
    // A node catching up that starts to leave is withdrawn.
    let mut catching_up = slot("a", None, true, 2);
    catching_up.joining = Some("c".into());
    let v = c_leaving(&[(5, catching_up)]);
    let w = decide(&v, TTL, &mut |_, _| true)
        .into_iter()
        .find(|w| w.slot == 5)
        .expect("a write for slot 5");
    assert_ne!(w.record.joining.as_deref(), Some("c"));
    // A rebalance sends no slot to it, and leaves its own slots to its stop.
    let slots: Vec<_> = (0..SLOTS)
        .map(|s| (s, slot("a", Some("b"), true, 2)))
        .collect();
    let v = c_leaving(&slots);
    let (writes, _) = rebalance(&v, &BTreeSet::new());
    for w in writes {
        assert_ne!(w.record.handoff.as_deref(), Some("c"), "slot {}", w.slot);
        assert_ne!(w.record.joining.as_deref(), Some("c"), "slot {}", w.slot);
    }
    let slots: Vec<_> = (0..SLOTS)
        .map(|s| (s, slot("c", Some("a"), true, 2)))
        .collect();
    let v = c_leaving(&slots);
    let (writes, _) = rebalance(&v, &BTreeSet::new());
    assert!(writes.is_empty(), "{writes:?}");
}

#[test]
fn a_used_slot_fails_over_to_its_backup_only_after_the_grace_period() {
    let slots = [(3, slot("gone", Some("b"), true, 4))];
    let v = view(&["a", "b"], &slots);
    let for_3 = |ws: Vec<Write>| ws.into_iter().find(|w| w.slot == 3);
    assert_eq!(
        for_3(decide(&v, TTL, &mut |_, _| false)),
        None,
        "within the grace"
    );
    let w = for_3(decide(&v, TTL, &mut |_, _| true)).expect("a failover");
    assert_eq!(w.record, slot("b", None, true, 5));
    assert!(w.failover);
    // No live backup: the slot waits for its owner.
    let v = view(&["a"], &slots);
    assert_eq!(for_3(decide(&v, TTL, &mut |_, _| true)), None);
    // A dead backup of a live owner is dropped (degraded), epoch kept:
    // once an owner that died with it would have lost its lease too (a
    // graceful stop ends the backup's at once; dropped before, its copy
    // was lost while the dead owner still looked alive).
    let v = view(&["a"], &[(3, slot("a", Some("gone"), true, 4))]);
    let past = |d: Duration| move |_: &str, needed: Duration| needed <= d;
    assert_eq!(
        for_3(decide(&v, TTL, &mut past(GRACE))),
        None,
        "dropped within the lease"
    );
    assert_eq!(
        for_3(decide(&v, TTL, &mut past(TTL))),
        None,
        "dropped within the lease"
    );
    let w = for_3(decide(&v, TTL, &mut past(TTL + GRACE))).expect("backup dropped");
    assert_eq!(w.record, slot("a", None, true, 4));
    assert!(!w.failover);
    // A used slot never moves to a node without its data: a slot
    // without a backup gets a joining node, which is not promoted.
    let v = view(&["a", "b", "c"], &[(3, slot("a", None, true, 4))]);
    let w = for_3(decide(&v, TTL, &mut |_, _| true)).expect("a joining node");
    assert_eq!(w.record.owner, "a");
    assert!(w.record.backup.is_none());
    let joining = w.record.joining.clone().expect("joining");
    assert_ne!(joining, "a");
    let v = view(&["b", "c"], &[(3, w.record.clone())]);
    assert_eq!(
        for_3(decide(&v, TTL, &mut |_, _| true)),
        None,
        "a joining node took over"
    );
    // A node the owner could not reach is not chosen again.
    let avoided = SlotRecord {
        avoid: Some(joining.clone()),
        ..slot("a", None, true, 4)
    };
    let v = view(&["a", "b", "c"], &[(3, avoided.clone())]);
    let w = for_3(decide(&v, TTL, &mut |_, _| true)).expect("another joining node");
    assert_ne!(w.record.joining, Some(joining.clone()));
    let v = view(&["a", &joining], &[(3, avoided.clone())]);
    assert_eq!(
        for_3(decide(&v, TTL, &mut |_, _| true)),
        None,
        "only the avoided node left"
    );
    // Once it has left, it is avoided no more: back, it is chosen.
    let v = view(&["a"], &[(3, avoided)]);
    let w = for_3(decide(&v, TTL, &mut |_, _| false)).expect("the avoid cleared");
    assert_eq!(w.record.avoid, None);
    assert_eq!(w.record.joining, None);
    let v = view(&["a", &joining], &[(3, w.record)]);
    let w = for_3(decide(&v, TTL, &mut |_, _| true)).expect("a joining node");
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
    let w = for_3(decide(&v, TTL, &mut |_, _| true)).expect("a failover");
    assert_eq!((w.record.owner.as_str(), w.failover), ("c", true));
    assert_eq!(w.record.region.as_deref(), Some("eu"));
    // Owned in us without a backup: the backup that joins is in eu.
    let v = view_in(&members, &[(3, slot_of("eu", "c", None))]);
    let w = for_3(decide(&v, TTL, &mut |_, _| true)).expect("a joining node");
    let joining = w.record.joining.expect("joining");
    assert!(["a", "b"].contains(&joining.as_str()), "{joining}");
    // Owned in eu, backed up in us (no eu node was live then): an eu
    // node catches up beside the backup, to take its place.
    let v = view_in(&members, &[(3, slot_of("eu", "a", Some("c")))]);
    let w = for_3(decide(&v, TTL, &mut |_, _| true)).expect("a joining node");
    assert_eq!(w.record.joining.as_deref(), Some("b"));
    assert_eq!(w.record.backup.as_deref(), Some("c"), "kept until then");
    // Not while a rebalance hands it over, nor without an eu node to take
    // it, nor when the backup is in the region already.
    let handing = SlotRecord {
        handoff: Some("c".into()),
        ..slot_of("eu", "a", Some("c"))
    };
    let v = view_in(&members, &[(3, handing)]);
    assert_eq!(for_3(decide(&v, TTL, &mut |_, _| true)), None);
    let v = view_in(
        &[("a", "eu"), ("c", "us")],
        &[(3, slot_of("eu", "a", Some("c")))],
    );
    assert_eq!(for_3(decide(&v, TTL, &mut |_, _| true)), None);
    let v = view_in(&members, &[(3, slot_of("eu", "a", Some("b")))]);
    assert_eq!(for_3(decide(&v, TTL, &mut |_, _| true)), None);
    // Many such slots: a few catch up at a time.
    let many: Vec<(u32, SlotRecord)> = (0..40)
        .map(|s| (s, slot_of("eu", "a", Some("c"))))
        .collect();
    let v = view_in(&members, &many);
    let joining = decide(&v, TTL, &mut |_, _| true)
        .into_iter()
        .filter(|w| w.record.joining.is_some())
        .count();
    assert_eq!(joining, REBALANCE_AT_ONCE);
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
    let w = for_3(decide(&v, TTL, &mut |_, _| true)).expect("region filled in");
    assert_eq!(
        w.record,
        SlotRecord {
            region: Some("eu".into()),
            ..legacy
        }
    );
}

/// A live node the owner could not reach is passed over as the backup for
/// a while, then may be chosen again: in a cluster of two, a pause of a
/// few seconds left the slot on one disk for good.
#[test]
fn an_avoided_live_node_is_forgiven_after_a_while() {
    let avoided = SlotRecord {
        avoid: Some("b".into()),
        ..slot("a", None, true, 3)
    };
    let v = view(&["a", "b"], &[(3, avoided.clone())]);
    // Not chosen now: it is avoided, and nobody else is live.
    assert!(
        decide(&v, TTL, &mut |_, _| true)
            .iter()
            .all(|w| w.slot != 3)
    );
    let mut since = HashMap::new();
    let t0 = Instant::now();
    let mut writes = Vec::new();
    forgive_avoided(&v, &mut writes, &mut since, t0);
    assert!(writes.is_empty(), "forgiven at once");
    forgive_avoided(&v, &mut writes, &mut since, t0 + AVOID_FOR / 2);
    assert!(writes.is_empty(), "forgiven too soon");
    forgive_avoided(&v, &mut writes, &mut since, t0 + AVOID_FOR);
    let [w] = &writes[..] else {
        panic!("{writes:?}")
    };
    assert_eq!(
        w.record,
        SlotRecord {
            avoid: None,
            ..avoided.clone()
        }
    );
    // Once forgiven, the next round has it catch up as the backup.
    let v = view(&["a", "b"], &[(3, w.record.clone())]);
    let next = decide(&v, TTL, &mut |_, _| true);
    let w = next.iter().find(|w| w.slot == 3).expect("a joining node");
    assert_eq!(w.record.joining.as_deref(), Some("b"));
    // A node that is not live is not tracked (it is cleared when it left).
    let v = view(&["a"], &[(3, avoided)]);
    let mut writes = Vec::new();
    forgive_avoided(&v, &mut writes, &mut since, t0);
    assert!(since.is_empty());
}
