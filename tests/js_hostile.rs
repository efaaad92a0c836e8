//! Hostile JavaScript: every attack must end in bounded time with a clear
//! error, commit nothing, and leave the node and its other actors serving.

mod common;

use std::time::{Duration, Instant};

use common::Api;
use common::js::{COUNTER_JS, eval, node};
use serde_json::json;

/// Runs `attack` as an eval while a neighbour actor keeps taking turns;
/// returns the eval's error.
///
/// A neighbour turn must never wait a second. An attack during which one
/// did is run once more before the test fails: on a loaded two-core CI
/// machine one neighbour request once took 1.01 s beside the recursion
/// attack, whose worst neighbour turn was 5.5 ms in a run that printed
/// them (every attack's: 5–50 ms). A script that holds a worker stalls
/// its neighbour on every attempt, so it still fails; one that stalls it
/// only now and then is caught less often.
async fn contained(api: &Api, id: &str, attack: &str) -> String {
    let mut attempt = attacked(api, id, attack).await;
    if attempt.worst >= Duration::from_secs(1) {
        eprintln!(
            "{attack}: a neighbour turn waited {:?}; running the attack again",
            attempt.worst
        );
        attempt = attacked(api, id, attack).await;
    }
    let Attempt {
        r,
        took,
        turns,
        worst,
    } = attempt;
    assert_eq!(r.status, 200, "{attack}: {}", r.json);
    assert!(took < Duration::from_secs(10), "{attack}: took {took:?}");
    assert!(turns > 5, "{attack}: the neighbour only got {turns} turns");
    assert!(
        worst < Duration::from_secs(1),
        "{attack}: a neighbour turn waited {worst:?}"
    );
    let err = r.json["error"]
        .as_str()
        .unwrap_or_else(|| panic!("{attack}: no error: {}", r.json));
    // Nothing the attack wrote was committed.
    assert_eq!(
        api.get(&format!("/v1/actors/jscount/{id}/state/pwned"))
            .await
            .status,
        404
    );
    err.to_owned()
}

/// One run of an attack beside the neighbour's turns.
struct Attempt {
    /// The eval's answer.
    r: common::Resp,
    /// How long the eval took.
    took: Duration,
    /// The neighbour's turns meanwhile, and the longest one.
    turns: u32,
    worst: Duration,
}

async fn attacked(api: &Api, id: &str, attack: &str) -> Attempt {
    let started = Instant::now();
    let neighbour = {
        let api = api.clone();
        tokio::spawn(async move {
            let mut worst = Duration::ZERO;
            let mut turns = 0;
            let end = Instant::now() + Duration::from_millis(400);
            while Instant::now() < end {
                let t = Instant::now();
                let r = api
                    .post_json("/v1/actors/jscount/neighbour", &json!({"by": 1}))
                    .await;
                assert_eq!(r.status, 200, "the neighbour was refused: {}", r.json);
                worst = worst.max(t.elapsed());
                turns += 1;
            }
            (turns, worst)
        })
    };
    let r = eval(api, "jscount", id, attack).await;
    let took = started.elapsed();
    let (turns, worst) = neighbour.await.unwrap();
    Attempt {
        r,
        took,
        turns,
        worst,
    }
}

#[tokio::test]
async fn hostile_scripts_are_contained() {
    let config = "[limits]\neval_cpu_ms = 300\neval_memory_bytes = 16777216\n";
    let (_dir, _m, api) = node(Some(config)).await;
    api.deploy_js("jscount", COUNTER_JS).await;
    api.post_json("/v1/actors/jscount/victim", &json!({"by": 1}))
        .await;
    let w = "marmot.state.set('pwned', 1);\n";

    let cpu = [
        "for (;;) {}",
        "'x'.repeat(1 << 20).split('').map((c) => c.repeat(50)).sort().join('').length; for(;;){}",
        "/(a+)+$/.test('a'.repeat(40) + '!')",
        "const loop = () => Promise.resolve().then(loop); loop(); await new Promise(() => {})",
        "Array.from({ length: 1e9 }, (_, i) => i).reduce((a, b) => a + b)",
        // A script's CPU limit is its whole run's: host calls used to
        // start the meter again, and these ran to the 30 s turn timeout.
        "for (;;) marmot.state.get('x')",
        "for (;;) console.log('')",
    ];
    for attack in cpu {
        let err = contained(&api, "victim", &format!("{w}{attack}")).await;
        assert!(
            err.contains("CPU limit") || err.contains("memory limit"),
            "{attack}: {err}"
        );
        // A script's limit is its whole run's, and says so (it said the
        // script ran so long "without calling the host" after host calls).
        assert!(!err.contains("without calling the host"), "{attack}: {err}");
    }
    let mem = [
        "const a = []; for (;;) a.push(new Array(1e5).fill(1.5))",
        "'x'.repeat(2 ** 28)",
        "new ArrayBuffer(1 << 30)",
    ];
    for attack in mem {
        let err = contained(&api, "victim", &format!("{w}{attack}")).await;
        assert!(
            err.contains("memory") || err.contains("RangeError") || err.contains("InternalError"),
            "{attack}: {err}"
        );
    }
    let recursion = contained(
        &api,
        "victim",
        &format!("{w}function f(n) {{ return f(n + 1) + 1 }} f(0)"),
    )
    .await;
    assert!(
        recursion.contains("stack")
            || recursion.contains("RangeError")
            || recursion.contains("InternalError"),
        "{recursion}"
    );

    // Huge outputs are capped, huge results refused.
    let r = eval(
        &api,
        "jscount",
        "victim",
        "for (let i = 0; i < 5000; i++) console.log('x'.repeat(1000)); 1",
    )
    .await;
    assert_eq!(r.json["result"], 1);
    let logs = r.json["logs"].as_array().unwrap();
    assert!(logs.len() <= 1001, "{} log lines kept", logs.len());
    assert!(logs.last().unwrap().as_str().unwrap().contains("dropped"));
    let r = eval(&api, "jscount", "victim", "'y'.repeat(3 << 20)").await;
    assert!(
        r.json["error"].as_str().unwrap().contains("over the limit"),
        "{}",
        r.json
    );

    // No way out: network, files, environment, modules, Wasm.
    let probe = r#"({
      fetch: await fetch("http://127.0.0.1:" + PORT + "/").then(() => "reached", (e) => String(e.message)),
      require: typeof require, process: typeof process,
      wasm: typeof WebAssembly, sab: typeof SharedArrayBuffer, atomics: typeof Atomics,
      std: await import("std").then(() => "loaded", (e) => String(e.message)),
      os: await import("os").then(() => "loaded", (e) => String(e.message)),
      host: typeof __marmot_host,
      fn: (() => { try { return new Function("return globalThis")() === globalThis } catch (e) { return String(e) } })(),
    })"#;
    // Something listens on loopback; fetch must not reach it.
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let port = listener.local_addr().unwrap().port();
    let probe = probe.replace("PORT", &port.to_string());
    let r = eval(&api, "jscount", "victim", &probe).await;
    let p = &r.json["result"];
    let fetch = p["fetch"].as_str().unwrap_or("");
    assert!(
        fetch.starts_with("fetch: unsupported") || fetch.starts_with("fetch: denied"),
        "{}",
        r.json
    );
    listener.set_nonblocking(true).unwrap();
    assert!(
        listener.accept().is_err(),
        "fetch reached the host's loopback"
    );
    assert_eq!(p["require"], "undefined");
    assert_eq!(p["process"], "undefined");
    assert_eq!(p["wasm"], "undefined");
    assert_eq!(p["sab"], "undefined");
    assert_eq!(p["atomics"], "undefined");
    assert_ne!(p["std"], "loaded");
    assert_ne!(p["os"], "loaded");
    assert_eq!(
        p["host"], "undefined",
        "the native host handle must be hidden"
    );

    // The victim is unharmed and still counts.
    assert_eq!(
        api.post_json("/v1/actors/jscount/victim", &json!({"by": 1}))
            .await
            .json["n"],
        2
    );
}

#[tokio::test]
async fn prototype_pollution_stays_in_its_sandbox() {
    let (_dir, _m, api) = node(None).await;
    let src = r#"
import { state, alarms, log } from "marmot";
export default {
  onMessage(body) {
    if (body.op === "pollute") {
      Object.prototype.polluted = "yes";
      Array.prototype.map = () => "hijacked";
      JSON.stringify = () => "hijacked";
      return "done";
    }
    if (body.op === "sdk") {
      // What the module's own calls used: they kept working (they broke
      // `state.list` for the actor that did this).
      const no = (what) => () => { throw new Error(what + " hijacked"); };
      Array.prototype.push = no("push");
      Array.prototype.join = no("join");
      Object.entries = no("entries");
      state.set("a", 1);
      state.set("b", { c: 2 });
      alarms.set("later", { after: 600000 });
      console.log("logged", 1, { x: 2 });
      log.info("fields", { k: "v", n: 3 });
      const listed = state.list("");
      return { n: listed.length, a: listed[0][0], c: listed[1][1].c, alarms: alarms.list().length };
    }
    return { polluted: ({}).polluted ?? null, map: [1].map((x) => x + 1) };
  },
  onAlarm() {},
};
"#;
    api.deploy_js("p", src).await;
    let r = api.op("p", "sdk", json!({"op": "sdk"})).await;
    assert_eq!(
        (r.status, &r.json),
        (200, &json!({"n": 2, "a": "a", "c": 2, "alarms": 1}))
    );
    assert_eq!(
        api.op("p", "evil", json!({"op": "pollute"})).await.body,
        b"done"
    );
    // The polluter itself still replies correctly: the host's encoding does
    // not go through the (replaced) global JSON.
    let r = api.op("p", "evil", json!({"op": "look"})).await;
    assert_eq!(r.json["polluted"], "yes");
    // Another actor of the same type, and an eval sandbox, are untouched.
    let r = api.op("p", "good", json!({"op": "look"})).await;
    assert_eq!(r.json, json!({"polluted": null, "map": [2]}));
    let r = eval(
        &api,
        "p",
        "evil",
        "[({}).polluted ?? null, [1].map((x) => x * 3)]",
    )
    .await;
    assert_eq!(r.json["result"], json!([null, [3]]));
}

const FUZZ_JS: &str = r#"import { state, events, alarms, inputs, actors, files, model, log } from "marmot";
function rng(seed) {
  let a = seed >>> 0;
  return () => {
    a = (a + 0x6D2B79F5) >>> 0;
    let t = a;
    t = Math.imul(t ^ (t >>> 15), t | 1);
    t ^= t + Math.imul(t ^ (t >>> 7), t | 61);
    return ((t ^ (t >>> 14)) >>> 0) / 4294967296;
  };
}
const deep = (n) => { let o = {}; for (let i = 0; i < n; i++) o = { o }; return o; };
const values = [undefined, null, true, false, 0, -1, 1.5, 1e308, NaN, Infinity, -0, "", "a", "n",
  "x".repeat(300), "y".repeat(70000), "../../etc/passwd", "/abs", "a/../b", "\u0000", "名前/ファイル",
  "outputs/r.txt", "*/5 * * * *", "bad cron", "Europe/Berlin", {}, [], { a: 1 }, [1, "2", null],
  { at: 0 }, { after: 5 }, { cron: "* * * * *" }, { cron: "nope", tz: "Mars/Base" }, { after: -1 },
  { at: 1e20 }, new Uint8Array(8), () => 1, deep(50), deep(400),
  { prompt: "q", schema: { type: "string" } }, { provider: "none", model: "x", messages: [] },
  Symbol.iterator, 123456789012345678901234567890n];
const fns = [
  (a) => state.get(a), (a, b) => state.set(a, b), (a) => state.delete(a), (a) => state.list(a),
  (a, b) => events.emit(a, b), (a, b) => alarms.set(a, b), (a) => alarms.cancel(a), () => alarms.list(),
  (a) => inputs.request(a), (a, b) => actors.send(a, b, {}), (a) => actors.send("fuzz", a, { stop: true }),
  (a) => actors.call("fuzz", a, { stop: true }), (a, b) => actors.call(a, b, { stop: true }),
  (a) => files.read(a), (a, b) => files.write(a, b), (a) => files.list(a), (a) => files.delete(a),
  (a, b) => log.info(a, b), (a) => console.log(a),
  (a) => model.chat(a), (a) => fetch(a), (a, b) => fetch("https://example.invalid/", b),
  (a) => setTimeout(a, 1), (a) => new TextDecoder().decode(a), (a) => new URL(a),
  (a) => crypto.getRandomValues(a), (a) => JSON.stringify(a),
];
export default {
  async onMessage(body) {
    if (body?.stop) return { stopped: true };
    const r = rng(body?.seed ?? 1);
    let ok = 0, thrown = 0;
    for (let i = 0; i < 40; i++) {
      const f = fns[Math.floor(r() * fns.length)];
      const a = values[Math.floor(r() * values.length)];
      const b = values[Math.floor(r() * values.length)];
      try { await f(a, b); ok++; } catch (e) { thrown++; }
    }
    return { ok, thrown };
  },
  onAlarm() {},
  onInput() {},
};
"#;

#[tokio::test]
async fn host_calls_with_random_arguments_never_break_the_node() {
    let (_dir, m, api) = node(None).await;
    assert_eq!(api.deploy_js("fuzz", FUZZ_JS).await.status, 201);
    let (mut ok, mut thrown, mut failed) = (0, 0, 0);
    for seed in 0..300u32 {
        let r = api
            .post_json(
                &format!("/v1/actors/fuzz/f{}", seed % 50),
                &json!({"seed": seed}),
            )
            .await;
        match r.status {
            200 => {
                ok += r.json["ok"].as_u64().unwrap();
                thrown += r.json["thrown"].as_u64().unwrap();
            }
            // A limit the random calls ran into (memory, output) ends the
            // turn cleanly: a JSON error, the instance discarded.
            _ => {
                assert!(
                    r.json["error"]["code"].is_string(),
                    "seed {seed}: {}",
                    r.json
                );
                failed += 1;
            }
        }
    }
    eprintln!("host calls: {ok} returned, {thrown} threw; {failed} turns ended by a limit");
    assert!(
        ok > 400 && thrown > 400,
        "the generator reached both outcomes"
    );
    assert!(failed < 30, "{failed} of 300 turns failed");
    assert_eq!(api.get("/healthz").await.status, 200);
    tokio::time::sleep(Duration::from_millis(200)).await;
    assert!(!m.log_text().contains("panicked"), "the node panicked");
    // Still consistent: plain turns and reads work.
    let r = api
        .post_json("/v1/actors/fuzz/after", &json!({"stop": true}))
        .await;
    assert_eq!(r.json, json!({"stopped": true}));
    assert_eq!(api.get("/v1/actors/fuzz/f3/state").await.status, 200);
}

/// A timer's delay is held to 2^31 - 1 ms, as browsers and Node hold it:
/// `setTimeout(r, Infinity)` used to panic the engine (a trap, with Rust's
/// panic message for the client). Now the script waits, and its time
/// limit ends it like any other wait.
#[tokio::test]
async fn endless_timer_delays_wait_for_the_time_limit() {
    let (_dir, _m, api) = node(Some("[limits]\neval_timeout_ms = 300\n")).await;
    api.deploy_js("jscount", COUNTER_JS).await;
    for delay in ["Infinity", "1e300", "-Infinity", "NaN"] {
        let r = eval(
            &api,
            "jscount",
            "t",
            &format!(
                "await new Promise((r) => setTimeout(r, {delay})); \
                 await new Promise((r) => setTimeout(r, Infinity)); 1"
            ),
        )
        .await;
        let shown = r.json.to_string();
        assert!(!shown.contains("panicked"), "{delay}: {shown}");
        assert!(
            r.json["error"]
                .as_str()
                .is_some_and(|e| e.contains("time limit of 300 ms")),
            "{delay}: {shown}"
        );
    }
}

/// A guest's error message is cut at 16 KiB: it goes to the client, the
/// log and a `turn_failed` event, and a 5 MB `Error` message was all three
/// in full, past every limit on events and output.
#[tokio::test]
async fn huge_error_messages_are_cut() {
    let (_dir, m, api) = node(None).await;
    let js = r#"
export default {
  onMessage() { throw new Error("m".repeat(5 << 20)); },
};
"#;
    assert_eq!(api.deploy_js("loud", js).await.status, 201);
    let r = api.post_json("/v1/actors/loud/a", &json!({})).await;
    assert_eq!(r.status, 500, "{}", r.json);
    assert!(r.body.len() < 20 << 10, "a {} byte reply", r.body.len());
    let msg = r.json["error"]["message"].as_str().unwrap();
    assert!(msg.contains("more bytes of the message cut"), "{msg:.200}");
    let r = api
        .post_json("/v1/actors/loud/q?wait=false", &json!({}))
        .await;
    assert_eq!(r.status, 202, "{}", r.json);
    let failed = api
        .wait_info("loud", "q", "the queued turn's failure", |i| {
            i["last_event_seq"].as_u64().unwrap_or(0) >= 1
        })
        .await;
    assert!(failed["last_event_seq"] == 1, "{failed}");
    let ev = api.get("/v1/actors/loud/q/events").await;
    assert!(ev.body.len() < 20 << 10, "a {} byte event", ev.body.len());
    assert_eq!(
        ev.json["events"][0]["kind"], "turn_failed",
        "{:.300}",
        ev.json
    );
    let r = eval(&api, "loud", "a", "throw new Error('e'.repeat(5 << 20))").await;
    assert!(
        r.body.len() < 20 << 10,
        "a {} byte eval reply",
        r.body.len()
    );
    assert!(m.log_text().len() < 4 << 20, "the log holds the messages");
}

/// Deep recursion is QuickJS's own stack overflow, a `RangeError` the code
/// may catch, for every shape tried: calls, the parser, `JSON.parse`,
/// `JSON.stringify`, `toString`. It was a trap at ~660 calls, which failed
/// the turn whatever the code did: QuickJS's limit is off on WASI
/// upstream, and the wasm stack (512 KiB) ran out first.
#[tokio::test]
async fn deep_recursion_is_a_catchable_error() {
    let (_dir, _m, api) = node(None).await;
    let js = r#"
function f(n) { return n === 0 ? 0 : 1 + f(n - 1); }
function g(n, a, b, c, d, e) { return n === 0 ? 0 : 1 + g(n - 1, a, b, c, d, e); }
const shapes = {
  f: (n) => f(n),
  g: (n) => g(n, 1, 2, 3, 4, 5),
  parse: (n) => JSON.parse("[".repeat(n) + "]".repeat(n)).length,
  parser: (n) => eval("(".repeat(n) + "1" + ")".repeat(n)),
  stringify: (n) => {
    const root = {};
    let o = root;
    for (let i = 0; i < n; i++) o = o.a = {};
    return JSON.stringify(root).length > 0 ? 1 : 0;
  },
  tostring: (n) => {
    const o = { toString: () => (n-- > 0 ? String(o) : "x") };
    return String(o).length;
  },
};
export default {
  onMessage({ n }) {
    const out = {};
    for (const [name, run] of Object.entries(shapes)) {
      try {
        out[name] = run(n) > 0 ? "ran" : "?";
      } catch (e) {
        out[name] = `caught ${e.name}`;
      }
    }
    return out;
  },
};
"#;
    assert_eq!(api.deploy_js("deep", js).await.status, 201);
    let r = api.post_json("/v1/actors/deep/a", &json!({"n": 200})).await;
    assert_eq!(r.status, 200, "{}", r.json);
    for (k, v) in r.json.as_object().unwrap() {
        assert_eq!(v, "ran", "{k}: {}", r.json);
    }
    for n in [1_000, 20_000, 100_000] {
        let r = api.post_json("/v1/actors/deep/a", &json!({"n": n})).await;
        assert_eq!(r.status, 200, "{n}: {}", r.json);
        for k in ["f", "g", "parse", "parser", "stringify", "tostring"] {
            let v = r.json[k].as_str().unwrap_or_default();
            assert!(
                v == "ran" || v == "caught RangeError",
                "{n} {k}: {}",
                r.json
            );
        }
        if n == 100_000 {
            assert!(
                r.json
                    .as_object()
                    .unwrap()
                    .values()
                    .all(|v| v == "caught RangeError"),
                "{}",
                r.json
            );
        }
    }
}

/// A type that logs as much as each turn may (1,000 lines of 8 KiB, by
/// `log` and by `console.log`), turn after turn, or throws long errors,
/// writes only its budget of bytes per second to the node's log; the rest
/// is dropped, counted in `/metrics` and reported in one line, not one
/// per turn. Without the budget the turns below wrote ~53 MB of log.
#[tokio::test]
async fn a_type_that_floods_the_log_is_held_to_its_bytes_per_second() {
    let (_dir, m, api) = node(Some("[limits]\nguest_log_bytes_per_s = 65536\n")).await;
    let source = r#"
import { log } from "marmot";
export default {
  async onMessage(body) {
    if (body.throw) throw new Error("F".repeat(100000));
    const line = "x".repeat(8000);
    for (let i = 0; i < 1000; i++) {
      if (body.console) console.log(line); else log.info(line, { i: String(i) });
    }
    return "ok";
  },
};
"#;
    assert_eq!(api.deploy_js("loud", source).await.status, 201);
    let before = m.log_text().len();
    for (i, console) in [false, true, false].into_iter().enumerate() {
        let r = api
            .post_json(
                &format!("/v1/actors/loud/a{i}"),
                &json!({"console": console}),
            )
            .await;
        assert_eq!(r.status, 200, "{}", r.json);
    }
    // Errors the guest chooses are charged too: 300 failed turns logged
    // ~16 KiB of message each (4.8 MB).
    for i in 0..300 {
        let r = api
            .post_json(
                &format!("/v1/actors/loud/e{}", i % 8),
                &json!({"throw": true}),
            )
            .await;
        assert_eq!(r.status, 500, "{}", r.json);
    }
    let written = m.log_text().len() - before;
    // A burst of 16 s at 64 KiB/s (1 MiB), and what refills meanwhile.
    assert!(written < 4 << 20, "{written} bytes of log");
    let metrics = String::from_utf8(api.get("/metrics").await.body).unwrap();
    let dropped: f64 = metrics
        .lines()
        .find(|l| l.starts_with("marmot_guest_log_lines_dropped_total{reason=\"rate\"}"))
        .and_then(|l| l.rsplit(' ').next()?.parse().ok())
        .expect("the counter");
    assert!(dropped > 2000.0, "{dropped} lines dropped");
    let reports = m
        .log_text()
        .matches("guest log output of this type dropped")
        .count();
    assert!((1..=2).contains(&reports), "{reports} reports");
    // Another type still logs.
    assert_eq!(api.deploy_js("quiet", COUNTER_JS).await.status, 201);
    let r = api.post_json("/v1/actors/quiet/q", &json!({})).await;
    assert_eq!(r.status, 200, "{}", r.json);
    assert!(m.log_text().contains("counter quiet q 1"));
}

/// Actors that loop, one per core, leave the node answering. A guest
/// yields to tokio's own scheduler at every tick, which polls the node's
/// sockets before the guest runs on; with wasmtime's plain yield the
/// workers looked at their sockets every 61 polls (~0.6 s of 10 ms
/// slices), and two loops on a 2-core node delayed every request by
/// 125–450 ms (a probe; this test's p90 was ~450 ms, and ~20 ms after).
#[tokio::test]
async fn looping_actors_leave_the_node_answering() {
    let (_dir, _m, api) = node(Some("[defaults]\ncpu_slice_ms = 8000\n")).await;
    let js = r#"import { state } from "marmot";
export default { async onMessage(body) {
  if (body.mode === "spin") for (;;) {}
  if (body.mode === "hostloop") for (;;) state.get("x");
  return 1;
} };"#;
    let manifest = json!({ "kind": "js", "code": js, "config": { "turn_timeout_ms": 8000 } });
    assert_eq!(api.deploy_manifest("loop", &manifest).await.status, 201);
    let idle = healthz_p90(&api).await;
    let workers = std::thread::available_parallelism().map_or(2, |n| n.get().clamp(2, 8));
    for i in 0..workers {
        // Both kinds: a loop between host calls, and one that calls the
        // host all the time (its CPU slice starts over at every call).
        let mode = if i % 2 == 0 { "spin" } else { "hostloop" };
        let r = api
            .post_json(
                &format!("/v1/actors/loop/l{i}?wait=false"),
                &json!({ "mode": mode }),
            )
            .await;
        assert_eq!(r.status, 202, "{}", r.json);
    }
    tokio::time::sleep(Duration::from_millis(500)).await;
    let busy = healthz_p90(&api).await;
    assert!(
        busy < Duration::from_millis(150),
        "with {workers} actors looping, /healthz took {busy:?} (p90; {idle:?} idle)"
    );
}

/// The 90th percentile of 21 `GET /healthz`, 20 ms apart.
async fn healthz_p90(api: &Api) -> Duration {
    let mut took = Vec::new();
    for _ in 0..21 {
        let t = Instant::now();
        assert_eq!(api.get("/healthz").await.status, 200);
        took.push(t.elapsed());
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    took.sort();
    took[18]
}
