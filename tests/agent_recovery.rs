//! The built-in agent harness through crashes and outages: `kill -9` in
//! the middle of a tool call and after every kind of committed step, and a
//! provider that is down for a while.

mod common;

use std::collections::HashMap;
use std::time::{Duration, Instant};

use common::agent::{Rig, kinds, put};
use marmot::fake_provider::Scripted;
use serde_json::{Value, json};

#[tokio::test]
async fn a_tool_call_cut_off_by_kill_9_is_never_blindly_repeated() {
    let mut rig = Rig::new().await;
    // One tool asks the server whether the call arrived; the other cannot.
    let reconcile = json!({"method": "GET", "url": format!("http://127.0.0.1:{}/tickets/by-key/{{idempotency_key}}", rig.port)});
    let tools = json!([rig.ticket_tool(json!({"reconcile": reconcile})),
                       {"kind": "http", "name": "plain_ticket", "method": "POST",
                        "url": format!("http://127.0.0.1:{}/tickets", rig.port)}]);
    assert_eq!(rig.agent("sturdy", tools).await.status, 201);
    *rig.tickets.delay_ms.lock().unwrap() = 60_000;

    for (n, tool) in [(1usize, "create_ticket"), (2, "plain_ticket")] {
        rig.fake.push([
            Scripted::ToolCalls {
                text: String::new(),
                calls: vec![(
                    format!("call_{n}"),
                    tool.into(),
                    json!({"title": format!("t{n}")}),
                )],
            },
            Scripted::Text(format!("done {n}")),
        ]);
        let id = format!("k{n}");
        let r = rig
            .api
            .post_json(
                &format!("/v1/actors/sturdy/{id}?wait=false"),
                &json!({"input": "go"}),
            )
            .await;
        assert_eq!(r.status, 202);
        // The request reached the server, which has not answered: kill -9.
        let deadline = Instant::now() + Duration::from_secs(20);
        while rig.tickets.posts().len() < n {
            assert!(Instant::now() < deadline, "the tool call never arrived");
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        rig.node.kill9();
        *rig.tickets.delay_ms.lock().unwrap() = 0;
        rig.node.restart().await;
        rig.api = rig.node.client();
        if tool == "create_ticket" {
            // Reconciled by its idempotency key: the server had it.
            let res = rig.wait_event("sturdy", &id, "tool_result", 1).await;
            assert_eq!(res["data"]["content"]["reconciled"], true, "{res}");
        } else {
            // No way to ask: a person is asked whether it happened.
            let unsure = rig.wait_event("sturdy", &id, "tool_uncertain", 1).await;
            let input_id = unsure["data"]["input_id"].as_str().unwrap();
            let r = rig
                .api
                .post_json(
                    &format!("/v1/actors/sturdy/{id}/inputs/{input_id}"),
                    &json!({"happened": true, "result": {"id": 2}}),
                )
                .await;
            assert_eq!(r.status, 200, "{}", r.json);
        }
        let done = rig.wait_event("sturdy", &id, "run_finished", 1).await;
        assert_eq!(done["data"]["output"], format!("done {n}"));
        assert_eq!(
            rig.tickets.posts().len(),
            n,
            "the call was repeated: {:?}",
            rig.tickets.posts()
        );
        *rig.tickets.delay_ms.lock().unwrap() = 60_000;
    }
    let by_key: HashMap<String, usize> =
        rig.tickets
            .posts()
            .into_iter()
            .fold(HashMap::new(), |mut m, (k, _)| {
                *m.entry(k).or_default() += 1;
                m
            });
    assert!(by_key.values().all(|&c| c == 1), "{by_key:?}");
}

/// `kill -9` right after each kind of committed step: the run finishes
/// after the restart, and the ticket is posted exactly once.
/// A tool's turn that fails (here its turn timeout, the request already at
/// the server) is sent again by the run's watchdog, marked as such: the
/// tool is not run blindly but reconciled, and the run goes on. It stayed
/// open until `limits.max_run_ms`.
#[tokio::test]
async fn a_tool_turn_that_failed_is_sent_again_and_not_run_blindly() {
    let rig = Rig::new().await;
    let reconcile = json!({"method": "GET", "url": format!("http://127.0.0.1:{}/tickets/by-key/{{idempotency_key}}", rig.port)});
    let manifest = json!({"kind": "agent",
        "agent": {"model": {"provider": "fake", "name": "m1"},
                  "tools": [rig.ticket_tool(json!({"reconcile": reconcile}))]},
        "config": {"allowed_hosts": ["127.0.0.1"], "turn_timeout_ms": 1000}});
    assert_eq!(put(&rig.api, "/v1/types/timid", manifest).await.status, 201);
    // The desk keeps the ticket, then answers after the tool's turn timed out.
    *rig.tickets.delay_ms.lock().unwrap() = 3000;
    rig.fake.push([
        Scripted::ToolCalls {
            text: String::new(),
            calls: vec![(
                "call_t".into(),
                "create_ticket".into(),
                json!({"title": "t"}),
            )],
        },
        Scripted::Text("filed".into()),
    ]);
    let r = rig
        .api
        .post_json("/v1/actors/timid/t1", &json!({"input": "file it"}))
        .await;
    assert_eq!(
        (r.status, r.json["output"].as_str()),
        (200, Some("filed")),
        "{}",
        r.json
    );
    assert_eq!(rig.tickets.posts().len(), 1, "the ticket was filed twice");
    let evs = rig.events("timid", "t1").await;
    let k = kinds(&evs);
    let at = |kind: &str| {
        k.iter()
            .position(|x| x == kind)
            .unwrap_or_else(|| panic!("{k:?}"))
    };
    assert!(
        at("turn_failed") < at("step_retry") && at("step_retry") < at("tool_result"),
        "{k:?}"
    );
    let result = &evs[at("tool_result")]["data"]["content"];
    assert_eq!(result["reconciled"], true, "{result}");
}

#[tokio::test]
async fn kill_9_at_every_step_boundary_repeats_no_effect() {
    let mut rig = Rig::new().await;
    let reconcile = json!({"method": "GET", "url": format!("http://127.0.0.1:{}/tickets/by-key/{{idempotency_key}}", rig.port)});
    assert_eq!(
        rig.agent(
            "tough",
            json!([rig.ticket_tool(json!({"reconcile": reconcile}))])
        )
        .await
        .status,
        201
    );
    // Slow answers and a slow ticket desk: the kill lands inside the next
    // step as often as between steps.
    rig.fake
        .set_timing(Duration::from_millis(150), Duration::ZERO);
    *rig.tickets.delay_ms.lock().unwrap() = 150;
    for (n, boundary) in ["run_started", "model_step", "tool_call", "tool_result"]
        .iter()
        .enumerate()
    {
        let id = format!("b{n}");
        let input = format!(r#"call create_ticket {{"title": "t{n}"}}"#);
        let r = rig
            .api
            .post_json(
                &format!("/v1/actors/tough/{id}?wait=false"),
                &json!({"input": input}),
            )
            .await;
        assert_eq!(r.status, 202);
        let run_id = r.json["run_id"].as_str().unwrap().to_owned();
        rig.wait_event("tough", &id, boundary, 1).await;
        rig.node.kill9();
        rig.node.restart().await;
        rig.api = rig.node.client();
        let done = rig.wait_event("tough", &id, "run_finished", 1).await;
        assert_eq!(done["data"]["run_id"], run_id.as_str());
        let posts: Vec<_> = rig
            .tickets
            .posts()
            .into_iter()
            .filter(|(k, _)| k.starts_with(&run_id))
            .collect();
        assert_eq!(posts.len(), 1, "after a kill at {boundary}: {posts:?}");
        let evs = rig.events("tough", &id).await;
        for kind in ["tool_result", "run_finished"] {
            assert_eq!(
                evs.iter().filter(|e| e["kind"] == *kind).count(),
                1,
                "{kind} after a kill at {boundary}: {evs:#?}"
            );
        }
    }
}

/// A transcript past `context_tokens` is summarized by the model before
/// the next step; a provider down for a while pauses the step and the run
/// goes on when it is back.
#[tokio::test]
async fn long_transcripts_are_compacted_and_outages_are_waited_out() {
    let rig = Rig::new().await;
    let manifest = json!({"kind": "agent", "agent": {"model": {"provider": "fake", "name": "m1"},
                                                    "limits": {"context_tokens": 60}}});
    assert_eq!(put(&rig.api, "/v1/types/brief", manifest).await.status, 201);
    for i in 0..3 {
        let r = rig
            .api
            .post_json(
                "/v1/actors/brief/x",
                &json!({"input": format!("message number {i} with some words in it")}),
            )
            .await;
        assert_eq!(r.status, 200, "{}", r.json);
    }
    let evs = rig.events("brief", "x").await;
    let compacted: Vec<&Value> = evs.iter().filter(|e| e["kind"] == "compacted").collect();
    assert!(!compacted.is_empty(), "{:#?}", kinds(&evs));
    // The summary replaced what it summarized: the model's last request
    // starts with it.
    let last = rig.fake.requests().last().unwrap().body.clone();
    let first = last["messages"]
        .as_array()
        .unwrap()
        .iter()
        .find(|m| m["role"] != "system")
        .and_then(|m| m["content"].as_str())
        .unwrap_or_default()
        .to_owned();
    assert!(
        first.starts_with("Summary of the earlier conversation"),
        "{last}"
    );

    // Down for longer than the gateway's retries: the step waits (an alarm)
    // and the run finishes once the provider answers.
    rig.fake.push((0..3).map(|_| Scripted::Error {
        status: 503,
        retry_after: None,
    }));
    let r = rig
        .api
        .post_json("/v1/actors/brief/y", &json!({"input": "hello"}))
        .await;
    assert_eq!(r.status, 200, "{}", r.json);
    assert_eq!(r.json["output"], "You said: hello");
    let k = kinds(&rig.events("brief", "y").await);
    assert_eq!(
        k,
        ["run_started", "model_retry", "model_step", "run_finished"]
    );

    // So is one still refusing for its rate limit after the gateway's
    // retries (that failed the run at once).
    rig.fake.push((0..3).map(|_| Scripted::Error {
        status: 429,
        retry_after: None,
    }));
    let r = rig
        .api
        .post_json("/v1/actors/brief/z", &json!({"input": "hello"}))
        .await;
    assert_eq!(r.status, 200, "{}", r.json);
    let k = kinds(&rig.events("brief", "z").await);
    assert_eq!(
        k,
        ["run_started", "model_retry", "model_step", "run_finished"]
    );
}
