//! The database file and the disk under the writer: a damaged, missing or
//! unreadable file at open is a clear error that changes nothing, and a
//! failing fsync refuses writes, keeps reads and recovers.

use std::sync::Arc;

use marmot_core::config::StorageConfig;

use super::tests::{create, turn, value};
use super::{CommitFailed, CommitTracker};
use crate::{Storage, WriterMetrics};

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
