//! Client tokens (`POST /v1/tokens`): a browser or app talks to its own
//! actor with exactly the verbs it was given, on `marmot serve` with an
//! admin token (real process, real HTTP).

mod common;

use std::path::Path;
use std::time::{Duration, Instant};

use reqwest::{Method, StatusCode};
use serde_json::{Value, json};

const ADMIN: &str = "admin-token-for-client-token-tests-0123";

/// `marmot serve` on `data` with the admin token and master `key` (and
/// `previous` keys it can still use).
struct Serve {
    child: std::process::Child,
    url: String,
    http: reqwest::Client,
}

impl Serve {
    async fn start(data: &Path, key: &str, previous: Option<&str>) -> Self {
        Self::start_with(data, key, previous, "").await
    }

    async fn start_with(data: &Path, key: &str, previous: Option<&str>, config: &str) -> Self {
        Self::start_as(data, key, previous, config, ADMIN).await
    }

    /// The node with `admin` for its admin token.
    async fn start_as(
        data: &Path,
        key: &str,
        previous: Option<&str>,
        config: &str,
        admin: &str,
    ) -> Self {
        let port = common::free_port();
        let config_path = data.with_extension("toml");
        std::fs::write(&config_path, config).unwrap();
        let mut cmd = std::process::Command::new(env!("CARGO_BIN_EXE_marmot"));
        cmd.args(["serve", "--listen", &format!("127.0.0.1:{port}"), "--data"])
            .arg(data)
            .arg("--config")
            .arg(&config_path)
            .env("MARMOT_ADMIN_TOKEN", admin)
            .env("MARMOT_MASTER_KEY", key)
            .env_remove("MARMOT_MASTER_KEY_PREVIOUS")
            .stderr(std::process::Stdio::null());
        if let Some(p) = previous {
            cmd.env("MARMOT_MASTER_KEY_PREVIOUS", p);
        }
        let child = cmd.spawn().unwrap();
        let s = Self {
            child,
            url: format!("http://127.0.0.1:{port}"),
            http: reqwest::Client::new(),
        };
        for _ in 0..400 {
            if let Ok(r) = s.http.get(format!("{}/readyz", s.url)).send().await
                && r.status() == 200
            {
                return s;
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        panic!("serve did not become ready");
    }

    /// `method path` with `bearer` (and a JSON body): (status, JSON body).
    async fn call(
        &self,
        method: Method,
        path: &str,
        bearer: Option<&str>,
        body: Option<Value>,
    ) -> (StatusCode, Value) {
        let mut req = self.http.request(method, format!("{}{path}", self.url));
        if let Some(b) = bearer {
            req = req.bearer_auth(b);
        }
        if let Some(body) = body {
            req = req.json(&body);
        }
        let r = req.send().await.unwrap();
        let status = r.status();
        (status, r.json().await.unwrap_or(Value::Null))
    }

    async fn mint(&self, spec: Value) -> (StatusCode, Value) {
        self.call(Method::POST, "/v1/tokens", Some(ADMIN), Some(spec))
            .await
    }

    /// A token for `spec`, which must mint.
    async fn token(&self, spec: Value) -> (String, String) {
        let (status, body) = self.mint(spec).await;
        assert_eq!(status, 201, "{body}");
        assert!(body["expires_at_ms"].as_u64().unwrap() > 0);
        (
            body["token"].as_str().unwrap().to_owned(),
            body["token_id"].as_str().unwrap().to_owned(),
        )
    }

    async fn send(&self, path: &str, bearer: &str) -> (StatusCode, Value) {
        let op = json!({"op": "add", "key": "n", "by": 1});
        self.call(Method::POST, path, Some(bearer), Some(op)).await
    }
}

impl Drop for Serve {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

async fn node_with_kit(data: &Path, key: &str) -> Serve {
    node_with_kit_config(data, key, "").await
}

async fn node_with_kit_config(data: &Path, key: &str, config: &str) -> Serve {
    let s = Serve::start_with(data, key, None, config).await;
    use base64::Engine as _;
    let manifest = json!({
        "kind": "wasm",
        "code_base64": base64::engine::general_purpose::STANDARD.encode(common::TESTKIT),
        "config": {},
    });
    let (status, body) = s
        .call(Method::PUT, "/v1/types/kit", Some(ADMIN), Some(manifest))
        .await;
    assert_eq!(status, 201, "{body}");
    s
}

#[tokio::test]
async fn a_client_token_opens_its_verbs_on_its_actor_and_nothing_else() {
    let dir = common::tempdir();
    let s = node_with_kit(&dir.path().join("data"), &common::new_master_key()).await;

    // Minting takes the admin token and a well-formed request.
    let spec = json!({"type": "kit", "id": "alice", "scopes": ["send", "events"], "ttl_s": 600});
    let (status, _) = s
        .call(Method::POST, "/v1/tokens", None, Some(spec.clone()))
        .await;
    assert_eq!(status, 401);
    for (bad, code) in [
        (
            json!({"type": "kit", "id": "a", "id_prefix": "a", "scopes": ["send"], "ttl_s": 60}),
            400,
        ),
        (json!({"type": "kit", "scopes": ["send"], "ttl_s": 60}), 400),
        (
            json!({"type": "kit", "id": "a", "scopes": [], "ttl_s": 60}),
            400,
        ),
        (
            json!({"type": "kit", "id": "a", "scopes": ["admin"], "ttl_s": 60}),
            400,
        ),
        (
            json!({"type": "kit", "id": "a", "scopes": ["send"], "ttl_s": 0}),
            400,
        ),
        (
            json!({"type": "kit", "id": "a", "scopes": ["send"], "ttl_s": 60, "extra": 1}),
            400,
        ),
        (
            json!({"type": "nope", "id": "a", "scopes": ["send"], "ttl_s": 60}),
            404,
        ),
    ] {
        let (status, body) = s.mint(bad.clone()).await;
        assert_eq!(status.as_u16(), code, "{bad} → {body}");
    }

    let (token, _) = s.token(spec).await;
    // Its verbs on its actor.
    let (status, body) = s.send("/v1/actors/kit/alice", &token).await;
    assert_eq!(status, 200, "{body}");
    let (status, _) = s
        .call(
            Method::GET,
            "/v1/actors/kit/alice/events",
            Some(&token),
            None,
        )
        .await;
    assert_eq!(status, 200);
    // EventSource cannot send headers: the token may come in the query.
    let (status, _) = s
        .call(
            Method::GET,
            &format!("/v1/actors/kit/alice/events?access_token={token}"),
            None,
            None,
        )
        .await;
    assert_eq!(status, 200);
    // The admin token never does (it would end up in URLs and logs).
    let (status, _) = s
        .call(
            Method::GET,
            &format!("/v1/actors/kit/alice/events?access_token={ADMIN}"),
            None,
            None,
        )
        .await;
    assert_eq!(status, 401);

    // Anything else is refused, and changes nothing.
    for (method, path) in [
        (Method::POST, "/v1/actors/kit/bob"),
        (Method::POST, "/v1/actors/kit/alice2"),
        (Method::GET, "/v1/actors/kit/alice/files"),
        (Method::GET, "/v1/actors/kit/alice/inputs"),
        (Method::GET, "/v1/actors/kit/alice/state"),
        (Method::POST, "/v1/actors/kit/alice/eval"),
        (Method::DELETE, "/v1/actors/kit/alice"),
        (Method::GET, "/v1/types"),
        (Method::PUT, "/v1/secrets/KEY"),
        (Method::POST, "/v1/tokens"),
    ] {
        let (status, body) = s.call(method.clone(), path, Some(&token), None).await;
        assert_eq!(status, 403, "{method} {path}: {body}");
        assert_eq!(body["error"]["code"], "forbidden");
    }
    // The refused sends created no actor, and alice is still the only one.
    for path in ["/v1/actors/kit/bob", "/v1/actors/kit/alice2"] {
        let (status, info) = s.call(Method::GET, path, Some(ADMIN), None).await;
        assert_eq!(status, 404, "{path} exists after a refused send: {info}");
        assert_eq!(info["error"]["code"], "actor_not_found", "{info}");
    }
    let (status, list) = s
        .call(Method::GET, "/v1/actors/kit", Some(ADMIN), None)
        .await;
    assert_eq!(status, 200, "{list}");
    let ids: Vec<&str> = list["actors"]
        .as_array()
        .unwrap()
        .iter()
        .map(|a| a["id"].as_str().unwrap())
        .collect();
    assert_eq!(ids, ["alice"], "{list}");
    let (_, n) = s
        .call(
            Method::GET,
            "/v1/actors/kit/alice/state/n",
            Some(ADMIN),
            None,
        )
        .await;
    assert_eq!(n, 1);

    // A tampered token (its claims edited, e.g. to another actor) fails
    // its signature.
    let parts: Vec<&str> = token.split('.').collect();
    use base64::Engine as _;
    let b64 = base64::engine::general_purpose::URL_SAFE_NO_PAD;
    let claims = String::from_utf8(b64.decode(parts[1]).unwrap()).unwrap();
    let forged = b64.encode(claims.replace("alice", "bob"));
    let tampered = format!("{}.{forged}.{}", parts[0], parts[2]);
    let (status, body) = s.send("/v1/actors/kit/bob", &tampered).await;
    assert_eq!(status, 401, "{body}");
    assert_eq!(body["error"]["code"], "invalid_token");

    // A prefix token opens every id under the prefix (ids compared
    // decoded), and no other.
    let (team, _) = s
        .token(json!({"type": "kit", "id_prefix": "team-7/", "scopes": ["send"], "ttl_s": 60}))
        .await;
    assert_eq!(s.send("/v1/actors/kit/team-7%2Fana", &team).await.0, 200);
    assert_eq!(s.send("/v1/actors/kit/team-8%2Fana", &team).await.0, 403);
    assert_eq!(s.send("/v1/actors/kit/alice", &team).await.0, 403);

    // The CLI mints and revokes the same tokens.
    let cli = |args: &[&str]| common::cli_ok(&s.url, Some(ADMIN), args);
    let minted: Value = serde_json::from_str(&cli(&[
        "tokens", "mint", "kit", "dave", "--scopes", "send", "--ttl", "60",
    ]))
    .unwrap();
    let dave = minted["token"].as_str().unwrap();
    assert_eq!(s.send("/v1/actors/kit/dave", dave).await.0, 200);
    assert_eq!(s.send("/v1/actors/kit/alice", dave).await.0, 403);
    cli(&["tokens", "revoke", minted["token_id"].as_str().unwrap()]);
    assert_eq!(s.send("/v1/actors/kit/dave", dave).await.0, 401);
}

#[tokio::test]
async fn tokens_expire_are_revoked_for_good_and_follow_the_master_key() {
    let dir = common::tempdir();
    let data = dir.path().join("data");
    let key = common::new_master_key();
    let s = node_with_kit(&data, &key).await;
    let spec = |ttl: u64| json!({"type": "kit", "id": "carol", "scopes": ["send"], "ttl_s": ttl});

    // Expiry.
    let (short, _) = s.token(spec(1)).await;
    assert_eq!(s.send("/v1/actors/kit/carol", &short).await.0, 200);
    tokio::time::sleep(Duration::from_millis(2100)).await;
    let (status, body) = s.send("/v1/actors/kit/carol", &short).await;
    assert_eq!(status, 401);
    assert_eq!(body["error"]["code"], "token_expired");

    // Revocation, kept across a restart.
    let (token, id) = s.token(spec(600)).await;
    let (kept, _) = s.token(spec(600)).await;
    assert_eq!(s.send("/v1/actors/kit/carol", &token).await.0, 200);
    // The scheme's name is case-insensitive (RFC 9110).
    for (scheme, bearer) in [("bearer", kept.as_str()), ("BEARER", ADMIN)] {
        let r = s
            .http
            .post(format!("{}/v1/actors/kit/carol", s.url))
            .header("authorization", format!("{scheme} {bearer}"))
            .json(&json!({"op": "add", "key": "n", "by": 1}))
            .send()
            .await
            .unwrap();
        assert_eq!(r.status(), 200, "{scheme}");
    }
    // An id that names no token is refused, not stored as revoked: a part
    // of it, or more. Its case does not matter.
    for wrong in [id[..16].to_owned(), format!("{id}00"), "not-hex!".into()] {
        let (status, body) = s
            .call(
                Method::DELETE,
                &format!("/v1/tokens/{wrong}"),
                Some(ADMIN),
                None,
            )
            .await;
        assert_eq!(status, 400, "{wrong}: {body}");
    }
    assert_eq!(s.send("/v1/actors/kit/carol", &token).await.0, 200);
    let (status, body) = s
        .call(
            Method::DELETE,
            &format!("/v1/tokens/{}", id.to_ascii_uppercase()),
            Some(ADMIN),
            None,
        )
        .await;
    assert_eq!(status, 200, "{body}");
    assert_eq!(body["token_id"], id.as_str());
    let (status, body) = s.send("/v1/actors/kit/carol", &token).await;
    assert_eq!(status, 401);
    assert_eq!(body["error"]["code"], "token_revoked");
    drop(s);
    let s = Serve::start(&data, &key, None).await;
    assert_eq!(s.send("/v1/actors/kit/carol", &token).await.0, 401);
    assert_eq!(s.send("/v1/actors/kit/carol", &kept).await.0, 200);
    drop(s);

    // A new master key with the old one kept as previous: old tokens still
    // verify. Without the old key they do not.
    let next = common::new_master_key();
    let s = Serve::start(&data, &next, Some(&key)).await;
    assert_eq!(s.send("/v1/actors/kit/carol", &kept).await.0, 200);
    let (fresh, _) = s.token(spec(600)).await;
    drop(s);
    let s = Serve::start(&data, &next, None).await;
    let (status, body) = s.send("/v1/actors/kit/carol", &kept).await;
    assert_eq!(status, 401);
    assert_eq!(body["error"]["code"], "invalid_token");
    assert_eq!(s.send("/v1/actors/kit/carol", &fresh).await.0, 200);
}

/// What the probes of 2026-12-06 found at the edge: a token in the URL
/// opened a file named `events`; the `files` scope opened the whole
/// workspace; HEAD was refused where GET was allowed; two Authorization
/// headers were taken (the first won); invalid tokens were answered in the
/// JWT library's words; refusals were neither logged nor counted; a 1 s
/// token could arrive expired; and rotating a leaked admin token left
/// every client token minted with it working.
#[tokio::test]
async fn the_edge_refuses_plainly_counts_refusals_and_ties_tokens_to_the_admin_token() {
    let dir = common::tempdir();
    let data = dir.path().join("data");
    let key = common::new_master_key();
    let s = node_with_kit(&data, &key).await;
    let write = |path: &str| json!({"op": "file_write", "path": path, "text": "x"});
    for path in ["outputs/events", "outputs/report.md", "private/notes.txt"] {
        let (status, body) = s
            .call(
                Method::POST,
                "/v1/actors/kit/alice",
                Some(ADMIN),
                Some(write(path)),
            )
            .await;
        assert_eq!(status, 200, "{body}");
    }
    let before = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_millis() as u64;
    let (status, minted) = s
        .mint(json!({"type": "kit", "id": "alice", "scopes": ["files", "events"], "ttl_s": 1}))
        .await;
    assert_eq!(status, 201, "{minted}");
    assert!(
        minted["expires_at_ms"].as_u64().unwrap() >= before + 1000,
        "a token lives at least its ttl: {minted}"
    );
    let (files, _) = s
        .token(json!({"type": "kit", "id": "alice", "scopes": ["files", "events"], "ttl_s": 600}))
        .await;

    // `?access_token=` opens the event log only, not a file named so.
    let get = |path: String| s.http.get(format!("{}{path}", s.url)).send();
    let r = get(format!(
        "/v1/actors/kit/alice/files/outputs/events?access_token={files}"
    ))
    .await
    .unwrap();
    assert_eq!(r.status(), 401);
    // Saying where the query's token is taken (it read "missing or wrong
    // bearer token" of a valid token).
    let body: serde_json::Value = r.json().await.unwrap();
    let message = body["error"]["message"].as_str().unwrap();
    assert!(
        message.contains("taken only on an actor's event stream"),
        "{body}"
    );
    let r = get(format!("/v1/actors/kit/alice/events?access_token={files}"))
        .await
        .unwrap();
    assert_eq!(r.status(), 200);

    // The files scope opens the artifacts, for GET and HEAD alike.
    for method in [Method::GET, Method::HEAD] {
        let (status, _) = s
            .call(
                method.clone(),
                "/v1/actors/kit/alice/files/outputs/report.md",
                Some(&files),
                None,
            )
            .await;
        assert_eq!(status, 200, "{method}");
        let (status, body) = s
            .call(
                method.clone(),
                "/v1/actors/kit/alice/files/private/notes.txt",
                Some(&files),
                None,
            )
            .await;
        assert_eq!(status, 403, "{method} {body}");
    }
    for prefix in ["", "out", "private/"] {
        let (status, list) = s
            .call(
                Method::GET,
                &format!("/v1/actors/kit/alice/files?prefix={prefix}"),
                Some(&files),
                None,
            )
            .await;
        assert_eq!(status, 200, "{list}");
        let paths: Vec<&str> = list["files"]
            .as_array()
            .unwrap()
            .iter()
            .map(|f| f["path"].as_str().unwrap())
            .collect();
        let want: &[&str] = match prefix {
            "private/" => &[],
            _ => &["outputs/events", "outputs/report.md"],
        };
        assert_eq!(paths, want, "prefix {prefix:?}");
    }
    let (_, list) = s
        .call(Method::GET, "/v1/actors/kit/alice/files", Some(ADMIN), None)
        .await;
    assert_eq!(list["files"].as_array().unwrap().len(), 3, "{list}");

    // Two Authorization headers: refused, whichever comes first.
    let r = s
        .http
        .get(format!("{}/v1/actors/kit/alice/events", s.url))
        .header("authorization", format!("Bearer {ADMIN}"))
        .header("authorization", "Bearer nonsense")
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 400);
    let body: Value = r.json().await.unwrap();
    assert_eq!(body["error"]["code"], "invalid_authorization");

    // A bad token is told so plainly.
    let mut flipped = files.clone().into_bytes();
    let at = flipped.len() - 5;
    flipped[at] = if flipped[at] == b'A' { b'B' } else { b'A' };
    let flipped = String::from_utf8(flipped).unwrap();
    for bad in [
        flipped.as_str(),
        "eyJhbGciOiJub25lIn0.eyJ4IjoxfQ.",
        "eyJ!!.x.y",
    ] {
        let (status, body) = s
            .call(Method::GET, "/v1/actors/kit/alice/events", Some(bad), None)
            .await;
        assert_eq!(status, 401, "{body}");
        let msg = body["error"]["message"].as_str().unwrap();
        for internal in ["Base64", "JSON", "variant", "offset"] {
            assert!(!msg.contains(internal), "{msg}");
        }
    }

    // Refusals are counted by code.
    let (_, _) = s
        .call(Method::GET, "/v1/actors/kit/bob/events", Some(&files), None)
        .await;
    let metrics = s
        .http
        .get(format!("{}/metrics", s.url))
        .bearer_auth(ADMIN)
        .send()
        .await
        .unwrap()
        .text()
        .await
        .unwrap();
    let count = |code: &str| {
        metrics
            .lines()
            .find(|l| l.starts_with(&format!("marmot_requests_refused_total{{code=\"{code}\"}}")))
            .and_then(|l| l.rsplit(' ').next()?.parse::<u64>().ok())
            .unwrap_or(0)
    };
    assert!(count("invalid_token") >= 3, "{metrics}");
    assert!(count("forbidden") >= 3, "{metrics}");
    assert_eq!(count("invalid_authorization"), 1, "{metrics}");
    drop(s);

    // A new admin token (the old one leaked): every client token minted
    // with the old one stops working; new ones work.
    let rotated = "a-new-admin-token-after-a-leak-456789";
    let s = Serve::start_as(&data, &key, None, "", rotated).await;
    let (status, body) = s
        .call(
            Method::GET,
            "/v1/actors/kit/alice/events",
            Some(&files),
            None,
        )
        .await;
    assert_eq!(status, 401, "{body}");
    assert_eq!(body["error"]["code"], "invalid_token");
    let (status, minted) = s
        .call(
            Method::POST,
            "/v1/tokens",
            Some(rotated),
            Some(json!({"type": "kit", "id": "alice", "scopes": ["events"], "ttl_s": 60})),
        )
        .await;
    assert_eq!(status, 201, "{minted}");
    let (status, _) = s
        .call(
            Method::GET,
            "/v1/actors/kit/alice/events",
            minted["token"].as_str(),
            None,
        )
        .await;
    assert_eq!(status, 200);
}

#[tokio::test]
async fn browsers_get_cors_from_allowed_origins_and_clients_are_rate_limited() {
    let dir = common::tempdir();
    let config = r#"
[clients]
cors_origins = ["https://app.example.com"]
token_rate_per_s = 1
token_burst = 3
actor_rate_per_s = 1
actor_burst = 4
"#;
    let s = node_with_kit_config(&dir.path().join("data"), &common::new_master_key(), config).await;
    let url = |p: &str| format!("{}{p}", s.url);

    // Preflight: no credentials, answered before auth.
    let r = s
        .http
        .request(Method::OPTIONS, url("/v1/actors/kit/alice"))
        .header("origin", "https://app.example.com")
        .header("access-control-request-method", "POST")
        .header(
            "access-control-request-headers",
            "authorization, content-type",
        )
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 204);
    let h = r.headers();
    assert_eq!(h["access-control-allow-origin"], "https://app.example.com");
    assert_eq!(h.get_all("vary").iter().count(), 1, "{h:?}");
    assert!(
        h["access-control-allow-headers"]
            .to_str()
            .unwrap()
            .contains("authorization")
    );
    let r = s
        .http
        .request(Method::OPTIONS, url("/v1/actors/kit/alice"))
        .header("origin", "https://evil.example")
        .header("access-control-request-method", "POST")
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 403);
    assert!(!r.headers().contains_key("access-control-allow-origin"));

    // Responses carry the header for allowed origins only.
    let (token, _) = s
        .token(json!({"type": "kit", "id": "alice", "scopes": ["send"], "ttl_s": 600}))
        .await;
    let op = json!({"op": "add", "key": "n", "by": 1});
    let r = s
        .http
        .post(url("/v1/actors/kit/alice"))
        .bearer_auth(&token)
        .header("origin", "https://app.example.com")
        .json(&op)
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 200);
    assert_eq!(
        r.headers()["access-control-allow-origin"],
        "https://app.example.com"
    );
    // Every answer varies by Origin while CORS is on, one without it too.
    let plain = s
        .http
        .get(url("/v1/actors/kit/alice"))
        .bearer_auth(ADMIN)
        .send()
        .await
        .unwrap();
    assert_eq!(plain.headers()["vary"], "origin");
    // A browser may read what downloads and replays say beyond the body.
    let exposed = r.headers()["access-control-expose-headers"]
        .to_str()
        .unwrap();
    for h in ["etag", "content-range", "idempotent-replayed"] {
        assert!(exposed.contains(h), "{exposed}");
    }
    let r = s
        .http
        .post(url("/v1/actors/kit/alice"))
        .bearer_auth(&token)
        .header("origin", "https://evil.example")
        .json(&op)
        .send()
        .await
        .unwrap();
    assert!(!r.headers().contains_key("access-control-allow-origin"));

    // Per token: a burst of 3 (two used above), then 429 with Retry-After.
    assert_eq!(s.send("/v1/actors/kit/alice", &token).await.0, 200);
    let r = s
        .http
        .post(url("/v1/actors/kit/alice"))
        .bearer_auth(&token)
        .json(&op)
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 429);
    assert!(
        r.headers()["retry-after"]
            .to_str()
            .unwrap()
            .parse::<u64>()
            .unwrap()
            >= 1
    );
    // Per actor: another token for the same actor has its own budget, but
    // the actor's (4) is nearly spent (3 went through; the refused one did
    // not count): one more, then 429.
    let (other, _) = s
        .token(json!({"type": "kit", "id": "alice", "scopes": ["send"], "ttl_s": 600}))
        .await;
    assert_eq!(s.send("/v1/actors/kit/alice", &other).await.0, 200);
    let (status, body) = s.send("/v1/actors/kit/alice", &other).await;
    assert_eq!(status, 429, "{body}");
    assert_eq!(body["error"]["code"], "rate_limited");
    // Another actor is not affected, and the admin token is never limited.
    let (bob, _) = s
        .token(json!({"type": "kit", "id": "bob", "scopes": ["send"], "ttl_s": 600}))
        .await;
    assert_eq!(s.send("/v1/actors/kit/bob", &bob).await.0, 200);
    for _ in 0..10 {
        assert_eq!(s.send("/v1/actors/kit/alice", ADMIN).await.0, 200);
    }
    // What was refused did not run: 4 client turns and 10 admin ones.
    let (_, n) = s
        .call(
            Method::GET,
            "/v1/actors/kit/alice/state/n",
            Some(ADMIN),
            None,
        )
        .await;
    assert_eq!(n, 14);
}

/// Nodes mark a message they pass on for another node's turn
/// (`x-marmot-from-actor`): its sender already passed the checks and the
/// type's rate limit. A client token cannot claim that: the mark is
/// dropped from its requests, while the admin token (which nodes use) keeps
/// it.
#[tokio::test]
async fn a_client_token_cannot_pass_for_a_node() {
    let dir = common::tempdir();
    let s = node_with_kit(&dir.path().join("data"), &common::new_master_key()).await;
    use base64::Engine as _;
    let manifest = json!({
        "kind": "wasm",
        "code_base64": base64::engine::general_purpose::STANDARD.encode(common::TESTKIT),
        "config": {"rate_limit_per_s": 1, "rate_limit_burst": 1},
    });
    let (status, body) = s
        .call(Method::PUT, "/v1/types/kit", Some(ADMIN), Some(manifest))
        .await;
    assert_eq!(status, 201, "{body}");
    let (token, _) = s
        .token(json!({"type": "kit", "id": "alice", "scopes": ["send"], "ttl_s": 600}))
        .await;
    let op = json!({"op": "add", "key": "n", "by": 1});
    let post = |bearer: &str| {
        s.http
            .post(format!("{}/v1/actors/kit/alice", s.url))
            .bearer_auth(bearer)
            .header("x-marmot-from-actor", "1")
            .json(&op)
            .send()
    };
    // The bucket's one message, then the client is limited despite the
    // mark; the admin's marked messages pass.
    assert_eq!(post(&token).await.unwrap().status(), 200);
    let r = post(&token).await.unwrap();
    assert_eq!(r.status(), 429);
    for _ in 0..3 {
        assert_eq!(post(ADMIN).await.unwrap().status(), 200);
    }
}

/// A live event stream opened with a client token ends when the token
/// expires or is revoked: it used to go on delivering for as long as the
/// connection lasted, while every new request with the token got 401.
/// One client token holds at most `events.max_streams_per_token` open
/// streams (429 past it); other tokens are unaffected, and a closed
/// stream makes room. One token could take every stream of the node.
#[tokio::test]
async fn a_client_token_holds_at_most_its_share_of_event_streams() {
    let dir = common::tempdir();
    let config = "[events]\nmax_streams_per_token = 3\n";
    let s = node_with_kit_config(&dir.path().join("data"), &common::new_master_key(), config).await;
    let spec = json!({"type": "kit", "id": "eve", "scopes": ["events"], "ttl_s": 600});
    let (mine, _) = s.token(spec.clone()).await;
    let (other, _) = s.token(spec).await;
    let open = |token: &str| {
        let url = format!("{}/v1/actors/kit/eve/events?access_token={token}", s.url);
        s.http.get(url).header("accept", "text/event-stream").send()
    };
    let mut held = Vec::new();
    for _ in 0..3 {
        let r = open(&mine).await.unwrap();
        assert_eq!(r.status(), 200);
        held.push(r);
    }
    let r = open(&mine).await.unwrap();
    assert_eq!(r.status(), 429);
    let body: Value = r.json().await.unwrap();
    assert_eq!(body["error"]["code"], "too_many_streams", "{body}");
    assert_eq!(open(&other).await.unwrap().status(), 200);
    drop(held.pop());
    let deadline = Instant::now() + Duration::from_secs(5);
    loop {
        let r = open(&mine).await.unwrap();
        if r.status() == 200 {
            break;
        }
        assert!(Instant::now() < deadline, "no room after a stream closed");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

#[tokio::test]
async fn an_event_stream_ends_when_its_client_token_expires_or_is_revoked() {
    let dir = common::tempdir();
    let s = node_with_kit(&dir.path().join("data"), &common::new_master_key()).await;
    let emit = json!({"op": "emit", "kind": "tick", "data": 1});
    let (status, _) = s
        .call(
            Method::POST,
            "/v1/actors/kit/dora",
            Some(ADMIN),
            Some(emit.clone()),
        )
        .await;
    assert_eq!(status, 200);
    let spec = |ttl: u64| json!({"type": "kit", "id": "dora", "scopes": ["events"], "ttl_s": ttl});
    let (short, _) = s.token(spec(2)).await;
    let (revoked, revoked_id) = s.token(spec(600)).await;
    let (kept, _) = s.token(spec(600)).await;
    // Each stream is read until it ends; (what it read, how long it ran).
    let open = |token: String| {
        let url = format!("{}/v1/actors/kit/dora/events?access_token={token}", s.url);
        let http = s.http.clone();
        tokio::spawn(async move {
            let started = Instant::now();
            let mut r = http
                .get(url)
                .header("accept", "text/event-stream")
                .send()
                .await
                .unwrap();
            assert_eq!(r.status(), 200);
            let mut text = String::new();
            let deadline = Duration::from_secs(8);
            while let Ok(Ok(Some(chunk))) = tokio::time::timeout(deadline, r.chunk()).await {
                text.push_str(&String::from_utf8_lossy(&chunk));
            }
            (text, started.elapsed())
        })
    };
    let (short_stream, revoked_stream, kept_stream) =
        (open(short), open(revoked), open(kept.clone()));
    tokio::time::sleep(Duration::from_millis(300)).await;
    let (status, body) = s
        .call(
            Method::DELETE,
            &format!("/v1/tokens/{revoked_id}"),
            Some(ADMIN),
            None,
        )
        .await;
    assert_eq!(status, 200, "{body}");
    for (name, stream, ends_within) in [
        ("revoked", revoked_stream, 2.5),
        ("expired", short_stream, 3.5),
    ] {
        let (text, ran) = stream.await.unwrap();
        assert!(text.contains("\"tick\""), "{name}: {text}");
        assert!(ran.as_secs_f64() < ends_within, "{name} stream ran {ran:?}");
    }
    // The control: a stream whose token holds keeps going.
    assert!(
        !kept_stream.is_finished(),
        "the stream of a valid token ended"
    );
    kept_stream.abort();
}
