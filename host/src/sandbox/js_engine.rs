//! The built-in JavaScript engine: its own snapshot, shared by evals and
//! child scripts, and one snapshot per JavaScript type version with the
//! type's module already evaluated (see "One snapshot per JavaScript type
//! version" in docs/design.md).

use std::borrow::Cow;
use std::collections::HashMap;
use std::path::PathBuf;
use std::sync::{Arc, Mutex};

use sha2::{Digest, Sha256};

use super::caps::CapSet;
use super::snapshot::{Preinit, PreloadError, PreloadLimits};
use super::{CodeError, Host, InstanceSpec, JsModule, Prepared, Sandbox};
use crate::config::ResolvedTypeConfig;

/// In a preload's environment: only check that the module's top level runs
/// to its end, with randomness and timers allowed, and take no snapshot
/// (the engine's `PRELOAD_CHECK_ENV`, `actors/quickjs/src/engine.rs`).
const PRELOAD_CHECK_ENV: &str = "MARMOT_PRELOAD_CHECK";

/// How long a deploy waits for a checked top level that is waiting (on a
/// timer), not computing: past it, it passes, and the first turn runs it.
const CHECK_WAIT: std::time::Duration = std::time::Duration::from_secs(3);

/// The engine's snapshot and what builds snapshots, each made on first use.
#[derive(Default)]
pub(super) struct JsEngines {
    /// The engine's own snapshot, compiled.
    engine: Mutex<Option<Arc<Prepared>>>,
    /// The instrumented engine, compiled.
    preinit: Mutex<Option<Arc<Preinit>>>,
}

impl Sandbox {
    /// The built-in JavaScript engine, pre-initialized with Wizer and
    /// compiled (or loaded from the cache) on first use: what evals and
    /// child scripts run in, and what a JavaScript type runs in when its
    /// module cannot be preloaded. Blocking: call from a blocking thread
    /// inside the tokio runtime.
    pub fn js_engine(&self) -> Result<Arc<Prepared>, CodeError> {
        if let Some(p) = self.js_engine_if_ready() {
            return Ok(p);
        }
        let mut slot = self.js.engine.lock().expect("js engine lock");
        if let Some(p) = &*slot {
            return Ok(p.clone());
        }
        let started = std::time::Instant::now();
        let sha = hex::encode(Sha256::digest(crate::guests::QUICKJS));
        let path = self.config.cache_dir.join(format!(
            "quickjs-{}-{}.snapshot.wasm",
            &sha[..16],
            self.parts.hash
        ));
        let snapshot = match std::fs::read(&path) {
            Ok(bytes) => {
                self.cache.used(&path).for_life();
                bytes
            }
            Err(_) => {
                let config =
                    crate::config::TypeConfig::default().resolve(&Default::default(), true);
                let host = self.preload_host(&config, None);
                let preinit = self.preinit()?;
                let bytes = tokio::runtime::Handle::current()
                    .block_on(preinit.engine(&self.parts.linker, host))?;
                if let Some(file) = self.cache.store(&path, &bytes, "the engine snapshot") {
                    file.for_life();
                }
                bytes
            }
        };
        let (component, file) = self.compile(&snapshot)?;
        let prepared = Arc::new(self.link_js_engine(&component, file)?);
        tracing::info!(
            elapsed_ms = started.elapsed().as_millis() as u64,
            "JavaScript engine ready"
        );
        *slot = Some(prepared.clone());
        Ok(prepared)
    }

    /// The engine for one JavaScript type version: a snapshot taken after
    /// the module's top level ran, compiled (or loaded from the cache), so
    /// that a wake neither parses nor evaluates the module. A module whose
    /// top level draws random numbers, sets timers, calls the `marmot` API
    /// or exceeds the turn timeout gets the shared engine instead, and is
    /// loaded by each sandbox's first turn. A module no turn could run (its
    /// top level throws or exceeds the type's memory or CPU slice, its
    /// default export has no handler) is [`CodeError::Script`]: a deploy
    /// refuses it. Blocking:
    /// call from a blocking thread inside the tokio runtime.
    pub fn js_type_engine(
        &self,
        module: &JsModule,
        config: &ResolvedTypeConfig,
    ) -> Result<Arc<Prepared>, CodeError> {
        let shared = self.js_engine()?;
        let (cwasm, refused) = self.type_cache_paths(module, config);
        if let Some((c, file)) = self.load_cached(&cwasm) {
            return Ok(Arc::new(self.link_js_engine(&c, Some(file))?));
        }
        if refused.exists() {
            // A few bytes: kept for as long as the node runs.
            self.cache.used(&refused).for_life();
            return Ok(shared);
        }
        let started = std::time::Instant::now();
        let host = self.preload_host(config, Some(Arc::new(module.clone())));
        let preinit = self.preinit()?;
        let limits = PreloadLimits {
            timeout: config.turn_timeout,
        };
        let snapshot = tokio::runtime::Handle::current().block_on(preinit.type_version(
            &self.parts.linker,
            host,
            limits,
        ));
        let snapshot = match snapshot {
            Ok(bytes) => bytes,
            Err(PreloadError::Refused(why)) => {
                // Randomness or timers, which no snapshot may freeze, may
                // still be followed by a throw: run the top level once more
                // with them allowed (as a turn would run it), or every
                // actor's first turn would fail with it.
                self.check_top_level(&preinit, module, config)?;
                tracing::info!(module = %module.name, reason = %why, "module not preloaded: each sandbox evaluates it in its first turn");
                // Remembered, so a restart does not run its top level again.
                if let Some(file) = self
                    .cache
                    .store(&refused, why.as_bytes(), "a refused preload")
                {
                    file.for_life();
                }
                return Ok(shared);
            }
            Err(PreloadError::Invalid(why)) => return Err(CodeError::Script(why)),
            Err(PreloadError::TooSlow(why)) => {
                // Not remembered: the next start tries again.
                tracing::info!(module = %module.name, reason = %why, "module not preloaded this time: each sandbox evaluates it in its first turn");
                return Ok(shared);
            }
            Err(PreloadError::Failed(e)) => {
                tracing::warn!(module = %module.name, error = %e, "preloading a module failed; it runs on the shared engine");
                return Ok(shared);
            }
        };
        let compiling = std::time::Instant::now();
        let (component, file) = self.compile_into(&snapshot, &cwasm)?;
        let compile_ms = compiling.elapsed().as_millis() as u64;
        let prepared = Arc::new(self.link_js_engine(&component, file)?);
        tracing::info!(
            module = %module.name,
            elapsed_ms = started.elapsed().as_millis() as u64,
            compile_ms,
            "module preloaded into its own snapshot"
        );
        Ok(prepared)
    }

    /// [`Self::js_type_engine`] for a version that was deployed already,
    /// here or on a peer: a module no turn could run, which a deploy now
    /// refuses but an earlier build took, gets the shared engine (as it
    /// did then) and a warning, and each of its turns says what is wrong.
    pub fn js_type_engine_as_stored(
        &self,
        module: &JsModule,
        config: &ResolvedTypeConfig,
    ) -> Result<Arc<Prepared>, CodeError> {
        self.js_type_engine(module, config).or_else(|e| match e {
            CodeError::Script(why) => {
                tracing::warn!(module = %module.name, error = %why,
                    "this module cannot serve a turn; redeploy it");
                self.js_engine()
            }
            e => Err(e),
        })
    }

    /// The built-in JavaScript engine, compiled on a blocking thread if it
    /// is not yet.
    pub async fn js_engine_async(self: &Arc<Self>) -> Result<Arc<Prepared>, CodeError> {
        if let Some(e) = self.js_engine_if_ready() {
            return Ok(e);
        }
        let this = self.clone();
        tokio::task::spawn_blocking(move || this.js_engine())
            .await
            .map_err(|e| CodeError::Invalid(format!("compiler panicked: {e}")))?
    }

    /// The JavaScript engine if it is already compiled (never blocks on a
    /// compile).
    pub fn js_engine_if_ready(&self) -> Option<Arc<Prepared>> {
        self.js
            .engine
            .try_lock()
            .ok()
            .and_then(|slot| slot.as_ref().cloned())
    }

    /// The instrumented engine, compiled (or loaded from the cache) once.
    fn preinit(&self) -> Result<Arc<Preinit>, CodeError> {
        let mut slot = self.js.preinit.lock().expect("preinit lock");
        if let Some(p) = &*slot {
            return Ok(p.clone());
        }
        // Kept for as long as the node runs, like the preinit itself.
        let p = Arc::new(Preinit::new(crate::guests::QUICKJS, |wasm| {
            let (component, file) = self.compile(wasm)?;
            if let Some(file) = file {
                file.for_life();
            }
            Ok(component)
        })?);
        *slot = Some(p.clone());
        Ok(p)
    }

    /// Run `module`'s top level to its end with randomness and timers
    /// allowed (nothing is snapshotted): a throw, or the type's CPU or
    /// memory limit, means no turn could run it. One that reaches for the
    /// `marmot` API is still refused there and passes: only a turn can
    /// tell. So does one still waiting after [`CHECK_WAIT`] (a deploy is
    /// not held for a turn's 15 minutes).
    fn check_top_level(
        &self,
        preinit: &Preinit,
        module: &JsModule,
        config: &ResolvedTypeConfig,
    ) -> Result<(), CodeError> {
        let host = self.preload_host_for(config, Some(Arc::new(module.clone())), true);
        let limits = PreloadLimits {
            timeout: config.turn_timeout.min(CHECK_WAIT),
        };
        let checked = tokio::runtime::Handle::current().block_on(preinit.check_top_level(
            &self.parts.linker,
            host,
            limits,
        ));
        match checked {
            Err(PreloadError::Invalid(why)) => Err(CodeError::Script(why)),
            // Finished, used the `marmot` API, or waited past the turn
            // timeout (not computing): the first turn runs it, as before.
            Ok(()) | Err(PreloadError::Refused(_) | PreloadError::TooSlow(_)) => Ok(()),
            Err(PreloadError::Failed(e)) => {
                tracing::warn!(module = %module.name, error = %e, "checking a module's top level failed");
                Ok(())
            }
        }
    }

    /// Store data for a pre-initialization: no capabilities (the `marmot`
    /// API traps), the type's limits.
    fn preload_host(&self, config: &ResolvedTypeConfig, module: Option<Arc<JsModule>>) -> Host {
        self.preload_host_for(config, module, false)
    }

    /// [`Self::preload_host`], for a check of the top level (`check`) or
    /// for a snapshot. The type's own environment cannot ask for a check:
    /// a snapshot taken with randomness and timers allowed would give
    /// every actor of the type the same "random" values.
    fn preload_host_for(
        &self,
        config: &ResolvedTypeConfig,
        module: Option<Arc<JsModule>>,
        check: bool,
    ) -> Host {
        let mut config = Cow::Borrowed(config);
        if check || config.env.contains_key(PRELOAD_CHECK_ENV) {
            let env = &mut config.to_mut().env;
            env.remove(PRELOAD_CHECK_ENV);
            if check {
                env.insert(PRELOAD_CHECK_ENV.into(), "1".into());
            }
        }
        let config = &*config;
        let spec = InstanceSpec {
            config,
            js_module: module,
            actors: None,
            http: None,
            models: None,
        };
        Host::new(
            spec,
            None,
            CapSet::NONE,
            self.tick_ms,
            self.config.output_capacity,
            None,
            // Deploy-time work, bounded by the type's own limits.
            None,
        )
    }

    /// Where a type version's compiled snapshot, or the reason it has
    /// none, is cached: named by what the preload depends on.
    fn type_cache_paths(
        &self,
        module: &JsModule,
        config: &ResolvedTypeConfig,
    ) -> (PathBuf, PathBuf) {
        let mut h = Sha256::new();
        h.update(Sha256::digest(crate::guests::QUICKJS));
        for part in [module.name.as_bytes(), module.source.as_bytes()] {
            h.update((part.len() as u64).to_le_bytes());
            h.update(part);
        }
        h.update(config.max_memory_bytes.to_le_bytes());
        h.update((config.cpu_slice.as_micros() as u64).to_le_bytes());
        h.update((config.turn_timeout.as_micros() as u64).to_le_bytes());
        for (k, v) in &config.env {
            for part in [k, v] {
                h.update((part.len() as u64).to_le_bytes());
                h.update(part.as_bytes());
            }
        }
        let key = hex::encode(h.finalize());
        let stem = format!("quickjs-type-{}-{}", &key[..24], self.parts.hash);
        let dir = &self.config.cache_dir;
        (
            dir.join(format!("{stem}.cwasm")),
            dir.join(format!("{stem}.refused")),
        )
    }
}

/// Cranelift's incremental compilation cache. A type version's snapshot
/// differs from the engine's only in its data, so compiling it finds every
/// function here. Kept in one file in the compiled-code cache, so that a
/// node whose engine snapshot was already compiled does not compile the
/// engine's functions again for its first type version; read into memory
/// when a compile first asks, and dropped from memory after each compile
/// ([`CompileCache::release`]), so an idle node does not hold it (12 MB for
/// the engine). Bounded: when full it starts again empty.
#[derive(Debug)]
pub(super) struct CompileCache {
    entries: Mutex<CacheEntries>,
    /// Where the entries are kept between runs.
    file: PathBuf,
}

#[derive(Debug, Default)]
struct CacheEntries {
    map: HashMap<Vec<u8>, Vec<u8>>,
    bytes: usize,
    /// Whether `map` holds what the file held.
    loaded: bool,
    /// Inserted since the file was written.
    dirty: bool,
}

impl CacheEntries {
    fn insert(&mut self, key: Vec<u8>, value: Vec<u8>) {
        let size = key.len() + value.len();
        if self.bytes + size > CompileCache::CAPACITY {
            self.map.clear();
            self.bytes = 0;
        }
        self.bytes += size;
        self.map.insert(key, value);
    }
}

impl CompileCache {
    /// Bytes of compiled functions kept.
    const CAPACITY: usize = 64 << 20;
    /// The file's first bytes; the format's version is part of them. Then,
    /// per entry: key length (u32 LE), key, value length (u32 LE), value.
    const MAGIC: &'static [u8] = b"marmot-cranelift-cache-v1\n";

    /// The cache kept in `file` (read on first use).
    pub(super) fn open(file: PathBuf) -> Self {
        Self {
            entries: Mutex::new(CacheEntries::default()),
            file,
        }
    }

    /// The entries, read from the file if they are not in memory. An
    /// unreadable or malformed file counts as empty: it is only a cache.
    fn entries(&self) -> std::sync::MutexGuard<'_, CacheEntries> {
        let mut entries = self.entries.lock().expect("compile cache lock");
        if entries.loaded {
            return entries;
        }
        entries.loaded = true;
        if let Ok(bytes) = std::fs::read(&self.file)
            && let Some(mut rest) = bytes.strip_prefix(Self::MAGIC)
        {
            fn field<'a>(rest: &mut &'a [u8]) -> Option<&'a [u8]> {
                let (len, tail) = rest.split_first_chunk::<4>()?;
                let len = u32::from_le_bytes(*len) as usize;
                let (value, tail) = (tail.get(..len)?, tail.get(len..)?);
                *rest = tail;
                Some(value)
            }
            let mut read = CacheEntries::default();
            while !rest.is_empty() {
                let (Some(k), Some(v)) = (field(&mut rest), field(&mut rest)) else {
                    read = CacheEntries::default();
                    break;
                };
                read.insert(k.to_vec(), v.to_vec());
            }
            read.loaded = true;
            *entries = read;
        }
        entries
    }

    /// After a compile: write the entries to the file if any were added,
    /// and drop them from memory.
    pub(super) fn release(&self) {
        let mut entries = self.entries.lock().expect("compile cache lock");
        if !entries.dirty {
            *entries = CacheEntries::default();
            return;
        }
        let mut out = Vec::with_capacity(Self::MAGIC.len() + entries.bytes + 8 * entries.map.len());
        out.extend_from_slice(Self::MAGIC);
        for (k, v) in &entries.map {
            for part in [k, v] {
                out.extend_from_slice(&(part.len() as u32).to_le_bytes());
                out.extend_from_slice(part);
            }
        }
        if let Err(e) = super::write_atomic(&self.file, &out) {
            tracing::warn!(path = %self.file.display(), error = %e, "failed to write the compile cache");
        }
        *entries = CacheEntries::default();
    }
}

impl wasmtime::CacheStore for CompileCache {
    fn get(&self, key: &[u8]) -> Option<Cow<'_, [u8]>> {
        self.entries().map.get(key).map(|v| Cow::Owned(v.clone()))
    }

    fn insert(&self, key: &[u8], value: Vec<u8>) -> bool {
        let mut entries = self.entries();
        entries.insert(key.to_vec(), value);
        entries.dirty = true;
        true
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use wasmtime::CacheStore;

    #[test]
    fn the_compile_cache_survives_a_restart_and_ignores_a_damaged_file() {
        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join("cache");
        let cache = CompileCache::open(file.clone());
        assert!(cache.get(b"k").is_none());
        assert!(cache.insert(b"k", b"compiled".to_vec()));
        assert!(cache.insert(b"", Vec::new()));
        cache.release();
        assert_eq!(
            cache.get(b"k").as_deref(),
            Some(&b"compiled"[..]),
            "read again"
        );
        let again = CompileCache::open(file.clone());
        assert_eq!(again.get(b"k").as_deref(), Some(&b"compiled"[..]));
        assert_eq!(again.get(b"").as_deref(), Some(&b""[..]));
        // Cut short: nothing of it is trusted.
        let bytes = std::fs::read(&file).unwrap();
        std::fs::write(&file, &bytes[..bytes.len() - 3]).unwrap();
        assert!(CompileCache::open(file.clone()).get(b"k").is_none());
        std::fs::write(&file, b"something else").unwrap();
        assert!(CompileCache::open(file).get(b"k").is_none());
    }

    #[test]
    fn the_compile_cache_is_bounded() {
        let dir = tempfile::tempdir().unwrap();
        let cache = CompileCache::open(dir.path().join("cache"));
        let big = vec![0u8; CompileCache::CAPACITY / 2];
        cache.insert(b"a", big.clone());
        cache.insert(b"b", big);
        assert!(cache.get(b"a").is_none(), "full: started again");
        assert!(cache.get(b"b").is_some());
    }
}
