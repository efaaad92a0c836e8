//! Fetches a turn does not await one by one run side by side: JavaScript's
//! `Promise.all` of fetches and Rust's `http::send_all` take as long as
//! the slowest request, not the sum. Each answer goes to its own promise
//! (a refused or failed one rejects alone), timers still fire while
//! fetches are under way, and a fetch the turn leaves behind is cancelled
//! with it.

use std::convert::Infallible;
use std::net::Ipv4Addr;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use crate::common::{Api, Marmot, TESTKIT, tempdir};
use bytes::Bytes;
use http_body_util::Full;
use serde_json::{Value, json};

/// Where the test server listens (the node may reach exactly it).
const SERVER_IP: Ipv4Addr = Ipv4Addr::new(127, 0, 0, 5);

/// What the server saw: requests in flight now, the most at once, and the
/// requests whose client went away before their answer.
#[derive(Default)]
struct Seen {
    in_flight: AtomicUsize,
    most: AtomicUsize,
    abandoned: AtomicUsize,
}

/// Counts a request in flight; one dropped before it answered was
/// abandoned by its client.
struct InFlight {
    seen: Arc<Seen>,
    answered: bool,
}

impl InFlight {
    fn new(seen: &Arc<Seen>) -> Self {
        let now = seen.in_flight.fetch_add(1, Ordering::SeqCst) + 1;
        seen.most.fetch_max(now, Ordering::SeqCst);
        Self {
            seen: seen.clone(),
            answered: false,
        }
    }
}

impl Drop for InFlight {
    fn drop(&mut self) {
        self.seen.in_flight.fetch_sub(1, Ordering::SeqCst);
        if !self.answered {
            self.seen.abandoned.fetch_add(1, Ordering::SeqCst);
        }
    }
}

/// `/slow?ms=N` answers `slow` after N ms; `/hang` answers after a minute;
/// `/big?mb=N` answers N MiB at once.
async fn serve(seen: Arc<Seen>) -> u16 {
    let listener = tokio::net::TcpListener::bind((SERVER_IP, 0)).await.unwrap();
    let port = listener.local_addr().unwrap().port();
    tokio::spawn(async move {
        while let Ok((tcp, _)) = listener.accept().await {
            let seen = seen.clone();
            tokio::spawn(async move {
                let service = hyper::service::service_fn(move |req| {
                    let seen = seen.clone();
                    async move {
                        let mut guard = InFlight::new(&seen);
                        if req.uri().path() == "/big" {
                            guard.answered = true;
                            let mb: usize = req
                                .uri()
                                .query()
                                .and_then(|q| q.strip_prefix("mb="))
                                .and_then(|v| v.parse().ok())
                                .unwrap_or(1);
                            let body = Bytes::from(vec![b'x'; mb << 20]);
                            return Ok(hyper::Response::new(Full::new(body)));
                        }
                        let ms = match req.uri().path() {
                            "/hang" => 60_000,
                            _ => req
                                .uri()
                                .query()
                                .and_then(|q| q.strip_prefix("ms="))
                                .and_then(|v| v.parse().ok())
                                .unwrap_or(0),
                        };
                        // The whole request first (an answer before it
                        // closed the connection on a body being sent).
                        let _ = http_body_util::BodyExt::collect(req.into_body()).await;
                        tokio::time::sleep(Duration::from_millis(ms)).await;
                        guard.answered = true;
                        Ok::<_, Infallible>(hyper::Response::new(Full::new(Bytes::from_static(
                            b"slow",
                        ))))
                    }
                });
                let io = hyper_util::rt::TokioIo::new(tcp);
                let _ = hyper::server::conn::http1::Builder::new()
                    .serve_connection(io, service)
                    .await;
            });
        }
    });
    port
}

async fn node(seen: &Arc<Seen>) -> (tempfile::TempDir, Marmot, Api, String) {
    let dir = tempdir();
    let port = serve(seen.clone()).await;
    let config = format!("[egress]\nallow_private = [\"{SERVER_IP}/32\"]\n");
    let node = Marmot::start_opts(&dir.path().join("data"), &[], Some(&config)).await;
    let api = node.client();
    (dir, node, api, format!("http://{SERVER_IP}:{port}"))
}

fn type_config() -> Value {
    json!({ "allowed_hosts": [SERVER_IP.to_string()] })
}

const SCRIPT: &str = r#"export default {
  async onMessage(body) {
    const base = body.base;
    if (body.op === "limit") {
      const all = [];
      for (let i = 0; i < 70; i++) all.push(fetch(`${base}/slow?ms=20`));
      const settled = await Promise.allSettled(all);
      const refused = settled.filter((s) => s.status === "rejected").map((s) => String(s.reason.message));
      return { fulfilled: settled.length - refused.length, refused: refused.length, says: refused[0] };
    }
    const four = await Promise.all([1, 2, 3, 4].map(() => fetch(`${base}/slow?ms=600`).then((r) => r.text())));
    // One refused among them rejects alone.
    const mixed = await Promise.allSettled([fetch(`${base}/slow?ms=50`), fetch("http://127.0.0.1:1/")]);
    // A timer fires while a fetch is under way.
    const order = [];
    await Promise.all([
      fetch(`${base}/slow?ms=400`).then(() => order.push("fetch")),
      new Promise((resolve) => setTimeout(() => { order.push("timer"); resolve(); }, 20)),
    ]);
    // Awaited one by one, still in order.
    const a = await (await fetch(`${base}/slow?ms=1`)).text();
    // Left behind (once it reached the server): cancelled when the turn ends.
    fetch(`${base}/hang`);
    await new Promise((resolve) => setTimeout(resolve, 300));
    return { four, mixed: mixed.map((m) => m.status), why: String(mixed[1].reason?.message), order, a };
  },
};
"#;

#[tokio::test]
async fn javascript_fetches_run_side_by_side_and_end_with_their_turn() {
    let seen = Arc::new(Seen::default());
    let (_dir, _node, api, base) = node(&seen).await;
    let manifest = json!({ "kind": "js", "code": SCRIPT, "config": type_config() });
    let r = api.deploy_manifest("par", &manifest).await;
    assert_eq!(r.status, 201, "{}", r.json);

    let r = api
        .post_json("/v1/actors/par/a", &json!({ "base": base }))
        .await;
    assert_eq!(r.status, 200, "{}", r.json);
    assert_eq!(r.json["four"], json!(["slow", "slow", "slow", "slow"]));
    // All four were in flight at once (one after another, never two).
    assert_eq!(seen.most.load(Ordering::SeqCst), 4, "{}", r.json);
    assert_eq!(
        r.json["mixed"],
        json!(["fulfilled", "rejected"]),
        "{}",
        r.json
    );
    assert!(
        r.json["why"].as_str().unwrap().contains("does not allow"),
        "{}",
        r.json
    );
    assert_eq!(r.json["order"], json!(["timer", "fetch"]), "{}", r.json);
    assert_eq!(r.json["a"], "slow");

    // The turn did not wait for the fetch it left behind, and that fetch
    // was cancelled: its connection closed long before its minute.
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    while seen.abandoned.load(Ordering::SeqCst) == 0 {
        assert!(
            std::time::Instant::now() < deadline,
            "the fetch left behind was not cancelled"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert_eq!(seen.in_flight.load(Ordering::SeqCst), 0);

    // At most 64 started and not finished in a turn: the rest are refused,
    // each its own rejection, and the others answer.
    let r = api
        .post_json("/v1/actors/par/a", &json!({ "base": base, "op": "limit" }))
        .await;
    assert_eq!(r.status, 200, "{}", r.json);
    assert_eq!(r.json["fulfilled"], 64, "{}", r.json);
    assert_eq!(r.json["refused"], 6, "{}", r.json);
    assert!(
        r.json["says"]
            .as_str()
            .unwrap()
            .contains("at most 64 fetches started"),
        "{}",
        r.json
    );
}

#[tokio::test]
async fn rust_send_all_runs_requests_side_by_side() {
    let seen = Arc::new(Seen::default());
    let (_dir, _node, api, base) = node(&seen).await;
    let r = api.deploy("kit", TESTKIT, type_config()).await;
    assert_eq!(r.status, 201, "{}", r.json);
    let slow = format!("{base}/slow?ms=600");
    let r = api
        .op(
            "kit",
            "a",
            json!({ "op": "fetch_all", "urls": [slow, slow, slow] }),
        )
        .await;
    assert_eq!(
        r.json["answers"],
        json!([{ "body": "slow" }, { "body": "slow" }, { "body": "slow" }]),
        "{}",
        r.json
    );
    assert_eq!(seen.most.load(Ordering::SeqCst), 3);
    // A request refused before it was sent fails the call (the ones
    // started before it are cancelled with the turn).
    let r = api
        .op(
            "kit",
            "a",
            json!({ "op": "fetch_all", "urls": [slow, slow, "http://127.0.0.1:1/"] }),
        )
        .await;
    assert_eq!(r.status, 200, "{}", r.json);
    assert!(
        r.json["error"]
            .as_str()
            .unwrap_or("")
            .contains("does not allow"),
        "{}",
        r.json
    );
}

const BOUNDED: &str = r#"export default {
  async onMessage(body) {
    const base = body.base;
    const settled = async (all) =>
      (await Promise.allSettled(all)).map((s) => (s.status === "fulfilled" ? "ok" : String(s.reason.message)));
    if (body.op === "lanes") return settled([1, 2, 3, 4, 5, 6].map(() => fetch(`${base}/slow?ms=300`)));
    if (body.op === "bodies") {
      const big = new Uint8Array(4 << 20);
      return settled([...Array(9).keys()].map(() => fetch(`${base}/slow?ms=200`, { method: "POST", body: big })));
    }
    return settled([1, 2].map(() => fetch(`${base}/big?mb=6`).then((r) => r.arrayBuffer())));
  },
};
"#;

/// What a turn's fetches side by side may take, each found by a re-probe:
/// a quarter of the type's places at once (one actor's `Promise.all` held
/// every place, and a neighbour's fetch waited 11.6 s), request bodies up
/// to the actor's memory limit (64 slow 4 MiB POSTs held 256 MB), and
/// answers that together fit what one fetch may hand over (four 10 MiB
/// answers trapped the sandbox past any `catch`; now the one that does not
/// fit rejects).
#[tokio::test]
async fn fetches_side_by_side_are_bounded() {
    let seen = Arc::new(Seen::default());
    let (_dir, _node, api, base) = node(&seen).await;
    let mut config = type_config();
    config["http_concurrency"] = json!(8);
    let manifest = json!({ "kind": "js", "code": BOUNDED, "config": config });
    let r = api.deploy_manifest("bounded", &manifest).await;
    assert_eq!(r.status, 201, "{}", r.json);
    let run = |op: &'static str| {
        let (api, base) = (api.clone(), base.clone());
        async move {
            let r = api
                .post_json("/v1/actors/bounded/a", &json!({ "base": base, "op": op }))
                .await;
            assert_eq!(r.status, 200, "{op}: {}", r.json);
            r.json
        }
    };
    // Eight places for the type: two for one turn.
    assert_eq!(
        run("lanes").await,
        json!(["ok", "ok", "ok", "ok", "ok", "ok"])
    );
    assert_eq!(seen.most.load(Ordering::SeqCst), 2);
    // 8 × 4 MiB (the most one request may send) of request bodies under
    // way, in a 32 MiB actor: the ninth is refused.
    let r = run("bodies").await;
    assert_eq!(r.as_array().unwrap()[..8], vec![json!("ok"); 8], "{r}");
    let ninth = r[8].as_str().unwrap();
    assert!(ninth.contains("bytes of request bodies"), "{r}");
    // Two 6 MiB answers side by side, where one fetch may hand over a
    // third of 32 MiB: the second is refused, and the turn goes on.
    let r = run("answers").await;
    let (ok, refused): (Vec<&Value>, Vec<&Value>) =
        r.as_array().unwrap().iter().partition(|a| *a == "ok");
    assert_eq!((ok.len(), refused.len()), (1, 1), "{r}");
    assert!(
        refused[0].as_str().unwrap().contains("side by side share"),
        "{r}"
    );
}
