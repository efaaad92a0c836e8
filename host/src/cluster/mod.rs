//! Several nodes as one: membership, the slot table and routing, with etcd
//! as the metadata authority (PRODUCT.md §8; docs/design.md "Cluster").
//!
//! Each node holds an etcd lease on its member key and renews it; it serves
//! its slots only while the lease is *provably* alive: until the send time
//! of the last confirmed keepalive plus the TTL minus a margin, measured on
//! the monotonic clock (a node paused past that stops serving before anyone
//! else may take over). One node, elected by a key under its own lease, is
//! the controller: the only writer of slot assignments, always by
//! compare-and-swap, the epoch incremented on every change of owner. Every
//! node watches the metadata and routes each actor request to its slot's
//! owner.
//!
//! A slot that has served requests ("used") keeps its owner until the
//! owner dies; then its backup, which has every commit the owner released
//! (`replication.rs`), takes it over at the next epoch. Unused slots are
//! balanced over the live members by rendezvous hashing. An actor lives in
//! its hash slot unless a placement entry names another (`placement.rs`:
//! placed in a region at creation, or moved).

mod admission;
mod advertise;
mod blobs;
mod controller;
mod lease;
mod patience;
mod peer;
mod placement;
mod rebalance;
pub mod records;
mod replication;
mod status;
mod takeover;
mod target;
mod view;

pub use advertise::check_advertise;

use std::sync::atomic::{AtomicI64, AtomicU64, Ordering};
use std::sync::{Arc, RwLock};
use std::time::{Duration, Instant};

use anyhow::Context as _;
use etcd_client::{Client, Compare, CompareOp, GetOptions, Txn, TxnOp, WatchOptions};
use tokio::sync::Notify;

use crate::config::{ClusterConfig, WithoutBackup};
use crate::ids::ActorKey;
use admission::{check_credential, check_meta};
pub use blobs::{Ask, send_blobs};
use lease::Lease;
use patience::patiently;
pub use peer::{
    CALL_CHAIN, CALL_KEY, FROM_ACTOR, PeerError, Peers, Target, client as peer_client, decode_chain,
};
pub use placement::MoveStarted;
use records::{Keys, MemberRecord, SLOTS, SlotRecord};
pub use replication::Replicator;
pub use target::{TARGET, TARGET_MAC, TargetKey};
pub use view::View;

/// The longest a single etcd request may take before the caller gives up
/// (and retries, or reports).
pub(super) const ETCD_CALL: Duration = Duration::from_secs(5);

/// A region a client named, as an error shows it: cut after 64 characters
/// (a client may send any length; the answer need not repeat it).
pub fn shown_region(region: &str) -> String {
    const SHOWN: usize = 64;
    match region.char_indices().nth(SHOWN) {
        Some((cut, _)) => format!("{}…", &region[..cut]),
        None => region.to_owned(),
    }
}

/// Where a request for an actor goes.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Route {
    /// This node owns the slot.
    Local { slot: u32, epoch: u64, used: bool },
    /// Another node does.
    Remote {
        slot: u32,
        epoch: u64,
        node_id: String,
        advertise: String,
    },
    /// Nobody can serve it now.
    Unavailable { slot: u32, why: String },
}

/// Where a replicated batch goes now.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Shipping {
    /// To the slot's backup, and to the node catching up to replace it
    /// (a rebalance keeps the old backup meanwhile), or to the latter only.
    To(Vec<ShipTarget>),
    /// Nowhere: the slot has no backup (degraded); release on this disk.
    NoBackup,
    /// The slot is no longer this node's at that epoch: fail the batch.
    Lost,
}

/// A node a slot's batches go to.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ShipTarget {
    /// Its node id.
    pub node_id: String,
    /// Its URL, while it is a live member.
    pub advertise: Option<String>,
    /// Catching up (joining) in this session (the slot record's revision):
    /// it gets the slot's batches from its snapshot on, none before.
    pub joining: Option<i64>,
}

/// A running cluster member.
#[derive(Clone)]
pub struct Cluster {
    inner: Arc<Inner>,
}

struct Inner {
    config: ClusterConfig,
    keys: Keys,
    client: Client,
    view: RwLock<View>,
    /// Woken when the view changes.
    changed: Notify,
    lease: Lease,
    /// The node has taken the types it missed from a peer.
    caught_up: std::sync::atomic::AtomicBool,
    /// Counts the times this node joined again after losing its lease.
    rejoins: tokio::sync::watch::Sender<u64>,
    /// Failovers this node made as the controller.
    failovers: AtomicU64,
    /// Slots this node is handing to their backup (`rebalance.rs`): fenced.
    draining: rebalance::Draining,
    /// Slots this node owns whose batches accepted as backup have landed.
    settled: takeover::Settled,
    /// The identity of this node's database (`Storage::store_id`).
    store_id: String,
    /// This node is stopping: its member record says `leaving` (also when
    /// it joins again meanwhile), and it takes no rebalance handoffs.
    leaving: std::sync::atomic::AtomicBool,
}

impl Cluster {
    /// Connect to etcd, join (a member key under a fresh lease), read the
    /// metadata and start renewing, watching and campaigning.
    pub async fn start(
        config: &ClusterConfig,
        store_id: &str,
        admin_token: Option<&str>,
    ) -> anyhow::Result<Self> {
        let client = tokio::time::timeout(
            Duration::from_secs(10),
            Client::connect(&config.etcd, Some(connect_options())),
        )
        .await
        .map_err(|_| anyhow::anyhow!("etcd at {:?} did not answer within 10 s", config.etcd))?
        .with_context(|| format!("cannot connect to etcd at {:?}", config.etcd))?;
        let keys = Keys::new(&config.etcd_prefix);
        let keys_ref = &keys;
        patiently("checking the cluster's layout", || {
            let mut client = client.clone();
            async move { check_meta(&mut client, keys_ref).await }
        })
        .await?;
        let credential = records::credential(admin_token, &rand::random());
        patiently("checking the cluster's admin token", || {
            let mut client = client.clone();
            let credential = credential.as_str();
            async move { check_credential(&mut client, keys_ref, credential, admin_token).await }
        })
        .await?;
        let ttl = Duration::from_secs(config.lease_ttl_s);
        let inner = Arc::new(Inner {
            config: config.clone(),
            keys,
            client,
            view: RwLock::new(View::default()),
            changed: Notify::new(),
            caught_up: std::sync::atomic::AtomicBool::new(false),
            rejoins: tokio::sync::watch::Sender::new(0),
            failovers: AtomicU64::new(0),
            draining: rebalance::Draining::default(),
            settled: takeover::Settled::default(),
            store_id: store_id.to_owned(),
            leaving: std::sync::atomic::AtomicBool::new(false),
            lease: Lease {
                id: AtomicI64::new(0),
                alive_until_ms: AtomicU64::new(0),
                base: Instant::now(),
                ttl,
            },
        });
        patiently("joining", || inner.join_at_start()).await?;
        patiently("reading the cluster's view", || inner.relist()).await?;
        tokio::spawn(inner.clone().keep_alive());
        tokio::spawn(inner.clone().watch());
        tokio::spawn(controller::run(inner.clone()));
        tracing::info!(node = %config.node_id, region = %config.region, etcd = ?config.etcd, "joined the cluster");
        Ok(Self { inner })
    }

    /// This node's id.
    pub fn node_id(&self) -> &str {
        &self.inner.config.node_id
    }

    /// This node's region.
    pub fn region(&self) -> &str {
        &self.inner.config.region
    }

    /// Whether the node has caught up with the cluster's types.
    pub fn caught_up(&self) -> bool {
        self.inner.caught_up.load(Ordering::Acquire)
    }

    /// The node has caught up with the cluster's types (or given up
    /// trying, and said so).
    pub fn set_caught_up(&self) {
        self.inner.caught_up.store(true, Ordering::Release);
    }

    /// Changes each time this node joins again after its lease was lost
    /// (paused, cut off from etcd): what was written meanwhile went to the
    /// members of the time, not to it.
    pub fn rejoins(&self) -> tokio::sync::watch::Receiver<u64> {
        self.inner.rejoins.subscribe()
    }

    /// Whether this node's lease is provably alive.
    pub fn alive(&self) -> bool {
        self.inner.lease.alive()
    }

    /// Where a request for `key` goes now.
    pub fn route(&self, key: &ActorKey) -> Route {
        self.inner.route(self.slot_of(key))
    }

    /// Where a request for an actor of `slot` goes now.
    pub fn route_slot(&self, slot: u32) -> Route {
        self.inner.route(slot)
    }

    /// Where a message from one of this node's turns to `key` goes: to the
    /// actor here when this node owns its slot and has claimed it, else
    /// through the API of the owner (or, to claim the slot or learn why
    /// nobody can serve it, this node's own).
    pub fn target(&self, key: &ActorKey) -> Target {
        if self.moving(key).is_some() {
            // Through this node's API, which waits for the move.
            return Target::Via(self.inner.config.advertise.clone());
        }
        match self.route(key) {
            // Not while the slot is handed over: the API waits for that.
            Route::Local {
                used: true, slot, ..
            } if !self.draining(slot) => Target::Here,
            Route::Remote { advertise, .. } => Target::Via(advertise),
            Route::Local { .. } | Route::Unavailable { .. } => {
                Target::Via(self.inner.config.advertise.clone())
            }
        }
    }

    /// Re-read the metadata from etcd (after a peer said our view is
    /// stale).
    pub async fn refresh(&self) -> anyhow::Result<()> {
        self.inner.relist().await
    }

    /// Mark `slot`, owned here at `epoch`, used before serving it for the
    /// first time: from then on the controller will not give it away
    /// (compare-and-swap against its last write). `false`: the slot changed
    /// meanwhile; route again.
    pub async fn claim(&self, slot: u32, epoch: u64) -> anyhow::Result<bool> {
        let claimed = self.inner.view().slots[slot as usize]
            .as_ref()
            .is_some_and(|e| {
                e.record.owner == self.inner.config.node_id
                    && e.record.epoch == epoch
                    && e.record.used
            });
        if claimed {
            return Ok(true);
        }
        self.rewrite_slot(slot, epoch, None, |r| {
            (!r.used).then(|| SlotRecord {
                used: true,
                ..r.clone()
            })
        })
        .await
    }

    /// The backup of `key`'s slot, if it has one.
    pub fn backup_of(&self, key: &ActorKey) -> Option<String> {
        let slot = self.slot_of(key);
        let v = self.inner.view();
        v.slots[slot as usize]
            .as_ref()
            .and_then(|e| e.record.backup.clone())
    }

    /// Where this node's commits for `key` go: refused unless this node
    /// owns its slot and no move of the actor is under way; to the slot's
    /// backup too when it has one.
    pub fn placement(&self, key: &ActorKey) -> crate::storage::Placement {
        let v = self.inner.view();
        let slot = match v.placements.get(key) {
            Some(e) if e.record.moving.is_some() => return crate::storage::Placement::Elsewhere,
            Some(e) => e.record.slot,
            None => records::hash_slot(key),
        };
        self.inner.slot_placement(&v, slot)
    }

    /// Where this node's commits to the rows of `slot` go.
    pub fn slot_placement(&self, slot: u32) -> crate::storage::Placement {
        self.inner.slot_placement(&self.inner.view(), slot)
    }

    /// Where a batch of `slot` written at `epoch` goes now: to its backup
    /// and its joining node (id and URL; the URL is `None` while that node
    /// is not a live member), or nowhere.
    pub fn shipping(&self, slot: u32, epoch: u64) -> Shipping {
        let v = self.inner.view();
        let Some(e) = &v.slots[slot as usize] else {
            return Shipping::Lost;
        };
        let r = &e.record;
        if r.owner != self.inner.config.node_id || r.epoch != epoch {
            return Shipping::Lost;
        }
        let target = |node: &String, joining: Option<i64>| ShipTarget {
            node_id: node.clone(),
            advertise: v.members.get(node).map(|m| m.advertise.clone()),
            joining,
        };
        let to: Vec<ShipTarget> = r
            .backup
            .iter()
            .map(|b| target(b, None))
            .chain(r.joining.iter().map(|j| target(j, Some(e.mod_revision))))
            .collect();
        if to.is_empty() {
            Shipping::NoBackup
        } else {
            Shipping::To(to)
        }
    }

    /// Whether this node applies a batch of `slot` written at `epoch`: it
    /// is the slot's backup at that very epoch (a new owner's epoch seals
    /// the old owner's writes out). Its own lease does not matter: keeping
    /// a copy is harmless, and a backup whose lease lapsed is dropped by
    /// the controller before it could be promoted.
    pub fn accepts_replica(&self, slot: u32, epoch: u64) -> bool {
        let v = self.inner.view();
        v.slots
            .get(slot as usize)
            .and_then(Option::as_ref)
            .is_some_and(|e| {
                let me = Some(self.inner.config.node_id.as_str());
                (e.record.backup.as_deref() == me || e.record.joining.as_deref() == me)
                    && e.record.epoch == epoch
            })
    }

    /// Whether this node keeps the rows of `slot`: it owns it, backs it up
    /// or is catching up to.
    pub fn holds(&self, slot: u32) -> bool {
        let v = self.inner.view();
        let me = Some(self.inner.config.node_id.as_str());
        v.slots[slot as usize].as_ref().is_some_and(|e| {
            let r = &e.record;
            Some(r.owner.as_str()) == me || r.backup.as_deref() == me || r.joining.as_deref() == me
        })
    }

    /// Slots this node owns whose joining node needs a snapshot:
    /// (slot, epoch, session).
    pub fn joining_slots(&self) -> Vec<(u32, u64, i64)> {
        self.owned_slots(|slot, e| {
            let r = &e.record;
            r.joining
                .is_some()
                .then_some((slot, r.epoch, e.mod_revision))
        })
    }

    /// What `pick` takes of each slot this node owns, in slot order.
    fn owned_slots<T>(&self, mut pick: impl FnMut(u32, &view::SlotEntry) -> Option<T>) -> Vec<T> {
        let v = self.inner.view();
        let me = &self.inner.config.node_id;
        v.slots
            .iter()
            .enumerate()
            .filter_map(|(i, e)| {
                let e = e.as_ref().filter(|e| &e.record.owner == me)?;
                pick(i as u32, e)
            })
            .collect()
    }

    /// `node`, catching up as `slot`'s joining node, has its snapshot,
    /// taken for the catching-up `session` (the slot record's revision
    /// then): name it the backup, in place of the old one if there was one
    /// (a rebalance) — compare-and-swap on that very record; `false` if
    /// the slot changed since (its writes meanwhile may be in no snapshot
    /// the node has: a new catching-up takes a new one).
    pub async fn joined(
        &self,
        slot: u32,
        epoch: u64,
        node: &str,
        session: i64,
    ) -> anyhow::Result<bool> {
        self.rewrite_slot(slot, epoch, Some(session), |r| {
            (r.joining.as_deref() == Some(node)).then(|| SlotRecord {
                backup: Some(node.to_owned()),
                joining: None,
                avoid: None,
                ..r.clone()
            })
        })
        .await
    }

    /// Write `slot` (owned here at `epoch`; its record written at
    /// `revision`, when given) as `change` says, by compare-and-swap: the
    /// owner's own writes of its slot (marking it used, dropping a backup,
    /// naming a caught-up one). `false` if it changed meanwhile or `change`
    /// has nothing to do.
    async fn rewrite_slot(
        &self,
        slot: u32,
        epoch: u64,
        revision: Option<i64>,
        change: impl Fn(&SlotRecord) -> Option<SlotRecord>,
    ) -> anyhow::Result<bool> {
        let inner = &self.inner;
        let entry = inner.view().slots[slot as usize].clone();
        let Some((entry, record)) = entry
            .filter(|e| e.record.owner == inner.config.node_id && e.record.epoch == epoch)
            .filter(|e| revision.is_none_or(|r| r == e.mod_revision))
            .and_then(|e| change(&e.record).map(|r| (e, r)))
        else {
            return Ok(false);
        };
        let key = inner.keys.slot(slot);
        let txn = Txn::new()
            .when([Compare::mod_revision(
                key.clone(),
                CompareOp::Equal,
                entry.mod_revision,
            )])
            .and_then([TxnOp::put(key, serde_json::to_vec(&record)?, None)]);
        let resp = within(ETCD_CALL, inner.client.clone().txn(txn)).await?;
        if !resp.succeeded() {
            // Someone wrote the slot meanwhile: take the table as it is now.
            inner.relist().await?;
            return Ok(false);
        }
        // Ours: note it at once (the watch brings the same write later), so
        // that what follows sees it — concurrent first requests do not
        // claim again, the replication sees a dropped backup.
        let revision = resp.header().map_or(0, |h| h.revision());
        let mut v = inner.view.write().unwrap_or_else(|p| p.into_inner());
        let e = &mut v.slots[slot as usize];
        if e.as_ref().is_some_and(|e| e.mod_revision < revision) {
            *e = Some(view::SlotEntry {
                record,
                mod_revision: revision,
            });
        }
        Ok(true)
    }

    /// Drop `backup` from `slot` (owned here at `epoch`) because this node
    /// cannot reach it: the slot runs without a backup from then on.
    /// Compare-and-swap like every slot write; `false` if the slot changed.
    pub async fn drop_backup(&self, slot: u32, epoch: u64, backup: &str) -> anyhow::Result<bool> {
        self.rewrite_slot(slot, epoch, None, |r| {
            if r.backup.as_deref() == Some(backup) {
                Some(SlotRecord {
                    backup: None,
                    avoid: Some(backup.to_owned()),
                    ..r.clone()
                })
            } else if r.joining.as_deref() == Some(backup) {
                Some(SlotRecord {
                    joining: None,
                    avoid: Some(backup.to_owned()),
                    ..r.clone()
                })
            } else {
                None
            }
        })
        .await
    }

    /// Slots this node owns (with their epochs) that `node` backs up or
    /// is catching up to.
    pub fn slots_backed_by(&self, node: &str) -> Vec<(u32, u64)> {
        self.owned_slots(|slot, e| {
            let r = &e.record;
            let backs = r.backup.as_deref() == Some(node) || r.joining.as_deref() == Some(node);
            backs.then_some((slot, r.epoch))
        })
    }

    /// Slots this node owns and has used, and how many of them have no
    /// backup.
    pub fn owned_used(&self) -> (Vec<u32>, usize) {
        let mut degraded = 0;
        let slots = self.owned_slots(|slot, e| {
            let r = &e.record;
            degraded += usize::from(r.used && r.backup.is_none());
            r.used.then_some(slot)
        });
        (slots, degraded)
    }

    /// Wait until the view changes.
    pub async fn changed(&self) {
        self.inner.changed.notified().await;
    }

    /// The other live members (for requests that every node must apply).
    pub fn peers(&self) -> Vec<MemberRecord> {
        self.inner
            .view()
            .members
            .values()
            .filter(|m| m.node_id != self.inner.config.node_id)
            .cloned()
            .collect()
    }

    /// Resolves once no other member is `which` (checked every half
    /// second): for a request waiting on a node that stopped answering,
    /// whose slots fail over once its lease lapses.
    pub async fn until_no_peer(&self, which: impl Fn(&MemberRecord) -> bool) {
        const CHECK: std::time::Duration = std::time::Duration::from_millis(500);
        loop {
            tokio::time::sleep(CHECK).await;
            if !self.peers().iter().any(&which) {
                return;
            }
        }
    }

    /// Say that this node is stopping: it keeps what it owns until it
    /// hands it over, and is given nothing more.
    pub async fn announce_leaving(&self) -> anyhow::Result<()> {
        self.inner.leaving.store(true, Ordering::Release);
        self.inner.announce_leaving().await
    }

    /// Whether this node is stopping.
    pub fn is_leaving(&self) -> bool {
        self.inner.leaving.load(Ordering::Acquire)
    }

    /// Slots another node is handing to this one (a rebalance's handoff
    /// not yet switched).
    pub fn handoffs_to_me(&self) -> usize {
        let me = &self.inner.config.node_id;
        self.inner
            .view()
            .slots
            .iter()
            .flatten()
            .filter(|e| e.record.owner != *me && e.record.handoff.as_ref() == Some(me))
            .count()
    }

    /// Whether `node` left the cluster by a graceful stop: no member now,
    /// and its last record said it was leaving (a lease that lapsed and is
    /// renewed, or a crash, says nothing of the kind).
    pub fn left_gracefully(&self, node: &str) -> bool {
        let v = self.inner.view();
        !v.members.contains_key(node) && v.departed.get(node).is_some_and(|m| m.leaving)
    }

    /// Whether `node` is stopping or gone: what it owned may be elsewhere
    /// soon, or already.
    pub fn leaving_or_gone(&self, node: &str) -> bool {
        self.inner
            .view()
            .members
            .get(node)
            .is_none_or(|m| m.leaving)
    }

    /// Leave: revoke the lease so that the member key goes at once.
    pub async fn leave(&self) {
        let id = self.inner.lease.id.load(Ordering::Acquire);
        let _ = self.inner.client.clone().lease_revoke(id).await;
    }
}

impl Inner {
    fn view(&self) -> std::sync::RwLockReadGuard<'_, View> {
        self.view.read().unwrap_or_else(|p| p.into_inner())
    }

    fn slot_placement(&self, v: &View, slot: u32) -> crate::storage::Placement {
        use crate::storage::Placement;
        let Some(e) = &v.slots[slot as usize] else {
            return Placement::Elsewhere;
        };
        match &e.record {
            r if r.owner != self.config.node_id => Placement::Elsewhere,
            _ if self.draining.contains(slot) => Placement::Elsewhere,
            r if r.backup.is_some() => Placement::Replicated {
                slot,
                epoch: r.epoch,
            },
            r if r.joining.is_some() => Placement::Joining {
                slot,
                epoch: r.epoch,
                session: e.mod_revision,
            },
            r if r.used && self.config.without_backup == WithoutBackup::Refuse => {
                Placement::NoBackup
            }
            _ => Placement::Here,
        }
    }

    fn route(&self, slot: u32) -> Route {
        let v = self.view();
        let Some(entry) = &v.slots[slot as usize] else {
            return Route::Unavailable {
                slot,
                why: "the slot has no owner yet (the controller assigns it once members join)"
                    .into(),
            };
        };
        let r = &entry.record;
        if r.owner == self.config.node_id {
            if !self.lease.alive() {
                return Route::Unavailable {
                    slot,
                    why: "this node's membership lease is not confirmed alive".into(),
                };
            }
            return Route::Local {
                slot,
                epoch: r.epoch,
                used: r.used,
            };
        }
        match v.members.get(&r.owner) {
            Some(m) => Route::Remote {
                slot,
                epoch: r.epoch,
                node_id: m.node_id.clone(),
                advertise: m.advertise.clone(),
            },
            None => Route::Unavailable {
                slot,
                why: match r.backup.as_deref() {
                    Some(b) if v.members.contains_key(b) => format!(
                        "its owner `{}` is down; its backup `{b}` takes the slot over once \
                         the owner's lease has expired (seconds)",
                        r.owner
                    ),
                    Some(b) => format!("its owner `{}` and its backup `{b}` are down", r.owner),
                    None => format!("its owner `{}` is down and the slot has no backup", r.owner),
                },
            },
        }
    }

    /// Read everything at one revision into a fresh view.
    async fn relist(&self) -> anyhow::Result<()> {
        let all = Some(GetOptions::new().with_prefix());
        let resp = within(ETCD_CALL, self.client.clone().get(self.keys.all(), all)).await?;
        let revision = resp.header().map_or(0, |h| h.revision());
        let mut view = View {
            revision,
            ..View::default()
        };
        for kv in resp.kvs() {
            if let Ok(key) = kv.key_str() {
                view.apply(&self.keys, key, Some(kv.value()), kv.mod_revision());
            }
        }
        {
            let mut v = self.view.write().unwrap_or_else(|p| p.into_inner());
            // A watch may have moved ahead meanwhile.
            if v.revision <= revision {
                // Who left is not in etcd: carry it over, with the members
                // that left while the watch was down.
                let mut departed = std::mem::take(&mut v.departed);
                for (id, m) in std::mem::take(&mut v.members) {
                    departed.insert(id, m);
                }
                departed.retain(|id, _| !view.members.contains_key(id));
                view.departed = departed;
                view.keep_newer_writes(&v);
                *v = view;
            }
        }
        self.changed.notify_waiters();
        Ok(())
    }

    /// Follow changes from the view's revision; after a watch error or
    /// compaction, re-list and watch from there.
    async fn watch(self: Arc<Self>) {
        loop {
            if let Err(e) = self.watch_once().await {
                tracing::warn!(error = %e, "cluster watch ended; re-listing");
            }
            tokio::time::sleep(Duration::from_millis(200)).await;
            if let Err(e) = self.relist().await {
                tracing::warn!(error = %e, "cannot re-list the cluster metadata");
            }
        }
    }

    async fn watch_once(&self) -> anyhow::Result<()> {
        let from = self.view().revision + 1;
        let options = WatchOptions::new().with_prefix().with_start_revision(from);
        let mut client = self.client.clone();
        let watch = client.watch(self.keys.all(), Some(options));
        let mut stream = within(ETCD_CALL, watch).await?;
        while let Some(resp) = stream.message().await? {
            if resp.canceled() || resp.compact_revision() > 0 {
                anyhow::bail!("watch canceled (compacted at {})", resp.compact_revision());
            }
            let revision = resp.header().map_or(0, |h| h.revision());
            {
                let mut v = self.view.write().unwrap_or_else(|p| p.into_inner());
                for ev in resp.events() {
                    let Some(kv) = ev.kv() else { continue };
                    let Ok(key) = kv.key_str() else { continue };
                    let value = match ev.event_type() {
                        etcd_client::EventType::Put => Some(kv.value()),
                        etcd_client::EventType::Delete => None,
                    };
                    v.apply(&self.keys, key, value, kv.mod_revision());
                }
                v.revision = v.revision.max(revision);
            }
            self.changed.notify_waiters();
        }
        anyhow::bail!("watch stream closed")
    }
}

/// How the etcd client finds out that a connection died: a partition
/// drops packets silently, and without pings a stream would wait for TCP's
/// retransmission timeout (minutes) before reconnecting. etcd refuses pings
/// more often than every 5 s (`--grpc-keepalive-min-time`). A member
/// without a leader must not serve reads or watches (`require_leader`).
fn connect_options() -> etcd_client::ConnectOptions {
    etcd_client::ConnectOptions::new()
        .with_connect_timeout(Duration::from_secs(2))
        .with_keep_alive(Duration::from_secs(5), Duration::from_secs(2))
        .with_keep_alive_while_idle(true)
        .with_require_leader(true)
}

/// `fut`, or an error after `limit`: no etcd call may hang a loop that
/// must notice a lost lease.
pub(super) async fn within<T, E: Into<anyhow::Error>>(
    limit: Duration,
    fut: impl std::future::Future<Output = Result<T, E>>,
) -> anyhow::Result<T> {
    match tokio::time::timeout(limit, fut).await {
        Ok(r) => r.map_err(Into::into),
        Err(_) => Err(patience::NoAnswer(limit).into()),
    }
}
