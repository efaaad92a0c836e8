//! The `[cluster]` section: membership in etcd (PRODUCT.md §8).

use serde::{Deserialize, Serialize};

/// Membership of a cluster (PRODUCT.md §8): etcd holds members, the
/// controller and the slot table.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ClusterConfig {
    /// Unique and stable: the node's name in the slot table.
    pub node_id: String,
    /// Where the node is (`eu-west`); new actors are placed in a region.
    #[serde(default = "default_region")]
    pub region: String,
    /// The URL the other nodes reach this one at (`http://10.0.0.1:7878`).
    pub advertise: String,
    /// etcd endpoints (`http://10.0.0.9:2379`).
    pub etcd: Vec<String>,
    /// The membership lease's time to live. A node that cannot renew it
    /// within this time stops serving; the controller moves its slots only
    /// after it expired.
    #[serde(default = "default_lease_ttl_s")]
    pub lease_ttl_s: u64,
    /// The cluster's key prefix in etcd (several clusters may share one).
    #[serde(default = "default_etcd_prefix")]
    pub etcd_prefix: String,
    /// What a used slot without a backup (it died, or could not be
    /// reached) does with writes.
    #[serde(default)]
    pub without_backup: WithoutBackup,
    /// A request header set by the edge in front of the cluster naming the
    /// client's region (`x-edge-region`): a new actor is placed in that
    /// region when it is one of the cluster's (`?region=` wins; without
    /// either, the receiving node's region).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub region_header: Option<String>,
}

/// The policy of a slot that has no backup (degraded).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum WithoutBackup {
    /// Keep serving, durable on the owner's disk alone (flagged in
    /// `/readyz`, metrics and `GET /v1/cluster`).
    #[default]
    Local,
    /// Refuse writes (503 `no_backup`) until the slot has a backup again;
    /// reads go on.
    Refuse,
}

fn default_region() -> String {
    "default".into()
}

fn default_lease_ttl_s() -> u64 {
    5
}

fn default_etcd_prefix() -> String {
    "/marmot".into()
}

impl ClusterConfig {
    pub(super) fn validate(&self) -> Result<(), String> {
        let name_ok = |s: &str| {
            !s.is_empty()
                && s.len() <= 64
                && s.bytes()
                    .all(|b| b.is_ascii_alphanumeric() || b"-_.".contains(&b))
        };
        if !name_ok(&self.node_id) {
            return Err(format!(
                "cluster.node_id `{}` must be 1–64 of A-Z a-z 0-9 - _ .",
                self.node_id
            ));
        }
        if !name_ok(&self.region) {
            return Err(format!(
                "cluster.region `{}` must be 1–64 of A-Z a-z 0-9 - _ .",
                self.region
            ));
        }
        let url_ok = |u: &str| {
            (u.starts_with("http://") || u.starts_with("https://"))
                && u.split_once("://").is_some_and(|(_, rest)| {
                    !rest.is_empty() && !rest.contains(['/', '?', '#', ' '])
                })
        };
        if !url_ok(&self.advertise) {
            return Err(format!(
                "cluster.advertise `{}` must be a base URL like `http://10.0.0.1:7878` (scheme, host, port; no path)",
                self.advertise
            ));
        }
        if self.etcd.is_empty() {
            return Err("cluster.etcd must list at least one endpoint".into());
        }
        if let Some(e) = self.etcd.iter().find(|e| !url_ok(e)) {
            return Err(format!(
                "cluster.etcd: `{e}` is not an endpoint like `http://10.0.0.9:2379`"
            ));
        }
        if !(2..=60).contains(&self.lease_ttl_s) {
            return Err("cluster.lease_ttl_s must be between 2 and 60 seconds".into());
        }
        if !self.etcd_prefix.starts_with('/') || self.etcd_prefix.ends_with('/') {
            return Err("cluster.etcd_prefix must start with `/` and not end with one".into());
        }
        Ok(())
    }
}
