//! Disk faults on a real, full file system: a node whose disk fills up
//! refuses writes with 503 and releases nothing of them, keeps serving
//! reads, says so on `/readyz` and in metrics, and recovers by itself when
//! space returns.
//!
//! Needs root (it mounts a size-limited tmpfs); without it the test says
//! so and skips.

mod common;

use std::time::{Duration, Instant};

use common::disk::SmallDisk;
use common::{Marmot, TESTKIT, metric, tempdir};
use serde_json::json;

#[tokio::test]
async fn a_full_disk_refuses_writes_keeps_reads_and_recovers_by_itself() {
    let dir = tempdir();
    let Some(disk) = SmallDisk::mount(&dir.path().join("disk"), 48) else {
        return;
    };
    // The data directory is the small disk; the node log is beside it.
    let mut m = Marmot::start(&disk.dir).await;
    let api = m.client();
    assert_eq!(api.deploy("kit", TESTKIT, json!({})).await.status, 201);
    for i in 1..=3 {
        let r = api.add("kit", "a", 1).await;
        assert_eq!(r.status, 200, "{}", r.json);
        assert_eq!(r.json["value"], i);
    }

    let filler = disk.fill();
    // Writes until one is refused. The database file may still hold free
    // pages, so the first few commits can succeed: those are acknowledged
    // and must stay.
    let mut acked = 3;
    let mut refused = None;
    for _ in 0..2_000 {
        let r = api
            .op(
                "kit",
                "a",
                json!({"op": "big", "key": format!("big{acked}"), "bytes": 16 * 1024}),
            )
            .await;
        if r.status == 200 {
            let r = api.add("kit", "a", 1).await;
            if r.status == 200 {
                acked += 1;
                assert_eq!(r.json["value"], acked);
                continue;
            }
            refused = Some(r);
        } else {
            refused = Some(r);
        }
        break;
    }
    let refused = refused.expect("a full disk refused a write");
    assert_eq!(refused.status, 503, "{}", refused.json);
    assert_eq!(refused.code(), "storage_error", "{}", refused.json);
    assert_eq!(refused.headers.get("retry-after").unwrap(), "1");

    // While the disk is full: more writes are refused, reads work, and the
    // node says why it is not ready.
    let r = api.add("kit", "a", 1).await;
    assert_eq!(r.status, 503, "{}", r.json);
    // A file's blob that does not fit fails the turn as the node's storage
    // failure, not as a trap of the guest (it was 500 actor_trapped,
    // counted and logged as a trap).
    let r = api
        .op(
            "kit",
            "b",
            json!({"op": "file_write", "path": "outputs/big.bin", "bytes": 4 << 20}),
        )
        .await;
    assert_eq!((r.status, r.code()), (503, "storage_error"), "{}", r.json);
    let metrics = String::from_utf8_lossy(&api.get("/metrics").await.body).into_owned();
    assert_eq!(
        common::sample(&metrics, "marmot_sandbox_traps_total{reason=\"trap\"}"),
        Some(0.0),
        "{metrics}"
    );
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let info = api.get("/v1/actors/kit/a").await;
        let state = api.op("kit", "a", json!({"op": "get", "key": "n"})).await;
        if info.status == 200 && state.status == 200 {
            assert_eq!(state.json["value"], acked, "no refused write is visible");
            break;
        }
        assert!(
            Instant::now() < deadline,
            "reads fail on a full disk: {} {} / {} {}\n{}",
            info.status,
            info.json,
            state.status,
            state.json,
            m.log_text()
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let ready = api.get("/readyz").await;
    assert_eq!(ready.status, 503, "{}", ready.json);
    assert_eq!(ready.code(), "disk_fault", "{}", ready.json);
    let metrics = String::from_utf8_lossy(&api.get("/metrics").await.body).into_owned();
    assert_eq!(metric(&metrics, "marmot_storage_disk_faulted"), 1.0);
    assert!(m.log_text().contains("the disk failed"), "the log says why");

    // Space returns: the node notices by itself (no request needed), and
    // writes continue from the last acknowledged value.
    std::fs::remove_file(&filler).unwrap();
    let deadline = Instant::now() + Duration::from_secs(10);
    while api.get("/readyz").await.status != 200 {
        assert!(Instant::now() < deadline, "the node did not recover");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let r = api.add("kit", "a", 1).await;
    assert_eq!(r.status, 200, "{}", r.json);
    assert_eq!(r.json["value"], acked + 1);
    let metrics = String::from_utf8_lossy(&api.get("/metrics").await.body).into_owned();
    assert_eq!(metric(&metrics, "marmot_storage_disk_faulted"), 0.0);
    assert!(metric(&metrics, "marmot_storage_reopens_total") >= 1.0);

    // And it is durable: a kill -9 and restart find it.
    m.kill9();
    m.restart().await;
    let r = api.op("kit", "a", json!({"op": "get", "key": "n"})).await;
    assert_eq!(r.json["value"], acked + 1, "{}", r.json);
    drop(m);
    drop(disk);
}

/// A backup whose destination fills is refused as 507, names the place
/// that is full (it named only the node's own blob, as if the node's disk
/// were full), and leaves nothing there.
#[tokio::test]
async fn a_backup_onto_a_full_disk_is_507_and_names_the_destination() {
    let dir = tempdir();
    let Some(disk) = SmallDisk::mount(&dir.path().join("backups"), 1) else {
        return;
    };
    let m = Marmot::start(&dir.path().join("data")).await;
    let api = m.client();
    assert_eq!(api.deploy("kit", TESTKIT, json!({})).await.status, 201);
    let r = api
        .op(
            "kit",
            "f",
            json!({"op": "file_write", "path": "big.bin", "bytes": 2_000_000}),
        )
        .await;
    assert_eq!(r.status, 200, "{}", r.json);
    let to = disk.dir.join("nightly");
    let r = api.post_json("/v1/backup", &json!({"to": to})).await;
    assert_eq!((r.status, r.code()), (507, "backup_failed"), "{}", r.json);
    let msg = r.json["error"]["message"].as_str().unwrap();
    assert!(
        msg.contains(&format!("to `{}", disk.dir.display())),
        "{msg}"
    );
    assert_eq!(std::fs::read_dir(&disk.dir).unwrap().count(), 0);
    // The node is unharmed.
    assert_eq!(api.add("kit", "f", 1).await.status, 200);
}
