//! Crash torture: `--cycles` (default 1,000) `kill -9`s of a node under
//! mixed load, with every acknowledged effect checked after each restart.
//!
//! Clients send messages with idempotency keys, `?wait=false` messages,
//! alarms, signed inbound webhooks, actor-to-actor sends, input requests and
//! their answers, and events that go out as webhooks to a local receiver.
//! Every operation carries a unique tag `c{client}-{seq}`; the actor counts
//! each effect under its tag in state, so the checker reads state and knows
//! how often each effect happened. The node is killed at a random moment;
//! operations in flight then have an unknown outcome.
//!
//! The run is cut into blocks of [`BLOCK`] cycles, each with its own actors,
//! so that the check after a restart reads a bounded amount of state. After
//! every restart, over the current block: each acknowledged synchronous
//! effect is present
//! exactly once, no effect is present twice, no alarm ran before its due
//! time, and every event the receiver got belongs to a committed turn (the
//! output gate). At the end, over every block, with the node left running,
//! the same again and every acknowledged
//! asynchronous effect (queued messages, alarms, webhooks in, sends, input
//! answers, webhooks out) arrives, exactly once in state and with one
//! stable `webhook-id` per event out. Any violation fails the run.

use std::collections::{BTreeMap, HashMap, HashSet};
use std::path::Path;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use anyhow::{Context as _, bail, ensure};
use rand::Rng as _;
use serde_json::{Value, json};

use super::BenchArgs;
use super::server::ServerProc;
use crate::webhooks::{new_secret, secret_key, sign};

const TYPE: &str = "torture";

/// Cycles that share one set of actors.
const BLOCK: usize = 20;

const ACTOR_JS: &str = r#"
import { state, events, alarms, inputs, actors } from "marmot";

const bump = (key) => {
  const n = (state.get(key) ?? 0) + 1;
  state.set(key, n);
  return n;
};

export default {
  onMessage(b) {
    switch (b.op) {
      case "add":
        return { n: bump("m:" + b.tag) };
      case "emit":
        bump("e:" + b.tag);
        events.emit("torture.out", { tag: b.tag });
        return { ok: true };
      case "alarm":
        bump("as:" + b.tag);
        alarms.set(b.tag, { after: b.after, payload: { tag: b.tag } });
        return { ok: true };
      case "send":
        bump("ss:" + b.tag);
        actors.send("torture", b.to, { op: "recv", tag: b.tag });
        return { ok: true };
      case "recv":
        return { n: bump("s:" + b.tag) };
      case "ask": {
        bump("q:" + b.tag);
        const id = inputs.request({ kind: "confirm", prompt: b.tag });
        state.set("input:" + id, b.tag);
        return { input_id: id };
      }
    }
    throw new Error("unknown op " + b.op);
  },
  onAlarm(alarm) {
    bump("a:" + alarm.payload.tag);
    if (Date.now() < alarm.dueAt) state.set("early:" + alarm.payload.tag, Date.now());
  },
  onWebhook(req) {
    bump("w:" + req.body.tag);
  },
  onInput(input) {
    bump("i:" + state.get("input:" + input.id));
  },
};
"#;

/// One kind of operation, and the state keys (prefixes) its effects count
/// under: synchronous effects are there when the request is acknowledged;
/// eventual ones arrive later.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
enum Kind {
    /// A message with an idempotency key, waiting for the reply.
    Message,
    /// `?wait=false`: acknowledged once queued.
    Queued,
    /// Sets an alarm due within 300 ms.
    Alarm,
    /// A signed inbound webhook.
    Hook,
    /// An actor-to-actor send.
    Send,
    /// An input request, then its answer.
    Input,
    /// An event that goes out as a webhook.
    Emit,
}

const KINDS: [Kind; 7] = [
    Kind::Message,
    Kind::Queued,
    Kind::Alarm,
    Kind::Hook,
    Kind::Send,
    Kind::Input,
    Kind::Emit,
];

/// An acknowledged operation and where its effects must show.
#[derive(Clone, Debug)]
struct Acked {
    kind: Kind,
    tag: String,
    /// Actor numbers (`a{n}`), unique across blocks.
    actor: usize,
    /// The actor a send went to.
    to: usize,
}

impl Acked {
    /// (actor, key) present once the acknowledgement was received.
    fn sync_effects(&self) -> Vec<(usize, String)> {
        let t = &self.tag;
        match self.kind {
            Kind::Message => vec![(self.actor, format!("m:{t}"))],
            Kind::Alarm => vec![(self.actor, format!("as:{t}"))],
            Kind::Send => vec![(self.actor, format!("ss:{t}"))],
            Kind::Input => vec![(self.actor, format!("q:{t}"))],
            Kind::Emit => vec![(self.actor, format!("e:{t}"))],
            Kind::Queued | Kind::Hook => Vec::new(),
        }
    }

    /// (actor, key) that must arrive eventually.
    fn eventual_effects(&self) -> Vec<(usize, String)> {
        let t = &self.tag;
        match self.kind {
            Kind::Queued => vec![(self.actor, format!("m:{t}"))],
            Kind::Alarm => vec![(self.actor, format!("a:{t}"))],
            Kind::Hook => vec![(self.actor, format!("w:{t}"))],
            Kind::Send => vec![(self.to, format!("s:{t}"))],
            Kind::Input => vec![(self.actor, format!("i:{t}"))],
            Kind::Message | Kind::Emit => Vec::new(),
        }
    }
}

/// What the clients saw.
#[derive(Default)]
struct History {
    /// By block.
    acked: BTreeMap<usize, Vec<Acked>>,
    /// Operations cut off by the kill (or refused while the node was
    /// failing): they may or may not have happened, at most once.
    unknown: BTreeMap<Kind, u64>,
    ok: BTreeMap<Kind, u64>,
}

/// State read back: actor number → key → value.
type States = HashMap<usize, HashMap<String, Value>>;

/// Outbound webhooks received: tag → webhook-ids seen.
type Received = Arc<Mutex<HashMap<String, HashSet<String>>>>;

/// Run the torture: `args.cycles` kill -9 cycles, `args.actors` actors per
/// block (default 16), `args.connections` clients.
pub(super) async fn torture(args: &BenchArgs) -> anyhow::Result<()> {
    let cycles = args.cycles;
    let actors = args.actors.unwrap_or(16).max(2);
    let clients = args.connections.clamp(1, 64);
    let dir = tempfile::tempdir()?;
    let data = dir.path().join("data");
    let log = dir.path().join("node.log");
    let (receiver_url, received) = start_receiver().await?;
    let secret = new_secret();
    let key = Arc::new(secret_key(&secret));
    let http = reqwest::Client::builder()
        .timeout(Duration::from_secs(20))
        .pool_max_idle_per_host(0)
        .build()?;
    println!(
        "torture: {cycles} kill -9 cycles, {actors} actors, {clients} clients, node log {}",
        log.display()
    );

    let history = Arc::new(Mutex::new(History::default()));
    let mut seqs = vec![0u64; clients];
    let mut restarts = Vec::with_capacity(cycles);
    let started = Instant::now();
    let mut node = start_node(&data, &log).await?;
    setup(&http, &node, &secret, &receiver_url).await?;
    for cycle in 1..=cycles {
        let block = (cycle - 1) / BLOCK;
        let stop = Arc::new(AtomicBool::new(false));
        let mut tasks = Vec::with_capacity(clients);
        for (c, seq) in seqs.iter().enumerate() {
            let ctx = Client {
                http: http.clone(),
                base: format!("http://{}", node.addr),
                key: key.clone(),
                history: history.clone(),
                stop: stop.clone(),
                actors: block * actors..(block + 1) * actors,
                block,
                id: c,
            };
            let seq = *seq;
            tasks.push(tokio::spawn(async move { ctx.run(seq).await }));
        }
        let run_for = rand::rng().random_range(30..400);
        tokio::time::sleep(Duration::from_millis(run_for)).await;
        node.kill9();
        stop.store(true, Ordering::SeqCst);
        for (c, t) in tasks.into_iter().enumerate() {
            seqs[c] = t.await?;
        }
        let t = Instant::now();
        node = start_node(&data, &log).await?;
        restarts.push(t.elapsed());
        let state = read(&http, &node, block * actors..(block + 1) * actors).await?;
        let h = history.lock().unwrap_or_else(|p| p.into_inner());
        check(&h, &state, &received, false)
            .with_context(|| format!("after restart {cycle} (node log: {})", log.display()))?;
        if cycle % 50 == 0 || cycle == cycles {
            println!(
                "  cycle {cycle}: {} acknowledged, {} unknown, checks pass",
                h.ok.values().sum::<u64>(),
                h.unknown.values().sum::<u64>()
            );
        }
    }

    // Let every acknowledged asynchronous effect arrive.
    let deadline = Instant::now() + Duration::from_secs(120);
    let blocks = cycles.div_ceil(BLOCK);
    loop {
        let state = read(&http, &node, 0..blocks * actors).await?;
        let checked = {
            let h = history.lock().unwrap_or_else(|p| p.into_inner());
            check(&h, &state, &received, true)
        };
        match checked {
            Ok(()) => break,
            Err(e) if Instant::now() > deadline => {
                return Err(e.context(format!(
                    "effects still missing after 120 s (node log: {})",
                    log.display()
                )));
            }
            Err(_) => {}
        }
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
    node.stop();

    let h = history.lock().unwrap_or_else(|p| p.into_inner());
    let p = super::Percentiles::of(&mut restarts);
    println!(
        "torture: {cycles} cycles in {:.0} s; kill -9 → ready again: p50 {:.0} ms, p99 {:.0} ms",
        started.elapsed().as_secs_f64(),
        p.p50.as_secs_f64() * 1e3,
        p.p99.as_secs_f64() * 1e3,
    );
    println!("  {:<9} {:>9} {:>9}", "operation", "acked", "unknown");
    for k in KINDS {
        println!(
            "  {:<9} {:>9} {:>9}",
            format!("{k:?}").to_lowercase(),
            h.ok.get(&k).copied().unwrap_or(0),
            h.unknown.get(&k).copied().unwrap_or(0)
        );
    }
    let out: usize = received.lock().unwrap_or_else(|p| p.into_inner()).len();
    println!(
        "  result: 0 acknowledged effects lost, 0 applied twice, 0 alarms early, \
         0 webhooks out before their commit ({out} events delivered, one webhook-id each)"
    );
    Ok(())
}

async fn start_node(data: &Path, log: &Path) -> anyhow::Result<ServerProc> {
    // Fast outbound retries, so that deliveries cut off by a kill arrive
    // within the final wait.
    ServerProc::start_with(
        data,
        "",
        &[("MARMOT_WEBHOOK_RETRY_BASE_MS", "50")],
        Some(log),
    )
    .await
}

async fn setup(
    http: &reqwest::Client,
    node: &ServerProc,
    secret: &str,
    receiver: &str,
) -> anyhow::Result<()> {
    let manifest = json!({"kind": "js", "code": ACTOR_JS, "config": {"webhook_secret": secret}});
    let r = http
        .put(format!("http://{}/v1/types/{TYPE}", node.addr))
        .json(&manifest)
        .send()
        .await?;
    ensure!(r.status().is_success(), "deploy: {}", r.text().await?);
    let r = http
        .put(format!("http://{}/v1/subscriptions/torture", node.addr))
        .json(&json!({"url": receiver, "events": ["torture.out"]}))
        .send()
        .await?;
    ensure!(r.status().is_success(), "subscribe: {}", r.text().await?);
    Ok(())
}

/// One client's loop.
struct Client {
    http: reqwest::Client,
    base: String,
    key: Arc<Vec<u8>>,
    history: Arc<Mutex<History>>,
    stop: Arc<AtomicBool>,
    /// This block's actor numbers.
    actors: std::ops::Range<usize>,
    block: usize,
    id: usize,
}

/// How one request ended.
enum Outcome {
    Ok(Value),
    /// No answer, or a 5xx: may or may not have happened.
    Unknown,
}

impl Client {
    /// Send operations until stopped; returns the next sequence number.
    async fn run(self, mut seq: u64) -> u64 {
        while !self.stop.load(Ordering::SeqCst) {
            seq += 1;
            let (kind, actor, to) = {
                let mut rng = rand::rng();
                let kind = KINDS[rng.random_range(0..KINDS.len())];
                let actor = rng.random_range(self.actors.clone());
                let to = loop {
                    let to = rng.random_range(self.actors.clone());
                    if to != actor {
                        break to;
                    }
                };
                (kind, actor, to)
            };
            let tag = format!("{}.c{}-{seq}", self.block, self.id);
            let outcome = self.invoke(kind, &tag, actor, to).await;
            let mut h = self.history.lock().unwrap_or_else(|p| p.into_inner());
            match outcome {
                Outcome::Ok(_) => {
                    *h.ok.entry(kind).or_default() += 1;
                    h.acked.entry(self.block).or_default().push(Acked {
                        kind,
                        tag,
                        actor,
                        to,
                    });
                }
                Outcome::Unknown => *h.unknown.entry(kind).or_default() += 1,
            }
        }
        seq
    }

    async fn invoke(&self, kind: Kind, tag: &str, actor: usize, to: usize) -> Outcome {
        let path = format!("/v1/actors/{TYPE}/a{actor}");
        match kind {
            Kind::Message => {
                self.message(&path, json!({"op": "add", "tag": tag}), tag)
                    .await
            }
            Kind::Queued => {
                let path = format!("{path}?wait=false");
                self.message(&path, json!({"op": "add", "tag": tag}), tag)
                    .await
            }
            Kind::Alarm => {
                let after = rand::rng().random_range(0..300);
                let body = json!({"op": "alarm", "tag": tag, "after": after});
                self.message(&path, body, tag).await
            }
            Kind::Send => {
                let body = json!({"op": "send", "tag": tag, "to": format!("a{to}")});
                self.message(&path, body, tag).await
            }
            Kind::Emit => {
                self.message(&path, json!({"op": "emit", "tag": tag}), tag)
                    .await
            }
            Kind::Hook => self.hook(actor, tag).await,
            Kind::Input => {
                let asked = self.message(&path, json!({"op": "ask", "tag": tag}), tag);
                let Outcome::Ok(reply) = asked.await else {
                    return Outcome::Unknown;
                };
                let Some(id) = reply["input_id"].as_str() else {
                    return Outcome::Unknown;
                };
                let answer = self
                    .http
                    .post(format!("{}{path}/inputs/{id}", self.base))
                    .json(&json!({"ok": true}))
                    .send()
                    .await;
                outcome(answer).await
            }
        }
    }

    async fn message(&self, path: &str, body: Value, tag: &str) -> Outcome {
        let r = self
            .http
            .post(format!("{}{path}", self.base))
            .header("idempotency-key", tag)
            .json(&body)
            .send()
            .await;
        outcome(r).await
    }

    async fn hook(&self, actor: usize, tag: &str) -> Outcome {
        let body = serde_json::to_vec(&json!({"tag": tag})).expect("JSON encodes");
        let ts = crate::clock::now_ms() as i64 / 1000;
        let r = self
            .http
            .post(format!("{}/v1/hooks/{TYPE}/a{actor}/t", self.base))
            .header("content-type", "application/json")
            .header("webhook-id", tag)
            .header("webhook-timestamp", ts.to_string())
            .header("webhook-signature", sign(&self.key, tag, ts, &body))
            .body(body)
            .send()
            .await;
        outcome(r).await
    }
}

async fn outcome(r: reqwest::Result<reqwest::Response>) -> Outcome {
    let Ok(r) = r else {
        return Outcome::Unknown;
    };
    let status = r.status();
    match r.bytes().await {
        Ok(body) if status.is_success() => {
            Outcome::Ok(serde_json::from_slice(&body).unwrap_or(Value::Null))
        }
        // 4xx would be the checker's own mistake (and is refused by the
        // node without effect); 5xx and cut-off bodies are unknown.
        _ => Outcome::Unknown,
    }
}

/// The state of actors `actors`.
async fn read(
    http: &reqwest::Client,
    node: &ServerProc,
    actors: std::ops::Range<usize>,
) -> anyhow::Result<States> {
    let mut all = States::with_capacity(actors.len());
    for a in actors {
        let mut state = HashMap::new();
        let mut after: Option<String> = None;
        loop {
            let mut url = format!(
                "http://{}/v1/actors/{TYPE}/a{a}/state?limit=1000",
                node.addr
            );
            if let Some(k) = &after {
                url.push_str("&after=");
                url.push_str(
                    &percent_encoding::utf8_percent_encode(k, percent_encoding::NON_ALPHANUMERIC)
                        .to_string(),
                );
            }
            let r = http.get(url).send().await?;
            if r.status() == reqwest::StatusCode::NOT_FOUND {
                break;
            }
            ensure!(r.status().is_success(), "reading state: {}", r.status());
            let page: Value = r.json().await?;
            for e in page["entries"].as_array().into_iter().flatten() {
                let k = e["key"].as_str().unwrap_or_default().to_owned();
                state.insert(k, e["value"].clone());
            }
            match page["next_after"].as_str() {
                Some(k) => after = Some(k.to_owned()),
                None => break,
            }
        }
        all.insert(a, state);
    }
    Ok(all)
}

/// Check the history of the blocks whose actors are in `state`. `eventual`:
/// the asynchronous effects must be there too.
fn check(h: &History, state: &States, received: &Received, eventual: bool) -> anyhow::Result<()> {
    let count = |a: usize, k: &str| {
        state
            .get(&a)
            .and_then(|s| s.get(k))
            .and_then(Value::as_u64)
            .unwrap_or(0)
    };
    // Nothing twice, no alarm early.
    for (a, s) in state {
        for (k, v) in s {
            if k.starts_with("early:") {
                bail!("alarm {k} of a{a} ran before its due time");
            }
            if v.as_u64().unwrap_or(0) > 1 {
                bail!("effect {k} of a{a} applied {v} times");
            }
        }
    }
    let blocks: HashSet<usize> = h
        .acked
        .iter()
        .filter(|(_, ops)| ops.first().is_some_and(|op| state.contains_key(&op.actor)))
        .map(|(b, _)| *b)
        .collect();
    let ops = || blocks.iter().flat_map(|b| &h.acked[b]);
    for op in ops() {
        for (a, k) in op.sync_effects() {
            ensure!(count(a, &k) == 1, "acknowledged {op:?}: {k} lost on a{a}");
        }
        if eventual {
            for (a, k) in op.eventual_effects() {
                ensure!(
                    count(a, &k) == 1,
                    "acknowledged {op:?}: {k} never arrived on a{a}"
                );
            }
        }
    }
    // Output gate: an event out belongs to a committed turn.
    let received = received.lock().unwrap_or_else(|p| p.into_inner());
    let committed: HashSet<&str> = state
        .values()
        .flat_map(|s| s.keys())
        .filter_map(|k| k.strip_prefix("e:"))
        .collect();
    let in_blocks = |tag: &str| {
        let block = tag.split('.').next().and_then(|b| b.parse().ok());
        block.is_some_and(|b| blocks.contains(&b))
    };
    for (tag, ids) in received.iter().filter(|(tag, _)| in_blocks(tag)) {
        ensure!(
            committed.contains(tag.as_str()),
            "event {tag} went out but its turn is not committed"
        );
        ensure!(
            ids.len() == 1,
            "event {tag} went out with {} webhook-ids",
            ids.len()
        );
    }
    if eventual {
        for op in ops().filter(|op| op.kind == Kind::Emit) {
            ensure!(
                received.contains_key(&op.tag),
                "acknowledged event {} never went out",
                op.tag
            );
        }
    }
    Ok(())
}

/// A local webhook receiver: records each event's tag and webhook-id.
async fn start_receiver() -> anyhow::Result<(String, Received)> {
    let received: Received = Arc::default();
    let listener = tokio::net::TcpListener::bind(("127.0.0.1", 0)).await?;
    let url = format!("http://{}/hook", listener.local_addr()?);
    let r = received.clone();
    let app = axum::Router::new().route(
        "/hook",
        axum::routing::post(
            move |headers: axum::http::HeaderMap, body: axum::body::Bytes| {
                let r = r.clone();
                async move {
                    let id = headers
                        .get("webhook-id")
                        .and_then(|v| v.to_str().ok())
                        .unwrap_or_default()
                        .to_owned();
                    let tag = serde_json::from_slice::<Value>(&body)
                        .ok()
                        .and_then(|v| find_tag(&v));
                    if let Some(tag) = tag {
                        r.lock()
                            .unwrap_or_else(|p| p.into_inner())
                            .entry(tag)
                            .or_default()
                            .insert(id);
                    }
                    axum::http::StatusCode::OK
                }
            },
        ),
    );
    tokio::spawn(async move {
        let _ = axum::serve(listener, app).await;
    });
    Ok((url, received))
}

/// The `tag` of an event, wherever the envelope put its data.
fn find_tag(v: &Value) -> Option<String> {
    match v {
        Value::Object(o) => o
            .get("tag")
            .and_then(Value::as_str)
            .map(str::to_owned)
            .or_else(|| o.values().find_map(find_tag)),
        Value::Array(a) => a.iter().find_map(find_tag),
        _ => None,
    }
}
