//! Content-addressed blobs: the bytes of large files, one file each under
//! `<data>/blobs/ab/abcdef…` (the SHA-256 in hex).
//!
//! A blob is written and fsync'd by the turn that writes the file, before
//! the turn's commit; the commit adds the file's row and a reference in
//! `blob_refs`. So a blob without a reference is garbage: its turn failed or
//! never committed (a crash), or its last file was overwritten or deleted.
//! [`BlobStore::collect`] removes those, and the node runs it at start-up
//! (when no turn can be writing one) and periodically with a grace period
//! longer than any turn.

use std::io::Write as _;
use std::path::{Path, PathBuf};
use std::time::{Duration, SystemTime};

use sha2::{Digest, Sha256};

use crate::StorageError;

/// Where blobs live.
pub struct BlobStore {
    dir: PathBuf,
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
        Ok(Self { dir })
    }

    /// The path of blob `sha256`.
    pub fn path(&self, sha256: &[u8; 32]) -> PathBuf {
        let hex = hex::encode(sha256);
        self.dir.join(&hex[..2]).join(&hex)
    }

    /// Store `bytes` durably; returns their SHA-256. Blocking (call from a
    /// blocking thread). Storing the same bytes twice writes them once.
    pub fn put(&self, bytes: &[u8]) -> Result<[u8; 32], StorageError> {
        let sha256: [u8; 32] = Sha256::digest(bytes).into();
        let path = self.path(&sha256);
        if path.exists() {
            return Ok(sha256);
        }
        let parent = path.parent().expect("blob paths have a parent");
        std::fs::create_dir_all(parent)
            .map_err(io(format!("failed to create `{}`", parent.display())))?;
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
            return Err(io(format!("failed to write blob `{}`", path.display()))(e));
        }
        Ok(sha256)
    }

    /// Read blob `sha256` whole. Blocking.
    pub fn read(&self, sha256: &[u8; 32]) -> Result<Vec<u8>, StorageError> {
        let path = self.path(sha256);
        std::fs::read(&path).map_err(io(format!("failed to read blob `{}`", path.display())))
    }

    /// Remove every blob that `referenced` says is unused and that was
    /// last modified more than `grace` ago (so a blob written by a turn
    /// still running is kept), and leftover temporary files. Returns how
    /// many were removed. Blocking.
    pub fn collect(
        &self,
        grace: Duration,
        referenced: impl Fn(&[u8; 32]) -> Result<bool, StorageError>,
    ) -> Result<usize, StorageError> {
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
                let garbage = if name.starts_with(".tmp-") {
                    true
                } else {
                    let mut sha = [0u8; 32];
                    match hex::decode_to_slice(name.as_bytes(), &mut sha) {
                        Ok(()) => !referenced(&sha)?,
                        Err(_) => false,
                    }
                };
                if garbage && old(&path) && std::fs::remove_file(&path).is_ok() {
                    removed += 1;
                }
            }
        }
        Ok(removed)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn blobs_are_content_addressed_and_collected_when_unreferenced() {
        let dir = tempfile::tempdir().unwrap();
        let store = BlobStore::open(dir.path().join("blobs")).unwrap();
        let a = store.put(b"alpha").unwrap();
        assert_eq!(store.put(b"alpha").unwrap(), a);
        let b = store.put(b"beta").unwrap();
        assert_eq!(store.read(&a).unwrap(), b"alpha");
        // Within the grace period nothing goes.
        assert_eq!(
            store
                .collect(Duration::from_secs(60), |_| Ok(false))
                .unwrap(),
            0
        );
        // Past it, only what is not referenced.
        let removed = store.collect(Duration::ZERO, |h| Ok(*h == a)).unwrap();
        assert_eq!(removed, 1);
        assert!(store.read(&a).is_ok());
        assert!(store.read(&b).is_err());
    }
}
