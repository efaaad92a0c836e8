//! Actors' files and artifacts (PRODUCT.md §5): written with the turn (or
//! not at all), small ones inline and large ones as blobs, downloadable
//! with `ETag` and `Range` whether the actor is awake or not, refused for
//! bad paths in any spelling, bounded by quotas, durable across `kill -9`
//! exactly when acknowledged, and gone with their actor.

mod common;

use std::time::{Duration, Instant};

use common::{Api, Marmot, TESTKIT, kit_node, tempdir};
use reqwest::Method;
use serde_json::{Value, json};

async fn write(api: &Api, id: &str, op: Value) -> Value {
    let mut o = json!({ "op": "file_write" });
    for (k, v) in op.as_object().unwrap() {
        o[k] = v.clone();
    }
    api.op("kit", id, o).await.json
}

async fn read(api: &Api, id: &str, path: &str) -> Value {
    api.op("kit", id, json!({ "op": "file_read", "path": path }))
        .await
        .json
}

/// The status of a GET of `path` sent as written (a client library would
/// remove `..` segments before sending).
async fn raw_get(m: &Marmot, path: &str) -> u16 {
    use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};
    let mut s = tokio::net::TcpStream::connect(("127.0.0.1", m.port))
        .await
        .unwrap();
    s.write_all(
        format!("GET {path} HTTP/1.1\r\nhost: marmot\r\nconnection: close\r\n\r\n").as_bytes(),
    )
    .await
    .unwrap();
    let mut resp = String::new();
    s.read_to_string(&mut resp).await.unwrap();
    resp.split(' ').nth(1).unwrap().parse().unwrap()
}

/// Every blob file under the data directory.
fn blobs(data: &std::path::Path) -> Vec<String> {
    let mut out = Vec::new();
    if let Ok(shards) = std::fs::read_dir(data.join("blobs")) {
        for shard in shards.flatten() {
            for f in std::fs::read_dir(shard.path()).unwrap().flatten() {
                out.push(f.file_name().to_string_lossy().into_owned());
            }
        }
    }
    out
}

#[tokio::test]
async fn files_commit_with_their_turn_and_download_with_etag_and_range() {
    let (dir, _m, api) = kit_node(json!({})).await;
    let r = write(
        &api,
        "a",
        json!({ "path": "notes/today.md", "text": "# hello" }),
    )
    .await;
    assert_eq!(r, json!({ "ok": true }));
    // Larger than the inline limit (64 KiB): a blob.
    let big = 200_000;
    let r = write(
        &api,
        "a",
        json!({ "path": "outputs/report.txt", "bytes": big }),
    )
    .await;
    assert_eq!(r, json!({ "ok": true }));
    assert_eq!(blobs(&dir.path().join("data")).len(), 1);

    assert_eq!(read(&api, "a", "notes/today.md").await["text"], "# hello");
    assert_eq!(read(&api, "a", "outputs/report.txt").await["size"], big);

    // A failed turn leaves no file behind.
    let r = api
        .op(
            "kit",
            "a",
            json!({ "op": "file_write", "path": "lost.txt", "text": "x", "fail": true }),
        )
        .await;
    assert_eq!(r.status, 500);
    assert!(
        read(&api, "a", "lost.txt").await["error"]
            .as_str()
            .unwrap()
            .starts_with("not found")
    );
    // ... and no blob either: a failed turn's blobs go with it.
    let r = api
        .op(
            "kit",
            "a",
            json!({ "op": "file_write", "path": "lost.bin", "bytes": 300_000, "fail": true }),
        )
        .await;
    assert_eq!(r.status, 500);
    let deadline = Instant::now() + Duration::from_secs(5);
    while blobs(&dir.path().join("data")).len() != 1 {
        assert!(Instant::now() < deadline, "the failed turn's blob stayed");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }

    let list = api.get("/v1/actors/kit/a/files").await;
    assert_eq!(list.status, 200, "{}", list.json);
    let files = list.json["files"].as_array().unwrap();
    let paths: Vec<&str> = files.iter().map(|f| f["path"].as_str().unwrap()).collect();
    assert_eq!(paths, ["notes/today.md", "outputs/report.txt"]);
    assert_eq!(files[0]["size"], 7);
    assert_eq!(files[0]["sha256"].as_str().unwrap().len(), 64);
    let outputs = api.get("/v1/actors/kit/a/files?prefix=outputs/").await;
    assert_eq!(outputs.json["files"].as_array().unwrap().len(), 1);
    // A prefix is a string, not a path: `notes/to`, `n` or `.` are prefixes
    // as in the guest's `files.list` (the last was a 400 `invalid_path`).
    for (prefix, n) in [("notes/to", 1), ("n", 1), (".", 0), ("a//", 0), ("", 2)] {
        let r = api
            .get(&format!("/v1/actors/kit/a/files?prefix={prefix}"))
            .await;
        assert_eq!(r.status, 200, "{prefix}: {}", r.json);
        assert_eq!(r.json["files"].as_array().unwrap().len(), n, "{prefix}");
    }
    let long = "p".repeat(1025);
    let r = api
        .get(&format!("/v1/actors/kit/a/files?prefix={long}"))
        .await;
    assert_eq!(r.code(), "invalid_path", "{}", r.json);

    let md = api.get("/v1/actors/kit/a/files/notes/today.md").await;
    assert_eq!(md.status, 200);
    assert_eq!(md.body, b"# hello");
    assert_eq!(
        md.headers["content-type"].to_str().unwrap(),
        "text/markdown; charset=utf-8"
    );
    let etag = md.headers["etag"].to_str().unwrap().to_owned();
    assert_eq!(
        etag,
        format!("\"{}\"", files[0]["sha256"].as_str().unwrap())
    );
    let r = api
        .req(
            Method::GET,
            "/v1/actors/kit/a/files/notes/today.md",
            None,
            &[("if-none-match", &etag)],
        )
        .await;
    assert_eq!(r.status, 304);
    // Compared weakly, as RFC 9110 says for If-None-Match (a proxy may
    // have weakened it): it was a 200.
    let weak = format!("\"other\", W/{etag}");
    let r = api
        .req(
            Method::GET,
            "/v1/actors/kit/a/files/notes/today.md",
            None,
            &[("if-none-match", &weak)],
        )
        .await;
    assert_eq!(r.status, 304);
    let r = api
        .req(
            Method::GET,
            "/v1/actors/kit/a/files/outputs/report.txt",
            None,
            &[("range", "bytes=26-29")],
        )
        .await;
    assert_eq!(r.status, 206);
    assert_eq!(r.body, b"abcd");
    assert_eq!(
        r.headers["content-range"].to_str().unwrap(),
        format!("bytes 26-29/{big}")
    );
    // A resumed download's If-Range: its own version's range, or the
    // whole file when the file changed (another tag, a weak one, a date).
    let report_etag = r.headers["etag"].to_str().unwrap().to_owned();
    for (if_range, status) in [
        (report_etag.clone(), 206),
        ("\"old-version\"".to_owned(), 200),
        (format!("W/{report_etag}"), 200),
        ("Sat, 05 Dec 2026 10:00:00 GMT".to_owned(), 200),
    ] {
        let r = api
            .req(
                Method::GET,
                "/v1/actors/kit/a/files/outputs/report.txt",
                None,
                &[("range", "bytes=26-29"), ("if-range", &if_range)],
            )
            .await;
        assert_eq!(r.status, status, "{if_range}");
        let len = if status == 206 { 4 } else { big };
        assert_eq!(r.body.len(), len, "{if_range}");
    }
    let r = api
        .req(
            Method::GET,
            "/v1/actors/kit/a/files/outputs/report.txt",
            None,
            &[("range", "bytes=999999-")],
        )
        .await;
    assert_eq!(r.status, 416);
    assert_eq!(r.code(), "range_not_satisfiable", "{}", r.json);
    assert_eq!(
        r.headers["content-range"].to_str().unwrap(),
        format!("bytes */{big}")
    );
    // If-Match: that version or nothing (412, nothing sent).
    for (if_match, status) in [
        (report_etag.clone(), 200),
        ("*".to_owned(), 200),
        (format!("\"old-version\", {report_etag}"), 200),
        ("\"old-version\"".to_owned(), 412),
        (format!("W/{report_etag}"), 412),
    ] {
        let r = api
            .req(
                Method::GET,
                "/v1/actors/kit/a/files/outputs/report.txt",
                None,
                &[("if-match", &if_match)],
            )
            .await;
        assert_eq!(r.status, status, "{if_match}");
        if status == 412 {
            assert_eq!(r.code(), "precondition_failed", "{}", r.json);
        } else {
            assert_eq!(r.body.len(), big, "{if_match}");
        }
    }
    // A blob is sent as it is read, in pieces: a range across a piece's
    // edge and the whole file come back byte for byte, with their length.
    let pattern: Vec<u8> = (0..big).map(|i| b'a' + (i % 26) as u8).collect();
    let r = api
        .req(
            Method::GET,
            "/v1/actors/kit/a/files/outputs/report.txt",
            None,
            &[("range", "bytes=65530-131080")],
        )
        .await;
    assert_eq!(r.status, 206);
    assert_eq!(r.body, pattern[65530..=131080]);
    let whole = api.get("/v1/actors/kit/a/files/outputs/report.txt").await;
    assert_eq!(whole.body, pattern);
    assert_eq!(whole.headers["content-length"], big.to_string().as_str());
    assert_eq!(
        api.get("/v1/actors/kit/a/files/nope.txt").await.code(),
        "file_not_found"
    );
    assert_eq!(
        api.get("/v1/actors/kit/nobody/files/x").await.code(),
        "actor_not_found"
    );

    // Overwritten and deleted files go; their blob is collected.
    let r = write(
        &api,
        "a",
        json!({ "path": "outputs/report.txt", "text": "small now" }),
    )
    .await;
    assert_eq!(r, json!({ "ok": true }));
    let r = api
        .op(
            "kit",
            "a",
            json!({ "op": "file_delete", "path": "notes/today.md" }),
        )
        .await;
    assert_eq!(r.json, json!({ "existed": true }));
    assert_eq!(
        api.get("/v1/actors/kit/a/files").await.json["files"]
            .as_array()
            .unwrap()
            .len(),
        1
    );
}

#[tokio::test]
async fn bad_paths_are_refused_in_every_spelling() {
    let (_dir, m, api) = kit_node(json!({})).await;
    write(&api, "a", json!({ "path": "ok.txt", "text": "fine" })).await;
    for raw in [
        "..",
        "../../etc/passwd",
        "a/../ok.txt",
        "%2e%2e/ok.txt",
        "%2E%2E",
        "a%2Fb",
        "a%5Cb",
        "a%00b",
        "a//b",
        "./ok.txt",
    ] {
        let status = raw_get(&m, &format!("/v1/actors/kit/a/files/{raw}")).await;
        assert_eq!(status, 400, "{raw}");
    }
    for bad in ["", "/abs", "../x", "a/./b", "a\\b", "a\u{0}b", "a/", "x/.."] {
        let r = write(&api, "a", json!({ "path": bad, "text": "x" })).await;
        assert!(
            r["error"]
                .as_str()
                .unwrap_or("")
                .starts_with("invalid: invalid file path"),
            "{bad:?}: {r}"
        );
    }
    let list = api.get("/v1/actors/kit/a/files").await;
    assert_eq!(
        list.json["files"].as_array().unwrap().len(),
        1,
        "a bad path wrote something"
    );
}

#[tokio::test]
async fn quotas_refuse_a_write_and_change_nothing() {
    let dir = tempdir();
    let config = "[files]\nmax_file_bytes = 100000\nmax_actor_bytes = 150000\nmax_actor_files = 3\nmax_type_bytes = 250000\n";
    let m = Marmot::start_opts(&dir.path().join("data"), &[], Some(config)).await;
    let api = m.client();
    assert_eq!(api.deploy("kit", TESTKIT, json!({})).await.status, 201);
    let limit = |r: Value| {
        let e = r["error"].as_str().unwrap_or("").to_owned();
        assert!(e.starts_with("limit exceeded"), "{r}");
        e
    };
    assert!(
        limit(write(&api, "a", json!({ "path": "big", "bytes": 100_001 })).await)
            .contains("at most 100000 bytes")
    );
    write(&api, "a", json!({ "path": "one", "bytes": 90_000 })).await;
    assert!(
        limit(write(&api, "a", json!({ "path": "two", "bytes": 90_000 })).await)
            .contains("quota of 150000")
    );
    // Replacing a file counts only the difference.
    assert_eq!(
        write(&api, "a", json!({ "path": "one", "bytes": 100_000 })).await,
        json!({ "ok": true })
    );
    write(&api, "a", json!({ "path": "x", "text": "1" })).await;
    write(&api, "a", json!({ "path": "y", "text": "2" })).await;
    assert!(
        limit(write(&api, "a", json!({ "path": "z", "text": "3" })).await)
            .contains("at most 3 files")
    );
    // The type's quota spans its actors.
    write(&api, "b", json!({ "path": "one", "bytes": 100_000 })).await;
    assert!(
        limit(write(&api, "c", json!({ "path": "one", "bytes": 60_000 })).await)
            .contains("files of type `kit`")
    );
    let a = api.get("/v1/actors/kit/a/files").await.json;
    let sizes: Vec<u64> = a["files"]
        .as_array()
        .unwrap()
        .iter()
        .map(|f| f["size"].as_u64().unwrap())
        .collect();
    assert_eq!(sizes, [100_000, 1, 1], "a refused write changed something");
    assert_eq!(
        api.get("/v1/actors/kit/c/files").await.json["files"],
        json!([]),
    );
}

/// A type's quota holds when its actors write at once: each turn counts
/// what the others are writing. It was checked against what was committed
/// only, and eight concurrent 200 kB writes stored 1.2 MB against 800 kB.
#[tokio::test]
async fn a_types_quota_holds_against_concurrent_writers() {
    let dir = tempdir();
    let config = "[files]\nmax_type_bytes = 800000\n";
    let m = Marmot::start_opts(&dir.path().join("data"), &[], Some(config)).await;
    let api = m.client();
    assert_eq!(api.deploy("kit", TESTKIT, json!({})).await.status, 201);
    for round in 0..3 {
        let writes = (0..8).map(|i| {
            let api = api.clone();
            async move {
                let path = format!("r{round}");
                write(
                    &api,
                    &format!("a{i}"),
                    json!({ "path": path, "bytes": 200_000 }),
                )
                .await
            }
        });
        for r in futures::future::join_all(writes).await {
            let ok = r == json!({ "ok": true });
            let refused = r["error"]
                .as_str()
                .is_some_and(|e| e.contains("files of type `kit`"));
            assert!(ok || refused, "{r}");
        }
    }
    let mut stored = 0;
    for i in 0..8 {
        let files = api.get(&format!("/v1/actors/kit/a{i}/files")).await.json;
        for f in files["files"].as_array().into_iter().flatten() {
            stored += f["size"].as_u64().unwrap();
        }
    }
    assert_eq!(
        stored, 800_000,
        "stored {stored} bytes against a quota of 800000"
    );
}

/// A write refused by the turn's cap on stored blobs holds none of the
/// type's quota: it was refused after the type's reservation grew, which
/// stayed grown until the turn ended and refused the type's other writers.
#[tokio::test]
async fn a_refused_write_reserves_nothing_of_the_types_quota() {
    const CHURN_JS: &str = r#"
import { files } from "marmot";
export default {
  onMessage(body) {
    let refused = null;
    if (body.warm) return { refused };
    if (body.churn) {
      files.write("f", "a".repeat(80000));
      try { files.write("f", "b".repeat(140000)); } catch (e) { refused = String(e.message ?? e); }
      console.log("churn: written");
      const until = Date.now() + 1500;
      while (Date.now() < until) {}
    } else {
      files.write("g", "c".repeat(150000));
    }
    return { refused };
  },
};
"#;
    let dir = tempdir();
    let config = "[files]\nmax_actor_bytes = 150000\nmax_type_bytes = 250000\n";
    let m = Marmot::start_opts(&dir.path().join("data"), &[], Some(config)).await;
    let api = m.client();
    assert_eq!(api.deploy_js("churn", CHURN_JS).await.status, 201);
    // The code ready, so that `a`'s turn starts at once.
    let r = api
        .post_json("/v1/actors/churn/warm", &json!({"warm": true}))
        .await;
    assert_eq!(r.status, 200, "{}", r.json);
    let churn = {
        let api = api.clone();
        tokio::spawn(async move {
            api.post_json("/v1/actors/churn/a", &json!({"churn": true}))
                .await
        })
    };
    // While `a` runs on, holding 80 kB of the type's 250 kB.
    let deadline = Instant::now() + Duration::from_secs(20);
    while !m.log_text().contains("churn: written") {
        assert!(Instant::now() < deadline, "`a` never wrote");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let r = api.post_json("/v1/actors/churn/b", &json!({})).await;
    assert_eq!(
        (r.status, &r.json),
        (200, &json!({"refused": null})),
        "{}",
        r.json
    );
    let r = churn.await.unwrap();
    assert_eq!(r.status, 200, "{}", r.json);
    let refused = r.json["refused"].as_str().unwrap_or_default();
    assert!(refused.contains("a turn may store at most"), "{}", r.json);
}

#[tokio::test]
async fn artifacts_download_while_the_actor_hibernates() {
    let (_dir, _m, api) = kit_node(json!({ "idle_timeout_ms": 200 })).await;
    write(
        &api,
        "a",
        json!({ "path": "outputs/summary.json", "text": "{\"ok\":true}" }),
    )
    .await;
    let deadline = Instant::now() + Duration::from_secs(10);
    while api.get("/v1/actors/kit/a").await.json["status"] != "hibernated" {
        assert!(Instant::now() < deadline, "the actor did not hibernate");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let r = api.get("/v1/actors/kit/a/files/outputs/summary.json").await;
    assert_eq!(r.status, 200);
    assert_eq!(r.json, json!({ "ok": true }));
    assert_eq!(
        api.get("/v1/actors/kit/a").await.json["status"],
        "hibernated",
        "a download woke the actor"
    );
}

#[tokio::test]
async fn files_survive_kill_9_exactly_when_acknowledged_and_go_with_their_actor() {
    let dir = tempdir();
    let data = dir.path().join("data");
    let marker = "crash-after-the-blob-write";
    let mut m = Marmot::start_with_env(&data, &[("MARMOT_FAULT_ABORT_ON_LOG", marker)]).await;
    let api = m.client();
    assert_eq!(api.deploy("kit", TESTKIT, json!({})).await.status, 201);
    let r = write(&api, "a", json!({ "path": "kept.bin", "bytes": 150_000 })).await;
    assert_eq!(r, json!({ "ok": true }));
    assert_eq!(blobs(&data).len(), 1);
    // This turn stores its blob, then the node dies before the commit.
    let crashed = api
        .http
        .post(format!("{}/v1/actors/kit/a", api.url))
        .json(&json!({ "op": "file_write", "path": "lost.bin", "bytes": 170_000, "crash": marker }))
        .send()
        .await;
    assert!(crashed.is_err(), "the turn was acknowledged: {crashed:?}");
    assert!(
        m.wait_exit(Duration::from_secs(10)),
        "the fault did not fire"
    );
    assert_eq!(
        blobs(&data).len(),
        2,
        "the lost turn's blob was not written"
    );
    m.restart().await;
    let api = m.client();
    assert_eq!(read(&api, "a", "kept.bin").await["size"], 150_000);
    assert!(
        read(&api, "a", "lost.bin").await["error"]
            .as_str()
            .unwrap()
            .starts_with("not found")
    );
    assert_eq!(blobs(&data).len(), 1, "the orphan blob was not collected");

    // Deleting the actor deletes its files (and, at the next collection,
    // their blobs).
    assert_eq!(api.delete("/v1/actors/kit/a").await.status, 200);
    assert_eq!(
        api.get("/v1/actors/kit/a/files").await.code(),
        "actor_not_found"
    );
    let r = api.op("kit", "a", json!({ "op": "file_list" })).await;
    assert_eq!(r.json, json!({ "files": [] }));
    m.restart().await;
    assert!(blobs(&data).is_empty(), "a deleted actor's blob was kept");
}

/// A node with `config` on which actor `a` of `kit` wrote twelve versions
/// of one 300 kB file, `big.bin` (distinct sizes: distinct blobs); its
/// data directory.
async fn twelve_versions(config: &str) -> (tempfile::TempDir, std::path::PathBuf, Marmot, Api) {
    let dir = tempdir();
    let data = dir.path().join("data");
    let m = Marmot::start_opts(&data, &[], Some(config)).await;
    let api = m.client();
    assert_eq!(api.deploy("kit", TESTKIT, json!({})).await.status, 201);
    for i in 0..12 {
        let r = write(
            &api,
            "a",
            json!({ "path": "big.bin", "bytes": 300_000 + i }),
        )
        .await;
        assert_eq!(r, json!({ "ok": true }), "version {i}");
    }
    (dir, data, m, api)
}

/// A file rewritten or deleted gives its blob back shortly after the
/// commit, not at the hourly sweep: an actor rewriting a large file in a
/// loop, within its quota, used to leave every old version on disk for up
/// to 70 minutes (a probe grew `blobs/` by 115 MB in two seconds).
#[tokio::test]
async fn rewritten_and_deleted_files_give_their_blobs_back() {
    let config = "[files]\nreleased_blob_delay_ms = 300\nmax_actor_bytes = 1000000\n";
    // 3.6 MB in all against a quota of 1 MB, and a file written and
    // deleted.
    let (_dir, data, _m, api) = twelve_versions(config).await;
    let r = write(&api, "a", json!({ "path": "gone.bin", "bytes": 200_000 })).await;
    assert_eq!(r, json!({ "ok": true }));
    let r = api
        .op(
            "kit",
            "a",
            json!({ "op": "file_delete", "path": "gone.bin" }),
        )
        .await;
    assert_eq!(r.json, json!({ "existed": true }));
    let list = api.get("/v1/actors/kit/a/files").await;
    let live = list.json["files"][0]["sha256"].as_str().unwrap().to_owned();
    let deadline = Instant::now() + Duration::from_secs(10);
    while blobs(&data) != [live.clone()] {
        assert!(
            Instant::now() < deadline,
            "blobs no file refers to stayed: {} on disk",
            blobs(&data).len()
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert_eq!(read(&api, "a", "big.bin").await["size"], 300_011);
    let r = api.get("/v1/actors/kit/a/files/big.bin").await;
    assert_eq!(r.status, 200);

    // A child script's file, rolled back when it threw, in a turn that
    // otherwise changed nothing: its blob goes too (it stayed until the
    // hourly sweep: found by a probe).
    let code = "marmot.files.write('outputs/o', 'x'.repeat(100000)); throw new Error('no')";
    let r = api
        .op(
            "kit",
            "a",
            json!({ "op": "js_eval", "code": code, "tools": ["files"] }),
        )
        .await;
    assert_eq!(r.status, 200, "{}", r.json);
    assert!(
        r.json["error"].as_str().is_some_and(|e| e.contains("no")),
        "{}",
        r.json
    );
    let deadline = Instant::now() + Duration::from_secs(10);
    while blobs(&data) != [live.clone()] {
        assert!(
            Instant::now() < deadline,
            "a rolled-back script's blob stayed: {} on disk",
            blobs(&data).len()
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// While the blobs waiting out their delay hold more than
/// `files.max_released_bytes`, the oldest go at once: a rewrite loop kept
/// write rate × delay on disk, outside every quota (2 GB against a 6 MiB
/// type quota: a probe).
#[tokio::test]
async fn released_blobs_past_their_bound_go_before_their_delay() {
    let config = "[files]\nreleased_blob_delay_ms = 600000\nmax_released_bytes = 700000\n\
                  max_actor_bytes = 1000000\n";
    let (_dir, data, _m, api) = twelve_versions(config).await;
    let list = api.get("/v1/actors/kit/a/files").await;
    let live = list.json["files"][0]["sha256"].as_str().unwrap().to_owned();
    // The live version, and the two newest old ones (600 kB): a third
    // would be 900 kB waiting.
    let deadline = Instant::now() + Duration::from_secs(10);
    while blobs(&data).len() != 3 {
        assert!(
            Instant::now() < deadline,
            "{} blobs on disk, 3 expected",
            blobs(&data).len()
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert!(blobs(&data).contains(&live));
    assert_eq!(read(&api, "a", "big.bin").await["size"], 300_011);
}

#[tokio::test]
async fn javascript_actors_have_files_too() {
    let (_dir, _m, api) = kit_node(json!({})).await;
    let source = r#"import { files } from "marmot";
export default {
  async onMessage(body) {
    files.write("outputs/hello.txt", "hi " + body.name);
    return { read: files.read("outputs/hello.txt"), list: files.list("outputs/") };
  }
};"#;
    let r = api.deploy_js("jsfiles", source).await;
    assert_eq!(r.status, 201, "{}", r.json);
    let r = api
        .post_json("/v1/actors/jsfiles/a", &json!({ "name": "ann" }))
        .await;
    assert_eq!(r.status, 200, "{}", r.json);
    assert_eq!(r.json["read"], "hi ann");
    assert_eq!(r.json["list"][0]["path"], "outputs/hello.txt");
    let r = api
        .get("/v1/actors/jsfiles/a/files/outputs/hello.txt")
        .await;
    assert_eq!(r.body, b"hi ann");
}

/// A blob damaged on disk (a stray write, a truncation) is never handed
/// out as the file: the guest's read fails, a whole download ends short
/// of its length, a range of a cut-short blob is a 500, a backup fails
/// naming it, and writing the same bytes again repairs it. Before, the
/// damage was served with the file's ETag, a new file with the same
/// bytes was acknowledged onto it, and every backup copied it on while
/// no restore would take one (found by a probe).
#[tokio::test]
async fn a_blob_damaged_on_disk_is_never_served_as_the_file() {
    let (dir, m, api) = kit_node(json!({})).await;
    let size = 300_000;
    let r = write(&api, "a", json!({ "path": "outputs/r.txt", "bytes": size })).await;
    assert_eq!(r, json!({ "ok": true }));
    let data = dir.path().join("data");
    let name = blobs(&data).pop().expect("a blob");
    let blob = data.join("blobs").join(&name[..2]).join(&name);
    let good = std::fs::read(&blob).unwrap();
    let mut bad = good.clone();
    bad[200_000..200_004].copy_from_slice(b"ZZZZ");
    std::fs::write(&blob, &bad).unwrap();

    let r = api
        .op(
            "kit",
            "a",
            json!({ "op": "file_read", "path": "outputs/r.txt" }),
        )
        .await;
    assert!(r.status >= 500, "the guest read {}: {}", r.status, r.json);
    let url = format!("{}/v1/actors/kit/a/files/outputs/r.txt", m.url);
    let resp = reqwest::get(&url).await.unwrap();
    assert_eq!(resp.status(), 200);
    assert!(
        resp.bytes().await.is_err(),
        "the damaged file arrived whole"
    );
    let resp = reqwest::Client::new()
        .get(&url)
        .header("range", "bytes=0-")
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status(), 206);
    assert!(
        resp.bytes().await.is_err(),
        "every byte of it arrived as a range"
    );
    let backup = dir.path().join("backup");
    let r = api.post_json("/v1/backup", &json!({ "to": backup })).await;
    assert!(r.status >= 400, "{}", r.json);
    let message = r.json["error"]["message"].as_str().unwrap_or_default();
    assert!(
        message.contains(&name) && message.contains("damaged"),
        "{}",
        r.json
    );
    assert!(!backup.exists());

    // The same bytes written again (by another actor) mend the blob.
    let r = write(&api, "b", json!({ "path": "copy.txt", "bytes": size })).await;
    assert_eq!(r, json!({ "ok": true }));
    assert_eq!(std::fs::read(&blob).unwrap(), good);
    let whole = reqwest::get(&url).await.unwrap().bytes().await.unwrap();
    assert_eq!(whole.as_ref(), good.as_slice());

    // Cut short: even a range of it is refused.
    std::fs::write(&blob, &good[..1000]).unwrap();
    let r = api
        .req(
            Method::GET,
            "/v1/actors/kit/a/files/outputs/r.txt",
            None,
            &[("range", "bytes=0-99")],
        )
        .await;
    assert_eq!(r.status, 500, "{}", r.json);
    assert_eq!(r.code(), "file_unreadable");

    // Gone from disk while its row still names it: unreadable too, after
    // the row is read again (a blob released by a rewrite in between is
    // served as the file is now).
    std::fs::remove_file(&blob).unwrap();
    let r = api.get("/v1/actors/kit/a/files/outputs/r.txt").await;
    assert_eq!((r.status, r.code()), (500, "file_unreadable"), "{}", r.json);
}
