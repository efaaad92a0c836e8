//! What went wrong with a call, whether trying again can help, and how
//! long the provider asked us to wait.

use std::time::{Duration, SystemTime};

use serde_json::Value;

/// What kind of failure a provider's answer (or its absence) is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ErrorKind {
    /// 429: too many requests right now.
    RateLimited,
    /// 529 (or an `overloaded_error`): the provider is overloaded.
    Overloaded,
    /// 5xx, 408, a malformed answer or an error event mid-stream.
    Server,
    /// The connection failed.
    Connection,
    /// No answer (or, streaming, no next chunk) within `models.timeout_ms`:
    /// the next provider is tried at once. Asking the same one again waited
    /// out the timeout per attempt (3 × 300 s by default, past the turn's
    /// own limit, so no fallback was ever reached).
    Timeout,
    /// The conversation does not fit the model's context.
    ContextLength,
    /// 401/403: the key is wrong or lacks access.
    Auth,
    /// 404: no such model (or endpoint).
    NotFound,
    /// 429 `insufficient_quota`: the account is out of credit; waiting
    /// does not help.
    QuotaExhausted,
    /// Any other 4xx: the request itself is wrong.
    Invalid,
    /// This node may not reach the provider (its key's hosts, the address
    /// policy): a configuration problem another provider may not have.
    Refused,
}

impl ErrorKind {
    /// Trying the same provider again later may succeed.
    pub fn retryable(self) -> bool {
        matches!(
            self,
            ErrorKind::RateLimited
                | ErrorKind::Overloaded
                | ErrorKind::Server
                | ErrorKind::Connection
        )
    }

    /// Another provider may succeed where this one cannot.
    pub fn falls_back(self) -> bool {
        self.retryable()
            || matches!(
                self,
                ErrorKind::Auth
                    | ErrorKind::NotFound
                    | ErrorKind::QuotaExhausted
                    | ErrorKind::Refused
                    | ErrorKind::Timeout
            )
    }

    /// A short snake_case name (metrics, error prefixes).
    pub fn code(self) -> &'static str {
        match self {
            ErrorKind::RateLimited => "rate_limited",
            ErrorKind::Overloaded => "overloaded",
            ErrorKind::Server => "provider_error",
            ErrorKind::Connection => "connection_failed",
            ErrorKind::Timeout => "timeout",
            ErrorKind::ContextLength => "context_length_exceeded",
            ErrorKind::Auth => "provider_auth",
            ErrorKind::NotFound => "model_not_found",
            ErrorKind::QuotaExhausted => "quota_exhausted",
            ErrorKind::Invalid => "invalid_request",
            ErrorKind::Refused => "provider_refused",
        }
    }
}

/// A failed call to one provider.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ProviderError {
    /// What kind of failure.
    pub kind: ErrorKind,
    /// The HTTP status, when there was one.
    pub status: Option<u16>,
    /// The provider's message (scrubbed, shortened).
    pub message: String,
    /// How long the provider asked us to wait.
    pub retry_after: Option<Duration>,
}

/// The longest provider message kept.
const MAX_MESSAGE: usize = 500;

impl ProviderError {
    /// An error without a wait.
    pub fn new(kind: ErrorKind, status: Option<u16>, message: String) -> Self {
        let mut message = message;
        if message.len() > MAX_MESSAGE {
            let mut cut = MAX_MESSAGE;
            while !message.is_char_boundary(cut) {
                cut -= 1;
            }
            message.truncate(cut);
            message.push('…');
        }
        Self {
            kind,
            status,
            message,
            retry_after: None,
        }
    }

    /// Classify an HTTP error response: its status, its headers and its
    /// body (the JSON error objects all three formats use).
    pub fn from_response(status: u16, headers: &[(String, String)], body: &[u8]) -> Self {
        if (300..400).contains(&status) {
            // Not followed (a redirect could lead anywhere, past the
            // address policy), and not worth retrying: the same request
            // gets the same answer. Usually a base URL missing `/v1`, or
            // http where the server wants https.
            let to = headers
                .iter()
                .find(|(k, _)| k.eq_ignore_ascii_case("location"))
                .map(|(_, v)| format!(" to `{}`", &v[..v.len().min(200)]))
                .unwrap_or_default();
            return ProviderError::new(
                ErrorKind::Refused,
                Some(status),
                format!(
                    "the provider redirected{to}; redirects are not followed: check the provider's `base_url`"
                ),
            );
        }
        let json: Option<Value> = serde_json::from_slice(body).ok();
        let error = json.as_ref().and_then(|j| j.get("error")).or(json.as_ref());
        let field = |k: &str| {
            error
                .and_then(|e| e.get(k))
                .and_then(Value::as_str)
                .unwrap_or("")
                .to_owned()
        };
        let (code, ty, message) = (field("code"), field("type"), field("message"));
        let message = if message.is_empty() {
            String::from_utf8_lossy(&body[..body.len().min(MAX_MESSAGE)]).into_owned()
        } else {
            message
        };
        let lower = message.to_ascii_lowercase();
        let context = code == "context_length_exceeded"
            || lower.contains("context length")
            || lower.contains("context_length")
            || lower.contains("context window")
            || lower.contains("prompt is too long")
            || lower.contains("maximum context");
        let kind = match status {
            429 if code == "insufficient_quota" || ty == "insufficient_quota" => {
                ErrorKind::QuotaExhausted
            }
            429 => ErrorKind::RateLimited,
            529 => ErrorKind::Overloaded,
            503 if ty == "overloaded_error" => ErrorKind::Overloaded,
            401 | 403 => ErrorKind::Auth,
            404 => ErrorKind::NotFound,
            400 | 413 | 422 if context => ErrorKind::ContextLength,
            408 => ErrorKind::Server,
            400..=499 => ErrorKind::Invalid,
            _ => ErrorKind::Server,
        };
        let mut e = ProviderError::new(kind, Some(status), message);
        e.retry_after = marmot_core::http::retry_after(headers, SystemTime::now());
        e
    }

    /// An error event inside a stream that had started with 200.
    pub fn from_stream_event(error: &Value) -> Self {
        let e = error.get("error").unwrap_or(error);
        let s = |k: &str| e.get(k).and_then(Value::as_str).unwrap_or("").to_owned();
        let (ty, code, message) = (s("type"), s("code"), s("message"));
        let kind = match (ty.as_str(), code.as_str()) {
            ("overloaded_error", _) => ErrorKind::Overloaded,
            ("rate_limit_error", _) | (_, "rate_limit_exceeded") => ErrorKind::RateLimited,
            ("not_found_error" | "not_found", _) | (_, "model_not_found") => ErrorKind::NotFound,
            ("invalid_request_error", _) => ErrorKind::Invalid,
            (_, "context_length_exceeded") => ErrorKind::ContextLength,
            _ => ErrorKind::Server,
        };
        let message = if message.is_empty() {
            format!("error event: {e}")
        } else {
            message
        };
        ProviderError::new(kind, None, message)
    }
}

impl std::fmt::Display for ProviderError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self.status {
            Some(s) => write!(f, "{} ({s}): {}", self.kind.code(), self.message),
            None => write!(f, "{}: {}", self.kind.code(), self.message),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn errors_are_classified_like_the_providers_mean_them() {
        let c = |status: u16, body: &str| {
            ProviderError::from_response(status, &[], body.as_bytes()).kind
        };
        assert_eq!(
            c(
                429,
                r#"{"error":{"message":"slow down","type":"requests"}}"#
            ),
            ErrorKind::RateLimited
        );
        assert_eq!(
            c(
                429,
                r#"{"error":{"message":"You exceeded your current quota","type":"insufficient_quota","code":"insufficient_quota"}}"#
            ),
            ErrorKind::QuotaExhausted
        );
        assert_eq!(
            c(
                529,
                r#"{"type":"error","error":{"type":"overloaded_error","message":"Overloaded"}}"#
            ),
            ErrorKind::Overloaded
        );
        assert_eq!(c(500, "oops"), ErrorKind::Server);
        assert_eq!(c(502, ""), ErrorKind::Server);
        // A redirect is a misconfigured base URL: said, not retried.
        let moved = ProviderError::from_response(
            307,
            &[("location".into(), "https://api.example.com/v1/chat".into())],
            b"",
        );
        assert_eq!(moved.kind, ErrorKind::Refused);
        assert!(!moved.kind.retryable());
        assert!(
            moved.message.contains("https://api.example.com/v1/chat")
                && moved.message.contains("base_url"),
            "{}",
            moved.message
        );
        assert_eq!(
            c(401, r#"{"error":{"message":"bad key"}}"#),
            ErrorKind::Auth
        );
        assert_eq!(
            c(
                400,
                r#"{"error":{"message":"This model's maximum context length is 8192 tokens","code":"context_length_exceeded"}}"#
            ),
            ErrorKind::ContextLength
        );
        assert_eq!(
            c(
                400,
                r#"{"type":"error","error":{"type":"invalid_request_error","message":"prompt is too long: 210000 tokens > 200000 maximum"}}"#
            ),
            ErrorKind::ContextLength
        );
        assert_eq!(
            c(400, r#"{"error":{"message":"bad tools"}}"#),
            ErrorKind::Invalid
        );
        for k in [
            ErrorKind::Invalid,
            ErrorKind::ContextLength,
            ErrorKind::Auth,
            ErrorKind::QuotaExhausted,
        ] {
            assert!(!k.retryable(), "{k:?}");
        }
        let e = ProviderError::from_response(
            400,
            &[],
            r#"{"error":{"message":"x"}}"#.repeat(100).as_bytes(),
        );
        assert!(e.message.len() <= MAX_MESSAGE + '…'.len_utf8());
    }
}
