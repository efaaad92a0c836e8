//! Settings of the capabilities guests reach beyond their own state:
//! files, outbound HTTP, model providers, and the secret store's keys.

use std::net::SocketAddr;
use std::path::PathBuf;

use serde::{Deserialize, Serialize};

/// Actors' files: sizes and quotas.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct FilesConfig {
    /// Largest file (a file passes through the guest's memory whole).
    pub max_file_bytes: usize,
    /// Bytes of files one actor may keep.
    pub max_actor_bytes: u64,
    /// Files one actor may keep.
    pub max_actor_files: u64,
    /// Bytes of files all actors of one type may keep.
    pub max_type_bytes: u64,
    /// Files up to this size are stored in the database row; larger ones
    /// as content-addressed blobs beside it.
    pub inline_max_bytes: usize,
    /// Unreferenced blobs older than this are removed (must be longer than
    /// any turn: a turn writes its blobs before it commits).
    pub blob_gc_grace_ms: u64,
    /// A blob whose last file was overwritten or deleted is removed this
    /// long after the commit: time for a download that read the file's
    /// row just before to open the blob (backups pause removals).
    pub released_blob_delay_ms: u64,
    /// Unless blobs waiting so hold more bytes than this: then the oldest
    /// go at once (files rewritten in a loop kept write rate × delay on
    /// disk, outside every quota).
    pub max_released_bytes: u64,
}

impl Default for FilesConfig {
    fn default() -> Self {
        Self {
            max_file_bytes: 16 << 20,
            max_actor_bytes: 256 << 20,
            max_actor_files: 10_000,
            max_type_bytes: 10 << 30,
            inline_max_bytes: 64 << 10,
            blob_gc_grace_ms: 3_600_000,
            released_blob_delay_ms: 10_000,
            max_released_bytes: 256 << 20,
        }
    }
}

/// Outbound HTTP from guests. Which hosts a type may reach is its own
/// `allowed_hosts`; this is what applies to all of them.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct EgressConfig {
    /// Address ranges opened despite the address policy (which refuses
    /// loopback, private, link-local, CGNAT, multicast and metadata
    /// addresses): `["127.0.0.1/32"]` for development and tests.
    pub allow_private: Vec<String>,
    /// Connect timeout.
    pub connect_timeout_ms: u64,
    /// Whole-request timeout when the guest gives none.
    pub timeout_ms: u64,
    /// Longest whole-request timeout a guest may ask for.
    pub max_timeout_ms: u64,
    /// Largest request body.
    pub max_request_bytes: usize,
    /// Largest response body a guest may receive.
    pub max_response_bytes: usize,
    /// Extra trusted root certificates (PEM), besides the webpki roots:
    /// a private CA, or a test CA.
    pub extra_ca_file: Option<PathBuf>,
    /// DNS servers to resolve with instead of the system's resolver.
    pub nameservers: Vec<SocketAddr>,
}

impl Default for EgressConfig {
    fn default() -> Self {
        Self {
            allow_private: Vec::new(),
            connect_timeout_ms: 5_000,
            timeout_ms: 30_000,
            max_timeout_ms: 300_000,
            max_request_bytes: 4 << 20,
            max_response_bytes: 16 << 20,
            extra_ca_file: None,
            nameservers: Vec::new(),
        }
    }
}

/// The model gateway. Providers themselves are set through the API
/// (`PUT /v1/providers/{name}`); this is how calls to them behave.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct ModelsConfig {
    /// Address ranges a provider's `base_url` may resolve to despite the
    /// address policy, on top of `egress.allow_private`: a vLLM or Ollama
    /// server on the local network. Guests' own fetches do not get these.
    /// `marmot dev` opens loopback here.
    pub allow_private: Vec<String>,
    /// Attempts per provider for an error worth retrying (429, 529, 5xx,
    /// a failed connection), the first one included.
    pub max_attempts: u32,
    /// First back-off; it doubles per attempt, with jitter.
    pub backoff_ms: u64,
    /// Longest back-off between two attempts.
    pub max_backoff_ms: u64,
    /// Longest `Retry-After` honoured: a provider asking for a longer wait
    /// is treated as unavailable (the next fallback is tried at once).
    pub max_retry_after_ms: u64,
    /// Timeout of one attempt: the whole answer, or for a streamed one
    /// the wait for its head and then for each chunk.
    pub timeout_ms: u64,
}

impl Default for ModelsConfig {
    fn default() -> Self {
        Self {
            allow_private: Vec::new(),
            max_attempts: 3,
            backoff_ms: 500,
            max_backoff_ms: 8_000,
            max_retry_after_ms: 30_000,
            timeout_ms: 300_000,
        }
    }
}

/// Where the master key that seals the secret store comes from.
///
/// `MARMOT_MASTER_KEY` (base64 of 32 bytes; `marmot secrets new-key` makes
/// one) wins over `master_key_file`. To rotate, start with the new key as
/// the master key and the old one in `MARMOT_MASTER_KEY_PREVIOUS` (or
/// `previous_key_files`): every secret is re-encrypted under the new key at
/// start-up, after which the old key is no longer needed.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct SecretsConfig {
    /// File holding the master key (base64), readable by its owner only.
    pub master_key_file: Option<PathBuf>,
    /// Files holding earlier master keys, for rotation.
    pub previous_key_files: Vec<PathBuf>,
    /// Without a key, create `<data_dir>/master.key` (mode 0600): what
    /// `marmot dev` does; `marmot serve` refuses to start instead.
    #[serde(skip)]
    pub generate_key: bool,
}
