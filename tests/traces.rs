//! OpenTelemetry traces over OTLP/HTTP to a local collector that decodes
//! the real protobuf: a span per turn with its times, the caller's
//! `traceparent` as its parent, carried into `actors.call`, the `http`
//! capability and outbound webhooks (stored with the outbox row).

mod common;

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use common::{Marmot, tempdir};
use opentelemetry_proto::tonic::collector::trace::v1::ExportTraceServiceRequest;
use opentelemetry_proto::tonic::common::v1::any_value::Value as AnyValue;
use prost::Message as _;
use reqwest::Method;
use serde_json::json;

/// A span as the collector got it.
#[derive(Clone, Debug)]
struct Span {
    name: String,
    trace_id: String,
    span_id: String,
    parent_span_id: String,
    attributes: HashMap<String, String>,
    /// The span's status code (0 unset, 1 ok, 2 error).
    status: i32,
}

/// An OTLP/HTTP collector on loopback, plus an HTTP server for the actor's
/// `fetch` and a webhook receiver: both record the `traceparent` they get.
#[derive(Default)]
struct Collector {
    spans: Mutex<Vec<Span>>,
    services: Mutex<Vec<String>>,
    traceparents: Mutex<HashMap<String, String>>,
}

async fn start_collector() -> (String, Arc<Collector>) {
    let c = Arc::new(Collector::default());
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let url = format!("http://{}", listener.local_addr().unwrap());
    let st = c.clone();
    let app = axum::Router::new()
        .route(
            "/v1/traces",
            axum::routing::post(
                move |headers: axum::http::HeaderMap, body: axum::body::Bytes| {
                    let st = st.clone();
                    async move {
                        assert_eq!(headers["content-type"], "application/x-protobuf");
                        let req = ExportTraceServiceRequest::decode(body).expect("OTLP protobuf");
                        for rs in req.resource_spans {
                            for a in rs.resource.iter().flat_map(|r| &r.attributes) {
                                if a.key == "service.name" {
                                    st.services.lock().unwrap().push(text(a.value.as_ref()));
                                }
                            }
                            for ss in rs.scope_spans {
                                for s in ss.spans {
                                    st.spans.lock().unwrap().push(Span {
                                        name: s.name,
                                        trace_id: hex(&s.trace_id),
                                        span_id: hex(&s.span_id),
                                        parent_span_id: hex(&s.parent_span_id),
                                        attributes: s
                                            .attributes
                                            .iter()
                                            .map(|a| (a.key.clone(), text(a.value.as_ref())))
                                            .collect(),
                                        status: s.status.map_or(0, |s| s.code),
                                    });
                                }
                            }
                        }
                        axum::http::StatusCode::OK
                    }
                },
            ),
        )
        .route(
            "/{what}",
            axum::routing::post({
                let st = c.clone();
                move |axum::extract::Path(what): axum::extract::Path<String>,
                      headers: axum::http::HeaderMap| {
                    let st = st.clone();
                    async move {
                        if let Some(tp) = headers.get("traceparent") {
                            st.traceparents
                                .lock()
                                .unwrap()
                                .insert(what, tp.to_str().unwrap().to_owned());
                        }
                        "{}"
                    }
                }
            }),
        );
    tokio::spawn(async move { axum::serve(listener, app).await.unwrap() });
    (url, c)
}

fn hex(b: &[u8]) -> String {
    b.iter().map(|x| format!("{x:02x}")).collect()
}

fn text(v: Option<&opentelemetry_proto::tonic::common::v1::AnyValue>) -> String {
    match v.and_then(|v| v.value.as_ref()) {
        Some(AnyValue::StringValue(s)) => s.clone(),
        Some(AnyValue::IntValue(i)) => i.to_string(),
        Some(AnyValue::BoolValue(b)) => b.to_string(),
        Some(AnyValue::DoubleValue(d)) => d.to_string(),
        other => format!("{other:?}"),
    }
}

const CALLER_JS: &str = r#"
import { actors, events } from "marmot";
export default {
  async onMessage(body) {
    const reply = await actors.call("callee", "b", { hi: 1 });
    const r = await fetch(body.fetch, { method: "POST", body: "{}" });
    events.emit("traced.done", { status: r.status });
    return { reply, status: r.status };
  },
};
"#;

const CALLEE_JS: &str = r#"
import { state } from "marmot";
export default {
  onMessage() {
    state.set("n", (state.get("n") ?? 0) + 1);
    return { n: state.get("n") };
  },
};
"#;

/// The caller (calls the callee, fetches a local URL, emits an event) and
/// the callee.
async fn deploy_both(api: &common::Api) {
    for (ty, code, config) in [
        ("callee", CALLEE_JS, json!({})),
        (
            "caller",
            CALLER_JS,
            json!({"allowed_hosts": ["127.0.0.1"], "allowed_methods": ["POST"]}),
        ),
    ] {
        let manifest = json!({"kind": "js", "code": code, "config": config});
        let r = api.deploy_manifest(ty, &manifest).await;
        assert_eq!(r.status, 201, "{}", r.json);
    }
}

#[tokio::test]
async fn turns_are_traced_under_the_callers_traceparent_and_carry_it_onwards() {
    let (collector_url, c) = start_collector().await;
    let dir = tempdir();
    let config = "[egress]\nallow_private = [\"127.0.0.1/32\"]\n";
    let m = Marmot::start_opts(
        &dir.path().join("data"),
        &[
            ("OTEL_EXPORTER_OTLP_ENDPOINT", collector_url.as_str()),
            ("OTEL_SERVICE_NAME", "marmot-test"),
            ("OTEL_BSP_SCHEDULE_DELAY", "100"),
            ("MARMOT_WEBHOOK_RETRY_BASE_MS", "40"),
        ],
        Some(config),
    )
    .await;
    let api = m.client();
    deploy_both(&api).await;
    let r = api
        .req(
            Method::PUT,
            "/v1/subscriptions/traced",
            Some((
                "application/json",
                serde_json::to_vec(
                    &json!({"url": format!("{collector_url}/hook"), "events": ["traced.*"]}),
                )
                .unwrap(),
            )),
            &[],
        )
        .await;
    assert!(r.status < 300, "{}", r.json);

    let trace_id = "4bf92f3577b34da6a3ce929d0e0e4736";
    let parent = "00f067aa0ba902b7";
    let r = api
        .post_with(
            "/v1/actors/caller/a",
            &json!({"fetch": format!("{collector_url}/fetch")}),
            &[("traceparent", &format!("00-{trace_id}-{parent}-01"))],
        )
        .await;
    assert_eq!(r.status, 200, "{}", r.json);
    assert_eq!(r.json["status"], 200, "{}", r.json);

    // Wait for the turns, the request span and the outbound webhook.
    let deadline = Instant::now() + Duration::from_secs(20);
    let spans = loop {
        let spans = c.spans.lock().unwrap().clone();
        let turns = spans.iter().filter(|s| s.name == "turn").count();
        let hooked = spans.iter().any(|s| s.name == "webhook_out");
        if turns >= 2 && hooked && c.traceparents.lock().unwrap().contains_key("hook") {
            break spans;
        }
        assert!(
            Instant::now() < deadline,
            "spans so far: {spans:#?}\nnode log:\n{}",
            m.log_text()
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    };
    assert!(
        c.services
            .lock()
            .unwrap()
            .iter()
            .any(|s| s == "marmot-test")
    );

    // The request span hangs under the caller's span, in the caller's trace.
    let request = spans
        .iter()
        .find(|s| s.name == "request")
        .expect("request span");
    assert_eq!(request.trace_id, trace_id);
    assert_eq!(request.parent_span_id, parent);
    let turn = |ty: &str| {
        spans
            .iter()
            .find(|s| {
                s.name == "turn" && s.attributes.get("actor_type").map(String::as_str) == Some(ty)
            })
            .unwrap_or_else(|| panic!("no turn span of {ty}: {spans:#?}"))
    };
    let caller = turn("caller");
    assert_eq!(caller.trace_id, trace_id);
    assert_eq!(caller.parent_span_id, request.span_id);
    assert_eq!(caller.attributes["actor_id"], "a");
    assert_eq!(caller.attributes["kind"], "message");
    for field in ["version", "wait_us", "run_us", "commit_us", "cpu_us"] {
        assert!(
            caller.attributes.contains_key(field),
            "turn span lacks {field}: {caller:?}"
        );
    }
    // actors.call: the callee's turn is a child of the caller's.
    let callee = turn("callee");
    assert_eq!(callee.trace_id, trace_id);
    assert_eq!(callee.parent_span_id, caller.span_id);

    // The fetch carried the caller's turn as its parent.
    let fetched = c.traceparents.lock().unwrap()["fetch"].clone();
    assert_eq!(fetched, format!("00-{trace_id}-{}-01", caller.span_id));
    // The outbound webhook continues the trace of the turn that emitted
    // the event (stored with the outbox row), and carries its attempt's
    // span.
    let hook = spans.iter().find(|s| s.name == "webhook_out").unwrap();
    assert_eq!(hook.attributes["actor_type"], "caller");
    assert_eq!(hook.trace_id, trace_id);
    assert_eq!(hook.parent_span_id, caller.span_id);
    let sent = c.traceparents.lock().unwrap()["hook"].clone();
    assert_eq!(sent, format!("00-{}-{}-01", hook.trace_id, hook.span_id));
}

#[tokio::test]
async fn without_an_endpoint_no_traceparent_is_sent() {
    let (collector_url, c) = start_collector().await;
    let dir = tempdir();
    let config = "[egress]\nallow_private = [\"127.0.0.1/32\"]\n";
    let m = Marmot::start_opts(&dir.path().join("data"), &[], Some(config)).await;
    let api = m.client();
    deploy_both(&api).await;
    let r = api
        .post_with(
            "/v1/actors/caller/a",
            &json!({"fetch": format!("{collector_url}/fetch")}),
            &[(
                "traceparent",
                "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01",
            )],
        )
        .await;
    assert_eq!(r.status, 200, "{}", r.json);
    // The fetch reached the local server (the control), without a
    // `traceparent`: with export off, nothing is sampled, and the caller's
    // trace goes no further than the node.
    assert_eq!(r.json["status"], 200, "{}", r.json);
    assert!(c.traceparents.lock().unwrap().is_empty());
}

/// A failed turn's span says so (status ERROR: what trace backends filter
/// by; it was unset), and traces do not follow the log's level: with
/// `--log warn` none were exported, and the trap's warning named no actor
/// (found by a probe).
#[tokio::test]
async fn failed_turns_are_errors_in_traces_whatever_the_log_level() {
    let (collector_url, c) = start_collector().await;
    let dir = tempdir();
    let m = Marmot::start_opts(
        &dir.path().join("data"),
        &[
            ("OTEL_EXPORTER_OTLP_ENDPOINT", collector_url.as_str()),
            ("OTEL_BSP_SCHEDULE_DELAY", "100"),
            ("MARMOT_LOG", "warn"),
        ],
        None,
    )
    .await;
    let api = m.client();
    assert_eq!(
        api.deploy("kit", common::TESTKIT, json!({})).await.status,
        201
    );
    let r = api
        .op(
            "kit",
            "k",
            json!({"op": "set_then_trap", "key": "k", "value": 1}),
        )
        .await;
    assert_eq!(r.status, 500, "{}", r.json);
    assert_eq!(api.add("kit", "k", 1).await.status, 200);
    let deadline = Instant::now() + Duration::from_secs(20);
    let turns = loop {
        let turns: Vec<Span> = c
            .spans
            .lock()
            .unwrap()
            .iter()
            .filter(|s| s.name == "turn" && s.attributes.get("actor_id").is_some_and(|i| i == "k"))
            .cloned()
            .collect();
        if turns.len() >= 2 {
            break turns;
        }
        assert!(Instant::now() < deadline, "turn spans: {turns:#?}");
        tokio::time::sleep(Duration::from_millis(100)).await;
    };
    let statuses: Vec<i32> = turns.iter().map(|t| t.status).collect();
    assert!(statuses.contains(&2), "{turns:#?}");
    assert!(statuses.contains(&0), "the turn that succeeded: {turns:#?}");
    let log = m.log_text();
    let line = log
        .lines()
        .find(|l| l.contains("turn trapped"))
        .unwrap_or_else(|| panic!("no trap logged:\n{log}"));
    assert!(line.contains("actor=kit/k"), "{line}");
}
