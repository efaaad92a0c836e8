//! The one HTTP client guests' requests leave through.
//!
//! TLS is rustls with the webpki roots (plus `[egress] extra_ca_file`);
//! proxies from the environment are ignored; names resolve through the
//! policy resolver; an IP literal is checked before anything is sent.
//! Redirects are followed only as far as the caller allows, each hop
//! checked like the first, and headers that carried secrets (and
//! `authorization`, `cookie`) are dropped when a hop leaves the origin.
//! What comes back is capped, and every secret value in it is replaced
//! before the caller sees it.

use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use reqwest::header::{HeaderName, HeaderValue};
use url::Url;
use zeroize::Zeroizing;

use super::budget::{ResponseBudget, ResponseCharge};
use super::policy::AddressPolicy;
use super::resolve::{AddressRefused, PolicyResolver};
use crate::config::EgressConfig;

/// One header of an outbound request.
pub struct OutboundHeader {
    /// Its name.
    pub name: String,
    /// Its value, with placeholders already substituted.
    pub value: Zeroizing<String>,
    /// It holds a secret: never sent past the request's first origin.
    pub secret: bool,
}

/// An outbound request, checked against the caller's allow-list already.
pub struct OutboundRequest {
    /// The method.
    pub method: reqwest::Method,
    /// Where it goes.
    pub url: Url,
    /// Its headers.
    pub headers: Vec<OutboundHeader>,
    /// Its body.
    pub body: Option<Vec<u8>>,
    /// Whole-request timeout (all hops, body included).
    pub timeout: Duration,
    /// Redirects to follow.
    pub max_redirects: u32,
    /// Ask for an uncompressed response and refuse a compressed one: what
    /// comes back must be checkable for secrets.
    pub identity_only: bool,
}

/// A response, capped and scrubbed.
#[derive(Debug)]
pub struct OutboundResponse {
    /// Status.
    pub status: u16,
    /// Headers (values that are not text are dropped).
    pub headers: Vec<(String, String)>,
    /// Body.
    pub body: Vec<u8>,
    /// The body's charge against the node's response budget, given back
    /// when the response is dropped (so keep the response, not only its
    /// body, until the body is handed on).
    _charge: ResponseCharge,
}

/// Why an outbound request failed. Messages are scrubbed, never hold a
/// URL's credentials, and never show where a redirect pointed.
#[derive(Debug, thiserror::Error)]
pub enum EgressError {
    /// A rule refused it before anything was sent.
    #[error("{0}")]
    Refused(String),
    /// Malformed (a bad header, a bad redirect).
    #[error("{0}")]
    Invalid(String),
    /// The request or its response is larger than allowed.
    #[error("{0}")]
    TooLarge(String),
    /// It took longer than its timeout.
    #[error("the request timed out after {0} ms")]
    Timeout(u64),
    /// The node holds as many response bodies as it may; retry later.
    #[error("{0}")]
    Overloaded(String),
    /// The connection or the exchange failed.
    #[error("{0}")]
    Failed(String),
}

impl EgressError {
    /// The same error with every secret value in its message replaced.
    fn scrubbed(self, scrub: &Scrub) -> Self {
        if scrub.is_empty() {
            return self;
        }
        match self {
            Self::Refused(m) => Self::Refused(scrub.text(m)),
            Self::Invalid(m) => Self::Invalid(scrub.text(m)),
            Self::TooLarge(m) => Self::TooLarge(scrub.text(m)),
            Self::Overloaded(m) => Self::Overloaded(scrub.text(m)),
            Self::Failed(m) => Self::Failed(scrub.text(m)),
            e @ Self::Timeout(_) => e,
        }
    }
}

/// Replaces secret values in what comes back. Values match regardless of
/// ASCII case: a URL parser lowercases a host, so a value a server put in
/// a redirect's host comes back lowercased.
#[derive(Clone, Default)]
pub struct Scrub {
    needles: Vec<Zeroizing<Vec<u8>>>,
}

/// What a scrubbed secret is replaced with.
pub const REDACTED: &str = "[redacted]";

impl Scrub {
    /// Also replace `value`.
    pub fn add(&mut self, value: &[u8]) {
        if !value.is_empty() && !self.needles.iter().any(|n| n.eq_ignore_ascii_case(value)) {
            self.needles.push(Zeroizing::new(value.to_vec()));
            // Longest first: a value that contains another is replaced
            // whole, not around the shorter one.
            self.needles.sort_by_key(|n| std::cmp::Reverse(n.len()));
        }
    }

    /// Whether there is anything to replace.
    pub fn is_empty(&self) -> bool {
        self.needles.is_empty()
    }

    /// Whether `url` carries a secret value, as it is or percent-decoded.
    pub fn found_in_url(&self, url: &Url) -> bool {
        let raw = url.as_str().as_bytes();
        let decoded: Vec<u8> = percent_encoding::percent_decode(raw).collect();
        self.needles
            .iter()
            .any(|n| contains(raw, n) || contains(&decoded, n))
    }

    /// `bytes` with every secret value replaced.
    ///
    /// A text that ends with the start of a value, half of it or more
    /// (and at least [`PARTIAL_SECRET`] bytes: an answer cut off by
    /// `max_tokens` mid-key, a stream that ended there), has that start
    /// replaced too: that much of a key is worth keeping. (Redacted in the live preview only, it was
    /// kept in the stored answer.)
    pub fn bytes(&self, bytes: Vec<u8>) -> Vec<u8> {
        let mut out = self.whole_values(bytes);
        if let Some(at) = self.cut_tail(&out) {
            out.truncate(at);
            out.extend_from_slice(REDACTED.as_bytes());
        }
        out
    }

    /// Where the start of a value that `bytes` ends with begins, if
    /// enough of it is there.
    fn cut_tail(&self, bytes: &[u8]) -> Option<usize> {
        let longest = self.needles.first().map_or(0, |n| n.len());
        let from = bytes.len().saturating_sub(longest);
        (from..bytes.len()).find(|&i| {
            let tail = bytes.len() - i;
            self.needles.iter().any(|n| {
                tail < n.len()
                    && tail >= PARTIAL_SECRET.max(n.len() / 2)
                    && starts_with(n, &bytes[i..])
            })
        })
    }

    /// `bytes` with every whole value replaced.
    fn whole_values(&self, bytes: Vec<u8>) -> Vec<u8> {
        let mut out = bytes;
        for needle in &self.needles {
            if out.len() < needle.len() || !contains(&out, needle) {
                continue;
            }
            let mut next = Vec::with_capacity(out.len());
            let mut i = 0;
            while i < out.len() {
                if starts_with(&out[i..], needle) {
                    next.extend_from_slice(REDACTED.as_bytes());
                    i += needle.len();
                } else {
                    next.push(out[i]);
                    i += 1;
                }
            }
            out = next;
        }
        out
    }

    /// `text` with every secret value replaced.
    pub fn text(&self, text: String) -> String {
        match String::from_utf8(self.bytes(text.into_bytes())) {
            Ok(s) => s,
            Err(e) => String::from_utf8_lossy(e.as_bytes()).into_owned(),
        }
    }
}

/// The shortest start of a secret cut off at a text's end that is
/// replaced rather than kept: half the secret, and at least this (a key's
/// public prefix, `sk-proj-`, is 8 bytes, and a text may well end with it).
const PARTIAL_SECRET: usize = 12;

/// [`Scrub`] over a body that arrives in chunks: a value split across two
/// chunks is replaced too, because a chunk's tail that could be the start
/// of a value waits for the next one.
pub struct StreamScrub {
    scrub: Scrub,
    pending: Vec<u8>,
}

impl StreamScrub {
    /// Scrub a stream with `scrub`'s values.
    pub fn new(scrub: Scrub) -> Self {
        Self {
            scrub,
            pending: Vec::new(),
        }
    }

    /// Add `chunk`; returns what can be released now. Only what could be
    /// the start of a value is held back: the tail from the first place
    /// where the rest of the buffer is a proper prefix of one. (It used to
    /// hold back the last `longest value − 1` bytes whatever they were:
    /// with a real key of 100–170 characters, a keyed provider's answer
    /// streamed nothing live until that much more text had come.)
    pub fn push(&mut self, chunk: &[u8]) -> Vec<u8> {
        if self.scrub.needles.is_empty() {
            return chunk.to_vec();
        }
        self.pending.extend_from_slice(chunk);
        let buf = std::mem::take(&mut self.pending);
        let mut out = Vec::with_capacity(buf.len());
        let mut i = 0;
        'scan: while i < buf.len() {
            let rest = &buf[i..];
            // Longest first: a value that may still grow into a longer
            // one waits rather than being replaced around it.
            for needle in &self.scrub.needles {
                if starts_with(rest, needle) {
                    out.extend_from_slice(REDACTED.as_bytes());
                    i += needle.len();
                    continue 'scan;
                }
                if rest.len() < needle.len() && starts_with(needle, rest) {
                    break 'scan;
                }
            }
            out.push(buf[i]);
            i += 1;
        }
        self.pending = buf[i..].to_vec();
        out
    }

    /// The end of the stream: release what was held back. What was held
    /// may be the start of a value cut off by the end (a provider echoing
    /// a key when the connection dropped): [`Scrub::bytes`] replaces it
    /// if enough of it is there.
    pub fn finish(&mut self) -> Vec<u8> {
        self.scrub.bytes(std::mem::take(&mut self.pending))
    }
}

/// [`StreamScrub`] over text that arrives in pieces (a model's answer,
/// delta by delta): what it releases always ends on a character boundary.
pub struct TextStreamScrub {
    bytes: StreamScrub,
    /// Released bytes that end in the middle of a character.
    partial: Vec<u8>,
}

impl TextStreamScrub {
    /// Scrub a text stream with `scrub`'s values.
    pub fn new(scrub: Scrub) -> Self {
        Self {
            bytes: StreamScrub::new(scrub),
            partial: Vec::new(),
        }
    }

    /// Add `piece`; returns what can be released now (maybe nothing).
    pub fn push(&mut self, piece: &str) -> String {
        let out = self.bytes.push(piece.as_bytes());
        self.release(out, false)
    }

    /// The end of the stream: release what was held back.
    pub fn finish(&mut self) -> String {
        let out = self.bytes.finish();
        self.release(out, true)
    }

    fn release(&mut self, out: Vec<u8>, last: bool) -> String {
        self.partial.extend_from_slice(&out);
        let whole = match std::str::from_utf8(&self.partial) {
            Ok(_) => self.partial.len(),
            Err(e) if e.error_len().is_none() && !last => e.valid_up_to(),
            Err(_) => self.partial.len(),
        };
        let rest = self.partial.split_off(whole);
        let text = std::mem::replace(&mut self.partial, rest);
        match String::from_utf8(text) {
            Ok(t) => t,
            Err(e) => String::from_utf8_lossy(e.as_bytes()).into_owned(),
        }
    }
}

/// A response whose body is read as it arrives, scrubbed and capped.
pub struct StreamingResponse {
    /// Status.
    pub status: u16,
    /// Headers (scrubbed).
    pub headers: Vec<(String, String)>,
    resp: Option<reqwest::Response>,
    scrub: StreamScrub,
    /// Scrubbed bytes not yet handed out.
    ready: Vec<u8>,
    /// Bytes that may still arrive before the cap.
    remaining: usize,
    /// Longest wait for the next chunk.
    idle: Duration,
    /// How the body ended, once what arrived before has been handed out.
    failed: Option<EgressError>,
}

impl StreamingResponse {
    /// The next at most `max` bytes of the body (`None` at its end). When
    /// the connection fails, what arrived before the failure (and the
    /// scrubber held back) comes out first, then the error: a stream cut
    /// after its last event is complete to its reader. (Held-back bytes
    /// were dropped, so a keyed provider's `[DONE]` before a TLS close
    /// without `close_notify` was never seen, and the answer was retried
    /// and paid for again.)
    pub async fn next(&mut self, max: usize) -> Result<Option<Vec<u8>>, EgressError> {
        let max = max.max(1);
        while self.ready.is_empty() {
            if let Some(e) = self.failed.take() {
                return Err(e);
            }
            let Some(resp) = self.resp.as_mut() else {
                return Ok(None);
            };
            let chunk = match tokio::time::timeout(self.idle, resp.chunk()).await {
                Err(_) => Err(EgressError::Timeout(self.idle.as_millis() as u64)),
                Ok(r) => r.map_err(|e| transport_error(&e, &self.scrub.scrub)),
            };
            let chunk = match chunk {
                Ok(c) => c,
                Err(e) => {
                    self.resp = None;
                    self.ready = self.scrub.finish();
                    self.failed = Some(e);
                    continue;
                }
            };
            match chunk {
                Some(c) => {
                    if c.len() > self.remaining {
                        self.resp = None;
                        return Err(EgressError::TooLarge(
                            "the response body is larger than this node allows".into(),
                        ));
                    }
                    self.remaining -= c.len();
                    self.ready = self.scrub.push(&c);
                }
                None => {
                    self.resp = None;
                    self.ready = self.scrub.finish();
                    if self.ready.is_empty() {
                        return Ok(None);
                    }
                }
            }
        }
        let n = max.min(self.ready.len());
        let rest = self.ready.split_off(n);
        Ok(Some(std::mem::replace(&mut self.ready, rest)))
    }
}

/// Whether `hay` holds `needle`, ignoring ASCII case.
fn contains(hay: &[u8], needle: &[u8]) -> bool {
    hay.windows(needle.len())
        .any(|w| w.eq_ignore_ascii_case(needle))
}

/// Whether `hay` starts with `needle`, ignoring ASCII case.
fn starts_with(hay: &[u8], needle: &[u8]) -> bool {
    hay.get(..needle.len())
        .is_some_and(|h| h.eq_ignore_ascii_case(needle))
}

/// The node's outbound HTTP client.
pub struct Egress {
    client: reqwest::Client,
    policy: Arc<AddressPolicy>,
    config: EgressConfig,
    /// What buffered response bodies may hold, shared by the node's clients.
    responses: Arc<ResponseBudget>,
}

impl Egress {
    /// A client for `config`.
    pub fn new(config: &EgressConfig) -> anyhow::Result<Self> {
        let policy =
            Arc::new(AddressPolicy::new(&config.allow_private).map_err(anyhow::Error::msg)?);
        let mut builder = reqwest::Client::builder()
            .use_rustls_tls()
            .tls_built_in_root_certs(true)
            .no_proxy()
            .redirect(reqwest::redirect::Policy::none())
            .connect_timeout(Duration::from_millis(config.connect_timeout_ms))
            .pool_idle_timeout(Duration::from_secs(30))
            .user_agent(concat!("marmot/", env!("CARGO_PKG_VERSION")))
            .dns_resolver(Arc::new(PolicyResolver::new(
                policy.clone(),
                &config.nameservers,
            )));
        if let Some(path) = &config.extra_ca_file {
            let pem = std::fs::read(path)
                .map_err(|e| anyhow::anyhow!("egress.extra_ca_file `{}`: {e}", path.display()))?;
            for cert in reqwest::Certificate::from_pem_bundle(&pem)
                .map_err(|e| anyhow::anyhow!("egress.extra_ca_file `{}`: {e}", path.display()))?
            {
                builder = builder.add_root_certificate(cert);
            }
        }
        Ok(Self {
            client: builder.build()?,
            policy,
            config: config.clone(),
            responses: ResponseBudget::unbounded(),
        })
    }

    /// Charge buffered response bodies to `budget` (the node's, shared
    /// with its other clients) instead of none.
    pub fn with_response_budget(mut self, budget: Arc<ResponseBudget>) -> Self {
        self.responses = budget;
        self
    }

    /// The node's egress settings.
    pub fn config(&self) -> &EgressConfig {
        &self.config
    }

    /// Whether `url` may be reached at all: http or https, with a host,
    /// and an IP literal host must pass the address policy (names are
    /// judged when resolved).
    pub fn check_url(&self, url: &Url) -> Result<(), EgressError> {
        if !matches!(url.scheme(), "http" | "https") {
            return Err(EgressError::Refused(format!(
                "only http and https URLs may be fetched, not {}:",
                url.scheme()
            )));
        }
        if !url.username().is_empty() || url.password().is_some() {
            return Err(EgressError::Refused(
                "URLs with credentials are not allowed; send them in a header".into(),
            ));
        }
        if url.host().is_none() {
            return Err(EgressError::Refused("the URL has no host".into()));
        }
        match self.refused_address(url) {
            Some((ip, class)) => Err(EgressError::Refused(format!(
                "{ip} is {class} and this node does not allow it"
            ))),
            None => Ok(()),
        }
    }

    /// An IP literal host the address policy refuses, and its class.
    fn refused_address(&self, url: &Url) -> Option<(std::net::IpAddr, &'static str)> {
        let ip = match url.host()? {
            url::Host::Ipv4(ip) => std::net::IpAddr::V4(ip),
            url::Host::Ipv6(ip) => std::net::IpAddr::V6(ip),
            url::Host::Domain(_) => return None,
        };
        super::resolve::check(&self.policy, &ip.to_string(), &[ip])
            .err()
            .map(|e| (ip, e.class.label()))
    }

    /// Why a redirect's target was refused, in words that do not show it:
    /// the server chose it, and may have put in it what the request sent
    /// (a header reflected into `Location`).
    fn redirect_refused(&self, hop: u32, url: &Url) -> EgressError {
        let why = if !matches!(url.scheme(), "http" | "https") {
            "its scheme is not http or https".to_owned()
        } else if !url.username().is_empty() || url.password().is_some() {
            "it carries credentials".to_owned()
        } else if url.host().is_none() {
            "it has no host".to_owned()
        } else if let Some((_, class)) = self.refused_address(url) {
            format!("its address is {class} and this node does not allow it")
        } else {
            "its host is not in this actor type's config.allowed_hosts".to_owned()
        };
        EgressError::Refused(format!(
            "redirect {hop} was refused: {why} (the target is not shown: the server chose it)"
        ))
    }

    /// Send `req`, following redirects that `allowed` accepts, and read the
    /// response (at most `egress.max_response_bytes`), scrubbed with `scrub`.
    pub async fn fetch(
        &self,
        req: OutboundRequest,
        allowed: &(dyn Fn(&Url) -> Result<(), EgressError> + Sync),
        scrub: &Scrub,
    ) -> Result<OutboundResponse, EgressError> {
        let timeout = req.timeout;
        let ms = timeout.as_millis() as u64;
        let deadline = tokio::time::Instant::now() + timeout;
        let whole = async {
            let resp = self.fetch_hops(req, allowed, scrub).await?;
            self.read(resp, scrub, deadline).await
        };
        match tokio::time::timeout_at(deadline, whole).await {
            Ok(r) => r.map_err(|e| e.scrubbed(scrub)),
            Err(_) => Err(EgressError::Timeout(ms)),
        }
    }

    /// Like [`fetch`](Self::fetch), but the body is read as it arrives:
    /// the timeout bounds the wait for the response's head, and then each
    /// wait for the next chunk.
    pub async fn fetch_stream(
        &self,
        req: OutboundRequest,
        allowed: &(dyn Fn(&Url) -> Result<(), EgressError> + Sync),
        scrub: Scrub,
    ) -> Result<StreamingResponse, EgressError> {
        let timeout = req.timeout;
        let resp = tokio::time::timeout(timeout, self.fetch_hops(req, allowed, &scrub))
            .await
            .map_err(|_| EgressError::Timeout(timeout.as_millis() as u64))?
            .map_err(|e| e.scrubbed(&scrub))?;
        let max = self.config.max_response_bytes;
        if resp.content_length().is_some_and(|n| n > max as u64) {
            return Err(EgressError::TooLarge(format!(
                "the response body is larger than {max} bytes"
            )));
        }
        Ok(StreamingResponse {
            status: resp.status().as_u16(),
            headers: scrubbed_headers(&resp, &scrub),
            resp: Some(resp),
            scrub: StreamScrub::new(scrub),
            ready: Vec::new(),
            remaining: max,
            idle: timeout,
            failed: None,
        })
    }

    /// Send `req` and follow the redirects it may; the final response.
    async fn fetch_hops(
        &self,
        req: OutboundRequest,
        allowed: &(dyn Fn(&Url) -> Result<(), EgressError> + Sync),
        scrub: &Scrub,
    ) -> Result<reqwest::Response, EgressError> {
        if req
            .body
            .as_ref()
            .is_some_and(|b| b.len() > self.config.max_request_bytes)
        {
            return Err(EgressError::TooLarge(format!(
                "a request body may be at most {} bytes",
                self.config.max_request_bytes
            )));
        }
        let OutboundRequest {
            mut method,
            mut url,
            mut headers,
            body,
            max_redirects,
            identity_only,
            ..
        } = req;
        if identity_only {
            headers.retain(|h| !h.name.eq_ignore_ascii_case("accept-encoding"));
            headers.push(OutboundHeader {
                name: "accept-encoding".into(),
                value: Zeroizing::new("identity".into()),
                secret: false,
            });
        }
        // Shared by every hop's request, not copied per hop.
        let mut body = body.map(Bytes::from);
        let origin = url.origin();
        let mut hops = 0;
        loop {
            if let Err(e) = self.check_url(&url).and_then(|()| allowed(&url)) {
                return Err(if hops == 0 {
                    e
                } else {
                    self.redirect_refused(hops, &url)
                });
            }
            let mut builder = self.client.request(method.clone(), url.clone());
            for h in &headers {
                let name = HeaderName::from_bytes(h.name.as_bytes()).map_err(|_| {
                    EgressError::Invalid(format!("`{}` is not a valid header name", h.name))
                })?;
                let mut value = HeaderValue::from_str(&h.value).map_err(|_| {
                    EgressError::Invalid(format!(
                        "the value of header `{}` is not valid (control characters?)",
                        h.name
                    ))
                })?;
                value.set_sensitive(h.secret);
                builder = builder.header(name, value);
            }
            if let Some(b) = &body {
                builder = builder.body(b.clone());
            }
            // The turn's trace, unless the guest carries its own.
            if !headers
                .iter()
                .any(|h| h.name.eq_ignore_ascii_case("traceparent"))
            {
                builder = builder.headers(crate::telemetry::outgoing_headers());
            }
            let resp = builder
                .send()
                .await
                .map_err(|e| transport_error(&e, scrub))?;
            let status = resp.status();
            if status.is_redirection() && hops < max_redirects {
                let Some(location) = resp
                    .headers()
                    .get(reqwest::header::LOCATION)
                    .and_then(|l| l.to_str().ok())
                else {
                    return Ok(resp);
                };
                hops += 1;
                let next = url.join(location).map_err(|e| {
                    EgressError::Invalid(format!(
                        "redirect {hops} was refused: its Location is not a URL ({e})"
                    ))
                })?;
                if next.origin() != origin && scrub.found_in_url(&next) {
                    return Err(EgressError::Refused(format!(
                        "redirect {hops} was refused: its URL carries a secret's value to \
                         another origin"
                    )));
                }
                if next.origin() != origin {
                    // Secrets and credentials stay with the origin they
                    // were written for.
                    headers.retain(|h| {
                        !h.secret
                            && !["authorization", "cookie", "proxy-authorization"]
                                .contains(&h.name.to_ascii_lowercase().as_str())
                    });
                }
                if status == reqwest::StatusCode::SEE_OTHER
                    || (matches!(status.as_u16(), 301 | 302) && method == reqwest::Method::POST)
                {
                    method = reqwest::Method::GET;
                    body = None;
                    headers.retain(|h| {
                        !h.name.eq_ignore_ascii_case("content-type")
                            && !h.name.eq_ignore_ascii_case("content-length")
                    });
                }
                url = next;
                continue;
            }
            if identity_only {
                check_identity(&resp)?;
            }
            return Ok(resp);
        }
    }

    /// Read `resp`'s body, charged to the response budget: its declared
    /// length before reading, or, when it has none, its buffer as it grows;
    /// either may wait for room until `deadline`.
    async fn read(
        &self,
        mut resp: reqwest::Response,
        scrub: &Scrub,
        deadline: tokio::time::Instant,
    ) -> Result<OutboundResponse, EgressError> {
        let max = self.config.max_response_bytes;
        let declared = resp.content_length();
        if declared.is_some_and(|n| n > max as u64) {
            return Err(EgressError::TooLarge(format!(
                "the response body is larger than {max} bytes"
            )));
        }
        let status = resp.status().as_u16();
        let headers = scrubbed_headers(&resp, scrub);
        let (mut body, mut charge) = match declared {
            Some(n) => {
                let charge = self.responses.reserve(n, deadline).await.map_err(|no| {
                    self.overloaded(format!(
                        "a {n}-byte response body waited until the request's timeout for \
                         room ({} of the budget's {} in use)",
                        no.held, no.limit
                    ))
                })?;
                (Vec::with_capacity(n as usize), charge)
            }
            None => (Vec::new(), self.responses.empty()),
        };
        while let Some(chunk) = resp.chunk().await.map_err(|e| transport_error(&e, scrub))? {
            if body.len() + chunk.len() > max {
                return Err(EgressError::TooLarge(format!(
                    "the response body is larger than {max} bytes"
                )));
            }
            body.reserve(chunk.len());
            // A body of unknown length is charged what its buffer holds. (A
            // declared one was charged up front; it cannot grow past its
            // length, which the connection checks.)
            let more = (body.capacity() as u64).saturating_sub(charge.bytes());
            if declared.is_none() && more > 0 {
                let mine = charge.bytes();
                self.responses
                    .grow(&mut charge, more, deadline)
                    .await
                    .map_err(|no| {
                        let why = if no.deadlock {
                            "every holder waited for more, this one holding least"
                        } else {
                            "it waited until the request's timeout"
                        };
                        self.overloaded(format!(
                            "a response body of unknown length needed {more} bytes more \
                             ({mine} held already; {} of the budget's {} in use) and {why}",
                            no.held, no.limit
                        ))
                    })?;
            }
            body.extend_from_slice(&chunk);
        }
        let body = scrub.bytes(body);
        let mut headers = headers;
        if declared.is_some() && !scrub.is_empty() {
            headers.push(("content-length".into(), body.len().to_string()));
        }
        Ok(OutboundResponse {
            status,
            headers,
            body,
            _charge: charge,
        })
    }

    /// The error of a fetch the response budget had no room for.
    fn overloaded(&self, why: String) -> EgressError {
        EgressError::Overloaded(format!(
            "the node holds as many outbound response bodies as it may \
             (limits.egress_response_budget_bytes = {}): {why}; retry later",
            self.responses.limit()
        ))
    }
}

/// A compressed (or otherwise encoded) body cannot be checked for secrets.
fn check_identity(resp: &reqwest::Response) -> Result<(), EgressError> {
    match resp
        .headers()
        .get(reqwest::header::CONTENT_ENCODING)
        .and_then(|v| v.to_str().ok())
    {
        None => Ok(()),
        Some(e) if e.trim().eq_ignore_ascii_case("identity") => Ok(()),
        Some(e) => Err(EgressError::Refused(format!(
            "the response is encoded ({e}) and cannot be checked for secrets; \
             this type's responses must be uncompressed"
        ))),
    }
}

/// The headers of `resp` that are text, scrubbed.
fn scrubbed_headers(resp: &reqwest::Response, scrub: &Scrub) -> Vec<(String, String)> {
    resp.headers()
        .iter()
        // Scrubbing may change the body's length; the declared one would
        // tell how long the values it replaced were.
        .filter(|(k, _)| scrub.is_empty() || *k != reqwest::header::CONTENT_LENGTH)
        .filter_map(|(k, v)| {
            let v = v.to_str().ok()?;
            Some((k.as_str().to_owned(), scrub.text(v.to_owned())))
        })
        .collect()
}

/// A transport error in words, without the URL (it may carry what the
/// guest put there) and scrubbed.
fn transport_error(e: &reqwest::Error, scrub: &Scrub) -> EgressError {
    let mut source = std::error::Error::source(e);
    let mut detail = Vec::new();
    while let Some(s) = source {
        if let Some(refused) = s.downcast_ref::<AddressRefused>() {
            return EgressError::Refused(scrub.text(refused.to_string()));
        }
        detail.push(s.to_string());
        source = s.source();
    }
    let kind = if e.is_timeout() {
        "timed out"
    } else if e.is_connect() {
        "connection failed"
    } else if e.is_body() || e.is_decode() {
        "reading the response failed"
    } else {
        "request failed"
    };
    let mut msg = kind.to_owned();
    if let Some(last) = detail.last() {
        msg.push_str(": ");
        msg.push_str(last);
    }
    EgressError::Failed(scrub.text(msg))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_value_containing_another_is_replaced_whole() {
        let mut s = Scrub::default();
        s.add(b"sk-1");
        s.add(b"sk-1234");
        assert_eq!(
            s.bytes(b"x sk-1234 y sk-1".to_vec()),
            b"x [redacted] y [redacted]".to_vec()
        );
        let mut stream = StreamScrub::new(s);
        let mut out = stream.push(b"x sk-12");
        out.extend(stream.push(b"34 y"));
        out.extend(stream.finish());
        assert_eq!(out, b"x [redacted] y".to_vec());
    }

    /// Only what could start a value waits: text that cannot is released
    /// at once however long the values are.
    #[test]
    fn a_stream_holds_back_only_what_could_start_a_value() {
        let mut s = Scrub::default();
        let key = format!("sk-proj-{}", "Q".repeat(150));
        s.add(key.as_bytes());
        let mut stream = StreamScrub::new(s);
        assert_eq!(stream.push(b"word0 "), b"word0 ".to_vec());
        assert_eq!(stream.push(b"word1 s"), b"word1 ".to_vec());
        assert_eq!(stream.push(b"o "), b"so ".to_vec());
        assert_eq!(stream.push(b"sk-proj-QQ"), Vec::<u8>::new());
        let mut out = stream.push(&key.as_bytes()[10..]);
        out.extend(stream.push(b" done"));
        assert_eq!(out, b"[redacted] done".to_vec());
        // A key cut off by the end of the stream: its start is not released.
        let cut = format!("then {}", &key[..100]);
        assert_eq!(stream.push(cut.as_bytes()), b"then ".to_vec());
        assert_eq!(stream.finish(), b"[redacted]".to_vec());
        // A few bytes that merely could start one are.
        assert_eq!(stream.push(b"ok sk-"), b"ok ".to_vec());
        assert_eq!(stream.finish(), b"sk-".to_vec());
        // A value's start found again inside a false start.
        let mut s = Scrub::default();
        s.add(b"aab");
        let mut stream = StreamScrub::new(s);
        let mut out = stream.push(b"aa");
        out.extend(stream.push(b"ab!"));
        assert_eq!(out, b"a[redacted]!".to_vec());
    }

    /// A text ending with enough of a key's start (cut by `max_tokens`)
    /// keeps none of it; a few bytes that could start one stay.
    #[test]
    fn a_text_cut_off_inside_a_value_keeps_none_of_it() {
        let mut s = Scrub::default();
        s.add(b"sk-PROBE7-abcdefghijklmnop0123456789");
        assert_eq!(
            s.text("tail sk-PROBE7-abcdefghijklmnop012345678".into()),
            "tail [redacted]"
        );
        assert_eq!(
            s.text("ok sk-PROBE7-abcdefgh".into()),
            "ok [redacted]",
            "half of it"
        );
        // Less (a key's public prefix ends many texts) stays.
        assert_eq!(s.text("ok sk-PROBE7".into()), "ok sk-PROBE7");
        assert_eq!(s.text("ok sk-".into()), "ok sk-");
        assert_eq!(
            s.text("a sk-PROBE7-abcdefghijklmnop0123456789 b".into()),
            "a [redacted] b"
        );
    }

    #[test]
    fn scrub_replaces_every_occurrence_of_every_value() {
        let mut s = Scrub::default();
        s.add(b"sk-123");
        s.add(b"other");
        s.add(b"");
        assert_eq!(
            s.bytes(b"a sk-123 b sk-123other".to_vec()),
            b"a [redacted] b [redacted][redacted]".to_vec()
        );
        assert_eq!(s.text("nothing here".into()), "nothing here");
        assert_eq!(s.bytes(b"sk-12".to_vec()), b"sk-12".to_vec());
    }

    #[test]
    fn text_streams_are_scrubbed_across_pieces_and_released_on_character_boundaries() {
        let mut s = Scrub::default();
        s.add("clé-secrète".as_bytes());
        let mut t = TextStreamScrub::new(s);
        let mut out = String::new();
        for piece in ["key: cl", "é-se", "crète! ", "naïve ", "café"] {
            out.push_str(&t.push(piece));
        }
        out.push_str(&t.finish());
        assert_eq!(out, "key: [redacted]! naïve café");
        // Without values, pieces pass through at once.
        let mut t = TextStreamScrub::new(Scrub::default());
        assert_eq!(t.push("é"), "é");
    }

    #[test]
    fn scrub_ignores_ascii_case_and_finds_values_in_urls_encoded_or_not() {
        let mut s = Scrub::default();
        s.add(b"SuperSecret_9");
        s.add(b"supersecret_9");
        assert_eq!(s.needles.len(), 1, "one value, whatever its case");
        assert_eq!(
            s.text("host supersecret_9.invalid, SUPERSECRET_9".into()),
            "host [redacted].invalid, [redacted]"
        );
        let mut stream = StreamScrub::new(s.clone());
        let mut out = stream.push(b"a SUPERsec");
        out.extend(stream.push(b"ret_9 b"));
        out.extend(stream.finish());
        assert_eq!(out, b"a [redacted] b".to_vec());
        let url = |u: &str| Url::parse(u).unwrap();
        assert!(s.found_in_url(&url("https://x.test/?k=supersecret_9")));
        assert!(s.found_in_url(&url("https://supersecret_9.test/")));
        assert!(s.found_in_url(&url("https://x.test/%53uperSecret%5F9")));
        assert!(!s.found_in_url(&url("https://x.test/?k=supersecret")));
    }

    #[test]
    fn stream_scrub_catches_values_split_across_chunks() {
        let mut s = Scrub::default();
        s.add(b"SECRET");
        let mut stream = StreamScrub::new(s);
        let mut out = Vec::new();
        for chunk in [&b"data: SEC"[..], b"RET and SE", b"CRET", b"SECR", b"ET!"] {
            out.extend(stream.push(chunk));
        }
        out.extend(stream.finish());
        assert_eq!(
            String::from_utf8(out).unwrap(),
            "data: [redacted] and [redacted][redacted]!"
        );
        // Without values, chunks pass straight through.
        let mut plain = StreamScrub::new(Scrub::default());
        assert_eq!(plain.push(b"abc"), b"abc");
        assert!(plain.finish().is_empty());
    }

    /// A body cut by a failed connection hands out what came before the
    /// failure, held back by the scrubber or not, and then the error.
    #[tokio::test]
    async fn a_stream_cut_off_releases_what_came_before_then_fails() {
        use tokio::io::AsyncWriteExt as _;
        let listener = tokio::net::TcpListener::bind("127.0.0.2:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let server = tokio::spawn(async move {
            let (mut sock, _) = listener.accept().await.unwrap();
            let mut req = [0u8; 4096];
            let _ = tokio::io::AsyncReadExt::read(&mut sock, &mut req).await;
            let body = "data: {\"x\":1}\n\ndata: [DONE]\n\n";
            let head = "HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\n\
                        transfer-encoding: chunked\r\n\r\n";
            let chunk = format!("{:x}\r\n{body}\r\n", body.len());
            sock.write_all(format!("{head}{chunk}").as_bytes())
                .await
                .unwrap();
            // Gone without the last chunk: a transport error to the reader.
            drop(sock);
        });
        let e = Egress::new(&EgressConfig {
            allow_private: vec!["127.0.0.2/32".into()],
            ..EgressConfig::default()
        })
        .unwrap();
        // A value whose start is the stream's end: `]\n\n`, the end of the
        // `[DONE]` line, is held back until the failure.
        let mut scrub = Scrub::default();
        scrub.add(b"]\n\n-not-really-a-key");
        let req = OutboundRequest {
            method: reqwest::Method::POST,
            url: Url::parse(&format!("http://{addr}/v1/chat/completions")).unwrap(),
            headers: Vec::new(),
            body: Some(b"{}".to_vec()),
            timeout: Duration::from_secs(5),
            max_redirects: 0,
            identity_only: true,
        };
        let mut resp = e.fetch_stream(req, &|_| Ok(()), scrub).await.unwrap();
        let mut got = Vec::new();
        let err = loop {
            match resp.next(1 << 16).await {
                Ok(Some(c)) => got.extend(c),
                Ok(None) => panic!("the cut stream ended cleanly"),
                Err(e) => break e,
            }
        };
        assert_eq!(
            String::from_utf8(got).unwrap(),
            "data: {\"x\":1}\n\ndata: [DONE]\n\n"
        );
        assert!(!matches!(err, EgressError::TooLarge(_)), "{err}");
        server.await.unwrap();
    }

    #[test]
    fn urls_are_checked_before_sending() {
        let e = Egress::new(&EgressConfig {
            allow_private: vec!["127.0.0.2/32".into()],
            ..EgressConfig::default()
        })
        .unwrap();
        let check = |u: &str| e.check_url(&Url::parse(u).unwrap());
        assert!(check("https://api.example.com/").is_ok());
        assert!(check("http://127.0.0.2:8080/").is_ok());
        for refused in [
            "http://127.0.0.1/",
            "http://[::1]/",
            "http://[::ffff:127.0.0.1]/",
            "http://0.0.0.0/",
            "http://2130706433/",
            "http://0x7f.1/",
            "http://10.1.2.3/",
            "http://169.254.169.254/latest/meta-data/",
            "http://[fd00:ec2::254]/",
            "ftp://example.com/",
            "https://user:pass@example.com/",
        ] {
            assert!(check(refused).is_err(), "{refused} was allowed");
        }
    }
}
