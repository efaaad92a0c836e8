//! The owner's side of synchronous replication: every committed batch's
//! writes to slots with a backup go to that backup, and the batch is
//! released (replies, stream frames, outbound webhooks, relayed sends,
//! alarm effects) only once the backup acknowledged them — the output gate
//! covers the backup's disk too.
//!
//! Shipments queue in commit order and are released in that order. While
//! one round trip is in flight the next shipments gather, so the backup
//! gets them in one request (group replication, like the group commit).
//! A backup that refuses (it does not see itself as the backup at that
//! epoch yet) or cannot be reached is retried; once it has failed for
//! [`DROP_AFTER`] (from the first quick attempt that got no answer, which
//! waits as long: `peer::replicate_timeout`), the owner drops it from the
//! slot (compare-and-swap) and the slot runs without a backup (degraded, counted in metrics and
//! `GET /v1/cluster`) — and from every other slot it backs for this node
//! at the same time, since a node that failed one slot's batches for that
//! long fails them all. A batch whose slot moved to another node meanwhile
//! fails instead of being released.
//!
//! A node catching up to become a slot's backup (joining) gets the slot's
//! batches from its snapshot on — the snapshot holds everything before —
//! and none before it (it could not apply them). A rebalance keeps the old
//! backup meanwhile, so a batch then waits for both.

use std::collections::{BTreeMap, HashMap};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use tokio::sync::mpsc;

use super::blobs::Ask;
use super::{Cluster, Peers, ShipTarget, Shipping};
use crate::ids::ActorKey;
use crate::metrics::Metrics;
use crate::storage::blobs::BlobHold;
use crate::storage::schema::ReplicaBatch;
use crate::storage::{Placement, Release, Replication, Storage};

/// Fault injection for tests: delay every shipping round by this many
/// milliseconds (a slow link to the backups), so that a test can kill an
/// owner while its commits are on their way.
pub const FAULT_DELAY_ENV: &str = "MARMOT_FAULT_REPLICATION_DELAY_MS";

/// How long a live backup may fail before the owner drops it.
pub const DROP_AFTER: Duration = Duration::from_secs(3);

/// Shipments gathered into one round per backup, at most.
const MAX_ROUND: usize = 512;

struct Shipment {
    batches: Vec<ReplicaBatch>,
    release: Release,
    /// The blobs a snapshot's files name, held until it is shipped: a
    /// file overwritten meanwhile released its blob, which went 10 s later,
    /// while a large snapshot could still be on its way.
    holds: Vec<BlobHold>,
}

/// The [`Replication`] of a cluster node.
pub struct Replicator {
    cluster: Cluster,
    storage: Arc<Storage>,
    tx: mpsc::UnboundedSender<Shipment>,
}

impl Replicator {
    /// Start shipping for `cluster`, reading blobs from `storage`.
    pub fn start(
        cluster: Cluster,
        peers: Peers,
        storage: Arc<Storage>,
        metrics: Arc<Metrics>,
    ) -> Arc<Self> {
        let (tx, rx) = mpsc::unbounded_channel();
        let delay = std::env::var(FAULT_DELAY_ENV)
            .ok()
            .and_then(|v| v.parse().ok())
            .map(Duration::from_millis);
        if let Some(d) = delay {
            tracing::warn!(delay = ?d, "fault injection enabled ({FAULT_DELAY_ENV}); never use this in production");
        }
        let sender = Sender {
            cluster: cluster.clone(),
            peers,
            storage: storage.clone(),
            metrics,
            delay,
            armed: Mutex::default(),
        };
        tokio::spawn(sender.run(rx));
        Arc::new(Self {
            cluster,
            storage,
            tx,
        })
    }
}

impl Replication for Replicator {
    fn placement(&self, key: &ActorKey) -> Placement {
        self.cluster.placement(key)
    }

    fn slot_placement(&self, slot: u32) -> Placement {
        self.cluster.slot_placement(slot)
    }

    fn slot_of(&self, key: &ActorKey) -> u32 {
        self.cluster.slot_of(key)
    }

    fn holds(&self, slot: u32) -> bool {
        self.cluster.holds(slot)
    }

    /// Output: only while the lease is provably alive (self-fencing), like
    /// the replies of turns.
    fn sends_for(&self, key: &ActorKey) -> bool {
        self.cluster.alive() && self.cluster.placement(key) != Placement::Elsewhere
    }

    fn ship(&self, batches: Vec<ReplicaBatch>, release: Release) {
        // A turn's blobs are held by the turn until its batch is released;
        // a snapshot's (files written long before) by nobody.
        let holds = batches
            .iter()
            .filter(|b| b.snapshot.is_some())
            .flat_map(ReplicaBatch::blob_shas)
            .filter_map(|sha| self.storage.blobs().hold(&sha))
            .collect();
        let shipment = Shipment {
            batches,
            release,
            holds,
        };
        if let Err(mpsc::error::SendError(s)) = self.tx.send(shipment) {
            (s.release)(Err("the node is shutting down".into()));
        }
    }
}

struct Sender {
    cluster: Cluster,
    peers: Peers,
    storage: Arc<Storage>,
    metrics: Arc<Metrics>,
    /// Injected before each round ([`FAULT_DELAY_ENV`]).
    delay: Option<Duration>,
    /// Per slot, the joining node (and its session) whose snapshot has been
    /// shipped: it gets the slot's later batches.
    armed: Mutex<HashMap<u32, (String, i64)>>,
}

/// What became of one batch, from the best to the most cautious: where
/// fates meet (a batch sent to a backup and a joining node, a commit of
/// several batches), the most cautious one is told.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord)]
enum Fate {
    /// On the backup (or no backup to wait for): release.
    Done,
    /// Its slot is no longer this node's, and no copy left: it failed.
    Lost(String),
    /// Its slot is no longer this node's after a copy went out: the
    /// outcome is unknown (the node it went to may own the slot now).
    Unknown(String),
}

impl Sender {
    async fn run(self, mut rx: mpsc::UnboundedReceiver<Shipment>) {
        while let Some(first) = rx.recv().await {
            let mut round = vec![first];
            while round.len() < MAX_ROUND {
                match rx.try_recv() {
                    Ok(s) => round.push(s),
                    Err(_) => break,
                }
            }
            self.metrics.replication_queue.set(rx.len() as i64);
            let mut holds = Vec::new();
            let (batches, releases): (Vec<Vec<ReplicaBatch>>, Vec<Release>) = round
                .into_iter()
                .map(|s| {
                    holds.push(s.holds);
                    (s.batches, s.release)
                })
                .unzip();
            let started = Instant::now();
            if let Some(d) = self.delay {
                tokio::time::sleep(d).await;
            }
            let fates = self.ship_round(&batches).await;
            if batches.iter().any(|b| !b.is_empty()) {
                self.metrics
                    .replication_seconds
                    .observe(started.elapsed().as_secs_f64());
            }
            let mut fates = fates.into_iter();
            for (shipped, release) in batches.iter().zip(releases) {
                let worst = fates.by_ref().take(shipped.len()).max();
                release(match worst {
                    None | Some(Fate::Done) => Ok(()),
                    Some(Fate::Lost(why) | Fate::Unknown(why)) => Err(why),
                });
            }
            drop(holds);
        }
    }

    /// Every batch of the round onto its backup; a fate per batch, in
    /// order.
    async fn ship_round(&self, round: &[Vec<ReplicaBatch>]) -> Vec<Fate> {
        let batches: Vec<&ReplicaBatch> = round.iter().flatten().collect();
        let mut fates = vec![Fate::Done; batches.len()];
        // Per target node, its batches in commit order.
        let mut per_node: BTreeMap<String, Vec<usize>> = BTreeMap::new();
        for (i, b) in batches.iter().enumerate() {
            match self.cluster.shipping(b.slot, b.mark.epoch) {
                Shipping::To(targets) => {
                    for t in targets {
                        // A joining node takes the slot's batches from the
                        // snapshot of its own catching-up on.
                        if let Some(session) = t.joining
                            && b.snapshot == Some(session)
                        {
                            self.lock_armed()
                                .insert(b.slot, (t.node_id.clone(), session));
                        }
                        if self.gets(b, &t) {
                            per_node.entry(t.node_id).or_default().push(i);
                        }
                    }
                }
                Shipping::NoBackup => {}
                Shipping::Lost => fates[i] = lost(b, false),
            }
        }
        let sends = per_node
            .into_iter()
            .map(|(node, idx)| self.ship_to(node, idx, &batches));
        // A batch is done once every node it went to has it.
        for (i, fate) in futures::future::join_all(sends).await.into_iter().flatten() {
            if fate > fates[i] {
                fates[i] = fate;
            }
        }
        fates
    }

    /// Whether batch `b` goes to target `t`: a backup gets every batch, a
    /// joining node those from the snapshot of its catching-up on (not one
    /// taken for an earlier record of the slot).
    fn gets(&self, b: &ReplicaBatch, t: &ShipTarget) -> bool {
        match t.joining {
            None => true,
            Some(session) => {
                b.snapshot == Some(session)
                    || self.lock_armed().get(&b.slot) == Some(&(t.node_id.clone(), session))
            }
        }
    }

    fn lock_armed(&self) -> std::sync::MutexGuard<'_, HashMap<u32, (String, i64)>> {
        self.armed.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Ship batches `idx` (of `all`) to `node` until each is on it, or
    /// resolved otherwise.
    async fn ship_to(
        &self,
        node: String,
        idx: Vec<usize>,
        all: &[&ReplicaBatch],
    ) -> Vec<(usize, Fate)> {
        // Since when the backup has failed to take anything: a long
        // transfer of blobs that then fails once is not three seconds of
        // failing.
        let mut failing_since: Option<Instant> = None;
        let mut pending = idx;
        let mut out = Vec::new();
        let mut backoff = Duration::from_millis(10);
        // Batches a copy of which went out (the backup may have them).
        let mut sent = std::collections::HashSet::new();
        loop {
            // Re-resolve: the slot may have lost its backup or its owner.
            // (`url`: the backup's, while it is a live member.)
            let mut url = None;
            pending.retain(|&i| {
                let b = all[i];
                let target = match self.cluster.shipping(b.slot, b.mark.epoch) {
                    Shipping::To(targets) => targets.into_iter().find(|t| t.node_id == node),
                    Shipping::NoBackup => None,
                    Shipping::Lost => {
                        out.push((i, lost(b, sent.contains(&i))));
                        return false;
                    }
                };
                match target {
                    Some(t) if self.gets(b, &t) => {
                        if url.is_none() {
                            url = t.advertise;
                        }
                        true
                    }
                    // Not a target now (dropped, named backup in place of
                    // another, or catching up anew): the writes are on the
                    // slot's other copies, or on this disk alone.
                    _ => {
                        out.push((i, Fate::Done));
                        false
                    }
                }
            });
            if pending.is_empty() {
                return out;
            }
            let mut progressed = false;
            let attempt_started = Instant::now();
            // Whether this attempt was quick to make: small requests, no
            // blobs. Only then does an unanswered one count as failing
            // from when it went (see below).
            let mut quick = false;
            if let Some(base) = &url {
                match self.send(base, &pending, all, &mut sent, &mut quick).await {
                    Ok(outcomes) => {
                        let mut refused = Vec::new();
                        for (&i, o) in pending.iter().zip(&outcomes) {
                            if o == "applied" || o == "repeat" {
                                progressed = true;
                                out.push((i, Fate::Done));
                                if let Some(session) = all[i].snapshot {
                                    self.joined(all[i], &node, session).await;
                                }
                            } else {
                                refused.push(i);
                            }
                        }
                        // Anything past the answered ones is resent.
                        refused.extend(pending.iter().skip(outcomes.len()));
                        pending = refused;
                        if pending.is_empty() {
                            return out;
                        }
                        tracing::debug!(backup = %node, batches = pending.len(), ?outcomes, "backup refused batches; retrying");
                    }
                    Err(e) => {
                        tracing::debug!(backup = %node, error = %e, "shipping to the backup failed; retrying");
                    }
                }
            }
            // Failing since a quick attempt that got no answer was sent (a
            // backup that hangs used up its timeout, 3 s, first: the
            // owner's writes waited 5 s of timeout and then 3 s more), or
            // since a long one failed (a large transfer that then fails
            // once is not seconds of failing).
            let since = if progressed {
                failing_since = None;
                Instant::now()
            } else {
                *failing_since.get_or_insert_with(|| match quick {
                    true => attempt_started,
                    false => Instant::now(),
                })
            };
            // A backup that stopped gracefully (it said it was leaving,
            // then revoked its lease as it exited) is not coming back as it
            // was: dropped at once, not after `DROP_AFTER` of commits
            // waiting for it. A member key gone for another reason (a
            // lease that lapsed and is renewed) gets the full wait.
            if since.elapsed() >= DROP_AFTER || self.cluster.left_gracefully(&node) {
                self.drop_backup(&node, &pending, all).await;
                backoff = Duration::from_millis(10);
                continue;
            }
            tokio::time::sleep(backoff).await;
            backoff = (backoff * 2).min(Duration::from_millis(250));
        }
    }

    /// `node` has the snapshot `b` of its slot: name it the backup. Until
    /// then it gets every write as the joining node, so naming it may take
    /// a while: retried in the background while etcd fails (a slot whose
    /// caught-up node is never named stays without a backup), until named
    /// or the slot changed.
    async fn joined(&self, b: &ReplicaBatch, node: &str, session: i64) {
        let (cluster, slot, epoch) = (self.cluster.clone(), b.slot, b.mark.epoch);
        let (node, actors) = (node.to_owned(), b.ops.len());
        tokio::spawn(async move {
            let mut backoff = Duration::from_millis(50);
            loop {
                match cluster.joined(slot, epoch, &node, session).await {
                    Ok(true) => {
                        tracing::info!(slot, backup = %node, actors, "a new backup caught up with the slot");
                        return;
                    }
                    Ok(false) => return,
                    Err(e) => tracing::warn!(slot, backup = %node, error = %e,
                        "cannot name the caught-up backup yet; retrying"),
                }
                tokio::time::sleep(backoff).await;
                backoff = (backoff * 2).min(Duration::from_secs(2));
            }
        });
    }

    /// Drop `node` as the backup of the slots of `pending`, and of every
    /// other slot it backs for this node: one drop for all of them. Each
    /// slot used to be dropped when a batch of its own had waited
    /// [`DROP_AFTER`], so the owner's commits (released in order) stalled
    /// in three-second waves, one per round that touched another of its
    /// slots: 12–18 s without a write anywhere in the cluster after one
    /// node died (a probe). Rounds go one at a time, and each rewritten
    /// record is this node's view at once, so the next round sends the
    /// dropped node nothing.
    async fn drop_backup(&self, node: &str, pending: &[usize], all: &[&ReplicaBatch]) {
        let gracefully = self.cluster.left_gracefully(node);
        let mut slots: Vec<(u32, u64)> = pending
            .iter()
            .map(|&i| (all[i].slot, all[i].mark.epoch))
            .chain(self.cluster.slots_backed_by(node))
            .collect();
        slots.sort_unstable();
        slots.dedup();
        let mut gone = 0usize;
        // A few compare-and-swaps at a time: hundreds of slots.
        for chunk in slots.chunks(16) {
            let drops = chunk
                .iter()
                .map(|&(slot, epoch)| self.cluster.drop_backup(slot, epoch, node));
            for (&(slot, _), r) in chunk.iter().zip(futures::future::join_all(drops).await) {
                match r {
                    Ok(true) => gone += 1,
                    Ok(false) => {}
                    Err(e) => {
                        tracing::warn!(slot, backup = %node, error = %e, "cannot drop an unreachable backup")
                    }
                }
            }
        }
        if gone == 0 {
            return;
        }
        if gracefully {
            tracing::info!(backup = %node, slots = gone,
                "the backup stopped gracefully; its slots run without one until another catches up");
        } else {
            tracing::warn!(backup = %node, slots = gone,
                "backup unreachable or out of step for {DROP_AFTER:?}; its slots run without one");
        }
    }

    /// Batches `idx`, after the blobs they name, in requests of at most
    /// [`REQUEST_BYTES`] sent one after the other; the outcomes answered,
    /// in order (short if a later request failed: the rest is resent).
    /// Batches a copy of which went out join `sent`.
    async fn send(
        &self,
        base: &str,
        idx: &[usize],
        all: &[&ReplicaBatch],
        sent: &mut std::collections::HashSet<usize>,
        quick: &mut bool,
    ) -> anyhow::Result<Vec<String>> {
        let batches: Vec<&ReplicaBatch> = idx.iter().map(|&i| all[i]).collect();
        let shas: Vec<[u8; 32]> = batches.iter().flat_map(|b| b.blob_shas()).collect();
        let bodies = requests(&batches)?;
        *quick = shas.is_empty() && bodies.iter().all(|b| super::peer::quick_request(b.len()));
        if !shas.is_empty() {
            // A snapshot's blobs may be there already (a node that held
            // the slot before); a turn's were just written.
            let ask = if batches.iter().any(|b| b.snapshot.is_some()) {
                Ask::First
            } else {
                Ask::Never
            };
            let bytes =
                super::blobs::send_blobs(&self.peers, &self.storage, base, shas, ask).await?;
            if bytes > 0 {
                tracing::debug!(backup = base, bytes, "sent blobs ahead of their batches");
            }
        }
        sent.extend(idx.iter().copied());
        let mut outcomes = Vec::with_capacity(batches.len());
        for request in bodies {
            match self.peers.replicate(base, request).await {
                Ok(o) => outcomes.extend(o),
                Err(e) if outcomes.is_empty() => return Err(e.into()),
                Err(e) => {
                    tracing::debug!(backup = base, error = %e, "shipping to the backup failed part-way");
                    break;
                }
            }
        }
        Ok(outcomes)
    }
}

/// Batch bytes per replication request, at most (a larger batch goes
/// alone). A round of 512 shipments of 1 MiB messages was one 512 MiB
/// request with five seconds to arrive.
const REQUEST_BYTES: usize = 16 << 20;

/// `batches` encoded as the bodies of consecutive requests (each a
/// postcard sequence: its length, then the batches), none above
/// [`REQUEST_BYTES`] unless it holds a single batch.
fn requests(batches: &[&ReplicaBatch]) -> anyhow::Result<Vec<Vec<u8>>> {
    let mut out = Vec::new();
    let mut group: Vec<Vec<u8>> = Vec::new();
    let mut bytes = 0;
    let finish = |group: &mut Vec<Vec<u8>>| -> anyhow::Result<Vec<u8>> {
        let mut body = postcard::to_allocvec(&group.len())?;
        for b in group.drain(..) {
            body.extend(b);
        }
        Ok(body)
    };
    for b in batches {
        let one = postcard::to_allocvec(b)?;
        if !group.is_empty() && bytes + one.len() > REQUEST_BYTES {
            out.push(finish(&mut group)?);
            bytes = 0;
        }
        bytes += one.len();
        group.push(one);
    }
    if !group.is_empty() {
        out.push(finish(&mut group)?);
    }
    Ok(out)
}

/// The fate of batch `b` whose slot moved on before its backup confirmed
/// it; `maybe_sent`: a copy was sent, so the backup (now the owner) may
/// have it. Then the outcome is unknown, and the error must say so: "commit
/// failed" told a client that a turn the new owner had applied did not
/// happen, and its plain retry applied it twice (found by a probe).
fn lost(b: &ReplicaBatch, maybe_sent: bool) -> Fate {
    if maybe_sent {
        Fate::Unknown(format!(
            "outcome unknown: slot {} moved to another node while this commit was being copied \
             to its backup, which may have applied it; retry with the same Idempotency-Key to \
             learn the outcome without running it twice",
            b.slot
        ))
    } else {
        Fate::Lost(format!(
            "slot {} moved to another node before this commit was copied to its backup: it did \
             not take effect, and a retry is safe (every turn committed with it fails, \
             whichever slot its actor is in)",
            b.slot
        ))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::storage::schema::{ReplicaMark, ReplicaOp};

    /// Batches go in requests of bounded size, in order, each request a
    /// sequence the backup decodes as a whole.
    #[test]
    fn batches_go_in_bounded_requests_in_order() {
        let batch = |lsn: u64, bytes: usize| ReplicaBatch {
            slot: 7,
            mark: ReplicaMark { epoch: 1, lsn },
            ops: vec![ReplicaOp::Delete {
                actor_type: "t".into(),
                actor_id: "x".repeat(bytes),
            }],
            snapshot: None,
        };
        let batches: Vec<ReplicaBatch> = (1..=40).map(|lsn| batch(lsn, 1 << 20)).collect();
        let refs: Vec<&ReplicaBatch> = batches.iter().collect();
        let bodies = requests(&refs).unwrap();
        assert!(bodies.len() >= 3, "{} requests", bodies.len());
        let mut decoded = Vec::new();
        for body in &bodies {
            assert!(body.len() <= REQUEST_BYTES + 64, "{} bytes", body.len());
            decoded.extend(postcard::from_bytes::<Vec<ReplicaBatch>>(body).unwrap());
        }
        assert_eq!(decoded, batches);
        // A batch larger than a request goes alone; small ones together.
        let big = batch(41, REQUEST_BYTES + 1);
        let small = batch(42, 10);
        let bodies = requests(&[&small, &big, &small, &small]).unwrap();
        assert_eq!(bodies.len(), 3);
        let sizes: Vec<usize> = bodies
            .iter()
            .map(|b| postcard::from_bytes::<Vec<ReplicaBatch>>(b).unwrap().len())
            .collect();
        assert_eq!(sizes, [1, 1, 2]);
    }

    /// Where fates meet, the most cautious is told: a copy that may have
    /// landed somewhere outweighs one that went nowhere (it said "a retry
    /// is safe" of a commit another node may have applied).
    #[test]
    fn the_most_cautious_fate_wins() {
        let fates = [
            Fate::Done,
            Fate::Unknown("maybe".into()),
            Fate::Lost("no".into()),
        ];
        assert_eq!(fates.iter().max(), Some(&Fate::Unknown("maybe".into())));
        assert!(Fate::Lost(String::new()) > Fate::Done);
    }
}
