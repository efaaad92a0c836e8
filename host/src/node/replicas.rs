//! The backup's side of replication: batches an owner shipped are applied
//! here in order, each once, and only while this node is the slot's backup
//! at the batch's epoch (see `cluster/replication.rs` for the owner's).
//!
//! The blobs their files name come ahead of them (`cluster/blobs.rs`):
//! the owner asks which this node lacks ([`Node::blobs_missing`]), sends
//! those in bounded requests ([`Node::take_blobs`]), then the batches,
//! which apply only with every blob they name on disk. (Blobs rode inside
//! the batches' request, which had to fit 512 MiB and five seconds: a slot
//! with more file bytes than that never got a backup.) An actor moved in
//! gets its blobs the same way.

use std::collections::HashMap;
use std::sync::Mutex;
use std::time::{Duration, Instant};

use super::Node;
use crate::storage::blobs::BlobHold;
use crate::storage::schema::ReplicaBatch;
use crate::storage::{ReplicaApplied, Storage, WriteOp};

/// How long a blob sent ahead stays held for the rows that will name it.
const STAGED_FOR: Duration = Duration::from_secs(600);

/// Blobs sent ahead of the rows that name them (or found here when the
/// sender asked): held, so that no removal takes them before those rows
/// commit, until the rows came or [`STAGED_FOR`] passed. One hold per ask:
/// the rows of one sender let go of theirs, not of another's.
#[derive(Default)]
pub(super) struct StagedBlobs(Mutex<HashMap<[u8; 32], Vec<Staged>>>);

/// One hold of a staged blob, and when it was taken.
type Staged = (BlobHold, Instant);

impl StagedBlobs {
    fn keep(&self, holds: Vec<BlobHold>) {
        let now = Instant::now();
        let mut staged = self.0.lock().unwrap_or_else(|p| p.into_inner());
        for h in holds {
            staged.entry(*h.sha256()).or_default().push((h, now));
        }
    }

    /// Let go of blobs held for longer than [`STAGED_FOR`] (rows that never
    /// came: a move or a round that failed). Called every minute.
    pub(super) fn expire(&self) {
        let now = Instant::now();
        let mut staged = self.0.lock().unwrap_or_else(|p| p.into_inner());
        staged.retain(|_, holds| {
            holds.retain(|(_, at)| now.duration_since(*at) < STAGED_FOR);
            !holds.is_empty()
        });
    }

    /// Let go of one hold of each blob whose rows came (committed, or
    /// refused): the oldest.
    pub(super) fn release(&self, shas: &[[u8; 32]]) {
        let mut staged = self.0.lock().unwrap_or_else(|p| p.into_inner());
        for sha in shas {
            if let Some(holds) = staged.get_mut(sha) {
                holds.remove(0);
                if holds.is_empty() {
                    staged.remove(sha);
                }
            }
        }
    }
}

/// Hold every blob of `shas` on disk, or name the first that is not.
/// Blocking.
pub(super) fn hold_blobs(storage: &Storage, shas: &[[u8; 32]]) -> anyhow::Result<Vec<BlobHold>> {
    shas.iter()
        .map(|sha| {
            storage.blobs().hold(sha).ok_or_else(|| {
                anyhow::anyhow!(
                    "blob {} is not on this node: the sender sends a file's blob before the \
                     rows that name it",
                    hex::encode(sha)
                )
            })
        })
        .collect()
}

impl Node {
    /// Apply `batches` (in order) as the backup of their slots; an outcome
    /// per batch. Their blobs are stored first.
    pub async fn apply_replicas(
        &self,
        batches: Vec<ReplicaBatch>,
    ) -> anyhow::Result<Vec<ReplicaApplied>> {
        let Some(cluster) = self.cluster.clone() else {
            anyhow::bail!("this node is not in a cluster");
        };
        // A file row is committed only with its blob on disk (sent ahead):
        // the holds keep the blobs from every removal until the rows commit.
        let mut shas: Vec<[u8; 32]> = batches.iter().flat_map(ReplicaBatch::blob_shas).collect();
        shas.sort_unstable();
        shas.dedup();
        let _holds = if shas.is_empty() {
            Vec::new()
        } else {
            let (storage, names) = (self.storage.clone(), shas.clone());
            tokio::task::spawn_blocking(move || hold_blobs(&storage, &names)).await??
        };
        // Submitted together, so the writer applies them in order (and
        // mostly in one transaction), then awaited.
        let mut waiting = Vec::with_capacity(batches.len());
        for batch in batches {
            let (slot, epoch) = (batch.slot, batch.mark.epoch);
            let c = cluster.clone();
            let (done, rx) = tokio::sync::oneshot::channel();
            self.storage.writer().submit(WriteOp::Replica {
                batch,
                accept: Box::new(move || {
                    let accepted = c.accepts_replica(slot, epoch);
                    if accepted {
                        stall_for_tests();
                    }
                    accepted
                }),
                done,
            });
            waiting.push(rx);
        }
        let mut out = Vec::with_capacity(waiting.len());
        for rx in waiting {
            let outcome = rx.await??;
            if outcome == ReplicaApplied::Applied {
                self.metrics.replica_batches.inc();
            }
            out.push(outcome);
        }
        self.staged_blobs.release(&shas);
        Ok(out)
    }

    /// Which of `shas` (blobs about to be named by replicated or moved-in
    /// rows) this node lacks. Those it has are held for those rows.
    pub async fn blobs_missing(&self, shas: Vec<[u8; 32]>) -> anyhow::Result<Vec<[u8; 32]>> {
        if self.cluster.is_none() {
            anyhow::bail!("this node is not in a cluster");
        }
        let storage = self.storage.clone();
        let (holds, missing) = tokio::task::spawn_blocking(move || {
            let mut holds = Vec::new();
            let mut missing = Vec::new();
            for sha in shas {
                match storage.blobs().hold(&sha) {
                    Some(h) => holds.push(h),
                    None => missing.push(sha),
                }
            }
            (holds, missing)
        })
        .await?;
        self.staged_blobs.keep(holds);
        Ok(missing)
    }

    /// Store `blobs` sent ahead of the rows that name them, each checked
    /// against its name, and hold them for those rows. How many.
    pub async fn take_blobs(&self, blobs: Vec<([u8; 32], Vec<u8>)>) -> anyhow::Result<usize> {
        if self.cluster.is_none() {
            anyhow::bail!("this node is not in a cluster");
        }
        let storage = self.storage.clone();
        let holds = tokio::task::spawn_blocking(move || {
            blobs
                .iter()
                .map(|(sha, bytes)| {
                    let hold = storage.blobs().put(bytes)?;
                    anyhow::ensure!(
                        hold.sha256() == sha,
                        "the bytes sent as blob {} have another SHA-256",
                        hex::encode(sha)
                    );
                    Ok(hold)
                })
                .collect::<anyhow::Result<Vec<_>>>()
        })
        .await??;
        let n = holds.len();
        self.staged_blobs.keep(holds);
        Ok(n)
    }
}

/// Fault injection for tests: while the file this names exists, a backup's
/// writer holds a batch it has just accepted, before committing it (a slow
/// commit, long enough for a failover to happen meanwhile), and says so by
/// creating the same path with `.held` appended. At most 30 s.
pub const FAULT_STALL_ENV: &str = "MARMOT_FAULT_REPLICA_STALL_FILE";

fn stall_for_tests() {
    static FILE: std::sync::OnceLock<Option<std::path::PathBuf>> = std::sync::OnceLock::new();
    let init = || {
        let file = std::env::var_os(FAULT_STALL_ENV).map(std::path::PathBuf::from);
        if let Some(f) = &file {
            tracing::warn!(file = %f.display(), "fault injection enabled ({FAULT_STALL_ENV}); never use this in production");
        }
        file
    };
    let Some(file) = FILE.get_or_init(init) else {
        return;
    };
    if !file.exists() {
        return;
    }
    let mut held = file.clone().into_os_string();
    held.push(".held");
    let _ = std::fs::write(held, b"");
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(30);
    while file.exists() && std::time::Instant::now() < deadline {
        std::thread::sleep(std::time::Duration::from_millis(10));
    }
}
