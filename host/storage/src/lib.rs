//! Durable storage on redb: one database file per node.
//!
//! This crate is the lowest layer of the host: it knows the schema, how to
//! read it and how to write it, and nothing of actors, sandboxes or the
//! node (Cargo keeps it that way). Its tests build without wasmtime.
//!
//! * [`schema`] declares every table and record, with the format version.
//! * [`writer`] owns all writes: one thread folds queued operations from many
//!   actors into one fsync'd transaction (group commit) and only then
//!   completes each operation — the output gate that keeps replies from
//!   leaving before their turn is durable.
//! * [`Reader`] serves reads from MVCC read transactions, which never block
//!   the writer.

pub mod backup;
pub mod blobs;
pub mod bulk;
mod db;
pub mod journal;
mod reader;
pub mod reservations;
pub mod schema;
pub mod subscriptions;
pub mod writer;

use std::path::{Path, PathBuf};
use std::sync::Arc;

use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::{Histogram, exponential_buckets};
use redb::ReadableDatabase;

use db::DbCell;
pub use marmot_core::config::StorageConfig;
pub use reader::{AlarmsPage, DeliveryPage, DueScan, InputsPage, Page, Reader, StateEntries};
use schema::*;
pub use subscriptions::Subscriptions;
pub use writer::{
    CommitFailed, CommitTracker, EnqueueOutcome, Fence, Placement, Release, Released,
    ReplicaApplied, Replication, TurnCommit, WriteOp, Writer,
};

/// A storage failure.
#[derive(Debug, thiserror::Error)]
pub enum StorageError {
    /// redb failed (I/O, corruption).
    #[error("storage: {0}")]
    Db(#[from] redb::Error),
    /// A record could not be decoded.
    #[error("storage: {0}")]
    Decode(#[from] DecodeError),
    /// The database cannot be used by this build.
    #[error(transparent)]
    Format(#[from] FormatError),
    /// A file-system operation failed.
    #[error("{what}: {source}")]
    Io {
        /// What was being done.
        what: String,
        /// The OS error.
        source: std::io::Error,
    },
    /// The database file cannot be opened: damaged, not a database, or in
    /// use by another process.
    #[error("cannot open the database `{}`: {why}", path.display())]
    Open {
        /// The file.
        path: PathBuf,
        /// What is wrong and what to do.
        why: String,
    },
    /// The writer thread is gone (node shutting down).
    #[error("storage writer stopped")]
    WriterGone,
    /// The commit holding this operation failed; nothing of it was written.
    #[error("{0}")]
    CommitFailed(#[from] CommitFailed),
    /// The disk failed (full, or a failed write or fsync) and the database
    /// is closed until it can be reopened.
    #[error("storage unavailable: {0}")]
    Unavailable(String),
    /// The node is shutting down and has closed the database for good:
    /// work still running finds it gone (which is no fault to report;
    /// it said "the database is being reopened", at ERROR, at every stop).
    #[error("the node is shutting down")]
    ShuttingDown,
}

macro_rules! db_err {
    ($($t:ty),*) => {$(
        impl From<$t> for StorageError {
            fn from(e: $t) -> Self {
                StorageError::Db(e.into())
            }
        }
    )*};
}
db_err!(
    redb::TransactionError,
    redb::TableError,
    redb::StorageError,
    redb::CommitError,
    redb::DatabaseError
);

/// Logs from this crate carry the host's target, so a filter such as
/// `MARMOT_LOG=marmot=debug` covers storage too.
pub(crate) const LOG_TARGET: &str = "marmot::storage";

/// What the writer counts. The node registers these with its metrics
/// (handles are shared: counting here shows up there).
#[derive(Clone, Debug)]
pub struct WriterMetrics {
    /// Commits.
    pub commits: Counter,
    /// Failed commits.
    pub commit_failures: Counter,
    /// Operations per commit.
    pub commit_batch_size: Histogram,
    /// Commit latency including fsync.
    pub commit_seconds: Histogram,
    /// 1 while commits fail because the disk does (full, failed fsync).
    pub disk_faulted: Gauge,
    /// Times the database was reopened after a disk failure.
    pub reopens: Counter,
    /// The journal's checkpoints.
    pub journal: journal::JournalMetrics,
}

impl WriterMetrics {
    /// Fresh counters and histograms (not registered anywhere yet).
    pub fn new() -> Self {
        Self {
            commits: Counter::default(),
            commit_failures: Counter::default(),
            commit_batch_size: Histogram::new(exponential_buckets(1.0, 2.0, 14)),
            commit_seconds: Histogram::new(exponential_buckets(50e-6, 2.0, 16)),
            disk_faulted: Gauge::default(),
            reopens: Counter::default(),
            journal: journal::JournalMetrics::new(),
        }
    }
}

impl Default for WriterMetrics {
    fn default() -> Self {
        Self::new()
    }
}

/// The node's database and its writer.
pub struct Storage {
    db: Arc<DbCell>,
    blobs: blobs::BlobStore,
    writer: Writer,
    path: PathBuf,
    subscriptions: Arc<Subscriptions>,
    outbox_ready: Arc<tokio::sync::Notify>,
    relay_ready: Arc<tokio::sync::Notify>,
    file_reservations: Arc<reservations::FileReservations>,
    /// Held by the backup being written: backups go one at a time.
    backups: std::sync::Mutex<()>,
    /// The data directory.
    dir: PathBuf,
    /// The last node on it stopped cleanly (see [`CLEAN_STOP`]).
    after_clean_stop: bool,
}

/// Open (or create) the database file `path`, on the journal when
/// `journal_bytes` is not 0 (replaying what the journal holds first). Every
/// open of a data directory's database goes through here: after a power
/// loss the file alone may lack commits that only the journal holds.
pub fn open_database(
    path: &Path,
    cache_bytes: usize,
    journal_bytes: u64,
    metrics: &journal::JournalMetrics,
) -> Result<redb::Database, redb::DatabaseError> {
    let builder = {
        let mut b = redb::Builder::new();
        b.set_cache_size(cache_bytes);
        b
    };
    if journal_bytes == 0 {
        // The journal's last records may still be needed: replay them into
        // the file (with a small journal, emptied at once) before going
        // without.
        if journal::log_paths(path).iter().any(|p| p.exists()) {
            drop(journal::open(path, 0, metrics.clone())?);
            for p in journal::log_paths(path) {
                std::fs::remove_file(p)?;
            }
        }
        return builder.create(path);
    }
    let backend = journal::open(path, journal_bytes, metrics.clone())?;
    builder.create_with_backend(backend)
}

/// The database's identity, made now if it has none yet. One that cannot
/// be written (a full disk at the first start after an upgrade) is this
/// run's alone: the node still starts, serving reads, as it did before
/// databases had identities (in a cluster it then counts as a new store).
fn store_id(db: &redb::Database) -> Result<String, StorageError> {
    let read = db.begin_read()?;
    if let Some(id) = read.open_table(schema::META)?.get(schema::STORE_ID_KEY)? {
        return Ok(String::from_utf8_lossy(id.value()).into_owned());
    }
    drop(read);
    let id = format!("{:032x}", rand::random::<u128>());
    let written = (|| -> Result<(), StorageError> {
        let write = db.begin_write()?;
        write
            .open_table(schema::META)?
            .insert(schema::STORE_ID_KEY, id.as_bytes())?;
        write.commit()?;
        Ok(())
    })();
    if let Err(e) = written {
        tracing::warn!(target: LOG_TARGET, error = %e, "cannot record the database's identity; using one for this run");
    }
    Ok(id)
}

/// Whether `dir` holds a file anywhere below it.
fn holds_a_file(dir: &Path) -> bool {
    let Ok(entries) = std::fs::read_dir(dir) else {
        return false;
    };
    entries.flatten().any(|e| match e.file_type() {
        Ok(t) if t.is_dir() => holds_a_file(&e.path()),
        Ok(_) => true,
        Err(_) => false,
    })
}

/// The I/O error under a failed open, if that is what failed.
fn io_kind(e: &redb::DatabaseError) -> Option<std::io::ErrorKind> {
    match e {
        redb::DatabaseError::Storage(redb::StorageError::Io(io)) => Some(io.kind()),
        _ => None,
    }
}

/// Whether an open failed for want of disk space.
fn disk_full(e: &redb::DatabaseError) -> bool {
    use std::io::ErrorKind;
    matches!(
        io_kind(e),
        Some(ErrorKind::StorageFull | ErrorKind::QuotaExceeded)
    )
}

/// What a failed open of `path` means for the operator.
fn open_error(path: &Path, e: redb::DatabaseError) -> StorageError {
    use std::io::ErrorKind;
    let io_kind = io_kind(&e);
    let why = match e {
        redb::DatabaseError::DatabaseAlreadyOpen => {
            "it is in use by another Marmot process (one node per data directory)".to_owned()
        }
        // Not damage: moving a healthy file away on that advice lost it.
        other if io_kind == Some(ErrorKind::PermissionDenied) => format!(
            "{other}: the user running Marmot must be able to read and write the data \
             directory and its files (check their owner and mode). Nothing was changed."
        ),
        other if io_kind == Some(ErrorKind::IsADirectory) => {
            format!("{other}: a directory holds the database's name. Nothing was changed.")
        }
        // Not damage either: the same advice lost healthy files too.
        other if disk_full(&other) => {
            format!(
                "{other}: the data directory's disk is full. Free space (the journal needs \
                 `storage.journal_bytes`, 32 MiB by default), then start again. Nothing was \
                 changed."
            )
        }
        other if io_kind == Some(ErrorKind::ReadOnlyFilesystem) => format!(
            "{other}: the data directory is on a read-only file system; Marmot writes there \
             (remount it read-write). Nothing was changed."
        ),
        other => format!(
            "{other}. The file is damaged or not a Marmot database: restore a backup \
             (`marmot restore BACKUP --data NEW_DIR`) and start on that directory, or move the \
             file (and `blobs/`) away to start empty. Nothing was changed."
        ),
    };
    StorageError::Open {
        path: path.to_owned(),
        why,
    }
}

impl Storage {
    /// Open (or create) `dir/marmot.redb` and start the writer thread.
    pub fn open(
        dir: &Path,
        config: &StorageConfig,
        metrics: WriterMetrics,
    ) -> Result<Self, StorageError> {
        std::fs::create_dir_all(dir).map_err(|e| StorageError::Io {
            what: format!("failed to create data directory `{}`", dir.display()),
            source: e,
        })?;
        // A restore cut off before it placed the database: starting here
        // would make an empty node and remove the restored blobs as garbage.
        let restoring = dir.join(backup::RESTORING);
        if restoring.exists() {
            return Err(StorageError::Io {
                what: format!("data directory `{}`", dir.display()),
                source: std::io::Error::new(
                    std::io::ErrorKind::InvalidData,
                    format!(
                        "a restore into it was cut off (`{}` is there): remove the directory \
                         and restore again",
                        backup::RESTORING
                    ),
                ),
            });
        }
        let path = dir.join("marmot.redb");
        // Blobs next to a database that is missing or empty: the directory
        // held a node whose database is gone (deleted, or a copy made
        // without it). Starting would make an empty node and remove those
        // blobs as garbage within a second.
        let empty = std::fs::metadata(&path).map_or(true, |m| m.is_file() && m.len() == 0);
        if empty && holds_a_file(&dir.join("blobs")) {
            return Err(StorageError::Open {
                path,
                why: "it is missing or empty, but the directory holds the blobs of a database \
                      (`blobs/`): restore a backup (`marmot restore BACKUP --data NEW_DIR`) and \
                      start on that directory, or, to start empty, move `blobs/` away too. \
                      Nothing was changed."
                    .into(),
            });
        }
        let (cache_bytes, journal_bytes) = (config.cache_bytes, config.journal_bytes);
        let (file, journal) = (path.clone(), metrics.journal.clone());
        let opener: db::Opener =
            Box::new(move || open_database(&file, cache_bytes, journal_bytes, &journal));
        Self::open_with(dir, config, metrics, opener)
    }

    /// Open with `opener`, which opens `dir/marmot.redb` (the tests open it
    /// on a storage backend that injects disk faults).
    pub(crate) fn open_with(
        dir: &Path,
        config: &StorageConfig,
        metrics: WriterMetrics,
        opener: db::Opener,
    ) -> Result<Self, StorageError> {
        let path = dir.join("marmot.redb");
        let made: Vec<PathBuf> = journal::log_paths(&path)
            .into_iter()
            .chain([path.clone()])
            .filter(|p| !p.exists())
            .collect();
        let db = opener().map_err(|e| {
            if disk_full(&e) {
                // What this start made on a disk it then filled (journal
                // files preallocated, an empty database) goes: it left the
                // disk full for every later try. (A start that got this
                // far holds the journal's lock: no other node uses them.)
                for p in &made {
                    let _ = std::fs::remove_file(p);
                }
            }
            open_error(&path, e)
        })?;
        check_format(&db)?;
        // Removed (durably) only once the node is about to run anything
        // ([`Self::take_clean_stop`]): a start that fails before that (a
        // bad master key) leaves it for the next.
        let after_clean_stop = dir.join(CLEAN_STOP).exists();
        let subscriptions = Arc::new(Subscriptions::load(&db)?);
        let blobs = blobs::BlobStore::open(dir.join("blobs"))?;
        let outbox_ready = Arc::new(tokio::sync::Notify::new());
        let relay_ready = Arc::new(tokio::sync::Notify::new());
        let db = Arc::new(DbCell::new(db, opener, path.clone()));
        let writer = Writer::start(
            db.clone(),
            config,
            metrics,
            subscriptions.clone(),
            outbox_ready.clone(),
            relay_ready.clone(),
            blobs.unreferenced(),
        )?;
        Ok(Self {
            db,
            blobs,
            writer,
            path,
            subscriptions,
            outbox_ready,
            relay_ready,
            file_reservations: Arc::default(),
            backups: std::sync::Mutex::default(),
            dir: dir.to_path_buf(),
            after_clean_stop,
        })
    }

    /// Whether the node that used this directory last stopped cleanly
    /// ([`Self::close`]): work it left unfinished was cut by that stop,
    /// not by a crash, and counts against no one's crash attempts. The
    /// marker is removed, durably, before the answer is given: a crash
    /// from here on finds none. One that cannot be removed is an error: it
    /// would make a later crash pass for a clean stop.
    pub fn take_clean_stop(&self) -> Result<bool, StorageError> {
        if !self.after_clean_stop {
            return Ok(false);
        }
        let path = self.dir.join(CLEAN_STOP);
        std::fs::remove_file(&path)
            .and_then(|()| std::fs::File::open(&self.dir)?.sync_all())
            .map_err(|e| StorageError::Io {
                what: format!(
                    "cannot remove `{}` (a later crash would pass for a clean stop)",
                    path.display()
                ),
                source: e,
            })?;
        Ok(true)
    }

    /// Bytes of files that turns in flight add to their types.
    pub fn file_reservations(&self) -> &Arc<reservations::FileReservations> {
        &self.file_reservations
    }

    /// The outbound webhook subscriptions.
    pub fn subscriptions(&self) -> &Arc<Subscriptions> {
        &self.subscriptions
    }

    /// Notified after commits that add or change outbox rows.
    pub fn outbox_ready(&self) -> &Arc<tokio::sync::Notify> {
        &self.outbox_ready
    }

    /// Notified after commits that add relay rows.
    pub fn relay_ready(&self) -> &Arc<tokio::sync::Notify> {
        &self.relay_ready
    }

    /// The database file.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// This database's identity ([`schema::STORE_ID_KEY`]), made now if it
    /// has none yet. Asked for by a node joining a cluster, before any
    /// turn (it commits a row itself; a node alone never asks, so its
    /// database is as before).
    pub fn store_id(&self) -> Result<String, StorageError> {
        store_id(&*self.db.get()?)
    }

    /// A consistent read-only view of everything committed so far.
    pub fn reader(&self) -> Result<Reader, StorageError> {
        Ok(Reader {
            txn: self.db.get()?.begin_read()?,
        })
    }

    /// Why commits are failing (a full disk, a failed fsync), while they
    /// are: the node stays up, serves reads and refuses writes with 503
    /// until a commit succeeds again.
    pub fn disk_fault(&self) -> Option<String> {
        self.db.fault()
    }

    /// The blobs holding large files.
    pub fn blobs(&self) -> &blobs::BlobStore {
        &self.blobs
    }

    /// Whether a committed file refers to blob `sha256`, read from a
    /// snapshot begun now (what [`blobs::BlobStore`]'s removals ask).
    pub fn blob_referenced_now(&self, sha256: &[u8; 32]) -> Result<bool, StorageError> {
        self.reader()?.blob_referenced(sha256)
    }

    /// Remove the blobs whose last file went and that nothing took again,
    /// as `release` says when (see [`blobs::BlobStore::reap`]). Blocking.
    pub fn reap_blobs(&self, release: blobs::Release) -> Result<usize, StorageError> {
        self.blobs
            .reap(release, |sha| self.blob_referenced_now(sha))
    }

    /// The group-commit writer.
    pub fn writer(&self) -> &Writer {
        &self.writer
    }

    /// Wait until every write queued so far is durable.
    pub async fn flush(&self) {
        self.writer.flush().await;
    }

    /// At shutdown: flush, then close the database cleanly (no repair and
    /// no journal replay at the next start; `marmot.redb` whole by itself).
    /// Writes after this fail with `Unavailable`.
    pub async fn close(&self) {
        self.flush().await;
        // Before the journal's lock goes: no other node can start on the
        // directory between this and the database's close.
        if let Err(e) = mark_clean_stop(&self.dir) {
            tracing::warn!(error = %e, "cannot mark the stop as clean; the next start counts the turns it cut as crashes");
        }
        self.db.shut_down();
    }
}

/// The file a clean stop leaves in the data directory, removed at the
/// next start. Turns a stop cuts short (a durable message, an alarm, a
/// webhook still running when the node closed its storage) run again at
/// the next start like those a crash cut, but only after a crash is each
/// such re-run counted towards `recovery.max_attempts`: four rolling
/// restarts during one long turn gave it up as a crasher (found by a
/// probe).
pub const CLEAN_STOP: &str = "clean-stop";

fn mark_clean_stop(dir: &Path) -> std::io::Result<()> {
    let path = dir.join(CLEAN_STOP);
    let file = std::fs::File::create(&path)?;
    file.sync_all()?;
    std::fs::File::open(dir)?.sync_all()
}

/// Type records are stored as JSON: they are rare, small, and carry the
/// user's config, which must stay readable as config keys are added.
pub(crate) fn decode_type(bytes: &[u8]) -> Result<TypeRecord, StorageError> {
    serde_json::from_slice(bytes)
        .map_err(|e| StorageError::Db(redb::Error::Corrupted(format!("corrupt type record: {e}"))))
}

pub(crate) fn encode_type(rec: &TypeRecord) -> Vec<u8> {
    serde_json::to_vec(rec).expect("type records always serialize")
}
