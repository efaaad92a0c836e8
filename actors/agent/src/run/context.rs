//! The conversation against the model's limits: what a failed model call
//! does to the run (its budget spent, the context too long, the provider
//! out for now), and compaction of the transcript.

use marmot_guest::Result;
use marmot_guest::alarms::{self, Schedule};
use marmot_guest::model;
use serde_json::{Value, json};

use super::{Harness, Next, RETRY_DELAYS_MS, WATCHDOG_MS, count, emit, nonce, usage};
use crate::store::{self, Run};
use crate::transcript::content_text;

impl Harness {
    /// A step's model call failed with `error`: the run ends, waits for its
    /// budget, compacts, or tries again after a pause.
    pub(super) fn model_failed(
        &self,
        mut run: Run,
        transcript: &[(String, Value)],
        error: &str,
    ) -> Result<()> {
        let code = model_error_code(error);
        if code == "budget_exceeded" {
            return self.out_of_budget(run, error);
        }
        if code == "context_length_exceeded" {
            if run.just_compacted {
                return self.fail(
                    run,
                    "context_length",
                    "the conversation does not fit the model even after compaction",
                );
            }
            return self.compact(run, transcript);
        }
        // Unavailable: unreachable or failing, or still refusing for its
        // rate limit after the gateway's own retries (that failed the run
        // at once, where a 500 paused it three times).
        let unavailable = error.starts_with("host error:") || code == "rate_limited";
        if unavailable && (run.retries as usize) < RETRY_DELAYS_MS.len() {
            let delay = RETRY_DELAYS_MS[run.retries as usize];
            run.retries += 1;
            run.expect = nonce();
            store::set_run(&run)?;
            alarms::set(
                &format!("agent-retry/{}", run.run_id),
                Schedule::After(delay),
                &json!({ "nonce": run.expect }),
            )?;
            self.watch(&run, delay + WATCHDOG_MS, None)?;
            return emit(
                "model_retry",
                &json!({ "run_id": run.run_id, "error": error, "after_ms": delay }),
            );
        }
        self.fail(run, "model_error", error)
    }

    /// Replace the older part of the transcript by a summary written by the
    /// model (committed like any step).
    pub(super) fn compact(&self, mut run: Run, transcript: &[(String, Value)]) -> Result<()> {
        // Keep from the last user message on; summarize what is before it.
        let cut = transcript
            .iter()
            .rposition(|(_, m)| m["role"] == "user")
            .unwrap_or(0);
        if cut == 0 {
            return self.fail(
                run,
                "context_length",
                "the conversation does not fit the model, and nothing before the last input \
                 is left to summarize",
            );
        }
        let mut text: String = transcript[..cut]
            .iter()
            .map(|(_, m)| m.to_string())
            .collect::<Vec<_>>()
            .join("\n");
        let budget = (self.m.limits.context_tokens as usize * 4) / 2;
        if text.len() > budget {
            let mut start = text.len() - budget;
            while !text.is_char_boundary(start) {
                start += 1;
            }
            text = text[start..].to_owned();
        }
        let mut req = self.request(json!([{ "role": "user", "content": format!(
            "Here is an earlier part of our conversation, one JSON message per line:\n\n{text}\n\n\
             Summarize it for your own later use: facts, decisions, open tasks, tool results \
             that still matter, and the user's preferences. Be concise.") }]));
        req["system"] =
            json!("You write summaries of conversations so they can continue without them.");
        match model::chat(&req) {
            Ok(answer) => {
                count(&mut run, &answer);
                let summary = content_text(&answer["message"]["content"]);
                store::replace(
                    &transcript[0].0,
                    &json!({ "role": "user", "content": format!("Summary of the earlier conversation:\n{summary}") }),
                )?;
                let rest: Vec<String> = transcript[1..cut].iter().map(|(k, _)| k.clone()).collect();
                store::remove(&rest);
                run.just_compacted = true;
                emit(
                    "compacted",
                    &json!({ "run_id": run.run_id, "messages_summarized": cut, "summary": summary,
                             "usage": answer["usage"] }),
                )?;
                self.next(&mut run, Next::Step)
            }
            Err(e) if model_error_code(e.message()) == "budget_exceeded" => {
                self.out_of_budget(run, e.message())
            }
            Err(e) => self.fail(run, "compaction_failed", e.message()),
        }
    }

    /// The run's budget is spent: it ends, saying so.
    fn out_of_budget(&self, run: Run, error: &str) -> Result<()> {
        emit(
            "budget_exceeded",
            &json!({ "run_id": run.run_id, "error": error, "usage": usage(&run) }),
        )?;
        self.end(run)
    }
}

/// The code a failed model call's message starts with, after the SDK's
/// kind (`invalid: context_length_exceeded: …`): what the harness acts on.
/// It searched the whole message, so a provider's own text that mentioned
/// `budget_exceeded` ended a run as if a budget had (found by a probe).
fn model_error_code(message: &str) -> &str {
    message.split(": ").nth(1).unwrap_or("")
}
