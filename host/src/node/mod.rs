//! One Marmot node: the composition root and the public face.
//!
//! [`Node`] is what the HTTP API, the CLI's `dev`/`serve` and the in-process
//! benchmarks talk to. [`Node::start`] opens the database, builds the
//! engines, loads the catalog, wires the actor layer, the alarm scheduler
//! and the webhook worker to the parts each uses, and spawns crash
//! recovery. Nothing below the node holds it. Its work is split by concern:
//!
//! | file | concern |
//! |---|---|
//! | `actors.rs` | messages, durable enqueue, evals, answers, deletion |
//! | `deploy.rs` | deploying and deleting types |
//! | `queries.rs` | reads of committed data: actor info, state, events… |
//! | `hooks.rs` | inbound webhooks: verify, route, store |
//! | `background.rs` | crash recovery and periodic chores |

mod actors;
mod background;
mod deploy;
mod hooks;
mod moves;
mod queries;
mod relay;
mod replicas;
mod runs;
mod shared;
mod slots;
#[cfg(test)]
mod tests;

use crate::cluster::{Cluster, Peers, Replicator};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

pub use deploy::{DeleteTypeError, DeployError};
pub use hooks::WebhookError;
pub use moves::{DropCopy, MoveError, MoveIn, Moved};
pub use queries::AdmitError;
pub use runs::{RunState, RunWaitError};
pub use shared::SharedState;

use crate::actor::{ActorEnv, Boot, Parts, Registry};
use crate::alarms::scheduler::Scheduler;
use crate::catalog::Catalog;
use crate::clock::now_ms;
use crate::config::NodeConfig;
use crate::egress::{Egress, ResponseBudget};
use crate::metrics::Metrics;
use crate::models::budget::Ledger;
use crate::models::{Gateway, Providers};
use crate::sandbox::{
    ActorLimits, AlarmLimits, EventLimits, FileLimits, HostLimits, InputLimits, LogBudget,
    LogLimits, PoolPlan, Sandbox, SandboxConfig, StateLimits, TurnLimits,
};
use crate::secrets::{MasterKeys, SecretStore};
use crate::storage::{Storage, WriteOp};
use crate::streams::EventBus;
use crate::tokens::Tokens;

/// Environment variable naming a guest log message that aborts the process
/// (fault injection for crash tests).
pub const FAULT_ABORT_ENV: &str = "MARMOT_FAULT_ABORT_ON_LOG";

/// A running node.
pub struct Node {
    config: Arc<NodeConfig>,
    storage: Arc<Storage>,
    sandbox: Arc<Sandbox>,
    catalog: Arc<Catalog>,
    metrics: Arc<Metrics>,
    /// The actor layer: activation, mailboxes, turns.
    actors: Arc<ActorEnv>,
    /// Open event streams and what they watch.
    event_bus: Arc<EventBus>,
    /// Named values the host holds for guests.
    secrets: Arc<SecretStore>,
    /// Client tokens: minting, verifying, revoking.
    tokens: Arc<Tokens>,
    /// Model calls.
    models: Arc<Gateway>,
    /// Membership and routing when the node is part of a cluster.
    cluster: Option<Cluster>,
    /// Actors this node is moving to another region now.
    moves: moves::Moves,
    /// Webhook deliveries being handed to their actors now.
    webhooks_in_flight: hooks::InFlight,
    /// Blobs another node sent ahead of the rows that name them.
    staged_blobs: replicas::StagedBlobs,
    ready: AtomicBool,
}

impl Node {
    /// Open the data directory, load types and start recovery.
    pub async fn start(mut config: NodeConfig) -> anyhow::Result<Arc<Self>> {
        config
            .validate()
            .map_err(|e| anyhow::anyhow!("invalid configuration: {e}"))?;
        // Fit the instance pool to the host; the active cap follows it, so
        // active actors never outnumber instance slots.
        let host = HostLimits::read();
        let pool = PoolPlan::new(&config.limits, &host);
        pool.log(config.limits.max_active_actors, &host);
        config.limits.max_active_actors = pool.max_active;
        config.limits.state_cache_budget_bytes = Some(pool.state_cache);
        config.limits.request_body_budget_bytes = Some(pool.request_bodies);
        config.limits.egress_response_budget_bytes = Some(pool.egress_responses);
        if let Some(asked) = config
            .limits
            .max_connections
            .filter(|&n| n > pool.connections)
        {
            tracing::warn!(
                configured = asked,
                max_connections = pool.connections,
                open_files = host.open_files,
                "limits.max_connections is more than the open-files limit leaves room for: \
                 lowered (past it, accepts and sandboxes fail for want of descriptors)"
            );
        }
        config.limits.max_connections = Some(pool.connections);
        // Event streams hold their connections for as long as they run:
        // at most half of them may be streams, so that requests (health
        // checks, the API) always find a slot. 512 streams took every
        // slot of a node allowed 512 connections (found by a probe).
        let stream_room = (pool.connections / 2).max(1);
        if config.events.max_streams > stream_room {
            tracing::info!(
                configured = config.events.max_streams,
                max_streams = stream_room,
                max_connections = pool.connections,
                "events.max_streams lowered to half of the connections the node allows"
            );
            config.events.max_streams = stream_room;
        }
        let config = Arc::new(config);
        let metrics = Arc::new(Metrics::new());
        let storage = {
            let dir = config.data_dir.clone();
            let sc = config.storage.clone();
            let m = metrics.writer.clone();
            tokio::task::spawn_blocking(move || Storage::open(&dir, &sc, m)).await??
        };
        let storage = Arc::new(storage);
        let keys = MasterKeys::load(&config.secrets, &config.data_dir)?;
        let tokens = Arc::new(Tokens::open(
            storage.clone(),
            keys.derived(&crate::tokens::key_purpose(config.admin_token.as_deref())),
        )?);
        let secrets = Arc::new(SecretStore::open(storage.clone(), keys).await?);
        let fault_abort_marker = std::env::var(FAULT_ABORT_ENV)
            .ok()
            .filter(|s| !s.is_empty())
            .map(Arc::from);
        if fault_abort_marker.is_some() {
            tracing::warn!(
                "fault injection enabled ({FAULT_ABORT_ENV}); never use this in production"
            );
        }
        let sandbox = Sandbox::new(
            SandboxConfig {
                max_instances: pool.slots,
                max_memory_bytes: config.limits.max_guest_memory_bytes,
                max_js_instances: pool.js_sandboxes,
                tick: Duration::from_millis(10),
                cache_dir: config
                    .cache_dir
                    .clone()
                    .unwrap_or_else(|| config.data_dir.join("cache")),
                output_capacity: 64 << 10,
                fault_abort_marker,
                turn_limits: turn_limits(&config, &metrics),
                eval: config.limits.eval_config(),
                guest_memory_budget: pool.guest_memory,
            },
            storage.clone(),
        )?;
        let catalog = Arc::new(Catalog::load(&storage)?);
        let (recover, boot_inbox_seq) = storage.reader()?.inbox_actors()?;
        let (scheduler, scheduler_rx) = Scheduler::new();
        let event_bus = Arc::new(EventBus::new(
            config.events.max_streams,
            config.events.max_streams_per_token,
            metrics.event_streams.clone(),
        ));
        // One bound for what guests' fetches and model calls buffer.
        metrics
            .egress_response_budget_bytes
            .set(pool.egress_responses.min(i64::MAX as u64) as i64);
        let responses = ResponseBudget::new(
            pool.egress_responses,
            metrics.egress_response_bytes.clone(),
            metrics.egress_responses_refused.clone(),
        );
        let egress = Arc::new(Egress::new(&config.egress)?.with_response_budget(responses.clone()));
        let models = Arc::new(Gateway::new(
            Arc::new(Providers::open(storage.clone())?),
            Arc::new(Ledger::new(storage.clone())),
            secrets.clone(),
            &config.egress,
            responses,
            &config.models,
            metrics.clone(),
        )?);
        let cluster = match &config.cluster {
            Some(c) => {
                let token = config.admin_token.as_deref();
                Some(Cluster::start(c, &storage.store_id()?, token).await?)
            }
            None => None,
        };
        let actors = ActorEnv::new(Parts {
            config: config.clone(),
            storage: storage.clone(),
            sandbox: sandbox.clone(),
            catalog: catalog.clone(),
            metrics: metrics.clone(),
            scheduler: scheduler.clone(),
            event_bus: event_bus.clone(),
            egress,
            secrets: secrets.clone(),
            models: models.clone(),
            boot: Boot {
                inbox_seq: boot_inbox_seq,
                at_ms: now_ms(),
                after_crash: !storage.take_clean_stop()?,
            },
            cluster: cluster
                .clone()
                .map(|c| (c, Peers::new(config.admin_token.clone()))),
        });
        if let Some(c) = &cluster {
            // Before any turn: every commit of a slot with a backup reaches
            // it before its output is released.
            let peers = Peers::new(config.admin_token.clone());
            let replicator = Replicator::start(c.clone(), peers, storage.clone(), metrics.clone());
            storage.writer().replicate(replicator);
        }
        let node = Arc::new(Self {
            config: config.clone(),
            storage: storage.clone(),
            sandbox,
            catalog,
            metrics: metrics.clone(),
            actors: actors.clone(),
            event_bus,
            secrets,
            tokens,
            models,
            cluster,
            moves: moves::Moves::default(),
            webhooks_in_flight: hooks::InFlight::default(),
            staged_blobs: replicas::StagedBlobs::default(),
            ready: AtomicBool::new(false),
        });
        node.update_gauges();
        tracing::info!(
            data = %storage.path().display(),
            actors = storage.writer().actor_count(),
            types = node.catalog.all().len(),
            recovering = recover.len(),
            "storage open"
        );
        // Before any turn can run (and write a blob): every unreferenced
        // blob is garbage now, left by turns that never committed.
        node.collect_blobs(Duration::ZERO).await;
        tokio::spawn(node.clone().recover(recover));
        scheduler.start(storage.clone(), actors, &config.alarms, scheduler_rx);
        tokio::spawn(node.clone().housekeeping());
        tokio::spawn(node.clone().reap_released_blobs());
        tokio::spawn(node.clone().relay());
        tokio::spawn(node.clone().follow_slots());
        tokio::spawn(node.clone().sweep_placements());
        crate::webhooks::outbound::start(storage, metrics, config.webhooks.clone());
        Ok(node)
    }

    /// Storage open and crash recovery finished.
    pub fn is_ready(&self) -> bool {
        self.ready.load(Ordering::Acquire)
    }

    /// Membership and routing, when the node is part of a cluster.
    pub fn cluster(&self) -> Option<&Cluster> {
        self.cluster.as_ref()
    }

    /// The node's configuration.
    pub fn config(&self) -> &NodeConfig {
        &self.config
    }

    /// The node's metrics.
    pub fn metrics(&self) -> &Arc<Metrics> {
        &self.metrics
    }

    /// The metrics in Prometheus text, with the gauges that are sampled
    /// rather than kept up to date set first.
    pub fn render_metrics(&self) -> String {
        self.metrics
            .js_sandboxes
            .set(i64::from(self.sandbox.js_sandboxes()));
        let guest_memory = self.sandbox.guest_memory();
        let m = &self.metrics;
        m.guest_memory_grown_bytes.set(guest_memory.used() as i64);
        m.guest_memory_budget_bytes
            .set(guest_memory.limit().min(i64::MAX as u64) as i64);
        let caches = &self.actors.state_caches;
        m.state_cache_bytes.set(caches.used() as i64);
        m.state_cache_budget_bytes
            .set(caches.limit().min(i64::MAX as u64) as i64);
        m.guest_memory_refused
            .inner()
            .store(guest_memory.refused(), std::sync::atomic::Ordering::Relaxed);
        self.update_gauges();
        m.process.refresh();
        match self.storage.reader().and_then(|r| r.inbox_rows()) {
            Ok(n) => {
                m.inbox_depth.set(n.min(i64::MAX as u64) as i64);
            }
            Err(e) => tracing::debug!(error = %e, "inbox depth unread"),
        }
        self.metrics.render()
    }

    /// Client tokens.
    pub fn tokens(&self) -> &Arc<Tokens> {
        &self.tokens
    }

    /// The activation registry.
    pub fn registry(&self) -> &Registry {
        self.actors.registry()
    }

    /// The type catalog.
    pub fn catalog(&self) -> &Catalog {
        &self.catalog
    }

    /// The database and its writer.
    pub(crate) fn storage(&self) -> &Storage {
        &self.storage
    }

    /// Open event streams and what they watch.
    pub(crate) fn event_bus(&self) -> &Arc<EventBus> {
        &self.event_bus
    }

    /// The secret store.
    pub(crate) fn secrets(&self) -> &SecretStore {
        &self.secrets
    }

    /// The model gateway and its providers.
    pub(crate) fn models(&self) -> &Gateway {
        &self.models
    }

    /// Wait until every write so far is durable.
    pub async fn flush(&self) {
        self.storage.flush().await;
    }

    /// At a graceful stop, after the last request: ask every awake actor
    /// to hibernate, and wait (at most `bound`) until they have, those
    /// running a turn (queued work, an alarm) once it ends. Queued work
    /// and due alarms start no new turn meanwhile (they run after the next
    /// start). A hibernation writes what the actor's record is behind on,
    /// its turn count and last turn's time, kept in memory between writes:
    /// a clean stop lost them for every awake actor (an actor of 7 turns
    /// read 1 after a restart; found by a probe). A turn still running at `bound` is cut:
    /// it runs again after the start, uncounted; its actor's statistics
    /// are written without it (they went back to the last record written:
    /// a probe). Turns were not waited for at all: one of a queued message
    /// that needed 300 ms more ran again from the start.
    pub async fn hibernate_idle(&self, bound: Duration) {
        let registry = self.registry();
        registry.begin_stop();
        let awake = registry.active_count();
        if awake == 0 {
            return;
        }
        tracing::info!(awake, "hibernating the awake actors");
        let deadline = tokio::time::Instant::now() + bound;
        loop {
            // Asked again: an alarm may have woken one meanwhile.
            registry.hibernate_all();
            if registry.active_count() == 0 {
                break;
            }
            if tokio::time::Instant::now() >= deadline {
                let busy = registry
                    .active_count()
                    .saturating_sub(registry.idle_count());
                if busy > 0 {
                    tracing::warn!(
                        busy,
                        bound_ms = bound.as_millis() as u64,
                        "actors still running a turn at the stop: their turns are cut and run again after the start"
                    );
                }
                break;
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        let writer = self.storage.writer();
        let written = registry.awake_stats().into_iter().map(|(key, turns, at)| {
            writer.call(move |done| WriteOp::RecordStats {
                key,
                turns,
                last_turn_at_ms: at,
                done,
            })
        });
        for r in futures::future::join_all(written).await {
            if let Err(e) = r {
                tracing::warn!(error = %e, "an awake actor's statistics were not written at the stop");
            }
        }
    }

    /// At shutdown, after the last request: flush and close the database
    /// cleanly.
    pub async fn close_storage(&self) {
        self.storage.close().await;
    }

    fn update_gauges(&self) {
        let active = self.registry().active_count() as i64;
        let total = self.storage.writer().actor_count() as i64;
        self.metrics.actors_hibernated.set((total - active).max(0));
    }
}

/// The limits of every capability inside a turn, from the node's config.
fn turn_limits(config: &NodeConfig, metrics: &Metrics) -> TurnLimits {
    let l = &config.limits;
    TurnLimits {
        state: StateLimits {
            max_value_bytes: l.max_value_bytes,
            max_state_bytes: l.max_state_bytes,
            max_turn_write_bytes: 64 << 20,
            max_cache_bytes: 8 << 20,
        },
        events: EventLimits {
            max_event_bytes: l.max_event_bytes,
            max_events_per_turn: 1000,
            max_turn_event_bytes: 16 << 20,
        },
        log: LogLimits {
            max_lines: l.max_log_lines_per_turn,
            max_line_bytes: l.max_log_line_bytes,
            budget: Arc::new(LogBudget::new(
                l.guest_log_bytes_per_s,
                metrics.guest_log_lines_dropped.clone(),
            )),
        },
        alarms: AlarmLimits {
            max_alarms: config.alarms.max_per_actor,
            max_payload_bytes: 64 << 10,
        },
        inputs: InputLimits {
            max_pending: config.inputs.max_pending_per_actor,
        },
        actors: ActorLimits {
            max_sends_per_turn: 100,
            // A turn may always send one message of the largest size.
            max_turn_send_bytes: (16 << 20).max(l.max_message_bytes),
            max_message_bytes: l.max_message_bytes,
        },
        files: FileLimits {
            max_file_bytes: config.files.max_file_bytes,
            max_actor_bytes: config.files.max_actor_bytes,
            max_actor_files: config.files.max_actor_files,
            max_type_bytes: config.files.max_type_bytes,
            inline_max_bytes: config.files.inline_max_bytes,
        },
    }
}
