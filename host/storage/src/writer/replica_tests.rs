//! Replication in the writer, checked without a node: what an owner ships
//! to its slot's backup and when it releases it, how a backup applies it
//! (once, in order, only while it is the backup), and a joining
//! backup's snapshot. An actor's rows moving between slots: `move_tests.rs`.

use std::sync::Arc;

use marmot_core::ids::ActorKey;
use tokio::sync::oneshot;

use super::tests::{create, open, turn, with_effects};
use super::{CommitFailed, CommitTracker, WriteOp};
use crate::Storage;

/// A queued message `m1` under idempotency key `k1`.
pub(super) fn keyed_message() -> crate::schema::InboxRecord {
    crate::schema::InboxRecord {
        message_id: "m1".into(),
        body: b"{}".to_vec(),
        content_type: None,
        idempotency_key: Some("k1".into()),
        attempts: 0,
        enqueued_at_ms: 7,
        kind: crate::schema::InboxKind::Message,
    }
}

/// A replication that collects what the writer ships and releases each
/// batch when the test says so.
pub(super) type Shipment = (Vec<crate::schema::ReplicaBatch>, super::Release);

#[derive(Default)]
pub(super) struct Collect {
    shipped: std::sync::Mutex<Vec<Shipment>>,
}

impl super::Replication for Collect {
    fn slot_of(&self, _: &ActorKey) -> u32 {
        7
    }

    fn placement(&self, key: &ActorKey) -> super::Placement {
        // Actors whose id starts with `r` replicate (slot 7, epoch 3);
        // those starting with `x` are another node's.
        match key.id().as_bytes()[0] {
            b'r' => super::Placement::Replicated { slot: 7, epoch: 3 },
            b'x' => super::Placement::Elsewhere,
            _ => super::Placement::Here,
        }
    }

    fn slot_placement(&self, slot: u32) -> super::Placement {
        match slot {
            7 => super::Placement::Replicated { slot: 7, epoch: 3 },
            13 => super::Placement::Elsewhere,
            _ => super::Placement::Here,
        }
    }

    /// This node keeps slot 8's rows too.
    fn holds(&self, slot: u32) -> bool {
        slot == 8
    }

    fn ship(&self, batches: Vec<crate::schema::ReplicaBatch>, release: super::Release) {
        self.shipped.lock().unwrap().push((batches, release));
    }
}

impl Collect {
    /// Wait for the next shipment.
    pub(super) async fn next(&self) -> Shipment {
        for _ in 0..500 {
            {
                let mut s = self.shipped.lock().unwrap();
                if !s.is_empty() {
                    return s.remove(0);
                }
            }
            tokio::time::sleep(std::time::Duration::from_millis(2)).await;
        }
        panic!("nothing shipped");
    }
}

/// Release every shipment until `rx` has its answer.
pub(super) async fn until<T>(c: &Collect, mut rx: oneshot::Receiver<T>) -> T {
    loop {
        if let Ok(v) = rx.try_recv() {
            return v;
        }
        let (_, release) = c.next().await;
        release(Ok(()));
    }
}

/// A subscription to every event, put on `storage`.
pub(super) async fn subscribe(storage: &Storage, c: Option<&Collect>) {
    let (done, rx) = oneshot::channel();
    storage.writer().submit(WriteOp::PutSubscription {
        name: "all".into(),
        record: crate::schema::SubscriptionRecord {
            url: "http://127.0.0.1:9/".into(),
            events: vec!["*".into()],
            types: Vec::new(),
            secret: "whsec_x".into(),
            created_at_ms: 1,
        },
        done,
    });
    match c {
        Some(c) => until(c, rx).await.unwrap(),
        None => rx.await.unwrap().unwrap(),
    };
}

/// One event of kind `kind`, as a turn appends it at seq `seq`.
fn event(seq: u64, kind: &str) -> (u64, crate::schema::EventRecord) {
    (
        seq,
        crate::schema::EventRecord {
            kind: kind.into(),
            data: b"{}".to_vec(),
            at_ms: 5,
        },
    )
}

/// Turn `op` emitting one event of `kind` (an outbound delivery, with a
/// subscription), and relaying a keyed message when `send`.
pub(super) fn emitting(op: WriteOp, kind: &str, send: bool) -> WriteOp {
    let WriteOp::Turn(mut t) = op else {
        unreachable!()
    };
    t.events = vec![event(1, kind)];
    if send {
        t.sends = vec![(ActorKey::new("t", "other").unwrap(), keyed_message())];
        t.relay_sends = true;
    }
    WriteOp::Turn(t)
}

/// Submit the creation of `t/{id}` without waiting for it: on a
/// replicating writer it completes only once its batch is released.
pub(super) fn submit_create(
    storage: &Storage,
    id: &str,
) -> (
    ActorKey,
    oneshot::Receiver<Result<crate::schema::ActorRecord, crate::StorageError>>,
) {
    let key = ActorKey::new("t", id).unwrap();
    let (done, rx) = oneshot::channel();
    storage.writer().submit(WriteOp::GetOrCreate {
        key: key.clone(),
        version: 1,
        early: None,
        done,
    });
    (key, rx)
}

pub(super) async fn apply_on(
    storage: &Storage,
    batch: crate::schema::ReplicaBatch,
    accept: bool,
) -> super::ReplicaApplied {
    storage
        .writer()
        .call(|done| WriteOp::Replica {
            batch,
            accept: Box::new(move || accept),
            done,
        })
        .await
        .unwrap()
}

#[tokio::test]
async fn a_backup_applies_what_the_owner_shipped_once_and_only_while_it_is_the_backup() {
    use crate::schema::*;
    let (_a_dir, owner) = open();
    let (_b_dir, backup) = open();
    let collect = Arc::new(Collect::default());
    assert!(owner.writer().replicate(collect.clone()));
    // An actor that does not replicate takes a number on the backup first,
    // so that numbers differ between the nodes.
    create(&backup, "local").await;

    // Creation, a turn (state, an event, an alarm), a durable message.
    let (key, created) = submit_create(&owner, "r1");
    let rec = {
        let (batches, release) = collect.next().await;
        assert_eq!(batches.len(), 1);
        assert!(matches!(batches[0].ops[..], [ReplicaOp::Create { .. }]));
        assert_eq!(batches[0].mark, ReplicaMark { epoch: 3, lsn: 1 });
        assert_eq!(
            apply_on(&backup, batches[0].clone(), true).await,
            super::ReplicaApplied::Applied
        );
        release(Ok(()));
        created.await.unwrap().unwrap()
    };
    let tracker = Arc::new(CommitTracker::default());
    let (op, rx) = turn(&key, &rec, &tracker, 0, 1, "k", "v1");
    // With an event, an alarm, an input request and a message (to itself,
    // dropped: no type is deployed here), all shipped in one batch.
    owner.writer().submit(with_effects(op, &key));
    let (batches, release) = collect.next().await;
    // The output gate: nothing is released before the replication says so.
    tokio::time::sleep(std::time::Duration::from_millis(20)).await;
    let mut rx = rx;
    assert!(
        rx.try_recv().is_err(),
        "a turn was released before its backup had it"
    );
    let batch = batches[0].clone();
    assert_eq!(batch.mark.lsn, 2);
    assert_eq!(
        apply_on(&backup, batch.clone(), true).await,
        super::ReplicaApplied::Applied
    );
    // A repeat (a lost acknowledgement) changes nothing.
    assert_eq!(
        apply_on(&backup, batch.clone(), true).await,
        super::ReplicaApplied::Repeat
    );
    // A batch after a missing one is refused.
    let mut later = batch;
    later.mark.lsn += 2;
    assert_eq!(
        apply_on(&backup, later, true).await,
        super::ReplicaApplied::Gap
    );
    release(Ok(()));
    rx.await.unwrap().unwrap();

    let message = keyed_message();
    let (done, queued) = oneshot::channel();
    owner.writer().submit(WriteOp::Enqueue {
        key: key.clone(),
        version: 1,
        message,
        idempotency_ttl_ms: 1000,
        done,
    });
    let (batches, release) = collect.next().await;
    // Not the backup (any more): refused, nothing written.
    assert_eq!(
        apply_on(&backup, batches[0].clone(), false).await,
        super::ReplicaApplied::Refused
    );
    assert_eq!(
        apply_on(&backup, batches[0].clone(), true).await,
        super::ReplicaApplied::Applied
    );
    release(Ok(()));
    queued.await.unwrap().unwrap();

    // The backup holds the actor as the owner does, under its own number.
    let (o, b) = (owner.reader().unwrap(), backup.reader().unwrap());
    let (on, bn) = (
        o.actor(&key).unwrap().unwrap().num,
        b.actor(&key).unwrap().unwrap().num,
    );
    assert_ne!(on, bn);
    assert_eq!(b.state(bn, "k").unwrap().as_deref(), Some(&b"v1"[..]));
    assert_eq!(
        b.events(bn, 0, 10, usize::MAX).unwrap(),
        o.events(on, 0, 10, usize::MAX).unwrap()
    );
    assert_eq!(b.alarms(bn).unwrap(), o.alarms(on).unwrap());
    assert_eq!(b.inbox(bn, 0, 10).unwrap(), o.inbox(on, 0, 10).unwrap());
    assert_eq!(
        b.idempotency(bn, "k1").unwrap(),
        o.idempotency(on, "k1").unwrap()
    );
    assert_eq!(b.actor(&key).unwrap().map(|r| r.version), Some(1));
    drop((o, b));

    // An actor another node owns: its writes are refused here (the fence
    // is in storage), and the rest of the batch commits.
    let (release_hold, until) = std::sync::mpsc::channel();
    owner.writer().submit(WriteOp::Hold { until });
    let (_, refused) = submit_create(&owner, "x1");
    let (_, fine) = submit_create(&owner, "y1");
    drop(release_hold);
    loop {
        let (_, release) = collect.next().await;
        release(Ok(()));
        if !fine.is_empty() {
            break;
        }
    }
    assert!(matches!(
        refused.await.unwrap(),
        Err(crate::StorageError::CommitFailed(CommitFailed::Moved(_)))
    ));
    assert!(fine.await.unwrap().is_ok());
    assert!(
        owner
            .reader()
            .unwrap()
            .actor(&ActorKey::new("t", "x1").unwrap())
            .unwrap()
            .is_none()
    );
}

/// Slot 9 (actors `j…`) has a node catching up to become its backup.
/// With `auto`, shipments are released at once (a node applying them).
struct Joining(Collect, bool);

impl super::Replication for Joining {
    fn slot_of(&self, key: &ActorKey) -> u32 {
        if key.id().starts_with('j') { 9 } else { 7 }
    }

    fn placement(&self, key: &ActorKey) -> super::Placement {
        if key.id().starts_with('j') {
            super::Placement::Joining {
                slot: 9,
                epoch: 2,
                session: 1,
            }
        } else {
            super::Placement::Here
        }
    }

    fn slot_placement(&self, slot: u32) -> super::Placement {
        match slot {
            9 => super::Placement::Joining {
                slot: 9,
                epoch: 2,
                session: 1,
            },
            _ => super::Placement::Here,
        }
    }

    fn holds(&self, _: u32) -> bool {
        false
    }

    fn ship(&self, batches: Vec<crate::schema::ReplicaBatch>, release: super::Release) {
        if self.1 {
            release(Ok(()));
        } else {
            self.0.ship(batches, release);
        }
    }
}

#[tokio::test]
async fn a_joining_backup_gets_a_snapshot_of_the_slot_then_every_write() {
    let (_a_dir, owner) = open();
    let (_b_dir, backup) = open();
    let shipped = Arc::new(Joining(Collect::default(), false));
    assert!(owner.writer().replicate(shipped.clone()));
    assert!(
        backup
            .writer()
            .replicate(Arc::new(Joining(Collect::default(), true)))
    );
    // Before the snapshot, the slot's writes stay here.
    let (key, rx) = submit_create(&owner, "j1");
    let rec = until(&shipped.0, rx).await.unwrap();
    let tracker = Arc::new(CommitTracker::default());
    subscribe(&owner, Some(&shipped.0)).await;
    let (op, rx) = turn(&key, &rec, &tracker, 0, 1, "k", "before");
    owner.writer().submit(emitting(op, "hi", false));
    until(&shipped.0, rx).await.unwrap();
    // The backup holds an old copy of another actor of the slot, with an
    // outbound delivery.
    let (stale, stale_rec) = create(&backup, "j-stale").await;
    subscribe(&backup, None).await;
    let (op, rx) = turn(&stale, &stale_rec, &tracker, 0, 1, "k", "old");
    backup.writer().submit(emitting(op, "old", false));
    rx.await.unwrap().unwrap();

    let (done, rx) = oneshot::channel();
    owner.writer().submit(WriteOp::Snapshot {
        slots: vec![(9, 2, 1)],
        done,
    });
    let (batches, release) = shipped.0.next().await;
    assert_eq!(batches.len(), 1);
    let snapshot = batches[0].clone();
    assert!(snapshot.snapshot.is_some());
    assert!(matches!(
        snapshot.ops[..],
        [
            crate::schema::ReplicaOp::Install(_),
            crate::schema::ReplicaOp::Delivery { .. }
        ]
    ));
    assert_eq!(
        apply_on(&backup, snapshot, true).await,
        super::ReplicaApplied::Applied
    );
    release(Ok(()));
    assert_eq!(rx.await.unwrap().unwrap(), 1);
    // From now on the slot's writes are shipped, following the snapshot.
    let (op, rx) = turn(&key, &rec, &tracker, 0, 2, "k", "after");
    owner.writer().submit(op);
    let (batches, release) = shipped.0.next().await;
    assert_eq!(batches.len(), 1);
    assert!(batches[0].snapshot.is_none());
    assert_eq!(
        apply_on(&backup, batches[0].clone(), true).await,
        super::ReplicaApplied::Applied
    );
    release(Ok(()));
    rx.await.unwrap().unwrap();
    let r = backup.reader().unwrap();
    assert!(
        r.actor(&ActorKey::new("t", "j-stale").unwrap())
            .unwrap()
            .is_none(),
        "the old copy stayed"
    );
    let due = r.deliveries_due(u64::MAX, 10, |_| true).unwrap();
    assert_eq!(due.len(), 1, "the old copy's delivery stayed");
    assert_eq!(due[0].1.actor_id, "j1");
    let num = r.actor(&key).unwrap().unwrap().num;
    assert_eq!(r.state(num, "k").unwrap().as_deref(), Some(&b"after"[..]));
}

/// Outgoing rows: the owner ships each outbound webhook delivery and each
/// relayed send its slot's actors commit, and what became of them, to the
/// backup, which keeps copies under its own seqs (found by their ids) and
/// so can go on where the owner stopped. Only the owner sends them.
#[tokio::test]
async fn a_backup_keeps_the_slots_outgoing_rows_and_what_became_of_them() {
    use crate::schema::*;
    let (_a_dir, owner) = open();
    let (_b_dir, backup) = open();
    let collect = Arc::new(Collect::default());
    assert!(owner.writer().replicate(collect.clone()));
    subscribe(&owner, Some(&collect)).await;
    // The backup has a delivery of its own first: seqs differ.
    subscribe(&backup, None).await;
    let (local, local_rec) = create(&backup, "local").await;
    let (op, rx) = turn(&local, &local_rec, &Default::default(), 0, 1, "k", "v");
    backup.writer().submit(emitting(op, "mine", false));
    rx.await.unwrap().unwrap();

    let (key, rx) = submit_create(&owner, "r1");
    let (batches, release) = collect.next().await;
    apply_on(&backup, batches[0].clone(), true).await;
    release(Ok(()));
    let rec = rx.await.unwrap().unwrap();
    // A turn with an event (one delivery) and a relayed send.
    let (op, rx) = turn(&key, &rec, &Default::default(), 0, 1, "k", "v");
    owner.writer().submit(emitting(op, "hi", true));
    let (batches, release) = collect.next().await;
    assert!(matches!(
        batches[0].ops[..],
        [
            ReplicaOp::Delivery {
                record: Some(_),
                ..
            },
            ReplicaOp::Turn(_),
            ReplicaOp::Relay {
                record: Some(_),
                ..
            }
        ]
    ));
    apply_on(&backup, batches[0].clone(), true).await;
    release(Ok(()));
    rx.await.unwrap().unwrap();

    let all = |_: &DeliveryHead| true;
    let any = |_: &RelayRecord| true;
    let o = owner.reader().unwrap();
    let [(oseq, row)] = &o.deliveries_due(u64::MAX, 10, all).unwrap()[..] else {
        panic!("one delivery on the owner")
    };
    let [(relay_seq, relayed)] = &o.relay_page(10, any).unwrap()[..] else {
        panic!("one relayed send on the owner")
    };
    assert_eq!(relayed.from, Some(("t".into(), "r1".into())));
    let (oseq, relay_seq, id) = (*oseq, *relay_seq, row.webhook_id.clone());
    drop(o);
    let copy = |storage: &Storage| storage.reader().unwrap().delivery_by_id(&id).unwrap();
    assert_eq!(copy(&backup).as_ref(), Some(row), "the backup has the row");
    let b = backup.reader().unwrap();
    assert_eq!(b.deliveries_due(u64::MAX, 10, all).unwrap().len(), 2);
    assert_ne!(
        b.deliveries_due(u64::MAX, 10, all).unwrap()[1].0,
        oseq,
        "under its own seq"
    );
    assert_eq!(b.relay_page(10, any).unwrap()[0].1, *relayed);
    b.assert_outbox_heads_in_step();
    drop(b);
    // Only the owner of an actor's slot sends what it committed.
    assert!(owner.writer().sends_for(&key));
    assert!(!owner.writer().sends_for(&ActorKey::new("t", "x1").unwrap()));

    // A failed attempt, a replay, then the delivery: each reaches the copy.
    let mut failed = row.clone();
    failed.attempts = 1;
    failed.next_attempt_ms = u64::MAX / 2;
    failed.last_error = Some("HTTP 500".into());
    let (done, rx) = oneshot::channel();
    owner.writer().submit(WriteOp::DeliveryAttempted {
        seq: oseq,
        update: Some(failed.clone()),
        read_as: None,
        done,
    });
    let (batches, release) = collect.next().await;
    apply_on(&backup, batches[0].clone(), true).await;
    release(Ok(()));
    rx.await.unwrap().unwrap();
    assert_eq!(copy(&backup), Some(failed));
    let b = backup.reader().unwrap();
    assert_eq!(b.deliveries_due(u64::MAX / 4, 10, all).unwrap().len(), 1);
    drop(b);
    let (done, rx) = oneshot::channel();
    owner.writer().submit(WriteOp::RetryDelivery {
        id: id.clone(),
        done,
    });
    let (batches, release) = collect.next().await;
    apply_on(&backup, batches[0].clone(), true).await;
    release(Ok(()));
    // (A retry of one still pending keeps its attempts.)
    assert_eq!(rx.await.unwrap().unwrap().unwrap().attempts, 1);
    assert_eq!(copy(&backup).unwrap().attempts, 1);
    for op in [
        WriteOp::DeliveryAttempted {
            seq: oseq,
            update: None,
            read_as: None,
            done: oneshot::channel().0,
        },
        WriteOp::RelayDone {
            seqs: vec![relay_seq],
            done: oneshot::channel().0,
        },
    ] {
        owner.writer().submit(op);
        let (batches, release) = collect.next().await;
        apply_on(&backup, batches[0].clone(), true).await;
        release(Ok(()));
    }
    assert_eq!(copy(&owner), None);
    assert_eq!(copy(&backup), None, "delivered: the copy went");
    let b = backup.reader().unwrap();
    assert!(b.relay_page(10, any).unwrap().is_empty(), "handed over");
    assert_eq!(b.deliveries_due(u64::MAX, 10, all).unwrap().len(), 1);
    drop(b);
    // An attempt whose row went meanwhile (moved away) writes nothing.
    let (done, rx) = oneshot::channel();
    owner.writer().submit(WriteOp::DeliveryAttempted {
        seq: oseq,
        update: Some(row.clone()),
        read_as: None,
        done,
    });
    until(&collect, rx).await.unwrap();
    assert_eq!(copy(&owner), None, "a delivered row came back");
    owner.reader().unwrap().assert_outbox_heads_in_step();
    backup.reader().unwrap().assert_outbox_heads_in_step();
}

/// A subscription, and the one delivery (seq and row) of an event the
/// actor emitted.
async fn one_delivery(
    storage: &Storage,
) -> (
    ActorKey,
    crate::schema::ActorRecord,
    u64,
    crate::schema::DeliveryRecord,
) {
    use crate::schema::DeliveryHead;
    subscribe(storage, None).await;
    let (key, rec) = create(storage, "a").await;
    let (op, rx) = turn(&key, &rec, &Default::default(), 0, 1, "k", "v");
    storage.writer().submit(emitting(op, "first", false));
    rx.await.unwrap().unwrap();
    let all = |_: &DeliveryHead| true;
    let due = storage.reader().unwrap().deliveries_due(u64::MAX, 10, all);
    let [(seq, row)] = &due.unwrap()[..] else {
        panic!("one delivery")
    };
    (key, rec, *seq, row.clone())
}

/// A retry asked for while an attempt is in flight stands: the attempt's
/// failure is not written over the retried row. It was, and the 202 of
/// the retry meant nothing (the row went dead after the last allowed
/// attempt; a re-probe found the first attempt's failure undid it too).
#[tokio::test]
async fn a_retry_during_an_attempt_is_not_undone_by_its_failure() {
    use crate::schema::*;
    let (_dir, storage) = open();
    let (_, _, seq, row) = one_delivery(&storage).await;
    let attempted = |update: DeliveryRecord, read: &DeliveryRecord| {
        let read_as = Some((read.attempts, read.next_attempt_ms));
        storage
            .writer()
            .call(move |done| WriteOp::DeliveryAttempted {
                seq,
                update: Some(update),
                read_as,
                done,
            })
    };
    let now = |s: &Storage| s.reader().unwrap().delivery(seq).unwrap().unwrap();
    let retry = || {
        storage.writer().call(|done| WriteOp::RetryDelivery {
            id: row.webhook_id.clone(),
            done,
        })
    };
    // The first attempt reads the row; a retry comes while it runs; it
    // fails (for good, as with `max_attempts = 1`).
    let read = now(&storage);
    assert_eq!(retry().await.unwrap().unwrap().attempts, 0);
    let mut dead = read.clone();
    dead.attempts = 1;
    dead.status = DeliveryStatus::Dead;
    attempted(dead, &read).await.unwrap();
    let after = now(&storage);
    assert_eq!(
        (after.status, after.attempts),
        (DeliveryStatus::Pending, 0),
        "the retry was undone"
    );
    // An attempt that nothing overtook is written.
    let mut failed = after.clone();
    failed.attempts = 1;
    failed.next_attempt_ms = u64::MAX / 2;
    attempted(failed, &after).await.unwrap();
    assert_eq!(now(&storage).attempts, 1);
}

/// Deleting a subscription removes its rows, pending or dead, heads and
/// all, and leaves another subscription's (it finds them by their heads).
#[tokio::test]
async fn deleting_a_subscription_removes_its_rows_and_no_others() {
    use crate::schema::*;
    let (_dir, storage) = open();
    let (key, rec, seq, mut dead) = one_delivery(&storage).await;
    let all = |_: &DeliveryHead| true;
    dead.status = DeliveryStatus::Dead;
    storage
        .writer()
        .call(|done| WriteOp::DeliveryAttempted {
            seq,
            update: Some(dead.clone()),
            read_as: None,
            done,
        })
        .await
        .unwrap();
    // A second subscription, and a pending row for each.
    let (done, rx) = oneshot::channel();
    storage.writer().submit(WriteOp::PutSubscription {
        name: "other".into(),
        record: SubscriptionRecord {
            url: "http://127.0.0.1:9/".into(),
            events: vec!["*".into()],
            types: Vec::new(),
            secret: "whsec_y".into(),
            created_at_ms: 1,
        },
        done,
    });
    rx.await.unwrap().unwrap();
    let (op, rx) = turn(&key, &rec, &Default::default(), 0, 2, "k", "w");
    storage.writer().submit(emitting(op, "second", false));
    rx.await.unwrap().unwrap();
    let subs = |s: &Storage| {
        let page = s.reader().unwrap().deliveries(0, 10, |_| true).unwrap().0;
        (page.into_iter())
            .map(|(_, d)| (d.label(), d.subscription, d.kind))
            .collect::<Vec<_>>()
    };
    assert_eq!(
        subs(&storage),
        [
            ("dead", "all".into(), "first".into()),
            ("pending", "all".into(), "second".into()),
            ("pending", "other".into(), "second".into()),
        ]
    );
    storage
        .writer()
        .call(|done| WriteOp::DeleteSubscription {
            name: "all".into(),
            done,
        })
        .await
        .unwrap();
    assert_eq!(
        subs(&storage),
        [("pending", "other".into(), "second".into())]
    );
    let r = storage.reader().unwrap();
    assert_eq!(r.delivery_by_id(&dead.webhook_id).unwrap(), None);
    assert_eq!(r.deliveries_due(u64::MAX, 10, all).unwrap().len(), 1);
    r.assert_outbox_heads_in_step();
}

/// The dead-letter list's retention: dead rows of events made before the
/// cut-off go (heads and all), newer dead rows and pending ones stay.
#[tokio::test]
async fn dead_deliveries_past_their_retention_are_removed() {
    use crate::schema::*;
    let (_dir, storage) = open();
    subscribe(&storage, None).await;
    let (key, rec) = create(&storage, "a").await;
    for (i, kind) in ["old", "new", "pending"].iter().enumerate() {
        let (op, rx) = turn(&key, &rec, &Default::default(), 0, i as u64 + 1, "k", "v");
        storage.writer().submit(emitting(op, kind, false));
        rx.await.unwrap().unwrap();
    }
    let all = |_: &DeliveryHead| true;
    let rows = storage.reader().unwrap().deliveries_due(u64::MAX, 10, all);
    for (seq, row) in rows.unwrap() {
        let mut row = row.clone();
        match row.kind.as_str() {
            "old" => (row.status, row.created_at_ms) = (DeliveryStatus::Dead, 1_000),
            "new" => (row.status, row.created_at_ms) = (DeliveryStatus::Dead, 5_000),
            _ => row.created_at_ms = 1_000,
        }
        storage
            .writer()
            .call(|done| WriteOp::DeliveryAttempted {
                seq,
                update: Some(row),
                read_as: None,
                done,
            })
            .await
            .unwrap();
    }
    let prune = || {
        storage.writer().call(|done| WriteOp::PruneDeadDeliveries {
            created_before_ms: 5_000,
            done,
        })
    };
    assert_eq!(prune().await.unwrap(), 1);
    assert_eq!(prune().await.unwrap(), 0, "nothing more to remove");
    let r = storage.reader().unwrap();
    let kinds: Vec<(String, &str)> = (r.deliveries(0, 10, |_| true).unwrap().0.into_iter())
        .map(|(_, d)| (d.kind.clone(), d.label()))
        .collect();
    assert_eq!(
        kinds,
        [("new".into(), "dead"), ("pending".into(), "pending")]
    );
    r.assert_outbox_heads_in_step();
}
