//! Work the node does on its own: crash recovery at start-up, and periodic
//! chores (gauges, idempotency expiry, event retention by age).

use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::Duration;

use tokio::sync::Semaphore;

use super::Node;
use crate::actor::Envelope;
use crate::clock::now_ms;
use crate::storage::WriteOp;
use crate::storage::blobs::Release;

impl Node {
    /// Re-run durable messages found at start-up, a bounded number of actors
    /// at a time so a restart does not stampede. The node is ready when they
    /// have run, or after `recovery.ready_within_ms` at the latest, with
    /// the rest still running.
    pub(super) async fn recover(self: Arc<Self>, actors: Vec<u64>) {
        let started = std::time::Instant::now();
        let concurrency = self.config.recovery.concurrency.max(1);
        let total = actors.len();
        let recovered = Arc::new(std::sync::atomic::AtomicUsize::new(0));
        let bound = Duration::from_millis(self.config.recovery.ready_within_ms);
        let (node, done) = (self.clone(), recovered.clone());
        let early = tokio::spawn(async move {
            tokio::time::sleep(bound).await;
            if !node.ready.swap(true, Ordering::AcqRel) {
                tracing::warn!(
                    actors = total,
                    woken = done.load(Ordering::Relaxed),
                    ready_within_ms = bound.as_millis() as u64,
                    "ready while recovery goes on: some actors found with interrupted work are still \
                     re-running it (slow turns, or a busy inbox)"
                );
            }
        });
        let permits = Arc::new(Semaphore::new(concurrency));
        let mut n = 0;
        for num in actors {
            let key = match self.storage.reader().and_then(|r| r.actor_key(num)) {
                Ok(Some(k)) => k,
                Ok(None) => continue,
                Err(e) => {
                    tracing::error!(error = %e, "recovery: cannot read actor key");
                    continue;
                }
            };
            if let Some(c) = &self.cluster {
                // In a cluster: only this node's own actors (it may hold
                // copies of others', as a backup or a former owner)...
                if c.target(&key) != crate::cluster::Target::Here {
                    continue;
                }
                // ... once every batch it accepted as their slot's backup
                // has landed (`cluster/takeover.rs`).
                c.settle_before_loading(self.storage.writer(), &key).await;
            }
            let Ok(permit) = permits.clone().acquire_owned().await else {
                break;
            };
            match self.actors.deliver(&key, Envelope::Recover(permit)) {
                Ok(()) => n += 1,
                Err(e) => tracing::warn!(actor = %key, error = %e, "recovery: cannot wake actor"),
            }
            recovered.store(n, Ordering::Relaxed);
        }
        let _ = permits.acquire_many(concurrency as u32).await;
        early.abort();
        let elapsed_ms = started.elapsed().as_millis() as u64;
        if self.ready.swap(true, Ordering::AcqRel) {
            tracing::info!(actors = n, elapsed_ms, "recovery finished");
        } else {
            tracing::info!(actors = n, elapsed_ms, "recovery finished; ready");
        }
    }

    /// Remove blobs no file refers to that are older than `grace`: those of
    /// turns that never committed, and those whose files went.
    pub(super) async fn collect_blobs(&self, grace: Duration) {
        let storage = self.storage.clone();
        let collected = tokio::task::spawn_blocking(move || {
            storage
                .blobs()
                .collect(grace, |sha| storage.blob_referenced_now(sha))
        })
        .await;
        match collected {
            Ok(Ok(0)) => {}
            Ok(Ok(n)) => tracing::info!(blobs = n, "unreferenced blobs removed"),
            Ok(Err(e)) => tracing::warn!(error = %e, "blob collection failed"),
            Err(e) => tracing::warn!(error = %e, "blob collection panicked"),
        }
    }

    /// Remove the blobs whose last file was overwritten or deleted, once
    /// due: `files.released_blob_delay_ms` later, or at once while those
    /// waiting hold more than `files.max_released_bytes`. Looks every
    /// second, and after every commit that released some (a rewrite loop
    /// writes hundreds of MB a second).
    pub(super) async fn reap_released_blobs(self: Arc<Self>) {
        let release = Release {
            delay: Duration::from_millis(self.config.files.released_blob_delay_ms),
            max_waiting_bytes: self.config.files.max_released_bytes,
        };
        let unreferenced = self.storage.blobs().unreferenced();
        loop {
            tokio::select! {
                () = unreferenced.added() => {}
                () = tokio::time::sleep(Duration::from_secs(1)) => {}
            }
            if self.storage.blobs().reap_due(release) {
                self.reap_blobs(release).await;
            }
        }
    }

    async fn reap_blobs(&self, release: Release) {
        let storage = self.storage.clone();
        match tokio::task::spawn_blocking(move || storage.reap_blobs(release)).await {
            Ok(Ok(0)) => {}
            Ok(Ok(n)) => tracing::debug!(blobs = n, "blobs no file refers to any more removed"),
            Ok(Err(e)) => {
                tracing::warn!(error = %e, "cannot remove blobs no file refers to; the periodic sweep will")
            }
            Err(e) => tracing::warn!(error = %e, "blob removal panicked"),
        }
    }

    /// Remove compiled-code cache files that no node sharing the cache has
    /// used for a week (see `sandbox/code_cache.rs`).
    pub(super) async fn sweep_code_cache(&self) {
        let sandbox = self.sandbox.clone();
        let swept = tokio::task::spawn_blocking(move || {
            sandbox.sweep_code_cache(crate::sandbox::CODE_CACHE_UNUSED_FOR)
        })
        .await;
        match swept {
            Ok(Ok(s)) if s.files == 0 => {}
            Ok(Ok(s)) => {
                self.metrics.code_cache_removed_files.inc_by(s.files);
                tracing::info!(
                    files = s.files,
                    bytes = s.bytes,
                    "removed compiled code unused for a week"
                );
            }
            Ok(Err(e)) => tracing::warn!(error = %e, "compiled-code cache sweep failed"),
            Err(e) => tracing::warn!(error = %e, "compiled-code cache sweep panicked"),
        }
    }

    /// Periodic chores: idempotency expiry, event retention by age, gauges.
    pub(super) async fn housekeeping(self: Arc<Self>) {
        let mut tick = tokio::time::interval(Duration::from_secs(1));
        let mut n: u64 = 0;
        let max_age = self.config.events.max_age_ms;
        // Sweep old events a few times per retention period (1 s to 1 h).
        let sweep_every = (max_age / 4 / 1000).clamp(1, 3600);
        loop {
            tick.tick().await;
            n += 1;
            self.update_gauges();
            if max_age > 0 && n.is_multiple_of(sweep_every) {
                self.sweep_old_events().await;
            }
            if n.is_multiple_of(600) {
                let grace = Duration::from_millis(self.config.files.blob_gc_grace_ms);
                self.collect_blobs(grace).await;
            }
            // A minute after start (the versions woken at start are loaded
            // by then and count as used), then hourly.
            if n == 60 || n.is_multiple_of(3600) {
                self.sweep_code_cache().await;
            }
            // Five minutes after start (a node restarted often must prune
            // too), then hourly.
            if n == 300 || n.is_multiple_of(3600) {
                self.prune_dead_deliveries().await;
            }
            if n.is_multiple_of(60) {
                self.staged_blobs.expire();
                let now = now_ms();
                match self
                    .storage
                    .writer()
                    .call(|done| WriteOp::SweepIdempotency { now_ms: now, done })
                    .await
                {
                    Ok(0) => {}
                    Ok(removed) => tracing::debug!(removed, "expired idempotency records removed"),
                    Err(e) => tracing::warn!(error = %e, "idempotency sweep failed"),
                }
            }
        }
    }

    /// Remove dead deliveries past `webhooks.dead_retention_ms`, a batch
    /// at a time.
    async fn prune_dead_deliveries(&self) {
        let retention = self.config.webhooks.dead_retention_ms;
        if retention == 0 {
            return;
        }
        let created_before_ms = now_ms().saturating_sub(retention);
        let mut total = 0;
        loop {
            let pruned = self
                .storage
                .writer()
                .call(|done| WriteOp::PruneDeadDeliveries {
                    created_before_ms,
                    done,
                })
                .await;
            match pruned {
                Ok(0) => break,
                Ok(n) => total += n,
                Err(e) => {
                    tracing::warn!(error = %e, "dead delivery pruning failed");
                    break;
                }
            }
        }
        if total > 0 {
            tracing::info!(
                removed = total,
                retention_ms = retention,
                "dead deliveries past their retention removed"
            );
        }
    }

    /// Ask every actor whose oldest event is past retention to trim its log.
    /// The actor owns its record, so it does the trimming (a bookkeeping
    /// commit without waking its sandbox) and goes back to sleep.
    async fn sweep_old_events(self: &Arc<Self>) {
        const BATCH: usize = 1000;
        let cutoff = self.config.events.cutoff_ms(now_ms());
        let mut from = 0;
        let mut poked = 0usize;
        loop {
            let found = self
                .storage
                .reader()
                .and_then(|r| r.actors_with_events_before(cutoff, from, BATCH));
            let (nums, next) = match found {
                Ok(x) => x,
                Err(e) => {
                    tracing::warn!(error = %e, "event retention sweep failed");
                    return;
                }
            };
            for num in nums {
                let Ok(Some(key)) = self.storage.reader().and_then(|r| r.actor_key(num)) else {
                    continue;
                };
                match self.actors.deliver(&key, Envelope::TrimEvents) {
                    Ok(()) => poked += 1,
                    Err(e) => tracing::debug!(actor = %key, error = %e, "event trim deferred"),
                }
            }
            match next {
                Some(n) => from = n,
                None => break,
            }
            // Let the woken actors finish before waking more.
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        if poked > 0 {
            tracing::debug!(actors = poked, "event retention: old events trimmed");
        }
    }
}
