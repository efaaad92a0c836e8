//! The relay: sends to actors that may live on another node wait in it,
//! each with an idempotency key, until handed over.

use std::sync::Arc;

use marmot_core::ids::ActorKey;

use super::tests::{create, open, turn};
use super::{CommitTracker, WriteOp};

/// A plain message `id`, as a turn sends one.
fn message(id: &str) -> crate::schema::InboxRecord {
    crate::schema::InboxRecord {
        message_id: id.into(),
        body: b"{}".to_vec(),
        content_type: None,
        idempotency_key: None,
        attempts: 0,
        enqueued_at_ms: 1,
        kind: crate::schema::InboxKind::Message,
    }
}

#[tokio::test]
async fn relayed_sends_wait_in_the_relay_with_a_key_until_handed_over() {
    let (_dir, storage) = open();
    let (key, rec) = create(&storage, "a").await;
    let tracker = Arc::new(CommitTracker::default());
    let (op, rx) = turn(&key, &rec, &tracker, 0, 1, "k", "v");
    let WriteOp::Turn(mut t) = op else {
        unreachable!()
    };
    let to = ActorKey::new("t", "far").unwrap();
    t.sends = vec![(to.clone(), message("m1")), (to.clone(), message("m2"))];
    t.relay_sends = true;
    let ready = storage.relay_ready().clone();
    let notified = ready.notified();
    storage.writer().submit(WriteOp::Turn(t));
    rx.await.unwrap().unwrap();
    notified.await;
    let page = storage.reader().unwrap().relay_page(10, |_| true).unwrap();
    let keys: Vec<_> = page
        .iter()
        .map(|(_, r)| (r.actor_id.as_str(), r.message.idempotency_key.as_deref()))
        .collect();
    assert_eq!(
        keys,
        [("far", Some("relay-m1")), ("far", Some("relay-m2"))],
        "in send order, each with a key derived from its id"
    );
    // Not queued here: the recipient may live on another node.
    let reader = storage.reader().unwrap();
    assert!(reader.actor(&to).unwrap().is_none());
    drop(reader);
    let seqs = page.iter().map(|(s, _)| *s).collect();
    storage
        .writer()
        .call(|done| WriteOp::RelayDone { seqs, done })
        .await
        .unwrap();
    assert!(
        storage
            .reader()
            .unwrap()
            .relay_page(10, |_| true)
            .unwrap()
            .is_empty()
    );
}

/// A page of the relay holds the rows `mine` accepts, however many it
/// passes over first: the relay leaves a waiting recipient's rows out,
/// and with a page's worth of them at the head no other message was
/// handed over (found by a probe).
#[tokio::test]
async fn a_relay_page_reads_past_the_rows_it_leaves_out() {
    let (_dir, storage) = open();
    let (key, rec) = create(&storage, "a").await;
    let tracker = Arc::new(CommitTracker::default());
    let (op, rx) = turn(&key, &rec, &tracker, 0, 1, "k", "v");
    let WriteOp::Turn(mut t) = op else {
        unreachable!()
    };
    let (stuck, other) = (
        ActorKey::new("t", "stuck").unwrap(),
        ActorKey::new("t", "ok").unwrap(),
    );
    t.sends = (0..10)
        .map(|i| (stuck.clone(), message(&format!("s{i}"))))
        .chain((0..2).map(|i| (other.clone(), message(&format!("o{i}")))))
        .collect();
    t.relay_sends = true;
    storage.writer().submit(WriteOp::Turn(t));
    rx.await.unwrap().unwrap();
    let page = storage
        .reader()
        .unwrap()
        .relay_page(4, |r| r.actor_id != "stuck")
        .unwrap();
    let ids: Vec<_> = page
        .iter()
        .map(|(_, r)| r.message.message_id.as_str())
        .collect();
    assert_eq!(ids, ["o0", "o1"]);
}
