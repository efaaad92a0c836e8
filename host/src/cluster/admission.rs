//! What a node checks in etcd before it joins a cluster: that this build
//! speaks the cluster's layout (`meta`), and that its admin token is the
//! one every node of the cluster has (`credential`).

use std::time::Duration;

use anyhow::Context as _;
use etcd_client::{Client, Compare, CompareOp, GetOptions, Txn, TxnOp};

use super::peer_client;
use super::records::{self, Keys, LAYOUT_VERSION, MemberRecord, MetaRecord, SLOTS};

/// Record the nodes' admin token (as [`records::credential`]) on first
/// use, or check that this node's is the same. A node whose token differs
/// could not reach its peers nor they it: it is refused before it joins.
pub(super) async fn check_credential(
    client: &mut Client,
    keys: &Keys,
    credential: &str,
    admin_token: Option<&str>,
) -> anyhow::Result<()> {
    let recorded = client.get(keys.credential(), None).await?;
    if recorded.kvs().is_empty() {
        check_token_with_members(client, keys, admin_token).await?;
    }
    let Some(found) = create_or_get(client, keys.credential(), credential.as_bytes()).await? else {
        return Ok(());
    };
    if records::credential_matches(&found, admin_token) {
        return Ok(());
    }
    let mine = match admin_token {
        Some(_) => "this node's admin_token",
        None => "this node has no admin_token (auth off), which",
    };
    anyhow::bail!(
        "{mine} is not the one recorded for the cluster (etcd key {} holds a hash of it, written \
         by the first node to start): every node needs the same admin_token. Not joining. If the \
         recorded one is the mistake, stop every node, delete that key, and start them with the \
         right one",
        keys.credential()
    )
}

/// Before it records the cluster's credential, which a cluster formed by
/// an earlier build has none of, a node checks its token with the live
/// members: one with another token, upgraded first, recorded its own and
/// locked every right node out (found by a probe). A member that refuses
/// it stops it; one that takes it, or none answering, lets it go on.
async fn check_token_with_members(
    client: &mut Client,
    keys: &Keys,
    admin_token: Option<&str>,
) -> anyhow::Result<()> {
    let all = Some(GetOptions::new().with_prefix());
    let resp = client.get(keys.members(), all).await?;
    let http = peer_client();
    for kv in resp.kvs() {
        let Ok(member) = serde_json::from_slice::<MemberRecord>(kv.value()) else {
            continue;
        };
        let mut req = http
            .get(format!("{}/v1/cluster", member.advertise))
            .timeout(Duration::from_secs(5));
        if let Some(t) = admin_token {
            req = req.bearer_auth(t);
        }
        match req.send().await.map(|r| r.status()) {
            Ok(s) if s.is_success() => return Ok(()),
            Ok(s) if s == reqwest::StatusCode::UNAUTHORIZED => anyhow::bail!(
                "the cluster's node `{}` refuses this node's admin_token ({s}): every node needs \
                 the same admin_token. Not joining",
                member.node_id
            ),
            _ => {}
        }
    }
    Ok(())
}

/// Put `value` at `key` if nothing is there (`None`), else what is there.
async fn create_or_get(
    client: &mut Client,
    key: String,
    value: &[u8],
) -> anyhow::Result<Option<Vec<u8>>> {
    let txn = Txn::new()
        .when([Compare::create_revision(key.clone(), CompareOp::Equal, 0)])
        .and_then([TxnOp::put(key.clone(), value, None)])
        .or_else([TxnOp::get(key, None)]);
    let resp = client.txn(txn).await?;
    if resp.succeeded() {
        return Ok(None);
    }
    let found = resp.op_responses().into_iter().find_map(|r| match r {
        etcd_client::TxnOpResponse::Get(g) => g.kvs().first().map(|kv| kv.value().to_vec()),
        _ => None,
    });
    // The compare said the key is there, in the same revision.
    Ok(Some(found.unwrap_or_default()))
}

/// Create `meta` on first use, or check that this build speaks its layout.
pub(super) async fn check_meta(client: &mut Client, keys: &Keys) -> anyhow::Result<()> {
    let meta = MetaRecord {
        layout: LAYOUT_VERSION,
        slots: SLOTS,
    };
    let Some(found) = create_or_get(client, keys.meta(), &serde_json::to_vec(&meta)?).await? else {
        return Ok(());
    };
    let found: MetaRecord = serde_json::from_slice(&found)
        .ok()
        .context("the cluster's meta record in etcd does not decode")?;
    anyhow::ensure!(
        found == meta,
        "the cluster in etcd uses layout {} with {} slots; this build speaks layout {} with {} slots",
        found.layout,
        found.slots,
        meta.layout,
        meta.slots
    );
    Ok(())
}
