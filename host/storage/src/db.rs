//! The open database, which the writer closes and reopens after an I/O error.
//!
//! redb latches the first failed write or fsync: from then on every
//! transaction, reads included, fails with `PreviousIo` until the database is
//! closed and opened again (which repairs it from its last durable commit).
//! A full disk or a failing fsync must not take the node down for good, so
//! the database lives in this cell: the writer, which sees every commit
//! fail, closes it and opens it again, and records the fault until a commit
//! succeeds. Readers take the current database for each read transaction.

use std::path::PathBuf;
use std::sync::{Arc, Mutex, RwLock};

use crate::StorageError;

/// Opens the database file (again).
pub(crate) type Opener =
    Box<dyn Fn() -> Result<redb::Database, redb::DatabaseError> + Send + Sync + 'static>;

/// The database, when it is open, and the storage fault, if there is one.
pub(crate) struct DbCell {
    current: RwLock<Option<Arc<redb::Database>>>,
    opener: Opener,
    path: PathBuf,
    fault: Mutex<Option<String>>,
    /// Closed for good (the node is stopping): never opened again.
    shut: std::sync::atomic::AtomicBool,
}

impl DbCell {
    pub(crate) fn new(db: redb::Database, opener: Opener, path: PathBuf) -> Self {
        Self {
            current: RwLock::new(Some(Arc::new(db))),
            opener,
            path,
            fault: Mutex::new(None),
            shut: std::sync::atomic::AtomicBool::new(false),
        }
    }

    /// Close the database for good: the last handle to go closes the file
    /// cleanly (redb's clean shutdown; the journal syncs the file and
    /// empties itself), and nothing opens it again.
    pub(crate) fn shut_down(&self) {
        self.shut.store(true, std::sync::atomic::Ordering::Release);
        self.close();
    }

    /// The open database, or why there is none.
    pub(crate) fn get(&self) -> Result<Arc<redb::Database>, StorageError> {
        let current = self.current.read().unwrap_or_else(|p| p.into_inner());
        current.clone().ok_or_else(|| self.unavailable())
    }

    fn unavailable(&self) -> StorageError {
        if self.shut.load(std::sync::atomic::Ordering::Acquire) {
            return StorageError::ShuttingDown;
        }
        StorageError::Unavailable(
            self.fault()
                .unwrap_or_else(|| "the database is being reopened".to_owned()),
        )
    }

    /// Why writes are failing, while they are.
    pub(crate) fn fault(&self) -> Option<String> {
        self.fault.lock().unwrap_or_else(|p| p.into_inner()).clone()
    }

    pub(crate) fn set_fault(&self, why: Option<String>) {
        *self.fault.lock().unwrap_or_else(|p| p.into_inner()) = why;
    }

    /// Close the database: the file is released once the last transaction
    /// that holds it ends (read transactions in flight then fail).
    pub(crate) fn close(&self) {
        let old = self
            .current
            .write()
            .unwrap_or_else(|p| p.into_inner())
            .take();
        drop(old);
    }

    /// Open the database again if it is closed. Fails while an old handle
    /// is still held somewhere (`DatabaseAlreadyOpen`) or the file cannot be
    /// opened; the caller tries again later.
    pub(crate) fn reopen(&self) -> Result<Arc<redb::Database>, StorageError> {
        let mut current = self.current.write().unwrap_or_else(|p| p.into_inner());
        if let Some(db) = current.as_ref() {
            return Ok(db.clone());
        }
        if self.shut.load(std::sync::atomic::Ordering::Acquire) {
            return Err(StorageError::ShuttingDown);
        }
        let db = Arc::new((self.opener)().map_err(|e| StorageError::Open {
            path: self.path.clone(),
            why: e.to_string(),
        })?);
        *current = Some(db.clone());
        Ok(db)
    }
}

/// Whether `e` means the disk failed (a write, an fsync, space), so that the
/// database must be reopened before it can be used again.
pub(crate) fn is_io_failure(e: &StorageError) -> bool {
    matches!(
        e,
        StorageError::Db(redb::Error::Io(_) | redb::Error::PreviousIo)
            | StorageError::Io { .. }
            | StorageError::Unavailable(_)
    )
}
