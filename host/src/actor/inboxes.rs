//! The bound on each actor's durable inbox (`limits.max_inbox_messages`,
//! `limits.max_inbox_bytes`).
//!
//! `?wait=false` messages, webhooks, relayed sends and what turns send
//! (`actors.send`, counted when the turn makes the send) wait in the inbox
//! on disk, and nothing bounded how many: one client posting 1 MiB
//! messages to one slow actor grew the data directory by 600 MB in 4 s,
//! and a client token allowed to send could fill the disk (found by two
//! probes).
//!
//! Counting an actor's rows reads them, so the count is kept here, in
//! memory: read from disk the first time an actor is sent to, then only
//! *added to* as messages are admitted, an upper bound of what is queued
//! (its turns take rows away unseen). Only when it reaches a limit is it
//! read again, and the message is refused only if what is really queued
//! is at the limit; within a second of a read the count is not read again
//! (what was read, plus what was admitted since), so a sender hammering a
//! full inbox costs one read a second. A retry of a message already
//! queued (same `Idempotency-Key`, same webhook id) is answered as before,
//! full or not.
//!
//! A turn's send is counted when the turn makes it, but written only when
//! the turn commits: until then it is *unsettled*, and a read from disk
//! adds what is unsettled (a read that forgot them let running turns queue
//! a whole limit more each second: the reviewer). Its [`SendClaim`]
//! settles it: queued once the commit is durable, taken back if the turn
//! fails or rolls the send back.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use crate::actor::TurnError;
use crate::ids::ActorKey;
use crate::storage::StorageError;

/// How often a full inbox's count is read again from disk.
const RECOUNT: Duration = Duration::from_secs(1);

/// Actors counted before the map starts over (each from 0 again).
const MAX_COUNTED: usize = 65_536;

/// What is queued, as far as this node knows.
#[derive(Debug, Clone, Copy)]
struct Queued {
    messages: u64,
    bytes: u64,
    /// Of those, sends of turns not committed yet (not on disk).
    unsettled: u64,
    unsettled_bytes: u64,
    /// When it was last read from disk (`None`: never).
    read_at: Option<Instant>,
}

impl Queued {
    fn add(&mut self, bytes: u64) {
        self.messages += 1;
        self.bytes = self.bytes.saturating_add(bytes);
    }
}

/// The per-actor counts and the limits.
pub(crate) struct Inboxes {
    counted: Mutex<HashMap<ActorKey, Queued>>,
    max_messages: u64,
    max_bytes: u64,
}

impl Inboxes {
    pub(crate) fn new(max_messages: u64, max_bytes: u64) -> Self {
        Self {
            counted: Mutex::default(),
            max_messages,
            max_bytes,
        }
    }

    fn fits(&self, q: &Queued, bytes: u64) -> bool {
        q.messages < self.max_messages && q.bytes.saturating_add(bytes) <= self.max_bytes
    }

    /// Whether a message of `bytes` may join `key`'s inbox, which then
    /// counts it (taken back by [`Self::not_queued`] if it is not queued
    /// after all: a duplicate, a failed commit). `read` counts what the
    /// inbox holds on disk (rows, bytes): asked the first time an actor is
    /// seen, and when the kept count is at a limit. Counted at once, so
    /// that senders side by side cannot all pass the same check (60 at
    /// once passed a limit of 5: found by a re-probe).
    pub(crate) fn admit(
        &self,
        key: &ActorKey,
        bytes: u64,
        read: impl FnOnce() -> Result<(u64, u64), StorageError>,
    ) -> Result<(), TurnError> {
        {
            let mut counted = self.counted.lock().expect("inbox counts lock");
            match counted.get_mut(key) {
                Some(q) if self.fits(q, bytes) => {
                    q.add(bytes);
                    return Ok(());
                }
                Some(q) if q.read_at.is_some_and(|t| t.elapsed() < RECOUNT) => {
                    return Err(self.full(key, q));
                }
                // Not seen since the node started (it may hold what it was
                // sent before: each restart let a full inbox take another
                // whole limit, found by a re-probe), or at a limit a while
                // ago: read it.
                _ => {}
            }
        }
        // Read without the lock: the rows of one actor, at most its limit.
        let reading = Instant::now();
        let (messages, held) = read()?;
        let mut counted = self.counted.lock().expect("inbox counts lock");
        if counted.len() >= MAX_COUNTED && !counted.contains_key(key) {
            // Starting over costs a read per actor, never a wrong count.
            counted.clear();
        }
        let q = counted.entry(key.clone()).or_insert(Queued {
            messages: 0,
            bytes: 0,
            unsettled: 0,
            unsettled_bytes: 0,
            read_at: None,
        });
        // A sender side by side that read after this one began has the
        // fresher count, with what was admitted since: keep it.
        if q.read_at.is_none_or(|t| t < reading) {
            q.messages = messages + q.unsettled;
            q.bytes = held.saturating_add(q.unsettled_bytes);
            q.read_at = Some(Instant::now());
        }
        if self.fits(q, bytes) {
            q.add(bytes);
            Ok(())
        } else {
            Err(self.full(key, q))
        }
    }

    /// A message [`Self::admit`] counted was not queued after all.
    pub(crate) fn not_queued(&self, key: &ActorKey, bytes: u64) {
        let mut counted = self.counted.lock().expect("inbox counts lock");
        if let Some(q) = counted.get_mut(key) {
            q.messages = q.messages.saturating_sub(1);
            q.bytes = q.bytes.saturating_sub(bytes);
        }
    }

    /// [`Self::admit`] a turn's send of `bytes` to `key`, unsettled until
    /// the claim is (dropped without [`SendClaim::queued`]: not queued).
    pub(crate) fn admit_send(
        self: &Arc<Self>,
        key: &ActorKey,
        bytes: u64,
        read: impl FnOnce() -> Result<(u64, u64), StorageError>,
    ) -> Result<SendClaim, TurnError> {
        self.admit(key, bytes, read)?;
        let mut counted = self.counted.lock().expect("inbox counts lock");
        if let Some(q) = counted.get_mut(key) {
            q.unsettled += 1;
            q.unsettled_bytes = q.unsettled_bytes.saturating_add(bytes);
        }
        Ok(SendClaim {
            inboxes: self.clone(),
            key: key.clone(),
            bytes,
            queued: false,
        })
    }

    fn settle(&self, key: &ActorKey, bytes: u64, queued: bool) {
        let mut counted = self.counted.lock().expect("inbox counts lock");
        if let Some(q) = counted.get_mut(key) {
            q.unsettled = q.unsettled.saturating_sub(1);
            q.unsettled_bytes = q.unsettled_bytes.saturating_sub(bytes);
            if !queued {
                q.messages = q.messages.saturating_sub(1);
                q.bytes = q.bytes.saturating_sub(bytes);
            }
        }
    }

    fn full(&self, key: &ActorKey, q: &Queued) -> TurnError {
        // (Counted with what turns are sending it and may still commit.)
        TurnError::InboxFull(format!(
            "actor {key} has {} durable messages ({} bytes) queued or on their way; an actor \
             may hold {} messages and {} bytes (limits.max_inbox_messages, \
             limits.max_inbox_bytes)",
            q.messages, q.bytes, self.max_messages, self.max_bytes
        ))
    }
}

/// A turn's send counted against its recipient's inbox, until settled
/// when dropped: as queued if [`Self::queued`] was called (its commit is
/// durable), else taken back.
pub(crate) struct SendClaim {
    inboxes: Arc<Inboxes>,
    key: ActorKey,
    bytes: u64,
    queued: bool,
}

impl std::fmt::Debug for SendClaim {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SendClaim")
            .field("key", &self.key)
            .field("bytes", &self.bytes)
            .field("queued", &self.queued)
            .finish()
    }
}

impl crate::sandbox::InboxClaim for SendClaim {
    fn queued(&mut self) {
        self.queued = true;
    }
}

impl Drop for SendClaim {
    fn drop(&mut self) {
        self.inboxes.settle(&self.key, self.bytes, self.queued);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::sandbox::InboxClaim as _;

    /// What turns have sent but not committed is not forgotten by a read
    /// from disk; once settled it is on disk, or taken back.
    #[test]
    fn unsettled_sends_survive_a_read_and_settle() {
        let key = ActorKey::new("t", "a").unwrap();
        let inboxes = Arc::new(Inboxes::new(3, 1000));
        let read = |n: u64| move || Ok((n, n * 10));
        let mut a = inboxes.admit_send(&key, 10, read(0)).unwrap();
        let b = inboxes.admit_send(&key, 10, read(0)).unwrap();
        inboxes.admit(&key, 10, read(0)).unwrap();
        // Full; a second on, the disk shows the one client message: the
        // two sends in flight still count.
        inboxes
            .counted
            .lock()
            .unwrap()
            .get_mut(&key)
            .unwrap()
            .read_at = Some(Instant::now() - RECOUNT);
        assert!(inboxes.admit(&key, 10, read(1)).is_err());
        // `a` committed, `b`'s turn failed: room for one.
        a.queued();
        drop((a, b));
        inboxes.admit(&key, 10, read(2)).unwrap();
        assert!(inboxes.admit(&key, 10, read(2)).is_err());
    }

    #[test]
    fn a_full_inbox_is_read_again_before_a_refusal_and_at_most_once_a_second() {
        let key = ActorKey::new("t", "a").unwrap();
        let inboxes = Inboxes::new(3, 1000);
        let reads = std::cell::Cell::new(0);
        let read = |n: u64, b: u64| {
            let reads = &reads;
            move || {
                reads.set(reads.get() + 1);
                Ok((n, b))
            }
        };
        let a_second_on = |inboxes: &Inboxes, key: &ActorKey| {
            let mut counted = inboxes.counted.lock().unwrap();
            counted.get_mut(key).unwrap().read_at = Some(Instant::now() - RECOUNT);
        };
        // First seen: read (it held one from before a restart), then
        // counted as admitted, no read while under the limits.
        inboxes.admit(&key, 10, read(1, 10)).unwrap();
        inboxes.admit(&key, 10, read(0, 0)).unwrap();
        assert_eq!(reads.get(), 1);
        // At the limit within a second of the read: refused without one.
        let e = inboxes.admit(&key, 10, read(0, 0)).unwrap_err();
        assert_eq!(e.code(), "inbox_full");
        assert!(e.to_string().contains("limits.max_inbox_messages"), "{e}");
        assert_eq!(reads.get(), 1);
        // One not queued after all (a duplicate) makes room.
        inboxes.not_queued(&key, 10);
        inboxes.admit(&key, 10, read(0, 0)).unwrap();
        assert_eq!(reads.get(), 1);
        // A second on, at the limit: read again; still full, refused.
        a_second_on(&inboxes, &key);
        assert!(inboxes.admit(&key, 10, read(3, 30)).is_err());
        assert_eq!(reads.get(), 2);
        // A second on again, drained meanwhile: admitted.
        a_second_on(&inboxes, &key);
        assert!(inboxes.admit(&key, 10, read(0, 0)).is_ok());
        assert_eq!(reads.get(), 3);
        // Bytes count too.
        let other = ActorKey::new("t", "b").unwrap();
        assert!(inboxes.admit(&other, 5, read(1, 995)).is_ok());
        assert!(inboxes.admit(&other, 1, read(0, 0)).is_err());
    }
}
