//! Fetches a turn started without waiting (`start`, `wait-any`, `finish`).
//!
//! Each runs as its own task on the node's runtime, so a guest's fetches
//! go side by side while it computes or waits for another; each reports
//! its answer on the turn's channel, tagged with the handle `start` gave.
//! The answers wait here until the guest takes them. Everything a turn
//! started ends with the turn: dropping [`Started`] aborts the fetches
//! still under way and drops the answers not taken.

use std::collections::{HashMap, HashSet};
use std::time::Duration;

use tokio::sync::mpsc;
use tokio::task::AbortHandle;

use crate::sandbox::bindings::GuestError;
use crate::sandbox::bindings::marmot::actor::http;

/// A started fetch's answer, as `fetch` would have returned it.
pub(super) type Answer = Result<http::Response, GuestError>;

/// Most fetches a turn may have started and not finished (under way, or
/// answered and not yet taken): each answer is held by the host until
/// taken, so this bounds what a turn holds besides the node's response
/// budget.
pub(super) const MAX_STARTED: usize = 64;

/// Where a started fetch reports its answer.
pub(super) type Report = mpsc::UnboundedSender<(u32, Answer)>;

/// The fetches a turn started and has not finished.
#[derive(Default)]
pub struct Started {
    next: u32,
    /// Made at the turn's first `start` (most turns fetch nothing, or
    /// only with `fetch`).
    channel: Option<(Report, mpsc::UnboundedReceiver<(u32, Answer)>)>,
    under_way: HashMap<u32, Abort>,
    answered: HashMap<u32, Answer>,
}

/// Aborts a fetch's task when its turn ends first.
struct Abort(AbortHandle);

impl Drop for Abort {
    fn drop(&mut self) {
        self.0.abort();
    }
}

impl Started {
    /// Fetches started and not finished.
    pub(super) fn len(&self) -> usize {
        self.under_way.len() + self.answered.len()
    }

    /// The handle the next started fetch gets, and where it reports.
    pub(super) fn next(&mut self) -> (u32, Report) {
        let handle = self.next;
        self.next = self.next.wrapping_add(1);
        let (report, _) = self.channel.get_or_insert_with(mpsc::unbounded_channel);
        (handle, report.clone())
    }

    /// Fetch `handle` is under way as the task `task`.
    pub(super) fn under_way(&mut self, handle: u32, task: AbortHandle) {
        self.under_way.insert(handle, Abort(task));
    }

    /// One of `handles` whose answer is here, waiting at most `timeout`
    /// for one; `None` at the timeout, or if none of them is a fetch this
    /// turn has under way or answered.
    pub(super) async fn wait_any(
        &mut self,
        handles: &[u32],
        timeout: Option<Duration>,
    ) -> Option<u32> {
        if let Some(h) = handles.iter().find(|h| self.answered.contains_key(h)) {
            return Some(*h);
        }
        let wanted: HashSet<u32> = handles
            .iter()
            .copied()
            .filter(|h| self.under_way.contains_key(h))
            .collect();
        if wanted.is_empty() {
            return None;
        }
        let deadline = timeout.map(|t| tokio::time::Instant::now() + t);
        loop {
            let handle = match deadline {
                Some(at) => tokio::time::timeout_at(at, self.receive()).await.ok()?,
                None => self.receive().await,
            }?;
            if wanted.contains(&handle) {
                return Some(handle);
            }
        }
    }

    /// The answer of fetch `handle`, waiting for it if need be.
    pub(super) async fn finish(&mut self, handle: u32) -> Answer {
        loop {
            if let Some(answer) = self.answered.remove(&handle) {
                return answer;
            }
            if !self.under_way.contains_key(&handle) {
                return Err(GuestError::Invalid(format!(
                    "no fetch of this turn has handle {handle} (never started, or already \
                     finished)"
                )));
            }
            self.receive().await;
        }
    }

    /// The next answer to come in, kept with the others; its handle.
    async fn receive(&mut self) -> Option<u32> {
        let (_, answers) = self.channel.as_mut()?;
        // (Never `None`: the sender is kept beside it.)
        let (handle, answer) = answers.recv().await?;
        // (Its task is over: aborting it does nothing.)
        self.under_way.remove(&handle);
        self.answered.insert(handle, answer);
        Some(handle)
    }
}
