//! `marmot:actor/actors`: messages to other actors.
//!
//! `call` waits for the other actor's reply (released once its turn is
//! durable). Turns of one actor never overlap, so an actor cannot be
//! re-entered: a call back into any actor already waiting in the same call
//! chain fails at once with `denied` instead of deadlocking. `send` is
//! one-way and durable: the message is queued in the recipient's inbox by
//! the sending turn's own commit, so it is sent if and only if that turn
//! commits, exactly once.
//!
//! The sandbox does not know how to reach another actor: the actor layer
//! gives each instance an [`ActorCalls`].

use std::sync::Arc;

use super::super::turn::Refusal;
use super::Cap;
use crate::clock::now_ms;
use crate::ids::ActorKey;
use crate::sandbox::bindings::GuestError;
use crate::sandbox::bindings::marmot::actor::actors;
use crate::sandbox::bindings::marmot::actor::types::Reply;
use crate::sandbox::host::Host;
use crate::storage::CommitTracker;
use crate::storage::schema::{InboxKind, InboxRecord};

/// Most actors in one call chain (A calls B calls C …, A included).
pub const MAX_CALL_DEPTH: usize = 8;

/// The callers above a turn, outermost first: a turn that was started by
/// `actors.call` from A, itself called from B, has chain `[B, A]`.
pub type CallChain = Arc<[ActorKey]>;

/// A reply from another actor.
#[derive(Debug, Clone)]
pub struct CallReply {
    /// Its status.
    pub status: u16,
    /// Its body.
    pub body: Vec<u8>,
    /// Its content type.
    pub content_type: Option<String>,
}

/// The error a call's caller sees when the callee's node refused or
/// failed it with API error `code` (the same codes on this node and over
/// HTTP from another): a callee that does not exist is `not-found`, one
/// with no room for now (its mailbox full, its type's rate, the node out
/// of instance slots) is `limit-exceeded`, so that a guest can tell
/// "retry later" from "the callee broke" (`internal`, also for its
/// traps: the limits it ran into are its own, not the caller's).
pub fn call_refused(code: &str, message: String) -> GuestError {
    match code {
        "unknown_type" | "actor_not_found" => GuestError::NotFound(message),
        "mailbox_full" | "inbox_full" | "rate_limited" | "overloaded" => {
            GuestError::LimitExceeded(message)
        }
        _ => GuestError::Internal(message),
    }
}

/// What turns may ask of other actors; the actor layer implements it. A
/// narrow trait keeps the sandbox free of the actor runtime.
pub trait ActorCalls: Send + Sync {
    /// Send `body` to `to` as a message and wait for its (durable) reply.
    /// `chain` holds the callers above the call, the caller last; `key`,
    /// if any, names the call (see `ActorsCtx::call_key`): the callee
    /// stores it after [`CALL_KEY_PREFIX`].
    fn call(
        self: Arc<Self>,
        to: ActorKey,
        body: Vec<u8>,
        chain: CallChain,
        key: Option<String>,
    ) -> futures::future::BoxFuture<'static, Result<CallReply, GuestError>>;

    /// Count a message to an actor of type `ty` against the type's rate
    /// limit: `not-found` when no such type is deployed, `limit-exceeded`
    /// past its limit.
    fn admit(&self, ty: &str) -> Result<(), GuestError>;

    /// Count a message of `bytes` sent to `to` against its durable inbox's
    /// bound (`limits.max_inbox_messages`, `max_inbox_bytes`):
    /// `limit-exceeded` when it is full. Counted at once, though the send
    /// is made only if the turn commits: the claim, if any, settles it
    /// (`None`: the recipient's own node counts it, in a cluster).
    fn admit_send(
        &self,
        to: &ActorKey,
        bytes: u64,
    ) -> Result<Option<Box<dyn InboxClaim>>, GuestError>;
}

/// A message a turn sends: its recipient, and its inbox row.
pub type SentMessage = (ActorKey, InboxRecord);

/// A send counted against its recipient's inbox while its turn runs
/// ([`ActorCalls::admit_send`]): told once the send is on disk, and taken
/// back if dropped before (the turn failed, or rolled the send back).
pub trait InboxClaim: Send + std::fmt::Debug {
    /// The send's commit is durable.
    fn queued(&mut self);
}

/// The last commit an actor submitted before a turn, and its generation.
/// A request that leaves mid-turn (`actors.call`) must not depend on
/// earlier turns that could still fail to commit.
#[derive(Clone)]
pub struct DurableBefore {
    /// The actor's commit bookkeeping.
    pub tracker: Arc<CommitTracker>,
    /// Submitted seq to wait for.
    pub seq: u64,
    /// The actor's generation (a failed commit raises the tracker's).
    pub generation: u64,
}

/// Limits of the actors capability.
#[derive(Debug, Clone, Copy)]
pub struct ActorLimits {
    /// Messages one turn may send with `actors.send`.
    pub max_sends_per_turn: usize,
    /// Largest message body.
    pub max_message_bytes: usize,
    /// Bytes of all the messages one turn sends: each is held several
    /// times over until the turn commits (a turn of 100 sends of 1 MiB
    /// took ~500 MB of the node's memory, found by a probe).
    pub max_turn_send_bytes: usize,
}

/// The actors part of a turn.
pub struct ActorsCtx {
    limits: ActorLimits,
    /// Callers above this turn (`actors.call`), for cycle detection.
    chain: CallChain,
    /// This actor's commits before this turn: `actors.call` waits for them.
    durable_before: Option<DurableBefore>,
    /// Messages sent with `actors.send`, queued when the turn commits.
    sends: Vec<(ActorKey, InboxRecord)>,
    /// Their counts against their recipients' inboxes, one per send.
    claims: Vec<Option<Box<dyn InboxClaim>>>,
    /// The turn sent its own actor a message the type's rate limit did not
    /// count (see [`ActorsCtx::counts_against_rate`]).
    continued: bool,
    /// The caller and turn id its calls' keys are made of, when the turn
    /// may run again under that id (see `ActorsCtx::call_key`).
    calls_of: Option<(ActorKey, String)>,
    /// Calls made so far: the next one's number.
    calls: u32,
}

impl ActorsCtx {
    pub(crate) fn new(
        limits: ActorLimits,
        chain: CallChain,
        durable_before: Option<DurableBefore>,
        calls_of: Option<(ActorKey, String)>,
    ) -> Self {
        Self {
            limits,
            chain,
            durable_before,
            sends: Vec::new(),
            claims: Vec::new(),
            continued: false,
            calls_of,
            calls: 0,
        }
    }

    /// Whether a send from actor `from` to `to` counts against the
    /// recipient type's rate limit. A turn's first message to its own actor
    /// does not: it is how a turn continues its work in the next one (the
    /// agent harness steps a run that way), and a chain of one per turn
    /// never grows the inbox. Every further one does, so a turn that sends
    /// itself two or more (which grows without bound) is held to the rate.
    fn counts_against_rate(&mut self, from: &ActorKey, to: &ActorKey) -> bool {
        if from == to && !self.continued {
            self.continued = true;
            return false;
        }
        true
    }

    /// Queue a message to `to`, sent durably if and only if this turn
    /// commits; `claim` counts it against `to`'s inbox meanwhile.
    pub fn send(
        &mut self,
        to: ActorKey,
        body: Vec<u8>,
        now_ms: u64,
        claim: Option<Box<dyn InboxClaim>>,
    ) -> Result<(), Refusal> {
        self.check_send(body.len())?;
        let message = InboxRecord {
            message_id: crate::ids::new_message_id(),
            body,
            content_type: Some("application/json".into()),
            idempotency_key: None,
            attempts: 0,
            enqueued_at_ms: now_ms,
            kind: InboxKind::Message,
        };
        self.sends.push((to, message));
        self.claims.push(claim);
        Ok(())
    }

    /// Check a call from actor `me` to `to` and return the chain it
    /// carries (the callers above it, `me` last).
    fn check_call(
        &self,
        me: &ActorKey,
        to: &ActorKey,
        len: usize,
    ) -> Result<CallChain, GuestError> {
        if to == me || self.chain.contains(to) {
            let path: Vec<String> = self
                .chain
                .iter()
                .chain([me, to])
                .map(ToString::to_string)
                .collect();
            return Err(GuestError::Denied(format!(
                "call cycle {}: an actor waiting for a reply cannot take another turn",
                path.join(" → ")
            )));
        }
        if self.chain.len() + 1 >= MAX_CALL_DEPTH {
            return Err(GuestError::LimitExceeded(format!(
                "a call chain may hold at most {MAX_CALL_DEPTH} actors"
            )));
        }
        if len > self.limits.max_message_bytes {
            return Err(GuestError::LimitExceeded(format!(
                "a message of {len} bytes exceeds the limit of {} bytes",
                self.limits.max_message_bytes
            )));
        }
        Ok(self.chain.iter().cloned().chain([me.clone()]).collect())
    }

    /// How many sends a rollback to this point keeps.
    pub(crate) fn savepoint(&self) -> usize {
        self.sends.len()
    }

    /// Drop the sends since `sp` (and their claims: not queued).
    pub(crate) fn rollback(&mut self, sp: usize) {
        self.sends.truncate(sp);
        self.claims.truncate(sp);
    }

    /// Whether one more message of `len` bytes may be sent this turn.
    pub fn check_send(&self, len: usize) -> Result<(), Refusal> {
        if self.sends.len() >= self.limits.max_sends_per_turn {
            return Err(Refusal::Limit(format!(
                "a turn may send at most {} messages",
                self.limits.max_sends_per_turn
            )));
        }
        if len > self.limits.max_message_bytes {
            return Err(Refusal::Limit(format!(
                "a message of {len} bytes exceeds the limit of {} bytes",
                self.limits.max_message_bytes
            )));
        }
        let sent: usize = self.sends.iter().map(|(_, r)| r.body.len()).sum();
        if sent + len > self.limits.max_turn_send_bytes {
            return Err(Refusal::Limit(format!(
                "a turn may send at most {} bytes of messages ({sent} sent, {len} more asked)",
                self.limits.max_turn_send_bytes
            )));
        }
        Ok(())
    }

    /// The messages to queue in the turn's commit.
    pub(crate) fn finish(self) -> (Vec<SentMessage>, Vec<Box<dyn InboxClaim>>) {
        (self.sends, self.claims.into_iter().flatten().collect())
    }
}

/// Prefix of the idempotency keys of calls, as the callee stores them.
/// NUL cannot appear in an `Idempotency-Key` header: no client can send
/// (or claim) one.
pub const CALL_KEY_PREFIX: &str = "\0call:";

/// The idempotency key the callee stores call key `key` under.
pub fn stored_call_key(key: &str) -> String {
    format!("{CALL_KEY_PREFIX}{key}")
}

impl ActorsCtx {
    /// The number of the turn's next call: taken as the call starts, before
    /// any check that may refuse it, so that a turn run again numbers its
    /// calls alike.
    fn next_call(&mut self) -> u32 {
        self.calls += 1;
        self.calls - 1
    }

    /// The idempotency key of call `n` to `to` with `body`, if the turn
    /// may run again under its turn id (a durable message recovered after
    /// a crash, an alarm retried, an upgrade, an input): that run's same
    /// call has the same key, and the callee answers it with its first
    /// reply instead of running again (a recovered caller applied its
    /// calls' effects twice: found by a probe). The target and body are
    /// part of it: a call that differs on the second run (a timestamp in
    /// its body, new code) is a new call, not a conflict. A direct message
    /// runs again only when asked again under its `Idempotency-Key` (or
    /// call key): its calls' keys are made from that; without one, and in
    /// evals, calls carry none (each would cost the callee a stored reply
    /// for a day).
    fn call_key(&self, n: u32, to: &ActorKey, body: &[u8]) -> Option<String> {
        use sha2::Digest as _;
        let (caller, turn_id) = self.calls_of.as_ref()?;
        let mut h = sha2::Sha256::new();
        for part in [
            caller.to_string().as_bytes(),
            turn_id.as_bytes(),
            to.to_string().as_bytes(),
        ] {
            h.update((part.len() as u64).to_le_bytes());
            h.update(part);
        }
        h.update(n.to_le_bytes());
        h.update(body);
        Some(hex::encode(&h.finalize()[..16]))
    }
}

fn target(ty: &str, id: &str) -> Result<ActorKey, GuestError> {
    ActorKey::new(ty, id).map_err(|e| GuestError::Invalid(e.to_string()))
}

impl actors::Host for Host {
    async fn call(
        &mut self,
        actor_type: String,
        id: String,
        body: Vec<u8>,
    ) -> wasmtime::Result<Result<Reply, GuestError>> {
        let calls = self.actors.clone();
        let turn = self.enter(Cap::Actors)?;
        let n = turn.actors.next_call();
        let to = match target(&actor_type, &id) {
            Ok(k) => k,
            Err(e) => return Ok(Err(e)),
        };
        let Some(calls) = calls else {
            return Ok(Err(GuestError::Unsupported(
                "actors.call is not available in this sandbox".into(),
            )));
        };
        let chain = match turn.actors.check_call(&turn.key, &to, body.len()) {
            Ok(c) => c,
            Err(e) => return Ok(Err(e)),
        };
        if let Err(e) = calls.admit(&actor_type) {
            return Ok(Err(e));
        }
        // The request may carry state of this actor's earlier turns, still
        // in flight to disk: only send it once they are durable.
        if let Some(before) = turn.actors.durable_before.clone() {
            before
                .tracker
                .wait_committed(before.seq, before.generation)
                .await;
            if before.tracker.min_generation() > before.generation {
                return Ok(Err(GuestError::Internal(
                    "an earlier commit of this actor failed; the call was not made".into(),
                )));
            }
        }
        let key = turn.actors.call_key(n, &to, &body);
        Ok(calls.call(to, body, chain, key).await.map(|r| Reply {
            status: r.status,
            body: r.body,
            content_type: r.content_type,
        }))
    }

    async fn send(
        &mut self,
        actor_type: String,
        id: String,
        body: Vec<u8>,
    ) -> wasmtime::Result<Result<(), GuestError>> {
        let calls = self.actors.clone();
        let turn = self.enter(Cap::Actors)?;
        let to = match target(&actor_type, &id) {
            Ok(k) => k,
            Err(e) => return Ok(Err(e)),
        };
        let Some(calls) = calls else {
            return Ok(Err(GuestError::Unsupported(
                "actors.send is not available in this sandbox".into(),
            )));
        };
        // Checked before the send is queued: a refused send costs no rate,
        // and one over the rate is never queued.
        if let Err(e) = turn.actors.check_send(body.len()) {
            return Ok(Err(e.into()));
        }
        // A turn's first message to its own actor continues its work (see
        // `counts_against_rate`): neither the rate nor a full inbox holds
        // it back. Every other send is held to both: sends from turns grew
        // an inbox without bound, past the limit clients are held to
        // (found by a probe). The inbox first: a send it refuses takes
        // none of the type's rate, which its other actors share.
        let mut claim = None;
        if turn.actors.counts_against_rate(&turn.key, &to) {
            claim = match calls.admit_send(&to, body.len() as u64) {
                Ok(c) => c,
                Err(e) => return Ok(Err(e)),
            };
            // (A refusal here drops the claim: the send was not made.)
            if let Err(e) = calls.admit(&actor_type) {
                return Ok(Err(e));
            }
        }
        Ok(turn
            .actors
            .send(to, body, now_ms(), claim)
            .map_err(Into::into))
    }
}
