//! Deployed actor types and their versions, in memory, with each type's
//! rate limit.
//!
//! The catalog mirrors the `types` table and keeps, per version, the compiled
//! [`Prepared`] code (compiled or loaded from the on-disk cache on first use,
//! once, however many actors wake at the same time).

use std::collections::HashMap;
use std::num::NonZeroU32;
use std::sync::atomic::{AtomicBool, AtomicU32, Ordering};
use std::sync::{Arc, Mutex, RwLock};
use std::time::Duration;

use governor::clock::{Clock, DefaultClock};
use governor::{DefaultDirectRateLimiter, Quota, RateLimiter};
use tokio::sync::OnceCell;

use crate::config::{ResolvedTypeConfig, TypeConfig, TypeDefaults};
use crate::sandbox::{CodeError, HttpGrant, JsModule, Prepared, Sandbox};
use crate::storage::schema::{CodeKind, TypeRecord, VersionRecord};
use crate::storage::{Storage, StorageError};

/// A version ready to instantiate.
pub struct PreparedVersion {
    /// The version number.
    pub version: u32,
    /// Compiled code, linked against the host (for JavaScript types: the
    /// shared engine).
    pub pre: Arc<Prepared>,
    /// For JavaScript types: the module the engine runs.
    pub js_module: Option<Arc<JsModule>>,
    /// The type's settings as of this version.
    pub config: ResolvedTypeConfig,
    /// What its turns may reach over HTTP (shared by its instances: it
    /// bounds their requests in flight).
    pub http: Arc<HttpGrant>,
}

/// One actor type.
pub struct TypeEntry {
    name: String,
    record: RwLock<TypeRecord>,
    latest: AtomicU32,
    deleted: AtomicBool,
    prepared: Mutex<HashMap<u32, Arc<OnceCell<Arc<PreparedVersion>>>>>,
    /// The current version's `rate_limit_per_s`, if it sets one.
    rate: RwLock<Option<Arc<TypeRate>>>,
}

/// A type's rate limit on this node: GCRA over every message its actors
/// take (see [`TypeConfig::rate_limit_per_s`]).
pub struct TypeRate {
    per_s: u32,
    burst: u32,
    limiter: DefaultDirectRateLimiter,
}

impl TypeRate {
    /// The limit `config` sets, if any.
    fn of(config: &TypeConfig) -> Option<Self> {
        let per_s = NonZeroU32::new(config.rate_limit_per_s?)?;
        let burst = config
            .rate_limit_burst
            .and_then(NonZeroU32::new)
            .unwrap_or(per_s);
        Some(Self {
            per_s: per_s.get(),
            burst: burst.get(),
            limiter: RateLimiter::direct(Quota::per_second(per_s).allow_burst(burst)),
        })
    }
}

/// A message refused by its type's rate limit.
#[derive(Debug, Clone, thiserror::Error)]
#[error(
    "actor type `{ty}` takes at most {per_s} messages per second on this node \
     (config.rate_limit_per_s); retry in {} ms",
    retry_after.as_millis()
)]
pub struct RateLimited {
    /// The type.
    pub ty: String,
    /// Its rate.
    pub per_s: u32,
    /// How long until a message would be taken.
    pub retry_after: Duration,
}

/// Why a version could not be loaded.
#[derive(Debug, thiserror::Error)]
pub enum LoadError {
    /// The version's code is missing from storage.
    #[error("code of {ty} version {version} is missing")]
    Missing {
        /// Type.
        ty: String,
        /// Version.
        version: u32,
    },
    /// Storage failed.
    #[error(transparent)]
    Storage(#[from] StorageError),
    /// The code no longer compiles (engine change?).
    #[error(transparent)]
    Code(#[from] CodeError),
    /// The stored config no longer parses.
    #[error("config of this version: {0}")]
    Config(String),
}

impl TypeEntry {
    fn new(record: TypeRecord) -> Self {
        Self {
            name: record.name.clone(),
            latest: AtomicU32::new(record.latest().version),
            rate: RwLock::new(TypeRate::of(&record.latest().config).map(Arc::new)),
            record: RwLock::new(record),
            deleted: AtomicBool::new(false),
            prepared: Mutex::new(HashMap::new()),
        }
    }

    /// Whether the type sets a rate limit.
    pub fn is_rate_limited(&self) -> bool {
        self.rate.read().expect("type rate lock").is_some()
    }

    /// Count one message to the type's actors against its rate limit:
    /// refused past it. Free when the type sets none.
    pub fn admit(&self) -> Result<(), RateLimited> {
        let rate = self.rate.read().expect("type rate lock");
        let Some(rate) = rate.as_ref() else {
            return Ok(());
        };
        rate.limiter.check().map_err(|not_until| RateLimited {
            ty: self.name.clone(),
            per_s: rate.per_s,
            retry_after: not_until.wait_time_from(DefaultClock::default().now()),
        })
    }

    /// The type's name.
    pub fn name(&self) -> &str {
        &self.name
    }

    /// The current version number.
    pub fn latest_version(&self) -> u32 {
        self.latest.load(Ordering::Acquire)
    }

    /// Whether the type was deleted (its actors must stop).
    pub fn is_deleted(&self) -> bool {
        self.deleted.load(Ordering::Acquire)
    }

    /// How the current version's code runs, read in place: the request
    /// path asks on every message, and a copy of the record costs as many
    /// allocations as the type has versions.
    pub fn latest_kind(&self) -> CodeKind {
        self.record.read().expect("type record lock").latest().kind
    }

    /// A copy of the stored record.
    pub fn record(&self) -> TypeRecord {
        self.record.read().expect("type record lock").clone()
    }

    /// The record of one version.
    pub fn version(&self, version: u32) -> Option<VersionRecord> {
        self.record
            .read()
            .expect("type record lock")
            .versions
            .iter()
            .find(|v| v.version == version)
            .cloned()
    }

    /// The compiled code of `version`, compiling or loading it on first use.
    pub async fn prepared(
        &self,
        version: u32,
        storage: &Arc<Storage>,
        sandbox: &Arc<Sandbox>,
        defaults: &TypeDefaults,
    ) -> Result<Arc<PreparedVersion>, LoadError> {
        let cell = self
            .prepared
            .lock()
            .expect("prepared lock")
            .entry(version)
            .or_default()
            .clone();
        cell.get_or_try_init(|| async {
            let meta = self.version(version).ok_or_else(|| LoadError::Missing {
                ty: self.name.clone(),
                version,
            })?;
            let code = storage
                .reader()?
                .code(&self.name, version)?
                .ok_or_else(|| LoadError::Missing {
                    ty: self.name.clone(),
                    version,
                })?;
            let sandbox = sandbox.clone();
            let js = meta.kind == CodeKind::Js;
            let js_module = if js {
                Some(Arc::new(js_module(&self.name, code.clone())?))
            } else {
                None
            };
            let agent = meta.kind == CodeKind::Agent;
            let manifest = agent.then(|| code.clone());
            let mut config = meta.config.resolve(defaults, js);
            if let Some(m) = manifest {
                with_manifest(&mut config, m)?;
            }
            let (module, resolved) = (js_module.clone(), config.clone());
            let pre = tokio::task::spawn_blocking(move || {
                if let Some(module) = module {
                    // Stored, so deployed: by a build that took modules no
                    // turn could run, maybe.
                    sandbox.js_type_engine_as_stored(&module, &resolved)
                } else if agent {
                    sandbox.agent_engine()
                } else {
                    sandbox.prepare(&code).map(Arc::new)
                }
            })
            .await
            .map_err(|e| {
                LoadError::Code(CodeError::Invalid(format!("compiler panicked: {e}")))
            })??;
            let http = Arc::new(HttpGrant::new(&config.http).map_err(LoadError::Config)?);
            Ok(Arc::new(PreparedVersion {
                version,
                pre,
                js_module,
                config,
                http,
            }))
        })
        .await
        .cloned()
    }

    /// The versions whose compiled code is cached, sorted.
    #[cfg(test)]
    pub(crate) fn cached_versions(&self) -> Vec<u32> {
        let mut v: Vec<u32> = self
            .prepared
            .lock()
            .expect("prepared lock")
            .keys()
            .copied()
            .collect();
        v.sort_unstable();
        v
    }

    /// Install a version that was just compiled for its deploy.
    fn install(&self, record: TypeRecord, prepared: Arc<PreparedVersion>) {
        let version = prepared.version;
        let mut cache = self.prepared.lock().expect("prepared lock");
        // Older versions leave the cache: an actor still running one holds
        // it itself, and an actor woken at one later loads it again (from
        // the code cache on disk). Every JavaScript version deployed kept
        // ~6 MB until the node restarted.
        cache.retain(|v, _| *v > version);
        cache.insert(version, Arc::new(OnceCell::new_with(Some(prepared))));
        drop(cache);
        // A deploy that keeps the limit keeps what its bucket has used.
        let config = &record.latest().config;
        let mut rate = self.rate.write().expect("type rate lock");
        let same = |r: &TypeRate| {
            Some(r.per_s) == config.rate_limit_per_s
                && r.burst == config.rate_limit_burst.unwrap_or(r.per_s)
        };
        if !rate.as_deref().is_some_and(same) {
            *rate = TypeRate::of(config).map(Arc::new);
        }
        drop(rate);
        *self.record.write().expect("type record lock") = record;
        self.latest.store(version, Ordering::Release);
    }
}

/// Give the agent component its manifest (an agent type's stored code).
pub fn with_manifest(config: &mut ResolvedTypeConfig, manifest: Vec<u8>) -> Result<(), CodeError> {
    let text = String::from_utf8(manifest)
        .map_err(|_| CodeError::Invalid("the stored agent manifest is not UTF-8".into()))?;
    config
        .env
        .insert(crate::agents::MANIFEST_ENV.to_owned(), text);
    Ok(())
}

/// The module a JavaScript type's stored code holds.
pub fn js_module(ty: &str, code: Vec<u8>) -> Result<JsModule, CodeError> {
    let source = String::from_utf8(code)
        .map_err(|_| CodeError::Script("the module is not valid UTF-8".into()))?;
    Ok(JsModule {
        name: format!("{ty}.js"),
        source,
    })
}

/// Every deployed type.
#[derive(Default)]
pub struct Catalog {
    types: RwLock<HashMap<String, Arc<TypeEntry>>>,
    /// Serializes deploys and deletes.
    pub(crate) deploy_lock: tokio::sync::Mutex<()>,
}

impl Catalog {
    /// Load every type record (code is compiled lazily).
    pub fn load(storage: &Storage) -> Result<Self, StorageError> {
        let catalog = Self::default();
        {
            let mut types = catalog.types.write().expect("catalog lock");
            for rec in storage.reader()?.types()? {
                types.insert(rec.name.clone(), Arc::new(TypeEntry::new(rec)));
            }
        }
        Ok(catalog)
    }

    /// A type by name.
    pub fn get(&self, name: &str) -> Option<Arc<TypeEntry>> {
        self.types.read().expect("catalog lock").get(name).cloned()
    }

    /// Every type, by name.
    pub fn all(&self) -> Vec<Arc<TypeEntry>> {
        let mut v: Vec<_> = self
            .types
            .read()
            .expect("catalog lock")
            .values()
            .cloned()
            .collect();
        v.sort_by(|a, b| a.name.cmp(&b.name));
        v
    }

    /// Record a committed deploy.
    pub(crate) fn install(&self, record: TypeRecord, prepared: Arc<PreparedVersion>) {
        let mut types = self.types.write().expect("catalog lock");
        match types.get(&record.name) {
            Some(entry) => entry.install(record, prepared),
            None => {
                let entry = TypeEntry::new(record.clone());
                entry.install(record.clone(), prepared);
                types.insert(record.name.clone(), Arc::new(entry));
            }
        }
    }

    /// Forget a type; its live actors see `is_deleted`.
    pub(crate) fn remove(&self, name: &str) -> Option<Arc<TypeEntry>> {
        let entry = self.types.write().expect("catalog lock").remove(name);
        if let Some(e) = &entry {
            e.deleted.store(true, Ordering::Release);
        }
        entry
    }

    /// Put back a type [`Self::remove`] took out (its delete was refused).
    pub(crate) fn restore(&self, entry: Arc<TypeEntry>) {
        entry.deleted.store(false, Ordering::Release);
        self.types
            .write()
            .expect("catalog lock")
            .insert(entry.name().to_owned(), entry);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn version(version: u32, kind: CodeKind) -> VersionRecord {
        VersionRecord {
            version,
            kind,
            sha256: String::new(),
            code_bytes: 0,
            config: Default::default(),
            deployed_at_ms: 0,
        }
    }

    #[test]
    fn latest_kind_is_the_current_versions() {
        let entry = TypeEntry::new(TypeRecord {
            name: "t".into(),
            created_at_ms: 0,
            versions: vec![version(1, CodeKind::Wasm), version(2, CodeKind::Agent)],
        });
        assert_eq!(entry.latest_kind(), CodeKind::Agent);
        *entry.record.write().unwrap() = TypeRecord {
            name: "t".into(),
            created_at_ms: 0,
            versions: vec![version(1, CodeKind::Agent), version(2, CodeKind::Js)],
        };
        assert_eq!(entry.latest_kind(), CodeKind::Js);
    }
}
