//! The state every node of a cluster holds alike besides the types:
//! secrets, model providers, webhook subscriptions and token revocations.
//! Writes of it are applied on every live node as they are made (the API
//! fans them out); a node that was away takes a peer's when it returns, so
//! that it does not serve with a stale copy: what was set meanwhile is set
//! here, what was deleted is deleted.

use serde::{Deserialize, Serialize};

use super::Node;
use crate::clock::now_ms;
use crate::storage::schema::{ProviderRecord, SecretRecord, SubscriptionRecord};
use crate::storage::{StorageError, WriteOp};

/// A node's shared state, as a peer sends it (`GET /v1/cluster/catalog`).
/// Secrets stay sealed: a node opens them with the cluster's master key.
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
pub struct SharedState {
    /// Secrets by name.
    pub secrets: Vec<(String, SecretRecord)>,
    /// Model providers by name.
    pub providers: Vec<(String, ProviderRecord)>,
    /// Webhook subscriptions by name (their signing secrets included, so
    /// that every node signs alike).
    pub subscriptions: Vec<(String, SubscriptionRecord)>,
    /// Revoked client tokens: (token id, until).
    pub revoked_tokens: Vec<(String, u64)>,
}

/// What taking a peer's shared state changed here.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Adopted {
    /// Secrets set or deleted.
    pub secrets: usize,
    /// Providers set or deleted.
    pub providers: usize,
    /// Subscriptions set or deleted.
    pub subscriptions: usize,
    /// Revocations added.
    pub revocations: usize,
}

/// How much later a peer's subscription must have been made than this
/// node's of the same name to be another one (made again while this node
/// was away), not the same one stamped by another node's clock.
const REMADE_AFTER_MS: u64 = 1_000;

impl Node {
    /// This node's shared state.
    pub fn shared_state(&self) -> Result<SharedState, StorageError> {
        let reader = self.storage.reader()?;
        Ok(SharedState {
            secrets: reader.secrets()?,
            providers: reader.providers()?,
            subscriptions: self
                .storage
                .subscriptions()
                .snapshot()
                .iter()
                .map(|(n, r)| (n.clone(), r.clone()))
                .collect(),
            revoked_tokens: reader.revoked_tokens(now_ms())?,
        })
    }

    /// Make this node's shared state a peer's.
    pub async fn adopt_shared_state(&self, peer: &SharedState) -> anyhow::Result<Adopted> {
        let secrets = self.secrets.adopt(&peer.secrets).await?;
        let providers = self.models.providers().adopt(&peer.providers).await?;
        let revocations = self.tokens.adopt_revocations(&peer.revoked_tokens).await?;
        let mine = self.storage.subscriptions().snapshot();
        let mut subscriptions = 0;
        for (name, theirs) in &peer.subscriptions {
            match mine.get(name) {
                Some(m) if m == theirs => continue,
                // Deleted and made again while this node was away: the rows
                // it queued here were the old one's, and go with it (they
                // were sent to the new one). Nodes share a subscription's
                // creation time, but before they did each stamped its own:
                // only a clearly later one is another subscription.
                Some(m) if theirs.created_at_ms > m.created_at_ms + REMADE_AFTER_MS => {
                    let name = name.clone();
                    self.storage
                        .writer()
                        .call(|done| WriteOp::DeleteSubscription { name, done })
                        .await?;
                }
                _ => {}
            }
            let (name, record) = (name.clone(), theirs.clone());
            self.storage
                .writer()
                .call(|done| WriteOp::PutSubscription { name, record, done })
                .await?;
            subscriptions += 1;
        }
        for name in mine.keys() {
            if !peer.subscriptions.iter().any(|(n, _)| n == name) {
                let name = name.clone();
                self.storage
                    .writer()
                    .call(|done| WriteOp::DeleteSubscription { name, done })
                    .await?;
                subscriptions += 1;
            }
        }
        Ok(Adopted {
            secrets,
            providers,
            subscriptions,
            revocations,
        })
    }
}
