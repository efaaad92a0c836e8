//! `marmot:actor/js`: run model-written JavaScript in a child QuickJS
//! sandbox, from any actor (the agent harness's `code` tool is built on
//! this).
//!
//! The child is a fresh JavaScript sandbox with the eval limits (CPU,
//! memory, output, time; `timeout-ms` may lower them) and only the
//! capabilities its caller names in `tools` — a subset of the caller's own;
//! it can never start scripts itself. It runs inside the caller's turn: what
//! it writes joins that turn if the script succeeds and is rolled back if it
//! throws or hits a limit, so a failed script leaves nothing behind.

use std::sync::Arc;
use std::time::Duration;

use super::{Cap, CapSet};
use crate::sandbox::bindings::GuestError;
use crate::sandbox::bindings::marmot::actor::js;
use crate::sandbox::host::{Host, LimitTrap};
use crate::sandbox::{InstanceSpec, InstantiateError, Sandbox, TurnFailure};

/// A way for an instance to start child sandboxes.
#[derive(Clone)]
pub struct JsAccess {
    /// The node's sandbox.
    pub sandbox: Arc<Sandbox>,
}

impl js::Host for Host {
    async fn eval(
        &mut self,
        req: js::EvalRequest,
    ) -> wasmtime::Result<Result<js::EvalResult, GuestError>> {
        self.enter(Cap::Js)?;
        let Some(access) = self.js.clone() else {
            return Ok(Err(GuestError::Denied(
                "a script cannot start scripts".into(),
            )));
        };
        let mut granted = CapSet::NONE;
        for tool in &req.tools {
            let cap = match Cap::parse(tool) {
                Some(Cap::Js) => {
                    return Ok(Err(GuestError::Denied(
                        "a script cannot be given `js`: scripts do not start scripts".into(),
                    )));
                }
                Some(cap) => cap,
                None => {
                    let known: Vec<&str> = Cap::ALL
                        .iter()
                        .filter(|c| **c != Cap::Js)
                        .map(|c| c.name())
                        .collect();
                    return Ok(Err(GuestError::Invalid(format!(
                        "unknown tool `{tool}` (known: {})",
                        known.join(", ")
                    ))));
                }
            };
            if !self.granted.has(cap) {
                return Ok(Err(GuestError::Denied(format!(
                    "`{tool}` cannot be passed on: the caller does not have it"
                ))));
            }
            granted = granted.with(cap);
        }
        let engine = match access.sandbox.js_engine_async().await {
            Ok(e) => e,
            Err(e) => return Ok(Err(GuestError::Internal(e.to_string()))),
        };
        let mut config = access.sandbox.eval_config().clone();
        if let Some(ms) = req.timeout_ms {
            let d = Duration::from_millis(u64::from(ms.max(1)));
            config.cpu_slice = config.cpu_slice.min(d);
            config.turn_timeout = config.turn_timeout.min(d);
        }
        let spec = InstanceSpec {
            config: &config,
            js_module: None,
            actors: self.actors.clone().filter(|_| granted.has(Cap::Actors)),
            http: self.http.clone().filter(|_| granted.has(Cap::Http)),
            models: self.models.clone().filter(|_| granted.has(Cap::Model)),
        };
        let mut child = match access
            .sandbox
            .instantiate_with(&engine, spec, None, granted)
            .await
        {
            Ok(c) => c,
            Err(InstantiateError::NoRoom(_) | InstantiateError::TooManyJs(_)) => {
                return Ok(Err(GuestError::LimitExceeded(
                    "no JavaScript sandbox is free; try again later".into(),
                )));
            }
            Err(InstantiateError::Failed(e)) => return Ok(Err(GuestError::Internal(e))),
        };
        let turn = self
            .turn
            .take()
            .ok_or_else(|| wasmtime::Error::new(LimitTrap::NoTurn))?;
        let (turn, result, logs) = child.run_child(turn, req.code).await;
        self.turn = turn;
        // Waiting for the child is not the caller's CPU.
        self.host_call_ends_stretch();
        Ok(match result {
            Ok(reply) => Ok(js::EvalResult {
                result: reply.result,
                logs: reply.logs,
                error: reply.error,
            }),
            Err(TurnFailure::NoRoom(_)) => Err(GuestError::LimitExceeded(
                "no room to run the script; try again later".into(),
            )),
            Err(TurnFailure::NodeMemory(m)) => {
                Err(GuestError::LimitExceeded(format!("{m}; try again later")))
            }
            Err(TurnFailure::LostState) => {
                return Err(wasmtime::format_err!("the host lost the turn state"));
            }
            // The node's storage failed, not the script.
            Err(TurnFailure::Storage(m)) => Err(GuestError::Internal(m)),
            Err(failure) => Ok(js::EvalResult {
                result: None,
                logs,
                error: Some(match failure {
                    TurnFailure::Trap { message, .. } => message,
                    TurnFailure::Timeout(d) => {
                        format!("the script exceeded its time limit of {} ms", d.as_millis())
                    }
                    TurnFailure::Guest(m) => m,
                    TurnFailure::NoRoom(_)
                    | TurnFailure::NodeMemory(_)
                    | TurnFailure::LostState
                    | TurnFailure::Storage(_) => unreachable!(),
                }),
            }),
        })
    }
}
