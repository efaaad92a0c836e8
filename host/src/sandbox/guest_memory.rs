//! The node's bound on guest memory growth.
//!
//! Each store has its own limit (the type's `max_memory_bytes`), but
//! 10,000 active actors each allowed 32–64 MiB could ask for far more than
//! the host has, and the kernel's answer to that is to kill the whole node
//! (every actor, every connection). So the node also keeps one budget for
//! all of them: the linear memory live guests have grown past the size
//! they were instantiated with. A memory's starting size is the pool plan's
//! to bound ([`pool`](super::pool) plans ~64 KB resident per Rust instance
//! and ~640 KB per JavaScript sandbox); what the guests then ask for at run
//! time is charged here, and handed back when the instance is dropped
//! (its pages are discarded with it).
//!
//! A growth that does not fit traps the turn with [`MemoryExhausted`]: the
//! turn changes nothing (it never commits), the caller gets 503
//! `overloaded`, and idle actors holding grown memory are asked to
//! hibernate so the next attempt finds room.
//!
//! Growth is counted in bytes made accessible, not pages touched: a guest
//! that grows its memory by 20 MiB and writes one page is charged 20 MiB.
//! That is the bound a guest controls, and what it may touch at any moment.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

use wasmtime::{ResourceLimiter, StoreLimits};

/// The node-wide budget.
#[derive(Debug)]
pub struct GuestMemory {
    limit: u64,
    used: AtomicU64,
    refused: AtomicU64,
}

/// A growth the node's budget could not take.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
#[error(
    "the node's guest memory is exhausted: growing by {asked} bytes would pass the node's \
     budget of {limit} bytes ({used} in use by live actors; limits.guest_memory_budget_bytes)"
)]
pub struct MemoryExhausted {
    /// Bytes the guest asked for.
    pub asked: u64,
    /// Bytes charged when it asked.
    pub used: u64,
    /// The budget.
    pub limit: u64,
}

impl GuestMemory {
    /// A budget of `limit` bytes.
    pub fn new(limit: u64) -> Arc<Self> {
        Arc::new(Self {
            limit,
            used: AtomicU64::new(0),
            refused: AtomicU64::new(0),
        })
    }

    /// The budget.
    pub fn limit(&self) -> u64 {
        self.limit
    }

    /// Bytes charged now.
    pub fn used(&self) -> u64 {
        self.used.load(Ordering::Relaxed)
    }

    /// Growths refused since start.
    pub fn refused(&self) -> u64 {
        self.refused.load(Ordering::Relaxed)
    }

    fn charge(&self, bytes: u64) -> Result<(), MemoryExhausted> {
        self.used
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |used| {
                used.checked_add(bytes).filter(|&n| n <= self.limit)
            })
            .map(drop)
            .map_err(|used| {
                self.refused.fetch_add(1, Ordering::Relaxed);
                MemoryExhausted {
                    asked: bytes,
                    used,
                    limit: self.limit,
                }
            })
    }

    fn release(&self, bytes: u64) {
        self.used.fetch_sub(bytes, Ordering::AcqRel);
    }
}

/// The resource limiter of one store: its own limits first, then the
/// node's budget for what it grows at run time.
pub(super) struct GuestLimits {
    own: StoreLimits,
    /// The store's memory limit.
    max_memory: usize,
    node: Option<Arc<GuestMemory>>,
    /// Instantiation is over: from now on a memory's size only grows.
    running: bool,
    /// Bytes this store holds of the node's budget.
    held: u64,
    /// Bytes its memories grew by since instantiation.
    grown: u64,
}

impl GuestLimits {
    /// `own` limits, charging growth to `node` if given.
    pub(super) fn new(own: StoreLimits, max_memory: usize, node: Option<Arc<GuestMemory>>) -> Self {
        Self {
            own,
            max_memory,
            node,
            running: false,
            held: 0,
            grown: 0,
        }
    }

    /// The store's instance is made. Until now a call with a current size
    /// of 0 was a memory being created at its declared minimum, which is
    /// not charged; after it, every growth is, from 0 too.
    pub(super) fn instantiated(&mut self) {
        self.running = true;
    }

    /// Bytes of the node's budget this store holds.
    pub(super) fn held(&self) -> u64 {
        self.held
    }

    /// The store's memory limit.
    pub(super) fn max_memory(&self) -> usize {
        self.max_memory
    }

    /// Bytes its memories grew by since instantiation (a high-water mark:
    /// wasm memory never shrinks).
    pub(super) fn grown(&self) -> u64 {
        self.grown
    }
}

impl ResourceLimiter for GuestLimits {
    fn memory_growing(
        &mut self,
        current: usize,
        desired: usize,
        maximum: Option<usize>,
    ) -> wasmtime::Result<bool> {
        let allowed = self.own.memory_growing(current, desired, maximum);
        if current == 0 && !self.running && allowed.is_err() {
            // A memory declared larger than the limit, being created ("forcing
            // trap when growing memory" read as bad code, at deploy and at
            // every wake). Growth past it later stays wasmtime's trap, which
            // the preload check reads as running out of memory.
            return Err(wasmtime::Error::msg(format!(
                "the module needs {desired} bytes of memory to start, more than its memory \
                 limit (the type's config.max_memory_bytes, else the node's \
                 defaults.max_memory_bytes or defaults.js_max_memory_bytes): growing memory \
                 to that was refused"
            )));
        }
        // Past the limit while running: said with the limit (wasmtime's
        // "forcing trap when growing memory to 64552960 bytes" read as if
        // that were the limit; a probe). The words "growing memory" are
        // what trap reports key on.
        let allowed = allowed.map_err(|_| {
            wasmtime::Error::msg(format!(
                "growing memory to {desired} bytes passes the limit of {} bytes (the type's \
                 config.max_memory_bytes)",
                self.max_memory
            ))
        });
        if !allowed? {
            return Ok(false);
        }
        let creating = current == 0 && !self.running;
        if !creating {
            self.grown += desired.saturating_sub(current) as u64;
        }
        if let Some(node) = self.node.as_ref().filter(|_| !creating) {
            let asked = desired.saturating_sub(current) as u64;
            node.charge(asked).map_err(wasmtime::Error::new)?;
            self.held += asked;
        }
        Ok(true)
    }

    // A failed growth traps (`trap_on_grow_failure`), so the store is
    // dropped with what it was charged: nothing to hand back here.
    fn memory_grow_failed(&mut self, error: wasmtime::Error) -> wasmtime::Result<()> {
        self.own.memory_grow_failed(error)
    }

    fn table_growing(
        &mut self,
        current: usize,
        desired: usize,
        maximum: Option<usize>,
    ) -> wasmtime::Result<bool> {
        self.own.table_growing(current, desired, maximum)
    }

    fn table_grow_failed(&mut self, error: wasmtime::Error) -> wasmtime::Result<()> {
        self.own.table_grow_failed(error)
    }

    fn instances(&self) -> usize {
        self.own.instances()
    }

    fn tables(&self) -> usize {
        self.own.tables()
    }

    fn memories(&self) -> usize {
        self.own.memories()
    }
}

impl Drop for GuestLimits {
    fn drop(&mut self) {
        if let Some(node) = &self.node {
            node.release(self.held);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use wasmtime::StoreLimitsBuilder;

    const MIB: usize = 1 << 20;

    fn limits(node: &Arc<GuestMemory>, own_max: usize) -> GuestLimits {
        let own = StoreLimitsBuilder::new()
            .memory_size(own_max)
            .trap_on_grow_failure(true)
            .build();
        GuestLimits::new(own, own_max, Some(node.clone()))
    }

    #[test]
    fn growth_is_charged_and_handed_back_when_the_store_goes() {
        let node = GuestMemory::new(10 * MIB as u64);
        let mut a = limits(&node, 64 * MIB);
        // Creating a memory at its minimum is not charged.
        assert!(a.memory_growing(0, 2 * MIB, None).unwrap());
        assert_eq!(node.used(), 0);
        a.instantiated();
        assert!(a.memory_growing(2 * MIB, 6 * MIB, None).unwrap());
        assert_eq!((node.used(), a.held()), (4 << 20, 4 << 20));
        let mut b = limits(&node, 64 * MIB);
        b.instantiated();
        // A memory that starts empty is charged from its first growth.
        assert!(b.memory_growing(0, 5 * MIB, None).unwrap());
        assert_eq!(node.used(), 9 << 20);
        // Past the budget: a trap naming it, nothing charged.
        let err = b.memory_growing(5 * MIB, 7 * MIB, None).unwrap_err();
        let exhausted = err.downcast_ref::<MemoryExhausted>().expect("typed");
        assert_eq!(
            *exhausted,
            MemoryExhausted {
                asked: 2 << 20,
                used: 9 << 20,
                limit: 10 << 20
            }
        );
        assert_eq!((node.used(), node.refused()), (9 << 20, 1));
        drop(a);
        assert_eq!(node.used(), 5 << 20);
        assert!(b.memory_growing(5 * MIB, 7 * MIB, None).unwrap());
        drop(b);
        assert_eq!(node.used(), 0);
    }

    #[test]
    fn the_stores_own_limit_comes_first() {
        let node = GuestMemory::new(100 * MIB as u64);
        let mut a = limits(&node, 4 * MIB);
        a.instantiated();
        let err = a.memory_growing(MIB, 8 * MIB, None).unwrap_err();
        assert!(err.downcast_ref::<MemoryExhausted>().is_none(), "{err:#}");
        assert_eq!((node.used(), node.refused()), (0, 0));
    }
}
