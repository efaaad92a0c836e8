//! The memory of JavaScript sandboxes: an idle sandbox gives back the
//! snapshot pages it copied but left unchanged, and keeps everything else;
//! pages a turn is known to write are copied before it runs, and the turn
//! finds them as it would have. And the node's own bounds on memory: what
//! guests grow, what state caches hold, the request bodies and outbound
//! response bodies it holds, and its client connections.

mod common;

use std::time::{Duration, Instant};

use common::js::node;
use common::{Api, metric};
use serde_json::json;

/// Module-scope data the turns read and write: some of it built by the top
/// level (so it lies in the type version's snapshot), some by the turns.
const MODULE: &str = r#"
import { state } from "marmot";

const table = Array.from({ length: 4000 }, (_, i) => ({ i, text: "row " + i }));
const seen = [];
let turns = 0;
// Recursion runs deep into the execution stack a trim gives back.
const depth = (n) => (n === 0 ? 0 : 1 + depth(n - 1));

export default {
  onMessage(body, ctx) {
    turns += 1;
    const row = table[body.row];
    row.hits = (row.hits ?? 0) + 1;
    seen.push(body.row);
    const n = (state.get("n") ?? 0) + 1;
    state.set("n", n);
    let hits = 0;
    for (const r of table) hits += r.hits ?? 0;
    return {
      id: ctx.id, turns, n, hits, row: row.text, rowHits: row.hits, seen: seen.length,
      depth: depth(500 + body.row % 7),
    };
  },
};
"#;

async fn metrics(api: &Api) -> String {
    String::from_utf8(api.get("/metrics").await.body).unwrap()
}

/// Wait until metric `name` `holds` (else panic after `within`, saying
/// `what` did not happen); the metrics text it was read from.
async fn wait_for_metric(
    api: &Api,
    name: &str,
    holds: impl Fn(f64) -> bool,
    within: Duration,
    what: &str,
) -> String {
    let deadline = Instant::now() + within;
    loop {
        let m = metrics(api).await;
        let value = metric(&m, name);
        if holds(value) {
            return m;
        }
        assert!(Instant::now() < deadline, "{what}: {name} = {value}");
        tokio::time::sleep(Duration::from_millis(25)).await;
    }
}

/// Wait until the node has trimmed at least `trims` sandboxes in all.
async fn wait_for_trims(api: &Api, trims: f64) -> String {
    wait_for_metric(
        api,
        "marmot_js_sandbox_trims_total",
        |n| n >= trims,
        Duration::from_secs(30),
        "idle sandboxes were not trimmed",
    )
    .await
}

/// A type's compiled code is the code cache's file, mapped: pages the
/// kernel may drop and read again, not memory of the node's own. Compiled
/// at deploy it stayed in anonymous memory, ~4 MB of engine code per
/// JavaScript type for as long as the type was deployed, its actors asleep
/// or not (found by a probe: 5 MB per type).
#[tokio::test]
async fn compiled_code_is_mapped_from_the_cache_not_held() {
    let (_dir, m, api) = node(None).await;
    // Code no test compiled before (the code cache is shared).
    let nonce = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_nanos();
    for t in 0..3 {
        let code = format!(
            "// {nonce}\n{}",
            MODULE.replace("row ", &format!("row{t} "))
        );
        let r = api.deploy_js(&format!("t{t}"), &code).await;
        assert_eq!(r.status, 201, "{}", r.json);
    }
    let smaps = std::fs::read_to_string(format!("/proc/{}/smaps", m.pid().unwrap())).unwrap();
    // Anonymous executable mappings: (size in kB).
    let mut anon_code = Vec::new();
    let mut current: Option<bool> = None;
    for line in smaps.lines() {
        let mut words = line.split_whitespace();
        match (words.next(), words.next()) {
            (Some(range), Some(perms)) if range.contains('-') && perms.len() == 4 => {
                let path = line.split_whitespace().nth(5);
                current = Some(perms.contains('x') && path.is_none());
            }
            (Some("Size:"), Some(kb)) if current == Some(true) => {
                anon_code.push(kb.parse::<u64>().unwrap());
            }
            _ => {}
        }
    }
    let total: u64 = anon_code.iter().sum();
    assert!(
        total < 2048,
        "{total} kB of anonymous executable memory after 3 JavaScript deploys: {anon_code:?}"
    );
}

#[tokio::test]
async fn idle_sandboxes_give_back_unchanged_pages_and_keep_their_heap() {
    let (_dir, _m, api) = node(None).await;
    let r = api.deploy_js("rows", MODULE).await;
    assert_eq!(r.status, 201, "{}", r.json);

    let ids = ["a", "b", "c"];
    let mut trims = 0.0;
    let mut released = 0.0;
    // Three rounds of turns, each followed by the sandboxes going idle and
    // being trimmed: every turn must find exactly what the earlier ones
    // left, in the module's heap (part of it in snapshot pages the turns
    // wrote to) and in state.
    for round in 1..=3u64 {
        for (k, id) in ids.iter().enumerate() {
            for t in 0..3u64 {
                // Rows far apart, so the writes land on different pages.
                let row = (k as u64 * 1000 + round * 97 + t) % 4000;
                let r = api.op("rows", id, json!({ "row": row })).await;
                assert_eq!(r.status, 200, "{}", r.json);
                let turn = (round - 1) * 3 + t + 1;
                assert_eq!(r.json["turns"], turn, "{id}: {}", r.json);
                assert_eq!(r.json["n"], turn, "{id}: {}", r.json);
                assert_eq!(r.json["hits"], turn, "{id}: {}", r.json);
                assert_eq!(r.json["seen"], turn, "{id}: {}", r.json);
                assert_eq!(r.json["rowHits"], 1, "{id}: {}", r.json);
                assert_eq!(r.json["row"], format!("row {row}"), "{id}: {}", r.json);
                assert_eq!(r.json["depth"], 500 + row % 7, "{id}: {}", r.json);
            }
        }
        trims += ids.len() as f64;
        let m = wait_for_trims(&api, trims).await;
        let now = metric(&m, "marmot_js_sandbox_trimmed_pages_total");
        assert!(
            now > released,
            "round {round}: the trims gave nothing back ({now} pages in all)"
        );
        released = now;
        // And the execution stack each store keeps between calls.
        let stack = metric(&m, "marmot_sandbox_trimmed_stack_pages_total");
        assert!(
            stack >= round as f64 * ids.len() as f64,
            "round {round}: {stack} stack pages given back in all"
        );
        // The turns after a trim took back what it gave, up front.
        if round > 1 {
            assert!(
                metric(&m, "marmot_js_sandbox_prefaulted_pages_total") > 0.0,
                "round {round}: trimmed sandboxes ran again without their pages populated"
            );
        }
    }
    // Still the same sandboxes: trims are not hibernations.
    let m = metrics(&api).await;
    assert_eq!(metric(&m, "marmot_hibernations_total"), 0.0);
}

#[tokio::test]
async fn fresh_sandboxes_start_with_the_pages_first_turns_write() {
    let (_dir, _m, api) = node(None).await;
    let r = api.deploy_js("rows", MODULE).await;
    assert_eq!(r.status, 201, "{}", r.json);

    // Each new actor's first turn runs in a fresh sandbox. The first ones
    // teach the type version which pages such a turn copies; the later
    // ones start with those pages populated, and must see the snapshot's
    // data and nothing of any other actor's turns.
    for k in 0..16u64 {
        let id = format!("fresh-{k}");
        let row = (k * 251) % 4000;
        let r = api.op("rows", &id, json!({ "row": row })).await;
        assert_eq!(r.status, 200, "{}", r.json);
        assert_eq!(r.json["turns"], 1, "{id}: {}", r.json);
        assert_eq!(r.json["n"], 1, "{id}: {}", r.json);
        assert_eq!(r.json["hits"], 1, "{id}: {}", r.json);
        assert_eq!(r.json["seen"], 1, "{id}: {}", r.json);
        assert_eq!(r.json["row"], format!("row {row}"), "{id}: {}", r.json);
    }
    let m = metrics(&api).await;
    assert!(
        metric(&m, "marmot_js_sandbox_prefaulted_pages_total") > 0.0,
        "no fresh sandbox had its pages populated"
    );
    // One sandbox per active actor, counted against the node's cap.
    assert_eq!(metric(&m, "marmot_js_sandboxes"), 16.0);
    // And a second turn in each finds its own first one.
    for k in 0..16u64 {
        let id = format!("fresh-{k}");
        let r = api.op("rows", &id, json!({ "row": 7 })).await;
        assert_eq!(r.status, 200, "{}", r.json);
        assert_eq!(r.json["turns"], 2, "{id}: {}", r.json);
        assert_eq!(r.json["hits"], 2, "{id}: {}", r.json);
    }
}

/// Objects, strings and closures the module's top level made: they are in
/// the type version's snapshot, and their reference counts stay untouched
/// while turns use them (`vendor/rquickjs-sys/MARMOT.md`). Every use that
/// changes such a value (a new property, a deleted one, a string grown in
/// place, a shape shared with a turn's own objects) must behave as plain
/// JavaScript, sandbox by sandbox, and what turns make and drop must still
/// be freed.
const SNAPSHOT_MODULE: &str = r#"
const shared = { a: 1 };
const twin = { a: 1 };
let text = "snap";
const alias = text;
const list = [1, 2, 3];
const byKey = new Map([["k", { deep: [1] }]]);
let counter = 0;
const bump = () => ++counter;

export default {
  onMessage() {
    const fresh = { a: 1 };
    fresh.b = 2;
    shared[`k${bump()}`] = counter;
    delete twin.a;
    text += "!";
    list.push(list.length + 1);
    byKey.get("k").deep.push(counter);
    // About 2 MB that the next turn drops: 40 turns of it would not fit the
    // sandbox's 32 MiB if dropped values were never freed. It refers to
    // itself, so only the cycle collector can free it, walking from a
    // snapshot object to it.
    const cycle = { items: new Array(250000).fill(counter) };
    cycle.self = cycle;
    shared.big = cycle;
    return {
      shared: Object.keys(shared).filter((k) => k !== "big").map((k) => [k, shared[k]]),
      big: shared.big.items.length, twin, fresh, text, alias, list,
      deep: byKey.get("k").deep,
    };
  },
};
"#;

#[tokio::test]
async fn snapshot_objects_behave_as_javascript_and_turns_still_free_what_they_drop() {
    let (_dir, _m, api) = node(None).await;
    let r = api.deploy_js("snap", SNAPSHOT_MODULE).await;
    assert_eq!(r.status, 201, "{}", r.json);

    let expected = |turn: u64| {
        let mut shared = vec![json!(["a", 1])];
        shared.extend((1..=turn).map(|k| json!([format!("k{k}"), k])));
        json!({
            "shared": shared,
            "big": 250000,
            "twin": {},
            "fresh": {"a": 1, "b": 2},
            "text": format!("snap{}", "!".repeat(turn as usize)),
            "alias": "snap",
            "list": (1..=3 + turn).collect::<Vec<_>>(),
            "deep": std::iter::once(1).chain(1..=turn).collect::<Vec<_>>(),
        })
    };
    for turn in 1..=40u64 {
        let r = api.op("snap", "a", json!({})).await;
        assert_eq!(r.status, 200, "turn {turn}: {}", r.json);
        assert_eq!(r.json, expected(turn), "turn {turn}");
    }
    // Another actor's sandbox starts from the snapshot, untouched by a's.
    for turn in 1..=2u64 {
        let r = api.op("snap", "b", json!({})).await;
        assert_eq!(r.json, expected(turn), "b, turn {turn}");
    }
}

/// What a turn hangs on an object of the snapshot and the module then
/// drops is never freed (the snapshot's objects are immortal), so a
/// sandbox whose memory grew past half its limit starts afresh: "fill 20
/// MiB, reset, fill" failed its third turn for memory in a 32 MiB sandbox
/// (a probe).
#[tokio::test]
async fn memory_hung_on_a_snapshot_object_and_dropped_does_not_pile_up() {
    let (_dir, _m, api) = node(None).await;
    let module = r#"
let buf = [];
export default {
  onMessage(body) {
    if (body.mode === "fill") {
      for (let i = 0; i < 5; i++) buf.push(new Uint8Array(4 << 20).fill(1));
    } else {
      buf = [];
    }
    return buf.length;
  },
};
"#;
    assert_eq!(api.deploy_js("imm", module).await.status, 201);
    for (turn, mode) in ["fill", "reset", "fill", "reset", "fill"]
        .iter()
        .enumerate()
    {
        let r = api.op("imm", "a", json!({ "mode": mode })).await;
        assert_eq!(r.status, 200, "turn {turn} ({mode}): {}", r.json);
    }
}

/// Holds `mb` more MiB of its heap per message, after writing state, so a
/// refused turn shows whether anything of it committed.
const HOG: &str = r#"
import { state } from "marmot";
const kept = [];
export default {
  onMessage(body) {
    state.set("asked", (state.get("asked") ?? 0) + body.mb);
    if (body.mb > 0) kept.push(new Uint8Array(body.mb << 20).fill(7));
    return { held_mb: kept.reduce((s, a) => s + a.length, 0) >> 20 };
  },
};
"#;

#[tokio::test]
async fn growth_past_the_nodes_guest_memory_budget_is_refused_and_given_back() {
    // 24 MiB for all guests' growth: two actors holding 8 MiB each fit, a
    // third asking for 12 does not. Without the budget, enough such actors
    // take the node's whole memory and the kernel kills it.
    let config = "[limits]\nguest_memory_budget_bytes = 25165824\n";
    let (_dir, m, api) = node(Some(config)).await;
    assert_eq!(api.deploy_js("hog", HOG).await.status, 201);
    for id in ["a", "b"] {
        let r = api.op("hog", id, json!({"mb": 8})).await;
        assert_eq!((r.status, &r.json), (200, &json!({"held_mb": 8})));
    }
    let grown = metric(&metrics(&api).await, "marmot_guest_memory_grown_bytes");
    // Less than asked when the heap had free room past its start.
    assert!(
        (12.0 * 1048576.0..24.0 * 1048576.0).contains(&grown),
        "{grown}"
    );

    let r = api.op("hog", "c", json!({"mb": 12})).await;
    assert_eq!(r.status, 503, "{}", r.json);
    assert_eq!(r.json["error"]["code"], "overloaded", "{}", r.json);
    let message = r.json["error"]["message"].as_str().unwrap();
    assert!(
        message.contains("guest memory is exhausted") && message.contains("25165824"),
        "{message}"
    );
    // The refused turn committed nothing.
    let state = api.get("/v1/actors/hog/c/state/asked").await;
    assert_eq!(state.status, 404, "{}", state.json);
    let text = metrics(&api).await;
    assert_eq!(metric(&text, "marmot_guest_memory_refused_total"), 1.0);
    assert_eq!(
        metric(&text, "marmot_guest_memory_budget_bytes"),
        25165824.0
    );
    assert!(m.log_text().contains("guest memory is exhausted"));

    // The idle actors holding grown memory were asked to hibernate: their
    // growth comes back to the node, and the same request now fits.
    wait_for_metric(
        &api,
        "marmot_guest_memory_grown_bytes",
        |grown| grown == 0.0,
        Duration::from_secs(20),
        "growth not given back",
    )
    .await;
    let r = api.op("hog", "c", json!({"mb": 12})).await;
    assert_eq!((r.status, &r.json), (200, &json!({"held_mb": 12})));
    assert_eq!(
        api.get("/v1/actors/hog/c/state/asked").await.json,
        json!(12)
    );
    // The others still answer, from a fresh heap.
    let r = api.op("hog", "a", json!({"mb": 0})).await;
    assert_eq!((r.status, &r.json), (200, &json!({"held_mb": 0})));
}

/// Writes `chunks` values of 256 KiB each: a module-level string, so the
/// guest's memory does not grow but the host's copy of each does.
const WRITER: &str = r#"
import { state } from "marmot";
const chunk = "x".repeat(256 << 10);
export default {
  onMessage(body) {
    for (let i = 0; i < body.chunks; i++) state.set("k" + i, chunk + body.tag);
    return { wrote: body.chunks };
  },
};
"#;

#[tokio::test]
async fn the_actors_state_caches_together_stay_within_the_nodes_budget() {
    // 4 MiB for all caches; three actors each write 3 MiB and fall idle.
    // Each alone is under the 8 MiB per-actor cap, so without the node's
    // budget all 9 MiB would stay cached until they hibernate (30 s).
    let config = "[limits]\nstate_cache_budget_bytes = 4194304\n";
    let (_dir, _m, api) = node(Some(config)).await;
    assert_eq!(api.deploy_js("w", WRITER).await.status, 201);
    for id in ["a", "b", "c"] {
        let r = api.op("w", id, json!({"chunks": 12, "tag": id})).await;
        assert_eq!((r.status, &r.json), (200, &json!({"wrote": 12})));
    }
    let text = metrics(&api).await;
    assert_eq!(metric(&text, "marmot_state_cache_budget_bytes"), 4194304.0);
    // Within a few seconds of falling idle (their writes durable), the
    // actors drop what the node cannot afford.
    wait_for_metric(
        &api,
        "marmot_state_cache_bytes",
        |cached| cached <= 4194304.0,
        Duration::from_secs(15),
        "caches still hold more than the budget",
    )
    .await;
    // Nothing was lost: what was dropped is read from disk again, by the
    // actors' turns and by the API.
    for id in ["a", "b", "c"] {
        let v = api.get(&format!("/v1/actors/w/{id}/state/k11")).await;
        let s = v.json.as_str().unwrap();
        assert!(s.len() == (256 << 10) + 1 && s.ends_with(id), "{id}");
        let r = api.op("w", id, json!({"chunks": 1, "tag": "again"})).await;
        assert_eq!(r.status, 200, "{}", r.json);
    }
    assert_eq!(
        api.get("/v1/actors/w/b/state/k0")
            .await
            .json
            .as_str()
            .unwrap()
            .len(),
        (256 << 10) + 5
    );
}

/// Takes half a second per message, holding its body meanwhile.
const SLOW: &str = r#"
export default {
  async onMessage(body) {
    await new Promise((resolve) => setTimeout(resolve, 500));
    return { len: body.pad.length };
  },
};
"#;

#[tokio::test]
async fn request_bodies_past_the_nodes_budget_are_shed_at_once() {
    // 1 MiB of request bodies at once: one 600 KB message fits, a second
    // while the first is held does not.
    let config = "[limits]\nrequest_body_budget_bytes = 1048576\n";
    let (_dir, _m, api) = node(Some(config)).await;
    assert_eq!(api.deploy_js("slow", SLOW).await.status, 201);
    let big = json!({"pad": "x".repeat(600_000)});
    let first = {
        let (api, big) = (api.clone(), big.clone());
        tokio::spawn(async move { api.op("slow", "a", big).await })
    };
    wait_for_metric(
        &api,
        "marmot_request_body_bytes",
        |held| held >= 600_000.0,
        Duration::from_secs(10),
        "the first body was never held",
    )
    .await;
    let second = api.op("slow", "b", big.clone()).await;
    assert_eq!(second.status, 503, "{}", second.json);
    assert_eq!(second.code(), "overloaded");
    assert_eq!(second.headers["retry-after"], "1");
    let message = second.json["error"]["message"].as_str().unwrap();
    assert!(
        message.contains("limits.request_body_budget_bytes"),
        "{message}"
    );
    // Requests without a body still get through, and small ones fit.
    assert_eq!(api.get("/v1/actors/slow/a").await.status, 200);
    let small = api.op("slow", "c", json!({"pad": "x"})).await;
    assert_eq!((small.status, &small.json), (200, &json!({"len": 1})));
    // The first one finishes, its body is given back, and the refused
    // message, sent again, fits.
    let first = first.await.unwrap();
    assert_eq!((first.status, &first.json), (200, &json!({"len": 600_000})));
    let again = api.op("slow", "b", big).await;
    assert_eq!((again.status, &again.json), (200, &json!({"len": 600_000})));
    let text = metrics(&api).await;
    assert_eq!(metric(&text, "marmot_request_body_bytes"), 0.0);
    assert_eq!(metric(&text, "marmot_requests_shed_total"), 1.0);
}

/// Bodies are charged as they arrive and must arrive in time: connections
/// that declare a large body and send a few bytes of it (messages to
/// actors here; webhook routes, open to anyone, read their body before
/// checking it until 2026-12-07) used to hold their declared lengths of
/// the budget for as long as they stayed open, and every other request
/// with a body got 503.
#[tokio::test]
async fn bodies_that_never_arrive_hold_nothing_and_time_out() {
    use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};
    // A budget of 256 KiB; messages up to 64 KiB, so a body's deadline is
    // 0.5 s plus 1 s.
    let config = "[limits]\nrequest_body_budget_bytes = 262144\nmax_message_bytes = 65536\n\
                  body_timeout_ms = 500\n";
    let (_dir, m, api) = node(Some(config)).await;
    assert_eq!(api.deploy_js("slow", SLOW).await.status, 201);
    let mut stalled = Vec::new();
    for i in 0..8 {
        let mut s = tokio::net::TcpStream::connect(("127.0.0.1", m.port))
            .await
            .unwrap();
        let head = format!(
            "POST /v1/actors/slow/x{i} HTTP/1.1\r\nhost: marmot\r\n\
             content-length: 65536\r\n\r\n0123456789"
        );
        s.write_all(head.as_bytes()).await.unwrap();
        stalled.push(s);
    }
    // Eight times 64 KiB declared is twice the budget; ten bytes each arrived.
    tokio::time::sleep(Duration::from_millis(200)).await;
    let text = metrics(&api).await;
    assert_eq!(metric(&text, "marmot_request_body_bytes"), 80.0);
    let r = api
        .op("slow", "a", json!({"pad": "x".repeat(60_000)}))
        .await;
    assert_eq!((r.status, &r.json), (200, &json!({"len": 60_000})));
    // Each stalled body is cut at its deadline with a 408, and its
    // connection closed.
    for mut s in stalled {
        let mut answer = String::new();
        let read = tokio::time::timeout(Duration::from_secs(10), s.read_to_string(&mut answer));
        read.await.expect("the stalled body was never cut").unwrap();
        assert!(answer.starts_with("HTTP/1.1 408"), "{answer}");
        assert!(answer.contains("body_timeout"), "{answer}");
    }
    let text = metrics(&api).await;
    assert_eq!(metric(&text, "marmot_request_body_bytes"), 0.0);
}

/// Fetches a body from the test's server and says how long it was, or why
/// the fetch failed.
const FETCHER: &str = r#"
export default {
  async onMessage(body) {
    try {
      const r = await fetch(body.url, { timeoutMs: body.timeoutMs });
      return { status: r.status, len: (await r.text()).length };
    } catch (e) {
      return { error: String(e.message) };
    }
  },
};
"#;

/// A server of slow bodies: `GET /{known|chunked}/{kib}/{pause_ms}` sends
/// `kib` KiB of `x`, half of it, then the rest after the pause; `known`
/// declares its length, `chunked` does not.
async fn slow_bodies() -> u16 {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let port = listener.local_addr().unwrap().port();
    tokio::spawn(async move {
        loop {
            let Ok((mut conn, _)) = listener.accept().await else {
                return;
            };
            tokio::spawn(async move {
                let mut head = Vec::new();
                let mut buf = [0u8; 1024];
                while !head.windows(4).any(|w| w == b"\r\n\r\n") {
                    match conn.read(&mut buf).await {
                        Ok(0) | Err(_) => return,
                        Ok(n) => head.extend_from_slice(&buf[..n]),
                    }
                }
                let head = String::from_utf8_lossy(&head);
                let path = head.split_whitespace().nth(1).unwrap_or("/");
                let parts: Vec<&str> = path.trim_start_matches('/').split('/').collect();
                let [kind, kib, pause] = parts[..] else {
                    return;
                };
                let (len, pause) = (kib.parse::<usize>().unwrap() << 10, pause.parse().unwrap());
                let half = vec![b'x'; len / 2];
                let chunked = kind == "chunked";
                let framing = if chunked {
                    "transfer-encoding: chunked".to_owned()
                } else {
                    format!("content-length: {len}")
                };
                let frame = |data: &[u8]| {
                    if chunked {
                        [format!("{:x}\r\n", data.len()).as_bytes(), data, b"\r\n"].concat()
                    } else {
                        data.to_vec()
                    }
                };
                let head = format!("HTTP/1.1 200 OK\r\nconnection: close\r\n{framing}\r\n\r\n");
                let _ = conn.write_all(head.as_bytes()).await;
                let _ = conn.write_all(&frame(&half)).await;
                tokio::time::sleep(Duration::from_millis(pause)).await;
                let _ = conn.write_all(&frame(&half)).await;
                if chunked {
                    let _ = conn.write_all(b"0\r\n\r\n").await;
                }
            });
        }
    });
    port
}

#[tokio::test]
async fn outbound_response_bodies_wait_for_room_in_the_nodes_budget() {
    const MIB: u64 = 1 << 20;
    // 4 MiB of outbound response bodies at once.
    let config = "[egress]\nallow_private = [\"127.0.0.1/32\"]\n\
                  [limits]\negress_response_budget_bytes = 4194304\n";
    let (_dir, _m, api) = node(Some(config)).await;
    let port = slow_bodies().await;
    let manifest = json!({
        "kind": "js", "code": FETCHER,
        "config": {"allowed_hosts": ["127.0.0.1"], "http_concurrency": 16},
    });
    let r = api.deploy_manifest("fetcher", &manifest).await;
    assert_eq!(r.status, 201, "{}", r.json);
    let url = |path: &str| format!("http://127.0.0.1:{port}/{path}");
    let fetch = |id: String, body: serde_json::Value| {
        let api = api.clone();
        tokio::spawn(async move { api.op("fetcher", &id, body).await })
    };

    // Three 3 MiB bodies of declared length, each taking 600 ms: one fits
    // at a time, so they are read one after another (the server is not
    // held up: the socket buffers what is not read yet), and the node
    // never holds more than its budget. Without it, all three would hold
    // their 3 MiB through the pause.
    let three: Vec<_> = (0..3)
        .map(|i| fetch(format!("k{i}"), json!({"url": url("known/3072/600")})))
        .collect();
    let mut peak = 0.0f64;
    while !three.iter().all(|t| t.is_finished()) {
        peak = peak.max(metric(&metrics(&api).await, "marmot_egress_response_bytes"));
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    for t in three {
        let r = t.await.unwrap();
        assert_eq!(
            (r.status, &r.json),
            (200, &json!({"status": 200, "len": 3 * MIB}))
        );
    }
    assert!(
        peak >= (3 * MIB) as f64,
        "no body was ever charged ({peak})"
    );
    assert!(peak <= (4 * MIB) as f64, "the node held {peak} bytes");

    // While one holds 3 MiB for 1.5 s, a body of unknown length waits for
    // room as it grows, and gets it when the first is done; a declared one
    // whose request times out first says why.
    let holder = fetch("h".into(), json!({"url": url("known/3072/1500")}));
    wait_for_metric(
        &api,
        "marmot_egress_response_bytes",
        |held| held >= (3 * MIB) as f64,
        Duration::from_secs(10),
        "the first body was never charged",
    )
    .await;
    let chunked = fetch("c".into(), json!({"url": url("chunked/2048/0")}));
    let waited = api
        .op(
            "fetcher",
            "w",
            json!({"url": url("known/2048/0"), "timeoutMs": 300}),
        )
        .await;
    let message = waited.json["error"].as_str().unwrap_or_default();
    assert!(
        message.contains("limits.egress_response_budget_bytes")
            && message.contains("waited until the request's timeout"),
        "{}",
        waited.json
    );
    assert!(!chunked.is_finished(), "the chunked body did not wait");
    let holder = holder.await.unwrap();
    assert_eq!(holder.json, json!({"status": 200, "len": 3 * MIB}));
    let chunked = chunked.await.unwrap();
    assert_eq!(chunked.json, json!({"status": 200, "len": 2 * MIB}));

    // Two bodies of unknown length that each outgrow half the budget
    // midway: waiting for each other would never end, so the second to ask
    // fails at once and the first goes on.
    let both: Vec<_> = ["d1", "d2"]
        .into_iter()
        .map(|id| fetch(id.into(), json!({"url": url("chunked/3072/800")})))
        .collect();
    let mut outcomes = Vec::new();
    for t in both {
        outcomes.push(t.await.unwrap().json);
    }
    let done = outcomes.iter().filter(|o| o["len"] == 3 * MIB).count();
    let refused: Vec<_> = outcomes
        .iter()
        .filter_map(|o| o["error"].as_str())
        .collect();
    assert!(
        done == 1 && refused.len() == 1 && refused[0].contains("this one holding least"),
        "{outcomes:?}"
    );

    // A body larger than the whole budget is read alone rather than never.
    for path in ["known/6144/0", "chunked/6144/0"] {
        let r = api.op("fetcher", "big", json!({"url": url(path)})).await;
        assert_eq!(r.json, json!({"status": 200, "len": 6 * MIB}), "{path}");
    }
    let text = metrics(&api).await;
    assert_eq!(metric(&text, "marmot_egress_response_bytes"), 0.0);
    assert_eq!(metric(&text, "marmot_egress_responses_refused_total"), 2.0);
    assert_eq!(
        metric(&text, "marmot_egress_response_budget_bytes"),
        (4 * MIB) as f64
    );
}

/// Send `head` on a new connection to the node at `port` and read until the
/// node answers or closes; what it said.
async fn raw_exchange(port: u16, head: &[u8]) -> String {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let mut conn = tokio::net::TcpStream::connect(("127.0.0.1", port))
        .await
        .unwrap();
    // The node may answer and close before the whole head is written.
    let _ = conn.write_all(head).await;
    let mut out = Vec::new();
    let _ = tokio::time::timeout(Duration::from_secs(10), conn.read_to_end(&mut out)).await;
    String::from_utf8_lossy(&out).into_owned()
}

#[tokio::test]
async fn connections_are_capped_and_request_heads_are_bounded() {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let config = "[limits]\nmax_connections = 4\n";
    let (_dir, m, api) = node(Some(config)).await;
    let echo = "export default { onMessage(body) { return body; } };";
    assert_eq!(api.deploy_js("echo", echo).await.status, 201);
    // Only this test's own connections from here on, each counted: the
    // client's pooled ones close with it.
    drop(api);

    // A head past the limit is refused with 431 and its connection closed,
    // however long the client would go on.
    let mut head = b"GET /healthz HTTP/1.1\r\nhost: x\r\n".to_vec();
    while head.len() < 40 << 10 {
        head.extend_from_slice(format!("x-pad-{}: {}\r\n", head.len(), "a".repeat(200)).as_bytes());
    }
    head.extend_from_slice(b"\r\n");
    let said = raw_exchange(m.port, &head).await;
    assert!(said.starts_with("HTTP/1.1 431"), "{said:?}");
    // A head within it is served.
    let said = raw_exchange(
        m.port,
        b"GET /healthz HTTP/1.1\r\nhost: x\r\nconnection: close\r\n\r\n",
    )
    .await;
    assert!(said.starts_with("HTTP/1.1 200"), "{said:?}");

    // At the cap a new connection closes the one idle longest: four that
    // never finish a head, and a fifth is served at once.
    let mut idle = Vec::new();
    for _ in 0..4 {
        let mut c = tokio::net::TcpStream::connect(("127.0.0.1", m.port))
            .await
            .unwrap();
        c.write_all(b"GET /healthz HTTP/1.1\r\nx-slow: ")
            .await
            .unwrap();
        idle.push(c);
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    tokio::time::sleep(Duration::from_millis(200)).await;
    let said = tokio::time::timeout(
        Duration::from_secs(5),
        raw_exchange(
            m.port,
            b"GET /healthz HTTP/1.1\r\nhost: x\r\nconnection: close\r\n\r\n",
        ),
    )
    .await
    .expect("a new connection waited behind idle ones");
    assert!(said.starts_with("HTTP/1.1 200"), "{said:?}");
    // The oldest one was closed; the others are open.
    let mut buf = [0u8; 64];
    let first = tokio::time::timeout(Duration::from_secs(5), idle[0].read(&mut buf)).await;
    assert!(matches!(first, Ok(Ok(0)) | Ok(Err(_))), "{first:?}");
    let second = tokio::time::timeout(Duration::from_millis(200), idle[1].read(&mut buf)).await;
    assert!(second.is_err(), "a younger idle connection was closed too");

    // Connections with a request in flight (a body still coming) are never
    // closed for another: with all four busy, a new one waits.
    drop(idle);
    let mut busy = Vec::new();
    for _ in 0..4 {
        let mut c = tokio::net::TcpStream::connect(("127.0.0.1", m.port))
            .await
            .unwrap();
        c.write_all(
            b"POST /v1/actors/echo/a HTTP/1.1\r\nhost: x\r\n\
              content-type: application/json\r\ncontent-length: 100\r\n\r\n{",
        )
        .await
        .unwrap();
        busy.push(c);
    }
    tokio::time::sleep(Duration::from_millis(300)).await;
    let mut fifth = tokio::net::TcpStream::connect(("127.0.0.1", m.port))
        .await
        .unwrap();
    fifth
        .write_all(b"GET /healthz HTTP/1.1\r\nhost: x\r\nconnection: close\r\n\r\n")
        .await
        .unwrap();
    let mut out = Vec::new();
    let waited = tokio::time::timeout(Duration::from_millis(500), fifth.read_to_end(&mut out));
    assert!(waited.await.is_err(), "served past the cap: {out:?}");
    drop(busy.pop());
    tokio::time::timeout(Duration::from_secs(10), fifth.read_to_end(&mut out))
        .await
        .expect("the fifth connection was never served")
        .unwrap();
    let said = String::from_utf8_lossy(&out);
    assert!(said.starts_with("HTTP/1.1 200"), "{said:?}");
    // The three busy ones and the one asking are open.
    let said = raw_exchange(
        m.port,
        b"GET /metrics HTTP/1.1\r\nhost: x\r\nconnection: close\r\n\r\n",
    )
    .await;
    assert!(said.contains("\nmarmot_http_connections 4\n"), "{said}");
    // At least the idle one was evicted. How many more is a race of this
    // test's own closes: a connection the client has just closed still
    // counts (as idle) until the node has seen it go, and may be the one
    // evicted. What matters is that no busy one was: each still finishes
    // its request and gets its answer.
    let evicted = common::sample(&said, "marmot_http_connections_evicted_total");
    assert!(evicted >= Some(1.0), "{said}");
    for mut c in busy {
        let mut rest = vec![b' '; 98];
        rest.push(b'}');
        c.write_all(&rest).await.unwrap();
        let mut head = Vec::new();
        let mut buf = [0u8; 1024];
        while !head.windows(4).any(|w| w == b"\r\n\r\n") {
            let n = tokio::time::timeout(Duration::from_secs(10), c.read(&mut buf))
                .await
                .expect("a busy connection's answer")
                .unwrap();
            assert!(n > 0, "a busy connection was closed: {head:?}");
            head.extend_from_slice(&buf[..n]);
        }
        assert!(head.starts_with(b"HTTP/1.1 200"), "{head:?}");
    }
}

/// A memory limit below what the JavaScript engine needs to start says
/// so, and what to raise (it said "forcing trap when growing memory",
/// as if the module were at fault); 2 MiB is enough.
#[tokio::test]
async fn a_memory_limit_too_small_for_the_engine_says_so() {
    let (_dir, _m, api) = node(None).await;
    let code = "export default { onMessage() { return 1; } };";
    let manifest =
        |bytes: u64| json!({"kind": "js", "code": code, "config": {"max_memory_bytes": bytes}});
    let r = api.deploy_manifest("tiny", &manifest(1 << 20)).await;
    assert_eq!(r.status, 400, "{}", r.json);
    let message = r.json["error"]["message"].as_str().unwrap();
    assert!(message.contains("bytes of memory to start"), "{message}");
    assert!(message.contains("config.max_memory_bytes"), "{message}");
    let r = api.deploy_manifest("small", &manifest(2 << 20)).await;
    assert_eq!(r.status, 201, "{}", r.json);
    assert_eq!(
        api.post_json("/v1/actors/small/a", &json!({})).await.status,
        200
    );
}
