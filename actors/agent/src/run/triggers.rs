//! What starts a run besides a client's input: the manifest's schedules
//! (cron alarms kept in step with it) and its webhooks.

use marmot_guest::alarms::{self, Schedule};
use marmot_guest::{Error, Result, state};
use serde_json::{Value, json};
use sha2::{Digest, Sha256};

use super::{Harness, run_id_for};

/// Alarms of the manifest's schedules are named this plus the schedule.
pub const SCHEDULE_ALARM: &str = "agent-schedule/";
/// The hash of the schedules the alarms were set for.
const SCHEDULES: &str = "agent/schedules";
/// Most bytes of a webhook payload put into a run's input.
const MAX_WEBHOOK_TEXT: usize = 16 << 10;

impl Harness {
    /// Keep the alarms of the manifest's schedules in step with it (set
    /// once per actor, and again when a new version changes them).
    pub fn ensure_schedules(&self) -> Result<()> {
        let want = serde_json::to_string(&self.m.schedules)?;
        let hash = hex::encode(Sha256::digest(want.as_bytes()));
        if state::get_json::<String>(SCHEDULES)?.as_deref() == Some(hash.as_str()) {
            return Ok(());
        }
        for a in alarms::list()? {
            if let Some(name) = a.name.strip_prefix(SCHEDULE_ALARM)
                && !self.m.schedules.iter().any(|s| s.name == name)
            {
                alarms::cancel(&a.name)?;
            }
        }
        for s in &self.m.schedules {
            let when = Schedule::Cron {
                expr: s.cron.clone(),
                tz: s.tz.clone(),
            };
            alarms::set(&format!("{SCHEDULE_ALARM}{}", s.name), when, &json!({}))?;
        }
        state::set_json(SCHEDULES, &hash)
    }

    /// Schedule `name` is due: a run with its input.
    pub fn scheduled(&self, name: &str, turn_id: &str) -> Result<()> {
        // Removed from the manifest since: nothing to do.
        let Some(s) = self.m.schedules.iter().find(|s| s.name == name) else {
            return Ok(());
        };
        self.start_or_queue(&run_id_for(turn_id), s.input.clone())?;
        Ok(())
    }

    /// Webhook `name` arrived: a run with the manifest's input for it.
    pub fn webhook(&self, name: &str, body: &[u8], turn_id: &str) -> Result<()> {
        let Some(template) = self.m.webhooks.get(name).and_then(Value::as_str) else {
            return Err(Error::new(format!(
                "this agent takes no webhook `{name}` (agent.webhooks lists the ones it does)"
            )));
        };
        let mut text = String::from_utf8_lossy(body).into_owned();
        if text.len() > MAX_WEBHOOK_TEXT {
            let mut cut = MAX_WEBHOOK_TEXT;
            while !text.is_char_boundary(cut) {
                cut -= 1;
            }
            text.truncate(cut);
        }
        self.start_or_queue(&run_id_for(turn_id), template.replace("{body}", &text))?;
        Ok(())
    }
}
