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
//! kept) while messages to others go on: a pass reads a few of each
//! recipient's first messages and hands recipients theirs side by side.

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
/// Of them, most to one recipient: one that cannot be reached holds back
/// only its own.
const PER_RECIPIENT: usize = 32;
/// Recipients handed messages at once.
const HAND_OVER_AT_ONCE: usize = 16;
/// Longest wait between passes while a recipient is unreachable.
const MAX_BACKOFF: Duration = Duration::from_secs(5);

impl Node {
    /// Hand relayed messages over as they are committed (cluster only).
    pub(super) async fn relay(self: Arc<Self>) {
        let Some((cluster, peers)) = self.actors.cluster.clone() else {
            return;
        };
        let ready = self.storage.relay_ready().clone();
        let mut backoff = Duration::from_millis(100);
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
            // go from the node that has them.
            let writer = self.storage.writer();
            let mine = |rec: &RelayRecord| {
                rec.from
                    .as_ref()
                    .and_then(|(ty, id)| ActorKey::new(ty, id).ok())
                    .is_none_or(|from| writer.sends_for(&from))
            };
            let page = match self
                .storage
                .reader()
                .and_then(|r| r.relay_page(PAGE, PER_RECIPIENT, mine))
            {
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
                // Also a periodic look, in case a wake-up was missed.
                let _ = tokio::time::timeout(MAX_BACKOFF, notified).await;
                continue;
            }
            let (done, stuck) = self.hand_over_page(&cluster, &peers, page).await;
            let moved = !done.is_empty();
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
            // Stuck, and nothing else moved: wait. (While others move,
            // waiting for the stuck one delayed them too.)
            if stuck && !moved {
                tokio::time::sleep(backoff).await;
                backoff = (backoff * 2).min(MAX_BACKOFF);
            } else {
                backoff = Duration::from_millis(100);
            }
        }
    }

    /// Hand over one page; returns the seqs to forget (handed over, or
    /// dropped) and whether any recipient could not be reached. Each
    /// recipient's messages go in order, one at a time; recipients go
    /// side by side, so one whose node hangs holds back only its own.
    async fn hand_over_page(
        &self,
        cluster: &Cluster,
        peers: &Peers,
        page: Vec<(u64, RelayRecord)>,
    ) -> (Vec<u64>, bool) {
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
        let recipients = order.into_iter().map(|key| {
            let list = rows.remove(&key).unwrap_or_default();
            async move {
                let mut done = Vec::new();
                for (seq, rec) in list {
                    match self.hand_over(cluster, peers, &key, rec).await {
                        Ok(()) => done.push(seq),
                        Err(PeerError::NotFound(why)) => {
                            // As on one node: a message to a type deleted
                            // since it was sent is dropped.
                            tracing::warn!(to = %key, %why, "relay: message to an actor of an unknown type dropped");
                            done.push(seq);
                        }
                        Err(e @ (PeerError::Refused { .. } | PeerError::Failed(_))) => {
                            let why = e.to_string();
                            tracing::warn!(to = %key, %why, "relay: cannot hand a message over yet; retrying");
                            return (done, true);
                        }
                    }
                }
                (done, false)
            }
        });
        let mut stuck = false;
        let mut handed = futures::stream::iter(recipients).buffer_unordered(HAND_OVER_AT_ONCE);
        while let Some((seqs, waits)) = handed.next().await {
            done.extend(seqs);
            stuck |= waits;
        }
        (done, stuck)
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
