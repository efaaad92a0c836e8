//! The writer's guarantees, checked without a node: a batch is
//! all-or-nothing, nothing is released before its commit, and a failed
//! commit fences every later commit of the same actor generation.

use std::sync::Arc;

use bytes::Bytes;
use marmot_core::config::StorageConfig;
use marmot_core::ids::ActorKey;
use tokio::sync::oneshot;

use super::{CommitFailed, CommitTracker, Fence, TurnCommit, WriteOp};
use crate::schema::ActorRecord;
use crate::{Storage, WriterMetrics};

fn open() -> (tempfile::TempDir, Storage) {
    let dir = tempfile::tempdir().unwrap();
    let storage =
        Storage::open(dir.path(), &StorageConfig::default(), WriterMetrics::new()).unwrap();
    (dir, storage)
}

async fn create(storage: &Storage, id: &str) -> (ActorKey, ActorRecord) {
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
fn turn(
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

fn value(storage: &Storage, num: u64, k: &str) -> Option<Vec<u8>> {
    storage.reader().unwrap().state(num, k).unwrap()
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

#[tokio::test]
async fn a_failed_commit_fails_its_whole_batch_and_fences_the_generation() {
    let (_dir, storage) = open();
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
    storage.writer().submit(op_a);
    storage.writer().submit(op_b);
    // Two failures: the held batch's (harmless), then the batch of both
    // turns.
    storage.writer().inject_commit_failures(2);
    drop(release);
    assert!(matches!(rx_a.await.unwrap(), Err(CommitFailed::Storage(_))));
    assert!(matches!(rx_b.await.unwrap(), Err(CommitFailed::Storage(_))));
    assert_eq!(value(&storage, rec_a.num, "k"), None, "half a batch landed");
    assert_eq!(value(&storage, rec_b.num, "k"), None, "half a batch landed");
    // A turn that ran on top of the lost one (same generation) is refused:
    // it might depend on what was lost.
    let (op, rx) = turn(&a, &rec_a, &ta, 0, 2, "k", "on top of lost");
    storage.writer().submit(op);
    assert!(matches!(rx.await.unwrap(), Err(CommitFailed::Superseded)));
    assert_eq!(value(&storage, rec_a.num, "k"), None);
    // The next generation (the actor reloaded from disk) commits again.
    assert_eq!(ta.min_generation(), 1);
    let (op, rx) = turn(&a, &rec_a, &ta, 1, 3, "k", "fresh");
    storage.writer().submit(op);
    rx.await.unwrap().unwrap();
    assert_eq!(
        value(&storage, rec_a.num, "k").as_deref(),
        Some(&b"fresh"[..])
    );
}

#[tokio::test]
async fn a_fenced_actor_commits_nothing_more() {
    let (_dir, storage) = open();
    let (key, rec) = create(&storage, "a").await;
    let tracker = Arc::new(CommitTracker::default());
    tracker.fence();
    let (op, rx) = turn(&key, &rec, &tracker, 0, 1, "k", "after the fence");
    storage.writer().submit(op);
    assert!(matches!(rx.await.unwrap(), Err(CommitFailed::Superseded)));
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
    let message = |id: &str| crate::schema::InboxRecord {
        message_id: id.into(),
        body: b"{}".to_vec(),
        content_type: None,
        idempotency_key: None,
        attempts: 0,
        enqueued_at_ms: 1,
        kind: crate::schema::InboxKind::Message,
    };
    t.sends = vec![(to.clone(), message("m1")), (to.clone(), message("m2"))];
    t.relay_sends = true;
    let ready = storage.relay_ready().clone();
    let notified = ready.notified();
    storage.writer().submit(WriteOp::Turn(t));
    rx.await.unwrap().unwrap();
    notified.await;
    let page = storage.reader().unwrap().relay_page(10).unwrap();
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
    assert!(storage.reader().unwrap().relay_page(10).unwrap().is_empty());
}

/// A queued message `m1` under idempotency key `k1`.
fn keyed_message() -> crate::schema::InboxRecord {
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
type Shipment = (Vec<crate::schema::ReplicaBatch>, super::Release);

#[derive(Default)]
struct Collect {
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
    async fn next(&self) -> Shipment {
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

async fn apply_on(
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
    let key = ActorKey::new("t", "r1").unwrap();
    let rec = {
        let (done, created) = oneshot::channel();
        owner.writer().submit(WriteOp::GetOrCreate {
            key: key.clone(),
            version: 1,
            early: None,
            done,
        });
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
    let WriteOp::Turn(mut t) = op else {
        unreachable!()
    };
    t.events = vec![(
        1,
        EventRecord {
            kind: "hi".into(),
            data: b"{}".to_vec(),
            at_ms: 5,
        },
    )];
    t.alarms = vec![(
        "a".into(),
        Some(AlarmRecord {
            schedule: AlarmSchedule::At(10),
            payload: Vec::new(),
            next_due_ms: 10,
            attempts: 0,
            boot_attempts: 0,
            set_at_ms: 1,
        }),
    )];
    owner.writer().submit(WriteOp::Turn(t));
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
    assert_eq!(b.events(bn, 0, 10).unwrap(), o.events(on, 0, 10).unwrap());
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
    let (done_x, refused) = oneshot::channel();
    owner.writer().submit(WriteOp::GetOrCreate {
        key: ActorKey::new("t", "x1").unwrap(),
        version: 1,
        early: None,
        done: done_x,
    });
    let (done_y, fine) = oneshot::channel();
    owner.writer().submit(WriteOp::GetOrCreate {
        key: ActorKey::new("t", "y1").unwrap(),
        version: 1,
        early: None,
        done: done_y,
    });
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
        Err(crate::StorageError::Unavailable(_))
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
    // Releases every shipment until `rx` has its answer.
    async fn until<T>(c: &Collect, mut rx: oneshot::Receiver<T>) -> T {
        loop {
            if let Ok(v) = rx.try_recv() {
                return v;
            }
            let (_, release) = c.next().await;
            release(Ok(()));
        }
    }
    // Before the snapshot, the slot's writes stay here.
    let key = ActorKey::new("t", "j1").unwrap();
    let (done, rx) = oneshot::channel();
    owner.writer().submit(WriteOp::GetOrCreate {
        key: key.clone(),
        version: 1,
        early: None,
        done,
    });
    let rec = until(&shipped.0, rx).await.unwrap();
    let tracker = Arc::new(CommitTracker::default());
    let (op, rx) = turn(&key, &rec, &tracker, 0, 1, "k", "before");
    owner.writer().submit(op);
    until(&shipped.0, rx).await.unwrap();
    // The backup holds an old copy of another actor of the slot.
    create(&backup, "j-stale").await;

    let (done, rx) = oneshot::channel();
    owner.writer().submit(WriteOp::Snapshot {
        slots: vec![(9, 2, 1)],
        done,
    });
    let (batches, release) = shipped.0.next().await;
    assert_eq!(batches.len(), 1);
    let snapshot = batches[0].clone();
    assert!(snapshot.snapshot);
    assert!(matches!(
        snapshot.ops[..],
        [crate::schema::ReplicaOp::Install(_)]
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
    assert!(!batches[0].snapshot);
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
    let num = r.actor(&key).unwrap().unwrap().num;
    assert_eq!(r.state(num, "k").unwrap().as_deref(), Some(&b"after"[..]));
}

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
    let (op, rx) = turn(&key, &rec, &tracker, 0, 1, "k", "v1");
    source.writer().submit(op);
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
}
