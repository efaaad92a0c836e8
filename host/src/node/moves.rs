//! Moving an actor to a node nearer its users, and placing a new one
//! there (docs/design.md "Placement and moves").
//!
//! Run by the owner of the slot the actor lives in:
//!
//! 1. **Fence**: its placement entry says this node is moving it (etcd
//!    compare-and-swap, also on the slot's record: only the slot's owner
//!    at its epoch can start). From then on requests for the actor wait
//!    and every node's writer refuses its commits.
//! 2. **Read** all its rows in the writer (after the fence: nothing can
//!    commit after the read).
//! 3. **Install** them on the owner of the new slot, which commits them
//!    there and on that slot's backup before it answers.
//! 4. **Switch**: the placement entry names the new slot (compare-and-swap
//!    on the entry this node wrote). This is the moment of the move.
//! 5. **Drop** the rows here (and on the old slot's backup).
//!
//! A failure before the switch undoes the fence (the rows in the old slot
//! are still the actor's); a node that finds a fence whose mover is gone
//! (it crashed, or lost the slot) undoes it the same way. A copy installed
//! on the target before an undone switch is never served (the entry does
//! not name its slot) and is replaced by the next move there.
//!
//! Placing a new actor is the same with nothing to read: if the actor
//! turns out to exist after the fence, it stays. So is forgetting the
//! placement of an actor that is gone (deleted, or never created): it
//! "moves" to its hash slot, which deletes its entry — after the owner of
//! the hash slot dropped any copy of the actor it kept from before (a move
//! out that crashed before its drop, a move in that was undone), which
//! would otherwise be served as the actor.

use std::collections::HashSet;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use serde::{Deserialize, Serialize};

use super::Node;
use crate::cluster::{Ask, Cluster, MoveStarted, Peers, Route};
use crate::ids::ActorKey;
use crate::storage::WriteOp;
use crate::storage::schema::ActorImage;

/// Actors this node is moving now: their requests wait here.
#[derive(Default)]
pub(super) struct Moves(Mutex<HashSet<ActorKey>>);

/// Removes its actor from [`Moves`] when the move ends, however it ends.
struct Moving<'m>(&'m Moves, ActorKey);

impl Drop for Moving<'_> {
    fn drop(&mut self) {
        self.0
            .0
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .remove(&self.1);
    }
}

impl Moves {
    fn begin(&self, key: &ActorKey) -> Option<Moving<'_>> {
        let mut set = self.0.lock().unwrap_or_else(|p| p.into_inner());
        set.insert(key.clone()).then(|| Moving(self, key.clone()))
    }

    fn contains(&self, key: &ActorKey) -> bool {
        self.0
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .contains(key)
    }
}

/// An actor's rows on their way to the owner of its new slot
/// (`POST /v1/cluster/move-in`, postcard).
#[derive(Debug, Serialize, Deserialize)]
pub struct MoveIn {
    /// The new slot.
    pub slot: u32,
    /// Its epoch, as the sender saw it.
    pub epoch: u64,
    /// The rows. The blobs its files name were sent ahead
    /// (`POST /v1/cluster/blobs`).
    pub image: ActorImage,
}

/// A copy of an actor that the owner of `slot` (at `epoch`) may keep from
/// before, to drop ahead of the removal of its placement entry
/// (`POST /v1/cluster/drop-copy`, postcard). The actor is gone where it
/// lived (checked under its fence), so the copy held then is stale.
#[derive(Debug, Serialize, Deserialize)]
pub struct DropCopy {
    /// The slot whose owner may keep a copy (the actor's hash slot).
    pub slot: u32,
    /// Its epoch, as the sender saw it.
    pub epoch: u64,
    /// The actor's type.
    pub actor_type: String,
    /// The actor's id.
    pub actor_id: String,
    /// `None`: only say which copy is held (its creation time). `Some`:
    /// drop the copy created then, if that is the one held.
    pub created_at_ms: Option<u64>,
}

/// What became of a move.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Moved {
    /// The actor lives in `slot` now.
    To { slot: u32 },
    /// It was in that region already.
    Already,
}

/// Why an actor was not moved. Nothing changed.
#[derive(Debug, thiserror::Error)]
pub enum MoveError {
    /// The actor does not exist.
    #[error("actor {0} does not exist")]
    NotFound(ActorKey),
    /// No live node is in the region.
    #[error("no live node is in region `{0}` (regions: {1})")]
    NoRegion(String, String),
    /// The region's nodes are all stopping or down now.
    #[error(
        "no node of region `{0}` can take actors now (its nodes are stopping or down); \
         retry later"
    )]
    RegionUnavailable(String),
    /// The node is not in a cluster.
    #[error("this node runs alone: there is nowhere to move an actor to")]
    NoCluster,
    /// Another move of the actor is under way, or the slot changed hands.
    #[error("{0}")]
    Busy(String),
    /// A step failed (etcd, the target node, storage).
    #[error("{0}")]
    Failed(String),
}

/// What the actor turned out to be after the fence.
enum Found {
    Nothing,
    Rows(Box<ActorImage>),
}

impl Node {
    /// Move `key`, which lives in a slot this node owns, to `region`.
    pub async fn move_actor(
        self: &Arc<Self>,
        key: &ActorKey,
        region: &str,
    ) -> Result<Moved, MoveError> {
        let cluster = self.cluster.clone().ok_or(MoveError::NoCluster)?;
        let to = slot_in(&cluster, key, region)?;
        let exists = self
            .actor_exists(key)
            .map_err(|e| MoveError::Failed(format!("cannot read actor {key}: {e}")))?;
        if !exists {
            return Err(MoveError::NotFound(key.clone()));
        }
        if cluster.region_of_slot(cluster.slot_of(key)).as_deref() == Some(region) {
            return Ok(Moved::Already);
        }
        self.relocate(&cluster, key, to, false).await
    }

    /// Place `key`, new, in `region`: `true` if it now lives there, `false`
    /// if it turned out to exist (it stays where it is).
    pub async fn place_new(
        self: &Arc<Self>,
        key: &ActorKey,
        region: &str,
    ) -> Result<bool, MoveError> {
        let cluster = self.cluster.clone().ok_or(MoveError::NoCluster)?;
        let to = slot_in(&cluster, key, region)?;
        Ok(self.relocate(&cluster, key, to, true).await? != Moved::Already)
    }

    /// Delete the placement entry of `key` if the actor does not exist
    /// (after the fence: nothing can create it meanwhile). `true` if the
    /// entry is gone; `false` if the actor exists, or had no entry.
    pub async fn forget_placement(self: &Arc<Self>, key: &ActorKey) -> Result<bool, MoveError> {
        let cluster = self.cluster.clone().ok_or(MoveError::NoCluster)?;
        if !cluster.placed(key) {
            return Ok(false);
        }
        let home = cluster.hash_slot(key);
        let forgotten = self.relocate(&cluster, key, home, true).await? != Moved::Already;
        if forgotten {
            self.metrics.cluster_placements_forgotten.inc();
        }
        Ok(forgotten)
    }

    /// In a cluster, forever: every few minutes, forget the placement
    /// entries of actors that are gone ([`Self::sweep_placements_once`]).
    pub(super) async fn sweep_placements(self: Arc<Self>) {
        if self.cluster.is_none() {
            return;
        }
        let every = std::env::var(PLACEMENT_SWEEP_ENV)
            .ok()
            .and_then(|v| v.parse().ok())
            .filter(|s| *s > 0)
            .map_or(Duration::from_secs(300), Duration::from_secs);
        let mut seen = HashSet::new();
        loop {
            tokio::time::sleep(every).await;
            self.sweep_placements_once(&mut seen).await;
        }
    }

    /// Forget the placement entries, in slots this node owns, of actors
    /// that do not exist here and whose entry has not changed since the
    /// last sweep (`seen`: so an actor being placed right now, whose first
    /// turn has not committed yet, keeps its entry). At most
    /// [`SWEEP_AT_ONCE`] per sweep.
    async fn sweep_placements_once(self: &Arc<Self>, seen: &mut HashSet<(ActorKey, i64)>) {
        let Some(cluster) = self.cluster.clone() else {
            return;
        };
        let now: HashSet<(ActorKey, i64)> = cluster.placements_owned().into_iter().collect();
        let (mut forgotten, mut tried) = (0, 0);
        for (key, revision) in now.intersection(seen) {
            if tried == SWEEP_AT_ONCE {
                break;
            }
            match self.actor_exists(key) {
                Ok(false) => tried += 1,
                Ok(true) => continue,
                Err(e) => {
                    tracing::warn!(actor = %key, error = %e, "placement sweep: cannot read actor");
                    continue;
                }
            }
            match self.forget_placement(key).await {
                Ok(true) => forgotten += 1,
                Ok(false) => {}
                Err(e) => {
                    tracing::debug!(actor = %key, revision, error = %e, "placement sweep: entry kept")
                }
            }
        }
        if forgotten > 0 {
            tracing::info!(
                entries = forgotten,
                "placement entries of actors that do not exist removed"
            );
        }
        *seen = now;
    }

    /// Whether this node is moving `key` now.
    pub fn is_moving(&self, key: &ActorKey) -> bool {
        self.moves.contains(key)
    }

    /// Undo the fence of a move whose mover is gone (or restarted), if
    /// this node owns the actor's slot. `true` if undone.
    pub async fn undo_stale_move(&self, key: &ActorKey) -> anyhow::Result<bool> {
        let Some(cluster) = &self.cluster else {
            return Ok(false);
        };
        if self.moves.contains(key) {
            return Ok(false);
        }
        let Route::Local { slot, .. } = cluster.route(key) else {
            return Ok(false);
        };
        let undone = cluster.undo_stale_move(key, slot).await?;
        if undone {
            tracing::warn!(actor = %key, slot, "undid the fence of a move whose mover is gone");
        }
        Ok(undone)
    }

    async fn relocate(
        self: &Arc<Self>,
        cluster: &Cluster,
        key: &ActorKey,
        to: u32,
        placing: bool,
    ) -> Result<Moved, MoveError> {
        let Route::Local { slot, epoch, .. } = cluster.route(key) else {
            return Err(MoveError::Busy(format!(
                "actor {key} is not served by this node now; retry"
            )));
        };
        let Some(_moving) = self.moves.begin(key) else {
            return Err(MoveError::Busy(format!(
                "a move of actor {key} is under way"
            )));
        };
        let started = cluster
            .start_move(key, slot, epoch)
            .await
            .map_err(|e| MoveError::Failed(format!("cannot fence actor {key}: {e:#}")))?
            .ok_or_else(|| {
                MoveError::Busy(format!("actor {key}'s slot or placement changed; retry"))
            })?;
        // Fenced: whatever the active instance would commit is refused.
        self.actors.registry().invalidate_where(|k| k == key);
        let found = self.read_fenced(key).await;
        let home = cluster.hash_slot(key);
        let result = match (found, placing) {
            (Err(e), _) => Err(e),
            (Ok(Found::Rows(_)), true) => Ok(Moved::Already),
            (Ok(Found::Nothing), false) => Err(MoveError::NotFound(key.clone())),
            // Forgetting the entry: what the hash slot's owner kept of the
            // actor goes first.
            (Ok(Found::Nothing), true) if to == home && to != started.from => self
                .drop_copy(cluster, key, to)
                .await
                .map(|()| Moved::To { slot: to }),
            (Ok(Found::Nothing), true) => Ok(Moved::To { slot: to }),
            (Ok(Found::Rows(image)), false) => self
                .ship(cluster, to, *image)
                .await
                .map(|()| Moved::To { slot: to }),
        };
        let Ok(Moved::To { slot: to }) = result else {
            self.end(cluster, key, started, started.from).await;
            return result;
        };
        if let Some(delay) = fault_delay() {
            tracing::warn!(actor = %key, ?delay, "fault injection ({FAULT_MOVE_DELAY_ENV}): holding a move before its switch");
            tokio::time::sleep(delay).await;
        }
        if !self.end(cluster, key, started, to).await {
            return Err(MoveError::Busy(format!(
                "actor {key}'s slot changed hands during the move; it stays where it was"
            )));
        }
        if !placing {
            let dropped = self
                .storage
                .writer()
                .call(|done| WriteOp::MoveOut {
                    key: key.clone(),
                    from: started.from,
                    to,
                    done,
                })
                .await;
            if let Err(e) = dropped {
                // The entry names the new slot: these rows are never
                // served again, only kept.
                tracing::warn!(actor = %key, error = %e, "cannot drop the rows of a moved actor");
            }
            self.actors.registry().invalidate_where(|k| k == key);
            self.actors
                .scheduler
                .notify(crate::alarms::scheduler::Notice::Reload);
            self.metrics.cluster_moves.inc();
        }
        if placing && to == home {
            tracing::info!(actor = %key, from = started.from, "placement entry removed");
        } else {
            tracing::info!(actor = %key, from = started.from, to, placing, "actor moved");
        }
        Ok(Moved::To { slot: to })
    }

    /// The fenced actor's rows.
    async fn read_fenced(&self, key: &ActorKey) -> Result<Found, MoveError> {
        let image = self
            .storage
            .writer()
            .call(|done| WriteOp::ReadImage {
                key: key.clone(),
                done,
            })
            .await
            .map_err(|e| MoveError::Failed(format!("cannot read actor {key}: {e}")))?;
        Ok(image.map_or(Found::Nothing, Found::Rows))
    }

    /// End the move at `to` (`started.from`: undo it). Whether the actor
    /// lives in `to` now, fence lifted — also when an answer from etcd was
    /// lost but the write landed (the failed compare re-reads the view).
    async fn end(&self, cluster: &Cluster, key: &ActorKey, started: MoveStarted, to: u32) -> bool {
        for attempt in 0..5u32 {
            match cluster.end_move(key, started, to).await {
                Ok(true) => return true,
                Ok(false) => break,
                Err(e) => {
                    tracing::warn!(actor = %key, attempt, error = %e, "cannot end a move yet");
                    tokio::time::sleep(Duration::from_millis(200 << attempt)).await;
                }
            }
        }
        // Otherwise the fence stays until this node (or the slot's next
        // owner) finds it stale and undoes it: the actor waits, nothing is
        // lost.
        cluster.slot_of(key) == to && cluster.moving(key).is_none()
    }

    /// Have the owner of `slot` drop its copy of `key`, which is gone
    /// where it lived (and fenced there). Two steps: learn which copy it
    /// holds (its creation time), then drop that copy — so that a drop
    /// arriving late, after this node gave up and lifted the fence and
    /// the id was used again, never takes the new actor's rows.
    async fn drop_copy(
        self: &Arc<Self>,
        cluster: &Cluster,
        key: &ActorKey,
        slot: u32,
    ) -> Result<(), MoveError> {
        let (epoch, base) = owner_of(cluster, slot, "the actor's hash slot cannot drop its copy")?;
        let mut request = DropCopy {
            slot,
            epoch,
            actor_type: key.ty().to_owned(),
            actor_id: key.id().to_owned(),
            created_at_ms: None,
        };
        let Some(held) = self.ask_drop_copy(base.as_deref(), &request).await? else {
            return Ok(());
        };
        request.created_at_ms = Some(held);
        self.ask_drop_copy(base.as_deref(), &request)
            .await
            .map(drop)
    }

    /// `request` on the node at `base` (`None`: this one).
    async fn ask_drop_copy(
        &self,
        base: Option<&str>,
        request: &DropCopy,
    ) -> Result<Option<u64>, MoveError> {
        let Some(base) = base else {
            return self.accept_drop_copy(request).await;
        };
        let body = postcard::to_stdvec(request)
            .map_err(|e| MoveError::Failed(format!("cannot encode the drop: {e}")))?;
        let answer = Peers::new(self.config.admin_token.clone())
            .drop_copy(base, body)
            .await
            .map_err(|e| MoveError::Failed(format!("the hash slot's owner refused: {e}")))?;
        Ok(answer["created_at_ms"].as_u64())
    }

    /// On the owner of `request.slot` (at `request.epoch`): without
    /// `created_at_ms`, the creation time of the copy of the actor held
    /// here, if any; with it, drop that copy (here and on the slot's
    /// backup) and answer its creation time if rows went. Durable when
    /// this returns.
    pub async fn accept_drop_copy(&self, request: &DropCopy) -> Result<Option<u64>, MoveError> {
        let cluster = self.cluster.clone().ok_or(MoveError::NoCluster)?;
        let key = ActorKey::new(&request.actor_type, &request.actor_id)
            .map_err(|e| MoveError::Failed(format!("no valid actor name: {e}")))?;
        let slot = request.slot;
        match cluster.route_slot(slot) {
            Route::Local { epoch, .. } if epoch == request.epoch => {}
            _ => {
                return Err(MoveError::Busy(format!(
                    "slot {slot} is not this node's at epoch {}",
                    request.epoch
                )));
            }
        }
        let Some(created_at_ms) = request.created_at_ms else {
            let held = self
                .storage
                .reader()
                .and_then(|r| r.actor(&key))
                .map_err(|e| MoveError::Failed(format!("cannot read actor {key}: {e}")))?;
            return Ok(held.map(|r| r.created_at_ms));
        };
        self.actors.registry().invalidate_where(|k| k == &key);
        let dropped = self
            .storage
            .writer()
            .call(|done| WriteOp::DropStale {
                key: key.clone(),
                slot,
                created_at_ms,
                done,
            })
            .await
            .map_err(|e| MoveError::Failed(format!("cannot drop the copy of {key}: {e}")))?;
        if dropped {
            tracing::info!(actor = %key, slot, "dropped a copy of an actor kept from before");
        }
        Ok(dropped.then_some(created_at_ms))
    }

    /// Install `image` on the owner of slot `to`.
    async fn ship(
        self: &Arc<Self>,
        cluster: &Cluster,
        to: u32,
        image: ActorImage,
    ) -> Result<(), MoveError> {
        let (epoch, base) = owner_of(cluster, to, "the new slot cannot take the actor")?;
        let request = MoveIn {
            slot: to,
            epoch,
            image,
        };
        match base {
            None => self.accept_move(request).await,
            Some(base) => {
                let peers = Peers::new(self.config.admin_token.clone());
                let shas = request.image.blob_shas().collect();
                crate::cluster::send_blobs(&peers, &self.storage, &base, shas, Ask::First)
                    .await
                    .map_err(|e| {
                        MoveError::Failed(format!("cannot send the files' blobs: {e:#}"))
                    })?;
                let body = postcard::to_stdvec(&request)
                    .map_err(|e| MoveError::Failed(format!("cannot encode the move: {e}")))?;
                peers
                    .move_in(&base, body)
                    .await
                    .map_err(|e| MoveError::Failed(format!("the new owner refused: {e}")))
            }
        }
    }

    /// Take an actor moved into `request.slot`, which this node must own
    /// at `request.epoch`: its rows are durable here and on the slot's
    /// backup when this returns. It starts (alarms, queued messages) once
    /// this node sees the switch.
    pub async fn accept_move(self: &Arc<Self>, request: MoveIn) -> Result<(), MoveError> {
        let cluster = self.cluster.clone().ok_or(MoveError::NoCluster)?;
        let MoveIn { slot, epoch, image } = request;
        match cluster.route_slot(slot) {
            Route::Local { epoch: e, used, .. } if e == epoch => {
                // The slot holds data from now on.
                if !used && !cluster.claim(slot, epoch).await.unwrap_or(false) {
                    return Err(MoveError::Busy(format!("slot {slot} changed hands")));
                }
            }
            _ => {
                return Err(MoveError::Busy(format!(
                    "slot {slot} is not this node's at epoch {epoch}"
                )));
            }
        }
        // Its files' blobs came ahead (or were here): held until the rows
        // naming them commit.
        let shas: Vec<[u8; 32]> = image.blob_shas().collect();
        let storage = self.storage.clone();
        let names = shas.clone();
        let _holds =
            tokio::task::spawn_blocking(move || super::replicas::hold_blobs(&storage, &names))
                .await
                .map_err(|e| MoveError::Failed(e.to_string()))?
                .map_err(|e| MoveError::Failed(format!("{e:#}")))?;
        let key = ActorKey::new(&image.actor_type, &image.actor_id)
            .map_err(|e| MoveError::Failed(format!("the moved actor has no valid name: {e}")))?;
        // An instance left here from an earlier stay would serve what it
        // remembers: it reloads the rows installed now.
        self.actors.registry().invalidate_where(|k| k == &key);
        self.storage
            .writer()
            .call(|done| WriteOp::MoveIn {
                image: Box::new(image),
                slot,
                done,
            })
            .await
            .map_err(|e| MoveError::Failed(format!("cannot install actor {key}: {e}")))?;
        self.staged_blobs.release(&shas);
        self.actors.registry().invalidate_where(|k| k == &key);
        // Start it once the switch is seen (bounded: an undone move never
        // switches).
        let node = self.clone();
        tokio::spawn(async move {
            let deadline = tokio::time::Instant::now() + Duration::from_secs(60);
            while tokio::time::Instant::now() < deadline {
                if cluster.slot_of(&key) == slot && cluster.moving(&key).is_none() {
                    node.start_actors(|k| k == &key);
                    return;
                }
                let _ = tokio::time::timeout(Duration::from_secs(1), cluster.changed()).await;
            }
        });
        Ok(())
    }
}

/// Environment variable: seconds between two sweeps of placement entries
/// (default 300; the tests shorten it).
pub const PLACEMENT_SWEEP_ENV: &str = "MARMOT_PLACEMENT_SWEEP_SECS";

/// The most placement entries one sweep tries to forget (each costs a few
/// etcd transactions and commits); the next sweep goes on.
const SWEEP_AT_ONCE: usize = 1000;

/// Environment variable: hold every move this long between the install on
/// the new owner and the switch (fault tests kill the mover there).
pub const FAULT_MOVE_DELAY_ENV: &str = "MARMOT_FAULT_MOVE_DELAY_MS";

fn fault_delay() -> Option<Duration> {
    std::env::var(FAULT_MOVE_DELAY_ENV)
        .ok()
        .and_then(|v| v.parse().ok())
        .map(Duration::from_millis)
}

/// The epoch of `slot` and its owner's URL (`None`: this node), or why
/// nobody can serve it (after `what`).
fn owner_of(cluster: &Cluster, slot: u32, what: &str) -> Result<(u64, Option<String>), MoveError> {
    match cluster.route_slot(slot) {
        Route::Local { epoch, .. } => Ok((epoch, None)),
        Route::Remote {
            epoch, advertise, ..
        } => Ok((epoch, Some(advertise))),
        Route::Unavailable { why, .. } => Err(MoveError::Failed(format!("{what}: {why}"))),
    }
}

/// The slot `key` goes to in `region`.
fn slot_in(cluster: &Cluster, key: &ActorKey, region: &str) -> Result<u32, MoveError> {
    cluster.slot_in_region(key, region).ok_or_else(|| {
        let regions: Vec<String> = cluster.regions().into_iter().collect();
        let shown = crate::cluster::shown_region(region);
        // A region whose nodes are all leaving (or whose slots failed
        // over elsewhere) is known: it was a 400 `unknown_region` that
        // listed the region it said had no node.
        if regions.iter().any(|r| r == region) {
            MoveError::RegionUnavailable(shown)
        } else {
            MoveError::NoRegion(shown, regions.join(", "))
        }
    })
}
