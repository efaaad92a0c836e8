//! The actor's key-value state.
//!
//! Reads see the turn's own earlier writes. Writes belong to the current turn
//! and commit with it; nothing is visible to anyone else before the commit.
//! Keys are UTF-8 strings of at most 1 KiB; values are bytes (1 MiB by
//! default). The `*_json` helpers store values as JSON so that
//! `GET /v1/actors/{type}/{id}/state/{key}` shows them readably.

use serde::{Serialize, de::DeserializeOwned};

use crate::Result;
use crate::bindings::marmot::actor::state as host;

/// The raw bytes under `key`.
pub fn get(key: &str) -> Option<Vec<u8>> {
    host::get(key)
}

/// Store raw bytes under `key`.
pub fn set(key: &str, value: &[u8]) -> Result<()> {
    Ok(host::set(key, value)?)
}

/// Remove `key`; returns whether it existed.
pub fn delete(key: &str) -> bool {
    host::delete(key)
}

/// The JSON value under `key`, or `None` when absent.
pub fn get_json<T: DeserializeOwned>(key: &str) -> Result<Option<T>> {
    match host::get(key) {
        Some(bytes) => Ok(Some(serde_json::from_slice(&bytes)?)),
        None => Ok(None),
    }
}

/// Store `value` as JSON under `key`.
pub fn set_json<T: Serialize + ?Sized>(key: &str, value: &T) -> Result<()> {
    let bytes = serde_json::to_vec(value)?;
    Ok(host::set(key, &bytes)?)
}

/// Up to `limit` entries whose key starts with `prefix`, in key order,
/// continuing after `start_after` when given.
pub fn list(prefix: &str, start_after: Option<&str>, limit: u32) -> Vec<(String, Vec<u8>)> {
    host::list(prefix, start_after, limit)
}

/// Every entry whose key starts with `prefix`, paging through the host.
pub fn list_all(prefix: &str) -> Vec<(String, Vec<u8>)> {
    const PAGE: u32 = 256;
    let mut out: Vec<(String, Vec<u8>)> = Vec::new();
    loop {
        let after = out.last().map(|(k, _)| k.clone());
        let page = host::list(prefix, after.as_deref(), PAGE);
        let done = page.len() < PAGE as usize;
        out.extend(page);
        if done {
            return out;
        }
    }
}
