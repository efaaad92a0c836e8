//! One Marmot node: storage, engine, catalog and activation, wired together.
//!
//! [`Node`] is what the HTTP API, the CLI's `dev`/`serve` and the in-process
//! benchmarks talk to. Start-up opens the database, loads the catalog and
//! spawns crash recovery, which re-runs every durable message that was
//! acknowledged but not finished when the node last stopped.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use bytes::Bytes;
use serde::Serialize;
use sha2::{Digest, Sha256};
use tokio::sync::{Semaphore, oneshot};

use crate::actor::{AnswerDelivery, Delivery, Envelope, EvalReply, Registry, TurnError, TurnReply};
use crate::catalog::{Catalog, PreparedVersion};
use crate::clock::now_ms;
use crate::config::{NodeConfig, TypeConfig};
use crate::ids::{ActorKey, new_message_id, validate_type_name};
use crate::metrics::Metrics;
use crate::sandbox::bindings::GuestError;
use crate::sandbox::host::{ActorCalls, CallChain, CallReply};
use crate::sandbox::turn::TurnLimits;
use crate::sandbox::{CodeError, Sandbox, SandboxConfig};
use crate::storage::schema::{
    ActorRecord, AlarmRecord, CodeKind, EventRecord, InboxKind, InboxRecord, InputRecord,
    TypeRecord, VersionRecord,
};
use crate::storage::{EnqueueOutcome, Page, Storage, StorageError, WriteOp};
use crate::streams::EventBus;

/// State entries: (key, value) in key order.
pub type StateEntries = Vec<(String, Vec<u8>)>;

/// Environment variable naming a guest log message that aborts the process
/// (fault injection for crash tests).
pub const FAULT_ABORT_ENV: &str = "MARMOT_FAULT_ABORT_ON_LOG";

/// A running node.
pub struct Node {
    /// This node, for the futures of `actors.call` (which outlive `&self`).
    me: std::sync::Weak<Node>,
    pub(crate) config: NodeConfig,
    pub(crate) storage: Arc<Storage>,
    pub(crate) sandbox: Arc<Sandbox>,
    pub(crate) catalog: Catalog,
    pub(crate) metrics: Arc<Metrics>,
    pub(crate) registry: Registry,
    pub(crate) turn_limits: Arc<TurnLimits>,
    /// Inbox rows with a seq up to this were present at start-up.
    pub(crate) boot_inbox_seq: u64,
    /// Wall-clock time the node started.
    pub(crate) boot_ms: u64,
    /// Delivers due alarms.
    pub(crate) scheduler: crate::alarms::scheduler::Scheduler,
    /// Open event streams and what they watch.
    pub(crate) event_bus: Arc<EventBus>,
    ready: AtomicBool,
}

/// Why a deploy was refused.
#[derive(Debug, thiserror::Error)]
pub enum DeployError {
    /// Bad type name.
    #[error(transparent)]
    Name(#[from] crate::ids::IdError),
    /// Bad config.
    #[error("invalid config: {0}")]
    Config(String),
    /// Bad code.
    #[error(transparent)]
    Code(#[from] CodeError),
    /// Code too large.
    #[error("code of {size} bytes exceeds the limit of {limit} bytes")]
    TooLarge {
        /// Size.
        size: usize,
        /// Limit.
        limit: usize,
    },
    /// Storage failed.
    #[error(transparent)]
    Storage(#[from] StorageError),
}

/// Result of a deploy.
#[derive(Debug, Clone, Serialize)]
pub struct Deployed {
    /// Type name.
    #[serde(rename = "type")]
    pub ty: String,
    /// The version now current.
    pub version: u32,
    /// `wasm`.
    pub kind: &'static str,
    /// SHA-256 of the code.
    pub sha256: String,
    /// False when identical code and config were already current (no new version).
    pub created: bool,
}

/// What `GET /v1/actors/{type}/{id}` shows.
#[derive(Debug, Clone, Serialize)]
pub struct ActorInfo {
    /// Type.
    #[serde(rename = "type")]
    pub ty: String,
    /// Id.
    pub id: String,
    /// `active` or `hibernated`.
    pub status: &'static str,
    /// Version its state belongs to.
    pub version: u32,
    /// Creation time (ms since epoch).
    pub created_at_ms: u64,
    /// Last committed turn (ms since epoch; 0: never).
    pub last_turn_at_ms: u64,
    /// Turns committed.
    pub turns: u64,
    /// State size in bytes.
    pub state_bytes: u64,
    /// State keys.
    pub state_keys: u64,
    /// Newest event seq.
    pub last_event_seq: u64,
    /// Oldest event seq still kept (0: no events yet; `last_event_seq + 1`:
    /// all removed by retention).
    pub first_event_seq: u64,
    /// Durable messages waiting.
    pub pending_messages: u64,
    /// Pending alarms.
    pub pending_alarms: u64,
    /// Pending input requests (not supported yet: always 0).
    pub pending_inputs: u64,
}

/// Why a type cannot be deleted.
#[derive(Debug, thiserror::Error)]
pub enum DeleteTypeError {
    /// No such type.
    #[error("unknown actor type `{0}`")]
    Unknown(String),
    /// Actors exist and `force` was not given.
    #[error("type `{ty}` still has {count} actor(s); delete them first or pass ?force=true")]
    HasActors {
        /// Type.
        ty: String,
        /// Actors on disk.
        count: u64,
    },
    /// Storage failed.
    #[error(transparent)]
    Storage(#[from] StorageError),
}

impl Node {
    /// Open the data directory, load types and start recovery.
    pub async fn start(config: NodeConfig) -> anyhow::Result<Arc<Self>> {
        config
            .validate()
            .map_err(|e| anyhow::anyhow!("invalid configuration: {e}"))?;
        let metrics = Arc::new(Metrics::new());
        let storage = {
            let dir = config.data_dir.clone();
            let sc = config.storage.clone();
            let m = metrics.clone();
            tokio::task::spawn_blocking(move || Storage::open(&dir, &sc, m)).await??
        };
        let storage = Arc::new(storage);
        let fault_abort_marker = std::env::var(FAULT_ABORT_ENV)
            .ok()
            .filter(|s| !s.is_empty())
            .map(Arc::from);
        if fault_abort_marker.is_some() {
            tracing::warn!(
                "fault injection enabled ({FAULT_ABORT_ENV}); never use this in production"
            );
        }
        let max_active = config.limits.max_active_actors;
        let sandbox = Sandbox::new(SandboxConfig {
            // Headroom over the cap: eviction is asynchronous.
            max_instances: max_active + max_active / 10 + 64,
            max_memory_bytes: config.limits.max_guest_memory_bytes,
            max_js_instances: config.limits.max_js_sandboxes,
            tick: Duration::from_millis(10),
            cache_dir: config
                .cache_dir
                .clone()
                .unwrap_or_else(|| config.data_dir.join("cache")),
            output_capacity: 64 << 10,
            fault_abort_marker,
        })?;
        let catalog = Catalog::load(&storage)?;
        let (recover, boot_inbox_seq) = storage.reader()?.inbox_actors()?;
        let l = &config.limits;
        let turn_limits = Arc::new(TurnLimits {
            max_value_bytes: l.max_value_bytes,
            max_state_bytes: l.max_state_bytes,
            max_event_bytes: l.max_event_bytes,
            max_events_per_turn: 1000,
            max_log_lines: l.max_log_lines_per_turn,
            max_log_line_bytes: l.max_log_line_bytes,
            max_turn_write_bytes: 64 << 20,
            max_cache_bytes: 8 << 20,
            max_alarms: config.alarms.max_per_actor,
            max_alarm_payload_bytes: 64 << 10,
            max_pending_inputs: config.inputs.max_pending_per_actor,
            max_sends_per_turn: 100,
            max_message_bytes: l.max_message_bytes,
        });
        let (scheduler, scheduler_rx) = crate::alarms::scheduler::Scheduler::new();
        let event_bus = Arc::new(EventBus::new(
            config.events.max_streams,
            metrics.event_streams.clone(),
        ));
        let registry = Registry::new(max_active, l.mailbox_capacity);
        let node = Arc::new_cyclic(|me| Self {
            me: me.clone(),
            scheduler,
            event_bus,
            registry,
            config,
            storage,
            sandbox,
            catalog,
            metrics,
            turn_limits,
            boot_inbox_seq,
            boot_ms: now_ms(),
            ready: AtomicBool::new(false),
        });
        node.update_gauges();
        tracing::info!(
            data = %node.storage.path().display(),
            actors = node.storage.writer().actor_count(),
            types = node.catalog.all().len(),
            recovering = recover.len(),
            "storage open"
        );
        tokio::spawn(node.clone().recover(recover));
        node.scheduler.start(node.clone(), scheduler_rx);
        tokio::spawn(node.clone().housekeeping());
        crate::webhooks::outbound::start(node.clone());
        Ok(node)
    }

    /// The sandbox settings of `POST …/eval`.
    pub(crate) fn eval_config(&self) -> crate::config::ResolvedTypeConfig {
        let l = &self.config.limits;
        crate::config::ResolvedTypeConfig {
            idle_timeout: Duration::from_secs(0),
            turn_timeout: Duration::from_millis(l.eval_timeout_ms),
            cpu_slice: Duration::from_millis(l.eval_cpu_ms),
            max_memory_bytes: l.eval_memory_bytes.min(l.max_guest_memory_bytes),
            env: Default::default(),
        }
    }

    /// Run a model-written script in a fresh JavaScript sandbox bound to the
    /// actor's state; its writes commit only if it succeeds.
    pub async fn eval(
        self: &Arc<Self>,
        key: &ActorKey,
        code: String,
    ) -> Result<EvalReply, TurnError> {
        let (tx, rx) = oneshot::channel();
        self.registry.deliver(self, key, Envelope::Eval(code, tx))?;
        rx.await.map_err(|_| TurnError::Stopped)?
    }

    /// Storage open and crash recovery finished.
    pub fn is_ready(&self) -> bool {
        self.ready.load(Ordering::Acquire)
    }

    /// The node's configuration.
    pub fn config(&self) -> &NodeConfig {
        &self.config
    }

    /// The node's metrics.
    pub fn metrics(&self) -> &Metrics {
        &self.metrics
    }

    /// The activation registry.
    pub fn registry(&self) -> &Registry {
        &self.registry
    }

    fn update_gauges(&self) {
        let active = self.registry.active_count() as i64;
        let total = self.storage.writer().actor_count() as i64;
        self.metrics.actors_hibernated.set((total - active).max(0));
    }

    /// Re-run durable messages found at start-up, a bounded number of actors
    /// at a time so a restart does not stampede.
    async fn recover(self: Arc<Self>, actors: Vec<u64>) {
        let started = std::time::Instant::now();
        let concurrency = self.config.recovery.concurrency.max(1);
        let permits = Arc::new(Semaphore::new(concurrency));
        let mut n = 0;
        for num in actors {
            let key = match self.storage.reader().and_then(|r| r.actor_key(num)) {
                Ok(Some(k)) => k,
                Ok(None) => continue,
                Err(e) => {
                    tracing::error!(error = %e, "recovery: cannot read actor key");
                    continue;
                }
            };
            let Ok(permit) = permits.clone().acquire_owned().await else {
                break;
            };
            match self
                .registry
                .deliver(&self, &key, Envelope::Recover(permit))
            {
                Ok(()) => n += 1,
                Err(e) => tracing::warn!(actor = %key, error = %e, "recovery: cannot wake actor"),
            }
        }
        let _ = permits.acquire_many(concurrency as u32).await;
        self.ready.store(true, Ordering::Release);
        tracing::info!(
            actors = n,
            elapsed_ms = started.elapsed().as_millis() as u64,
            "recovery finished; ready"
        );
    }

    /// Periodic chores: idempotency expiry, event retention by age, gauges.
    async fn housekeeping(self: Arc<Self>) {
        let mut tick = tokio::time::interval(Duration::from_secs(1));
        let mut n: u64 = 0;
        let max_age = self.config.events.max_age_ms;
        // Sweep old events a few times per retention period (1 s to 1 h).
        let sweep_every = (max_age / 4 / 1000).clamp(1, 3600);
        loop {
            tick.tick().await;
            n += 1;
            self.update_gauges();
            if max_age > 0 && n.is_multiple_of(sweep_every) {
                self.sweep_old_events().await;
            }
            if n.is_multiple_of(60) {
                let now = now_ms();
                match self
                    .storage
                    .writer()
                    .call(|done| WriteOp::SweepIdempotency { now_ms: now, done })
                    .await
                {
                    Ok(0) => {}
                    Ok(removed) => tracing::debug!(removed, "expired idempotency records removed"),
                    Err(e) => tracing::warn!(error = %e, "idempotency sweep failed"),
                }
            }
        }
    }

    /// Events older than this are past retention (0: no age limit).
    pub(crate) fn event_cutoff_ms(&self) -> u64 {
        match self.config.events.max_age_ms {
            0 => 0,
            age => now_ms().saturating_sub(age),
        }
    }

    /// Ask every actor whose oldest event is past retention to trim its log.
    /// The actor owns its record, so it does the trimming (a bookkeeping
    /// commit without waking its sandbox) and goes back to sleep.
    async fn sweep_old_events(self: &Arc<Self>) {
        const BATCH: usize = 1000;
        let cutoff = self.event_cutoff_ms();
        let mut from = 0;
        let mut poked = 0usize;
        loop {
            let found = self
                .storage
                .reader()
                .and_then(|r| r.actors_with_events_before(cutoff, from, BATCH));
            let (nums, next) = match found {
                Ok(x) => x,
                Err(e) => {
                    tracing::warn!(error = %e, "event retention sweep failed");
                    return;
                }
            };
            for num in nums {
                let Ok(Some(key)) = self.storage.reader().and_then(|r| r.actor_key(num)) else {
                    continue;
                };
                match self.registry.deliver(self, &key, Envelope::TrimEvents) {
                    Ok(()) => poked += 1,
                    Err(e) => tracing::debug!(actor = %key, error = %e, "event trim deferred"),
                }
            }
            match next {
                Some(n) => from = n,
                None => break,
            }
            // Let the woken actors finish before waking more.
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        if poked > 0 {
            tracing::debug!(actors = poked, "event retention: old events trimmed");
        }
    }

    /// Deploy a new version of `ty`.
    pub async fn deploy(
        self: &Arc<Self>,
        ty: &str,
        kind: CodeKind,
        code: Vec<u8>,
        config: TypeConfig,
    ) -> Result<Deployed, DeployError> {
        validate_type_name(ty)?;
        if code.len() > self.config.limits.max_code_bytes {
            return Err(DeployError::TooLarge {
                size: code.len(),
                limit: self.config.limits.max_code_bytes,
            });
        }
        config
            .validate(&self.config.limits)
            .map_err(DeployError::Config)?;
        let sha256 = hex::encode(Sha256::digest(&code));
        let _guard = self.catalog.deploy_lock.lock().await;
        let existing = self.catalog.get(ty);
        if let Some(e) = &existing {
            let latest = e
                .version(e.latest_version())
                .expect("latest version record");
            if latest.sha256 == sha256 && latest.config == config && latest.kind == kind {
                return Ok(Deployed {
                    ty: ty.to_owned(),
                    version: latest.version,
                    kind: latest.kind.as_str(),
                    sha256,
                    created: false,
                });
            }
        }
        let js = kind == CodeKind::Js;
        let resolved = config.resolve(&self.config.defaults, js);
        let (pre, js_module) = if js {
            let module = Arc::new(crate::catalog::js_module(ty, code.clone())?);
            self.sandbox
                .check_js(&module.name, &module.source, &resolved)
                .await?;
            let sandbox = self.sandbox.clone();
            let engine = tokio::task::spawn_blocking(move || sandbox.js_engine())
                .await
                .map_err(|e| CodeError::Invalid(format!("compiler panicked: {e}")))??;
            (engine, Some(module))
        } else {
            let sandbox = self.sandbox.clone();
            let code_for_compile = code.clone();
            let pre = tokio::task::spawn_blocking(move || sandbox.prepare(&code_for_compile))
                .await
                .map_err(|e| CodeError::Invalid(format!("compiler panicked: {e}")))??;
            (Arc::new(pre), None)
        };
        let now = now_ms();
        let mut record = existing.as_ref().map(|e| e.record()).unwrap_or(TypeRecord {
            name: ty.to_owned(),
            created_at_ms: now,
            versions: Vec::new(),
        });
        let version = record.versions.last().map_or(1, |v| v.version + 1);
        record.versions.push(VersionRecord {
            version,
            kind,
            sha256: sha256.clone(),
            code_bytes: code.len() as u64,
            config: config.clone(),
            deployed_at_ms: now,
        });
        let rec = record.clone();
        self.storage
            .writer()
            .call(|done| WriteOp::PutType {
                record: rec,
                code: Some((version, code)),
                done,
            })
            .await?;
        let prepared = Arc::new(PreparedVersion {
            version,
            pre,
            js_module,
            config: resolved,
        });
        self.catalog.install(record, prepared);
        tracing::info!(ty, version, %sha256, "deployed");
        Ok(Deployed {
            ty: ty.to_owned(),
            version,
            kind: kind.as_str(),
            sha256,
            created: true,
        })
    }

    /// Delete a type (and with `force` its actors).
    pub async fn delete_type(
        self: &Arc<Self>,
        ty: &str,
        force: bool,
    ) -> Result<u64, DeleteTypeError> {
        let _guard = self.catalog.deploy_lock.lock().await;
        if self.catalog.get(ty).is_none() {
            return Err(DeleteTypeError::Unknown(ty.to_owned()));
        }
        let count = self.storage.reader()?.count_actors_of_type(ty)?;
        if count > 0 && !force {
            return Err(DeleteTypeError::HasActors {
                ty: ty.to_owned(),
                count,
            });
        }
        // Stop new turns, then wait for live actors to flush and leave so no
        // commit of theirs lands after the delete.
        self.catalog.remove(ty);
        for _ in 0..500 {
            self.registry.hibernate_type(ty);
            if self.registry.count_type(ty) == 0 {
                break;
            }
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        // Actors still busy after 5 s (a long turn) may finish, but nothing
        // they commit from now on lands: the delete below is final.
        self.registry.fence_type(ty);
        let name = ty.to_owned();
        let deleted = self
            .storage
            .writer()
            .call(|done| WriteOp::DeleteType {
                name,
                with_actors: true,
                done,
            })
            .await?;
        tracing::info!(ty, actors_deleted = deleted, "type deleted");
        Ok(deleted)
    }

    /// Send a message and wait for the reply (released once durable).
    pub async fn send(
        self: &Arc<Self>,
        key: &ActorKey,
        body: Bytes,
        content_type: Option<String>,
        idempotency_key: Option<String>,
    ) -> Result<TurnReply, TurnError> {
        self.send_chained(key, body, content_type, idempotency_key, Arc::from([]))
            .await
    }

    /// [`Node::send`] from inside another actor's turn; `chain` holds the
    /// callers above it.
    pub(crate) async fn send_chained(
        self: &Arc<Self>,
        key: &ActorKey,
        body: Bytes,
        content_type: Option<String>,
        idempotency_key: Option<String>,
        chain: CallChain,
    ) -> Result<TurnReply, TurnError> {
        let (reply, rx) = oneshot::channel();
        let delivery = Delivery {
            message_id: new_message_id(),
            body,
            content_type,
            idempotency_key,
            chain,
            reply,
        };
        self.registry
            .deliver(self, key, Envelope::Message(Box::new(delivery)))?;
        rx.await.map_err(|_| TurnError::Stopped)?
    }

    /// Durably enqueue a message; returns its id once it is on disk.
    pub async fn enqueue(
        self: &Arc<Self>,
        key: &ActorKey,
        body: Bytes,
        content_type: Option<String>,
        idempotency_key: Option<String>,
    ) -> Result<EnqueueOutcome, TurnError> {
        let message = InboxRecord {
            message_id: new_message_id(),
            body: body.to_vec(),
            content_type,
            idempotency_key,
            attempts: 0,
            enqueued_at_ms: now_ms(),
            kind: InboxKind::Message,
        };
        let ttl = self.config.limits.idempotency_ttl_ms;
        self.enqueue_record(key, message, ttl).await
    }

    /// Durably queue an inbox row (message or webhook) for `key`, creating
    /// the actor if needed; its idempotency key, if any, lives `ttl_ms`.
    pub(crate) async fn enqueue_record(
        self: &Arc<Self>,
        key: &ActorKey,
        message: InboxRecord,
        ttl_ms: u64,
    ) -> Result<EnqueueOutcome, TurnError> {
        let ty = self
            .catalog
            .get(key.ty())
            .ok_or_else(|| TurnError::UnknownType(key.ty().to_owned()))?;
        let k = key.clone();
        let version = ty.latest_version();
        let ttl = ttl_ms;
        let outcome = self
            .storage
            .writer()
            .call(|done| WriteOp::Enqueue {
                key: k,
                version,
                message,
                idempotency_ttl_ms: ttl,
                done,
            })
            .await?;
        if let EnqueueOutcome::Queued { .. } = outcome {
            self.metrics.inbox_depth.inc();
            self.registry.poke(self, key);
        }
        Ok(outcome)
    }

    /// Delete an actor and everything it owns. Returns false if it did not exist.
    pub async fn delete_actor(self: &Arc<Self>, key: &ActorKey) -> Result<bool, TurnError> {
        if self.catalog.get(key.ty()).is_none() {
            return Err(TurnError::UnknownType(key.ty().to_owned()));
        }
        if !self.registry.is_active(key) && self.storage.reader()?.actor(key)?.is_none() {
            return Ok(false);
        }
        let (tx, rx) = oneshot::channel();
        self.registry.deliver(self, key, Envelope::Delete(tx))?;
        rx.await.map_err(|_| TurnError::Stopped)?
    }

    /// What is known about an actor (its committed state).
    pub fn actor_info(&self, key: &ActorKey) -> Result<Option<ActorInfo>, StorageError> {
        let r = self.storage.reader()?;
        let Some(rec) = r.actor(key)? else {
            return Ok(None);
        };
        Ok(Some(self.info_from(key, &rec, &r)?))
    }

    fn info_from(
        &self,
        key: &ActorKey,
        rec: &ActorRecord,
        r: &crate::storage::Reader,
    ) -> Result<ActorInfo, StorageError> {
        let live = self.registry.live_stats(key);
        let (turns, last_turn_at_ms) = match live {
            Some(Some((t, at))) if t >= rec.turns => (t, at),
            _ => (rec.turns, rec.last_turn_at_ms),
        };
        Ok(ActorInfo {
            ty: key.ty().to_owned(),
            id: key.id().to_owned(),
            status: if live.is_some() {
                "active"
            } else {
                "hibernated"
            },
            version: rec.version,
            created_at_ms: rec.created_at_ms,
            last_turn_at_ms,
            turns,
            state_bytes: rec.state_bytes,
            state_keys: rec.state_keys,
            last_event_seq: rec.last_event_seq,
            first_event_seq: rec.first_event_seq,
            pending_messages: r.inbox_len(rec.num)?,
            pending_alarms: r.alarm_count(rec.num)?,
            pending_inputs: r.pending_input_count(rec.num)?,
        })
    }

    /// Actors of a type.
    pub fn list_actors(
        &self,
        ty: &str,
        prefix: &str,
        cursor: Option<&str>,
        limit: usize,
    ) -> Result<Page<ActorInfo>, StorageError> {
        let r = self.storage.reader()?;
        let page = r.list_actors(ty, prefix, cursor, limit)?;
        let mut items = Vec::with_capacity(page.items.len());
        for (id, rec) in page.items {
            let key = ActorKey::new_unchecked(ty, &id);
            items.push(self.info_from(&key, &rec, &r)?);
        }
        Ok(Page {
            items,
            next_cursor: page.next_cursor,
        })
    }

    /// Committed state: one key, or a page of keys with `prefix`.
    pub fn read_state(
        &self,
        key: &ActorKey,
        prefix: &str,
        after: Option<&str>,
        limit: usize,
    ) -> Result<Option<StateEntries>, StorageError> {
        let r = self.storage.reader()?;
        let Some(rec) = r.actor(key)? else {
            return Ok(None);
        };
        Ok(Some(r.state_range(rec.num, prefix, after, limit)?))
    }

    /// One committed state value.
    pub fn read_state_key(
        &self,
        key: &ActorKey,
        state_key: &str,
    ) -> Result<Option<Option<Vec<u8>>>, StorageError> {
        let r = self.storage.reader()?;
        let Some(rec) = r.actor(key)? else {
            return Ok(None);
        };
        Ok(Some(r.state(rec.num, state_key)?))
    }

    /// Committed input requests of an actor, by id (oldest first).
    pub fn inputs(
        &self,
        key: &ActorKey,
    ) -> Result<Option<Vec<(String, InputRecord)>>, StorageError> {
        let r = self.storage.reader()?;
        let Some(rec) = r.actor(key)? else {
            return Ok(None);
        };
        Ok(Some(r.inputs(rec.num)?))
    }

    /// Answer one of an actor's input requests: runs its `on-input` turn and
    /// returns once that is durable.
    pub async fn answer_input(
        self: &Arc<Self>,
        key: &ActorKey,
        input_id: &str,
        response: Vec<u8>,
    ) -> Result<(), TurnError> {
        // Do not wake an actor that does not exist.
        if self.storage.reader()?.actor(key)?.is_none() {
            return Err(TurnError::NotFound);
        }
        let (tx, rx) = oneshot::channel();
        let delivery = AnswerDelivery {
            input_id: input_id.to_owned(),
            response,
            reply: tx,
        };
        self.registry
            .deliver(self, key, Envelope::Answer(Box::new(delivery)))?;
        rx.await.map_err(|_| TurnError::Stopped)?
    }

    /// Committed alarms of an actor, by name.
    pub fn alarms(
        &self,
        key: &ActorKey,
    ) -> Result<Option<Vec<(String, AlarmRecord)>>, StorageError> {
        let r = self.storage.reader()?;
        let Some(rec) = r.actor(key)? else {
            return Ok(None);
        };
        let mut alarms = r.alarms(rec.num)?;
        alarms.retain(|(name, _)| !crate::alarms::is_internal(name));
        Ok(Some(alarms))
    }

    /// Committed events after `after`.
    pub fn events(
        &self,
        key: &ActorKey,
        after: u64,
        limit: usize,
    ) -> Result<Option<Vec<(u64, EventRecord)>>, StorageError> {
        let r = self.storage.reader()?;
        let Some(rec) = r.actor(key)? else {
            return Ok(None);
        };
        // Events past retention are hidden at once, even before the sweep
        // deletes them; they are the oldest, so skip them page by page.
        let cutoff = self.event_cutoff_ms();
        let mut after = after;
        loop {
            let mut page = r.events(rec.num, after, limit)?;
            let full = page.len() == limit;
            let Some(last) = page.last().map(|(seq, _)| *seq) else {
                return Ok(Some(page));
            };
            page.retain(|(_, e)| e.at_ms >= cutoff);
            if !page.is_empty() || !full {
                return Ok(Some(page));
            }
            after = last;
        }
    }

    /// The type catalog.
    pub fn catalog(&self) -> &Catalog {
        &self.catalog
    }

    /// Actors on disk.
    pub fn actor_count(&self) -> u64 {
        self.storage.writer().actor_count()
    }

    /// Wait until every write so far is durable.
    pub async fn flush(&self) {
        self.storage.flush().await;
    }
}

/// `actors.call` and `actors.send` for turns on this node.
impl ActorCalls for Node {
    fn call(
        &self,
        to: ActorKey,
        body: Vec<u8>,
        chain: CallChain,
    ) -> futures::future::BoxFuture<'static, Result<CallReply, GuestError>> {
        let Some(node) = self.me.upgrade() else {
            return Box::pin(async {
                Err(GuestError::Internal("the node is shutting down".into()))
            });
        };
        let timeout = Duration::from_millis(self.config.limits.actor_call_timeout_ms);
        Box::pin(async move {
            let sent = node.send_chained(
                &to,
                Bytes::from(body),
                Some("application/json".into()),
                None,
                chain,
            );
            match tokio::time::timeout(timeout, sent).await {
                Ok(Ok(r)) => Ok(CallReply {
                    status: r.status,
                    body: r.body.to_vec(),
                    content_type: r.content_type,
                }),
                Ok(Err(e @ (TurnError::UnknownType(_) | TurnError::NotFound))) => {
                    Err(GuestError::NotFound(e.to_string()))
                }
                Ok(Err(e)) => Err(GuestError::Internal(format!("{to}: {e}"))),
                Err(_) => Err(GuestError::Internal(format!(
                    "{to} did not reply within {} ms",
                    timeout.as_millis()
                ))),
            }
        })
    }

    fn type_exists(&self, ty: &str) -> bool {
        self.catalog.get(ty).is_some()
    }
}

#[cfg(test)]
mod tests {
    //! In-process tests of behaviour that needs a fault the HTTP API cannot
    //! cause.

    use super::*;

    async fn node() -> (tempfile::TempDir, Arc<Node>) {
        let dir = tempfile::tempdir().unwrap();
        let node = Node::start(NodeConfig::for_dir(dir.path().join("data")))
            .await
            .unwrap();
        node.deploy(
            "counter",
            CodeKind::Wasm,
            crate::guests::COUNTER.to_vec(),
            TypeConfig::default(),
        )
        .await
        .unwrap();
        (dir, node)
    }

    async fn send(node: &Arc<Node>, body: &'static str) -> Result<TurnReply, TurnError> {
        let key = ActorKey::new("counter", "a").unwrap();
        let fut = node.send(&key, Bytes::from_static(body.as_bytes()), None, None);
        tokio::time::timeout(Duration::from_secs(10), fut)
            .await
            .expect("the actor answered (it must not hang after a failed commit)")
    }

    /// Regression: after a failed commit, an actor whose next turn wrote
    /// nothing waited forever for the lost commit.
    #[tokio::test]
    async fn a_failed_commit_fails_its_turn_and_the_actor_recovers_from_disk() {
        let (_dir, node) = node().await;
        assert_eq!(
            send(&node, r#"{"by": 5}"#).await.unwrap().body,
            r#"{"n":5}"#
        );
        node.storage.writer().inject_commit_failures(1);
        let lost = send(&node, r#"{"by": 1}"#).await;
        assert!(matches!(lost, Err(TurnError::Storage(_))), "{lost:?}");
        // Read-only turn: sees what is on disk, and answers.
        assert_eq!(
            send(&node, r#"{"by": 0}"#).await.unwrap().body,
            r#"{"n":5}"#
        );
        assert_eq!(
            send(&node, r#"{"by": 2}"#).await.unwrap().body,
            r#"{"n":7}"#
        );
        let metrics = node.metrics().render();
        assert!(
            metrics.contains("marmot_commit_failures_total 1"),
            "{metrics}"
        );
    }

    /// A read-only reply that depends on a commit in flight is held back
    /// until that commit is durable, and fails with it.
    #[tokio::test]
    async fn replies_depending_on_a_failed_commit_are_never_released() {
        let (_dir, node) = node().await;
        send(&node, r#"{"by": 1}"#).await.unwrap();
        node.storage.writer().inject_commit_failures(1);
        let key = ActorKey::new("counter", "a").unwrap();
        // Pipelined: the write and the read are both queued before the
        // write's commit fails.
        let (w, r) = tokio::join!(
            node.send(&key, Bytes::from_static(br#"{"by": 10}"#), None, None),
            node.send(&key, Bytes::from_static(br#"{"by": 0}"#), None, None),
        );
        assert!(w.is_err(), "the write's commit failed: {w:?}");
        match r {
            Ok(reply) => assert_eq!(reply.body, r#"{"n":1}"#, "a read saw a lost write"),
            Err(e) => assert!(matches!(e, TurnError::Storage(_)), "{e:?}"),
        }
        assert_eq!(
            send(&node, r#"{"by": 0}"#).await.unwrap().body,
            r#"{"n":1}"#
        );
    }
}
