//! Content-addressed blobs: the bytes of large files, one file each under
//! `<data>/blobs/ab/abcdef…` (the SHA-256 in hex).
//!
//! A blob is written and fsync'd by the turn that writes the file, before
//! the turn's commit; the commit adds the file's row and a reference in
//! `blob_refs`. Until then the turn holds the blob ([`BlobHold`]): the
//! collector never removes a held blob, and when the last hold goes the
//! blob is removed at once unless a committed file refers to it (the turn
//! failed). A blob without a reference and without a hold is garbage — a
//! crash left it, or its last file went — and [`BlobStore::collect`]
//! removes it: at start-up (nothing can hold one then) and periodically.
//! A commit that removes a blob's last reference (its file overwritten or
//! deleted) queues it ([`Unreferenced`]), and [`BlobStore::reap`] removes
//! it a few seconds later, or at once while the queue holds more bytes
//! than [`Release::max_waiting_bytes`]: garbage from files rewritten in a
//! loop used to wait for the periodic sweep, outside every quota, and then
//! for the delay, at whatever rate the disk could write.
//! One lock orders `put` against the collector's check-and-delete, so a
//! blob found by `put` is never deleted under a turn that just took it;
//! whether a committed file refers to a blob is read *under* that lock,
//! so a turn that took the blob and committed just before is seen.

use std::collections::{HashMap, VecDeque};
use std::io::Write as _;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant, SystemTime};

use sha2::{Digest, Sha256};

use crate::StorageError;

/// Unreferenced blobs one [`BlobStore::reap`] looks at, at most (a type
/// deleted with a million files queues a million; the rest wait for the
/// next call, a second later).
const REAP_AT_ONCE: usize = 10_000;

/// Where blobs live.
pub struct BlobStore {
    dir: PathBuf,
    /// Blobs held by turns not yet committed, with how many holds each;
    /// also the lock that orders `put` against collection.
    held: Arc<Mutex<HashMap<[u8; 32], usize>>>,
    unreferenced: Arc<Unreferenced>,
    /// Backups taking their snapshot: while any is, nothing is removed.
    pauses: Arc<AtomicUsize>,
    /// Blobs backups under way copy, with how many backups each: never
    /// removed while pinned.
    pins: Pins,
}

type Pins = Arc<Mutex<HashMap<[u8; 32], usize>>>;

/// No blob is removed while this lives (see [`BlobStore::pause_removals`]).
pub struct RemovalPause(Arc<AtomicUsize>);

impl Drop for RemovalPause {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::AcqRel);
    }
}

/// A backup's claim on the blobs its snapshot names (see
/// [`BlobStore::pin`]); the blobs whose removal it put off are looked at
/// again when it goes.
pub struct BlobPins {
    shas: Vec<[u8; 32]>,
    pins: Pins,
    unreferenced: Arc<Unreferenced>,
}

impl Drop for BlobPins {
    fn drop(&mut self) {
        let mut pins = self.pins.lock().expect("blob pins lock");
        for sha in &self.shas {
            if let Some(n) = pins.get_mut(sha) {
                *n -= 1;
                if *n == 0 {
                    pins.remove(sha);
                }
            }
        }
        drop(pins);
        self.unreferenced.requeue_deferred();
    }
}

/// When a blob whose last file went is removed.
#[derive(Debug, Clone, Copy)]
pub struct Release {
    /// This long after its last file went: time for whoever read the
    /// file's row just before to open the blob (a download; an open blob
    /// stays readable once removed).
    pub delay: Duration,
    /// At once, oldest first, while the blobs waiting hold more bytes than
    /// this: an actor rewriting a 2 MB file in a loop kept 2 GB on disk
    /// for the delay against a 6 MiB quota (a probe).
    pub max_waiting_bytes: u64,
}

/// A blob waiting for removal: since when, which, and its size.
type Waiting = (Instant, [u8; 32], u64);

/// Blobs whose last reference a commit removed, oldest first, with when
/// and their sizes: filled by the writer after each commit, emptied by
/// [`BlobStore::reap`].
#[derive(Debug)]
pub struct Unreferenced {
    queue: Mutex<WaitingQueue>,
    /// Due ones a backup still copies: back in the queue when it ends.
    deferred: Mutex<Vec<Waiting>>,
    /// Told of every addition (the reaper need not wait for its tick when
    /// too many bytes wait).
    added: tokio::sync::Notify,
}

#[derive(Debug, Default)]
struct WaitingQueue {
    blobs: VecDeque<Waiting>,
    bytes: u64,
}

impl Unreferenced {
    fn new() -> Self {
        Self {
            queue: Mutex::default(),
            deferred: Mutex::default(),
            added: tokio::sync::Notify::new(),
        }
    }

    /// `blobs` (each with its size, from the file row that named it) lost
    /// their last reference in a commit that just succeeded.
    pub fn add(&self, blobs: Vec<([u8; 32], u64)>) {
        let now = Instant::now();
        let mut q = self.queue.lock().expect("unreferenced blobs lock");
        q.bytes += blobs.iter().map(|(_, size)| size).sum::<u64>();
        q.blobs
            .extend(blobs.into_iter().map(|(sha, size)| (now, sha, size)));
        drop(q);
        self.added.notify_one();
    }

    /// Wait until a blob is added (or was, since the last wait).
    pub async fn added(&self) {
        self.added.notified().await;
    }

    /// Take at most `max` of the blobs due under `release`.
    fn take_due(&self, release: Release, max: usize) -> Vec<Waiting> {
        let mut q = self.queue.lock().expect("unreferenced blobs lock");
        let mut bytes = q.bytes;
        let due = q
            .blobs
            .iter()
            .take(max)
            .take_while(|(at, _, size)| {
                let due = bytes > release.max_waiting_bytes || at.elapsed() >= release.delay;
                bytes -= if due { *size } else { 0 };
                due
            })
            .count();
        q.bytes = bytes;
        q.blobs.drain(..due).collect()
    }

    /// Put `rest` back at the front, oldest first (a removal failed).
    fn put_back(&self, rest: impl DoubleEndedIterator<Item = Waiting>) {
        let mut q = self.queue.lock().expect("unreferenced blobs lock");
        for e in rest.rev() {
            q.bytes += e.2;
            q.blobs.push_front(e);
        }
    }

    /// `waiting` is due, but a backup copies it: out of the queue (and its
    /// bytes out of the count) until the backup ends.
    fn defer(&self, waiting: Waiting) {
        self.deferred
            .lock()
            .expect("deferred blobs lock")
            .push(waiting);
    }

    /// A backup ended: what it put off waits again, as due as it was.
    fn requeue_deferred(&self) {
        let deferred = std::mem::take(&mut *self.deferred.lock().expect("deferred blobs lock"));
        if deferred.is_empty() {
            return;
        }
        self.put_back(deferred.into_iter());
        self.added.notify_one();
    }

    /// Whether some blob is due under `release`.
    fn any_due(&self, release: Release) -> bool {
        let q = self.queue.lock().expect("unreferenced blobs lock");
        q.bytes > release.max_waiting_bytes
            || q.blobs
                .front()
                .is_some_and(|(at, _, _)| at.elapsed() >= release.delay)
    }

    /// The bytes of the blobs waiting.
    pub fn waiting_bytes(&self) -> u64 {
        self.queue.lock().expect("unreferenced blobs lock").bytes
    }
}

/// A turn's claim on a blob it stored, from `put` until its commit is
/// durable (or the turn is abandoned): while held, the blob is never
/// collected.
pub struct BlobHold {
    sha256: [u8; 32],
    held: Arc<Mutex<HashMap<[u8; 32], usize>>>,
}

impl BlobHold {
    /// The blob's SHA-256.
    pub fn sha256(&self) -> &[u8; 32] {
        &self.sha256
    }
}

impl Drop for BlobHold {
    fn drop(&mut self) {
        let mut held = self.held.lock().expect("blob holds lock");
        if let Some(n) = held.get_mut(&self.sha256) {
            *n -= 1;
            if *n == 0 {
                held.remove(&self.sha256);
            }
        }
    }
}

impl std::fmt::Debug for BlobHold {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "BlobHold({})", hex::encode(self.sha256))
    }
}

fn io(what: String) -> impl FnOnce(std::io::Error) -> StorageError {
    move |source| StorageError::Io { what, source }
}

impl BlobStore {
    /// The store in `dir` (created if missing).
    pub fn open(dir: PathBuf) -> Result<Self, StorageError> {
        std::fs::create_dir_all(&dir).map_err(io(format!(
            "failed to create blob directory `{}`",
            dir.display()
        )))?;
        Ok(Self {
            dir,
            held: Arc::default(),
            unreferenced: Arc::new(Unreferenced::new()),
            pauses: Arc::default(),
            pins: Arc::default(),
        })
    }

    /// Keep every blob until the returned pause is dropped: while a backup
    /// takes its snapshot and pins the blobs it names ([`Self::pin`]). It
    /// copies them one by one, and one removed meanwhile (its file
    /// rewritten after the snapshot) made it start over, five times at
    /// most, then fail.
    pub fn pause_removals(&self) -> RemovalPause {
        self.pauses.fetch_add(1, Ordering::AcqRel);
        RemovalPause(self.pauses.clone())
    }

    fn paused(&self) -> bool {
        self.pauses.load(Ordering::Acquire) > 0
    }

    /// Keep `shas` (the blobs a backup's snapshot names) until the pins
    /// are dropped, and only them: a backup paused every removal while it
    /// copied, and released blobs piled up past
    /// [`Release::max_waiting_bytes`] (546 MB against 4 MiB in a 3.7 s
    /// backup: a re-probe). Take them under [`Self::pause_removals`], so
    /// none goes between the snapshot and its pins.
    pub fn pin(&self, shas: Vec<[u8; 32]>) -> BlobPins {
        let mut pins = self.pins.lock().expect("blob pins lock");
        for sha in &shas {
            *pins.entry(*sha).or_default() += 1;
        }
        drop(pins);
        BlobPins {
            shas,
            pins: self.pins.clone(),
            unreferenced: self.unreferenced.clone(),
        }
    }

    fn pinned(&self, sha256: &[u8; 32]) -> bool {
        self.pins
            .lock()
            .expect("blob pins lock")
            .contains_key(sha256)
    }

    /// Where commits queue the blobs they left unreferenced.
    pub fn unreferenced(&self) -> Arc<Unreferenced> {
        self.unreferenced.clone()
    }

    /// Whether [`Self::reap`] under `release` has something to do.
    pub fn reap_due(&self, release: Release) -> bool {
        !self.paused() && self.unreferenced.any_due(release)
    }

    /// Remove the blobs due under `release`, if nothing holds them and no
    /// committed file refers to them again (`referenced`, asked under the
    /// lock `put` takes: read it from a fresh snapshot). Returns how many
    /// were removed. Blocking.
    pub fn reap(
        &self,
        release: Release,
        referenced: impl Fn(&[u8; 32]) -> Result<bool, StorageError>,
    ) -> Result<usize, StorageError> {
        let mut removed = 0;
        if self.paused() {
            return Ok(0);
        }
        let due = self.unreferenced.take_due(release, REAP_AT_ONCE);
        let mut due = due.into_iter();
        while let Some(waiting) = due.next() {
            if self.pinned(&waiting.1) {
                self.unreferenced.defer(waiting);
                continue;
            }
            match self.release_if_unused(&waiting.1, &referenced) {
                Ok(true) => removed += 1,
                Ok(false) => {}
                Err(e) => {
                    // Looked at again next time, not left to the sweep.
                    self.unreferenced
                        .put_back(std::iter::once(waiting).chain(due));
                    return Err(e);
                }
            }
        }
        Ok(removed)
    }

    /// The path of blob `sha256`.
    pub fn path(&self, sha256: &[u8; 32]) -> PathBuf {
        let hex = hex::encode(sha256);
        self.dir.join(&hex[..2]).join(&hex)
    }

    /// Store `bytes` durably and hold the blob for the caller's turn.
    /// Blocking (call from a blocking thread). Storing the same bytes twice
    /// writes them once.
    pub fn put(&self, bytes: &[u8]) -> Result<BlobHold, StorageError> {
        let sha256: [u8; 32] = Sha256::digest(bytes).into();
        let path = self.path(&sha256);
        // Held across the write: the collector cannot delete the blob
        // between "it exists" and "it is held".
        let mut held = self.held.lock().expect("blob holds lock");
        *held.entry(sha256).or_default() += 1;
        let hold = BlobHold {
            sha256,
            held: self.held.clone(),
        };
        // Held now: the collector leaves the file alone from here on.
        drop(held);
        // The same bytes are there already, unless the file was damaged
        // on disk: then it is written again (a new file with the same
        // bytes acknowledged a write that could not be read back, found by
        // a probe). Hashing it back, in pieces and outside the lock, is the
        // price of not writing it twice.
        let same_size = std::fs::metadata(&path).is_ok_and(|m| m.len() == bytes.len() as u64);
        if same_size && file_matches(&path, &sha256).unwrap_or(false) {
            return Ok(hold);
        }
        let parent = path.parent().expect("blob paths have a parent");
        std::fs::create_dir_all(parent).map_err(io(format!(
            "failed to make the directory of {}",
            name(&sha256)
        )))?;
        let tmp = parent.join(format!(
            ".tmp-{}-{:016x}",
            std::process::id(),
            rand::random::<u64>()
        ));
        let write = || -> std::io::Result<()> {
            let mut f = std::fs::File::create(&tmp)?;
            f.write_all(bytes)?;
            f.sync_all()?;
            std::fs::rename(&tmp, &path)?;
            // The rename is durable once the directory is.
            std::fs::File::open(parent)?.sync_all()
        };
        if let Err(e) = write() {
            let _ = std::fs::remove_file(&tmp);
            return Err(io(format!("failed to write {}", name(&sha256)))(e));
        }
        Ok(hold)
    }

    /// Hold blob `sha256` if it is on disk (as [`Self::put`] would, without
    /// its bytes): what a node that was sent only the blob's name takes
    /// before committing a row that names it. `None`: not here.
    pub fn hold(&self, sha256: &[u8; 32]) -> Option<BlobHold> {
        let mut held = self.held.lock().expect("blob holds lock");
        if !self.path(sha256).exists() {
            return None;
        }
        *held.entry(*sha256).or_default() += 1;
        Some(BlobHold {
            sha256: *sha256,
            held: self.held.clone(),
        })
    }

    /// Remove blob `sha256` now if nothing holds it and `referenced` says
    /// no committed file needs it (a turn that stored it failed, or its
    /// last file went). `referenced` is asked under the lock `put` takes:
    /// read it from a snapshot begun inside the call, not before (a turn
    /// that took this blob and committed meanwhile would be missed).
    /// Blocking.
    pub fn release_if_unused(
        &self,
        sha256: &[u8; 32],
        referenced: impl Fn(&[u8; 32]) -> Result<bool, StorageError>,
    ) -> Result<bool, StorageError> {
        let held = self.held.lock().expect("blob holds lock");
        if held.contains_key(sha256) || self.pinned(sha256) || referenced(sha256)? {
            return Ok(false);
        }
        Ok(std::fs::remove_file(self.path(sha256)).is_ok())
    }

    /// Read blob `sha256` whole, checked against its name. Blocking.
    pub fn read(&self, sha256: &[u8; 32]) -> Result<Vec<u8>, StorageError> {
        let path = self.path(sha256);
        let bytes = std::fs::read(&path).map_err(io(format!("failed to read {}", name(sha256))))?;
        check(&path, sha256, &bytes)?;
        Ok(bytes)
    }

    /// Remove every blob that nothing holds, that `referenced` says no
    /// committed file needs (asked as in [`Self::release_if_unused`]),
    /// and that was last modified more than `grace` ago; and leftover
    /// temporary files. Returns how many were removed. Blocking.
    pub fn collect(
        &self,
        grace: Duration,
        referenced: impl Fn(&[u8; 32]) -> Result<bool, StorageError>,
    ) -> Result<usize, StorageError> {
        if self.paused() {
            return Ok(0);
        }
        let now = SystemTime::now();
        let old = |p: &Path| {
            std::fs::metadata(p)
                .and_then(|m| m.modified())
                .ok()
                .and_then(|t| now.duration_since(t).ok())
                .is_some_and(|age| age >= grace)
        };
        let mut removed = 0;
        let shards = std::fs::read_dir(&self.dir)
            .map_err(io(format!("failed to list `{}`", self.dir.display())))?;
        for shard in shards.flatten() {
            let Ok(entries) = std::fs::read_dir(shard.path()) else {
                continue;
            };
            for entry in entries.flatten() {
                let path = entry.path();
                let name = entry.file_name();
                let name = name.to_string_lossy();
                if name.starts_with(".tmp-") {
                    if old(&path) && std::fs::remove_file(&path).is_ok() {
                        removed += 1;
                    }
                    continue;
                }
                let mut sha = [0u8; 32];
                if hex::decode_to_slice(name.as_bytes(), &mut sha).is_err() {
                    continue;
                }
                // Check and delete under the lock `put` takes.
                let held = self.held.lock().expect("blob holds lock");
                if !held.contains_key(&sha)
                    && !self.pinned(&sha)
                    && old(&path)
                    && !referenced(&sha)?
                    && std::fs::remove_file(&path).is_ok()
                {
                    removed += 1;
                }
                drop(held);
            }
        }
        Ok(removed)
    }
}

/// `bytes`, read from blob file `path`, are blob `sha256`; else the file
/// was damaged on disk (a stray write, a bad sector, a truncation), and
/// the error says so rather than handing out other bytes as the file.
pub fn check(path: &Path, sha256: &[u8; 32], bytes: &[u8]) -> Result<(), StorageError> {
    if Sha256::digest(bytes).as_slice() == sha256 {
        return Ok(());
    }
    tracing::error!(path = %path.display(), "a blob's bytes do not match its SHA-256: damaged on disk");
    Err(damaged(sha256))
}

/// How errors name blob `sha256`: by its hash, never its path, which would
/// tell whoever reads the error (a client, through a failed turn) where
/// the node keeps its data. The operator's log has the path.
pub fn name(sha256: &[u8; 32]) -> String {
    format!("blob {}", hex::encode(sha256))
}

/// The error for blob `sha256` whose bytes are not what its name says.
pub fn damaged(sha256: &[u8; 32]) -> StorageError {
    StorageError::Io {
        what: name(sha256),
        source: std::io::Error::new(
            std::io::ErrorKind::InvalidData,
            "its bytes do not match its SHA-256: the file was damaged on disk",
        ),
    }
}

/// Whether the file at `path` holds blob `sha256`, read in pieces.
pub fn file_matches(path: &Path, sha256: &[u8; 32]) -> std::io::Result<bool> {
    use std::io::Read as _;
    let mut f = std::fs::File::open(path)?;
    let mut hasher = Sha256::new();
    let mut buf = vec![0; 256 << 10];
    loop {
        match f.read(&mut buf)? {
            0 => return Ok(hasher.finalize().as_slice() == sha256),
            n => hasher.update(&buf[..n]),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A client sees a turn's storage error: it names the blob, not where
    /// the node keeps its data (a full disk's error did, found by a probe).
    #[test]
    fn errors_name_blobs_by_hash_not_path() {
        let dir = tempfile::tempdir().unwrap();
        let store = BlobStore::open(dir.path().join("blobs")).unwrap();
        let where_ = dir.path().display().to_string();
        let sha256: [u8; 32] = Sha256::digest(b"delta").into();
        let hex = hex::encode(sha256);
        let e = store.read(&sha256).unwrap_err().to_string();
        assert!(e.contains(&hex) && !e.contains(&where_), "{e}");
        // A write that fails: its directory is taken by a file.
        std::fs::write(dir.path().join("blobs").join(&hex[..2]), b"").unwrap();
        let e = store.put(b"delta").err().unwrap().to_string();
        assert!(e.contains(&hex) && !e.contains(&where_), "{e}");
        assert!(!damaged(&sha256).to_string().contains(&where_));
    }

    #[test]
    fn blobs_are_content_addressed_and_collected_when_unreferenced() {
        let dir = tempfile::tempdir().unwrap();
        let store = BlobStore::open(dir.path().join("blobs")).unwrap();
        let a = store.put(b"alpha").unwrap();
        let a2 = store.put(b"alpha").unwrap();
        assert_eq!(a2.sha256(), a.sha256());
        let b = store.put(b"beta").unwrap();
        let (a_sha, b_sha) = (*a.sha256(), *b.sha256());
        assert_eq!(store.read(&a_sha).unwrap(), b"alpha");
        // Held blobs are never collected, referenced or not.
        assert_eq!(store.collect(Duration::ZERO, |_| Ok(false)).unwrap(), 0);
        drop((a, a2, b));
        // Within the grace period nothing goes.
        assert_eq!(
            store
                .collect(Duration::from_secs(60), |_| Ok(false))
                .unwrap(),
            0
        );
        // Past it, only what is not referenced.
        let removed = store.collect(Duration::ZERO, |h| Ok(*h == a_sha)).unwrap();
        assert_eq!(removed, 1);
        assert!(store.read(&a_sha).is_ok());
        assert!(store.read(&b_sha).is_err());
        // A failed turn's blob goes as soon as its hold does.
        let c = store.put(b"gamma").unwrap();
        let c_sha = *c.sha256();
        assert!(!store.release_if_unused(&c_sha, |_| Ok(false)).unwrap());
        drop(c);
        assert!(store.release_if_unused(&c_sha, |_| Ok(false)).unwrap());
        assert!(store.read(&c_sha).is_err());
    }

    #[test]
    fn a_blob_on_disk_can_be_held_by_name() {
        let dir = tempfile::tempdir().unwrap();
        let store = BlobStore::open(dir.path().join("blobs")).unwrap();
        let sha = *store.put(b"shipped ahead").unwrap().sha256();
        let held = store.hold(&sha).expect("the blob is on disk");
        assert_eq!(held.sha256(), &sha);
        assert_eq!(store.collect(Duration::ZERO, |_| Ok(false)).unwrap(), 0);
        assert!(!store.release_if_unused(&sha, |_| Ok(false)).unwrap());
        drop(held);
        assert!(store.release_if_unused(&sha, |_| Ok(false)).unwrap());
        // Gone, it cannot be held.
        assert!(store.hold(&sha).is_none());
    }

    #[test]
    fn unreferenced_blobs_go_after_the_delay_unless_taken_again() {
        let dir = tempfile::tempdir().unwrap();
        let store = BlobStore::open(dir.path().join("blobs")).unwrap();
        let shas: Vec<[u8; 32]> = [&b"old"[..], b"taken again", b"held"]
            .iter()
            .map(|b| *store.put(b).unwrap().sha256())
            .collect();
        let hold = store.put(b"held").unwrap();
        store.unreferenced().add(sized(&shas, 1000));
        // Not before the delay.
        assert!(!store.reap_due(after(60)));
        assert_eq!(store.reap(after(60), |_| Ok(false)).unwrap(), 0);
        // After it: only the one nothing refers to or holds.
        assert!(store.reap_due(after(0)));
        let removed = store.reap(after(0), |h| Ok(*h == shas[1])).unwrap();
        assert_eq!(removed, 1);
        assert!(store.read(&shas[0]).is_err());
        assert!(store.read(&shas[1]).is_ok());
        assert!(store.read(&shas[2]).is_ok());
        // Each is looked at once: the queue is empty now.
        assert!(!store.reap_due(after(0)));
        drop(hold);

        // A failed look leaves it, and those after it, queued.
        let more: Vec<[u8; 32]> = [&b"one"[..], b"two"]
            .iter()
            .map(|b| *store.put(b).unwrap().sha256())
            .collect();
        store.unreferenced().add(sized(&more, 1000));
        let failing = |h: &[u8; 32]| {
            if *h == more[0] {
                Err(StorageError::ShuttingDown)
            } else {
                Ok(false)
            }
        };
        assert!(store.reap(after(0), failing).is_err());
        // Nothing goes while a backup runs.
        let pause = store.pause_removals();
        assert!(!store.reap_due(after(0)));
        assert_eq!(store.reap(after(0), |_| Ok(false)).unwrap(), 0);
        drop(pause);
        assert_eq!(store.reap(after(0), |_| Ok(false)).unwrap(), 2);
    }

    /// A blob a backup copies is put off, not removed, however many bytes
    /// wait; the rest go; when the backup ends, what it put off goes too.
    #[test]
    fn blobs_a_backup_copies_outlive_the_bound_until_it_ends() {
        let dir = tempfile::tempdir().unwrap();
        let store = BlobStore::open(dir.path().join("blobs")).unwrap();
        let shas: Vec<[u8; 32]> = (0..3u8)
            .map(|i| *store.put(&[i; 1000]).unwrap().sha256())
            .collect();
        let pins = store.pin(vec![shas[0]]);
        store.unreferenced().add(sized(&shas, 1000));
        let release = Release {
            delay: Duration::from_secs(60),
            max_waiting_bytes: 0,
        };
        assert_eq!(store.reap(release, |_| Ok(false)).unwrap(), 2);
        assert!(store.read(&shas[0]).is_ok(), "the backup's blob stays");
        assert!(store.read(&shas[1]).is_err() && store.read(&shas[2]).is_err());
        // Not removed by the sweep either.
        assert_eq!(store.collect(Duration::ZERO, |_| Ok(false)).unwrap(), 0);
        assert!(!store.reap_due(release), "put off, not waiting");
        drop(pins);
        assert!(store.reap_due(release));
        assert_eq!(store.reap(release, |_| Ok(false)).unwrap(), 1);
        assert!(store.read(&shas[0]).is_err());
    }

    /// `shas`, each of `size` bytes.
    fn sized(shas: &[[u8; 32]], size: u64) -> Vec<([u8; 32], u64)> {
        shas.iter().map(|sha| (*sha, size)).collect()
    }

    /// A release after `secs`, whatever waits.
    fn after(secs: u64) -> Release {
        Release {
            delay: Duration::from_secs(secs),
            max_waiting_bytes: u64::MAX,
        }
    }

    /// Past `max_waiting_bytes`, the oldest go at once, down to it; the
    /// rest wait for the delay.
    #[test]
    fn too_many_bytes_waiting_go_at_once_oldest_first() {
        let dir = tempfile::tempdir().unwrap();
        let store = BlobStore::open(dir.path().join("blobs")).unwrap();
        let shas: Vec<[u8; 32]> = (0..4u8)
            .map(|i| *store.put(&[i; 1000]).unwrap().sha256())
            .collect();
        store.unreferenced().add(sized(&shas, 1000));
        assert_eq!(store.unreferenced().waiting_bytes(), 4000);
        let release = Release {
            delay: Duration::from_secs(60),
            max_waiting_bytes: 2500,
        };
        assert!(store.reap_due(release));
        assert_eq!(store.reap(release, |_| Ok(false)).unwrap(), 2);
        assert!(store.read(&shas[0]).is_err() && store.read(&shas[1]).is_err());
        assert!(store.read(&shas[2]).is_ok() && store.read(&shas[3]).is_ok());
        assert_eq!(store.unreferenced().waiting_bytes(), 2000);
        assert!(!store.reap_due(release), "at the bound, the rest wait");
        // A failed look puts the bytes back with the blobs.
        let nine = *store.put(&[9; 1000]).unwrap().sha256();
        store.unreferenced().add(sized(&[nine], 1000));
        let failing = |_: &[u8; 32]| Err(StorageError::ShuttingDown);
        assert!(store.reap(release, failing).is_err());
        assert_eq!(store.unreferenced().waiting_bytes(), 3000);
        assert_eq!(store.reap(release, |_| Ok(false)).unwrap(), 1);
        assert_eq!(store.unreferenced().waiting_bytes(), 2000);
    }
}
