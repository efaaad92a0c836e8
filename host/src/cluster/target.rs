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

use hmac::Mac as _;
use reqwest::Method;
use reqwest::header::{HeaderMap, HeaderName, HeaderValue};
use sha2::Digest as _;

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

    /// Whether `mac` is the signature of `target` sent with `method`.
    pub fn verifies(&self, method: &Method, target: &str, mac: &[u8]) -> bool {
        self.mac(method, target).verify_slice(mac).is_ok()
    }
}
