//! `marmot:actor/files`: a tree of files per actor, written with the turn.
//!
//! Writes are buffered in the turn like state writes and commit with it (a
//! failed turn leaves no file behind). Small files go in their database row;
//! a larger one is stored as a content-addressed blob (written and fsync'd
//! by the host call, so before the commit) that the committed row names. A
//! blob whose turn never commits is unreferenced, and the node's blob
//! collector removes it. Reads see the turn's own writes, then the writes
//! of this activation still in flight to disk, then disk. Quotas (bytes and
//! files per actor, bytes per type) are checked at each write, before
//! anything is stored; everything under `outputs/` is an artifact, served
//! by the API whether the actor is awake or not.

use std::collections::{BTreeMap, HashMap};

use sha2::{Digest, Sha256};

use super::super::turn::{ActorDisk, Refusal};
use super::Cap;
use crate::clock::now_ms;
use crate::ids::validate_file_path;
use crate::sandbox::bindings::GuestError;
use crate::sandbox::bindings::marmot::actor::files;
use crate::sandbox::host::Host;
use crate::storage::StorageError;
use crate::storage::blobs::BlobHold;
use crate::storage::reservations::Reservation;
use crate::storage::schema::{FileBody, FileRecord, FileUsage};

/// Most entries one `list` returns.
const MAX_LIST: usize = 10_000;

/// Limits of the files capability.
#[derive(Debug, Clone, Copy)]
pub struct FileLimits {
    /// Largest file.
    pub max_file_bytes: usize,
    /// Bytes of files per actor.
    pub max_actor_bytes: u64,
    /// Files per actor.
    pub max_actor_files: u64,
    /// Bytes of files per type.
    pub max_type_bytes: u64,
    /// Files up to this size are stored inline.
    pub inline_max_bytes: usize,
}

/// Files this activation wrote whose commit may not be durable yet, and
/// its usage: kept between turns.
#[derive(Debug, Default)]
pub struct FileCache {
    /// Path → record (`None`: deleted), and the turn that wrote it.
    entries: HashMap<String, (Option<FileRecord>, u64)>,
    /// Bytes and files, once a turn needed them.
    usage: Option<FileUsage>,
}

impl FileCache {
    /// Forget entries whose commits are durable (disk has them now).
    pub fn trim(&mut self, committed_seq: u64) {
        self.entries.retain(|_, (_, seq)| *seq > committed_seq);
    }
}

/// Files written (`Some`) or deleted (`None`) by a turn, in path order.
pub(crate) type FileWrites = Vec<(String, Option<FileRecord>)>;

/// The files part of a savepoint.
pub(crate) struct FilesSavepoint {
    writes: BTreeMap<String, Option<FileRecord>>,
    usage: Option<FileUsage>,
    type_delta: i64,
}

/// The files part of a turn.
pub struct FilesCtx {
    disk: ActorDisk,
    limits: FileLimits,
    ty: String,
    cache: FileCache,
    /// This turn's writes (`None` deletes), in path order.
    writes: BTreeMap<String, Option<FileRecord>>,
    /// Usage including this turn's writes, once known.
    usage: Option<FileUsage>,
    /// Bytes this turn adds to its type (may be negative).
    type_delta: i64,
    /// The blobs this turn stored, held until its commit is durable.
    holds: Vec<BlobHold>,
    /// The bytes it adds to its type, counted by other turns' quota checks
    /// until its commit is over.
    reservation: Reservation,
    /// Their bytes.
    blob_bytes: u64,
}

impl FilesCtx {
    pub(crate) fn new(disk: ActorDisk, limits: FileLimits, ty: String, cache: FileCache) -> Self {
        let usage = cache.usage;
        let reservation = disk.reserve_files(&ty);
        Self {
            disk,
            limits,
            ty,
            reservation,
            cache,
            writes: BTreeMap::new(),
            usage,
            type_delta: 0,
            holds: Vec::new(),
            blob_bytes: 0,
        }
    }

    /// The record at `path` as this turn sees it.
    fn record(&self, path: &str) -> Result<Option<FileRecord>, StorageError> {
        if let Some(r) = self.writes.get(path) {
            return Ok(r.clone());
        }
        if let Some((r, _)) = self.cache.entries.get(path) {
            return Ok(r.clone());
        }
        self.disk.reader()?.file(self.disk.num, path)
    }

    fn usage(&mut self) -> Result<FileUsage, StorageError> {
        if let Some(u) = self.usage {
            return Ok(u);
        }
        let u = self.disk.reader()?.file_usage(self.disk.num)?;
        self.usage = Some(u);
        Ok(u)
    }

    /// Read a file.
    pub async fn read(&self, path: &str) -> Result<Result<Vec<u8>, GuestError>, StorageError> {
        if let Err(e) = validate_file_path(path) {
            return Ok(Err(GuestError::Invalid(e.to_string())));
        }
        let Some(rec) = self.record(path)? else {
            return Ok(Err(GuestError::NotFound(format!("no file `{path}`"))));
        };
        Ok(Ok(match rec.body {
            FileBody::Inline(bytes) => bytes,
            FileBody::Blob => {
                let blob = self.disk.blob_path(&rec.sha256);
                let bytes = tokio::fs::read(&blob)
                    .await
                    .map_err(|source| StorageError::Io {
                        what: format!(
                            "failed to read {}",
                            crate::storage::blobs::name(&rec.sha256)
                        ),
                        source,
                    })?;
                // Damaged on disk: an error, never other bytes as the file.
                // (Hashing up to 16 MiB takes tens of ms: not on a worker.)
                let sha256 = rec.sha256;
                tokio::task::spawn_blocking(move || {
                    crate::storage::blobs::check(&blob, &sha256, &bytes).map(|()| bytes)
                })
                .await
                .map_err(|e| StorageError::Io {
                    what: "checking a blob".into(),
                    source: std::io::Error::other(e),
                })??
            }
        }))
    }

    /// Write a file (replacing one at the same path).
    pub async fn write(
        &mut self,
        path: String,
        data: Vec<u8>,
    ) -> Result<Result<(), Refusal>, StorageError> {
        if let Err(e) = validate_file_path(&path) {
            return Ok(Err(Refusal::Invalid(e.to_string())));
        }
        let size = data.len() as u64;
        if data.len() > self.limits.max_file_bytes {
            return Ok(Err(Refusal::Limit(format!(
                "a file may be at most {} bytes, not {size}",
                self.limits.max_file_bytes
            ))));
        }
        let old = self.record(&path)?;
        let old_size = old.as_ref().map_or(0, |r| r.size);
        let mut usage = self.usage()?;
        usage.bytes = (usage.bytes + size).saturating_sub(old_size);
        if old.is_none() {
            usage.files += 1;
        }
        if usage.files > self.limits.max_actor_files {
            return Ok(Err(Refusal::Limit(format!(
                "an actor may keep at most {} files",
                self.limits.max_actor_files
            ))));
        }
        if size > old_size && usage.bytes > self.limits.max_actor_bytes {
            return Ok(Err(Refusal::Limit(format!(
                "the actor's files would take {} bytes, over its quota of {} bytes",
                usage.bytes, self.limits.max_actor_bytes
            ))));
        }
        let blob = data.len() > self.limits.inline_max_bytes;
        // Every blob a turn stores costs disk until the turn ends, even one
        // it overwrites again: bound them per turn. Checked before the
        // type's reservation grows, which a refusal here kept grown for
        // the rest of the turn, against the type's other writers.
        if blob && self.blob_bytes + size > self.limits.max_actor_bytes {
            return Ok(Err(Refusal::Limit(format!(
                "a turn may store at most {} bytes of files",
                self.limits.max_actor_bytes
            ))));
        }
        let delta = size as i64 - old_size as i64;
        if delta > 0 {
            // Against what is committed and what other turns of the type,
            // still running or committing, have reserved.
            let (disk, ty) = (&self.disk, &self.ty);
            if let Err(after) = self.reservation.grow(
                delta as u64,
                || disk.reader()?.type_file_bytes(ty),
                self.type_delta,
                self.limits.max_type_bytes,
            )? {
                return Ok(Err(Refusal::Limit(format!(
                    "files of type `{}` would take {after} bytes (with what other turns are \
                     writing), over its quota of {} bytes",
                    self.ty, self.limits.max_type_bytes
                ))));
            }
        }
        let (sha256, body) = if blob {
            let stored = self.blob_bytes + size;
            // Stored and held before the commit; removed if the turn fails.
            let blobs = self.disk.clone();
            let hold = tokio::task::spawn_blocking(move || blobs.put_blob(&data))
                .await
                .map_err(|e| StorageError::Io {
                    what: "blob writer".into(),
                    source: std::io::Error::other(e.to_string()),
                })??;
            let sha = *hold.sha256();
            self.holds.push(hold);
            self.blob_bytes = stored;
            (sha, FileBody::Blob)
        } else {
            (Sha256::digest(&data).into(), FileBody::Inline(data))
        };
        self.usage = Some(usage);
        self.type_delta += delta;
        // (A smaller overwrite gives room back.)
        self.reservation.shrink_to(self.type_delta);
        self.writes.insert(
            path,
            Some(FileRecord {
                size,
                sha256,
                updated_at_ms: now_ms(),
                body,
            }),
        );
        Ok(Ok(()))
    }

    /// Delete a file; whether it existed.
    pub fn delete(&mut self, path: &str) -> Result<Result<bool, Refusal>, StorageError> {
        if let Err(e) = validate_file_path(path) {
            return Ok(Err(Refusal::Invalid(e.to_string())));
        }
        let Some(old) = self.record(path)? else {
            return Ok(Ok(false));
        };
        let mut usage = self.usage()?;
        usage.bytes = usage.bytes.saturating_sub(old.size);
        usage.files = usage.files.saturating_sub(1);
        self.usage = Some(usage);
        self.type_delta -= old.size as i64;
        self.reservation.shrink_to(self.type_delta);
        self.writes.insert(path.to_owned(), None);
        Ok(Ok(true))
    }

    /// Files under `prefix`, in path order: (path, record).
    pub fn list(&self, prefix: &str) -> Result<Vec<(String, FileRecord)>, StorageError> {
        let mut overlay: BTreeMap<&str, &Option<FileRecord>> = BTreeMap::new();
        for (p, (r, _)) in &self.cache.entries {
            if p.starts_with(prefix) {
                overlay.insert(p, r);
            }
        }
        for (p, r) in &self.writes {
            if p.starts_with(prefix) {
                overlay.insert(p, r);
            }
        }
        let hidden = overlay.values().filter(|r| r.is_none()).count();
        let disk = self.disk.reader()?.files(
            self.disk.num,
            prefix,
            None,
            MAX_LIST.saturating_add(hidden),
        )?;
        let mut merged: BTreeMap<String, FileRecord> = disk.into_iter().collect();
        for (p, r) in overlay {
            match r {
                Some(r) => merged.insert(p.to_owned(), r.clone()),
                None => merged.remove(p),
            };
        }
        Ok(merged.into_iter().take(MAX_LIST).collect())
    }

    /// This turn's writes so far, for a rollback.
    pub(crate) fn savepoint(&self) -> FilesSavepoint {
        FilesSavepoint {
            writes: self.writes.clone(),
            usage: self.usage,
            type_delta: self.type_delta,
        }
    }

    /// Undo the writes since `sp` (blobs they stored become garbage).
    pub(crate) fn rollback(&mut self, sp: FilesSavepoint) {
        self.writes = sp.writes;
        self.usage = sp.usage;
        self.type_delta = sp.type_delta;
        self.reservation.shrink_to(self.type_delta);
    }

    /// The turn succeeded: its writes join the cache (as written by turn
    /// `seq`) and are returned to commit.
    pub(crate) fn finish(
        mut self,
        seq: u64,
    ) -> (FileCache, FileWrites, Vec<BlobHold>, Reservation) {
        let writes: Vec<(String, Option<FileRecord>)> =
            std::mem::take(&mut self.writes).into_iter().collect();
        for (p, r) in &writes {
            self.cache.entries.insert(p.clone(), (r.clone(), seq));
        }
        self.cache.usage = self.usage;
        (self.cache, writes, self.holds, self.reservation)
    }

    /// The turn failed: its writes are dropped, and the blobs it stored
    /// with them.
    pub(crate) fn abandon(self) -> FileCache {
        self.disk.release_blobs(self.holds);
        self.cache
    }
}

impl files::Host for Host {
    async fn read(&mut self, path: String) -> wasmtime::Result<Result<Vec<u8>, GuestError>> {
        let turn = self.enter(Cap::Files)?;
        Ok(turn.files.read(&path).await?)
    }

    async fn write(
        &mut self,
        path: String,
        data: Vec<u8>,
    ) -> wasmtime::Result<Result<(), GuestError>> {
        let turn = self.enter(Cap::Files)?;
        Ok(turn.files.write(path, data).await?.map_err(Into::into))
    }

    async fn list(
        &mut self,
        prefix: String,
    ) -> wasmtime::Result<Result<Vec<files::FileInfo>, GuestError>> {
        let turn = self.enter(Cap::Files)?;
        Ok(Ok(turn
            .files
            .list(&prefix)?
            .into_iter()
            .map(|(path, r)| files::FileInfo {
                path,
                size: r.size,
                modified_at: r.updated_at_ms,
            })
            .collect()))
    }

    async fn delete(&mut self, path: String) -> wasmtime::Result<Result<bool, GuestError>> {
        let turn = self.enter(Cap::Files)?;
        Ok(turn.files.delete(&path)?.map_err(Into::into))
    }
}
