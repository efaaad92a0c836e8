//! Runs that stop going on: a continuation whose turn failed is found by
//! an alarm, sent once more, then the run fails; and every run fails at
//! its deadline (docs/agent.md, "Failed turns").

use marmot_guest::Result;
use marmot_guest::alarms::{self, Schedule};
use serde_json::json;

use super::{Harness, emit};
use crate::store::{self, Run};

/// Alarms ending a run at `limits.max_run_ms` (name + run id).
pub const DEADLINE_ALARM: &str = "agent-deadline/";
/// Alarms checking that a queued continuation's turn completed (name +
/// run id).
pub const WATCHDOG_ALARM: &str = "agent-watchdog/";
/// When the watchdog looks, after the continuation was queued. The
/// alarm's turn runs after the continuation's (an actor's turns never
/// overlap), so one that takes longer is not cut short: the watchdog then
/// finds it done.
pub(super) const WATCHDOG_MS: u64 = 30_000;
/// Times a continuation whose turn failed is sent again before the run
/// fails.
const STEP_RESENDS: u32 = 1;

impl Harness {
    /// The run's deadline is due: if it is still going, it fails.
    pub fn deadline(&self, run_id: &str) -> Result<()> {
        match store::run()? {
            Some(run) if run.run_id == run_id => self.fail(
                run,
                "max_run_ms",
                "the run did not end within limits.max_run_ms",
            ),
            _ => Ok(()),
        }
    }

    /// Look again in `after_ms` whether the continuation `run` now
    /// expects (a step, or the exec of tool call `call_id`) ran.
    pub(super) fn watch(&self, run: &Run, after_ms: u64, call_id: Option<&str>) -> Result<()> {
        alarms::set(
            &format!("{WATCHDOG_ALARM}{}", run.run_id),
            Schedule::After(after_ms),
            &json!({ "nonce": run.expect, "call_id": call_id }),
        )
    }

    /// A continuation's watchdog is due. If the run still expects it, its
    /// turn failed (a trap, its turn timeout, crashes past the recovery
    /// limit: the platform records `turn_failed` and does not run it
    /// again): send it once more, then fail the run. A run used to stay
    /// open until `limits.max_run_ms` (an hour), its caller waiting and
    /// later inputs queued behind it. It is sent again with the same
    /// nonce: were the first copy still queued, whichever runs first takes
    /// it and the other finds nothing to do. A tool's exec goes again
    /// marked as re-sent, so it is not run blindly: its call may have
    /// taken effect before the turn failed (an idempotent tool runs again,
    /// one with a reconcile request asks, any other asks a person).
    pub fn watchdog(&self, run_id: &str, nonce: &str, call_id: Option<&str>) -> Result<()> {
        let Some(mut run) = self.expected(run_id, nonce)? else {
            return Ok(());
        };
        if run.step_resends >= STEP_RESENDS {
            return self.fail(
                run,
                "turn_failed",
                "the run's next turn failed again after it was sent once more (the \
                 turn_failed events say why)",
            );
        }
        run.step_resends += 1;
        store::set_run(&run)?;
        emit(
            "step_retry",
            &json!({ "run_id": run.run_id, "call_id": call_id,
                     "why": "the turn did not complete (a turn_failed event says why)" }),
        )?;
        self.watch(&run, WATCHDOG_MS, call_id)?;
        self.send_continuation(&run, call_id, true)
    }
}
