//! Following this node's slots in a cluster. When a failover makes it the
//! owner of used slots (it was their backup), their actors start here:
//! alarms are re-read and actors with queued messages are woken. When it
//! loses slots (it was fenced and another node took over), their active
//! actors leave (whatever they would commit is refused by the writer
//! anyway). It also keeps the degraded-slots gauge current.

use std::collections::BTreeSet;
use std::sync::Arc;
use std::time::Duration;

use super::Node;

/// How long a graceful stop waits for the turns in flight before it hands
/// its slots over.
const TURNS_AT_STOP: Duration = Duration::from_secs(5);
use crate::alarms::scheduler::Notice;
use crate::ids::ActorKey;

impl Node {
    pub(super) async fn follow_slots(self: Arc<Self>) {
        let Some(cluster) = self.cluster.clone() else {
            return;
        };
        let (slots, degraded) = cluster.owned_used();
        self.metrics.degraded_slots.set(degraded as i64);
        let mut owned: BTreeSet<u32> = slots.into_iter().collect();
        let mut snapshots: BTreeSet<(u32, i64)> = BTreeSet::new();
        loop {
            self.snapshot_for_joining(&cluster, &mut snapshots);
            for (slot, epoch, to) in cluster.handoffs_asked() {
                tokio::spawn(self.clone().hand_off(cluster.clone(), slot, epoch, to));
            }
            let _ = tokio::time::timeout(Duration::from_secs(1), cluster.changed()).await;
            let (slots, degraded) = cluster.owned_used();
            self.metrics.degraded_slots.set(degraded as i64);
            let now: BTreeSet<u32> = slots.into_iter().collect();
            let gained: BTreeSet<u32> = now.difference(&owned).copied().collect();
            let lost: BTreeSet<u32> = owned.difference(&now).copied().collect();
            if !lost.is_empty() {
                tracing::warn!(
                    slots = lost.len(),
                    "slots taken over by another node; their actors leave"
                );
                self.actors
                    .registry()
                    .invalidate_where(|k| lost.contains(&cluster.slot_of(k)));
                // Their followers resume at the new owner.
                self.event_bus
                    .end_where(|k| lost.contains(&cluster.slot_of(k)));
            }
            if !gained.is_empty() {
                // What this node accepted as their backup lands before
                // their actors start (`cluster/takeover.rs`).
                let epochs = cluster.owned_epochs(&gained);
                for &(slot, epoch) in &epochs {
                    self.note_takeover(&cluster, slot, epoch);
                }
                cluster.settle_slots(self.storage.writer(), &epochs).await;
                let woken = self.start_actors(|k| gained.contains(&cluster.slot_of(k)));
                tracing::info!(
                    slots = gained.len(),
                    actors_with_messages = woken,
                    "took over slots"
                );
            }
            owned = now;
        }
    }

    /// At a graceful stop, while the listener still serves: hand every
    /// slot this node owns to its live backup, as a rebalance's handoff
    /// does (fence, let every earlier commit reach the backup, switch), so
    /// that its actors are served on at once rather than after the lease
    /// and the controller's grace (~5 s per node of a rolling restart).
    /// Requests caught by a fence are routed again to the new owner.
    /// Bounded: past it (or with etcd gone) what is left fails over as
    /// after a crash.
    pub async fn hand_over_slots_at_stop(&self) {
        let Some(cluster) = self.cluster.clone() else {
            return;
        };
        // First say so: the controller and the other owners then give this
        // node no more slots. A rebalance kept handing it some while it
        // stopped; never handed on, they failed over after its lease
        // (a probe: 502s and ~2 s without answers).
        if let Err(e) = cluster.announce_leaving().await {
            tracing::warn!(error = %e, "cannot say this node is leaving");
        }
        // No new inbox row starts now (`served_elsewhere`); the turns
        // running finish and submit their commits before the fence, within
        // a bound (a turn may run for minutes: past it, it is cut, and its
        // guest told so where it runs again).
        if !self.actors.turns_done(TURNS_AT_STOP).await {
            tracing::info!(
                waited_ms = TURNS_AT_STOP.as_millis() as u64,
                "stopping: turns still running are cut by the handover"
            );
        }
        let started = std::time::Instant::now();
        let bound = Duration::from_secs(10);
        // Slots handed, and slots tried (each once, however many passes).
        let (mut handed, mut asked) = (0, BTreeSet::new());
        // Again while slots keep coming (a handoff to this node decided
        // before the controller saw it leaving, still being switched),
        // within the bound.
        while started.elapsed() < bound {
            let due = cluster.slots_to_hand_over_at_stop();
            if due.is_empty() && cluster.handoffs_to_me() == 0 {
                break;
            }
            // One fenced already is in a rebalance's handoff, which
            // switches it itself: left to it.
            let mine: Vec<_> = due
                .into_iter()
                .filter(|(slot, _, _)| cluster.start_drain(*slot))
                .collect();
            let mut all_switched = !mine.is_empty();
            if !mine.is_empty() {
                asked.extend(mine.iter().map(|(slot, _, _)| *slot));
                let left = bound.saturating_sub(started.elapsed());
                let n = tokio::time::timeout(left, self.hand_over_at_stop(&cluster, &mine))
                    .await
                    .unwrap_or(0);
                all_switched = n == mine.len();
                handed += n;
                // Past the bound (or with the writer gone): what was not
                // switched is served here while the node finishes, then
                // fails over.
                for (slot, _, _) in &mine {
                    cluster.end_drain(*slot);
                }
            }
            if !all_switched {
                // Waiting for slots on their way, or some could not be
                // switched now (their slot changed, or etcd failed).
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
        }
        if asked.is_empty() {
            return;
        }
        self.metrics.cluster_handoffs.inc_by(handed as u64);
        tracing::info!(
            handed,
            of = asked.len(),
            elapsed_ms = started.elapsed().as_millis() as u64,
            "slots handed to their backups before stopping"
        );
    }

    /// Hand `slots` (slot, epoch, backup; fenced by the caller) over at a
    /// stop: let every earlier commit reach the backups, switch each,
    /// eight at a time. How many were switched.
    async fn hand_over_at_stop(
        &self,
        cluster: &crate::cluster::Cluster,
        slots: &[(u32, u64, String)],
    ) -> usize {
        let (done, drained) = tokio::sync::oneshot::channel();
        self.storage
            .writer()
            .submit(crate::storage::WriteOp::Barrier { done });
        if drained.await.is_err() {
            return 0;
        }
        // A few at a time (each an etcd compare-and-swap); each fence
        // lifted as soon as its switch is known, so that requests waiting
        // on it go to the new owner (or, where the switch failed, are
        // served here while this node finishes).
        use futures::StreamExt as _;
        futures::stream::iter(slots.to_vec())
            .map(|(slot, epoch, to)| {
                let cluster = cluster.clone();
                async move {
                    let switched = cluster.hand_off_at_stop(slot, epoch, &to).await;
                    cluster.end_drain(slot);
                    match switched {
                        Ok(switched) => usize::from(switched),
                        Err(e) => {
                            tracing::warn!(slot, error = %e, "cannot hand the slot over; it fails over");
                            0
                        }
                    }
                }
            })
            .buffer_unordered(8)
            .fold(0, |n, handed| async move { n + handed })
            .await
    }

    /// Hand `slot` (owned here at `epoch`) to its backup `to`, as a
    /// rebalance asks (`cluster/rebalance.rs`): fence it, let every earlier
    /// commit reach the backup, switch.
    async fn hand_off(
        self: Arc<Self>,
        cluster: crate::cluster::Cluster,
        slot: u32,
        epoch: u64,
        to: String,
    ) {
        if !cluster.start_drain(slot) {
            return;
        }
        // Released only after every batch committed before it, each once
        // its backup has it.
        let (done, drained) = tokio::sync::oneshot::channel();
        self.storage
            .writer()
            .submit(crate::storage::WriteOp::Barrier { done });
        let switched = match drained.await {
            Ok(()) => cluster.hand_off(slot, epoch, &to).await,
            Err(_) => Err(anyhow::anyhow!("the writer stopped")),
        };
        match switched {
            Ok(true) => {
                self.metrics.cluster_handoffs.inc();
                tracing::info!(slot, to = %to, epoch = epoch + 1, "slot handed to its backup (rebalance)");
            }
            Ok(false) => tracing::debug!(slot, "handoff withdrawn or the slot changed"),
            Err(e) => {
                // The switch may have been written: keep the fence until
                // the view says (or for a while), then go on.
                tracing::warn!(slot, error = %e, "handing the slot over failed");
                let _ = tokio::time::timeout(Duration::from_secs(2), cluster.changed()).await;
            }
        }
        cluster.end_drain(slot);
    }

    /// Ship a snapshot of each slot this node owns that has a joining node
    /// (once per catching-up, `asked`), so that the node becomes its backup.
    fn snapshot_for_joining(
        &self,
        cluster: &crate::cluster::Cluster,
        asked: &mut BTreeSet<(u32, i64)>,
    ) {
        let slots: Vec<(u32, u64, i64)> = cluster
            .joining_slots()
            .into_iter()
            .filter(|(slot, _, session)| asked.insert((*slot, *session)))
            .collect();
        if slots.is_empty() {
            return;
        }
        let n = slots.len();
        let storage = self.storage.clone();
        tokio::spawn(async move {
            let taken = storage
                .writer()
                .call(|done| crate::storage::WriteOp::Snapshot { slots, done })
                .await;
            match taken {
                Ok(actors) => {
                    tracing::info!(slots = n, actors, "snapshots shipped to joining backups")
                }
                Err(e) => {
                    tracing::warn!(slots = n, error = %e, "snapshot for joining backups failed")
                }
            }
        });
    }

    /// Start the actors `which` selects, which this node now serves with
    /// their data (slots taken over, an actor moved in): their alarms,
    /// their queued messages, and what they committed to send (outbound
    /// webhooks, relayed messages: the workers look again). Returns the
    /// actors woken for messages.
    /// `slot`, owned here at `epoch`, came from another node and has not
    /// settled yet: the rows queued in it so far may have been started
    /// there (their guests are told so: `attempt`).
    pub fn note_takeover(&self, cluster: &crate::cluster::Cluster, slot: u32, epoch: u64) {
        if !cluster.settled(slot, epoch) {
            self.actors.took_over(slot);
        }
    }

    pub(super) fn start_actors(&self, which: impl Fn(&ActorKey) -> bool) -> usize {
        self.actors.scheduler.notify(Notice::Reload);
        self.storage.outbox_ready().notify_one();
        self.storage.relay_ready().notify_one();
        match self.storage.reader().and_then(|r| {
            let (nums, _) = r.inbox_actors()?;
            let mut keys = Vec::new();
            for num in nums {
                if let Some(k) = r.actor_key(num)?
                    && which(&k)
                {
                    keys.push(k);
                }
            }
            Ok(keys)
        }) {
            Ok(keys) => {
                for k in &keys {
                    self.actors.poke(k);
                }
                keys.len()
            }
            // Stopping (a SIGTERM while the node started): no fault.
            Err(crate::storage::StorageError::ShuttingDown) => 0,
            Err(e) => {
                tracing::error!(error = %e, "cannot read the inboxes of actors to start");
                0
            }
        }
    }
}
