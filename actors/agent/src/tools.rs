//! Running tools: a declared HTTP endpoint, another actor, or JavaScript
//! the model wrote (with the other tools as async functions). Each gets the
//! call's idempotency key; the result goes into the transcript as a `tool`
//! message.

use marmot_guest::http::Request;
use marmot_guest::{actors, js};
use serde_json::{Map, Value, json};

use crate::manifest::{Endpoint, Manifest, Tool};

/// Most bytes of a tool's result kept in the transcript.
const MAX_RESULT: usize = 64 << 10;

/// A tool's result: its content, and whether it failed.
pub struct Outcome {
    pub content: Value,
    pub is_error: bool,
}

impl Outcome {
    fn ok(content: Value) -> Self {
        Self {
            content,
            is_error: false,
        }
    }

    pub fn error(message: impl Into<String>) -> Self {
        Self {
            content: Value::String(message.into()),
            is_error: true,
        }
    }
}

/// Run `tool` with `args` (not a client tool: those are answered by the
/// client).
pub fn run(manifest: &Manifest, tool: &Tool, args: &Value, key: &str) -> Outcome {
    match tool {
        Tool::Http {
            method,
            url,
            headers,
            ..
        } => http(method, url, headers, args, key),
        Tool::Actor { actor_type, .. } => actor(actor_type, args),
        Tool::Code {
            tools, timeout_ms, ..
        } => code(manifest, tools.as_deref(), *timeout_ms, args, key),
        Tool::Files { .. } => files(args),
        Tool::Client { .. } => Outcome::error("a client tool is answered by the client"),
    }
}

/// The actor's own files: written with the step's commit.
fn files(args: &Value) -> Outcome {
    use marmot_guest::files as f;
    let path = args.get("path").and_then(Value::as_str).unwrap_or("");
    let r = match args.get("op").and_then(Value::as_str) {
        Some("read") => {
            f::read(path).map(|b| Value::String(String::from_utf8_lossy(&b).into_owned()))
        }
        Some("write") => {
            let content = match args.get("content") {
                Some(Value::String(s)) => s.clone(),
                Some(v) => v.to_string(),
                None => String::new(),
            };
            f::write(path, content.as_bytes())
                .map(|()| json!({ "written": path, "bytes": content.len() }))
        }
        Some("list") => f::list(path).map(|l| {
            l.iter()
                .map(|i| json!({ "path": i.path, "size": i.size }))
                .collect::<Vec<_>>()
                .into()
        }),
        Some("delete") => f::delete(path).map(|d| json!({ "deleted": d })),
        _ => return Outcome::error("`op` must be read, write, list or delete"),
    };
    match r {
        Ok(v) => Outcome::ok(cap(v)),
        Err(e) => Outcome::error(e.message()),
    }
}

/// Ask a tool's `reconcile` endpoint whether the call with `key` took
/// effect: `Some(result)` if it did, `None` if it did not, `Err` if the
/// answer says neither.
pub fn reconcile(endpoint: &Endpoint, key: &str) -> Result<Option<Value>, String> {
    let url = endpoint.url.replace("{idempotency_key}", &encode(key));
    let mut req = Request::new(&endpoint.method, &url);
    for (k, v) in &endpoint.headers {
        req = req.header(k, v.as_str().unwrap_or_default());
    }
    let resp = req.send().map_err(|e| e.message().to_owned())?;
    match resp.status {
        200..=299 => Ok(Some(body_value(&resp.body))),
        404 | 410 => Ok(None),
        s => Err(format!("the reconcile request answered {s}")),
    }
}

fn http(method: &str, url: &str, headers: &Map<String, Value>, args: &Value, key: &str) -> Outcome {
    let with_body = !matches!(method, "GET" | "HEAD" | "DELETE");
    let mut url = url.to_owned();
    if !with_body && let Value::Object(o) = args {
        let query: Vec<String> = o
            .iter()
            .map(|(k, v)| {
                let v = match v {
                    Value::String(s) => s.clone(),
                    v => v.to_string(),
                };
                format!("{}={}", encode(k), encode(&v))
            })
            .collect();
        if !query.is_empty() {
            url.push(if url.contains('?') { '&' } else { '?' });
            url.push_str(&query.join("&"));
        }
    }
    let mut req = Request::new(method, &url);
    let mut has_key = false;
    for (k, v) in headers {
        has_key |= k.eq_ignore_ascii_case("idempotency-key");
        req = req.header(k, v.as_str().unwrap_or_default());
    }
    if !has_key {
        req = req.header("idempotency-key", key);
    }
    if with_body {
        req = req
            .header("content-type", "application/json")
            .body(args.to_string());
    }
    match req.send() {
        Ok(resp) => {
            let content = json!({ "status": resp.status, "body": body_value(&resp.body) });
            Outcome {
                content,
                is_error: resp.status >= 400,
            }
        }
        Err(e) => Outcome::error(e.message()),
    }
}

fn actor(actor_type: &str, args: &Value) -> Outcome {
    let Some(id) = args.get("id").and_then(Value::as_str) else {
        return Outcome::error("arguments need an `id` (which actor)");
    };
    let message = args.get("message").cloned().unwrap_or(Value::Null);
    match actors::call(actor_type, id, &message) {
        Ok(r) => Outcome {
            content: json!({ "status": r.status, "body": body_value(&r.body) }),
            is_error: r.status >= 400,
        },
        Err(e) => Outcome::error(e.message()),
    }
}

/// The script runs in a child JavaScript sandbox with `http` and `actors`
/// only; the prelude defines `tools`, whose functions send the same
/// requests the tools would, each with its own idempotency key.
fn code(
    manifest: &Manifest,
    allowed: Option<&[String]>,
    timeout_ms: Option<u32>,
    args: &Value,
    key: &str,
) -> Outcome {
    let Some(source) = args.get("code").and_then(Value::as_str) else {
        return Outcome::error("arguments need `code` (the JavaScript to run)");
    };
    let mut prelude = String::from("const tools = (() => { let n = 0; const t = {};\n");
    for tool in manifest.script_tools(allowed) {
        match tool {
            Tool::Http {
                name,
                method,
                url,
                headers,
                ..
            } => {
                let spec = json!({ "method": method, "url": url, "headers": headers });
                prelude.push_str(&format!(
                    "t[{name}] = async (args = {{}}) => {{ const s = {spec}; const key = {key} + '-' + (n++);\n\
                     const h = {{ ...s.headers }}; if (!Object.keys(h).some((k) => k.toLowerCase() === 'idempotency-key')) h['idempotency-key'] = key;\n\
                     let url = s.url; const init = {{ method: s.method, headers: h }};\n\
                     if (['GET', 'HEAD', 'DELETE'].includes(s.method)) {{ const q = new URLSearchParams(Object.entries(args).map(([k, v]) => [k, typeof v === 'string' ? v : JSON.stringify(v)])).toString(); if (q) url += (url.includes('?') ? '&' : '?') + q; }}\n\
                     else {{ h['content-type'] = 'application/json'; init.body = JSON.stringify(args); }}\n\
                     const r = await fetch(url, init); const text = await r.text(); let body; try {{ body = JSON.parse(text); }} catch {{ body = text; }}\n\
                     if (!r.ok) throw new Error(`{name}: HTTP ${{r.status}}: ${{text.slice(0, 500)}}`); return body; }};\n",
                    name = json!(name),
                    key = json!(key),
                ));
            }
            Tool::Actor {
                name, actor_type, ..
            } => {
                prelude.push_str(&format!(
                    "t[{name}] = async (args = {{}}) => marmot.actors.call({ty}, String(args.id), args.message ?? null);\n",
                    name = json!(name),
                    ty = json!(actor_type),
                ));
            }
            _ => {}
        }
    }
    prelude.push_str("return Object.freeze(t); })(); ");
    // The model's code is a script whose last expression is the result:
    // keep it last, after the prelude, and on the prelude's line, so that
    // an error's line numbers are the model's own (they were off by the
    // prelude's length, and misled the model fixing its code). The
    // prelude's strings are JSON, without raw line breaks.
    let script = format!("{}{source}", prelude.replace('\n', " "));
    match js::eval_with(&script, &script_capabilities(manifest), timeout_ms) {
        Ok(out) => {
            let result = out
                .result
                .as_deref()
                .map(|r| serde_json::from_str(r).unwrap_or(Value::String(r.to_owned())))
                .unwrap_or(Value::Null);
            let mut content = json!({ "result": result });
            if !out.logs.is_empty() {
                content["logs"] = json!(out.logs);
            }
            match out.error {
                Some(e) => {
                    content["error"] = Value::String(e);
                    Outcome {
                        content: cap(content),
                        is_error: true,
                    }
                }
                None => Outcome::ok(cap(content)),
            }
        }
        Err(e) => Outcome::error(e.message()),
    }
}

/// What a script may use. A script holding `http` could send any request
/// the type may send, so while any http tool needs an approval, scripts get
/// no `http` (they could reach that endpoint without one); the same for
/// `actors` and actor tools.
fn script_capabilities(manifest: &Manifest) -> Vec<&'static str> {
    let (http_gated, actors_gated) = manifest.gated();
    let mut caps = vec!["log"];
    if !http_gated {
        caps.push("http");
    }
    if !actors_gated {
        caps.push("actors");
    }
    caps
}

/// A body as JSON if it is, else as text; capped.
fn body_value(body: &[u8]) -> Value {
    let v = serde_json::from_slice(body)
        .unwrap_or_else(|_| Value::String(String::from_utf8_lossy(body).into_owned()));
    cap(v)
}

fn cap(v: Value) -> Value {
    let text = v.to_string();
    if text.len() <= MAX_RESULT {
        return v;
    }
    let mut cut = MAX_RESULT;
    while !text.is_char_boundary(cut) {
        cut -= 1;
    }
    Value::String(format!(
        "{}… ({} bytes cut)",
        &text[..cut],
        text.len() - cut
    ))
}

/// Percent-encode for a URL query.
fn encode(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    for b in s.bytes() {
        if b.is_ascii_alphanumeric() || b"-_.~".contains(&b) {
            out.push(b as char);
        } else {
            out.push_str(&format!("%{b:02X}"));
        }
    }
    out
}
