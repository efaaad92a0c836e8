//! Every table Marmot keeps in redb, and every record stored in them.
//!
//! This module (this file, with the records of `replica.rs` and
//! `webhooks.rs`) is the single declaration of the on-disk format. Changing a
//! table's key or value type, or the meaning of a record field, requires a
//! new [`FORMAT_VERSION`]; [`check_format`] refuses to open files written in
//! another version rather than misreading them.
//!
//! Records are encoded with `postcard` (compact, deterministic, stable across
//! platforms). New record fields may only be appended with `#[serde(default)]`
//! semantics *and* a format bump, because postcard is not self-describing.
//! Each bump comes with a migration from the previous format, run once when
//! an older data directory is opened ([`check_format`]).
//!
//! History: 1 — first format; 2 — inbox rows carry their kind (message or
//! webhook); 3 — actors' files (`files`, `file_usage`, `type_file_usage`,
//! `blob_refs`), and no binary of format 2 may open a file that has them;
//! 4 — outbox rows carry the emitting turn's `traceparent`; 5 — messages
//! sent in a cluster wait in `relay` (a format-4 binary would ignore them),
//! and `replica_lsn` marks where each slot's replication stands; 6 —
//! outbox and relay rows are found by their public ids (`outbox_ids`,
//! `relay_ids`: a slot's backup keeps copies of them under its own seqs)
//! and relay rows name their sender; 7 — idempotency records keep the
//! SHA-256 of the body that took the key; 8 — input requests are indexed
//! by status (`inputs_by_settled`); 9 — outbox rows' heads are kept apart
//! from their payloads (`outbox_heads`).
//! Tables added within a version (`providers`, `actor_usage`, `type_usage`)
//! are created when a file of
//! that version without them is opened.
//!
//! Actors are interned: `(type, id)` maps to a compact `u64` actor number at
//! first use, so hot per-actor keys (`state`, `events`, …) stay small and
//! ordered by actor.

use marmot_core::config::TypeConfig;
use redb::{ReadableDatabase, ReadableTable, TableDefinition, TableHandle};
use serde::{Deserialize, Serialize, de::DeserializeOwned};

mod replica;
mod upgrade;
mod webhooks;

pub use replica::*;
pub use webhooks::*;

pub use upgrade::{FormatError, check_format};

/// Version of the on-disk format described in this file.
pub const FORMAT_VERSION: u32 = 9;

/// Node-wide settings: `format_version` (u32 LE), and [`DISK_PROBE_KEY`].
pub const META: TableDefinition<'_, &str, &[u8]> = TableDefinition::new("meta");

/// In [`META`]: when the writer last probed a failing disk (u64 LE ms). A
/// real write, so that its commit succeeding means writes work again.
pub const DISK_PROBE_KEY: &str = "disk_probe";

/// In [`META`]: this database's identity (32 hex digits, UTF-8), made the
/// first time a node joins a cluster with it and never changed; a backup
/// and a restore remove it, so a copy is a new store. A cluster node joins with it: one whose
/// store is not the one it joined with before holds none (or old copies)
/// of its slots' data (docs/design.md, "A node back with another disk").
pub const STORE_ID_KEY: &str = "store_id";

/// Actor types: name → [`TypeRecord`] as JSON, not postcard: its
/// [`TypeConfig`] skips empty fields when serialized, which a format that
/// is not self-describing cannot read back.
pub const TYPES: TableDefinition<'_, &str, &[u8]> = TableDefinition::new("types");

/// Deployed code: (type, version) → the component or module bytes.
pub const CODE: TableDefinition<'_, (&str, u32), &[u8]> = TableDefinition::new("code");

/// Actors: (type, id) → [`ActorRecord`].
pub const ACTORS: TableDefinition<'_, (&str, &str), &[u8]> = TableDefinition::new("actors");

/// Reverse of [`ACTORS`]: actor number → (type, id).
pub const ACTOR_KEYS: TableDefinition<'_, u64, (&str, &str)> = TableDefinition::new("actor_keys");

/// Actor state: (actor, key) → value bytes.
pub const STATE: TableDefinition<'_, (u64, &str), &[u8]> = TableDefinition::new("state");

/// Event log: (actor, seq) → [`EventRecord`]. Seqs start at 1 per actor.
pub const EVENTS: TableDefinition<'_, (u64, u64), &[u8]> = TableDefinition::new("events");

/// Idempotency records: (actor, key) → [`IdemRecord`].
pub const IDEMPOTENCY: TableDefinition<'_, (u64, &str), &[u8]> =
    TableDefinition::new("idempotency");

/// Expiry index for [`IDEMPOTENCY`]: (expires_at_ms, actor, key) → ().
pub const IDEM_EXPIRY: TableDefinition<'_, (u64, u64, &str), ()> =
    TableDefinition::new("idempotency_expiry");

/// Alarms: (actor, name) → [`AlarmRecord`].
pub const ALARMS: TableDefinition<'_, (u64, &str), &[u8]> = TableDefinition::new("alarms");

/// Due index for [`ALARMS`]: (next_due_ms, actor, name) → (). The scheduler
/// reads only the near future from it.
pub const ALARM_DUE: TableDefinition<'_, (u64, u64, &str), ()> = TableDefinition::new("alarm_due");

/// Input requests: (actor, input id) → [`InputRecord`]. Settled ones stay a
/// while so that answering twice is a clear 409.
pub const INPUTS: TableDefinition<'_, (u64, &str), &[u8]> = TableDefinition::new("inputs");

/// [`INPUTS`] by status: (actor, when the request settled — 0 while it is
/// pending, input id) → (). An actor's pending requests are the range at
/// 0, its settled ones follow oldest first: counting the pending and
/// pruning the settled read keys, not every record. (Format 8.)
pub const INPUTS_BY_SETTLED: TableDefinition<'_, (u64, u64, &str), ()> =
    TableDefinition::new("inputs_by_settled");

/// Outbound webhook subscriptions: name → [`SubscriptionRecord`].
pub const SUBSCRIPTIONS: TableDefinition<'_, &str, &[u8]> = TableDefinition::new("subscriptions");

/// Outbound webhook deliveries not yet delivered: seq → [`DeliveryRecord`].
/// Rows are written by the commit of the turn that emitted the event, and
/// deleted once delivered; dead ones stay (the dead-letter list).
pub const OUTBOX: TableDefinition<'_, u64, &[u8]> = TableDefinition::new("outbox");

/// Due index for pending [`OUTBOX`] rows: (next attempt ms, seq) → ().
pub const OUTBOX_DUE: TableDefinition<'_, (u64, u64), ()> = TableDefinition::new("outbox_due");

/// The [`DeliveryHead`] of every [`OUTBOX`] row: seq → head (postcard).
/// What the delivery worker reads to choose the due rows it starts, and
/// what moves and subscription deletes read to find an actor's or a
/// subscription's rows, without reading each row's payload (up to
/// `limits.max_event_bytes`): walking 1,000 rows of 100 KB that a hanging
/// receiver kept due read 100 MB per wake-up. A row's head never changes
/// while it has its seq. (Format 9.)
pub const OUTBOX_HEADS: TableDefinition<'_, u64, &[u8]> = TableDefinition::new("outbox_heads");

/// [`OUTBOX`] rows by their `webhook-id` → seq. Seqs are each node's own;
/// the id is the same on every node that keeps a copy of the row (the
/// owner of the emitting actor's slot, and its backup). (Format 6.)
pub const OUTBOX_IDS: TableDefinition<'_, &str, u64> = TableDefinition::new("outbox_ids");

/// The secret store, by name: [`SecretRecord`] (postcard). Values are
/// sealed under the node's master key; nothing here is plaintext.
pub const SECRETS: TableDefinition<'_, &str, &[u8]> = TableDefinition::new("secrets");

/// Model providers, by name: [`ProviderRecord`].
pub const PROVIDERS: TableDefinition<'_, &str, &[u8]> = TableDefinition::new("providers");

/// Revoked client tokens: token id (`jti`) → when the token expires (ms);
/// a row is useless after that and is dropped by a later revocation.
pub const REVOKED_TOKENS: TableDefinition<'_, &str, u64> = TableDefinition::new("revoked_tokens");

/// Model usage per actor: actor → [`UsageRecord`], added to by the commit
/// of each turn that called a model (or, for a failed turn, a commit of
/// its usage alone).
pub const ACTOR_USAGE: TableDefinition<'_, u64, &[u8]> = TableDefinition::new("actor_usage");

/// Model usage per type: type → [`UsageRecord`], in step with
/// [`ACTOR_USAGE`]; deleting an actor does not refund its type.
pub const TYPE_USAGE: TableDefinition<'_, &str, &[u8]> = TableDefinition::new("type_usage");

/// Actors' files: (actor, path) → [`FileRecord`]. Paths are relative and
/// `/`-separated, so one actor's files under a prefix are a range.
pub const FILES: TableDefinition<'_, (u64, &str), &[u8]> = TableDefinition::new("files");

/// Files per actor: actor → [`FileUsage`], kept in step with `files`.
pub const FILE_USAGE: TableDefinition<'_, u64, &[u8]> = TableDefinition::new("file_usage");

/// Bytes of files per type (its quota): type → u64 (LE).
pub const TYPE_FILE_USAGE: TableDefinition<'_, &str, u64> = TableDefinition::new("type_file_usage");

/// References to each blob: SHA-256 → count. A blob (a file in
/// `<data>/blobs/`) with no row here is garbage: written by a turn that
/// never committed, or no longer used; the blob collector removes it.
pub const BLOB_REFS: TableDefinition<'_, &[u8; 32], u64> = TableDefinition::new("blob_refs");

/// Durable inbox of `?wait=false` messages: (actor, seq) → [`InboxRecord`].
/// `seq` is node-wide and increasing, so per-actor order is arrival order.
pub const INBOX: TableDefinition<'_, (u64, u64), &[u8]> = TableDefinition::new("inbox");

/// Messages sent with `actors.send` by actors of a cluster node, waiting
/// to be handed to their recipients' owners: seq → [`RelayRecord`].
/// Written by the sending turn's commit, deleted once the owner queued the
/// message (whose idempotency key makes a repeated hand-over harmless).
pub const RELAY: TableDefinition<'_, u64, &[u8]> = TableDefinition::new("relay");

/// [`RELAY`] rows by their message's id → seq (like [`OUTBOX_IDS`]).
/// (Format 6.)
pub const RELAY_IDS: TableDefinition<'_, &str, u64> = TableDefinition::new("relay_ids");

/// Replication: per slot, the last `(epoch, lsn)` this node wrote — as the
/// slot's owner, the last batch it shipped; as its backup, the last it
/// applied (a batch at or below it is a repeat and is skipped). Written in
/// the same transaction as the batch: slot (u32) → [`ReplicaMark`].
pub const REPLICA_LSN: TableDefinition<'_, u32, &[u8]> = TableDefinition::new("replica_lsn");

/// How a type's code runs.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum CodeKind {
    /// A WebAssembly component implementing the `marmot:actor` world.
    Wasm,
    /// A JavaScript module run by the built-in QuickJS engine (stored as
    /// UTF-8 source).
    Js,
    /// The built-in agent harness run with a manifest (stored as its JSON).
    Agent,
}

impl CodeKind {
    /// The name used in the HTTP API.
    pub fn as_str(self) -> &'static str {
        match self {
            CodeKind::Wasm => "wasm",
            CodeKind::Js => "js",
            CodeKind::Agent => "agent",
        }
    }
}

/// One deployed version of a type.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct VersionRecord {
    /// 1, 2, 3, … per type.
    pub version: u32,
    /// How the code runs.
    pub kind: CodeKind,
    /// Hex SHA-256 of the code bytes.
    pub sha256: String,
    /// Size of the code in bytes.
    pub code_bytes: u64,
    /// The type's configuration as of this version.
    pub config: TypeConfig,
    /// When it was deployed.
    pub deployed_at_ms: u64,
}

/// An actor type and its versions, oldest first.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct TypeRecord {
    /// The type's name.
    pub name: String,
    /// When version 1 was deployed.
    pub created_at_ms: u64,
    /// Every version kept, oldest first; the last one is current.
    pub versions: Vec<VersionRecord>,
}

impl TypeRecord {
    /// The current version.
    pub fn latest(&self) -> &VersionRecord {
        self.versions
            .last()
            .expect("a type record always has a version")
    }
}

/// What the node knows about one actor.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ActorRecord {
    /// Interned actor number.
    pub num: u64,
    /// When the actor was created.
    pub created_at_ms: u64,
    /// Version of its type's code that its state belongs to (on-upgrade has
    /// run for it).
    pub version: u32,
    /// When its last turn committed (0: never). An activity statistic:
    /// written with the next durable change or at hibernation, so it can lag
    /// after a crash.
    pub last_turn_at_ms: u64,
    /// Turns committed (an activity statistic, like `last_turn_at_ms`).
    pub turns: u64,
    /// Sequence number of its newest event (0: none yet).
    pub last_event_seq: u64,
    /// Sequence number of its oldest retained event (0: none).
    pub first_event_seq: u64,
    /// Sum of key and value lengths of its state.
    pub state_bytes: u64,
    /// Number of state keys.
    pub state_keys: u64,
}

impl ActorRecord {
    /// Whether `other` differs only in activity statistics (`turns`,
    /// `last_turn_at_ms`), which need not be written with every turn.
    pub fn same_durable_fields(&self, other: &ActorRecord) -> bool {
        self.num == other.num
            && self.created_at_ms == other.created_at_ms
            && self.version == other.version
            && self.last_event_seq == other.last_event_seq
            && self.first_event_seq == other.first_event_seq
            && self.state_bytes == other.state_bytes
            && self.state_keys == other.state_keys
    }

    /// A fresh record for a new actor.
    pub fn new(num: u64, now_ms: u64, version: u32) -> Self {
        Self {
            num,
            created_at_ms: now_ms,
            version,
            last_turn_at_ms: 0,
            turns: 0,
            last_event_seq: 0,
            first_event_seq: 0,
            state_bytes: 0,
            state_keys: 0,
        }
    }
}

/// One entry of an actor's event log.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct EventRecord {
    /// What happened (`counted`, `turn_failed`, …).
    pub kind: String,
    /// JSON payload.
    pub data: Vec<u8>,
    /// When the turn that emitted it committed... more precisely, when the
    /// turn ran.
    pub at_ms: u64,
}

/// A reply as stored for idempotent retries.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct StoredReply {
    /// HTTP status.
    pub status: u16,
    /// Body bytes.
    pub body: Vec<u8>,
    /// Content type.
    pub content_type: Option<String>,
}

/// What an `Idempotency-Key` has been used for.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub enum IdemOutcome {
    /// A durable message with this key is queued and has not run yet.
    Queued {
        /// Its message id.
        message_id: String,
    },
    /// The turn ran and committed this reply.
    Done {
        /// Its message id.
        message_id: String,
        /// The reply.
        reply: StoredReply,
    },
    /// A durable message with this key ran and failed; see its `turn_failed` event.
    Failed {
        /// Its message id.
        message_id: String,
        /// Why.
        error: String,
    },
}

impl IdemOutcome {
    /// Whether `message`, with this outcome's key, runs again instead of
    /// being a duplicate: a webhook whose turn failed. Its sender was
    /// told 202 and saw no failure, so a redelivery (a provider's "resend"
    /// button) is the way to run it again; a client's message with an
    /// `Idempotency-Key` gets the failure it already had.
    pub fn redelivery_runs(&self, message: &InboxRecord) -> bool {
        matches!(self, Self::Failed { .. }) && matches!(message.kind, InboxKind::Webhook { .. })
    }
}

impl IdemOutcome {
    /// The message the outcome belongs to.
    pub fn into_message_id(self) -> String {
        match self {
            IdemOutcome::Queued { message_id }
            | IdemOutcome::Done { message_id, .. }
            | IdemOutcome::Failed { message_id, .. } => message_id,
        }
    }
}

/// An idempotency record.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct IdemRecord {
    /// The outcome.
    pub outcome: IdemOutcome,
    /// When the record may be forgotten.
    pub expires_at_ms: u64,
    /// SHA-256 of the message (media type and body, see
    /// [`request_fingerprint`]) that took the key (format 7): a request
    /// with the same key and another body is refused, not answered with
    /// this outcome. `None` for webhooks (the sender's delivery id is the
    /// message's identity) and for records written by format 6.
    pub request_sha256: Option<[u8; 32]>,
}

impl IdemRecord {
    /// Whether a request whose body has fingerprint `request` may not use
    /// this record's key: both are known and they differ.
    pub fn refuses(&self, request: Option<&[u8; 32]>) -> bool {
        matches!((&self.request_sha256, request), (Some(a), Some(b)) if a != b)
    }
}

/// The fingerprint an idempotency record keeps of a message: its body and
/// its media type (lower-cased, without parameters), which says how the
/// body reaches the actor (the same bytes as `application/json` and as
/// `text/plain` are an object and a string to a JavaScript handler).
pub fn request_fingerprint(content_type: Option<&str>, body: &[u8]) -> [u8; 32] {
    use sha2::Digest;
    let media = content_type
        .and_then(|c| c.split(';').next())
        .map(|m| m.trim().to_ascii_lowercase())
        .unwrap_or_default();
    let mut h = sha2::Sha256::new();
    h.update(media.as_bytes());
    h.update([0]);
    h.update(body);
    h.finalize().into()
}

/// A durable message waiting in an actor's inbox.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct InboxRecord {
    /// Message id returned with the 202.
    pub message_id: String,
    /// Body bytes.
    pub body: Vec<u8>,
    /// Content type, if the sender named one.
    pub content_type: Option<String>,
    /// The sender's `Idempotency-Key`.
    pub idempotency_key: Option<String>,
    /// Recovery attempts started (written before each re-run after a restart).
    pub attempts: u32,
    /// When it was accepted.
    pub enqueued_at_ms: u64,
    /// What it is (since format 2).
    pub kind: InboxKind,
}

impl InboxRecord {
    /// What its idempotency record keeps of it: a message's body
    /// fingerprint; nothing for a webhook.
    pub fn request_fingerprint(&self) -> Option<[u8; 32]> {
        match self.kind {
            InboxKind::Message => Some(request_fingerprint(
                self.content_type.as_deref(),
                &self.body,
            )),
            InboxKind::Webhook { .. } => None,
        }
    }
}

/// A message on its way to an actor that may live on another node.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct RelayRecord {
    /// The recipient's type.
    pub actor_type: String,
    /// The recipient's id.
    pub actor_id: String,
    /// The message, with an idempotency key derived from its id.
    pub message: InboxRecord,
    /// The sending actor (type, id): only the owner of its slot hands the
    /// message over. `None` in rows written before format 6: handed over
    /// by the node that has them.
    pub from: Option<(String, String)>,
}

/// What a durable inbox row delivers.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub enum InboxKind {
    /// A message: an `on-message` turn.
    Message,
    /// A verified inbound webhook: an `on-webhook` turn.
    Webhook {
        /// The hook name from the URL.
        name: String,
        /// Request headers, lowercase names.
        headers: Vec<(String, String)>,
    },
}

/// When an alarm fires.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub enum AlarmSchedule {
    /// Once, at this time (ms since the epoch).
    At(u64),
    /// Once, this many ms after it was set.
    After(u64),
    /// Periodically, on a cron pattern in a time zone (UTC when `None`).
    Cron {
        /// The pattern (5 or 6 fields, `@hourly`…).
        expr: String,
        /// IANA time zone name.
        tz: Option<String>,
    },
}

/// Alarm names that start with NUL (which names users choose cannot
/// contain) are the platform's own, such as input expiries: they share the
/// durable machinery but are never listed, counted or given to `on-alarm`.
pub const INTERNAL_ALARM_PREFIX: char = '\0';

/// Whether alarm `name` is one of the platform's own.
pub fn is_internal_alarm(name: &str) -> bool {
    name.starts_with(INTERNAL_ALARM_PREFIX)
}

/// A pending alarm.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct AlarmRecord {
    /// When it fires.
    pub schedule: AlarmSchedule,
    /// Given to `on-alarm`.
    pub payload: Vec<u8>,
    /// The next time it is due (ms since the epoch).
    pub next_due_ms: u64,
    /// Failed turns of the current occurrence.
    pub attempts: u32,
    /// Turns of the current occurrence started after a restart, counted
    /// before each runs (a turn that crashes the node never finishes).
    pub boot_attempts: u32,
    /// When it was set.
    pub set_at_ms: u64,
}

/// A secret: where it may be sent, and its value sealed with
/// XChaCha20-Poly1305 under a master key, with `(name, version)` as
/// associated data (a value cannot be moved to another name or version).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct SecretRecord {
    /// Host patterns (`api.example.com`, `*.example.com`) it may be sent to,
    /// over https only.
    pub hosts: Vec<String>,
    /// When it was first set.
    pub created_at_ms: u64,
    /// When its value or hosts last changed.
    pub updated_at_ms: u64,
    /// Increases with every write of the value.
    pub version: u64,
    /// Which master key sealed it (a short hash of the key).
    pub key_id: String,
    /// The 24-byte nonce.
    pub nonce: Vec<u8>,
    /// The sealed value (ciphertext and tag).
    pub sealed: Vec<u8>,
}

/// A model provider: where its API is and how to talk to it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ProviderRecord {
    /// The provider as configured (`PUT /v1/providers/{name}`), JSON text:
    /// `format`, `base_url`, `key_secret` and the optional settings the
    /// models module documents. Kept as given so settings added later need
    /// no format change; the models module validates it on write and read.
    pub config_json: String,
    /// When it was first set.
    pub created_at_ms: u64,
    /// When it last changed.
    pub updated_at_ms: u64,
}

/// Model usage totals (or one turn's delta).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct UsageRecord {
    /// Model calls answered.
    pub calls: u64,
    /// Prompt tokens.
    pub input_tokens: u64,
    /// Generated tokens.
    pub output_tokens: u64,
    /// Cost in billionths of a US dollar, for calls whose prices are
    /// configured.
    pub cost_nano_usd: u64,
}

impl UsageRecord {
    /// `self + other`, saturating.
    pub fn plus(self, other: UsageRecord) -> UsageRecord {
        UsageRecord {
            calls: self.calls.saturating_add(other.calls),
            input_tokens: self.input_tokens.saturating_add(other.input_tokens),
            output_tokens: self.output_tokens.saturating_add(other.output_tokens),
            cost_nano_usd: self.cost_nano_usd.saturating_add(other.cost_nano_usd),
        }
    }

    /// Nothing recorded.
    pub fn is_empty(&self) -> bool {
        *self == UsageRecord::default()
    }
}

/// One file of an actor.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct FileRecord {
    /// Bytes.
    pub size: u64,
    /// SHA-256 of the content (the `ETag`, and a blob's name).
    pub sha256: [u8; 32],
    /// When it was written (ms since the epoch).
    pub updated_at_ms: u64,
    /// Where the bytes are.
    pub body: FileBody,
}

impl FileRecord {
    /// The blob holding its bytes, if they are not in the row.
    pub fn blob(&self) -> Option<[u8; 32]> {
        (self.body == FileBody::Blob).then_some(self.sha256)
    }
}

/// Where a file's bytes are.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub enum FileBody {
    /// In the row (small files).
    Inline(Vec<u8>),
    /// In the content-addressed blob named by the record's `sha256`.
    Blob,
}

/// How much an actor keeps in files.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct FileUsage {
    /// Total bytes.
    pub bytes: u64,
    /// Number of files.
    pub files: u64,
}

/// A durable wait for an answer from a person or a system.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct InputRecord {
    /// What kind of input: `approval`, `question`, a tool name…
    pub kind: String,
    /// The question shown to whoever answers.
    pub prompt: String,
    /// A JSON Schema (as JSON text) the answer must satisfy.
    pub schema: Option<String>,
    /// When it was requested.
    pub created_at_ms: u64,
    /// When it expires unanswered.
    pub expires_at_ms: Option<u64>,
    /// Where it stands.
    pub status: InputStatus,
}

/// Where an input request stands.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub enum InputStatus {
    /// Waiting for an answer.
    Pending,
    /// Answered; the actor's `on-input` turn with the answer committed.
    Answered {
        /// When.
        at_ms: u64,
        /// The answer.
        response: Vec<u8>,
    },
    /// Expired unanswered; the actor's `on-input` turn for that committed.
    Expired {
        /// When.
        at_ms: u64,
    },
    /// Withdrawn by the actor (`inputs.cancel`): nobody needs to answer it.
    /// (Appended: records of earlier versions decode as before.)
    Cancelled {
        /// When.
        at_ms: u64,
    },
}

impl InputStatus {
    /// `pending`, `answered`, `expired` or `cancelled`.
    pub fn label(&self) -> &'static str {
        match self {
            InputStatus::Pending => "pending",
            InputStatus::Answered { .. } => "answered",
            InputStatus::Expired { .. } => "expired",
            InputStatus::Cancelled { .. } => "cancelled",
        }
    }

    /// When it was settled (`None` while pending).
    pub fn settled_at_ms(&self) -> Option<u64> {
        match self {
            InputStatus::Pending => None,
            InputStatus::Answered { at_ms, .. }
            | InputStatus::Expired { at_ms }
            | InputStatus::Cancelled { at_ms } => Some(*at_ms),
        }
    }

    /// Its place in [`INPUTS_BY_SETTLED`]: 0 while pending, else when it
    /// settled (at least 1).
    pub fn index_ms(&self) -> u64 {
        self.settled_at_ms().map_or(0, |t| t.max(1))
    }
}

/// A record that failed to decode: the file is corrupt or from another format.
#[derive(Debug, thiserror::Error)]
#[error("corrupt {what} record: {source}")]
pub struct DecodeError {
    what: &'static str,
    #[source]
    source: postcard::Error,
}

/// Encode a record.
pub fn encode<T: Serialize>(value: &T) -> Vec<u8> {
    postcard::to_allocvec(value).expect("records always serialize")
}

/// Decode a record of kind `what` (for error messages).
pub fn decode<T: DeserializeOwned>(what: &'static str, bytes: &[u8]) -> Result<T, DecodeError> {
    postcard::from_bytes(bytes).map_err(|source| DecodeError { what, source })
}

#[cfg(test)]
mod tests;
