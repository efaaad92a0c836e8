//! Node and actor-type configuration, with the defaults of PRODUCT.md §7.
//!
//! [`NodeConfig`] comes from `marmot.toml` (for `marmot serve`), flags and
//! environment variables. [`TypeConfig`] comes with each deploy and is stored
//! with the version it belongs to; unset keys fall back to the node's
//! [`TypeDefaults`].

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::time::Duration;

use serde::{Deserialize, Serialize};

mod caps;
mod cluster;
mod types;

pub use caps::{EgressConfig, FilesConfig, ModelsConfig, SecretsConfig};
pub use cluster::{ClusterConfig, WithoutBackup};
pub use types::{Budget, HTTP_METHODS, ResolvedHttp, ResolvedTypeConfig, TypeConfig, Usd};

/// Everything a node needs to start.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct NodeConfig {
    /// Address the HTTP API listens on.
    pub listen: SocketAddr,
    /// Directory holding the database (and, by default, the compiled-code
    /// cache).
    pub data_dir: PathBuf,
    /// Compiled-code cache; `<data_dir>/cache` when unset. Several nodes
    /// may share one.
    pub cache_dir: Option<PathBuf>,
    /// Bearer token required on every API call except health checks. `None`
    /// turns authentication off, which only `marmot dev` on loopback allows.
    pub admin_token: Option<String>,
    /// Limits that protect the node.
    pub limits: Limits,
    /// Defaults for per-type settings.
    pub defaults: TypeDefaults,
    /// Storage tuning.
    pub storage: StorageConfig,
    /// Crash recovery.
    pub recovery: RecoveryConfig,
    /// Alarm delivery.
    pub alarms: AlarmsConfig,
    /// Event retention and live streams.
    pub events: EventsConfig,
    /// Input requests.
    pub inputs: InputsConfig,
    /// Webhooks in and out.
    pub webhooks: WebhooksConfig,
    /// The secret store's master key.
    pub secrets: SecretsConfig,
    /// Outbound HTTP from guests (`http` capability, JavaScript `fetch`).
    pub egress: EgressConfig,
    /// Actors' files.
    pub files: FilesConfig,
    /// The model gateway (`model.chat`, the agent harness).
    pub models: ModelsConfig,
    /// Browsers and apps that call with client tokens: CORS, rate limits.
    pub clients: ClientsConfig,
    /// Several nodes sharing metadata in etcd; `None`: this node runs alone.
    pub cluster: Option<ClusterConfig>,
}

impl Default for NodeConfig {
    fn default() -> Self {
        Self {
            listen: SocketAddr::from(([127, 0, 0, 1], 7878)),
            data_dir: PathBuf::from(".marmot"),
            cache_dir: None,
            admin_token: None,
            limits: Limits::default(),
            defaults: TypeDefaults::default(),
            storage: StorageConfig::default(),
            recovery: RecoveryConfig::default(),
            alarms: AlarmsConfig::default(),
            events: EventsConfig::default(),
            inputs: InputsConfig::default(),
            webhooks: WebhooksConfig::default(),
            secrets: SecretsConfig::default(),
            egress: EgressConfig::default(),
            files: FilesConfig::default(),
            models: ModelsConfig::default(),
            clients: ClientsConfig::default(),
            cluster: None,
        }
    }
}

impl NodeConfig {
    /// Read a TOML config file; unknown keys are an error.
    pub fn from_file(path: &Path) -> anyhow::Result<Self> {
        use anyhow::Context as _;
        let text = std::fs::read_to_string(path)
            .with_context(|| format!("failed to read config file `{}`", path.display()))?;
        toml::from_str(&text).with_context(|| format!("invalid config file `{}`", path.display()))
    }

    /// A configuration for tests and benchmarks: data in `dir`, loopback on
    /// an ephemeral port, auth off.
    pub fn for_dir(dir: impl Into<PathBuf>) -> Self {
        Self {
            listen: SocketAddr::from(([127, 0, 0, 1], 0)),
            data_dir: dir.into(),
            secrets: SecretsConfig {
                generate_key: true,
                ..SecretsConfig::default()
            },
            ..Self::default()
        }
    }

    /// Check values that would make the node misbehave.
    pub fn validate(&self) -> Result<(), String> {
        let l = &self.limits;
        if l.max_active_actors == 0 {
            return Err("limits.max_active_actors must be at least 1".into());
        }
        if l.mailbox_capacity == 0 {
            return Err("limits.mailbox_capacity must be at least 1".into());
        }
        if l.max_inbox_messages == 0 {
            return Err("limits.max_inbox_messages must be at least 1".into());
        }
        if l.max_inbox_bytes < l.max_message_bytes as u64 {
            return Err(
                "limits.max_inbox_bytes must hold at least one message (limits.max_message_bytes)"
                    .into(),
            );
        }
        for (name, bytes) in [
            ("max_memory_bytes", self.defaults.max_memory_bytes),
            ("js_max_memory_bytes", self.defaults.js_max_memory_bytes),
        ] {
            if bytes > l.max_guest_memory_bytes {
                return Err(format!(
                    "defaults.{name} ({bytes}) exceeds limits.max_guest_memory_bytes ({})",
                    l.max_guest_memory_bytes
                ));
            }
        }
        // As a type's own config is checked (`TypeConfig::validate`): a 0
        // here was taken, and every turn then failed.
        for (name, v) in [
            ("idle_timeout_ms", self.defaults.idle_timeout_ms),
            ("turn_timeout_ms", self.defaults.turn_timeout_ms),
            ("cpu_slice_ms", self.defaults.cpu_slice_ms),
        ] {
            if v == 0 {
                return Err(format!("defaults.{name} must be greater than 0"));
            }
        }
        // As a type's are bounded: past them a value was taken and cut to
        // the bound without a word.
        const DAY_MS: u64 = 86_400_000;
        for (name, v, most) in [
            (
                "defaults.idle_timeout_ms",
                self.defaults.idle_timeout_ms,
                7 * DAY_MS,
            ),
            (
                "defaults.turn_timeout_ms",
                self.defaults.turn_timeout_ms,
                DAY_MS,
            ),
            ("defaults.cpu_slice_ms", self.defaults.cpu_slice_ms, DAY_MS),
            // An expiry added to the time wrapped around, and the records
            // it keeps expired at once: repeats ran again (found by a
            // probe).
            (
                "limits.idempotency_ttl_ms",
                l.idempotency_ttl_ms,
                365 * DAY_MS,
            ),
            (
                "webhooks.dedupe_ttl_ms",
                self.webhooks.dedupe_ttl_ms,
                365 * DAY_MS,
            ),
        ] {
            if v > most {
                return Err(format!("{name} may be at most {most} ({v} given)"));
            }
        }
        // Sizes of queues made up front: past these a node started, said
        // it listened, and failed every call (a semaphore's permits) or
        // aborted (a batch's capacity): a re-probe.
        for (name, v) in [
            ("limits.mailbox_capacity", l.mailbox_capacity),
            ("storage.max_batch", self.storage.max_batch),
        ] {
            if v > 1_000_000 {
                return Err(format!("{name} may be at most 1000000 ({v} given)"));
            }
        }
        if l.max_connections == Some(0) {
            return Err("limits.max_connections must be at least 1 (or left out)".into());
        }
        if l.max_message_bytes == 0 {
            return Err("limits.max_message_bytes must be at least 1".into());
        }
        for (name, bytes, least) in [
            (
                "max_memory_bytes",
                self.defaults.max_memory_bytes,
                1u64 << 20,
            ),
            // The JavaScript engine needs about 1.7 MB to start (a node
            // whose guests may not have that runs no JavaScript).
            (
                "js_max_memory_bytes",
                self.defaults.js_max_memory_bytes,
                (2 << 20).min(l.max_guest_memory_bytes),
            ),
        ] {
            if bytes < least {
                return Err(format!("defaults.{name} must be at least {least} bytes"));
            }
        }
        for (name, v) in [
            ("egress.timeout_ms", self.egress.timeout_ms),
            ("egress.max_timeout_ms", self.egress.max_timeout_ms),
            ("egress.connect_timeout_ms", self.egress.connect_timeout_ms),
            ("models.timeout_ms", self.models.timeout_ms),
            ("limits.body_timeout_ms", l.body_timeout_ms),
            ("limits.eval_cpu_ms", l.eval_cpu_ms),
            ("limits.eval_timeout_ms", l.eval_timeout_ms),
            ("limits.actor_call_timeout_ms", l.actor_call_timeout_ms),
            ("limits.guest_log_bytes_per_s", l.guest_log_bytes_per_s),
            ("webhooks.timeout_ms", self.webhooks.timeout_ms),
            (
                "webhooks.connect_timeout_ms",
                self.webhooks.connect_timeout_ms,
            ),
            ("files.max_file_bytes", self.files.max_file_bytes as u64),
            ("storage.max_batch", self.storage.max_batch as u64),
        ] {
            if v == 0 {
                return Err(format!("{name} must be greater than 0"));
            }
        }
        // Checked here too (the egress layer parses them again), so that a
        // bad entry is refused before the data directory is made.
        for (name, list) in [
            ("egress.allow_private", &self.egress.allow_private),
            ("models.allow_private", &self.models.allow_private),
        ] {
            if let Some(bad) = list.iter().find(|a| !is_address_or_range(a)) {
                return Err(format!("{name}: `{bad}` is not an address or CIDR range"));
            }
        }
        if l.guest_memory_budget_bytes.is_some_and(|b| b < 1 << 20) {
            return Err("limits.guest_memory_budget_bytes must be at least 1 MiB (1048576)".into());
        }
        self.clients.validate()?;
        if let Some(c) = &self.cluster {
            c.validate()?;
        }
        if self.models.max_attempts == 0 {
            return Err("models.max_attempts must be at least 1".into());
        }
        self.alarms.validate()?;
        if self.inputs.max_settled_per_actor == 0 {
            return Err(
                "inputs.max_settled_per_actor must be at least 1 (a second answer to a \
                        request just settled must find it)"
                    .into(),
            );
        }
        if self.recovery.max_attempts == 0 {
            return Err("recovery.max_attempts must be at least 1".into());
        }
        if let Some(t) = &self.admin_token {
            if t.len() < 16 {
                return Err("admin token must be at least 16 characters".into());
            }
            // It travels in an `Authorization` header: a character that is
            // not visible ASCII (or a leading or trailing space, which a
            // header loses) made a token no request could present.
            if !t.bytes().all(|b| b.is_ascii_graphic() || b == b' ') || t.trim() != t {
                return Err(
                    "admin token must be visible ASCII characters (no accents, no \
                            leading or trailing spaces): it is sent in an HTTP header"
                        .into(),
                );
            }
        }
        Ok(())
    }
}

/// Node-wide limits.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct Limits {
    /// Active (awake) actors; beyond it the least recently used hibernate.
    /// Lowered at start-up (with a warning) when the host's
    /// `vm.max_map_count` or memory cannot hold an instance for each.
    pub max_active_actors: usize,
    /// Messages queued per actor before senders get 429.
    pub mailbox_capacity: usize,
    /// Durable messages (`?wait=false`, webhooks, relayed sends) queued
    /// per actor before senders get 429 `inbox_full`.
    pub max_inbox_messages: u64,
    /// Bytes of durable message bodies queued per actor before senders
    /// get 429 `inbox_full`.
    pub max_inbox_bytes: u64,
    /// JavaScript sandboxes live at once: active JavaScript actors plus
    /// running evals (at least 16). Unset: as many as half of the host's
    /// memory holds at ~640 KB each, up to the instance pool. When they are
    /// all in use, the least recently used idle JavaScript actors hibernate
    /// to make room.
    pub max_js_sandboxes: Option<u32>,
    /// Largest message body.
    pub max_message_bytes: usize,
    /// Largest deployable code.
    pub max_code_bytes: usize,
    /// Largest state value.
    pub max_value_bytes: usize,
    /// Largest total state of one actor.
    pub max_state_bytes: u64,
    /// Largest event payload.
    pub max_event_bytes: usize,
    /// Events kept per actor; older ones are trimmed.
    pub max_events_per_actor: u64,
    /// How long idempotency records are kept.
    pub idempotency_ttl_ms: u64,
    /// Upper bound for any type's `max_memory_bytes`; sizes the instance pool.
    pub max_guest_memory_bytes: u64,
    /// Memory all live guests together may grow past the size they start
    /// with (the node's bound, on top of each type's `max_memory_bytes`).
    /// A turn whose growth does not fit traps, changes nothing and gets
    /// 503 `overloaded`; idle actors holding grown memory hibernate to give
    /// it back. Unset: a third of the host's memory, or of its cgroup's
    /// limit when lower.
    pub guest_memory_budget_bytes: Option<u64>,
    /// What the active actors' state caches may hold together (each holds
    /// up to 8 MiB of values its turns read or wrote). Past it, actors keep
    /// only entries not yet durable and read the rest from disk again.
    /// Unset: an eighth of the host's memory, or of its cgroup's limit.
    pub state_cache_budget_bytes: Option<u64>,
    /// Request bodies the node holds at once, from reading each until its
    /// response (in mailboxes, queued behind earlier messages), charged as
    /// they arrive. A request whose declared body does not fit what is
    /// left gets 503 `overloaded` at once; one that stops fitting as it
    /// arrives, then. Unset: a sixteenth of the host's memory, or of its
    /// cgroup's limit.
    pub request_body_budget_bytes: Option<u64>,
    /// How long a request body may take to arrive, plus a second per
    /// 64 KiB of the largest body its route takes (a message: 16 s more);
    /// 408 `body_timeout` after that.
    pub body_timeout_ms: u64,
    /// Outbound response bodies the node buffers at once (guests'
    /// `http.fetch`, model calls that do not stream), from the first byte
    /// read until the body is handed on. A body of known length waits for
    /// room within its request's timeout; one of unknown length that does
    /// not fit fails at once. Unset: a sixteenth of the host's memory, or
    /// of its cgroup's limit.
    pub egress_response_budget_bytes: Option<u64>,
    /// Open client connections at most; at the cap the node stops
    /// accepting and new ones wait in the kernel's backlog. Unset: what a
    /// sixteenth of the host's memory (or its cgroup's limit) holds at
    /// 64 KiB per connection (1,024 per GiB).
    pub max_connections: Option<usize>,
    /// Log lines a turn may write (guest `log` and stdout/stderr).
    pub max_log_lines_per_turn: u32,
    /// Largest log line kept; longer ones are cut.
    pub max_log_line_bytes: usize,
    /// Guest log bytes each type may write per second, over all its
    /// actors and turns (bursts up to 16 s worth); past it lines are
    /// dropped and counted.
    pub guest_log_bytes_per_s: u64,
    /// CPU an eval script may use (`POST …/eval`).
    pub eval_cpu_ms: u64,
    /// Memory of an eval sandbox.
    pub eval_memory_bytes: u64,
    /// Wall-clock limit of an eval (timers and host calls included).
    pub eval_timeout_ms: u64,
    /// How long `actors.call` waits for the other actor's reply (bounds the
    /// wait when two actors call each other from different chains).
    pub actor_call_timeout_ms: u64,
}

impl Limits {
    /// The sandbox settings of `POST …/eval`.
    pub fn eval_config(&self) -> ResolvedTypeConfig {
        ResolvedTypeConfig {
            idle_timeout: Duration::from_secs(0),
            turn_timeout: Duration::from_millis(self.eval_timeout_ms),
            cpu_slice: Duration::from_millis(self.eval_cpu_ms),
            cpu_slice_is_total: true,
            max_memory_bytes: self.eval_memory_bytes.min(self.max_guest_memory_bytes),
            env: Default::default(),
            budget: None,
            http: Default::default(),
        }
    }
}

impl Default for Limits {
    fn default() -> Self {
        Self {
            max_active_actors: 10_000,
            mailbox_capacity: 1024,
            max_inbox_messages: 10_000,
            max_inbox_bytes: 256 << 20,
            max_js_sandboxes: None,
            max_message_bytes: 1 << 20,
            max_code_bytes: 64 << 20,
            max_value_bytes: 1 << 20,
            max_state_bytes: 1 << 30,
            max_event_bytes: 256 << 10,
            max_events_per_actor: 10_000,
            idempotency_ttl_ms: 24 * 3600 * 1000,
            max_guest_memory_bytes: 64 << 20,
            guest_memory_budget_bytes: None,
            state_cache_budget_bytes: None,
            request_body_budget_bytes: None,
            body_timeout_ms: 30_000,
            egress_response_budget_bytes: None,
            max_connections: None,
            max_log_lines_per_turn: 1000,
            max_log_line_bytes: 8 << 10,
            guest_log_bytes_per_s: 256 << 10,
            eval_cpu_ms: 2_000,
            eval_memory_bytes: 32 << 20,
            eval_timeout_ms: 30_000,
            actor_call_timeout_ms: 30_000,
        }
    }
}

/// Defaults for settings a type may override.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct TypeDefaults {
    /// Hibernate after this long without work.
    pub idle_timeout_ms: u64,
    /// Wall-clock limit of one turn.
    pub turn_timeout_ms: u64,
    /// CPU a guest may burn without calling the host.
    pub cpu_slice_ms: u64,
    /// Guest linear memory.
    pub max_memory_bytes: u64,
    /// Linear memory of JavaScript actors (the QuickJS heap lives in it).
    pub js_max_memory_bytes: u64,
}

impl Default for TypeDefaults {
    fn default() -> Self {
        Self {
            idle_timeout_ms: 30_000,
            turn_timeout_ms: 15 * 60 * 1000,
            cpu_slice_ms: 10_000,
            max_memory_bytes: 64 << 20,
            js_max_memory_bytes: 32 << 20,
        }
    }
}

/// Storage tuning.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct StorageConfig {
    /// redb page cache.
    pub cache_bytes: usize,
    /// Most write operations folded into one commit.
    pub max_batch: usize,
    /// Save allocator state with every commit so that opening after a crash
    /// is instant instead of a full repair scan (slower commits).
    pub quick_repair: bool,
    /// Size of each of the two journal files beside the database
    /// (`marmot.redb-journal-0` and `-1`, preallocated): a commit is one
    /// sequential write and one `fdatasync` of a journal file, and the
    /// database file is synced in the background, a journal at a time.
    /// 0 turns the journal off: every commit then syncs the database file.
    pub journal_bytes: u64,
}

impl Default for StorageConfig {
    fn default() -> Self {
        Self {
            cache_bytes: 64 << 20,
            max_batch: 4096,
            quick_repair: false,
            journal_bytes: 16 << 20,
        }
    }
}

/// Crash recovery.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct RecoveryConfig {
    /// Recovery runs of one durable message before it is given up with a
    /// `turn_failed` event.
    pub max_attempts: u32,
    /// Actors recovered at once after a restart.
    pub concurrency: usize,
    /// Longest a restart says not ready while it re-runs the durable
    /// messages it found; past it the node is ready and recovery goes on
    /// (one interrupted 45 s turn held readiness 45 s; 10,000 interrupted
    /// 8 s turns would have held it ~21 minutes).
    pub ready_within_ms: u64,
}

impl Default for RecoveryConfig {
    fn default() -> Self {
        Self {
            max_attempts: 3,
            concurrency: 64,
            ready_within_ms: 10_000,
        }
    }
}

/// Alarm delivery.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct AlarmsConfig {
    /// Pending alarms per actor.
    pub max_per_actor: usize,
    /// Deliveries of one occurrence before it is given up with an
    /// `alarm_failed` event.
    pub max_attempts: u32,
    /// First retry delay; doubles per attempt, with jitter.
    pub retry_base_ms: u64,
    /// Alarm turns running at once (spreads wake-ups after a restart, and
    /// keeps a burst of due alarms from crowding out requests); their
    /// commits are awaited apart.
    pub concurrency: usize,
    /// How often the scheduler reads the due index again. Alarms set on
    /// this node reach it at once; the reads find the rest: alarms of
    /// actors this node keeps as a backup (fired once it owns them) and
    /// deliveries that went wrong.
    pub reload_ms: u64,
    /// Most rows of the due index the scheduler holds in memory at once. A
    /// larger backlog (overdue alarms after a long stop) is read a piece
    /// at a time, the next as soon as most of the last has gone out.
    pub reload_batch: usize,
}

impl AlarmsConfig {
    /// The longest [`Self::reload_ms`]: the scheduler holds alarms due
    /// within a minute of a read, and one due past that waits for the
    /// next read (with a longer interval, alarms fired late by up to the
    /// difference, silently).
    pub const MAX_RELOAD_MS: u64 = 30_000;

    fn validate(&self) -> Result<(), String> {
        if self.reload_ms == 0 || self.reload_ms > Self::MAX_RELOAD_MS {
            return Err(format!(
                "alarms.reload_ms must be between 1 and {} (alarms due past a minute from a \
                 read wait for the next one)",
                Self::MAX_RELOAD_MS
            ));
        }
        for (name, v) in [
            ("concurrency", self.concurrency),
            ("reload_batch", self.reload_batch),
        ] {
            if v == 0 {
                return Err(format!("alarms.{name} must be at least 1"));
            }
        }
        Ok(())
    }
}

impl Default for AlarmsConfig {
    fn default() -> Self {
        Self {
            max_per_actor: 1000,
            max_attempts: 5,
            retry_base_ms: 1000,
            concurrency: 16,
            reload_ms: 20_000,
            reload_batch: 200_000,
        }
    }
}

/// Browsers and apps that talk to their own actors with client tokens
/// (`POST /v1/tokens`).
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct ClientsConfig {
    /// Origins a browser may call the API from (CORS), as the browser
    /// sends them (`https://app.example.com`), or `"*"` for any. Empty: no
    /// CORS headers, so browsers on other origins cannot call.
    pub cors_origins: Vec<String>,
    /// Requests per second one client token may make, sustained (0: no
    /// limit); beyond it 429 with `Retry-After`.
    pub token_rate_per_s: u32,
    /// Requests one client token may make at once above its rate.
    pub token_burst: u32,
    /// Requests per second all client tokens together may make to one
    /// actor (0: no limit). Admin-token requests are not limited.
    pub actor_rate_per_s: u32,
    /// Requests to one actor at once above its rate.
    pub actor_burst: u32,
}

impl Default for ClientsConfig {
    fn default() -> Self {
        Self {
            cors_origins: Vec::new(),
            token_rate_per_s: 20,
            token_burst: 40,
            actor_rate_per_s: 50,
            actor_burst: 100,
        }
    }
}

impl ClientsConfig {
    fn validate(&self) -> Result<(), String> {
        for o in &self.cors_origins {
            let host = o
                .strip_prefix("https://")
                .or_else(|| o.strip_prefix("http://"));
            let ok = o == "*"
                || host.is_some_and(|h| {
                    !h.is_empty()
                        && h.bytes()
                            .all(|b| b.is_ascii_alphanumeric() || b"-.:[]".contains(&b))
                });
            if !ok {
                return Err(format!(
                    "clients.cors_origins: `{o}` is not an origin like `https://app.example.com` (scheme and host, no path) or `*`"
                ));
            }
        }
        for (burst, name, rate) in [
            (self.token_burst, "token_burst", self.token_rate_per_s),
            (self.actor_burst, "actor_burst", self.actor_rate_per_s),
        ] {
            if rate > 0 && burst == 0 {
                return Err(format!(
                    "clients.{name} must be at least 1 when its rate is set"
                ));
            }
        }
        Ok(())
    }
}

/// Event retention and live (SSE) event streams.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct EventsConfig {
    /// Events older than this are hidden at once and deleted by a sweep (or
    /// the actor's next commit); 0 keeps them until the count limit
    /// (`limits.max_events_per_actor`) pushes them out.
    pub max_age_ms: u64,
    /// Open event streams per node; more get 503.
    pub max_streams: usize,
    /// Open event streams one client token may hold (on one node); more
    /// get 429.
    pub max_streams_per_token: usize,
    /// Interval of the comment lines that keep idle streams open.
    pub heartbeat_ms: u64,
}

impl EventsConfig {
    /// Events written before this time (ms since the epoch) are past
    /// retention by age at `now_ms` (0: no age limit).
    pub fn cutoff_ms(&self, now_ms: u64) -> u64 {
        match self.max_age_ms {
            0 => 0,
            age => now_ms.saturating_sub(age),
        }
    }
}

impl Default for EventsConfig {
    fn default() -> Self {
        Self {
            max_age_ms: 0,
            max_streams: 10_000,
            max_streams_per_token: 16,
            heartbeat_ms: 15_000,
        }
    }
}

/// Input requests.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct InputsConfig {
    /// Pending input requests per actor.
    pub max_pending_per_actor: u64,
    /// Answered, expired and cancelled requests are kept this long
    /// (answering one again is a 409 meanwhile, a 404 after).
    pub settled_ttl_ms: u64,
    /// And at most this many per actor (at least 1), the oldest settled
    /// pruned first: an actor that asks all day keeps a bounded history.
    pub max_settled_per_actor: u64,
}

impl Default for InputsConfig {
    fn default() -> Self {
        Self {
            max_pending_per_actor: 100,
            settled_ttl_ms: 7 * 24 * 3600 * 1000,
            max_settled_per_actor: 1000,
        }
    }
}

/// Webhooks in and out.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct WebhooksConfig {
    /// Inbound: how far a `webhook-timestamp` may be from the node's clock.
    pub tolerance_s: u64,
    /// Inbound: how long a delivery id is remembered to drop duplicates
    /// (senders retry for days).
    pub dedupe_ttl_ms: u64,
    /// Outbound: first retry delay; doubles per attempt up to
    /// `retry_max_delay_ms`, plus up to 25 % jitter. The environment
    /// variable `MARMOT_WEBHOOK_RETRY_BASE_MS` overrides it (tests, demos).
    pub retry_base_ms: u64,
    /// Outbound: longest delay between attempts.
    pub retry_max_delay_ms: u64,
    /// Outbound: attempts before a delivery is dead (the defaults span more
    /// than 24 hours).
    pub max_attempts: u32,
    /// Outbound: deliveries in flight at once.
    pub concurrency: usize,
    /// Outbound: deliveries of one subscription in flight to one host at
    /// once (one while its last attempt failed; such destinations share
    /// half of `concurrency`).
    pub per_destination: usize,
    /// Outbound: whole-request timeout.
    pub timeout_ms: u64,
    /// Outbound: connect timeout.
    pub connect_timeout_ms: u64,
    /// Outbound: how long after its event a dead delivery stays in the
    /// dead-letter list (replayable) before it is removed; 0 keeps them
    /// for ever. A subscription whose receiver is gone for good would
    /// otherwise keep every event's body on disk.
    pub dead_retention_ms: u64,
}

impl Default for WebhooksConfig {
    fn default() -> Self {
        Self {
            tolerance_s: 300,
            dedupe_ttl_ms: 7 * 24 * 3600 * 1000,
            retry_base_ms: 5_000,
            retry_max_delay_ms: 3 * 3600 * 1000,
            max_attempts: 20,
            concurrency: 64,
            per_destination: 4,
            timeout_ms: 15_000,
            connect_timeout_ms: 5_000,
            dead_retention_ms: 30 * 24 * 3600 * 1000,
        }
    }
}

/// Whether `s` is an IP address, or one with a prefix length that fits it
/// (`10.0.0.0/8`, `fd00::/8`).
fn is_address_or_range(s: &str) -> bool {
    let (addr, len) = match s.split_once('/') {
        Some((a, l)) => (a, Some(l)),
        None => (s, None),
    };
    let Ok(addr) = addr.parse::<std::net::IpAddr>() else {
        return false;
    };
    let max = if addr.is_ipv4() { 32 } else { 128 };
    len.is_none_or(|l| l.parse::<u8>().is_ok_and(|l| l <= max))
}

/// Configuration files: any text is a config or an error, never a panic.
#[cfg(test)]
mod props {
    use proptest::prelude::*;

    use super::*;

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(1000))]

        #[test]
        fn arbitrary_config_text_never_panics(
            text in prop_oneof![
                ".{0,200}",
                "(\\[(limits|defaults|clients|egress|webhooks|events)\\]\n)?([a-z_]{1,24} = (-?[0-9]{1,20}|\"[^\"\n]{0,20}\"|\\[\"[^\"\n]{0,20}\"\\]|true)\n){0,5}",
            ],
        ) {
            if let Ok(c) = toml::from_str::<NodeConfig>(&text) {
                let _ = c.validate();
            }
        }

        /// Real keys of real sections with values of any shape: parsing
        /// and validating them reaches the checks of each field, and a
        /// refusal names one of the fields set.
        #[test]
        fn real_keys_with_any_values_are_accepted_or_refused_by_name(
            entries in prop::collection::vec(
                (
                    prop::sample::select(numeric_keys()),
                    prop_oneof![
                        Just("0".to_owned()),
                        Just("1".to_owned()),
                        Just("-1".to_owned()),
                        Just("18446744073709551615".to_owned()),
                        (0u64..100_000_000).prop_map(|n| n.to_string()),
                    ],
                ),
                1..4,
            ),
        ) {
            let mut text = String::new();
            let mut names = Vec::new();
            for ((section, key), value) in &entries {
                text.push_str(&format!("[{section}]\n{key} = {value}\n"));
                names.push(format!("{section}.{key}"));
            }
            // A section twice, or a value out of a field's type's range,
            // is a parse error; that is an answer too.
            let Ok(c) = toml::from_str::<NodeConfig>(&text) else {
                return Ok(());
            };
            if let Err(e) = c.validate() {
                prop_assert!(
                    names.iter().any(|n| e.contains(n.as_str())),
                    "{e:?} names none of {names:?}"
                );
            }
        }
    }

    /// `(section, key)` of every numeric setting a default config has.
    fn numeric_keys() -> Vec<(String, String)> {
        let table = toml::Table::try_from(NodeConfig::default()).unwrap();
        let mut keys = Vec::new();
        for (section, v) in &table {
            let Some(fields) = v.as_table() else { continue };
            for (key, v) in fields {
                if v.is_integer() {
                    keys.push((section.clone(), key.clone()));
                }
            }
        }
        assert!(keys.len() > 20, "{keys:?}");
        keys
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_guest_memory_budget_under_a_mebibyte_is_refused() {
        let parse = |text: &str| toml::from_str::<NodeConfig>(text).unwrap().validate();
        let err = parse("[limits]\nguest_memory_budget_bytes = 1000\n").unwrap_err();
        assert!(
            err.contains("limits.guest_memory_budget_bytes must be at least 1 MiB"),
            "{err}"
        );
        assert_eq!(
            parse("[limits]\nguest_memory_budget_bytes = 1048576\n"),
            Ok(())
        );
        assert_eq!(parse(""), Ok(()), "unset: derived from the host's memory");
    }

    /// Settings no node can work with are refused at start, naming them:
    /// they were taken silently (an alarm fired 52 s late with
    /// `reload_ms = 120000`; a token with an accent matched no request).
    #[test]
    fn unworkable_alarm_settings_and_admin_tokens_are_refused() {
        let parse = |text: &str| toml::from_str::<NodeConfig>(text).unwrap().validate();
        for (text, named) in [
            ("[alarms]\nreload_ms = 120000\n", "alarms.reload_ms"),
            ("[alarms]\nreload_ms = 0\n", "alarms.reload_ms"),
            ("[alarms]\nconcurrency = 0\n", "alarms.concurrency"),
            ("[alarms]\nreload_batch = 0\n", "alarms.reload_batch"),
            (
                "[inputs]\nmax_settled_per_actor = 0\n",
                "inputs.max_settled_per_actor",
            ),
            (
                "[defaults]\nturn_timeout_ms = 0\n",
                "defaults.turn_timeout_ms",
            ),
            ("[defaults]\ncpu_slice_ms = 0\n", "defaults.cpu_slice_ms"),
            (
                "[defaults]\nmax_memory_bytes = 0\n",
                "defaults.max_memory_bytes",
            ),
            (
                "[defaults]\njs_max_memory_bytes = 1048576\n",
                "defaults.js_max_memory_bytes",
            ),
            ("[egress]\ntimeout_ms = 0\n", "egress.timeout_ms"),
            ("[egress]\nmax_timeout_ms = 0\n", "egress.max_timeout_ms"),
            ("[models]\ntimeout_ms = 0\n", "models.timeout_ms"),
            ("[limits]\neval_cpu_ms = 0\n", "limits.eval_cpu_ms"),
            (
                "[egress]\nallow_private = [\"10.0.0.0/33\"]\n",
                "egress.allow_private",
            ),
            (
                "[models]\nallow_private = [\"not a range\"]\n",
                "models.allow_private",
            ),
            ("[webhooks]\ntimeout_ms = 0\n", "webhooks.timeout_ms"),
            (
                "[limits]\nmax_inbox_messages = 0\n",
                "limits.max_inbox_messages",
            ),
            (
                "[limits]\nmax_inbox_bytes = 1000\n",
                "limits.max_inbox_bytes",
            ),
            ("[files]\nmax_file_bytes = 0\n", "files.max_file_bytes"),
            ("[storage]\nmax_batch = 0\n", "storage.max_batch"),
            (
                "[limits]\nidempotency_ttl_ms = 18446744073709551615\n",
                "limits.idempotency_ttl_ms may be at most",
            ),
            (
                "[webhooks]\ndedupe_ttl_ms = 18446744073709551615\n",
                "webhooks.dedupe_ttl_ms may be at most",
            ),
            (
                "[defaults]\nidle_timeout_ms = 18446744073709551615\n",
                "defaults.idle_timeout_ms may be at most",
            ),
            ("[limits]\nmax_connections = 0\n", "limits.max_connections"),
            (
                "[limits]\nmailbox_capacity = 2305843009213693952\n",
                "limits.mailbox_capacity may be at most",
            ),
            (
                "[storage]\nmax_batch = 18446744073709551615\n",
                "storage.max_batch may be at most",
            ),
            (
                "[limits]\nmax_message_bytes = 0\n",
                "limits.max_message_bytes",
            ),
            (
                "admin_token = \"pässwörd-long-enough-1\"\n",
                "visible ASCII",
            ),
            (
                "admin_token = \" leading-space-long-enough\"\n",
                "visible ASCII",
            ),
        ] {
            let err = parse(text).unwrap_err();
            assert!(err.contains(named), "{text}: {err}");
        }
        assert_eq!(parse("[alarms]\nreload_ms = 30000\n"), Ok(()));
        // No guest alarms at all is a setting, not a mistake.
        assert_eq!(parse("[alarms]\nmax_per_actor = 0\n"), Ok(()));
        assert_eq!(parse("admin_token = \"a token with spaces 123\"\n"), Ok(()));
    }
}
