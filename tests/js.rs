//! JavaScript actors and `POST …/eval` on the built-in QuickJS engine: the
//! `marmot` module, errors, hibernation, evals, child sandboxes and preloaded
//! modules. Hostile code is in `tests/js_hostile.rs`.

mod common;
#[path = "js/state_list.rs"]
mod state_list;

use std::time::{Duration, Instant};

use common::js::{COUNTER_JS, eval, node};
use common::{event_kinds, metric};
use reqwest::Method;
use serde_json::{Value, json};

#[tokio::test]
async fn javascript_actors_run_turns_against_the_marmot_module() {
    let (_dir, m, api) = node(None).await;
    let r = api.deploy_js("jscount", COUNTER_JS).await;
    assert_eq!(r.status, 201, "{}", r.json);
    assert_eq!(r.json["kind"], "js");

    let r = api
        .post_json("/v1/actors/jscount/ann", &json!({"by": 5}))
        .await;
    assert_eq!(r.status, 200, "{}", r.json);
    assert_eq!(r.json, json!({"n": 5, "id": "ann", "version": 1}));
    let r = api
        .post_json("/v1/actors/jscount/ann", &json!({"by": 2}))
        .await;
    assert_eq!(r.json["n"], 7);
    // The context argument: who the actor is and which message this is.
    let first = api.op("jscount", "ann", json!({"op": "ctx"})).await.json;
    let second = api.op("jscount", "ann", json!({"op": "ctx"})).await.json;
    assert_eq!(first["type"], "jscount", "{first}");
    assert_eq!(first["id"], "ann");
    assert_eq!(first["version"], 1);
    let id = first["messageId"].as_str().unwrap();
    assert!(
        !id.is_empty() && second["messageId"] != id,
        "{first} {second}"
    );
    // A string reply is text; a JSON body without a content type is still
    // parsed; a plain-text body stays a string.
    let r = api
        .req(
            Method::POST,
            "/v1/actors/jscount/ann",
            Some(("text/plain", b"ping".to_vec())),
            &[],
        )
        .await;
    assert_eq!(r.body, b"pong");
    assert!(
        r.headers["content-type"]
            .to_str()
            .unwrap()
            .starts_with("text/plain")
    );
    let r = api.op("jscount", "ann", json!({"op": "nothing"})).await;
    assert_eq!(r.json, Value::Null);

    assert_eq!(api.get("/v1/actors/jscount/ann/state/n").await.json, 7);
    let ev = api.get("/v1/actors/jscount/ann/events").await.json;
    assert_eq!(ev["events"][1]["kind"], "counted");
    assert_eq!(ev["events"][1]["data"], json!({"n": 7}));
    tokio::time::sleep(Duration::from_millis(100)).await;
    assert!(
        m.log_text().contains("counter jscount ann 7"),
        "console.log reaches the log"
    );

    // A capability's refusal throws a clear JavaScript error.
    let r = api
        .op("jscount", "ann", json!({"op": "missing-file"}))
        .await;
    assert!(
        r.json["error"]
            .as_str()
            .unwrap()
            .contains("not found: no file `notes.txt`"),
        "{}",
        r.json
    );
}

#[tokio::test]
async fn javascript_errors_are_clear_and_commit_nothing() {
    let (_dir, _m, api) = node(None).await;
    api.deploy_js("jscount", COUNTER_JS).await;
    api.post_json("/v1/actors/jscount/a", &json!({"by": 3}))
        .await;

    // A syntax error is a 400 naming line and column; nothing is deployed.
    let bad = "export default {\n  onMessage() {\n    return 1 +;\n  }\n};\n";
    let r = api.deploy_js("jscount", bad).await;
    assert_eq!(r.status, 400, "{}", r.json);
    assert_eq!(r.code(), "invalid_code");
    let msg = r.json["error"]["message"].as_str().unwrap();
    assert!(
        msg.contains("SyntaxError") && msg.contains("jscount.js:3:"),
        "{msg}"
    );
    assert_eq!(api.get("/v1/types/jscount").await.json["version"], 1);
    let r = api
        .req(
            Method::PUT,
            "/v1/types/jsbad",
            Some(("text/javascript", vec![0xff, 0xfe])),
            &[],
        )
        .await;
    assert_eq!(r.status, 400);
    assert_eq!(api.get("/v1/types/jsbad").await.status, 404);

    // A thrown error is a 500 with message and stack; its writes are gone.
    let r = api.op("jscount", "a", json!({"op": "throw"})).await;
    assert_eq!(r.status, 500);
    assert_eq!(r.code(), "actor_error");
    let msg = r.json["error"]["message"].as_str().unwrap();
    assert!(
        msg.contains("Error: boom: a") && msg.contains("jscount.js:"),
        "{msg}"
    );
    assert_eq!(api.get("/v1/actors/jscount/a/state/n").await.json, 3);

    // A reply that is not JSON-serializable is a clear error.
    let r = api.op("jscount", "a", json!({"op": "bigint"})).await;
    assert_eq!(r.status, 500);
    assert!(
        r.json["error"]["message"]
            .as_str()
            .unwrap()
            .contains("not JSON-serializable"),
        "{}",
        r.json
    );

    // A body declared JSON that is not JSON is the client's error: 400
    // before anything is stored, so no actor comes to be for it, with or
    // without `wait` (it used to be a 500 from the turn, and an actor).
    for (query, body) in [
        ("", b"{bad json".to_vec()),
        ("?wait=false", b"{bad json".to_vec()),
        ("", vec![0xff, 0xfe]),
    ] {
        let r = api
            .req(
                Method::POST,
                &format!("/v1/actors/jscount/never{query}"),
                Some(("application/json; charset=utf-8", body)),
                &[],
            )
            .await;
        assert_eq!(r.status, 400, "{query}: {}", r.json);
        assert_eq!(r.code(), "invalid_json", "{}", r.json);
        assert!(
            r.json["error"]["message"]
                .as_str()
                .unwrap()
                .contains("declared JSON"),
            "{}",
            r.json
        );
    }
    // Nor nested past what the sandbox parses (100,000 levels were a 500
    // from the turn); as deep as it takes is a message like any other.
    let nested = |id: &'static str, depth: usize| {
        let body = format!("{}{}", "[".repeat(depth), "]".repeat(depth)).into_bytes();
        let api = api.clone();
        async move {
            let path = format!("/v1/actors/jscount/{id}");
            api.req(Method::POST, &path, Some(("application/json", body)), &[])
                .await
        }
    };
    let r = nested("never", 100_000).await;
    assert_eq!((r.status, r.code()), (400, "invalid_json"), "{}", r.json);
    assert!(
        r.json["error"]["message"]
            .as_str()
            .unwrap()
            .contains("deeper than 10000 levels"),
        "{}",
        r.json
    );
    assert_eq!(api.get("/v1/actors/jscount/never").await.status, 404);
    let r = nested("deep", 10_000).await;
    assert_eq!(r.status, 200, "{}", r.json);
    // What another node passes on for a turn is taken as a turn on this
    // node would send it: queued, and the turn reads it.
    let r = api
        .req(
            Method::POST,
            "/v1/actors/jscount/relayed?wait=false",
            Some(("application/json", b"{bad json".to_vec())),
            &[("x-marmot-from-actor", "1")],
        )
        .await;
    assert_eq!(r.status, 202, "{}", r.json);

    // A module no turn could run is refused at deploy, saying why, and
    // nothing is deployed: no default export, one that is not an object,
    // one without a handler, a top level that throws.
    for (source, says) in [
        ("export const x = 1;", "export default"),
        ("export default 5;", "export default"),
        (
            "export default { onmessage() {}, handlers: {} };",
            "none of the handlers onMessage",
        ),
        (
            "throw new TypeError('no config'); export default { onMessage() {} };",
            "TypeError: no config",
        ),
        // It read as "none of the handlers".
        (
            "export default { onMessage: 5 };",
            "`onMessage` of the default export must be a function, not a number",
        ),
        (
            "export default { get onMessage() { throw new RangeError('lazy'); } };",
            "reading `onMessage` of the default export threw: RangeError: lazy",
        ),
        // It read as a module that used timers, deployed, and every turn
        // then failed.
        (
            "await new Promise(() => {}); export default { onMessage() { return 1; } };",
            "the module's top level never settles",
        ),
    ] {
        let r = api.deploy_js("empty", source).await;
        assert_eq!(r.status, 400, "{source}: {}", r.json);
        assert_eq!(r.json["error"]["code"], "invalid_code", "{}", r.json);
        let message = r.json["error"]["message"].as_str().unwrap();
        assert!(message.contains(says), "{source}: {message}");
        assert_eq!(api.get("/v1/types/empty").await.status, 404, "{source}");
    }
    // Any one handler will do, own or inherited.
    for source in [
        "export default { onAlarm() {} };",
        "class A { onWebhook() {} }\nexport default new A();",
    ] {
        let r = api.deploy_js("onlyone", source).await;
        assert!(r.status == 201 || r.status == 200, "{source}: {}", r.json);
    }
    // The actor still serves.
    assert_eq!(
        api.post_json("/v1/actors/jscount/a", &json!({"by": 1}))
            .await
            .json["n"],
        4
    );
}

/// Guarantee 2 for JavaScript actors: a turn that writes state, emits an
/// event, sets and cancels alarms, requests an input, sends to another
/// actor and writes a file, then throws, commits none of it.
#[tokio::test]
async fn a_javascript_turn_that_throws_commits_none_of_its_effects() {
    let (_dir, _m, api) = node(None).await;
    let js = r#"
import { state, events, alarms, inputs, actors, files } from "marmot";
export default {
  onMessage(body) {
    if (body.op === "setup") {
      state.set("n", 1);
      alarms.set("kept", { after: 60000 });
      return "ok";
    }
    if (body.op === "count") {
      state.set("got", (state.get("got") ?? 0) + 1);
      return state.get("got");
    }
    state.set("n", 2);
    state.set("extra", true);
    events.emit("happened", { n: 2 });
    alarms.set("soon", { after: 50 });
    alarms.cancel("kept");
    inputs.request({ kind: "question", prompt: "Sure?" });
    actors.send("atomic", "other", { op: "count" });
    files.write("notes/draft.md", "never");
    if (body.op === "throw") throw new Error("changed my mind");
    return "done";
  },
  onInput() {},
  onAlarm() {},
};
"#;
    let r = api.deploy_js("atomic", js).await;
    assert_eq!(r.status, 201, "{}", r.json);
    let r = api.op("atomic", "a", json!({"op": "setup"})).await;
    assert_eq!(r.status, 200, "{}", r.json);

    let r = api.op("atomic", "a", json!({"op": "throw"})).await;
    assert_eq!(r.status, 500, "{}", r.json);
    assert_eq!(r.code(), "actor_error");
    assert!(
        r.json["error"]["message"]
            .as_str()
            .unwrap()
            .contains("changed my mind"),
        "{}",
        r.json
    );
    tokio::time::sleep(Duration::from_millis(500)).await;
    assert_eq!(api.get("/v1/actors/atomic/a/state/n").await.json, 1);
    assert_eq!(api.get("/v1/actors/atomic/a/state/extra").await.status, 404);
    let events = api.get("/v1/actors/atomic/a/events").await.json;
    assert_eq!(events["events"], json!([]), "{events}");
    let alarms = api.get("/v1/actors/atomic/a/alarms").await.json;
    let names: Vec<&str> = alarms["alarms"]
        .as_array()
        .unwrap()
        .iter()
        .map(|a| a["name"].as_str().unwrap())
        .collect();
    assert_eq!(names, ["kept"], "{alarms}");
    let pending = api
        .get("/v1/actors/atomic/a/inputs?status=pending")
        .await
        .json;
    assert_eq!(pending["inputs"], json!([]), "{pending}");
    let listed = api.get("/v1/actors/atomic/a/files").await;
    assert_eq!(listed.status, 200, "{}", listed.json);
    assert_eq!(listed.json["files"], json!([]), "{}", listed.json);
    assert_eq!(api.get("/v1/actors/atomic/other").await.status, 404);

    // The same turn without the throw commits all of it.
    let r = api.op("atomic", "a", json!({"op": "all"})).await;
    assert_eq!(r.status, 200, "{}", r.json);
    assert_eq!(api.get("/v1/actors/atomic/a/state/n").await.json, 2);
    let events = api.get("/v1/actors/atomic/a/events").await.json;
    assert_eq!(
        event_kinds(&events),
        ["happened", "input_requested"],
        "{events}"
    );
    let pending = api
        .get("/v1/actors/atomic/a/inputs?status=pending")
        .await
        .json;
    assert_eq!(pending["inputs"].as_array().unwrap().len(), 1, "{pending}");
    let listed = api.get("/v1/actors/atomic/a/files").await.json;
    assert_eq!(listed["files"].as_array().unwrap().len(), 1, "{listed}");
    let deadline = Instant::now() + Duration::from_secs(20);
    while api.get("/v1/actors/atomic/other/state/got").await.json != 1 {
        assert!(Instant::now() < deadline, "the send never arrived");
        tokio::time::sleep(Duration::from_millis(25)).await;
    }
}

#[tokio::test]
async fn javascript_actors_hibernate_wake_and_upgrade() {
    let (_dir, _m, api) = node(None).await;
    let manifest = json!({"kind": "js", "code": COUNTER_JS, "config": {"idle_timeout_ms": 300}});
    let r = api.deploy_manifest("jscount", &manifest).await;
    assert_eq!(r.status, 201, "{}", r.json);
    api.post_json("/v1/actors/jscount/s", &json!({"by": 4}))
        .await;
    api.wait_info("jscount", "s", "hibernation", |i| {
        i["status"] == "hibernated"
    })
    .await;
    let r = api
        .post_json("/v1/actors/jscount/s", &json!({"by": 1}))
        .await;
    assert_eq!(r.json["n"], 5, "state survives hibernation");

    let v2 = COUNTER_JS.replace("version: ctx.version", "version: ctx.version, v2: true");
    let manifest = json!({"kind": "js", "code": v2, "config": {"idle_timeout_ms": 300}});
    api.deploy_manifest("jscount", &manifest).await;
    let r = api
        .post_json("/v1/actors/jscount/s", &json!({"by": 1}))
        .await;
    assert_eq!(r.json["v2"], true);
    assert_eq!(r.json["version"], 2);
    assert_eq!(
        api.get("/v1/actors/jscount/s/state/upgrades").await.json,
        json!([1])
    );
}

/// An eval on an actor that slept through a deploy runs the upgrade
/// first, then the script on the new version with the type's new config:
/// it ran on the old version, reaching hosts a deploy had revoked and
/// writing old-shaped state under a later `onUpgrade` (found by a probe).
#[tokio::test]
async fn an_eval_upgrades_the_actor_first() {
    let (_dir, _m, api) = node(None).await;
    assert_eq!(api.deploy_js("jscount", COUNTER_JS).await.status, 201);
    let r = api.post_json("/v1/actors/jscount/e", &json!({})).await;
    assert_eq!(r.json["version"], 1, "{}", r.json);
    let manifest = json!({"kind": "js", "code": COUNTER_JS, "config": {"env": {"V": "2"}}});
    assert_eq!(api.deploy_manifest("jscount", &manifest).await.status, 201);
    let r = eval(&api, "jscount", "e", "marmot.state.get('upgrades')").await;
    assert_eq!(r.status, 200, "{}", r.json);
    assert_eq!(r.json["result"], json!([1]), "{}", r.json);
    let info = api.get("/v1/actors/jscount/e").await.json;
    assert_eq!(info["version"], 2, "{info}");
}

/// An alarm whose own delivery brings in a new version fires as that
/// version's `onUpgrade` left it: cancelled there, it neither fires nor
/// comes back. (It fired as read before the upgrade, and its commit wrote
/// the cancelled alarm back: a periodic one fired for good, and an agent's
/// removed schedule kept running.)
#[tokio::test]
async fn an_alarm_cancelled_by_the_upgrade_it_brings_stays_cancelled() {
    let (_dir, _m, api) = node(None).await;
    let v1 = r#"
import { events, alarms } from "marmot";
export default {
  onMessage() {
    alarms.set("tick", { cron: "* * * * * *" });
    alarms.set("once", { after: 1500 });
    return "set";
  },
  onAlarm(a) { events.emit("fired", { name: a.name }); },
};
"#;
    let v2 = v1.replace(
        "export default {",
        "export default {\n  onUpgrade(from) { alarms.cancel(\"tick\"); alarms.cancel(\"once\"); \
         events.emit(\"upgraded\", { from }); },",
    );
    assert_eq!(api.deploy_js("upal", v1).await.status, 201);
    assert_eq!(
        api.post_json("/v1/actors/upal/a", &json!({})).await.status,
        200
    );
    // No message from here on: an alarm wakes the actor into version 2.
    assert_eq!(api.deploy_js("upal", &v2).await.status, 201);
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        let kinds = event_kinds(&api.get("/v1/actors/upal/a/events").await.json);
        if kinds.iter().any(|k| k == "upgraded") {
            break;
        }
        assert!(Instant::now() < deadline, "no upgrade: {kinds:?}");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    tokio::time::sleep(Duration::from_millis(2500)).await;
    let kinds = event_kinds(&api.get("/v1/actors/upal/a/events").await.json);
    let after: Vec<&String> = kinds.iter().skip_while(|k| *k != "upgraded").collect();
    assert_eq!(after, ["upgraded"], "{kinds:?}");
    let alarms = api.get("/v1/actors/upal/a/alarms").await.json;
    assert_eq!(alarms["alarms"], json!([]), "{alarms}");
}

/// A queued message whose actor's upgrade fails waits for a version whose
/// upgrade works, then runs (it was failed and dropped, though its
/// handler never ran): as soon as that version is deployed (it waited out
/// its back-off, up to 30 s), and before any message sent after it (one
/// sent right after the fix ran first, and ran the upgrade: a probe).
#[tokio::test]
async fn a_queued_message_waits_out_a_failing_upgrade() {
    let (_dir, _m, api) = node(None).await;
    let v1 = r#"
import { state } from "marmot";
export default {
  onMessage(body) {
    const log = state.get("log") ?? [];
    log.push(body);
    state.set("log", log);
    return log;
  },
};
"#;
    let broken = v1.replace(
        "export default {",
        "export default {\n  onUpgrade() { throw new Error(\"bad deploy\"); },",
    );
    let fixed = v1.replace("export default {", "export default {\n  onUpgrade() {},");
    assert_eq!(api.deploy_js("upq", v1).await.status, 201);
    assert_eq!(
        api.post_json("/v1/actors/upq/a", &json!("m1")).await.status,
        200
    );
    assert_eq!(api.deploy_js("upq", &broken).await.status, 201);
    let r = api
        .post_json("/v1/actors/upq/a?wait=false", &json!("m2"))
        .await;
    assert_eq!(r.status, 202, "{}", r.json);
    // Its retries back off (0.2 s, doubling: at ~6.2 s, then ~12.6 s),
    // so the fix below lands well between two.
    tokio::time::sleep(Duration::from_millis(6500)).await;
    assert_eq!(
        api.get("/v1/actors/upq/a/state/log").await.json,
        json!(["m1"])
    );
    assert_eq!(api.deploy_js("upq", &fixed).await.status, 201);
    let fixed_at = Instant::now();
    loop {
        let log = api.get("/v1/actors/upq/a/state/log").await.json;
        if log == json!(["m1", "m2"]) {
            break;
        }
        assert!(
            fixed_at.elapsed() < Duration::from_millis(2000),
            "m2 did not run once fixed: {log}"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    // Again, with a message sent right after the fix: it runs second.
    assert_eq!(api.deploy_js("upq", &broken).await.status, 201);
    let r = api
        .post_json("/v1/actors/upq/a?wait=false", &json!("m3"))
        .await;
    assert_eq!(r.status, 202, "{}", r.json);
    tokio::time::sleep(Duration::from_millis(500)).await;
    assert_eq!(api.deploy_js("upq", v1).await.status, 201);
    let r = api.post_json("/v1/actors/upq/a", &json!("m4")).await;
    assert_eq!(r.status, 200, "{}", r.json);
    assert_eq!(r.json, json!(["m1", "m2", "m3", "m4"]));
}

/// Queued messages waiting for a version whose upgrade works back off
/// (0.2 s, doubling), also when their actor's idle timeout is shorter:
/// woken by each retry, a new activation started over at 0.2 s, and the
/// broken upgrade ran every ~1.4 s for good (found by a re-probe).
#[tokio::test]
async fn a_failing_upgrade_backs_off_past_the_idle_timeout() {
    let (_dir, m, api) = node(None).await;
    let v1 = "export default { onMessage() { return 1; } };";
    let broken = "export default { onUpgrade() { throw new Error(\"bad deploy\"); }, onMessage() { return 2; } };";
    let manifest =
        |code: &str| json!({"kind": "js", "code": code, "config": {"idle_timeout_ms": 300}});
    assert_eq!(api.deploy_manifest("upb", &manifest(v1)).await.status, 201);
    assert_eq!(
        api.post_json("/v1/actors/upb/a", &json!({})).await.status,
        200
    );
    assert_eq!(
        api.deploy_manifest("upb", &manifest(broken)).await.status,
        201
    );
    let failed = || async {
        let text = String::from_utf8(api.get("/metrics").await.body).unwrap();
        let name = "marmot_turns_total{kind=\"upgrade\",outcome=\"error\"}";
        common::sample(&text, name).unwrap_or(0.0)
    };
    // The node's CPU time (user and system), in seconds.
    let cpu = || {
        let stat = std::fs::read_to_string(format!("/proc/{}/stat", m.pid().unwrap())).unwrap();
        let fields: Vec<&str> = stat
            .rsplit(')')
            .next()
            .unwrap()
            .split_whitespace()
            .collect();
        let ticks: f64 = fields[11].parse::<f64>().unwrap() + fields[12].parse::<f64>().unwrap();
        ticks / 100.0
    };
    let before = failed().await;
    let r = api
        .post_json("/v1/actors/upb/a?wait=false", &json!({}))
        .await;
    assert_eq!(r.status, 202, "{}", r.json);
    let cpu_before = cpu();
    tokio::time::sleep(Duration::from_secs(8)).await;
    // At 0, 0.2, 0.6, 1.4, 3.0 and 6.2 s.
    let tries = failed().await - before;
    assert!((3.0..=7.0).contains(&tries), "{tries} upgrades in 8 s");
    // And it waits in between: kept awake, it spun on its idle deadline
    // (a core's worth: a re-probe).
    let burned = cpu() - cpu_before;
    assert!(burned < 3.0, "{burned} s of CPU in 8 s");
}

#[tokio::test]
async fn more_javascript_actors_than_sandboxes_take_turns_by_making_room() {
    // Sixteen sandboxes (the smallest pool) for forty busy actors: the
    // least recently used idle ones hibernate to make way instead of callers
    // getting 503s.
    let (_dir, _m, api) = node(Some("[limits]\nmax_js_sandboxes = 16\n")).await;
    assert_eq!(api.deploy_js("jscount", COUNTER_JS).await.status, 201);
    for round in 1..=3 {
        let mut calls = Vec::new();
        for i in 0..40 {
            let api = api.clone();
            calls.push(tokio::spawn(async move {
                api.post_json(&format!("/v1/actors/jscount/a{i}"), &json!({"by": 1}))
                    .await
            }));
        }
        for c in calls {
            let r = c.await.unwrap();
            assert_eq!(r.status, 200, "{}", r.json);
            assert_eq!(r.json["n"], round, "{}", r.json);
        }
    }
    // Evals take a sandbox of the same pool.
    let r = eval(&api, "jscount", "a0", "marmot.state.get('n')").await;
    assert_eq!(r.json["result"], 3, "{}", r.json);
    let metrics = String::from_utf8(api.get("/metrics").await.body).unwrap();
    let hibernations = metric(&metrics, "marmot_hibernations_total");
    assert!(hibernations >= 24.0, "actors made room: {hibernations}");
}

/// A deploy while every JavaScript sandbox is in a turn is a 503 to retry
/// (nothing is deployed), not a 400 saying the code is wrong; once the
/// turns are over, idle actors make way for it as for a waking actor.
#[tokio::test]
async fn a_deploy_while_every_sandbox_is_busy_is_told_to_retry() {
    let (_dir, _m, api) = node(Some("[limits]\nmax_js_sandboxes = 16\n")).await;
    let nap =
        "export default { async onMessage() { await new Promise((r) => setTimeout(r, 4000)); } };";
    assert_eq!(api.deploy_js("nap", nap).await.status, 201);
    let busy: Vec<_> = (0..16)
        .map(|i| {
            let api = api.clone();
            tokio::spawn(async move {
                api.post_json(&format!("/v1/actors/nap/n{i}"), &json!({}))
                    .await
            })
        })
        .collect();
    tokio::time::sleep(Duration::from_millis(700)).await;
    let r = api.deploy_js("later", COUNTER_JS).await;
    assert_eq!((r.status, r.code()), (503, "overloaded"), "{}", r.json);
    assert!(r.headers.contains_key("retry-after"));
    assert_eq!(api.get("/v1/types/later").await.status, 404);
    for b in busy {
        assert_eq!(b.await.unwrap().status, 200);
    }
    assert_eq!(api.deploy_js("later", COUNTER_JS).await.status, 201);
}

#[tokio::test]
async fn globals_async_timers_encoding_and_randomness() {
    let (_dir, _m, api) = node(None).await;
    let src = r#"
export default {
  async onMessage(body) {
    const order = [];
    await new Promise((r) => setTimeout(() => { order.push("timer"); r(); }, 20));
    await Promise.resolve().then(() => order.push("micro"));
    const id = setTimeout(() => order.push("cancelled"), 5);
    clearTimeout(id);
    const bytes = new TextEncoder().encode("héllo ✓");
    const back = new TextDecoder().decode(bytes);
    let fatal = null;
    try { new TextDecoder("utf-8", { fatal: true }).decode(new Uint8Array([0xff])); } catch (e) { fatal = e.name; }
    const rnd = crypto.getRandomValues(new Uint8Array(16));
    const u = new URL("../x?a=1&b=two words#frag", "https://user:pw@example.com:8080/p/q/r");
    u.searchParams.append("c", "ä&");
    const url = { href: u.href, origin: u.origin, b: u.searchParams.get("b"),
      form: new URLSearchParams({ x: "1 2" }).toString(), bad: URL.canParse("not a url") };
    return {
      order, len: bytes.length, back, fatal,
      random: Array.from(rnd).some((b) => b !== 0),
      math: Math.random(),
      now: Date.now() > 1.7e12,
      wasm: typeof WebAssembly, sab: typeof SharedArrayBuffer, url,
    };
  },
};
"#;
    assert_eq!(api.deploy_js("g", src).await.status, 201);
    let a = api.op("g", "a", json!({})).await;
    assert_eq!(a.status, 200, "{}", a.json);
    assert_eq!(a.json["order"], json!(["timer", "micro"]));
    assert_eq!(a.json["len"], 10);
    assert_eq!(a.json["back"], "héllo ✓");
    assert_eq!(a.json["fatal"], "TypeError");
    assert_eq!(a.json["random"], true);
    assert_eq!(a.json["now"], true);
    assert_eq!(a.json["wasm"], "undefined");
    assert_eq!(a.json["sab"], "undefined");
    assert_eq!(
        a.json["url"],
        json!({
            "href": "https://user:pw@example.com:8080/p/x?a=1&b=two+words&c=%C3%A4%26#frag",
            "origin": "https://example.com:8080",
            "b": "two words",
            "form": "x=1+2",
            "bad": false,
        })
    );
    // Sandboxes start from one snapshot but must not share a random sequence.
    let b = api.op("g", "b", json!({})).await;
    assert_ne!(a.json["math"], b.json["math"]);
}

/// A script stopped by a limit (CPU, memory) still returns what it wrote
/// with `console` until then: the lines it logged before a runaway loop
/// are what says where it went wrong. They were lost (`"logs": []`): the
/// sandbox that kept them was discarded with the trap.
#[tokio::test]
async fn an_eval_stopped_by_a_limit_keeps_its_logs() {
    let config = "[limits]\neval_cpu_ms = 300\neval_memory_bytes = 16777216\n";
    let (_dir, _m, api) = node(Some(config)).await;
    api.deploy_js("jscount", COUNTER_JS).await;
    api.post_json("/v1/actors/jscount/l", &json!({"by": 1}))
        .await;
    for (code, limit) in [
        (
            "for (let i = 0; i < 3; i++) console.log('step', i, 'of\\nthree');\n\
             console.error('a \\\\ backslash'); for (;;) {}",
            "CPU limit",
        ),
        (
            "console.log('filling'); const a = []; for (;;) a.push(new Array(1e5).fill(1.5))",
            "memory",
        ),
    ] {
        let r = eval(&api, "jscount", "l", code).await;
        assert_eq!(r.status, 200, "{}", r.json);
        let e = r.json["error"].as_str().unwrap_or_default();
        assert!(e.contains(limit), "{code}: {}", r.json);
        let want = if limit == "memory" {
            json!(["filling"])
        } else {
            json!([
                "step 0 of\nthree",
                "step 1 of\nthree",
                "step 2 of\nthree",
                "a \\ backslash"
            ])
        };
        assert_eq!(r.json["logs"], want, "{code}");
    }
    // A script that ends well has its logs once (not also from the echo).
    let r = eval(&api, "jscount", "l", "console.log('once'); 1").await;
    assert_eq!(r.json["logs"], json!(["once"]), "{}", r.json);
}

#[tokio::test]
async fn eval_runs_scripts_bound_to_the_actor_and_commits_only_on_success() {
    let (_dir, _m, api) = node(None).await;
    api.deploy_js("jscount", COUNTER_JS).await;
    api.post_json("/v1/actors/jscount/e", &json!({"by": 10}))
        .await;

    let r = eval(
        &api,
        "jscount",
        "e",
        "console.log('n is', marmot.state.get('n'));\n\
         marmot.state.set('n', marmot.state.get('n') * 2);\n\
         await new Promise((r) => setTimeout(r, 10));\n\
         ({ doubled: marmot.state.get('n') })",
    )
    .await;
    assert_eq!(r.status, 200, "{}", r.json);
    assert_eq!(r.json["result"], json!({"doubled": 20}));
    assert_eq!(r.json["logs"], json!(["n is 10"]));
    assert!(r.json["error"].is_null());
    assert_eq!(
        api.get("/v1/actors/jscount/e/state/n").await.json,
        20,
        "a successful eval commits"
    );

    let r = eval(
        &api,
        "jscount",
        "e",
        "marmot.state.set('n', 0); throw new TypeError('no')",
    )
    .await;
    assert_eq!(r.status, 200);
    assert!(r.json["result"].is_null());
    assert!(
        r.json["error"]
            .as_str()
            .unwrap()
            .starts_with("TypeError: no"),
        "{}",
        r.json
    );
    assert_eq!(
        api.get("/v1/actors/jscount/e/state/n").await.json,
        20,
        "a failed eval commits nothing"
    );

    let r = eval(&api, "jscount", "e", "({ f() {} }).f").await;
    assert!(
        r.json["error"]
            .as_str()
            .unwrap()
            .contains("not JSON-serializable"),
        "{}",
        r.json
    );
    let r = eval(&api, "jscount", "e", "1 +").await;
    assert!(
        r.json["error"].as_str().unwrap().contains("SyntaxError"),
        "{}",
        r.json
    );
    // JSON body form; eval works on Rust actors' state too.
    api.deploy("kit", common::TESTKIT, json!({})).await;
    api.add("kit", "r", 3).await;
    let r = api
        .post_json(
            "/v1/actors/kit/r/eval",
            &json!({"code": "marmot.state.get('n') + 1"}),
        )
        .await;
    assert_eq!(r.json["result"], 4);
    // The API surface matches guest-sdk/ts/marmot.d.ts.
    let r = eval(
        &api,
        "kit",
        "r",
        "Object.fromEntries(Object.entries(marmot).map(([k, v]) => [k, Object.keys(v).sort()]))",
    )
    .await;
    assert_eq!(
        r.json["result"],
        json!({
            "state": ["delete", "get", "list", "set"],
            "events": ["emit"],
            "alarms": ["cancel", "list", "set"],
            "inputs": ["cancel", "request"],
            "actors": ["call", "callResponse", "send"],
            "files": ["delete", "list", "read", "readBytes", "write"],
            "model": ["chat"],
            "log": ["debug", "error", "info", "warn"],
        })
    );
    // Bad requests.
    let r = api
        .post_json("/v1/actors/kit/r/eval", &json!({"nope": 1}))
        .await;
    assert_eq!(r.code(), "invalid_body");
    assert_eq!(eval(&api, "nope", "r", "1").await.code(), "unknown_type");
}

/// The `js` capability: a Rust actor runs model-written JavaScript in a
/// child sandbox with its own limits and only the capabilities it passes
/// on; what the script writes joins the caller's turn, or nothing does.
#[tokio::test]
async fn rust_actors_run_scripts_in_child_sandboxes() {
    let (_dir, _m, api) = common::kit_node(json!({})).await;
    let eval = |code: &str, tools: Value, extra: Value| {
        let mut op = json!({ "op": "js_eval", "code": code, "tools": tools });
        for (k, v) in extra.as_object().unwrap() {
            op[k] = v.clone();
        }
        op
    };
    let r = api
        .op(
            "kit",
            "a",
            eval("console.log('hi'); 1 + 2", json!([]), json!({})),
        )
        .await;
    assert_eq!(r.status, 200, "{}", r.json);
    assert_eq!(r.json["result"], 3, "{}", r.json);
    assert_eq!(r.json["logs"], json!(["hi"]));

    // Passed on: the script writes the caller's state, committed with its
    // turn.
    let r = api
        .op(
            "kit",
            "a",
            eval(
                "marmot.state.set('k', 41 + 1); 'done'",
                json!(["state"]),
                json!({}),
            ),
        )
        .await;
    assert_eq!(r.json["result"], "done", "{}", r.json);
    assert_eq!(
        api.get("/v1/actors/kit/a/state/k").await.json,
        json!(42),
        "the script's write did not commit"
    );

    // A script that throws leaves nothing; nor does a caller's turn that
    // fails after a script succeeded.
    let r = api
        .op(
            "kit",
            "a",
            eval(
                "marmot.state.set('k', 0); throw new Error('nope')",
                json!(["state"]),
                json!({}),
            ),
        )
        .await;
    assert!(
        r.json["error"].as_str().unwrap().contains("nope"),
        "{}",
        r.json
    );
    let r = api
        .op(
            "kit",
            "a",
            eval(
                "marmot.state.set('k', 1)",
                json!(["state"]),
                json!({ "fail": true }),
            ),
        )
        .await;
    assert_eq!(r.status, 500);
    assert_eq!(api.get("/v1/actors/kit/a/state/k").await.json, json!(42));

    // Not passed on: refused, and nothing written.
    let r = api
        .op(
            "kit",
            "a",
            eval("marmot.state.set('k', 7)", json!([]), json!({})),
        )
        .await;
    assert!(
        r.json["error"]
            .as_str()
            .unwrap()
            .contains("`state` is not granted"),
        "{}",
        r.json
    );
    assert_eq!(api.get("/v1/actors/kit/a/state/k").await.json, json!(42));
    for (tools, want) in [
        (json!(["js"]), "scripts do not start scripts"),
        (json!(["teleport"]), "unknown tool `teleport`"),
    ] {
        let r = api.op("kit", "a", eval("1", tools, json!({}))).await;
        assert!(
            r.json["host_error"].as_str().unwrap().contains(want),
            "{}",
            r.json
        );
    }

    // Its own limits: a runaway script ends with an error naming the limit,
    // with what it logged until then, and the caller carries on.
    let started = Instant::now();
    let r = api
        .op(
            "kit",
            "a",
            eval(
                "console.log('looping'); while (true) {}",
                json!([]),
                json!({ "timeout_ms": 300 }),
            ),
        )
        .await;
    let e = r.json["error"].as_str().unwrap();
    assert!(
        e.contains("CPU limit") || e.contains("time limit of 300 ms"),
        "{e}"
    );
    assert_eq!(r.json["logs"], json!(["looping"]), "{}", r.json);
    assert!(started.elapsed() < Duration::from_secs(10));
    let r = api
        .op(
            "kit",
            "a",
            eval(
                "const a = []; for (;;) a.push(new Array(1e6).fill(1));",
                json!([]),
                json!({}),
            ),
        )
        .await;
    assert!(
        r.json["error"].as_str().unwrap().contains("memory"),
        "{}",
        r.json
    );
    let r = api.op("kit", "a", json!({ "op": "get", "key": "k" })).await;
    assert_eq!(r.status, 200, "the caller is still serving: {}", r.json);
}

/// Host calls with random arguments, as model-written code makes them: a
/// seeded generator picks capability functions and hostile values (wrong
/// types, huge and deep values, traversal paths, bad cron strings and
/// zones, unknown types and providers, functions, typed arrays). Every
/// turn must end with the guest's own reply or a clean error, the node must
/// log no panic, and stay healthy and consistent afterwards. (Messages to
/// other fuzz actors stop at once: two actors calling each other from
/// different chains wait out `actor_call_timeout_ms`, by design.)
/// A type version's module is evaluated once, when the node prepares it, and
/// every sandbox of the version starts from that evaluated module (its own
/// copy). A module whose top level draws random numbers, sets timers, calls
/// the `marmot` API or runs away is evaluated by each sandbox's first turn
/// instead, as if nothing had been preloaded.
#[tokio::test]
async fn module_top_level_is_preloaded_once_per_type_version_unless_it_needs_a_turn() {
    let (_dir, mut m, api) = node(None).await;
    let pure = r#"
const loadedAt = Date.now();
const squares = Array.from({ length: 100 }, (_, i) => i * i);
let hits = 0;
export default {
  onMessage() {
    hits += 1;
    return { loadedAt, now: Date.now(), hits, sum: squares.reduce((a, b) => a + b) };
  },
};
"#;
    assert_eq!(api.deploy_js("pure", pure).await.status, 201);
    tokio::time::sleep(Duration::from_millis(300)).await;
    let a = api.op("pure", "a", json!({})).await;
    assert_eq!(a.status, 200, "{}", a.json);
    let (loaded, now) = (
        a.json["loadedAt"].as_f64().unwrap(),
        a.json["now"].as_f64().unwrap(),
    );
    assert!(
        now - loaded >= 300.0,
        "the top level ran at deploy, not in the first turn: {}",
        a.json
    );
    assert_eq!(a.json["sum"], 328_350);
    let loaded_at = a.json["loadedAt"].clone();
    assert_eq!(a.json["hits"], 1);
    assert_eq!(api.op("pure", "a", json!({})).await.json["hits"], 2);
    // Another actor starts from the module as evaluated, not from a's copy.
    let b = api.op("pure", "b", json!({})).await;
    assert_eq!(
        (b.json["hits"].clone(), b.json["loadedAt"].clone()),
        (json!(1), a.json["loadedAt"].clone())
    );

    let random = r#"
const salt = Math.random();
const bytes = Array.from(crypto.getRandomValues(new Uint8Array(8)));
export default { onMessage() { return { salt, bytes }; } };
"#;
    let api_call = r#"
import { state } from "marmot";
const before = state.get("n") ?? "none";
export default { onMessage() { return { before }; } };
"#;
    let timers = r#"
let fired = false;
setTimeout(() => { fired = true; }, 0);
export default { async onMessage() { await new Promise((r) => setTimeout(r, 5)); return { fired }; } };
"#;
    let logs = r#"
console.log("loading");
export default { onMessage() { return { ok: true }; } };
"#;
    // Caught, the refusal still refuses the preload: the top level would
    // not have drawn the same number in every sandbox.
    let caught = r#"
let drawn = "no";
try { Math.random(); drawn = "yes"; } catch (e) { drawn = "refused"; }
export default { onMessage() { return { drawn }; } };
"#;
    for (ty, src) in [
        ("random", random),
        ("apicall", api_call),
        ("timers", timers),
        ("logs", logs),
        ("caught", caught),
    ] {
        assert_eq!(api.deploy_js(ty, src).await.status, 201, "{ty}");
    }
    // Nor can a type's own environment switch the deploy's check of a top
    // level on for its snapshot: it would freeze one draw for every actor.
    let manifest = json!({"kind": "js", "code": format!("// env\n{random}"),
                          "config": {"env": {"MARMOT_PRELOAD_CHECK": "1"}}});
    assert_eq!(
        api.deploy_manifest("randomenv", &manifest).await.status,
        201
    );
    // Two actors of `ty`: each sandbox draws its own numbers.
    let draws = |ty: &'static str| {
        let api = &api;
        async move {
            let (a, b) = (
                api.op(ty, "a", json!({})).await,
                api.op(ty, "b", json!({})).await,
            );
            assert_eq!(a.status, 200, "{ty}: {}", a.json);
            assert_ne!(a.json["salt"], b.json["salt"], "{ty}: one draw for both");
            assert_ne!(a.json["bytes"], b.json["bytes"], "{ty}: one draw for both");
        }
    };
    draws("randomenv").await;
    draws("random").await;
    assert_eq!(
        api.op("apicall", "a", json!({})).await.json,
        json!({"before": "none"})
    );
    assert_eq!(
        api.op("timers", "a", json!({})).await.json,
        json!({"fired": true})
    );
    assert_eq!(
        api.op("logs", "a", json!({})).await.json,
        json!({"ok": true})
    );
    assert_eq!(
        api.op("caught", "a", json!({})).await.json,
        json!({"drawn": "yes"})
    );
    // A top level that throws on its own would throw in every sandbox: the
    // deploy says so instead of every turn.
    let throws = r#"
if (globalThis.marmotNeverDefinesThis === undefined) throw new Error("top level failed");
export default { onMessage() { return 1; } };
"#;
    let r = api.deploy_js("throws", throws).await;
    assert_eq!(r.status, 400, "{}", r.json);
    assert!(
        r.json["error"]["message"]
            .as_str()
            .unwrap()
            .contains("Error: top level failed"),
        "{}",
        r.json
    );

    // So does one that first draws a random number or reads the clock,
    // which no snapshot may freeze: the deploy runs it once more with
    // those allowed (it used to be deployed, and every actor's first turn
    // failed with `upgrade_failed`). Its own source in every run, as the
    // reason a preload was refused is cached by source.
    let stamp = format!("{:?}", std::time::SystemTime::now());
    let random_then_throws = format!(
        "// {stamp}\nconst session = Math.random();\nnull.x;\nexport default {{ onMessage() {{ return session; }} }};"
    );
    let r = api.deploy_js("randomthrows", &random_then_throws).await;
    assert_eq!(r.status, 400, "{}", r.json);
    assert!(
        r.json.to_string().contains("cannot read property"),
        "{}",
        r.json
    );
    assert_eq!(api.get("/v1/types/randomthrows").await.status, 404);
    let clock_then_spins =
        format!("// {stamp}\nconst t = Date.now();\nfor (;;) {{}}\nexport default {{}};");
    let manifest = json!({"kind": "js", "code": clock_then_spins, "config": {"cpu_slice_ms": 100}});
    let r = api.deploy_manifest("clockspins", &manifest).await;
    assert_eq!(r.status, 400, "{}", r.json);
    assert!(r.json.to_string().contains("CPU slice"), "{}", r.json);

    // A runaway top level costs the deploy its CPU slice, once, and is
    // refused: every sandbox's first turn would run out of it the same way
    // (it used to be deployed, and every first turn burnt its slice).
    // (Its own source in every run: the code cache is shared between runs.)
    let runaway = format!(
        "// {:?}\nfor (;;) {{}}\nexport default {{}};",
        std::time::SystemTime::now()
    );
    let manifest = json!({"kind": "js", "code": runaway, "config": {"cpu_slice_ms": 100}});
    let since = std::time::SystemTime::now();
    let started = Instant::now();
    let r = api.deploy_manifest("runaway", &manifest).await;
    assert_eq!(r.status, 400, "{}", r.json);
    assert!(
        r.json["error"]["message"]
            .as_str()
            .unwrap()
            .contains("does not finish within the type's CPU slice"),
        "{}",
        r.json
    );
    assert!(!r.json.to_string().contains("backtrace"), "{}", r.json);
    assert!(
        started.elapsed() < Duration::from_secs(10),
        "{:?}",
        started.elapsed()
    );
    assert_eq!(api.get("/v1/types/runaway").await.status, 404);
    // Nor does one whose top level outgrows the type's memory.
    let hungry = format!(
        "// {:?}\nconst kept = []; for (;;) kept.push(new Array(4096).fill(kept.length));\n\
         export default {{ onMessage() {{ return kept.length; }} }};",
        std::time::SystemTime::now()
    );
    let manifest = json!({"kind": "js", "code": hungry, "config": {"max_memory_bytes": 16 << 20}});
    let r = api.deploy_manifest("hungry", &manifest).await;
    assert_eq!(r.status, 400, "{}", r.json);
    assert!(r.json.to_string().contains("memory"), "{}", r.json);
    assert_eq!(api.get("/v1/types/hungry").await.status, 404);
    // Preload refusals that would repeat are remembered, in a file holding
    // the reason; running out of CPU is not (a deploy again may fit, after a
    // busy moment), nor is anything a deploy refuses.
    let reasons: Vec<String> = std::fs::read_dir(common::shared_cache_dir())
        .unwrap()
        .map(|e| e.unwrap())
        .filter(|e| e.path().extension().is_some_and(|x| x == "refused"))
        .filter(|e| e.metadata().unwrap().modified().unwrap() >= since)
        .map(|e| std::fs::read_to_string(e.path()).unwrap())
        .collect();
    assert!(
        !reasons.iter().any(|r| r.contains("CPU limit")),
        "{reasons:?}"
    );

    // After a restart the compiled snapshot is loaded, not taken again.
    m.restart().await;
    let c = api.op("pure", "c", json!({})).await;
    assert_eq!(c.status, 200, "{}", c.json);
    assert_eq!(
        (c.json["hits"].clone(), c.json["loadedAt"].clone()),
        (json!(1), loaded_at)
    );
}

/// A timer still pending when its turn ends is dropped: it does not fire in
/// a later turn that waits for timers of its own.
#[tokio::test]
async fn timers_pending_when_a_turn_ends_are_dropped() {
    let (_dir, _m, api) = node(None).await;
    let src = r#"
let fired = 0;
export default {
  async onMessage(body) {
    if (body?.op === "leave") {
      setTimeout(() => { fired += 1; }, 20);
      return fired;
    }
    await new Promise((r) => setTimeout(r, 80));
    return fired;
  },
};
"#;
    assert_eq!(api.deploy_js("late", src).await.status, 201);
    assert_eq!(api.op("late", "a", json!({"op": "leave"})).await.json, 0);
    let r = api.op("late", "a", json!({"op": "wait"})).await;
    assert_eq!(r.status, 200, "{}", r.json);
    assert_eq!(r.json, 0, "the first turn's timer fired in the second");
}

/// `Headers` and `Response` are the standard ones as scripts use them:
/// headers from any iterable of pairs (a generator's were dropped without a
/// word), and `new Response(body, init)` (its arguments were fetch's own).
#[tokio::test]
async fn headers_and_responses_are_built_the_standard_way() {
    let (_dir, _m, api) = node(None).await;
    api.deploy_js("std", COUNTER_JS).await;
    let r = eval(
        &api,
        "std",
        "a",
        "const gen = function* () { yield ['X-A', '1']; yield new Set(['x-b', '2']); };\n\
         const fromGen = [...new Headers(gen())];\n\
         const fromMap = new Headers(new Map([['X-C', '3']])).get('x-c');\n\
         const r = new Response('hi', { status: 201, headers: { 'Content-Type': 'text/plain' } });\n\
         const empty = new Response(null, null);\n\
         let bad = null; try { new Response('x', { status: 99 }); } catch (e) { bad = e.name; }\n\
         ({ fromGen, fromMap, status: r.status, ok: r.ok, type: r.headers.get('content-type'),\n\
            text: await r.text(), bytes: Array.from(await new Response(new Uint8Array([7])).bytes()),\n\
            empty: [empty.status, await empty.text()], bad })",
    )
    .await;
    assert_eq!(r.json["error"], Value::Null, "{}", r.json);
    assert_eq!(
        r.json["result"],
        json!({"fromGen": [["x-a", "1"], ["x-b", "2"]], "fromMap": "3", "status": 201, "ok": true,
               "type": "text/plain", "text": "hi", "bytes": [7], "empty": [200, ""],
               "bad": "RangeError"})
    );

    // A body is read once (a second read gave it again); `clone()` first
    // to read it twice. `TextEncoder.encodeInto` fills what fits, never
    // half a character (it was missing).
    let r = eval(
        &api,
        "std",
        "a",
        "const r = new Response('once', { status: 202 });\n\
         const copy = r.clone();\n\
         const first = await r.text();\n\
         let again = null; try { await r.json(); } catch (e) { again = e.name; }\n\
         const buf = new Uint8Array(5);\n\
         const into = new TextEncoder().encodeInto('aé😀', buf);\n\
         const none = new Response(null, { status: 204 });\n\
         const twice = [await none.text(), await none.text(), none.bodyUsed];\n\
         const cut = '😀'.slice(0, 1);\n\
         const url = new URL('http://a.example/' + cut).pathname;\n\
         const form = new URLSearchParams({ a: cut }).toString();\n\
         ({ first, again, used: r.bodyUsed, copy: [copy.status, copy.bodyUsed, await copy.text()],\n\
            into, buf: Array.from(buf), twice, url, form })",
    )
    .await;
    assert_eq!(r.json["error"], Value::Null, "{}", r.json);
    assert_eq!(
        r.json["result"],
        json!({"first": "once", "again": "TypeError", "used": true,
               "copy": [202, false, "once"],
               "into": {"read": 2, "written": 3}, "buf": [0x61, 0xc3, 0xa9, 0, 0],
               "twice": ["", "", false], "url": "/%EF%BF%BD", "form": "a=%EF%BF%BD"})
    );
}

/// A message queued to a new actor while an eval on it runs is kept,
/// whatever the eval did. (Taking away the actor an eval had made but not
/// written to deleted such messages with it, acknowledged as they were.)
#[tokio::test]
async fn a_message_queued_during_an_eval_on_a_new_actor_is_kept() {
    let (_dir, _m, api) = node(None).await;
    let js = r#"
import { state } from "marmot";
export default { onMessage(b) { state.set("m", b ?? null); return { ok: true }; } };
"#;
    assert_eq!(api.deploy_js("race", js).await.status, 201);
    let slow = {
        let api = api.clone();
        tokio::spawn(async move {
            eval(
                &api,
                "race",
                "x",
                "const t0 = Date.now(); while (Date.now() - t0 < 600) {} marmot.state.get('m') ?? 'none'",
            )
            .await
        })
    };
    tokio::time::sleep(Duration::from_millis(150)).await;
    let r = api
        .post_json("/v1/actors/race/x?wait=false", &json!({"v": 1}))
        .await;
    assert_eq!(r.status, 202, "{}", r.json);
    let e = slow.await.unwrap();
    assert_eq!(e.status, 200, "{}", e.json);
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let m = api.get("/v1/actors/race/x/state/m").await;
        if m.status == 200 {
            assert_eq!(m.json, json!({"v": 1}));
            break;
        }
        assert!(
            Instant::now() < deadline,
            "the acknowledged message was lost: {}",
            m.json
        );
        tokio::time::sleep(Duration::from_millis(25)).await;
    }
}

/// Files hold bytes: a JavaScript actor writes a typed array, a view into
/// one or an ArrayBuffer as its bytes (they used to be stored as JSON, so
/// no PNG or zip artifact could be made) and reads them back with
/// `readBytes`. A path that is not a string is a TypeError (a missing
/// variable used to write a file called `undefined`).
#[tokio::test]
async fn javascript_files_hold_bytes_and_paths_are_strings() {
    let (_dir, _m, api) = node(None).await;
    api.deploy_js("bin", COUNTER_JS).await;
    let r = eval(
        &api,
        "bin",
        "a",
        "const all = new Uint8Array([0, 1, 2, 0xfe, 0xff, 0x80]);\n\
         marmot.files.write('outputs/all.bin', all);\n\
         marmot.files.write('outputs/view.bin', new DataView(all.buffer, 3, 2));\n\
         marmot.files.write('outputs/buf.bin', all.buffer.slice(4));\n\
         marmot.files.write('outputs/words.bin', new Uint16Array([0x0201]));\n\
         const back = marmot.files.readBytes('outputs/all.bin');\n\
         [back instanceof Uint8Array, Array.from(back), marmot.files.read('outputs/view.bin')]",
    )
    .await;
    assert_eq!(r.status, 200, "{}", r.json);
    assert_eq!(r.json["error"], Value::Null, "{}", r.json);
    assert_eq!(
        r.json["result"],
        json!([true, [0, 1, 2, 254, 255, 128], "\u{fffd}\u{fffd}"])
    );
    for (path, bytes) in [
        ("all.bin", &[0u8, 1, 2, 0xfe, 0xff, 0x80][..]),
        ("view.bin", &[0xfe, 0xff]),
        ("buf.bin", &[0xff, 0x80]),
        ("words.bin", &[0x01, 0x02]),
    ] {
        let r = api
            .get(&format!("/v1/actors/bin/a/files/outputs/{path}"))
            .await;
        assert_eq!(r.status, 200, "{path}");
        assert_eq!(&r.body[..], bytes, "{path}");
    }

    for (call, says) in [
        (
            "marmot.files.write(undefined, 'x')",
            "files.write: path must be a string",
        ),
        (
            "marmot.files.read(null)",
            "files.read: path must be a string",
        ),
        (
            "marmot.files.readBytes({})",
            "files.readBytes: path must be a string",
        ),
        (
            "marmot.files.delete(7)",
            "files.delete: path must be a string",
        ),
        (
            "marmot.files.list(null)",
            "files.list: path must be a string",
        ),
    ] {
        let r = eval(
            &api,
            "bin",
            "a",
            &format!("marmot.files.write('kept', 'x'); {call}"),
        )
        .await;
        let error = r.json["error"].as_str().unwrap_or_default();
        assert!(error.contains(says), "{call}: {}", r.json);
    }
    // A refusal by the host carries a code to branch on.
    let r = eval(
        &api,
        "bin",
        "a",
        "const codes = []; \
         for (const f of [() => marmot.files.read('nothing/here'), () => marmot.files.read('../x')]) { \
           try { f(); } catch (e) { codes.push([e instanceof Error, e.code]); } } \
         codes",
    )
    .await;
    assert_eq!(
        r.json["result"],
        json!([[true, "not_found"], [true, "invalid"]]),
        "{}",
        r.json
    );
    let listed = api.get("/v1/actors/bin/a/files").await.json;
    let paths: Vec<_> = listed["files"]
        .as_array()
        .unwrap()
        .iter()
        .map(|f| f["path"].as_str().unwrap().to_owned())
        .collect();
    assert_eq!(
        paths,
        [
            "outputs/all.bin",
            "outputs/buf.bin",
            "outputs/view.bin",
            "outputs/words.bin"
        ],
        "{listed}"
    );
}

/// JavaScript strings may hold lone surrogates, which UTF-8 cannot: what
/// leaves the sandbox as text or JSON has U+FFFD in their place. Event
/// data and eval results holding one used to read back as `null`, and
/// `console.log` and `TextEncoder` threw.
#[tokio::test]
async fn lone_surrogates_leave_the_sandbox_as_replacement_characters() {
    let (_dir, m, api) = node(None).await;
    let js = r#"
import { events, files } from "marmot";
export default {
  onMessage() {
    events.emit("mixed", { ok: "fine", bad: "a\uDBFFb", pair: "\uD83D\uDE00" });
    files.write("notes/a\uD800.txt", "x\uDC00");
    console.log("lonely \uD800 line");
    return {
      encoded: Array.from(new TextEncoder().encode("x\uDC00")),
      bom: new TextDecoder().decode(new Uint8Array([0xef, 0xbb, 0xbf, 0x41])),
      kept: new TextDecoder("utf-8", { ignoreBOM: true })
        .decode(new Uint8Array([0xef, 0xbb, 0xbf, 0x41])).length,
      // The same name finds the same file.
      file: files.read("notes/a\uD800.txt"),
    };
  },
};
"#;
    assert_eq!(api.deploy_js("lone", js).await.status, 201);
    let r = api.post_json("/v1/actors/lone/a", &json!({})).await;
    assert_eq!(r.status, 200, "{}", r.json);
    assert_eq!(
        r.json,
        json!({"encoded": [0x78, 0xef, 0xbf, 0xbd], "bom": "A", "kept": 2,
               "file": "x\u{fffd}"})
    );
    let ev = api.get("/v1/actors/lone/a/events").await.json;
    assert_eq!(
        ev["events"][0]["data"],
        json!({"ok": "fine", "bad": "a\u{fffd}b", "pair": "😀"}),
        "{ev}"
    );
    let r = eval(&api, "lone", "a", "['ok', 'a\\uD800b']").await;
    assert_eq!(r.json["result"], json!(["ok", "a\u{fffd}b"]), "{}", r.json);

    // A string reply, and an error's name, message and stack, are text too:
    // the first failed the turn, the second lost its message.
    let js = r#"
export default {
  onMessage({ op }) {
    if (op === "text") return "x\uDC00y";
    const e = new Error("bad \uD800 news");
    e.name = "Odd\uDFFFError";
    throw e;
  },
};
"#;
    assert_eq!(api.deploy_js("lonetext", js).await.status, 201);
    let r = api.op("lonetext", "a", json!({"op": "text"})).await;
    assert_eq!(r.status, 200, "{}", String::from_utf8_lossy(&r.body));
    assert_eq!(r.body, "x\u{fffd}y".as_bytes());
    let r = api.op("lonetext", "a", json!({"op": "throw"})).await;
    assert_eq!(r.code(), "actor_error", "{}", r.json);
    let message = r.json["error"]["message"].as_str().unwrap();
    assert!(
        message.contains("Odd\u{fffd}Error: bad \u{fffd} news"),
        "{message}"
    );
    let r = eval(&api, "lone", "a", "throw new Error('e\\uDBFF')").await;
    let error = r.json["error"].as_str().unwrap_or_default();
    assert!(error.starts_with("Error: e\u{fffd}"), "{}", r.json);
    tokio::time::sleep(Duration::from_millis(100)).await;
    assert!(m.log_text().contains("lonely \u{fffd} line"));

    // JSON that JavaScript wrote: `JSON.stringify` escapes a lone
    // surrogate as `\udXXX`, which strict parsers refuse. A state value
    // holding one was shown as base64 (not JSON) and a JSON reply was not
    // JSON; a state key or an actor id holding one threw "Conversion from
    // string failed" naming no call.
    let js = r#"
import { state, actors } from "marmot";
export default {
  onMessage({ op, text }) {
    if (op === "echo") return { text };
    const short = text.slice(0, 5);
    state.set("summary", { short, escaped: "\\ud83d", pair: "\uD83D\uDE00" });
    state.set("k" + short, 1);
    actors.send("cut", "to-" + short, { op: "echo", text: "sent" });
    return { short, stored: state.get("summary"), keyed: state.get("k" + short) };
  },
};
"#;
    assert_eq!(api.deploy_js("cut", js).await.status, 201);
    let r = api
        .op("cut", "a", json!({"op": "cut", "text": "abcd😀efg"}))
        .await;
    assert_eq!(r.status, 200, "{}", String::from_utf8_lossy(&r.body));
    let want = json!({"short": "abcd\u{fffd}", "escaped": "\\ud83d", "pair": "😀"});
    assert_eq!(
        r.json,
        json!({"short": "abcd\u{fffd}", "stored": want, "keyed": 1}),
        "{}",
        String::from_utf8_lossy(&r.body)
    );
    let state = api.get("/v1/actors/cut/a/state").await.json;
    let entries = state["entries"].as_array().unwrap();
    let summary = entries.iter().find(|e| e["key"] == "summary").unwrap();
    assert_eq!(summary["value"], want, "{state}");
    assert!(
        entries.iter().any(|e| e["key"] == "kabcd\u{fffd}"),
        "{state}"
    );
    api.wait_info("cut", "to-abcd\u{fffd}", "the actor sent to", |i| {
        i.is_object()
    })
    .await;
}

/// A thrown value that is not an `Error` reaches the caller as what it
/// was, not only its type ("Uncaught int", "Uncaught object").
#[tokio::test]
async fn thrown_values_that_are_not_errors_are_shown() {
    let (_dir, _m, api) = node(None).await;
    api.deploy_js("jscount", COUNTER_JS).await;
    for (script, shown) in [
        ("throw 42", "Uncaught 42"),
        (
            "throw { message: 'custom', code: 7 }",
            r#"Uncaught {"message":"custom","code":7}"#,
        ),
        ("throw Symbol('why')", "Uncaught Symbol(why)"),
        ("throw null", "Uncaught null"),
        ("throw undefined", "Uncaught undefined"),
        ("throw () => 1", "Uncaught a thrown function"),
        (
            "throw { get x() { throw new Error('no') } }",
            "Uncaught a thrown object that cannot be shown",
        ),
    ] {
        let r = eval(&api, "jscount", "a", script).await;
        assert_eq!(r.json["error"], shown, "{script}: {}", r.json);
    }
}

/// JSON nested deeper than `serde_json::Value` goes (128 levels) is shown
/// as it was stored: an event's data showed as `null` (in pages, streams
/// and outbound webhooks), a state value and an alarm's payload as base64,
/// and an eval's result as `null` (probes).
#[tokio::test]
async fn deeply_nested_json_is_shown_as_stored() {
    let (_dir, m, api) = node(None).await;
    let js = r#"import { state, events, alarms } from "marmot";
export default { onMessage(body) {
  state.set("v", body);
  events.emit("deep", body);
  alarms.set("deep", { after: 600000, payload: body });
  return 1;
}, onAlarm() {} };"#;
    assert_eq!(api.deploy_js("deep", js).await.status, 201);
    let depth = 1_000;
    let nested = format!("{}{}", "[".repeat(depth), "]".repeat(depth));
    let r = api
        .req(
            Method::POST,
            "/v1/actors/deep/a",
            Some(("application/json", nested.clone().into_bytes())),
            &[],
        )
        .await;
    assert_eq!(r.status, 200, "{}", r.json);
    let text = |r: &common::Resp| String::from_utf8(r.body.clone()).unwrap();
    let events = text(&api.get("/v1/actors/deep/a/events").await);
    assert!(
        events.contains(&format!(r#""data":{nested}"#)),
        "{}",
        &events[..events.len().min(300)]
    );
    let state = text(&api.get("/v1/actors/deep/a/state").await);
    assert!(
        state.contains(&format!(r#""value":{nested}"#)) && !state.contains("value_base64"),
        "{}",
        &state[..state.len().min(300)]
    );
    let alarms = text(&api.get("/v1/actors/deep/a/alarms").await);
    assert!(
        alarms.contains(&format!(r#""payload":{nested}"#)),
        "{}",
        &alarms[..alarms.len().min(300)]
    );
    // And the CLI, which read every answer into a `Value` ("invalid
    // response" for the whole log or inspection).
    for args in [["events", "deep", "a"], ["inspect", "deep", "a"]] {
        let out = std::process::Command::new(env!("CARGO_BIN_EXE_marmot"))
            .args(args)
            .env("MARMOT_URL", &m.url)
            .output()
            .unwrap();
        let printed = String::from_utf8_lossy(&out.stdout);
        assert!(
            out.status.success() && printed.contains(&nested),
            "{args:?}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
    }
    let script = format!("let v = []; for (let i = 1; i < {depth}; i++) v = [v]; v");
    let r = eval(&api, "deep", "a", &script).await;
    let result = text(&r);
    assert!(
        result.contains(&format!(r#""result":{nested}"#)),
        "{}",
        &result[..result.len().min(300)]
    );
}

/// A promise rejected with nothing to handle it (a `fetch` without
/// `await`, a `.then` without `.catch`) is logged when its turn ends, as
/// `console.error` would: `Uncaught (in promise) …` (it left no trace);
/// one handled later in the turn is not; a script's go with its logs.
#[tokio::test]
async fn unhandled_rejections_are_logged_when_the_turn_ends() {
    let (_dir, m, api) = node(None).await;
    let js = r#"
export default {
  async onMessage() {
    Promise.reject(new Error("lost in the void"));
    const late = Promise.reject(new Error("caught later"));
    await null;
    late.catch(() => {});
    Promise.resolve().then(() => { throw 42; });
    return { ok: true };
  },
};
"#;
    assert_eq!(api.deploy_js("rejects", js).await.status, 201);
    let r = api.post_json("/v1/actors/rejects/a", &json!({})).await;
    assert_eq!(r.json, json!({"ok": true}));
    let deadline = Instant::now() + Duration::from_secs(5);
    while !m
        .log_text()
        .contains("Uncaught (in promise) Error: lost in the void")
    {
        assert!(Instant::now() < deadline, "{}", m.log_text());
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let log = m.log_text();
    assert!(log.contains("Uncaught (in promise) 42"), "{log}");
    assert!(!log.contains("caught later"), "{log}");

    // A script's own rejection is its error, not also "unhandled".
    let r = eval(
        &api,
        "rejects",
        "a",
        "Promise.reject(new Error('dropped')); 7",
    )
    .await;
    assert_eq!(r.json["result"], 7, "{}", r.json);
    let logs = r.json["logs"].to_string();
    assert!(
        logs.contains("Uncaught (in promise) Error: dropped"),
        "{logs}"
    );
    let r = eval(
        &api,
        "rejects",
        "a",
        "await Promise.reject(new Error('mine'))",
    )
    .await;
    assert!(
        r.json["error"]
            .as_str()
            .unwrap_or_default()
            .contains("mine"),
        "{}",
        r.json
    );
    assert!(
        !r.json["logs"].to_string().contains("Uncaught"),
        "{}",
        r.json
    );
}
