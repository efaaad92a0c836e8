//! Input requests: a durable wait that an answer (or its deadline) ends
//! exactly once, across restarts, with schema-checked answers.

mod common;

use std::time::{Duration, Instant};

use common::{Api, Marmot, TESTKIT, all_pages, event_kinds, kit_node, tempdir};
use reqwest::Method;
use serde_json::{Value, json};

async fn request(api: &Api, id: &str, req: Value) -> String {
    let mut op = json!({"op": "input_request"});
    op.as_object_mut()
        .unwrap()
        .extend(req.as_object().unwrap().clone());
    let r = api.op("kit", id, op).await;
    assert_eq!(r.status, 200, "{}", r.json);
    let input = r.json["id"].as_str().unwrap().to_owned();
    assert!(input.starts_with("in_"), "{input}");
    input
}

async fn answer(api: &Api, id: &str, input: &str, body: &str) -> common::Resp {
    api.req(
        Method::POST,
        &format!("/v1/actors/kit/{id}/inputs/{input}"),
        Some(("application/json", body.as_bytes().to_vec())),
        &[],
    )
    .await
}

async fn seen(api: &Api, id: &str) -> Vec<Value> {
    let r = api
        .op("kit", id, json!({"op": "get", "key": "inputs_seen"}))
        .await;
    r.json["value"].as_array().cloned().unwrap_or_default()
}

async fn wait_seen(api: &Api, id: &str, n: usize) -> Vec<Value> {
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        let s = seen(api, id).await;
        if s.len() >= n {
            return s;
        }
        assert!(
            Instant::now() < deadline,
            "{} of {n} inputs handled",
            s.len()
        );
        tokio::time::sleep(Duration::from_millis(25)).await;
    }
}

async fn listed(api: &Api, id: &str, status: &str) -> Vec<Value> {
    listed_of(api, "kit", id, status).await
}

/// Input requests of (`ty`, `id`) with `status`.
async fn listed_of(api: &Api, ty: &str, id: &str, status: &str) -> Vec<Value> {
    let r = api
        .get(&format!("/v1/actors/{ty}/{id}/inputs?status={status}"))
        .await;
    assert_eq!(r.status, 200, "{}", r.json);
    r.json["inputs"].as_array().unwrap().clone()
}

#[tokio::test]
async fn an_input_is_answered_once_and_resumes_the_actor() {
    let (_dir, _m, api) = kit_node(json!({})).await;
    let schema = json!({
        "type": "object",
        "required": ["approved"],
        "properties": {"approved": {"type": "boolean"}, "note": {"type": "string"}},
        "additionalProperties": false
    });
    let input = request(
        &api,
        "a",
        json!({"kind": "approval", "prompt": "Refund $40?", "schema": schema}),
    )
    .await;
    let pending = listed(&api, "a", "pending").await;
    assert_eq!(pending.len(), 1);
    assert_eq!(pending[0]["id"], input.as_str());
    assert_eq!(pending[0]["kind"], "approval");
    assert_eq!(pending[0]["prompt"], "Refund $40?");
    assert_eq!(pending[0]["schema"], schema);
    assert_eq!(pending[0]["status"], "pending");
    assert_eq!(api.get("/v1/actors/kit/a").await.json["pending_inputs"], 1);
    let ev = api.get("/v1/actors/kit/a/events").await.json;
    assert_eq!(event_kinds(&ev), ["input_requested"]);
    assert_eq!(ev["events"][0]["data"]["id"], input.as_str());
    assert_eq!(ev["events"][0]["data"]["schema"], schema);

    // Bad answers change nothing, and say what is wrong with them (one
    // that is not JSON was blamed on the schema).
    let deep = format!("{}{}", "[".repeat(200), "]".repeat(200));
    for (body, says) in [
        (
            r#"{"approved": "yes"}"#,
            "the answer does not match the input's schema",
        ),
        (
            r#"{"approved": true, "extra": 1}"#,
            "the answer does not match the input's schema",
        ),
        ("not json", "the answer must be JSON"),
        (deep.as_str(), "the answer nests more than 128 levels deep"),
    ] {
        let r = answer(&api, "a", &input, body).await;
        assert_eq!(r.status, 422, "{body}: {}", r.json);
        assert_eq!(r.code(), "invalid_answer");
        let message = r.json["error"]["message"].as_str().unwrap();
        assert!(message.starts_with(says), "{body}: {message}");
    }
    assert!(
        answer(&api, "a", &input, r#"{"approved": 1}"#).await.json["error"]["message"]
            .as_str()
            .unwrap()
            .contains("$.approved")
    );
    assert_eq!(listed(&api, "a", "pending").await.len(), 1);
    assert!(seen(&api, "a").await.is_empty());

    let r = answer(&api, "a", &input, r#"{"approved": true, "note": "ok"}"#).await;
    assert_eq!(r.status, 200, "{}", r.json);
    assert_eq!(r.json, json!({"id": input, "status": "answered"}));
    // The reply left after the on-input turn was durable: its effect is there.
    let s = seen(&api, "a").await;
    assert_eq!(
        s,
        [
            json!({"id": input, "kind": "approval", "response": {"approved": true, "note": "ok"}, "expired": false})
        ]
    );
    assert!(listed(&api, "a", "pending").await.is_empty());
    let all = listed(&api, "a", "all").await;
    assert_eq!(all[0]["status"], "answered");
    assert_eq!(all[0]["response"], json!({"approved": true, "note": "ok"}));
    assert!(all[0]["settled_at_ms"].as_u64().unwrap() > 0);
    assert_eq!(api.get("/v1/actors/kit/a").await.json["pending_inputs"], 0);
    let ev = api.get("/v1/actors/kit/a/events").await.json;
    assert_eq!(
        event_kinds(&ev),
        ["input_requested", "input_handled", "input_answered"]
    );

    // Twice: 409. Unknown: 404. Nothing ran again.
    let r = answer(&api, "a", &input, r#"{"approved": false}"#).await;
    assert_eq!(r.status, 409);
    assert_eq!(r.code(), "input_settled");
    assert!(
        r.json["error"]["message"]
            .as_str()
            .unwrap()
            .contains("answered")
    );
    let r = answer(&api, "a", "in_0000000000000000000000000", "{}").await;
    assert_eq!(r.status, 404);
    assert_eq!(r.code(), "input_not_found");
    let r = answer(&api, "a", "in-bad.id", "{}").await;
    assert_eq!(r.status, 404);
    let r = answer(&api, "nobody", &input, "{}").await;
    assert_eq!(r.code(), "actor_not_found");
    assert_eq!(seen(&api, "a").await.len(), 1);
    let r = api.get("/v1/actors/kit/a/inputs?status=weird").await;
    assert_eq!(r.status, 400);
}

#[tokio::test]
async fn a_failed_on_input_turn_leaves_the_request_pending() {
    let (_dir, _m, api) = kit_node(json!({})).await;
    let input = request(&api, "a", json!({"kind": "question"})).await;
    let r = answer(&api, "a", &input, r#"{"fail": true}"#).await;
    assert_eq!(r.status, 500);
    assert_eq!(r.code(), "actor_error");
    assert_eq!(listed(&api, "a", "pending").await.len(), 1);
    assert!(
        seen(&api, "a").await.is_empty(),
        "the failed turn committed nothing"
    );
    let r = answer(&api, "a", &input, r#""blue""#).await;
    assert_eq!(r.status, 200, "{}", r.json);
    assert_eq!(seen(&api, "a").await[0]["response"], "blue");
}

/// Guarantee 2 for inputs: a turn that requests an input and then fails
/// leaves no request behind.
#[tokio::test]
async fn a_failed_turn_requests_no_input() {
    let (_dir, _m, api) = kit_node(json!({})).await;
    let r = api
        .op(
            "kit",
            "a",
            json!({"op": "input_request", "kind": "question", "expires_in_ms": 300, "fail": true}),
        )
        .await;
    assert_eq!(r.status, 500, "{}", r.json);
    assert_eq!(r.code(), "actor_error");
    assert!(listed(&api, "a", "pending").await.is_empty());
    // Nor does it expire later: it never existed.
    tokio::time::sleep(Duration::from_millis(800)).await;
    assert!(listed(&api, "a", "expired").await.is_empty());
    assert!(seen(&api, "a").await.is_empty());
    let events = api.get("/v1/actors/kit/a/events").await.json;
    assert!(
        !event_kinds(&events).iter().any(|k| k.starts_with("input")),
        "{events}"
    );
}

#[tokio::test]
async fn an_unanswered_input_expires_once_and_cannot_be_answered_after() {
    let (_dir, _m, api) = kit_node(json!({})).await;
    let input = request(&api, "a", json!({"kind": "approval", "expires_in_ms": 300})).await;
    // Its expiry is the platform's own alarm: not listed, not counted.
    assert!(
        api.get("/v1/actors/kit/a/alarms").await.json["alarms"]
            .as_array()
            .unwrap()
            .is_empty()
    );
    assert_eq!(api.get("/v1/actors/kit/a").await.json["pending_alarms"], 0);
    let s = wait_seen(&api, "a", 1).await;
    assert_eq!(
        s[0],
        json!({"id": input, "kind": "approval", "response": null, "expired": true})
    );
    let all = listed(&api, "a", "expired").await;
    assert_eq!(all.len(), 1);
    let r = answer(&api, "a", &input, "true").await;
    assert_eq!(r.status, 409);
    assert!(
        r.json["error"]["message"]
            .as_str()
            .unwrap()
            .contains("expired")
    );
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert_eq!(seen(&api, "a").await.len(), 1, "expired once");
    let ev = api.get("/v1/actors/kit/a/events").await.json;
    assert_eq!(
        event_kinds(&ev),
        ["input_requested", "input_handled", "input_expired"]
    );

    // Answered in time: the expiry never runs.
    let input = request(&api, "b", json!({"kind": "approval", "expires_in_ms": 400})).await;
    assert_eq!(answer(&api, "b", &input, "1").await.status, 200);
    tokio::time::sleep(Duration::from_millis(800)).await;
    let s = seen(&api, "b").await;
    assert_eq!(s.len(), 1);
    assert_eq!(s[0]["expired"], false);
}

#[tokio::test]
async fn inputs_survive_restarts_and_settle_once() {
    let dir = tempdir();
    let mut m = Marmot::start(&dir.path().join("data")).await;
    let api = m.client();
    api.deploy("kit", TESTKIT, json!({})).await;
    let answered = request(&api, "a", json!({"kind": "question", "prompt": "why?"})).await;
    let expiring = request(&api, "b", json!({"kind": "approval", "expires_in_ms": 500})).await;
    m.kill9();
    // `b`'s deadline passes while the node is down.
    tokio::time::sleep(Duration::from_millis(700)).await;
    m.restart().await;
    let api = m.client();
    let r = answer(&api, "a", &answered, r#""because""#).await;
    assert_eq!(r.status, 200, "{}", r.json);
    let s = wait_seen(&api, "b", 1).await;
    assert_eq!(s[0]["id"], expiring.as_str());
    assert_eq!(s[0]["expired"], true);
    m.restart().await;
    let api = m.client();
    assert_eq!(answer(&api, "a", &answered, r#""again""#).await.status, 409);
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert_eq!(seen(&api, "a").await.len(), 1, "answered once");
    assert_eq!(seen(&api, "b").await.len(), 1, "expired once");
}

#[tokio::test]
async fn bad_requests_are_refused_and_pending_inputs_are_capped() {
    let config = "[inputs]\nmax_pending_per_actor = 2\n";
    let dir = tempdir();
    let m = Marmot::start_opts(&dir.path().join("data"), &[], Some(config)).await;
    let api = m.client();
    api.deploy("kit", TESTKIT, json!({})).await;
    for (req, needle) in [
        (json!({"kind": ""}), "input kind"),
        (json!({"kind": "q", "schema": [1]}), "JSON Schema object"),
        // A schema the answer check would misread checked nothing: any
        // answer was taken.
        (
            json!({"kind": "q", "schema": {"type": "nonsense"}}),
            "$.type: \"nonsense\" is not a JSON type",
        ),
        (
            json!({"kind": "q", "schema": {"$ref": "https://example.com/s.json"}}),
            "references are not supported",
        ),
        (json!({"kind": "q", "expires_in_ms": 0}), "expires-in-ms"),
    ] {
        let mut op = json!({"op": "input_request"});
        op.as_object_mut()
            .unwrap()
            .extend(req.as_object().unwrap().clone());
        let r = api.op("kit", "a", op).await;
        assert_eq!(r.status, 422, "{req}: {}", r.json);
        assert!(
            r.json["error"].as_str().unwrap().contains(needle),
            "{req}: {}",
            r.json
        );
    }
    request(&api, "a", json!({"kind": "q"})).await;
    request(&api, "a", json!({"kind": "q"})).await;
    let r = api
        .op("kit", "a", json!({"op": "input_request", "kind": "q"}))
        .await;
    assert_eq!(r.status, 422);
    assert!(
        r.json["error"]
            .as_str()
            .unwrap()
            .contains("at most 2 pending")
    );
    assert_eq!(listed(&api, "a", "pending").await.len(), 2);
    // Answering one frees a slot.
    let first = listed(&api, "a", "pending").await[0]["id"]
        .as_str()
        .unwrap()
        .to_owned();
    assert_eq!(answer(&api, "a", &first, "1").await.status, 200);
    request(&api, "a", json!({"kind": "q"})).await;
}

const APPROVER_JS: &str = r#"
import { state, inputs } from "marmot";

export default {
  onMessage(body) {
    const id = inputs.request({
      kind: "approval",
      prompt: `Ship ${body.what}?`,
      schema: { type: "object", required: ["ok"], properties: { ok: { type: "boolean" } } },
    });
    return { id };
  },
  onInput(input) {
    state.set("decision", { id: input.id, kind: input.kind, ok: input.response.ok });
  },
};
"#;

#[tokio::test]
async fn javascript_actors_request_and_receive_inputs() {
    let (_dir, _m, api) = kit_node(json!({})).await;
    let r = api.deploy_js("approver", APPROVER_JS).await;
    assert_eq!(r.status, 201, "{}", r.json);
    let r = api
        .post_json("/v1/actors/approver/x", &json!({"what": "v2"}))
        .await;
    let id = r.json["id"].as_str().unwrap().to_owned();
    let r = api
        .req(
            Method::POST,
            &format!("/v1/actors/approver/x/inputs/{id}"),
            Some(("application/json", br#"{"ok": "sure"}"#.to_vec())),
            &[],
        )
        .await;
    assert_eq!(r.status, 422, "the schema holds for JS actors too");
    let r = api
        .req(
            Method::POST,
            &format!("/v1/actors/approver/x/inputs/{id}"),
            Some(("application/json", br#"{"ok": true}"#.to_vec())),
            &[],
        )
        .await;
    assert_eq!(r.status, 200, "{}", r.json);
    let d = api.get("/v1/actors/approver/x/state/decision").await.json;
    assert_eq!(d, json!({"id": id, "kind": "approval", "ok": true}));
}

/// `inputs.cancel` withdraws a pending request, made by an earlier turn
/// or the same one: `cancelled` when the turn commits, with an
/// `input_cancelled` event, its expiry gone, and an answer refused. Only
/// the actor's own pending requests can be cancelled, and a turn that
/// fails cancels nothing.
#[tokio::test]
async fn an_actor_withdraws_its_own_pending_requests() {
    let dir = tempdir();
    let m = Marmot::start(&dir.path().join("data")).await;
    let api = m.client();
    let js = r#"
import { inputs } from "marmot";
export default {
  onMessage({ op, id }) {
    if (op === "ask") return { r: inputs.request({ kind: "approval", prompt: "ok?", expiresInMs: 60000 }) };
    if (op === "cancel") { inputs.cancel(id); return { r: "cancelled" }; }
    if (op === "cancel-and-fail") { inputs.cancel(id); throw new Error("changed my mind"); }
    if (op === "ask-and-cancel") { const i = inputs.request({ kind: "q", prompt: "?" }); inputs.cancel(i); return { r: i }; }
    try { inputs.cancel(id); return { r: "cancelled" }; } catch (e) { return { r: String(e) }; }
  },
  onInput() {},
};
"#;
    assert_eq!(api.deploy_js("asker", js).await.status, 201);
    let op = |op: &str, id: &str| json!({"op": op, "id": id});
    let first = api.op("asker", "a", op("ask", "")).await.json["r"].clone();
    let first = first.as_str().unwrap().to_owned();
    // A failed turn cancels nothing.
    let r = api.op("asker", "a", op("cancel-and-fail", &first)).await;
    assert_eq!(r.status, 500, "{}", r.json);
    assert_eq!(listed_of(&api, "asker", "a", "pending").await.len(), 1);
    let r = api.op("asker", "a", op("cancel", &first)).await;
    assert_eq!(r.json["r"], "cancelled", "{}", r.json);
    let all = listed_of(&api, "asker", "a", "all").await;
    assert_eq!(all[0]["status"], "cancelled", "{all:?}");
    assert!(all[0]["settled_at_ms"].as_u64().is_some());
    assert!(listed_of(&api, "asker", "a", "pending").await.is_empty());
    assert_eq!(listed_of(&api, "asker", "a", "cancelled").await.len(), 1);
    assert_eq!(
        api.get("/v1/actors/asker/a").await.json["pending_inputs"],
        0
    );
    let alarms = api.get("/v1/actors/asker/a/alarms").await.json;
    assert_eq!(alarms["alarms"], json!([]), "the expiry stayed: {alarms}");
    let r = api
        .post_json(
            &format!("/v1/actors/asker/a/inputs/{first}"),
            &json!({"approved": true}),
        )
        .await;
    assert_eq!(r.status, 409, "{}", r.json);
    // Twice, or an id that is not the actor's: not found.
    for id in [first.as_str(), "in_nope"] {
        let r = api.op("asker", "a", op("try", id)).await;
        assert!(
            r.json["r"].as_str().unwrap().contains("not found"),
            "{id}: {}",
            r.json
        );
    }
    let other = api.op("asker", "b", op("ask", "")).await.json["r"].clone();
    let r = api
        .op("asker", "a", op("try", other.as_str().unwrap()))
        .await;
    assert!(
        r.json["r"].as_str().unwrap().contains("not found"),
        "{}",
        r.json
    );
    // Asked and withdrawn in one turn.
    let same = api.op("asker", "c", op("ask-and-cancel", "")).await.json["r"].clone();
    let all = listed_of(&api, "asker", "c", "all").await;
    assert_eq!(
        (&all[0]["id"], &all[0]["status"]),
        (&same, &json!("cancelled"))
    );
    let events = api.get("/v1/actors/asker/a/events").await.json;
    assert_eq!(
        event_kinds(&events),
        ["input_requested", "input_cancelled"],
        "{events}"
    );
}

/// Settled requests are kept for `settled_ttl_ms` and at most
/// `max_settled_per_actor` per actor, the oldest pruned first by the next
/// commit that settles one (an answer, an expiry or a cancellation); a
/// pruned one is a 404, a kept one a 409. (Every settlement used to decode
/// every request the actor kept, up to a week of them.)
#[tokio::test]
async fn settled_inputs_are_kept_by_age_and_by_count() {
    let ids = |v: &[Value]| -> Vec<String> {
        v.iter()
            .map(|i| i["id"].as_str().unwrap().to_owned())
            .collect()
    };
    let dir = tempdir();
    let config = "[inputs]\nmax_settled_per_actor = 2\nsettled_ttl_ms = 600000\n";
    let m = Marmot::start_opts(&dir.path().join("count"), &[], Some(config)).await;
    let api = m.client();
    api.deploy("kit", TESTKIT, json!({})).await;
    let mut asked = Vec::new();
    for n in 0..4 {
        let input = request(&api, "a", json!({"kind": "q"})).await;
        assert_eq!(answer(&api, "a", &input, &n.to_string()).await.status, 200);
        asked.push(input);
    }
    let pending = request(&api, "a", json!({"kind": "q"})).await;
    let all = listed(&api, "a", "all").await;
    assert_eq!(ids(&all), [&*asked[2], &*asked[3], &*pending], "{all:?}");
    assert_eq!(ids(&listed(&api, "a", "pending").await), [pending.as_str()]);
    assert_eq!(answer(&api, "a", &asked[0], "9").await.status, 404);
    assert_eq!(answer(&api, "a", &asked[3], "9").await.status, 409);
    drop(m);

    let config = "[inputs]\nsettled_ttl_ms = 1500\n";
    let m = Marmot::start_opts(&dir.path().join("age"), &[], Some(config)).await;
    let api = m.client();
    api.deploy("kit", TESTKIT, json!({})).await;
    let old = request(&api, "a", json!({"kind": "q"})).await;
    assert_eq!(answer(&api, "a", &old, "1").await.status, 200);
    tokio::time::sleep(Duration::from_millis(1600)).await;
    let new = request(&api, "a", json!({"kind": "q"})).await;
    assert_eq!(answer(&api, "a", &new, "2").await.status, 200);
    assert_eq!(ids(&listed(&api, "a", "all").await), [new.as_str()]);
    assert_eq!(answer(&api, "a", &old, "3").await.status, 404);
}

/// A JavaScript module without `onInput` cannot ask for input: nothing
/// could take the answer (it was a 500 and the request stayed pending, and
/// its expiry failed for ever), so `inputs.request` throws, naming why.
#[tokio::test]
async fn a_javascript_module_without_on_input_cannot_ask() {
    let dir = tempdir();
    let m = Marmot::start(&dir.path().join("data")).await;
    let api = m.client();
    let js = r#"
import { inputs } from "marmot";
export default {
  onMessage() {
    try { inputs.request({ kind: "approval", prompt: "ok?" }); return "asked"; }
    catch (e) { return { error: String(e), code: e.code }; }
  },
};
"#;
    assert_eq!(api.deploy_js("mute", js).await.status, 201);
    let r = api.post_json("/v1/actors/mute/a", &json!({})).await;
    assert_eq!(r.status, 200, "{}", r.json);
    assert!(
        r.json["error"]
            .as_str()
            .unwrap()
            .contains("no `onInput` handler"),
        "{}",
        r.json
    );
    assert_eq!(r.json["code"], "invalid");
    assert!(listed_of(&api, "mute", "a", "all").await.is_empty());
}

/// Settled requests are listed a page at a time, answers and all: every
/// answer an actor keeps was read and parsed at once, ~9× its size in
/// memory, for any holder of an `inputs` token (a probe: 26 MB of answers
/// took a node from 185 MB to 1 GB).
#[tokio::test]
async fn settled_inputs_are_listed_a_page_at_a_time() {
    let (_dir, _m, api) = common::js::node(None).await;
    let asker = r#"import { inputs } from "marmot";
export default {
  onMessage(b) {
    const ids = [];
    for (let i = 0; i < b.n; i++) ids.push(inputs.request({ kind: "q", prompt: "p" }));
    return ids;
  },
  onInput() {},
};"#;
    assert_eq!(api.deploy_js("asker", asker).await.status, 201);
    let r = api.post_json("/v1/actors/asker/a", &json!({"n": 40})).await;
    assert_eq!(r.status, 200, "{}", r.json);
    let ids: Vec<String> = serde_json::from_value(r.json).unwrap();
    // 40 answers of 256 KiB: more than one page holds (8 MiB).
    let big = format!("[{}]", vec!["0"; 131_071].join(","));
    for id in &ids {
        let r = api
            .req(
                Method::POST,
                &format!("/v1/actors/asker/a/inputs/{id}"),
                Some(("application/json", big.clone().into_bytes())),
                &[],
            )
            .await;
        assert_eq!(r.status, 200, "{}", r.json);
    }
    let (answered, pages) =
        all_pages(&api, "/v1/actors/asker/a/inputs?status=answered", "inputs").await;
    let listed: Vec<String> = answered
        .iter()
        .map(|i| {
            assert_eq!(i["response"].as_array().map(Vec::len), Some(131_071));
            i["id"].as_str().unwrap().to_owned()
        })
        .collect();
    assert!(pages >= 2, "one page held every answer");
    let mut want = ids.clone();
    want.sort();
    assert_eq!(listed, want, "each once, by id");
    // And `limit`.
    let r = api
        .get("/v1/actors/asker/a/inputs?status=answered&limit=5")
        .await;
    let got: Vec<&str> = r.json["inputs"]
        .as_array()
        .unwrap()
        .iter()
        .map(|i| i["id"].as_str().unwrap())
        .collect();
    assert_eq!(got, want[..5]);
    assert_eq!(r.json["next_after"].as_str(), Some(want[4].as_str()));
}

/// An input's expiry that its actor keeps failing is given up with an
/// `alarm_failed` event naming the input, not the platform's own alarm
/// (its NUL-prefixed name, never shown to guests, reached the log).
#[tokio::test]
async fn a_failing_expiry_is_given_up_naming_its_input() {
    let config = "[alarms]\nmax_attempts = 2\nretry_base_ms = 50\n";
    let (_dir, _m, api) = common::js::node(Some(config)).await;
    let module = r#"import { inputs } from "marmot";
export default {
  onMessage() { return { id: inputs.request({ kind: "q", prompt: "p", expiresInMs: 200 }) }; },
  onInput(input) { if (input.expired) throw new Error("cannot expire"); },
};"#;
    assert_eq!(api.deploy_js("exp", module).await.status, 201);
    let r = api.post_json("/v1/actors/exp/a", &json!({})).await;
    assert_eq!(r.status, 200, "{}", r.json);
    let input = r.json["id"].as_str().unwrap().to_owned();
    let deadline = Instant::now() + Duration::from_secs(20);
    let failed = loop {
        let r = api.get("/v1/actors/exp/a/events").await;
        let found = r.json["events"]
            .as_array()
            .unwrap()
            .iter()
            .find(|e| e["kind"] == "alarm_failed")
            .cloned();
        if let Some(e) = found {
            assert!(
                !String::from_utf8_lossy(&r.body).contains("\\u0000"),
                "{}",
                r.json
            );
            break e;
        }
        assert!(Instant::now() < deadline, "no alarm_failed: {}", r.json);
        tokio::time::sleep(Duration::from_millis(100)).await;
    };
    assert_eq!(failed["data"]["input_expiry"], input.as_str(), "{failed}");
    assert!(failed["data"].get("alarm").is_none(), "{failed}");
}
