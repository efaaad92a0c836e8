//! How many instances a node can hold, decided once at start-up from what
//! the host allows.
//!
//! Rust actors and JavaScript sandboxes share one pooling allocator. Every
//! slot of it costs kernel memory mappings (VMAs) up front — its fiber
//! stack and guard page — and every live instance a few more, so the pool
//! is bounded by `vm.max_map_count` as well as by the configured active
//! cap. JavaScript sandboxes are the large instances (about 0.6 MB resident
//! each, against ~60 KB for a Rust actor), so their count is bounded by the
//! host's memory. [`PoolPlan::new`] takes the smallest of the bounds and
//! says which one it was; the node logs that in one line.
//!
//! The same plan gives the node's other memory bounds their share of the
//! host's memory, unless configured: what all guests may grow
//! ([`guest_memory`](super::guest_memory)), what all state caches may hold
//! and what request bodies may be held at once (docs/design.md, "Memory
//! bounds").

use std::sync::Arc;
use std::sync::atomic::{AtomicU32, Ordering};

use crate::config::Limits;

/// Memory mappings (VMAs) taken by every pool slot, used or not: its fiber
/// stack and guard page, mapped when the engine is built.
const MAPS_PER_SLOT: u64 = 2;
/// Memory mappings a memory slot takes at most once an instance used it:
/// the accessible part, the copy-on-write image inside it (a Rust actor's
/// data sits past its stack, so the image splits the accessible part in
/// two) and the guard. The slot keeps them after its instance is gone
/// (wasmtime keeps the image for the next instance of the module), so the
/// engine has exactly one memory slot per pool slot (`pooling`). Measured
/// with `/proc/PID/maps` (`marmot bench rss-active` and `js-rss` print the
/// count): 4 per Rust actor, 3 per JavaScript sandbox (its snapshot image
/// starts at address 0).
const MAPS_PER_LIVE: u64 = 4;
/// Everything else of the process: binary, libraries, heap, threads.
const MAPS_BESIDES_POOL: u64 = 4096;
/// The smallest pool, whatever the configuration.
const MIN_POOL: u32 = 16;
/// The share of the host's memory that instances may plan to fill.
const MEMORY_SHARE: u64 = 2;
/// Planned resident memory of a live Rust instance (measured ~62 KB).
const BYTES_PER_INSTANCE: u64 = 64 << 10;
/// Planned resident memory of a live JavaScript sandbox (measured ~590 KB).
const BYTES_PER_JS_SANDBOX: u64 = 640 << 10;
/// The share of the host's memory that guests may grow their memories by,
/// all together (see [`guest_memory`](super::guest_memory)): a third, next
/// to the half planned for instances as they start, so that what is left
/// holds the host's own heap, the storage cache and the page cache.
const GUEST_GROWTH_SHARE: u64 = 3;
/// The share of the host's memory the actors' state caches may hold
/// together (see `actor/caches.rs`).
const STATE_CACHE_SHARE: u64 = 8;
/// The share of the host's memory that request bodies may hold together
/// (see `api/bodies.rs`).
const REQUEST_BODY_SHARE: u64 = 16;
/// The share of the host's memory that buffered outbound response bodies
/// may hold together (see `egress/budget.rs`).
const EGRESS_RESPONSE_SHARE: u64 = 16;
/// The share of the host's memory that client connections may hold
/// together, at their planned worst case (see `api/listen.rs`).
const CONNECTION_SHARE: u64 = 16;
/// Planned worst-case memory of a client connection (`api/listen.rs`).
const BYTES_PER_CONNECTION: u64 = 64 << 10;
/// Client connections allowed whatever the memory.
const MIN_CONNECTIONS: u64 = 256;
/// File descriptors kept from client connections for everything else a
/// node opens (module memory images, outbound requests, peers, files): a
/// quarter of the open-files limit, at least this many.
const FDS_BESIDES_CONNECTIONS: u64 = 1024;

/// What the host allows, read at start-up.
#[derive(Debug, Clone, Copy, Default)]
pub struct HostLimits {
    /// `vm.max_map_count`, if readable.
    pub max_map_count: Option<u64>,
    /// Memory the process may use: the machine's, or its cgroup's limit
    /// when lower.
    pub memory_bytes: Option<u64>,
    /// The process's open-files limit (soft, as raised at start-up).
    pub open_files: Option<u64>,
}

impl HostLimits {
    /// Read the limits of this host (Linux `/proc`, and the cgroup the
    /// process runs in, v1 or v2).
    pub fn read() -> Self {
        let max_map_count = std::fs::read_to_string("/proc/sys/vm/max_map_count")
            .ok()
            .and_then(|s| s.trim().parse().ok());
        let total = std::fs::read_to_string("/proc/meminfo").ok().and_then(|s| {
            s.lines()
                .find_map(|l| l.strip_prefix("MemTotal:"))
                .and_then(|v| v.trim().trim_end_matches("kB").trim().parse::<u64>().ok())
                .map(|kb| kb * 1024)
        });
        let cgroup = super::cgroup::memory_limit();
        let memory_bytes = match (total, cgroup) {
            (Some(t), Some(c)) => Some(t.min(c)),
            (t, c) => t.or(c),
        };
        // "Max open files  <soft>  <hard>  files"
        let open_files = std::fs::read_to_string("/proc/self/limits")
            .ok()
            .and_then(|s| {
                s.lines()
                    .find_map(|l| l.strip_prefix("Max open files"))
                    .and_then(|v| v.split_whitespace().next())
                    .and_then(|soft| soft.parse().ok())
            });
        Self {
            max_map_count,
            memory_bytes,
            open_files,
        }
    }
}

/// Client connections the open-files limit leaves room for: what is left
/// after a quarter of it (at least [`FDS_BESIDES_CONNECTIONS`]), and never
/// less than half of it. Past it the accept loop fails with "too many open
/// files" and the idlest connection is never closed to make room (a probe
/// held 20,000 idle connections on a node whose memory allowed 24,151: new
/// clients timed out, and a new type's first message failed for want of a
/// memfd).
fn connections_for_fds(open_files: u64) -> u64 {
    let besides = (open_files / 4).max(FDS_BESIDES_CONNECTIONS);
    open_files.saturating_sub(besides).max(open_files / 2)
}

/// The instance pool sized for `max_active` active actors: a little
/// headroom over the cap for evals and for actors still leaving when
/// others arrive (eviction is asynchronous; a waking actor that finds the
/// pool full makes room and retries).
fn pool_for_active(max_active: usize) -> u64 {
    max_active as u64 + max_active as u64 / 100 + 64
}

/// The most active actors a pool of `slots` serves (inverse of
/// [`pool_for_active`]).
fn active_for_pool(slots: u64) -> usize {
    (slots.saturating_sub(64) * 100 / 101).max(1) as usize
}

/// What bounded a size.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Bound {
    /// The configuration (`limits.max_active_actors` or
    /// `limits.max_js_sandboxes`).
    Config,
    /// The kernel's `vm.max_map_count`.
    MapCount,
    /// The host's (or cgroup's) memory.
    Memory,
}

impl Bound {
    /// How the log line names it.
    pub fn label(self) -> &'static str {
        match self {
            Bound::Config => "configuration",
            Bound::MapCount => "vm.max_map_count",
            Bound::Memory => "memory",
        }
    }
}

/// The pool the node runs with.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PoolPlan {
    /// Slots of the shared instance pool.
    pub slots: u32,
    /// Active actors at most (the configured cap, or less when the pool
    /// had to be smaller): never more active actors than slots, so active
    /// actors do not evict each other's instances.
    pub max_active: usize,
    /// JavaScript sandboxes live at once at most.
    pub js_sandboxes: u32,
    /// What bounded `slots`.
    pub slots_bound: Bound,
    /// What bounded `js_sandboxes`.
    pub js_bound: Bound,
    /// Memory mappings the full pool needs.
    pub maps_needed: u64,
    /// Bytes all live guests may grow their memories by (`u64::MAX`: no
    /// bound, the host's memory being unknown).
    pub guest_memory: u64,
    /// What bounded `guest_memory`.
    pub guest_memory_bound: Bound,
    /// Bytes the actors' state caches may hold together (`u64::MAX`: no
    /// bound, the host's memory being unknown).
    pub state_cache: u64,
    /// Bytes of request bodies the node may hold at once (`u64::MAX`: no
    /// bound).
    pub request_bodies: u64,
    /// Bytes of outbound response bodies the node may buffer at once
    /// (`u64::MAX`: no bound).
    pub egress_responses: u64,
    /// Client connections open at once at most (`usize::MAX`: no bound).
    pub connections: usize,
}

impl PoolPlan {
    /// Size the pool for `max_active` actors and `max_js` JavaScript
    /// sandboxes (`None`: as many as memory allows) on `host`, and the
    /// memory budgets of `limits` (unset: a share of the host's memory).
    pub fn new(limits: &Limits, host: &HostLimits) -> Self {
        let (max_active, max_js) = (limits.max_active_actors, limits.max_js_sandboxes);
        let wanted = pool_for_active(max_active);
        let mut slots = wanted;
        let mut slots_bound = Bound::Config;
        if let Some(limit) = host.max_map_count {
            let fit = limit.saturating_sub(MAPS_BESIDES_POOL) / (MAPS_PER_SLOT + MAPS_PER_LIVE);
            if fit < slots {
                slots = fit;
                slots_bound = Bound::MapCount;
            }
        }
        let share = host.memory_bytes.map(|m| m / MEMORY_SHARE);
        if let Some(fit) = share.map(|s| s / BYTES_PER_INSTANCE)
            && fit < slots
        {
            slots = fit;
            slots_bound = Bound::Memory;
        }
        let slots = slots.clamp(u64::from(MIN_POOL), u64::from(u32::MAX)) as u32;
        let max_active = if slots_bound == Bound::Config {
            max_active
        } else {
            active_for_pool(u64::from(slots)).min(max_active)
        };
        let (js, js_bound) = match max_js {
            Some(n) if n < slots => (n, Bound::Config),
            Some(_) => (slots, slots_bound),
            None => match share.map(|s| s / BYTES_PER_JS_SANDBOX) {
                Some(fit) if fit < u64::from(slots) => (fit as u32, Bound::Memory),
                _ => (slots, slots_bound),
            },
        };
        // A configured budget, else `1 / share` of the memory, else none.
        let budget = |configured: Option<u64>, share: u64| {
            configured
                .or(host.memory_bytes.map(|m| m / share))
                .unwrap_or(u64::MAX)
        };
        let guest_memory = budget(limits.guest_memory_budget_bytes, GUEST_GROWTH_SHARE);
        let guest_memory_bound = match (limits.guest_memory_budget_bytes, host.memory_bytes) {
            (None, Some(_)) => Bound::Memory,
            _ => Bound::Config,
        };
        let state_cache = budget(limits.state_cache_budget_bytes, STATE_CACHE_SHARE);
        let request_bodies = budget(limits.request_body_budget_bytes, REQUEST_BODY_SHARE);
        let egress_responses = budget(limits.egress_response_budget_bytes, EGRESS_RESPONSE_SHARE);
        let connections = match (limits.max_connections, host.memory_bytes) {
            // As configured, within what the open-files limit allows.
            (Some(n), _) => host
                .open_files
                .map(connections_for_fds)
                .and_then(|fit| usize::try_from(fit).ok())
                .map_or(n, |fit| n.min(fit)),
            (None, memory) => {
                let by_memory = memory
                    .map(|m| (m / CONNECTION_SHARE / BYTES_PER_CONNECTION).max(MIN_CONNECTIONS));
                let by_fds = host.open_files.map(connections_for_fds);
                match by_memory.into_iter().chain(by_fds).min() {
                    Some(fit) => usize::try_from(fit).unwrap_or(usize::MAX),
                    None => usize::MAX,
                }
            }
        };
        Self {
            slots,
            max_active,
            js_sandboxes: js.max(MIN_POOL).min(slots),
            slots_bound,
            js_bound,
            maps_needed: maps_needed(u64::from(slots)),
            guest_memory,
            guest_memory_bound,
            state_cache,
            request_bodies,
            egress_responses,
            connections,
        }
    }

    /// Say what was chosen and why, in one line: a warning when the host
    /// made the node smaller than configured.
    pub fn log(&self, configured_active: usize, host: &HostLimits) {
        let (slots, active, js) = (self.slots, self.max_active, self.js_sandboxes);
        let (slots_by, js_by) = (self.slots_bound.label(), self.js_bound.label());
        let (maps, map_limit) = (self.maps_needed, host.max_map_count);
        let memory_mb = host.memory_bytes.map(|b| b >> 20);
        let guest_memory_mb = (self.guest_memory != u64::MAX).then_some(self.guest_memory >> 20);
        let guest_memory_by = self.guest_memory_bound.label();
        let state_cache_mb = (self.state_cache != u64::MAX).then_some(self.state_cache >> 20);
        let request_bodies_mb =
            (self.request_bodies != u64::MAX).then_some(self.request_bodies >> 20);
        let egress_responses_mb =
            (self.egress_responses != u64::MAX).then_some(self.egress_responses >> 20);
        let max_connections = (self.connections != usize::MAX).then_some(self.connections);
        if active < configured_active {
            tracing::warn!(
                slots,
                max_active = active,
                configured_max_active = configured_active,
                slots_bound = slots_by,
                js_sandboxes = js,
                js_bound = js_by,
                maps_needed = maps,
                max_map_count = map_limit,
                memory_mb,
                guest_memory_mb,
                guest_memory_bound = guest_memory_by,
                state_cache_mb,
                request_bodies_mb,
                egress_responses_mb,
                max_connections,
                open_files = host.open_files,
                "instance pool smaller than limits.max_active_actors asks: the host allows \
                 fewer; raise vm.max_map_count (sysctl -w vm.max_map_count=N) or memory, \
                 or lower the limit"
            );
        } else {
            tracing::info!(
                slots,
                max_active = active,
                slots_bound = slots_by,
                js_sandboxes = js,
                js_bound = js_by,
                maps_needed = maps,
                max_map_count = map_limit,
                memory_mb,
                guest_memory_mb,
                guest_memory_bound = guest_memory_by,
                state_cache_mb,
                request_bodies_mb,
                egress_responses_mb,
                max_connections,
                open_files = host.open_files,
                "instance pool sized"
            );
        }
    }
}

/// A live JavaScript sandbox, counted against the node's cap while it
/// lives.
pub(super) struct JsSlot(Arc<AtomicU32>);

impl JsSlot {
    /// Count one more sandbox in `live`, unless `cap` are live already.
    pub(super) fn take(live: &Arc<AtomicU32>, cap: u32) -> Option<Self> {
        live.fetch_update(Ordering::AcqRel, Ordering::Acquire, |n| {
            (n < cap).then_some(n + 1)
        })
        .ok()?;
        Some(Self(live.clone()))
    }
}

impl Drop for JsSlot {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::AcqRel);
    }
}

/// Memory mappings of the node with a full pool of `slots`.
fn maps_needed(slots: u64) -> u64 {
    slots * (MAPS_PER_SLOT + MAPS_PER_LIVE) + MAPS_BESIDES_POOL
}

#[cfg(test)]
mod tests {
    use super::*;

    const GIB: u64 = 1 << 30;

    /// The plan for these limits, the others at their defaults.
    fn plan(active: usize, js: Option<u32>, guest: Option<u64>, host: &HostLimits) -> PoolPlan {
        let limits = Limits {
            max_active_actors: active,
            max_js_sandboxes: js,
            guest_memory_budget_bytes: guest,
            ..Limits::default()
        };
        PoolPlan::new(&limits, host)
    }

    fn host(maps: u64, memory: u64) -> HostLimits {
        HostLimits {
            max_map_count: Some(maps),
            memory_bytes: Some(memory),
            open_files: None,
        }
    }

    #[test]
    fn connections_fit_the_open_files_limit_too() {
        let l = Limits::default();
        let by_memory = PoolPlan::new(&l, &host(65_530, 24 * GIB)).connections;
        assert_eq!(by_memory, 24_576);
        let with_fds = |n| {
            let h = HostLimits {
                open_files: Some(n),
                ..host(65_530, 24 * GIB)
            };
            PoolPlan::new(&l, &h).connections
        };
        // The probe's machine: 20,000 open files.
        assert_eq!(with_fds(20_000), 15_000);
        assert_eq!(with_fds(1 << 20), by_memory);
        assert_eq!(with_fds(4096), 3072);
        assert_eq!(with_fds(1024), 512);
        // A configured cap is taken as given, within the open-files
        // limit: past it, accepts and sandboxes failed for want of
        // descriptors (found by a probe).
        let configured = |n| Limits {
            max_connections: Some(n),
            ..Limits::default()
        };
        let h = HostLimits {
            open_files: Some(20_000),
            ..host(65_530, 24 * GIB)
        };
        assert_eq!(PoolPlan::new(&configured(50_000), &h).connections, 15_000);
        assert_eq!(PoolPlan::new(&configured(100), &h).connections, 100);
        let unknown = host(65_530, 24 * GIB);
        assert_eq!(
            PoolPlan::new(&configured(50_000), &unknown).connections,
            50_000
        );
    }

    #[test]
    fn the_defaults_fit_a_default_kernel_unchanged() {
        // `marmot dev` with the default limits on Linux's default
        // vm.max_map_count (65,530) and a 24 GiB machine: every configured
        // active actor gets a slot, JavaScript ones included.
        let l = Limits::default();
        let plan = PoolPlan::new(&l, &host(65_530, 24 * GIB));
        assert_eq!(plan.max_active, l.max_active_actors);
        assert_eq!(u64::from(plan.slots), pool_for_active(l.max_active_actors));
        assert_eq!(plan.js_sandboxes, plan.slots);
        assert!(plan.maps_needed <= 65_530, "{plan:?}");
        assert_eq!(plan.slots_bound, Bound::Config);
    }

    #[test]
    fn a_low_map_limit_shrinks_the_pool_and_the_active_cap_with_it() {
        let plan = plan(10_000, None, None, &host(30_000, 64 * GIB));
        assert_eq!(plan.slots_bound, Bound::MapCount);
        assert!(plan.maps_needed <= 30_000, "{plan:?}");
        assert!(plan.max_active < 10_000);
        assert!(pool_for_active(plan.max_active) <= u64::from(plan.slots));
    }

    #[test]
    fn small_memory_bounds_javascript_sandboxes_first() {
        // 1 GiB: half of it for instances, ~640 KB per sandbox.
        let plan = plan(10_000, None, None, &host(65_530, GIB));
        assert_eq!(plan.js_bound, Bound::Memory);
        assert_eq!(plan.js_sandboxes, 819);
        assert_eq!(plan.slots, 8_192);
        assert_eq!(plan.max_active, 8_047);
        assert_eq!(plan.slots_bound, Bound::Memory);
    }

    #[test]
    fn a_configured_javascript_cap_is_kept_but_never_above_the_pool() {
        let h = host(65_530, 64 * GIB);
        assert_eq!(plan(100, Some(20), None, &h).js_sandboxes, 20);
        assert_eq!(plan(100, Some(1), None, &h).js_sandboxes, MIN_POOL);
        let p = plan(100, Some(1_000_000), None, &h);
        assert_eq!(p.js_sandboxes, p.slots);
    }

    #[test]
    fn javascript_slots_stop_at_the_cap_and_come_back_when_dropped() {
        let live = Arc::new(AtomicU32::new(0));
        let a = JsSlot::take(&live, 2).unwrap();
        let _b = JsSlot::take(&live, 2).unwrap();
        assert!(JsSlot::take(&live, 2).is_none());
        drop(a);
        assert!(JsSlot::take(&live, 2).is_some());
        assert_eq!(live.load(Ordering::Relaxed), 1);
    }

    #[test]
    fn unknown_limits_leave_the_configuration_alone() {
        let plan = plan(500, None, None, &HostLimits::default());
        assert_eq!(plan.max_active, 500);
        assert_eq!(u64::from(plan.slots), pool_for_active(500));
        assert_eq!(plan.guest_memory, u64::MAX, "no memory known, no bound");
        assert_eq!(plan.state_cache, u64::MAX);
        assert_eq!(plan.request_bodies, u64::MAX);
        assert_eq!(plan.egress_responses, u64::MAX);
        assert_eq!(plan.connections, usize::MAX);
    }

    #[test]
    fn memory_budgets_take_shares_of_memory_unless_configured() {
        let p = plan(10_000, None, None, &host(65_530, 3 * GIB));
        assert_eq!((p.guest_memory, p.guest_memory_bound), (GIB, Bound::Memory));
        assert_eq!(p.state_cache, 3 * GIB / 8);
        assert_eq!(p.request_bodies, 3 * GIB / 16);
        assert_eq!(p.egress_responses, 3 * GIB / 16);
        assert_eq!(p.connections, 3 * 1024);
        let small = plan(10_000, None, None, &host(65_530, GIB / 8));
        assert_eq!(small.connections, 256, "a floor whatever the memory");
        let p = plan(10_000, None, Some(5 << 20), &host(65_530, 3 * GIB));
        assert_eq!(
            (p.guest_memory, p.guest_memory_bound),
            (5 << 20, Bound::Config)
        );
        let limits = Limits {
            state_cache_budget_bytes: Some(7),
            egress_response_budget_bytes: Some(9),
            max_connections: Some(11),
            ..Limits::default()
        };
        let p = PoolPlan::new(&limits, &host(65_530, 3 * GIB));
        assert_eq!((p.state_cache, p.egress_responses), (7, 9));
        assert_eq!(p.connections, 11);
    }
}
