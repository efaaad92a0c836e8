//! The journal under the database: a commit costs one sequential write and
//! one `fdatasync` of a preallocated log, instead of a write per B-tree
//! page scattered over the database file and an `fdatasync` of that file.
//!
//! redb commits by writing every page a transaction dirtied and its header,
//! then calling the backend's `sync_data` once. [`Journaled`] is that
//! backend. Each write goes to the database file at once (into the page
//! cache, so readers and a `kill -9` see it) and is also appended to the
//! commit's record in memory; `sync_data` writes the record to the active
//! log file in one synchronous write (`O_DIRECT | O_DSYNC`, or `pwrite` and
//! `fdatasync` where the file system refuses `O_DIRECT`). The database file is
//! synced later, in the background, a log at a time ("checkpoint"): on this
//! kind of VM twelve scattered 4 KiB pages and an `fdatasync` take ~320 µs,
//! the same 48 KiB written in one piece ~100 µs (`docs/design.md`,
//! "Storage: the journal").
//!
//! **Recovery.** Opening replays every valid record of both logs, oldest
//! log first, onto the database file, syncs it, and empties the logs; only
//! then does redb open the file (and run its own repair if the last commit
//! left it marked dirty). Replay ends with the last complete record, whose
//! header write is the last commit that returned; a torn record fails its
//! checksum and ends its log. Why replaying onto a file that may hold newer
//! or half-written pages is right: redb copies on write, so a transaction
//! only writes pages that are free in the last commit; every page the last
//! recorded commit can reach was either written by a record (replayed, in
//! order, so the newest version wins) or last written before the log that
//! holds it was checkpointed (durable in the database file, and not
//! overwritten since, or a record would hold the new version).
//!
//! **Checkpoints.** There are two logs. When the active one is full the
//! other becomes active, once the database file has been synced since that
//! other log was retired (normally long before: a background thread syncs
//! the file as soon as a log is retired, and the commit waits only if the
//! disk cannot keep up). A log is never emptied while the database file
//! may lack its writes. A commit larger than a log skips the journal: the
//! database file is synced directly, then both logs are emptied.
//!
//! **Ownership.** A log's header names the database file it belongs to
//! (device, inode, creation time), and so does every record's checksum;
//! logs of another file (a database that was deleted or restored over) are
//! ignored and emptied, never replayed. The persisted format is declared in
//! `format.rs`, with its version.

use std::fs::{File, OpenOptions};
use std::io;
use std::os::unix::fs::{FileExt, OpenOptionsExt};
use std::path::{Path, PathBuf};
use std::sync::{Arc, Condvar, Mutex, MutexGuard};
use std::thread::JoinHandle;
use std::time::Instant;

use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::histogram::{Histogram, exponential_buckets};
use redb::StorageBackend;
use redb::backends::FileBackend;

use crate::LOG_TARGET;

mod format;
pub use format::FORMAT;
use format::*;

/// A record buffer that grew past this is given back after its commit.
const KEEP_BUFFER: usize = 4 << 20;

/// The two log files of the database at `db`.
pub fn log_paths(db: &Path) -> [PathBuf; 2] {
    [0, 1].map(|i| {
        let mut name = db.as_os_str().to_owned();
        name.push(format!("-journal-{i}"));
        PathBuf::from(name)
    })
}

/// Whether a handle (of this process or another: a running node) has the
/// journal of the database at `db` open.
pub fn in_use(db: &Path) -> bool {
    let Ok(log) = File::open(&log_paths(db)[0]) else {
        return false;
    };
    matches!(log.try_lock(), Err(std::fs::TryLockError::WouldBlock))
}

/// What the journal counts (registered by the node with the writer's).
#[derive(Clone, Debug)]
pub struct JournalMetrics {
    /// Syncs of the database file that let a log be reused.
    pub checkpoints: Counter,
    /// How long each took.
    pub checkpoint_seconds: Histogram,
    /// Commits that waited for a checkpoint (the disk fell behind).
    pub waits: Counter,
    /// Commits too large for a log, synced to the database file directly.
    pub direct: Counter,
}

impl JournalMetrics {
    pub fn new() -> Self {
        Self {
            checkpoints: Counter::default(),
            checkpoint_seconds: Histogram::new(exponential_buckets(1e-3, 2.0, 14)),
            waits: Counter::default(),
            direct: Counter::default(),
        }
    }
}

impl Default for JournalMetrics {
    fn default() -> Self {
        Self::new()
    }
}

/// One log file in use.
#[derive(Debug)]
struct Log {
    file: File,
    /// Opened `O_DIRECT | O_DSYNC`: each write is durable when it returns,
    /// without the page cache (~15–20 µs less per commit than `pwrite` and
    /// `fdatasync` on this VM). Otherwise (a file system that refuses
    /// `O_DIRECT`, such as older tmpfs) writes are followed by `fdatasync`.
    direct: bool,
    epoch: u64,
    /// Where the next record goes.
    next: u64,
    seq: u64,
}

impl Log {
    /// Write `bytes` at `at` and make them durable. With `direct`, `bytes`
    /// must be whole blocks; they are copied to a block-aligned place in
    /// `scratch` first, as `O_DIRECT` requires of the memory too.
    fn write_durably(&self, bytes: &[u8], at: u64, scratch: &mut Vec<u8>) -> io::Result<()> {
        if !self.direct {
            self.file.write_all_at(bytes, at)?;
            return self.file.sync_data();
        }
        debug_assert_eq!(bytes.len() as u64 % BLOCK, 0);
        scratch.resize(bytes.len() + BLOCK as usize, 0);
        let start = scratch.as_ptr().align_offset(BLOCK as usize);
        let aligned = &mut scratch[start..start + bytes.len()];
        aligned.copy_from_slice(bytes);
        self.file.write_all_at(aligned, at)
    }

    /// Write the header for `epoch`, durably.
    fn write_header(
        &self,
        epoch: u64,
        identity: Identity,
        scratch: &mut Vec<u8>,
    ) -> io::Result<()> {
        let mut block = [0u8; BLOCK as usize];
        block[..HEADER_LEN].copy_from_slice(&header_bytes(epoch, identity));
        self.write_durably(&block, 0, scratch)
    }
}

#[derive(Debug)]
struct State {
    logs: [Log; 2],
    active: usize,
    /// The record being built: RECORD_HEADER bytes, then the operations
    /// since the last `sync_data`.
    record: Vec<u8>,
    /// Where a record is copied to be block-aligned for `O_DIRECT`.
    scratch: Vec<u8>,
    /// Set when a write failed or a log write's outcome is unknown: no
    /// further commit may succeed on this handle (redb then latches the
    /// error and the database is opened again, which replays the logs).
    broken: Option<String>,
}

/// What the writer and the checkpoint thread share.
#[derive(Debug, Default)]
struct Checkpoint {
    /// A log whose records need the database file synced.
    retired: Option<usize>,
    /// Whether every record of each log is durable in the database file.
    clean: [bool; 2],
    failed: Option<String>,
    stop: bool,
}

#[derive(Debug)]
struct Shared {
    state: Mutex<Checkpoint>,
    changed: Condvar,
    /// Called before (`false`) and after (`true`) each sync of the
    /// database file (tests: what a power loss could leave of it, and
    /// slow checkpoints).
    on_synced: Option<OnSynced>,
}

/// See [`Shared::on_synced`].
#[derive(Clone)]
pub(crate) struct OnSynced(pub Arc<dyn Fn(bool) + Send + Sync>);

impl std::fmt::Debug for OnSynced {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("OnSynced")
    }
}

impl Shared {
    fn synced(&self, done: bool) {
        if let Some(f) = &self.on_synced {
            (f.0)(done);
        }
    }
}

/// redb's storage backend for the database file, with the journal.
#[derive(Debug)]
pub struct Journaled {
    db: FileBackend,
    size: u64,
    identity: Identity,
    state: Mutex<State>,
    shared: Arc<Shared>,
    sync_handle: Arc<File>,
    thread: Mutex<Option<JoinHandle<()>>>,
    metrics: JournalMetrics,
    /// Log 0 opened once more and `flock`ed for as long as this handle is
    /// open: one handle per journal, across processes and within one.
    lock: Mutex<Option<File>>,
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

/// Open `path` (creating it if needed) with its logs of `size` bytes each,
/// replaying what they hold first. `DatabaseAlreadyOpen` if another handle
/// (this process's or another's) has the journal open: replaying under a
/// live writer would put older pages back under it.
pub fn open(
    path: &Path,
    size: u64,
    metrics: JournalMetrics,
) -> Result<Journaled, redb::DatabaseError> {
    open_observed(path, size, metrics, None, true)
}

/// [`open`], calling `on_synced` around every sync of the database file,
/// and writing the logs without direct I/O unless `try_direct`.
pub(crate) fn open_observed(
    path: &Path,
    size: u64,
    metrics: JournalMetrics,
    on_synced: Option<OnSynced>,
    try_direct: bool,
) -> Result<Journaled, redb::DatabaseError> {
    let paths = log_paths(path);
    let lock = OpenOptions::new()
        .read(true)
        .write(true)
        .create(true)
        .truncate(false)
        .open(&paths[0])?;
    match lock.try_lock() {
        Ok(()) => {}
        Err(std::fs::TryLockError::WouldBlock) => {
            return Err(redb::DatabaseError::DatabaseAlreadyOpen);
        }
        Err(std::fs::TryLockError::Error(e)) => return Err(e.into()),
    }
    let mut journaled = open_locked(path, &paths, size, metrics, on_synced, try_direct)?;
    journaled.lock = Mutex::new(Some(lock));
    Ok(journaled)
}

fn open_locked(
    path: &Path,
    paths: &[PathBuf; 2],
    size: u64,
    metrics: JournalMetrics,
    on_synced: Option<OnSynced>,
    try_direct: bool,
) -> io::Result<Journaled> {
    let size = align(size.max(4 * BLOCK));
    let existed = path.exists();
    let file = OpenOptions::new()
        .read(true)
        .write(true)
        .create(true)
        .truncate(false)
        .open(path)?;
    let identity = identity_of(&file)?;
    let mut max_epoch = 0;
    let mut logs = Vec::new();
    for p in paths {
        match File::open(p) {
            Ok(f) => logs.extend(scan(&f, identity)?),
            Err(e) if e.kind() == io::ErrorKind::NotFound => {}
            Err(e) => return Err(e),
        }
    }
    logs.sort_by_key(|(epoch, _)| *epoch);
    let mut replayed = 0;
    if existed {
        for (epoch, records) in &logs {
            max_epoch = max_epoch.max(*epoch);
            for body in records {
                // A record whose checksum holds but which does not parse is
                // damage: stopping short could leave pages of later commits
                // under an older header, so refuse to open instead.
                let ops = ops(body).ok_or_else(|| {
                    io::Error::new(
                        io::ErrorKind::InvalidData,
                        format!(
                            "a record of the storage journal (epoch {epoch}) does not parse; \
                             the journal beside `{}` is damaged",
                            path.display()
                        ),
                    )
                })?;
                for op in ops {
                    match op {
                        Op::Write(offset, data) => file.write_all_at(data, offset)?,
                        Op::SetLen(len) => file.set_len(len)?,
                    }
                }
                replayed += 1;
            }
        }
    }
    if replayed > 0 {
        file.sync_data()?;
        tracing::info!(target: LOG_TARGET, records = replayed, db = %path.display(), "replayed the storage journal");
    }
    // Both logs start empty: log 1 with the older epoch, log 0 active.
    let mut opened = Vec::with_capacity(2);
    for (i, p) in paths.iter().enumerate() {
        let log = prepare_log(p, size, max_epoch + 2 - i as u64, identity, try_direct)?;
        opened.push(log);
    }
    if let Some(dir) = path.parent().filter(|d| !d.as_os_str().is_empty()) {
        File::open(dir)?.sync_all()?;
    }
    let [log0, log1]: [Log; 2] = opened.try_into().expect("two logs");
    tracing::info!(
        target: LOG_TARGET,
        files = 2,
        mb_each = size >> 20,
        direct_io = log0.direct && log1.direct,
        replayed,
        "storage journal open: a commit is one sequential write to it; the database file is synced in the background"
    );
    let sync_handle = Arc::new(file.try_clone()?);
    let shared = Arc::new(Shared {
        state: Mutex::new(Checkpoint {
            clean: [false, true],
            ..Checkpoint::default()
        }),
        changed: Condvar::new(),
        on_synced,
    });
    let thread = {
        let (shared, file, metrics) = (shared.clone(), sync_handle.clone(), metrics.clone());
        std::thread::Builder::new()
            .name("marmot-checkpoint".into())
            .spawn(move || checkpoints(&shared, &file, &metrics))?
    };
    Ok(Journaled {
        db: FileBackend::new(file).map_err(io::Error::other)?,
        size,
        identity,
        state: Mutex::new(State {
            logs: [log0, log1],
            active: 0,
            record: vec![0; RECORD_HEADER],
            scratch: Vec::new(),
            broken: None,
        }),
        shared,
        sync_handle,
        thread: Mutex::new(Some(thread)),
        metrics,
        lock: Mutex::new(None),
    })
}

/// Open (or create, zero-filled to `size`) the log at `path`, emptied: a new
/// header with `epoch`, synced.
fn prepare_log(
    path: &Path,
    size: u64,
    epoch: u64,
    identity: Identity,
    try_direct: bool,
) -> io::Result<Log> {
    let file = OpenOptions::new()
        .read(true)
        .write(true)
        .create(true)
        .truncate(false)
        .open(path)?;
    if file.metadata()?.len() != size {
        file.set_len(0)?;
        let zeros = vec![0u8; 1 << 20];
        let mut at = 0;
        while at < size {
            let n = (size - at).min(zeros.len() as u64) as usize;
            file.write_all_at(&zeros[..n], at)?;
            at += n as u64;
        }
    }
    file.sync_data()?;
    let buffered = Log {
        file,
        direct: false,
        epoch,
        next: BLOCK,
        seq: 0,
    };
    let mut scratch = Vec::new();
    // Direct I/O if the file system takes it: tried with the header write,
    // since some accept the open and refuse the write.
    let refused = |e: &io::Error| e.raw_os_error() == Some(libc::EINVAL);
    if !try_direct {
        buffered.write_header(epoch, identity, &mut scratch)?;
        return Ok(buffered);
    }
    match OpenOptions::new()
        .read(true)
        .write(true)
        .custom_flags(libc::O_DIRECT | libc::O_DSYNC)
        .open(path)
    {
        Ok(file) => {
            let direct = Log {
                file,
                direct: true,
                ..buffered
            };
            match direct.write_header(epoch, identity, &mut scratch) {
                Ok(()) => return Ok(direct),
                Err(e) if refused(&e) => {}
                Err(e) => return Err(e),
            }
        }
        Err(e) if refused(&e) => {}
        Err(e) => return Err(e),
    }
    buffered.write_header(epoch, identity, &mut scratch)?;
    Ok(buffered)
}

/// The checkpoint thread: sync the database file for each retired log.
fn checkpoints(shared: &Shared, file: &File, metrics: &JournalMetrics) {
    let mut st = lock(&shared.state);
    loop {
        while st.retired.is_none() && !st.stop {
            st = shared.changed.wait(st).unwrap_or_else(|p| p.into_inner());
        }
        if st.stop {
            return;
        }
        let log = st.retired.take().expect("checked above");
        drop(st);
        let started = Instant::now();
        shared.synced(false);
        let result = file.sync_data();
        if result.is_ok() {
            shared.synced(true);
        }
        metrics
            .checkpoint_seconds
            .observe(started.elapsed().as_secs_f64());
        st = lock(&shared.state);
        match result {
            Ok(()) => {
                st.clean[log] = true;
                metrics.checkpoints.inc();
            }
            Err(e) => {
                tracing::error!(target: LOG_TARGET, error = %e, "syncing the database file for a checkpoint failed");
                st.failed = Some(format!("checkpoint sync failed: {e}"));
            }
        }
        shared.changed.notify_all();
    }
}

impl Journaled {
    fn stop_checkpoints(&self) {
        lock(&self.shared.state).stop = true;
        self.shared.changed.notify_all();
        if let Some(t) = lock(&self.thread).take() {
            let _ = t.join();
        }
    }

    /// Make `st.record` durable in the active log (switching logs first if
    /// it does not fit), or, if it is larger than a log, in the database
    /// file itself.
    fn commit(&self, st: &mut State) -> io::Result<()> {
        let body = (st.record.len() - RECORD_HEADER) as u64;
        let len = align(RECORD_HEADER as u64 + body);
        if len > self.size - BLOCK {
            return self.commit_direct(st);
        }
        if st.logs[st.active].next + len > self.size {
            self.switch(st)?;
        }
        let log = &mut st.logs[st.active];
        let r = &mut st.record;
        r[0..4].copy_from_slice(&RECORD_MAGIC.to_le_bytes());
        r[8..16].copy_from_slice(&log.epoch.to_le_bytes());
        r[16..24].copy_from_slice(&log.seq.to_le_bytes());
        r[24..32].copy_from_slice(&body.to_le_bytes());
        let sum = record_crc(self.identity, &[&r[8..]]);
        r[4..8].copy_from_slice(&sum.to_le_bytes());
        r.resize(len as usize, 0);
        log.write_durably(r, log.next, &mut st.scratch)?;
        log.next += len;
        log.seq += 1;
        Ok(())
    }

    /// Retire the active log and make the other one active, once the
    /// database file holds the other's records durably.
    fn switch(&self, st: &mut State) -> io::Result<()> {
        let other = 1 - st.active;
        {
            let mut ck = lock(&self.shared.state);
            if !ck.clean[other] {
                self.metrics.waits.inc();
            }
            while !ck.clean[other] {
                if let Some(why) = &ck.failed {
                    return Err(io::Error::other(why.clone()));
                }
                ck = self
                    .shared
                    .changed
                    .wait(ck)
                    .unwrap_or_else(|p| p.into_inner());
            }
            ck.clean[other] = false;
            ck.retired = Some(st.active);
            self.shared.changed.notify_all();
        }
        let epoch = st.logs[st.active].epoch + 1;
        let log = &mut st.logs[other];
        log.write_header(epoch, self.identity, &mut st.scratch)?;
        log.epoch = epoch;
        log.next = BLOCK;
        log.seq = 0;
        st.active = other;
        Ok(())
    }

    /// A commit larger than a log: sync the database file, then empty both
    /// logs, whose records it now holds (replaying them after this commit
    /// would put older pages back).
    fn commit_direct(&self, st: &mut State) -> io::Result<()> {
        self.metrics.direct.inc();
        self.sync_and_empty(st)
    }

    /// On close: sync the database file and empty both logs, so that a
    /// stopped node's `marmot.redb` is whole by itself (a copy of it, or an
    /// older Marmot, needs no journal). Not after a failed write: the logs
    /// then keep what the next open replays.
    fn checkpoint_all(&self) {
        let mut st = lock(&self.state);
        if st.broken.is_some() {
            return;
        }
        if let Err(e) = self.sync_and_empty(&mut st) {
            tracing::warn!(target: LOG_TARGET, error = %e, "could not empty the storage journal at close; the next open replays it");
        }
    }

    /// Sync the database file, then empty both logs (new epochs, the active
    /// one's the newer): the file now holds every record they held, and
    /// replaying them over what follows would put older pages back.
    fn sync_and_empty(&self, st: &mut State) -> io::Result<()> {
        self.shared.synced(false);
        self.sync_handle.sync_data()?;
        self.shared.synced(true);
        let epoch = st.logs[0].epoch.max(st.logs[1].epoch) + 1;
        for (i, log) in st.logs.iter_mut().enumerate() {
            let e = epoch + u64::from(i == st.active);
            log.write_header(e, self.identity, &mut st.scratch)?;
            log.epoch = e;
            log.next = BLOCK;
            log.seq = 0;
        }
        let mut ck = lock(&self.shared.state);
        ck.clean = [true, true];
        ck.clean[st.active] = false;
        ck.retired = None;
        Ok(())
    }
}

impl Drop for Journaled {
    fn drop(&mut self) {
        self.stop_checkpoints();
    }
}

impl StorageBackend for Journaled {
    fn len(&self) -> io::Result<u64> {
        self.db.len()
    }

    fn read(&self, offset: u64, out: &mut [u8]) -> io::Result<()> {
        self.db.read(offset, out)
    }

    fn set_len(&self, len: u64) -> io::Result<()> {
        let mut st = lock(&self.state);
        if let Err(e) = self.db.set_len(len) {
            st.broken = Some(format!("resizing the database file failed: {e}"));
            return Err(e);
        }
        st.record.push(OP_SET_LEN);
        st.record.extend_from_slice(&len.to_le_bytes());
        Ok(())
    }

    fn sync_data(&self) -> io::Result<()> {
        let mut st = lock(&self.state);
        if let Some(why) = &st.broken {
            return Err(io::Error::other(why.clone()));
        }
        if st.record.len() == RECORD_HEADER {
            return Ok(());
        }
        let result = self.commit(&mut st);
        if let Err(e) = &result {
            st.broken = Some(format!("writing the storage journal failed: {e}"));
        }
        st.record.truncate(RECORD_HEADER);
        if st.record.capacity() > KEEP_BUFFER {
            st.record.shrink_to(KEEP_BUFFER);
            st.scratch = Vec::new();
        }
        result
    }

    fn write(&self, offset: u64, data: &[u8]) -> io::Result<()> {
        let mut st = lock(&self.state);
        if let Err(e) = self.db.write(offset, data) {
            st.broken = Some(format!("writing the database file failed: {e}"));
            return Err(e);
        }
        st.record.push(OP_WRITE);
        st.record.extend_from_slice(&offset.to_le_bytes());
        st.record
            .extend_from_slice(&(data.len() as u64).to_le_bytes());
        st.record.extend_from_slice(data);
        Ok(())
    }

    fn close(&self) -> io::Result<()> {
        self.stop_checkpoints();
        self.checkpoint_all();
        let result = self.db.close();
        drop(lock(&self.lock).take());
        result
    }

    fn try_lock_range(
        &self,
        start: std::ops::Bound<u64>,
        end: std::ops::Bound<u64>,
    ) -> Result<bool, redb::BackendError> {
        self.db.try_lock_range(start, end)
    }

    fn try_lock_shared_range(
        &self,
        start: std::ops::Bound<u64>,
        end: std::ops::Bound<u64>,
    ) -> Result<bool, redb::BackendError> {
        self.db.try_lock_shared_range(start, end)
    }

    fn lock_range(
        &self,
        start: std::ops::Bound<u64>,
        end: std::ops::Bound<u64>,
    ) -> Result<(), redb::BackendError> {
        self.db.lock_range(start, end)
    }

    fn lock_shared_range(
        &self,
        start: std::ops::Bound<u64>,
        end: std::ops::Bound<u64>,
    ) -> Result<(), redb::BackendError> {
        self.db.lock_shared_range(start, end)
    }

    fn unlock_range(
        &self,
        start: std::ops::Bound<u64>,
        end: std::ops::Bound<u64>,
    ) -> Result<(), redb::BackendError> {
        self.db.unlock_range(start, end)
    }

    fn query_lock_range(
        &self,
        start: std::ops::Bound<u64>,
        end: std::ops::Bound<u64>,
    ) -> Result<bool, redb::BackendError> {
        self.db.query_lock_range(start, end)
    }
}

#[cfg(test)]
mod tests;
