//! Marmot: a hibernating WebAssembly actor runtime for AI agents.
//!
//! One node hosts many *actors*, each addressed by `(type, id)`. An actor
//! wakes on a message, runs one *turn* in a wasmtime sandbox, commits what it
//! wrote to redb, and hibernates when idle. The modules map onto those parts:
//!
//! | module | concern |
//! |---|---|
//! | `node` | wiring: open storage, load types, recover, serve |
//! | `actor` | activation, mailboxes, turns, hibernation |
//! | `sandbox` | wasmtime engine, compiled-code cache, host capabilities |
//! | `catalog` | deployed types and their versions |
//! | `storage` | redb schema and the group-commit writer |
//! | `alarms` | durable alarms: schedules and the scheduler |
//! | `streams` | live event streams: who watches which actor |
//! | `inputs` | input requests: checks and answer validation |
//! | [`webhooks`] | webhooks in (verify, route, enqueue) and out |
//! | `api` | the HTTP API |
//! | [`cli`] | the `marmot` command line |
//! | `metrics` | Prometheus metrics |
//! | `bench` | `marmot bench` scenarios |

// The lowest layers are crates of their own (Cargo keeps them from
// importing anything above): `marmot-core` (clock, names, settings) and
// `marmot-storage`. They keep their module names here.
use marmot_core::{clock, config, ids, json, throttle};
use marmot_storage as storage;

mod actor;
mod agents;
mod alarms;
mod api;
mod bench;
mod catalog;
pub mod cli;
mod cluster;
mod egress;
pub mod fake_provider;
mod guests;
mod inputs;
mod metrics;
mod models;
mod node;
mod sandbox;
mod secrets;
mod streams;
mod telemetry;
#[cfg(test)]
mod test_child;
mod tokens;
pub mod webhooks;
