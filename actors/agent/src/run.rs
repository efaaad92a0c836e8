//! The run loop: one step per turn, each committed before the next.

use std::hash::{BuildHasher, Hasher};

use marmot_guest::alarms::{self, Schedule};
use marmot_guest::{Context, Error, InputAnswer, Result, actors, events, inputs, model};
use serde_json::{Value, json};
use sha2::{Digest, Sha256};

use crate::manifest::{Manifest, Tool};
use crate::store::{self, Pending, Queued, Run, Wait};
use crate::tools::{self, Outcome};
use crate::transcript::{
    call_name, call_position, content_text, next_call, open_calls, set_call_arguments,
    unique_call_ids,
};

/// A step's answer is sent no cap of the run's own while more than this
/// is left of `limits.max_output_tokens`: the gateway's default for a
/// request without one (and what a budget reserves for it).
const UNCAPPED_STEP_TOKENS: u64 = 4096;
/// Most bytes of one event; larger message contents are cut in the event
/// (the transcript keeps them whole).
const MAX_EVENT: usize = 128 << 10;
/// Pauses before retrying a step whose model call failed (provider
/// unavailable after the gateway's own retries).
const RETRY_DELAYS_MS: [u64; 3] = [2_000, 10_000, 60_000];

/// The harness for one turn of one agent.
pub struct Harness {
    ctx: Context,
    m: Manifest,
}

mod context;
mod triggers;
mod watchdog;

pub use triggers::SCHEDULE_ALARM;
use watchdog::WATCHDOG_MS;
pub use watchdog::{DEADLINE_ALARM, WATCHDOG_ALARM};

/// Where a run goes next.
enum Next {
    Step,
    Exec(String),
}

fn now_ms() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as u64)
}

/// A fresh random token: continuation messages carry the one the run
/// expects, so stale or forged ones are ignored.
fn nonce() -> String {
    let mut h = std::collections::hash_map::RandomState::new().build_hasher();
    h.write_u64(now_ms());
    format!("{:016x}", h.finish())
}

/// The hash an approval binds to: the exact arguments (canonical JSON:
/// serde_json sorts object keys).
pub fn args_hash(args: &Value) -> String {
    hex::encode(Sha256::digest(args.to_string().as_bytes()))
}

fn emit(kind: &str, data: &Value) -> Result<()> {
    let text = data.to_string();
    if text.len() <= MAX_EVENT {
        events::emit(kind, data)?;
        return Ok(());
    }
    let mut d = data.clone();
    for field in ["message", "content", "arguments", "output"] {
        if let Some(v) = d.get_mut(field) {
            let s = v.to_string();
            if s.len() > MAX_EVENT / 2 {
                let mut cut = MAX_EVENT / 2;
                while !s.is_char_boundary(cut) {
                    cut -= 1;
                }
                *v = json!({ "truncated": true, "start": &s[..cut] });
            }
        }
    }
    events::emit(kind, &d)?;
    Ok(())
}

impl Harness {
    pub fn new(ctx: &Context) -> Result<Self> {
        Ok(Self {
            ctx: ctx.clone(),
            m: Manifest::load().map_err(Error::new)?,
        })
    }

    /// Start a run for `input`, or queue it behind the active one; whether
    /// it was queued.
    pub fn start_or_queue(&self, run_id: &str, input: String) -> Result<bool> {
        if store::run()?.is_some() {
            let mut q = store::queue()?;
            if !q.iter().any(|x| x.run_id == run_id) {
                q.push(Queued {
                    run_id: run_id.to_owned(),
                    input,
                });
                store::set_queue(&q)?;
                emit("input_queued", &json!({ "run_id": run_id }))?;
            }
            return Ok(true);
        }
        self.start(run_id, input)?;
        Ok(false)
    }

    fn start(&self, run_id: &str, input: String) -> Result<()> {
        store::append(&json!({ "role": "user", "content": input }))?;
        let mut run = Run {
            run_id: run_id.to_owned(),
            expect: String::new(),
            waiting: false,
            steps: 0,
            started_at_ms: now_ms(),
            input_tokens: 0,
            output_tokens: 0,
            cost_usd: 0.0,
            retries: 0,
            just_compacted: false,
            step_resends: 0,
        };
        emit("run_started", &json!({ "run_id": run_id, "input": input }))?;
        // The run ends by this deadline whatever happens to its turns: a
        // continuation whose turn fails (a trap, a turn timeout) is not
        // retried, and without it the run would stay open for good.
        alarms::set(
            &format!("{DEADLINE_ALARM}{run_id}"),
            Schedule::After(self.m.limits.max_run_ms),
            &json!({}),
        )?;
        self.next(&mut run, Next::Step)
    }

    /// Commit the run and queue its next turn (a message to this actor,
    /// sent when this turn commits).
    fn next(&self, run: &mut Run, what: Next) -> Result<()> {
        run.expect = nonce();
        run.waiting = false;
        // A continuation was committed: the step before it went through.
        run.step_resends = 0;
        store::set_run(run)?;
        let call_id = match &what {
            Next::Step => None,
            Next::Exec(call_id) => Some(call_id.as_str()),
        };
        self.watch(run, WATCHDOG_MS, call_id)?;
        self.send_continuation(run, call_id, false)
    }

    /// Queue the turn `run` expects: its next step, or the exec of tool
    /// call `call_id` (`resent`: sent again by the watchdog).
    fn send_continuation(&self, run: &Run, call_id: Option<&str>, resent: bool) -> Result<()> {
        let body = match call_id {
            None => json!({ "_agent_step": run.run_id, "nonce": run.expect }),
            Some(c) => json!({ "_agent_exec": run.run_id, "call_id": c, "nonce": run.expect,
                               "resent": resent }),
        };
        actors::send(&self.ctx.actor_type, &self.ctx.id, &body)
    }

    /// The active run, if `run_id` and `nonce` are what it expects.
    fn expected(&self, run_id: &str, nonce: &str) -> Result<Option<Run>> {
        Ok(store::run()?.filter(|r| r.run_id == run_id && r.expect == nonce && !r.waiting))
    }

    /// One step: prepare the next tool call, or call the model.
    pub fn step(&self, run_id: &str, nonce: &str) -> Result<()> {
        let Some(mut run) = self.expected(run_id, nonce)? else {
            return Ok(());
        };
        let limits = &self.m.limits;
        if now_ms().saturating_sub(run.started_at_ms) > limits.max_run_ms {
            return self.fail(
                run,
                "max_run_ms",
                "the run took longer than limits.max_run_ms",
            );
        }
        // An answer that went past the run's allowance (a provider that
        // does not honour the cap sent, or none sent) has its calls closed
        // unmade: they ran first, paid for by nobody's limit (found by a
        // probe: 150,000 tokens of a 10,000 allowance, and its call ran).
        let transcript = store::transcript()?;
        if run.output_tokens > limits.max_output_tokens {
            let error = match next_call(&transcript) {
                Some(_) => {
                    "the last answer went past limits.max_output_tokens; its tool calls were not made"
                }
                None => "the run went past limits.max_output_tokens",
            };
            return self.fail(run, "max_output_tokens", error);
        }
        if let Some((call_id, name, args)) = next_call(&transcript) {
            let most = limits.max_tool_calls_per_step as usize;
            if call_position(&transcript, &call_id).is_some_and(|i| i >= most) {
                let outcome = Outcome::error(format!(
                    "not run: one model step may make at most {most} tool calls \
                     (limits.max_tool_calls_per_step)"
                ));
                return self.record(run, &call_id, &name, outcome);
            }
            return self.begin_tool(run, call_id, name, args);
        }
        if run.steps >= limits.max_steps {
            return self.fail(run, "max_steps", "the run reached limits.max_steps");
        }
        if run.output_tokens >= limits.max_output_tokens {
            return self.fail(
                run,
                "max_output_tokens",
                "the run reached limits.max_output_tokens",
            );
        }
        let size: usize = transcript.iter().map(|(_, m)| m.to_string().len()).sum();
        if !run.just_compacted
            && (size + self.m.instructions.len()) as u64 / 4 > limits.context_tokens
        {
            return self.compact(run, &transcript);
        }
        let messages: Vec<&Value> = transcript.iter().map(|(_, m)| m).collect();
        let mut req = self.request(json!(messages));
        // What is left of the run's allowance caps this step's answer:
        // checked only between steps, one answer passed
        // limits.max_output_tokens by any amount (a probe saw 202 of 20).
        // It only lowers a cap: with none in the manifest, the provider's
        // default stands unless less than that is left (sending the whole
        // allowance, 200,000 by default, is refused by most models and
        // reserves that much of a budget per call).
        let left = limits.max_output_tokens - run.output_tokens;
        match req["max_output_tokens"].as_u64() {
            Some(n) => req["max_output_tokens"] = json!(n.min(left)),
            None if left < UNCAPPED_STEP_TOKENS => req["max_output_tokens"] = json!(left),
            None => {}
        }
        req["tools"] = json!(self.m.definitions());
        req["stream"] = json!(true);
        match model::chat(&req) {
            Ok(answer) => {
                run.steps += 1;
                run.retries = 0;
                run.just_compacted = false;
                count(&mut run, &answer);
                let mut message = answer["message"].clone();
                unique_call_ids(&mut message, &transcript);
                if let Err(e) = store::append(&message) {
                    // An answer too large to keep (a transcript message is
                    // one state value, at most 1 MiB): the run fails, paid
                    // for, rather than the turn (whose step would only
                    // call the model again).
                    return self.fail(
                        run,
                        "model_error",
                        &format!("the model's answer cannot be kept: {}", e.message()),
                    );
                }
                emit(
                    "model_step",
                    &json!({
                        "run_id": run.run_id, "step": run.steps, "message": message,
                        "stop_reason": answer["stop_reason"], "usage": answer["usage"],
                        "provider": answer["provider"], "model": answer["model"],
                    }),
                )?;
                let calls = message["tool_calls"]
                    .as_array()
                    .is_some_and(|c| !c.is_empty());
                if calls {
                    self.next(&mut run, Next::Step)
                } else {
                    let output = content_text(&message["content"]);
                    self.finish(run, output)
                }
            }
            Err(e) => self.model_failed(run, &transcript, e.message()),
        }
    }

    /// The chat request for `messages` with the manifest's model.
    fn request(&self, messages: Value) -> Value {
        let spec = &self.m.model;
        let mut req = json!({
            "provider": spec.provider,
            "model": spec.name,
            "messages": messages,
        });
        if !self.m.instructions.is_empty() {
            req["system"] = json!(self.m.instructions);
        }
        if !spec.fallbacks.is_empty() {
            req["fallbacks"] = spec
                .fallbacks
                .iter()
                .map(|f| json!({ "provider": f.provider, "model": f.name }))
                .collect();
        }
        if let Some(n) = spec.max_output_tokens {
            req["max_output_tokens"] = json!(n);
        }
        if let Some(t) = spec.temperature {
            req["temperature"] = json!(t);
        }
        if !spec.provider_options.is_empty() {
            req["provider_options"] = json!(spec.provider_options);
        }
        req
    }

    /// Prepare a tool call: ask for approval, hand it to the client, or
    /// commit it as started and run it in the next turn.
    fn begin_tool(&self, mut run: Run, call_id: String, name: String, args: Value) -> Result<()> {
        let Some(tool) = self.m.tool(&name) else {
            let outcome = Outcome::error(format!("there is no tool named `{name}`"));
            return self.record(run, &call_id, &name, outcome);
        };
        if let Err(why) = self.m.check_arguments(tool, &args) {
            let outcome = Outcome::error(match &args {
                // What the model wrote was not JSON (the gateway keeps the
                // text): "expected type object" did not say so.
                Value::String(text) => format!(
                    "the arguments are not a JSON object: the model wrote {} (not JSON, cut \
                     off, or a JSON string); the call was not made",
                    serde_json::to_string(&preview(text)).unwrap_or_default()
                ),
                _ => format!(
                    "the arguments do not fit the tool's input_schema ({why}); the call was not \
                     made"
                ),
            });
            return self.record(run, &call_id, &name, outcome);
        }
        let data =
            json!({ "run_id": run.run_id, "call_id": call_id, "name": name, "arguments": args });
        if let Tool::Client { .. } = tool {
            let prompt = json!({ "tool": name, "call_id": call_id, "arguments": args }).to_string();
            let input_id = inputs::request_with(&format!("tool:{name}"), &prompt, None, None)?;
            store::set_wait(
                &input_id,
                Some(&Wait::Client {
                    run_id: run.run_id.clone(),
                    call_id: call_id.clone(),
                }),
            )?;
            let mut data = data;
            data["client"] = json!(true);
            data["input_id"] = json!(input_id);
            emit("tool_call", &data)?;
            return self.wait(run);
        }
        let hash = args_hash(&args);
        if tool.needs_approval() && store::approved(&call_id)?.as_deref() != Some(hash.as_str()) {
            let prompt = format!("Approve `{name}` with arguments {args}?");
            let schema = json!({ "type": "object", "required": ["approved"], "properties": {
                "approved": { "type": "boolean" }, "arguments": { "type": "object" } } });
            let input_id = inputs::request_with("approval", &prompt, Some(&schema), None)?;
            store::set_wait(
                &input_id,
                Some(&Wait::Approval {
                    run_id: run.run_id.clone(),
                    call_id: call_id.clone(),
                    args_hash: hash,
                }),
            )?;
            let mut data = data;
            data["input_id"] = json!(input_id);
            emit("approval_requested", &data)?;
            return self.wait(run);
        }
        let key = format!("{}-{}", run.run_id, call_key(&call_id));
        store::set_pending(Some(&Pending {
            run_id: run.run_id.clone(),
            call_id: call_id.clone(),
            name,
            arguments: args,
            key,
        }))?;
        emit("tool_call", &data)?;
        self.next(&mut run, Next::Exec(call_id))
    }

    fn wait(&self, mut run: Run) -> Result<()> {
        run.waiting = true;
        run.expect = nonce();
        store::set_run(&run)
    }

    /// Run the pending tool call. `attempt > 0`: a crash may have cut off
    /// an earlier run of this very turn, after the call took effect.
    pub fn exec(&self, run_id: &str, call_id: &str, nonce: &str, attempt: u32) -> Result<()> {
        let Some(run) = self.expected(run_id, nonce)? else {
            return Ok(());
        };
        let Some(p) = store::pending()?.filter(|p| p.call_id == call_id) else {
            return Ok(());
        };
        let Some(tool) = self.m.tool(&p.name) else {
            let outcome = Outcome::error(format!("there is no tool named `{}`", p.name));
            return self.record(run, &p.call_id, &p.name, outcome);
        };
        if attempt > 0 && !tool.idempotent() {
            match tool {
                Tool::Http {
                    reconcile: Some(endpoint),
                    ..
                } => match tools::reconcile(endpoint, &p.key) {
                    Ok(Some(result)) => {
                        let outcome = Outcome {
                            content: json!({ "reconciled": true, "result": result }),
                            is_error: false,
                        };
                        return self.record(run, &p.call_id, &p.name, outcome);
                    }
                    Ok(None) => {} // it did not happen: run it
                    Err(why) => return self.park(run, &p, &why),
                },
                Tool::Http { .. } => {
                    return self.park(
                        run,
                        &p,
                        "the tool declares no reconcile request to check with",
                    );
                }
                // Only http tools can declare one.
                Tool::Code { .. } => {
                    return self.park(
                        run,
                        &p,
                        "its script may have sent requests before the crash, and a script \
                         cannot be checked with",
                    );
                }
                Tool::Actor { .. } => {
                    return self.park(
                        run,
                        &p,
                        "the message may have reached the other actor before the crash, and an \
                         actor tool cannot be checked with",
                    );
                }
                _ => {
                    return self.park(run, &p, "this kind of tool cannot be checked with");
                }
            }
        }
        let outcome = tools::run(&self.m, tool, &p.arguments, &p.key);
        self.record(run, &p.call_id, &p.name, outcome)
    }

    /// Commit a tool's result and step on.
    fn record(&self, mut run: Run, call_id: &str, name: &str, outcome: Outcome) -> Result<()> {
        let mut message =
            json!({ "role": "tool", "tool_call_id": call_id, "content": outcome.content });
        if outcome.is_error {
            message["is_error"] = json!(true);
        }
        store::append(&message)?;
        store::set_pending(None)?;
        emit(
            "tool_result",
            &json!({ "run_id": run.run_id, "call_id": call_id, "name": name,
                     "content": outcome.content, "is_error": outcome.is_error }),
        )?;
        self.next(&mut run, Next::Step)
    }

    /// Ask a person whether a call cut off by a crash took effect.
    fn park(&self, run: Run, p: &Pending, why: &str) -> Result<()> {
        let prompt = format!(
            "The node stopped while `{}` was running with arguments {} ({why}). Did it take \
             effect? Answer {{\"happened\": true, \"result\": …}} or {{\"happened\": false}} \
             (then it runs again).",
            p.name, p.arguments
        );
        let schema = json!({ "type": "object", "required": ["happened"],
                             "properties": { "happened": { "type": "boolean" } } });
        let input_id = inputs::request_with("confirm", &prompt, Some(&schema), None)?;
        store::set_wait(
            &input_id,
            Some(&Wait::Confirm {
                run_id: run.run_id.clone(),
                call_id: p.call_id.clone(),
            }),
        )?;
        emit(
            "tool_uncertain",
            &json!({ "run_id": run.run_id, "call_id": p.call_id, "name": p.name,
                     "arguments": p.arguments, "input_id": input_id, "reason": why }),
        )?;
        self.wait(run)
    }

    /// An input request the run waited on was answered (or expired).
    pub fn answer(&self, input: InputAnswer) -> Result<()> {
        let Some(wait) = store::wait(&input.id)? else {
            return Ok(());
        };
        store::set_wait(&input.id, None)?;
        let answer: Value = if input.expired {
            Value::Null
        } else {
            input.json().unwrap_or(Value::Null)
        };
        let (run_id, call_id) = match &wait {
            Wait::Approval {
                run_id, call_id, ..
            }
            | Wait::Client { run_id, call_id }
            | Wait::Confirm { run_id, call_id } => (run_id.clone(), call_id.clone()),
        };
        let Some(mut run) = store::run()?.filter(|r| r.run_id == run_id && r.waiting) else {
            return Ok(()); // the run ended (cancelled) meanwhile
        };
        let name = call_name(&call_id)?.unwrap_or_default();
        match wait {
            Wait::Approval {
                args_hash: approved_hash,
                ..
            } => {
                if answer["approved"] != json!(true) {
                    let why = if input.expired {
                        "Nobody approved this call in time; it was not made."
                    } else {
                        "A person declined this call; it was not made."
                    };
                    return self.record(run, &call_id, &name, Outcome::error(why));
                }
                match answer.get("arguments") {
                    Some(edited) if args_hash(edited) != approved_hash => {
                        // The person changed the arguments: those need an
                        // approval of their own, asked for by the next step.
                        set_call_arguments(&call_id, edited)?;
                        emit(
                            "tool_arguments_changed",
                            &json!({ "run_id": run.run_id, "call_id": call_id, "name": name, "arguments": edited }),
                        )?;
                    }
                    _ => store::set_approved(&call_id, &approved_hash)?,
                }
                self.next(&mut run, Next::Step)
            }
            Wait::Client { .. } => {
                let outcome = if input.expired {
                    Outcome::error("the client did not answer in time")
                } else {
                    Outcome {
                        content: answer,
                        is_error: false,
                    }
                };
                self.record(run, &call_id, &name, outcome)
            }
            Wait::Confirm { .. } => match answer.get("happened").and_then(Value::as_bool) {
                Some(true) => {
                    let result = answer
                        .get("result")
                        .cloned()
                        .unwrap_or_else(|| json!("It took effect (a person confirmed it)."));
                    self.record(
                        run,
                        &call_id,
                        &name,
                        Outcome {
                            content: result,
                            is_error: false,
                        },
                    )
                }
                Some(false) => self.next(&mut run, Next::Exec(call_id)),
                None => self.record(
                    run,
                    &call_id,
                    &name,
                    Outcome::error("nobody could say whether this call took effect"),
                ),
            },
        }
    }

    /// Stop `run_id`, active or queued; whether there was one.
    pub fn cancel(&self, run_id: &str) -> Result<bool> {
        if let Some(run) = store::run()?.filter(|r| r.run_id == run_id) {
            self.fail(run, "cancelled", "the run was cancelled")?;
            return Ok(true);
        }
        let mut q = store::queue()?;
        let before = q.len();
        q.retain(|x| x.run_id != run_id);
        if q.len() == before {
            return Ok(false);
        }
        store::set_queue(&q)?;
        emit(
            "run_failed",
            // A queued run never started: it used nothing (its waiting
            // caller was told `usage: null`).
            &json!({ "run_id": run_id, "reason": "cancelled", "error": "the run was cancelled",
                     "usage": { "input_tokens": 0, "output_tokens": 0 } }),
        )?;
        Ok(true)
    }

    fn finish(&self, run: Run, output: String) -> Result<()> {
        emit(
            "run_finished",
            &json!({ "run_id": run.run_id, "output": output, "usage": usage(&run), "steps": run.steps }),
        )?;
        self.end(run)
    }

    fn fail(&self, run: Run, reason: &str, error: &str) -> Result<()> {
        emit(
            "run_failed",
            &json!({ "run_id": run.run_id, "reason": reason, "error": error, "usage": usage(&run) }),
        )?;
        self.end(run)
    }

    /// The run is over: clear it and start the next queued input.
    fn end(&self, run: Run) -> Result<()> {
        close_calls()?;
        withdraw_inputs(&run.run_id)?;
        store::clear_run();
        store::set_pending(None)?;
        store::clear_approvals();
        alarms::cancel(&format!("agent-retry/{}", run.run_id))?;
        alarms::cancel(&format!("{DEADLINE_ALARM}{}", run.run_id))?;
        alarms::cancel(&format!("{WATCHDOG_ALARM}{}", run.run_id))?;
        let mut q = store::queue()?;
        if !q.is_empty() {
            let next = q.remove(0);
            store::set_queue(&q)?;
            self.start(&next.run_id, next.input)?;
        }
        Ok(())
    }
}

/// Give every call of the last model answer that has no result yet one
/// saying it was never made: the run ended (cancelled, out of time or
/// budget) before it ran. Without it, the next run's first step took the
/// call for its own and ran it, unasked (found by a probe: a cancelled
/// run's payment went out in the next, unrelated run), and providers refuse
/// a conversation whose call is not followed by its result.
fn close_calls() -> Result<()> {
    let transcript = store::transcript()?;
    for call in open_calls(&transcript) {
        store::append(&json!({
            "role": "tool",
            "tool_call_id": call["id"].as_str().unwrap_or(""),
            "content": "Not run: the run ended before this call was made.",
            "is_error": true,
        }))?;
    }
    Ok(())
}

/// Withdraw the input requests the ended run waited on (an approval, a
/// client tool's result, a crash confirmation): nobody needs to answer them
/// any more, and a UI listing pending inputs should not offer them. They
/// used to stay `pending` for ever, and an answer did nothing.
fn withdraw_inputs(run_id: &str) -> Result<()> {
    for (input_id, wait) in store::waits()? {
        let (Wait::Approval { run_id: r, .. }
        | Wait::Client { run_id: r, .. }
        | Wait::Confirm { run_id: r, .. }) = &wait;
        if r != run_id {
            continue;
        }
        store::set_wait(&input_id, None)?;
        // Gone already (answered in this very turn, expired): nothing to do.
        let _ = inputs::cancel(&input_id);
    }
    Ok(())
}

/// The run id of a run started by a delivery other than an input (an
/// alarm, a webhook): stable across re-runs of that delivery.
fn run_id_for(turn_id: &str) -> String {
    hex::encode(&Sha256::digest(turn_id.as_bytes())[..16])
}

/// A call id as it may appear in an idempotency key.
fn call_key(call_id: &str) -> String {
    call_id
        .chars()
        .map(|c| {
            if c.is_ascii_alphanumeric() || c == '_' || c == '-' {
                c
            } else {
                '_'
            }
        })
        .collect()
}

fn count(run: &mut Run, answer: &Value) {
    let u = &answer["usage"];
    run.input_tokens += u["input_tokens"].as_u64().unwrap_or(0);
    run.output_tokens += u["output_tokens"].as_u64().unwrap_or(0);
    run.cost_usd += u["cost_usd"].as_f64().unwrap_or(0.0);
}

fn usage(run: &Run) -> Value {
    let mut u = json!({ "input_tokens": run.input_tokens, "output_tokens": run.output_tokens });
    if run.cost_usd > 0.0 {
        u["cost_usd"] = json!(run.cost_usd);
    }
    u
}

/// The start of what a model wrote, for a message about it.
fn preview(text: &str) -> String {
    const SHOWN: usize = 120;
    match text.char_indices().nth(SHOWN) {
        Some((at, _)) => format!("{}…", &text[..at]),
        None => text.to_owned(),
    }
}
