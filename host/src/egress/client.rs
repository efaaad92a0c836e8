//! The one HTTP client guests' requests leave through.
//!
//! TLS is rustls with the webpki roots (plus `[egress] extra_ca_file`);
//! proxies from the environment are ignored; names resolve through the
//! policy resolver; an IP literal is checked before anything is sent.
//! Redirects are followed only as far as the caller allows, each hop
//! checked like the first, and headers that carried secrets (and
//! `authorization`, `cookie`) are dropped when a hop leaves the origin.
//! What comes back is capped, and every secret value in it is replaced
//! before the caller sees it (`scrub.rs`).

use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use reqwest::header::{HeaderName, HeaderValue};
use url::Url;
use zeroize::Zeroizing;

use super::budget::{ResponseBudget, ResponseCharge};
use super::policy::AddressPolicy;
use super::resolve::{AddressRefused, PolicyResolver};
use super::scrub::{Scrub, StreamScrub};
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
    /// The cap (`egress.max_response_bytes`), for its message.
    limit: usize,
    /// Longest wait for the next chunk.
    idle: Duration,
    /// How the body ended, once what arrived before has been handed out.
    failed: Option<EgressError>,
    /// The node's response budget, which [`Self::collect`] charges.
    budget: Arc<ResponseBudget>,
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
                Ok(r) => r.map_err(|e| transport_error(&e, self.scrub.values())),
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
                        return Err(EgressError::TooLarge(format!(
                            "the response body is larger than {} bytes (this node's \
                             egress.max_response_bytes; a streamed body counts its framing)",
                            self.limit
                        )));
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

    /// The rest of the body, whole (a server that answered a request for a
    /// stream with one document): charged to the node's response budget as
    /// its buffer grows, like a buffered fetch's, waiting for room at most
    /// as long as for a chunk. (It was read into memory uncharged.)
    pub async fn collect(mut self) -> Result<OutboundResponse, EgressError> {
        let budget = self.budget.clone();
        let mut charge = budget.empty();
        let mut body = Vec::new();
        while let Some(chunk) = self.next(64 << 10).await? {
            body.reserve(chunk.len());
            let deadline = tokio::time::Instant::now() + self.idle;
            charge_growing(&budget, &mut charge, body.capacity(), deadline).await?;
            body.extend_from_slice(&chunk);
        }
        Ok(OutboundResponse {
            status: self.status,
            headers: std::mem::take(&mut self.headers),
            body,
            _charge: charge,
        })
    }
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
        let policy = Arc::new(
            AddressPolicy::new(&config.allow_private)
                .map_err(|e| anyhow::anyhow!("egress.allow_private: {e}"))?,
        );
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
        self.fetch_within(req, allowed, scrub, None).await
    }

    /// [`fetch`](Self::fetch), the body held to `cap` too, when given:
    /// (bytes, why) — a body past it fails saying why.
    pub async fn fetch_within(
        &self,
        req: OutboundRequest,
        allowed: &(dyn Fn(&Url) -> Result<(), EgressError> + Sync),
        scrub: &Scrub,
        cap: Option<(usize, &str)>,
    ) -> Result<OutboundResponse, EgressError> {
        let timeout = req.timeout;
        let ms = timeout.as_millis() as u64;
        let deadline = tokio::time::Instant::now() + timeout;
        let whole = async {
            let resp = self.fetch_hops(req, allowed, scrub).await?;
            self.read(resp, scrub, deadline, cap).await
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
                "the response body is larger than {max} bytes (this node's egress.max_response_bytes)"
            )));
        }
        Ok(StreamingResponse {
            status: resp.status().as_u16(),
            headers: scrubbed_headers(&resp, &scrub),
            resp: Some(resp),
            scrub: StreamScrub::new(scrub),
            ready: Vec::new(),
            remaining: max,
            limit: max,
            idle: timeout,
            failed: None,
            budget: self.responses.clone(),
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
            let resp = builder.send().await.map_err(|e| match hops {
                0 => transport_error(&e, scrub),
                _ => hop_transport_error(&e, hops, &url, scrub),
            })?;
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
        cap: Option<(usize, &str)>,
    ) -> Result<OutboundResponse, EgressError> {
        let (max, why) = match cap {
            Some((bytes, why)) if bytes < self.config.max_response_bytes => (bytes, why),
            _ => (
                self.config.max_response_bytes,
                "this node's egress.max_response_bytes",
            ),
        };
        let too_large = || {
            EgressError::TooLarge(format!(
                "the response body is larger than {max} bytes ({why})"
            ))
        };
        let declared = resp.content_length();
        if declared.is_some_and(|n| n > max as u64) {
            return Err(too_large());
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
                return Err(too_large());
            }
            body.reserve(chunk.len());
            // A body of unknown length is charged what its buffer holds. (A
            // declared one was charged up front; it cannot grow past its
            // length, which the connection checks.)
            if declared.is_none() {
                charge_growing(&self.responses, &mut charge, body.capacity(), deadline).await?;
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
        overloaded(&self.responses, why)
    }
}

/// The error of a fetch `budget` had no room for.
fn overloaded(budget: &ResponseBudget, why: String) -> EgressError {
    EgressError::Overloaded(format!(
        "the node holds as many outbound response bodies as it may \
         (limits.egress_response_budget_bytes = {}): {why}; retry later",
        budget.limit()
    ))
}

/// Charge `charge` (a body of unknown length) up to `buffer` bytes, what
/// its buffer holds now, waiting for room until `deadline`.
async fn charge_growing(
    budget: &ResponseBudget,
    charge: &mut ResponseCharge,
    buffer: usize,
    deadline: tokio::time::Instant,
) -> Result<(), EgressError> {
    let more = (buffer as u64).saturating_sub(charge.bytes());
    if more == 0 {
        return Ok(());
    }
    let mine = charge.bytes();
    budget.grow(charge, more, deadline).await.map_err(|no| {
        let why = if no.deadlock {
            "every holder waited for more, this one holding least"
        } else {
            "it waited until the request's timeout"
        };
        overloaded(
            budget,
            format!(
                "a response body of unknown length needed {more} bytes more \
                 ({mine} held already; {} of the budget's {} in use) and {why}",
                no.held, no.limit
            ),
        )
    })
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

/// The headers of `resp` that are text, scrubbed. A header whose *name*
/// holds a secret's value (a server that reflects what it was sent into a
/// name, `x-<token>: 1`) is left out: a name has no room for `[redacted]`
/// (brackets are not allowed in one), and no legitimate use for a key.
fn scrubbed_headers(resp: &reqwest::Response, scrub: &Scrub) -> Vec<(String, String)> {
    resp.headers()
        .iter()
        // Scrubbing may change the body's length; the declared one would
        // tell how long the values it replaced were.
        .filter(|(k, _)| scrub.is_empty() || *k != reqwest::header::CONTENT_LENGTH)
        .filter(|(k, _)| !scrub.found_in(k.as_str().as_bytes()))
        .filter_map(|(k, v)| {
            let v = v.to_str().ok()?;
            Some((k.as_str().to_owned(), scrub.text(v.to_owned())))
        })
        .collect()
}

/// A transport error in words, without the URL (it may carry what the
/// guest put there) and scrubbed.
fn transport_error(e: &reqwest::Error, scrub: &Scrub) -> EgressError {
    if let Some(refused) = address_refused(e) {
        return EgressError::Refused(scrub.text(refused.to_string()));
    }
    let mut msg = transport_kind(e).to_owned();
    if let Some(last) = innermost_cause(e) {
        msg.push_str(": ");
        msg.push_str(&last);
    }
    EgressError::Failed(scrub.text(msg))
}

/// A redirect hop's transport error: as [`transport_error`], but without
/// the hop's host, which the server chose and which may hold what the
/// request sent (the policy's refusal and the resolver's errors name it:
/// a value reflected into a host came back in them, lowercased).
fn hop_transport_error(e: &reqwest::Error, hop: u32, url: &Url, scrub: &Scrub) -> EgressError {
    const UNSHOWN: &str = "the target is not shown: the server chose it";
    if let Some(refused) = address_refused(e) {
        return EgressError::Refused(format!(
            "redirect {hop} was refused: its host resolves to an address this node does \
             not allow ({}; {UNSHOWN})",
            refused.class.label()
        ));
    }
    let host = url.host_str().unwrap_or_default().as_bytes();
    let mut msg = format!("redirect {hop}: {}", transport_kind(e));
    match innermost_cause(e) {
        Some(last) if host.is_empty() || !contains_ignoring_case(last.as_bytes(), host) => {
            msg.push_str(&format!(": {last} ({UNSHOWN})"))
        }
        _ => msg.push_str(&format!(" ({UNSHOWN}, nor the cause, which names it)")),
    }
    EgressError::Failed(scrub.text(msg))
}

/// The address policy's refusal in `e`'s chain of causes, if that is why
/// it failed.
fn address_refused(e: &reqwest::Error) -> Option<&AddressRefused> {
    let mut source = std::error::Error::source(e);
    while let Some(s) = source {
        if let Some(refused) = s.downcast_ref::<AddressRefused>() {
            return Some(refused);
        }
        source = s.source();
    }
    None
}

/// The innermost cause of `e`, in words.
fn innermost_cause(e: &reqwest::Error) -> Option<String> {
    let mut source = std::error::Error::source(e);
    let mut last = None;
    while let Some(s) = source {
        last = Some(s.to_string());
        source = s.source();
    }
    last
}

fn contains_ignoring_case(hay: &[u8], needle: &[u8]) -> bool {
    hay.windows(needle.len())
        .any(|w| w.eq_ignore_ascii_case(needle))
}

/// What kind of failure `e` is, in words.
fn transport_kind(e: &reqwest::Error) -> &'static str {
    if e.is_timeout() {
        "timed out"
    } else if e.is_connect() {
        "connection failed"
    } else if e.is_body() || e.is_decode() {
        "reading the response failed"
    } else {
        "request failed"
    }
}

#[cfg(test)]
mod tests {
    use super::*;

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

    /// A body asked for as a stream but read whole (a JSON answer to a
    /// streamed model call) is charged to the response budget: with the
    /// budget held by another body it waits, then fails naming the limit.
    #[tokio::test]
    async fn a_stream_read_whole_is_charged_to_the_response_budget() {
        use tokio::io::AsyncWriteExt as _;
        let listener = tokio::net::TcpListener::bind("127.0.0.2:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        tokio::spawn(async move {
            for _ in 0..2 {
                let (mut sock, _) = listener.accept().await.unwrap();
                let mut req = [0u8; 4096];
                let _ = tokio::io::AsyncReadExt::read(&mut sock, &mut req).await;
                let body = format!("{{\"pad\":\"{}\"}}", "x".repeat(100_000));
                let head = "HTTP/1.1 200 OK\r\ncontent-type: application/json\r\n\
                            transfer-encoding: chunked\r\n\r\n";
                let chunk = format!("{:x}\r\n{body}\r\n0\r\n\r\n", body.len());
                sock.write_all(format!("{head}{chunk}").as_bytes())
                    .await
                    .unwrap();
            }
        });
        let budget = ResponseBudget::new(1 << 20, Default::default(), Default::default());
        let e = Egress::new(&EgressConfig {
            allow_private: vec!["127.0.0.2/32".into()],
            ..EgressConfig::default()
        })
        .unwrap()
        .with_response_budget(budget.clone());
        let req = || OutboundRequest {
            method: reqwest::Method::POST,
            url: Url::parse(&format!("http://{addr}/v1/chat/completions")).unwrap(),
            headers: Vec::new(),
            body: Some(b"{}".to_vec()),
            timeout: Duration::from_millis(300),
            max_redirects: 0,
            identity_only: true,
        };
        let any = |_: &Url| Ok(());
        let whole = e
            .fetch_stream(req(), &any, Scrub::default())
            .await
            .unwrap()
            .collect()
            .await
            .unwrap();
        assert_eq!(whole.body.len(), 100_010);
        assert!(budget.held() >= 100_010, "held {}", budget.held());
        drop(whole);
        assert_eq!(budget.held(), 0);

        let far = tokio::time::Instant::now() + Duration::from_secs(5);
        let _all = budget.reserve(1 << 20, far).await.unwrap();
        let resp = e.fetch_stream(req(), &any, Scrub::default()).await.unwrap();
        let err = resp.collect().await.unwrap_err();
        assert!(
            matches!(&err, EgressError::Overloaded(m) if m.contains("egress_response_budget_bytes")),
            "{err}"
        );
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
