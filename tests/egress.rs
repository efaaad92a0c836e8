//! Outbound HTTP from guests (the `http` capability, JavaScript `fetch`)
//! and guarantee 9 (secrets never enter a sandbox) end to end: a real node,
//! a local https server with a test CA (`rcgen`) on 127.0.0.2, a plain http
//! server beside it, and a small DNS server that the node resolves with
//! (`[egress] nameservers`), which can change its answers (rebinding), and
//! an OTLP collector that keeps the traces the node exports.
//!
//! Only loopback addresses are ever contacted: the refusals of private,
//! link-local and metadata addresses happen before a connection.

mod common;
#[path = "egress/side_by_side.rs"]
mod side_by_side;

use std::collections::HashMap;
use std::net::{Ipv4Addr, SocketAddr};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};

use common::otlp::Traces;
use common::{Api, Marmot, TESTKIT, holds, tempdir};
use reqwest::Method;
use serde_json::{Value, json};

const SECRET: &str = "sk-test-7c1d93e5aa-do-not-leak";
/// The address the test servers listen on: loopback, but not 127.0.0.1, so
/// that the node can open exactly it (`allow_private`) and still refuse
/// 127.0.0.1.
const SERVER_IP: Ipv4Addr = Ipv4Addr::new(127, 0, 0, 2);

/// A request a test server saw: method, path, headers.
type Request = (String, String, Vec<(String, String)>);

/// What the test servers saw.
#[derive(Default)]
struct Seen {
    connections: AtomicUsize,
    requests: Mutex<Vec<Request>>,
}

impl Seen {
    fn requests(&self) -> Vec<Request> {
        self.requests.lock().unwrap().clone()
    }

    fn header(&self, i: usize, name: &str) -> Option<String> {
        self.requests()
            .get(i)?
            .2
            .iter()
            .find(|(k, _)| k == name)
            .map(|(_, v)| v.clone())
    }
}

/// Answer a request: `/echo` echoes the request headers in the body (and
/// one of them in a response header); `/redirect?to=URL` is a 302 there;
/// anything else is `ok`.
type Body = http_body_util::combinators::BoxBody<bytes::Bytes, std::convert::Infallible>;

async fn respond(
    seen: Arc<Seen>,
    req: hyper::Request<hyper::body::Incoming>,
) -> Result<hyper::Response<Body>, std::convert::Infallible> {
    use http_body_util::BodyExt;
    let headers: Vec<(String, String)> = req
        .headers()
        .iter()
        .map(|(k, v)| (k.to_string(), v.to_str().unwrap_or("").to_owned()))
        .collect();
    let path = req.uri().path().to_owned();
    let query = req.uri().query().unwrap_or("").to_owned();
    seen.requests
        .lock()
        .unwrap()
        .push((req.method().to_string(), path.clone(), headers.clone()));
    let mut resp = hyper::Response::builder();
    let body = match path.as_str() {
        "/echo" => {
            let auth = headers
                .iter()
                .find(|(k, _)| k == "authorization")
                .map(|(_, v)| v.clone())
                .unwrap_or_default();
            // And in a header's name, as a server reflecting it there would.
            let name = format!("x-key-{}", auth.trim_start_matches("Bearer "));
            if !auth.is_empty() && hyper::header::HeaderName::from_bytes(name.as_bytes()).is_ok() {
                resp = resp.header(name, "1");
            }
            resp = resp.header("x-echo-auth", auth);
            serde_json::to_string(&headers).unwrap()
        }
        "/stream" => {
            // The authorization header, 3 bytes at a time, as server-sent
            // events trickle: a secret in it is split across chunks.
            let auth = headers
                .iter()
                .find(|(k, _)| k == "authorization")
                .map(|(_, v)| v.clone())
                .unwrap_or_default();
            let pieces: Vec<bytes::Bytes> = format!("data: {auth}\n\n")
                .into_bytes()
                .chunks(3)
                .map(bytes::Bytes::copy_from_slice)
                .collect();
            let stream = futures::StreamExt::then(futures::stream::iter(pieces), |p| async move {
                tokio::time::sleep(std::time::Duration::from_millis(2)).await;
                Ok::<_, std::convert::Infallible>(hyper::body::Frame::data(p))
            });
            return Ok(resp
                .header("content-type", "text/event-stream")
                .body(BodyExt::boxed(http_body_util::StreamBody::new(stream)))
                .unwrap());
        }
        // The request's body, then every byte value: binary both ways.
        "/binary" => {
            let mut out = req
                .into_body()
                .collect()
                .await
                .map(|b| b.to_bytes().to_vec())
                .unwrap_or_default();
            out.extend(0..=255u8);
            return Ok(resp
                .header("content-type", "application/octet-stream")
                .body(BodyExt::boxed(http_body_util::Full::new(
                    bytes::Bytes::from(out),
                )))
                .unwrap());
        }
        // A value stored earlier, read back without any placeholder.
        "/leak" => format!("stored: {SECRET}"),
        // `n` bytes of `x`.
        "/big" => "x".repeat(
            query
                .strip_prefix("n=")
                .and_then(|n| n.parse().ok())
                .unwrap_or(0),
        ),
        "/gzip" => {
            resp = resp.header("content-encoding", "gzip");
            "\u{1f}\u{8b}not really gzip".into()
        }
        "/slow" => {
            tokio::time::sleep(std::time::Duration::from_millis(1500)).await;
            "slow".into()
        }
        "/redirect" => {
            let to = query.strip_prefix("to=").unwrap_or("/").to_owned();
            resp = resp.status(302).header("location", to);
            String::new()
        }
        // A server that reflects what it was sent into its redirect:
        // `KEY` in `tpl` becomes the bearer token, `ENC` the same
        // percent-encoded byte by byte.
        "/reflect" => {
            let key = headers
                .iter()
                .find(|(k, _)| k == "authorization")
                .map(|(_, v)| v.trim_start_matches("Bearer ").to_owned())
                .unwrap_or_default();
            let enc: String = key.bytes().map(|b| format!("%{b:02X}")).collect();
            let to = query
                .strip_prefix("tpl=")
                .unwrap_or("/")
                .replace("KEY", &key)
                .replace("ENC", &enc);
            resp = resp.status(302).header("location", to);
            String::new()
        }
        _ => "ok".into(),
    };
    Ok(resp
        .body(http_body_util::Full::new(bytes::Bytes::from(body)).boxed())
        .unwrap())
}

/// Serve `respond` on a fresh port of `SERVER_IP`, over TLS if `tls`.
async fn serve(seen: Arc<Seen>, tls: Option<tokio_rustls::TlsAcceptor>) -> u16 {
    let listener = tokio::net::TcpListener::bind((SERVER_IP, 0)).await.unwrap();
    let port = listener.local_addr().unwrap().port();
    tokio::spawn(async move {
        loop {
            let Ok((tcp, _)) = listener.accept().await else {
                return;
            };
            seen.connections.fetch_add(1, Ordering::SeqCst);
            let (seen, tls) = (seen.clone(), tls.clone());
            tokio::spawn(async move {
                let service = hyper::service::service_fn(move |req| respond(seen.clone(), req));
                let conn = hyper::server::conn::http1::Builder::new();
                match tls {
                    Some(tls) => {
                        if let Ok(stream) = tls.accept(tcp).await {
                            let io = hyper_util::rt::TokioIo::new(stream);
                            let _ = conn.serve_connection(io, service).await;
                        }
                    }
                    None => {
                        let io = hyper_util::rt::TokioIo::new(tcp);
                        let _ = conn.serve_connection(io, service).await;
                    }
                }
            });
        }
    });
    port
}

/// A DNS server answering A queries from a table; a name with several
/// answers gives the next one at each query (the last one repeats), which
/// is how a rebinding attacker behaves.
struct Dns {
    addr: SocketAddr,
    queries: Arc<Mutex<HashMap<String, usize>>>,
}

impl Dns {
    async fn start(table: Vec<(&'static str, Vec<Ipv4Addr>)>) -> Self {
        let socket = tokio::net::UdpSocket::bind("127.0.0.1:0").await.unwrap();
        let addr = socket.local_addr().unwrap();
        let queries: Arc<Mutex<HashMap<String, usize>>> = Arc::default();
        let counts = queries.clone();
        let table: HashMap<String, Vec<Ipv4Addr>> =
            table.into_iter().map(|(k, v)| (k.to_owned(), v)).collect();
        tokio::spawn(async move {
            let mut buf = [0u8; 1500];
            loop {
                let Ok((n, from)) = socket.recv_from(&mut buf).await else {
                    return;
                };
                if let Some(reply) = answer(&buf[..n], &table, &counts) {
                    let _ = socket.send_to(&reply, from).await;
                }
            }
        });
        Self { addr, queries }
    }

    fn queries(&self, name: &str) -> usize {
        *self.queries.lock().unwrap().get(name).unwrap_or(&0)
    }
}

/// One DNS reply (RFC 1035 §4): the question copied, A answers with TTL 0.
fn answer(
    q: &[u8],
    table: &HashMap<String, Vec<Ipv4Addr>>,
    counts: &Mutex<HashMap<String, usize>>,
) -> Option<Vec<u8>> {
    if q.len() < 12 {
        return None;
    }
    let mut labels = Vec::new();
    let mut i = 12;
    loop {
        let len = *q.get(i)? as usize;
        i += 1;
        if len == 0 {
            break;
        }
        labels.push(String::from_utf8_lossy(q.get(i..i + len)?).to_lowercase());
        i += len;
    }
    let qtype = u16::from_be_bytes([*q.get(i)?, *q.get(i + 1)?]);
    let question_end = i + 4;
    let name = labels.join(".");
    // An entry `*.parent` answers for every name under `parent`.
    let entry = table.get_key_value(&name).or_else(|| {
        let (_, parent) = name.split_once('.')?;
        table.get_key_value(&format!("*.{parent}"))
    });
    let answers: Vec<Ipv4Addr> = match entry {
        Some((key, ips)) if qtype == 1 => {
            let mut c = counts.lock().unwrap();
            let n = c.entry(key.clone()).or_default();
            let ip = ips[(*n).min(ips.len() - 1)];
            *n += 1;
            vec![ip]
        }
        _ => Vec::new(),
    };
    let rcode = if entry.is_some() { 0 } else { 3 };
    let mut out = Vec::with_capacity(question_end + 16 * answers.len());
    out.extend_from_slice(&q[0..2]);
    out.extend_from_slice(&[0x81, 0x80 | rcode]);
    out.extend_from_slice(&[0, 1]);
    out.extend_from_slice(&(answers.len() as u16).to_be_bytes());
    out.extend_from_slice(&[0, 0, 0, 0]);
    out.extend_from_slice(q.get(12..question_end)?);
    for ip in answers {
        out.extend_from_slice(&[0xc0, 0x0c, 0, 1, 0, 1, 0, 0, 0, 0, 0, 4]);
        out.extend_from_slice(&ip.octets());
    }
    Some(out)
}

/// Everything a test needs: the servers, the DNS, and a node that trusts
/// the test CA, resolves with the test DNS and may reach only 127.0.0.2.
struct Rig {
    _dir: tempfile::TempDir,
    node: Marmot,
    api: Api,
    seen: Arc<Seen>,
    dns: Dns,
    traces: Traces,
    https: u16,
    http: u16,
}

impl Rig {
    async fn new(type_config: Value) -> Self {
        let dir = tempdir();
        let seen = Arc::new(Seen::default());
        let (config, ca_pem) = common::test_tls(&["api.test", "other.test"]);
        let acceptor = tokio_rustls::TlsAcceptor::from(config);
        let https = serve(seen.clone(), Some(acceptor)).await;
        let http = serve(seen.clone(), None).await;
        let dns = Dns::start(vec![
            ("api.test", vec![SERVER_IP]),
            ("other.test", vec![SERVER_IP]),
            ("loop.test", vec![Ipv4Addr::LOCALHOST]),
            ("*.loop.test", vec![Ipv4Addr::LOCALHOST]),
            ("private.test", vec![Ipv4Addr::new(10, 0, 0, 7)]),
            ("rebind.test", vec![SERVER_IP, Ipv4Addr::LOCALHOST]),
        ])
        .await;
        let ca_file = dir.path().join("ca.pem");
        std::fs::write(&ca_file, ca_pem).unwrap();
        let config = format!(
            "[egress]\nallow_private = [\"127.0.0.2/32\"]\nextra_ca_file = {:?}\nnameservers = [\"{}\"]\n",
            ca_file.display().to_string(),
            dns.addr
        );
        // Logs at trace level, and traces exported (with the log events in
        // their spans) to a local collector: both are searched for secrets.
        let traces = Traces::start().await;
        let node =
            Marmot::start_opts(&dir.path().join("data"), &traces.node_env(), Some(&config)).await;
        let api = node.client();
        let r = api
            .req(
                Method::PUT,
                "/v1/secrets/API_KEY",
                Some((
                    "application/json",
                    serde_json::to_vec(&json!({ "value": SECRET, "hosts": ["api.test"] })).unwrap(),
                )),
                &[],
            )
            .await;
        assert_eq!(r.status, 201, "{}", r.json);
        let r = api.deploy("kit", TESTKIT, type_config).await;
        assert_eq!(r.status, 201, "{}", r.json);
        Self {
            _dir: dir,
            node,
            api,
            seen,
            dns,
            traces,
            https,
            http,
        }
    }

    async fn fetch(&self, req: Value) -> Value {
        let mut op = json!({ "op": "fetch" });
        for (k, v) in req.as_object().unwrap() {
            op[k] = v.clone();
        }
        let r = self.api.op("kit", "a", op).await;
        assert_eq!(r.status, 200, "{}", r.json);
        r.json
    }
}

fn denied(r: &Value) -> String {
    let e = r["error"].as_str().unwrap_or_default().to_owned();
    assert!(e.starts_with("denied: "), "expected a refusal, got {r}");
    e
}

fn kit_config() -> Value {
    json!({
        "allowed_hosts": [
            "api.test", "other.test", "loop.test", "private.test", "rebind.test",
            "127.0.0.1", "[::1]", "[::ffff:127.0.0.1]", "0.0.0.0", "10.0.0.1",
            "169.254.169.254", "[fd00:ec2::254]",
        ],
        "secrets": ["API_KEY"],
    })
}

#[tokio::test]
async fn a_secret_reaches_only_its_https_host_and_nothing_comes_back_with_it() {
    let rig = Rig::new(kit_config()).await;
    let url = format!("https://api.test:{}/echo", rig.https);
    let r = rig
        .fetch(json!({
            "url": url,
            "headers": [["authorization", "Bearer {{secret:API_KEY}}"], ["x-marker", "echo-marker-5150"]],
        }))
        .await;
    assert_eq!(r["status"], 200, "{r}");
    // The server got the value; the guest got it back only redacted, in
    // the body and in the header that echoed it.
    assert_eq!(
        rig.seen.header(0, "authorization").as_deref(),
        Some(format!("Bearer {SECRET}").as_str())
    );
    let body = r["body"].as_str().unwrap();
    assert!(!body.contains(SECRET), "{body}");
    assert!(body.contains("Bearer [redacted]"), "{body}");
    let echoed = r["headers"]
        .as_array()
        .unwrap()
        .iter()
        .find(|h| h[0] == "x-echo-auth")
        .unwrap();
    assert_eq!(echoed[1], "Bearer [redacted]");
    // A header whose name held the value is not handed over at all.
    let names: Vec<String> = r["headers"]
        .as_array()
        .unwrap()
        .iter()
        .map(|h| h[0].as_str().unwrap().to_owned())
        .collect();
    assert!(names.iter().all(|n| !n.starts_with("x-key-")), "{names:?}");

    // Not in the guest's memory: the scan finds a string the guest did see,
    // and not the value.
    let scan = |needle: &str| {
        let mask: Vec<u8> = (0..needle.len()).map(|i| 0x5a ^ (i as u8)).collect();
        let masked: Vec<u8> = needle.bytes().zip(&mask).map(|(b, m)| b ^ m).collect();
        json!({ "op": "scan_memory", "masked": masked, "mask": mask })
    };
    let seen_marker = rig.api.op("kit", "a", scan("echo-marker-5150")).await;
    assert_eq!(
        seen_marker.json["found"], true,
        "the scan cannot find anything"
    );
    let secret = rig.api.op("kit", "a", scan(SECRET)).await;
    assert_eq!(secret.json["found"], false, "the secret is in guest memory");

    // The wrong destinations: refused before a byte is sent.
    let before = rig.seen.requests().len();
    for (req, why) in [
        (
            json!({ "url": format!("https://other.test:{}/echo", rig.https),
                    "headers": [["authorization", "{{secret:API_KEY}}"]] }),
            "may only be sent over https to api.test",
        ),
        (
            json!({ "url": format!("http://api.test:{}/echo", rig.http),
                    "headers": [["authorization", "{{secret:API_KEY}}"]] }),
            "may only be sent over https to api.test",
        ),
    ] {
        let e = denied(&rig.fetch(req).await);
        assert!(e.contains(why), "{e}");
        assert!(!e.contains(SECRET));
    }
    let r = rig
        .fetch(json!({ "url": url, "headers": [["x", "{{secret:NOPE}}"]] }))
        .await;
    assert!(denied(&r).contains("not listed in this actor type's config.secrets"));
    // A placeholder anywhere in the URL (it went out as written).
    for at in [
        "?key={{secret:API_KEY}}",
        "/{{secret:API_KEY}}",
        "?key={{SECRET:API_KEY}}",
        "?key=%7B%7B%20secret%3AAPI_KEY%7D%7D",
    ] {
        let r = rig.fetch(json!({ "url": format!("{url}{at}") })).await;
        let e = r["error"].as_str().unwrap_or_default();
        assert!(e.contains("in header values only"), "{r}");
    }
    // In a body, or in another case in a header, it went out as written
    // too (found by a probe).
    for body in [
        r#"{"api_key": "{{secret:API_KEY}}"}"#,
        "k={{Secret:API_KEY}}",
        r#"{"api_key": "{{ secret:API_KEY }}"}"#,
        "k=%7B%7Bsecret%3AAPI_KEY%7D%7D",
    ] {
        let r = rig
            .fetch(json!({ "method": "POST", "url": url, "body": body }))
            .await;
        let e = r["error"].as_str().unwrap_or_default();
        assert!(e.contains("not in the body"), "{r}");
    }
    for header in [
        "Bearer {{SECRET:API_KEY}}",
        "Bearer {{ secret:API_KEY }}",
        "Bearer %7B%7Bsecret%3AAPI_KEY%7D%7D",
        "Bearer {{secret%3AAPI_KEY}}",
    ] {
        let r = rig
            .fetch(json!({ "url": url, "headers": [["authorization", header]] }))
            .await;
        let e = r["error"].as_str().unwrap_or_default();
        let why = if header.contains("%7B") {
            "not percent-encoded"
        } else {
            "in lower case"
        };
        assert!(e.contains(why) && !e.contains(SECRET), "{r}");
    }
    assert_eq!(
        rig.seen.requests().len(),
        before,
        "a refused request was sent"
    );

    // A type that does not list the secret cannot use it.
    let r = rig
        .api
        .deploy("other", TESTKIT, json!({ "allowed_hosts": ["api.test"] }))
        .await;
    assert_eq!(r.status, 201);
    let r = rig
        .api
        .op(
            "other",
            "a",
            json!({ "op": "fetch", "url": url, "headers": [["authorization", "{{secret:API_KEY}}"]] }),
        )
        .await;
    assert!(denied(&r.json).contains("config.secrets"));

    // A value that comes back without having been sent in this request
    // (stored through an earlier one) is scrubbed too; the response must be
    // uncompressed and whole to be checked, and the host frames requests.
    let r = rig
        .fetch(json!({ "url": format!("https://api.test:{}/leak", rig.https) }))
        .await;
    assert_eq!(r["body"], "stored: [redacted]", "{r}");
    // The length the server declared would tell the value's length.
    let length = r["headers"]
        .as_array()
        .unwrap()
        .iter()
        .find(|h| h[0] == "content-length")
        .map(|h| h[1].clone());
    assert_eq!(
        length,
        Some(json!("stored: [redacted]".len().to_string())),
        "{r}"
    );
    // Rotated, the old value is still cut out of what comes back: the
    // server may keep it, and it may still be valid (it came back whole).
    let r = rig
        .api
        .req(
            Method::PUT,
            "/v1/secrets/API_KEY",
            Some((
                "application/json",
                serde_json::to_vec(
                    &json!({ "value": "sk-rotated-0000-new", "hosts": ["api.test"] }),
                )
                .unwrap(),
            )),
            &[],
        )
        .await;
    assert_eq!(r.status, 200, "{}", r.json);
    let r = rig
        .fetch(json!({ "url": format!("https://api.test:{}/leak", rig.https) }))
        .await;
    assert_eq!(r["body"], "stored: [redacted]", "{r}");
    let r = rig
        .fetch(
            json!({ "url": format!("https://api.test:{}/gzip", rig.https),
                       "headers": [["accept-encoding", "gzip"]] }),
        )
        .await;
    assert!(denied(&r).contains("cannot be checked for secrets"), "{r}");
    assert_eq!(
        rig.seen
            .header(rig.seen.requests().len() - 1, "accept-encoding")
            .as_deref(),
        Some("identity")
    );
    let r = rig
        .fetch(json!({ "url": url, "headers": [["range", "bytes=0-5"]] }))
        .await;
    assert!(denied(&r).contains("partial response"), "{r}");
    for header in ["host", "Transfer-Encoding", "proxy-authorization"] {
        let r = rig
            .fetch(json!({ "url": url, "headers": [[header, "x"]] }))
            .await;
        assert!(
            r["error"]
                .as_str()
                .unwrap_or("")
                .starts_with("invalid: header"),
            "{header}: {r}"
        );
    }

    // Nowhere else either: exported traces, logs at trace level,
    // metrics, events, the database file. Every turn above is traced (13
    // of them: a refused fetch is a turn too), with the log events
    // inside it.
    let exports = rig.traces.settled(13).await;
    assert!(
        !exports.iter().any(|b| holds(b, SECRET)),
        "an exported trace holds the secret"
    );
    assert!(
        exports.iter().any(|b| holds(b, "api.test")),
        "the traces carry the log events of the fetches (which name the host)"
    );
    let metrics = rig.api.get("/metrics").await;
    assert!(!String::from_utf8_lossy(&metrics.body).contains(SECRET));
    let events = rig.api.get("/v1/actors/kit/a/events").await;
    assert!(!String::from_utf8_lossy(&events.body).contains(SECRET));
    let mut node = rig.node;
    node.kill9();
    assert!(
        !node.log_text().contains(SECRET),
        "the log holds the secret"
    );
    let db = common::database_bytes(&rig._dir.path().join("data"));
    assert!(
        !holds(&db, SECRET),
        "the database or its journal holds the secret"
    );
}

#[tokio::test]
async fn streamed_bodies_arrive_in_chunks_and_are_scrubbed_across_them() {
    let rig = Rig::new(kit_config()).await;
    let r = rig
        .api
        .op(
            "kit",
            "a",
            json!({
                "op": "fetch_stream",
                "url": format!("https://api.test:{}/stream", rig.https),
                "headers": [["authorization", "Bearer {{secret:API_KEY}}"]],
                "max": 5,
            }),
        )
        .await;
    assert_eq!(r.status, 200, "{}", r.json);
    assert_eq!(r.json["status"], 200);
    assert_eq!(r.json["body"], "data: Bearer [redacted]\n\n", "{}", r.json);
    assert!(r.json["chunks"].as_u64().unwrap() > 3, "{}", r.json);
    assert_eq!(
        rig.seen.header(0, "authorization").as_deref(),
        Some(format!("Bearer {SECRET}").as_str())
    );
}

/// Waiting for a response is neither CPU (the type's CPU slice is far
/// shorter than the wait) nor idleness (the idle timeout is too): the
/// actor stays awake and its turn completes.
#[tokio::test]
async fn a_slow_fetch_is_not_cpu_and_keeps_the_actor_awake() {
    let mut config = kit_config();
    config["cpu_slice_ms"] = json!(200);
    config["idle_timeout_ms"] = json!(300);
    let rig = Rig::new(config).await;
    let r = rig
        .fetch(json!({ "url": format!("https://api.test:{}/slow", rig.https) }))
        .await;
    assert_eq!(r["status"], 200, "{r}");
    assert_eq!(r["body"], "slow");
    let hibernations = |m: &str| common::metric(m, "marmot_hibernations_total");
    let metrics = String::from_utf8_lossy(&rig.api.get("/metrics").await.body).into_owned();
    assert_eq!(
        hibernations(&metrics),
        0.0,
        "the actor hibernated while it waited"
    );
    assert_eq!(
        rig.api.get("/v1/actors/kit/a").await.json["status"],
        "active"
    );
    // Both limits are live for this type: the actor hibernates 300 ms after
    // the turn, and a turn that spins is stopped after its 200 ms slice.
    let asleep = rig
        .api
        .wait_info("kit", "a", "hibernation", |i| i["status"] == "hibernated")
        .await;
    assert_eq!(asleep["turns"], 1, "{asleep}");
    let started = std::time::Instant::now();
    let r = rig.api.op("kit", "a", json!({ "op": "spin" })).await;
    assert_eq!(r.code(), "cpu_limit_exceeded", "{}", r.json);
    assert!(
        started.elapsed() < std::time::Duration::from_millis(1500),
        "the spin outlasted the slow fetch: {:?}",
        started.elapsed()
    );
}

/// A fetch's timeout bounds its wait for one of the type's
/// `http_concurrency` places too: with every place held by slow fetches it
/// fails in its own time, saying why, instead of waiting for them (16
/// slow fetches held a 1 s one for 18 s: found by a probe).
#[tokio::test]
async fn a_fetch_waits_for_a_place_no_longer_than_its_timeout() {
    let mut config = kit_config();
    config["http_concurrency"] = json!(1);
    let rig = Rig::new(config).await;
    let url = format!("https://api.test:{}/slow", rig.https);
    let slow = rig.api.op("kit", "a", json!({ "op": "fetch", "url": url }));
    let quick = async {
        tokio::time::sleep(std::time::Duration::from_millis(300)).await;
        let started = std::time::Instant::now();
        let r = rig
            .api
            .op(
                "kit",
                "b",
                json!({ "op": "fetch", "url": url, "timeout_ms": 200 }),
            )
            .await;
        (r, started.elapsed())
    };
    let (slow, (quick, took)) = tokio::join!(slow, quick);
    assert_eq!(slow.json["status"], 200, "{}", slow.json);
    let e = quick.json["error"].as_str().unwrap_or_default();
    assert!(
        e.starts_with("limit exceeded: ") && e.contains("http_concurrency"),
        "{}",
        quick.json
    );
    assert!(
        took < std::time::Duration::from_millis(1000),
        "the fetch waited {took:?} for its place"
    );
}

#[tokio::test]
async fn bad_egress_config_is_refused_at_deploy() {
    let rig = Rig::new(kit_config()).await;
    for (config, want) in [
        (
            json!({ "allowed_hosts": ["https://api.test"] }),
            "allowed_hosts",
        ),
        (json!({ "allowed_hosts": ["*"] }), "allowed_hosts"),
        (json!({ "allowed_methods": ["FETCH"] }), "allowed_methods"),
        (json!({ "secrets": ["bad name"] }), "secrets"),
        (json!({ "max_redirects": 99 }), "max_redirects"),
    ] {
        let r = rig.api.deploy("bad", TESTKIT, config.clone()).await;
        assert_eq!(r.status, 400, "{config}: {}", r.json);
        let msg = r.json["error"]["message"].as_str().unwrap();
        assert!(msg.contains(want), "{config}: {msg}");
    }
    assert_eq!(rig.api.get("/v1/types/bad").await.status, 404);
}

#[tokio::test]
async fn ssrf_attempts_are_refused_before_a_connection() {
    let rig = Rig::new(json!({
        "allowed_hosts": kit_config()["allowed_hosts"],
        "max_redirects": 3,
    }))
    .await;
    let p = rig.http;
    let attempts = [
        format!("http://127.0.0.1:{p}/"),
        format!("http://[::1]:{p}/"),
        format!("http://[::ffff:127.0.0.1]:{p}/"),
        format!("http://0.0.0.0:{p}/"),
        format!("http://2130706433:{p}/"),
        format!("http://0x7f.1:{p}/"),
        format!("http://0177.0.0.1:{p}/"),
        "http://10.0.0.1/".into(),
        "http://169.254.169.254/latest/meta-data/".into(),
        "http://[fd00:ec2::254]/".into(),
        format!("http://loop.test:{p}/"),
        "http://private.test/".into(),
        format!(
            "https://api.test:{}/redirect?to=http://127.0.0.1:{p}/",
            rig.https
        ),
    ];
    let connections = rig.seen.connections.load(Ordering::SeqCst);
    for url in &attempts {
        let r = rig.fetch(json!({ "url": url })).await;
        let e = denied(&r);
        assert!(e.contains("does not allow"), "{url}: {e}");
    }
    // Only the redirecting server was reached (once), never the target.
    assert_eq!(
        rig.seen.connections.load(Ordering::SeqCst),
        connections + 1,
        "a refused address was connected to"
    );
    assert_eq!(rig.seen.requests().len(), 1);

    // Rebinding: the name is judged as it is resolved, and the connection
    // goes to the judged answer (127.0.0.2); the next lookup answers
    // 127.0.0.1 and is refused.
    let r = rig
        .fetch(json!({ "url": format!("http://rebind.test:{p}/ok") }))
        .await;
    assert_eq!(r["status"], 200, "{r}");
    assert_eq!(rig.dns.queries("rebind.test"), 1);
    // A new connection (the pool is per host and port) resolves again.
    let r = rig
        .fetch(json!({ "url": format!("http://rebind.test:{}/ok", rig.https) }))
        .await;
    denied(&r);
    assert_eq!(rig.dns.queries("rebind.test"), 2);

    // Every refusal was counted, and the one request that went through.
    let text = String::from_utf8(rig.api.get("/metrics").await.body).unwrap();
    let count = |outcome: &str| -> u64 {
        let prefix = format!("marmot_http_requests_total{{outcome=\"{outcome}\"}} ");
        text.lines()
            .find_map(|l| l.strip_prefix(prefix.as_str()))
            .map_or(0, |v| v.trim().parse().unwrap())
    };
    assert_eq!(count("refused"), attempts.len() as u64 + 1, "{text}");
    assert_eq!(count("ok"), 1, "{text}");
    assert!(text.contains("marmot_http_request_duration_seconds_count"));
}

#[tokio::test]
async fn allow_lists_methods_and_redirects() {
    let rig = Rig::new(json!({
        "allowed_hosts": ["api.test", "other.test"],
        "allowed_methods": ["GET"],
        "secrets": ["API_KEY"],
    }))
    .await;
    // A host the type does not list: refused without a connection.
    let r = rig
        .fetch(json!({ "url": format!("http://unlisted.test:{}/", rig.http) }))
        .await;
    assert!(denied(&r).contains("allowed_hosts"), "{r}");
    assert_eq!(rig.seen.connections.load(Ordering::SeqCst), 0);
    // A method the type does not list.
    let r = rig
        .fetch(json!({ "method": "POST", "url": format!("https://api.test:{}/", rig.https) }))
        .await;
    assert!(denied(&r).contains("allowed_methods"), "{r}");
    assert_eq!(rig.seen.connections.load(Ordering::SeqCst), 0);
    // Redirects are not followed by default: the guest gets the 302.
    let target = format!("https://other.test:{}/echo", rig.https);
    let r = rig
        .fetch(json!({ "url": format!("https://api.test:{}/redirect?to={target}", rig.https) }))
        .await;
    assert_eq!(r["status"], 302, "{r}");

    // Opted in: followed, each hop checked, and the secret is not carried
    // to another host.
    let r = rig
        .api
        .deploy(
            "kit",
            TESTKIT,
            json!({
                "allowed_hosts": ["api.test", "other.test", "*.loop.test", "*.nx.test"],
                "secrets": ["API_KEY"],
                "max_redirects": 2,
            }),
        )
        .await;
    assert_eq!(r.status, 201);
    let r = rig
        .fetch(json!({
            "url": format!("https://api.test:{}/redirect?to={target}", rig.https),
            "headers": [["authorization", "Bearer {{secret:API_KEY}}"], ["x-kept", "yes"]],
        }))
        .await;
    assert_eq!(r["status"], 200, "{r}");
    let last = rig.seen.requests().len() - 1;
    assert_eq!(rig.seen.requests()[last].1, "/echo");
    assert_eq!(
        rig.seen.header(last, "authorization"),
        None,
        "the secret followed a redirect"
    );
    assert_eq!(rig.seen.header(last, "x-kept").as_deref(), Some("yes"));
    // A hop to a host the type does not list is refused.
    let r = rig
        .fetch(json!({ "url": format!("https://api.test:{}/redirect?to=https://unlisted.test/", rig.https) }))
        .await;
    assert!(denied(&r).contains("allowed_hosts"), "{r}");

    // A server that puts the secret it was sent into its redirect: the
    // refusal does not show the target (a URL parser lowercases a host, and
    // the value used to come back in the error), and the value is not
    // carried to another origin in the URL either, as it is or encoded.
    let reflect = |tpl: &str| {
        json!({
            "url": format!("https://api.test:{}/reflect?tpl={tpl}", rig.https),
            "headers": [["authorization", "Bearer {{secret:API_KEY}}"]],
        })
    };
    let other = format!("https://other.test:{}/echo", rig.https);
    for (tpl, says) in [
        ("https://KEY.invalid/".to_owned(), "redirect 1 was refused"),
        ("KEY://x/".to_owned(), "redirect 1 was refused"),
        (format!("{other}?k=KEY"), "carries a secret's value"),
        (format!("{other}?k=ENC"), "carries a secret's value"),
        (
            format!("https://other.test:{}/ENC", rig.https),
            "carries a secret's value",
        ),
    ] {
        let before = rig.seen.requests().len();
        let r = rig.fetch(reflect(&tpl)).await;
        let e = denied(&r);
        assert!(e.contains(says), "{tpl}: {e}");
        assert!(
            !e.to_ascii_lowercase().contains(SECRET),
            "{tpl}: the secret is in the error: {e}"
        );
        assert_eq!(
            rig.seen.requests().len(),
            before + 1,
            "{tpl}: the redirect was followed"
        );
    }
    // A hop refused by its answer's address, or whose name does not
    // resolve: the errors name neither the host (the resolver's own words
    // do) nor anything else the server put there.
    for (tpl, says) in [
        (
            "https://marker-q7.loop.test/",
            "redirect 1 was refused: its host resolves to an address this node does not allow (loopback",
        ),
        (
            "https://marker-q7.nx.test/",
            "redirect 1: connection failed",
        ),
    ] {
        let r = rig.fetch(reflect(tpl)).await;
        let e = r["error"].as_str().unwrap_or_default();
        assert!(e.contains(says), "{tpl}: {r}");
        assert!(
            !e.contains("marker-q7"),
            "{tpl}: the target is in the error: {e}"
        );
    }
    let mut node = rig.node;
    node.kill9();
    assert!(
        !node.log_text().to_ascii_lowercase().contains(SECRET),
        "the log holds the secret"
    );
}

/// A body the actor's memory cannot take fails the fetch, which the
/// script can catch, saying why; it trapped the whole turn (12 MB in a
/// JavaScript actor's 32 MiB, under the node's 16 MiB cap: found by a
/// probe). A body that fits comes whole.
#[tokio::test]
async fn a_body_the_actors_memory_cannot_take_fails_the_fetch() {
    let rig = Rig::new(kit_config()).await;
    let source = format!(
        r#"export default {{
  async onMessage(body) {{
    try {{
      const r = await fetch("https://api.test:{}/big?n=" + body.n);
      return {{ length: (await r.text()).length }};
    }} catch (e) {{
      return {{ code: e.code, message: String(e.message) }};
    }}
  }}
}};"#,
        rig.https
    );
    let manifest = json!({ "kind": "js", "code": source, "config": kit_config() });
    let r = rig.api.deploy_manifest("bigfetch", &manifest).await;
    assert_eq!(r.status, 201, "{}", r.json);
    let r = rig
        .api
        .post_json("/v1/actors/bigfetch/a", &json!({"n": 1_000_000}))
        .await;
    assert_eq!(r.json, json!({"length": 1_000_000}), "{}", r.json);
    let r = rig
        .api
        .post_json("/v1/actors/bigfetch/a", &json!({"n": 12_000_000}))
        .await;
    assert_eq!(r.status, 200, "the turn failed: {}", r.json);
    assert_eq!(r.json["code"], "limit_exceeded", "{}", r.json);
    assert!(
        r.json["message"]
            .as_str()
            .unwrap()
            .contains("max_memory_bytes"),
        "{}",
        r.json
    );
}

#[tokio::test]
async fn javascript_fetch_uses_the_same_capability() {
    let rig = Rig::new(kit_config()).await;
    let source = format!(
        r#"export default {{
  async onMessage(body) {{
    const r = await fetch("https://api.test:{}/echo", {{
      headers: {{ authorization: "Bearer {{{{secret:API_KEY}}}}", "idempotency-key": "{{{{idempotency-key}}}}" }},
    }});
    const text = await r.text();
    const heads = [...r.headers].map(([k, v]) => k + ": " + v).join("\n");
    let refused = null;
    try {{ await fetch("http://127.0.0.1:{}/"); }} catch (e) {{ refused = String(e.message || e); }}
    // The secret towards a host it may not go to: the refusal names it,
    // never its value.
    let misdirected = null;
    try {{
      await fetch("https://other.test:{}/echo", {{ headers: {{ authorization: "{{{{secret:API_KEY}}}}" }} }});
    }} catch (e) {{ misdirected = String(e.message || e); }}
    // A timeout that is not whole milliseconds, at least 1: refused
    // before anything is sent.
    const badTimeouts = [];
    for (const timeoutMs of [0, -5, 1.5, "abc", Infinity]) {{
      try {{ await fetch("https://api.test:{}/echo", {{ timeoutMs }}); badTimeouts.push("sent"); }}
      catch (e) {{ badTimeouts.push(e instanceof TypeError && e.message.includes("timeoutMs must be a whole number")); }}
    }}
    const seen = text + heads + refused + misdirected;
    // Bytes both ways (a body used to go as text, and come back as text:
    // 0x80 and up turned into U+FFFD), and WHATWG headers.
    const bin = await fetch("https://api.test:{}/binary", {{ method: "POST", body: new Uint8Array([0xff, 0x00, 0x80]) }});
    const got = new Uint8Array(await bin.arrayBuffer());
    const binary = {{ length: got.length, head: Array.from(got.slice(0, 4)), last: got[got.length - 1],
                     type: bin.headers.get("Content-Type"), missing: bin.headers.get("x-nope"),
                     isHeaders: bin.headers instanceof Headers }};
    // The content type a body implies, as the standard fetch sets it.
    await fetch("https://api.test:{}/echo", {{ method: "POST", body: "plain" }});
    await fetch("https://api.test:{}/echo", {{ method: "POST", body: new URLSearchParams({{ a: "1" }}) }});
    await fetch("https://api.test:{}/echo", {{ method: "POST", body: "{{}}", headers: {{ "Content-Type": "application/json" }} }});
    return {{ status: r.status, leaked: seen.includes("{SECRET}"), redacted: text.includes("[redacted]"),
             echoed: r.headers.get("x-echo-auth"), refused, misdirected, binary, badTimeouts }};
  }}
}};"#,
        rig.https, rig.http, rig.https, rig.https, rig.https, rig.https, rig.https, rig.https
    );
    let manifest = json!({ "kind": "js", "code": source, "config": kit_config() });
    let r = rig.api.deploy_manifest("jsfetch", &manifest).await;
    assert_eq!(r.status, 201, "{}", r.json);
    let r = rig.api.post_json("/v1/actors/jsfetch/a", &json!({})).await;
    assert_eq!(r.status, 200, "{}", r.json);
    assert_eq!(r.json["status"], 200);
    assert_eq!(r.json["leaked"], false, "{}", r.json);
    assert_eq!(r.json["redacted"], true);
    assert_eq!(
        r.json["badTimeouts"],
        json!([true, true, true, true, true]),
        "{}",
        r.json
    );
    assert_eq!(r.json["echoed"], "Bearer [redacted]", "{}", r.json);
    assert_eq!(
        r.json["binary"],
        json!({"length": 259, "head": [255, 0, 128, 0], "last": 255,
               "type": "application/octet-stream", "missing": null, "isHeaders": true}),
        "{}",
        r.json
    );
    assert!(
        r.json["misdirected"]
            .as_str()
            .unwrap_or("")
            .contains("may only be sent over https to api.test"),
        "{}",
        r.json
    );
    assert!(
        r.json["refused"]
            .as_str()
            .unwrap_or("")
            .contains("does not allow"),
        "{}",
        r.json
    );
    assert_eq!(
        rig.seen.header(0, "authorization").as_deref(),
        Some(format!("Bearer {SECRET}").as_str())
    );
    for (i, want) in [
        (1, None),
        (2, Some("text/plain;charset=UTF-8")),
        (3, Some("application/x-www-form-urlencoded;charset=UTF-8")),
        (4, Some("application/json")),
    ] {
        assert_eq!(
            rig.seen.header(i, "content-type").as_deref(),
            want,
            "request {i}"
        );
    }
    // The idempotency key is 32 hex digits, the same when the same call of
    // the same turn runs again.
    let key = rig.seen.header(0, "idempotency-key").unwrap();
    assert_eq!(key.len(), 32, "{key}");
    assert!(key.bytes().all(|b| b.is_ascii_hexdigit()));
    // Nor in the JavaScript turn's trace.
    let exports = rig.traces.settled(1).await;
    assert!(!exports.iter().any(|b| holds(b, SECRET)));
}
