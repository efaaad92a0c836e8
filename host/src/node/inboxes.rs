//! The bound on each actor's durable inbox (`limits.max_inbox_messages`,
//! `limits.max_inbox_bytes`).
//!
//! `?wait=false` messages, webhooks and relayed sends wait in the inbox on
//! disk, and nothing bounded how many: one client posting 1 MiB messages to
//! one slow actor grew the data directory by 600 MB in 4 s, and a client
//! token allowed to send could fill the disk (found by two probes).
//!
//! Counting an actor's rows reads them, so the count is kept here, in
//! memory, and only *added to* as messages are queued: it is an upper
//! bound of what is queued since it was last read from disk. Only when it
//! reaches a limit is it read again, and the message is refused only if
//! what is really queued is at the limit; within a second of a read the
//! count is not read again (what was read, plus what was queued since),
//! so a sender hammering a full inbox costs one read a second. An actor
//! nobody sent to since the node started counts from 0: what it had
//! queued before is found at its first read, so it may go past a limit by
//! what it held at start-up, once.

use std::collections::HashMap;
use std::sync::Mutex;
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
    /// When it was last read from disk (`None`: never).
    read_at: Option<Instant>,
}

/// The per-actor counts and the limits.
pub(super) struct Inboxes {
    counted: Mutex<HashMap<ActorKey, Queued>>,
    max_messages: u64,
    max_bytes: u64,
}

impl Inboxes {
    pub(super) fn new(max_messages: u64, max_bytes: u64) -> Self {
        Self {
            counted: Mutex::default(),
            max_messages,
            max_bytes,
        }
    }

    fn fits(&self, q: &Queued, bytes: u64) -> bool {
        q.messages < self.max_messages && q.bytes.saturating_add(bytes) <= self.max_bytes
    }

    /// Whether a message of `bytes` may join `key`'s inbox; `read` counts
    /// what the inbox holds on disk (rows, bytes), asked only when the
    /// kept count is at a limit.
    pub(super) fn admit(
        &self,
        key: &ActorKey,
        bytes: u64,
        read: impl FnOnce() -> Result<(u64, u64), StorageError>,
    ) -> Result<(), TurnError> {
        {
            let counted = self.counted.lock().expect("inbox counts lock");
            match counted.get(key) {
                None => return Ok(()),
                Some(q) if self.fits(q, bytes) => return Ok(()),
                Some(q) if q.read_at.is_some_and(|t| t.elapsed() < RECOUNT) => {
                    return Err(self.full(key, q));
                }
                Some(_) => {}
            }
        }
        // Read without the lock: the rows of one actor, at most its limit.
        let (messages, held) = read()?;
        let q = Queued {
            messages,
            bytes: held,
            read_at: Some(Instant::now()),
        };
        self.counted
            .lock()
            .expect("inbox counts lock")
            .insert(key.clone(), q);
        if self.fits(&q, bytes) {
            Ok(())
        } else {
            Err(self.full(key, &q))
        }
    }

    /// A message of `bytes` joined `key`'s inbox.
    pub(super) fn queued(&self, key: &ActorKey, bytes: u64) {
        let mut counted = self.counted.lock().expect("inbox counts lock");
        if counted.len() >= MAX_COUNTED && !counted.contains_key(key) {
            // Starting over only lowers counts: limits are checked later,
            // never wrongly sooner.
            counted.clear();
        }
        let q = counted.entry(key.clone()).or_insert(Queued {
            messages: 0,
            bytes: 0,
            read_at: None,
        });
        q.messages += 1;
        q.bytes = q.bytes.saturating_add(bytes);
    }

    fn full(&self, key: &ActorKey, q: &Queued) -> TurnError {
        TurnError::InboxFull(format!(
            "actor {key} has {} durable messages ({} bytes) queued; an actor may hold \
             {} messages and {} bytes (limits.max_inbox_messages, limits.max_inbox_bytes)",
            q.messages, q.bytes, self.max_messages, self.max_bytes
        ))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

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
        // Counted as queued, no read while under the limits.
        for _ in 0..3 {
            inboxes.admit(&key, 10, read(0, 0)).unwrap();
            inboxes.queued(&key, 10);
        }
        assert_eq!(reads.get(), 0);
        // At the limit: read; the actor ran two of them meanwhile.
        inboxes.admit(&key, 10, read(1, 10)).unwrap();
        assert_eq!(reads.get(), 1);
        inboxes.queued(&key, 10);
        inboxes.queued(&key, 10);
        // At the limit again within the second: refused without a read.
        let e = inboxes.admit(&key, 10, read(0, 0)).unwrap_err();
        assert_eq!(e.code(), "inbox_full");
        assert!(e.to_string().contains("limits.max_inbox_messages"), "{e}");
        assert_eq!(reads.get(), 1);
        // A second later it is read again: full for real, refused.
        let later = |q: &mut Queued| q.read_at = Some(Instant::now() - RECOUNT);
        later(inboxes.counted.lock().unwrap().get_mut(&key).unwrap());
        assert!(inboxes.admit(&key, 10, read(3, 30)).is_err());
        assert_eq!(reads.get(), 2);
        // Drained meanwhile: admitted.
        later(inboxes.counted.lock().unwrap().get_mut(&key).unwrap());
        assert!(inboxes.admit(&key, 10, read(0, 0)).is_ok());
        assert_eq!(reads.get(), 3);
        // Bytes count too.
        let other = ActorKey::new("t", "b").unwrap();
        inboxes.queued(&other, 995);
        assert!(inboxes.admit(&other, 5, read(1, 995)).is_ok());
        assert!(inboxes.admit(&other, 6, read(1, 995)).is_err());
        assert_eq!(reads.get(), 4);
    }
}
