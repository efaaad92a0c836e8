//! The native half of the `marmot` API: functions on `__marmot_host` that
//! the prelude wraps (JSON encoding, argument checks) and then hides.
//!
//! Each function calls one `marmot:actor` import. Errors the host reports
//! become JavaScript exceptions whose message names the capability.

use std::cell::RefCell;
use std::time::Instant;

use rquickjs::{Array, Ctx, Exception, Function, Object, Result, TypedArray};

use crate::bindings::marmot::actor::types::Error as HostError;
use crate::bindings::marmot::actor::{
    actors, alarms, events, files, http, inputs, log, model, state,
};
use crate::engine::refused_in_preload;

/// Where `console` output goes.
pub enum ConsoleSink {
    /// A turn: into the node's log through the `log` import.
    Turn,
    /// An eval: collected and returned with the result.
    Eval {
        /// Lines kept.
        lines: Vec<String>,
        /// Bytes kept.
        bytes: usize,
        /// Lines dropped for lack of room.
        dropped: usize,
    },
}

/// Copy a console line an eval keeps to stdout, one line each (`\\` and
/// `\n` escaped), as it is written: if the script then hits a limit (CPU,
/// memory, time), the host has nothing else of what it logged — the lines
/// kept here die with the sandbox — and reads them back from there
/// (`sandbox::output::eval_lines`).
fn echo_eval_line(line: &str) {
    use std::io::Write as _;
    let escaped = line.replace('\\', "\\\\").replace('\n', "\\n");
    let mut out = std::io::stdout().lock();
    let _ = out.write_all(escaped.as_bytes());
    let _ = out.write_all(b"\n");
    let _ = out.flush();
}

/// A `console` line at `lvl`, where [`CONSOLE`] says.
pub fn console_line(lvl: &str, line: String) {
    CONSOLE.with(|c| match &mut *c.borrow_mut() {
        ConsoleSink::Turn => log::log(level(lvl), &line, &[]),
        ConsoleSink::Eval {
            lines,
            bytes,
            dropped,
        } => {
            if lines.len() >= MAX_EVAL_LOG_LINES || *bytes + line.len() > MAX_EVAL_LOG_BYTES {
                *dropped += 1;
            } else {
                *bytes += line.len();
                echo_eval_line(&line);
                lines.push(line);
            }
        }
    });
}

/// Most console bytes an eval keeps (PRODUCT.md §7: 1 MiB of output).
pub const MAX_EVAL_LOG_BYTES: usize = 1 << 20;
/// Most console lines an eval keeps.
pub const MAX_EVAL_LOG_LINES: usize = 1000;

thread_local! {
    pub static CONSOLE: RefCell<ConsoleSink> = const { RefCell::new(ConsoleSink::Turn) };
    static EPOCH: RefCell<Option<Instant>> = const { RefCell::new(None) };
    /// Whether anything asked for the time (every `setTimeout` does) since
    /// [`take_timers_touched`] last looked.
    static TIMERS_TOUCHED: std::cell::Cell<bool> = const { std::cell::Cell::new(false) };
}

/// Whether a timer may have been set or a fetch started since the last
/// call: a turn that did neither need not call the prelude to drop what it
/// left pending (a call that writes to the snapshot's shared pages in
/// every fresh sandbox).
pub fn take_timers_touched() -> bool {
    TIMERS_TOUCHED.with(|t| t.replace(false))
}

/// What a preload that meets randomness or a timer throws (nobody sees it:
/// the module is then loaded by each sandbox's first turn instead).
const PRELOAD_REFUSAL: &str = "not available while the module's top level is preloaded";

fn now_ms(ctx: Ctx<'_>) -> Result<f64> {
    if refused_in_preload("timers") {
        return Err(Exception::throw_message(&ctx, PRELOAD_REFUSAL));
    }
    TIMERS_TOUCHED.with(|t| t.set(true));
    Ok(EPOCH.with(|e| {
        let start = *e.borrow_mut().get_or_insert_with(Instant::now);
        start.elapsed().as_secs_f64() * 1000.0
    }))
}

fn describe(e: HostError) -> String {
    match e {
        HostError::Unsupported(m) => format!("unsupported: {m}"),
        HostError::Invalid(m) => format!("invalid argument: {m}"),
        HostError::LimitExceeded(m) => format!("limit exceeded: {m}"),
        HostError::Denied(m) => format!("denied: {m}"),
        HostError::NotFound(m) => format!("not found: {m}"),
        HostError::Internal(m) => format!("host error: {m}"),
    }
}

/// The `code` a thrown host error carries, from the WIT error variant:
/// what a script can branch on (`e.code === "limit_exceeded"`) without
/// parsing the message.
fn code(e: &HostError) -> &'static str {
    match e {
        HostError::Unsupported(_) => "unsupported",
        HostError::Invalid(_) => "invalid",
        HostError::LimitExceeded(_) => "limit_exceeded",
        HostError::Denied(_) => "denied",
        HostError::NotFound(_) => "not_found",
        HostError::Internal(_) => "internal",
    }
}

/// `what` refused because the module's default export has no `handler`,
/// so `then`.
fn without_handler<T>(ctx: &Ctx<'_>, what: &str, handler: &str, then: &str) -> Result<T> {
    let why = format!("the module's default export has no `{handler}` handler, so {then}");
    throw(ctx, what, HostError::Invalid(why))
}

fn throw<T>(ctx: &Ctx<'_>, what: &str, e: HostError) -> Result<T> {
    let code = code(&e);
    let exc = Exception::from_message(ctx.clone(), &format!("{what}: {}", describe(e)))?;
    exc.as_object().set("code", code)?;
    Err(ctx.throw(exc.into_value()))
}

/// Whether a reply's content type says JSON (absent means JSON, as the
/// WIT `reply` has it).
fn declares_json(content_type: Option<&str>) -> bool {
    let Some(ct) = content_type else {
        return true;
    };
    let media = ct
        .split(';')
        .next()
        .unwrap_or("")
        .trim()
        .to_ascii_lowercase();
    media == "application/json" || media.ends_with("+json")
}

/// A copy of a `Uint8Array`'s bytes; `None` when its buffer is detached
/// or out of bounds.
fn bytes_of(view: &TypedArray<'_, u8>) -> Option<Vec<u8>> {
    // SAFETY: the bytes are copied at once; no JavaScript runs while the
    // borrowed slice is alive.
    #[allow(unsafe_code, reason = "copying a Uint8Array's bytes")]
    unsafe { view.as_bytes() }.map(<[u8]>::to_vec)
}

fn text(bytes: Vec<u8>) -> String {
    String::from_utf8(bytes).unwrap_or_else(|e| String::from_utf8_lossy(e.as_bytes()).into_owned())
}

fn level(name: &str) -> log::Level {
    match name {
        "debug" => log::Level::Debug,
        "warn" => log::Level::Warn,
        "error" => log::Level::Error,
        _ => log::Level::Info,
    }
}

/// Install `globalThis.__marmot_host`.
pub fn install(ctx: &Ctx<'_>) -> Result<()> {
    let h = Object::new(ctx.clone())?;

    h.set(
        "stateGet",
        Function::new(ctx.clone(), |key: String| -> Option<String> {
            state::get(&key).map(text)
        })?,
    )?;
    h.set(
        "stateSet",
        Function::new(
            ctx.clone(),
            |ctx: Ctx<'_>, key: String, json: String| match state::set(&key, json.as_bytes()) {
                Ok(()) => Ok(()),
                Err(e) => throw(&ctx, "state.set", e),
            },
        )?,
    )?;
    h.set(
        "stateDelete",
        Function::new(ctx.clone(), |key: String| state::delete(&key))?,
    )?;
    h.set("stateList", Function::new(ctx.clone(), state_list)?)?;
    h.set(
        "emit",
        Function::new(
            ctx.clone(),
            |ctx: Ctx<'_>, kind: String, json: String| match events::emit(&kind, json.as_bytes()) {
                Ok(seq) => Ok(seq as f64),
                Err(e) => throw(&ctx, "events.emit", e),
            },
        )?,
    )?;
    h.set(
        "log",
        Function::new(
            ctx.clone(),
            |lvl: String, msg: String, fields: Vec<Vec<String>>| {
                let fields: Vec<(String, String)> = fields
                    .into_iter()
                    .filter_map(|mut kv| {
                        let v = kv.pop()?;
                        let k = kv.pop()?;
                        Some((k, v))
                    })
                    .collect();
                log::log(level(&lvl), &msg, &fields);
            },
        )?,
    )?;
    h.set(
        "console",
        Function::new(ctx.clone(), |lvl: String, line: String| {
            console_line(&lvl, line);
        })?,
    )?;
    h.set(
        "alarmsSet",
        Function::new(
            ctx.clone(),
            |ctx: Ctx<'_>,
             name: String,
             kind: String,
             number: f64,
             expr: Option<String>,
             tz: Option<String>,
             payload: String| {
                if !crate::engine::takes_alarms() {
                    return without_handler(
                        &ctx,
                        "alarms.set",
                        "onAlarm",
                        "the alarm could never run",
                    );
                }
                let schedule = match kind.as_str() {
                    "at" => alarms::Schedule::At(number.max(0.0) as u64),
                    "after" => alarms::Schedule::After(number.max(0.0) as u64),
                    _ => alarms::Schedule::Cron(alarms::Cron {
                        expr: expr.unwrap_or_default(),
                        tz,
                    }),
                };
                match alarms::set(&name, &schedule, payload.as_bytes()) {
                    Ok(()) => Ok(()),
                    Err(e) => throw(&ctx, "alarms.set", e),
                }
            },
        )?,
    )?;
    h.set(
        "alarmsCancel",
        Function::new(
            ctx.clone(),
            |ctx: Ctx<'_>, name: String| match alarms::cancel(&name) {
                Ok(b) => Ok(b),
                Err(e) => throw(&ctx, "alarms.cancel", e),
            },
        )?,
    )?;
    h.set(
        "alarmsList",
        Function::new(ctx.clone(), |ctx: Ctx<'_>| match alarms::list() {
            Ok(list) => {
                let items: Vec<String> = list
                    .into_iter()
                    .map(|a| {
                        let schedule = match a.schedule {
                            alarms::Schedule::At(t) => format!("{{\"at\":{t}}}"),
                            alarms::Schedule::After(t) => format!("{{\"after\":{t}}}"),
                            alarms::Schedule::Cron(c) => format!(
                                "{{\"cron\":{},\"tz\":{}}}",
                                json_string(&c.expr),
                                c.tz.as_deref().map_or("null".into(), json_string)
                            ),
                        };
                        format!(
                            "{{\"name\":{},\"schedule\":{schedule},\"nextDue\":{},\"payload\":{}}}",
                            json_string(&a.name),
                            a.next_due,
                            json_string(&text(a.payload))
                        )
                    })
                    .collect();
                Ok(format!("[{}]", items.join(",")))
            }
            Err(e) => throw(&ctx, "alarms.list", e),
        })?,
    )?;
    h.set(
        "inputsRequest",
        Function::new(
            ctx.clone(),
            |ctx: Ctx<'_>,
             kind: String,
             prompt: String,
             schema: Option<String>,
             expires: Option<f64>| {
                if !crate::engine::takes_inputs() {
                    return without_handler(
                        &ctx,
                        "inputs.request",
                        "onInput",
                        "no answer (nor the request's expiry) could reach it",
                    );
                }
                let req = inputs::InputRequest {
                    kind,
                    prompt,
                    schema,
                    expires_in_ms: expires.map(|e| e.max(0.0) as u64),
                };
                match inputs::request(&req) {
                    Ok(id) => Ok(id),
                    Err(e) => throw(&ctx, "inputs.request", e),
                }
            },
        )?,
    )?;
    h.set(
        "inputsCancel",
        Function::new(ctx.clone(), |ctx: Ctx<'_>, id: String| {
            inputs::cancel(&id).or_else(|e| throw(&ctx, "inputs.cancel", e))
        })?,
    )?;
    h.set("actorsCall", Function::new(ctx.clone(), actors_call)?)?;
    h.set(
        "actorsSend",
        Function::new(
            ctx.clone(),
            |ctx: Ctx<'_>, ty: String, id: String, body: String| match actors::send(
                &ty,
                &id,
                body.as_bytes(),
            ) {
                Ok(()) => Ok(()),
                Err(e) => throw(&ctx, "actors.send", e),
            },
        )?,
    )?;
    h.set(
        "filesRead",
        Function::new(
            ctx.clone(),
            |ctx: Ctx<'_>, path: String| match files::read(&path) {
                Ok(b) => Ok(text(b)),
                Err(e) => throw(&ctx, "files.read", e),
            },
        )?,
    )?;
    h.set("filesReadBytes", Function::new(ctx.clone(), read_bytes)?)?;
    h.set(
        "filesWriteBytes",
        Function::new(
            ctx.clone(),
            |ctx: Ctx<'_>, path: String, view: TypedArray<'_, u8>| {
                let Some(bytes) = bytes_of(&view) else {
                    return Err(Exception::throw_type(
                        &ctx,
                        "files.write: the buffer is detached or out of bounds",
                    ));
                };
                match files::write(&path, &bytes) {
                    Ok(()) => Ok(()),
                    Err(e) => throw(&ctx, "files.write", e),
                }
            },
        )?,
    )?;
    h.set(
        "filesWrite",
        Function::new(
            ctx.clone(),
            |ctx: Ctx<'_>, path: String, data: String| match files::write(&path, data.as_bytes()) {
                Ok(()) => Ok(()),
                Err(e) => throw(&ctx, "files.write", e),
            },
        )?,
    )?;
    h.set(
        "filesList",
        Function::new(
            ctx.clone(),
            |ctx: Ctx<'_>, prefix: String| match files::list(&prefix) {
                Ok(list) => {
                    let items: Vec<String> = list
                        .iter()
                        .map(|f| {
                            format!(
                                "{{\"path\":{},\"size\":{},\"modifiedAt\":{}}}",
                                json_string(&f.path),
                                f.size,
                                f.modified_at
                            )
                        })
                        .collect();
                    Ok(format!("[{}]", items.join(",")))
                }
                Err(e) => throw(&ctx, "files.list", e),
            },
        )?,
    )?;
    h.set(
        "filesDelete",
        Function::new(
            ctx.clone(),
            |ctx: Ctx<'_>, path: String| match files::delete(&path) {
                Ok(b) => Ok(b),
                Err(e) => throw(&ctx, "files.delete", e),
            },
        )?,
    )?;
    h.set(
        "modelChat",
        Function::new(
            ctx.clone(),
            |ctx: Ctx<'_>, request: String| match model::chat(&request) {
                Ok(answer) => Ok(answer),
                Err(e) => throw(&ctx, "model.chat", e),
            },
        )?,
    )?;
    h.set("httpStart", Function::new(ctx.clone(), http_start)?)?;
    h.set("httpWaitAny", Function::new(ctx.clone(), http_wait_any)?)?;
    h.set("httpFinish", Function::new(ctx.clone(), http_finish)?)?;
    h.set("now", Function::new(ctx.clone(), now_ms)?)?;
    h.set("randomBytes", Function::new(ctx.clone(), random_bytes)?)?;
    h.set(
        "randomFloat",
        Function::new(ctx.clone(), |ctx: Ctx<'_>| {
            if refused_in_preload("Math.random") {
                return Err(Exception::throw_message(&ctx, PRELOAD_REFUSAL));
            }
            let mut b = [0u8; 8];
            // WASI random never fails in practice; fall back to a constant
            // rather than throwing from Math.random.
            let _ = getrandom::fill(&mut b);
            Ok((u64::from_le_bytes(b) >> 11) as f64 / (1u64 << 53) as f64)
        })?,
    )?;
    h.set("utf8Encode", Function::new(ctx.clone(), utf8_encode)?)?;
    h.set(
        "wellFormedJson",
        Function::new(ctx.clone(), well_formed_json)?,
    )?;
    h.set(
        "urlParse",
        Function::new(ctx.clone(), |input: String, base: Option<String>| {
            let url = match base {
                Some(b) => url::Url::parse(&b).and_then(|b| b.join(&input)),
                None => url::Url::parse(&input),
            };
            url.ok().map(|u| url_parts(&u))
        })?,
    )?;
    h.set(
        "urlSet",
        Function::new(
            ctx.clone(),
            |ctx: Ctx<'_>, href: String, field: String, value: String| -> Result<String> {
                let mut u = url::Url::parse(&href)
                    .map_err(|e| Exception::throw_type(&ctx, &format!("Invalid URL: {e}")))?;
                use url::quirks;
                let ok = match field.as_str() {
                    "href" => {
                        return url::Url::parse(&value).map(|u| url_parts(&u)).map_err(|_| {
                            Exception::throw_type(&ctx, &format!("Invalid URL: {value}"))
                        });
                    }
                    "protocol" => quirks::set_protocol(&mut u, &value).is_ok(),
                    "username" => quirks::set_username(&mut u, &value).is_ok(),
                    "password" => quirks::set_password(&mut u, &value).is_ok(),
                    "host" => quirks::set_host(&mut u, &value).is_ok(),
                    "hostname" => quirks::set_hostname(&mut u, &value).is_ok(),
                    "port" => quirks::set_port(&mut u, &value).is_ok(),
                    "pathname" => {
                        quirks::set_pathname(&mut u, &value);
                        true
                    }
                    "search" => {
                        quirks::set_search(&mut u, &value);
                        true
                    }
                    "hash" => {
                        quirks::set_hash(&mut u, &value);
                        true
                    }
                    _ => false,
                };
                // Like browsers, an invalid assignment leaves the URL as it was.
                let _ = ok;
                Ok(url_parts(&u))
            },
        )?,
    )?;
    h.set("formDecode", Function::new(ctx.clone(), form_decode)?)?;
    h.set(
        "formEncode",
        Function::new(ctx.clone(), |pairs: Vec<Vec<String>>| {
            let mut ser = url::form_urlencoded::Serializer::new(String::new());
            for kv in &pairs {
                if let [k, v] = kv.as_slice() {
                    ser.append_pair(k, v);
                }
            }
            ser.finish()
        })?,
    )?;
    h.set(
        "utf8Decode",
        Function::new(
            ctx.clone(),
            |ctx: Ctx<'_>, view: TypedArray<'_, u8>, fatal: bool| -> Result<String> {
                let bytes = bytes_of(&view).unwrap_or_default();
                match String::from_utf8(bytes) {
                    Ok(s) => Ok(s),
                    Err(_) if fatal => Err(Exception::throw_type(
                        &ctx,
                        "TextDecoder: the input is not valid UTF-8",
                    )),
                    Err(e) => Ok(String::from_utf8_lossy(e.as_bytes()).into_owned()),
                }
            },
        )?,
    )?;

    ctx.globals().set("__marmot_host", h)?;
    Ok(())
}

fn state_list<'js>(
    ctx: Ctx<'js>,
    prefix: String,
    after: Option<String>,
    limit: u32,
) -> Result<Array<'js>> {
    let page = state::list(&prefix, after.as_deref(), limit);
    let out = Array::new(ctx.clone())?;
    for (i, (k, v)) in page.into_iter().enumerate() {
        let pair = Array::new(ctx.clone())?;
        pair.set(0, k)?;
        pair.set(1, text(v))?;
        out.set(i, pair)?;
    }
    Ok(out)
}

fn random_bytes<'js>(ctx: Ctx<'js>, n: usize) -> Result<TypedArray<'js, u8>> {
    if refused_in_preload("crypto.getRandomValues") {
        return Err(Exception::throw_message(&ctx, PRELOAD_REFUSAL));
    }
    let mut buf = vec![0u8; n.min(65536)];
    getrandom::fill(&mut buf)
        .map_err(|e| Exception::throw_message(&ctx, &format!("crypto: {e}")))?;
    TypedArray::new(ctx, buf)
}

/// `actors.call`: `{json, status, contentType, body}`, the reply's text,
/// whether it is JSON to parse, and how the callee answered.
fn actors_call<'js>(ctx: Ctx<'js>, ty: String, id: String, body: String) -> Result<Object<'js>> {
    match actors::call(&ty, &id, body.as_bytes()) {
        Ok(reply) => {
            let out = Object::new(ctx)?;
            out.set("json", declares_json(reply.content_type.as_deref()))?;
            out.set("status", reply.status)?;
            out.set("contentType", reply.content_type)?;
            out.set("body", text(reply.body))?;
            Ok(out)
        }
        Err(e) => throw(&ctx, "actors.call", e),
    }
}

/// `files.readBytes`: the file as a `Uint8Array`.
fn read_bytes<'js>(ctx: Ctx<'js>, path: String) -> Result<TypedArray<'js, u8>> {
    match files::read(&path) {
        Ok(b) => TypedArray::new(ctx, b),
        Err(e) => throw(&ctx, "files.readBytes", e),
    }
}

fn utf8_encode<'js>(ctx: Ctx<'js>, s: String) -> Result<TypedArray<'js, u8>> {
    TypedArray::new(ctx, s.into_bytes())
}

/// `fetch` through the host's `http` capability (allow-listed hosts only;
/// headers may name secrets the host fills in). Returns
/// `[status, [[name, value], …], bodyText]`.
/// The request `fetch` asks for, from what the prelude passes.
fn http_request(
    ctx: &Ctx<'_>,
    method: String,
    url: String,
    headers: Vec<Vec<String>>,
    body: Option<TypedArray<'_, u8>>,
    timeout_ms: Option<f64>,
) -> Result<http::Request> {
    let body = match body.as_ref().map(bytes_of) {
        None => None,
        Some(Some(bytes)) => Some(bytes),
        Some(None) => {
            return Err(Exception::throw_type(
                ctx,
                "fetch: the body's buffer is detached or out of bounds",
            ));
        }
    };
    Ok(http::Request {
        method,
        url,
        headers: headers
            .into_iter()
            .filter_map(|mut kv| {
                let v = kv.pop()?;
                let k = kv.pop()?;
                Some((k, v))
            })
            .collect(),
        body,
        timeout_ms: timeout_ms.map(|t| t.clamp(0.0, f64::from(u32::MAX)) as u32),
    })
}

/// An answer as the prelude takes it: `[status, [[name, value]…], body]`.
fn http_answer<'js>(ctx: &Ctx<'js>, answer: http::Response) -> Result<Array<'js>> {
    let out = Array::new(ctx.clone())?;
    out.set(0, answer.status)?;
    let hs = Array::new(ctx.clone())?;
    for (i, (k, v)) in answer.headers.into_iter().enumerate() {
        let pair = Array::new(ctx.clone())?;
        pair.set(0, k)?;
        pair.set(1, v)?;
        hs.set(i, pair)?;
    }
    out.set(1, hs)?;
    out.set(2, TypedArray::new(ctx.clone(), answer.body)?)?;
    Ok(out)
}

/// A fetch started without waiting: its handle.
fn http_start<'js>(
    ctx: Ctx<'js>,
    method: String,
    url: String,
    headers: Vec<Vec<String>>,
    body: Option<TypedArray<'js, u8>>,
    timeout_ms: Option<f64>,
) -> Result<u32> {
    let req = http_request(&ctx, method, url, headers, body, timeout_ms)?;
    // The turn's end drops the promise (with its timers).
    TIMERS_TOUCHED.with(|t| t.set(true));
    http::start(&req).or_else(|e| throw(&ctx, "fetch", e))
}

/// Which of the started fetches `handles` has its answer, waiting at most
/// `timeout_ms` (none: until one has).
fn http_wait_any(handles: Vec<u32>, timeout_ms: Option<f64>) -> Option<u32> {
    let timeout = timeout_ms.map(|t| t.ceil().clamp(0.0, f64::from(u32::MAX)) as u32);
    http::wait_any(&handles, timeout)
}

/// The answer of a started fetch.
fn http_finish(ctx: Ctx<'_>, handle: u32) -> Result<Array<'_>> {
    match http::finish(handle) {
        Ok(answer) => http_answer(&ctx, answer),
        Err(e) => throw(&ctx, "fetch", e),
    }
}

/// The WHATWG URL components, as JSON.
fn url_parts(u: &url::Url) -> String {
    use url::quirks;
    let fields = [
        ("href", quirks::href(u)),
        ("protocol", quirks::protocol(u)),
        ("username", quirks::username(u)),
        ("password", quirks::password(u)),
        ("host", quirks::host(u)),
        ("hostname", quirks::hostname(u)),
        ("port", quirks::port(u)),
        ("pathname", quirks::pathname(u)),
        ("search", quirks::search(u)),
        ("hash", quirks::hash(u)),
    ];
    let mut out = String::from("{");
    for (k, v) in fields {
        out.push_str(&format!("\"{k}\":{},", json_string(v)));
    }
    out.push_str(&format!("\"origin\":{}}}", json_string(&quirks::origin(u))));
    out
}

fn form_decode<'js>(ctx: Ctx<'js>, s: String) -> Result<Array<'js>> {
    let out = Array::new(ctx.clone())?;
    for (i, (k, v)) in url::form_urlencoded::parse(s.as_bytes()).enumerate() {
        let pair = Array::new(ctx.clone())?;
        pair.set(0, k.into_owned())?;
        pair.set(1, v.into_owned())?;
        out.set(i, pair)?;
    }
    Ok(out)
}

/// JSON text from `JSON.stringify` made valid for every JSON parser:
/// `JSON.stringify` writes a lone surrogate (a string cut in the middle
/// of an emoji) as a `\udXXX` escape, which strict parsers (the node's
/// own) refuse, so a state value was shown as base64 and a reply was not
/// JSON. Each such escape not part of a pair becomes `\ufffd`, as the
/// rest of the sandbox's text does (`String.prototype.toWellFormed`).
pub fn well_formed_json(text: String) -> String {
    fn surrogate_at(b: &[u8], i: usize) -> Option<u16> {
        let hex = b.get(i..i + 6)?;
        if hex[0] != b'\\' || hex[1] != b'u' {
            return None;
        }
        let n = u16::from_str_radix(std::str::from_utf8(&hex[2..]).ok()?, 16).ok()?;
        (0xD800..=0xDFFF).contains(&n).then_some(n)
    }
    let b = text.as_bytes();
    if !b.windows(3).any(|w| w == b"\\ud" || w == b"\\uD") {
        return text;
    }
    let mut out = String::with_capacity(text.len());
    let (mut i, mut copied) = (0, 0);
    while i < b.len() {
        if b[i] != b'\\' {
            i += 1;
            continue;
        }
        match surrogate_at(b, i) {
            // A high half followed by its low half: a character, kept.
            Some(0xD800..=0xDBFF) if surrogate_at(b, i + 6).is_some_and(|n| n >= 0xDC00) => {
                i += 12;
            }
            Some(_) => {
                out.push_str(&text[copied..i]);
                out.push_str("\\ufffd");
                i += 6;
                copied = i;
            }
            // Any other escape, `\\` included: skipped whole.
            None => i += 2,
        }
    }
    out.push_str(&text[copied..]);
    out
}

/// `s` as a JSON string literal.
pub fn json_string(s: &str) -> String {
    let mut out = String::with_capacity(s.len() + 2);
    out.push('"');
    for c in s.chars() {
        match c {
            '"' => out.push_str("\\\""),
            '\\' => out.push_str("\\\\"),
            '\n' => out.push_str("\\n"),
            '\r' => out.push_str("\\r"),
            '\t' => out.push_str("\\t"),
            c if (c as u32) < 0x20 => out.push_str(&format!("\\u{:04x}", c as u32)),
            c => out.push(c),
        }
    }
    out.push('"');
    out
}
