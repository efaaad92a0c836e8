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
pub mod js;
mod js_module;
pub mod log;
pub mod model;
pub mod state;
pub mod turn;

use super::bindings::GuestError;
use super::host::Host;
use super::turn::Refusal;

impl super::bindings::marmot::actor::types::Host for Host {}

impl From<Refusal> for GuestError {
    fn from(r: Refusal) -> Self {
        match r {
            Refusal::Invalid(m) => GuestError::Invalid(m),
            Refusal::Limit(m) => GuestError::LimitExceeded(m),
            Refusal::NotFound(m) => GuestError::NotFound(m),
        }
    }
}

/// A capability a guest may be granted. An actor's instance has them all;
/// a child JavaScript sandbox (`js.eval`) has the ones its caller names.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Cap {
    /// `state`.
    State,
    /// `events`.
    Events,
    /// `alarms`.
    Alarms,
    /// `inputs`.
    Inputs,
    /// `actors`.
    Actors,
    /// `http`.
    Http,
    /// `files`.
    Files,
    /// `log`.
    Log,
    /// `model`.
    Model,
    /// `js`.
    Js,
}

impl Cap {
    /// Every capability.
    pub const ALL: [Cap; 10] = [
        Cap::State,
        Cap::Events,
        Cap::Alarms,
        Cap::Inputs,
        Cap::Actors,
        Cap::Http,
        Cap::Files,
        Cap::Log,
        Cap::Model,
        Cap::Js,
    ];

    /// Its WIT interface name.
    pub fn name(self) -> &'static str {
        match self {
            Cap::State => "state",
            Cap::Events => "events",
            Cap::Alarms => "alarms",
            Cap::Inputs => "inputs",
            Cap::Actors => "actors",
            Cap::Http => "http",
            Cap::Files => "files",
            Cap::Log => "log",
            Cap::Model => "model",
            Cap::Js => "js",
        }
    }

    /// The capability named `name`.
    pub fn parse(name: &str) -> Option<Self> {
        Self::ALL.into_iter().find(|c| c.name() == name)
    }
}

/// A set of capabilities.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct CapSet(u16);

impl CapSet {
    /// Every capability.
    pub const ALL: CapSet = CapSet(u16::MAX);
    /// None.
    pub const NONE: CapSet = CapSet(0);

    /// This set and `cap`.
    pub fn with(self, cap: Cap) -> Self {
        CapSet(self.0 | 1 << cap as u16)
    }

    /// Whether `cap` is in the set.
    pub fn has(self, cap: Cap) -> bool {
        self.0 & (1 << cap as u16) != 0
    }
}
