//! Webhooks in and out.
//!
//! Both directions speak [Standard Webhooks]: a message id, a Unix
//! timestamp and an HMAC-SHA256 signature over `"{id}.{timestamp}.{body}"`
//! with a `whsec_`-prefixed base64 secret. Inbound hooks may also be signed
//! the GitHub way (`X-Hub-Signature-256`, HMAC-SHA256 of the body with the
//! secret's text). This module holds the signing and checking; [`inbound`]
//! accepts hooks for actors and [`outbound`] delivers events to
//! subscriptions.
//!
//! [Standard Webhooks]: https://www.standardwebhooks.com/

pub mod inbound;
pub mod outbound;

use base64::Engine as _;
use base64::engine::general_purpose::STANDARD as B64;
use hmac::{Hmac, Mac};
use sha2::Sha256;

type HmacSha256 = Hmac<Sha256>;

/// Why a signature was not accepted; shown to the sender.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum VerifyError {
    /// No signature headers at all.
    #[error(
        "missing signature: send webhook-id, webhook-timestamp and webhook-signature \
         (Standard Webhooks) or X-Hub-Signature-256 (GitHub)"
    )]
    Unsigned,
    /// Some Standard Webhooks headers but not all.
    #[error("incomplete Standard Webhooks headers: {0} is missing")]
    Missing(&'static str),
    /// The id is empty, not visible ASCII, or too long to be a key.
    #[error("webhook-id must be 1 to {MAX_ID} visible ASCII characters (no spaces)")]
    BadId,
    /// The timestamp is not a number.
    #[error("webhook-timestamp is not a Unix timestamp")]
    BadTimestamp,
    /// The timestamp is in milliseconds (it was "-1794887173810 s away").
    #[error(
        "webhook-timestamp looks like milliseconds (or finer); Standard Webhooks sends seconds"
    )]
    Milliseconds,
    /// Too old or too far in the future.
    #[error("webhook-timestamp is {0} s away from this node's clock (tolerance {1} s)")]
    OutOfTolerance(i64, u64),
    /// No signature matched.
    #[error("signature does not match")]
    Mismatch,
}

/// Longest `webhook-id` taken: it is kept as the delivery's
/// de-duplication key for days (a 5,000-byte one was, and came back in
/// every answer).
pub const MAX_ID: usize = 256;

/// The HMAC key of a Standard Webhooks secret: the base64 after `whsec_`.
/// Secrets without the prefix are used as raw bytes (some senders do that).
pub fn secret_key(secret: &str) -> Vec<u8> {
    match secret.strip_prefix("whsec_") {
        Some(b64) => B64
            .decode(b64)
            .unwrap_or_else(|_| secret.as_bytes().to_vec()),
        None => secret.as_bytes().to_vec(),
    }
}

/// Whether `secret` is a well-formed `whsec_…` secret.
pub fn check_secret(secret: &str) -> Result<(), String> {
    let Some(b64) = secret.strip_prefix("whsec_") else {
        return Err("a webhook secret starts with `whsec_` followed by base64".into());
    };
    match B64.decode(b64) {
        Ok(k) if k.len() >= 16 => Ok(()),
        Ok(_) => Err("a webhook secret must hold at least 16 bytes".into()),
        Err(_) => Err("a webhook secret must be `whsec_` followed by base64".into()),
    }
}

/// Check what a type's config says about webhooks that the config itself
/// cannot (the format of `webhook_secret`); part of every deploy.
pub fn check_type_config(config: &crate::config::TypeConfig) -> Result<(), String> {
    if let Some(s) = &config.webhook_secret {
        check_secret(s).map_err(|e| format!("config.webhook_secret: {e}"))?;
    }
    Ok(())
}

/// A new random `whsec_` secret (32 bytes).
pub fn new_secret() -> String {
    let bytes: [u8; 32] = rand::random();
    format!("whsec_{}", B64.encode(bytes))
}

/// The `webhook-signature` value for a message: `v1,<base64>`.
pub fn sign(key: &[u8], id: &str, timestamp: i64, body: &[u8]) -> String {
    let mut mac = HmacSha256::new_from_slice(key).expect("HMAC takes any key length");
    mac.update(id.as_bytes());
    mac.update(b".");
    mac.update(timestamp.to_string().as_bytes());
    mac.update(b".");
    mac.update(body);
    format!("v1,{}", B64.encode(mac.finalize().into_bytes()))
}

/// Check Standard Webhooks headers against `body`. `signatures` is the
/// space-separated `webhook-signature` list (any `v1,` entry may match:
/// senders list several while rotating secrets).
pub fn verify_standard(
    key: &[u8],
    id: &str,
    timestamp: &str,
    signatures: &str,
    body: &[u8],
    now_s: i64,
    tolerance_s: u64,
) -> Result<(), VerifyError> {
    check_timestamp(timestamp, now_s, tolerance_s)?;
    let mut mac = HmacSha256::new_from_slice(key).expect("HMAC takes any key length");
    mac.update(id.as_bytes());
    mac.update(b".");
    mac.update(timestamp.trim().as_bytes());
    mac.update(b".");
    mac.update(body);
    let matched = signatures
        .split_whitespace()
        .filter_map(|s| s.strip_prefix("v1,"))
        .filter_map(|b64| B64.decode(b64).ok())
        .any(|sig| mac.clone().verify_slice(&sig).is_ok());
    if matched {
        Ok(())
    } else {
        Err(VerifyError::Mismatch)
    }
}

/// A Standard Webhooks `webhook-timestamp` (seconds) within `tolerance_s`
/// of `now_s`: what can be checked of a signature before the body is there.
pub fn check_timestamp(timestamp: &str, now_s: i64, tolerance_s: u64) -> Result<(), VerifyError> {
    let ts: i64 = timestamp
        .trim()
        .parse()
        .map_err(|_| VerifyError::BadTimestamp)?;
    // Seconds reach 10^11 in the year 5138; milliseconds passed it in 1973.
    if ts >= 100_000_000_000 {
        return Err(VerifyError::Milliseconds);
    }
    // Saturating: a sender picks `ts`, and i64::MIN must not overflow.
    let skew = now_s.saturating_sub(ts);
    if skew.unsigned_abs() > tolerance_s {
        return Err(VerifyError::OutOfTolerance(skew, tolerance_s));
    }
    Ok(())
}

/// Check GitHub's `X-Hub-Signature-256: sha256=<hex>` against `body`.
pub fn verify_github(secret: &str, header: &str, body: &[u8]) -> Result<(), VerifyError> {
    let sig = header
        .trim()
        .strip_prefix("sha256=")
        .and_then(|h| hex::decode(h).ok())
        .ok_or(VerifyError::Mismatch)?;
    let mut mac = HmacSha256::new_from_slice(secret.as_bytes()).expect("HMAC takes any key length");
    mac.update(body);
    mac.verify_slice(&sig).map_err(|_| VerifyError::Mismatch)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn standard_webhooks_reference_vector() {
        // The example from the Standard Webhooks specification.
        let key = secret_key("whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw");
        let id = "msg_p5jXN8AQM9LWM0D4loKWxJek";
        let body = br#"{"test": 2432232314}"#;
        let sig = sign(&key, id, 1614265330, body);
        assert_eq!(sig, "v1,g0hM9SsE+OTPJTGt/tmIKtSyZlE3uFJELVlNIOLJ1OE=");
        let now = 1614265330 + 10;
        assert_eq!(
            verify_standard(&key, id, "1614265330", &sig, body, now, 300),
            Ok(())
        );
        // Several signatures (rotation): any may match.
        let list = format!("v1,bm90LXRoaXM= {sig}");
        assert_eq!(
            verify_standard(&key, id, "1614265330", &list, body, now, 300),
            Ok(())
        );
        // Tampered body, id or timestamp; wrong key; stale or future time.
        assert_eq!(
            verify_standard(&key, id, "1614265330", &sig, b"{}", now, 300),
            Err(VerifyError::Mismatch)
        );
        assert_eq!(
            verify_standard(&key, "msg_other", "1614265330", &sig, body, now, 300),
            Err(VerifyError::Mismatch)
        );
        assert_eq!(
            verify_standard(&key, id, "1614265331", &sig, body, now, 300),
            Err(VerifyError::Mismatch)
        );
        assert_eq!(
            verify_standard(
                &secret_key("whsec_AAAA"),
                id,
                "1614265330",
                &sig,
                body,
                now,
                300
            ),
            Err(VerifyError::Mismatch)
        );
        assert!(matches!(
            verify_standard(&key, id, "1614265330", &sig, body, now + 3600, 300),
            Err(VerifyError::OutOfTolerance(..))
        ));
        assert!(matches!(
            verify_standard(&key, id, "1614265330", &sig, body, now - 3600, 300),
            Err(VerifyError::OutOfTolerance(..))
        ));
        assert_eq!(
            verify_standard(&key, id, "soon", &sig, body, now, 300),
            Err(VerifyError::BadTimestamp)
        );
    }

    #[test]
    fn github_signatures() {
        // From GitHub's documentation on validating webhook deliveries.
        let secret = "It's a Secret to Everybody";
        let header = "sha256=757107ea0eb2509fc211221cce984b8a37570b6d7586c22c46f4379c8b043e17";
        assert_eq!(verify_github(secret, header, b"Hello, World!"), Ok(()));
        assert_eq!(
            verify_github(secret, header, b"Hello, World?"),
            Err(VerifyError::Mismatch)
        );
        assert_eq!(
            verify_github("other", header, b"Hello, World!"),
            Err(VerifyError::Mismatch)
        );
        assert_eq!(
            verify_github(secret, "sha1=abc", b"Hello, World!"),
            Err(VerifyError::Mismatch)
        );
    }

    #[test]
    fn secrets() {
        assert!(check_secret(&new_secret()).is_ok());
        assert!(check_secret("hunter2").is_err());
        assert!(check_secret("whsec_!!").is_err());
        assert!(check_secret("whsec_AAAA").is_err(), "too short");
    }
}

/// Signature checks against arbitrary headers and bodies.
#[cfg(test)]
mod props {
    use proptest::collection::vec;
    use proptest::prelude::*;

    use super::*;

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(2000))]

        #[test]
        fn verifying_arbitrary_headers_never_panics(
            key in vec(any::<u8>(), 0..64),
            id in ".{0,40}",
            timestamp in prop_oneof![".{0,24}", any::<i64>().prop_map(|t| t.to_string())],
            signatures in prop_oneof![".{0,120}", "(v1,[A-Za-z0-9+/=]{0,60} ?){0,4}"],
            body in vec(any::<u8>(), 0..256),
            now_s in any::<i64>(),
            tolerance_s in any::<u64>(),
        ) {
            let _ = verify_standard(&key, &id, &timestamp, &signatures, &body, now_s, tolerance_s);
            let _ = verify_github(&id, &signatures, &body);
            let _ = verify_github(&id, &format!("sha256={signatures}"), &body);
        }

        #[test]
        fn a_signature_verifies_and_breaks_with_any_changed_byte(
            key in vec(any::<u8>(), 1..64),
            id in "[A-Za-z0-9_]{1,30}",
            ts in 0i64..4_000_000_000,
            body in vec(any::<u8>(), 1..256),
            at in any::<proptest::sample::Index>(),
        ) {
            let sig = sign(&key, &id, ts, &body);
            prop_assert!(verify_standard(&key, &id, &ts.to_string(), &sig, &body, ts, 0).is_ok());
            let mut changed = body.clone();
            changed[at.index(body.len())] ^= 0x01;
            prop_assert!(verify_standard(&key, &id, &ts.to_string(), &sig, &changed, ts, 0).is_err());
            // Outside the tolerance, even a good signature is refused.
            prop_assert!(verify_standard(&key, &id, &ts.to_string(), &sig, &body, ts + 301, 300).is_err());
        }
    }
}
