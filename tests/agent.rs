//! The built-in agent harness end to end: a real node, the fake provider
//! speaking OpenAI's wire format, a ticket server the agent's http tool
//! posts to, approvals, budgets, client tools and the examples. Crashes
//! and outages are in `tests/agent_recovery.rs`.

mod common;

use std::time::{Duration, Instant};

use common::agent::{Rig, kinds, put};
use common::{Marmot, tempdir};
use marmot::fake_provider::Scripted;
use serde_json::{Value, json};

#[tokio::test]
async fn a_run_calls_the_model_and_its_tools_committing_every_step() {
    let rig = Rig::new().await;
    let r = rig
        .agent(
            "helper",
            json!([
                rig.ticket_tool(json!({})),
                {"kind": "actor", "name": "ask_billing", "description": "Ask billing", "type": "billing"},
                {"kind": "code"},
            ]),
        )
        .await;
    assert_eq!(r.status, 201, "{}", r.json);
    assert_eq!(r.json["kind"], "agent");

    // Plain conversation: the fake echoes.
    let r = rig
        .api
        .post_json("/v1/actors/helper/alice", &json!({"input": "hello there"}))
        .await;
    assert_eq!(r.status, 200, "{}", r.json);
    assert_eq!(r.json["output"], "You said: hello there");
    let run_id = r.json["run_id"].as_str().unwrap().to_owned();
    assert!(r.json["usage"]["output_tokens"].as_u64().unwrap() > 0);
    let evs = rig.events("helper", "alice").await;
    assert_eq!(kinds(&evs), ["run_started", "model_step", "run_finished"]);
    assert_eq!(evs[0]["data"]["run_id"], run_id.as_str());

    // Tools: the model calls the ticket endpoint, billing and a script,
    // then answers. Each call's result is committed before the next step.
    rig.fake.push([
        Scripted::ToolCalls {
            text: String::new(),
            calls: vec![
                ("call_t".into(), "create_ticket".into(), json!({"title": "printer on fire"})),
                ("call_b".into(), "ask_billing".into(), json!({"id": "acct-1", "message": {"op": "add", "key": "n", "by": 5}})),
            ],
        },
        Scripted::ToolCalls {
            text: String::new(),
            calls: vec![("call_c".into(), "code".into(), json!({"code": "const t = await tools.create_ticket({title: 'from code'}); ({ticket: t.id, sum: 1 + 1})"}))],
        },
        Scripted::Text("All done.".into()),
    ]);
    let r = rig
        .api
        .post_json(
            "/v1/actors/helper/alice",
            &json!({"input": "open a ticket"}),
        )
        .await;
    assert_eq!(r.status, 200, "{}", r.json);
    assert_eq!(r.json["output"], "All done.");
    let posts = rig.tickets.posts();
    assert_eq!(posts.len(), 2, "{posts:?}");
    assert_eq!(posts[0].1, json!({"title": "printer on fire"}));
    assert!(!posts[0].0.is_empty(), "an idempotency key is sent");
    assert_eq!(posts[1].1, json!({"title": "from code"}));
    assert_ne!(posts[0].0, posts[1].0);
    let billing = rig
        .api
        .op("billing", "acct-1", json!({"op": "get", "key": "n"}))
        .await;
    assert_eq!(billing.json["value"], 5);
    let evs = rig.events("helper", "alice").await;
    let k = kinds(&evs);
    assert_eq!(
        k[3..],
        [
            "run_started",
            "model_step",
            "tool_call",
            "tool_result",
            "tool_call",
            "tool_result",
            "model_step",
            "tool_call",
            "tool_result",
            "model_step",
            "run_finished"
        ],
        "{evs:#?}"
    );
    let code_result = evs
        .iter()
        .filter(|e| e["kind"] == "tool_result")
        .nth(2)
        .unwrap();
    assert_eq!(
        code_result["data"]["content"]["result"],
        json!({"ticket": 2, "sum": 2}),
        "{code_result}"
    );
    // The transcript the model saw on its last step had every result.
    let last = rig.fake.requests().last().unwrap().body.clone();
    let msgs = last["messages"].as_array().unwrap();
    assert_eq!(msgs[0]["role"], "system");
    assert_eq!(msgs.iter().filter(|m| m["role"] == "tool").count(), 3);

    // A new input while a run is active waits its turn: it arrives while
    // the first run's first step (a slow model answer) runs.
    rig.fake
        .set_timing(Duration::from_millis(300), Duration::ZERO);
    rig.fake.push([
        Scripted::ToolCalls {
            text: String::new(),
            calls: vec![(
                "call_q".into(),
                "ask_billing".into(),
                json!({"id": "acct-2", "message": {"op": "get", "key": "n"}}),
            )],
        },
        Scripted::Text("first done".into()),
    ]);
    let a = rig
        .api
        .post_json(
            "/v1/actors/helper/bob?wait=false",
            &json!({"input": "first"}),
        )
        .await;
    assert_eq!(a.status, 202);
    rig.wait_event("helper", "bob", "run_started", 1).await;
    let b = rig
        .api
        .post_json("/v1/actors/helper/bob", &json!({"input": "second"}))
        .await;
    assert_eq!(b.status, 200, "{}", b.json);
    assert_eq!(b.json["output"], "You said: second");
    assert_ne!(b.json["run_id"], a.json["run_id"]);
    let k = kinds(&rig.events("helper", "bob").await);
    let first_end = k.iter().position(|k| k == "run_finished").unwrap();
    let queued = k
        .iter()
        .position(|k| k == "input_queued")
        .expect("the second input was queued");
    assert!(queued < first_end, "{k:?}");
    assert_eq!(
        k[first_end + 1..],
        ["run_started", "model_step", "run_finished"],
        "{k:?}"
    );
    rig.fake.set_timing(Duration::ZERO, Duration::ZERO);

    // Bad manifests are refused and change nothing.
    for (tools, why) in [
        (
            json!([{"kind": "http", "name": "x", "url": "https://elsewhere.example.com/"}]),
            "allowed_hosts",
        ),
        (json!([{"kind": "shell"}]), "kind must be"),
        (
            json!([{"kind": "client", "name": "pick", "input_schema": {"type": "banana"}}]),
            "must describe an object",
        ),
        (
            json!([{"kind": "client", "name": "pick", "input_schema": {"type": "array"}}]),
            "must describe an object",
        ),
        // One the argument check would misread checked nothing.
        (
            json!([{"kind": "client", "name": "pick", "input_schema":
                {"type": "object", "properties": {"n": {"type": "int"}}}}]),
            "$.properties.n.type",
        ),
    ] {
        let r = rig.agent("helper", tools).await;
        assert_eq!(
            (r.status, r.json["error"]["code"].as_str()),
            (400, Some("invalid_manifest")),
            "{}",
            r.json
        );
        assert!(r.json["error"]["message"].as_str().unwrap().contains(why));
    }
    assert_eq!(rig.api.get("/v1/types/helper").await.json["version"], 1);
    drop(rig.dir);
}

#[tokio::test]
async fn approvals_bind_to_the_exact_arguments_and_survive_a_restart() {
    let mut rig = Rig::new().await;
    let r = rig
        .agent(
            "careful",
            json!([rig.ticket_tool(json!({"needs_approval": true})),
                   {"kind": "client", "name": "pick_date", "description": "Ask the user for a date",
                    "input_schema": {"type": "object"}}]),
        )
        .await;
    assert_eq!(r.status, 201, "{}", r.json);
    rig.fake.push([
        Scripted::ToolCalls {
            text: "Let me file that.".into(),
            calls: vec![(
                "call_1".into(),
                "create_ticket".into(),
                json!({"title": "leak"}),
            )],
        },
        Scripted::ToolCalls {
            text: String::new(),
            calls: vec![("call_2".into(), "pick_date".into(), json!({"for": "visit"}))],
        },
        Scripted::Text("Filed, see you then.".into()),
    ]);
    let r = rig
        .api
        .post_json(
            "/v1/actors/careful/c1?wait=false",
            &json!({"input": "file a leak"}),
        )
        .await;
    assert_eq!(r.status, 202);
    let run_id = r.json["run_id"].as_str().unwrap().to_owned();
    let asked = rig
        .wait_event("careful", "c1", "approval_requested", 1)
        .await;
    assert_eq!(asked["data"]["arguments"], json!({"title": "leak"}));
    assert!(
        rig.tickets.posts().is_empty(),
        "nothing is sent before the approval"
    );

    // The node restarts while the approval is pending.
    rig.node.restart().await;
    let api = rig.node.client();
    rig.api = api.clone();
    let input_id = asked["data"]["input_id"].as_str().unwrap();
    // Approving different arguments is not approving these: a new approval
    // is asked for the edited ones.
    let r = api
        .post_json(
            &format!("/v1/actors/careful/c1/inputs/{input_id}"),
            &json!({"approved": true, "arguments": {"title": "flood"}}),
        )
        .await;
    assert_eq!(r.status, 200, "{}", r.json);
    let again = rig
        .wait_event("careful", "c1", "approval_requested", 2)
        .await;
    assert_eq!(again["data"]["arguments"], json!({"title": "flood"}));
    assert!(rig.tickets.posts().is_empty());
    let r = api
        .post_json(
            &format!(
                "/v1/actors/careful/c1/inputs/{}",
                again["data"]["input_id"].as_str().unwrap()
            ),
            &json!({"approved": true}),
        )
        .await;
    assert_eq!(r.status, 200, "{}", r.json);
    // Answering twice is refused.
    let r = api
        .post_json(
            &format!(
                "/v1/actors/careful/c1/inputs/{}",
                again["data"]["input_id"].as_str().unwrap()
            ),
            &json!({"approved": true}),
        )
        .await;
    assert_eq!(r.status, 409);

    // The client tool is an input request the client answers with the result.
    let call = rig.wait_event("careful", "c1", "tool_call", 2).await;
    assert_eq!(call["data"]["client"], true);
    let r = api
        .post_json(
            &format!(
                "/v1/actors/careful/c1/inputs/{}",
                call["data"]["input_id"].as_str().unwrap()
            ),
            &json!({"date": "2026-12-24"}),
        )
        .await;
    assert_eq!(r.status, 200, "{}", r.json);
    let done = rig.wait_event("careful", "c1", "run_finished", 1).await;
    assert_eq!(done["data"]["run_id"], run_id.as_str());
    assert_eq!(done["data"]["output"], "Filed, see you then.");
    let posts = rig.tickets.posts();
    assert_eq!(
        posts.len(),
        1,
        "exactly one ticket, with the approved arguments: {posts:?}"
    );
    assert_eq!(posts[0].1, json!({"title": "flood"}));
    let last = rig.fake.requests().last().unwrap().body.clone();
    assert!(
        last.to_string().contains("2026-12-24"),
        "the client's result reached the model"
    );
}

#[tokio::test]
async fn runs_can_be_cancelled_and_budgets_stop_them() {
    let rig = Rig::new().await;
    assert_eq!(
        rig.agent(
            "slow",
            json!([rig.ticket_tool(json!({"needs_approval": true}))])
        )
        .await
        .status,
        201
    );
    rig.fake.push([Scripted::ToolCalls {
        text: String::new(),
        calls: vec![(
            "call_x".into(),
            "create_ticket".into(),
            json!({"title": "x"}),
        )],
    }]);
    // A waiting caller whose run asks a person is told so (it was held
    // until someone answered): 202, what to answer, and the run goes on.
    let input = json!({"input": "go"});
    let go = || {
        rig.api
            .post_with("/v1/actors/slow/s1", &input, &[("idempotency-key", "go-1")])
    };
    let r = tokio::time::timeout(std::time::Duration::from_secs(20), go())
        .await
        .expect("a run waiting for an approval holds its caller");
    assert_eq!(r.status, 202, "{}", r.json);
    let doc = rig.api.get("/v1/openapi.json").await.json;
    common::documented(&doc, "post", "/v1/actors/{type}/{id}", &r);
    assert_eq!(r.json["status"], "waiting", "{}", r.json);
    assert_eq!(r.json["waiting_for"]["kind"], "approval", "{}", r.json);
    assert_eq!(r.json["waiting_for"]["tool"], "create_ticket", "{}", r.json);
    let asked = rig.wait_event("slow", "s1", "approval_requested", 1).await;
    assert_eq!(r.json["waiting_for"]["input_id"], asked["data"]["input_id"]);
    let run_id = asked["data"]["run_id"].as_str().unwrap();
    assert_eq!(r.json["run_id"], run_id);
    let r = rig
        .api
        .post_json(
            &format!("/v1/actors/slow/s1/runs/{run_id}/cancel"),
            &json!({}),
        )
        .await;
    assert_eq!(r.status, 202, "{}", r.json);
    common::documented(
        &doc,
        "post",
        "/v1/actors/{type}/{id}/runs/{run_id}/cancel",
        &r,
    );
    // Asked again (the same key) once it ended, the caller gets how.
    rig.wait_event("slow", "s1", "run_failed", 1).await;
    let r = go().await;
    assert_eq!(
        (r.status, r.json["error"]["code"].as_str()),
        (409, Some("run_cancelled")),
        "{}",
        r.json
    );
    // The ended run's approval is withdrawn with it: cancelled, no longer
    // pending (it stayed pending for ever), and an answer is refused.
    let input_id = asked["data"]["input_id"].as_str().unwrap();
    let listed = rig.api.get("/v1/actors/slow/s1/inputs?status=all").await;
    let listed = &listed.json["inputs"];
    assert_eq!(listed[0]["id"], input_id, "{listed}");
    assert_eq!(listed[0]["status"], "cancelled", "{listed}");
    let info = rig.api.get("/v1/actors/slow/s1").await.json;
    assert_eq!(info["pending_inputs"], 0, "{info}");
    let r = rig
        .api
        .post_json(
            &format!("/v1/actors/slow/s1/inputs/{input_id}"),
            &json!({"approved": true}),
        )
        .await;
    assert_eq!(r.status, 409, "{}", r.json);
    let events = rig.events("slow", "s1").await;
    assert!(
        events
            .iter()
            .any(|e| e["kind"] == "input_cancelled" && e["data"]["id"] == input_id),
        "{events:#?}"
    );
    let cancelled = events
        .iter()
        .position(|e| e["kind"] == "run_failed" && e["data"]["reason"] == "cancelled")
        .unwrap_or_else(|| panic!("no run_failed (cancelled): {events:#?}"));
    assert!(
        !events[cancelled..]
            .iter()
            .any(|e| e["kind"] == "tool_call" || e["kind"] == "tool_result"),
        "a tool ran after the cancel: {events:#?}"
    );
    assert!(rig.tickets.posts().is_empty());
    // The next run is the next input's: it asks the model, and neither
    // runs nor asks again for the cancelled run's call (it did both, and a
    // provider refused the conversation from then on: the call had no
    // result).
    rig.fake.push([Scripted::Text("a fresh answer".into())]);
    let r = rig
        .api
        .post_json("/v1/actors/slow/s1", &json!({"input": "something else"}))
        .await;
    assert_eq!(r.status, 200, "{}", r.json);
    assert_eq!(r.json["output"], "a fresh answer", "{}", r.json);
    let events = rig.events("slow", "s1").await;
    let asks = events
        .iter()
        .filter(|e| e["kind"] == "approval_requested")
        .count();
    assert_eq!(
        asks, 1,
        "the cancelled call was asked for again: {events:#?}"
    );
    assert!(rig.tickets.posts().is_empty(), "the cancelled call ran");
    let r = rig
        .api
        .post_json("/v1/actors/counter/x/runs/abc/cancel", &json!({}))
        .await;
    assert_eq!(r.status, 404);
    // A run that cannot end any more is said so: it ended (409), or there
    // never was one (404); both were a 202 that did nothing.
    let cancel = |run: String| {
        let api = &rig.api;
        async move {
            api.post_json(&format!("/v1/actors/slow/s1/runs/{run}/cancel"), &json!({}))
                .await
        }
    };
    let r = cancel(run_id.to_owned()).await;
    assert_eq!((r.status, r.code()), (409, "run_ended"), "{}", r.json);
    let r = cancel("m0000000000000000nothing".into()).await;
    assert_eq!((r.status, r.code()), (404, "run_not_found"), "{}", r.json);

    // A budget of a few tokens: the first step is refused.
    let manifest = json!({"kind": "agent", "agent": {"model": {"provider": "fake", "name": "m1"}},
                          "config": {"budget": {"actor_max_tokens": 50}}});
    assert_eq!(put(&rig.api, "/v1/types/tight", manifest).await.status, 201);
    let r = rig
        .api
        .post_json("/v1/actors/tight/t1", &json!({"input": "hi"}))
        .await;
    assert_eq!(
        (r.status, r.json["error"]["code"].as_str()),
        (402, Some("budget_exceeded")),
        "{}",
        r.json
    );
    // With what the run used, as every other end of a run says.
    assert_eq!(
        r.json["usage"],
        json!({"input_tokens": 0, "output_tokens": 0}),
        "{}",
        r.json
    );
    let k = kinds(&rig.events("tight", "t1").await);
    assert_eq!(k, ["run_started", "budget_exceeded"]);
}

/// What a client sends an agent is `{"input": "…"}` or `{"cancel": "…"}`;
/// anything else is a 400 in the API's error shape before it is stored,
/// so no actor comes to be for it and no message vanishes unanswered
/// behind `?wait=false` (both happened: the harness answered a plain
/// `{"error": "…"}` from a turn). Cancelling on an actor that does not
/// exist is a 404.
#[tokio::test]
async fn bad_input_to_an_agent_is_refused_and_stores_nothing() {
    let rig = Rig::new().await;
    assert_eq!(rig.agent("helper", json!([])).await.status, 201);
    let bodies: [&[u8]; 9] = [
        br#"{"nope": 1}"#,
        b"{bad",
        br#"{"input": 123}"#,
        br#"{"cancel": 5}"#,
        b"[1]",
        b"",
        br#"{"_agent_step": "r", "nonce": "n"}"#,
        // An input with the harness's own fields was taken for one of its
        // continuations and dropped, its caller waiting for good.
        br#"{"input": "hello", "_agent_step": "x", "nonce": "y"}"#,
        br#"{"input": "hello", "_agent_exec": "x", "call_id": "c", "nonce": "y"}"#,
    ];
    for body in bodies {
        for query in ["", "?wait=false"] {
            let r = rig
                .api
                .req(
                    reqwest::Method::POST,
                    &format!("/v1/actors/helper/nobody{query}"),
                    Some(("application/json", body.to_vec())),
                    &[],
                )
                .await;
            let shown = String::from_utf8_lossy(body);
            assert_eq!(r.status, 400, "{shown}{query}: {}", r.json);
            assert_eq!(r.code(), "invalid_input", "{shown}: {}", r.json);
            assert!(
                r.json["error"]["message"]
                    .as_str()
                    .unwrap()
                    .contains(r#"send {"input": "…"}"#),
                "{}",
                r.json
            );
        }
    }
    assert_eq!(rig.api.get("/v1/actors/helper/nobody").await.status, 404);
    let r = rig
        .api
        .post_json("/v1/actors/helper/nobody/runs/abc/cancel", &json!({}))
        .await;
    assert_eq!(r.code(), "actor_not_found", "{}", r.json);
    // The same cancel sent as a message makes no actor either.
    let r = rig
        .api
        .post_json("/v1/actors/helper/nobody", &json!({"cancel": "abc"}))
        .await;
    assert_eq!(r.code(), "actor_not_found", "{}", r.json);
    assert_eq!(rig.api.get("/v1/actors/helper/nobody").await.status, 404);
}

/// An input queued when the node cannot wait for the run's end (every
/// stream slot taken) is answered 202 with its run id, and the run goes
/// on. (It was a 503 after the input was stored: a plain retry ran twice.)
#[tokio::test]
async fn an_input_the_node_cannot_wait_for_is_accepted_with_its_run_id() {
    let rig = Rig::with_limits("[events]\nmax_streams = 1\n").await;
    assert_eq!(rig.agent("helper", json!([])).await.status, 201);
    let _held = rig.api.sse("/v1/actors/billing/x/events", None).await;
    let r = rig
        .api
        .post_json("/v1/actors/helper/u", &json!({"input": "hi"}))
        .await;
    assert_eq!(r.status, 202, "{}", r.json);
    assert_eq!(r.json["status"], "accepted", "{}", r.json);
    let run_id = r.json["run_id"].as_str().expect("a run id").to_owned();
    let doc = rig.api.get("/v1/openapi.json").await.json;
    common::documented(&doc, "post", "/v1/actors/{type}/{id}", &r);
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        let events = rig.api.get("/v1/actors/helper/u/events").await.json;
        let ended: Vec<&Value> = events["events"]
            .as_array()
            .unwrap()
            .iter()
            .filter(|e| e["kind"] == "run_finished")
            .collect();
        if let Some(e) = ended.first() {
            assert_eq!(e["data"]["run_id"], run_id.as_str(), "{events}");
            assert_eq!(ended.len(), 1, "{events}");
            break;
        }
        assert!(Instant::now() < deadline, "the run never ended: {events}");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// A repeated `Idempotency-Key` answers with the first run's outcome while
/// the log keeps it, and with a 410 once retention has dropped it (it
/// waited for an end that would never come, found by a probe), never by
/// running again. A different body under the key is refused.
#[tokio::test]
async fn a_repeated_run_answers_its_outcome_or_says_it_is_gone() {
    let rig = Rig::with_limits("max_events_per_actor = 6\n").await;
    assert_eq!(rig.agent("helper", json!([])).await.status, 201);
    let input = |text: &str| json!({"input": text});
    let run = |text: &'static str, key: &'static str| {
        let api = &rig.api;
        async move {
            tokio::time::timeout(
                std::time::Duration::from_secs(20),
                api.post_with(
                    "/v1/actors/helper/h",
                    &input(text),
                    &[("idempotency-key", key)],
                ),
            )
            .await
            .unwrap_or_else(|_| panic!("the run under {key} never answered"))
        }
    };
    let first = run("first", "k1").await;
    assert_eq!(first.status, 200, "{}", first.json);
    let again = run("first", "k1").await;
    assert_eq!(again.status, 200, "{}", again.json);
    assert_eq!(again.json["run_id"], first.json["run_id"]);
    assert_eq!(again.json["output"], first.json["output"]);
    let other = run("second", "k1").await;
    assert_eq!(other.status, 422, "{}", other.json);
    assert_eq!(other.code(), "idempotency_key_reused");

    for (text, key) in [("a", "k2"), ("b", "k3"), ("c", "k4")] {
        assert_eq!(run(text, key).await.status, 200);
    }
    let info = rig.api.get("/v1/actors/helper/h").await.json;
    assert!(info["first_event_seq"].as_u64().unwrap() > 6, "{info}");
    let gone = run("first", "k1").await;
    assert_eq!(gone.status, 410, "{}", gone.json);
    assert_eq!(gone.code(), "run_outcome_expired");
    let runs = rig
        .events("helper", "h")
        .await
        .iter()
        .filter(|e| e["kind"] == "run_started")
        .count();
    assert!(runs <= 3, "nothing ran again");
    assert_eq!(
        rig.api.get("/v1/actors/helper/h").await.json["turns"],
        info["turns"],
        "the repeat ran no turn"
    );
}

/// A repeat of a run that waits for a person is told so even once the
/// event that asked has left the log (it waited until someone answered).
#[tokio::test]
async fn a_repeat_of_a_waiting_run_is_told_so_after_its_ask_left_the_log() {
    let rig = Rig::with_limits("max_events_per_actor = 6\n").await;
    let tool = rig.ticket_tool(json!({"needs_approval": true}));
    assert_eq!(rig.agent("asker", json!([tool])).await.status, 201);
    rig.fake.push([Scripted::ToolCalls {
        text: String::new(),
        calls: vec![(
            "call_w".into(),
            "create_ticket".into(),
            json!({"title": "t"}),
        )],
    }]);
    let input = json!({"input": "go"});
    let go = || {
        rig.api
            .post_with("/v1/actors/asker/w", &input, &[("idempotency-key", "w1")])
    };
    let first = go().await;
    assert_eq!(first.status, 202, "{}", first.json);
    let input_id = first.json["waiting_for"]["input_id"].clone();
    assert!(input_id.is_string(), "{}", first.json);
    for i in 0..8 {
        let r = rig
            .api
            .post_json(
                "/v1/actors/asker/w?wait=false",
                &json!({"input": format!("later {i}")}),
            )
            .await;
        assert_eq!(r.status, 202, "{}", r.json);
    }
    rig.api
        .wait_info("asker", "w", "the inputs to be queued", |i| {
            i["pending_messages"] == 0
        })
        .await;
    let info = rig.api.get("/v1/actors/asker/w").await.json;
    assert!(
        info["first_event_seq"].as_u64().unwrap() > 5,
        "the ask is still kept: {info}"
    );
    let again = tokio::time::timeout(std::time::Duration::from_secs(20), go())
        .await
        .expect("a repeat of a waiting run whose ask left the log hung");
    assert_eq!(again.status, 202, "{}", again.json);
    assert_eq!(again.json["status"], "waiting");
    assert_eq!(again.json["waiting_for"], first.json["waiting_for"]);
    assert_eq!(again.json["waiting_for"]["tool"], "create_ticket");
}

/// A run's `limits.max_output_tokens` caps each model step's answer by
/// what is left of it (it was checked between steps only, so one answer
/// could pass it by any amount), and the manifest's own cap still holds
/// when it is lower.
#[tokio::test]
async fn a_steps_answer_is_capped_by_what_is_left_of_the_run() {
    let rig = Rig::new().await;
    // (model cap, run limit) → the cap sent: the smaller; none of the
    // run's own while more than a default answer is left (the whole
    // allowance, 200,000 by default, was sent, which models refuse).
    for (ty, model_cap, limit, sent_cap) in [
        ("capped", Some(1000), 20, json!(20)),
        ("tight", Some(7), 20, json!(7)),
        ("bare", None, 20, json!(20)),
        ("roomy", None, 200_000, Value::Null),
    ] {
        let mut model = json!({"provider": "fake", "name": "m1"});
        if let Some(c) = model_cap {
            model["max_output_tokens"] = json!(c);
        }
        let manifest = json!({"kind": "agent", "agent": {
            "model": model, "limits": {"max_output_tokens": limit}}});
        let r = put(&rig.api, &format!("/v1/types/{ty}"), manifest).await;
        assert_eq!(r.status, 201, "{}", r.json);
        let r = rig
            .api
            .post_json(&format!("/v1/actors/{ty}/a"), &json!({"input": "hello"}))
            .await;
        assert_eq!(r.status, 200, "{}", r.json);
        let sent = rig.fake.requests().last().unwrap().body.clone();
        assert_eq!(sent["max_tokens"], sent_cap, "{ty}: {sent}");
    }
}

/// An answer that went past the run's allowance anyway (the provider did
/// not honour the cap) ends the run before its tool calls are made: they
/// ran first (found by a probe).
#[tokio::test]
async fn an_answer_past_the_runs_allowance_has_its_calls_left_unmade() {
    let rig = Rig::new().await;
    let tool = rig.ticket_tool(json!({}));
    let manifest = json!({"kind": "agent", "agent": {
        "model": {"provider": "fake", "name": "m1"}, "tools": [tool],
        "limits": {"max_output_tokens": 20}},
        "config": {"allowed_hosts": ["127.0.0.1"]}});
    let r = put(&rig.api, "/v1/types/spender", manifest).await;
    assert_eq!(r.status, 201, "{}", r.json);
    // 30 words and a call: 40 tokens, whatever cap was sent.
    rig.fake.push([Scripted::ToolCalls {
        text: vec!["word"; 30].join(" "),
        calls: vec![(
            "call_1".into(),
            "create_ticket".into(),
            json!({"title": "t"}),
        )],
    }]);
    let r = rig
        .api
        .post_json("/v1/actors/spender/a", &json!({"input": "go"}))
        .await;
    assert_ne!(r.status, 200, "{}", r.json);
    let failed = rig.wait_event("spender", "a", "run_failed", 1).await;
    assert_eq!(failed["data"]["reason"], "max_output_tokens", "{failed}");
    assert_eq!(failed["data"]["usage"]["output_tokens"], 40, "{failed}");
    let k = kinds(&rig.events("spender", "a").await);
    assert!(!k.contains(&"tool_call".to_owned()), "{k:?}");
    assert!(rig.tickets.posts().is_empty(), "the call was made");
}

/// What ends a run is the code of a model call's error, not words in the
/// provider's message: one that mentioned `budget_exceeded` ended a run as
/// if a budget had, with no budget set (found by a probe), and one that
/// mentioned `rate_limited` was waited out as if the provider were busy.
#[tokio::test]
async fn a_providers_words_do_not_decide_how_a_run_ends() {
    let rig = Rig::new().await;
    assert_eq!(rig.agent("wordy", json!([])).await.status, 201);
    rig.fake.push([Scripted::ErrorSaying {
        status: 400,
        kind: "invalid_request_error".into(),
        message: "your request (budget_exceeded, rate_limited) was odd".into(),
    }]);
    let r = rig
        .api
        .post_json("/v1/actors/wordy/a", &json!({"input": "go"}))
        .await;
    assert_ne!(r.status, 200, "{}", r.json);
    let failed = rig.wait_event("wordy", "a", "run_failed", 1).await;
    assert_eq!(failed["data"]["reason"], "model_error", "{failed}");
    let k = kinds(&rig.events("wordy", "a").await);
    assert!(!k.contains(&"budget_exceeded".to_owned()), "{k:?}");
    assert!(!k.contains(&"model_retry".to_owned()), "{k:?}");
}

/// A call whose arguments do not fit the tool's `input_schema` is answered
/// with why, and is neither put to a person nor sent (the schema was only
/// shown to the model: `{"title": 12345}` reached the endpoint, approved).
/// Nor is a call of a name no tool has, even an empty one or one no
/// provider takes back; the conversation goes on (such a call, sent back
/// as it was, got every later request refused: the actor could not run
/// again).
#[tokio::test]
async fn calls_that_do_not_fit_their_schema_are_refused_before_anything() {
    let rig = Rig::new().await;
    let tool = rig.ticket_tool(json!({"needs_approval": true}));
    assert_eq!(rig.agent("strict", json!([tool])).await.status, 201);
    rig.fake.push([
        Scripted::ToolCalls {
            text: String::new(),
            calls: vec![
                (
                    "call_n".into(),
                    "create_ticket".into(),
                    json!({"title": 12345}),
                ),
                ("call_a".into(), "create_ticket".into(), json!([1, 2])),
                (
                    "call_j".into(),
                    "create_ticket".into(),
                    json!("{\"title\": \"cut o"),
                ),
                ("call_e".into(), String::new(), json!({})),
                ("call_p".into(), "multi_tool_use.parallel".into(), json!({})),
            ],
        },
        Scripted::Text("I could not.".into()),
        Scripted::Text("Still here.".into()),
    ]);
    let r = rig
        .api
        .post_json("/v1/actors/strict/s", &json!({"input": "go"}))
        .await;
    assert_eq!(
        (r.status, r.json["output"].as_str()),
        (200, Some("I could not.")),
        "{}",
        r.json
    );
    let events = rig.events("strict", "s").await;
    let k = kinds(&events);
    assert!(!k.contains(&"approval_requested".to_owned()), "{k:?}");
    let results: Vec<&Value> = events
        .iter()
        .filter(|e| e["kind"] == "tool_result")
        .collect();
    let texts: Vec<String> = results.iter().map(|e| e["data"].to_string()).collect();
    assert_eq!(texts.len(), 5, "{events:#?}");
    for text in &texts[..2] {
        assert!(text.contains("input_schema"), "{text}");
    }
    assert!(
        texts[2].contains("(not JSON, cut off, or a JSON string)"),
        "{}",
        texts[2]
    );
    assert!(texts[3].contains("no tool named ``"), "{}", texts[3]);
    assert!(
        texts[4].contains("no tool named `multi_tool_use.parallel`"),
        "{}",
        texts[4]
    );
    assert!(
        rig.tickets.posts().is_empty(),
        "a call that did not fit was sent"
    );
    let r = rig
        .api
        .post_json("/v1/actors/strict/s", &json!({"input": "again"}))
        .await;
    assert_eq!(
        (r.status, r.json["output"].as_str()),
        (200, Some("Still here.")),
        "{}",
        r.json
    );
}

/// An error in the model's script names the model's own line (the
/// prelude that defines `tools` pushed it 17 lines down).
#[tokio::test]
async fn a_scripts_error_names_the_models_own_line() {
    let rig = Rig::new().await;
    let tools = json!([rig.ticket_tool(json!({})), {"kind": "code"}]);
    assert_eq!(rig.agent("coder", tools).await.status, 201);
    let code = "const a = 1;\nconst b = 2;\nthrow new Error('boom on three');";
    let r = rig.run_script("coder", "c", code).await;
    assert_eq!(r.status, 200, "{}", r.json);
    let events = rig.events("coder", "c").await;
    let result = events
        .iter()
        .find(|e| e["kind"] == "tool_result")
        .expect("a tool result");
    let error = result["data"]["content"]["error"].as_str().unwrap_or("");
    assert!(error.contains("boom on three"), "{result}");
    assert!(error.contains(":3:"), "the model's line 3: {error}");
}

/// A queued run cancelled before it started used nothing, and says so (its
/// waiting caller was told `usage: null`).
#[tokio::test]
async fn a_cancelled_queued_run_used_nothing() {
    let rig = Rig::new().await;
    // The first run waits for an approval: the second queues behind it.
    let tool = rig.ticket_tool(json!({"needs_approval": true}));
    assert_eq!(rig.agent("queue", json!([tool])).await.status, 201);
    rig.fake.push([Scripted::ToolCalls {
        text: String::new(),
        calls: vec![(
            "call_q".into(),
            "create_ticket".into(),
            json!({"title": "t"}),
        )],
    }]);
    let input = |text: &str| json!({"input": text});
    let path = "/v1/actors/queue/a?wait=false";
    let first = rig.api.post_json(path, &input("one")).await;
    assert_eq!(first.status, 202);
    rig.wait_event("queue", "a", "approval_requested", 1).await;
    // A waiting caller queued behind a run that waits for a person is told
    // so (it was held until someone answered the other run's question).
    let second = tokio::time::timeout(
        Duration::from_secs(20),
        rig.api.post_json("/v1/actors/queue/a", &input("two")),
    )
    .await
    .expect("an input queued behind a waiting run held its caller");
    assert_eq!(second.status, 202, "{}", second.json);
    assert_eq!(second.json["status"], "queued", "{}", second.json);
    let doc = rig.api.get("/v1/openapi.json").await.json;
    common::documented(&doc, "post", "/v1/actors/{type}/{id}", &second);
    assert_eq!(second.json["behind"]["run_id"], first.json["run_id"]);
    assert_eq!(second.json["behind"]["waiting_for"]["kind"], "approval");
    assert_eq!(
        second.json["behind"]["waiting_for"]["tool"],
        "create_ticket"
    );
    let run_id = second.json["run_id"].as_str().unwrap().to_owned();
    rig.wait_event("queue", "a", "input_queued", 1).await;
    let r = rig
        .api
        .post_json(
            &format!("/v1/actors/queue/a/runs/{run_id}/cancel"),
            &json!({}),
        )
        .await;
    assert_eq!(r.status, 202, "{}", r.json);
    let failed = rig.wait_event("queue", "a", "run_failed", 1).await;
    assert_eq!(failed["data"]["run_id"], run_id.as_str(), "{failed}");
    assert_eq!(
        failed["data"]["usage"],
        json!({"input_tokens": 0, "output_tokens": 0}),
        "{failed}"
    );
}

/// Twenty agent runs at once against one type budget: the reservations
/// admit only what the budget covers, the rest end `budget_exceeded`
/// before their model call, and what was committed stays under the limit.
#[tokio::test]
async fn twenty_concurrent_runs_never_overspend_a_budget() {
    const MAX_TOKENS: u64 = 4000;
    let rig = Rig::new().await;
    let manifest = json!({"kind": "agent",
        "agent": {"instructions": "Be brief.",
                  "model": {"provider": "fake", "name": "m1", "max_output_tokens": 100}},
        "config": {"budget": {"max_tokens": MAX_TOKENS}}});
    assert_eq!(put(&rig.api, "/v1/types/pool", manifest).await.status, 201);
    // Every answer takes 300 ms, so the runs' model calls overlap.
    rig.fake
        .set_timing(Duration::from_millis(300), Duration::ZERO);
    let runs = (0..20).map(|i| {
        let api = rig.api.clone();
        async move {
            api.post_json(&format!("/v1/actors/pool/p{i}"), &json!({"input": "hello"}))
                .await
        }
    });
    let results = futures::future::join_all(runs).await;
    let done = results.iter().filter(|r| r.status == 200).count();
    let refused = results
        .iter()
        .filter(|r| r.status == 402 && r.json["error"]["code"] == "budget_exceeded")
        .count();
    assert_eq!(done + refused, 20, "{results:?}");
    assert!(done > 0 && refused > 0, "the budget binds: {results:?}");
    // Refused runs never reached the provider.
    assert_eq!(rig.fake.requests().len(), done);
    let spent: u64 = results
        .iter()
        .filter(|r| r.status == 200)
        .map(|r| {
            r.json["usage"]["input_tokens"].as_u64().unwrap()
                + r.json["usage"]["output_tokens"].as_u64().unwrap()
        })
        .sum();
    let ty = rig.api.get("/v1/types/pool").await.json;
    let used = ty["usage"]["input_tokens"].as_u64().unwrap()
        + ty["usage"]["output_tokens"].as_u64().unwrap();
    assert_eq!(used, spent, "{ty}");
    assert!(used <= MAX_TOKENS, "{ty}");
    assert_eq!(ty["usage"]["calls"], done as u64, "{ty}");
    for (i, r) in results.iter().enumerate() {
        if r.status == 402 {
            let k = kinds(&rig.events("pool", &format!("p{i}")).await);
            assert_eq!(k, ["run_started", "budget_exceeded"]);
        }
    }
}

/// A failed turn never leaves a caller waiting for good: an input whose
/// own turn fails answers at once, and a run whose next step fails (here
/// the model's answer is larger than a state value may be, so its turn
/// cannot commit) ends at `limits.max_run_ms`.
#[tokio::test]
async fn failed_turns_end_their_runs() {
    let rig = Rig::new().await;
    let manifest = json!({"kind": "agent",
        "agent": {"model": {"provider": "fake", "name": "m1"}, "limits": {"max_run_ms": 1500}}});
    assert_eq!(
        put(&rig.api, "/v1/types/brittle", manifest).await.status,
        201
    );

    let huge = "y".repeat(70_000);
    let r = rig
        .api
        .post_json("/v1/actors/brittle/b1", &json!({"input": huge}))
        .await;
    assert_eq!(
        (r.status, r.json["error"]["reason"].as_str()),
        (502, Some("turn_failed")),
        "{}",
        r.json
    );

    // An answer too large to keep (here 70 kB against 64 KiB values):
    // the run fails at once, its usage counted, and no turn fails (the
    // step's turn failed, and the run waited for `max_run_ms`).
    rig.fake.push([Scripted::Text("x".repeat(70_000))]);
    let before = rig.events("brittle", "b1").await.len();
    let r = rig
        .api
        .post_json("/v1/actors/brittle/b1", &json!({"input": "hi"}))
        .await;
    assert_eq!(
        (r.status, r.json["error"]["reason"].as_str()),
        (502, Some("model_error")),
        "{}",
        r.json
    );
    let evs = rig.events("brittle", "b1").await;
    let k = kinds(&evs[before..]);
    assert_eq!(k, ["run_started", "run_failed"], "{k:?}");
    let failed = &evs.last().unwrap()["data"];
    assert!(
        failed["error"]
            .as_str()
            .unwrap()
            .starts_with("the model's answer cannot be kept"),
        "{failed}"
    );
    assert!(
        failed["usage"]["output_tokens"].as_u64().unwrap() > 0,
        "{failed}"
    );

    // The agent takes the next input.
    rig.fake.push([Scripted::Text("fine".into())]);
    let r = rig
        .api
        .post_json("/v1/actors/brittle/b1", &json!({"input": "again"}))
        .await;
    assert_eq!(
        (r.status, r.json["output"].as_str()),
        (200, Some("fine")),
        "{}",
        r.json
    );
}

/// A step whose turn fails for a reason the harness cannot see (here its
/// turn timeout; a trap, crashes past the recovery limit) is sent once
/// more by a watchdog, and the run goes on; it used to stay open until
/// `limits.max_run_ms` (an hour), the caller waiting and later inputs
/// queued behind it.
#[tokio::test]
async fn a_step_whose_turn_failed_is_sent_again() {
    let rig = Rig::new().await;
    let manifest = json!({"kind": "agent",
        "agent": {"model": {"provider": "fake", "name": "m1"}},
        "config": {"turn_timeout_ms": 1000}});
    assert_eq!(
        put(&rig.api, "/v1/types/slowstep", manifest).await.status,
        201
    );
    rig.fake.push([
        Scripted::Delay(
            Duration::from_secs(3),
            Box::new(Scripted::Text("too late".into())),
        ),
        Scripted::Text("second try".into()),
    ]);
    let t = Instant::now();
    let r = rig
        .api
        .post_json("/v1/actors/slowstep/s", &json!({"input": "hi"}))
        .await;
    assert_eq!(
        (r.status, r.json["output"].as_str()),
        (200, Some("second try")),
        "{}",
        r.json
    );
    assert!(t.elapsed() < Duration::from_secs(60), "{:?}", t.elapsed());
    let k = kinds(&rig.events("slowstep", "s").await);
    assert_eq!(
        k,
        [
            "run_started",
            "turn_failed",
            "step_retry",
            "model_step",
            "run_finished"
        ]
    );
}

/// Some OpenAI-compatible servers send empty tool-call ids, or the same
/// ids at every step: each call still runs once, with its own idempotency
/// key.
#[tokio::test]
async fn repeated_or_empty_call_ids_are_made_unique() {
    let rig = Rig::new().await;
    assert_eq!(
        rig.agent("sloppy", json!([rig.ticket_tool(json!({}))]))
            .await
            .status,
        201
    );
    let call = |id: &str, title: &str| {
        (
            id.to_owned(),
            "create_ticket".to_owned(),
            json!({"title": title}),
        )
    };
    rig.fake.push([
        Scripted::ToolCalls {
            text: String::new(),
            calls: vec![call("call_0", "a")],
        },
        Scripted::ToolCalls {
            text: String::new(),
            calls: vec![call("call_0", "b")],
        },
        Scripted::ToolCalls {
            text: String::new(),
            calls: vec![call("", "c"), call("", "d")],
        },
        Scripted::Text("done".into()),
    ]);
    let r = rig
        .api
        .post_json("/v1/actors/sloppy/s", &json!({"input": "four tickets"}))
        .await;
    assert_eq!(
        (r.status, r.json["output"].as_str()),
        (200, Some("done")),
        "{}",
        r.json
    );
    let posts = rig.tickets.posts();
    let titles: Vec<&str> = posts
        .iter()
        .map(|(_, b)| b["title"].as_str().unwrap())
        .collect();
    assert_eq!(titles, ["a", "b", "c", "d"], "{posts:?}");
    let keys: std::collections::HashSet<&str> = posts.iter().map(|(k, _)| k.as_str()).collect();
    assert_eq!(keys.len(), 4, "{posts:?}");
}

/// `marmot dev` with no credentials: the assistant example runs against
/// the fake model, writes a report to `outputs/`, opens a ticket at the
/// demo desk after an approval, and takes a signed ticket webhook.
#[tokio::test]
async fn the_dev_assistant_works_without_credentials() {
    let dir = tempdir();
    let node = Marmot::start_with_examples(&dir.path().join("data")).await;
    let api = node.client();
    let ty = api.get("/v1/types/assistant").await;
    assert_eq!(ty.json["kind"], "agent", "{}", ty.json);
    assert_eq!(
        api.get("/v1/providers/default").await.json["format"],
        "openai-chat"
    );

    let r = api
        .post_json(
            "/v1/actors/assistant/alice",
            &json!({"input": "Write a report to outputs/report.md please"}),
        )
        .await;
    assert_eq!(r.status, 200, "{}", r.json);
    let report = api
        .get("/v1/actors/assistant/alice/files/outputs/report.md")
        .await;
    assert_eq!(report.status, 200);
    assert!(String::from_utf8_lossy(&report.body).starts_with("# Report"));

    let r = api
        .post_json(
            "/v1/actors/assistant/alice?wait=false",
            &json!({"input": "Open a ticket: the printer is on fire"}),
        )
        .await;
    assert_eq!(r.status, 202);
    let deadline = Instant::now() + Duration::from_secs(20);
    let input_id = loop {
        let inputs = api.get("/v1/actors/assistant/alice/inputs").await.json;
        if let Some(i) = inputs["inputs"].as_array().and_then(|l| l.first()) {
            break i["id"].as_str().unwrap().to_owned();
        }
        assert!(Instant::now() < deadline, "no approval asked: {inputs}");
        tokio::time::sleep(Duration::from_millis(25)).await;
    };
    let r = api
        .post_json(
            &format!("/v1/actors/assistant/alice/inputs/{input_id}"),
            &json!({"approved": true}),
        )
        .await;
    assert_eq!(r.status, 200, "{}", r.json);
    let desk = reqwest::Client::new();
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        let t: Value = desk
            .get("http://127.0.0.77:7879/desk/tickets")
            .send()
            .await
            .unwrap()
            .json()
            .await
            .unwrap();
        if t["tickets"].as_array().is_some_and(|l| l.len() == 1) {
            assert!(
                t["tickets"][0]["title"]
                    .as_str()
                    .unwrap()
                    .contains("printer")
            );
            break;
        }
        assert!(Instant::now() < deadline, "no ticket: {t}");
        tokio::time::sleep(Duration::from_millis(25)).await;
    }

    // The daily summary is scheduled once the actor exists.
    let alarms = api.get("/v1/actors/assistant/alice/alarms").await.json;
    assert!(
        alarms.to_string().contains("agent-schedule/daily-summary"),
        "{alarms}"
    );

    // A ticket webhook, routed to the requester's assistant.
    let manifest: Value =
        serde_json::from_str(include_str!("../examples/assistant/assistant.json")).unwrap();
    let secret = manifest["config"]["webhook_secret"].as_str().unwrap();
    let body =
        serde_json::to_vec(&json!({"ticket": {"requester": "bob", "status": "solved"}})).unwrap();
    let ts = common::now_s();
    let sig = marmot::webhooks::sign(&marmot::webhooks::secret_key(secret), "msg_1", ts, &body);
    let r = api
        .req(
            reqwest::Method::POST,
            "/v1/hooks/assistant/_/ticket",
            Some(("application/json", body)),
            &[
                ("webhook-id", "msg_1"),
                ("webhook-timestamp", &ts.to_string()),
                ("webhook-signature", &sig),
            ],
        )
        .await;
    assert_eq!(r.status, 202, "{}", r.json);
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        let f = api
            .get("/v1/actors/assistant/bob/files/outputs/ticket-updates.md")
            .await;
        if f.status == 200 {
            break;
        }
        assert!(Instant::now() < deadline, "the webhook started no run");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// `examples/js-agent`: a JavaScript actor running its own loop with
/// `model.chat` and tools written in JavaScript.
#[tokio::test]
async fn the_javascript_agent_example_runs_its_own_loop() {
    let rig = Rig::new().await;
    let r = put(
        &rig.api,
        "/v1/providers/default",
        json!({"format": "anthropic-messages", "base_url": rig.fake.base_url("127.0.0.1")}),
    )
    .await;
    assert_eq!(r.status, 201);
    let source = include_str!("../examples/js-agent/agent.js");
    let r = rig.api.deploy_js("js-agent", source).await;
    assert_eq!(r.status, 201, "{}", r.json);
    rig.fake.push([
        Scripted::ToolCalls {
            text: String::new(),
            calls: vec![(
                "toolu_1".into(),
                "multiply".into(),
                json!({"a": 19, "b": 23}),
            )],
        },
        Scripted::Text("437".into()),
    ]);
    let r = rig
        .api
        .post_json(
            "/v1/actors/js-agent/alice",
            &json!({"ask": "What is 19 * 23?"}),
        )
        .await;
    assert_eq!(r.status, 200, "{}", r.json);
    assert_eq!(r.json["answer"], "437");
    let last = rig.fake.requests().last().unwrap().body.clone();
    // The tool's result went back to the model (Anthropic's format here).
    assert_eq!(
        last["messages"][2]["content"][0]["content"], r#"{"product":437}"#,
        "{last}"
    );
    let transcript = rig
        .api
        .get("/v1/actors/js-agent/alice/state/transcript")
        .await;
    assert_eq!(transcript.status, 200);
}

/// A script from the code tool cannot send, by itself, the request an
/// http tool needs an approval for.
#[tokio::test]
async fn scripts_cannot_bypass_an_approval() {
    let rig = Rig::new().await;
    let tools = json!([rig.ticket_tool(json!({"needs_approval": true})), {"kind": "code"}]);
    assert_eq!(rig.agent("gated", tools).await.status, 201);
    let url = format!("http://127.0.0.1:{}/tickets", rig.port);
    let code = format!(
        "const r = await fetch({url:?}, {{ method: 'POST', body: '{{\"title\": \"sneaky\"}}' }}); r.status"
    );
    let r = rig.run_script("gated", "g1", &code).await;
    assert_eq!(r.status, 200, "{}", r.json);
    let result = rig.wait_event("gated", "g1", "tool_result", 1).await;
    assert_eq!(result["data"]["is_error"], true, "{result}");
    assert!(
        result["data"]["content"]
            .to_string()
            .contains("`http` is not granted"),
        "{result}"
    );
    assert!(
        rig.tickets.posts().is_empty(),
        "the script reached the gated endpoint"
    );
}

/// The calls of one answer past `limits.max_tool_calls_per_step` are
/// answered "not run" and never made (a model answering with 200 calls a
/// step made 600 in a run of three steps: a probe).
#[tokio::test]
async fn calls_past_a_steps_limit_are_not_made() {
    let rig = Rig::new().await;
    let tool = rig.ticket_tool(json!({}));
    let manifest = json!({"kind": "agent", "agent": {
        "model": {"provider": "fake", "name": "m1"}, "tools": [tool],
        "limits": {"max_tool_calls_per_step": 2}},
        "config": {"allowed_hosts": ["127.0.0.1"]}});
    let r = put(&rig.api, "/v1/types/busy", manifest).await;
    assert_eq!(r.status, 201, "{}", r.json);
    let calls = (0..5)
        .map(|i| {
            (
                format!("call_{i}"),
                "create_ticket".to_owned(),
                json!({"title": format!("t{i}")}),
            )
        })
        .collect();
    rig.fake.push([
        Scripted::ToolCalls {
            text: String::new(),
            calls,
        },
        Scripted::Text("Two made.".into()),
    ]);
    let r = rig
        .api
        .post_json("/v1/actors/busy/a", &json!({"input": "go"}))
        .await;
    assert_eq!(
        (r.status, r.json["output"].as_str()),
        (200, Some("Two made.")),
        "{}",
        r.json
    );
    assert_eq!(rig.tickets.posts().len(), 2, "only the first two were made");
    let events = rig.events("busy", "a").await;
    let results: Vec<String> = events
        .iter()
        .filter(|e| e["kind"] == "tool_result")
        .map(|e| e["data"].to_string())
        .collect();
    assert_eq!(results.len(), 5, "{events:#?}");
    for text in &results[2..] {
        assert!(text.contains("at most 2 tool calls"), "{text}");
    }
    let r = put(
        &rig.api,
        "/v1/types/busy2",
        json!({"kind": "agent", "agent": {"model": {"provider": "fake", "name": "m1"},
               "limits": {"max_tool_calls_per_step": 0}}}),
    )
    .await;
    assert_eq!(r.status, 400, "{}", r.json);
}
