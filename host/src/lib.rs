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

mod actor;
mod alarms;
mod api;
mod bench;
mod catalog;
pub mod cli;
mod clock;
mod config;
mod guests;
mod ids;
mod inputs;
mod metrics;
mod node;
mod sandbox;
mod storage;
mod streams;
pub mod webhooks;
