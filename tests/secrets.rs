//! The secret store (PRODUCT.md §5, guarantee 9): write-only values sealed
//! at rest under a master key, the key's life (created by `marmot dev`,
//! required by `marmot serve`, rotated), the API and the CLI. What guests
//! can do with a secret is tested in `egress.rs`.

mod common;

use std::io::Write as _;
use std::process::{Command, Stdio};
use std::time::Duration;

use common::{Marmot, tempdir};
use reqwest::Method;
use serde_json::{Value, json};

const VALUE: &str = "sk-live-4f3c2b1a-planted-value";

async fn put(api: &common::Api, name: &str, body: Value) -> common::Resp {
    api.put_json(&format!("/v1/secrets/{name}"), &body).await
}

#[tokio::test]
async fn secrets_are_write_only_and_sealed_at_rest() {
    let dir = tempdir();
    let mut m = Marmot::start(&dir.path().join("data")).await;
    let api = m.client();
    let r = put(
        &api,
        "OPENAI_KEY",
        json!({ "value": VALUE, "hosts": ["api.openai.com", "*.example.com"] }),
    )
    .await;
    assert_eq!(r.status, 201, "{}", r.json);
    assert_eq!(r.json["name"], "OPENAI_KEY");
    assert_eq!(r.json["hosts"], json!(["api.openai.com", "*.example.com"]));
    assert!(r.json.get("value").is_none());
    let r = put(
        &api,
        "OPENAI_KEY",
        json!({ "value": "sk-value-2", "hosts": ["api.openai.com"] }),
    )
    .await;
    assert_eq!(r.status, 200, "replaced: {}", r.json);
    put(
        &api,
        "OPENAI_KEY",
        json!({ "value": VALUE, "hosts": ["api.openai.com"] }),
    )
    .await;

    let list = api.get("/v1/secrets").await;
    assert_eq!(list.status, 200);
    let secrets = list.json["secrets"].as_array().unwrap();
    assert_eq!(secrets.len(), 1);
    let s = &secrets[0];
    assert_eq!(s["name"], "OPENAI_KEY");
    assert_eq!(s["hosts"], json!(["api.openai.com"]));
    assert!(s["created_at_ms"].as_u64().unwrap() <= s["updated_at_ms"].as_u64().unwrap());
    assert!(!common::holds(&list.body, VALUE), "the list shows a value");

    // Bad input: a clear 4xx, and nothing changes.
    for (name, body, status, code) in [
        (
            "bad name",
            json!({ "value": "sk-0123456789", "hosts": ["a.com"] }),
            400,
            "invalid_secret_name",
        ),
        (
            "K",
            json!({ "value": "", "hosts": ["a.com"] }),
            400,
            "invalid_secret",
        ),
        // A short value would be cut out of every answer's ordinary text.
        (
            "K",
            json!({ "value": "sk-1234", "hosts": ["a.com"] }),
            400,
            "invalid_secret",
        ),
        (
            "K",
            json!({ "value": "sk-0123456789" }),
            400,
            "invalid_secret",
        ),
        (
            "K",
            json!({ "value": "sk-0123456789", "hosts": [] }),
            400,
            "invalid_secret",
        ),
        (
            "K",
            json!({ "value": "sk-0123456789", "hosts": ["https://a.com/"] }),
            400,
            "invalid_secret",
        ),
        (
            "K",
            json!({ "value": "sk-0123456789", "hosts": ["a.com"], "extra": 1 }),
            400,
            "invalid_secret",
        ),
        (
            "K",
            json!({ "value": 5, "hosts": ["a.com"] }),
            400,
            "invalid_secret",
        ),
        // Header values cannot hold line breaks or NUL.
        (
            "K",
            json!({ "value": "sk-1\nsk-2", "hosts": ["a.com"] }),
            400,
            "invalid_secret",
        ),
        (
            "K",
            json!({ "value": "sk\u{0}", "hosts": ["a.com"] }),
            400,
            "invalid_secret",
        ),
        (
            "K",
            json!({ "value": "x".repeat(64 * 1024 + 1), "hosts": ["a.com"] }),
            413,
            "secret_too_large",
        ),
    ] {
        let r = put(&api, &name.replace(' ', "%20"), body.clone()).await;
        assert_eq!(
            (r.status, r.code()),
            (status, code),
            "{name} {body}: {}",
            r.json
        );
    }
    let r = api
        .req(
            Method::PUT,
            "/v1/secrets/K",
            Some(("application/json", b"{\"value\": \"sk-sec".to_vec())),
            &[],
        )
        .await;
    assert_eq!(r.code(), "invalid_secret");
    assert!(
        !common::holds(&r.body, "sk-sec"),
        "an error quoted the value: {}",
        r.json
    );
    assert_eq!(
        api.get("/v1/secrets").await.json,
        list.json,
        "bad input changed something"
    );

    let r = api.delete("/v1/secrets/NOPE").await;
    assert_eq!((r.status, r.code()), (404, "secret_not_found"));

    // Nothing on disk or in the log holds the value in plain text.
    m.kill9();
    let db = common::database_bytes(&dir.path().join("data"));
    assert!(
        !common::holds(&db, VALUE),
        "the database or its journal holds the value"
    );
    assert!(!m.log_text().contains(VALUE), "the log holds the value");

    m.restart().await;
    let api = m.client();
    let r = api.delete("/v1/secrets/OPENAI_KEY").await;
    assert_eq!(r.status, 200, "{}", r.json);
    assert_eq!(api.get("/v1/secrets").await.json["secrets"], json!([]));
}

#[tokio::test]
async fn dev_makes_a_private_master_key_and_rotation_reseals_every_secret() {
    let dir = tempdir();
    let data = dir.path().join("data");
    let mut m = Marmot::start(&data).await;
    let key_file = data.join("master.key");
    let mode = {
        use std::os::unix::fs::PermissionsExt as _;
        std::fs::metadata(&key_file).unwrap().permissions().mode() & 0o777
    };
    assert_eq!(mode, 0o600, "the key file is readable by others");
    let old_key = std::fs::read_to_string(&key_file)
        .unwrap()
        .trim()
        .to_owned();
    let r = put(
        &m.client(),
        "K",
        json!({ "value": VALUE, "hosts": ["a.example.com"] }),
    )
    .await;
    assert_eq!(r.status, 201);

    let new_key = common::new_master_key();
    assert_ne!(new_key, old_key);

    // Only the new key: the node refuses to start and names what it needs.
    m.set_env("MARMOT_MASTER_KEY", Some(&new_key));
    m.respawn();
    assert!(
        m.wait_exit(Duration::from_secs(30)),
        "started without the old key"
    );
    assert!(
        m.log_text().contains("MARMOT_MASTER_KEY_PREVIOUS"),
        "{}",
        m.log_text()
    );

    // New key plus the old one: every secret is re-sealed.
    m.set_env("MARMOT_MASTER_KEY_PREVIOUS", Some(&old_key));
    m.restart().await;
    assert!(m.log_text().contains("re-sealed"), "{}", m.log_text());
    assert_eq!(
        m.client().get("/v1/secrets").await.json["secrets"][0]["name"],
        "K"
    );

    // From now on the new key alone is enough, and the old file is unused.
    std::fs::remove_file(&key_file).unwrap();
    m.set_env("MARMOT_MASTER_KEY_PREVIOUS", None);
    m.restart().await;
    assert_eq!(
        m.client().get("/v1/secrets").await.json["secrets"][0]["name"],
        "K"
    );
}

#[tokio::test]
async fn the_cli_sets_lists_and_removes_secrets() {
    let dir = tempdir();
    let m = Marmot::start(&dir.path().join("data")).await;
    let marmot = |args: &[&str], stdin: Option<&str>| {
        let mut child = Command::new(env!("CARGO_BIN_EXE_marmot"))
            .args(args)
            .env("MARMOT_URL", &m.url)
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap();
        child
            .stdin
            .take()
            .unwrap()
            .write_all(stdin.unwrap_or("").as_bytes())
            .unwrap();
        let out = child.wait_with_output().unwrap();
        (
            out.status.success(),
            String::from_utf8_lossy(&out.stdout).into_owned(),
            String::from_utf8_lossy(&out.stderr).into_owned(),
        )
    };
    let (ok, out, err) = marmot(
        &["secrets", "set", "TICKETS", "--host", "api.example.com"],
        Some(&format!("{VALUE}\n")),
    );
    assert!(ok, "{err}");
    assert!(out.contains("created"), "{out}");
    let value_file = dir.path().join("value.txt");
    std::fs::write(&value_file, "from-a-file\n").unwrap();
    let (ok, out, err) = marmot(
        &[
            "secrets",
            "set",
            "TICKETS",
            "--host",
            "api.example.com",
            "--from-file",
            value_file.to_str().unwrap(),
        ],
        None,
    );
    assert!(ok, "{err}");
    assert!(out.contains("replaced"), "{out}");
    let (ok, out, _) = marmot(&["secrets", "list"], None);
    assert!(ok);
    assert!(
        out.contains("TICKETS") && out.contains("api.example.com"),
        "{out}"
    );
    assert!(
        !out.contains(VALUE) && !out.contains("from-a-file"),
        "{out}"
    );
    let (ok, _, err) = marmot(
        &["secrets", "set", "bad name", "--host", "a.com"],
        Some("x"),
    );
    assert!(!ok);
    assert!(err.contains("invalid_secret_name"), "{err}");
    let (ok, _, err) = marmot(&["secrets", "rm", "TICKETS"], None);
    assert!(ok, "{err}");
    let (ok, _, err) = marmot(&["secrets", "rm", "TICKETS"], None);
    assert!(!ok);
    assert!(err.contains("secret_not_found"), "{err}");
}
