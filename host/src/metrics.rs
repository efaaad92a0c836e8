//! Prometheus metrics for `GET /metrics`.
//!
//! Hot-path handles (counters per outcome, histograms) are created once at
//! start-up so that recording a turn is a few atomic operations, never a label
//! lookup.

use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::{Histogram, exponential_buckets};
use prometheus_client::registry::Registry;

use crate::storage::WriterMetrics;

/// Label set for turn counters.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct TurnLabels {
    /// `message`, `upgrade`, …
    pub kind: &'static str,
    /// `ok`, `error`, `trap`, …
    pub outcome: &'static str,
}

/// Label set for inbound webhooks (and other counts by outcome).
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct HookLabels {
    /// In: `accepted`, `duplicate`, `rejected`; out: `delivered`, `failed`,
    /// `dead`.
    pub outcome: &'static str,
}

/// Label set for guests' outbound HTTP requests.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct HttpLabels {
    /// `ok` (any status), `refused` (a rule, before sending), `failed`,
    /// `timeout`, `too_large`, `invalid`.
    pub outcome: &'static str,
}

/// Label set for model calls: the provider, and the outcome (`ok` or an
/// error code) or, for tokens, the direction (`input`, `output`).
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct ModelLabels {
    /// The provider's name on this node.
    pub provider: String,
    /// Outcome or direction.
    pub outcome: &'static str,
}

/// Label set for requests refused at the edge.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct RefusalLabels {
    /// The error code answered: `unauthorized`, `invalid_token`,
    /// `token_expired`, `token_revoked`, `forbidden`, `rate_limited`,
    /// `invalid_authorization`.
    pub code: &'static str,
}

/// Label set for dropped guest log lines.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct ReasonLabels {
    /// `turn_limit` (the turn's lines) or `rate` (the type's bytes per
    /// second).
    pub reason: &'static str,
}

/// Label set for sandbox traps.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct TrapLabels {
    /// `cpu`, `memory`, `timeout`, `trap`, `stack_overflow`.
    pub reason: &'static str,
}

/// Every metric the node exports.
pub struct Metrics {
    registry: Registry,
    /// Actors awake in memory.
    pub actors_active: Gauge,
    /// Actors on disk and not awake.
    pub actors_hibernated: Gauge,
    /// Turns by kind and outcome.
    pub turns: Family<TurnLabels, Counter>,
    /// Turn duration (guest execution, not commit).
    pub turn_seconds: Histogram,
    /// Time from a message reaching a hibernated actor to its instance being ready.
    pub wake_seconds: Histogram,
    /// Hibernations.
    pub hibernations: Counter,
    /// Idle JavaScript sandboxes trimmed, and the snapshot pages they gave
    /// back (see "Trimming idle JavaScript sandboxes" in docs/design.md).
    pub js_trims: Counter,
    /// Pages given back by those trims.
    pub js_trimmed_pages: Counter,
    /// Fiber stack pages idle instances (of any language) gave back.
    pub trimmed_stack_pages: Counter,
    /// Pages of JavaScript sandboxes populated before a turn wrote them.
    pub js_prefaulted_pages: Counter,
    /// Pages of other instances (actors built with the Rust SDK)
    /// populated before their first turn wrote them.
    pub prefaulted_pages: Counter,
    /// JavaScript sandboxes live, counted against the node's cap (set when
    /// the metrics are read).
    pub js_sandboxes: Gauge,
    /// Bytes live guests have grown their memories by, against
    /// `guest_memory_budget_bytes` (set when the metrics are read).
    pub guest_memory_grown_bytes: Gauge,
    /// The node's guest memory growth budget.
    pub guest_memory_budget_bytes: Gauge,
    /// Growths the budget refused (set when the metrics are read).
    pub guest_memory_refused: Counter,
    /// Bytes the active actors' state caches hold (set when the metrics
    /// are read).
    pub state_cache_bytes: Gauge,
    /// What they may hold together before actors keep only what is not
    /// yet durable.
    pub state_cache_budget_bytes: Gauge,
    /// Bytes of request bodies the node holds (read, or declared and being
    /// read) until their responses are made.
    pub request_body_bytes: Gauge,
    /// Requests refused at once because their bodies did not fit
    /// `limits.request_body_budget_bytes`.
    pub requests_shed: Counter,
    /// Requests refused by auth or client rate limits, by error code.
    pub requests_refused: Family<RefusalLabels, Counter>,
    /// Client connections open (`limits.max_connections` at most).
    pub http_connections: Gauge,
    /// Client connections closed to make room for new ones at the cap: idle
    /// ones, else the one sending a webhook body longest.
    pub http_connections_evicted: Counter,
    /// Bytes of outbound response bodies buffered (charged until handed
    /// on), against `limits.egress_response_budget_bytes`.
    pub egress_response_bytes: Gauge,
    /// That budget.
    pub egress_response_budget_bytes: Gauge,
    /// Buffered fetches failed because their bodies found no room in it.
    pub egress_responses_refused: Counter,
    /// Compiled-code cache files removed because no node had used them for
    /// the retention (old versions, old builds, abandoned temporary files).
    pub code_cache_removed_files: Counter,
    /// What the storage writer counts (commits, failures, batch sizes,
    /// latency).
    pub writer: WriterMetrics,
    /// Messages refused because a mailbox was full.
    pub mailbox_full: Counter,
    /// Sandbox traps by reason.
    pub traps: Family<TrapLabels, Counter>,
    /// Guest log lines dropped, by reason.
    pub guest_log_lines_dropped: Family<ReasonLabels, Counter>,
    /// Durable messages waiting in inboxes: the inbox table's length, read
    /// at each scrape (kept by increments from start, it went negative
    /// after a restart with a backlog).
    pub inbox_depth: Gauge,
    /// Durable messages given up after repeated crashes.
    pub turns_failed_recovery: Counter,
    /// Time from an alarm's due time to its turn starting.
    pub alarm_lag_seconds: Histogram,
    /// Alarm occurrences given up after their last attempt.
    pub alarms_failed: Counter,
    /// Open live event streams.
    pub event_streams: Gauge,
    /// Inbound webhooks by outcome.
    pub webhooks_received: Family<HookLabels, Counter>,
    /// Inbound webhooks whose turn ran before the 202, in one commit with
    /// their de-duplication record (the rest went through the inbox).
    pub webhooks_run_directly: Counter,
    /// Outbound delivery attempts by outcome.
    pub webhook_deliveries: Family<HookLabels, Counter>,
    /// Outbound deliveries waiting (pending or retrying).
    pub webhook_queue_depth: Gauge,
    /// Guests' outbound HTTP requests by outcome.
    pub http_requests: Family<HttpLabels, Counter>,
    /// Their duration, head received (or refused).
    pub http_request_seconds: Histogram,
    /// Model calls (each attempt) by provider and outcome.
    pub model_calls: Family<ModelLabels, Counter>,
    /// Their duration, whole answer received.
    pub model_call_seconds: Histogram,
    /// Tokens by provider and direction.
    pub model_tokens: Family<ModelLabels, Counter>,
    /// Requests forwarded to the owner of an actor's slot, by outcome
    /// (`ok`, `stale`: the owner's epoch differed, `error`, `rerouted`:
    /// served here until its actor left, then routed again).
    pub cluster_forwards: Family<HookLabels, Counter>,
    /// Messages sent with `actors.send` handed to their recipients' owners
    /// (a cluster's relay).
    pub cluster_relayed: Counter,
    /// Actors moved out of this node's slots to another region.
    pub cluster_moves: Counter,
    /// Slots this node handed to their backup (a rebalance).
    pub cluster_handoffs: Counter,
    /// Placement entries removed because their actor was gone (deleted,
    /// or never created).
    pub cluster_placements_forgotten: Counter,
    /// Round trips shipping committed batches to backups (the time a
    /// batch's output waits for its backup).
    pub replication_seconds: Histogram,
    /// Committed batches waiting for the next shipping round.
    pub replication_queue: Gauge,
    /// Slots this node owns and has used that have no backup (degraded).
    pub degraded_slots: Gauge,
    /// Batches applied as a backup.
    pub replica_batches: Counter,
    /// What the kernel says the whole process uses, read at each scrape.
    pub process: ProcessGauges,
}

/// The process as the kernel sees it (Linux; the gauges stay 0 where
/// `/proc/self` cannot be read). Guest memory, state caches and sandboxes
/// have their own gauges; these are what an operator compares with the
/// machine's memory and file limits.
#[derive(Debug, Default, Clone)]
pub struct ProcessGauges {
    /// Resident memory (`VmRSS`): counts pages shared between sandboxes
    /// (the JavaScript snapshot) once per mapping's owner, and the code
    /// cache's mapped files, which the kernel may drop.
    resident: Gauge,
    /// Resident anonymous memory (`RssAnon`): heaps, guest memories,
    /// allocator caches; what the node holds and cannot give back on its own.
    anonymous: Gauge,
    /// Open file descriptors (connections, redb, mapped code files).
    open_fds: Gauge,
}

impl ProcessGauges {
    fn register(&self, registry: &mut Registry) {
        registry.register(
            "process_resident_memory_bytes",
            "Resident memory of the process (VmRSS)",
            self.resident.clone(),
        );
        registry.register(
            "process_anonymous_memory_bytes",
            "Resident anonymous memory of the process (RssAnon): heaps and guest memories",
            self.anonymous.clone(),
        );
        registry.register(
            "process_open_fds",
            "Open file descriptors of the process",
            self.open_fds.clone(),
        );
    }

    /// Read `/proc/self` again.
    pub fn refresh(&self) {
        if let Ok(status) = std::fs::read_to_string("/proc/self/status") {
            let (resident, anonymous) = memory_from_status(&status);
            self.resident.set(resident.map_or(0, kib_to_bytes));
            self.anonymous.set(anonymous.map_or(0, kib_to_bytes));
        }
        if let Ok(fds) = std::fs::read_dir("/proc/self/fd") {
            self.open_fds.set(fds.count().min(i64::MAX as usize) as i64);
        }
    }
}

fn kib_to_bytes(kib: u64) -> i64 {
    kib.saturating_mul(1024).min(i64::MAX as u64) as i64
}

/// `VmRSS` and `RssAnon`, in KiB, from the text of `/proc/self/status`.
fn memory_from_status(status: &str) -> (Option<u64>, Option<u64>) {
    let field = |name: &str| {
        status.lines().find_map(|line| {
            let rest = line.strip_prefix(name)?.strip_prefix(':')?;
            rest.trim().strip_suffix("kB")?.trim().parse().ok()
        })
    };
    (field("VmRSS"), field("RssAnon"))
}

impl Metrics {
    /// Register every metric.
    pub fn new() -> Self {
        let mut registry = Registry::with_prefix("marmot");
        let actors_active = Gauge::default();
        registry.register(
            "actors_active",
            "Actors awake in memory",
            actors_active.clone(),
        );
        let actors_hibernated = Gauge::default();
        registry.register(
            "actors_hibernated",
            "Actors stored on disk and not awake",
            actors_hibernated.clone(),
        );
        let turns = Family::<TurnLabels, Counter>::default();
        registry.register(
            "turns",
            "Turns by kind and the outcome of the guest's run (ok, error, trap, timeout, not_started, overloaded, storage_error); a turn whose commit then fails is ok here and counted in the commit failures",
            turns.clone(),
        );
        // Series that exist from the start, at 0: a counter that appears
        // with its first increment is invisible to `rate()` and
        // `increase()` for that increment (the first trap of a kind after
        // a restart went unseen).
        for kind in ["message", "alarm", "webhook", "input", "upgrade"] {
            for outcome in [
                "ok",
                "error",
                "trap",
                "timeout",
                "not_started",
                "overloaded",
            ] {
                drop(turns.get_or_create(&TurnLabels { kind, outcome }));
            }
        }
        let turn_seconds = Histogram::new(exponential_buckets(10e-6, 2.0, 22));
        registry.register(
            "turn_duration_seconds",
            "Guest execution time of a turn",
            turn_seconds.clone(),
        );
        let wake_seconds = Histogram::new(exponential_buckets(10e-6, 2.0, 20));
        registry.register(
            "wake_duration_seconds",
            "Time to wake a hibernated actor (load and instantiate)",
            wake_seconds.clone(),
        );
        let hibernations = Counter::default();
        registry.register("hibernations", "Actors put to sleep", hibernations.clone());
        let js_trims = Counter::default();
        registry.register(
            "js_sandbox_trims",
            "Idle JavaScript sandboxes trimmed",
            js_trims.clone(),
        );
        let js_trimmed_pages = Counter::default();
        registry.register(
            "js_sandbox_trimmed_pages",
            "Snapshot pages idle JavaScript sandboxes gave back, unchanged",
            js_trimmed_pages.clone(),
        );
        let trimmed_stack_pages = Counter::default();
        registry.register(
            "sandbox_trimmed_stack_pages",
            "Pages of the fiber stacks idle instances keep between calls, given back",
            trimmed_stack_pages.clone(),
        );
        let js_prefaulted_pages = Counter::default();
        registry.register(
            "js_sandbox_prefaulted_pages",
            "Pages of JavaScript sandboxes copied up front, before a turn that writes them",
            js_prefaulted_pages.clone(),
        );
        let prefaulted_pages = Counter::default();
        registry.register(
            "sandbox_prefaulted_pages",
            "Pages of other instances (actors built with the Rust SDK) copied up front, before a first turn that writes them",
            prefaulted_pages.clone(),
        );
        let code_cache_removed_files = Counter::default();
        registry.register(
            "code_cache_removed_files",
            "Compiled-code cache files removed after going unused for the retention",
            code_cache_removed_files.clone(),
        );
        let js_sandboxes = Gauge::default();
        registry.register(
            "js_sandboxes",
            "JavaScript sandboxes live, against the node's cap: actors', and evals' while they run",
            js_sandboxes.clone(),
        );
        let guest_memory_grown_bytes = Gauge::default();
        registry.register(
            "guest_memory_grown_bytes",
            "Bytes live guests have grown their linear memories by past their starting size, against the node's budget",
            guest_memory_grown_bytes.clone(),
        );
        let guest_memory_budget_bytes = Gauge::default();
        registry.register(
            "guest_memory_budget_bytes",
            "Bytes all live guests together may grow their memories by (limits.guest_memory_budget_bytes)",
            guest_memory_budget_bytes.clone(),
        );
        let state_cache_bytes = Gauge::default();
        registry.register(
            "state_cache_bytes",
            "Bytes of state values the active actors keep between turns",
            state_cache_bytes.clone(),
        );
        let state_cache_budget_bytes = Gauge::default();
        registry.register(
            "state_cache_budget_bytes",
            "What the actors' state caches may hold together (limits.state_cache_budget_bytes)",
            state_cache_budget_bytes.clone(),
        );
        let request_body_bytes = Gauge::default();
        registry.register(
            "request_body_bytes",
            "Bytes of request bodies held until their responses are made, against limits.request_body_budget_bytes",
            request_body_bytes.clone(),
        );
        let requests_shed = Counter::default();
        registry.register(
            "requests_shed",
            "Requests answered 503 at once because the node held too many request body bytes",
            requests_shed.clone(),
        );
        let requests_refused = Family::<RefusalLabels, Counter>::default();
        registry.register(
            "requests_refused",
            "Requests refused by auth (missing, invalid, expired, revoked or insufficient tokens) or client rate limits, by error code",
            requests_refused.clone(),
        );
        for code in [
            "unauthorized",
            "invalid_token",
            "token_expired",
            "token_revoked",
            "forbidden",
            "rate_limited",
            "invalid_authorization",
        ] {
            drop(requests_refused.get_or_create(&RefusalLabels { code }));
        }
        let http_connections = Gauge::default();
        registry.register(
            "http_connections",
            "Client connections open, against limits.max_connections",
            http_connections.clone(),
        );
        let http_connections_evicted = Counter::default();
        registry.register(
            "http_connections_evicted",
            "Client connections closed to make room for new ones at limits.max_connections: idle ones, else the one sending a webhook body longest",
            http_connections_evicted.clone(),
        );
        let egress_response_bytes = Gauge::default();
        registry.register(
            "egress_response_bytes",
            "Bytes of outbound response bodies buffered until handed on, against limits.egress_response_budget_bytes",
            egress_response_bytes.clone(),
        );
        let egress_response_budget_bytes = Gauge::default();
        registry.register(
            "egress_response_budget_bytes",
            "What buffered outbound response bodies may hold together (limits.egress_response_budget_bytes)",
            egress_response_budget_bytes.clone(),
        );
        let egress_responses_refused = Counter::default();
        registry.register(
            "egress_responses_refused",
            "Buffered outbound fetches failed because their bodies found no room in the node's response budget",
            egress_responses_refused.clone(),
        );
        let guest_memory_refused = Counter::default();
        registry.register(
            "guest_memory_refused",
            "Memory growths refused because the node's guest memory budget was spent (the turn got 503)",
            guest_memory_refused.clone(),
        );
        let writer = WriterMetrics::new();
        registry.register(
            "commits",
            "Storage commits (each fsync'd)",
            writer.commits.clone(),
        );
        registry.register(
            "commit_failures",
            "Storage commits that failed",
            writer.commit_failures.clone(),
        );
        registry.register(
            "commit_batch_size",
            "Write operations folded into one commit",
            writer.commit_batch_size.clone(),
        );
        registry.register(
            "commit_duration_seconds",
            "Commit latency including fsync",
            writer.commit_seconds.clone(),
        );
        registry.register(
            "storage_disk_faulted",
            "1 while commits fail because the disk does (full, failed fsync); writes get 503",
            writer.disk_faulted.clone(),
        );
        registry.register(
            "storage_journal_checkpoints",
            "Syncs of the database file that let a journal file be reused",
            writer.journal.checkpoints.clone(),
        );
        registry.register(
            "storage_journal_checkpoint_duration_seconds",
            "How long each journal checkpoint's sync of the database file took",
            writer.journal.checkpoint_seconds.clone(),
        );
        registry.register(
            "storage_journal_waits",
            "Commits that waited for a journal checkpoint (the disk fell behind)",
            writer.journal.waits.clone(),
        );
        registry.register(
            "storage_journal_direct_commits",
            "Commits larger than a journal file, synced to the database file directly",
            writer.journal.direct.clone(),
        );
        registry.register(
            "storage_reopens",
            "Times the database was reopened after a disk failure",
            writer.reopens.clone(),
        );
        let mailbox_full = Counter::default();
        registry.register(
            "mailbox_full",
            "Messages refused because the actor's mailbox was full",
            mailbox_full.clone(),
        );
        let traps = Family::<TrapLabels, Counter>::default();
        registry.register("sandbox_traps", "Sandbox traps by reason", traps.clone());
        let guest_log_lines_dropped = Family::<ReasonLabels, Counter>::default();
        registry.register(
            "guest_log_lines_dropped",
            "Guest log lines dropped: past the turn's lines (turn_limit) or the type's bytes per second (rate)",
            guest_log_lines_dropped.clone(),
        );
        for reason in ["turn_limit", "rate"] {
            drop(guest_log_lines_dropped.get_or_create(&ReasonLabels { reason }));
        }
        for reason in [
            "cpu",
            "memory",
            "timeout",
            "trap",
            "stack_overflow",
            "node_memory",
        ] {
            drop(traps.get_or_create(&TrapLabels { reason }));
        }
        let inbox_depth = Gauge::default();
        registry.register(
            "inbox_depth",
            "Durable messages and webhooks accepted and not yet run, held on this node (in a cluster, a backup's copies of its slots' inboxes included)",
            inbox_depth.clone(),
        );
        let turns_failed_recovery = Counter::default();
        registry.register(
            "recovery_given_up",
            "Durable messages given up after repeated crashes",
            turns_failed_recovery.clone(),
        );
        let alarm_lag_seconds = Histogram::new(exponential_buckets(100e-6, 2.0, 20));
        registry.register(
            "alarm_lag_seconds",
            "Time from an alarm's due time to its turn starting",
            alarm_lag_seconds.clone(),
        );
        let alarms_failed = Counter::default();
        registry.register(
            "alarms_failed",
            "Alarm occurrences given up after their last attempt",
            alarms_failed.clone(),
        );
        let event_streams = Gauge::default();
        registry.register(
            "event_streams",
            "Open live event streams (SSE)",
            event_streams.clone(),
        );
        let webhooks_received = Family::<HookLabels, Counter>::default();
        registry.register(
            "webhooks_received",
            "Inbound webhooks by outcome",
            webhooks_received.clone(),
        );
        for outcome in ["accepted", "duplicate", "rejected"] {
            drop(webhooks_received.get_or_create(&HookLabels { outcome }));
        }
        let webhooks_run_directly = Counter::default();
        registry.register(
            "webhooks_run_directly",
            "Inbound webhooks run by an idle actor before the 202, in one commit (others are queued in the inbox)",
            webhooks_run_directly.clone(),
        );
        let webhook_deliveries = Family::<HookLabels, Counter>::default();
        registry.register(
            "webhook_deliveries",
            "Outbound webhook delivery attempts by outcome (delivered, failed, dead)",
            webhook_deliveries.clone(),
        );
        for outcome in ["delivered", "failed", "dead"] {
            drop(webhook_deliveries.get_or_create(&HookLabels { outcome }));
        }
        let webhook_queue_depth = Gauge::default();
        registry.register(
            "webhook_queue_depth",
            "Outbound webhook deliveries waiting to be attempted",
            webhook_queue_depth.clone(),
        );
        let http_requests = Family::<HttpLabels, Counter>::default();
        registry.register(
            "http_requests",
            "Outbound HTTP requests of guests by outcome (ok, refused, failed, timeout, too_large, invalid)",
            http_requests.clone(),
        );
        let http_request_seconds = Histogram::new(exponential_buckets(100e-6, 2.0, 18));
        registry.register(
            "http_request_duration_seconds",
            "Outbound HTTP requests of guests, until the response's head",
            http_request_seconds.clone(),
        );
        let model_calls = Family::<ModelLabels, Counter>::default();
        registry.register(
            "model_calls",
            "Model calls (every attempt) by provider and outcome (ok or an error code)",
            model_calls.clone(),
        );
        let model_call_seconds = Histogram::new(exponential_buckets(0.01, 2.0, 16));
        registry.register(
            "model_call_duration_seconds",
            "Model calls, until the whole answer arrived",
            model_call_seconds.clone(),
        );
        let model_tokens = Family::<ModelLabels, Counter>::default();
        registry.register(
            "model_tokens",
            "Tokens of model calls by provider and direction (input, output)",
            model_tokens.clone(),
        );
        let cluster_forwards = Family::<HookLabels, Counter>::default();
        registry.register(
            "cluster_forwards",
            "Requests forwarded to the node owning the actor, by outcome (ok, stale, error; \
             rerouted: served here, its actor left while it ran, nothing applied, sent again)",
            cluster_forwards.clone(),
        );
        for outcome in ["ok", "stale", "error", "rerouted"] {
            drop(cluster_forwards.get_or_create(&HookLabels { outcome }));
        }
        let replication_seconds = Histogram::new(exponential_buckets(50e-6, 2.0, 18));
        registry.register(
            "cluster_replication_seconds",
            "Round trips shipping committed batches to the backups of their slots",
            replication_seconds.clone(),
        );
        let replication_queue = Gauge::default();
        registry.register(
            "cluster_replication_queue",
            "Committed batches waiting for the next shipping round (replication lag)",
            replication_queue.clone(),
        );
        let degraded_slots = Gauge::default();
        registry.register(
            "cluster_degraded_slots",
            "Used slots this node owns that have no backup",
            degraded_slots.clone(),
        );
        let replica_batches = Counter::default();
        registry.register(
            "cluster_replica_batches",
            "Batches applied as the backup of a slot",
            replica_batches.clone(),
        );
        let cluster_relayed = Counter::default();
        registry.register(
            "cluster_relayed",
            "Messages sent by actors (actors.send) handed to their recipients' owners",
            cluster_relayed.clone(),
        );
        let cluster_moves = Counter::default();
        registry.register(
            "cluster_moves",
            "Actors moved out of this node's slots to another region",
            cluster_moves.clone(),
        );
        let cluster_handoffs = Counter::default();
        registry.register(
            "cluster_handoffs",
            "Slots this node handed to their backup in a rebalance",
            cluster_handoffs.clone(),
        );
        let cluster_placements_forgotten = Counter::default();
        registry.register(
            "cluster_placements_forgotten",
            "Placement entries removed from etcd because their actor was deleted or never created",
            cluster_placements_forgotten.clone(),
        );
        let process = ProcessGauges::default();
        process.register(&mut registry);
        Self {
            registry,
            process,
            cluster_forwards,
            cluster_relayed,
            cluster_moves,
            cluster_handoffs,
            cluster_placements_forgotten,
            replication_seconds,
            replication_queue,
            degraded_slots,
            replica_batches,
            model_calls,
            model_call_seconds,
            model_tokens,
            http_requests,
            http_request_seconds,
            webhooks_received,
            webhooks_run_directly,
            webhook_deliveries,
            webhook_queue_depth,
            event_streams,
            actors_active,
            actors_hibernated,
            turns,
            turn_seconds,
            wake_seconds,
            hibernations,
            js_trims,
            js_trimmed_pages,
            trimmed_stack_pages,
            js_prefaulted_pages,
            prefaulted_pages,
            js_sandboxes,
            guest_memory_grown_bytes,
            guest_memory_budget_bytes,
            guest_memory_refused,
            state_cache_bytes,
            state_cache_budget_bytes,
            request_body_bytes,
            requests_shed,
            requests_refused,
            http_connections,
            http_connections_evicted,
            egress_response_bytes,
            egress_response_budget_bytes,
            egress_responses_refused,
            code_cache_removed_files,
            writer,
            mailbox_full,
            traps,
            guest_log_lines_dropped,
            inbox_depth,
            turns_failed_recovery,
            alarm_lag_seconds,
            alarms_failed,
        }
    }

    /// Count a forwarded request.
    pub fn cluster_forward(&self, outcome: &'static str) {
        self.cluster_forwards
            .get_or_create(&HookLabels { outcome })
            .inc();
    }

    /// Count messages the relay handed over.
    pub fn relayed(&self, n: usize) {
        self.cluster_relayed.inc_by(n as u64);
    }

    /// Count a turn.
    pub fn turn(&self, kind: &'static str, outcome: &'static str) {
        self.turns
            .get_or_create(&TurnLabels { kind, outcome })
            .inc();
    }

    /// Count a trap.
    pub fn trap(&self, reason: &'static str) {
        self.traps.get_or_create(&TrapLabels { reason }).inc();
    }

    /// The text exposition format.
    pub fn render(&self) -> String {
        let mut out = String::with_capacity(8 << 10);
        prometheus_client::encoding::text::encode(&mut out, &self.registry)
            .expect("writing to a String cannot fail");
        out
    }
}

impl Default for Metrics {
    fn default() -> Self {
        Self::new()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn process_memory_is_read_from_status() {
        let status = "Name:\tmarmot\nVmPeak:\t 9000 kB\nVmRSS:\t  51200 kB\n\
                      RssAnon:\t   40960 kB\nRssFile:\t 10240 kB\n";
        assert_eq!(memory_from_status(status), (Some(51200), Some(40960)));
        assert_eq!(memory_from_status("Name:\tx\n"), (None, None));
        // A field whose name only starts the same is not taken.
        assert_eq!(
            memory_from_status("VmRSSx:\t 1 kB\nRssAnonymous:\t 2 kB\n"),
            (None, None)
        );
    }
}
