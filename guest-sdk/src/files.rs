//! The actor's files: a tree of its own, written with the turn (a turn that
//! fails writes none). Paths are relative and `/`-separated, without `..`.
//! Everything under `outputs/` is an artifact that clients download with
//! `GET /v1/actors/{type}/{id}/files/outputs/…`, even while the actor
//! sleeps.

use crate::Result;
use crate::bindings::marmot::actor::files as host;

pub use host::FileInfo;

/// The bytes of the file at `path`.
pub fn read(path: &str) -> Result<Vec<u8>> {
    Ok(host::read(path)?)
}

/// Write (or replace) the file at `path`.
pub fn write(path: &str, data: &[u8]) -> Result<()> {
    Ok(host::write(path, data)?)
}

/// Files whose path starts with `prefix`, in path order.
pub fn list(prefix: &str) -> Result<Vec<FileInfo>> {
    Ok(host::list(prefix)?)
}

/// Delete the file at `path`; whether it existed.
pub fn delete(path: &str) -> Result<bool> {
    Ok(host::delete(path)?)
}
