//! The compiled-code cache directory: which of its files this node uses,
//! and removing the ones no node has used for a while.
//!
//! Every deploy of a new JavaScript version leaves a compiled snapshot
//! (~6 MB) and every new Marmot build a new copy of every component (the
//! engine's hash is in each name), so without eviction the directory only
//! grows. The protocol is a file's modification time: a node sets it to
//! now when it loads or writes a file, and again at every sweep for the
//! files it still uses; a sweep removes cache files whose time is older
//! than the retention. Several nodes may share the directory, and each
//! keeps its own files fresh, so one node's sweep never takes another's.
//! A file removed while mapped stays readable to whoever mapped it; a node
//! that needs a removed file later compiles it again, as after a wiped
//! cache. A file counts as used for as long as this node holds the code
//! loaded from it ([`CacheUse`]): once a type is deleted or a version
//! replaced and no actor runs it any more, its file ages like any other
//! and goes a week later. (It used to count as used until the node
//! restarted: a long-running node kept ~6 MB per JavaScript deploy.)

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::{Duration, SystemTime};

/// A file nobody has used for this long is removed by a sweep.
pub const UNUSED_FOR: Duration = Duration::from_secs(7 * 24 * 3600);

/// A temporary file (`write_atomic`) older than this was left by a crash.
const ABANDONED_AFTER: Duration = Duration::from_secs(3600);

/// The cache directory and the files in it this node uses.
#[derive(Debug)]
pub(super) struct CodeCache {
    dir: PathBuf,
    used: Arc<Users>,
}

/// How many holders each file this node uses has.
type Users = Mutex<HashMap<PathBuf, usize>>;

/// This node's use of one cache file: sweeps keep the file fresh while
/// any of these for it lives. Held with the code loaded from the file.
#[derive(Debug)]
#[must_use = "the file counts as used only while this lives"]
pub(super) struct CacheUse {
    users: Arc<Users>,
    path: PathBuf,
}

impl CacheUse {
    /// Keep the file for as long as this node runs (the shared engine's
    /// files, a few bytes of refused preload).
    pub(super) fn for_life(self) {
        std::mem::forget(self);
    }
}

impl Drop for CacheUse {
    fn drop(&mut self) {
        let mut users = self.users.lock().expect("code cache lock");
        if let Some(n) = users.get_mut(&self.path) {
            *n -= 1;
            if *n == 0 {
                users.remove(&self.path);
            }
        }
    }
}

/// What a sweep removed.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct Swept {
    pub files: u64,
    pub bytes: u64,
}

/// The kinds of file a sweep may remove: compiled code, engine snapshots,
/// refused preloads, and temporary files. Anything else in the directory
/// (Cranelift's incremental cache, which bounds itself; files that are not
/// ours) is left alone.
enum Kind {
    Entry,
    Temporary,
}

fn kind(name: &str) -> Option<Kind> {
    if name.ends_with(".cwasm") || name.ends_with(".snapshot.wasm") || name.ends_with(".refused") {
        return Some(Kind::Entry);
    }
    // `write_atomic` writes `<name>.tmp<pid>` and renames it into place.
    let (_, ext) = name.rsplit_once('.')?;
    let pid = ext.strip_prefix("tmp")?;
    (!pid.is_empty() && pid.bytes().all(|b| b.is_ascii_digit())).then_some(Kind::Temporary)
}

impl CodeCache {
    pub(super) fn new(dir: PathBuf) -> Self {
        Self {
            dir,
            used: Arc::default(),
        }
    }

    /// Note that this node uses `path` (it loaded or wrote it): its time is
    /// set to now, and sweeps keep it fresh for as long as the returned
    /// use lives.
    pub(super) fn used(&self, path: &Path) -> CacheUse {
        touch(path, SystemTime::now());
        *self
            .used
            .lock()
            .expect("code cache lock")
            .entry(path.to_path_buf())
            .or_default() += 1;
        CacheUse {
            users: self.used.clone(),
            path: path.to_path_buf(),
        }
    }

    /// Write `bytes` to `path` (atomically) as a file this node uses. A
    /// failure costs only a compile later, so it is logged, not returned:
    /// `what` names the entry in the log.
    pub(super) fn store(&self, path: &Path, bytes: &[u8], what: &str) -> Option<CacheUse> {
        match super::write_atomic(path, bytes) {
            Ok(()) => Some(self.used(path)),
            Err(e) => {
                tracing::warn!(path = %path.display(), error = %e, "failed to cache {what}");
                None
            }
        }
    }

    /// Refresh the files this node uses, then remove cache files unused
    /// for longer than `unused_for` (and temporary files abandoned for an
    /// hour). Blocking: run it on a blocking thread.
    pub(super) fn sweep(&self, now: SystemTime, unused_for: Duration) -> std::io::Result<Swept> {
        let used: std::collections::HashSet<PathBuf> = self
            .used
            .lock()
            .expect("code cache lock")
            .keys()
            .cloned()
            .collect();
        for path in &used {
            touch(path, now);
        }
        let mut swept = Swept::default();
        for entry in std::fs::read_dir(&self.dir)? {
            let entry = entry?;
            let path = entry.path();
            let Some(kind) = entry.file_name().to_str().and_then(kind) else {
                continue;
            };
            if used.contains(&path) {
                continue;
            }
            let Ok(meta) = entry.metadata() else { continue };
            if !meta.is_file() {
                continue;
            }
            let limit = match kind {
                Kind::Entry => unused_for,
                Kind::Temporary => ABANDONED_AFTER.min(unused_for),
            };
            let age = meta
                .modified()
                .ok()
                .and_then(|m| now.duration_since(m).ok())
                .unwrap_or_default();
            if age <= limit {
                continue;
            }
            match std::fs::remove_file(&path) {
                Ok(()) => {
                    swept.files += 1;
                    swept.bytes += meta.len();
                }
                // Another node sharing the directory got there first.
                Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
                Err(e) => {
                    tracing::warn!(path = %path.display(), error = %e, "failed to remove an unused compiled-code cache file");
                }
            }
        }
        Ok(swept)
    }
}

/// Set `path`'s modification time; a failure only makes the file look
/// older to a sweep of another node, so it is logged, not returned.
fn touch(path: &Path, now: SystemTime) {
    let result = std::fs::File::options()
        .write(true)
        .open(path)
        .and_then(|f| f.set_modified(now));
    if let Err(e) = result {
        tracing::debug!(path = %path.display(), error = %e, "failed to mark a compiled-code cache file as used");
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const DAY: Duration = Duration::from_secs(24 * 3600);

    fn file(dir: &Path, name: &str, age: Duration, now: SystemTime) -> PathBuf {
        let path = dir.join(name);
        std::fs::write(&path, b"compiled").unwrap();
        let f = std::fs::File::options().write(true).open(&path).unwrap();
        f.set_modified(now - age).unwrap();
        path
    }

    #[test]
    fn a_sweep_removes_only_cache_files_unused_for_longer_than_the_retention() {
        let dir = tempfile::tempdir().unwrap();
        let now = SystemTime::now();
        let d = dir.path();
        let old_component = file(d, "ab12-e1.cwasm", 8 * DAY, now);
        let old_type = file(d, "quickjs-type-k-e1.cwasm", 8 * DAY, now);
        let old_refusal = file(d, "quickjs-type-j-e1.refused", 8 * DAY, now);
        let old_snapshot = file(d, "quickjs-s-e1.snapshot.wasm", 8 * DAY, now);
        let recent = file(d, "cd34-e2.cwasm", 6 * DAY, now);
        let incremental = file(d, "cranelift-incremental.cache", 30 * DAY, now);
        let foreign = file(d, "notes.txt", 30 * DAY, now);
        let abandoned = file(d, "ef56-e2.tmp4242", Duration::from_secs(2 * 3600), now);
        let writing = file(d, "ef57-e2.tmp4243", Duration::from_secs(60), now);

        let cache = CodeCache::new(d.to_path_buf());
        let swept = cache.sweep(now, 7 * DAY).unwrap();

        for gone in [
            &old_component,
            &old_type,
            &old_refusal,
            &old_snapshot,
            &abandoned,
        ] {
            assert!(!gone.exists(), "{} should be removed", gone.display());
        }
        for kept in [&recent, &incremental, &foreign, &writing] {
            assert!(kept.exists(), "{} should be kept", kept.display());
        }
        assert_eq!(swept.files, 5);
        assert_eq!(swept.bytes, 5 * b"compiled".len() as u64);
        // Nothing left to remove.
        assert_eq!(cache.sweep(now, 7 * DAY).unwrap(), Swept::default());
    }

    #[test]
    fn a_file_in_use_is_kept_and_kept_fresh_for_other_nodes() {
        let dir = tempfile::tempdir().unwrap();
        let now = SystemTime::now();
        let path = file(dir.path(), "ab12-e1.cwasm", 3 * DAY, now);
        let cache = CodeCache::new(dir.path().to_path_buf());
        let _held = cache.used(&path);
        // Made old again, as if the node had run for weeks since loading it.
        file(dir.path(), "ab12-e1.cwasm", 30 * DAY, now);

        assert_eq!(cache.sweep(now, 7 * DAY).unwrap(), Swept::default());
        assert!(path.exists());
        // The sweep refreshed it: a node sharing the directory keeps it too.
        let other = CodeCache::new(dir.path().to_path_buf());
        assert_eq!(other.sweep(now, 7 * DAY).unwrap(), Swept::default());
        let age = now
            .duration_since(std::fs::metadata(&path).unwrap().modified().unwrap())
            .unwrap_or_default();
        assert!(age < DAY, "the sweep set the file's time to now");
    }

    #[test]
    fn a_file_no_longer_held_ages_like_any_other() {
        let dir = tempfile::tempdir().unwrap();
        let now = SystemTime::now();
        let path = file(dir.path(), "ab12-e1.cwasm", DAY, now);
        let cache = CodeCache::new(dir.path().to_path_buf());
        let (first, second) = (cache.used(&path), cache.used(&path));
        file(dir.path(), "ab12-e1.cwasm", 30 * DAY, now);
        drop(first);
        // Still held by the second user: kept, and made fresh.
        assert_eq!(cache.sweep(now, 7 * DAY).unwrap(), Swept::default());
        assert!(path.exists());
        drop(second);
        // Fresh from that sweep: kept until it has aged the retention.
        assert_eq!(cache.sweep(now, 7 * DAY).unwrap(), Swept::default());
        assert_eq!(cache.sweep(now + 8 * DAY, 7 * DAY).unwrap().files, 1);
        assert!(!path.exists());
        // One kept for life is never dropped.
        let path = file(dir.path(), "cd34-e1.cwasm", 30 * DAY, now);
        cache.used(&path).for_life();
        assert_eq!(cache.sweep(now, 7 * DAY).unwrap(), Swept::default());
        assert!(path.exists());
    }

    #[test]
    fn only_our_temporary_names_count_as_temporary() {
        assert!(matches!(kind("x.cwasm.tmp123"), Some(Kind::Temporary)));
        assert!(matches!(kind("x.tmp1"), Some(Kind::Temporary)));
        assert!(kind("x.tmp").is_none());
        assert!(kind("x.tmpabc").is_none());
        assert!(kind("cranelift-incremental.cache").is_none());
        assert!(matches!(kind("x.cwasm"), Some(Kind::Entry)));
    }
}
