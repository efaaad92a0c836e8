//! What a guest may know about the running turn.

use crate::bindings::marmot::actor::turn as host;

/// How many times this delivery was started before and may have been cut
/// off by a crash: 0 on its first run. Counted durably for messages in the
/// durable inbox (`?wait=false`, `actors::send`); other deliveries say 0.
///
/// A side effect outside the turn's transaction (a fetch, a model call) may
/// already have happened when this is above 0: check before repeating it.
pub fn attempt() -> u32 {
    host::attempt()
}
