//! A request one node forwards to another keeps its exact target.
//!
//! The forwarding client parses URLs as browsers do, which resolves `.`
//! and `..` segments (`%2e` spelled too): a request for
//! `/v1/actors/t/a/files/../../b/files/x`, sent through a node that does
//! not own `a`, reached `a`'s owner as a request for actor `b` — a read,
//! or a `DELETE`, of another actor than the one routed (found by a probe)
//! — and actors with the ids `.` and `..` could not be reached through
//! other nodes at all. Where parsing would change a target, the sender
//! passes it in [`TARGET`] with an HMAC of it under a key derived from
//! the admin token, which every node of a cluster shares ([`TARGET_MAC`]);
//! the receiver puts it back before routing, so the owner serves exactly
//! what the client sent (and refuses what it would refuse). Without a
//! valid MAC the header is refused: a client cannot make a node serve
//! another path than the one in its request line.

use axum::body::Body;
use axum::http::{HeaderMap, HeaderName, HeaderValue, Method, Request, StatusCode, Uri};
use axum::response::{IntoResponse, Response};
use hmac::Mac as _;
use sha2::Digest as _;

use super::ApiError;

/// The request target a forwarded request stands for.
pub const TARGET: HeaderName = HeaderName::from_static("x-marmot-target");
/// The HMAC-SHA256 of the method and [`TARGET`] (hex).
pub const TARGET_MAC: HeaderName = HeaderName::from_static("x-marmot-target-mac");

/// Bytes a target in a header is percent-encoded in: all but visible
/// ASCII (a request line may hold raw UTF-8).
const NOT_VISIBLE: &percent_encoding::AsciiSet = &percent_encoding::CONTROLS.add(b' ');

/// What the key is derived for (with the admin token).
const PURPOSE: &[u8] = b"marmot forwarded request targets v1\0";

/// The key that signs forwarded targets.
pub struct TargetKey([u8; 32]);

impl TargetKey {
    /// The key of nodes whose admin token is `admin_token`.
    pub fn new(admin_token: Option<&str>) -> Self {
        let mut h = sha2::Sha256::new();
        h.update(PURPOSE);
        h.update(admin_token.unwrap_or_default().as_bytes());
        Self(h.finalize().into())
    }

    fn mac(&self, method: &Method, target: &str) -> hmac::Hmac<sha2::Sha256> {
        let mut mac = <hmac::Hmac<sha2::Sha256>>::new_from_slice(&self.0)
            .expect("HMAC takes a key of any length");
        mac.update(method.as_str().as_bytes());
        mac.update(b" ");
        mac.update(target.as_bytes());
        mac
    }

    /// The URL that sends `target` to the node at `base`; when that URL
    /// would not keep `target` as it is, `headers` get it (signed).
    pub fn url(
        &self,
        method: &Method,
        base: &str,
        target: &str,
        headers: &mut HeaderMap,
    ) -> String {
        let url = format!("{base}{target}");
        let kept = url::Url::parse(&url).is_ok_and(|u| &u[url::Position::BeforePath..] == target);
        if !kept {
            // A header carries visible ASCII: other bytes (an id's UTF-8)
            // go percent-encoded, which routes to the same actor.
            let target = percent_encoding::utf8_percent_encode(target, NOT_VISIBLE).to_string();
            let mac = hex::encode(self.mac(method, &target).finalize().into_bytes());
            headers.insert(
                TARGET,
                HeaderValue::from_str(&target).expect("visible ASCII is a header value"),
            );
            headers.insert(
                TARGET_MAC,
                HeaderValue::from_str(&mac).expect("hex is a header value"),
            );
        }
        url
    }

    /// Put back the target of a forwarded request (before routing); the
    /// refusal to answer instead if its MAC does not verify.
    pub fn restore(&self, req: &mut Request<Body>) -> Option<Response> {
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
        if self.mac(req.method(), target).verify_slice(&mac).is_err() {
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
}

#[cfg(test)]
mod tests {
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
            assert!(key.restore(&mut req).is_none());
            assert_eq!(req.uri().path_and_query().unwrap().as_str(), target);
            assert!(!req.headers().contains_key(TARGET));
        }
        let (_, req) = forwarded(&key, "/v1/actors/t/a?wait=false");
        assert!(req.headers().is_empty());
        // Raw UTF-8 in the request line (which the URL would encode)
        // arrives percent-encoded: the same actor.
        let (_, mut req) = forwarded(&key, "/v1/actors/t/café");
        assert!(key.restore(&mut req).is_none());
        assert_eq!(req.uri().path(), "/v1/actors/t/caf%C3%A9");
    }

    /// A target signed under another key, for another method, or not at
    /// all is refused.
    #[test]
    fn a_target_without_a_valid_signature_is_refused() {
        let key = TargetKey::new(Some("token"));
        let (_, mut req) = forwarded(&TargetKey::new(Some("other")), "/v1/actors/t/..");
        assert!(key.restore(&mut req).is_some());
        let (_, mut req) = forwarded(&key, "/v1/actors/t/..");
        *req.method_mut() = Method::GET;
        assert!(key.restore(&mut req).is_some());
        let (_, mut req) = forwarded(&key, "/v1/actors/t/..");
        req.headers_mut().remove(TARGET_MAC);
        assert!(key.restore(&mut req).is_some());
    }
}
