//! Structured logs into the node's tracing output, tagged with the actor.

use crate::bindings::marmot::actor::log::{self as host, Level};

/// Log `message` with `fields` at `level`.
pub fn log(level: Level, message: &str, fields: &[(&str, &str)]) {
    let fields: Vec<(String, String)> = fields
        .iter()
        .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
        .collect();
    host::log(level, message, &fields);
}

/// Log at debug level.
pub fn debug(message: &str) {
    log(Level::Debug, message, &[]);
}

/// Log at info level.
pub fn info(message: &str) {
    log(Level::Info, message, &[]);
}

/// Log at warn level.
pub fn warn(message: &str) {
    log(Level::Warn, message, &[]);
}

/// Log at error level.
pub fn error(message: &str) {
    log(Level::Error, message, &[]);
}

pub use host::Level as LogLevel;
