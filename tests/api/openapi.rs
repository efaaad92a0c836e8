//! The API against its own OpenAPI document: every operation answers
//! with a status the document lists, and every success body is what the
//! document's schema for it says.

use reqwest::Method;
use serde_json::{Value, json};

use super::common::{self, Marmot, Resp, TESTKIT, tempdir};

/// The API answers as its OpenAPI document says. Every operation of the
/// document served by `marmot serve` is asked five ways, and each answer
/// must have a status the document lists for that operation (a 4xx with
/// the error body):
/// * without a token: 401, unless the document marks it open;
/// * with a client token for another actor: 403;
/// * with each path parameter set to a value its documented schema
///   refuses (checked here against the schema): 400 or 404;
/// * with each typed query parameter (integer, boolean, enum) not of its
///   type: 400;
/// * well-formed, with the admin token: anything documented.
#[tokio::test]
async fn every_operation_answers_as_the_openapi_document_says() {
    use std::collections::BTreeSet;

    const ADMIN: &str = "admin-token-for-the-openapi-conformance-test";
    let dir = tempdir();
    let node = Marmot::start_serve(&dir.path().join("n"), ADMIN).await;
    let api = node.client();
    assert_eq!(api.deploy("kit", TESTKIT, json!({})).await.status, 201);
    assert_eq!(api.add("kit", "a", 1).await.status, 200);
    let minted = api
        .req(
            Method::POST,
            "/v1/tokens",
            Some((
                "application/json",
                serde_json::to_vec(&json!({"type": "kit", "id": "someone-else",
                    "scopes": ["send", "events", "inputs", "files"], "ttl_s": 600}))
                .unwrap(),
            )),
            &[],
        )
        .await;
    assert_eq!(minted.status, 201, "{}", minted.json);
    let other = format!("Bearer {}", minted.json["token"].as_str().unwrap());
    let doc = api.get("/v1/openapi.json").await.json;

    // A well-formed value for each path parameter (names the document uses).
    let valid = |name: &str| match name {
        "type" => "kit",
        "id" => "a",
        "key" => "k",
        "path" => "notes/a.txt",
        "delivery" => "msg_00000000000000000000000000000000",
        _ => "n1",
    };
    let fill = |path: &str, broken: Option<(&str, &str)>| {
        let mut out = path.to_owned();
        for seg in path.split('/').filter(|s| s.starts_with('{')) {
            let name = seg.trim_matches(['{', '}']);
            let value = match broken {
                Some((n, v)) if n == name => v.to_owned(),
                _ if name == "id" && path.starts_with("/v1/deliveries/") => {
                    valid("delivery").to_owned()
                }
                _ => valid(name).to_owned(),
            };
            out = out.replace(seg, &value);
        }
        out
    };
    // A value (percent-encoded for the path) that `schema` refuses.
    let breaking = |schema: &Value| -> Option<String> {
        let refuses = |raw: &str| {
            let chars = raw.chars().count() as u64;
            schema["maxLength"].as_u64().is_some_and(|m| chars > m)
                || schema["pattern"]
                    .as_str()
                    .is_some_and(|p| !regex::Regex::new(p).unwrap().is_match(raw))
        };
        [
            ("Bad Name!", "Bad%20Name%21"),
            ("a\u{1}b", "a%01b"),
            ("a\\b", "a%5Cb"),
            ("zz", "zz"),
        ]
        .into_iter()
        .find(|(raw, _)| refuses(raw))
        .map(|(_, encoded)| encoded.to_owned())
        .or_else(|| {
            let max = schema["maxLength"].as_u64()? as usize;
            Some("k".repeat(max + 1))
        })
    };
    let body_of = |op: &Value| -> Option<(&'static str, Vec<u8>)> {
        op.get("requestBody")
            .map(|_| ("application/json", b"{}".to_vec()))
    };
    let mut asked = 0;
    for (path, item) in doc["paths"].as_object().unwrap() {
        for (method, op) in item.as_object().unwrap() {
            let m = Method::from_bytes(method.to_uppercase().as_bytes()).unwrap();
            let documented: BTreeSet<u16> = op["responses"]
                .as_object()
                .unwrap()
                .keys()
                .filter(|k| *k != "default")
                .map(|k| k.parse().unwrap())
                .collect();
            // `default`: the actor's own reply, with any status.
            let any_status = op["responses"].get("default").is_some();
            let check = |how: &str, r: &Resp, allowed: &[u16]| {
                let what = format!(
                    "{method} {path} ({how}): {} {}",
                    r.status,
                    String::from_utf8_lossy(&r.body)
                );
                assert!(
                    documented.contains(&r.status) || any_status,
                    "undocumented status: {what}"
                );
                assert!(
                    allowed.is_empty() || allowed.contains(&r.status),
                    "expected one of {allowed:?}: {what}"
                );
                if r.status >= 400 {
                    assert!(
                        !r.code().is_empty()
                            && r.json["error"]["message"]
                                .as_str()
                                .is_some_and(|m| !m.is_empty()),
                        "not an error body: {what}"
                    );
                }
            };
            let open = op["security"] == json!([]);
            let target = fill(path, None);

            let r = api
                .req(m.clone(), &target, body_of(op), &[("authorization", "")])
                .await;
            if open {
                assert_ne!(r.status, 401, "{method} {path} is documented open");
            } else {
                check("no token", &r, &[401]);
                let r = api
                    .req(
                        m.clone(),
                        &target,
                        body_of(op),
                        &[("authorization", &other)],
                    )
                    .await;
                check("another actor's client token", &r, &[403]);
            }

            let params = op["parameters"].as_array().unwrap();
            for p in params.iter().filter(|p| p["in"] == "path") {
                let name = p["name"].as_str().unwrap();
                let Some(bad) = breaking(&p["schema"]) else {
                    continue;
                };
                let r = api
                    .req(m.clone(), &fill(path, Some((name, &bad))), body_of(op), &[])
                    .await;
                check(&format!("path {name}={bad}"), &r, &[400, 404]);
                asked += 1;
            }
            for p in params.iter().filter(|p| p["in"] == "query") {
                let s = &p["schema"];
                if !(s["type"] == "integer" || s["type"] == "boolean" || s.get("enum").is_some()) {
                    continue;
                }
                let name = p["name"].as_str().unwrap();
                let r = api
                    .req(m.clone(), &format!("{target}?{name}=x~"), body_of(op), &[])
                    .await;
                check(&format!("query {name}=x~"), &r, &[400]);
                asked += 1;
            }

            let r = api.req(m.clone(), &target, body_of(op), &[]).await;
            check("well-formed", &r, &[]);
            asked += 1;
        }
    }
    assert!(asked > 80, "asked only {asked} questions");
    // Still serving, and the actor asked about is still there.
    assert_eq!(api.get("/readyz").await.status, 200);
}

/// Every success answer of the API, each operation asked once with what
/// makes it succeed, has a body the OpenAPI document's schema takes. The
/// document had bodies for 3 of its 53 success answers (the rest were
/// "any JSON"), and said 200 where a retried delivery answers 202.
#[tokio::test]
async fn success_bodies_are_what_the_openapi_document_says() {
    const ADMIN: &str = "admin-token-for-the-response-schema-test";
    let dir = tempdir();
    let node = Marmot::start_serve(&dir.path().join("n"), ADMIN).await;
    let api = node.client();
    let doc = api.get("/v1/openapi.json").await.json;
    let ok = |method: &str, path: &str, r: &Resp| common::documented(&doc, method, path, r);
    let put = |path: String, body: Value| {
        let api = api.clone();
        async move {
            api.req(
                Method::PUT,
                &path,
                Some(("application/json", serde_json::to_vec(&body).unwrap())),
                &[],
            )
            .await
        }
    };

    ok("get", "/healthz", &api.get("/healthz").await);
    ok("get", "/readyz", &api.get("/readyz").await);
    ok(
        "get",
        "/v1/openapi.json",
        &api.get("/v1/openapi.json").await,
    );
    ok("get", "/v1/cluster", &api.get("/v1/cluster").await);

    // Types.
    let secret = marmot::webhooks::new_secret();
    let config = json!({"webhook_secret": secret});
    let r = api.deploy("kit", TESTKIT, config.clone()).await;
    assert_eq!(r.status, 201);
    ok("put", "/v1/types/{type}", &r);
    let r = api.deploy("kit", TESTKIT, config).await;
    assert_eq!(r.status, 200, "the same code and config again");
    ok("put", "/v1/types/{type}", &r);
    ok("get", "/v1/types", &api.get("/v1/types").await);
    ok("get", "/v1/types/{type}", &api.get("/v1/types/kit").await);

    // An actor with state, events, alarms, an input request and a file.
    assert_eq!(api.add("kit", "a", 1).await.status, 200);
    for op in [
        json!({"op": "set", "key": "blob", "value": "x"}),
        json!({"op": "emit", "kind": "hello", "data": {"x": 1}}),
        json!({"op": "alarm_set", "name": "at", "at": 4_000_000_000_000u64}),
        json!({"op": "alarm_set", "name": "after", "after": 3_600_000, "payload": {"p": 1}}),
        json!({"op": "alarm_set", "name": "cron", "cron": "0 9 * * *", "tz": "Europe/Paris"}),
        json!({"op": "input_request", "kind": "approval", "prompt": "ok?",
               "schema": {"type": "boolean"}, "expires_in_ms": 3_600_000}),
        json!({"op": "input_request", "kind": "question"}),
        json!({"op": "file_write", "path": "outputs/a.txt", "text": "hello"}),
    ] {
        let r = api.op("kit", "a", op.clone()).await;
        assert_eq!(r.status, 200, "{op}: {}", r.json);
    }
    let queued = api
        .req(
            Method::POST,
            "/v1/actors/kit/b?wait=false",
            Some((
                "application/json",
                br#"{"op":"add","key":"n","by":1}"#.to_vec(),
            )),
            &[],
        )
        .await;
    assert_eq!(queued.status, 202);
    ok("post", "/v1/actors/{type}/{id}", &queued);
    ok("get", "/v1/actors/{type}", &api.get("/v1/actors/kit").await);
    ok(
        "get",
        "/v1/actors/{type}/{id}",
        &api.get("/v1/actors/kit/a").await,
    );
    let page = ok(
        "get",
        "/v1/actors/{type}/{id}/state",
        &api.get("/v1/actors/kit/a/state").await,
    );
    assert!(page["entries"].as_array().unwrap().len() >= 2, "{page}");
    let page = ok(
        "get",
        "/v1/actors/{type}/{id}/events",
        &api.get("/v1/actors/kit/a/events").await,
    );
    assert_eq!(page["events"][0]["kind"], "hello", "{page}");
    let alarms = ok(
        "get",
        "/v1/actors/{type}/{id}/alarms",
        &api.get("/v1/actors/kit/a/alarms").await,
    );
    assert_eq!(alarms["alarms"].as_array().unwrap().len(), 3, "{alarms}");
    let inputs = ok(
        "get",
        "/v1/actors/{type}/{id}/inputs",
        &api.get("/v1/actors/kit/a/inputs").await,
    );
    assert_eq!(inputs["inputs"].as_array().unwrap().len(), 2, "{inputs}");
    let input = inputs["inputs"][0]["id"].as_str().unwrap().to_owned();
    let r = api
        .post_json(&format!("/v1/actors/kit/a/inputs/{input}"), &json!(true))
        .await;
    ok("post", "/v1/actors/{type}/{id}/inputs/{input}", &r);
    let all = api.get("/v1/actors/kit/a/inputs?status=all").await;
    ok("get", "/v1/actors/{type}/{id}/inputs", &all);
    for code in ["marmot.state.get('n')", "throw new Error('no')"] {
        let r = api
            .post_json("/v1/actors/kit/a/eval", &json!({ "code": code }))
            .await;
        ok("post", "/v1/actors/{type}/{id}/eval", &r);
    }
    let files = ok(
        "get",
        "/v1/actors/{type}/{id}/files",
        &api.get("/v1/actors/kit/a/files").await,
    );
    assert_eq!(files["files"][0]["path"], "outputs/a.txt", "{files}");

    // An inbound webhook, taken and then seen again.
    let body = br#"{"op":"add","key":"n","by":1}"#;
    let signed = common::signed(&secret, "msg_1", common::now_s(), body);
    for _ in 0..2 {
        let r = api.post_hook("/v1/hooks/kit/a/h", body, &signed).await;
        assert_eq!(r.status, 202, "{}", r.json);
        ok("post", "/v1/hooks/{type}/{id}/{name}", &r);
    }

    // Shared configuration.
    for (path, body) in [
        (
            "/v1/secrets/{name}",
            json!({"value": "sk-0123456789", "hosts": ["api.example.com", "llm.example.com"]}),
        ),
        (
            "/v1/providers/{name}",
            json!({"format": "anthropic-messages", "base_url": "https://llm.example.com/v1",
                   "key_secret": "k", "headers": {"x-team": "a"},
                   "prices": {"m": {"input_per_mtok": 1.0, "output_per_mtok": 2.0}}}),
        ),
        (
            "/v1/subscriptions/{name}",
            json!({"url": "http://127.0.0.1:9/hook", "events": ["hel*"]}),
        ),
    ] {
        let at = path.replace("{name}", "k");
        let created = put(at.clone(), body.clone()).await;
        assert_eq!(created.status, 201, "{path}: {}", created.json);
        ok("put", path, &created);
        let replaced = put(at, body).await;
        assert_eq!(replaced.status, 200, "{path}: {}", replaced.json);
        ok("put", path, &replaced);
    }
    ok("get", "/v1/secrets", &api.get("/v1/secrets").await);
    ok("get", "/v1/providers", &api.get("/v1/providers").await);
    ok(
        "get",
        "/v1/providers/{name}",
        &api.get("/v1/providers/k").await,
    );
    ok(
        "get",
        "/v1/subscriptions",
        &api.get("/v1/subscriptions").await,
    );
    ok(
        "get",
        "/v1/subscriptions/{name}",
        &api.get("/v1/subscriptions/k").await,
    );

    // A delivery of a new event to that subscription, retried by hand.
    let r = api
        .op(
            "kit",
            "a",
            json!({"op": "emit", "kind": "hello", "data": 2}),
        )
        .await;
    assert_eq!(r.status, 200);
    let page = ok("get", "/v1/deliveries", &api.get("/v1/deliveries").await);
    let id = page["deliveries"][0]["id"]
        .as_str()
        .unwrap_or_else(|| panic!("no delivery: {page}"))
        .to_owned();
    let r = api
        .post_json(&format!("/v1/deliveries/{id}/retry"), &json!({}))
        .await;
    assert_eq!(r.status, 202, "{}", r.json);
    ok("post", "/v1/deliveries/{id}/retry", &r);

    // Tokens and a backup.
    let minted = api
        .post_json(
            "/v1/tokens",
            &json!({"type": "kit", "id": "a", "scopes": ["send"], "ttl_s": 60}),
        )
        .await;
    let token_id = ok("post", "/v1/tokens", &minted)["token_id"]
        .as_str()
        .unwrap()
        .to_owned();
    for _ in 0..2 {
        let r = api.delete(&format!("/v1/tokens/{token_id}")).await;
        ok("delete", "/v1/tokens/{id}", &r);
    }
    let to = dir.path().join("backup");
    let r = api
        .post_json("/v1/backup", &json!({"to": to.to_str().unwrap()}))
        .await;
    ok("post", "/v1/backup", &r);

    // Removals.
    for path in [
        "/v1/secrets/{name}",
        "/v1/providers/{name}",
        "/v1/subscriptions/{name}",
    ] {
        let r = api.delete(&path.replace("{name}", "k")).await;
        ok("delete", path, &r);
    }
    ok(
        "delete",
        "/v1/actors/{type}/{id}",
        &api.delete("/v1/actors/kit/b").await,
    );
    let r = api.delete("/v1/types/kit?force=true").await;
    ok("delete", "/v1/types/{type}", &r);
}
