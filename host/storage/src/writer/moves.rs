//! Moving one actor between slots (to a node nearer its users), in the
//! writer: the source reads the fenced actor's rows, the target installs
//! them in its new slot, and once the switch is made the source drops its
//! copy. Each step is replicated to the backup of the slot it writes, so a
//! failover at any point finds the rows where the placement says they are.

use marmot_core::ids::ActorKey;
use redb::ReadableTable;

use super::WriterState;
use super::replica::Placement;
use super::tables::Tables;
use crate::StorageError;
use crate::schema::*;

impl WriterState {
    /// All of `key`'s rows, if it exists.
    pub(super) fn read_image(
        &mut self,
        tables: &mut Tables<'_>,
        key: &ActorKey,
    ) -> Result<Option<Box<ActorImage>>, StorageError> {
        let record: ActorRecord = match tables.actors()?.get((key.ty(), key.id()))? {
            Some(v) => decode("actor", v.value())?,
            None => return Ok(None),
        };
        let mut image = tables.actor_image(key, record)?;
        let outgoing = tables.outgoing_where(|k| k == key)?;
        image.deliveries = outgoing.deliveries.into_iter().map(|(_, r)| r).collect();
        image.relays = outgoing.relays.into_iter().map(|(_, r)| r).collect();
        Ok(Some(Box::new(image)))
    }

    /// Whether `slot` has a node catching up to become its backup that
    /// has not got the slot's snapshot yet: an actor moved in now would be
    /// in neither the snapshot (read before the switch) nor the writes
    /// that follow it.
    pub(super) fn awaiting_snapshot(&mut self, slot: u32) -> bool {
        let raw = self.raw_slot_placement(slot);
        matches!(raw, Some(Placement::Joining { .. })) && self.taken(raw) == Placement::Here
    }

    /// Install a moved actor's rows in `slot` (owned here): whatever copy
    /// this node held of the actor goes first (an earlier move that was
    /// undone, or the copy it keeps as a backup of the old slot — the same
    /// rows, the actor being fenced).
    pub(super) fn move_in(
        &mut self,
        tables: &mut Tables<'_>,
        image: &ActorImage,
        slot: u32,
        created: &mut i64,
    ) -> Result<(), StorageError> {
        let key = ActorKey::new(&image.actor_type, &image.actor_id).map_err(|e| {
            StorageError::Unavailable(format!("a moved actor has no valid name: {e}"))
        })?;
        if tables.delete_actor(&key)? {
            *created -= 1;
        }
        let stale = tables.outgoing_where(|k| *k == key)?;
        tables.drop_outgoing(&stale)?;
        self.install(tables, image, created)?;
        self.copy_of.insert(key.clone(), slot);
        let at = self.slot_placement(slot);
        self.record_at(at, || ReplicaOp::Delete {
            actor_type: image.actor_type.clone(),
            actor_id: image.actor_id.clone(),
        });
        self.record_at(at, || ReplicaOp::Install(Box::new(image.clone())));
        Ok(())
    }

    /// `key` moved from `from` (owned here) to `to`: drop its rows here
    /// unless this node keeps `to`'s rows too, and tell `from`'s backup.
    /// Whether rows went.
    pub(super) fn move_out(
        &mut self,
        tables: &mut Tables<'_>,
        key: &ActorKey,
        from: u32,
        to: u32,
        created: &mut i64,
    ) -> Result<bool, StorageError> {
        let dropped = self.moved_out(tables, key, to, created)?;
        let at = self.slot_placement(from);
        self.record_at(at, || ReplicaOp::Moved {
            actor_type: key.ty().to_owned(),
            actor_id: key.id().to_owned(),
            to,
        });
        Ok(dropped)
    }

    /// Drop `key`'s rows (its outgoing ones too: they moved with it), moved
    /// to `to`, unless this node keeps `to`'s.
    pub(super) fn moved_out(
        &mut self,
        tables: &mut Tables<'_>,
        key: &ActorKey,
        to: u32,
        created: &mut i64,
    ) -> Result<bool, StorageError> {
        if self.replication.get().is_some_and(|r| r.holds(to)) {
            self.copy_of.insert(key.clone(), to);
            return Ok(false);
        }
        self.copy_of.remove(key);
        let dropped = tables.delete_actor(key)?;
        if dropped {
            *created -= 1;
        }
        let outgoing = tables.outgoing_where(|k| k == key)?;
        tables.drop_outgoing(&outgoing)?;
        Ok(dropped)
    }

    /// `key`'s copy in `slot` (owned here: checked by the caller), created
    /// at `created_at_ms`, is stale: drop it here and on the slot's
    /// backup. Whether rows went.
    pub(super) fn drop_stale(
        &mut self,
        tables: &mut Tables<'_>,
        key: &ActorKey,
        slot: u32,
        created_at_ms: u64,
        created: &mut i64,
    ) -> Result<bool, StorageError> {
        let at = self.slot_placement(slot);
        let dropped = dropped_if_stale(tables, key, created_at_ms, created)?;
        self.record_at(at, || ReplicaOp::Stale {
            actor_type: key.ty().to_owned(),
            actor_id: key.id().to_owned(),
            created_at_ms,
        });
        Ok(dropped)
    }
}

/// Drop `key`'s rows (and its outgoing ones) if they are the copy created
/// at `created_at_ms`. Whether they went.
pub(super) fn dropped_if_stale(
    tables: &mut Tables<'_>,
    key: &ActorKey,
    created_at_ms: u64,
    created: &mut i64,
) -> Result<bool, StorageError> {
    let held: Option<ActorRecord> = match tables.actors()?.get((key.ty(), key.id()))? {
        Some(v) => Some(decode("actor", v.value())?),
        None => None,
    };
    if held.is_none_or(|r| r.created_at_ms != created_at_ms) {
        return Ok(false);
    }
    if tables.delete_actor(key)? {
        *created -= 1;
    }
    let outgoing = tables.outgoing_where(|k| k == key)?;
    tables.drop_outgoing(&outgoing)?;
    Ok(true)
}
