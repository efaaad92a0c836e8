//! What the actor layer runs on, and its faces to the rest of the node.
//!
//! [`ActorEnv`] holds the parts of the node that actor tasks and the
//! registry use — storage, the sandbox, the type catalog, metrics, the
//! alarm scheduler's notices, the event bus, settings — and nothing else:
//! the node composes it, and nothing below the node holds the node. It is
//! also how others reach actors: the node delivers envelopes through it,
//! turns call other actors through it ([`ActorCalls`]), and the alarm
//! scheduler hands it due alarms ([`AlarmTarget`]).

use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use tokio::sync::oneshot;

use super::caches::StateCaches;
use super::inboxes::Inboxes;
use super::registry::Registry;
use super::{Delivery, Envelope, TurnError, TurnReply};
use crate::alarms::scheduler::{AlarmTarget, DueAlarm, Scheduler};
use crate::catalog::Catalog;
use crate::cluster::{Cluster, PeerError, Peers, Target};
use crate::config::{Budget, NodeConfig};
use crate::egress::Egress;
use crate::ids::{ActorKey, new_message_id};
use crate::metrics::Metrics;
use crate::models::Gateway;
use crate::sandbox::ModelAccess;
use crate::sandbox::{
    ActorCalls, CallChain, CallReply, GuestError, HttpAccess, HttpGrant, InboxClaim, Sandbox,
    call_refused, stored_call_key,
};
use crate::secrets::SecretStore;
use crate::storage::{Storage, StorageError};
use crate::streams::EventBus;

/// Facts about this start of the node.
#[derive(Debug, Clone, Copy)]
pub struct Boot {
    /// Inbox rows with a seq up to this were present at start-up (they may
    /// be what crashed the node).
    pub inbox_seq: u64,
    /// Wall-clock time the node started.
    pub at_ms: u64,
    /// The node before this one on the data directory crashed (or was
    /// killed): what it left running counts as a crash attempt when run
    /// again. After a clean stop nothing does.
    pub after_crash: bool,
}

/// The parts of the node the actor layer uses.
pub struct ActorEnv {
    pub(crate) config: Arc<NodeConfig>,
    pub(crate) storage: Arc<Storage>,
    pub(crate) sandbox: Arc<Sandbox>,
    pub(crate) catalog: Arc<Catalog>,
    pub(crate) metrics: Arc<Metrics>,
    pub(crate) registry: Registry,
    /// What the actors' state caches hold together.
    pub(crate) state_caches: Arc<StateCaches>,
    /// Told about alarms that commits set, move or remove.
    pub(crate) scheduler: Scheduler,
    /// Told about events once they are durable.
    pub(crate) event_bus: Arc<EventBus>,
    /// The way out for guests' HTTP requests.
    pub(crate) egress: Arc<Egress>,
    /// Secrets substituted into those requests.
    pub(crate) secrets: Arc<SecretStore>,
    pub(crate) models: Arc<Gateway>,
    pub(crate) boot: Boot,
    /// One permit: recovered turns that were running at an earlier crash
    /// run one at a time (`ActorTask::alone`).
    pub(crate) suspects: Arc<tokio::sync::Semaphore>,
    /// Routing to the owners of actors, in a cluster: turns reach actors
    /// of other nodes through it.
    pub(crate) cluster: Option<(Cluster, Peers)>,
    /// Slots this node took over from another (failover or handoff), each
    /// with when (ms since the epoch): rows queued before may have been
    /// started by the node before, and cut off.
    taken_over: std::sync::Mutex<std::collections::HashMap<u32, u64>>,
    /// When an actor last re-read the slot table after a failed commit
    /// (ms since the epoch): at most once a second for the node.
    slots_refreshed_ms: std::sync::atomic::AtomicU64,
    /// Turns running now (from their start to their commit's submission).
    running: Arc<std::sync::atomic::AtomicUsize>,
    /// The bound on each actor's durable inbox, for what clients, webhooks
    /// and other actors send.
    pub(crate) inboxes: Arc<Inboxes>,
}

/// A turn running, counted (see [`ActorEnv::turn_running`]) until dropped.
pub(crate) struct Running(Arc<std::sync::atomic::AtomicUsize>);

impl Drop for Running {
    fn drop(&mut self) {
        self.0.fetch_sub(1, std::sync::atomic::Ordering::AcqRel);
    }
}

/// The parts of the node the actor layer uses, to build an [`ActorEnv`].
pub struct Parts {
    /// Settings.
    pub config: Arc<NodeConfig>,
    /// The database.
    pub storage: Arc<Storage>,
    /// Engines and instances.
    pub sandbox: Arc<Sandbox>,
    /// Deployed types.
    pub catalog: Arc<Catalog>,
    /// Metrics.
    pub metrics: Arc<Metrics>,
    /// The alarm scheduler's notices.
    pub scheduler: Scheduler,
    /// Live event streams.
    pub event_bus: Arc<EventBus>,
    /// Outbound HTTP.
    pub egress: Arc<Egress>,
    /// The secret store.
    pub secrets: Arc<SecretStore>,
    /// The model gateway.
    pub models: Arc<Gateway>,
    /// Facts about this start.
    pub boot: Boot,
    /// Membership and routing, and the client to reach other nodes, in a
    /// cluster.
    pub cluster: Option<(Cluster, Peers)>,
}

impl ActorEnv {
    /// An environment with no active actors.
    pub fn new(p: Parts) -> Arc<Self> {
        let l = &p.config.limits;
        let registry = Registry::new(l.max_active_actors, l.mailbox_capacity);
        let state_caches = StateCaches::new(l.state_cache_budget_bytes.unwrap_or(u64::MAX));
        let inboxes = Arc::new(Inboxes::new(l.max_inbox_messages, l.max_inbox_bytes));
        Arc::new(Self {
            config: p.config,
            storage: p.storage,
            sandbox: p.sandbox,
            catalog: p.catalog,
            metrics: p.metrics,
            registry,
            state_caches,
            scheduler: p.scheduler,
            event_bus: p.event_bus,
            egress: p.egress,
            secrets: p.secrets,
            models: p.models,
            boot: p.boot,
            suspects: Arc::new(tokio::sync::Semaphore::new(1)),
            cluster: p.cluster,
            taken_over: Default::default(),
            slots_refreshed_ms: Default::default(),
            running: Default::default(),
            inboxes,
        })
    }

    /// Count a turn as running until the returned guard is dropped.
    pub(crate) fn turn_running(&self) -> Running {
        self.running
            .fetch_add(1, std::sync::atomic::Ordering::AcqRel);
        Running(self.running.clone())
    }

    /// What `key`'s durable inbox holds on disk: (rows, bytes), what its
    /// bound ([`Inboxes`]) reads when it must.
    pub(crate) fn inbox_on_disk(&self, key: &ActorKey) -> Result<(u64, u64), StorageError> {
        let r = self.storage.reader()?;
        match r.actor(key)? {
            Some(rec) => r.inbox_stats(rec.num),
            None => Ok((0, 0)),
        }
    }

    /// Wait, at most `bound`, until no turn is running: a graceful stop
    /// lets the turns in flight commit before it fences its slots. Cut by
    /// the fence, an agent's tool call ran again on the new owner after a
    /// confirmation asked of a person, for most runs of a rolling restart
    /// (found by a re-probe). Whether none was left.
    pub async fn turns_done(&self, bound: Duration) -> bool {
        let deadline = tokio::time::Instant::now() + bound;
        loop {
            if self.running.load(std::sync::atomic::Ordering::Acquire) == 0 {
                return true;
            }
            if tokio::time::Instant::now() >= deadline {
                return false;
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }

    /// Whether an actor whose commit failed may re-read the slot table
    /// from etcd now (once a second for the whole node).
    pub(crate) fn may_refresh_slots(&self) -> bool {
        use std::sync::atomic::Ordering;
        let now = crate::clock::now_ms();
        let last = self.slots_refreshed_ms.load(Ordering::Relaxed);
        now.saturating_sub(last) >= 1000
            && self
                .slots_refreshed_ms
                .compare_exchange(last, now, Ordering::Relaxed, Ordering::Relaxed)
                .is_ok()
    }

    /// Note that `slot` comes to this node from another now, before its
    /// actors run here (called as the slot settles, by whichever path
    /// serves it first).
    pub(crate) fn took_over(&self, slot: u32) {
        let now = crate::clock::now_ms();
        self.taken_over
            .lock()
            .expect("takeover lock")
            .insert(slot, now);
    }

    /// Whether a row of `key`'s inbox queued at `enqueued_at_ms` was
    /// there when its slot came to this node from another: that node may
    /// have started it, and been cut off (a failover re-sent a tool call in
    /// flight without the confirmation a restart asks for: found by a
    /// probe).
    pub(crate) fn queued_before_takeover(&self, key: &ActorKey, enqueued_at_ms: u64) -> bool {
        let Some((cluster, _)) = &self.cluster else {
            return false;
        };
        let taken = self.taken_over.lock().expect("takeover lock");
        taken
            .get(&cluster.slot_of(key))
            .is_some_and(|&at| enqueued_at_ms <= at)
    }

    /// The network access of an instance whose type grants `grant`.
    pub(crate) fn http_access(&self, grant: &Arc<HttpGrant>) -> HttpAccess {
        HttpAccess {
            egress: self.egress.clone(),
            secrets: self.secrets.clone(),
            grant: grant.clone(),
            metrics: self.metrics.clone(),
        }
    }

    /// What the model calls of an instance whose type has `budget` go
    /// through.
    pub(crate) fn model_access(&self, budget: Option<Budget>) -> ModelAccess {
        ModelAccess {
            gateway: self.models.clone(),
            ledger: self.models.ledger().clone(),
            bus: self.event_bus.clone(),
            budget,
        }
    }

    /// The active actors.
    pub fn registry(&self) -> &Registry {
        &self.registry
    }

    /// Deliver `envelope` to `key`, waking the actor if it is hibernated.
    pub fn deliver(self: &Arc<Self>, key: &ActorKey, envelope: Envelope) -> Result<(), TurnError> {
        self.registry.deliver(self, key, envelope)
    }

    /// Tell `key` that its inbox has new rows, waking it if needed.
    pub fn poke(self: &Arc<Self>, key: &ActorKey) {
        self.registry.poke(self, key);
    }

    /// Deliver the envelope `make` builds around a reply channel, and wait
    /// for the actor's answer.
    pub async fn ask<T>(
        self: &Arc<Self>,
        key: &ActorKey,
        make: impl FnOnce(oneshot::Sender<Result<T, TurnError>>) -> Envelope,
    ) -> Result<T, TurnError> {
        let (tx, rx) = oneshot::channel();
        self.deliver(key, make(tx))?;
        rx.await.map_err(|_| TurnError::Stopped)?
    }

    /// Delete `key` and everything it owns, ahead of whatever it has
    /// queued; whether it existed.
    pub async fn delete(self: &Arc<Self>, key: &ActorKey) -> Result<bool, TurnError> {
        let (tx, rx) = oneshot::channel();
        self.registry.delete(self, key, tx)?;
        rx.await.map_err(|_| TurnError::Stopped)?
    }

    /// Send a message and wait for its reply (released once durable);
    /// `chain` holds the actors waiting above it (`actors.call`).
    pub async fn send(
        self: &Arc<Self>,
        key: &ActorKey,
        body: Bytes,
        content_type: Option<String>,
        idempotency_key: Option<String>,
        chain: CallChain,
    ) -> Result<TurnReply, TurnError> {
        self.ask(key, |reply| {
            Envelope::Message(Box::new(Delivery {
                message_id: new_message_id(),
                body,
                content_type,
                idempotency_key,
                chain,
                reply,
                trace: crate::telemetry::Parent::current(),
                request_id: crate::telemetry::request_id(),
                sent_at: std::time::Instant::now(),
            }))
        })
        .await
    }
}

/// `actors.call` and `actors.send` for turns on this node.
impl ActorCalls for ActorEnv {
    fn call(
        self: Arc<Self>,
        to: ActorKey,
        body: Vec<u8>,
        chain: CallChain,
        key: Option<String>,
    ) -> futures::future::BoxFuture<'static, Result<CallReply, GuestError>> {
        let timeout = Duration::from_millis(self.config.limits.actor_call_timeout_ms);
        Box::pin(async move {
            let deadline = tokio::time::Instant::now() + timeout;
            let body = Bytes::from(body);
            let mut tries = 0;
            loop {
                let once = self.call_once(&to, body.clone(), &chain, key.as_deref());
                let failure = match tokio::time::timeout_at(deadline, once).await {
                    Ok(Ok(reply)) => return Ok(reply),
                    Ok(Err(f)) => f,
                    Err(_) => {
                        return Err(GuestError::Internal(format!(
                            "{to} did not reply within {} ms",
                            timeout.as_millis()
                        )));
                    }
                };
                // The callee is between nodes (its slot failing over or
                // moving): ask again where it is now, while the call has
                // time. Those calls failed at once, or after their callee
                // had run and been refused, and a durable caller's
                // message was dropped with them (found by a probe).
                let again = match failure.retry {
                    Retry::Never => false,
                    Retry::Always => true,
                    Retry::Keyed => key.is_some(),
                };
                if !again || tries >= CALL_REROUTES {
                    return Err(failure.error);
                }
                tries += 1;
                tracing::debug!(to = %to, why = %failure.error, tries, "actors.call: asking again where the callee is now");
                let pause = Duration::from_millis(100 << tries.min(4));
                tokio::time::sleep_until(deadline.min(tokio::time::Instant::now() + pause)).await;
            }
        })
    }

    fn admit(&self, ty: &str) -> Result<(), GuestError> {
        let entry = self
            .catalog
            .get(ty)
            .ok_or_else(|| GuestError::NotFound(format!("unknown actor type `{ty}`")))?;
        entry
            .admit()
            .map_err(|e| GuestError::LimitExceeded(e.to_string()))
    }

    fn admit_send(
        &self,
        to: &ActorKey,
        bytes: u64,
    ) -> Result<Option<Box<dyn InboxClaim>>, GuestError> {
        // In a cluster sends are relayed, this node's own too, and the
        // recipient's owner counts them as they arrive.
        if self.cluster.is_some() {
            return Ok(None);
        }
        match self
            .inboxes
            .admit_send(to, bytes, || self.inbox_on_disk(to))
        {
            Ok(claim) => Ok(Some(Box::new(claim))),
            Err(TurnError::InboxFull(m)) => Err(GuestError::LimitExceeded(m)),
            Err(other) => Err(GuestError::Internal(other.to_string())),
        }
    }
}

/// Most times one `actors.call` is sent again while its callee is
/// between nodes (within the call's timeout; pauses of 0.2 s to 1.6 s).
const CALL_REROUTES: u32 = 12;

/// Whether a failed call may be sent again.
enum Retry {
    /// The callee's turn failed, or it is not there: no.
    Never,
    /// It was refused before any turn ran (the node asked is not the
    /// callee's owner, or its slot has none for a moment): yes.
    Always,
    /// The callee may have run, but nothing of it was kept (its rows left
    /// while it ran), or the answer was lost on the way: only a keyed call,
    /// which the callee answers once.
    Keyed,
}

/// Why one sending of a call failed.
struct CallFailure {
    error: GuestError,
    retry: Retry,
}

impl CallFailure {
    fn refused(code: &str, message: String) -> Self {
        let retry = match code {
            "wrong_owner" | "slot_unavailable" => Retry::Always,
            "actor_moved" | "owner_unreachable" | "owner_left" | "actor_stopped" => Retry::Keyed,
            _ => Retry::Never,
        };
        Self {
            error: call_refused(code, message),
            retry,
        }
    }
}

impl ActorEnv {
    /// Send a call once, to the callee's owner as this node sees it.
    async fn call_once(
        self: &Arc<Self>,
        to: &ActorKey,
        body: Bytes,
        chain: &CallChain,
        key: Option<&str>,
    ) -> Result<CallReply, CallFailure> {
        if let Some((cluster, peers)) = &self.cluster
            && let Target::Via(base) = cluster.target(to)
        {
            let sent = peers.call(&base, to, body.to_vec(), chain, key);
            // A callee's node that stops answering (paused, cut off) held
            // the call for its whole timeout though its slots failed over
            // in seconds (found by a probe): once it is no member any more,
            // the call stops waiting for it, and a keyed one goes where
            // the callee is now.
            // Only a peer is watched: a call through this node's own API (its
            // callee moving, its slot failing over) waits there as long as
            // that takes.
            let watched = cluster.peers().iter().any(|m| m.advertise == base);
            let gone = async {
                if !watched {
                    return std::future::pending().await;
                }
                cluster.until_no_peer(|m| m.advertise == base).await;
            };
            let sent = tokio::select! {
                r = sent => r,
                () = gone => {
                    return Err(CallFailure {
                        error: GuestError::Internal(format!(
                            "{to}: its node {base} left the cluster while the call waited"
                        )),
                        retry: Retry::Keyed,
                    });
                }
            };
            return match sent {
                Ok(r) => Ok(CallReply {
                    status: r.status,
                    body: r.body,
                    content_type: r.content_type,
                }),
                Err(PeerError::NotFound(e)) => Err(CallFailure {
                    error: GuestError::NotFound(e),
                    retry: Retry::Never,
                }),
                Err(PeerError::Refused { code, message }) => {
                    Err(CallFailure::refused(&code, message))
                }
                Err(PeerError::Failed(e)) => Err(CallFailure {
                    error: GuestError::Internal(e),
                    retry: Retry::Keyed,
                }),
            };
        }
        // The recipient's slot just came to this node: what it accepted
        // as its backup lands before the recipient loads here.
        if let Some((cluster, _)) = &self.cluster {
            cluster
                .settle_before_loading(self.storage.writer(), to)
                .await;
        }
        let sent = self.send(
            to,
            body,
            Some("application/json".into()),
            key.map(stored_call_key),
            chain.clone(),
        );
        match sent.await {
            Ok(r) => Ok(CallReply {
                status: r.status,
                body: r.body.to_vec(),
                content_type: r.content_type,
            }),
            Err(e) => Err(CallFailure::refused(e.code(), format!("{to}: {e}"))),
        }
    }
}

/// How soon an alarm of a slot being settled is delivered again.
const SETTLING_RETRY_MS: u64 = 20;

/// Due alarms go to their actors like any other envelope.
impl AlarmTarget for ActorEnv {
    fn deliver_alarm(
        self: Arc<Self>,
        key: &ActorKey,
        mut alarm: DueAlarm,
    ) -> Result<(), Box<dyn std::error::Error + Send + Sync>> {
        if let Some((cluster, _)) = &self.cluster {
            // In a cluster this node also keeps the alarms of actors it
            // backs up (or owned before a failover): only the owner fires
            // them. A later reload brings them back, should this node take
            // over.
            if cluster.target(key) != Target::Here {
                alarm.ticket.settle();
                return Ok(());
            }
            // Just come to own the slot: what this node accepted as its
            // backup lands before the actor loads here. Nothing else may
            // settle it soon (no request need come), so start that here
            // and deliver again in a moment.
            if let Some((slot, epoch)) = cluster.unsettled(key) {
                if cluster.start_settling(slot, epoch) {
                    let (storage, cluster) = (self.storage.clone(), cluster.clone());
                    tokio::spawn(async move {
                        cluster
                            .settle_slots(storage.writer(), &[(slot, epoch)])
                            .await;
                    });
                }
                alarm.ticket.retry_later(SETTLING_RETRY_MS);
                return Ok(());
            }
        }
        Ok(self.deliver(key, Envelope::Alarm(Box::new(alarm)))?)
    }
}
