//! Who is watching which actor's event log.
//!
//! Live event streams (SSE) never talk to the actor: an open stream must not
//! keep it awake. Instead, every commit that appends events publishes the
//! actor's newest event seq here once the commit is durable, and a stream
//! waiting on that actor wakes and reads the new events from disk. What a
//! stream sends is therefore always committed (the output gate), and a
//! stream resumes from any seq the same way it follows live ones.
//!
//! Besides events, a turn may publish *live frames* (a model's token
//! deltas): they go to the streams open at that moment and nowhere else.
//! They are not events, carry no seq, are never stored and may describe
//! work whose turn later fails; clients treat them as a preview.

use std::collections::HashMap;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, RwLock};

use prometheus_client::metrics::gauge::Gauge;
use tokio::sync::{broadcast, watch};

use crate::ids::ActorKey;

/// The node's event-stream registry.
pub struct EventBus {
    watched: RwLock<HashMap<ActorKey, Watched>>,
    closing: watch::Sender<bool>,
    open: AtomicUsize,
    max_streams: usize,
    /// Streams open per client token (by token id).
    per_token: Mutex<HashMap<String, usize>>,
    max_per_token: usize,
    /// `marmot_event_streams`.
    gauge: Gauge,
}

/// What the streams of one actor listen to.
struct Watched {
    seq: watch::Sender<u64>,
    live: broadcast::Sender<Arc<str>>,
    /// Turns true when the actor is no longer this node's to serve.
    left: watch::Sender<bool>,
}

/// Live frames buffered per actor for a slow stream; one further behind
/// misses frames (and is told so).
const LIVE_BUFFER: usize = 1024;

/// One open stream's registration; unregisters when dropped.
pub struct Subscription {
    bus: Arc<EventBus>,
    key: ActorKey,
    /// The client token it counts against.
    token: Option<String>,
    /// Changes whenever a commit of the actor's events becomes durable (or
    /// the actor is deleted).
    pub changed: watch::Receiver<u64>,
    /// Turns true when the node shuts down.
    pub closing: watch::Receiver<bool>,
    /// Live frames (not events) published while the stream is open.
    pub live: broadcast::Receiver<Arc<str>>,
    /// Turns true when the actor went to another node: the stream ends,
    /// and its client resumes there (`Last-Event-ID`).
    pub left: watch::Receiver<bool>,
}

/// More streams are open than the node (or a client token) may hold.
#[derive(Debug, thiserror::Error)]
pub enum TooManyStreams {
    /// The node's `events.max_streams`.
    #[error("this node serves at most {0} event streams at once")]
    Node(usize),
    /// `events.max_streams_per_token`.
    #[error(
        "a client token may hold at most {0} event streams open at once \
         (events.max_streams_per_token); close one first"
    )]
    Token(usize),
}

impl EventBus {
    /// A bus allowing `max_streams` open streams, `max_per_token` of them
    /// for one client token, counted in `gauge`.
    pub fn new(max_streams: usize, max_per_token: usize, gauge: Gauge) -> Self {
        Self {
            watched: RwLock::new(HashMap::new()),
            closing: watch::Sender::new(false),
            open: AtomicUsize::new(0),
            max_streams,
            per_token: Mutex::default(),
            max_per_token,
            gauge,
        }
    }

    /// Watch `key`'s event log.
    pub fn subscribe(self: &Arc<Self>, key: &ActorKey) -> Result<Subscription, TooManyStreams> {
        self.subscribe_as(key, None)
    }

    /// Watch `key`'s event log for the holder of client token `token` (its
    /// id), which may hold only so many streams: one token kept open
    /// streams until no one else on the node could open one (found by a
    /// probe).
    pub fn subscribe_as(
        self: &Arc<Self>,
        key: &ActorKey,
        token: Option<&str>,
    ) -> Result<Subscription, TooManyStreams> {
        if let Some(t) = token {
            let mut held = self.per_token.lock().unwrap_or_else(|p| p.into_inner());
            let n = held.entry(t.to_owned()).or_default();
            if *n >= self.max_per_token {
                return Err(TooManyStreams::Token(self.max_per_token));
            }
            *n += 1;
        }
        if self.open.fetch_add(1, Ordering::AcqRel) >= self.max_streams {
            self.open.fetch_sub(1, Ordering::AcqRel);
            if let Some(t) = token {
                self.release_token(t);
            }
            return Err(TooManyStreams::Node(self.max_streams));
        }
        self.gauge.inc();
        let (changed, live, left) = {
            let mut w = self.watched.write().expect("event bus lock");
            let watched = w.entry(key.clone()).or_insert_with(|| Watched {
                seq: watch::Sender::new(0),
                live: broadcast::Sender::new(LIVE_BUFFER),
                left: watch::Sender::new(false),
            });
            // Back to this node (a stream is opened only where the actor
            // is served): new streams run again.
            if *watched.left.borrow() {
                watched.left.send_replace(false);
            }
            (
                watched.seq.subscribe(),
                watched.live.subscribe(),
                watched.left.subscribe(),
            )
        };
        Ok(Subscription {
            bus: self.clone(),
            key: key.clone(),
            token: token.map(str::to_owned),
            changed,
            closing: self.closing.subscribe(),
            live,
            left,
        })
    }

    fn release_token(&self, token: &str) {
        let mut held = self.per_token.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(n) = held.get_mut(token) {
            *n -= 1;
            if *n == 0 {
                held.remove(token);
            }
        }
    }

    /// A commit holding `key`'s events up to `last_seq` is durable (0: the
    /// actor was deleted).
    pub fn publish(&self, key: &ActorKey, last_seq: u64) {
        let w = self.watched.read().expect("event bus lock");
        if let Some(tx) = w.get(key) {
            tx.seq.send_replace(last_seq);
        }
    }

    /// Every actor of type `ty` was deleted (the type with them): their
    /// streams end, those of actors never created too (a deleted actor's
    /// ends when it reads that its log is gone; one waiting for its actor's
    /// first commit went back to waiting, and pinged for ever: a probe).
    pub fn publish_type_deleted(&self, ty: &str) {
        self.end_where(|key| key.ty() == ty);
    }

    /// Send a live frame to `key`'s open streams (none: dropped).
    pub fn live(&self, key: &ActorKey, frame: Arc<str>) {
        let w = self.watched.read().expect("event bus lock");
        if let Some(tx) = w.get(key) {
            let _ = tx.live.send(frame);
        }
    }

    /// End the streams of the actors `which` picks: they went to another
    /// node (their slots failed over), and a stream here would only ping
    /// for ever (found by a probe: a follower stalled silently after a
    /// pause and a failover).
    pub fn end_where(&self, which: impl Fn(&ActorKey) -> bool) {
        let w = self.watched.read().expect("event bus lock");
        for (key, tx) in w.iter() {
            if which(key) {
                tx.left.send_replace(true);
            }
        }
    }

    /// End every stream (the node is shutting down).
    pub fn close(&self) {
        self.closing.send_replace(true);
    }

    /// Streams open now (the `event_streams` gauge reports it).
    #[cfg(test)]
    pub fn open_streams(&self) -> usize {
        self.open.load(Ordering::Acquire)
    }
}

impl Drop for Subscription {
    fn drop(&mut self) {
        self.bus.open.fetch_sub(1, Ordering::AcqRel);
        self.bus.gauge.dec();
        if let Some(t) = &self.token {
            self.bus.release_token(t);
        }
        let mut w = self.bus.watched.write().expect("event bus lock");
        // Our own receiver is still alive here: the last one out removes
        // the entry. Subscribing takes the same lock, so nobody can join
        // between the count and the removal.
        if w.get(&self.key)
            .is_some_and(|tx| tx.seq.receiver_count() <= 1)
        {
            w.remove(&self.key);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// One client token holds at most its share of the node's streams;
    /// closing one makes room for it, and others are unaffected.
    #[test]
    fn a_client_token_holds_at_most_its_streams() {
        let bus = Arc::new(EventBus::new(10, 2, Gauge::default()));
        let a = ActorKey::new("t", "a").unwrap();
        let s1 = bus.subscribe_as(&a, Some("tok")).unwrap();
        let _s2 = bus.subscribe_as(&a, Some("tok")).unwrap();
        let Err(err) = bus.subscribe_as(&a, Some("tok")) else {
            panic!("a third stream for the token");
        };
        assert!(matches!(err, TooManyStreams::Token(2)), "{err}");
        let _other = bus.subscribe_as(&a, Some("another")).unwrap();
        let _admin = bus.subscribe(&a).unwrap();
        drop(s1);
        let _s3 = bus.subscribe_as(&a, Some("tok")).unwrap();
        assert_eq!(bus.open_streams(), 4);
    }

    #[tokio::test]
    async fn publishes_reach_subscribers_and_entries_go_with_the_last_one() {
        let bus = Arc::new(EventBus::new(2, 2, Gauge::default()));
        let a = ActorKey::new("t", "a").unwrap();
        let mut s1 = bus.subscribe(&a).unwrap();
        let s2 = bus.subscribe(&a).unwrap();
        assert!(bus.subscribe(&a).is_err(), "the cap holds");
        bus.publish(&a, 7);
        s1.changed.changed().await.unwrap();
        assert_eq!(*s1.changed.borrow_and_update(), 7);
        bus.live(&a, Arc::from("frame"));
        assert_eq!(&*s1.live.recv().await.unwrap(), "frame");
        drop(s2);
        assert_eq!(bus.watched.read().unwrap().len(), 1);
        drop(s1);
        assert!(bus.watched.read().unwrap().is_empty());
        assert_eq!(bus.open_streams(), 0);
        // Publishing to nobody is a no-op.
        bus.publish(&a, 8);
        assert!(bus.watched.read().unwrap().is_empty());
    }
}
