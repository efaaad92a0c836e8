//! `marmot:actor/events`: append to the actor's event log with the turn.

use super::super::turn::Refusal;
use super::Cap;
use crate::sandbox::bindings::GuestError;
use crate::sandbox::bindings::marmot::actor::events;
use crate::sandbox::host::Host;

/// Limits of the events capability.
#[derive(Debug, Clone, Copy)]
pub struct EventLimits {
    /// Largest event payload.
    pub max_event_bytes: usize,
    /// Events one turn may emit.
    pub max_events_per_turn: usize,
}

/// The events part of a turn: what it emitted, in order.
pub struct EventsCtx {
    limits: EventLimits,
    /// Emitted events: (kind, JSON data).
    events: Vec<(String, Vec<u8>)>,
    /// Seq the next emitted event gets.
    next_seq: u64,
}

impl EventsCtx {
    /// Events of an actor whose last event is `last_seq`.
    pub(crate) fn new(limits: EventLimits, last_seq: u64) -> Self {
        Self {
            limits,
            events: Vec::new(),
            next_seq: last_seq + 1,
        }
    }

    /// Buffer an event; returns its seq.
    pub fn emit(&mut self, kind: String, data: Vec<u8>) -> Result<u64, Refusal> {
        if kind.is_empty() || kind.len() > 128 || kind.chars().any(char::is_control) {
            return Err(Refusal::Invalid(
                "event kind must be 1 to 128 bytes without control characters".into(),
            ));
        }
        if data.len() > self.limits.max_event_bytes {
            return Err(Refusal::Limit(format!(
                "event data of {} bytes exceeds the limit of {} bytes",
                data.len(),
                self.limits.max_event_bytes
            )));
        }
        if self.events.len() >= self.limits.max_events_per_turn {
            return Err(Refusal::Limit(format!(
                "a turn may emit at most {} events",
                self.limits.max_events_per_turn
            )));
        }
        if serde_json::from_slice::<serde::de::IgnoredAny>(&data).is_err() {
            return Err(Refusal::Invalid("event data must be JSON".into()));
        }
        // Clients, streams and webhooks read it as UTF-8 JSON, which has no
        // place for a JavaScript string's lone surrogates: U+FFFD instead.
        let data = std::str::from_utf8(&data)
            .ok()
            .and_then(crate::json::without_lone_surrogates)
            .map_or(data, String::into_bytes);
        let seq = self.next_seq;
        self.next_seq += 1;
        self.events.push((kind, data));
        Ok(seq)
    }

    /// How many events a rollback to this point keeps.
    pub(crate) fn savepoint(&self) -> usize {
        self.events.len()
    }

    /// Drop the events emitted since `sp`.
    pub(crate) fn rollback(&mut self, sp: usize) {
        let dropped = self.events.len().saturating_sub(sp) as u64;
        self.events.truncate(sp);
        self.next_seq -= dropped;
    }

    /// The events to commit, in order.
    pub(crate) fn finish(self) -> Vec<(String, Vec<u8>)> {
        self.events
    }
}

impl events::Host for Host {
    fn emit(&mut self, kind: String, data: Vec<u8>) -> wasmtime::Result<Result<u64, GuestError>> {
        let turn = self.enter(Cap::Events)?;
        Ok(turn.events.emit(kind, data).map_err(Into::into))
    }
}
