//! Online backup and offline restore.
//!
//! A backup is a directory holding `marmot.redb` and `blobs/`, taken while
//! the node serves: every table is copied row by row inside one read
//! transaction (a consistent snapshot of everything committed), and every
//! blob that snapshot references is hard-linked (or copied) beside it.
//! Blobs are immutable and named by their hash, so a link is a consistent
//! copy; one removed between the snapshot and its link means the snapshot
//! is already stale, and the backup starts over from a newer one.
//!
//! Restore copies a backup into an empty data directory after checking it:
//! the database's integrity, its format (a backup written by a newer build
//! is refused, like a newer database file is at start-up) and every blob's
//! hash. It only reads the backup.

use std::path::{Path, PathBuf};
use std::time::Instant;

use redb::{ReadTransaction, ReadableDatabase, ReadableTable, TableDefinition, WriteTransaction};

use crate::schema::*;
use crate::{Storage, StorageError};

/// What a backup holds.
#[derive(Debug, Clone, serde::Serialize)]
pub struct BackupReport {
    /// The backup directory.
    pub path: PathBuf,
    /// Rows copied, all tables together.
    pub rows: u64,
    /// Blobs linked or copied.
    pub blobs: u64,
    /// Size of the database copy.
    pub db_bytes: u64,
    /// Snapshots taken (more than one when blobs went away meanwhile).
    pub attempts: u32,
    /// How long it took.
    pub elapsed_ms: u64,
}

/// Snapshots tried before giving up while blobs keep disappearing.
const MAX_ATTEMPTS: u32 = 5;

fn io(what: String) -> impl FnOnce(std::io::Error) -> StorageError {
    move |source| StorageError::Io { what, source }
}

/// Every table of the schema, copied by [`copy_tables`]. A table missing
/// here would be missing from backups: a test compares this list with the
/// tables a new database has.
macro_rules! for_each_table {
    ($m:ident!($($arg:tt)*)) => {
        $m!($($arg)*;
            META, TYPES, CODE, ACTORS, ACTOR_KEYS, STATE, EVENTS, IDEMPOTENCY, IDEM_EXPIRY,
            ALARMS, ALARM_DUE, INPUTS, INPUTS_BY_SETTLED, SUBSCRIPTIONS, OUTBOX, OUTBOX_HEADS, OUTBOX_DUE, OUTBOX_IDS, SECRETS,
            PROVIDERS,
            REVOKED_TOKENS, ACTOR_USAGE, TYPE_USAGE, FILES, FILE_USAGE, TYPE_FILE_USAGE,
            BLOB_REFS, INBOX, RELAY, RELAY_IDS, REPLICA_LSN)
    };
}

macro_rules! copy_all {
    ($r:expr, $w:expr; $($t:ident),+) => {{
        let mut rows = 0u64;
        $( rows += copy_table($r, $w, $t)?; )+
        rows
    }};
}

#[cfg(test)]
macro_rules! names {
    (; $($t:ident),+) => { vec![$($t.name()),+] };
}

fn copy_table<K: redb::Key + 'static, V: redb::Value + 'static>(
    read: &ReadTransaction,
    write: &WriteTransaction,
    def: TableDefinition<'_, K, V>,
) -> Result<u64, StorageError> {
    let src = match read.open_table(def) {
        Ok(t) => t,
        Err(redb::TableError::TableDoesNotExist(_)) => return Ok(0),
        Err(e) => return Err(e.into()),
    };
    let mut dst = write.open_table(def)?;
    let mut n = 0;
    for row in src.iter()? {
        let (k, v) = row?;
        dst.insert(k.value(), v.value())?;
        n += 1;
    }
    Ok(n)
}

fn copy_tables(read: &ReadTransaction, write: &WriteTransaction) -> Result<u64, StorageError> {
    Ok(for_each_table!(copy_all!(read, write)))
}

/// Whether `path` (which may not exist yet) lies inside directory `dir`,
/// symbolic links resolved as far as the path exists.
fn within(path: &Path, dir: &Path) -> bool {
    let Ok(dir) = dir.canonicalize() else {
        return false;
    };
    // `..` after a part that does not exist yet is taken lexically.
    let mut lexical = PathBuf::new();
    for part in path.components() {
        match part {
            std::path::Component::ParentDir => {
                lexical.pop();
            }
            std::path::Component::CurDir => {}
            other => lexical.push(other),
        }
    }
    let path = lexical.as_path();
    let mut existing = path;
    let mut rest = Vec::new();
    while !existing.exists() {
        match (existing.parent(), existing.file_name()) {
            (Some(parent), Some(name)) => {
                rest.push(name);
                existing = parent;
            }
            _ => return false,
        }
    }
    let Ok(mut resolved) = existing.canonicalize() else {
        return false;
    };
    resolved.extend(rest.iter().rev());
    resolved.starts_with(dir)
}

/// Make `path` durable: the file's contents, or a directory's entries.
fn sync(path: &Path) -> Result<(), StorageError> {
    std::fs::File::open(path)
        .and_then(|f| f.sync_all())
        .map_err(io(format!("failed to sync `{}`", path.display())))
}

/// Copy blob `sha256` from `from` to `to`, durably, and check the copy.
/// `Ok(false)` when `from` is gone.
///
/// A copy, not a hard link: a link shares the live file's inode, so damage
/// to one (a stray write, a bad sector) was in the node and in every backup
/// at once, and a later backup copied it on. (The kernel may still share
/// blocks where the file system can clone them: `copy_file_range`.) A
/// blob damaged in the node fails the backup, naming it: copied as it
/// was, every later backup claimed success and no restore took one (found
/// by a probe).
fn copy_blob(sha256: &[u8; 32], from: &Path, to: &Path) -> Result<bool, StorageError> {
    match std::fs::copy(from, to) {
        Ok(_) => {
            sync(to)?;
            let whole = crate::blobs::file_matches(to, sha256)
                .map_err(io(format!("failed to read back blob `{}`", to.display())))?;
            if !whole {
                return Err(StorageError::Io {
                    what: format!("blob `{}`", from.display()),
                    source: std::io::Error::new(
                        std::io::ErrorKind::InvalidData,
                        "its bytes do not match its SHA-256 (damaged on disk), so no backup \
                         can hold it: the files naming it (their `sha256` in GET \
                         /v1/actors/{type}/{id}/files) must be written again or deleted",
                    ),
                });
            }
            Ok(true)
        }
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(false),
        // Named by both ends: a full destination said only the node's own
        // blob, as if its disk were the full one.
        Err(e) => Err(StorageError::Io {
            what: format!(
                "failed to copy blob `{}` to `{}`",
                from.display(),
                to.display()
            ),
            source: e,
        }),
    }
}

/// The cache of the database a backup writes (redb's default is 1 GiB,
/// which a large backup filled).
const BACKUP_CACHE_BYTES: usize = 32 << 20;

impl Storage {
    /// Write a consistent backup of everything committed to `dest`, a
    /// directory that must not exist yet. Blocking; safe while the node
    /// serves (it holds one read transaction, which keeps the pages it
    /// reads from being reused, and never blocks the writer).
    ///
    /// `extra` files (the dev node's key file) are copied beside the
    /// database when they exist. The backup is written under `DEST.partial`
    /// and renamed into place once complete; a `DEST.partial` already there
    /// (another backup into `DEST` under way, or one cut off) is refused,
    /// never removed.
    ///
    /// Backups go one at a time (each holds a copy of the database's pages
    /// in its cache: several at once took the node's memory from 0.2 to
    /// 1.4 GB), with a small cache.
    pub fn backup(&self, dest: &Path, extra: &[PathBuf]) -> Result<BackupReport, StorageError> {
        let _one = self.backups.lock().unwrap_or_else(|p| p.into_inner());
        if dest.exists() {
            return Err(StorageError::Io {
                what: format!("backup destination `{}`", dest.display()),
                source: std::io::Error::new(
                    std::io::ErrorKind::AlreadyExists,
                    "already exists; choose a new directory",
                ),
            });
        }
        if let Some(data) = self.path.parent()
            && within(dest, data)
        {
            return Err(StorageError::Io {
                what: format!("backup destination `{}`", dest.display()),
                source: std::io::Error::new(
                    std::io::ErrorKind::InvalidInput,
                    format!(
                        "is inside the node's data directory `{}`: a backup there shares the \
                         node's disk and would be copied into the next backup; choose a \
                         directory elsewhere",
                        data.display()
                    ),
                ),
            });
        }
        let started = Instant::now();
        let partial = partial_path(dest)?;
        if let Some(parent) = partial.parent().filter(|p| !p.as_os_str().is_empty()) {
            std::fs::create_dir_all(parent).map_err(|e| StorageError::Io {
                what: format!("backup destination `{}`", dest.display()),
                source: std::io::Error::new(
                    // A file in the way is a bad destination, not a backup
                    // that exists.
                    match e.kind() {
                        std::io::ErrorKind::AlreadyExists => std::io::ErrorKind::InvalidInput,
                        k => bad_place(k),
                    },
                    format!("cannot make its parent `{}`: {e}", parent.display()),
                ),
            })?;
        }
        // Creating it claims it: of two backups into one place, one gets
        // it and the other is refused.
        std::fs::create_dir(&partial).map_err(|e| match e.kind() {
            std::io::ErrorKind::AlreadyExists => StorageError::Io {
                what: format!("backup destination `{}`", dest.display()),
                source: std::io::Error::new(
                    std::io::ErrorKind::AlreadyExists,
                    format!(
                        "`{}` exists: another backup into it is under way, or one was cut \
                         off (remove it and try again)",
                        partial.display()
                    ),
                ),
            },
            _ => StorageError::Io {
                what: format!("backup destination `{}`", dest.display()),
                source: std::io::Error::new(
                    bad_place(e.kind()),
                    format!("cannot create `{}`: {e}", partial.display()),
                ),
            },
        })?;
        let written = self.backup_into(&partial, dest, extra, started);
        if written.is_err() {
            let _ = std::fs::remove_dir_all(&partial);
        }
        written
    }

    /// [`Storage::backup`] into `partial`, which this backup created.
    fn backup_into(
        &self,
        partial: &Path,
        dest: &Path,
        extra: &[PathBuf],
        started: Instant,
    ) -> Result<BackupReport, StorageError> {
        // The blob the last snapshot lacked.
        let mut missing: Option<[u8; 32]> = None;
        for attempt in 1..=MAX_ATTEMPTS {
            // What an earlier attempt left (this backup's own).
            for leftover in [partial.join("blobs"), partial.join("marmot.redb")] {
                let gone = match std::fs::symlink_metadata(&leftover) {
                    Ok(m) if m.is_dir() => std::fs::remove_dir_all(&leftover),
                    Ok(_) => std::fs::remove_file(&leftover),
                    Err(_) => Ok(()),
                };
                gone.map_err(io(format!("failed to clear `{}`", leftover.display())))?;
            }
            let blob_dir = partial.join("blobs");
            std::fs::create_dir_all(&blob_dir)
                .map_err(io(format!("failed to create `{}`", blob_dir.display())))?;
            // The blobs the snapshot names stay until they are copied; the
            // rest go as usual meanwhile.
            let pause = self.blobs().pause_removals();
            let read = self.db.get()?.begin_read()?;
            let named = read
                .open_table(BLOB_REFS)?
                .iter()?
                .map(|row| row.map(|(sha, _)| *sha.value()))
                .collect::<Result<Vec<[u8; 32]>, _>>()?;
            let _pins = self.blobs().pin(named.clone());
            drop(pause);
            // Blobs first.
            let mut blobs = 0;
            let mut went = None;
            for sha in named {
                let from = self.blobs().path(&sha);
                let rel = from.strip_prefix(self.path.parent().unwrap_or(Path::new("")));
                let to = partial.join(rel.unwrap_or(&from));
                if let Some(parent) = to.parent() {
                    std::fs::create_dir_all(parent)
                        .map_err(io(format!("failed to create `{}`", parent.display())))?;
                }
                if !copy_blob(&sha, &from, &to)? {
                    went = Some((sha, from));
                    break;
                }
                blobs += 1;
            }
            if let Some((sha, path)) = went {
                // The same blob missing from a newer snapshot is not one
                // that went meanwhile (removals are paused): retrying
                // took five snapshots, then said "try again".
                if missing.as_ref() == Some(&sha) {
                    return Err(StorageError::Io {
                        what: format!("blob `{}`", path.display()),
                        source: std::io::Error::new(
                            std::io::ErrorKind::NotFound,
                            format!(
                                "is missing from disk though {} (sha256 {}), so no backup can \
                                 hold it; retrying will not help: the files naming it must be \
                                 written again or deleted",
                                files_naming(&read, &sha)?,
                                hex::encode(sha)
                            ),
                        ),
                    });
                }
                tracing::info!(
                    attempt,
                    blob = %path.display(),
                    "a blob went away during the backup; taking a newer snapshot"
                );
                missing = Some(sha);
                continue;
            }
            let db_path = partial.join("marmot.redb");
            let rows = {
                let out = redb::Builder::new()
                    .set_cache_size(BACKUP_CACHE_BYTES)
                    .create(&db_path)?;
                let write = out.begin_write()?;
                let rows = copy_tables(&read, &write)?;
                // A copy is another store, also started on where it lies
                // (a restore removes the identity too, for older backups).
                write.open_table(META)?.remove(STORE_ID_KEY)?;
                write.commit()?;
                rows
            };
            sync(&db_path)?;
            for file in extra {
                if let Some(name) = file.file_name().filter(|_| file.is_file()) {
                    let to = partial.join(name);
                    std::fs::copy(file, &to)
                        .map_err(io(format!("failed to copy `{}`", file.display())))?;
                    sync(&to)?;
                }
            }
            sync(partial)?;
            std::fs::rename(partial, dest).map_err(io(format!(
                "failed to move the backup into `{}`",
                dest.display()
            )))?;
            if let Some(parent) = dest.parent().filter(|p| !p.as_os_str().is_empty()) {
                sync(parent)?;
            }
            let db_bytes = std::fs::metadata(dest.join("marmot.redb"))
                .map(|m| m.len())
                .unwrap_or(0);
            return Ok(BackupReport {
                path: dest.to_owned(),
                rows,
                blobs,
                db_bytes,
                attempts: attempt,
                elapsed_ms: started.elapsed().as_millis() as u64,
            });
        }
        Err(StorageError::Io {
            what: "backup".into(),
            source: std::io::Error::other(format!(
                "blobs kept disappearing during {MAX_ATTEMPTS} snapshots; try again"
            )),
        })
    }
}

/// The files whose bytes are blob `sha256`, for an error naming it: "`a/b`
/// of kit/f names it", the first few of them (the whole table is read, as
/// no index goes from a blob to its files; this is a rare failure's path).
fn files_naming(read: &ReadTransaction, sha256: &[u8; 32]) -> Result<String, StorageError> {
    const NAMED: usize = 3;
    let keys = read.open_table(ACTOR_KEYS)?;
    let mut found = Vec::new();
    let mut more = 0usize;
    for row in read.open_table(FILES)?.iter()? {
        let (k, v) = row?;
        let file: FileRecord = decode("file", v.value())?;
        if file.blob().as_ref() != Some(sha256) {
            continue;
        }
        if found.len() == NAMED {
            more += 1;
            continue;
        }
        let (num, path) = k.value();
        let actor = match keys.get(num)? {
            Some(key) => {
                let (ty, id) = key.value();
                format!("{ty}/{id}")
            }
            None => format!("actor #{num}"),
        };
        found.push(format!("`{path}` of {actor}"));
    }
    Ok(match (found.len(), more) {
        (0, _) => "a file names it".to_owned(),
        (1, _) => format!("{} names it", found[0]),
        (_, 0) => format!("{} name it", found.join(", ")),
        (_, more) => format!("{} and {more} more files name it", found.join(", ")),
    })
}

/// A directory that cannot be made there is a bad destination (what the
/// client chose), not a failed backup: `/proc/x` answered 500.
fn bad_place(kind: std::io::ErrorKind) -> std::io::ErrorKind {
    use std::io::ErrorKind as K;
    match kind {
        K::NotADirectory | K::NotFound | K::PermissionDenied | K::ReadOnlyFilesystem => {
            K::InvalidInput
        }
        k => k,
    }
}

/// `DEST.partial`, beside `DEST` (`nightly.1` → `nightly.1.partial`; an
/// extension is kept, not replaced).
fn partial_path(dest: &Path) -> Result<PathBuf, StorageError> {
    let Some(name) = dest.file_name() else {
        return Err(StorageError::Io {
            what: format!("backup destination `{}`", dest.display()),
            source: std::io::Error::new(
                std::io::ErrorKind::InvalidInput,
                "it must name a new directory",
            ),
        });
    };
    let mut partial = name.to_os_string();
    partial.push(".partial");
    Ok(dest.with_file_name(partial))
}

/// The database a restore is placing, until it is checked and renamed.
pub const RESTORING: &str = "marmot.redb.restoring";

/// What a restore wrote.
#[derive(Debug, Clone)]
pub struct RestoreReport {
    /// Blobs checked and copied.
    pub blobs: u64,
    /// Other files of the backup copied beside the database (a dev node's
    /// key file).
    pub files: Vec<String>,
}

fn refused(what: String, why: String) -> StorageError {
    StorageError::Io {
        what,
        source: std::io::Error::new(std::io::ErrorKind::InvalidData, why),
    }
}

/// Copy the backup in `from` into `data`, an empty or new directory, after
/// checking it: the database's integrity and format (a backup of a newer
/// format is refused; an older one is upgraded when the node opens it, as a
/// data directory would be), and every blob it references against its
/// SHA-256. The backup is only read. A restore that fails leaves `data` as
/// it found it. Of the backup's other files only those named in `extra`
/// (the dev node's key file) are copied.
pub fn restore(from: &Path, data: &Path, extra: &[&str]) -> Result<RestoreReport, StorageError> {
    let src_db = from.join("marmot.redb");
    if !src_db.is_file() {
        return Err(StorageError::Io {
            what: format!("`{}` is not a marmot backup", from.display()),
            source: std::io::Error::new(std::io::ErrorKind::NotFound, "no marmot.redb in it"),
        });
    }
    // A backup cut off before it was complete: its database may be empty
    // (created, its copy never committed) or lack its key file. Restored,
    // it was a node with nothing in it, and the restore said it was done
    // (a probe).
    // (Named as it is: `.` or `bk.partial/..` name no directory by
    // themselves.)
    let named = std::fs::canonicalize(from).unwrap_or_else(|_| from.to_owned());
    if named
        .file_name()
        .and_then(|n| n.to_str())
        .is_some_and(|n| n.ends_with(".partial"))
    {
        return Err(refused(
            format!("`{}`", from.display()),
            "it is a backup that was cut off before it was complete (`DEST.partial`); \
             take the backup again"
                .into(),
        ));
    }
    // A running node's data directory: its latest commits may be only in
    // its journal, which a restore does not read (one was taken, live, and
    // said it had restored: a probe).
    if crate::journal::in_use(&src_db) {
        return Err(StorageError::Io {
            what: format!("`{}` is not a marmot backup", from.display()),
            source: std::io::Error::new(
                std::io::ErrorKind::InvalidInput,
                "it is the data directory of a running node: back it up with `marmot backup`, \
                 and restore that",
            ),
        });
    }
    let existed = data.exists();
    if existed {
        let mut entries =
            std::fs::read_dir(data).map_err(io(format!("failed to list `{}`", data.display())))?;
        if entries.next().is_some() {
            let why = if data.join("marmot.redb").exists() {
                "it already holds a database; restore into an empty directory"
            } else if data.join(RESTORING).exists() {
                "a restore into it was cut off; remove the directory and restore again"
            } else {
                "it is not empty; restore into an empty or new directory"
            };
            return Err(StorageError::Io {
                what: format!("restore into `{}`", data.display()),
                source: std::io::Error::new(std::io::ErrorKind::AlreadyExists, why),
            });
        }
    }
    std::fs::create_dir_all(data).map_err(io(format!("failed to create `{}`", data.display())))?;
    let restored = restore_into(from, data, extra);
    if restored.is_err() {
        // `data` was empty: what is in it now is this restore's.
        let _ = if existed {
            std::fs::read_dir(data).map(|entries| {
                for e in entries.flatten() {
                    let p = e.path();
                    let _ = if p.is_dir() {
                        std::fs::remove_dir_all(&p)
                    } else {
                        std::fs::remove_file(&p)
                    };
                }
            })
        } else {
            std::fs::remove_dir_all(data)
        };
    }
    restored
}

fn restore_into(from: &Path, data: &Path, extra: &[&str]) -> Result<RestoreReport, StorageError> {
    let src_db = from.join("marmot.redb");
    // The database first, under a temporary name, checked there: the
    // backup itself is never opened (opening writes to a redb file).
    let tmp = data.join(RESTORING);
    std::fs::copy(&src_db, &tmp).map_err(io(format!("failed to copy `{}`", src_db.display())))?;
    let damaged = |why: String| {
        refused(
            format!("the backup's database `{}`", src_db.display()),
            format!("{why}; the backup is damaged"),
        )
    };
    let refs: Vec<[u8; 32]> = {
        let mut db = redb::Database::open(&tmp).map_err(|e| damaged(e.to_string()))?;
        match db.check_integrity() {
            Ok(true) => {}
            Ok(false) => return Err(damaged("it fails its integrity check".into())),
            Err(e) => return Err(damaged(e.to_string())),
        }
        // A restored copy is a new store (it may be older than what the
        // node last held): it gets an identity of its own when opened.
        let write = db.begin_write()?;
        write.open_table(META)?.remove(STORE_ID_KEY)?;
        write.commit()?;
        let read = db.begin_read()?;
        let found = read
            .open_table(META)?
            .get("format_version")?
            .map(|v| u32::from_le_bytes(v.value().try_into().unwrap_or([0; 4])));
        match found {
            // Every database a node opened is stamped, and a backup copies
            // the stamp in the one transaction that copies everything: a
            // database without one holds nothing of a node's.
            None => {
                return Err(damaged(
                    "it holds no marmot data (no format version: a backup cut off before \
                     its copy was committed)"
                        .into(),
                ));
            }
            Some(v) if v > FORMAT_VERSION => {
                return Err(FormatError::Mismatch {
                    found: v,
                    expected: FORMAT_VERSION,
                }
                .into());
            }
            Some(_) => {}
        }
        match read.open_table(BLOB_REFS) {
            Ok(t) => t
                .iter()?
                .map(|row| row.map(|(sha, _)| *sha.value()))
                .collect::<Result<_, _>>()?,
            Err(redb::TableError::TableDoesNotExist(_)) => Vec::new(),
            Err(e) => return Err(e.into()),
        }
    };
    sync(&tmp)?;
    // Every blob the database references, checked against its name.
    let mut blobs = 0;
    for sha in &refs {
        let hex = hex::encode(sha);
        let rel = Path::new("blobs").join(&hex[..2]).join(&hex);
        let bytes = std::fs::read(from.join(&rel)).map_err(|e| {
            refused(
                format!("blob `{}` of the backup", rel.display()),
                format!("{e}; the backup is incomplete"),
            )
        })?;
        if <sha2::Sha256 as sha2::Digest>::digest(&bytes).as_slice() != sha {
            return Err(refused(
                format!("blob `{}` of the backup", rel.display()),
                "its content does not match its SHA-256; the backup is damaged".into(),
            ));
        }
        let to = data.join(&rel);
        if let Some(dir) = to.parent() {
            std::fs::create_dir_all(dir)
                .map_err(io(format!("failed to create `{}`", dir.display())))?;
        }
        std::fs::write(&to, &bytes).map_err(io(format!("failed to write `{}`", to.display())))?;
        sync(&to)?;
        blobs += 1;
    }
    // The files asked for beside the database (a dev node's key file);
    // nothing else a backup directory holds is copied (a stray
    // `marmot.redb.restoring` in it replaced the checked database).
    let mut files = Vec::new();
    for name in extra {
        let file = from.join(name);
        if !std::fs::metadata(&file).is_ok_and(|m| m.is_file()) {
            continue;
        }
        let to = data.join(name);
        std::fs::copy(&file, &to).map_err(io(format!("failed to copy `{}`", file.display())))?;
        sync(&to)?;
        files.push((*name).to_owned());
    }
    if data.join("blobs").is_dir() {
        for shard in std::fs::read_dir(data.join("blobs"))
            .into_iter()
            .flatten()
            .flatten()
        {
            sync(&shard.path())?;
        }
        sync(&data.join("blobs"))?;
    }
    // The database last: a restore cut off before this leaves none, so
    // the directory is never mistaken for a restored one (nor is it empty:
    // remove it and restore again).
    let dst_db = data.join("marmot.redb");
    std::fs::rename(&tmp, &dst_db)
        .map_err(io(format!("failed to place `{}`", dst_db.display())))?;
    sync(data)?;
    Ok(RestoreReport { blobs, files })
}

#[cfg(test)]
mod tests;
