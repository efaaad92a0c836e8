//! The relay: in a cluster, messages a turn sends with `actors.send` are
//! committed with the turn into the relay table (the recipient may live on
//! another node), then handed to the recipient's owner here. Each carries
//! an idempotency key derived from its message id, so a hand-over repeated
//! after a crash or a lost answer queues the message once: a send is
//! delivered if and only if its turn committed, exactly once, across nodes.
//!
//! The relay rows of a slot's actors are replicated to the slot's backup
//! like its other rows; only the slot's owner hands them over, so after a
//! failover the new owner hands over what the old one had not.
//!
//! Messages are handed over in the order they were sent; when one
//! recipient cannot be reached, later messages to it wait (its order is
//! kept) while messages to others go on: its rows stay where they are
//! until it is tried again (after a back-off), and a pass hands
//! recipients their messages side by side; a pass waits at most 2 s for
//! them (one whose node hangs counts as not reached). A message is dropped
//! as one to a deleted type only when this node does not know the type
//! either: a peer that missed a deploy says 404 for a type that exists.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use super::Node;
use crate::actor::TurnError;
use crate::cluster::{Cluster, PeerError, Peers, Target};
use crate::ids::ActorKey;
use crate::storage::WriteOp;
use crate::storage::schema::RelayRecord;

/// Relayed messages read per pass.
const PAGE: usize = 256;
/// First wait before a recipient that could not be reached is tried again;
/// it doubles with each failure, to [`MAX_BACKOFF`].
const FIRST_BACKOFF: Duration = Duration::from_millis(100);
/// Recipients handed messages at once.
const HAND_OVER_AT_ONCE: usize = 16;
/// Longest a pass waits for its recipients' hand-overs.
const PASS_TIME: Duration = Duration::from_secs(2);
/// Longest wait between passes while a recipient is unreachable.
const MAX_BACKOFF: Duration = Duration::from_secs(5);

/// Recipients that could not be reached: when each is tried next, and
/// the wait before that. A pass leaves their rows where they are until
/// then: with a page's worth of rows to one such recipient at the head of
/// the relay, no other message was handed over (found by a probe).
#[derive(Default)]
struct Waiting(HashMap<(String, String), (tokio::time::Instant, Duration)>);

impl Waiting {
    /// Whether `rec`'s recipient is not to be tried yet at `now`.
    fn holds(&self, rec: &RelayRecord, now: tokio::time::Instant) -> bool {
        if self.0.is_empty() {
            return false;
        }
        let key = (rec.actor_type.clone(), rec.actor_id.clone());
        self.0.get(&key).is_some_and(|(at, _)| *at > now)
    }

    /// `key` was tried: reached, or not (and waits longer).
    fn tried(&mut self, key: ActorKey, reached: bool) {
        // Recipients not tried again for a minute past their time (their
        // messages went from another node, or were dropped) are forgotten.
        if let Some(stale) = tokio::time::Instant::now().checked_sub(Duration::from_secs(60)) {
            self.0.retain(|_, (at, _)| *at > stale);
        }
        let key = (key.ty().to_owned(), key.id().to_owned());
        if reached {
            self.0.remove(&key);
            return;
        }
        let wait = self
            .0
            .get(&key)
            .map_or(FIRST_BACKOFF, |(_, w)| (*w * 2).min(MAX_BACKOFF));
        self.0
            .insert(key, (tokio::time::Instant::now() + wait, wait));
    }

    /// The soonest a waiting recipient is tried again.
    fn next_try(&self) -> Option<tokio::time::Instant> {
        self.0.values().map(|(at, _)| *at).min()
    }
}

impl Node {
    /// Hand relayed messages over as they are committed (cluster only).
    pub(super) async fn relay(self: Arc<Self>) {
        let Some((cluster, peers)) = self.actors.cluster.clone() else {
            return;
        };
        let ready = self.storage.relay_ready().clone();
        let mut waiting = Waiting::default();
        loop {
            // Registered before reading, so a commit in between wakes us.
            let notified = ready.notified();
            // Rows of a batch its backups have not acknowledged yet wait.
            let released = self
                .storage
                .writer()
                .released()
                .relays
                .load(std::sync::atomic::Ordering::Acquire);
            // Only the owner of the sender's slot hands a message over (its
            // backup keeps a copy); rows from before senders were recorded
            // go from the node that has them. Rows to a recipient that
            // could not be reached wait for its next try, in order.
            let writer = self.storage.writer();
            let now = tokio::time::Instant::now();
            let mine = |rec: &RelayRecord| {
                rec.from
                    .as_ref()
                    .and_then(|(ty, id)| ActorKey::new(ty, id).ok())
                    .is_none_or(|from| writer.sends_for(&from))
                    && !waiting.holds(rec, now)
            };
            let page = match self.storage.reader().and_then(|r| r.relay_page(PAGE, mine)) {
                Ok(p) => p
                    .into_iter()
                    .take_while(|(seq, _)| *seq <= released)
                    .collect::<Vec<_>>(),
                Err(e) => {
                    tracing::warn!(error = %e, "relay: cannot read relayed messages");
                    tokio::time::sleep(MAX_BACKOFF).await;
                    continue;
                }
            };
            if page.is_empty() {
                // Until a commit, a waiting recipient's next try, or a
                // periodic look, in case a wake-up was missed.
                let wait = waiting
                    .next_try()
                    .map_or(MAX_BACKOFF, |t| t.saturating_duration_since(now))
                    .min(MAX_BACKOFF);
                let _ = tokio::time::timeout(wait, notified).await;
                continue;
            }
            let (done, reached) = self.hand_over_page(&cluster, &peers, page).await;
            for (key, ok) in reached {
                waiting.tried(key, ok);
            }
            if !done.is_empty() {
                let n = done.len();
                let forgotten = self
                    .storage
                    .writer()
                    .call(|done_tx| WriteOp::RelayDone {
                        seqs: done,
                        done: done_tx,
                    })
                    .await;
                match forgotten {
                    Ok(()) => self.metrics.relayed(n),
                    // Handed over but still here: the next pass repeats
                    // them, and their keys make that harmless.
                    Err(e) => {
                        tracing::warn!(error = %e, "relay: cannot forget handed-over messages")
                    }
                }
            }
        }
    }

    /// Hand over one page; returns the seqs to forget (handed over, or
    /// dropped) and whether each recipient could be reached. Each
    /// recipient's messages go in order, one at a time; recipients go
    /// side by side, so one whose node hangs holds back only its own.
    async fn hand_over_page(
        &self,
        cluster: &Cluster,
        peers: &Peers,
        page: Vec<(u64, RelayRecord)>,
    ) -> (Vec<u64>, Vec<(ActorKey, bool)>) {
        use futures::StreamExt as _;
        let mut done = Vec::new();
        let mut order: Vec<ActorKey> = Vec::new();
        let mut rows: HashMap<ActorKey, Vec<(u64, RelayRecord)>> = HashMap::new();
        for (seq, rec) in page {
            match ActorKey::new(&rec.actor_type, &rec.actor_id) {
                Ok(key) => {
                    let list = rows.entry(key.clone()).or_insert_with(|| {
                        order.push(key);
                        Vec::new()
                    });
                    list.push((seq, rec));
                }
                Err(e) => {
                    tracing::error!(seq, error = %e, "relay: a relayed message names no valid actor; dropped");
                    done.push(seq);
                }
            }
        }
        // Seqs to forget, as each is handed over: a pass cut short keeps
        // what its recipients got before it ended.
        let finished = std::sync::Mutex::new(done);
        let forget = |seq: u64| finished.lock().expect("relay pass lock").push(seq);
        let mut pending: std::collections::HashSet<ActorKey> = order.iter().cloned().collect();
        let recipients = order.into_iter().map(|key| {
            let list = rows.remove(&key).unwrap_or_default();
            async move {
                for (seq, rec) in list {
                    match self.hand_over(cluster, peers, &key, rec).await {
                        Ok(()) => forget(seq),
                        // As on one node: a message to a type deleted
                        // since it was sent is dropped. Not for a peer's
                        // word alone: one that missed the type's deploy (it
                        // was paused) dropped committed messages to a type
                        // this node has (found by a re-probe).
                        Err(PeerError::NotFound(why)) if self.catalog.get(key.ty()).is_none() => {
                            tracing::warn!(to = %key, %why, "relay: message to an actor of an unknown type dropped");
                            forget(seq);
                        }
                        Err(PeerError::NotFound(why)) => {
                            tracing::warn!(to = %key, %why, "relay: the recipient's node does not know its type, which this node has; retrying");
                            return (key, false);
                        }
                        Err(e @ (PeerError::Refused { .. } | PeerError::Failed(_))) => {
                            let why = e.to_string();
                            tracing::warn!(to = %key, %why, "relay: cannot hand a message over yet; retrying");
                            return (key, false);
                        }
                    }
                }
                (key, true)
            }
        });
        let mut reached = Vec::new();
        let mut handed = futures::stream::iter(recipients).buffer_unordered(HAND_OVER_AT_ONCE);
        // A pass ends by PASS_TIME: a recipient whose node accepts a
        // connection but never answers held every other's next messages
        // for the hand-over's 10 s, at each try (found by a re-probe). One
        // not done by then counts as not reached, and its messages not
        // handed yet wait for its next try.
        let deadline = tokio::time::Instant::now() + PASS_TIME;
        while let Ok(Some((key, ok))) = tokio::time::timeout_at(deadline, handed.next()).await {
            pending.remove(&key);
            reached.push((key, ok));
        }
        drop(handed);
        reached.extend(pending.into_iter().map(|key| (key, false)));
        let done = finished.into_inner().expect("relay pass lock");
        (done, reached)
    }

    /// Queue one relayed message with the recipient's owner.
    async fn hand_over(
        &self,
        cluster: &Cluster,
        peers: &Peers,
        key: &ActorKey,
        rec: RelayRecord,
    ) -> Result<(), PeerError> {
        let idempotency_key = rec
            .message
            .idempotency_key
            .clone()
            .unwrap_or_else(|| format!("relay-{}", rec.message.message_id));
        match cluster.target(key) {
            Target::Here => {
                let ttl = self.config.limits.idempotency_ttl_ms;
                match self.enqueue_record(key, rec.message, ttl).await {
                    Ok(_) => Ok(()),
                    Err(TurnError::UnknownType(t)) => {
                        Err(PeerError::NotFound(format!("type `{t}` is not deployed")))
                    }
                    Err(e) => Err(PeerError::Failed(format!("{key}: {e}"))),
                }
            }
            Target::Via(base) => {
                peers
                    .enqueue(&base, key, rec.message.body, &idempotency_key)
                    .await
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A recipient not reached waits longer with each failure, to
    /// MAX_BACKOFF, and not at all once reached; only its rows wait.
    #[test]
    fn a_recipient_not_reached_waits_longer_each_time() {
        let stuck = ActorKey::new("t", "stuck").unwrap();
        let row = |id: &str| RelayRecord {
            actor_type: "t".into(),
            actor_id: id.into(),
            message: crate::storage::schema::InboxRecord {
                message_id: "m".into(),
                body: Vec::new(),
                content_type: None,
                idempotency_key: None,
                attempts: 0,
                enqueued_at_ms: 0,
                kind: crate::storage::schema::InboxKind::Message,
            },
            from: None,
        };
        let mut w = Waiting::default();
        let now = tokio::time::Instant::now();
        assert!(!w.holds(&row("stuck"), now));
        let mut waits = Vec::new();
        for _ in 0..8 {
            w.tried(stuck.clone(), false);
            let (at, wait) = w.0[&("t".to_owned(), "stuck".to_owned())];
            waits.push(wait);
            assert_eq!(w.next_try(), Some(at));
            assert!(w.holds(&row("stuck"), at - Duration::from_millis(1)));
            assert!(!w.holds(&row("stuck"), at));
            assert!(!w.holds(&row("other"), now));
        }
        assert_eq!(waits[0], FIRST_BACKOFF);
        assert_eq!(waits[1], FIRST_BACKOFF * 2);
        assert_eq!(*waits.last().unwrap(), MAX_BACKOFF);
        w.tried(stuck, true);
        assert!(w.next_try().is_none());
    }
}
