//! Egress: everything the node sends to the network on a guest's behalf
//! goes through one policy (Spin keeps egress in one place that every
//! outbound capability consults; so does Marmot).
//!
//! * [`policy`]: host patterns (a type's `allowed_hosts`, a secret's
//!   `hosts`) and the address policy applied after DNS (no loopback,
//!   private, link-local, CGNAT, multicast, metadata or IPv4-in-IPv6
//!   addresses unless `[egress] allow_private` opens them).
//! * [`client`]: the one client requests leave through (rustls, no
//!   environment proxies, policy-checked DNS, redirects re-checked per hop,
//!   capped and scrubbed responses).
//! * [`budget`]: the node's bound on the response bodies its clients hold
//!   at once (`limits.egress_response_budget_bytes`).

pub mod budget;
pub mod client;
pub mod policy;
mod resolve;
pub mod scrub;

pub use budget::ResponseBudget;
pub use client::{Egress, EgressError, OutboundHeader, OutboundRequest, StreamingResponse};
pub use policy::{
    HostPattern, has_secret_placeholder, holds_secret_placeholder, opens_secret_placeholder,
};
pub use scrub::{Scrub, TextStreamScrub};
