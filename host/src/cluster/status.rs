//! `GET /v1/cluster`: the members and the slot table as this node sees
//! them, and how sure it is (a stale view says so).

use std::sync::atomic::Ordering;

use super::Cluster;
use super::records::SLOTS;

impl Cluster {
    /// The members and the slot table, as `GET /v1/cluster` shows them.
    pub fn status(&self) -> serde_json::Value {
        // Without a confirmed lease (etcd unreachable) the view is as last
        // seen, and this node serves nothing: it said every member was
        // alive and no slot unavailable while every request was a 503.
        let live = self.alive();
        let v = self.inner.view();
        let counts = v.slot_counts();
        let mut used = std::collections::BTreeMap::<&str, u32>::new();
        let mut backups = std::collections::BTreeMap::<&str, u32>::new();
        let mut unavailable = 0;
        let mut degraded = 0;
        for e in v.slots.iter().flatten() {
            if e.record.used {
                *used.entry(e.record.owner.as_str()).or_default() += 1;
                degraded += u32::from(e.record.backup.is_none());
            }
            if let Some(b) = &e.record.backup {
                *backups.entry(b.as_str()).or_default() += 1;
            }
            if !v.members.contains_key(&e.record.owner) {
                unavailable += 1;
            }
        }
        let members: Vec<_> = v
            .members
            .values()
            .map(|m| {
                serde_json::json!({
                    "node_id": m.node_id,
                    "region": m.region,
                    "advertise": m.advertise,
                    // A lease id: above 2^53, which JSON readers (jq,
                    // JavaScript) round; a string keeps it whole.
                    "incarnation": m.incarnation.to_string(),
                    // Stopping: handing its slots over, given no new ones.
                    "leaving": m.leaving,
                    // Unknown (null) while this node's view is stale.
                    "alive": live.then_some(true),
                    "slots": counts.get(&m.node_id).copied().unwrap_or(0),
                    "slots_used": used.get(m.node_id.as_str()).copied().unwrap_or(0),
                    "backup_of": backups.get(m.node_id.as_str()).copied().unwrap_or(0),
                })
            })
            .collect();
        // Down: what still names a node without a lease (its slots until
        // they fail over), and every member seen leaving since this node
        // started, with its region and address as last seen.
        let mut down_ids: std::collections::BTreeSet<&str> = counts
            .keys()
            .map(String::as_str)
            .filter(|n| !v.members.contains_key(*n))
            .collect();
        down_ids.extend(v.departed.keys().map(String::as_str));
        let down: Vec<_> = down_ids
            .into_iter()
            .map(|n| {
                let last = v.departed.get(n);
                serde_json::json!({
                    "node_id": n,
                    "region": last.map(|m| &m.region),
                    "advertise": last.map(|m| &m.advertise),
                    "alive": live.then_some(false),
                    "slots": counts.get(n).copied().unwrap_or(0),
                })
            })
            .collect();
        if !live {
            unavailable = SLOTS;
        }
        let max_epoch = v.slots.iter().flatten().map(|e| e.record.epoch).max();
        serde_json::json!({
            "node_id": self.inner.config.node_id,
            "view": if live { "live" } else { "stale: this node's lease is not confirmed (etcd unreachable?); members and slots are as last seen" },
            "controller": v.controller,
            "revision": v.revision,
            "slots": SLOTS,
            "slots_assigned": v.slots.iter().flatten().count(),
            "slots_unavailable": unavailable,
            "slots_degraded": degraded,
            "failovers_by_this_node": self.inner.failovers.load(Ordering::Relaxed),
            "actors_placed": v.placements.len(),
            "actors_moving": v.placements.values().filter(|e| e.record.moving.is_some()).count(),
            "max_epoch": max_epoch,
            "rebalance": self.rebalance_status(&v),
            "members": members.into_iter().chain(down).collect::<Vec<_>>(),
        })
    }
}
