//! `GET …/events` with `Accept: text/event-stream`: a live SSE stream of an
//! actor's event log.
//!
//! Each frame is one event: `id:` is its seq and `data:` the same JSON object
//! as in the event page (`{seq, kind, data, at_ms}`). `Last-Event-ID` (or
//! `?after=N`) resumes exactly after that seq. Frames are read from disk, so
//! only committed events go out, and the stream never wakes or pins the
//! actor: commits wake the stream through the node's [`EventBus`]. A resume
//! from a seq that retention already removed starts with a `gap` frame
//! naming what is missing; one from past the log's end (the actor was
//! deleted and made again) starts over after a `reset` frame. Comment
//! lines keep idle streams open; the
//! stream ends when the actor is deleted or the node shuts down.
//!
//! Live frames (a model's token deltas while a turn runs) arrive between
//! events as `event: delta` frames without an `id:`: they are not part of
//! the log, a resume never replays them, and the committed event that
//! follows (a `model_step`, say) is the record. A stream too slow for them
//! gets an `event: lagged` frame saying how many it missed.
//!
//! [`EventBus`]: crate::streams::EventBus

use std::collections::VecDeque;
use std::convert::Infallible;
use std::pin::Pin;
use std::sync::Arc;
use std::time::Duration;

use axum::http::{HeaderMap, HeaderValue, StatusCode};
use axum::response::sse::{Event, KeepAlive, Sse};
use axum::response::{IntoResponse, Response};
use tokio::sync::broadcast;

use super::ApiError;
use crate::ids::ActorKey;
use crate::node::Node;
use crate::storage::schema::EventRecord;
use crate::streams::{Subscription, TooManyStreams};
use crate::tokens::Grant;

/// Events read from disk per step.
const PAGE: usize = 256;

/// The most bytes of events a stream reads at once, as stored (and at
/// least one event): what a stream whose client stopped reading holds.
/// A page of 256 events of up to 256 KiB each held ~64 MiB per stalled
/// stream (a probe's 20 streams held 1.3 GB), for as long as it stayed
/// open; 1 MiB still let 1,000 stalled streams hold ~1 GB until they were
/// closed for not reading (`listen::WRITE_STALL`).
const PAGE_BYTES: usize = 256 << 10;
/// The reconnect delay suggested to clients.
const RETRY: Duration = Duration::from_secs(1);

/// An event as the API shows it, in pages and in streams.
#[derive(serde::Serialize)]
pub(super) struct EventJson<'a> {
    seq: u64,
    kind: &'a str,
    data: &'a serde_json::value::RawValue,
    at_ms: u64,
}

pub(super) fn event_json(seq: u64, e: &EventRecord) -> EventJson<'_> {
    EventJson {
        seq,
        kind: &e.kind,
        data: raw_json(&e.data).unwrap_or(serde_json::value::RawValue::NULL),
        at_ms: e.at_ms,
    }
}

/// `bytes` as JSON to pass on as they are, if they are JSON. Checked
/// without building a `serde_json::Value`, which stops at 128 levels of
/// nesting: an event nested deeper (a JavaScript actor may store 10,000)
/// showed as `null`, and such a state value as base64 (a probe).
pub(super) fn raw_json(bytes: &[u8]) -> Option<&serde_json::value::RawValue> {
    serde_json::from_slice(bytes).ok()
}

/// Where a stream starts: after `Last-Event-ID` if given, else `?after=`.
/// An empty one is none, as the SSE standard has it (it was a 400).
pub(super) fn start_after(headers: &HeaderMap, after: u64) -> Result<u64, ApiError> {
    let given = headers
        .get("last-event-id")
        .filter(|v| !v.as_bytes().iter().all(u8::is_ascii_whitespace));
    match given {
        None => Ok(after),
        Some(v) => v
            .to_str()
            .ok()
            .and_then(|s| s.trim().parse::<u64>().ok())
            .ok_or_else(|| {
                ApiError::bad_request(
                    "invalid_last_event_id",
                    "Last-Event-ID must be an event seq (a non-negative integer)",
                )
            }),
    }
}

/// The actor's last event seq when `after` lies beyond it: the client
/// resumes from an event this log never had, as after the actor was
/// deleted and made again (its log starts at 1 again). Waiting for that
/// seq would hide every new event from it, so the stream sends a `reset`
/// frame and starts over, and the page says `reset` and starts over.
pub(super) fn past_the_end(
    node: &Node,
    key: &ActorKey,
    after: u64,
) -> Result<Option<u64>, ApiError> {
    if after == 0 {
        return Ok(None);
    }
    Ok(node
        .actor_info(key)?
        .map(|i| i.last_event_seq)
        .filter(|last| after > *last))
}

/// The `reset` frame's (and page field's) body.
pub(super) fn reset_json(after: u64, last: u64) -> serde_json::Value {
    serde_json::json!({ "after": after, "last": last })
}

/// How often a stream opened with a client token looks whether the token
/// was revoked (its expiry it knows).
const REVOCATION_CHECK: Duration = Duration::from_secs(1);

/// Open a stream of `key`'s events after `after`; opened with a client
/// token (`grant`), it ends when the token expires or is revoked.
pub(super) fn open(
    node: &Arc<Node>,
    key: ActorKey,
    after: u64,
    grant: Option<Grant>,
) -> Result<Response, ApiError> {
    // Subscribe before the first read: a commit landing in between then
    // wakes the stream instead of being missed.
    let token = grant.as_ref().map(|g| g.jti.as_str());
    let sub = node
        .event_bus()
        .subscribe_as(&key, token)
        .map_err(|e| match e {
            TooManyStreams::Node(_) => ApiError::new(
                StatusCode::SERVICE_UNAVAILABLE,
                "too_many_streams",
                e.to_string(),
            ),
            TooManyStreams::Token(_) => ApiError::new(
                StatusCode::TOO_MANY_REQUESTS,
                "too_many_streams",
                e.to_string(),
            ),
        })?;
    let follow = Follow {
        node: node.clone(),
        key,
        after,
        resumed: after > 0,
        sub,
        queue: VecDeque::from([Event::default().retry(RETRY)]),
        existed: false,
        absent_at_open: false,
        read_due: true,
        lapse: grant.map(|g| Box::pin(lapse(node.clone(), g)) as Lapse),
    };
    let stream = futures::stream::unfold(follow, Follow::next);
    let heartbeat = Duration::from_millis(node.config().events.heartbeat_ms.max(100));
    let mut resp = Sse::new(stream)
        .keep_alive(KeepAlive::new().interval(heartbeat).text("ping"))
        .into_response();
    // Tell buffering proxies (nginx) to pass frames through at once.
    resp.headers_mut()
        .insert("x-accel-buffering", HeaderValue::from_static("no"));
    Ok(resp)
}

struct Follow {
    node: Arc<Node>,
    key: ActorKey,
    /// Last seq sent (or the resume point).
    after: u64,
    /// Whether the client resumed (gaps are reported only then).
    resumed: bool,
    sub: Subscription,
    queue: VecDeque<Event>,
    /// The actor existed at some point during the stream.
    existed: bool,
    /// The actor did not exist when the stream opened: a resume point is
    /// then from a log that is gone (a deleted actor's), and the new
    /// actor's log is read from its start after a `reset` frame.
    absent_at_open: bool,
    /// A commit may have added events since the last read.
    read_due: bool,
    /// Resolves when the client token the stream was opened with lapses.
    lapse: Option<Lapse>,
}

type Lapse = Pin<Box<dyn Future<Output = ()> + Send>>;

/// Wait until `grant` expires or its token is revoked.
async fn lapse(node: Arc<Node>, grant: Grant) {
    loop {
        if node.tokens().lapsed(&grant) {
            tracing::info!(token_id = %grant.jti, "event stream ends: its client token expired or was revoked");
            return;
        }
        let left = Duration::from_millis((grant.exp * 1000).saturating_sub(crate::clock::now_ms()));
        tokio::time::sleep(left.min(REVOCATION_CHECK)).await;
    }
}

impl Follow {
    async fn next(mut self) -> Option<(Result<Event, Infallible>, Self)> {
        loop {
            if let Some(ev) = self.queue.pop_front() {
                return Some((Ok(ev), self));
            }
            if *self.sub.closing.borrow() || *self.sub.left.borrow() {
                return None;
            }
            if self.read_due {
                // Mark what we have seen before reading, so a commit
                // published during the read wakes the wait below.
                self.sub.changed.borrow_and_update();
                self.read_due = false;
                match self.node.events(&self.key, self.after, PAGE, PAGE_BYTES) {
                    Ok(Some(page)) => {
                        let first_read = !self.existed;
                        self.existed = true;
                        if first_read && self.after > 0 && self.absent_at_open {
                            // Made after the stream opened: whatever the
                            // client saw was another actor's log.
                            let last = match self.node.actor_info(&self.key) {
                                Ok(Some(i)) => i.last_event_seq,
                                _ => page.last().map_or(0, |(seq, _)| *seq),
                            };
                            self.restart_from_the_start(last);
                            continue;
                        }
                        if page.is_empty() && first_read && self.restart_past_the_end() {
                            continue;
                        }
                        if !page.is_empty() {
                            self.enqueue(page);
                            self.read_due = true;
                            continue;
                        }
                    }
                    // Deleted while we watched: its log is gone.
                    Ok(None) if self.existed => return None,
                    // Not created yet: wait for its first commit.
                    Ok(None) => self.absent_at_open = true,
                    Err(e) => {
                        tracing::warn!(actor = %self.key, error = %e, "event stream ends: storage error");
                        return None;
                    }
                }
            }
            let lapse = async {
                match self.lapse.as_mut() {
                    Some(l) => l.await,
                    None => std::future::pending().await,
                }
            };
            tokio::select! {
                () = lapse => return None,
                r = self.sub.changed.changed() => match r {
                    Ok(()) => self.read_due = true,
                    Err(_) => return None,
                },
                _ = self.sub.closing.changed() => return None,
                _ = self.sub.left.changed() => return None,
                frame = self.sub.live.recv() => match frame {
                    Ok(f) => self.queue.push_back(Event::default().event("delta").data(&*f)),
                    Err(broadcast::error::RecvError::Lagged(n)) => {
                        let missed = serde_json::json!({ "missed": n });
                        self.queue
                            .push_back(Event::default().event("lagged").data(missed.to_string()));
                    }
                    // Only when the registration is gone: end like a delete.
                    Err(broadcast::error::RecvError::Closed) => return None,
                },
            }
        }
    }

    /// On the first read: if the resume point lies past the log's end,
    /// queue a `reset` frame and start over from the beginning.
    fn restart_past_the_end(&mut self) -> bool {
        match past_the_end(&self.node, &self.key, self.after) {
            Ok(Some(last)) => {
                tracing::info!(actor = %self.key, after = self.after, last, "event stream resumed past the log's end: starting over");
                self.restart_from_the_start(last);
                true
            }
            Ok(None) => false,
            Err(e) => {
                tracing::warn!(actor = %self.key, error = ?e, "event stream cannot read the actor's record");
                false
            }
        }
    }

    /// Queue a `reset` frame (the log ends at `last`, as far as read) and
    /// read the log again from its start.
    fn restart_from_the_start(&mut self, last: u64) {
        let reset = reset_json(self.after, last);
        self.queue
            .push_back(Event::default().event("reset").data(reset.to_string()));
        self.after = 0;
        self.read_due = true;
    }

    fn enqueue(&mut self, page: Vec<(u64, EventRecord)>) {
        let first = page[0].0;
        if self.resumed && first > self.after + 1 {
            let gap = serde_json::json!({ "after": self.after, "next": first });
            self.queue
                .push_back(Event::default().event("gap").data(gap.to_string()));
        }
        self.resumed = true;
        for (seq, e) in page {
            self.queue.push_back(
                Event::default()
                    .id(seq.to_string())
                    .data(serde_json::to_string(&event_json(seq, &e)).expect("serializable")),
            );
            self.after = seq;
        }
    }
}
