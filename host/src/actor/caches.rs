//! The node's bound on what the actors' state caches hold together.
//!
//! An active actor keeps the state values its turns read or wrote, up to
//! 8 MiB, so its next turns need not read them again. 10,000 active
//! actors at that cap would be 80 GB of the host's heap, so the node also
//! keeps a total (`limits.state_cache_budget_bytes`): while the caches
//! together hold more, every actor that trims its cache keeps only what is
//! not yet durable. Actors trim after each turn and once more when they
//! fall idle (with the idle sandbox trim, when their writes are durable),
//! so the total comes back under the budget within seconds, and nothing
//! is lost: a dropped entry is read from disk again when needed.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

/// What all state caches hold, against the budget.
#[derive(Debug)]
pub(crate) struct StateCaches {
    limit: u64,
    used: AtomicU64,
}

impl StateCaches {
    /// A total of `limit` bytes.
    pub(crate) fn new(limit: u64) -> Arc<Self> {
        Arc::new(Self {
            limit,
            used: AtomicU64::new(0),
        })
    }

    /// Bytes cached now.
    pub(crate) fn used(&self) -> u64 {
        self.used.load(Ordering::Relaxed)
    }

    /// The budget.
    pub(crate) fn limit(&self) -> u64 {
        self.limit
    }

    /// The cap for one actor's cache now: `per_actor` while the caches fit
    /// the budget, else 0 (keep only entries not yet durable).
    pub(crate) fn cap(&self, per_actor: usize) -> usize {
        if self.used() > self.limit {
            0
        } else {
            per_actor
        }
    }
}

/// One actor's part of the total, given back when the actor's task ends.
#[derive(Debug)]
pub(crate) struct CacheShare {
    caches: Arc<StateCaches>,
    held: u64,
}

impl CacheShare {
    /// An empty share of `caches`.
    pub(crate) fn new(caches: &Arc<StateCaches>) -> Self {
        Self {
            caches: caches.clone(),
            held: 0,
        }
    }

    /// The actor's cache holds `bytes` now.
    pub(crate) fn set(&mut self, bytes: u64) {
        // Called after every turn: leave the shared counter alone (no
        // atomic write to a line every core touches) when nothing changed.
        if bytes == self.held {
            return;
        }
        if bytes > self.held {
            self.caches
                .used
                .fetch_add(bytes - self.held, Ordering::Relaxed);
        } else {
            self.caches
                .used
                .fetch_sub(self.held - bytes, Ordering::Relaxed);
        }
        self.held = bytes;
    }
}

impl Drop for CacheShare {
    fn drop(&mut self) {
        self.set(0);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn shares_add_up_and_past_the_budget_the_cap_is_zero() {
        let caches = StateCaches::new(100);
        let mut a = CacheShare::new(&caches);
        let mut b = CacheShare::new(&caches);
        a.set(60);
        b.set(40);
        assert_eq!(
            (caches.used(), caches.cap(8)),
            (100, 8),
            "at the budget still fits"
        );
        b.set(41);
        assert_eq!(caches.cap(8), 0);
        a.set(10);
        assert_eq!((caches.used(), caches.cap(8)), (51, 8));
        drop(b);
        assert_eq!(caches.used(), 10);
        drop(a);
        assert_eq!(caches.used(), 0);
    }
}
