//! Pieces of HTTP that several layers read: the wait a response asks
//! for (a model provider's rate limit, a webhook receiver's back-off).

use std::time::{Duration, SystemTime};

/// The wait a response asks for: `retry-after-ms` (OpenAI), else
/// `Retry-After` as seconds or as an HTTP date.
pub fn retry_after(headers: &[(String, String)], now: SystemTime) -> Option<Duration> {
    let get = |name: &str| {
        headers
            .iter()
            .find(|(k, _)| k.eq_ignore_ascii_case(name))
            .map(|(_, v)| v.trim())
    };
    if let Some(ms) = get("retry-after-ms").and_then(|v| v.parse::<f64>().ok())
        && ms.is_finite()
        && ms >= 0.0
    {
        return Some(Duration::from_secs_f64(ms.min(1e9) / 1000.0));
    }
    let v = get("retry-after")?;
    if let Ok(s) = v.parse::<f64>() {
        return (s.is_finite() && s >= 0.0).then(|| Duration::from_secs_f64(s.min(1e9)));
    }
    let at = chrono::DateTime::parse_from_rfc2822(v).ok()?;
    let at = SystemTime::UNIX_EPOCH + Duration::from_millis(at.timestamp_millis().max(0) as u64);
    Some(at.duration_since(now).unwrap_or(Duration::ZERO))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn h(k: &str, v: &str) -> Vec<(String, String)> {
        vec![(k.into(), v.into())]
    }

    #[test]
    fn retry_after_in_every_spelling() {
        let now = SystemTime::UNIX_EPOCH + Duration::from_secs(1_700_000_000);
        assert_eq!(
            retry_after(&h("Retry-After", "3"), now),
            Some(Duration::from_secs(3))
        );
        assert_eq!(
            retry_after(&h("retry-after", "0.5"), now),
            Some(Duration::from_millis(500))
        );
        assert_eq!(
            retry_after(&h("retry-after-ms", "250"), now),
            Some(Duration::from_millis(250))
        );
        // 1_700_000_000 is Tue, 14 Nov 2023 22:13:20 GMT.
        assert_eq!(
            retry_after(&h("Retry-After", "Tue, 14 Nov 2023 22:13:30 GMT"), now),
            Some(Duration::from_secs(10))
        );
        assert_eq!(
            retry_after(&h("Retry-After", "Tue, 14 Nov 2023 22:00:00 GMT"), now),
            Some(Duration::ZERO),
            "a date in the past means now"
        );
        assert_eq!(retry_after(&h("Retry-After", "soon"), now), None);
        assert_eq!(retry_after(&h("Retry-After", "-4"), now), None);
        assert_eq!(retry_after(&[], now), None);
    }
}
