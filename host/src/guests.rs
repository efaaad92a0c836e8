//! Example actors built into the binary so `marmot dev` can deploy them at
//! once. Built from `examples/` by `build.rs`.

/// `examples/counter`: adds `by` (default 1) and replies with the count.
pub const COUNTER: &[u8] = include_bytes!(env!("MARMOT_GUEST_COUNTER"));

/// `examples/notes`: per-user notes.
pub const NOTES: &[u8] = include_bytes!(env!("MARMOT_GUEST_NOTES"));

/// `actors/quickjs`: the built-in JavaScript engine (QuickJS in Wasm).
pub const QUICKJS: &[u8] = include_bytes!(env!("MARMOT_GUEST_MARMOT_QUICKJS"));

/// `actors/agent`: the built-in agent harness (types of kind `agent`).
pub const AGENT: &[u8] = include_bytes!(env!("MARMOT_GUEST_MARMOT_AGENT"));

/// `examples/assistant`: the agent manifest `marmot dev` deploys.
pub const ASSISTANT: &str = include_str!("../../examples/assistant/assistant.json");

/// The examples `marmot dev` deploys: (type name, component).
pub const EXAMPLES: &[(&str, &[u8])] = &[("counter", COUNTER), ("notes", NOTES)];
