//! Node config (TOML) and type config (JSON): parse and validate any text
//! without a panic.
#![no_main]

use libfuzzer_sys::fuzz_target;
use marmot_core::config::{NodeConfig, TypeConfig};

fuzz_target!(|data: &str| {
    if let Ok(node) = toml::from_str::<NodeConfig>(data) {
        let _ = node.validate();
    }
    if let Ok(ty) = serde_json::from_str::<TypeConfig>(data) {
        let _ = ty.validate(&NodeConfig::default().limits);
    }
});
