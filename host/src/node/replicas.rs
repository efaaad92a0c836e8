//! The backup's side of replication: batches an owner shipped are applied
//! here in order, each once, and only while this node is the slot's backup
//! at the batch's epoch (see `cluster/replication.rs` for the owner's).

use super::Node;
use crate::storage::schema::ReplicaBatch;
use crate::storage::{ReplicaApplied, WriteOp};

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
        // Blobs first: a file row is committed only with its blob on disk.
        // The holds keep them from the collector until the rows commit.
        let blobs: Vec<Vec<u8>> = batches
            .iter()
            .flat_map(|b| b.blobs.iter().map(|(_, bytes)| bytes.clone()))
            .collect();
        let storage = self.storage.clone();
        let _holds = if blobs.is_empty() {
            Vec::new()
        } else {
            tokio::task::spawn_blocking(move || {
                blobs
                    .iter()
                    .map(|b| storage.blobs().put(b))
                    .collect::<Result<Vec<_>, _>>()
            })
            .await??
        };
        // Submitted together, so the writer applies them in order (and
        // mostly in one transaction), then awaited.
        let mut waiting = Vec::with_capacity(batches.len());
        for mut batch in batches {
            batch.blobs = Vec::new();
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
        Ok(out)
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
