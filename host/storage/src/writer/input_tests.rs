//! Input requests in the writer: a cancel never overwrites a settlement,
//! and the status index follows every write.

use std::sync::Arc;

use tokio::sync::oneshot;

use marmot_core::ids::ActorKey;

use super::tests::{create, input, open, turn};
use super::{CommitTracker, WriteOp};
use crate::Storage;
use crate::schema::{ActorRecord, InputRecord, InputStatus};

/// Commit turn `seq` of the actor writing `inputs` (and a state key).
async fn commit(
    storage: &Storage,
    key: &ActorKey,
    rec: &ActorRecord,
    tracker: &Arc<CommitTracker>,
    seq: u64,
    inputs: Vec<(String, Option<InputRecord>)>,
) {
    let (op, rx) = turn(key, rec, tracker, 0, seq, "k", "v");
    let WriteOp::Turn(mut t) = op else {
        unreachable!()
    };
    t.inputs = inputs;
    storage.writer().submit(WriteOp::Turn(t));
    rx.await.unwrap().unwrap();
}

/// A cancel written after a settlement of the same request (the cancelling
/// turn read it pending while the answer's commit was in flight) leaves
/// the settlement; a pending request, or one not written yet, is cancelled.
#[tokio::test]
async fn a_cancel_never_overwrites_a_settled_input() {
    let (_dir, storage) = open();
    let (key, rec) = create(&storage, "a").await;
    let tracker = Arc::new(CommitTracker::default());
    let answered = InputStatus::Answered {
        at_ms: 6,
        response: b"{}".to_vec(),
    };
    let cancelled = InputStatus::Cancelled { at_ms: 7 };
    let writes = [
        vec![
            ("in_a".to_owned(), Some(input(answered.clone()))),
            ("in_p".to_owned(), Some(input(InputStatus::Pending))),
        ],
        vec![
            ("in_a".to_owned(), Some(input(cancelled.clone()))),
            ("in_p".to_owned(), Some(input(cancelled.clone()))),
            ("in_new".to_owned(), Some(input(cancelled.clone()))),
        ],
    ];
    for (seq, inputs) in writes.into_iter().enumerate() {
        commit(&storage, &key, &rec, &tracker, seq as u64 + 1, inputs).await;
    }
    let r = storage.reader().unwrap();
    let status = |id: &str| r.input(rec.num, id).unwrap().unwrap().status;
    assert_eq!(status("in_a"), answered);
    assert_eq!(status("in_p"), cancelled);
    assert_eq!(status("in_new"), cancelled);
}

/// The status index follows every write of a request: counting the
/// pending and choosing what to prune read it alone, and a deleted request
/// or actor leaves nothing in it.
#[tokio::test]
async fn input_requests_are_indexed_by_status() {
    let (_dir, storage) = open();
    let (key, rec) = create(&storage, "a").await;
    let tracker = Arc::new(CommitTracker::default());
    let answered = |at_ms| InputStatus::Answered {
        at_ms,
        response: b"{}".to_vec(),
    };
    let writes = [
        vec![
            ("in_1".to_owned(), Some(input(InputStatus::Pending))),
            ("in_2".to_owned(), Some(input(InputStatus::Pending))),
            ("in_3".to_owned(), Some(input(InputStatus::Pending))),
            ("in_4".to_owned(), Some(input(InputStatus::Pending))),
        ],
        vec![
            ("in_1".to_owned(), Some(input(answered(30)))),
            (
                "in_2".to_owned(),
                Some(input(InputStatus::Expired { at_ms: 10 })),
            ),
            (
                "in_3".to_owned(),
                Some(input(InputStatus::Cancelled { at_ms: 20 })),
            ),
        ],
    ];
    for (seq, inputs) in writes.into_iter().enumerate() {
        commit(&storage, &key, &rec, &tracker, seq as u64 + 1, inputs).await;
    }
    let r = storage.reader().unwrap();
    assert_eq!(r.pending_input_count(rec.num).unwrap(), 1);
    let pending: Vec<_> = r.pending_inputs(rec.num).unwrap();
    assert_eq!(pending.len(), 1);
    assert_eq!(pending[0].0, "in_4");
    // Oldest settled first: by age, by count, by both.
    assert_eq!(r.inputs_to_prune(rec.num, 15, 10).unwrap(), ["in_2"]);
    assert_eq!(r.inputs_to_prune(rec.num, 0, 1).unwrap(), ["in_2", "in_3"]);
    assert_eq!(r.inputs_to_prune(rec.num, 25, 2).unwrap(), ["in_2", "in_3"]);
    assert!(r.inputs_to_prune(rec.num, 5, 3).unwrap().is_empty());
    drop(r);

    commit(
        &storage,
        &key,
        &rec,
        &tracker,
        3,
        vec![("in_2".to_owned(), None)],
    )
    .await;
    let r = storage.reader().unwrap();
    assert_eq!(
        r.inputs_to_prune(rec.num, 100, 10).unwrap(),
        ["in_3", "in_1"]
    );
    drop(r);

    let (done, rx) = oneshot::channel();
    storage.writer().submit(WriteOp::DeleteActor { key, done });
    assert!(rx.await.unwrap().unwrap());
    let r = storage.reader().unwrap();
    assert_eq!(r.pending_input_count(rec.num).unwrap(), 0);
    assert!(r.inputs_to_prune(rec.num, 100, 0).unwrap().is_empty());
}
