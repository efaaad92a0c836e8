//! The gateway: one chat call, over the wire format of whichever provider
//! answers, with the key added by the host, retries that honour
//! `Retry-After`, and fallbacks tried while nothing has been streamed yet.
//!
//! Retry policy (docs/models.md): 429, 529, 5xx, 408, a failed connection,
//! a malformed answer and an error event before the first delta are tried
//! again on the same provider, up to `models.max_attempts` times, waiting
//! `Retry-After` (seconds, an HTTP date, or `retry-after-ms`) when given
//! and an exponential back-off with jitter otherwise. A provider asking for
//! a longer wait than `models.max_retry_after_ms` counts as unavailable.
//! Bad requests (400, context length), a bad key (401/403), an unknown
//! model (404) and an exhausted quota are never retried; the last three
//! (and an unavailable provider) move on to the next fallback. Once a delta
//! has gone out to the actor's live stream, a failure ends the call: the
//! client saw part of an answer that a retry would not continue.

use std::sync::Arc;
use std::time::Duration;

use url::Url;
use zeroize::Zeroizing;

use super::budget::{Ledger, Spend};
use super::chat::{Attempt, ChatRequest, ChatResponse, Delta, Message, Target, sendable};
use super::errors::{ErrorKind, ProviderError};
use super::providers::{Provider, Providers};
use super::scrub;
use super::sse::SseParser;
use super::wire::{Decoded, Flow};
use crate::config::{EgressConfig, ModelsConfig};
use crate::egress::{
    Egress, EgressError, OutboundHeader, OutboundRequest, ResponseBudget, Scrub, policy,
};
use crate::metrics::{Metrics, ModelLabels};
use crate::secrets::{SecretError, SecretStore};

/// Why a chat call failed.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ModelError {
    /// The request is malformed.
    #[error("{0}")]
    Invalid(String),
    /// No such provider.
    #[error("{0}")]
    NotFound(String),
    /// A rule forbids the call (the key's hosts).
    #[error("{0}")]
    Denied(String),
    /// Every provider tried failed; the last one's error.
    #[error("{}: {message}", kind.code())]
    Failed {
        /// What kind of failure the last one was.
        kind: ErrorKind,
        /// What happened, provider by provider.
        message: String,
    },
}

/// What a call reports as it goes.
pub trait CallObserver: Send {
    /// A delta of the answer arrived (only for `stream: true`).
    fn delta(&mut self, delta: &Delta);
}

impl<F: FnMut(&Delta) + Send> CallObserver for F {
    fn delta(&mut self, delta: &Delta) {
        self(delta)
    }
}

/// The model gateway.
pub struct Gateway {
    providers: Arc<Providers>,
    ledger: Arc<Ledger>,
    secrets: Arc<SecretStore>,
    egress: Egress,
    config: ModelsConfig,
    metrics: Arc<Metrics>,
}

/// Largest error body read from a streamed call that failed.
const MAX_ERROR_BODY: usize = 64 << 10;

impl Gateway {
    /// A gateway over `providers`, reaching them with the node's egress
    /// settings plus `models.allow_private`, its buffered answers charged
    /// to the node's response budget.
    pub fn new(
        providers: Arc<Providers>,
        ledger: Arc<Ledger>,
        secrets: Arc<SecretStore>,
        egress: &EgressConfig,
        responses: Arc<ResponseBudget>,
        config: &ModelsConfig,
        metrics: Arc<Metrics>,
    ) -> anyhow::Result<Self> {
        let mut egress = egress.clone();
        egress
            .allow_private
            .extend(config.allow_private.iter().cloned());
        egress.timeout_ms = config.timeout_ms;
        Ok(Self {
            providers,
            ledger,
            secrets,
            egress: Egress::new(&egress)?.with_response_budget(responses),
            config: config.clone(),
            metrics,
        })
    }

    /// The providers.
    pub fn providers(&self) -> &Arc<Providers> {
        &self.providers
    }

    /// The budget ledger.
    pub fn ledger(&self) -> &Arc<Ledger> {
        &self.ledger
    }

    /// The most `req` can spend, on whichever provider of its chain
    /// answers: every byte of the request counted as a prompt token (no
    /// tokenizer makes fewer bytes than tokens, and the framing each
    /// provider adds per message is covered by a margin), plus
    /// `max_output_tokens`. With `cost`, every provider of the chain that
    /// exists here must have a price for its model (one that does not is
    /// stepped over by [`Self::chat`], and costs nothing); with none, the
    /// call fails there, saying so.
    pub fn estimate(&self, req: &ChatRequest, cost: bool) -> Result<Spend, ModelError> {
        let bytes = serde_json::to_vec(req).map_or(0, |b| b.len()) as u64;
        let input = bytes + 64 * (req.messages.len() as u64 + req.tools.len() as u64) + 256;
        let output = req.max_output_tokens.unwrap_or(u64::MAX / 4);
        let mut nano_usd: u64 = 0;
        if cost {
            for t in std::iter::once(req.target()).chain(req.fallbacks.iter().cloned()) {
                // A deleted primary no longer stops a budgeted call before
                // its fallbacks (found by a review).
                let Some(provider) = self.providers.get(&t.provider) else {
                    continue;
                };
                let price = provider
                    .price(&t.model)
                    .ok_or_else(|| {
                        ModelError::Denied(format!(
                            "this type has a budget in dollars, but provider `{}` has no price for model `{}` (set prices with PUT /v1/providers/{})",
                            t.provider, t.model, t.provider
                        ))
                    })?;
                let n = (input as f64 * price.input_per_mtok
                    + output as f64 * price.output_per_mtok)
                    * 1e3;
                nano_usd = nano_usd.max(n.ceil() as u64);
            }
        }
        Ok(Spend {
            tokens: input.saturating_add(output),
            nano_usd,
        })
    }

    /// Run `req`: its provider, then its fallbacks.
    pub async fn chat(
        &self,
        req: &ChatRequest,
        observer: &mut dyn CallObserver,
    ) -> Result<ChatResponse, ModelError> {
        req.check().map_err(ModelError::Invalid)?;
        let messages = sendable(&req.messages);
        let targets: Vec<Target> = std::iter::once(req.target())
            .chain(req.fallbacks.iter().cloned())
            .collect();
        let mut attempts: Vec<Attempt> = Vec::new();
        let mut emitted = false;
        let mut last = ErrorKind::Server;
        // A target this node cannot call (no such provider, a request its
        // format cannot carry, a key it may not send) is stepped over for
        // the next one, as a refused call is: with the primary's provider
        // deleted or its key's secret gone, the fallbacks were never tried
        // (found by a probe). Only when no target could be called is the
        // first one's reason the error.
        let mut unusable: Option<ModelError> = None;
        let mut called = false;
        for target in &targets {
            let mut skip = |why: String, as_error: fn(String) -> ModelError| {
                attempts.push(attempt(target, why.clone()));
                unusable.get_or_insert(as_error(why));
            };
            let Some(provider) = self.providers.get(&target.provider) else {
                let why = format!("no provider `{}` on this node", target.provider);
                skip(why, ModelError::NotFound);
                continue;
            };
            let body = match provider
                .format
                .encode(req, &target.model, &messages, &provider.encode)
            {
                Ok(b) => serde_json::to_vec(&b).expect("JSON encodes"),
                Err(why) => {
                    skip(why, ModelError::Invalid);
                    continue;
                }
            };
            let (key, scrub) = match self.key(&provider) {
                Ok(k) => k,
                Err(why) => {
                    skip(why, ModelError::Denied);
                    continue;
                }
            };
            called = true;
            let mut tries = 0;
            let error = loop {
                tries += 1;
                let started = std::time::Instant::now();
                let r = self
                    .call_once(
                        &provider,
                        key.as_ref().map(|k| k.as_str()),
                        &scrub,
                        &body,
                        req.stream,
                        observer,
                        &mut emitted,
                    )
                    .await
                    .map(|mut d| {
                        scrub::decoded(&mut d, &scrub);
                        estimate_missing_usage(&mut d, body.len());
                        d
                    })
                    .map_err(|mut e| {
                        e.message = scrub.text(std::mem::take(&mut e.message));
                        e
                    });
                let outcome = match &r {
                    Ok(_) => "ok",
                    Err(e) => e.kind.code(),
                };
                self.record(&provider.name, outcome, started);
                let e = match r {
                    Ok(d) => {
                        self.count_tokens(&provider.name, &d);
                        return Ok(response(&provider, target, d, attempts));
                    }
                    Err(e) => e,
                };
                tracing::info!(provider = %provider.name, model = %target.model, attempt = tries, error = %e, "model call failed");
                if emitted {
                    // Part of the answer reached the actor's live stream.
                    return Err(ModelError::Failed {
                        kind: e.kind,
                        message: format!(
                            "{} ({}) failed mid-stream, after part of the answer was streamed: {e}",
                            provider.name, target.model
                        ),
                    });
                }
                if !e.kind.retryable() || tries >= self.config.max_attempts {
                    break e;
                }
                let wait = match e.retry_after {
                    Some(w) if w > Duration::from_millis(self.config.max_retry_after_ms) => {
                        let mut e = e;
                        e.message = format!(
                            "{} (it asked to wait {} s, longer than this node waits)",
                            e.message,
                            w.as_secs()
                        );
                        break e;
                    }
                    Some(w) => w,
                    None => self.backoff(tries),
                };
                tokio::time::sleep(wait).await;
            };
            last = error.kind;
            attempts.push(attempt(target, error.to_string()));
            if !error.kind.falls_back() {
                break;
            }
        }
        let message = attempts
            .iter()
            .map(|a| format!("{} ({}): {}", a.provider, a.model, a.error))
            .collect::<Vec<_>>()
            .join("; ");
        Err(match unusable {
            Some(e) if !called && targets.len() == 1 => e,
            Some(e) if !called => match e {
                ModelError::NotFound(_) => ModelError::NotFound(message),
                ModelError::Invalid(_) => ModelError::Invalid(message),
                _ => ModelError::Denied(message),
            },
            _ => ModelError::Failed {
                kind: last,
                message,
            },
        })
    }

    /// The provider's key (checked against its secret's hosts) and a
    /// scrubber that removes it from whatever comes back.
    fn key(&self, provider: &Provider) -> Result<(Option<Zeroizing<String>>, Scrub), String> {
        let mut scrub = Scrub::default();
        let Some(name) = &provider.key_secret else {
            return Ok((None, scrub));
        };
        let (value, hosts) = self.secrets.reveal(name).map_err(|e| match e {
            SecretError::NotFound(_) => format!(
                "provider `{}` names key_secret `{name}`, which is not in the secret store",
                provider.name
            ),
            e => format!("provider `{}`: {e}", provider.name),
        })?;
        let url = &provider.base_url;
        let host_ok = url
            .host()
            .as_ref()
            .is_some_and(|h| policy::any_matches(&hosts, h));
        if url.scheme() != "https" || !host_ok {
            return Err(format!(
                "secret `{name}` may not be sent to {}://{} (its hosts: {})",
                url.scheme(),
                url.host_str().unwrap_or(""),
                hosts
                    .iter()
                    .map(ToString::to_string)
                    .collect::<Vec<_>>()
                    .join(", ")
            ));
        }
        let key = std::str::from_utf8(value.expose())
            .map_err(|_| format!("secret `{name}` is not text, so it cannot be an API key"))?;
        scrub.add(value.expose());
        for old in self.secrets.retired(name) {
            scrub.add(&old);
        }
        Ok((Some(Zeroizing::new(key.to_owned())), scrub))
    }

    #[allow(clippy::too_many_arguments)]
    async fn call_once(
        &self,
        provider: &Provider,
        key: Option<&str>,
        scrub: &Scrub,
        body: &[u8],
        stream: bool,
        observer: &mut dyn CallObserver,
        emitted: &mut bool,
    ) -> Result<Decoded, ProviderError> {
        let mut headers = vec![header("content-type", "application/json")];
        if stream {
            headers.push(header("accept", "text/event-stream"));
        }
        for (k, v) in provider.format.headers() {
            headers.push(header(k, v));
        }
        for (k, v) in &provider.headers {
            headers.push(header(k, v));
        }
        if let Some(key) = key {
            let (name, value) = provider.format.auth_header(key);
            headers.push(OutboundHeader {
                name: name.into(),
                value: Zeroizing::new(value),
                secret: true,
            });
        }
        let request = OutboundRequest {
            method: reqwest::Method::POST,
            url: provider.endpoint(),
            headers,
            body: Some(body.to_vec()),
            timeout: Duration::from_millis(self.config.timeout_ms),
            max_redirects: 0,
            identity_only: key.is_some(),
        };
        let any = |_: &Url| Ok(());
        if !stream {
            let resp = self
                .egress
                .fetch(request, &any, scrub)
                .await
                .map_err(egress_error)?;
            if !(200..300).contains(&resp.status) {
                return Err(ProviderError::from_response(
                    resp.status,
                    &resp.headers,
                    &resp.body,
                ));
            }
            return json_answer(provider, resp.status, &resp.body, scrub);
        }
        let mut resp = self
            .egress
            .fetch_stream(request, &any, scrub.clone())
            .await
            .map_err(egress_error)?;
        if !(200..300).contains(&resp.status) {
            let mut body = Vec::new();
            while body.len() < MAX_ERROR_BODY {
                match resp.next(MAX_ERROR_BODY).await {
                    Ok(Some(c)) => body.extend(c),
                    _ => break,
                }
            }
            return Err(ProviderError::from_response(
                resp.status,
                &resp.headers,
                &body,
            ));
        }
        let content_type = resp
            .headers
            .iter()
            .find(|(k, _)| k.eq_ignore_ascii_case("content-type"))
            .map(|(_, v)| v.to_ascii_lowercase());
        if let Some(ct) = content_type.filter(|ct| {
            ct.starts_with("application/json")
                || ct.starts_with("text/html")
                || ct.contains("xhtml")
        }) {
            // Not a stream. A server that ignores `stream: true` answers
            // JSON: taken as the whole answer. A web page (a wrong
            // base_url) is a configuration problem, said as such: both
            // were "the stream ended before the model finished", retried
            // twelve times over a minute. Other types are read as a
            // stream: some servers label theirs `text/plain`.
            if !ct.starts_with("application/json") {
                return Err(ProviderError::new(
                    ErrorKind::Refused,
                    Some(resp.status),
                    format!(
                        "the provider answered {} with Content-Type `{ct}`, a web page, not \
                         an event stream or JSON: is its base_url right?",
                        resp.status
                    ),
                ));
            }
            let whole = resp.collect().await.map_err(egress_error)?;
            return json_answer(provider, whole.status, &whole.body, scrub);
        }
        let mut parser = SseParser::default();
        let mut decoder = provider.format.stream();
        let mut deltas = Vec::new();
        let mut scrubbed = scrub::Deltas::new(scrub);
        // The connection failed after the answer was whole (a reset, TLS
        // closed without close_notify after the last event but before the
        // end marker): the answer is kept; else the failure is the error.
        let mut failed = None;
        // The egress times out a stream with no next chunk; a provider
        // that sends keep-alive comments or pings, or an event a byte at a
        // time, never has none: it times out with no event that moves the
        // answer on for as long (it held a run, its fallback and its
        // cancel for the turn's whole limit: found by a probe).
        let idle = Duration::from_millis(self.config.timeout_ms);
        let mut moved = tokio::time::Instant::now();
        // What the last event said: one that only repeats it (`{"choices":
        // []}` or an empty delta every second, a re-probe found) does not
        // move the answer on either.
        let mut last_data = String::new();
        'read: loop {
            let chunk = match resp.next(64 << 10).await {
                Ok(c) => c,
                Err(e) => {
                    failed = Some(e);
                    None
                }
            };
            let events = match &chunk {
                Some(c) => parser.push(c),
                None => Ok(parser.finish().into_iter().collect()),
            }
            // A line past the parser's bound: asking again gets the same.
            .map_err(|why| ProviderError::new(ErrorKind::Refused, None, why))?;
            let mut news = false;
            for ev in events.iter().filter(|ev| ev.event != "ping") {
                news |= ev.data != last_data;
                last_data.clone_from(&ev.data);
            }
            for ev in events {
                let flow = decoder.event(&ev, &mut deltas);
                // Text, even the same again, is the answer going on (a
                // model repeating "\n" was cut as a keep-alive: a probe).
                news |= deltas.iter().any(Delta::carries_content);
                for d in deltas.drain(..).filter_map(|d| scrubbed.delta(d)) {
                    *emitted = true;
                    observer.delta(&d);
                }
                // After a failed read, the last event may be cut short:
                // the failure is the error, not the cut event (an answer
                // over `egress.max_response_bytes` was "a streamed event's
                // data is not a JSON object", and retried at full cost).
                match flow {
                    Ok(Flow::Done) => break 'read,
                    Ok(Flow::More) => {}
                    Err(e) => return Err(failed.take().map_or(e, egress_error)),
                }
            }
            if news {
                moved = tokio::time::Instant::now();
            } else if chunk.is_some() && moved.elapsed() > idle {
                return Err(ProviderError::new(
                    ErrorKind::Timeout,
                    None,
                    format!(
                        "the provider's stream moved on no further for {} ms (models.timeout_ms): \
                         it sent only keep-alives, or an event too slowly",
                        idle.as_millis()
                    ),
                ));
            }
            if chunk.is_none() {
                break;
            }
        }
        for d in scrubbed.finish() {
            *emitted = true;
            observer.delta(&d);
        }
        match decoder.finish() {
            Ok(answer) => provider.format.decode(answer),
            Err(e) => Err(failed.map_or(e, egress_error)),
        }
    }

    fn backoff(&self, tries: u32) -> Duration {
        let base = self
            .config
            .backoff_ms
            .saturating_mul(1 << (tries - 1).min(20))
            .min(self.config.max_backoff_ms);
        // Half fixed, half random: spread retries of many actors apart.
        let jitter = (base as f64 * 0.5 * rand::random::<f64>()) as u64;
        Duration::from_millis(base / 2 + jitter)
    }

    fn record(&self, provider: &str, outcome: &'static str, started: std::time::Instant) {
        let labels = ModelLabels {
            provider: provider.to_owned(),
            outcome,
        };
        self.metrics.model_calls.get_or_create(&labels).inc();
        self.metrics
            .model_call_seconds
            .observe(started.elapsed().as_secs_f64());
    }

    fn count_tokens(&self, provider: &str, d: &Decoded) {
        for (direction, n) in [
            ("input", d.usage.input_tokens),
            ("output", d.usage.output_tokens),
        ] {
            self.metrics
                .model_tokens
                .get_or_create(&ModelLabels {
                    provider: provider.to_owned(),
                    outcome: direction,
                })
                .inc_by(n);
        }
    }
}

/// An answer without usage (many OpenAI-compatible servers send none when
/// streaming; a cut stream loses it) counted as 0 tokens, which no budget
/// ever saw: it is estimated instead, at about four bytes a token of the
/// request sent and of the answer's message (at least one token out), and
/// marked `"estimated": true` in the usage. A provider's own zeros for both
/// cannot be told from none, and are estimated too.
fn estimate_missing_usage(d: &mut Decoded, request_bytes: usize) {
    if d.usage.input_tokens > 0 || d.usage.output_tokens > 0 {
        return;
    }
    let answer = serde_json::to_vec(&d.message).map_or(0, |b| b.len());
    d.usage.input_tokens = (request_bytes as u64).div_ceil(4);
    d.usage.output_tokens = (answer as u64).div_ceil(4).max(1);
    d.usage
        .extra
        .insert("estimated".into(), serde_json::Value::Bool(true));
}

fn header(name: &str, value: &str) -> OutboundHeader {
    OutboundHeader {
        name: name.into(),
        value: Zeroizing::new(value.into()),
        secret: false,
    }
}

fn attempt(target: &Target, error: String) -> Attempt {
    Attempt {
        provider: target.provider.clone(),
        model: target.model.clone(),
        error,
    }
}

/// A whole (not streamed) answer's `body`, scrubbed once more as JSON
/// (a value escaped in it is not in the bytes) and decoded.
fn json_answer(
    provider: &Provider,
    status: u16,
    body: &[u8],
    scrub: &Scrub,
) -> Result<Decoded, ProviderError> {
    let mut json = serde_json::from_slice(body).map_err(|_| {
        ProviderError::new(
            ErrorKind::Server,
            Some(status),
            "the response is not JSON".into(),
        )
    })?;
    if !scrub.is_empty() {
        scrub::value(&mut json, scrub);
    }
    // A 200 that is an error object (some OpenAI-compatible servers: an
    // unknown model): the provider's own error, classed by its type. It
    // was "malformed response: no choices", with the provider's message
    // lost, and retried (found by a probe). (A Responses object has an
    // `error` of null.)
    if json.get("error").is_some_and(serde_json::Value::is_object) && json.get("choices").is_none()
    {
        let mut e = ProviderError::from_stream_event(&json);
        e.status = Some(status);
        return Err(e);
    }
    provider.format.decode(json)
}

fn egress_error(e: EgressError) -> ProviderError {
    match e {
        EgressError::Refused(m) => ProviderError::new(ErrorKind::Refused, None, m),
        EgressError::Invalid(m) => ProviderError::new(ErrorKind::Refused, None, m),
        // A node limit: asking again gets the same answer.
        EgressError::TooLarge(m) => ProviderError::new(ErrorKind::Refused, None, m),
        e @ EgressError::Timeout(_) => ProviderError::new(ErrorKind::Timeout, None, e.to_string()),
        // This node's response budget, not the provider: worth retrying.
        EgressError::Overloaded(m) => ProviderError::new(ErrorKind::Overloaded, None, m),
        EgressError::Failed(m) => ProviderError::new(ErrorKind::Connection, None, m),
    }
}

fn response(
    provider: &Provider,
    target: &Target,
    d: Decoded,
    attempts: Vec<Attempt>,
) -> ChatResponse {
    let mut usage = d.usage;
    if let Some(p) = provider.price(&target.model) {
        usage.cost_usd = Some(
            (usage.input_tokens as f64 * p.input_per_mtok
                + usage.output_tokens as f64 * p.output_per_mtok)
                / 1e6,
        );
    }
    let mut message = d.message;
    identify_calls(&mut message);
    ChatResponse {
        provider: provider.name.clone(),
        model: d.model.unwrap_or_else(|| target.model.clone()),
        id: d.id,
        message,
        stop_reason: d.stop_reason,
        provider_stop_reason: d.provider_stop_reason,
        usage,
        provider_fields: d.provider_fields,
        attempts,
    }
}

/// Give each tool call the provider sent without an id one of its own
/// (`call_` and 24 random hex digits): the answer is "ready to append",
/// and a call without an id is refused in the next request, so a guest's
/// own agent loop could not go on (some OpenAI-compatible servers leave
/// ids out; a re-probe).
fn identify_calls(message: &mut Message) {
    if let Message::Assistant { tool_calls, .. } = message {
        for c in tool_calls.iter_mut().filter(|c| c.id.is_empty()) {
            c.id = format!("call_{:024x}", rand::random::<u128>() >> 32);
        }
    }
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;
    use crate::models::wire::Format;

    /// A call the provider sent without an id gets one, different from
    /// any other; one with an id keeps it.
    #[test]
    fn calls_without_ids_get_their_own() {
        let mut m: Message = serde_json::from_value(json!({"role": "assistant", "content": "",
            "tool_calls": [{"id": "", "name": "f"}, {"id": "", "name": "f"}, {"id": "x", "name": "f"}]}))
        .unwrap();
        identify_calls(&mut m);
        let Message::Assistant { tool_calls, .. } = m else {
            panic!()
        };
        let ids: Vec<&str> = tool_calls.iter().map(|c| c.id.as_str()).collect();
        assert!(ids[0].starts_with("call_") && ids[0].len() == 29, "{ids:?}");
        assert_ne!(ids[0], ids[1]);
        assert_eq!(ids[2], "x");
    }

    /// A hung provider is left for the next one at once: retried, it held
    /// the turn for `max_attempts` timeouts, past the turn's own limit.
    #[test]
    fn a_timeout_falls_back_without_retrying() {
        let e = egress_error(EgressError::Timeout(300_000));
        assert_eq!(e.kind, ErrorKind::Timeout);
        assert!(!e.kind.retryable());
        assert!(e.kind.falls_back());
        let e = egress_error(EgressError::Failed("connection reset".into()));
        assert!(e.kind.retryable());
    }

    #[test]
    fn an_answer_without_usage_is_estimated_not_free() {
        let body = json!({"id": "c1", "model": "m", "choices": [{"index": 0,
            "message": {"role": "assistant", "content": "forty characters of a perfectly fine answer"},
            "finish_reason": "stop"}]});
        let mut d = Format::OpenAiChat.decode(body.clone()).unwrap();
        assert_eq!((d.usage.input_tokens, d.usage.output_tokens), (0, 0));
        estimate_missing_usage(&mut d, 400);
        assert_eq!(d.usage.input_tokens, 100);
        assert!(d.usage.output_tokens >= 10, "{:?}", d.usage);
        assert_eq!(d.usage.extra["estimated"], true);
        // Usage the provider sent is taken as it is.
        let mut with = body;
        with["usage"] = json!({"prompt_tokens": 3, "completion_tokens": 2});
        let mut d = Format::OpenAiChat.decode(with).unwrap();
        estimate_missing_usage(&mut d, 400);
        assert_eq!((d.usage.input_tokens, d.usage.output_tokens), (3, 2));
        assert!(!d.usage.extra.contains_key("estimated"));
    }
}
