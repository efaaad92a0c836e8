//! `marmot:actor/model`: LLM calls through the node's model gateway.
//!
//! The guest sends the normalized chat request as JSON text and gets the
//! normalized answer back; the host adds the provider's key (it never
//! enters the sandbox), retries, falls back, and, for `"stream": true`,
//! sends the token deltas to the actor's live event stream as they arrive
//! (`event: delta` frames: `{"call": n, "type": "text", "text": …}`, where
//! `n` counts the turn's model calls). Like a fetch, a call is a side
//! effect outside the turn's transaction, keeps the actor awake and is not
//! CPU time.
//!
//! A type with a `budget` has each call reserved in the node's ledger
//! before it is sent (refused with `budget_exceeded` if it could exceed a
//! limit) and settled when it returns; the turn's usage commits with the
//! turn (docs/models.md, "Usage and budgets").

use std::sync::Arc;

use super::Cap;
use crate::config::Budget;
use crate::ids::ActorKey;
use crate::models::budget::{Ledger, Spend};
use crate::models::errors::ErrorKind;
use crate::models::{ChatRequest, Delta, Gateway, ModelError};
use crate::sandbox::bindings::GuestError;
use crate::sandbox::bindings::marmot::actor::model;
use crate::sandbox::host::Host;
use crate::storage::schema::UsageRecord;
use crate::streams::EventBus;

/// What an instance's model calls go through.
#[derive(Clone)]
pub struct ModelAccess {
    /// The gateway.
    pub gateway: Arc<Gateway>,
    /// Budgets.
    pub ledger: Arc<Ledger>,
    /// Where live deltas go.
    pub bus: Arc<EventBus>,
    /// The type's budget, if it has one.
    pub budget: Option<Budget>,
}

/// When a budget applies and the request sets no `max_output_tokens`,
/// this is set, so that the reservation bounds the call.
pub const BUDGETED_MAX_OUTPUT_TOKENS: u64 = 4096;

/// The model part of a turn.
pub struct ModelCtx {
    /// The actor's number (its usage row).
    num: u64,
    /// Calls made so far (numbers the live frames).
    calls: u32,
    /// What the turn's calls used.
    usage: TurnUsage,
    /// The ledger holding `usage.held`, once a budgeted call settled.
    holder: Option<(Arc<Ledger>, ActorKey)>,
}

impl Drop for ModelCtx {
    /// A turn dropped with its usage untaken (a timeout while a child
    /// script held it): its calls were paid for, so their spend counts as
    /// spent, in memory at least (no commit will record it).
    fn drop(&mut self) {
        if let Some((ledger, key)) = &self.holder
            && self.usage.held != Spend::default()
        {
            ledger.committed(key, &self.usage.record, self.usage.held);
        }
    }
}

/// Model usage of one turn.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct TurnUsage {
    /// Added to the actor's and the type's usage by the turn's commit.
    pub record: UsageRecord,
    /// The part of it the budget ledger holds until that commit is
    /// durable.
    pub held: Spend,
}

impl TurnUsage {
    /// No model was called.
    pub fn is_empty(&self) -> bool {
        self.record.is_empty()
    }
}

impl ModelCtx {
    /// The model part of a turn of actor `num`.
    pub fn new(num: u64) -> Self {
        Self {
            num,
            calls: 0,
            usage: TurnUsage::default(),
            holder: None,
        }
    }

    /// What the turn's calls used (the turn is over).
    pub fn take_usage(&mut self) -> TurnUsage {
        std::mem::take(&mut self.usage)
    }
}

impl model::Host for Host {
    async fn chat(&mut self, request: String) -> wasmtime::Result<Result<String, GuestError>> {
        let turn = self.enter(Cap::Model)?;
        let key = turn.key.clone();
        let call = turn.model.calls;
        let num = turn.model.num;
        turn.model.calls += 1;
        let Some(access) = self.models.clone() else {
            return Ok(Err(GuestError::Unsupported(
                "model calls are not available in this sandbox".into(),
            )));
        };
        let mut req = match ChatRequest::parse(&request) {
            Ok(r) => r,
            Err(why) => return Ok(Err(GuestError::Invalid(why))),
        };
        let reservation = match &access.budget {
            None => None,
            Some(budget) => {
                if req.max_output_tokens.is_none() {
                    req.max_output_tokens = Some(BUDGETED_MAX_OUTPUT_TOKENS);
                }
                let amount = match access.gateway.estimate(&req, budget.limits_cost()) {
                    Ok(a) => a,
                    Err(e) => return Ok(Err(guest_error(e))),
                };
                match access.ledger.reserve(&key, num, budget, amount) {
                    Ok(Ok(r)) => Some(r),
                    Ok(Err(over)) => {
                        tracing::info!(actor = %key, error = %over, "model call refused");
                        return Ok(Err(GuestError::LimitExceeded(over.to_string())));
                    }
                    Err(e) => return Ok(Err(GuestError::Internal(e.to_string()))),
                }
            }
        };
        let mut live = LiveDeltas {
            bus: access.bus.clone(),
            key: key.clone(),
            call,
        };
        let started = std::time::Instant::now();
        let result = access
            .gateway
            .chat(&req, &mut |d: &Delta| live.send(d))
            .await;
        match result {
            Ok(resp) => {
                let u = &resp.usage;
                let record = UsageRecord {
                    calls: 1,
                    input_tokens: u.input_tokens,
                    output_tokens: u.output_tokens,
                    cost_nano_usd: u.cost_usd.map_or(0, |c| (c * 1e9).round() as u64),
                };
                let spend = Spend::of(&record);
                let held = match reservation {
                    Some(r) => {
                        access.ledger.settle(r, spend);
                        spend
                    }
                    None => Spend::default(),
                };
                if let Some(turn) = self.turn.as_mut() {
                    let usage = &mut turn.model.usage;
                    usage.record = usage.record.plus(record);
                    usage.held = usage.held.plus(held);
                    if held != Spend::default() && turn.model.holder.is_none() {
                        turn.model.holder = Some((access.ledger.clone(), key.clone()));
                    }
                }
                tracing::debug!(
                    actor = %key,
                    provider = %resp.provider,
                    model = %resp.model,
                    input_tokens = u.input_tokens,
                    output_tokens = u.output_tokens,
                    ms = started.elapsed().as_millis() as u64,
                    "model call"
                );
                Ok(Ok(serde_json::to_string(&resp).expect("a response encodes")))
            }
            Err(e) => {
                if let Some(r) = reservation {
                    access.ledger.release(r);
                }
                tracing::info!(actor = %key, provider = %req.provider, model = %req.model, error = %e, "model call failed");
                Ok(Err(guest_error(e)))
            }
        }
    }
}

/// Sends one call's deltas as live frames.
struct LiveDeltas {
    bus: Arc<EventBus>,
    key: ActorKey,
    call: u32,
}

impl LiveDeltas {
    fn send(&mut self, d: &Delta) {
        let mut v = serde_json::to_value(d).expect("a delta encodes");
        v["call"] = self.call.into();
        self.bus.live(&self.key, Arc::from(v.to_string()));
    }
}

/// The guest's view of a failure; the message starts with a code the
/// guest can act on (`context_length_exceeded: …`, `rate_limited: …`).
fn guest_error(e: ModelError) -> GuestError {
    let text = e.to_string();
    match e {
        ModelError::Invalid(_) => GuestError::Invalid(text),
        ModelError::NotFound(_) => GuestError::NotFound(text),
        ModelError::Denied(_) => GuestError::Denied(text),
        ModelError::Failed { kind, .. } => match kind {
            ErrorKind::Invalid | ErrorKind::ContextLength => GuestError::Invalid(text),
            ErrorKind::RateLimited | ErrorKind::QuotaExhausted => GuestError::LimitExceeded(text),
            ErrorKind::Auth | ErrorKind::Refused => GuestError::Denied(text),
            ErrorKind::NotFound => GuestError::NotFound(text),
            ErrorKind::Overloaded
            | ErrorKind::Server
            | ErrorKind::Connection
            | ErrorKind::Timeout => GuestError::Internal(text),
        },
    }
}
