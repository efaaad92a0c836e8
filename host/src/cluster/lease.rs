//! The membership lease: joining (the member key under a fresh lease, one
//! live process per node id), renewing it, rejoining as a new incarnation
//! once it is gone, and how long it is *provably* alive — until the send
//! time of the last confirmed keepalive plus the TTL minus a margin, on the
//! monotonic clock.

use std::sync::Arc;
use std::sync::atomic::{AtomicI64, AtomicU64, Ordering};
use std::time::{Duration, Instant};

use anyhow::Context as _;
use etcd_client::{Compare, CompareOp, PutOptions, Txn, TxnOp};

use super::records::MemberRecord;
use super::{Inner, within};

/// The membership lease and how long it is provably alive.
pub(super) struct Lease {
    pub(super) id: AtomicI64,
    /// Monotonic milliseconds since `base` until which the lease is alive.
    pub(super) alive_until_ms: AtomicU64,
    pub(super) base: Instant,
    pub(super) ttl: Duration,
}

impl Lease {
    /// Kept back from the TTL: etcd's clock and ours may drift, and a
    /// request admitted just before the deadline still has to finish.
    fn margin(&self) -> Duration {
        self.ttl / 5
    }

    pub(super) fn confirmed(&self, sent_at: Instant, ttl: Duration) {
        let until = (sent_at + ttl.saturating_sub(self.margin())) - self.base;
        self.alive_until_ms
            .fetch_max(until.as_millis() as u64, Ordering::AcqRel);
    }

    pub(super) fn alive(&self) -> bool {
        (self.base.elapsed().as_millis() as u64) < self.alive_until_ms.load(Ordering::Acquire)
    }
}

/// What a starting node saw of the lease that holds its id.
#[derive(Default)]
struct Holder {
    seen: u32,
    /// The holder's incarnation and the seconds its lease had left.
    last: Option<(i64, i64)>,
    /// Times that lease was seen with more time left than before.
    renewals: u32,
}

impl Holder {
    /// Renewals seen before a holder counts as alive: etcd extends every
    /// lease once when it elects a new leader, which a dead process's
    /// lease would show once (found in a review).
    const ALIVE_AFTER: u32 = 2;

    /// Record a sighting; whether the same lease has been seen with more
    /// time left than before often enough to say its process is alive. (A
    /// dead process's lease only runs down; a new incarnation starts the
    /// count again.)
    fn renewed(&mut self, member: &MemberRecord, left: i64) -> bool {
        self.seen += 1;
        match self.last.replace((member.incarnation, left)) {
            Some((incarnation, was)) if incarnation == member.incarnation => {
                if left > was {
                    self.renewals += 1;
                }
            }
            _ => self.renewals = 0,
        }
        self.renewals >= Self::ALIVE_AFTER
    }

    fn first_sight(&self) -> bool {
        self.seen == 1
    }
}

/// The node id is registered under a lease that is still live: another
/// process with this id runs, or this one's previous life died less than
/// a lease ago.
#[derive(Debug, thiserror::Error)]
#[error(
    "another live node is registered as `{node_id}` (node ids must be unique; if that node just died, its lease ends within {ttl_s} s)"
)]
pub(super) struct IdTaken {
    node_id: String,
    ttl_s: u64,
}

impl Inner {
    /// Join at start. While the id is held by a live lease, wait it out
    /// (and a little): a supervisor that restarts a node killed a moment
    /// ago starts it while its old lease runs, and it exited at once. A
    /// second live node with the id is refused as soon as its lease is
    /// seen renewed (every third of the TTL), before anything else: on a
    /// disk of its own it went on to wait for "its" slots to fail over,
    /// which never happened, and logged that it would serve them from the
    /// wrong database (found by a probe).
    pub(super) async fn join_at_start(&self) -> anyhow::Result<()> {
        self.wait_out_a_holder().await?;
        self.give_up_a_lost_store().await?;
        let deadline = Instant::now() + self.lease.ttl + Duration::from_secs(2);
        loop {
            match self.join().await {
                Err(e) if e.is::<IdTaken>() && Instant::now() < deadline => {
                    tokio::time::sleep(Duration::from_millis(500)).await;
                }
                r => return r,
            }
        }
    }

    /// Wait while a lease holds this node's id, for one lease (and a
    /// little) at most; refuse if it is renewed meanwhile.
    async fn wait_out_a_holder(&self) -> anyhow::Result<()> {
        let deadline = Instant::now() + self.lease.ttl + Duration::from_secs(2);
        let mut holder = Holder::default();
        while Instant::now() < deadline {
            // Unknown if etcd does not say: the join finds out.
            let Ok(Some((member, left))) = self.holder().await else {
                return Ok(());
            };
            if holder.renewed(&member, left) {
                anyhow::bail!(
                    "another live node is registered as `{}` (advertised at {}): its lease was \
                     renewed while this one waited. Node ids must be unique",
                    member.node_id,
                    member.advertise
                );
            }
            if holder.first_sight() {
                tracing::warn!(node_id = %self.config.node_id, holder = %member.advertise,
                    lease_left_s = left,
                    "this node id is registered under a live lease (a previous run of this node, \
                     killed a moment ago, or another node with the same id): waiting for the \
                     lease to end, or to see it renewed");
            }
            tokio::time::sleep(Duration::from_millis(500)).await;
        }
        Ok(())
    }

    /// Who holds this node's id, and the seconds left on their lease.
    async fn holder(&self) -> anyhow::Result<Option<(MemberRecord, i64)>> {
        let key = self.keys.member(&self.config.node_id);
        let resp = within(super::ETCD_CALL, self.client.clone().get(key, None)).await?;
        let Some(kv) = resp.kvs().first() else {
            return Ok(None);
        };
        let member: MemberRecord = serde_json::from_slice(kv.value())?;
        let ttl = within(
            super::ETCD_CALL,
            self.client.clone().lease_time_to_live(kv.lease(), None),
        )
        .await?;
        Ok(Some((member, ttl.ttl())))
    }

    /// A node back with another store than it joined with before (a new
    /// or wiped disk, a restored backup) holds none of its slots' data,
    /// or old copies: serving them at their epoch answered `{"n": 0}`, and
    /// its replication marks, started over, made their backup skip its
    /// new batches as repeats while acknowledging them. Before joining —
    /// not a member yet, so the controller sees it gone — it waits until
    /// the controller has failed its used slots over to their backups and
    /// dropped it as a backup; then it joins as a new node (a rebalance
    /// gives it slots back, copied from their owners). A used slot no
    /// backup can take (it had none) lost its data with the old disk:
    /// said, and the node joins anyway after a bound.
    async fn give_up_a_lost_store(&self) -> anyhow::Result<()> {
        let me = &self.config.node_id;
        let key = self.keys.store(me);
        let resp = within(super::ETCD_CALL, self.client.clone().get(key, None)).await?;
        let Some(recorded) = resp.kvs().first().map(|kv| kv.value().to_vec()) else {
            // Its first join (or one made before stores were recorded).
            return Ok(());
        };
        if recorded == self.store_id.as_bytes() {
            return Ok(());
        }
        tracing::warn!(
            node_id = %me,
            "this node's database is not the one it last joined the cluster with (a new or wiped \
             disk, or a restored backup): waiting for its slots to fail over to their backups, \
             then joining as a new node"
        );
        let deadline = Instant::now() + 2 * self.lease.ttl + Duration::from_secs(15);
        loop {
            self.relist().await?;
            // Nobody to take them (a cluster of one, or all others down):
            // it serves what its database holds.
            if self.view().members.keys().all(|m| m == me) {
                tracing::warn!(node_id = %me,
                    "no other member is alive to take this node's slots over: it serves them \
                     from the database it has now");
                return Ok(());
            }
            let held: Vec<u32> = {
                let v = self.view();
                (0..super::SLOTS)
                    .filter(|&s| {
                        v.slots
                            .get(s as usize)
                            .and_then(Option::as_ref)
                            .is_some_and(|e| {
                                let r = &e.record;
                                (r.used && &r.owner == me)
                                    || r.backup.as_ref() == Some(me)
                                    || r.joining.as_ref() == Some(me)
                            })
                    })
                    .collect()
            };
            if held.is_empty() {
                tracing::info!(node_id = %me, "its slots failed over; joining as a new node");
                return Ok(());
            }
            if Instant::now() >= deadline {
                tracing::error!(node_id = %me, slots = ?held,
                    "these slots were not taken over (no backup to fail over to): this node \
                     serves them from the database it has now, without what was written to the \
                     one it had since");
                return Ok(());
            }
            tokio::time::sleep(Duration::from_millis(500)).await;
        }
    }

    /// This node's member record under lease `id`.
    fn member(&self, id: i64, leaving: bool) -> MemberRecord {
        MemberRecord {
            node_id: self.config.node_id.clone(),
            region: self.config.region.clone(),
            advertise: self.config.advertise.clone(),
            incarnation: id,
            leaving,
        }
    }

    /// Say in the member key (same lease) that this node is stopping: the
    /// controller and the other owners give it nothing more.
    pub(super) async fn announce_leaving(&self) -> anyhow::Result<()> {
        if !self.lease.alive() {
            anyhow::bail!("this node's lease is not confirmed (etcd unreachable?)");
        }
        let id = self.lease.id.load(Ordering::Acquire);
        let member = self.member(id, true);
        let mut client = self.client.clone();
        let put = client.put(
            self.keys.member(&self.config.node_id),
            serde_json::to_vec(&member)?,
            Some(PutOptions::new().with_lease(id)),
        );
        // Short: a stop waits for it, and without etcd nothing is given to
        // this node anyway.
        within(Duration::from_secs(2), put).await?;
        Ok(())
    }

    /// Put the member key under a fresh lease, with the store this node
    /// joins with.
    pub(super) async fn join(&self) -> anyhow::Result<()> {
        let mut client = self.client.clone();
        let sent_at = Instant::now();
        let ttl = self.lease.ttl;
        let lease = within(ttl, client.lease_grant(ttl.as_secs() as i64, None))
            .await
            .context("cannot get a lease from etcd")?;
        let id = lease.id();
        let member = self.member(id, self.leaving.load(Ordering::Acquire));
        // Only one live process per node id: the key must be free (or ours
        // from a lease that is gone).
        let key = self.keys.member(&self.config.node_id);
        let txn = Txn::new()
            .when([Compare::create_revision(key.clone(), CompareOp::Equal, 0)])
            .and_then([
                TxnOp::put(
                    key,
                    serde_json::to_vec(&member)?,
                    Some(PutOptions::new().with_lease(id)),
                ),
                TxnOp::put(
                    self.keys.store(&self.config.node_id),
                    self.store_id.as_bytes(),
                    None,
                ),
            ]);
        if !within(ttl, client.txn(txn)).await?.succeeded() {
            let _ = within(ttl, client.lease_revoke(id)).await;
            return Err(IdTaken {
                node_id: self.config.node_id.clone(),
                ttl_s: self.lease.ttl.as_secs(),
            }
            .into());
        }
        self.lease.id.store(id, Ordering::Release);
        self.lease
            .confirmed(sent_at, Duration::from_secs(lease.ttl().max(0) as u64));
        Ok(())
    }

    /// Renew the lease every third of its TTL. A transport error retries
    /// the same lease; once etcd says it is gone, join again as a new
    /// incarnation.
    pub(super) async fn keep_alive(self: Arc<Self>) {
        let every = self.lease.ttl / 3;
        loop {
            match self.renew(every).await {
                Ok(()) => {
                    tracing::warn!(
                        "cluster membership lease lost: not serving this node's slots until it joins again"
                    );
                    loop {
                        match self.join().await {
                            Ok(()) => {
                                tracing::info!("joined the cluster again with a new lease");
                                // It catches up again (`sync_catalog`, on
                                // this signal) before it serves its actors
                                // or takes a cluster-wide write: it stayed
                                // "caught up", and a deploy it took just
                                // before the catch-up split a version number
                                // between two codes (a probe).
                                self.caught_up.store(false, Ordering::Release);
                                self.rejoins.send_modify(|n| *n += 1);
                                break;
                            }
                            Err(e) => {
                                tracing::warn!(error = %e, "cannot join the cluster again yet")
                            }
                        }
                        tokio::time::sleep(every).await;
                    }
                }
                Err(e) => {
                    tracing::warn!(error = %e, "cluster lease renewal failed; retrying");
                    tokio::time::sleep(every / 2).await;
                }
            }
        }
    }

    /// Renew until etcd says the lease is gone (`Ok`) or a request fails.
    async fn renew(&self, every: Duration) -> anyhow::Result<()> {
        let id = self.lease.id.load(Ordering::Acquire);
        let result = self.renew_lease(id, every).await;
        if result.is_err() {
            // The client reports an expired lease as an error of the
            // keepalive stream: ask etcd directly.
            let ttl = within(every, self.client.clone().lease_time_to_live(id, None)).await;
            if ttl.is_ok_and(|t| t.ttl() <= 0) {
                return Ok(());
            }
        }
        result
    }

    async fn renew_lease(&self, id: i64, every: Duration) -> anyhow::Result<()> {
        let (mut keeper, mut stream) =
            within(every, self.client.clone().lease_keep_alive(id)).await?;
        loop {
            let sent_at = Instant::now();
            within(every, keeper.keep_alive()).await?;
            let reply = tokio::time::timeout(every, stream.message())
                .await
                .map_err(|_| anyhow::anyhow!("no keepalive answer within {every:?}"))??
                .ok_or_else(|| anyhow::anyhow!("keepalive stream closed"))?;
            if reply.ttl() <= 0 {
                return Ok(());
            }
            self.lease
                .confirmed(sent_at, Duration::from_secs(reply.ttl() as u64));
            tokio::time::sleep(every).await;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn member(incarnation: i64) -> MemberRecord {
        MemberRecord {
            node_id: "n1".into(),
            region: "eu".into(),
            advertise: "http://127.0.0.1:1".into(),
            incarnation,
            leaving: false,
        }
    }

    #[test]
    fn a_holder_is_alive_once_its_lease_was_renewed_twice() {
        let mut h = Holder::default();
        assert!(!h.renewed(&member(7), 4));
        assert!(h.first_sight());
        assert!(!h.renewed(&member(7), 4), "the same time left");
        assert!(!h.renewed(&member(7), 2), "running down");
        assert!(!h.first_sight());
        assert!(
            !h.renewed(&member(7), 5),
            "once: an etcd election extends it too"
        );
        assert!(!h.renewed(&member(8), 5), "another incarnation starts over");
        assert!(!h.renewed(&member(8), 6));
        assert!(!h.renewed(&member(8), 4));
        assert!(h.renewed(&member(8), 5), "twice");
    }
}
