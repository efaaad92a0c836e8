//! `marmot:actor/http`: outbound requests to the hosts a type allows, with
//! secrets substituted outside the sandbox.
//!
//! A request is checked before a byte is sent: its method and host against
//! the type's `allowed_methods` and `allowed_hosts`, every
//! `{{secret:NAME}}` placeholder in a header value against the type's
//! `secrets` and the secret's own hosts (https only). The host then
//! substitutes the values, sends it through the node's [`Egress`] (address
//! policy after DNS, redirects re-checked per hop, capped), and replaces
//! every substituted value that comes back before the guest sees it.
//!
//! A fetch is a side effect outside the turn's transaction: if the turn
//! fails, or the node crashes before it commits, the request was still
//! sent, and a re-run turn sends it again. `{{idempotency-key}}` in a
//! header value becomes a key that is the same for the same call (the
//! n-th fetch of the turn) when the turn runs again, so a receiver that
//! honours it (`Idempotency-Key`) applies the effect once.

mod started;

use std::sync::Arc;
use std::time::Duration;

use sha2::{Digest, Sha256};
use tokio::sync::Semaphore;
use tracing::Instrument;
use url::Url;
use zeroize::Zeroizing;

use super::Cap;
use crate::config::ResolvedHttp;
use crate::egress::{
    Egress, EgressError, HostPattern, OutboundHeader, OutboundRequest, Scrub, StreamingResponse,
    policy,
};
use crate::ids::ActorKey;
use crate::metrics::{HttpLabels, Metrics};
use crate::sandbox::bindings::GuestError;
use crate::sandbox::bindings::marmot::actor::http;
use crate::sandbox::host::Host;
use crate::secrets::{SecretError, SecretStore};

/// The placeholder for a per-call idempotency key.
pub const IDEMPOTENCY_PLACEHOLDER: &str = "{{idempotency-key}}";

/// What one type's turns may reach (from its config), shared by its
/// instances.
pub struct HttpGrant {
    hosts: Vec<HostPattern>,
    methods: Vec<String>,
    secrets: Vec<String>,
    max_redirects: u32,
    /// Bounds the type's requests in flight (a streamed response holds its
    /// permit until its body is dropped).
    permits: Arc<Semaphore>,
    /// Their number.
    concurrency: u32,
}

impl HttpGrant {
    /// The grant a type's resolved config describes; an error names the
    /// bad host pattern.
    pub fn new(http: &ResolvedHttp) -> Result<Self, String> {
        Ok(Self {
            hosts: policy::parse_patterns("config.allowed_hosts", &http.allowed_hosts)?,
            methods: http.allowed_methods.clone(),
            secrets: http.secrets.clone(),
            max_redirects: http.max_redirects,
            permits: Arc::new(Semaphore::new(http.concurrency.max(1) as usize)),
            concurrency: http.concurrency.max(1),
        })
    }

    /// The type's permit for one request, waited for no longer than the
    /// request's own timeout; how long it waited. (The wait had no bound:
    /// 16 slow fetches of a type held a 1 s fetch of another of its
    /// actors for 18 s, found by a probe.)
    async fn permit(
        &self,
        timeout: Duration,
    ) -> Result<(tokio::sync::OwnedSemaphorePermit, Duration), EgressError> {
        place(
            self.permits.clone(),
            timeout,
            "the type's requests were shut",
            || {
                format!(
                    "the type's {} requests in flight (its config.http_concurrency) took the \
                     whole timeout of {} ms: none was sent",
                    self.concurrency,
                    timeout.as_millis()
                )
            },
        )
        .await
    }

    /// How many of one turn's started fetches may be in flight at once: a
    /// quarter of the type's places, so that one actor's `Promise.all`
    /// leaves room for its neighbours.
    fn turn_lanes(&self) -> usize {
        (self.concurrency as usize / 4).max(1)
    }

    /// Whether the type may reach `url`'s host.
    fn allows(&self, url: &Url) -> Result<(), EgressError> {
        let host = url
            .host()
            .ok_or_else(|| EgressError::Refused("the URL has no host".into()))?;
        if policy::any_matches(&self.hosts, &host) {
            return Ok(());
        }
        Err(EgressError::Refused(if self.hosts.is_empty() {
            "this actor type may not make outbound requests (its config.allowed_hosts is empty)"
                .into()
        } else {
            format!("host `{host}` is not in this actor type's config.allowed_hosts")
        }))
    }
}

/// An instance's way out: the node's client and secret store, and its
/// type's grant.
#[derive(Clone)]
pub struct HttpAccess {
    /// The node's outbound client.
    pub egress: Arc<Egress>,
    /// The node's secrets.
    pub secrets: Arc<SecretStore>,
    /// What the type may reach.
    pub grant: Arc<HttpGrant>,
    /// Where requests are counted.
    pub metrics: Arc<Metrics>,
}

/// Most response bodies a turn may have open at once.
const MAX_OPEN_STREAMS: usize = 16;

/// A streamed body, shared by its guest handle and its turn (which closes
/// it when the turn ends, whatever the guest did with the handle).
type StreamSlot = Arc<tokio::sync::Mutex<Option<StreamingResponse>>>;

/// The http part of a turn: how many fetches it made (the index in each
/// idempotency key), the bodies it streams and the fetches it started.
#[derive(Default)]
pub struct HttpCtx {
    fetches: u32,
    open: Vec<StreamSlot>,
    /// Fetches started without waiting, and their answers not yet taken.
    started: started::Started,
}

impl HttpCtx {
    /// Bodies still open (closed ones are forgotten).
    fn open_streams(&mut self) -> usize {
        self.open
            .retain(|s| s.try_lock().map_or(true, |body| body.is_some()));
        self.open.len()
    }
}

impl Drop for HttpCtx {
    /// The turn is over: its response bodies end with it.
    fn drop(&mut self) {
        for slot in &self.open {
            if let Ok(mut s) = slot.try_lock() {
                *s = None;
            }
        }
    }
}

/// `body-stream`: a response body being read. Reading it after its turn
/// ended, or after a read failed, finds it closed.
pub struct BodyStream {
    slot: StreamSlot,
    _permit: tokio::sync::OwnedSemaphorePermit,
}

/// The idempotency key of fetch number `index` of turn `turn_id`.
fn idempotency_key(key: &ActorKey, turn_id: &str, index: u32) -> String {
    let mut h = Sha256::new();
    for part in [key.ty(), key.id(), turn_id] {
        h.update(part.as_bytes());
        h.update([0]);
    }
    h.update(index.to_le_bytes());
    hex::encode(&h.finalize()[..16])
}

/// Substitute the placeholders of one header value. Returns the value and
/// whether it now holds a secret.
fn substitute(
    access: &HttpAccess,
    url: &Url,
    header: &str,
    value: &str,
    idempotency: &str,
    scrub: &mut Scrub,
) -> Result<(Zeroizing<String>, bool), GuestError> {
    let mut out = Zeroizing::new(String::with_capacity(value.len()));
    let mut secret = false;
    let mut rest = value;
    // Text around the placeholders that still holds one, percent-encoded
    // (`%7B%7Bsecret%3AK%7D%7D`), would go out as written.
    let miswritten = |text: &str| {
        if text.contains('%') && crate::egress::holds_secret_placeholder(text.as_bytes()) {
            Err(GuestError::Invalid(format!(
                "header `{header}`: a placeholder is written `{{{{secret:NAME}}}}`, not \
                 percent-encoded; this one would go out as written"
            )))
        } else {
            Ok(())
        }
    };
    while let Some(start) = rest.find("{{") {
        miswritten(&rest[..start])?;
        out.push_str(&rest[..start]);
        let after = &rest[start..];
        if let Some(tail) = after.strip_prefix(IDEMPOTENCY_PLACEHOLDER) {
            out.push_str(idempotency);
            rest = tail;
            continue;
        }
        let Some(inner) = after.strip_prefix("{{secret:") else {
            if crate::egress::opens_secret_placeholder(&after.as_bytes()[2..]) {
                return Err(GuestError::Invalid(format!(
                    "header `{header}`: a placeholder is written `{{{{secret:NAME}}}}`, in lower \
                     case, without spaces or percent-encoding; this one would go out as written"
                )));
            }
            // One brace on: `{{{secret:K}}}` is a brace around a placeholder.
            out.push('{');
            rest = &after[1..];
            continue;
        };
        let Some(end) = inner.find("}}") else {
            return Err(GuestError::Invalid(format!(
                "header `{header}`: `{{{{secret:` without a closing `}}}}`"
            )));
        };
        let name = &inner[..end];
        rest = &inner[end + 2..];
        if !access.grant.secrets.iter().any(|s| s == name) {
            return Err(GuestError::Denied(format!(
                "secret `{name}` is not listed in this actor type's config.secrets"
            )));
        }
        let (value, hosts) = access.secrets.reveal(name).map_err(|e| match e {
            SecretError::NotFound(_) => GuestError::NotFound(format!("no secret `{name}`")),
            e => GuestError::Internal(e.to_string()),
        })?;
        let host = url.host();
        if url.scheme() != "https"
            || !host
                .as_ref()
                .is_some_and(|h| policy::any_matches(&hosts, h))
        {
            let allowed: Vec<String> = hosts.iter().map(ToString::to_string).collect();
            return Err(GuestError::Denied(format!(
                "secret `{name}` may only be sent over https to {}; this request goes to {}://{}",
                allowed.join(", "),
                url.scheme(),
                host.map(|h| h.to_string()).unwrap_or_default()
            )));
        }
        let text = std::str::from_utf8(value.expose()).map_err(|_| {
            GuestError::Invalid(format!(
                "secret `{name}` is not text and cannot go in a header"
            ))
        })?;
        out.push_str(text);
        scrub.add(value.expose());
        secret = true;
    }
    miswritten(rest)?;
    out.push_str(rest);
    Ok((out, secret))
}

/// Headers a guest may not set: the host frames the request (`host` must
/// match the URL the checks saw), and hop-by-hop headers are the
/// connection's business.
const FORBIDDEN_HEADERS: &[&str] = &[
    "host",
    "connection",
    "content-length",
    "transfer-encoding",
    "te",
    "trailer",
    "upgrade",
    "expect",
    "keep-alive",
];

/// A guest's request, checked and with its placeholders substituted.
fn prepare(
    access: &HttpAccess,
    req: http::Request,
    idempotency: &str,
    scrub: &mut Scrub,
) -> Result<OutboundRequest, GuestError> {
    let method = req.method.to_ascii_uppercase();
    if !access.grant.methods.contains(&method) {
        return Err(GuestError::Denied(format!(
            "method {method} is not in this actor type's config.allowed_methods"
        )));
    }
    let url = Url::parse(&req.url)
        .map_err(|e| GuestError::Invalid(format!("`{}` is not a URL: {e}", req.url)))?;
    // It went out as written, naming the secret to the server (found by a
    // probe): a key in a query string is what many APIs ask for, and
    // sending the name instead fails far from the cause.
    if crate::egress::has_secret_placeholder(url.as_str()) {
        return Err(GuestError::Invalid(
            "a `{{secret:NAME}}` placeholder is substituted in header values only, not in \
             the URL: send the key in a header (most APIs take one)"
                .into(),
        ));
    }
    // Nor in a body, in any case (`{"api_key": "{{secret:K}}"}` sent the
    // name to the server: found by a probe), from a type that has secrets
    // to mean (a type with none may well send a text about placeholders).
    if !access.grant.secrets.is_empty()
        && req
            .body
            .as_deref()
            .is_some_and(crate::egress::holds_secret_placeholder)
    {
        return Err(GuestError::Invalid(
            "a `{{secret:NAME}}` placeholder is substituted in header values only, not in \
             the body: send the key in a header (most APIs take one)"
                .into(),
        ));
    }
    access
        .egress
        .check_url(&url)
        .and_then(|()| access.grant.allows(&url))
        .map_err(guest_error)?;
    // A type that holds secrets gets every response checked for all of
    // them (a value stored through one request and read back by another
    // carries no placeholder), so the response must come back whole and
    // uncompressed: no ranges, no content encodings.
    let identity_only = !access.grant.secrets.is_empty();
    for name in &access.grant.secrets {
        if let Ok((value, _)) = access.secrets.reveal(name) {
            scrub.add(value.expose());
        }
        for value in access.secrets.retired(name) {
            scrub.add(&value);
        }
    }
    let mut headers = Vec::with_capacity(req.headers.len());
    for (name, value) in req.headers {
        let lower = name.to_ascii_lowercase();
        if FORBIDDEN_HEADERS.contains(&lower.as_str()) || lower.starts_with("proxy-") {
            return Err(GuestError::Invalid(format!(
                "header `{name}` is set by the host, not the guest"
            )));
        }
        if identity_only && (lower == "range" || lower == "if-range") {
            return Err(GuestError::Denied(format!(
                "header `{name}` is not allowed for a type that uses secrets: \
                 a partial response could carry part of one"
            )));
        }
        let (value, secret) = substitute(access, &url, &name, &value, idempotency, scrub)?;
        headers.push(OutboundHeader {
            name,
            value,
            secret,
        });
    }
    let config = access.egress.config();
    let timeout = req
        .timeout_ms
        .map_or(config.timeout_ms, u64::from)
        .clamp(1, config.max_timeout_ms);
    Ok(OutboundRequest {
        method: reqwest::Method::from_bytes(method.as_bytes())
            .map_err(|_| GuestError::Invalid(format!("`{method}` is not an HTTP method")))?,
        url,
        headers,
        body: req.body,
        timeout: Duration::from_millis(timeout),
        max_redirects: access.grant.max_redirects,
        identity_only,
    })
}

/// Count a request's outcome (`ok`, or what [`outcome`] names), and log
/// why one was not completed.
fn record(
    access: &HttpAccess,
    key: &ActorKey,
    started: std::time::Instant,
    outcome: &'static str,
    error: Option<&GuestError>,
) {
    access
        .metrics
        .http_requests
        .get_or_create(&HttpLabels { outcome })
        .inc();
    access
        .metrics
        .http_request_seconds
        .observe(started.elapsed().as_secs_f64());
    if let Some(e) = error {
        // Refusals and errors are built by the host or scrubbed: no value
        // of a secret is in them.
        tracing::info!(actor = %key, outcome, error = ?e, "outbound request not completed");
    }
}

/// The metric label of a request that failed in the egress layer.
fn outcome(e: &EgressError) -> &'static str {
    match e {
        EgressError::Refused(_) => "refused",
        EgressError::Invalid(_) => "invalid",
        EgressError::TooLarge(_) => "too_large",
        EgressError::Timeout(_) => "timeout",
        EgressError::Overloaded(_) => "overloaded",
        EgressError::Failed(_) => "failed",
    }
}

/// The metric label of a request refused while it was prepared.
fn prepare_outcome(e: &GuestError) -> &'static str {
    match e {
        GuestError::Denied(_) => "refused",
        GuestError::LimitExceeded(_) => "too_large",
        _ => "invalid",
    }
}

fn guest_error(e: EgressError) -> GuestError {
    match e {
        EgressError::Refused(m) => GuestError::Denied(m),
        EgressError::Invalid(m) => GuestError::Invalid(m),
        EgressError::TooLarge(m) => GuestError::LimitExceeded(m),
        // The node's own bound (its response budget): a later try may fit.
        EgressError::Overloaded(m) => GuestError::LimitExceeded(m),
        e @ (EgressError::Timeout(_) | EgressError::Failed(_)) => {
            GuestError::Internal(e.to_string())
        }
    }
}

/// A fetch [`Host::begin_fetch`] checked, ready to send.
struct Begun {
    access: HttpAccess,
    request: OutboundRequest,
    scrub: Scrub,
    key: ActorKey,
    started: std::time::Instant,
    /// The most body bytes the guest is handed.
    cap: usize,
}

impl Host {
    /// The start of every fetch: the grant, the call's idempotency key,
    /// and the checked request with its placeholders substituted, with
    /// what sending needs besides; a refusal is counted.
    fn begin_fetch(&mut self, req: http::Request) -> wasmtime::Result<Result<Begun, GuestError>> {
        let started = std::time::Instant::now();
        let access = self.http.clone();
        let turn = self.enter(Cap::Http)?;
        let key = turn.key.clone();
        let Some(access) = access else {
            return Ok(Err(GuestError::Unsupported(
                "outbound HTTP is not available in this sandbox".into(),
            )));
        };
        let index = turn.http.fetches;
        turn.http.fetches += 1;
        let idempotency = idempotency_key(&turn.key, &turn.turn_id, index);
        let mut scrub = Scrub::default();
        let request = match prepare(&access, req, &idempotency, &mut scrub) {
            Ok(request) => request,
            Err(e) => {
                record(&access, &key, started, prepare_outcome(&e), Some(&e));
                return Ok(Err(e));
            }
        };
        Ok(Ok(Begun {
            access,
            request,
            scrub,
            key,
            started,
            cap: self.body_cap(),
        }))
    }

    /// The most body bytes one fetch hands the guest. A body the guest's
    /// memory cannot take trapped it (a 12 MB body in a JavaScript actor's
    /// 32 MiB, found by a probe), which it cannot catch: it fails as a
    /// fetch instead, past a share of the memory limit: the body is copied
    /// into it, and a script makes a string of it too (a third: 12 MB took
    /// 2.4 times as much); half for other guests. (Of the limit, not of
    /// what the memory may still grow by: memory grown once is free again
    /// inside.)
    fn body_cap(&self) -> usize {
        let share = if self.js_module.is_some() { 3 } else { 2 };
        self.limits.max_memory() / share
    }
}

impl Begun {
    /// Send it and read the answer, within the request's timeout (the
    /// waits for one of the turn's `lanes`, if it started side by side,
    /// and for the type's permit included); counted.
    async fn send(self, lanes: Option<Arc<Semaphore>>) -> Result<http::Response, GuestError> {
        let Begun {
            access,
            mut request,
            scrub,
            key,
            started,
            cap,
        } = self;
        // What is left of the request's timeout after a wait.
        let left = |timeout: Duration, waited| {
            timeout.saturating_sub(waited).max(Duration::from_millis(1))
        };
        let sent = async {
            let _lane = match lanes {
                Some(lanes) => {
                    let free = lanes.available_permits();
                    let timeout = request.timeout;
                    let (lane, waited) =
                        place(lanes, timeout, "the turn's requests were shut", || {
                            format!(
                                "this turn's fetches in flight (a quarter of its type's \
                                 config.http_concurrency; {free} free when this one started) \
                                 took the whole timeout of {} ms: none was sent",
                                timeout.as_millis()
                            )
                        })
                        .await?;
                    request.timeout = left(request.timeout, waited);
                    Some(lane)
                }
                None => None,
            };
            let (_permit, waited) = access.grant.permit(request.timeout).await?;
            request.timeout = left(request.timeout, waited);
            let grant = access.grant.clone();
            let allowed = move |url: &Url| grant.allows(url);
            let why = "a share of this actor's memory limit, config.max_memory_bytes: \
                       raise that, or from Rust read the body with fetch-stream";
            access
                .egress
                .fetch_within(request, &allowed, &scrub, Some((cap, why)))
                .await
        }
        .await;
        match sent {
            Ok(r) => {
                record(&access, &key, started, "ok", None);
                Ok(http::Response {
                    status: r.status,
                    headers: r.headers,
                    body: r.body,
                })
            }
            Err(e) => {
                let label = outcome(&e);
                let e = guest_error(e);
                record(&access, &key, started, label, Some(&e));
                Err(e)
            }
        }
    }
}

/// One of `places` (the type's, or a turn's for its fetches side by side),
/// waited for no longer than `timeout`; how long it waited. `shut` says
/// why none can come, `full` why none came in time.
async fn place(
    places: Arc<Semaphore>,
    timeout: Duration,
    shut: &str,
    full: impl FnOnce() -> String,
) -> Result<(tokio::sync::OwnedSemaphorePermit, Duration), EgressError> {
    let started = std::time::Instant::now();
    match tokio::time::timeout(timeout, places.acquire_owned()).await {
        Ok(Ok(permit)) => Ok((permit, started.elapsed())),
        Ok(Err(_)) => Err(EgressError::Failed(shut.into())),
        Err(_) => Err(EgressError::Overloaded(full())),
    }
}

impl http::Host for Host {
    async fn fetch(
        &mut self,
        req: http::Request,
    ) -> wasmtime::Result<Result<http::Response, GuestError>> {
        Ok(match self.begin_fetch(req)? {
            Ok(begun) => begun.send(None).await,
            Err(e) => Err(e),
        })
    }

    async fn start(&mut self, req: http::Request) -> wasmtime::Result<Result<u32, GuestError>> {
        let body = req.body.as_ref().map_or(0, Vec::len);
        let max_bodies = self.limits.max_memory();
        let started = &self.enter(Cap::Http)?.http.started;
        if started.len() >= started::MAX_STARTED {
            return Ok(Err(GuestError::LimitExceeded(format!(
                "a turn may have at most {} fetches started and not finished",
                started::MAX_STARTED
            ))));
        }
        let held = started.body_bytes();
        if held.saturating_add(body) > max_bodies {
            return Ok(Err(GuestError::LimitExceeded(format!(
                "the fetches under way hold {held} bytes of request bodies; with this one's \
                 {body} that passes this actor's memory limit ({max_bodies} bytes, \
                 config.max_memory_bytes): await some first"
            ))));
        }
        let begun = match self.begin_fetch(req)? {
            Ok(begun) => begun,
            Err(e) => return Ok(Err(e)),
        };
        let lanes = begun.access.grant.turn_lanes();
        let turn = self.enter(Cap::Http)?;
        let (handle, report, lanes) = turn.http.started.next(lanes);
        let task = tokio::spawn(
            async move {
                let _ = report.send((handle, begun.send(Some(lanes)).await));
            }
            .instrument(tracing::Span::current()),
        );
        turn.http
            .started
            .under_way(handle, task.abort_handle(), body);
        Ok(Ok(handle))
    }

    async fn wait_any(
        &mut self,
        handles: Vec<u32>,
        timeout_ms: Option<u32>,
    ) -> wasmtime::Result<Option<u32>> {
        let started = &mut self.enter(Cap::Http)?.http.started;
        let timeout = timeout_ms.map(|ms| Duration::from_millis(ms.into()));
        Ok(started.wait_any(&handles, timeout).await)
    }

    async fn finish(
        &mut self,
        handle: u32,
    ) -> wasmtime::Result<Result<http::Response, GuestError>> {
        let cap = self.body_cap();
        Ok(self
            .enter(Cap::Http)?
            .http
            .started
            .finish(handle, cap)
            .await)
    }

    async fn fetch_stream(
        &mut self,
        req: http::Request,
    ) -> wasmtime::Result<Result<http::StreamedResponse, GuestError>> {
        let open = self.enter(Cap::Http)?.http.open_streams();
        if open >= MAX_OPEN_STREAMS {
            return Ok(Err(GuestError::LimitExceeded(format!(
                "a turn may stream at most {MAX_OPEN_STREAMS} response bodies at once"
            ))));
        }
        let Begun {
            access,
            request,
            scrub,
            key,
            started,
            cap: _,
        } = match self.begin_fetch(req)? {
            Ok(begun) => begun,
            Err(e) => return Ok(Err(e)),
        };
        // A stream's timeout bounds the wait for a place, then its head
        // and each of its chunks (not shortened by the wait: it is the
        // longest gap between chunks too).
        let opened = match access.grant.permit(request.timeout).await {
            Ok((permit, _)) => {
                let grant = access.grant.clone();
                let allowed = move |url: &Url| grant.allows(url);
                let opened = access.egress.fetch_stream(request, &allowed, scrub).await;
                opened.map(|r| (r, permit))
            }
            Err(e) => Err(e),
        };
        let (resp, permit) = match opened {
            Ok(r) => {
                record(&access, &key, started, "ok", None);
                r
            }
            Err(e) => {
                let label = outcome(&e);
                let e = guest_error(e);
                record(&access, &key, started, label, Some(&e));
                return Ok(Err(e));
            }
        };
        let (status, headers) = (resp.status, resp.headers.clone());
        let slot: StreamSlot = Arc::new(tokio::sync::Mutex::new(Some(resp)));
        self.enter(Cap::Http)?.http.open.push(slot.clone());
        let body = self.table.push(BodyStream {
            slot,
            _permit: permit,
        })?;
        Ok(Ok(http::StreamedResponse {
            status,
            headers,
            body,
        }))
    }
}

impl http::HostBodyStream for Host {
    async fn read(
        &mut self,
        stream: wasmtime::component::Resource<BodyStream>,
        max: u32,
    ) -> wasmtime::Result<Result<Option<Vec<u8>>, GuestError>> {
        self.enter(Cap::Http)?;
        let slot = self.table.get(&stream)?.slot.clone();
        let mut guard = slot.lock().await;
        let Some(body) = guard.as_mut() else {
            return Ok(Err(GuestError::Invalid(
                "this response body is closed (its turn ended, or a read failed)".into(),
            )));
        };
        let max = (max as usize).clamp(1, 1 << 20);
        match body.next(max).await {
            Ok(chunk) => Ok(Ok(chunk)),
            Err(e) => {
                *guard = None;
                Ok(Err(guest_error(e)))
            }
        }
    }

    async fn drop(
        &mut self,
        stream: wasmtime::component::Resource<BodyStream>,
    ) -> wasmtime::Result<()> {
        let body = self.table.delete(stream)?;
        *body.slot.lock().await = None;
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn idempotency_keys_are_stable_per_call_and_distinct_across_calls() {
        let a = ActorKey::new("t", "a").unwrap();
        let k = idempotency_key(&a, "m1", 0);
        assert_eq!(k, idempotency_key(&a, "m1", 0));
        assert_eq!(k.len(), 32);
        assert_ne!(k, idempotency_key(&a, "m1", 1));
        assert_ne!(k, idempotency_key(&a, "m2", 0));
        assert_ne!(
            k,
            idempotency_key(&ActorKey::new("t", "b").unwrap(), "m1", 0)
        );
    }
}
