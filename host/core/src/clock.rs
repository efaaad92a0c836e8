//! Wall-clock time as the node sees it.
//!
//! Everything that compares against wall time (alarms, idempotency expiry,
//! event ages, webhook timestamps) and the guests' WASI wall clock read it
//! here. `MARMOT_CLOCK_OFFSET_MS` shifts it, so tests can move a node into
//! the future — "the node was down for an hour" — without waiting.

use std::sync::OnceLock;
use std::time::{SystemTime, UNIX_EPOCH};

/// Environment variable that shifts the node's wall clock (tests only).
pub const CLOCK_OFFSET_ENV: &str = "MARMOT_CLOCK_OFFSET_MS";

/// The configured offset in milliseconds (may be negative).
pub fn offset_ms() -> i64 {
    static OFFSET: OnceLock<i64> = OnceLock::new();
    *OFFSET.get_or_init(|| {
        std::env::var(CLOCK_OFFSET_ENV)
            .ok()
            .and_then(|v| v.trim().parse().ok())
            .unwrap_or(0)
    })
}

/// Milliseconds since the Unix epoch.
pub fn now_ms() -> u64 {
    let real = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_millis() as i64)
        .unwrap_or(0);
    (real + offset_ms()).max(0) as u64
}
