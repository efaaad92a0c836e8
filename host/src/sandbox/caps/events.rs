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
    /// Bytes of event data one turn may emit (a thousand events of 256 KiB
    /// were one 250 MB commit, with the node's memory at 1.5 GB and an
    /// unrelated actor's turn waiting four seconds behind it).
    pub max_turn_event_bytes: usize,
}

/// The events part of a turn: what it emitted, in order.
pub struct EventsCtx {
    limits: EventLimits,
    /// Emitted events: (kind, JSON data).
    events: Vec<(String, Vec<u8>)>,
    /// Their data's bytes.
    bytes: usize,
    /// Seq the next emitted event gets.
    next_seq: u64,
}

impl EventsCtx {
    /// Events of an actor whose last event is `last_seq`.
    pub(crate) fn new(limits: EventLimits, last_seq: u64) -> Self {
        Self {
            limits,
            events: Vec::new(),
            bytes: 0,
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
        if self.bytes + data.len() > self.limits.max_turn_event_bytes {
            return Err(Refusal::Limit(format!(
                "a turn may emit at most {} bytes of event data ({} emitted, {} more asked)",
                self.limits.max_turn_event_bytes,
                self.bytes,
                data.len()
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
        self.bytes += data.len();
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
        self.bytes -= self.events[sp.min(self.events.len())..]
            .iter()
            .map(|(_, d)| d.len())
            .sum::<usize>();
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

#[cfg(test)]
mod tests {
    use super::*;

    /// A turn's events are bounded in bytes as well as in number; what a
    /// rollback drops no longer counts.
    #[test]
    fn a_turn_emits_at_most_its_bytes_of_events() {
        let limits = EventLimits {
            max_event_bytes: 100,
            max_events_per_turn: 10,
            max_turn_event_bytes: 250,
        };
        let mut ctx = EventsCtx::new(limits, 0);
        let data = |n: usize| format!("\"{}\"", "x".repeat(n - 2)).into_bytes();
        assert_eq!(ctx.emit("a".into(), data(100)).unwrap(), 1);
        let sp = ctx.savepoint();
        assert_eq!(ctx.emit("b".into(), data(100)).unwrap(), 2);
        let err = ctx.emit("c".into(), data(100)).unwrap_err();
        assert!(
            matches!(&err, Refusal::Limit(m) if m.contains("at most 250 bytes")),
            "{err:?}"
        );
        ctx.rollback(sp);
        assert_eq!(ctx.emit("c".into(), data(100)).unwrap(), 2);
        assert_eq!(ctx.emit("d".into(), data(50)).unwrap(), 3);
    }
}
