//! The `marmot:actor` capabilities, one module per WIT interface. Each
//! holds the capability's part of a turn (its context, limits and what it
//! carries between turns; see [`super::turn`]) and its host functions,
//! which all start at `Host::enter`, the one checkpoint for limits and
//! accounting.

pub mod actors;
pub mod alarms;
pub mod events;
pub mod files;
pub mod http;
pub mod inputs;
mod js_module;
pub mod log;
mod pending;
pub mod state;

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
