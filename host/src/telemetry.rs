//! OpenTelemetry traces: an OTLP exporter, off by default, and W3C
//! `traceparent` propagation.
//!
//! Turned on by the standard variables: `OTEL_EXPORTER_OTLP_ENDPOINT` (or
//! `OTEL_EXPORTER_OTLP_TRACES_ENDPOINT`), OTLP over HTTP/protobuf, e.g.
//! `http://127.0.0.1:4318`; `OTEL_SERVICE_NAME` (default `marmot`) and
//! `OTEL_EXPORTER_OTLP_HEADERS` as the OpenTelemetry specification says. The
//! `tracing` spans of the node become OpenTelemetry spans: one per turn
//! (`turn`: type, id, version, kind, wait/run/commit times), outbound
//! webhook attempts, and what runs inside them.
//!
//! Propagation: a `traceparent` on an incoming message becomes the parent of
//! its turn; `actors.call` carries the caller's turn as parent in-process;
//! requests the node sends for a turn (the `http` capability, model calls)
//! carry the turn's `traceparent`; an outbound webhook continues the trace of
//! the turn that emitted its event (stored with the outbox row). Durable
//! inbox work (`?wait=false`, `actors.send`, alarms, webhooks in) starts its
//! own trace. With tracing off all of this is a single relaxed load.

use std::sync::atomic::{AtomicBool, Ordering};

use opentelemetry::propagation::TextMapPropagator as _;
use opentelemetry::trace::TracerProvider as _;
use opentelemetry_http::{Bytes, HeaderExtractor, HeaderInjector, HttpClient, HttpError};
use opentelemetry_sdk::propagation::TraceContextPropagator;
use opentelemetry_sdk::trace::SdkTracerProvider;
use tracing_opentelemetry::OpenTelemetrySpanExt as _;

static ENABLED: AtomicBool = AtomicBool::new(false);

tokio::task_local! {
    /// The `x-request-id` of the client request being served (the caller's,
    /// or the one the node chose), so the turn it causes can log it.
    static REQUEST_ID: std::sync::Arc<str>;
}

/// Serve `request` with `id` as its request id ([`request_id`]).
pub fn with_request_id<F: std::future::Future>(
    id: std::sync::Arc<str>,
    request: F,
) -> impl std::future::Future<Output = F::Output> {
    REQUEST_ID.scope(id, request)
}

/// The id of the client request this task serves, if it serves one: a
/// turn's log lines carry it, so the `x-request-id` a client was answered
/// with (an error reply too) finds them.
pub fn request_id() -> Option<std::sync::Arc<str>> {
    REQUEST_ID.try_with(std::sync::Arc::clone).ok()
}

/// Whether traces are exported.
pub fn enabled() -> bool {
    ENABLED.load(Ordering::Relaxed)
}

/// Whether the environment asks for an OTLP exporter.
pub fn requested() -> bool {
    [
        "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT",
        "OTEL_EXPORTER_OTLP_ENDPOINT",
    ]
    .iter()
    .any(|v| std::env::var_os(v).is_some_and(|v| !v.is_empty()))
}

/// The exporter, kept to flush what is buffered at exit.
pub struct Exporter {
    provider: SdkTracerProvider,
}

impl Exporter {
    /// Flush buffered spans and stop the exporter.
    pub fn shutdown(self) {
        if let Err(e) = self.provider.shutdown() {
            eprintln!("warning: OpenTelemetry exporter did not shut down cleanly: {e}");
        }
    }
}

/// Build the OTLP exporter and the `tracing` layer that feeds it. Requests
/// are sent on `runtime` (the exporter's batch thread is not a tokio one).
pub fn layer<S>(
    runtime: tokio::runtime::Handle,
) -> anyhow::Result<(
    tracing_opentelemetry::OpenTelemetryLayer<S, opentelemetry_sdk::trace::Tracer>,
    Exporter,
)>
where
    S: tracing::Subscriber + for<'a> tracing_subscriber::registry::LookupSpan<'a>,
{
    use opentelemetry_otlp::WithHttpConfig as _;
    let exporter = opentelemetry_otlp::SpanExporter::builder()
        .with_http()
        .with_http_client(OnTokio {
            client: reqwest::Client::builder()
                .timeout(std::time::Duration::from_secs(10))
                .build()?,
            runtime,
        })
        .build()?;
    let service = std::env::var("OTEL_SERVICE_NAME").unwrap_or_else(|_| "marmot".into());
    let provider = SdkTracerProvider::builder()
        .with_batch_exporter(exporter)
        .with_resource(
            opentelemetry_sdk::Resource::builder()
                .with_service_name(service)
                .with_attribute(opentelemetry::KeyValue::new(
                    "service.version",
                    env!("CARGO_PKG_VERSION"),
                ))
                .build(),
        )
        .build();
    let tracer = provider.tracer("marmot");
    opentelemetry::global::set_text_map_propagator(TraceContextPropagator::new());
    ENABLED.store(true, Ordering::Relaxed);
    Ok((
        tracing_opentelemetry::layer().with_tracer(tracer),
        Exporter { provider },
    ))
}

/// The parent a turn's span takes: the remote caller's trace, or the
/// calling actor's turn.
#[derive(Clone, Debug)]
pub struct Parent(opentelemetry::Context);

impl Parent {
    /// The current span, as a parent for work handed elsewhere (another
    /// actor's turn). `None` with tracing off.
    pub fn current() -> Option<Self> {
        enabled().then(|| Self(tracing::Span::current().context()))
    }

    /// The `traceparent` of incoming request `headers`, if it has a valid one.
    pub fn from_headers(headers: &http::HeaderMap) -> Option<Self> {
        if !enabled() || !headers.contains_key("traceparent") {
            return None;
        }
        let cx = TraceContextPropagator::new().extract(&HeaderExtractor(headers));
        use opentelemetry::trace::TraceContextExt as _;
        cx.span().span_context().is_valid().then_some(Self(cx))
    }

    /// A stored `traceparent` (an outbound webhook's originating turn).
    pub fn from_traceparent(traceparent: &str) -> Option<Self> {
        let mut headers = http::HeaderMap::new();
        headers.insert("traceparent", traceparent.parse().ok()?);
        Self::from_headers(&headers)
    }

    /// Make `span` a child of this parent.
    pub fn adopt(self, span: &tracing::Span) {
        let _ = span.set_parent(self.0);
    }
}

/// The W3C `traceparent` of `span`, to store with work it leaves behind.
pub fn traceparent_of(span: &tracing::Span) -> Option<String> {
    if !enabled() {
        return None;
    }
    let mut headers = http::HeaderMap::new();
    TraceContextPropagator::new()
        .inject_context(&span.context(), &mut HeaderInjector(&mut headers));
    headers
        .get("traceparent")
        .and_then(|v| v.to_str().ok())
        .map(str::to_owned)
}

/// The `traceparent` (and `tracestate`) of the current span, to send on a
/// request made for it. Empty with tracing off.
pub fn outgoing_headers() -> http::HeaderMap {
    let mut headers = http::HeaderMap::new();
    if enabled() {
        let cx = tracing::Span::current().context();
        TraceContextPropagator::new().inject_context(&cx, &mut HeaderInjector(&mut headers));
    }
    headers
}

/// The exporter's HTTP client: reqwest, run on the node's runtime.
#[derive(Debug)]
struct OnTokio {
    client: reqwest::Client,
    runtime: tokio::runtime::Handle,
}

#[async_trait::async_trait]
impl HttpClient for OnTokio {
    async fn send_bytes(
        &self,
        request: http::Request<Bytes>,
    ) -> Result<http::Response<Bytes>, HttpError> {
        let client = self.client.clone();
        let sent = self.runtime.spawn(async move {
            let request = reqwest::Request::try_from(request)?;
            let response = client.execute(request).await?;
            let mut out = http::Response::builder().status(response.status());
            if let Some(h) = out.headers_mut() {
                *h = response.headers().clone();
            }
            let body = response.bytes().await?;
            Ok::<_, HttpError>(out.body(body)?)
        });
        sent.await?
    }
}
