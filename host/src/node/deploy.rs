//! Deploying a type's new version (checked, compiled and linked before
//! anything is stored) and deleting a type.

use std::sync::Arc;
use std::time::Duration;

use serde::Serialize;
use sha2::{Digest, Sha256};

use super::Node;
use crate::catalog::PreparedVersion;
use crate::clock::now_ms;
use crate::config::TypeConfig;
use crate::ids::validate_type_name;
use crate::sandbox::{CodeError, HttpGrant, InstanceSpec, InstantiateError};
use crate::storage::schema::{CodeKind, TypeRecord, VersionRecord};
use crate::storage::{StorageError, WriteOp};

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
    /// The version number the cluster gave this deploy is taken here by
    /// other code, or is behind this node's latest.
    #[error("{0}")]
    VersionConflict(String),
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

/// One type as [`Node::catalog_export`] gives it.
pub struct CatalogEntry {
    pub ty: String,
    /// Its number on the exporting node (every node numbers a type's
    /// versions alike: see [`Node::deploy_numbered`]).
    pub version: u32,
    pub kind: CodeKind,
    pub code: Vec<u8>,
    pub config: TypeConfig,
}

/// The most CPU and wall time a deploy's check of new code may take (as a
/// JavaScript module's top level may).
const CHECK_LIMIT: Duration = Duration::from_secs(10);

/// Where a deploy comes from.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Origin {
    /// A user: everything is checked.
    User,
    /// A peer's catalog: deployed there already, maybe by an earlier build
    /// that took JavaScript modules no turn could run. This node must serve
    /// the type as the peer does, so such a module is installed as it was.
    Peer,
}

/// `deployed`, with a log line when it was refused: the client is told
/// why, and an operator reading the log sees that a deploy (a pipeline's,
/// say) failed, which it did not.
fn refused_logged(
    ty: &str,
    deployed: Result<Deployed, DeployError>,
) -> Result<Deployed, DeployError> {
    if let Err(e) = &deployed {
        tracing::info!(ty, error = %e, "deploy refused");
    }
    deployed
}

impl Node {
    /// Deploy a new version of `ty`.
    pub async fn deploy(
        &self,
        ty: &str,
        kind: CodeKind,
        code: Vec<u8>,
        config: TypeConfig,
    ) -> Result<Deployed, DeployError> {
        refused_logged(
            ty,
            self.deploy_from(Origin::User, ty, kind, code, config, None)
                .await,
        )
    }

    /// [`Self::deploy`] as version `version`, the number the node that
    /// took the deploy first gave it (a cluster-wide deploy reaching this
    /// node): every node numbers a type's versions alike, so an actor
    /// moved or failed over to another node finds its version there. (Each
    /// node numbered its own, and a node that joined later, or missed
    /// deploys, held the latest code under another number: actors that
    /// came to it failed with "code of version N is missing", found by a
    /// probe.) The same code under that number is a no-op; other code
    /// under it, or a number behind this node's latest, is refused.
    pub async fn deploy_numbered(
        &self,
        ty: &str,
        kind: CodeKind,
        code: Vec<u8>,
        config: TypeConfig,
        version: u32,
    ) -> Result<Deployed, DeployError> {
        refused_logged(
            ty,
            self.deploy_from(Origin::User, ty, kind, code, config, Some(version))
                .await,
        )
    }

    /// Install `ty` as a peer's catalog holds it (catching up with the
    /// cluster): [`Self::deploy`], but a JavaScript module that no turn
    /// could run is taken, as the build that deployed it took it, rather
    /// than stopping the catch-up. Its version keeps the peer's number, as
    /// [`Self::deploy_numbered`].
    pub async fn deploy_from_peer(
        &self,
        ty: &str,
        kind: CodeKind,
        code: Vec<u8>,
        config: TypeConfig,
        version: u32,
    ) -> Result<Deployed, DeployError> {
        self.deploy_from(Origin::Peer, ty, kind, code, config, Some(version))
            .await
    }

    async fn deploy_from(
        &self,
        origin: Origin,
        ty: &str,
        kind: CodeKind,
        code: Vec<u8>,
        config: TypeConfig,
        numbered: Option<u32>,
    ) -> Result<Deployed, DeployError> {
        validate_type_name(ty)?;
        if code.len() > self.config.limits.max_code_bytes {
            return Err(DeployError::TooLarge {
                size: code.len(),
                limit: self.config.limits.max_code_bytes,
            });
        }
        // A peer's version was checked by the node it was deployed on, by
        // the build it ran: checks added since (bounds, starting the code)
        // would stop a node from catching up with the cluster's types.
        let new = origin == Origin::User;
        config
            .validate(&self.config.limits)
            .and_then(|()| match new {
                true => config.validate_bounds(),
                false => Ok(()),
            })
            .and_then(|()| crate::webhooks::check_type_config(&config))
            .map_err(DeployError::Config)?;
        let sha256 = hex::encode(Sha256::digest(&code));
        let _guard = self.catalog.deploy_lock.lock().await;
        let existing = self.catalog.get(ty);
        if let (Some(n), Some(e)) = (numbered, &existing) {
            if let Some(v) = e.version(n) {
                if v.sha256 == sha256 && v.config == config && v.kind == kind {
                    return Ok(Deployed {
                        ty: ty.to_owned(),
                        version: n,
                        kind: v.kind.as_str(),
                        sha256,
                        created: false,
                    });
                }
                return Err(DeployError::VersionConflict(format!(
                    "version {n} of `{ty}` is other code on this node: its catalog differs \
                     from the cluster's (deploy the type again to make them one)"
                )));
            }
            if n < e.latest_version() {
                return Err(DeployError::VersionConflict(format!(
                    "version {n} of `{ty}` is behind this node's latest ({}): its catalog \
                     differs from the cluster's (deploy the type again to make them one)",
                    e.latest_version()
                )));
            }
        }
        if let (None, Some(e)) = (numbered, &existing) {
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
        let mut resolved = config.resolve(&self.config.defaults, js);
        let http = Arc::new(HttpGrant::new(&resolved.http).map_err(DeployError::Config)?);
        let (pre, js_module) = if kind == CodeKind::Agent {
            crate::catalog::with_manifest(&mut resolved, code.clone())?;
            let sandbox = self.sandbox.clone();
            let engine = tokio::task::spawn_blocking(move || sandbox.agent_engine())
                .await
                .map_err(|e| CodeError::Invalid(format!("compiler panicked: {e}")))??;
            (engine, None)
        } else if js {
            let module = Arc::new(crate::catalog::js_module(ty, code.clone())?);
            self.check_js_with_room(&module.name, &module.source, &resolved)
                .await?;
            let sandbox = self.sandbox.clone();
            let (m, config) = (module.clone(), resolved.clone());
            let engine = tokio::task::spawn_blocking(move || match origin {
                Origin::User => sandbox.js_type_engine(&m, &config),
                Origin::Peer => sandbox.js_type_engine_as_stored(&m, &config),
            })
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
        if new && js_module.is_none() {
            let what = match kind {
                CodeKind::Agent => "the agent harness",
                _ => "the component",
            };
            self.check_starts(&pre, &resolved, what).await?;
        }
        let now = now_ms();
        let mut record = existing.as_ref().map(|e| e.record()).unwrap_or(TypeRecord {
            name: ty.to_owned(),
            created_at_ms: now,
            versions: Vec::new(),
        });
        let version = match numbered {
            Some(v) => v,
            None => match record.versions.last() {
                None => 1,
                Some(v) => v.version.checked_add(1).ok_or_else(|| {
                    DeployError::VersionConflict(format!(
                        "type `{ty}` has reached the highest version number ({})",
                        v.version
                    ))
                })?,
            },
        };
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
            http,
        });
        self.catalog.install(record, prepared);
        tracing::info!(ty, version, %sha256, "deployed");
        // Queued messages held back by the last version's upgrade try again.
        self.registry().retry_deferred_of_type(&self.actors, ty);
        Ok(Deployed {
            ty: ty.to_owned(),
            version,
            kind: kind.as_str(),
            sha256,
            created: true,
        })
    }

    /// Every live type's current version with its code and config: what
    /// a node joining a cluster needs to serve any actor.
    pub fn catalog_export(&self) -> Result<Vec<CatalogEntry>, StorageError> {
        let reader = self.storage.reader()?;
        let mut out = Vec::new();
        for entry in self.catalog.all() {
            if entry.is_deleted() {
                continue;
            }
            let Some(v) = entry.version(entry.latest_version()) else {
                continue;
            };
            if let Some(code) = reader.code(entry.name(), v.version)? {
                out.push(CatalogEntry {
                    ty: entry.name().to_owned(),
                    version: v.version,
                    kind: v.kind,
                    code,
                    config: v.config,
                });
            }
        }
        Ok(out)
    }

    /// Delete a type (and with `force` its actors).
    pub async fn delete_type(&self, ty: &str, force: bool) -> Result<u64, DeleteTypeError> {
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
        let removed = self.catalog.remove(ty);
        let registry = self.registry();
        for _ in 0..500 {
            registry.hibernate_type(ty);
            if registry.count_type(ty) == 0 {
                break;
            }
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        // Actors still busy after 5 s (a long turn) may finish, but nothing
        // they commit from now on lands: the delete below is final.
        registry.fence_type(ty);
        let name = ty.to_owned();
        let deleted = self
            .storage
            .writer()
            .call(|done| WriteOp::DeleteType {
                name,
                with_actors: force,
                done,
            })
            .await;
        let deleted = match deleted {
            Ok(Ok(n)) => n,
            // Made (or handed over) since the count above: without `force`
            // they are not deleted, and the type is back as it was (they
            // were deleted with it, unasked: a probe).
            Ok(Err(count)) => {
                if let Some(entry) = removed {
                    self.catalog.restore(entry);
                }
                return Err(DeleteTypeError::HasActors {
                    ty: ty.to_owned(),
                    count,
                });
            }
            Err(e) => return Err(e.into()),
        };
        // Their event streams end, as a single actor's do when it is
        // deleted (they went on, and followed a new actor of the same name
        // from where the old log had been, skipping its first events).
        self.event_bus.publish_type_deleted(ty);
        // Its usage rows went with it: a type of the same name starts anew.
        self.models.ledger().forget_type(ty);
        tracing::info!(ty, actors_deleted = deleted, "type deleted");
        Ok(deleted)
    }
}

impl Node {
    /// Check a JavaScript module in a sandbox of the node's pool, which a
    /// deploy gets as a waking actor does: when every sandbox is held, idle
    /// actors are asked to make way for about two seconds; then the deploy
    /// is refused as busy (a 503 to retry), never as bad code. It was a 400
    /// `invalid_code` while the pool was full (found by a probe).
    async fn check_js_with_room(
        &self,
        name: &str,
        source: &str,
        config: &crate::config::ResolvedTypeConfig,
    ) -> Result<(), CodeError> {
        let engine = self.sandbox.js_engine_async().await?;
        let mut inst = self
            .instantiate_to_check(&engine, config, "the JavaScript engine")
            .await?;
        inst.check_js(name, source).await.map_err(CodeError::Script)
    }

    /// Start an instance of a Wasm or agent type's code under its limits
    /// and drop it: code that cannot start (a memory it declares larger
    /// than the type's `max_memory_bytes`, a start function that traps) is
    /// refused here rather than deployed to fail every call (found by a
    /// probe: 201, then 500 `actor_trapped` on each message).
    ///
    /// It holds the deploy lock, so it runs under at most [`CHECK_LIMIT`]
    /// of CPU and wall time, whatever the type allows its turns.
    async fn check_starts(
        &self,
        pre: &crate::sandbox::Prepared,
        config: &crate::config::ResolvedTypeConfig,
        what: &str,
    ) -> Result<(), CodeError> {
        let mut capped = config.clone();
        capped.cpu_slice = capped.cpu_slice.min(CHECK_LIMIT);
        capped.turn_timeout = capped.turn_timeout.min(CHECK_LIMIT);
        self.instantiate_to_check(pre, &capped, what).await?;
        Ok(())
    }

    /// An instance of `pre` with no capabilities, for a deploy's checks,
    /// made as a waking actor's is (idle actors make way for it).
    async fn instantiate_to_check(
        &self,
        pre: &crate::sandbox::Prepared,
        config: &crate::config::ResolvedTypeConfig,
        what: &str,
    ) -> Result<crate::sandbox::Instance, CodeError> {
        let spec = || InstanceSpec {
            config,
            js_module: None,
            actors: None,
            http: None,
            models: None,
        };
        crate::actor::instantiate_with_room(&self.actors, pre, spec)
            .await
            .map_err(|e| match e {
                InstantiateError::TooManyJs(_) | InstantiateError::NoRoom(_) => {
                    CodeError::Busy(format!("cannot check the module: {e}"))
                }
                InstantiateError::Failed(_) => {
                    CodeError::Invalid(format!("cannot start {what}: {e}"))
                }
            })
    }
}
