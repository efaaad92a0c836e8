//! Client commands: talk to a node over HTTP.

use std::path::Path;

use anyhow::Context as _;
use reqwest::{Method, StatusCode};
use serde_json::value::RawValue;

use super::ClientArgs;

struct Client {
    http: reqwest::Client,
    base: String,
    token: Option<String>,
}

impl Client {
    fn new(args: &ClientArgs) -> anyhow::Result<Self> {
        match reqwest::Url::parse(&args.url) {
            // Credentials in the URL would be echoed in every error (and
            // end up in CI logs); a query or fragment would be glued in
            // front of every path.
            Ok(u) if !u.username().is_empty() || u.password().is_some() => anyhow::bail!(
                "--url must not carry credentials: give the token with --token or MARMOT_TOKEN"
            ),
            // (Not echoed: the query may hold a token.)
            Ok(u) if u.query().is_some() || u.fragment().is_some() => anyhow::bail!(
                "--url must not have a query or fragment (e.g. http://127.0.0.1:7878)"
            ),
            Ok(u) if matches!(u.scheme(), "http" | "https") && u.host_str().is_some() => {}
            // (Not echoed either: what does not parse may still hold a
            // password.)
            _ => anyhow::bail!(
                "--url is not an http(s) URL with a host (e.g. http://127.0.0.1:7878)"
            ),
        }
        // A connect that hangs (a firewall dropping packets) fails after
        // 10 s. Reads have no limit: a call waits for its turn, which may
        // run for minutes, and `events --follow` for the next event.
        let http = reqwest::Client::builder()
            .connect_timeout(std::time::Duration::from_secs(10))
            .build()
            .context("cannot build the HTTP client")?;
        Ok(Self {
            http,
            base: args.url.trim_end_matches('/').to_owned(),
            token: args.token(),
        })
    }

    fn request(&self, method: Method, path: &str) -> reqwest::RequestBuilder {
        let mut r = self.http.request(method, format!("{}{path}", self.base));
        if let Some(t) = &self.token {
            r = r.bearer_auth(t);
        }
        r
    }

    /// Send and return the body, turning API errors into one-line errors.
    async fn send(&self, req: reqwest::RequestBuilder) -> anyhow::Result<(StatusCode, Vec<u8>)> {
        let req = req.build().context("building the request")?;
        let body_bytes = req
            .body()
            .and_then(reqwest::Body::as_bytes)
            .map_or(0, <[u8]>::len);
        let resp = self
            .http
            .execute(req)
            .await
            .map_err(|e| self.unsent(e, body_bytes))?;
        let status = resp.status();
        let body = resp.bytes().await.context("reading the response")?.to_vec();
        if status.is_client_error() || status.is_server_error() {
            return Err(api_error(status, &body));
        }
        Ok((status, body))
    }
}

impl Client {
    /// Why a request got no answer, in words that fit: a node that is not
    /// there, one that hung up on a large body it would not take, or one
    /// that hung up (it stopped or restarted mid-request).
    fn unsent(&self, e: reqwest::Error, body_bytes: usize) -> anyhow::Error {
        let hung_up = std::iter::successors(Some(&e as &(dyn std::error::Error + 'static)), |e| {
            e.source()
        })
        .filter_map(|e| e.downcast_ref::<std::io::Error>())
        .any(|e| {
            matches!(
                e.kind(),
                std::io::ErrorKind::BrokenPipe | std::io::ErrorKind::ConnectionReset
            )
        });
        let base = &self.base;
        if hung_up && !e.is_connect() {
            // Past what a node reads of a body it refuses (128 MiB).
            let why = if body_bytes > 128 << 20 {
                "a body far past the node's limits is refused unread"
            } else {
                "it may have stopped or restarted; retry"
            };
            anyhow::Error::new(e).context(format!(
                "marmot at {base} closed the connection before it answered ({why})"
            ))
        } else {
            anyhow::Error::new(e).context(format!("cannot reach marmot at {base}"))
        }
    }
}

/// A failed answer as one line: the API's message and code, or the start
/// of whatever else came back.
fn api_error(status: StatusCode, body: &[u8]) -> anyhow::Error {
    if let Ok(v) = serde_json::from_slice::<serde_json::Value>(body)
        && let Some(err) = v.get("error")
    {
        // An actor's own `{"error": "…"}` (the examples answer so) was
        // shown as an empty message.
        if let Some(msg) = err.as_str() {
            return anyhow::anyhow!("{msg} (HTTP {})", status.as_u16());
        }
        if let (Some(code), Some(msg)) = (
            err.get("code").and_then(|c| c.as_str()),
            err.get("message").and_then(|c| c.as_str()),
        ) {
            return anyhow::anyhow!("{msg} ({code}, HTTP {})", status.as_u16());
        }
    }
    anyhow::anyhow!(
        "HTTP {}: {}",
        status.as_u16(),
        String::from_utf8_lossy(body)
            .chars()
            .take(300)
            .collect::<String>()
    )
}

fn seg(s: &str) -> String {
    // Percent-encode a path segment (`.` and `..` cannot be: see
    // `cli::actor_id`).
    let mut out = String::with_capacity(s.len());
    for b in s.bytes() {
        if b.is_ascii_alphanumeric() || b"-._~".contains(&b) {
            out.push(b as char);
        } else {
            out.push_str(&format!("%{b:02X}"));
        }
    }
    out
}

fn print_json(body: &[u8]) {
    match serde_json::from_slice::<serde_json::Value>(body) {
        Ok(v) => println!("{}", serde_json::to_string_pretty(&v).unwrap_or_default()),
        Err(_) => println!("{}", for_terminal(&String::from_utf8_lossy(body))),
    }
}

/// `text` (an actor's, so anyone's) as it may be shown: at a terminal,
/// control characters other than newlines and tabs are escaped, so a
/// reply cannot move the cursor, recolour or retitle the operator's
/// terminal (ESC and OSC sequences); to a pipe or a file it is as sent.
fn for_terminal(text: &str) -> std::borrow::Cow<'_, str> {
    use std::io::IsTerminal as _;
    let risky = |c: char| c.is_control() && c != '\n' && c != '\t';
    if !std::io::stdout().is_terminal() || !text.contains(risky) {
        return text.into();
    }
    text.chars()
        .map(|c| {
            if risky(c) {
                format!("\\u{{{:x}}}", c as u32)
            } else {
                c.to_string()
            }
        })
        .collect::<String>()
        .into()
}

pub(super) async fn deploy(args: &ClientArgs, ty: &str, file: &Path) -> anyhow::Result<()> {
    let c = Client::new(args)?;
    let bytes = std::fs::read(file).with_context(|| format!("cannot read `{}`", file.display()))?;
    let content_type = match file.extension().and_then(|e| e.to_str()) {
        Some("wasm") => "application/wasm",
        Some("js") | Some("mjs") => "text/javascript",
        Some("json") => "application/json",
        _ => anyhow::bail!(
            "cannot tell what `{}` is: use a .wasm component, a .js module or a .json manifest",
            file.display()
        ),
    };
    eprintln!(
        "deploying {} ({} bytes) as `{ty}`…",
        file.display(),
        bytes.len()
    );
    let (status, body) = c
        .send(
            c.request(Method::PUT, &format!("/v1/types/{}", seg(ty)))
                .header("content-type", content_type)
                .body(bytes),
        )
        .await?;
    if status == StatusCode::OK {
        eprintln!("unchanged: identical code and config are already current");
    }
    print_json(&body);
    Ok(())
}

pub(super) async fn call(
    args: &ClientArgs,
    ty: &str,
    id: &str,
    json: Option<String>,
    no_wait: bool,
    idempotency_key: Option<String>,
) -> anyhow::Result<()> {
    let c = Client::new(args)?;
    let body = match json.as_deref() {
        // As curl's `-d`: neither starts a JSON text.
        Some("-") => std::io::read_to_string(std::io::stdin())
            .context("cannot read the message from standard input")?,
        Some(at) if at.starts_with('@') => std::fs::read_to_string(&at[1..])
            .with_context(|| format!("cannot read the message from `{}`", &at[1..]))?,
        _ => json.unwrap_or_default(),
    };
    if !body.trim().is_empty() {
        serde_json::from_str::<serde_json::Value>(&body)
            .with_context(|| "the message is not valid JSON")?;
    }
    let mut path = format!("/v1/actors/{}/{}", seg(ty), seg(id));
    if no_wait {
        path.push_str("?wait=false");
    }
    let mut req = c
        .request(Method::POST, &path)
        .header("content-type", "application/json")
        .body(body);
    if let Some(k) = idempotency_key {
        req = req.header("idempotency-key", k);
    }
    let (_, body) = c.send(req).await?;
    print_json(&body);
    Ok(())
}

pub(super) async fn actors(
    args: &ClientArgs,
    ty: &str,
    prefix: &str,
    limit: usize,
) -> anyhow::Result<()> {
    let c = Client::new(args)?;
    let mut cursor: Option<String> = None;
    let mut shown = 0;
    let header = || {
        println!(
            "{:<40} {:<11} {:>8} {:>10} {:>12}",
            "ID", "STATUS", "VERSION", "TURNS", "STATE BYTES"
        );
    };
    while shown < limit {
        let page = (limit - shown).min(1000);
        let mut req = c
            .request(Method::GET, &format!("/v1/actors/{}", seg(ty)))
            .query(&[("prefix", prefix), ("limit", &page.to_string())]);
        if let Some(cur) = &cursor {
            req = req.query(&[("cursor", cur)]);
        }
        let (_, body) = c.send(req).await?;
        let v: serde_json::Value = serde_json::from_slice(&body).context("invalid response")?;
        // After the first answer: an error prints nothing on stdout.
        if cursor.is_none() {
            header();
        }
        let items = v["actors"].as_array().cloned().unwrap_or_default();
        for a in &items {
            println!(
                "{:<40} {:<11} {:>8} {:>10} {:>12}",
                a["id"].as_str().unwrap_or(""),
                a["status"].as_str().unwrap_or(""),
                a["version"].to_string(),
                a["turns"].to_string(),
                a["state_bytes"].to_string()
            );
        }
        shown += items.len();
        match v["next_cursor"].as_str() {
            Some(next) if !items.is_empty() => {
                cursor = Some(next.to_owned());
                if shown >= limit {
                    // Said on stderr: stdout stays the table.
                    eprintln!("… more actors: list them with a larger --limit (or a --prefix)");
                }
            }
            _ => break,
        }
    }
    Ok(())
}

pub(super) async fn inspect(args: &ClientArgs, ty: &str, id: &str) -> anyhow::Result<()> {
    let c = Client::new(args)?;
    let base = format!("/v1/actors/{}/{}", seg(ty), seg(id));
    let (_, info) = c.send(c.request(Method::GET, &base)).await?;
    let (_, state) = c
        .send(
            c.request(Method::GET, &format!("{base}/state"))
                .query(&[("limit", "50")]),
        )
        .await?;
    let info: serde_json::Value = serde_json::from_slice(&info).context("invalid response")?;
    let state: StatePage = serde_json::from_slice(&state).context("invalid response")?;
    let last = info["last_event_seq"].as_u64().unwrap_or(0);
    let (_, events) = c
        .send(
            c.request(Method::GET, &format!("{base}/events"))
                .query(&[("after", last.saturating_sub(10).to_string())]),
        )
        .await?;
    let events: EventPage = serde_json::from_slice(&events).context("invalid response")?;
    if let Some(after) = &state.next_after {
        // Said on stderr: stdout stays the JSON.
        eprintln!(
            "… the first {} of {} state entries: page on with GET {base}/state?after={}",
            state.entries.len(),
            info["state_keys"],
            seg(after)
        );
    }
    // Pretty as a whole; values nested deeper than `serde_json::Value`
    // goes (128 levels, which an actor may store) as they came (a value
    // like that made the whole inspection "invalid response").
    #[derive(serde::Serialize)]
    struct Inspected<'a> {
        actor: &'a serde_json::Value,
        state: &'a [Box<RawValue>],
        recent_events: &'a [Box<RawValue>],
    }
    let values = |raw: &[Box<RawValue>]| -> Option<Vec<serde_json::Value>> {
        raw.iter()
            .map(|r| serde_json::from_str(r.get()).ok())
            .collect()
    };
    let out = match (values(&state.entries), values(&events.events)) {
        (Some(state), Some(recent)) => serde_json::to_string_pretty(&serde_json::json!({
            "actor": info,
            "state": state,
            "recent_events": recent,
        }))?,
        _ => serde_json::to_string_pretty(&Inspected {
            actor: &info,
            state: &state.entries,
            recent_events: &events.events,
        })?,
    };
    println!("{out}");
    Ok(())
}

/// A page of state entries, each as it came.
#[derive(serde::Deserialize)]
struct StatePage {
    entries: Vec<Box<RawValue>>,
    next_after: Option<String>,
}

/// A page of events, each as it came (its data may nest deeper than a
/// `serde_json::Value` goes).
#[derive(serde::Deserialize)]
struct EventPage {
    events: Vec<Box<RawValue>>,
    next_after: Option<u64>,
    gap: Option<serde_json::Value>,
    reset: Option<serde_json::Value>,
}

pub(super) async fn alarms(args: &ClientArgs, ty: &str, id: &str) -> anyhow::Result<()> {
    let c = Client::new(args)?;
    let path = format!("/v1/actors/{}/{}/alarms", seg(ty), seg(id));
    let (_, body) = c.send(c.request(Method::GET, &path)).await?;
    print_json(&body);
    Ok(())
}

/// Print an actor's events after `after`, one JSON object per line; with
/// `follow`, keep streaming new ones (SSE), resuming after the last one
/// printed whenever the connection drops.
pub(super) async fn events(
    args: &ClientArgs,
    ty: &str,
    id: &str,
    after: u64,
    follow: bool,
) -> anyhow::Result<()> {
    let c = Client::new(args)?;
    let path = format!("/v1/actors/{}/{}/events", seg(ty), seg(id));
    if !follow {
        let mut after = after;
        loop {
            let req = c
                .request(Method::GET, &path)
                .query(&[("after", after.to_string()), ("limit", "1000".into())]);
            let (_, body) = c.send(req).await?;
            let page: EventPage = serde_json::from_slice(&body).context("invalid response")?;
            if let Some(reset) = &page.reset {
                // Past the log's end (the actor was deleted and made
                // again): the page starts over from the log's start.
                eprintln!("marmot: {}", reset_note(reset));
                after = 0;
            }
            if let Some(gap) = &page.gap {
                eprintln!("marmot: events missing (past retention): {gap}");
            }
            // Each as it came: compact JSON, one per line.
            for e in &page.events {
                println!("{}", e.get());
            }
            match page.next_after {
                Some(next) if !page.events.is_empty() && next > after => after = next,
                _ => return Ok(()),
            }
        }
    }
    let mut last = after;
    let mut backoff = std::time::Duration::from_millis(250);
    // A node that never answered is a wrong `--url` (or a node not
    // started): said once, not retried for ever. Once following, a lost
    // connection is retried.
    let mut answered = false;
    loop {
        let req = c
            .request(Method::GET, &path)
            .header("accept", "text/event-stream")
            .header("last-event-id", last.to_string());
        let resp = match req.send().await {
            Ok(r) => {
                answered = true;
                r
            }
            Err(e) if !answered => {
                return Err(
                    anyhow::Error::new(e).context(format!("cannot reach marmot at {}", c.base))
                );
            }
            Err(e) => {
                eprintln!("marmot: stream interrupted ({e}); reconnecting");
                tokio::time::sleep(backoff).await;
                backoff = (backoff * 2).min(std::time::Duration::from_secs(10));
                continue;
            }
        };
        if !resp.status().is_success() {
            let status = resp.status();
            let body = resp.bytes().await.unwrap_or_default();
            return Err(api_error(status, &body));
        }
        backoff = std::time::Duration::from_millis(250);
        let mut resp = resp;
        let mut buf: Vec<u8> = Vec::new();
        while let Ok(Some(chunk)) = resp.chunk().await {
            buf.extend_from_slice(&chunk);
            while let Some(end) = find_frame_end(&buf) {
                let frame: Vec<u8> = buf.drain(..end).collect();
                if let Some(seq) = print_frame(&String::from_utf8_lossy(&frame)) {
                    last = seq;
                }
            }
        }
        tokio::time::sleep(backoff).await;
    }
}

/// The end (exclusive, including the blank line) of the first complete SSE
/// frame in `buf`.
fn find_frame_end(buf: &[u8]) -> Option<usize> {
    buf.windows(2).position(|w| w == b"\n\n").map(|i| i + 2)
}

/// What a `reset` (page field or stream frame) means, in one line.
fn reset_note(reset: &impl std::fmt::Display) -> String {
    format!(
        "no event after the seq asked for; the actor's log was made again \
         (deleted and recreated?): printing it from its start: {reset}"
    )
}

/// Print one SSE frame's event on stdout (what the stream says about
/// itself on stderr; a model's live deltas, which are not events, not at
/// all); return its id (0 for a reset: the log starts over).
fn print_frame(frame: &str) -> Option<u64> {
    let (mut id, mut event, mut data) = (None, None, Vec::new());
    for line in frame.lines() {
        if let Some(v) = line.strip_prefix("id:") {
            id = v.trim().parse::<u64>().ok();
        } else if let Some(v) = line.strip_prefix("event:") {
            event = Some(v.trim().to_owned());
        } else if let Some(v) = line.strip_prefix("data:") {
            data.push(v.strip_prefix(' ').unwrap_or(v).to_owned());
        }
    }
    let data = data.join("\n");
    match event.as_deref() {
        Some("gap") => eprintln!("marmot: events missing (past retention): {data}"),
        Some("reset") => {
            eprintln!("marmot: {}", reset_note(&data));
            // The stream starts over: so does where a reconnect resumes
            // (it would meet the reset again, and again).
            return Some(0);
        }
        Some("lagged") => eprintln!("marmot: {data} live deltas missed (the terminal was slow)"),
        None | Some("message") if !data.is_empty() => println!("{data}"),
        _ => {}
    }
    id
}

pub(super) async fn types(args: &ClientArgs) -> anyhow::Result<()> {
    let c = Client::new(args)?;
    let (_, body) = c.send(c.request(Method::GET, "/v1/types")).await?;
    print_json(&body);
    Ok(())
}

/// `marmot secrets set NAME --host H… [--from-file F]`: the value comes
/// from the file or from stdin; one trailing newline is dropped (what
/// `echo` and editors add).
pub(super) async fn secret_set(
    args: &ClientArgs,
    name: &str,
    hosts: &[String],
    from_file: Option<&Path>,
) -> anyhow::Result<()> {
    use std::io::Read as _;
    // A bad `--url` is said before the value is typed.
    let c = Client::new(args)?;
    let mut raw = zeroize::Zeroizing::new(Vec::new());
    match from_file {
        Some(path) => {
            *raw = std::fs::read(path)
                .with_context(|| format!("cannot read the value from `{}`", path.display()))?;
        }
        None if std::io::IsTerminal::is_terminal(&std::io::stdin()) => {
            // Typed: asked for, and not echoed (it used to show on the
            // screen, into scrollback and recordings).
            let line = {
                // Quiet before the prompt: what is typed after it is never
                // echoed.
                let _quiet = NoEcho::on_stdin();
                eprint!("value of secret {name} (not shown; Enter ends it): ");
                let mut line = zeroize::Zeroizing::new(String::new());
                std::io::stdin()
                    .read_line(&mut line)
                    .context("cannot read the value from the terminal")?;
                line
            };
            eprintln!();
            raw.extend_from_slice(line.as_bytes());
        }
        None => {
            std::io::stdin()
                .read_to_end(&mut raw)
                .context("cannot read the value from stdin")?;
        }
    }
    let mut value: &[u8] = &raw;
    if let Some(v) = value.strip_suffix(b"\n") {
        value = v.strip_suffix(b"\r").unwrap_or(v);
    }
    let value = std::str::from_utf8(value).context("the secret value must be UTF-8 text")?;
    let body = zeroize::Zeroizing::new(
        serde_json::to_vec(&serde_json::json!({ "value": value, "hosts": hosts }))
            .expect("JSON values serialize"),
    );
    let req = c
        .request(Method::PUT, &format!("/v1/secrets/{}", seg(name)))
        .header("content-type", "application/json")
        .body(body.to_vec());
    let (status, body) = c.send(req).await?;
    let v: serde_json::Value = serde_json::from_slice(&body).unwrap_or_default();
    let verb = if status == StatusCode::CREATED {
        "created"
    } else {
        "replaced"
    };
    println!("secret {name} {verb}; may be sent to {}", v["hosts"]);
    Ok(())
}

/// The terminal on stdin with its echo off, until dropped.
struct NoEcho(Option<libc::termios>);

/// The terminal settings [`NoEcho`] took echo from, for a signal that ends
/// the process before its `Drop` runs (Ctrl-C at the prompt left the
/// user's shell without echo).
static SAVED_TERMIOS: std::sync::OnceLock<libc::termios> = std::sync::OnceLock::new();
/// The signals that end a prompt.
const PROMPT_SIGNALS: [libc::c_int; 4] = [libc::SIGINT, libc::SIGTERM, libc::SIGHUP, libc::SIGQUIT];

/// Put the terminal back and die of `sig` as if unhandled.
extern "C" fn restore_and_die(sig: libc::c_int) {
    // SAFETY: tcsetattr, signal and raise are async-signal-safe; the saved
    // termios was set before this handler was installed and never changes.
    #[allow(unsafe_code, reason = "a signal handler restoring the terminal")]
    unsafe {
        if let Some(saved) = SAVED_TERMIOS.get() {
            libc::tcsetattr(libc::STDIN_FILENO, libc::TCSANOW, saved);
        }
        libc::signal(sig, libc::SIG_DFL);
        libc::raise(sig);
    }
}

impl NoEcho {
    fn on_stdin() -> Self {
        let mut saved = std::mem::MaybeUninit::<libc::termios>::uninit();
        // SAFETY: tcgetattr fills `saved` when it returns 0, and only then
        // is it read; tcsetattr reads a valid termios; the handler only
        // reads what was saved before it was installed.
        #[allow(unsafe_code, reason = "turning the terminal's echo off")]
        unsafe {
            if libc::tcgetattr(libc::STDIN_FILENO, saved.as_mut_ptr()) != 0 {
                return Self(None);
            }
            let saved = saved.assume_init();
            let _ = SAVED_TERMIOS.set(saved);
            let handler = restore_and_die as extern "C" fn(libc::c_int);
            for sig in PROMPT_SIGNALS {
                libc::signal(sig, handler as libc::sighandler_t);
            }
            let mut quiet = saved;
            quiet.c_lflag &= !libc::ECHO;
            if libc::tcsetattr(libc::STDIN_FILENO, libc::TCSANOW, &quiet) != 0 {
                return Self(None);
            }
            Self(Some(saved))
        }
    }
}

impl Drop for NoEcho {
    fn drop(&mut self) {
        // SAFETY: restores the termios tcgetattr returned, and the default
        // action of the signals `on_stdin` caught.
        #[allow(unsafe_code, reason = "turning the terminal's echo back on")]
        unsafe {
            if let Some(saved) = &self.0 {
                libc::tcsetattr(libc::STDIN_FILENO, libc::TCSANOW, saved);
            }
            for sig in PROMPT_SIGNALS {
                libc::signal(sig, libc::SIG_DFL);
            }
        }
    }
}

/// `marmot secrets list`.
pub(super) async fn secret_list(args: &ClientArgs) -> anyhow::Result<()> {
    let c = Client::new(args)?;
    let (_, body) = c.send(c.request(Method::GET, "/v1/secrets")).await?;
    let v: serde_json::Value = serde_json::from_slice(&body).unwrap_or_default();
    let secrets = v["secrets"].as_array().cloned().unwrap_or_default();
    if secrets.is_empty() {
        println!("no secrets");
    }
    for s in secrets {
        let hosts: Vec<&str> = s["hosts"]
            .as_array()
            .map(|h| h.iter().filter_map(|x| x.as_str()).collect())
            .unwrap_or_default();
        println!(
            "{}\thosts={}\tupdated_at_ms={}",
            s["name"].as_str().unwrap_or(""),
            hosts.join(","),
            s["updated_at_ms"]
        );
    }
    Ok(())
}

/// `marmot tokens mint …`: print the minted token as JSON.
pub(super) async fn token_mint(args: &ClientArgs, spec: serde_json::Value) -> anyhow::Result<()> {
    let c = Client::new(args)?;
    let (_, body) = c
        .send(c.request(Method::POST, "/v1/tokens").json(&spec))
        .await?;
    println!("{}", String::from_utf8_lossy(&body));
    Ok(())
}

/// `marmot backup --to DIR`.
pub(super) async fn backup(args: &ClientArgs, to: &std::path::Path) -> anyhow::Result<()> {
    let c = Client::new(args)?;
    let (_, body) = c
        .send(
            c.request(Method::POST, "/v1/backup")
                .json(&serde_json::json!({ "to": to })),
        )
        .await?;
    let v: serde_json::Value = serde_json::from_slice(&body).unwrap_or_default();
    println!(
        "backup written to {}: {} rows, {} blobs, {} bytes in {} ms",
        to.display(),
        v["rows"],
        v["blobs"],
        v["db_bytes"],
        v["elapsed_ms"]
    );
    Ok(())
}

/// `marmot tokens revoke TOKEN_ID`.
pub(super) async fn token_revoke(args: &ClientArgs, token_id: &str) -> anyhow::Result<()> {
    let c = Client::new(args)?;
    c.send(c.request(Method::DELETE, &format!("/v1/tokens/{}", seg(token_id))))
        .await?;
    println!("token {token_id} revoked");
    Ok(())
}

/// `marmot cluster status`.
/// A member's `alive` column: `leaving` while it stops gracefully, and `?`
/// when the node cannot tell (its view of etcd is stale: `GET
/// /v1/cluster` says `null`, which the table printed as is).
fn liveness(m: &serde_json::Value) -> &'static str {
    match (m["alive"].as_bool(), m["leaving"].as_bool()) {
        (Some(true), Some(true)) => "leaving",
        (Some(true), _) => "true",
        (Some(false), _) => "false",
        (None, _) => "?",
    }
}

pub(super) async fn cluster_status(args: &ClientArgs) -> anyhow::Result<()> {
    let c = Client::new(args)?;
    let (_, body) = c.send(c.request(Method::GET, "/v1/cluster")).await?;
    let v: serde_json::Value = serde_json::from_slice(&body).context("invalid response")?;
    if v["clustered"] == false {
        println!("this node runs alone (no [cluster] section in its config)");
        return Ok(());
    }
    println!(
        "node {}  controller {}  revision {}  slots {}/{} assigned, {} unavailable, {} without a backup, max epoch {}",
        v["node_id"].as_str().unwrap_or("?"),
        v["controller"].as_str().unwrap_or("(none)"),
        v["revision"],
        v["slots_assigned"],
        v["slots"],
        v["slots_unavailable"],
        v["slots_degraded"],
        v["max_epoch"],
    );
    if let Some(view) = v["view"].as_str().filter(|v| *v != "live") {
        println!("view: {view}");
    }
    println!(
        "actors placed outside their hash slot: {} ({} moving now)",
        v["actors_placed"], v["actors_moving"]
    );
    if let Some(r) = v["rebalance"].as_object() {
        println!(
            "rebalancing (asked through {}): {} used slots to move, {} being handed over",
            r.get("by").and_then(|b| b.as_str()).unwrap_or("?"),
            r.get("slots_to_move").unwrap_or(&serde_json::Value::Null),
            r.get("handoffs").unwrap_or(&serde_json::Value::Null),
        );
    }
    let count =
        |m: &serde_json::Value, k: &str| m[k].as_u64().map_or("-".into(), |u| u.to_string());
    println!(
        "{:<16} {:<12} {:<6} {:>6} {:>6} {:>7}  advertise",
        "node", "region", "alive", "slots", "used", "backup"
    );
    for m in v["members"].as_array().into_iter().flatten() {
        println!(
            "{:<16} {:<12} {:<6} {:>6} {:>6} {:>7}  {}",
            m["node_id"].as_str().unwrap_or("?"),
            m["region"].as_str().unwrap_or("-"),
            liveness(m),
            m["slots"].to_string(),
            count(m, "slots_used"),
            count(m, "backup_of"),
            m["advertise"].as_str().unwrap_or("-"),
        );
    }
    Ok(())
}

/// `marmot cluster move TYPE ID --region REGION`.
pub(super) async fn move_actor(
    args: &ClientArgs,
    ty: &str,
    id: &str,
    region: &str,
) -> anyhow::Result<()> {
    let c = Client::new(args)?;
    let path = format!(
        "/v1/actors/{}/{}/move?region={}",
        seg(ty),
        seg(id),
        seg(region)
    );
    let (_, body) = c.send(c.request(Method::POST, &path)).await?;
    let v: serde_json::Value = serde_json::from_slice(&body).context("invalid response")?;
    if v["moved"] == true {
        println!(
            "{ty}/{id} moved to region {region} (node {}, slot {})",
            v["node"].as_str().unwrap_or("?"),
            v["slot"]
        );
    } else {
        println!("{ty}/{id} is in region {region} already");
    }
    Ok(())
}

/// `marmot cluster rebalance`.
pub(super) async fn rebalance(args: &ClientArgs) -> anyhow::Result<()> {
    let c = Client::new(args)?;
    let (_, body) = c
        .send(c.request(Method::POST, "/v1/cluster/rebalance"))
        .await?;
    let v: serde_json::Value = serde_json::from_slice(&body).context("invalid response")?;
    println!(
        "rebalance asked for: {} used slots to move (see `marmot cluster status`)",
        v["slots_to_move"]
    );
    Ok(())
}

/// `marmot secrets rm NAME`.
pub(super) async fn secret_rm(args: &ClientArgs, name: &str) -> anyhow::Result<()> {
    let c = Client::new(args)?;
    c.send(c.request(Method::DELETE, &format!("/v1/secrets/{}", seg(name))))
        .await?;
    println!("secret {name} deleted");
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_status_table_says_leaving_and_unknown() {
        let m = |v: serde_json::Value| liveness(&v);
        assert_eq!(m(serde_json::json!({"alive": true})), "true");
        assert_eq!(
            m(serde_json::json!({"alive": true, "leaving": false})),
            "true"
        );
        assert_eq!(
            m(serde_json::json!({"alive": true, "leaving": true})),
            "leaving"
        );
        assert_eq!(
            m(serde_json::json!({"alive": false, "leaving": true})),
            "false"
        );
        assert_eq!(m(serde_json::json!({"alive": null})), "?");
    }

    /// The API's errors, an actor's own `{"error": "…"}`, and anything
    /// else (shown as it came) all say what went wrong.
    #[test]
    fn failed_answers_show_their_message() {
        let e = |status: u16, body: &str| {
            api_error(StatusCode::from_u16(status).unwrap(), body.as_bytes()).to_string()
        };
        assert_eq!(
            e(
                404,
                r#"{"error": {"code": "unknown_type", "message": "no type `x`"}}"#
            ),
            "no type `x` (unknown_type, HTTP 404)"
        );
        assert_eq!(
            e(400, r#"{"error": "expected {\"by\": integer}"}"#),
            r#"expected {"by": integer} (HTTP 400)"#
        );
        assert_eq!(
            e(422, r#"{"error": {"reason": 3}}"#),
            r#"HTTP 422: {"error": {"reason": 3}}"#
        );
        assert_eq!(e(502, "bad gateway"), "HTTP 502: bad gateway");
    }
}
