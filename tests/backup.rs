//! Backup while serving, restore into a new data directory: everything
//! acknowledged before the backup is in it, nothing is half-there, and
//! large files (blobs) come along.

mod common;

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use common::{Marmot, TESTKIT, tempdir};
use serde_json::json;

const ACTORS: usize = 20;

#[tokio::test]
async fn a_backup_taken_under_load_restores_everything_acknowledged_before_it() {
    let dir = tempdir();
    let m = Marmot::start(&dir.path().join("data")).await;
    let api = m.client();
    api.deploy("kit", TESTKIT, json!({})).await;
    // A large file is a blob beside the database.
    let r = api
        .op(
            "kit",
            "files",
            json!({"op": "file_write", "path": "outputs/big.bin", "bytes": 200_000}),
        )
        .await;
    assert_eq!(r.status, 200, "{}", r.json);

    // Load: every acknowledged add is recorded (actor → highest value).
    let acked: Arc<Mutex<HashMap<usize, i64>>> = Arc::default();
    let stop = Arc::new(std::sync::atomic::AtomicBool::new(false));
    let mut load = Vec::new();
    for w in 0..4 {
        let api = api.clone();
        let acked = acked.clone();
        let stop = stop.clone();
        load.push(tokio::spawn(async move {
            let mut i = w;
            while !stop.load(std::sync::atomic::Ordering::Relaxed) {
                let actor = i % ACTORS;
                let r = api.add("kit", &format!("a{actor}"), 1).await;
                if r.status == 200 {
                    let v = r.json["value"].as_i64().unwrap();
                    let mut a = acked.lock().unwrap();
                    let e = a.entry(actor).or_default();
                    *e = (*e).max(v);
                }
                i += 4;
            }
        }));
    }
    tokio::time::sleep(Duration::from_millis(300)).await;
    let before = acked.lock().unwrap().clone();
    let backup = dir.path().join("backup");
    let r = api.post_json("/v1/backup", &json!({"to": backup})).await;
    assert_eq!(r.status, 200, "{}", r.json);
    assert!(r.json["rows"].as_u64().unwrap() > 0);
    assert_eq!(r.json["blobs"], 1, "{}", r.json);
    tokio::time::sleep(Duration::from_millis(200)).await;
    stop.store(true, std::sync::atomic::Ordering::Relaxed);
    for l in load {
        l.await.unwrap();
    }
    let after = acked.lock().unwrap().clone();
    assert!(!before.is_empty(), "the load ran before the backup");

    // The same directory again: refused, nothing touched.
    let again = api.post_json("/v1/backup", &json!({"to": backup})).await;
    assert_eq!(again.status, 409, "{}", again.json);
    let relative = api
        .post_json("/v1/backup", &json!({"to": "relative/dir"}))
        .await;
    assert_eq!(relative.status, 400);

    // Restore with the CLI into a new data directory, and serve it.
    let restored = dir.path().join("restored");
    let restore = || {
        std::process::Command::new(env!("CARGO_BIN_EXE_marmot"))
            .arg("restore")
            .arg(&backup)
            .arg("--data")
            .arg(&restored)
            .output()
            .unwrap()
    };
    let out = restore();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    // Not over an existing database.
    let out = restore();
    assert!(!out.status.success());
    assert!(
        String::from_utf8_lossy(&out.stderr).contains("already holds a database"),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );

    let r2 = Marmot::start(&restored).await;
    let api2 = r2.client();
    for actor in 0..ACTORS {
        let got = api2
            .get(&format!("/v1/actors/kit/a{actor}/state/n"))
            .await
            .json
            .as_i64()
            .unwrap_or(0);
        let min = before.get(&actor).copied().unwrap_or(0);
        let max = after.get(&actor).copied().unwrap_or(0);
        assert!(
            (min..=max).contains(&got),
            "a{actor}: restored {got}, acknowledged {min} before the backup and {max} at the end"
        );
    }
    let file = api2.get("/v1/actors/kit/files/files/outputs/big.bin").await;
    assert_eq!(file.status, 200);
    assert_eq!(file.body.len(), 200_000);
    assert!(
        file.body
            .iter()
            .enumerate()
            .all(|(i, b)| *b == b'a' + (i % 26) as u8)
    );
    // The restored node takes new turns.
    assert_eq!(api2.add("kit", "a0", 1).await.status, 200);
}
