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
fn a_damaged_database_file_is_a_clear_error_naming_it_and_nothing_changes() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("marmot.redb");
    {
        let db = redb::Database::create(&path).unwrap();
        crate::schema::check_format(&db).unwrap();
    }
    for damage in [
        |p: &std::path::Path| {
            std::fs::OpenOptions::new()
                .write(true)
                .open(p)
                .unwrap()
                .set_len(5000)
                .unwrap()
        },
        |p: &std::path::Path| std::fs::write(p, vec![0x5a; 100_000]).unwrap(),
    ] {
        damage(&path);
        let before = std::fs::read(&path).unwrap();
        let err = match Storage::open(dir.path(), &StorageConfig::default(), WriterMetrics::new()) {
            Ok(_) => panic!("a damaged file opened"),
            Err(e) => e.to_string(),
        };
        assert!(err.contains(&path.display().to_string()), "{err}");
        assert!(err.contains("marmot restore"), "{err}");
        assert_eq!(
            std::fs::read(&path).unwrap(),
            before,
            "the file was changed"
        );
    }
}

/// A database that is missing or empty next to blobs is refused, never
/// started empty: that removed the blobs as garbage within a second (a
/// data directory copied without its database, one truncated by hand).
/// Without blobs it is a new node.
#[test]
fn a_missing_database_next_to_blobs_is_refused_and_nothing_is_removed() {
    let dir = tempfile::tempdir().unwrap();
    let blob = dir.path().join("blobs").join("ab").join("ab12");
    std::fs::create_dir_all(blob.parent().unwrap()).unwrap();
    std::fs::write(&blob, b"a file's bytes").unwrap();
    let path = dir.path().join("marmot.redb");
    for empty in [false, true] {
        if empty {
            std::fs::write(&path, b"").unwrap();
        }
        let err = match Storage::open(dir.path(), &StorageConfig::default(), WriterMetrics::new()) {
            Ok(_) => panic!("started empty next to blobs"),
            Err(e) => e.to_string(),
        };
        assert!(
            err.contains("missing or empty") && err.contains("blobs/"),
            "{err}"
        );
        assert!(err.contains("marmot restore"), "{err}");
        assert_eq!(std::fs::read(&blob).unwrap(), b"a file's bytes");
    }
    std::fs::remove_dir_all(dir.path().join("blobs")).unwrap();
    std::fs::remove_file(&path).unwrap();
    let storage = Storage::open(dir.path(), &StorageConfig::default(), WriterMetrics::new());
    assert!(storage.is_ok(), "a new node starts");
}

/// A database the node may not open is said to be that, not damage (the
/// advice for damage, to move the file away and start empty, lost a
/// healthy database).
#[test]
fn a_database_that_cannot_be_opened_for_permissions_says_so() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("marmot.redb");
    // A directory in its place fails the same way for root, which the
    // permission bits would not stop.
    std::fs::create_dir(&path).unwrap();
    let err = match Storage::open(dir.path(), &StorageConfig::default(), WriterMetrics::new()) {
        Ok(_) => panic!("a directory opened as a database"),
        Err(e) => e.to_string(),
    };
    assert!(
        err.contains("a directory holds the database's name"),
        "{err}"
    );
    assert!(!err.contains("damaged"), "{err}");
}

/// A full disk or a read-only file system at open is not called damage
/// (whose advice, moving the file away, lost healthy databases), and what
/// a first start made on a disk it filled (journal files preallocated) is
/// removed: it left the disk full for every later try.
#[test]
fn a_full_or_read_only_disk_at_open_says_so() {
    use std::io::ErrorKind;
    for (kind, says, removed) in [
        (ErrorKind::StorageFull, "disk is full", true),
        (
            ErrorKind::ReadOnlyFilesystem,
            "read-only file system",
            false,
        ),
    ] {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("marmot.redb");
        let made = path.clone();
        let opener: crate::db::Opener = Box::new(move || {
            for p in crate::journal::log_paths(&made).iter().chain([&made]) {
                std::fs::write(p, b"x")?;
            }
            Err(redb::StorageError::Io(std::io::Error::from(kind)).into())
        });
        let err = match Storage::open_with(
            dir.path(),
            &StorageConfig::default(),
            WriterMetrics::new(),
            opener,
        ) {
            Ok(_) => panic!("opened"),
            Err(e) => e.to_string(),
        };
        assert!(err.contains(says), "{err}");
        assert!(!err.contains("damaged"), "{err}");
        assert_eq!(!path.exists(), removed, "{kind:?}: {err}");
        assert_eq!(
            crate::journal::log_paths(&path).iter().all(|p| !p.exists()),
            removed
        );
    }
    // Files there before the open are never removed, whatever failed.
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("marmot.redb");
    for p in crate::journal::log_paths(&path).iter().chain([&path]) {
        std::fs::write(p, b"kept").unwrap();
    }
    let opener: crate::db::Opener = Box::new(|| {
        Err(redb::StorageError::Io(std::io::Error::from(std::io::ErrorKind::StorageFull)).into())
    });
    assert!(
        Storage::open_with(
            dir.path(),
            &StorageConfig::default(),
            WriterMetrics::new(),
            opener,
        )
        .is_err()
    );
    for p in crate::journal::log_paths(&path).iter().chain([&path]) {
        assert_eq!(std::fs::read(p).unwrap(), b"kept", "{}", p.display());
    }
}

/// A database file whose fsync fails while `fail_sync` is set, as a dying
/// disk's does.
#[derive(Debug)]
struct FlakyDisk {
    file: redb::backends::FileBackend,
    fail_sync: Arc<std::sync::atomic::AtomicBool>,
}

impl redb::StorageBackend for FlakyDisk {
    fn len(&self) -> Result<u64, std::io::Error> {
        self.file.len()
    }
    fn read(&self, offset: u64, out: &mut [u8]) -> Result<(), std::io::Error> {
        self.file.read(offset, out)
    }
    fn set_len(&self, len: u64) -> Result<(), std::io::Error> {
        self.file.set_len(len)
    }
    fn sync_data(&self) -> Result<(), std::io::Error> {
        if self.fail_sync.load(std::sync::atomic::Ordering::SeqCst) {
            return Err(std::io::Error::other("injected fsync failure"));
        }
        self.file.sync_data()
    }
    fn write(&self, offset: u64, data: &[u8]) -> Result<(), std::io::Error> {
        self.file.write(offset, data)
    }
    fn close(&self) -> Result<(), std::io::Error> {
        self.file.close()
    }
}

#[tokio::test]
async fn a_failing_fsync_refuses_writes_keeps_reads_and_recovers_without_a_restart() {
    use std::sync::atomic::{AtomicBool, Ordering};
    let dir = tempfile::tempdir().unwrap();
    let fail_sync = Arc::new(AtomicBool::new(false));
    let (path, flag) = (dir.path().join("marmot.redb"), fail_sync.clone());
    let opener: crate::db::Opener = Box::new(move || {
        let file = std::fs::OpenOptions::new()
            .read(true)
            .write(true)
            .create(true)
            .truncate(false)
            .open(&path)?;
        redb::Builder::new().create_with_backend(FlakyDisk {
            file: redb::backends::FileBackend::new(file)?,
            fail_sync: flag.clone(),
        })
    });
    let metrics = WriterMetrics::new();
    let storage = Storage::open_with(
        dir.path(),
        &StorageConfig::default(),
        metrics.clone(),
        opener,
    )
    .unwrap();
    let (key, rec) = create(&storage, "a").await;
    let tracker = Arc::new(CommitTracker::default());
    let (op, rx) = turn(&key, &rec, &tracker, 0, 1, "k", "durable");
    storage.writer().submit(op);
    rx.await.unwrap().unwrap();

    fail_sync.store(true, Ordering::SeqCst);
    let (op, rx) = turn(&key, &rec, &tracker, 0, 2, "k", "unsynced");
    storage.writer().submit(op);
    assert!(matches!(rx.await.unwrap(), Err(CommitFailed::Storage(_))));
    assert!(storage.disk_fault().is_some());
    assert_eq!(metrics.disk_faulted.get(), 1);
    // While every fsync fails the database cannot be repaired and reopened:
    // reads are refused too, never wrong.
    assert!(matches!(
        storage.reader(),
        Err(crate::StorageError::Unavailable(_))
    ));
    let (op, rx) = turn(&key, &rec, &tracker, 1, 3, "k", "still failing");
    storage.writer().submit(op);
    assert!(matches!(rx.await.unwrap(), Err(CommitFailed::Storage(_))));

    // The disk heals: the writer's probe notices without any write.
    fail_sync.store(false, Ordering::SeqCst);
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(5);
    while storage.disk_fault().is_some() {
        assert!(std::time::Instant::now() < deadline, "no recovery");
        tokio::time::sleep(std::time::Duration::from_millis(50)).await;
    }
    assert_eq!(metrics.disk_faulted.get(), 0);
    assert!(metrics.reopens.get() >= 1);
    // A commit whose fsync failed has an unknown outcome (its pages may
    // have reached the file): it was never acknowledged, and is either
    // wholly there or wholly absent.
    let v = value(&storage, rec.num, "k");
    assert!(
        matches!(v.as_deref(), Some(b"durable" | b"unsynced")),
        "{v:?}"
    );
    let (op, rx) = turn(&key, &rec, &tracker, 2, 4, "k", "after");
    storage.writer().submit(op);
    rx.await.unwrap().unwrap();
    assert_eq!(
        value(&storage, rec.num, "k").as_deref(),
        Some(&b"after"[..])
    );
}

/// A plain message `id`, as a turn sends one.
fn message(id: &str) -> crate::schema::InboxRecord {
    crate::schema::InboxRecord {
        message_id: id.into(),
        body: b"{}".to_vec(),
        content_type: None,
        idempotency_key: None,
        attempts: 0,
        enqueued_at_ms: 1,
        kind: crate::schema::InboxKind::Message,
    }
}

#[tokio::test]
async fn relayed_sends_wait_in_the_relay_with_a_key_until_handed_over() {
    let (_dir, storage) = open();
    let (key, rec) = create(&storage, "a").await;
    let tracker = Arc::new(CommitTracker::default());
    let (op, rx) = turn(&key, &rec, &tracker, 0, 1, "k", "v");
    let WriteOp::Turn(mut t) = op else {
        unreachable!()
    };
    let to = ActorKey::new("t", "far").unwrap();
    t.sends = vec![(to.clone(), message("m1")), (to.clone(), message("m2"))];
    t.relay_sends = true;
    let ready = storage.relay_ready().clone();
    let notified = ready.notified();
    storage.writer().submit(WriteOp::Turn(t));
    rx.await.unwrap().unwrap();
    notified.await;
    let page = storage.reader().unwrap().relay_page(10, |_| true).unwrap();
    let keys: Vec<_> = page
        .iter()
        .map(|(_, r)| (r.actor_id.as_str(), r.message.idempotency_key.as_deref()))
        .collect();
    assert_eq!(
        keys,
        [("far", Some("relay-m1")), ("far", Some("relay-m2"))],
        "in send order, each with a key derived from its id"
    );
    // Not queued here: the recipient may live on another node.
    let reader = storage.reader().unwrap();
    assert!(reader.actor(&to).unwrap().is_none());
    drop(reader);
    let seqs = page.iter().map(|(s, _)| *s).collect();
    storage
        .writer()
        .call(|done| WriteOp::RelayDone { seqs, done })
        .await
        .unwrap();
    assert!(
        storage
            .reader()
            .unwrap()
            .relay_page(10, |_| true)
            .unwrap()
            .is_empty()
    );
}

/// A page of the relay holds the rows `mine` accepts, however many it
/// passes over first: the relay leaves a waiting recipient's rows out,
/// and with a page's worth of them at the head no other message was
/// handed over (found by a probe).
#[tokio::test]
async fn a_relay_page_reads_past_the_rows_it_leaves_out() {
    let (_dir, storage) = open();
    let (key, rec) = create(&storage, "a").await;
    let tracker = Arc::new(CommitTracker::default());
    let (op, rx) = turn(&key, &rec, &tracker, 0, 1, "k", "v");
    let WriteOp::Turn(mut t) = op else {
        unreachable!()
    };
    let (stuck, other) = (
        ActorKey::new("t", "stuck").unwrap(),
        ActorKey::new("t", "ok").unwrap(),
    );
    t.sends = (0..10)
        .map(|i| (stuck.clone(), message(&format!("s{i}"))))
        .chain((0..2).map(|i| (other.clone(), message(&format!("o{i}")))))
        .collect();
    t.relay_sends = true;
    storage.writer().submit(WriteOp::Turn(t));
    rx.await.unwrap().unwrap();
    let page = storage
        .reader()
        .unwrap()
        .relay_page(4, |r| r.actor_id != "stuck")
        .unwrap();
    let ids: Vec<_> = page
        .iter()
        .map(|(_, r)| r.message.message_id.as_str())
        .collect();
    assert_eq!(ids, ["o0", "o1"]);
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
