//! An actor's rows moving between slots, checked in the writer without a
//! node: a move takes all of them, a stale copy goes only if it is the
//! copy named, and a backup's late "moved out" leaves a newer copy alone.

use std::sync::Arc;

use marmot_core::ids::ActorKey;
use tokio::sync::oneshot;

use super::replica_tests::{
    Collect, apply_on, emitting, keyed_message, submit_create, subscribe, until,
};
use super::tests::{create, open, turn};
use super::{CommitTracker, WriteOp};
use crate::Storage;

/// A move: the source reads the actor's rows, the target installs them
/// (its copy replaced, the install shipped to its slot's backup), the
/// source drops its copy and tells its own backup — and a node that keeps
/// the new slot's rows too keeps them.
#[tokio::test]
async fn a_moved_actor_takes_all_its_rows_and_leaves_none_behind() {
    use crate::schema::*;
    let (_a_dir, source) = open();
    let (_b_dir, target) = open();
    let (key, rec) = create(&source, "m1").await;
    let tracker = Arc::new(CommitTracker::default());
    subscribe(&source, None).await;
    let (op, rx) = turn(&key, &rec, &tracker, 0, 1, "k", "v1");
    source.writer().submit(emitting(op, "hi", true));
    rx.await.unwrap().unwrap();
    let message = keyed_message();
    let k = key.clone();
    source
        .writer()
        .call(|done| WriteOp::Enqueue {
            key: k,
            version: 1,
            message,
            idempotency_ttl_ms: 60_000,
            done,
        })
        .await
        .unwrap();

    let absent = ActorKey::new("t", "nobody").unwrap();
    let image = source
        .writer()
        .call(|done| WriteOp::ReadImage { key: absent, done })
        .await
        .unwrap();
    assert!(image.is_none(), "an actor that does not exist has no rows");
    let k = key.clone();
    let image = source
        .writer()
        .call(|done| WriteOp::ReadImage { key: k, done })
        .await
        .unwrap()
        .expect("the actor exists");
    assert_eq!((image.deliveries.len(), image.relays.len()), (1, 1));
    let id = image.deliveries[0].webhook_id.clone();
    let outgoing = |storage: &Storage| {
        let r = storage.reader().unwrap();
        (
            r.delivery_by_id(&id).unwrap().is_some(),
            r.relay_page(10, |_| true).unwrap().len(),
        )
    };

    // The target holds a stale copy (an undone move): replaced.
    let (_, stale) = create(&target, "m1").await;
    let shipped_by_target = Arc::new(Collect::default());
    assert!(target.writer().replicate(shipped_by_target.clone()));
    let (done, moved_in) = oneshot::channel();
    target.writer().submit(WriteOp::MoveIn {
        image: image.clone(),
        slot: 7,
        done,
    });
    let (batches, release) = shipped_by_target.next().await;
    assert!(matches!(
        batches[0].ops[..],
        [ReplicaOp::Delete { .. }, ReplicaOp::Install(_)]
    ));
    release(Ok(()));
    moved_in.await.unwrap().unwrap();
    let reader = target.reader().unwrap();
    let here = reader.actor(&key).unwrap().unwrap();
    assert_ne!(here.num, stale.num, "the stale copy went");
    assert_eq!(
        reader.state(here.num, "k").unwrap().as_deref(),
        Some(&b"v1"[..])
    );
    assert_eq!(reader.inbox_len(here.num).unwrap(), 1);
    assert!(reader.idempotency(here.num, "k1").unwrap().is_some());
    drop(reader);
    assert_eq!(outgoing(&target), (true, 1), "its outgoing rows moved too");

    // The source drops its rows and tells its slot's backup.
    let collect = Arc::new(Collect::default());
    assert!(source.writer().replicate(collect.clone()));
    let k = key.clone();
    let (done, out) = oneshot::channel();
    source.writer().submit(WriteOp::MoveOut {
        key: k,
        from: 7,
        to: 3,
        done,
    });
    let (batches, release) = collect.next().await;
    assert!(matches!(
        batches[0].ops[..],
        [ReplicaOp::Moved { to: 3, .. }]
    ));
    release(Ok(()));
    assert!(out.await.unwrap().unwrap(), "the rows went");
    assert!(source.reader().unwrap().actor(&key).unwrap().is_none());
    assert_eq!(outgoing(&source), (false, 0), "outgoing rows left behind");

    // A node that keeps the new slot's rows (slot 8 here) keeps them.
    let (done, kept) = oneshot::channel();
    target.writer().submit(WriteOp::MoveOut {
        key: key.clone(),
        from: 7,
        to: 8,
        done,
    });
    let (_, release) = shipped_by_target.next().await;
    release(Ok(()));
    assert!(!kept.await.unwrap().unwrap(), "nothing went");
    assert!(target.reader().unwrap().actor(&key).unwrap().is_some());
    assert_eq!(outgoing(&target), (true, 1));
    source.reader().unwrap().assert_outbox_heads_in_step();
    target.reader().unwrap().assert_outbox_heads_in_step();
}

#[tokio::test]
async fn a_stale_copy_goes_only_if_it_is_the_copy_named() {
    use crate::schema::ReplicaOp;
    let (_a_dir, owner) = open();
    let (_b_dir, backup) = open();
    let collect = Arc::new(Collect::default());
    assert!(owner.writer().replicate(collect.clone()));
    let (key, created) = submit_create(&owner, "r-stale");
    let (batches, release) = collect.next().await;
    apply_on(&backup, batches[0].clone(), true).await;
    release(Ok(()));
    let at = created.await.unwrap().unwrap().created_at_ms;
    let drop_stale = |created_at_ms: u64, slot: u32| {
        let (done, rx) = oneshot::channel();
        owner.writer().submit(WriteOp::DropStale {
            key: key.clone(),
            slot,
            created_at_ms,
            done,
        });
        rx
    };

    // Another copy (the id was used again since): it stays, here and on
    // the backup.
    let rx = drop_stale(at + 1, 7);
    let (batches, release) = collect.next().await;
    assert!(matches!(
        &batches[0].ops[..],
        [ReplicaOp::Stale { created_at_ms, .. }] if *created_at_ms == at + 1
    ));
    apply_on(&backup, batches[0].clone(), true).await;
    release(Ok(()));
    assert!(!rx.await.unwrap().unwrap(), "another actor's rows went");
    assert!(owner.reader().unwrap().actor(&key).unwrap().is_some());
    assert!(backup.reader().unwrap().actor(&key).unwrap().is_some());

    // A slot another node owns now: refused, nothing goes.
    let refused = until(&collect, drop_stale(at, 13)).await;
    assert!(
        matches!(refused, Err(crate::StorageError::Unavailable(_))),
        "{refused:?}"
    );
    assert!(owner.reader().unwrap().actor(&key).unwrap().is_some());

    // The copy named: it goes here and on the backup.
    let rx = drop_stale(at, 7);
    let (batches, release) = collect.next().await;
    apply_on(&backup, batches[0].clone(), true).await;
    release(Ok(()));
    assert!(rx.await.unwrap().unwrap(), "the stale copy stayed");
    assert!(owner.reader().unwrap().actor(&key).unwrap().is_none());
    assert!(backup.reader().unwrap().actor(&key).unwrap().is_none());
}

/// A backup's late "moved out" leaves a newer copy alone. The actor left
/// slot 7 (its owner then told slot 7's backup, behind its other writes),
/// and moved on into slot 8, kept by that same backup node, before the
/// op arrived: dropping its rows there dropped the actor's only copy, and
/// it started again empty (a probe: a counter back at 1 under moves 20 ms
/// apart).
#[tokio::test]
async fn a_late_moved_out_leaves_the_copy_moved_in_since() {
    use crate::schema::*;
    let (_a_dir, owner) = open();
    let (_b_dir, backup) = open();
    let collect = Arc::new(Collect::default());
    assert!(owner.writer().replicate(collect.clone()));
    let (key, created) = submit_create(&owner, "r1");
    let (batches, release) = collect.next().await;
    assert_eq!(
        apply_on(&backup, batches[0].clone(), true).await,
        super::ReplicaApplied::Applied
    );
    release(Ok(()));
    let rec = created.await.unwrap().unwrap();
    let tracker = Arc::new(CommitTracker::default());
    let (op, rx) = turn(&key, &rec, &tracker, 0, 1, "n", "1553");
    owner.writer().submit(op);
    let (batches, release) = collect.next().await;
    assert_eq!(
        apply_on(&backup, batches[0].clone(), true).await,
        super::ReplicaApplied::Applied
    );
    release(Ok(()));
    rx.await.unwrap().unwrap();
    // The image a move would carry (read from the backup's copy, which
    // has the same rows).
    let k = key.clone();
    let image = backup
        .writer()
        .call(|done| WriteOp::ReadImage { key: k, done })
        .await
        .unwrap()
        .expect("the actor exists");

    // It moves out of slot 7 to slot 3 (another node's); the op for slot
    // 7's backup is held up...
    let (done, out) = oneshot::channel();
    owner.writer().submit(WriteOp::MoveOut {
        key: key.clone(),
        from: 7,
        to: 3,
        done,
    });
    let (late, release) = collect.next().await;
    assert!(matches!(late[0].ops[..], [ReplicaOp::Moved { to: 3, .. }]));
    release(Ok(()));
    assert!(out.await.unwrap().unwrap());
    // ... while it moves on into slot 8, which the backup's node keeps.
    let backup_collect = Arc::new(Collect::default());
    assert!(backup.writer().replicate(backup_collect.clone()));
    let (done, moved_in) = oneshot::channel();
    backup.writer().submit(WriteOp::MoveIn {
        image,
        slot: 8,
        done,
    });
    until(&backup_collect, moved_in).await.unwrap();
    assert_eq!(
        apply_on(&backup, late[0].clone(), true).await,
        super::ReplicaApplied::Applied
    );
    let reader = backup.reader().unwrap();
    let here = reader
        .actor(&key)
        .unwrap()
        .expect("the moved-in copy stays");
    assert_eq!(
        reader.state(here.num, "n").unwrap().as_deref(),
        Some(&b"1553"[..])
    );
}
