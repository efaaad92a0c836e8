//! In-process tests of behaviour that needs a fault the HTTP API cannot
//! cause.

use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;

use super::Node;
use crate::actor::{TurnError, TurnReply};
use crate::config::{NodeConfig, TypeConfig};
use crate::ids::ActorKey;
use crate::storage::schema::CodeKind;

async fn node() -> (tempfile::TempDir, Arc<Node>) {
    let dir = tempfile::tempdir().unwrap();
    let node = Node::start(NodeConfig::for_dir(dir.path().join("data")))
        .await
        .unwrap();
    node.deploy(
        "counter",
        CodeKind::Wasm,
        crate::guests::COUNTER.to_vec(),
        TypeConfig::default(),
    )
    .await
    .unwrap();
    (dir, node)
}

async fn send(node: &Arc<Node>, body: &'static str) -> Result<TurnReply, TurnError> {
    let key = ActorKey::new("counter", "a").unwrap();
    let fut = node.send(&key, Bytes::from_static(body.as_bytes()), None, None);
    tokio::time::timeout(Duration::from_secs(10), fut)
        .await
        .expect("the actor answered (it must not hang after a failed commit)")
}

/// Regression: after a failed commit, an actor whose next turn wrote
/// nothing waited forever for the lost commit.
#[tokio::test]
async fn a_failed_commit_fails_its_turn_and_the_actor_recovers_from_disk() {
    let (_dir, node) = node().await;
    assert_eq!(
        send(&node, r#"{"by": 5}"#).await.unwrap().body,
        r#"{"n":5}"#
    );
    node.storage.writer().inject_commit_failures(1);
    let lost = send(&node, r#"{"by": 1}"#).await;
    assert!(matches!(lost, Err(TurnError::Storage(_))), "{lost:?}");
    // Read-only turn: sees what is on disk, and answers.
    assert_eq!(
        send(&node, r#"{"by": 0}"#).await.unwrap().body,
        r#"{"n":5}"#
    );
    assert_eq!(
        send(&node, r#"{"by": 2}"#).await.unwrap().body,
        r#"{"n":7}"#
    );
    let metrics = node.metrics().render();
    assert!(
        metrics.contains("marmot_commit_failures_total 1"),
        "{metrics}"
    );
}

/// A read-only reply that depends on a commit in flight is held back
/// until that commit is durable, and fails with it.
#[tokio::test]
async fn replies_depending_on_a_failed_commit_are_never_released() {
    let (_dir, node) = node().await;
    send(&node, r#"{"by": 1}"#).await.unwrap();
    node.storage.writer().inject_commit_failures(1);
    let key = ActorKey::new("counter", "a").unwrap();
    // Pipelined: the write and the read are both queued before the
    // write's commit fails.
    let (w, r) = tokio::join!(
        node.send(&key, Bytes::from_static(br#"{"by": 10}"#), None, None),
        node.send(&key, Bytes::from_static(br#"{"by": 0}"#), None, None),
    );
    assert!(w.is_err(), "the write's commit failed: {w:?}");
    match r {
        Ok(reply) => assert_eq!(reply.body, r#"{"n":1}"#, "a read saw a lost write"),
        Err(e) => assert!(matches!(e, TurnError::Storage(_)), "{e:?}"),
    }
    assert_eq!(
        send(&node, r#"{"by": 0}"#).await.unwrap().body,
        r#"{"n":1}"#
    );
}
