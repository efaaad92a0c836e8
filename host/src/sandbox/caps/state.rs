//! `marmot:actor/state`: the turn's view of the actor's key-value state.
//!
//! Writes are buffered in the turn ([`StateCtx`]); nothing reaches storage
//! until the actor commits a successful turn, and a failed turn is dropped
//! with its buffer. Reads go, in order, through the turn's own writes, the
//! actor's [`StateCache`] (values it read or wrote during this activation,
//! including writes whose commit is still in flight) and finally a redb
//! read transaction. The cache is authoritative for every key it holds
//! because the activation is the only writer of the actor's state.

use std::collections::BTreeMap;

use bytes::Bytes;

use super::super::turn::{ActorDisk, Refusal};
use super::Cap;
use crate::ids::MAX_STATE_KEY;
use crate::sandbox::bindings::GuestError;
use crate::sandbox::bindings::marmot::actor::state;
use crate::sandbox::host::Host;
use crate::storage::StorageError;

/// Most entries one `list` call returns.
const MAX_LIST: u32 = 1000;

/// Limits of the state capability.
#[derive(Debug, Clone, Copy)]
pub struct StateLimits {
    /// Largest state value.
    pub max_value_bytes: usize,
    /// Largest total state of one actor.
    pub max_state_bytes: u64,
    /// Bytes of state one turn may write (keys plus values).
    pub max_turn_write_bytes: usize,
    /// Values read from disk are cached only while the actor's cache holds
    /// less than this.
    pub max_cache_bytes: usize,
}

/// A cached state value.
#[derive(Debug, Clone)]
struct Cached {
    value: Option<Bytes>,
    /// Turn that wrote it (0: read from disk). Entries written by a turn whose
    /// commit is not yet durable must not be evicted.
    written_by: u64,
}

/// Values an active actor has read or written, so hot keys never touch redb.
/// In key order: a listing walks only the range it returns (a hash map
/// was walked whole for each page, so listing 100,000 cached keys took
/// 15 s of CPU, a probe).
#[derive(Debug, Default)]
pub struct StateCache {
    entries: BTreeMap<String, Cached>,
    bytes: usize,
}

impl StateCache {
    fn get(&self, key: &str) -> Option<&Option<Bytes>> {
        self.entries.get(key).map(|c| &c.value)
    }

    fn insert(&mut self, key: String, value: Option<Bytes>, written_by: u64) {
        let key_len = key.len();
        let value_len = value.as_ref().map_or(0, Bytes::len);
        match self.entries.insert(key, Cached { value, written_by }) {
            Some(old) => {
                self.bytes = self.bytes - old.value.as_ref().map_or(0, Bytes::len) + value_len;
            }
            None => self.bytes += key_len + value_len,
        }
    }

    /// Approximate memory held.
    pub fn bytes(&self) -> usize {
        self.bytes
    }

    /// Drop entries whose writes are durable (or that came from disk) when
    /// the cache grew beyond `cap` bytes.
    pub fn trim(&mut self, cap: usize, committed_seq: u64) {
        if self.bytes <= cap {
            return;
        }
        let mut bytes = 0;
        self.entries.retain(|k, c| {
            let keep = c.written_by > committed_seq;
            if keep {
                bytes += k.len() + c.value.as_ref().map_or(0, Bytes::len);
            }
            keep
        });
        self.bytes = bytes;
    }
}

/// The state part of a turn: its writes on top of the actor's cache.
pub struct StateCtx {
    disk: ActorDisk,
    limits: StateLimits,
    /// The actor's cache, moved in for the turn.
    cache: StateCache,
    /// State written by this turn, in key order (`None` deletes).
    writes: BTreeMap<String, Option<Bytes>>,
    /// Total state size, including this turn's writes.
    pub(crate) state_bytes: u64,
    /// Number of state keys, including this turn's writes.
    pub(crate) state_keys: u64,
    /// Bytes written by `set` so far.
    write_bytes: usize,
}

/// The state part of a savepoint.
pub(crate) struct StateSavepoint {
    writes: BTreeMap<String, Option<Bytes>>,
    state_bytes: u64,
    state_keys: u64,
    write_bytes: usize,
}

/// What a successful turn wrote to state.
pub(crate) struct StateWrites {
    pub writes: Vec<(String, Option<Bytes>)>,
    pub state_bytes: u64,
    pub state_keys: u64,
}

impl StateCtx {
    /// The state of an actor holding `state_bytes` in `state_keys` keys on
    /// disk (plus what `cache` knows).
    pub(crate) fn new(
        disk: ActorDisk,
        limits: StateLimits,
        cache: StateCache,
        state_bytes: u64,
        state_keys: u64,
    ) -> Self {
        Self {
            disk,
            limits,
            cache,
            writes: BTreeMap::new(),
            state_bytes,
            state_keys,
            write_bytes: 0,
        }
    }

    /// The value under `key` as this turn sees it.
    pub fn get(&mut self, key: &str) -> Result<Option<Bytes>, StorageError> {
        if check_key(key).is_err() {
            return Ok(None);
        }
        if let Some(v) = self.writes.get(key) {
            return Ok(v.clone());
        }
        if let Some(v) = self.cache.get(key) {
            return Ok(v.clone());
        }
        let v = self
            .disk
            .reader()?
            .state(self.disk.num, key)?
            .map(Bytes::from);
        // A turn that reads a lot must not grow the cache without bound.
        if self.cache.bytes() < self.limits.max_cache_bytes {
            self.cache.insert(key.to_owned(), v.clone(), 0);
        }
        Ok(v)
    }

    /// Buffer a write of `value` under `key`.
    pub fn set(&mut self, key: String, value: Bytes) -> Result<Result<(), Refusal>, StorageError> {
        if let Err(r) = check_key(&key) {
            return Ok(Err(r));
        }
        if value.len() > self.limits.max_value_bytes {
            return Ok(Err(Refusal::Limit(format!(
                "state value of {} bytes exceeds the limit of {} bytes",
                value.len(),
                self.limits.max_value_bytes
            ))));
        }
        let written = key.len() + value.len();
        if self.write_bytes + written > self.limits.max_turn_write_bytes {
            return Ok(Err(Refusal::Limit(format!(
                "a turn may write at most {} bytes of state",
                self.limits.max_turn_write_bytes
            ))));
        }
        let old = self.get(&key)?;
        let old_size = old.as_ref().map_or(0, |v| (key.len() + v.len()) as u64);
        let new_size = (key.len() + value.len()) as u64;
        let total = self.state_bytes - old_size + new_size;
        if new_size > old_size && total > self.limits.max_state_bytes {
            return Ok(Err(Refusal::Limit(format!(
                "actor state would grow to {total} bytes, over the limit of {} bytes",
                self.limits.max_state_bytes
            ))));
        }
        self.state_bytes = total;
        self.write_bytes += written;
        if old.is_none() {
            self.state_keys += 1;
        }
        self.writes.insert(key, Some(value));
        Ok(Ok(()))
    }

    /// Buffer a delete; returns whether the key existed.
    pub fn delete(&mut self, key: &str) -> Result<bool, StorageError> {
        if check_key(key).is_err() {
            return Ok(false);
        }
        let Some(old) = self.get(key)? else {
            return Ok(false);
        };
        self.state_bytes -= (key.len() + old.len()) as u64;
        self.state_keys -= 1;
        self.writes.insert(key.to_owned(), None);
        Ok(true)
    }

    /// Entries with `prefix` in key order, after `start_after`, at most
    /// `limit`. Reads what this page needs: the activation's view (cache,
    /// then this turn's writes on top) up to its `limit`-th value, and as
    /// many disk rows as can be visible there.
    pub fn list(
        &mut self,
        prefix: &str,
        start_after: Option<&str>,
        limit: usize,
    ) -> Result<Vec<(String, Bytes)>, StorageError> {
        if limit == 0 {
            return Ok(Vec::new());
        }
        let overlay = self.overlay(prefix, start_after, limit);
        // Deleted keys may hide disk rows, so read that many more.
        let hidden = overlay.iter().filter(|(_, v)| v.is_none()).count();
        let disk = self.disk.reader()?.state_range(
            self.disk.num,
            prefix,
            start_after,
            limit.saturating_add(hidden),
        )?;
        // (Past the overlay's last key, when it stopped at `limit` values,
        // a disk row may be one a write hides; but the page's `limit`
        // entries all come before it.)
        let mut merged: BTreeMap<&str, Bytes> = disk
            .iter()
            .map(|(k, v)| (k.as_str(), Bytes::copy_from_slice(v)))
            .collect();
        for (k, v) in overlay {
            match v {
                Some(v) => merged.insert(k, v.clone()),
                None => merged.remove(k),
            };
        }
        Ok(merged
            .into_iter()
            .take(limit)
            .map(|(k, v)| (k.to_owned(), v))
            .collect())
    }

    /// This activation's entries with `prefix` after `start_after`, in key
    /// order (a write over the cached value), up to the `limit`-th that
    /// holds a value.
    fn overlay<'a>(
        &'a self,
        prefix: &str,
        start_after: Option<&str>,
        limit: usize,
    ) -> Vec<(&'a str, &'a Option<Bytes>)> {
        use std::ops::Bound;
        let from = match start_after {
            Some(a) if a >= prefix => Bound::Excluded(a),
            _ => Bound::Included(prefix),
        };
        let ours = |(k, _): &(&String, _)| k.starts_with(prefix);
        let mut cached = self
            .cache
            .entries
            .range::<str, _>((from, Bound::Unbounded))
            .map(|(k, c)| (k, &c.value))
            .take_while(ours)
            .peekable();
        let mut written = self
            .writes
            .range::<str, _>((from, Bound::Unbounded))
            .take_while(ours)
            .peekable();
        let mut out = Vec::new();
        let mut values = 0;
        loop {
            let next = match (cached.peek(), written.peek()) {
                (None, None) => return out,
                (Some(c), Some(w)) if c.0 == w.0 => {
                    cached.next();
                    written.next()
                }
                (Some(c), Some(w)) if c.0 < w.0 => cached.next(),
                (Some(_), None) => cached.next(),
                _ => written.next(),
            };
            let Some((k, v)) = next else {
                return out;
            };
            out.push((k.as_str(), v));
            values += usize::from(v.is_some());
            if values == limit {
                return out;
            }
        }
    }

    /// What a rollback to this point needs.
    pub(crate) fn savepoint(&self) -> StateSavepoint {
        StateSavepoint {
            writes: self.writes.clone(),
            state_bytes: self.state_bytes,
            state_keys: self.state_keys,
            write_bytes: self.write_bytes,
        }
    }

    /// Undo every write since `sp` (reads stay cached: they were true).
    pub(crate) fn rollback(&mut self, sp: StateSavepoint) {
        self.writes = sp.writes;
        self.state_bytes = sp.state_bytes;
        self.state_keys = sp.state_keys;
        self.write_bytes = sp.write_bytes;
    }

    /// The turn succeeded: fold its writes into the cache (as written by
    /// turn `seq`) and return the cache and the writes to commit.
    pub(crate) fn finish(mut self, seq: u64) -> (StateCache, StateWrites) {
        let writes: Vec<(String, Option<Bytes>)> =
            std::mem::take(&mut self.writes).into_iter().collect();
        for (k, v) in &writes {
            self.cache.insert(k.clone(), v.clone(), seq);
        }
        let out = StateWrites {
            writes,
            state_bytes: self.state_bytes,
            state_keys: self.state_keys,
        };
        (self.cache, out)
    }

    /// The turn failed: its writes are dropped; the cache goes back.
    pub(crate) fn abandon(self) -> StateCache {
        self.cache
    }
}

fn check_key(key: &str) -> Result<(), Refusal> {
    if key.is_empty() {
        return Err(Refusal::Invalid("state key must not be empty".into()));
    }
    if key.len() > MAX_STATE_KEY {
        return Err(Refusal::Invalid(format!(
            "state key of {} bytes exceeds the limit of {MAX_STATE_KEY} bytes",
            key.len()
        )));
    }
    Ok(())
}

impl state::Host for Host {
    fn get(&mut self, key: String) -> wasmtime::Result<Option<Vec<u8>>> {
        let turn = self.enter(Cap::State)?;
        Ok(turn.state.get(&key)?.map(|b| b.to_vec()))
    }

    fn set(&mut self, key: String, value: Vec<u8>) -> wasmtime::Result<Result<(), GuestError>> {
        let turn = self.enter(Cap::State)?;
        Ok(turn.state.set(key, Bytes::from(value))?.map_err(Into::into))
    }

    fn delete(&mut self, key: String) -> wasmtime::Result<bool> {
        let turn = self.enter(Cap::State)?;
        Ok(turn.state.delete(&key)?)
    }

    fn list(
        &mut self,
        prefix: String,
        start_after: Option<String>,
        limit: u32,
    ) -> wasmtime::Result<Vec<(String, Vec<u8>)>> {
        let turn = self.enter(Cap::State)?;
        let entries = turn.state.list(
            &prefix,
            start_after.as_deref(),
            limit.min(MAX_LIST) as usize,
        )?;
        Ok(entries.into_iter().map(|(k, v)| (k, v.to_vec())).collect())
    }
}
