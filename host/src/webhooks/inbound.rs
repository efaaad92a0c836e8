//! `POST /v1/hooks/{type}/{id}/{name}`: verify, route, store, then 202.
//! This module does everything before the store ([`prepare`]); the node
//! stores the row and counts the outcome.
//!
//! Nothing is stored before the signature checks out. An accepted hook is a
//! durable inbox row (kind `webhook`) for its actor, so it runs in arrival
//! order with the actor's messages, survives crashes, and its `on-webhook`
//! turn commits once. The sender's delivery id (`webhook-id`, or GitHub's
//! `X-GitHub-Delivery`) is the row's idempotency key, kept
//! `webhooks.dedupe_ttl_ms`: a redelivery is acknowledged without being
//! stored again.

use axum::http::HeaderMap;
use bytes::Bytes;

use super::VerifyError;
use crate::clock::now_ms;
use crate::config::TypeConfig;
use crate::ids::{ActorKey, IdError, new_message_id};
use crate::storage::schema::{InboxKind, InboxRecord};

/// The actor id in a hook URL that asks for routing by the type's rule.
pub const ROUTED: &str = "_";
/// Most header bytes handed to the actor.
const MAX_HEADER_BYTES: usize = 16 << 10;
/// Headers never handed to the actor.
const PRIVATE_HEADERS: &[&str] = &["authorization", "cookie", "proxy-authorization"];

/// An accepted hook.
#[derive(Debug)]
pub struct Accepted {
    /// The actor it went to.
    pub actor_id: String,
    /// The sender's delivery id.
    pub delivery_id: String,
    /// The inbox message id.
    pub message_id: String,
    /// Already received earlier: acknowledged, not stored again.
    pub duplicate: bool,
}

/// Why a hook was refused before anything was stored.
#[derive(Debug, thiserror::Error)]
pub enum HookError {
    /// The type has no `webhook_secret`.
    #[error("type `{0}` does not accept webhooks (set config.webhook_secret)")]
    NotConfigured(String),
    /// Bad hook name.
    #[error("{0}")]
    BadName(String),
    /// The signature did not check out.
    #[error(transparent)]
    Verify(#[from] VerifyError),
    /// `_` without a route for this hook.
    #[error("no route for hook `{0}`: set config.webhook_routes.{0} or post to an actor id")]
    NoRoute(String),
    /// The routing field is missing or not a string or whole number.
    #[error("the payload has no string or whole number at `{0}` to route by")]
    RouteField(String),
    /// The routed id is not a valid actor id.
    #[error(transparent)]
    BadId(#[from] IdError),
}

fn header<'h>(headers: &'h HeaderMap, name: &str) -> Option<&'h str> {
    headers.get(name).and_then(|v| v.to_str().ok())
}

/// The signature headers a hook came with, by scheme.
enum Signed<'h> {
    /// Standard Webhooks: `webhook-id`, `webhook-timestamp`,
    /// `webhook-signature`.
    Standard {
        id: &'h str,
        ts: &'h str,
        sig: &'h str,
    },
    /// GitHub's `X-Hub-Signature-256`.
    GitHub { sig: &'h str },
}

/// Which scheme `headers` sign by, with all of its headers; refused when
/// one is partly there or none is.
fn signed_by(headers: &HeaderMap) -> Result<Signed<'_>, VerifyError> {
    // An empty id is none: every sender leaving it out would share one
    // de-duplication key.
    // Present, it must be a key: visible ASCII (a header that is not said
    // "is missing"), not empty, not huge.
    let id = match headers.get("webhook-id") {
        None => None,
        Some(v) => Some(
            v.to_str()
                .ok()
                .map(str::trim)
                .filter(|v| {
                    !v.is_empty()
                        && v.len() <= super::MAX_ID
                        && v.bytes().all(|b| b.is_ascii_graphic())
                })
                .ok_or(VerifyError::BadId)?,
        ),
    };
    let ts = header(headers, "webhook-timestamp");
    let sig = header(headers, "webhook-signature");
    if id.is_some() || ts.is_some() || sig.is_some() {
        return Ok(Signed::Standard {
            id: id.ok_or(VerifyError::Missing("webhook-id"))?,
            ts: ts.ok_or(VerifyError::Missing("webhook-timestamp"))?,
            sig: sig.ok_or(VerifyError::Missing("webhook-signature"))?,
        });
    }
    match header(headers, "x-hub-signature-256") {
        Some(sig) => Ok(Signed::GitHub { sig }),
        None => Err(VerifyError::Unsigned),
    }
}

/// What can be refused from a hook's head, before its body is read: a
/// type that takes no webhooks, no signature headers of a known scheme, a
/// Standard Webhooks timestamp out of tolerance. Reading a body first let
/// unsigned senders trickling bodies hold connections for the whole body
/// deadline (a probe: 600 of them kept every other client out ~46 s).
pub fn check_head(
    config: &TypeConfig,
    ty: &str,
    headers: &HeaderMap,
    tolerance_s: u64,
) -> Result<(), HookError> {
    if config.webhook_secret.is_none() {
        return Err(HookError::NotConfigured(ty.to_owned()));
    }
    if let Signed::Standard { ts, .. } = signed_by(headers)? {
        super::check_timestamp(ts, (now_ms() / 1000) as i64, tolerance_s)?;
    }
    Ok(())
}

/// A verified delivery: the id its sender gave it, and what tells a
/// redelivery (or a replay) of it from a new one.
struct Delivery {
    id: String,
    dedupe: String,
}

/// Verify a hook's signature and say which delivery it is.
fn verify(
    secret: &str,
    headers: &HeaderMap,
    body: &[u8],
    tolerance_s: u64,
) -> Result<Delivery, VerifyError> {
    match signed_by(headers)? {
        Signed::Standard { id, ts, sig } => {
            let now_s = (now_ms() / 1000) as i64;
            let key = super::secret_key(secret);
            super::verify_standard(&key, id, ts, sig, body, now_s, tolerance_s)?;
            // The id is signed.
            Ok(Delivery {
                id: id.to_owned(),
                dedupe: id.to_owned(),
            })
        }
        Signed::GitHub { sig } => {
            super::verify_github(secret, sig, body)?;
            // Only the body is signed, and nothing dates it: the body is
            // what is remembered. Keyed by `X-GitHub-Delivery`, one
            // captured request was accepted again and again under a new
            // header each time (a probe). (A redelivery from GitHub has
            // the same body too.)
            let hash = hex::encode(<sha2::Sha256 as sha2::Digest>::digest(body));
            let id = header(headers, "x-github-delivery")
                .filter(|v| !v.trim().is_empty())
                .map_or_else(|| hash.clone(), str::to_owned);
            Ok(Delivery {
                id,
                dedupe: format!("sha256:{hash}"),
            })
        }
    }
}

/// The actor id at `pointer` in a JSON body.
fn route(pointer: &str, body: &[u8]) -> Result<String, HookError> {
    let v: serde_json::Value =
        serde_json::from_slice(body).map_err(|_| HookError::RouteField(pointer.to_owned()))?;
    match v.pointer(pointer) {
        Some(serde_json::Value::String(s)) => Ok(s.clone()),
        // Whole numbers only: a float's text is not the sender's (`4521.0`
        // was another actor than `4521`, and numbers past 2^64 became one).
        Some(serde_json::Value::Number(n)) if n.is_u64() || n.is_i64() => Ok(n.to_string()),
        _ => Err(HookError::RouteField(pointer.to_owned())),
    }
}

/// Everything before storing a hook named `name` (checked by the caller
/// first): verify its signature against the type's `config`, route it to
/// its actor, and build the inbox row (keyed by the sender's delivery id, so a redelivery
/// is a duplicate). Returns the actor, the delivery id and the row.
pub fn prepare(
    config: &TypeConfig,
    ty: &str,
    id: &str,
    name: &str,
    headers: &HeaderMap,
    body: Bytes,
    tolerance_s: u64,
) -> Result<(ActorKey, String, InboxRecord), HookError> {
    let secret = config
        .webhook_secret
        .as_deref()
        .ok_or_else(|| HookError::NotConfigured(ty.to_owned()))?;
    let delivery = verify(secret, headers, &body, tolerance_s)?;
    let actor_id = if id == ROUTED {
        let pointer = config
            .webhook_routes
            .get(name)
            .ok_or_else(|| HookError::NoRoute(name.to_owned()))?;
        route(pointer, &body)?
    } else {
        id.to_owned()
    };
    let key = ActorKey::new(ty, &actor_id)?;
    let mut kept = Vec::new();
    let mut size = 0;
    for (k, v) in headers {
        let (k, Ok(v)) = (k.as_str(), v.to_str()) else {
            continue;
        };
        if PRIVATE_HEADERS.contains(&k) || k.starts_with("x-marmot-") {
            continue;
        }
        size += k.len() + v.len();
        if size > MAX_HEADER_BYTES {
            break;
        }
        kept.push((k.to_owned(), v.to_owned()));
    }
    let message = InboxRecord {
        message_id: new_message_id(),
        body: body.to_vec(),
        content_type: header(headers, "content-type").map(str::to_owned),
        // NUL cannot appear in an Idempotency-Key header: no collision with
        // keys that clients choose.
        idempotency_key: Some(format!("\0hook:{name}:{}", delivery.dedupe)),
        attempts: 0,
        enqueued_at_ms: now_ms(),
        kind: InboxKind::Webhook {
            name: name.to_owned(),
            headers: kept,
        },
    };
    Ok((key, delivery.id, message))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn routes_and_names() {
        let body = br#"{"ticket": {"id": 4521, "slug": "abc"}, "list": ["x"]}"#;
        assert_eq!(route("/ticket/id", body).unwrap(), "4521");
        assert_eq!(route("/ticket/slug", body).unwrap(), "abc");
        assert!(route("/ticket", body).is_err());
        assert!(route("/nope", body).is_err());
        assert!(route("/ticket/id", b"not json").is_err());
        // Whole numbers only, as written.
        assert_eq!(route("/n", br#"{"n": -7}"#).unwrap(), "-7");
        assert!(route("/n", br#"{"n": 4521.0}"#).is_err());
        assert!(route("/n", br#"{"n": 12345678901234567890123}"#).is_err());
    }

    /// An id that cannot be a key is refused as such: one that is not
    /// visible ASCII read as "webhook-id is missing", and one of 5,000
    /// bytes was kept for days.
    #[test]
    fn a_delivery_id_must_be_a_short_visible_key() {
        let secret = "whsec_MDEyMzQ1Njc4OWFiY2RlZjAxMjM0NTY3ODlhYmNkZWY=";
        let ts = (now_ms() / 1000) as i64;
        let body = b"{}";
        for (id, ok) in [
            (axum::http::HeaderValue::from_static("msg_1"), true),
            (
                axum::http::HeaderValue::from_str(&"a".repeat(256)).unwrap(),
                true,
            ),
            (
                axum::http::HeaderValue::from_str(&"a".repeat(257)).unwrap(),
                false,
            ),
            (
                axum::http::HeaderValue::from_bytes("msg_é".as_bytes()).unwrap(),
                false,
            ),
            (axum::http::HeaderValue::from_static("   "), false),
            (
                axum::http::HeaderValue::from_static("id with spaces"),
                false,
            ),
            (axum::http::HeaderValue::from_static("a\tb"), false),
        ] {
            let mut headers = HeaderMap::new();
            let key = String::from_utf8_lossy(id.as_bytes()).into_owned();
            headers.insert("webhook-id", id);
            headers.insert("webhook-timestamp", ts.to_string().parse().unwrap());
            let sig = super::super::sign(&super::super::secret_key(secret), &key, ts, body);
            headers.insert("webhook-signature", sig.parse().unwrap());
            let got = verify(secret, &headers, body, 300).map(|_| ());
            assert_eq!(got.is_ok(), ok, "{key}: {got:?}");
            if !ok {
                assert_eq!(got, Err(VerifyError::BadId), "{key}");
            }
        }
        // A timestamp in milliseconds says so.
        assert_eq!(
            super::super::check_timestamp(&(ts * 1000).to_string(), ts, 300),
            Err(VerifyError::Milliseconds)
        );
    }

    #[test]
    fn an_empty_delivery_id_is_none() {
        let secret = "whsec_MDEyMzQ1Njc4OWFiY2RlZjAxMjM0NTY3ODlhYmNkZWY=";
        let ts = (now_ms() / 1000) as i64;
        let body = b"{}";
        let mut headers = HeaderMap::new();
        headers.insert("webhook-id", "".parse().unwrap());
        headers.insert("webhook-timestamp", ts.to_string().parse().unwrap());
        let sig = super::super::sign(&super::super::secret_key(secret), "", ts, body);
        headers.insert("webhook-signature", sig.parse().unwrap());
        assert!(matches!(
            verify(secret, &headers, body, 300),
            Err(VerifyError::BadId)
        ));
    }
}

/// Routing pointers and bodies from senders: an id or an error, never a
/// panic.
#[cfg(test)]
mod props {
    use proptest::prelude::*;

    use super::*;

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(2000))]

        #[test]
        fn routing_arbitrary_bodies_never_panics(
            pointer in prop_oneof![".{0,20}", "(/[a-z0-9~]{0,4}){0,4}"],
            body in prop_oneof![
                proptest::collection::vec(any::<u8>(), 0..64),
                "\\{\"[a-z]{1,3}\": (\\{\"[a-z]{1,3}\": [0-9a-z\"]{1,6}\\}|[0-9]{1,5}|\"[a-z]{0,5}\")\\}".prop_map(String::into_bytes),
            ],
            name in ".{0,80}",
        ) {
            let _ = route(&pointer, &body);
            let _ = crate::ids::validate_hook_name(&name);
        }
    }
}
