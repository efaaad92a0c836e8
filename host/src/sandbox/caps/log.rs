//! `marmot:actor/log`: structured guest logs, tagged with the actor.

use super::Cap;
use crate::sandbox::bindings::marmot::actor::log::{self, Level};
use crate::sandbox::host::Host;

/// Limits of the log capability.
#[derive(Debug, Clone, Copy)]
pub struct LogLimits {
    /// Log lines one turn may write.
    pub max_lines: u32,
    /// Longest log line kept.
    pub max_line_bytes: usize,
}

/// The log part of a turn: how much it has written.
pub struct LogCtx {
    limits: LogLimits,
    lines: u32,
}

impl LogCtx {
    pub(crate) fn new(limits: LogLimits) -> Self {
        Self { limits, lines: 0 }
    }
}

impl log::Host for Host {
    fn log(
        &mut self,
        level: Level,
        message: String,
        fields: Vec<(String, String)>,
    ) -> wasmtime::Result<()> {
        if let Some(marker) = &self.fault_abort_marker
            && **marker == *message
        {
            // Fault injection for crash tests: die mid-turn like a real crash.
            eprintln!("marmot: fault injection: aborting on guest log marker");
            std::process::abort();
        }
        let turn = self.enter(Cap::Log)?;
        let log = &mut turn.log;
        log.lines += 1;
        if log.lines > log.limits.max_lines {
            if log.lines == log.limits.max_lines + 1 {
                tracing::warn!(actor = %turn.key, "guest log limit reached; dropping further lines this turn");
            }
            return Ok(());
        }
        let max = log.limits.max_line_bytes;
        let message = truncate(message, max);
        let fields = if fields.is_empty() {
            String::new()
        } else {
            let f: Vec<String> = fields.iter().map(|(k, v)| format!("{k}={v:?}")).collect();
            truncate(f.join(" "), max)
        };
        let actor = &turn.key;
        let version = turn.version;
        match level {
            Level::Trace => {
                tracing::trace!(target: "marmot::guest", %actor, version, %fields, "{message}")
            }
            Level::Debug => {
                tracing::debug!(target: "marmot::guest", %actor, version, %fields, "{message}")
            }
            Level::Info => {
                tracing::info!(target: "marmot::guest", %actor, version, %fields, "{message}")
            }
            Level::Warn => {
                tracing::warn!(target: "marmot::guest", %actor, version, %fields, "{message}")
            }
            Level::Error => {
                tracing::error!(target: "marmot::guest", %actor, version, %fields, "{message}")
            }
        }
        Ok(())
    }
}

/// Cut `s` to at most `max` bytes on a character boundary.
pub(crate) fn truncate(mut s: String, max: usize) -> String {
    if s.len() > max {
        let mut cut = max;
        while !s.is_char_boundary(cut) {
            cut -= 1;
        }
        s.truncate(cut);
        s.push('…');
    }
    s
}
