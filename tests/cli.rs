//! The `marmot` command line against a real process: `serve` with its
//! admin token, the client commands, and `dev`'s examples.

mod common;

use common::{Marmot, TESTKIT, tempdir};
use serde_json::{Value, json};

#[tokio::test]
async fn serve_requires_a_token_and_enforces_it() {
    let dir = tempdir();
    let data = dir.path().join("data");
    // Without a token `serve` refuses to start, with one clear line.
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_marmot"))
        .args(["serve", "--listen", "127.0.0.1:0", "--data"])
        .arg(&data)
        .env_remove("MARMOT_ADMIN_TOKEN")
        .output()
        .unwrap();
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("requires an admin token"), "{err}");
    // `dev` refuses to listen beyond loopback.
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_marmot"))
        .args(["dev", "--listen", "0.0.0.0:0", "--data"])
        .arg(&data)
        .output()
        .unwrap();
    assert!(!out.status.success());
    assert!(String::from_utf8_lossy(&out.stderr).contains("loopback"));

    let token = "s3cret-token-for-tests-0123456789";
    // Without a master key for the secret store, `serve` refuses to start
    // and says how to make one.
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_marmot"))
        .args(["serve", "--listen", "127.0.0.1:0", "--data"])
        .arg(&data)
        .env("MARMOT_ADMIN_TOKEN", token)
        .env_remove("MARMOT_MASTER_KEY")
        .output()
        .unwrap();
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("MARMOT_MASTER_KEY") && err.contains("marmot secrets new-key"),
        "{err}"
    );
    let key = common::new_master_key();

    let port = common::free_port();
    let mut child = std::process::Command::new(env!("CARGO_BIN_EXE_marmot"))
        .args(["serve", "--listen", &format!("127.0.0.1:{port}"), "--data"])
        .arg(&data)
        .env("MARMOT_ADMIN_TOKEN", token)
        .env("MARMOT_MASTER_KEY", &key)
        .stderr(std::process::Stdio::null())
        .spawn()
        .unwrap();
    let url = format!("http://127.0.0.1:{port}");
    let http = reqwest::Client::new();
    let mut ready = false;
    for _ in 0..400 {
        if let Ok(r) = http.get(format!("{url}/readyz")).send().await
            && r.status() == 200
        {
            ready = true;
            break;
        }
        tokio::time::sleep(std::time::Duration::from_millis(50)).await;
    }
    assert!(ready, "serve did not become ready");
    let r = http.get(format!("{url}/v1/types")).send().await.unwrap();
    assert_eq!(r.status(), 401);
    assert_eq!(
        r.headers()["www-authenticate"],
        "Bearer realm=\"marmot\"",
        "a 401 names the scheme it wants"
    );
    let body: Value = r.json().await.unwrap();
    assert_eq!(body["error"]["code"], "unauthorized");
    let r = http
        .get(format!("{url}/v1/types"))
        .bearer_auth("wrong")
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 401);
    let r = http
        .get(format!("{url}/v1/types"))
        .bearer_auth(token)
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 200);
    let r = http.get(format!("{url}/metrics")).send().await.unwrap();
    assert_eq!(r.status(), 401, "metrics are behind auth in serve");
    assert_eq!(
        http.get(format!("{url}/healthz"))
            .send()
            .await
            .unwrap()
            .status(),
        200
    );
    // The API description is open, and describes this API.
    let r = http
        .get(format!("{url}/v1/openapi.json"))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 200);
    let doc: Value = r.json().await.unwrap();
    assert_eq!(doc["openapi"], "3.1.0");
    assert!(doc["paths"]["/v1/actors/{type}/{id}"]["post"].is_object());
    // Inbound webhooks authenticate by signature, not by the admin token.
    let r = http
        .post(format!("{url}/v1/hooks/nope/a/github"))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 404, "reaches the hook handler (unknown type)");
    let _ = child.kill();
    let _ = child.wait();
}

#[tokio::test]
async fn cli_client_commands() {
    let dir = tempdir();
    let m = Marmot::start(&dir.path().join("data")).await;
    let wasm = dir.path().join("kit.wasm");
    std::fs::write(&wasm, TESTKIT).unwrap();
    let bad = dir.path().join("bad.wasm");
    std::fs::write(&bad, b"nope").unwrap();
    let marmot = |args: &[&str]| {
        std::process::Command::new(env!("CARGO_BIN_EXE_marmot"))
            .args(args)
            .env("MARMOT_URL", &m.url)
            .output()
            .unwrap()
    };
    let out = marmot(&["deploy", "kit", wasm.to_str().unwrap()]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let v: Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(v["version"], 1);
    let out = marmot(&["call", "kit", "a", r#"{"op":"add","key":"n","by":4}"#]);
    assert!(out.status.success());
    assert_eq!(
        serde_json::from_slice::<Value>(&out.stdout).unwrap()["value"],
        4
    );
    let out = marmot(&[
        "call",
        "kit",
        "a",
        r#"{"op":"add","key":"n","by":1}"#,
        "--no-wait",
    ]);
    assert!(out.status.success());
    assert!(serde_json::from_slice::<Value>(&out.stdout).unwrap()["message_id"].is_string());
    // A message too large for a command line, from a file or stdin.
    let large = json!({"op": "set", "key": "big", "value": "x".repeat(300_000)});
    let file = dir.path().join("large.json");
    std::fs::write(&file, large.to_string()).unwrap();
    let out = marmot(&["call", "kit", "a", &format!("@{}", file.display())]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let mut piped = std::process::Command::new(env!("CARGO_BIN_EXE_marmot"))
        .args(["call", "kit", "b", "-"])
        .env("MARMOT_URL", &m.url)
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    {
        use std::io::Write as _;
        let mut stdin = piped.stdin.take().unwrap();
        stdin.write_all(large.to_string().as_bytes()).unwrap();
    }
    assert!(piped.wait_with_output().unwrap().status.success());
    for id in ["a", "b"] {
        let out = marmot(&["call", "kit", id, r#"{"op":"get","key":"big"}"#]);
        let v: Value = serde_json::from_slice(&out.stdout).unwrap();
        assert_eq!(v["value"].as_str().map(str::len), Some(300_000), "{id}");
    }
    let out = marmot(&["call", "kit", "a", "@/nonexistent/message.json"]);
    assert!(!out.status.success());
    assert!(String::from_utf8_lossy(&out.stderr).contains("cannot read the message"));
    // A state larger than `inspect` shows says so.
    let api = m.client();
    for i in 0..60 {
        let set = json!({"op": "set", "key": format!("k{i:02}"), "value": i});
        assert_eq!(api.post_json("/v1/actors/kit/many", &set).await.status, 200);
    }
    let out = marmot(&["inspect", "kit", "many"]);
    let v: Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(v["state"].as_array().map(Vec::len), Some(50));
    let said = String::from_utf8_lossy(&out.stderr);
    assert!(said.contains("the first 50 of 60 state entries"), "{said}");
    let out = marmot(&["actors", "kit"]);
    assert!(String::from_utf8_lossy(&out.stdout).contains("a "));
    let out = marmot(&["inspect", "kit", "a"]);
    let v: Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(v["actor"]["id"], "a");

    // Errors: one line on stderr, non-zero exit, nothing on stdout.
    for args in [
        vec!["deploy", "kit", bad.to_str().unwrap()],
        vec!["call", "nope", "a"],
        vec!["call", "kit", "a", "{not json"],
        vec!["inspect", "kit", "ghost"],
        vec!["events", "nope", "a", "--follow"],
        vec!["actors", "nope"],
    ] {
        let out = marmot(&args);
        assert!(!out.status.success(), "{args:?} succeeded");
        let err = String::from_utf8_lossy(&out.stderr);
        let last = err.trim_end().lines().last().unwrap_or("");
        assert!(last.starts_with("error: "), "{args:?}: {err}");
        // The API's message, never its JSON (`events --follow` printed it).
        assert!(!last.contains("{\""), "{args:?}: {err}");
        assert!(out.stdout.is_empty(), "{args:?} printed to stdout");
    }
    // An empty TYPE or ID, or a URL without its scheme, says so (they were
    // "no such endpoint" and "builder error: relative URL without a base").
    let out = marmot(&["call", "kit", "", "{}"]);
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("must not be empty"), "{err}");
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_marmot"))
        .args(["types", "--url", m.url.trim_start_matches("http://")])
        .output()
        .unwrap();
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("is not an http(s) URL"), "{err}");
    // Credentials in the URL are refused, never echoed; a query would be
    // glued in front of every path.
    let port = m.url.rsplit(':').next().unwrap();
    for (url, why) in [
        (
            format!("http://admin:HUNTER2@127.0.0.1:{port}"),
            "credentials",
        ),
        (format!("{}/?token=x", m.url), "query"),
    ] {
        let out = std::process::Command::new(env!("CARGO_BIN_EXE_marmot"))
            .args(["types", "--url", &url])
            .output()
            .unwrap();
        assert!(!out.status.success());
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(err.contains(why) && !err.contains("HUNTER2"), "{err}");
    }
    // A listing cut by --limit says there is more (on stderr).
    for id in ["l1", "l2", "l3"] {
        marmot(&["call", "kit", id, r#"{"op": "get", "key": "n"}"#]);
    }
    let out = marmot(&["actors", "kit", "--prefix", "l", "--limit", "2"]);
    assert!(out.status.success());
    assert_eq!(
        String::from_utf8_lossy(&out.stdout).lines().count(),
        3,
        "a header and two rows"
    );
    assert!(String::from_utf8_lossy(&out.stderr).contains("more actors"));
    assert!(!marmot(&["actors", "kit", "--limit", "0"]).status.success());
    // `marmot inspect … | head -c 0`: the reader is gone before the answer
    // is printed. The command ends as `cat` would, killed by SIGPIPE with
    // nothing on stderr; it used to panic in `println!`.
    let mut child = std::process::Command::new(env!("CARGO_BIN_EXE_marmot"))
        .args(["inspect", "kit", "a"])
        .env("MARMOT_URL", &m.url)
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    drop(child.stdout.take());
    let out = child.wait_with_output().unwrap();
    use std::os::unix::process::ExitStatusExt as _;
    assert_eq!(
        out.status.signal(),
        Some(libc::SIGPIPE),
        "{:?}: {}",
        out.status,
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(
        out.stderr.is_empty(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    // A body so far past the node's limit that the node hangs up on it
    // unread (past 128 MiB) is an error that says so; SIGPIPE from the
    // socket used to end the command with no word.
    let huge = dir.path().join("huge.js");
    std::fs::File::create(&huge)
        .and_then(|f| f.set_len(130 << 20))
        .unwrap();
    let out = marmot(&["deploy", "huge", huge.to_str().unwrap()]);
    assert_eq!(out.status.signal(), None, "{:?}", out.status);
    assert_eq!(out.status.code(), Some(1), "{:?}", out.status);
    let err = String::from_utf8_lossy(&out.stderr);
    let last = err.trim_end().lines().last().unwrap_or("");
    assert!(
        last.contains("payload_too_large") || last.contains("refused unread"),
        "{err}"
    );
    assert_eq!(api.get("/v1/types/huge").await.status, 404);

    // `.` and `..` cannot be sent in a URL (every URL parser reads them,
    // encoded or not, as directory steps: `alarms kit ..` asked for the
    // type `alarms`): refused in one line, nothing sent.
    for id in [".", ".."] {
        for args in [
            vec!["call", "kit", id, r#"{"op":"add","key":"n","by":2}"#],
            vec!["inspect", "kit", id],
            vec!["alarms", "kit", id],
        ] {
            let out = marmot(&args);
            assert!(!out.status.success(), "{args:?}");
            let err = String::from_utf8_lossy(&out.stderr);
            assert!(err.contains("cannot be sent in a URL"), "{args:?}: {err}");
        }
    }
    // `--after` past the log's end (the actor was made again): the page
    // starts over, and so does the listing, saying so on stderr — it
    // printed one page and stopped; following printed the `reset` frame
    // as an event.
    for n in 0..3 {
        let op = format!(r#"{{"op":"emit","kind":"e","data":{n}}}"#);
        assert!(marmot(&["call", "kit", "ev", &op]).status.success());
    }
    let out = marmot(&["events", "kit", "ev", "--after", "50"]);
    assert!(out.status.success());
    let seqs: Vec<u64> = String::from_utf8_lossy(&out.stdout)
        .lines()
        .map(|l| {
            serde_json::from_str::<Value>(l).unwrap()["seq"]
                .as_u64()
                .unwrap()
        })
        .collect();
    assert_eq!(seqs, [1, 2, 3]);
    assert!(String::from_utf8_lossy(&out.stderr).contains("from its start"));
    let mut child = std::process::Command::new(env!("CARGO_BIN_EXE_marmot"))
        .args(["events", "kit", "ev", "--after", "50", "--follow"])
        .env("MARMOT_URL", &m.url)
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    tokio::time::sleep(std::time::Duration::from_millis(1500)).await;
    child.kill().unwrap();
    let out = child.wait_with_output().unwrap();
    let lines: Vec<Value> = String::from_utf8_lossy(&out.stdout)
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    assert_eq!(lines.len(), 3, "{lines:?}");
    assert!(lines.iter().all(|e| e["seq"].is_u64()), "{lines:?}");
    assert!(String::from_utf8_lossy(&out.stderr).contains("from its start"));

    // Nothing listening: one line, also when following (which retried for
    // ever).
    for args in [
        vec!["call", "kit", "a"],
        vec!["events", "kit", "a", "--follow"],
    ] {
        let out = std::process::Command::new(env!("CARGO_BIN_EXE_marmot"))
            .args(&args)
            .env("MARMOT_URL", "http://127.0.0.1:1")
            .output()
            .unwrap();
        assert!(!out.status.success(), "{args:?}");
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(err.contains("cannot reach marmot"), "{args:?}: {err}");
    }
}

/// Regression: `marmot dev` deployed its bundled examples at every start,
/// over a user's type of the same name: the user's code was silently
/// replaced and their actors ran other code.
#[tokio::test]
async fn dev_examples_never_replace_a_users_type() {
    let dir = tempdir();
    let mut m = Marmot::start_with_examples(&dir.path().join("data")).await;
    let api = m.client();
    let example = api.get("/v1/types/counter").await;
    assert_eq!(example.status, 200, "{}", example.json);
    assert_eq!(example.json["kind"], "wasm");

    let mine = "export default { async onMessage(body) { return { mine: true }; } };";
    let r = api.deploy_js("counter", mine).await;
    assert_eq!(r.status, 201, "{}", r.json);
    let version = r.json["version"].clone();

    m.restart().await;
    let after = api.get("/v1/types/counter").await.json;
    assert_eq!(after["kind"], "js", "the example replaced the user's type");
    assert_eq!(after["version"], version, "a new version appeared: {after}");
    let reply = api.post_json("/v1/actors/counter/a", &json!({})).await;
    assert_eq!(reply.status, 200, "{}", reply.json);
    assert_eq!(reply.json, json!({ "mine": true }));
    // The other example was not touched either, and is still there.
    assert_eq!(api.get("/v1/types/notes").await.json["version"], 1);
}

/// Model credentials in the environment apply at every start of `marmot
/// dev` (once the data directory had a provider `default`, a key set or
/// rotated later was ignored), and the assistant example follows the
/// model they name, unless the user changed the example.
#[tokio::test]
async fn dev_applies_model_credentials_at_every_start() {
    let dir = tempdir();
    let mut m = Marmot::start_with_examples(&dir.path().join("data")).await;
    let api = m.client();
    let version = |api: &common::Api| {
        let api = api.clone();
        async move { api.get("/v1/types/assistant").await.json["version"].clone() }
    };
    let base_url = |api: &common::Api| {
        let api = api.clone();
        async move {
            let r = api.get("/v1/providers/default").await;
            assert_eq!(r.status, 200, "{}", r.json);
            r.json["base_url"].clone()
        }
    };
    let first = version(&api).await.as_u64().unwrap();
    // A new version for each new model name, none for the same.
    for (url, model, want) in [
        ("http://127.0.0.1:9/v1", "first-model", first + 1),
        ("http://127.0.0.1:10/v1", "second-model", first + 2),
        ("http://127.0.0.1:10/v1", "second-model", first + 2),
    ] {
        m.set_env("MARMOT_MODEL_URL", Some(url));
        m.set_env("MARMOT_MODEL", Some(model));
        m.restart().await;
        assert_eq!(base_url(&api).await, url);
        assert_eq!(version(&api).await, want, "{model}");
    }
    // An example the user changed is theirs: it stays as they left it.
    let mut manifest: Value =
        serde_json::from_str(include_str!("../examples/assistant/assistant.json")).unwrap();
    manifest["agent"]["instructions"] = json!("Mine.");
    manifest["agent"]["model"]["name"] = json!("second-model");
    let r = api.deploy_manifest("assistant", &manifest).await;
    assert_eq!(r.status, 201, "{}", r.json);
    let mine = version(&api).await;
    m.set_env("MARMOT_MODEL", Some("third-model"));
    m.restart().await;
    assert_eq!(version(&api).await, mine);
}

/// A pseudo-terminal: (leader, follower), the follower for the CLI's
/// standard streams.
fn pty() -> (std::fs::File, std::fs::File) {
    use std::os::fd::FromRawFd as _;
    let (mut leader, mut follower) = (0, 0);
    // SAFETY: openpty writes the two descriptors it opens; each is owned
    // by one File from here on.
    #[allow(unsafe_code, reason = "a pseudo-terminal for the CLI")]
    unsafe {
        let rc = libc::openpty(
            &mut leader,
            &mut follower,
            std::ptr::null_mut(),
            std::ptr::null(),
            std::ptr::null(),
        );
        assert_eq!(rc, 0, "openpty");
        (
            std::fs::File::from_raw_fd(leader),
            std::fs::File::from_raw_fd(follower),
        )
    }
}

/// Everything the terminal's other side shows, gathered on a thread of its
/// own until every follower descriptor is closed (EIO).
fn record(
    leader: &std::fs::File,
) -> (
    std::sync::Arc<std::sync::Mutex<Vec<u8>>>,
    std::thread::JoinHandle<()>,
) {
    use std::io::Read as _;
    let seen = std::sync::Arc::new(std::sync::Mutex::new(Vec::new()));
    let reader = {
        let seen = seen.clone();
        let mut leader = leader.try_clone().unwrap();
        std::thread::spawn(move || {
            let mut buf = [0u8; 256];
            while let Ok(n @ 1..) = leader.read(&mut buf) {
                seen.lock().unwrap().extend_from_slice(&buf[..n]);
            }
        })
    };
    (seen, reader)
}

/// `marmot secrets set` at a terminal asks for the value and does not echo
/// what is typed (it showed it, into the scrollback).
#[tokio::test]
async fn secrets_set_at_a_terminal_asks_and_never_echoes() {
    use std::io::Write as _;
    let dir = tempdir();
    let m = Marmot::start(&dir.path().join("data")).await;
    let (leader, follower) = pty();
    let mut child = {
        let mut cmd = std::process::Command::new(env!("CARGO_BIN_EXE_marmot"));
        cmd.args(["secrets", "set", "TTYSEC", "--host", "api.example.com"])
            .env("MARMOT_URL", &m.url)
            .stdin(follower.try_clone().unwrap())
            .stdout(follower.try_clone().unwrap())
            .stderr(follower);
        cmd.spawn().unwrap()
    };
    let (seen, reader) = record(&leader);
    let text = || String::from_utf8_lossy(&seen.lock().unwrap()).into_owned();
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(20);
    while !text().contains("not shown") {
        assert!(
            std::time::Instant::now() < deadline,
            "no prompt: {:?}",
            text()
        );
        std::thread::sleep(std::time::Duration::from_millis(20));
    }
    let mut leader = leader;
    leader.write_all(b"typed-SECRET-value\n").unwrap();
    let status = loop {
        if let Some(s) = child.try_wait().unwrap() {
            break s;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "the CLI never ended: {:?}",
            text()
        );
        std::thread::sleep(std::time::Duration::from_millis(20));
    };
    drop(leader);
    reader.join().unwrap();
    let shown = text();
    assert!(status.success(), "{shown}");
    assert!(shown.contains("secret TTYSEC created"), "{shown}");
    assert!(!shown.contains("typed-SECRET-value"), "echoed: {shown}");
    let secrets = m.client().get("/v1/secrets").await.json;
    assert_eq!(secrets["secrets"][0]["name"], "TTYSEC", "{secrets}");
}

/// `marmot dev --config` with keys `dev` decides itself (`data_dir`,
/// `listen`, `admin_token`) says it ignores them: they were dropped without
/// a word, and the data went elsewhere than the file said.
#[tokio::test]
async fn dev_says_which_config_keys_it_ignores() {
    let dir = tempdir();
    let config = format!(
        "data_dir = {:?}\nadmin_token = \"0123456789abcdef0123456789abcdef\"\n",
        dir.path().join("elsewhere")
    );
    let m = Marmot::start_opts(&dir.path().join("data"), &[], Some(&config)).await;
    let log = m.log_text();
    assert!(log.contains("ignores `data_dir`"), "{log}");
    assert!(log.contains("ignores `admin_token`"), "{log}");
    assert!(!log.contains("ignores `listen`"), "{log}");
    assert!(!dir.path().join("elsewhere").exists());
}

/// `marmot dev` on a port in use says so before it makes its data
/// directory and deploys the examples into it (it did both first).
#[test]
fn dev_on_a_port_in_use_fails_before_touching_its_data_directory() {
    let taken = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let dir = tempdir();
    let data = dir.path().join("data");
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_marmot"))
        .arg("dev")
        .arg("--listen")
        .arg(taken.local_addr().unwrap().to_string())
        .arg("--data")
        .arg(&data)
        .output()
        .unwrap();
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("cannot listen on"), "{err}");
    assert!(!data.exists(), "{err}");
}

/// A bad address range is blamed on the setting that holds it
/// (`models.allow_private`'s were reported as `egress.allow_private`).
#[test]
fn a_bad_private_range_names_its_own_setting() {
    for (section, entry) in [("models", "not-a-range"), ("egress", "nor-this")] {
        let dir = tempdir();
        let config = dir.path().join("marmot.toml");
        std::fs::write(
            &config,
            format!("[{section}]\nallow_private = [\"{entry}\"]\n"),
        )
        .unwrap();
        let out = std::process::Command::new(env!("CARGO_BIN_EXE_marmot"))
            .args([
                "dev",
                "--no-examples",
                "--listen",
                "127.0.0.1:0",
                "--config",
            ])
            .arg(&config)
            .arg("--data")
            .arg(dir.path().join("data"))
            .output()
            .unwrap();
        assert!(!out.status.success());
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(
            err.contains(&format!("{section}.allow_private: `{entry}`")),
            "{err}"
        );
    }
}

/// With `--log-format json` every line `marmot dev` writes is a JSON
/// object, its greeting too (it was six lines of plain text among them).
#[test]
fn dev_with_json_logs_writes_only_json() {
    use std::io::BufRead as _;
    let dir = tempdir();
    let mut child = std::process::Command::new(env!("CARGO_BIN_EXE_marmot"))
        .args([
            "dev",
            "--no-examples",
            "--log-format",
            "json",
            "--listen",
            "127.0.0.1:0",
        ])
        .arg("--data")
        .arg(dir.path().join("data"))
        .stderr(std::process::Stdio::piped())
        .stdout(std::process::Stdio::null())
        .spawn()
        .unwrap();
    let stderr = std::io::BufReader::new(child.stderr.take().unwrap());
    let mut greeted = false;
    for line in stderr.lines().take(200) {
        let line = line.unwrap();
        let v: serde_json::Value =
            serde_json::from_str(&line).unwrap_or_else(|e| panic!("not JSON ({e}): {line}"));
        if v["fields"]["message"] == "marmot dev listening" {
            greeted = true;
            break;
        }
    }
    let _ = child.kill();
    let _ = child.wait();
    assert!(greeted, "no greeting record");
}

/// A signal at the `secrets set` prompt (Ctrl-C) leaves the terminal as it
/// found it: the process used to die with echo off, and the user's shell
/// showed nothing typed after it.
#[tokio::test]
async fn a_signal_at_the_secret_prompt_gives_the_terminal_its_echo_back() {
    use std::os::fd::AsRawFd as _;
    let dir = tempdir();
    let m = Marmot::start(&dir.path().join("data")).await;
    let (leader, follower) = pty();
    let echo_on = |f: &std::fs::File| {
        let mut t = std::mem::MaybeUninit::<libc::termios>::uninit();
        // SAFETY: tcgetattr fills `t` when it returns 0.
        #[allow(unsafe_code, reason = "reading the terminal's settings")]
        unsafe {
            assert_eq!(libc::tcgetattr(f.as_raw_fd(), t.as_mut_ptr()), 0);
            t.assume_init().c_lflag & libc::ECHO != 0
        }
    };
    assert!(echo_on(&follower));
    let mut child = std::process::Command::new(env!("CARGO_BIN_EXE_marmot"))
        .args(["secrets", "set", "SIGSEC", "--host", "api.example.com"])
        .env("MARMOT_URL", &m.url)
        .stdin(follower.try_clone().unwrap())
        .stdout(follower.try_clone().unwrap())
        .stderr(follower.try_clone().unwrap())
        .spawn()
        .unwrap();
    // The prompt (the reader is left blocked on the terminal, which stays
    // open here).
    let (seen, _reader) = record(&leader);
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(20);
    while !String::from_utf8_lossy(&seen.lock().unwrap()).contains("not shown") {
        assert!(std::time::Instant::now() < deadline, "no prompt");
        std::thread::sleep(std::time::Duration::from_millis(20));
    }
    assert!(!echo_on(&follower), "echo is off at the prompt");
    // SAFETY: a signal to the child this test started.
    #[allow(unsafe_code, reason = "signalling the child")]
    unsafe {
        libc::kill(child.id() as libc::pid_t, libc::SIGINT);
    }
    let status = child.wait().unwrap();
    use std::os::unix::process::ExitStatusExt as _;
    assert_eq!(status.signal(), Some(libc::SIGINT), "{status:?}");
    assert!(echo_on(&follower), "the terminal was left without echo");
    drop(leader);
}
