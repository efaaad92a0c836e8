//! The controller: one node, elected by a key under its own lease, is the
//! only writer of slot assignments. Every write is a compare-and-swap on the
//! slot's `mod_revision`, and a change of owner increments the epoch, so a
//! stale controller (paused, partitioned) cannot overwrite a newer
//! decision: its compare fails.
//!
//! Assignment: each unassigned slot, and each unused one whose owner is not
//! the rendezvous choice among live members (a member joined, or the owner
//! has been gone for [`GRACE`] past its lease's expiry), goes to the
//! rendezvous choice. A used slot keeps its owner (moving it needs its data:
//! the next slice's backups and moves).

use std::collections::HashMap;
use std::sync::Arc;
use std::time::{Duration, Instant};

use etcd_client::{Compare, CompareOp, PutOptions, Txn, TxnOp};

use super::Inner;
use super::records::{SLOTS, SlotRecord, score};

/// How long a member must have been gone (its lease already expired)
/// before the controller gives its unused slots to another node.
const GRACE: Duration = Duration::from_secs(2);

/// Slot writes per etcd transaction (etcd allows 128 operations).
const WRITES_PER_TXN: usize = 64;

pub(super) async fn run(inner: Arc<Inner>) {
    let mut gone_since: HashMap<String, Instant> = HashMap::new();
    loop {
        let changed = inner.changed.notified();
        if inner.lease.alive() {
            match campaign(&inner).await {
                Ok(true) => {
                    if let Err(e) = assign(&inner, &mut gone_since).await {
                        tracing::warn!(error = %e, "slot assignment round failed");
                    }
                }
                Ok(false) => gone_since.clear(),
                Err(e) => tracing::debug!(error = %e, "controller campaign failed"),
            }
        }
        // Again on any change, and at least every second (grace periods).
        let _ = tokio::time::timeout(Duration::from_secs(1), changed).await;
    }
}

/// Become the controller if nobody is, or stay it. `true`: this node is.
async fn campaign(inner: &Inner) -> anyhow::Result<bool> {
    let me = &inner.config.node_id;
    let key = inner.keys.controller();
    let lease = inner.lease.id.load(std::sync::atomic::Ordering::Acquire);
    let txn = Txn::new()
        .when([Compare::create_revision(key.clone(), CompareOp::Equal, 0)])
        .and_then([TxnOp::put(
            key.clone(),
            me.as_bytes(),
            Some(PutOptions::new().with_lease(lease)),
        )])
        .or_else([TxnOp::get(key, None)]);
    let resp = super::within(super::ETCD_CALL, inner.client.clone().txn(txn)).await?;
    if resp.succeeded() {
        tracing::info!("this node is the cluster controller");
        return Ok(true);
    }
    // Ours only under this very lease: a previous incarnation's key is
    // not ours.
    Ok(resp.op_responses().into_iter().any(|r| match r {
        etcd_client::TxnOpResponse::Get(g) => g
            .kvs()
            .first()
            .is_some_and(|kv| kv.value() == me.as_bytes() && kv.lease() == lease),
        _ => false,
    }))
}

/// One round: compute the writes, apply them in compare-and-swap batches.
async fn assign(inner: &Inner, gone_since: &mut HashMap<String, Instant>) -> anyhow::Result<()> {
    let writes = {
        let v = inner.view();
        if v.members.is_empty() {
            return Ok(());
        }
        let now = Instant::now();
        gone_since.retain(|n, _| !v.members.contains_key(n));
        let live: Vec<&str> = v.members.keys().map(String::as_str).collect();
        let mut writes = Vec::new();
        for slot in 0..SLOTS {
            let best = *live
                .iter()
                .max_by_key(|n| score(slot, n))
                .expect("members is not empty");
            match &v.slots[slot as usize] {
                None => writes.push((
                    slot,
                    None,
                    SlotRecord {
                        owner: best.to_owned(),
                        epoch: 1,
                        used: false,
                    },
                )),
                Some(e) if e.record.used || e.record.owner == best => {}
                Some(e) => {
                    let owner_live = v.members.contains_key(&e.record.owner);
                    if !owner_live {
                        let since = *gone_since.entry(e.record.owner.clone()).or_insert(now);
                        if now.duration_since(since) < GRACE {
                            continue;
                        }
                    }
                    writes.push((
                        slot,
                        Some(e.mod_revision),
                        SlotRecord {
                            owner: best.to_owned(),
                            epoch: e.record.epoch + 1,
                            used: false,
                        },
                    ));
                }
            }
        }
        writes
    };
    if writes.is_empty() {
        return Ok(());
    }
    let mut applied = 0;
    for chunk in writes.chunks(WRITES_PER_TXN) {
        let mut compares = Vec::with_capacity(chunk.len() + 1);
        let mut puts = Vec::with_capacity(chunk.len());
        // Still the controller: the election key is ours.
        compares.push(Compare::lease(
            inner.keys.controller(),
            CompareOp::Equal,
            inner.lease.id.load(std::sync::atomic::Ordering::Acquire),
        ));
        for (slot, rev, record) in chunk {
            let key = inner.keys.slot(*slot);
            compares.push(match rev {
                None => Compare::create_revision(key.clone(), CompareOp::Equal, 0),
                Some(r) => Compare::mod_revision(key.clone(), CompareOp::Equal, *r),
            });
            puts.push(TxnOp::put(key, serde_json::to_vec(record)?, None));
        }
        let txn = Txn::new().when(compares).and_then(puts);
        let resp = super::within(super::ETCD_CALL, inner.client.clone().txn(txn)).await?;
        if resp.succeeded() {
            applied += chunk.len();
        } else {
            // Someone else wrote meanwhile (an owner marked a slot used):
            // the watch brings it, the next round decides again.
            break;
        }
    }
    if applied > 0 {
        tracing::info!(slots = applied, "assigned slots");
    }
    Ok(())
}
