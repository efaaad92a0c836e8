//! Per-actor commit bookkeeping shared by an actor and the writer: which of
//! its turns are durable, and which generation of its turns may still
//! commit.

use std::sync::atomic::{AtomicU64, Ordering};

use tokio::sync::Notify;

/// A commit failed; nothing in it was written.
#[derive(Debug, Clone, thiserror::Error)]
pub enum CommitFailed {
    /// The transaction failed to apply or commit.
    #[error("commit failed: {0}")]
    Storage(String),
    /// An earlier commit of the same actor failed, so this turn, which ran on
    /// top of it, was refused.
    #[error("an earlier commit of this actor failed; the turn was discarded")]
    Superseded,
    /// The writer is shutting down.
    #[error("node is shutting down")]
    ShuttingDown,
    /// This node may not write the actor now (another node owns it, or its
    /// slot has no backup and the cluster refuses writes without one):
    /// nothing of the turn was written.
    #[error("{0}")]
    Refused(String),
    /// The actor's rows left this node (it moved, or its slot changed
    /// hands) or were replaced before the commit: nothing of it was
    /// written here, and routed again a retry reaches the actor where it
    /// is now.
    #[error("{0}")]
    Moved(String),
    /// The actor's type (named) was deleted while the turn ran: nothing of
    /// it was written.
    #[error("the actor's type `{0}` was deleted while the turn ran; nothing of it was written")]
    TypeDeleted(String),
}

impl CommitFailed {
    /// Why an activation's turns were refused after its rows moved away
    /// or were replaced underneath it (see [`CommitTracker::invalidate`]).
    pub(crate) fn rows_moved() -> Self {
        CommitFailed::Moved(
            "the actor moved (or its rows were replaced) while the turn ran; nothing of it \
             was written, and a retry reaches the actor where it is now"
                .into(),
        )
    }
}

/// Per-actor commit bookkeeping shared between an actor and the writer.
#[derive(Debug, Default)]
pub struct CommitTracker {
    /// Turns from generations below this are refused (an earlier commit failed).
    min_generation: AtomicU64,
    /// Highest turn sequence number known durable.
    committed_seq: AtomicU64,
    /// Signalled after every commit that includes this actor.
    committed: Notify,
    /// What failed the commit that last refused a generation: the replies
    /// of that generation's turns say it.
    failure: std::sync::Mutex<Option<CommitFailed>>,
}

impl CommitTracker {
    /// The lowest generation the writer still accepts.
    pub fn min_generation(&self) -> u64 {
        self.min_generation.load(Ordering::Acquire)
    }

    /// Highest turn sequence number known durable.
    pub fn committed_seq(&self) -> u64 {
        self.committed_seq.load(Ordering::Acquire)
    }

    /// Wait until turn `seq` is durable or the generation was superseded.
    pub async fn wait_committed(&self, seq: u64, generation: u64) {
        loop {
            let notified = self.committed.notified();
            tokio::pin!(notified);
            notified.as_mut().enable();
            if self.committed_seq() >= seq || self.min_generation() > generation {
                return;
            }
            notified.await;
        }
    }

    /// Why the turns of a refused generation failed: what failed the commit
    /// that refused it ([`CommitFailed::Superseded`] when nothing says more).
    pub fn failure(&self) -> CommitFailed {
        self.failure_slot()
            .clone()
            .unwrap_or(CommitFailed::Superseded)
    }

    /// Refuse every later commit of this actor: its type `ty` is being
    /// deleted.
    pub fn fence(&self, ty: &str) {
        self.mark_failed(u64::MAX - 1, &CommitFailed::TypeDeleted(ty.to_owned()));
    }

    /// Refuse the commits of this actor's current generation, so that its
    /// activation reloads from disk before its next turn: its rows moved
    /// away or were replaced underneath it.
    pub fn invalidate(&self) {
        // No commit failed: an older failure is not the reason.
        *self.failure_slot() = Some(CommitFailed::rows_moved());
        self.min_generation.fetch_add(1, Ordering::AcqRel);
        self.committed.notify_waiters();
    }

    pub(super) fn mark_committed(&self, seq: u64) {
        self.committed_seq.fetch_max(seq, Ordering::AcqRel);
        self.committed.notify_waiters();
    }

    /// Refuse `generation` (and older ones) because of `why`.
    pub(super) fn mark_failed(&self, generation: u64, why: &CommitFailed) {
        // Set before the generation moves, so a waiter that sees it moved
        // reads why; and only by a failure that moves it (a late one of an
        // older generation is not why the current one was refused).
        let mut failure = self.failure_slot();
        if generation >= self.min_generation() {
            *failure = Some(why.clone());
        }
        self.min_generation
            .fetch_max(generation + 1, Ordering::AcqRel);
        drop(failure);
        self.committed.notify_waiters();
    }

    fn failure_slot(&self) -> std::sync::MutexGuard<'_, Option<CommitFailed>> {
        self.failure
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }
}
