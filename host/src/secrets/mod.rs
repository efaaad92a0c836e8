//! The secret store: named values the host holds and guests refer to by
//! name (`{{secret:NAME}}`), never seeing them.
//!
//! Values are sealed at rest ([`crypto`]) under the node's master key and
//! opened only at the moment an outbound request needs one; the plaintext
//! lives in a [`SecretValue`] that wipes itself and cannot be printed. Each
//! secret names the hosts it may ever be sent to (https only). The API
//! shows names, hosts and times, never a value.
//!
//! The master key comes from `MARMOT_MASTER_KEY`, a key file, or (for
//! `marmot dev`) a key file created in the data directory on first start.
//! Rotation: start with the new key as the master key and the old one as a
//! previous key; every secret sealed under the old key is re-sealed under
//! the new one before the node serves (see [`MasterKeys::load`]).

pub mod crypto;

use std::path::{Path, PathBuf};
use std::sync::Arc;

use serde::Serialize;
use zeroize::Zeroizing;

pub use crypto::{MasterKey, OpenError, SecretValue};

use crate::clock::now_ms;
use crate::config::SecretsConfig;
use crate::egress::HostPattern;
use crate::ids::{IdError, validate_secret_name};
use crate::storage::schema::SecretRecord;
use crate::storage::{Storage, StorageError, WriteOp};

/// Environment variable holding the master key (base64 of 32 bytes).
pub const MASTER_KEY_ENV: &str = "MARMOT_MASTER_KEY";
/// Environment variable holding earlier master keys, comma-separated.
pub const PREVIOUS_KEYS_ENV: &str = "MARMOT_MASTER_KEY_PREVIOUS";
/// The key file `marmot dev` creates in its data directory.
pub const DEV_KEY_FILE: &str = "master.key";
/// Largest secret value.
pub const MAX_VALUE_BYTES: usize = 64 << 10;

/// The shortest value taken. Whatever comes back from the network to a
/// type that may use a secret has its value replaced wherever it occurs:
/// a value of a few bytes (`x`, `test`) is found in ordinary text and
/// would be cut out of every answer.
pub const MIN_VALUE_BYTES: usize = 8;
/// Most hosts one secret may name.
pub const MAX_HOSTS: usize = 64;

/// What the API shows of a secret.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct SecretInfo {
    /// Its name.
    pub name: String,
    /// Where it may be sent.
    pub hosts: Vec<String>,
    /// When it was first set (ms since the epoch).
    pub created_at_ms: u64,
    /// When it last changed.
    pub updated_at_ms: u64,
}

impl SecretInfo {
    fn of(name: &str, rec: &SecretRecord) -> Self {
        Self {
            name: name.to_owned(),
            hosts: rec.hosts.clone(),
            created_at_ms: rec.created_at_ms,
            updated_at_ms: rec.updated_at_ms,
        }
    }
}

/// Why a secret operation failed. Messages never hold a value.
#[derive(Debug, thiserror::Error)]
pub enum SecretError {
    /// A bad name.
    #[error(transparent)]
    Name(#[from] IdError),
    /// A bad value or host list.
    #[error("{0}")]
    Invalid(String),
    /// The value is too large.
    #[error("a secret value may be at most {limit} bytes, not {size}")]
    TooLarge {
        /// Its size.
        size: usize,
        /// The limit.
        limit: usize,
    },
    /// No such secret.
    #[error("no secret `{0}`")]
    NotFound(String),
    /// The stored value does not open.
    #[error("secret `{name}` cannot be opened: {why}")]
    Sealed {
        /// The secret.
        name: String,
        /// Why.
        why: OpenError,
    },
    /// Storage failed.
    #[error(transparent)]
    Storage(#[from] StorageError),
}

/// The key file a backup carries: the one `marmot dev` made in the data
/// directory, when that is the key in use (a dev backup restores whole).
/// A configured key (`MARMOT_MASTER_KEY`, a key file) is kept apart from
/// backups, by design: a backup then holds no way to open its secrets.
pub fn key_file_for_backup(config: &SecretsConfig, data_dir: &Path) -> Option<PathBuf> {
    let configured = std::env::var(MASTER_KEY_ENV).is_ok_and(|v| !v.is_empty())
        || config.master_key_file.is_some();
    let file = data_dir.join(DEV_KEY_FILE);
    (config.generate_key && !configured && file.is_file()).then_some(file)
}

/// The node's master key and the earlier ones it can still open.
#[derive(Debug)]
pub struct MasterKeys {
    current: MasterKey,
    previous: Vec<MasterKey>,
}

impl MasterKeys {
    /// The keys as configured: `MARMOT_MASTER_KEY` or the configured key
    /// file; failing both, a key file created in `data_dir` if the config
    /// allows (`marmot dev`), else an error that says how to make a key.
    /// Earlier keys come from `MARMOT_MASTER_KEY_PREVIOUS` and the
    /// configured previous key files.
    pub fn load(config: &SecretsConfig, data_dir: &Path) -> anyhow::Result<Self> {
        let current = match std::env::var(MASTER_KEY_ENV).ok().filter(|v| !v.is_empty()) {
            Some(text) => MasterKey::from_base64(&text)
                .map_err(|e| anyhow::anyhow!("{MASTER_KEY_ENV}: {e}"))?,
            None => match &config.master_key_file {
                Some(path) => read_key_file(path)?,
                None if config.generate_key => dev_key(&data_dir.join(DEV_KEY_FILE))?,
                None => anyhow::bail!(
                    "the secret store needs a master key: set {MASTER_KEY_ENV} to the output of \
                     `marmot secrets new-key`, or `secrets.master_key_file` in the config to a \
                     file (mode 0600) holding it"
                ),
            },
        };
        let mut previous = Vec::new();
        if let Ok(list) = std::env::var(PREVIOUS_KEYS_ENV) {
            for text in list.split(',').filter(|t| !t.trim().is_empty()) {
                previous.push(
                    MasterKey::from_base64(text)
                        .map_err(|e| anyhow::anyhow!("{PREVIOUS_KEYS_ENV}: {e}"))?,
                );
            }
        }
        for path in &config.previous_key_files {
            previous.push(read_key_file(path)?);
        }
        Ok(Self { current, previous })
    }

    /// Keys from values (tests).
    #[cfg(test)]
    pub fn new(current: MasterKey, previous: Vec<MasterKey>) -> Self {
        Self { current, previous }
    }

    /// Keys for `purpose` derived from the current key and the earlier
    /// ones, with their master key's id: the current one first.
    pub fn derived(&self, purpose: &str) -> Vec<(String, Zeroizing<[u8; crypto::KEY_BYTES]>)> {
        std::iter::once(&self.current)
            .chain(&self.previous)
            .map(|k| (k.id().to_owned(), k.derive(purpose)))
            .collect()
    }

    fn by_id(&self, id: &str) -> Option<&MasterKey> {
        std::iter::once(&self.current)
            .chain(&self.previous)
            .find(|k| k.id() == id)
    }
}

/// Read a key file, refusing one that others may read.
fn read_key_file(path: &Path) -> anyhow::Result<MasterKey> {
    let text =
        Zeroizing::new(std::fs::read_to_string(path).map_err(|e| {
            anyhow::anyhow!("cannot read master key file `{}`: {e}", path.display())
        })?);
    #[cfg(unix)]
    {
        use std::os::unix::fs::PermissionsExt as _;
        let mode = std::fs::metadata(path)?.permissions().mode() & 0o777;
        if mode & 0o077 != 0 {
            anyhow::bail!(
                "master key file `{}` is readable by others (mode {mode:o}); run `chmod 600` on it",
                path.display()
            );
        }
    }
    MasterKey::from_base64(&text)
        .map_err(|e| anyhow::anyhow!("master key file `{}`: {e}", path.display()))
}

/// `marmot dev`'s key: read `path`, or create it (mode 0600) on first start.
fn dev_key(path: &PathBuf) -> anyhow::Result<MasterKey> {
    if path.exists() {
        return read_key_file(path);
    }
    let key = MasterKey::generate();
    let mut options = std::fs::OpenOptions::new();
    options.write(true).create_new(true);
    #[cfg(unix)]
    {
        use std::os::unix::fs::OpenOptionsExt as _;
        options.mode(0o600);
    }
    let mut file = options
        .open(path)
        .map_err(|e| anyhow::anyhow!("cannot create master key file `{}`: {e}", path.display()))?;
    use std::io::Write as _;
    file.write_all(key.to_base64().as_bytes())?;
    file.write_all(b"\n")?;
    file.sync_all()?;
    tracing::info!(path = %path.display(), key_id = key.id(), "created a master key for the secret store");
    Ok(key)
}

/// The secret store.
pub struct SecretStore {
    storage: Arc<Storage>,
    keys: MasterKeys,
    /// Serializes writes: a write reads the current version to bump it.
    write_lock: tokio::sync::Mutex<()>,
    /// Values secrets had until they were replaced or deleted here, for
    /// [`RETIRED_FOR_MS`] (kept in memory only).
    retired: std::sync::Mutex<Vec<Retired>>,
}

/// How long a replaced or deleted value is still cut out of what comes
/// back: a rotated key often stays valid for a while, and a server that
/// stored it (a request log, an echo) may still hand it back. Only the
/// current values were scrubbed (found by a probe).
const RETIRED_FOR_MS: u64 = 24 * 3600 * 1000;
/// Most retired values kept per secret (the latest).
const RETIRED_PER_NAME: usize = 4;

/// A value a secret had.
struct Retired {
    name: String,
    value: zeroize::Zeroizing<Vec<u8>>,
    until_ms: u64,
}

impl SecretStore {
    /// The store over `storage`. Secrets sealed under a previous key are
    /// re-sealed under the current one first; one sealed under a key the
    /// node does not have is an error naming that key.
    pub async fn open(storage: Arc<Storage>, keys: MasterKeys) -> anyhow::Result<Self> {
        let store = Self {
            storage,
            keys,
            write_lock: tokio::sync::Mutex::new(()),
            retired: std::sync::Mutex::new(Vec::new()),
        };
        store.reseal().await?;
        Ok(store)
    }

    async fn reseal(&self) -> anyhow::Result<()> {
        let current = &self.keys.current;
        let mut resealed = 0;
        for (name, rec) in self.storage.reader()?.secrets()? {
            if rec.key_id == current.id() {
                continue;
            }
            let Some(old) = self.keys.by_id(&rec.key_id) else {
                anyhow::bail!(
                    "secret `{name}` is sealed under master key {}, but the node was given only \
                     key {}: start with that key in {PREVIOUS_KEYS_ENV} (or \
                     secrets.previous_key_files) to re-seal it under the new one",
                    rec.key_id,
                    current.id()
                );
            };
            let value = old
                .open(&name, rec.version, &rec.nonce, &rec.sealed)
                .map_err(|why| anyhow::anyhow!("secret `{name}` cannot be opened: {why}"))?;
            let (nonce, sealed) = current.seal(&name, rec.version, value.expose());
            let record = SecretRecord {
                key_id: current.id().to_owned(),
                nonce,
                sealed,
                ..rec
            };
            self.storage
                .writer()
                .call(|done| WriteOp::PutSecret {
                    name,
                    record: Some(record),
                    done,
                })
                .await?;
            resealed += 1;
        }
        if resealed > 0 {
            tracing::info!(
                secrets = resealed,
                key_id = current.id(),
                "secrets re-sealed under the current master key"
            );
        }
        Ok(())
    }

    /// Set (or replace) a secret. Returns what the API shows, and whether
    /// it is new.
    pub async fn put(
        &self,
        name: &str,
        value: &[u8],
        hosts: Vec<String>,
    ) -> Result<(SecretInfo, bool), SecretError> {
        validate_secret_name(name)?;
        if value.len() < MIN_VALUE_BYTES {
            return Err(SecretError::Invalid(format!(
                "value must have at least {MIN_VALUE_BYTES} bytes (it has {}): every answer \
                 to a type that may use it has the value cut out wherever it occurs, and a \
                 short one occurs in ordinary text",
                value.len()
            )));
        }
        if value.len() > MAX_VALUE_BYTES {
            return Err(SecretError::TooLarge {
                size: value.len(),
                limit: MAX_VALUE_BYTES,
            });
        }
        check_value_chars(value)?;
        let hosts = check_hosts(hosts)?;
        let _guard = self.write_lock.lock().await;
        let now = now_ms();
        let old = self.storage.reader()?.secret(name)?;
        self.retire(name, old.as_ref());
        let version = old.as_ref().map_or(1, |r| r.version + 1);
        let key = &self.keys.current;
        let (nonce, sealed) = key.seal(name, version, value);
        let record = SecretRecord {
            hosts,
            created_at_ms: old.as_ref().map_or(now, |r| r.created_at_ms),
            updated_at_ms: now,
            version,
            key_id: key.id().to_owned(),
            nonce,
            sealed,
        };
        let info = SecretInfo::of(name, &record);
        let existed = self
            .storage
            .writer()
            .call(|done| WriteOp::PutSecret {
                name: name.to_owned(),
                record: Some(record),
                done,
            })
            .await?;
        tracing::info!(secret = name, version, "secret set");
        Ok((info, !existed))
    }

    /// Every secret, by name (never a value).
    pub fn list(&self) -> Result<Vec<SecretInfo>, SecretError> {
        Ok(self
            .storage
            .reader()?
            .secrets()?
            .iter()
            .map(|(name, rec)| SecretInfo::of(name, rec))
            .collect())
    }

    /// Delete a secret; whether it existed.
    pub async fn delete(&self, name: &str) -> Result<bool, SecretError> {
        validate_secret_name(name)?;
        let _guard = self.write_lock.lock().await;
        self.retire(name, self.storage.reader()?.secret(name)?.as_ref());
        let existed = self
            .storage
            .writer()
            .call(|done| WriteOp::PutSecret {
                name: name.to_owned(),
                record: None,
                done,
            })
            .await?;
        if existed {
            tracing::info!(secret = name, "secret deleted");
        }
        Ok(existed)
    }

    /// Make this node's secrets those of `peer` (sealed records, as a peer
    /// of the cluster stores them): a secret whose value or hosts differ is
    /// re-sealed here under this node's key, one the peer does not have is
    /// deleted. Needs a master key the peer's records are sealed under
    /// (the cluster shares its master keys). Returns the secrets changed.
    pub async fn adopt(&self, peer: &[(String, SecretRecord)]) -> Result<usize, SecretError> {
        let _guard = self.write_lock.lock().await;
        let local: std::collections::BTreeMap<String, SecretRecord> =
            self.storage.reader()?.secrets()?.into_iter().collect();
        let mut writes = Vec::new();
        for (name, theirs) in peer {
            validate_secret_name(name)?;
            let value = self.open_sealed(name, theirs)?;
            let mine = local.get(name);
            let same = mine.is_some_and(|m| {
                m.hosts == theirs.hosts
                    && self
                        .open_sealed(name, m)
                        .is_ok_and(|v| v.expose() == value.expose())
            });
            if same {
                continue;
            }
            self.retire(name, mine);
            let version = theirs.version.max(mine.map_or(0, |m| m.version) + 1);
            let key = &self.keys.current;
            let (nonce, sealed) = key.seal(name, version, value.expose());
            let record = SecretRecord {
                hosts: theirs.hosts.clone(),
                created_at_ms: theirs.created_at_ms,
                updated_at_ms: theirs.updated_at_ms,
                version,
                key_id: key.id().to_owned(),
                nonce,
                sealed,
            };
            writes.push((name.clone(), Some(record)));
        }
        for (name, mine) in &local {
            if !peer.iter().any(|(n, _)| n == name) {
                self.retire(name, Some(mine));
                writes.push((name.clone(), None));
            }
        }
        let changed = writes.len();
        for (name, record) in writes {
            self.storage
                .writer()
                .call(|done| WriteOp::PutSecret { name, record, done })
                .await?;
        }
        Ok(changed)
    }

    /// Keep the value in `old`, secret `name`'s record being replaced or
    /// deleted, among the retired ones.
    fn retire(&self, name: &str, old: Option<&SecretRecord>) {
        let Some(value) = old.and_then(|rec| self.open_sealed(name, rec).ok()) else {
            return;
        };
        let now = now_ms();
        let mut retired = self.retired.lock().expect("retired secrets lock");
        retired.retain(|r| r.until_ms > now);
        retired.push(Retired {
            name: name.to_owned(),
            value: zeroize::Zeroizing::new(value.expose().to_vec()),
            until_ms: now + RETIRED_FOR_MS,
        });
        while retired.iter().filter(|r| r.name == name).count() > RETIRED_PER_NAME {
            let oldest = retired
                .iter()
                .position(|r| r.name == name)
                .expect("counted");
            retired.remove(oldest);
        }
    }

    /// The values secret `name` had until lately (replaced or deleted here
    /// within [`RETIRED_FOR_MS`]): what comes back is checked for them
    /// too.
    pub fn retired(&self, name: &str) -> Vec<zeroize::Zeroizing<Vec<u8>>> {
        let now = now_ms();
        self.retired
            .lock()
            .expect("retired secrets lock")
            .iter()
            .filter(|r| r.name == name && r.until_ms > now)
            .map(|r| r.value.clone())
            .collect()
    }

    /// The value sealed in `rec`, the record of secret `name`.
    fn open_sealed(&self, name: &str, rec: &SecretRecord) -> Result<SecretValue, SecretError> {
        let sealed = |why| SecretError::Sealed {
            name: name.to_owned(),
            why,
        };
        let key = self
            .keys
            .by_id(&rec.key_id)
            .ok_or_else(|| sealed(OpenError::UnknownKey(rec.key_id.clone())))?;
        key.open(name, rec.version, &rec.nonce, &rec.sealed)
            .map_err(sealed)
    }

    /// A secret's value and the hosts it may be sent to, opened for one
    /// outbound request.
    pub fn reveal(&self, name: &str) -> Result<(SecretValue, Vec<HostPattern>), SecretError> {
        let rec = self
            .storage
            .reader()?
            .secret(name)?
            .ok_or_else(|| SecretError::NotFound(name.to_owned()))?;
        let value = self.open_sealed(name, &rec)?;
        // Patterns were checked when stored.
        let hosts = rec
            .hosts
            .iter()
            .filter_map(|h| HostPattern::parse(h).ok())
            .collect();
        Ok((value, hosts))
    }
}

/// A value goes into HTTP header values, so it is what they can carry:
/// printable ASCII, with spaces or tabs inside it only.
/// * A control character (a key file's line break, NUL) could only ever
///   fail its requests.
/// * Leading or trailing whitespace is dropped from a header value on the
///   wire: what was sent would not be what was stored, and a value that is
///   all spaces would be cut out of every run of spaces in the answers.
/// * A server that echoes a non-ASCII value reads its bytes as Latin-1
///   and spells them in ways the answer filter does not recognize (a
///   probe got one back as `\u00c3\u00a9…` from a JSON echo).
fn check_value_chars(value: &[u8]) -> Result<(), SecretError> {
    let invalid = |why: &str| Err(SecretError::Invalid(format!("value {why}")));
    if value.iter().any(|&b| (b < 0x20 && b != b'\t') || b == 0x7f) {
        return invalid(
            "must not contain control characters (line breaks, NUL): it is sent in HTTP \
             header values",
        );
    }
    if !value.is_ascii() {
        return invalid(
            "must be ASCII: it is sent in HTTP header values, and a server that echoes other \
             characters spells them in ways the answer filter cannot recognize",
        );
    }
    if value.first().is_some_and(u8::is_ascii_whitespace)
        || value.last().is_some_and(u8::is_ascii_whitespace)
    {
        return invalid(
            "must not begin or end with whitespace: HTTP drops it from header values, so the \
             value sent would not be the value stored",
        );
    }
    Ok(())
}

/// Check a secret's host list: at least one, all valid patterns; returned
/// in their normal spelling.
fn check_hosts(hosts: Vec<String>) -> Result<Vec<String>, SecretError> {
    if hosts.is_empty() {
        return Err(SecretError::Invalid(
            "hosts must name at least one host the secret may be sent to".into(),
        ));
    }
    if hosts.len() > MAX_HOSTS {
        return Err(SecretError::Invalid(format!(
            "a secret may name at most {MAX_HOSTS} hosts"
        )));
    }
    let mut out: Vec<String> = Vec::with_capacity(hosts.len());
    for h in &hosts {
        let p = HostPattern::parse(h).map_err(|e| SecretError::Invalid(format!("hosts: {e}")))?;
        let p = p.to_string();
        // `*.com` would let the value go to any .com host.
        if p.strip_prefix("*.").is_some_and(|d| !d.contains('.')) {
            return Err(SecretError::Invalid(format!(
                "hosts: `{p}` covers a whole top-level domain; name the hosts or a \
                 domain under it (*.example.com)"
            )));
        }
        if !out.contains(&p) {
            out.push(p);
        }
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::StorageConfig;
    use crate::storage::WriterMetrics;

    fn storage(dir: &Path) -> Arc<Storage> {
        Arc::new(Storage::open(dir, &StorageConfig::default(), WriterMetrics::new()).unwrap())
    }

    fn key(text: &str) -> MasterKey {
        MasterKey::from_base64(text).unwrap()
    }

    /// A store over a new database in `dir`, under a new master key.
    async fn fresh_store(dir: &Path) -> SecretStore {
        SecretStore::open(storage(dir), MasterKeys::new(MasterKey::generate(), vec![]))
            .await
            .unwrap()
    }

    /// A replaced or deleted value stays known, for a day, as retired:
    /// what comes back to a type is checked for it too (only the current
    /// values were: found by a probe).
    #[tokio::test]
    async fn replaced_and_deleted_values_are_kept_as_retired() {
        let dir = tempfile::tempdir().unwrap();
        let store = fresh_store(dir.path()).await;
        let hosts = || vec!["api.example.com".to_owned()];
        store.put("K", b"value-one-1111", hosts()).await.unwrap();
        assert!(store.retired("K").is_empty());
        for v in [
            "value-two-2222",
            "value-3-333333",
            "value-4-444444",
            "value-5-555555",
        ] {
            store.put("K", v.as_bytes(), hosts()).await.unwrap();
        }
        let retired = |name| {
            store
                .retired(name)
                .iter()
                .map(|v| String::from_utf8(v.to_vec()).unwrap())
                .collect::<Vec<_>>()
        };
        // The latest four, oldest first.
        assert_eq!(
            retired("K"),
            [
                "value-one-1111",
                "value-two-2222",
                "value-3-333333",
                "value-4-444444"
            ]
        );
        store.put("K", b"value-6-666666", hosts()).await.unwrap();
        assert_eq!(retired("K")[0], "value-two-2222");
        assert!(store.delete("K").await.unwrap());
        assert_eq!(retired("K").last().unwrap(), "value-6-666666");
        assert!(retired("OTHER").is_empty());
    }

    #[tokio::test]
    async fn values_are_sealed_at_rest_and_reopen() {
        let dir = tempfile::tempdir().unwrap();
        let s = storage(dir.path());
        let store = SecretStore::open(s.clone(), MasterKeys::new(MasterKey::generate(), vec![]))
            .await
            .unwrap();
        let (info, created) = store
            .put("API_KEY", b"sk-very-secret", vec!["api.example.com".into()])
            .await
            .unwrap();
        assert!(created);
        assert_eq!(info.hosts, ["api.example.com"]);
        let (value, hosts) = store.reveal("API_KEY").unwrap();
        assert_eq!(value.expose(), b"sk-very-secret");
        assert_eq!(hosts, [HostPattern::Exact("api.example.com".into())]);
        let rec = s.reader().unwrap().secret("API_KEY").unwrap().unwrap();
        assert!(!rec.sealed.windows(14).any(|w| w == b"sk-very-secret"));
        let (_, created) = store
            .put("API_KEY", b"sk-value-2", vec!["api.example.com".into()])
            .await
            .unwrap();
        assert!(!created);
        assert_eq!(store.reveal("API_KEY").unwrap().0.expose(), b"sk-value-2");
        assert!(store.delete("API_KEY").await.unwrap());
        assert!(matches!(
            store.reveal("API_KEY"),
            Err(SecretError::NotFound(_))
        ));
    }

    #[tokio::test]
    async fn bad_input_changes_nothing() {
        let dir = tempfile::tempdir().unwrap();
        let store = fresh_store(dir.path()).await;
        let host = || vec!["api.example.com".to_owned()];
        // A secret that each bad write below tries to replace.
        store.put("K", b"sk-kept-value", host()).await.unwrap();
        assert!(matches!(
            store.put("bad name", b"sk-value", host()).await,
            Err(SecretError::Name(_))
        ));
        for (bad, why) in [
            (&b"sk-line\nbreak"[..], "control characters"),
            ("sk-caf\u{e9}-value".as_bytes(), "must be ASCII"),
            (b"        ", "whitespace"),
            (b" sk-value-1", "whitespace"),
            (b"sk-value-1\t", "whitespace"),
        ] {
            assert!(
                matches!(
                    store.put("K", bad, host()).await,
                    Err(SecretError::Invalid(m)) if m.contains(why)
                ),
                "{bad:?}"
            );
        }
        store.put("T", b"sk-inner space", host()).await.unwrap();
        store.delete("T").await.unwrap();
        for short in [&b""[..], b"x", b"sk-1234"] {
            assert!(matches!(
                store.put("K", short, host()).await,
                Err(SecretError::Invalid(m)) if m.contains("at least 8 bytes")
            ));
        }
        assert!(matches!(
            store
                .put("K", &vec![b'x'; MAX_VALUE_BYTES + 1], host())
                .await,
            Err(SecretError::TooLarge { .. })
        ));
        assert!(matches!(
            store.put("K", b"sk-value", vec![]).await,
            Err(SecretError::Invalid(_))
        ));
        assert!(matches!(
            store
                .put("K", b"sk-value", vec!["https://x.com".into()])
                .await,
            Err(SecretError::Invalid(_))
        ));
        assert!(matches!(
            store.put("K", b"sk-value", vec!["*.com".into()]).await,
            Err(SecretError::Invalid(m)) if m.contains("top-level domain")
        ));
        store
            .put("W", b"sk-value", vec!["*.example.com".into()])
            .await
            .unwrap();
        store.delete("W").await.unwrap();
        let listed = store.list().unwrap();
        assert_eq!(listed.len(), 1, "{listed:?}");
        assert_eq!(
            (listed[0].name.as_str(), listed[0].hosts.clone()),
            ("K", host())
        );
        let (value, _) = store.reveal("K").unwrap();
        assert_eq!(value.expose(), b"sk-kept-value");
    }

    #[tokio::test]
    async fn rotation_reseals_under_the_new_key() {
        let dir = tempfile::tempdir().unwrap();
        let s = storage(dir.path());
        let (a, b) = (MasterKey::generate(), MasterKey::generate());
        let (a_text, b_text) = (a.to_base64(), b.to_base64());
        let store = SecretStore::open(s.clone(), MasterKeys::new(a, vec![]))
            .await
            .unwrap();
        store
            .put("K", b"sk-value-1", vec!["*.example.com".into()])
            .await
            .unwrap();
        drop(store);
        // Only the new key: refused, naming the key it needs.
        let err = SecretStore::open(s.clone(), MasterKeys::new(key(&b_text), vec![]))
            .await
            .err()
            .unwrap()
            .to_string();
        assert!(err.contains(PREVIOUS_KEYS_ENV), "{err}");
        // New key plus the old one: re-sealed.
        let store = SecretStore::open(s.clone(), MasterKeys::new(key(&b_text), vec![key(&a_text)]))
            .await
            .unwrap();
        drop(store);
        let rec = s.reader().unwrap().secret("K").unwrap().unwrap();
        assert_eq!(rec.key_id, key(&b_text).id());
        // From now on the new key alone opens it.
        let store = SecretStore::open(s, MasterKeys::new(key(&b_text), vec![]))
            .await
            .unwrap();
        assert_eq!(store.reveal("K").unwrap().0.expose(), b"sk-value-1");
    }
}
