//! Records of outbound webhooks: subscriptions, and the deliveries queued
//! for them in the outbox (tables [`super::SUBSCRIPTIONS`],
//! [`super::OUTBOX`]).

use serde::{Deserialize, Serialize};

/// An outbound webhook subscription.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct SubscriptionRecord {
    /// Where deliveries are POSTed.
    pub url: String,
    /// Event kinds: `*`, an exact kind, or a prefix `order.*`.
    pub events: Vec<String>,
    /// Actor types (empty: all).
    pub types: Vec<String>,
    /// The signing secret (`whsec_…`); never shown back.
    pub secret: String,
    /// When it was created.
    pub created_at_ms: u64,
}

impl SubscriptionRecord {
    /// Whether `d`, queued for a subscription of this one's name, is still
    /// this one's to send: it matches the filter as it is now (a replace
    /// that narrowed the filter drops what it no longer wants). A deleted
    /// subscription's rows are removed with it, so a new one that takes its
    /// name never sees them.
    pub fn wants(&self, d: &DeliveryRecord) -> bool {
        self.matches(&d.actor_type, &d.kind)
    }

    /// Whether an event of `kind` from an actor of type `ty` goes to it.
    pub fn matches(&self, ty: &str, kind: &str) -> bool {
        (self.types.is_empty() || self.types.iter().any(|t| t == ty))
            && self.events.iter().any(|p| {
                p == "*"
                    || p == kind
                    || p.strip_suffix('*')
                        .is_some_and(|prefix| kind.starts_with(prefix))
            })
    }
}

/// One event on its way to one subscription.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct DeliveryRecord {
    /// The subscription's name.
    pub subscription: String,
    /// `webhook-id`: the same on every attempt.
    pub webhook_id: String,
    /// The actor's type.
    pub actor_type: String,
    /// The actor's id.
    pub actor_id: String,
    /// The event's seq.
    pub event_seq: u64,
    /// The event's kind.
    pub kind: String,
    /// The exact body sent on every attempt.
    pub payload: Vec<u8>,
    /// When the event committed.
    pub created_at_ms: u64,
    /// Attempts made.
    pub attempts: u32,
    /// When the next attempt is due.
    pub next_attempt_ms: u64,
    /// Last failure (status and a capped body, or the transport error).
    pub last_error: Option<String>,
    /// Pending or dead.
    pub status: DeliveryStatus,
    /// The W3C `traceparent` of the turn that emitted the event, when
    /// traces were on: every attempt continues that trace. (Format 4.)
    pub traceparent: Option<String>,
}

/// The leading fields of a [`DeliveryRecord`], which never change while
/// it is queued: what the delivery worker needs to choose the rows it
/// starts, kept apart from the payload in [`super::OUTBOX_HEADS`]. They
/// are also the record's first fields, in its order, so a head also
/// decodes from a whole record (postcard reads fields in order and leaves
/// what follows).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct DeliveryHead {
    /// The subscription's name.
    pub subscription: String,
    /// `webhook-id`.
    pub webhook_id: String,
    /// The actor's type.
    pub actor_type: String,
    /// The actor's id.
    pub actor_id: String,
    /// The event's seq.
    pub event_seq: u64,
    /// The event's kind.
    pub kind: String,
}

/// Where a delivery stands.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub enum DeliveryStatus {
    /// Will be attempted at `next_attempt_ms`.
    Pending,
    /// Given up after the last attempt; kept for replay.
    Dead,
}

impl DeliveryRecord {
    /// Its [`DeliveryHead`].
    pub fn head(&self) -> DeliveryHead {
        DeliveryHead {
            subscription: self.subscription.clone(),
            webhook_id: self.webhook_id.clone(),
            actor_type: self.actor_type.clone(),
            actor_id: self.actor_id.clone(),
            event_seq: self.event_seq,
            kind: self.kind.clone(),
        }
    }

    /// `pending` (never failed), `failed` (retrying) or `dead`.
    pub fn label(&self) -> &'static str {
        match (self.status, self.attempts) {
            (DeliveryStatus::Dead, _) => "dead",
            (DeliveryStatus::Pending, 0) => "pending",
            (DeliveryStatus::Pending, _) => "failed",
        }
    }
}

/// The public id of outbox row `seq`: `msg_` + 16 hex digits of the seq +
/// 16 random hex digits (so ids never repeat across data directories).
pub fn delivery_id(seq: u64) -> String {
    format!("msg_{seq:016x}{:016x}", rand::random::<u64>())
}

/// The outbox seq inside a delivery id.
pub fn delivery_seq(id: &str) -> Option<u64> {
    let hex = id.strip_prefix("msg_")?;
    // All ASCII hex digits first: slicing inside a multi-byte character
    // would panic, and `from_str_radix` would take a sign.
    if hex.len() != 32 || !hex.bytes().all(|b| b.is_ascii_hexdigit()) {
        return None;
    }
    u64::from_str_radix(&hex[..16], 16).ok()
}
