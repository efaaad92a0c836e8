//! A local OpenTelemetry collector (OTLP/HTTP) for tests that search what
//! a node exports.

use std::sync::{Arc, Mutex};

/// An OTLP/HTTP collector on loopback keeping every export as it came (the
/// protobuf bytes), so a test can search them for a secret byte for byte,
/// and count the spans named `turn` in them.
#[derive(Clone)]
pub struct Traces {
    exports: Arc<Mutex<Vec<axum::body::Bytes>>>,
    url: String,
}

impl Traces {
    pub async fn start() -> Self {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let url = format!("http://{}", listener.local_addr().unwrap());
        let traces = Self {
            exports: Arc::default(),
            url,
        };
        let kept = traces.exports.clone();
        let app = axum::Router::new().route(
            "/v1/traces",
            axum::routing::post(move |body: axum::body::Bytes| {
                kept.lock().unwrap().push(body);
                async { axum::http::StatusCode::OK }
            }),
        );
        tokio::spawn(async move { axum::serve(listener, app).await.unwrap() });
        traces
    }

    /// The environment of a node that exports here every 100 ms, with its
    /// logs at trace level (so the spans carry every log event too).
    pub fn node_env(&self) -> [(&'static str, &str); 3] {
        [
            ("MARMOT_LOG", "trace"),
            ("OTEL_EXPORTER_OTLP_ENDPOINT", &self.url),
            ("OTEL_BSP_SCHEDULE_DELAY", "100"),
        ]
    }

    pub fn exports(&self) -> Vec<axum::body::Bytes> {
        self.exports.lock().unwrap().clone()
    }

    pub fn turn_spans(&self) -> usize {
        use opentelemetry_proto::tonic::collector::trace::v1::ExportTraceServiceRequest;
        use prost::Message as _;
        self.exports()
            .into_iter()
            .map(|body| ExportTraceServiceRequest::decode(body).expect("OTLP protobuf"))
            .flat_map(|req| req.resource_spans)
            .flat_map(|rs| rs.scope_spans)
            .flat_map(|ss| ss.spans)
            .filter(|s| s.name == "turn")
            .count()
    }

    /// Once at least `turns` turn spans have come, wait until no export
    /// has come for half a second (the node exports every 100 ms).
    pub async fn settled(&self, turns: usize) -> Vec<axum::body::Bytes> {
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(20);
        let mut last = (0, std::time::Instant::now());
        loop {
            let n = self.exports().len();
            if n != last.0 {
                last = (n, std::time::Instant::now());
            }
            if self.turn_spans() >= turns
                && last.1.elapsed() > std::time::Duration::from_millis(500)
            {
                return self.exports();
            }
            assert!(
                std::time::Instant::now() < deadline,
                "{} turn spans exported, expected {turns}",
                self.turn_spans()
            );
            tokio::time::sleep(std::time::Duration::from_millis(50)).await;
        }
    }
}
