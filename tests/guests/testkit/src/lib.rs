//! `testkit`: an actor the integration tests steer with JSON commands.
//!
//! Each message is `{"op": "...", ...}`; the ops exercise one host behaviour
//! each (state, events, traps, limits, fault injection, upgrades).

mod fuzz;

use marmot_guest::actors;
use marmot_guest::alarms::{self, Schedule};
use marmot_guest::raw::{files, http, js};
use marmot_guest::{
    Actor, Alarm, Context, InputAnswer, Message, Reply, Result, Webhook, events, inputs, log, state,
};
use serde::Deserialize;
use serde_json::{Value, json};

#[derive(Deserialize)]
#[serde(tag = "op", rename_all = "snake_case")]
enum Op {
    /// Add `by` to the integer under `key`; reply with the new value.
    Add { key: String, by: i64 },
    /// Count operation `id` under `seen/<id>` and bump `total`, in one turn.
    Record {
        id: String,
        #[serde(default)]
        busy_ms: u64,
    },
    /// Append `value` to the JSON list under `key` (read-modify-write).
    Append { key: String, value: Value },
    /// Set `key` to the JSON `value`.
    Set { key: String, value: Value },
    /// Read `key`.
    Get { key: String },
    /// Delete `key`.
    Delete { key: String },
    /// List keys under `prefix`.
    List { prefix: String },
    /// Write `key`, then panic (trap): nothing may commit.
    SetThenTrap { key: String, value: Value },
    /// Write `key`, then return an error: nothing may commit.
    SetThenFail { key: String, value: Value },
    /// Append an event.
    Emit { kind: String, data: Value },
    /// Spin forever (CPU limit).
    Spin,
    /// Allocate and touch `mb` MiB (memory limit).
    Alloc { mb: usize },
    /// Store a value of `bytes` bytes under `key` (value size limit).
    Big { key: String, bytes: usize },
    /// Busy-wait `ms` milliseconds of wall time.
    Busy { ms: u64 },
    /// Log the fault-injection marker; a node started with
    /// `MARMOT_FAULT_ABORT_ON_LOG` set to it aborts mid-turn.
    Crash { marker: String },
    /// One `model.chat` call: the answer, or the error.
    Chat { request: Value },
    /// `calls` random host calls with random arguments through the raw
    /// WIT bindings (a fuzzer of the host boundary); replies with how many
    /// returned a value or an error per interface.
    HostFuzz { seed: u64, calls: u32 },
    /// Print to stdout and stderr.
    Print { text: String },
    /// Reply with the context and the upgrade marker.
    Whoami,
    /// Reply with a chosen status.
    Status {
        status: u16,
        /// Set this state key to `true` first.
        #[serde(default)]
        key: Option<String>,
    },
    /// Try to reach files, the environment and the network; report what
    /// worked (nothing should).
    Ambient { port: u16 },
    /// Set alarm `name` (one of `at`, `after`, `cron` [+ `tz`]); a refusal
    /// is replied with status 422 and the host's message. `fail`: then
    /// fail the turn.
    AlarmSet {
        name: String,
        at: Option<u64>,
        after: Option<u64>,
        cron: Option<String>,
        tz: Option<String>,
        #[serde(default)]
        payload: Value,
        #[serde(default)]
        fail: bool,
    },
    /// Cancel alarm `name` (`fail`: then fail the turn).
    AlarmCancel {
        name: String,
        #[serde(default)]
        fail: bool,
    },
    /// List pending alarms.
    AlarmList,
    /// Call another actor with `body`; reply with its status and body, or
    /// with status 502 and the error.
    Call { ty: String, id: String, body: Value },
    /// Send `body` to another actor, then fail the turn if `fail`.
    Send {
        ty: String,
        id: String,
        body: Value,
        #[serde(default)]
        fail: bool,
        /// Keep the turn busy this long after sending.
        #[serde(default)]
        then_busy_ms: u64,
    },
    /// Fetch through the `http` capability; reply with the response
    /// (`status`, `headers`, `body` as text) or `{"error": "kind: message"}`.
    Fetch {
        #[serde(default = "get")]
        method: String,
        url: String,
        #[serde(default)]
        headers: Vec<(String, String)>,
        body: Option<String>,
        timeout_ms: Option<u32>,
    },
    /// GET every url at once (the SDK's `send_all`); reply with each body,
    /// or each error, in order.
    FetchAll { urls: Vec<String> },
    /// Fetch with the body streamed, read `max` bytes at a time; reply with
    /// `status`, the number of chunks and the body as text.
    FetchStream {
        url: String,
        #[serde(default)]
        headers: Vec<(String, String)>,
        max: u32,
    },
    /// Write a file: `text`, or `bytes` bytes of a pattern; then fail the
    /// turn if `fail`, or log `crash` (the fault-injection marker).
    FileWrite {
        path: String,
        text: Option<String>,
        bytes: Option<usize>,
        #[serde(default)]
        fail: bool,
        crash: Option<String>,
    },
    /// Read a file: `{"text", "size"}` or `{"error"}`.
    FileRead { path: String },
    /// List files under `prefix`.
    FileList {
        #[serde(default)]
        prefix: String,
    },
    /// Delete a file: `{"existed"}`.
    FileDelete { path: String },
    /// Run `code` in a child JavaScript sandbox with `tools`; reply with
    /// its `{result, logs, error}` or `{"host_error"}`; then fail the turn if
    /// `fail`.
    JsEval {
        code: String,
        #[serde(default)]
        tools: Vec<String>,
        timeout_ms: Option<u32>,
        #[serde(default)]
        fail: bool,
    },
    /// Search this instance's whole linear memory for a byte string given
    /// masked (`masked[i] ^ mask[i]`), so that the string itself is never
    /// in memory unless something else put it there.
    ScanMemory { masked: Vec<u8>, mask: Vec<u8> },
    /// Keep `text` in this instance's memory for as long as the instance
    /// lives (what a scan of another instance must not find).
    Remember { text: String },
    /// Ask for input; a refusal is replied with status 422.
    InputRequest {
        kind: String,
        #[serde(default)]
        prompt: String,
        schema: Option<Value>,
        expires_in_ms: Option<u64>,
        /// Fail the turn after the request.
        #[serde(default)]
        fail: bool,
    },
}

thread_local! {
    /// What [`Op::Remember`] keeps.
    static REMEMBERED: std::cell::RefCell<Vec<String>> = const { std::cell::RefCell::new(Vec::new()) };
}

fn get() -> String {
    "GET".into()
}

/// Whether linear memory holds `masked ^ mask` anywhere.
#[allow(unsafe_code, reason = "reads the instance's own linear memory")]
fn memory_holds(masked: &[u8], mask: &[u8]) -> bool {
    #[cfg(target_family = "wasm")]
    {
        let size = core::arch::wasm32::memory_size(0) * 65536;
        let n = masked.len().min(mask.len());
        if n == 0 {
            return false;
        }
        // Address 0 is never a Rust object; start past it.
        (8..size.saturating_sub(n)).any(|at| {
            (0..n).all(|i| {
                // SAFETY: every address below memory_size * 64 KiB is
                // mapped linear memory; reading it is reading bytes.
                let b = unsafe { core::ptr::read_volatile((at + i) as *const u8) };
                b ^ mask[i] == masked[i]
            })
        })
    }
    #[cfg(not(target_family = "wasm"))]
    {
        let _ = (masked, mask);
        false
    }
}

/// What `on_alarm` does, from the alarm's payload: `{"fail": true}` fails
/// the turn; `{"rearm_after": ms}` sets the same alarm again; `{"log": m}`
/// logs `m` after the turn's writes (the fault-injection marker);
/// `{"busy_ms": ms}` makes the handler take that long; `{"add": key}` adds
/// 1 to the counter `key` (reading it first, as a message's `add` does).
#[derive(Deserialize, Default)]
#[serde(default)]
struct AlarmPayload {
    fail: bool,
    rearm_after: Option<u64>,
    log: Option<String>,
    busy_ms: Option<u64>,
    add: Option<String>,
}

struct TestKit;

impl Actor for TestKit {
    fn on_message(ctx: &Context, msg: Message) -> Result<Reply> {
        match msg.json::<Op>()? {
            Op::Add { key, by } => {
                let v = state::get_json::<i64>(&key)?.unwrap_or(0) + by;
                state::set_json(&key, &v)?;
                Reply::json(&json!({ "value": v }))
            }
            Op::Record { id, busy_ms } => {
                // Read, then stay busy: a commit that lands well after the
                // turn started (a move or a failover meanwhile).
                let seen = state::get_json::<u64>(&format!("seen/{id}"))?.unwrap_or(0) + 1;
                state::set_json(&format!("seen/{id}"), &seen)?;
                let total = state::get_json::<u64>("total")?.unwrap_or(0) + 1;
                state::set_json("total", &total)?;
                // Whether an earlier start of this message was cut off.
                state::set_json(&format!("attempt/{id}"), &marmot_guest::turn::attempt())?;
                let start = std::time::Instant::now();
                while start.elapsed().as_millis() < u128::from(busy_ms) {
                    std::hint::spin_loop();
                }
                Reply::json(&json!({ "seen": seen, "total": total }))
            }
            Op::Append { key, value } => {
                let mut list = state::get_json::<Vec<Value>>(&key)?.unwrap_or_default();
                list.push(value);
                state::set_json(&key, &list)?;
                Reply::json(&json!({ "len": list.len() }))
            }
            Op::Set { key, value } => {
                state::set_json(&key, &value)?;
                Reply::json(&json!({ "ok": true }))
            }
            Op::Get { key } => Reply::json(&json!({ "value": state::get_json::<Value>(&key)? })),
            Op::Delete { key } => Reply::json(&json!({ "existed": state::delete(&key) })),
            Op::List { prefix } => {
                let keys: Vec<String> = state::list_all(&prefix)
                    .into_iter()
                    .map(|(k, _)| k)
                    .collect();
                Reply::json(&json!({ "keys": keys }))
            }
            Op::SetThenTrap { key, value } => {
                state::set_json(&key, &value)?;
                events::emit("should_not_commit", &value)?;
                panic!("testkit: trapping after a write, as asked");
            }
            Op::SetThenFail { key, value } => {
                state::set_json(&key, &value)?;
                events::emit("should_not_commit", &value)?;
                Err("testkit: failing after a write, as asked".into())
            }
            Op::Emit { kind, data } => {
                let seq = events::emit(&kind, &data)?;
                Reply::json(&json!({ "seq": seq }))
            }
            Op::Spin => {
                let mut x: u64 = 0;
                loop {
                    x = std::hint::black_box(x.wrapping_add(1));
                }
            }
            Op::Alloc { mb } => {
                let mut chunks = Vec::new();
                for _ in 0..mb {
                    let mut v = vec![0u8; 1 << 20];
                    v[0] = 1;
                    *v.last_mut().unwrap() = 1;
                    chunks.push(v);
                }
                Reply::json(&json!({ "allocated_mb": chunks.len() }))
            }
            Op::Big { key, bytes } => {
                state::set(&key, &vec![b'x'; bytes])?;
                Reply::json(&json!({ "ok": true }))
            }
            Op::Busy { ms } => {
                let start = std::time::Instant::now();
                while start.elapsed().as_millis() < u128::from(ms) {
                    std::hint::spin_loop();
                }
                Reply::json(&json!({ "busy_ms": ms }))
            }
            Op::Crash { marker } => {
                log::error(&marker);
                Reply::json(&json!({ "crashed": false }))
            }
            Op::HostFuzz { seed, calls } => Reply::json(&fuzz::run(seed, calls)),
            Op::Chat { request } => match marmot_guest::model::chat(&request) {
                Ok(answer) => Reply::json(&json!({ "answer": answer })),
                Err(e) => Reply::json(&json!({ "error": e.message() })),
            },
            Op::Print { text } => {
                println!("{text}");
                eprintln!("{text}");
                Reply::json(&json!({ "ok": true }))
            }
            Op::Whoami => Reply::json(&json!({
                "type": ctx.actor_type,
                "id": ctx.id,
                "version": ctx.version,
                "upgraded_from": state::get_json::<Value>("upgraded_from")?,
            })),
            Op::Ambient { port } => {
                let file = std::fs::read("/etc/passwd")
                    .map(|b| b.len())
                    .map_err(|e| e.to_string());
                let dir = std::fs::read_dir("/")
                    .map(|d| d.count())
                    .map_err(|e| e.to_string());
                let cwd = std::fs::read_dir(".")
                    .map(|d| d.count())
                    .map_err(|e| e.to_string());
                let env: Vec<String> = std::env::vars().map(|(k, _)| k).collect();
                let net = std::net::TcpStream::connect(("127.0.0.1", port))
                    .map(|_| ())
                    .map_err(|e| e.to_string());
                Reply::json(&json!({
                    "file_ok": file.is_ok(),
                    "dir_ok": dir.is_ok(),
                    "cwd_ok": cwd.is_ok(),
                    "env": env,
                    "net_ok": net.is_ok(),
                    "net_error": net.err(),
                }))
            }
            Op::Status { status, key } => {
                if let Some(key) = key {
                    state::set_json(&key, &true)?;
                }
                Ok(Reply::json(&json!({ "status": status }))?.with_status(status))
            }
            Op::AlarmSet {
                name,
                at,
                after,
                cron,
                tz,
                payload,
                fail,
            } => {
                let schedule = match (at, after, cron) {
                    (Some(t), None, None) => Schedule::At(t),
                    (None, Some(d), None) => Schedule::After(d),
                    (None, None, Some(expr)) => Schedule::Cron { expr, tz },
                    _ => return Err("give exactly one of at, after, cron".into()),
                };
                match alarms::set(&name, schedule, &payload) {
                    Ok(()) if fail => Err("failing after setting the alarm".into()),
                    Ok(()) => Reply::json(&json!({ "ok": true })),
                    Err(e) => Ok(Reply::json(&json!({ "error": e.message() }))?.with_status(422)),
                }
            }
            Op::AlarmCancel { name, fail } => {
                let existed = alarms::cancel(&name)?;
                if fail {
                    return Err("failing after cancelling the alarm".into());
                }
                Reply::json(&json!({ "existed": existed }))
            }
            Op::Call { ty, id, body } => match actors::call(&ty, &id, &body) {
                Ok(r) => Reply::json(&json!({
                    "status": r.status,
                    "body": r.json::<Value>().unwrap_or(Value::Null),
                })),
                Err(e) => Ok(Reply::json(&json!({ "error": e.message() }))?.with_status(502)),
            },
            Op::Send {
                ty,
                id,
                body,
                fail,
                then_busy_ms,
            } => {
                actors::send(&ty, &id, &body)?;
                let start = std::time::Instant::now();
                while start.elapsed().as_millis() < u128::from(then_busy_ms) {
                    std::hint::spin_loop();
                }
                if fail {
                    return Err("testkit: failing after a send, as asked".into());
                }
                Reply::json(&json!({ "sent": true }))
            }
            Op::InputRequest {
                kind,
                prompt,
                schema,
                expires_in_ms,
                fail,
            } => match inputs::request_with(&kind, &prompt, schema.as_ref(), expires_in_ms) {
                Ok(_) if fail => Err("failing after the input request".into()),
                Ok(id) => Reply::json(&json!({ "id": id })),
                Err(e) => Ok(Reply::json(&json!({ "error": e.message() }))?.with_status(422)),
            },
            Op::Fetch {
                method,
                url,
                headers,
                body,
                timeout_ms,
            } => {
                let req = http::Request {
                    method,
                    url,
                    headers,
                    body: body.map(String::into_bytes),
                    timeout_ms,
                };
                match http::fetch(&req) {
                    Ok(r) => Reply::json(&json!({
                        "status": r.status,
                        "headers": r.headers,
                        "body": String::from_utf8_lossy(&r.body),
                    })),
                    Err(e) => Reply::json(&json!({
                        "error": marmot_guest::Error::from(e).message(),
                    })),
                }
            }
            Op::FetchAll { urls } => {
                let requests = urls.iter().map(|u| marmot_guest::http::Request::get(u));
                match marmot_guest::http::send_all(requests.collect()) {
                    Ok(answers) => {
                        let answers: Vec<Value> = answers
                            .into_iter()
                            .map(|a| match a {
                                Ok(r) => json!({ "body": r.text() }),
                                Err(e) => json!({ "error": e.message() }),
                            })
                            .collect();
                        Reply::json(&json!({ "answers": answers }))
                    }
                    Err(e) => Reply::json(&json!({ "error": e.message() })),
                }
            }
            Op::FetchStream { url, headers, max } => {
                let req = http::Request {
                    method: "GET".into(),
                    url,
                    headers,
                    body: None,
                    timeout_ms: None,
                };
                let resp = match http::fetch_stream(&req) {
                    Ok(r) => r,
                    Err(e) => {
                        return Reply::json(
                            &json!({ "error": marmot_guest::Error::from(e).message() }),
                        );
                    }
                };
                let mut body = Vec::new();
                let mut chunks = 0;
                loop {
                    match resp.body.read(max) {
                        Ok(Some(c)) => {
                            assert!(c.len() <= max as usize, "a chunk larger than asked for");
                            chunks += 1;
                            body.extend(c);
                        }
                        Ok(None) => break,
                        Err(e) => {
                            return Reply::json(
                                &json!({ "error": marmot_guest::Error::from(e).message() }),
                            );
                        }
                    }
                }
                Reply::json(&json!({
                    "status": resp.status,
                    "chunks": chunks,
                    "body": String::from_utf8_lossy(&body),
                }))
            }
            Op::FileWrite {
                path,
                text,
                bytes,
                fail,
                crash,
            } => {
                let data = match (text, bytes) {
                    (Some(t), _) => t.into_bytes(),
                    (None, Some(n)) => (0..n).map(|i| b'a' + (i % 26) as u8).collect(),
                    (None, None) => Vec::new(),
                };
                if let Err(e) = files::write(&path, &data) {
                    return Reply::json(
                        &json!({ "error": marmot_guest::Error::from(e).message() }),
                    );
                }
                if let Some(marker) = crash {
                    log::info(&marker);
                }
                if fail {
                    return Err("failing after the write".into());
                }
                Reply::json(&json!({ "ok": true }))
            }
            Op::FileRead { path } => match files::read(&path) {
                Ok(b) => Reply::json(&json!({
                    "size": b.len(),
                    "text": String::from_utf8_lossy(&b),
                })),
                Err(e) => Reply::json(&json!({ "error": marmot_guest::Error::from(e).message() })),
            },
            Op::FileList { prefix } => match files::list(&prefix) {
                Ok(list) => {
                    let files: Vec<Value> = list
                        .into_iter()
                        .map(|f| json!({ "path": f.path, "size": f.size }))
                        .collect();
                    Reply::json(&json!({ "files": files }))
                }
                Err(e) => Reply::json(&json!({ "error": marmot_guest::Error::from(e).message() })),
            },
            Op::FileDelete { path } => match files::delete(&path) {
                Ok(existed) => Reply::json(&json!({ "existed": existed })),
                Err(e) => Reply::json(&json!({ "error": marmot_guest::Error::from(e).message() })),
            },
            Op::JsEval {
                code,
                tools,
                timeout_ms,
                fail,
            } => {
                let req = js::EvalRequest {
                    code,
                    tools,
                    timeout_ms,
                };
                let out = match js::eval(&req) {
                    Ok(r) => json!({
                        "result": r.result.and_then(|t| serde_json::from_str::<Value>(&t).ok()),
                        "logs": r.logs,
                        "error": r.error,
                    }),
                    Err(e) => json!({ "host_error": marmot_guest::Error::from(e).message() }),
                };
                if fail {
                    return Err("failing after the script".into());
                }
                Reply::json(&out)
            }
            Op::ScanMemory { masked, mask } => {
                Reply::json(&json!({ "found": memory_holds(&masked, &mask) }))
            }
            Op::Remember { text } => {
                REMEMBERED.with_borrow_mut(|kept| kept.push(text));
                Reply::json(&json!({}))
            }
            Op::AlarmList => {
                let list: Vec<Value> = alarms::list()?
                    .into_iter()
                    .map(|a| {
                        json!({
                            "name": a.name,
                            "next_due": a.next_due,
                            "payload": serde_json::from_slice::<Value>(&a.payload).ok(),
                        })
                    })
                    .collect();
                Reply::json(&json!({ "alarms": list }))
            }
        }
    }

    /// Record the hook under `hooks` and as a `webhook_handled` event; a
    /// JSON body `{"fail": true}` fails the turn, `{"log": m}` logs `m`.
    fn on_webhook(_ctx: &Context, hook: Webhook) -> Result<()> {
        let body: Value = serde_json::from_slice(&hook.body).unwrap_or(Value::Null);
        // `{"busy_ms": ms}`: a slow handler.
        if let Some(ms) = body["busy_ms"].as_u64() {
            let start = std::time::Instant::now();
            while start.elapsed().as_millis() < u128::from(ms) {
                std::hint::spin_loop();
            }
        }
        let header = |name: &str| {
            hook.headers
                .iter()
                .find(|(k, _)| k == name)
                .map(|(_, v)| v.clone())
        };
        let mut hooks = state::get_json::<Vec<Value>>("hooks")?.unwrap_or_default();
        let record = json!({
            "name": hook.name,
            "body": body,
            "webhook_id": header("webhook-id"),
            "github_delivery": header("x-github-delivery"),
            "has_authorization": header("authorization").is_some(),
        });
        hooks.push(record.clone());
        state::set_json("hooks", &hooks)?;
        events::emit("webhook_handled", &record)?;
        if let Some(marker) = body["log"].as_str() {
            log::error(marker);
        }
        if body["fail"] == true {
            return Err("testkit: failing on this webhook, as asked".into());
        }
        Ok(())
    }

    /// Record the input under `inputs_seen` and as an `input_handled` event;
    /// an answer `{"fail": true}` fails the turn.
    fn on_input(_ctx: &Context, input: InputAnswer) -> Result<()> {
        let response: Value = if input.expired {
            Value::Null
        } else {
            input.json()?
        };
        let mut seen = state::get_json::<Vec<Value>>("inputs_seen")?.unwrap_or_default();
        let record = json!({
            "id": input.id,
            "kind": input.kind,
            "response": response,
            "expired": input.expired,
        });
        seen.push(record.clone());
        state::set_json("inputs_seen", &seen)?;
        events::emit("input_handled", &record)?;
        if response["fail"] == true {
            return Err("testkit: failing on this answer, as asked".into());
        }
        Ok(())
    }

    /// Record the firing under `fired` and as an `alarm_fired` event.
    fn on_alarm(_ctx: &Context, alarm: Alarm) -> Result<()> {
        let payload: Value = serde_json::from_slice(&alarm.payload)?;
        let how: AlarmPayload = serde_json::from_value(payload.clone()).unwrap_or_default();
        let mut fired = state::get_json::<Vec<Value>>("fired")?.unwrap_or_default();
        let record = json!({
            "name": alarm.name,
            "due_at": alarm.due_at,
            "payload": payload,
            "now": std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .map(|d| d.as_millis() as u64)
                .unwrap_or(0),
        });
        fired.push(record.clone());
        state::set_json("fired", &fired)?;
        if let Some(key) = &how.add {
            let v = state::get_json::<i64>(key)?.unwrap_or(0) + 1;
            state::set_json(key, &v)?;
        }
        events::emit("alarm_fired", &record)?;
        if let Some(ms) = how.busy_ms {
            let start = std::time::Instant::now();
            while start.elapsed().as_millis() < u128::from(ms) {
                std::hint::spin_loop();
            }
        }
        if let Some(marker) = &how.log {
            log::error(marker);
        }
        if how.fail {
            return Err(format!("testkit: alarm `{}` fails, as asked", alarm.name).into());
        }
        if let Some(ms) = how.rearm_after {
            alarms::set(&alarm.name, Schedule::After(ms), &payload)?;
        }
        Ok(())
    }

    fn on_upgrade(_ctx: &Context, from_version: u32) -> Result<()> {
        let mut froms = state::get_json::<Vec<u32>>("upgraded_from")?.unwrap_or_default();
        froms.push(from_version);
        state::set_json("upgraded_from", &froms)
    }
}

marmot_guest::export_actor!(TestKit);
