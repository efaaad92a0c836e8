//! Client commands: talk to a node over HTTP. One [`Client`] and the
//! answers' printing here; the commands by what they touch: actors
//! ([`actors`]), secrets and tokens ([`credentials`]), the cluster
//! ([`cluster`]).

use std::path::Path;

use anyhow::Context as _;
use reqwest::{Method, StatusCode};

use super::ClientArgs;

mod actors;
mod cluster;
mod credentials;

pub(super) use actors::{actors, alarms, events, inspect};
pub(super) use cluster::{cluster_status, move_actor, rebalance};
pub(super) use credentials::{secret_list, secret_rm, secret_set, token_mint, token_revoke};

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
pub(super) async fn types(args: &ClientArgs) -> anyhow::Result<()> {
    let c = Client::new(args)?;
    let (_, body) = c.send(c.request(Method::GET, "/v1/types")).await?;
    print_json(&body);
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
#[cfg(test)]
mod tests {
    use super::*;

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
