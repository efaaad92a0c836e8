//! `marmot:actor/log`: structured guest logs, tagged with the actor.

use crate::sandbox::bindings::marmot::actor::log::{self, Level};
use crate::sandbox::host::Host;

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
        let turn = self.enter()?;
        turn.log_lines += 1;
        if turn.log_lines > turn.limits.max_log_lines {
            if turn.log_lines == turn.limits.max_log_lines + 1 {
                tracing::warn!(actor = %turn.key, "guest log limit reached; dropping further lines this turn");
            }
            return Ok(());
        }
        let message = truncate(message, turn.limits.max_log_line_bytes);
        let fields = if fields.is_empty() {
            String::new()
        } else {
            let f: Vec<String> = fields.iter().map(|(k, v)| format!("{k}={v:?}")).collect();
            truncate(f.join(" "), turn.limits.max_log_line_bytes)
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
