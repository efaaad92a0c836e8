//! Virtual actors: activation, mailboxes, turns and hibernation.
//!
//! An actor is *active* while a task owns it: the task holds its mailbox, its
//! state cache and (once a turn needs it) a wasmtime instance. Turns of one
//! actor run one at a time, in mailbox order. When the mailbox stays empty
//! for the type's idle timeout, and every commit the actor produced is
//! durable, the task removes itself from the [`Registry`] and everything it
//! held is freed: the actor is *hibernated* and costs only disk. The next
//! message wakes it from redb.
//!
//! The lifecycle is `hibernated → active → hibernated`; the [`Registry`]'s
//! shard lock makes "check the mailbox is empty, then leave" atomic with
//! respect to senders, so no message is ever delivered to a task that is on
//! its way out.
//!
//! Nothing here holds the node: tasks and the registry run on an
//! [`ActorEnv`] of the parts they use.

mod caches;
mod env;
pub(crate) mod inboxes;
mod registry;
mod task;

pub use crate::sandbox::EvalReply;
pub use env::{ActorEnv, Boot, Parts};
pub use registry::Registry;
pub(crate) use task::instantiate_with_room;

use bytes::Bytes;
use tokio::sync::{OwnedSemaphorePermit, oneshot};

/// Something for an actor to do.
pub enum Envelope {
    /// A message whose sender waits for the reply.
    Message(Box<Delivery>),
    /// Durable messages were added to the actor's inbox.
    InboxPoke,
    /// Delete the actor and everything it owns.
    Delete(oneshot::Sender<Result<bool, TurnError>>),
    /// Crash recovery: run the inbox, then release the permit.
    Recover(OwnedSemaphorePermit),
    /// Run a script in a fresh JavaScript sandbox bound to the actor.
    Eval(String, oneshot::Sender<Result<EvalReply, TurnError>>),
    /// An alarm is due.
    Alarm(Box<crate::alarms::scheduler::DueAlarm>),
    /// Some of the actor's events are past retention: trim them (a
    /// bookkeeping commit; the sandbox is not woken).
    TrimEvents,
    /// An answer to one of the actor's input requests.
    Answer(Box<AnswerDelivery>),
    /// A verified inbound webhook, to run at once and commit with its
    /// de-duplication record (one commit instead of an inbox row and a
    /// turn); the actor hands it back when it cannot run it now.
    Webhook(Box<WebhookDelivery>),
}

/// A verified inbound webhook on its way to its actor.
pub struct WebhookDelivery {
    /// What the inbox would hold (its idempotency key is the delivery's
    /// de-duplication key).
    pub record: crate::storage::schema::InboxRecord,
    /// How long the de-duplication record is kept.
    pub dedupe_ttl_ms: u64,
    /// Gets the outcome once it is durable, or the record back.
    pub reply: oneshot::Sender<Result<WebhookOutcome, TurnError>>,
}

/// What became of a webhook handed to its actor.
pub enum WebhookOutcome {
    /// Its turn ran (or failed visibly, with a `turn_failed` event) and is
    /// durable with its de-duplication record; or it was a duplicate.
    Done(crate::storage::EnqueueOutcome),
    /// It did not run (queued durable work ahead of it, no instance slot,
    /// a storage error): enqueue it in the durable inbox instead.
    NotRun(Box<crate::storage::schema::InboxRecord>),
}

/// An answer on its way to the actor that asked.
pub struct AnswerDelivery {
    /// The input request.
    pub input_id: String,
    /// The answer (JSON).
    pub response: Vec<u8>,
    /// Gets the outcome once the `on-input` turn is durable.
    pub reply: oneshot::Sender<Result<(), TurnError>>,
}

/// A message and where its reply goes.
pub struct Delivery {
    /// The message id.
    pub message_id: String,
    /// The body.
    pub body: Bytes,
    /// The sender's content type.
    pub content_type: Option<String>,
    /// The sender's `Idempotency-Key`.
    pub idempotency_key: Option<String>,
    /// Actors waiting for this message's reply (`actors.call`), outermost
    /// first; empty for clients.
    pub chain: crate::sandbox::CallChain,
    /// Completed once the turn is durable (or failed).
    pub reply: oneshot::Sender<Result<TurnReply, TurnError>>,
    /// The sender's span (a caller's turn, a request with a
    /// `traceparent`), parent of the turn's span; `None` with traces off.
    pub trace: Option<crate::telemetry::Parent>,
    /// The client request's `x-request-id`, for the turn's log lines.
    pub request_id: Option<std::sync::Arc<str>>,
    /// When the message was handed to the actor.
    pub sent_at: std::time::Instant,
}

/// The reply to a message, released only after its turn is durable.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TurnReply {
    /// HTTP status chosen by the actor.
    pub status: u16,
    /// Body.
    pub body: Bytes,
    /// Content type chosen by the actor.
    pub content_type: Option<String>,
    /// The message id of the turn that produced it.
    pub message_id: String,
    /// True when this is a stored reply returned for a repeated
    /// `Idempotency-Key` (the turn did not run again).
    pub replayed: bool,
}

/// Why a message produced no reply.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum TurnError {
    /// No such type.
    #[error("unknown actor type `{0}`")]
    UnknownType(String),
    /// No such actor.
    #[error("actor not found")]
    NotFound,
    /// The mailbox is full.
    #[error("the actor's mailbox is full ({0} messages queued); retry later")]
    MailboxFull(usize),
    /// The actor's durable inbox holds as much as it may.
    #[error("{0}; retry later")]
    InboxFull(String),
    /// No room to run the turn: no instance slot free, or no file
    /// descriptor.
    #[error("{0}; retry later")]
    Overloaded(Shortage),
    /// The turn grew its memory past what the node's guest memory budget
    /// had left; it changed nothing.
    #[error("{0}; the turn changed nothing, retry later")]
    NoGuestMemory(String),
    /// The guest's handler returned an error.
    #[error("{0}")]
    ActorError(String),
    /// The guest trapped.
    #[error("actor trapped ({kind}): {message}")]
    Trap {
        /// `cpu`, `memory`, `stack_overflow` or `trap`.
        kind: &'static str,
        /// What happened.
        message: String,
    },
    /// The turn ran past its wall-clock limit.
    #[error("the turn exceeded its time limit of {0} ms")]
    Timeout(u64),
    /// `on-upgrade` failed; the actor stays on its old version.
    #[error("upgrading the actor to version {to} failed: {reason}")]
    UpgradeFailed {
        /// Target version.
        to: u32,
        /// Why.
        reason: String,
    },
    /// The same idempotency key is queued as a durable message.
    #[error("a durable message with this Idempotency-Key is queued and has not run yet")]
    IdempotencyInProgress,
    /// The idempotency key was used for a request with another body.
    #[error(
        "this Idempotency-Key was used by message `{0}` with a different body; \
         a new request needs a new key"
    )]
    IdempotencyKeyReused(String),
    /// The durable message with this idempotency key failed.
    #[error("the durable message with this Idempotency-Key failed: {0}")]
    PreviouslyFailed(String),
    /// The code could not be loaded.
    #[error("cannot load the actor's code: {0}")]
    Code(String),
    /// Storage failed; nothing was committed.
    #[error("{0}")]
    Storage(String),
    /// A host call failed on the node's storage while the guest ran: the
    /// guest was stopped part way (after whatever it had sent or paid
    /// for), so unlike [`TurnError::Storage`] it counts as an attempt and
    /// a durable message fails as after a trap, not retried for ever.
    #[error("{0}")]
    StorageMidTurn(String),
    /// The actor's rows left this node (a move, its slot changed hands)
    /// or were replaced while the turn ran: nothing of it was written,
    /// and routed again a retry reaches the actor where it is now.
    #[error("{0}")]
    Moved(String),
    /// The actor task went away.
    #[error("the actor stopped before replying")]
    Stopped,
    /// No input request with this id.
    #[error("no input request `{0}`")]
    InputNotFound(String),
    /// The input request was already answered or has expired.
    #[error("input request `{id}` is already {status}")]
    InputSettled {
        /// Its id.
        id: String,
        /// `answered` or `expired`.
        status: &'static str,
    },
    /// The answer is not JSON, or does not satisfy the request's schema
    /// (the sentence says which).
    #[error("{0}")]
    InvalidAnswer(String),
}

/// What a turn found no room for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Shortage {
    /// Every instance slot is taken.
    Slot,
    /// As many JavaScript sandboxes are live as the node allows (it said
    /// "no free instance slot", naming no limit: a probe).
    JsSandboxes,
    /// The process is at its open-files limit: a module's first instance
    /// needs one for its memory image. It was reported as "no free
    /// instance slot", which sent operators after the wrong limit.
    OpenFiles,
}

impl Shortage {
    /// The shortage a sandbox's error message names.
    pub fn of(message: &str) -> Self {
        // EMFILE (the process's limit) and ENFILE (the system's).
        if message.contains("Too many open files")
            || message.contains("os error 24")
            || message.contains("os error 23")
        {
            Self::OpenFiles
        } else if message.contains("JavaScript sandboxes are in use") {
            Self::JsSandboxes
        } else {
            Self::Slot
        }
    }
}

impl std::fmt::Display for Shortage {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            Self::Slot => "the node has no free instance slot",
            Self::JsSandboxes => {
                "every JavaScript sandbox the node allows is in use (limits.max_js_sandboxes)"
            }
            Self::OpenFiles => {
                "the node is out of file descriptors (its open-files limit, raised at start \
                 to the hard limit: LimitNOFILE= in a systemd unit, ulimit -Hn)"
            }
        })
    }
}

impl TurnError {
    /// Stable snake_case code for the API.
    pub fn code(&self) -> &'static str {
        match self {
            TurnError::UnknownType(_) => "unknown_type",
            TurnError::NotFound => "actor_not_found",
            TurnError::MailboxFull(_) => "mailbox_full",
            TurnError::InboxFull(_) => "inbox_full",
            TurnError::Overloaded(_) | TurnError::NoGuestMemory(_) => "overloaded",
            TurnError::ActorError(_) => "actor_error",
            TurnError::Trap { kind, .. } => match *kind {
                "cpu" => "cpu_limit_exceeded",
                "memory" => "memory_limit_exceeded",
                "stack_overflow" => "stack_overflow",
                _ => "actor_trapped",
            },
            TurnError::Timeout(_) => "turn_timeout",
            TurnError::UpgradeFailed { .. } => "upgrade_failed",
            TurnError::IdempotencyInProgress => "idempotency_key_in_use",
            TurnError::IdempotencyKeyReused(_) => "idempotency_key_reused",
            TurnError::PreviouslyFailed(_) => "turn_failed",
            TurnError::Code(_) => "code_unavailable",
            TurnError::Storage(_) | TurnError::StorageMidTurn(_) => "storage_error",
            TurnError::Moved(_) => "actor_moved",
            TurnError::Stopped => "actor_stopped",
            TurnError::InputNotFound(_) => "input_not_found",
            TurnError::InputSettled { .. } => "input_settled",
            TurnError::InvalidAnswer(_) => "invalid_answer",
        }
    }

    /// HTTP status.
    pub fn status(&self) -> u16 {
        match self {
            TurnError::UnknownType(_) | TurnError::NotFound | TurnError::InputNotFound(_) => 404,
            TurnError::InputSettled { .. } => 409,
            TurnError::InvalidAnswer(_) | TurnError::IdempotencyKeyReused(_) => 422,
            TurnError::MailboxFull(_) | TurnError::InboxFull(_) => 429,
            TurnError::Overloaded(_)
            | TurnError::NoGuestMemory(_)
            | TurnError::Storage(_)
            | TurnError::StorageMidTurn(_)
            | TurnError::Moved(_)
            | TurnError::Stopped => 503,
            TurnError::IdempotencyInProgress => 409,
            TurnError::Timeout(_) => 504,
            _ => 500,
        }
    }
}

impl From<crate::storage::StorageError> for TurnError {
    fn from(e: crate::storage::StorageError) -> Self {
        match e {
            crate::storage::StorageError::CommitFailed(c) => c.into(),
            e => TurnError::Storage(e.to_string()),
        }
    }
}

impl From<crate::storage::CommitFailed> for TurnError {
    fn from(e: crate::storage::CommitFailed) -> Self {
        match e {
            crate::storage::CommitFailed::Moved(why) => TurnError::Moved(why),
            // A forced delete cut the turn: answered as the type's messages
            // are from then on (it was a 503 `storage_error`, which told
            // clients and operators the disk was failing: a probe).
            crate::storage::CommitFailed::TypeDeleted(ty) => TurnError::UnknownType(ty),
            e => TurnError::Storage(e.to_string()),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_turn_without_room_says_what_ran_out() {
        // What wasmtime and the sandbox say at the open-files limit.
        for msg in [
            "cannot create a memfd for the module's memory image: Too many open files (os error 24)",
            "failed to create memfd: os error 24",
            "File table overflow (os error 23)",
        ] {
            let e = TurnError::Overloaded(Shortage::of(msg));
            assert!(e.to_string().contains("out of file descriptors"), "{e}");
            assert_eq!((e.status(), e.code()), (503, "overloaded"));
        }
        assert_eq!(
            Shortage::of("cannot create a memfd: Cannot allocate memory (os error 12)"),
            Shortage::Slot
        );
        let e = TurnError::Overloaded(Shortage::of(
            "maximum concurrent core instance limit of 10064 reached",
        ));
        assert_eq!(
            e.to_string(),
            "the node has no free instance slot; retry later"
        );
        let e = TurnError::Overloaded(Shortage::of(
            &crate::sandbox::InstantiateError::TooManyJs(20).to_string(),
        ));
        assert!(e.to_string().contains("limits.max_js_sandboxes"), "{e}");
        assert_eq!((e.status(), e.code()), (503, "overloaded"));
    }
}
