//! The writer's guarantees, checked without a node: a batch is
//! all-or-nothing, nothing is released before its commit, and a failed
//! commit fences every later commit of the same actor generation.

use std::sync::Arc;

use bytes::Bytes;
use marmot_core::config::StorageConfig;
use marmot_core::ids::ActorKey;
use tokio::sync::oneshot;

use super::{CommitFailed, CommitTracker, Fence, TurnCommit, WriteOp};
use crate::schema::{
    ActorRecord, AlarmRecord, AlarmSchedule, CodeKind, EventRecord, InboxKind, InboxRecord,
    InputRecord, InputStatus, TypeRecord, VersionRecord,
};
use crate::{Storage, StorageError, WriterMetrics};

pub(super) fn open() -> (tempfile::TempDir, Storage) {
    let dir = tempfile::tempdir().unwrap();
    let storage =
        Storage::open(dir.path(), &StorageConfig::default(), WriterMetrics::new()).unwrap();
    (dir, storage)
}

pub(super) async fn create(storage: &Storage, id: &str) -> (ActorKey, ActorRecord) {
    let key = ActorKey::new("t", id).unwrap();
    let k = key.clone();
    let rec = storage
        .writer()
        .call(|done| WriteOp::GetOrCreate {
            key: k,
            version: 1,
            early: None,
            done,
        })
        .await
        .unwrap();
    (key, rec)
}

/// A commit writing `value` under `k`, reporting its outcome on the channel.
pub(super) fn turn(
    key: &ActorKey,
    rec: &ActorRecord,
    tracker: &Arc<CommitTracker>,
    generation: u64,
    seq: u64,
    k: &str,
    value: &'static str,
) -> (WriteOp, oneshot::Receiver<Result<(), CommitFailed>>) {
    let (tx, rx) = oneshot::channel();
    let commit = TurnCommit {
        key: key.clone(),
        tracker: tracker.clone(),
        generation,
        seq,
        num: rec.num,
        record: None,
        state: vec![(k.to_owned(), Some(Bytes::from_static(value.as_bytes())))],
        events: Vec::new(),
        trim_events_below: None,
        idempotency: None,
        inbox_done: None,
        inbox_update: None,
        alarms: Vec::new(),
        inputs: Vec::new(),
        sends: Vec::new(),
        relay_sends: false,
        files: Vec::new(),
        usage: None,
        traceparent: None,
        on_durable: Box::new(move |r| {
            let _ = tx.send(r);
        }),
    };
    (WriteOp::Turn(Box::new(commit)), rx)
}

/// `op` (a [`turn`]) with an event, an alarm, an input request and a
/// message to `to` besides its state write.
pub(super) fn with_effects(op: WriteOp, to: &ActorKey) -> WriteOp {
    let WriteOp::Turn(mut t) = op else {
        unreachable!()
    };
    t.events = vec![(
        1,
        EventRecord {
            kind: "effect".into(),
            data: b"{}".to_vec(),
            at_ms: 5,
        },
    )];
    t.alarms = vec![(
        "effect".into(),
        Some(AlarmRecord {
            schedule: AlarmSchedule::At(10),
            payload: Vec::new(),
            next_due_ms: 10,
            attempts: 0,
            boot_attempts: 0,
            set_at_ms: 1,
        }),
    )];
    t.inputs = vec![("in_effect".into(), Some(input(InputStatus::Pending)))];
    t.sends = vec![(
        to.clone(),
        InboxRecord {
            message_id: "m_effect".into(),
            body: b"{}".to_vec(),
            content_type: None,
            idempotency_key: None,
            attempts: 0,
            enqueued_at_ms: 5,
            kind: InboxKind::Message,
        },
    )];
    WriteOp::Turn(t)
}

pub(super) fn value(storage: &Storage, num: u64, k: &str) -> Option<Vec<u8>> {
    storage.reader().unwrap().state(num, k).unwrap()
}

/// Work still running when the node stops finds the database closed for
/// good, and is told so: it was "the database is being reopened", which
/// the webhook worker and turns logged as a storage fault at every stop.
#[tokio::test]
async fn after_close_the_storage_says_the_node_is_shutting_down() {
    let (_dir, storage) = open();
    assert!(storage.reader().is_ok());
    storage.close().await;
    match storage.reader() {
        Err(StorageError::ShuttingDown) => {}
        Err(e) => panic!("closed storage says: {e}"),
        Ok(_) => panic!("closed storage still reads"),
    }
}

#[tokio::test]
async fn a_commit_is_released_once_durable_and_marks_the_tracker() {
    let (_dir, storage) = open();
    let (key, rec) = create(&storage, "a").await;
    let tracker = Arc::new(CommitTracker::default());
    let (op, rx) = turn(&key, &rec, &tracker, 0, 1, "k", "v1");
    storage.writer().submit(op);
    rx.await.unwrap().unwrap();
    // Released only after the data is readable from a new transaction.
    assert_eq!(value(&storage, rec.num, "k").as_deref(), Some(&b"v1"[..]));
    assert_eq!(tracker.committed_seq(), 1);
}

/// An approval request (made at 5 ms) that stands at `status`.
pub(super) fn input(status: InputStatus) -> InputRecord {
    InputRecord {
        kind: "approval".into(),
        prompt: String::new(),
        schema: None,
        created_at_ms: 5,
        expires_at_ms: None,
        status,
    }
}

#[tokio::test]
async fn a_failed_commit_fails_its_whole_batch_and_fences_the_generation() {
    let (_dir, storage) = open();
    // The type exists, so that a message to b is delivered, not dropped.
    let record = TypeRecord {
        name: "t".into(),
        created_at_ms: 1,
        versions: vec![VersionRecord {
            version: 1,
            kind: CodeKind::Wasm,
            sha256: String::new(),
            code_bytes: 0,
            config: Default::default(),
            deployed_at_ms: 1,
        }],
    };
    storage
        .writer()
        .call(|done| WriteOp::PutType {
            record,
            code: None,
            done,
        })
        .await
        .unwrap();
    let (a, rec_a) = create(&storage, "a").await;
    let (b, rec_b) = create(&storage, "b").await;
    let (ta, tb) = (
        Arc::new(CommitTracker::default()),
        Arc::new(CommitTracker::default()),
    );
    // Hold the writer so that both turns queue up and form one batch.
    let (release, until) = std::sync::mpsc::channel();
    storage.writer().submit(WriteOp::Hold { until });
    let (op_a, rx_a) = turn(&a, &rec_a, &ta, 0, 1, "k", "lost");
    let (op_b, rx_b) = turn(&b, &rec_b, &tb, 0, 1, "k", "lost");
    // Turn a does everything a turn can besides writing state.
    storage.writer().submit(with_effects(op_a, &b));
    storage.writer().submit(op_b);
    // Two failures: the held batch's (harmless), then the batch of both
    // turns.
    storage.writer().inject_commit_failures(2);
    drop(release);
    assert!(matches!(rx_a.await.unwrap(), Err(CommitFailed::Storage(_))));
    assert!(matches!(rx_b.await.unwrap(), Err(CommitFailed::Storage(_))));
    assert_eq!(value(&storage, rec_a.num, "k"), None, "half a batch landed");
    assert_eq!(value(&storage, rec_b.num, "k"), None, "half a batch landed");
    let reader = storage.reader().unwrap();
    assert!(
        reader
            .events(rec_a.num, 0, 10, usize::MAX)
            .unwrap()
            .is_empty(),
        "an event"
    );
    assert!(reader.alarms(rec_a.num).unwrap().is_empty(), "an alarm");
    assert!(reader.alarms_due(0, u64::MAX, 10).unwrap().is_empty());
    assert!(
        reader
            .inputs_page(rec_a.num, "", usize::MAX, usize::MAX, |_| true)
            .unwrap()
            .0
            .is_empty(),
        "an input"
    );
    assert_eq!(reader.inbox_len(rec_b.num).unwrap(), 0, "a message");
    drop(reader);
    // The replies of the refused generation say what failed.
    assert!(
        matches!(ta.failure(), CommitFailed::Storage(ref why) if why.contains("injected")),
        "{:?}",
        ta.failure()
    );
    // A turn that ran on top of the lost one (same generation) is refused:
    // it might depend on what was lost.
    let (op, rx) = turn(&a, &rec_a, &ta, 0, 2, "k", "on top of lost");
    storage.writer().submit(op);
    assert!(matches!(rx.await.unwrap(), Err(CommitFailed::Superseded)));
    assert_eq!(value(&storage, rec_a.num, "k"), None);
    // The next generation (the actor reloaded from disk) commits again.
    assert_eq!(ta.min_generation(), 1);
    let (op, rx) = turn(&a, &rec_a, &ta, 1, 3, "k", "fresh");
    storage.writer().submit(with_effects(op, &b));
    rx.await.unwrap().unwrap();
    assert_eq!(
        value(&storage, rec_a.num, "k").as_deref(),
        Some(&b"fresh"[..])
    );
    // The same effects, committed, are all there (what the checks above
    // would have seen).
    let reader = storage.reader().unwrap();
    assert_eq!(
        reader.events(rec_a.num, 0, 10, usize::MAX).unwrap().len(),
        1
    );
    assert_eq!(reader.alarms(rec_a.num).unwrap().len(), 1);
    assert_eq!(reader.alarms_due(0, u64::MAX, 10).unwrap().len(), 1);
    assert_eq!(
        reader
            .inputs_page(rec_a.num, "", usize::MAX, usize::MAX, |_| true)
            .unwrap()
            .0
            .len(),
        1
    );
    assert_eq!(reader.inbox_len(rec_b.num).unwrap(), 1);
}

#[tokio::test]
async fn a_deploy_keeps_the_code_of_its_version_and_the_one_before() {
    let (_dir, storage) = open();
    let mut record = TypeRecord {
        name: "t".into(),
        created_at_ms: 1,
        versions: Vec::new(),
    };
    for version in 1..=5u32 {
        record.versions.push(VersionRecord {
            version,
            kind: CodeKind::Wasm,
            sha256: String::new(),
            code_bytes: 4,
            config: Default::default(),
            deployed_at_ms: 1,
        });
        let code = Some((version, format!("v{version:03}").into_bytes()));
        let rec = record.clone();
        storage
            .writer()
            .call(|done| WriteOp::PutType {
                record: rec,
                code,
                done,
            })
            .await
            .unwrap();
        let reader = storage.reader().unwrap();
        let kept: Vec<u32> = (1..=version)
            .filter(|v| reader.code("t", *v).unwrap().is_some())
            .collect();
        let want: Vec<u32> = (version.saturating_sub(1).max(1)..=version).collect();
        assert_eq!(kept, want, "after deploying version {version}");
        assert_eq!(
            reader.code("t", version).unwrap().as_deref(),
            Some(format!("v{version:03}").as_bytes())
        );
    }
}

/// A delete without its actors is refused in its own commit when the type
/// has any (one made since the caller counted was deleted with the type).
#[tokio::test]
async fn a_type_with_actors_is_not_deleted_without_them() {
    let (_dir, storage) = open();
    let record = TypeRecord {
        name: "t".into(),
        created_at_ms: 1,
        versions: Vec::new(),
    };
    storage
        .writer()
        .call(|done| WriteOp::PutType {
            record,
            code: Some((1, b"code".to_vec())),
            done,
        })
        .await
        .unwrap();
    let (key, _) = create(&storage, "a").await;
    let delete = |with_actors| {
        storage.writer().call(move |done| WriteOp::DeleteType {
            name: "t".into(),
            with_actors,
            done,
        })
    };
    assert_eq!(delete(false).await.unwrap(), Err(1));
    let reader = storage.reader().unwrap();
    assert!(reader.actor(&key).unwrap().is_some(), "the actor went");
    assert!(reader.code("t", 1).unwrap().is_some(), "the type went");
    drop(reader);
    assert_eq!(delete(true).await.unwrap(), Ok(1));
    assert!(storage.reader().unwrap().actor(&key).unwrap().is_none());
}

#[tokio::test]
async fn a_fenced_actor_commits_nothing_more() {
    let (_dir, storage) = open();
    let (key, rec) = create(&storage, "a").await;
    let tracker = Arc::new(CommitTracker::default());
    tracker.fence("t");
    let (op, rx) = turn(&key, &rec, &tracker, 0, 1, "k", "after the fence");
    storage.writer().submit(op);
    // It says why: the type was deleted.
    assert!(matches!(rx.await.unwrap(), Err(CommitFailed::TypeDeleted(t)) if t == "t"));
    assert_eq!(value(&storage, rec.num, "k"), None);
}

/// An early creation: answered once applied, before its commit.
async fn create_early(
    storage: &Storage,
    id: &str,
    tracker: &Arc<CommitTracker>,
    generation: u64,
    seq: u64,
) -> (ActorKey, ActorRecord) {
    let key = ActorKey::new("t", id).unwrap();
    let k = key.clone();
    let early = Some(Fence {
        tracker: tracker.clone(),
        generation,
        seq,
    });
    let rec = storage
        .writer()
        .call(|done| WriteOp::GetOrCreate {
            key: k,
            version: 1,
            early,
            done,
        })
        .await
        .unwrap();
    (key, rec)
}

#[tokio::test]
async fn an_early_creation_shares_the_commit_of_the_first_turn() {
    let dir = tempfile::tempdir().unwrap();
    let metrics = WriterMetrics::new();
    let storage = Storage::open(dir.path(), &StorageConfig::default(), metrics.clone()).unwrap();
    let tracker = Arc::new(CommitTracker::default());
    let (key, rec) = create_early(&storage, "a", &tracker, 0, 1).await;
    let (op, rx) = turn(&key, &rec, &tracker, 0, 2, "k", "v");
    storage.writer().submit(op);
    rx.await.unwrap().unwrap();
    assert_eq!(tracker.committed_seq(), 2);
    assert_eq!(
        metrics.commits.get(),
        1,
        "one commit for the creation and the turn"
    );
    assert_eq!(
        storage
            .reader()
            .unwrap()
            .actor(&key)
            .unwrap()
            .map(|r| r.num),
        Some(rec.num)
    );
    assert_eq!(value(&storage, rec.num, "k").as_deref(), Some(&b"v"[..]));
}

/// An early creation that a failed batch never applied fences the
/// activation that counted it, which would otherwise wait for that commit
/// for good (at hibernation).
#[test]
fn an_unapplied_early_creation_fences_its_generation() {
    let tracker = Arc::new(CommitTracker::default());
    let (done, rx) = oneshot::channel();
    let op = WriteOp::GetOrCreate {
        key: ActorKey::new("t", "a").unwrap(),
        version: 1,
        early: Some(Fence {
            tracker: tracker.clone(),
            generation: 0,
            seq: 1,
        }),
        done,
    };
    let why = CommitFailed::Storage("an earlier op failed".into());
    super::ops::Applied::from_unapplied(op).complete(Some(&why));
    assert_eq!(tracker.min_generation(), 1, "the activation must reload");
    assert!(rx.blocking_recv().unwrap().is_err());
}

#[tokio::test]
async fn a_failed_early_creation_fences_its_generation_and_its_number_is_not_reused() {
    let (_dir, storage) = open();
    let tracker = Arc::new(CommitTracker::default());
    storage.writer().inject_commit_failures(1);
    let (key, rec) = create_early(&storage, "a", &tracker, 0, 1).await;
    let (op, rx) = turn(&key, &rec, &tracker, 0, 2, "k", "lost");
    storage.writer().submit(op);
    assert!(matches!(rx.await.unwrap(), Err(CommitFailed::Storage(_))));
    assert_eq!(tracker.min_generation(), 1, "the activation must reload");
    assert!(storage.reader().unwrap().actor(&key).unwrap().is_none());
    // The reloaded activation creates the actor again, under a new number:
    // the one handed out before the failure is never given to anyone.
    let (_, again) = create_early(&storage, "a", &tracker, 1, 3).await;
    assert!(again.num > rec.num, "{} reused", rec.num);
    let (op, rx) = turn(&key, &again, &tracker, 1, 4, "k", "kept");
    storage.writer().submit(op);
    rx.await.unwrap().unwrap();
    assert_eq!(
        value(&storage, again.num, "k").as_deref(),
        Some(&b"kept"[..])
    );
    assert_eq!(value(&storage, rec.num, "k"), None);
}

#[test]
fn a_refused_generations_replies_report_what_refused_it() {
    let t = CommitTracker::default();
    assert!(matches!(t.failure(), CommitFailed::Superseded));
    t.mark_failed(0, &CommitFailed::Refused("no backup".into()));
    assert!(matches!(t.failure(), CommitFailed::Refused(ref w) if w == "no backup"));
    // A late failure of the generation already refused is not the reason.
    t.mark_failed(0, &CommitFailed::Storage("late".into()));
    assert!(matches!(t.failure(), CommitFailed::Refused(_)));
    // The next generation's own failure is.
    t.mark_failed(1, &CommitFailed::Storage("disk".into()));
    assert!(matches!(t.failure(), CommitFailed::Storage(ref w) if w == "disk"));
    // A move reloads the actor without any commit failing: its turns
    // were refused because the actor left (a retry routed again is safe).
    t.invalidate();
    assert!(matches!(t.failure(), CommitFailed::Moved(_)));
}
