//! What the writer releases, and when, while the cluster's view changes
//! underneath it: a write let through is shipped even if its slot is
//! fenced meanwhile, and a barrier passes only behind earlier releases.

use std::sync::Arc;

use marmot_core::ids::ActorKey;
use tokio::sync::oneshot;

use super::replica_tests::{Collect, submit_create, until};
use super::tests::{open, turn};
use super::{CommitTracker, WriteOp};

/// Slot 7, replicated until `fence_after` more questions have been
/// answered, another node's from then on: a handoff fencing the slot while
/// the writer applies an op (-1: never).
struct FencedMidway {
    inner: Collect,
    fence_after: std::sync::atomic::AtomicIsize,
}

impl FencedMidway {
    fn answer(&self) -> super::Placement {
        use std::sync::atomic::Ordering;
        let left = self.fence_after.load(Ordering::SeqCst);
        if left == 0 {
            return super::Placement::Elsewhere;
        }
        if left > 0 {
            self.fence_after.fetch_sub(1, Ordering::SeqCst);
        }
        super::Placement::Replicated { slot: 7, epoch: 3 }
    }
}

impl super::Replication for FencedMidway {
    fn slot_of(&self, _: &ActorKey) -> u32 {
        7
    }

    fn placement(&self, _: &ActorKey) -> super::Placement {
        self.answer()
    }

    fn slot_placement(&self, _: u32) -> super::Placement {
        self.answer()
    }

    fn holds(&self, _: u32) -> bool {
        false
    }

    fn ship(&self, batches: Vec<crate::schema::ReplicaBatch>, release: super::Release) {
        self.inner.ship(batches, release)
    }
}

/// A turn let through while its slot was replicated is shipped to the
/// backup even if the slot is fenced before the writer records it: a write
/// that commits here is never released without its backup.
#[tokio::test]
async fn a_write_let_through_is_shipped_even_if_its_slot_is_fenced_meanwhile() {
    use std::sync::atomic::Ordering;
    let (_dir, owner) = open();
    let r = Arc::new(FencedMidway {
        inner: Collect::default(),
        fence_after: (-1).into(),
    });
    assert!(owner.writer().replicate(r.clone()));
    let (key, created) = submit_create(&owner, "r1");
    let rec = until(&r.inner, created).await.unwrap();

    // The fence comes right after the writer's first question.
    r.fence_after.store(1, Ordering::SeqCst);
    let tracker = Arc::new(CommitTracker::default());
    let (op, done) = turn(&key, &rec, &tracker, 0, 1, "k", "v1");
    owner.writer().submit(op);
    let (batches, release) = r.inner.next().await;
    let turns = batches
        .iter()
        .flat_map(|b| &b.ops)
        .filter(|op| matches!(op, crate::schema::ReplicaOp::Turn(_)))
        .count();
    release(Ok(()));
    let committed = done.await.unwrap().is_ok();
    let on_disk = owner.reader().unwrap().state(rec.num, "k").unwrap();
    assert!(committed, "the turn was let through: it commits");
    assert_eq!(on_disk.as_deref(), Some(&b"v1"[..]));
    assert_eq!(turns, 1, "a committed turn went unshipped: {batches:?}");

    // The next batch sees the fence: refused, nothing written.
    let (op, done) = turn(&key, &rec, &tracker, 0, 2, "k", "v2");
    owner.writer().submit(op);
    let (batches, release) = r.inner.next().await;
    assert!(batches.is_empty(), "{batches:?}");
    release(Ok(()));
    assert!(done.await.unwrap().is_err());
    let on_disk = owner.reader().unwrap().state(rec.num, "k").unwrap();
    assert_eq!(on_disk.as_deref(), Some(&b"v1"[..]));
}

/// A barrier alone commits nothing, and passes only behind every earlier
/// batch's release (a handoff and a reloading actor rely on it).
#[tokio::test]
async fn a_barrier_commits_nothing_and_passes_behind_earlier_releases() {
    let (_dir, owner) = open();
    let c = Arc::new(Collect::default());
    assert!(owner.writer().replicate(c.clone()));
    let (_, created) = submit_create(&owner, "r1");
    let (first, release_first) = c.next().await;
    assert_eq!(first.len(), 1);
    let (done, mut passed) = oneshot::channel();
    owner.writer().submit(WriteOp::Barrier { done });
    let (batches, release_barrier) = c.next().await;
    assert!(batches.is_empty(), "a barrier ships nothing: {batches:?}");
    tokio::time::sleep(std::time::Duration::from_millis(20)).await;
    assert!(
        passed.try_recv().is_err(),
        "the barrier passed an unreleased batch"
    );
    // Releases come in order (the replication keeps them so).
    release_first(Ok(()));
    created.await.unwrap().unwrap();
    release_barrier(Ok(()));
    passed.await.unwrap();
}
