//! Host implementations of the `marmot:actor` imports, one module per WIT
//! interface. Each function starts at [`Host::enter`](super::host::Host),
//! the one checkpoint for limits and accounting.

mod actors;
mod alarms;
mod events;
mod inputs;
mod js_module;
mod log;
mod pending;
mod state;

use super::bindings::GuestError;
use super::host::Host;
use super::turn::Refusal;

impl super::bindings::marmot::actor::types::Host for Host {}

impl From<Refusal> for GuestError {
    fn from(r: Refusal) -> Self {
        match r {
            Refusal::Invalid(m) => GuestError::Invalid(m),
            Refusal::Limit(m) => GuestError::LimitExceeded(m),
        }
    }
}
