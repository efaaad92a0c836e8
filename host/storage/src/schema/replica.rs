//! What a slot's owner ships to its backup (`cluster/replication.rs`):
//! batches of logical writes, marked with Raft's term and index. A wire
//! format between nodes of one version, and the mark is stored
//! ([`super::REPLICA_LSN`]): encoded with postcard like the rows.

use serde::{Deserialize, Serialize};

use super::*;

/// Where a slot's replication stands on this node (Raft's term and index:
/// `epoch` is the owner's term, `lsn` counts batches within the slot).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, PartialOrd, Ord, Serialize, Deserialize)]
pub struct ReplicaMark {
    /// The slot's epoch the batch was written under.
    pub epoch: u64,
    /// The batch's number in the slot.
    pub lsn: u64,
}

/// One committed batch's writes to the rows of one slot's actors, as the
/// slot's owner ships them to its backup. The backup applies them in one
/// transaction, once (by `mark`), and only while it is the slot's backup at
/// `mark.epoch` or later.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ReplicaBatch {
    /// The slot.
    pub slot: u32,
    /// Its epoch and this batch's number.
    pub mark: ReplicaMark,
    /// The writes, in commit order. The blobs their files name travel
    /// ahead of them (`POST /v1/cluster/blobs`): a backup applies a batch
    /// only with every such blob on its disk.
    pub ops: Vec<ReplicaOp>,
    /// `Some(session)`: the batch starts with a snapshot of the whole slot
    /// ([`ReplicaOp::Install`] of every actor), taken for the catching-up
    /// `session` (the slot record's etcd revision then): the receiver first
    /// drops whatever it holds of the slot, and the batch need not follow
    /// its last mark. A joining node is named backup only while the slot's
    /// record is still the one of that session.
    pub snapshot: Option<i64>,
}

impl ReplicaBatch {
    /// The blobs the files this batch writes name, sorted, each once.
    pub fn blob_shas(&self) -> Vec<[u8; 32]> {
        let mut out = Vec::new();
        for op in &self.ops {
            match op {
                ReplicaOp::Turn(t) => out.extend(
                    t.files
                        .iter()
                        .filter_map(|(_, f)| f.as_ref())
                        .filter_map(FileRecord::blob),
                ),
                // A whole actor: a joining backup's snapshot, an actor
                // moved in. (Its blobs were once left out, so a backup
                // that caught up from a snapshot took over with files it
                // could not read.)
                ReplicaOp::Install(image) => out.extend(image.blob_shas()),
                _ => {}
            }
        }
        out.sort_unstable();
        out.dedup();
        out
    }
}

/// One write to an actor's rows. Actors are named by type and id: each
/// node numbers its actors itself.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[allow(
    clippy::large_enum_variant,
    reason = "built once per write and serialized at once"
)]
pub enum ReplicaOp {
    /// The actor exists (created with `version`, at `created_at_ms`).
    Create {
        /// Its type.
        actor_type: String,
        /// Its id.
        actor_id: String,
        /// Its type's version.
        version: u32,
        /// When it was created.
        created_at_ms: u64,
    },
    /// A committed turn's writes.
    Turn(Box<ReplicaTurn>),
    /// A durable message queued at inbox `seq`, with the idempotency
    /// record its key got (if any).
    Enqueue {
        /// Its type.
        actor_type: String,
        /// Its id.
        actor_id: String,
        /// The inbox row's seq on the owner.
        seq: u64,
        /// The message.
        message: InboxRecord,
        /// Its idempotency record.
        idempotency: Option<IdemRecord>,
    },
    /// Model usage added without a turn.
    Usage {
        /// Its type.
        actor_type: String,
        /// Its id.
        actor_id: String,
        /// What was added.
        usage: UsageRecord,
    },
    /// The actor was deleted with everything it owned.
    Delete {
        /// Its type.
        actor_type: String,
        /// Its id.
        actor_id: String,
    },
    /// The actor with all its rows, as part of a snapshot of its slot or
    /// moved into it.
    Install(Box<ActorImage>),
    /// An outbound webhook delivery of an actor of the slot written
    /// (`Some`: new, attempted, or made due again) or gone (`None`:
    /// delivered, or its subscription deleted), found by its id.
    Delivery {
        /// Its `webhook-id`.
        webhook_id: String,
        /// The row, as the owner wrote it.
        record: Option<DeliveryRecord>,
    },
    /// A message an actor of the slot sent to another actor, waiting for
    /// the relay (`Some`) or handed over (`None`), found by its id.
    Relay {
        /// The message's id.
        message_id: String,
        /// The row.
        record: Option<RelayRecord>,
    },
    /// The actor moved to slot `to`: its rows go, unless the node keeps
    /// that slot's rows too.
    Moved {
        /// Its type.
        actor_type: String,
        /// Its id.
        actor_id: String,
        /// Its new slot.
        to: u32,
    },
    /// A copy of the actor kept from before, created at `created_at_ms`,
    /// is stale (the actor is gone where it lived): its rows go if they
    /// are that copy. A copy created at another time is another actor's
    /// (the id was used again since) and stays.
    Stale {
        /// Its type.
        actor_type: String,
        /// Its id.
        actor_id: String,
        /// When the stale copy was created.
        created_at_ms: u64,
    },
}

/// All of an actor's rows, for a new backup of its slot or for the node it
/// moves to.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ActorImage {
    /// Its type.
    pub actor_type: String,
    /// Its id.
    pub actor_id: String,
    /// Its record (`num` is the sender's).
    pub record: ActorRecord,
    /// State.
    pub state: Vec<(String, Vec<u8>)>,
    /// Retained events.
    pub events: Vec<(u64, EventRecord)>,
    /// Idempotency records.
    pub idempotency: Vec<(String, IdemRecord)>,
    /// Queued messages, by inbox seq.
    pub inbox: Vec<(u64, InboxRecord)>,
    /// Alarms.
    pub alarms: Vec<(String, AlarmRecord)>,
    /// Input requests.
    pub inputs: Vec<(String, InputRecord)>,
    /// Files.
    pub files: Vec<(String, FileRecord)>,
    /// Model usage.
    pub usage: Option<UsageRecord>,
    /// Its outbound webhook deliveries not yet delivered (a move carries
    /// them; a slot's snapshot sends them as [`ReplicaOp::Delivery`]).
    pub deliveries: Vec<DeliveryRecord>,
    /// Messages it sent that wait for the relay (likewise).
    pub relays: Vec<RelayRecord>,
}

impl ActorImage {
    /// The blobs its files name (in file order; a blob two files share
    /// is named twice).
    pub fn blob_shas(&self) -> impl Iterator<Item = [u8; 32]> + '_ {
        self.files.iter().filter_map(|(_, f)| f.blob())
    }
}

/// A turn's writes (see the writer's `TurnCommit`). The outbound webhook
/// deliveries and relayed sends it wrote follow as [`ReplicaOp::Delivery`]
/// and [`ReplicaOp::Relay`].
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ReplicaTurn {
    /// Its type.
    pub actor_type: String,
    /// Its id.
    pub actor_id: String,
    /// The actor record after the turn (its `num` is the owner's; the
    /// backup uses its own).
    pub record: Option<ActorRecord>,
    /// State writes (`None` deletes).
    pub state: Vec<(String, Option<Vec<u8>>)>,
    /// Events appended, with their seqs.
    pub events: Vec<(u64, EventRecord)>,
    /// Events below this seq deleted.
    pub trim_events_below: Option<u64>,
    /// An idempotency record written.
    pub idempotency: Option<(String, IdemRecord)>,
    /// The inbox row consumed.
    pub inbox_done: Option<u64>,
    /// An inbox row rewritten.
    pub inbox_update: Option<(u64, InboxRecord)>,
    /// Alarms set or removed.
    pub alarms: Vec<(String, Option<AlarmRecord>)>,
    /// Input requests written or removed.
    pub inputs: Vec<(String, Option<InputRecord>)>,
    /// Files written or deleted.
    pub files: Vec<(String, Option<FileRecord>)>,
    /// Model usage added.
    pub usage: Option<UsageRecord>,
}
