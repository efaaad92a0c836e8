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

/// A node with the test kit deployed and a 200 kB file (a blob) written
/// by actor `id`.
/// The first blob under `data` (a node's data directory or a backup).
fn first_blob(data: &std::path::Path) -> std::path::PathBuf {
    let shard = std::fs::read_dir(data.join("blobs"))
        .unwrap()
        .map(|e| e.unwrap().path())
        .find(|p| p.is_dir())
        .expect("a blob shard");
    std::fs::read_dir(shard)
        .unwrap()
        .map(|e| e.unwrap().path())
        .next()
        .expect("a blob")
}

async fn node_with_a_blob(dir: &tempfile::TempDir, id: &str) -> (Marmot, common::Api) {
    let m = Marmot::start(&dir.path().join("data")).await;
    let api = m.client();
    api.deploy("kit", TESTKIT, json!({})).await;
    let r = api
        .op(
            "kit",
            id,
            json!({"op": "file_write", "path": "outputs/big.bin", "bytes": 200_000}),
        )
        .await;
    assert_eq!(r.status, 200, "{}", r.json);
    (m, api)
}

#[tokio::test]
async fn a_backup_taken_under_load_restores_everything_acknowledged_before_it() {
    let dir = tempdir();
    // A large file is a blob beside the database.
    let (_m, api) = node_with_a_blob(&dir, "files").await;

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
    // Nor inside the node's own data directory (found by a probe: it
    // shared the node's disk and went into the next backup's blobs).
    let data = dir.path().join("data");
    for inside in [
        data.join("blobs/bk"),
        data.join("new/deeper"),
        dir.path().join("elsewhere/../data/bk"),
    ] {
        let r = api.post_json("/v1/backup", &json!({"to": inside})).await;
        assert_eq!(r.status, 400, "{}", r.json);
        assert!(
            r.json["error"]["message"]
                .as_str()
                .unwrap()
                .contains("data directory")
        );
        assert!(!inside.exists() && !data.join("bk").exists());
    }

    // Restore with the CLI into a new data directory, and serve it.
    let restored = dir.path().join("restored");
    let (ok, text) = restore(&backup, &restored);
    assert!(ok, "{text}");
    // Not over an existing database.
    let (ok, text) = restore(&backup, &restored);
    assert!(!ok && text.contains("already holds a database"), "{text}");

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

/// Copy directory `from` to `to` (a test's own copies of a backup).
fn copy_dir(from: &std::path::Path, to: &std::path::Path) {
    std::fs::create_dir_all(to).unwrap();
    for e in std::fs::read_dir(from).unwrap() {
        let e = e.unwrap();
        if e.file_type().unwrap().is_dir() {
            copy_dir(&e.path(), &to.join(e.file_name()));
        } else {
            std::fs::copy(e.path(), to.join(e.file_name())).unwrap();
        }
    }
}

fn restore(from: &std::path::Path, data: &std::path::Path) -> (bool, String) {
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_marmot"))
        .arg("restore")
        .arg(from)
        .arg("--data")
        .arg(data)
        .output()
        .unwrap();
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    (out.status.success(), text)
}

/// A backup touches only its own directory: `nightly.1` is written under
/// `nightly.1.partial` (it was `nightly.partial`, removed first whatever it
/// held), and a `.partial` already there is a 409 that leaves it be. A
/// restore only reads the backup, checks every blob against its hash and
/// the database's integrity, refuses a directory that is not empty, and
/// leaves nothing behind when it refuses. A dev node's backup carries its
/// key file, so its secrets open after a restore (the node used to refuse
/// to start on it).
#[tokio::test]
async fn backups_touch_only_their_own_directory_and_restores_check_what_they_copy() {
    let dir = tempdir();
    let (m, api) = node_with_a_blob(&dir, "f").await;
    let r = api
        .op(
            "kit",
            "f",
            json!({"op": "set", "key": "k", "value": "plain-text-value"}),
        )
        .await;
    assert_eq!(r.status, 200, "{}", r.json);
    let r = api
        .put_json(
            "/v1/secrets/K1",
            &json!({"value": "s3cret-value", "hosts": ["api.example.com"]}),
        )
        .await;
    assert_eq!(r.status, 201, "{}", r.json);

    let bk = dir.path().join("bk");
    let theirs = bk.join("nightly.partial");
    std::fs::create_dir_all(&theirs).unwrap();
    std::fs::write(theirs.join("keep.txt"), "precious").unwrap();
    let backup = bk.join("nightly.1");
    let r = api.post_json("/v1/backup", &json!({"to": backup})).await;
    assert_eq!(r.status, 200, "{}", r.json);
    assert_eq!(
        std::fs::read_to_string(theirs.join("keep.txt")).unwrap(),
        "precious"
    );
    assert!(!bk.join("nightly.1.partial").exists());
    let claimed = bk.join("nightly.2.partial");
    std::fs::create_dir_all(&claimed).unwrap();
    let r = api
        .post_json("/v1/backup", &json!({"to": bk.join("nightly.2")}))
        .await;
    assert_eq!(r.status, 409, "{}", r.json);
    assert_eq!(r.code(), "backup_exists");
    assert!(claimed.is_dir() && !bk.join("nightly.2").exists());

    // A destination under a file is a bad request, not a backup that exists.
    std::fs::write(bk.join("afile"), "x").unwrap();
    let r = api
        .post_json("/v1/backup", &json!({"to": bk.join("afile").join("sub")}))
        .await;
    assert_eq!(r.status, 400, "{}", r.json);
    assert_eq!(r.code(), "invalid_backup");
    // As is one where no directory can be made (it was a 500).
    let r = api
        .post_json("/v1/backup", &json!({"to": "/proc/marmot-backup"}))
        .await;
    assert_eq!((r.status, r.code()), (400, "invalid_backup"), "{}", r.json);

    // A blob missing from the node's disk is named, and no use retrying
    // (five snapshots went by, then "try again").
    let node_blob = first_blob(&dir.path().join("data"));
    let aside = dir.path().join("blob-aside");
    std::fs::rename(&node_blob, &aside).unwrap();
    let r = api
        .post_json("/v1/backup", &json!({"to": bk.join("nightly.3")}))
        .await;
    assert_eq!((r.status, r.code()), (500, "backup_failed"), "{}", r.json);
    let msg = r.json["error"]["message"].as_str().unwrap();
    let sha = node_blob.file_name().unwrap().to_str().unwrap();
    assert!(
        msg.contains("retrying will not help") && msg.contains(sha),
        "{msg}"
    );
    // The file that lost its bytes is named, with its actor.
    assert!(msg.contains("`outputs/big.bin` of kit/f names it"), "{msg}");
    assert!(!bk.join("nightly.3").exists() && !bk.join("nightly.3.partial").exists());
    std::fs::rename(&aside, &node_blob).unwrap();

    // The backup's blobs are its own: writing to one leaves the node's file
    // as it was (they were hard links to the same inode).
    let live = api.get("/v1/actors/kit/f/files/outputs/big.bin").await.body;
    {
        let blob = first_blob(&backup);
        let copy = dir.path().join("copy-of-blob");
        std::fs::copy(&blob, &copy).unwrap();
        std::fs::write(&blob, vec![b'Z'; 200_000]).unwrap();
        assert_eq!(
            api.get("/v1/actors/kit/f/files/outputs/big.bin").await.body,
            live
        );
        std::fs::copy(&copy, &blob).unwrap();
    }

    // Damaged copies are refused, and leave no data directory behind.
    let blob = first_blob(&backup);
    let rel = blob.strip_prefix(&backup).unwrap().to_owned();
    let tampered = dir.path().join("tampered");
    copy_dir(&backup, &tampered);
    std::fs::write(tampered.join(&rel), vec![b'e'; 200_000]).unwrap();
    let missing = dir.path().join("missing");
    copy_dir(&backup, &missing);
    std::fs::remove_file(missing.join(&rel)).unwrap();
    for (from, says) in [
        (&tampered, "does not match its SHA-256"),
        (&missing, "the backup is incomplete"),
    ] {
        let target = dir.path().join("never");
        let (ok, text) = restore(from, &target);
        assert!(!ok && text.contains(says), "{}: {text}", from.display());
        assert!(!target.exists(), "{}: {text}", from.display());
    }
    // A database with a changed byte.
    let flipped = dir.path().join("flipped");
    copy_dir(&backup, &flipped);
    let db = flipped.join("marmot.redb");
    let mut bytes = std::fs::read(&db).unwrap();
    let at = bytes
        .windows(16)
        .position(|w| w == b"plain-text-value")
        .expect("the value is in the file");
    bytes[at..at + 5].copy_from_slice(b"HACKD");
    std::fs::write(&db, bytes).unwrap();
    let (ok, text) = restore(&flipped, &dir.path().join("never"));
    assert!(!ok && text.contains("damaged"), "{text}");

    // Only the database it checked, and the key file: a stray file named
    // like the database being placed replaced it after the checks.
    let stray = dir.path().join("stray");
    copy_dir(&backup, &stray);
    std::fs::write(stray.join("marmot.redb.restoring"), vec![7u8; 5000]).unwrap();
    std::fs::write(stray.join("junk.txt"), "junk").unwrap();
    let from_stray = dir.path().join("from-stray");
    let (ok, text) = restore(&stray, &from_stray);
    assert!(ok, "{text}");
    let placed = std::fs::read(from_stray.join("marmot.redb")).unwrap();
    assert!(
        placed.starts_with(b"redb") && placed.len() != 5000,
        "the stray file was placed"
    );
    assert!(!from_stray.join("junk.txt").exists());
    assert!(from_stray.join("master.key").exists());

    // A restore cut off before it placed the database: a node refuses the
    // directory (it started empty and removed the restored blobs), and so
    // does a second restore, saying why.
    let cut = dir.path().join("cut");
    copy_dir(&from_stray, &cut);
    std::fs::rename(cut.join("marmot.redb"), cut.join("marmot.redb.restoring")).unwrap();
    let (ok, text) = restore(&backup, &cut);
    assert!(!ok && text.contains("cut off"), "{text}");
    let mut node = std::process::Command::new(env!("CARGO_BIN_EXE_marmot"))
        .args(["dev", "--no-examples", "--listen", "127.0.0.1:0", "--data"])
        .arg(&cut)
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let deadline = std::time::Instant::now() + Duration::from_secs(30);
    let status = loop {
        if let Some(s) = node.try_wait().unwrap() {
            break s;
        }
        if std::time::Instant::now() > deadline {
            node.kill().unwrap();
            panic!("a node started on a cut-off restore");
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    };
    let mut err = String::new();
    std::io::Read::read_to_string(&mut node.stderr.take().unwrap(), &mut err).unwrap();
    assert!(!status.success() && err.contains("cut off"), "{err}");
    assert!(
        cut.join("blobs").read_dir().unwrap().next().is_some(),
        "blobs removed"
    );

    // Not into a directory that holds anything.
    let occupied = dir.path().join("occupied");
    std::fs::create_dir_all(&occupied).unwrap();
    std::fs::write(occupied.join("notes.txt"), "mine").unwrap();
    let (ok, text) = restore(&backup, &occupied);
    assert!(!ok && text.contains("not empty"), "{text}");
    // One line, saying it once (the cause was repeated).
    assert_eq!(text.trim().lines().count(), 1, "{text}");
    assert_eq!(text.matches("not empty").count(), 1, "{text}");
    assert_eq!(std::fs::read_dir(&occupied).unwrap().count(), 1);

    // The backup is only read.
    let before = std::fs::read(backup.join("marmot.redb")).unwrap();
    let restored = dir.path().join("restored");
    let (ok, text) = restore(&backup, &restored);
    assert!(ok, "{text}");
    assert!(text.contains("1 blobs checked"), "{text}");
    assert_eq!(std::fs::read(backup.join("marmot.redb")).unwrap(), before);
    drop(m);
    let r2 = Marmot::start(&restored).await;
    let api2 = r2.client();
    let secrets = api2.get("/v1/secrets").await.json;
    assert_eq!(secrets["secrets"][0]["name"], "K1", "{secrets}");
    let file = api2.get("/v1/actors/kit/f/files/outputs/big.bin").await;
    assert_eq!(file.status, 200);
    assert_eq!(file.body.len(), 200_000);
}
