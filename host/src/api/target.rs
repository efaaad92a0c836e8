//! Forwarded requests keep their exact target: the receiving side (see
//! [`crate::cluster::TargetKey`], which signs them).

use axum::body::Body;
use axum::http::{Request, StatusCode, Uri};
use axum::response::{IntoResponse, Response};

use super::ApiError;
pub use crate::cluster::{TARGET, TARGET_MAC, TargetKey};

/// Put back the target of a forwarded request (before routing); the
/// refusal to answer instead if its MAC does not verify.
pub fn restore(key: &TargetKey, req: &mut Request<Body>) -> Option<Response> {
    let target = req.headers_mut().remove(TARGET)?;
    let mac = req.headers_mut().remove(TARGET_MAC);
    let refused = |why: &str| {
        Some(
            ApiError::new(StatusCode::BAD_REQUEST, "invalid_forward", why.to_owned())
                .into_response(),
        )
    };
    let (Ok(target), Some(mac)) = (target.to_str(), mac) else {
        return refused("a forwarded target without its signature");
    };
    let Ok(mac) = hex::decode(mac.as_bytes()) else {
        return refused("a forwarded target's signature is not hex");
    };
    if !key.verifies(req.method(), target, &mac) {
        return refused(
            "a forwarded target whose signature does not verify (only the nodes of a \
             cluster, which share its admin token, forward requests)",
        );
    }
    let mut parts = req.uri().clone().into_parts();
    let Ok(target) = target.parse() else {
        return refused("a forwarded target that is not a request target");
    };
    parts.path_and_query = Some(target);
    match Uri::from_parts(parts) {
        Ok(uri) => *req.uri_mut() = uri,
        Err(e) => return refused(&e.to_string()),
    }
    None
}

#[cfg(test)]
mod tests {
    use axum::http::{HeaderMap, Method};

    use super::*;

    fn forwarded(key: &TargetKey, target: &str) -> (String, Request<Body>) {
        let mut headers = HeaderMap::new();
        let url = key.url(&Method::DELETE, "http://127.0.0.1:9", target, &mut headers);
        // What the receiver gets: the URL as the client sends it.
        let sent = url::Url::parse(&url).unwrap();
        let mut req = Request::builder()
            .method(Method::DELETE)
            .uri(&sent[url::Position::BeforePath..])
            .body(Body::empty())
            .unwrap();
        *req.headers_mut() = headers;
        (sent.path().to_owned(), req)
    }

    /// Targets the URL would change arrive as sent; others need nothing.
    #[test]
    fn a_forwarded_target_arrives_as_sent() {
        let key = TargetKey::new(Some("token"));
        for target in [
            "/v1/actors/t/a/x/../../b",
            "/v1/actors/t/a/files/%2e%2e/x",
            "/v1/actors/t/%2E%2E",
            "/v1/actors/t/./files/a?prefix=..",
        ] {
            let (changed, mut req) = forwarded(&key, target);
            assert_ne!(changed, target.split('?').next().unwrap(), "{target}");
            assert!(restore(&key, &mut req).is_none());
            assert_eq!(req.uri().path_and_query().unwrap().as_str(), target);
            assert!(!req.headers().contains_key(TARGET));
        }
        let (_, req) = forwarded(&key, "/v1/actors/t/a?wait=false");
        assert!(req.headers().is_empty());
        // Raw UTF-8 in the request line (which the URL would encode)
        // arrives percent-encoded: the same actor.
        let (_, mut req) = forwarded(&key, "/v1/actors/t/café");
        assert!(restore(&key, &mut req).is_none());
        assert_eq!(req.uri().path(), "/v1/actors/t/caf%C3%A9");
    }

    /// A target signed under another key, for another method, or not at
    /// all is refused.
    #[test]
    fn a_target_without_a_valid_signature_is_refused() {
        let key = TargetKey::new(Some("token"));
        let (_, mut req) = forwarded(&TargetKey::new(Some("other")), "/v1/actors/t/..");
        assert!(restore(&key, &mut req).is_some());
        let (_, mut req) = forwarded(&key, "/v1/actors/t/..");
        *req.method_mut() = Method::GET;
        assert!(restore(&key, &mut req).is_some());
        let (_, mut req) = forwarded(&key, "/v1/actors/t/..");
        req.headers_mut().remove(TARGET_MAC);
        assert!(restore(&key, &mut req).is_some());
    }
}
