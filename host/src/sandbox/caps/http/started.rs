//! Fetches a turn started without waiting (`start`, `wait-any`, `finish`).
//!
//! Each runs as its own task on the node's runtime, so a guest's fetches
//! go side by side while it computes or waits for another; each reports
//! its answer on the turn's channel, tagged with the handle `start` gave.
//! The answers wait here until the guest takes them. Everything a turn
//! started ends with the turn: dropping [`Started`] aborts the fetches
//! still under way and drops the answers not taken.
//!
//! Bounds (each found by a re-probe of the first version): the request
//! bodies of a turn's fetches under way, held by the host until sent, at
//! most its memory limit in all (64 slow 4 MiB POSTs held 256 MB per
//! turn); a turn's fetches in flight at once, a quarter of its type's
//! `http_concurrency` (one actor's `Promise.all` took every place of its
//! type, and a neighbour's 10 ms fetch waited 11.6 s); and the answers
//! taken while others of the turn are still under way, at most what one
//! fetch may hold in all (four 10 MiB answers trapped a 32 MiB sandbox,
//! past any `catch`; now the one that would not fit rejects).

use std::collections::{HashMap, HashSet};
use std::sync::Arc;
use std::time::Duration;

use tokio::sync::{Semaphore, mpsc};
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
    /// The places the turn's fetches take turns in (made with the channel).
    lanes: Option<Arc<Semaphore>>,
    /// Each under way, and the bytes of its request body.
    under_way: HashMap<u32, (Abort, usize)>,
    answered: HashMap<u32, Answer>,
    /// Bytes of answers taken since the turn last had no fetch started
    /// and not finished.
    batch_bytes: usize,
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

    /// Bytes of request bodies the fetches under way hold.
    pub(super) fn body_bytes(&self) -> usize {
        self.under_way.values().map(|(_, bytes)| bytes).sum()
    }

    /// The handle the next started fetch gets, where it reports, and the
    /// turn's `lanes` places it waits for (the first call sets how many).
    pub(super) fn next(&mut self, lanes: usize) -> (u32, Report, Arc<Semaphore>) {
        let handle = self.next;
        self.next = self.next.wrapping_add(1);
        let (report, _) = self.channel.get_or_insert_with(mpsc::unbounded_channel);
        let lanes = self
            .lanes
            .get_or_insert_with(|| Arc::new(Semaphore::new(lanes.max(1))));
        (handle, report.clone(), lanes.clone())
    }

    /// Fetch `handle`, with a request body of `body_bytes`, is under way
    /// as the task `task`.
    pub(super) fn under_way(&mut self, handle: u32, task: AbortHandle, body_bytes: usize) {
        self.under_way.insert(handle, (Abort(task), body_bytes));
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

    /// The answer of fetch `handle`, waiting for it if need be; refused
    /// if, with the answers taken while others of the turn ran, it would
    /// pass `cap` bytes (what one fetch may hand the guest).
    pub(super) async fn finish(&mut self, handle: u32, cap: usize) -> Answer {
        loop {
            if let Some(answer) = self.answered.remove(&handle) {
                let answer = self.within_batch(answer, cap);
                if self.len() == 0 {
                    self.batch_bytes = 0;
                }
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

    /// `answer`, unless its body and those taken before it in this batch
    /// pass `cap` (the first always fits: the egress held it to `cap`).
    fn within_batch(&mut self, answer: Answer, cap: usize) -> Answer {
        let Ok(response) = &answer else {
            return answer;
        };
        let bytes = response.body.len();
        if self.batch_bytes > 0 && self.batch_bytes.saturating_add(bytes) > cap {
            return Err(GuestError::LimitExceeded(format!(
                "the answers of fetches run side by side share what one fetch may hand over \
                 ({cap} bytes, a share of config.max_memory_bytes): with the {} taken already, \
                 this one's {bytes} would pass it; await fewer at once",
                self.batch_bytes
            )));
        }
        self.batch_bytes += bytes;
        answer
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

impl Drop for Started {
    /// Fetches still under way are cancelled (each [`Abort`]): said, since
    /// one never awaited may not have been sent at all.
    fn drop(&mut self) {
        if !self.under_way.is_empty() {
            tracing::info!(
                fetches = self.under_way.len(),
                "fetches still under way when the turn ended were cancelled (await them to \
                 have them finish)"
            );
        }
    }
}
