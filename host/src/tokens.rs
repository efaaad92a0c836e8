//! Client tokens: what a browser or an app presents to talk to its own
//! actor without the admin token (`POST /v1/tokens`, PRODUCT.md §3).
//!
//! A token is a JWT signed with HS256 under a key derived from the node's
//! master key (so every node of a cluster, sharing that key, verifies it);
//! its header's `kid` names the master key, so tokens minted before a
//! master-key rotation stay valid while the old key is configured as a
//! previous one. The claims name one type, one actor id or an id prefix,
//! the verbs allowed (`send`, `events`, `inputs`, `files`) and the expiry;
//! [`Grant::allows`] maps a request to exactly one verb on exactly one
//! actor, and everything else is refused. A token can be revoked by its id
//! (`DELETE /v1/tokens/{id}`): revocations are stored and kept in memory
//! until the longest-lived token could have expired. The key also covers
//! the admin token ([`key_purpose`]): rotating it revokes them all.

use std::collections::HashMap;
use std::sync::{Arc, RwLock};

use jsonwebtoken::{Algorithm, DecodingKey, EncodingKey, Header, Validation};
use serde::{Deserialize, Serialize};
use zeroize::Zeroizing;

use crate::clock::now_ms;
use crate::ids::{ActorKey, IdError};
use crate::storage::{Storage, StorageError, WriteOp};

/// What the token keys are derived for (part of every token's key: a
/// change invalidates every token).
pub const KEY_PURPOSE: &str = "marmot client tokens v1";
/// The longest a token may live.
pub const MAX_TTL_S: u64 = 30 * 24 * 3600;

/// What a token that does not verify is told.
const MALFORMED: &str = "the token is malformed, altered, or not signed by this node's current admin \
                         token and master key";

/// What a node's token keys are derived for: [`KEY_PURPOSE`] and the
/// admin token's SHA-256. Tokens are minted with the admin token, so
/// rotating it (after a leak) ends every client token minted under the
/// old one, as an operator expects; there is nothing else to revoke them
/// in bulk by. A node without an admin token (`marmot dev`) uses the
/// purpose alone.
pub fn key_purpose(admin_token: Option<&str>) -> String {
    use sha2::Digest;
    match admin_token {
        Some(t) => format!(
            "{KEY_PURPOSE}; admin {}",
            hex::encode(sha2::Sha256::digest(t.as_bytes()))
        ),
        None => KEY_PURPOSE.to_owned(),
    }
}

/// Random bytes of a token's id (`jti`, `token_id`: their hex).
const TOKEN_ID_BYTES: usize = 16;

/// `id` as a token id is written when minted (lower-case hex of
/// [`TOKEN_ID_BYTES`]), or why it cannot be one. A revocation names its
/// token exactly: `DELETE /v1/tokens/97928A66…` used to answer "revoked"
/// and store an id no token has, while the token kept working.
pub fn canonical_token_id(id: &str) -> Result<String, TokenError> {
    if id.len() != 2 * TOKEN_ID_BYTES || !id.bytes().all(|b| b.is_ascii_hexdigit()) {
        return Err(TokenError::BadRequest(format!(
            "a token id is the {}-digit hex `token_id` returned when it was minted",
            2 * TOKEN_ID_BYTES
        )));
    }
    Ok(id.to_ascii_lowercase())
}

/// A verb a token may allow.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Scope {
    /// `POST /v1/actors/{type}/{id}` (messages) and cancelling its runs.
    Send,
    /// `GET …/events`, live (SSE) or not.
    Events,
    /// `GET …/inputs` and answering them.
    Inputs,
    /// `GET …/files` and downloads of the actor's artifacts (the files
    /// under `outputs/`; the rest of its workspace stays the operator's).
    Files,
}

impl Scope {
    /// Every scope.
    pub const ALL: [Scope; 4] = [Scope::Send, Scope::Events, Scope::Inputs, Scope::Files];
}

/// The body of `POST /v1/tokens`.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct TokenRequest {
    /// The actor type.
    #[serde(rename = "type")]
    pub ty: String,
    /// One actor id …
    #[serde(default)]
    pub id: Option<String>,
    /// … or every id that starts with this.
    #[serde(default)]
    pub id_prefix: Option<String>,
    /// The verbs allowed.
    pub scopes: Vec<Scope>,
    /// Lifetime in seconds (1 to 30 days).
    pub ttl_s: u64,
}

/// A freshly minted token.
#[derive(Debug, Clone, Serialize)]
pub struct Minted {
    /// `Authorization: Bearer <token>`.
    pub token: String,
    /// When it stops working.
    pub expires_at_ms: u64,
    /// Its id, for revoking it.
    pub token_id: String,
}

/// The claims of a token: what it allows.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Grant {
    /// Token id.
    pub jti: String,
    /// The actor type.
    #[serde(rename = "type")]
    pub ty: String,
    /// One actor id, or
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub id: Option<String>,
    /// every id with this prefix.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub id_prefix: Option<String>,
    /// The verbs allowed.
    pub scopes: Vec<Scope>,
    /// Issued at (s since the epoch).
    pub iat: u64,
    /// Expires at (s since the epoch).
    pub exp: u64,
}

/// Why a request with a client token is refused.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum TokenError {
    /// Not a token of this node: bad signature, unknown key, malformed.
    #[error("invalid token: {0}")]
    Invalid(String),
    /// Past its expiry.
    #[error("the token has expired")]
    Expired,
    /// Revoked by the operator.
    #[error("the token has been revoked")]
    Revoked,
    /// A valid token, for something else.
    #[error("the token does not allow this: {0}")]
    Forbidden(String),
    /// A bad mint request.
    #[error("{0}")]
    BadRequest(String),
}

impl From<IdError> for TokenError {
    fn from(e: IdError) -> Self {
        TokenError::BadRequest(e.to_string())
    }
}

/// One signing key: the master key's id and the derived HMAC key.
struct Key {
    id: String,
    encoding: EncodingKey,
    decoding: DecodingKey,
}

/// Mints, verifies and revokes client tokens.
pub struct Tokens {
    /// The current key first (it signs), then earlier ones (they verify).
    keys: Vec<Key>,
    /// Revoked token ids → when they could expire at the latest (ms).
    revoked: RwLock<HashMap<String, u64>>,
    storage: Arc<Storage>,
}

impl Tokens {
    /// Tokens under `keys` (master key id, derived key; the current one
    /// first), with the revocations stored in `storage`.
    pub fn open(
        storage: Arc<Storage>,
        keys: Vec<(String, Zeroizing<[u8; 32]>)>,
    ) -> Result<Self, StorageError> {
        let keys = keys
            .into_iter()
            .map(|(id, k)| Key {
                id,
                encoding: EncodingKey::from_secret(k.as_slice()),
                decoding: DecodingKey::from_secret(k.as_slice()),
            })
            .collect();
        let revoked = storage.reader()?.revoked_tokens(now_ms())?;
        Ok(Self {
            keys,
            revoked: RwLock::new(revoked.into_iter().collect()),
            storage,
        })
    }

    /// Mint a token for `req` (the type's existence is the caller's check).
    pub fn mint(&self, req: TokenRequest) -> Result<Minted, TokenError> {
        let (id, id_prefix) = match (req.id, req.id_prefix) {
            (Some(id), None) => {
                ActorKey::new(&req.ty, &id)?;
                (Some(id), None)
            }
            (None, Some(prefix)) => {
                ActorKey::new(&req.ty, &prefix)?;
                (None, Some(prefix))
            }
            _ => {
                return Err(TokenError::BadRequest(
                    "give exactly one of `id` and `id_prefix`".into(),
                ));
            }
        };
        if req.scopes.is_empty() {
            return Err(TokenError::BadRequest(
                "`scopes` must name at least one of send, events, inputs, files".into(),
            ));
        }
        if !(1..=MAX_TTL_S).contains(&req.ttl_s) {
            return Err(TokenError::BadRequest(format!(
                "`ttl_s` must be 1 to {MAX_TTL_S} seconds"
            )));
        }
        let mut scopes = req.scopes;
        scopes.sort_by_key(|s| *s as u8);
        scopes.dedup();
        // `exp` is in whole seconds: rounded up, so a token lives at least
        // `ttl_s` (rounded down, a 1 s token could arrive expired).
        let now = now_ms();
        let grant = Grant {
            jti: hex::encode(rand::random::<[u8; TOKEN_ID_BYTES]>()),
            ty: req.ty,
            id,
            id_prefix,
            scopes,
            iat: now / 1000,
            exp: (now + req.ttl_s * 1000).div_ceil(1000),
        };
        let key = &self.keys[0];
        let mut header = Header::new(Algorithm::HS256);
        header.kid = Some(key.id.clone());
        let token = jsonwebtoken::encode(&header, &grant, &key.encoding)
            .map_err(|e| TokenError::Invalid(e.to_string()))?;
        Ok(Minted {
            token,
            expires_at_ms: grant.exp * 1000,
            token_id: grant.jti,
        })
    }

    /// Whether `bearer` looks like a client token (a JWT) rather than the
    /// admin token: the caller then verifies it with [`Self::verify`].
    pub fn looks_like_token(bearer: &str) -> bool {
        bearer.starts_with("eyJ") && bearer.bytes().filter(|b| *b == b'.').count() == 2
    }

    /// The grant of a valid, unexpired, unrevoked token.
    ///
    /// Why a token is invalid is said in one plain sentence: the parser's
    /// own words (base64 offsets, serde's expected variants, an
    /// attacker's `kid` echoed back) help nobody but a prober.
    pub fn verify(&self, token: &str) -> Result<Grant, TokenError> {
        let malformed = |e: &dyn std::fmt::Display| {
            tracing::debug!(error = %e, "client token refused");
            TokenError::Invalid(MALFORMED.into())
        };
        let header = jsonwebtoken::decode_header(token).map_err(|e| malformed(&e))?;
        if header.alg != Algorithm::HS256 {
            return Err(malformed(&"unexpected algorithm"));
        }
        let kid = header.kid.ok_or_else(|| malformed(&"no key id"))?;
        let key = self.keys.iter().find(|k| k.id == kid).ok_or_else(|| {
            TokenError::Invalid(
                "the token was signed with a key this node no longer has (the master key was \
                 rotated); mint a new one"
                    .into(),
            )
        })?;
        let mut validation = Validation::new(Algorithm::HS256);
        validation.leeway = 0;
        validation.set_required_spec_claims(&["exp"]);
        let grant = jsonwebtoken::decode::<Grant>(token, &key.decoding, &validation)
            .map_err(|e| match e.kind() {
                jsonwebtoken::errors::ErrorKind::ExpiredSignature => TokenError::Expired,
                _ => malformed(&e),
            })?
            .claims;
        // Checked again here: the library allows a token in its last second.
        if grant.exp * 1000 <= now_ms() {
            return Err(TokenError::Expired);
        }
        if self
            .revoked
            .read()
            .expect("revocations lock")
            .contains_key(&grant.jti)
        {
            return Err(TokenError::Revoked);
        }
        Ok(grant)
    }

    /// Whether `grant` no longer opens anything: it expired, or its token
    /// was revoked since it was verified (a stream it opened ends then).
    pub fn lapsed(&self, grant: &Grant) -> bool {
        grant.exp * 1000 <= now_ms()
            || self
                .revoked
                .read()
                .expect("revocations lock")
                .contains_key(&grant.jti)
    }

    /// Take the revocations a peer of the cluster has that this node
    /// missed (`(token id, until)`). Returns how many were new.
    pub async fn adopt_revocations(&self, peer: &[(String, u64)]) -> Result<usize, TokenError> {
        let now = now_ms();
        let mut new = 0;
        for (jti, until) in peer {
            let known = self
                .revoked
                .read()
                .expect("revocations lock")
                .contains_key(jti);
            if known || *until <= now {
                continue;
            }
            self.storage
                .writer()
                .call(|done| WriteOp::RevokeToken {
                    jti: jti.clone(),
                    expires_at_ms: *until,
                    now_ms: now,
                    done,
                })
                .await
                .map_err(|e| TokenError::Invalid(format!("cannot store the revocation: {e}")))?;
            self.revoked
                .write()
                .expect("revocations lock")
                .insert(jti.clone(), *until);
            new += 1;
        }
        Ok(new)
    }

    /// Revoke the token `token_id` (whether or not this node minted it):
    /// kept until any token could have expired. Whether it is new.
    pub async fn revoke(&self, token_id: &str) -> Result<bool, TokenError> {
        let jti = canonical_token_id(token_id)?;
        let now = now_ms();
        // A token's `exp` is rounded up to the second: it may live up to
        // a second past `MAX_TTL_S` from now, and so must its revocation.
        let until = now + MAX_TTL_S * 1000 + 1000;
        let new = self
            .storage
            .writer()
            .call(|done| WriteOp::RevokeToken {
                jti: jti.clone(),
                expires_at_ms: until,
                now_ms: now,
                done,
            })
            .await
            .map_err(|e| TokenError::Invalid(format!("cannot store the revocation: {e}")))?;
        let mut revoked = self.revoked.write().expect("revocations lock");
        revoked.retain(|_, exp| *exp > now);
        revoked.insert(jti, until);
        Ok(new)
    }
}

impl Grant {
    /// Whether this grant allows `method` on `path` (a request path, still
    /// percent-encoded): exactly one verb on one actor it names, whose
    /// (type, id) it returns.
    pub fn allows(
        &self,
        method: &axum::http::Method,
        path: &str,
    ) -> Result<(String, String), TokenError> {
        use axum::http::Method;
        let deny = |why: &str| Err(TokenError::Forbidden(why.to_owned()));
        let Some(rest) = path.strip_prefix("/v1/actors/") else {
            return deny("a client token reaches only /v1/actors/{type}/{id}/…");
        };
        let mut parts = rest.split('/');
        let (Some(ty), Some(id)) = (parts.next(), parts.next()) else {
            return deny("a client token reaches one actor, not a list");
        };
        let decode = |s: &str| {
            percent_encoding::percent_decode_str(s)
                .decode_utf8()
                .map(|c| c.into_owned())
                .map_err(|_| TokenError::Forbidden("the path is not UTF-8".into()))
        };
        let (ty, id) = (decode(ty)?, decode(id)?);
        if ty != self.ty {
            return deny("another actor type");
        }
        let own = match (&self.id, &self.id_prefix) {
            (Some(own), _) => id == *own,
            (None, Some(prefix)) => id.starts_with(prefix.as_str()),
            (None, None) => false,
        };
        if !own {
            return deny("another actor");
        }
        let rest: Vec<&str> = parts.collect();
        // HEAD is answered by the GET routes: it opens what GET opens.
        let read = method == Method::GET || method == Method::HEAD;
        let scope = match (read, method, rest.as_slice()) {
            (false, &Method::POST, []) => Scope::Send,
            (false, &Method::POST, ["runs", _, "cancel"]) => Scope::Send,
            (true, _, ["events"]) => Scope::Events,
            (true, _, ["inputs"]) | (false, &Method::POST, ["inputs", _]) => Scope::Inputs,
            // The listing shows a token only `outputs/` (api/files.rs).
            (true, _, ["files"]) | (true, _, ["files", "outputs", _, ..]) => Scope::Files,
            (true, _, ["files", ..]) => {
                return deny(
                    "a client token reaches only the actor's artifacts, the files under `outputs/`",
                );
            }
            _ => return deny("this endpoint is for the admin token only"),
        };
        if !self.scopes.contains(&scope) {
            return Err(TokenError::Forbidden(format!(
                "the token's scopes do not include `{}`",
                serde_json::to_value(scope)
                    .ok()
                    .and_then(|v| v.as_str().map(str::to_owned))
                    .unwrap_or_default()
            )));
        }
        Ok((ty, id))
    }
}

#[cfg(test)]
mod tests {
    use axum::http::Method;

    use super::*;

    pub(super) fn grant(id: Option<&str>, prefix: Option<&str>, scopes: &[Scope]) -> Grant {
        Grant {
            jti: "00".into(),
            ty: "assistant".into(),
            id: id.map(str::to_owned),
            id_prefix: prefix.map(str::to_owned),
            scopes: scopes.to_vec(),
            iat: 0,
            exp: u64::MAX / 2000,
        }
    }

    #[test]
    fn a_grant_allows_its_verbs_on_its_actor_and_nothing_else() {
        let g = grant(Some("alice"), None, &[Scope::Send, Scope::Events]);
        assert!(
            g.allows(&Method::POST, "/v1/actors/assistant/alice")
                .is_ok()
        );
        assert!(
            g.allows(&Method::POST, "/v1/actors/assistant/alice/runs/r1/cancel")
                .is_ok()
        );
        assert!(
            g.allows(&Method::GET, "/v1/actors/assistant/alice/events")
                .is_ok()
        );
        for (m, p) in [
            (Method::POST, "/v1/actors/assistant/bob"),
            (Method::POST, "/v1/actors/assistant/alicex"),
            (Method::POST, "/v1/actors/other/alice"),
            (Method::GET, "/v1/actors/assistant/alice/files"),
            (Method::GET, "/v1/actors/assistant/alice/inputs"),
            (Method::GET, "/v1/actors/assistant/alice/state"),
            (Method::POST, "/v1/actors/assistant/alice/eval"),
            (Method::DELETE, "/v1/actors/assistant/alice"),
            (Method::GET, "/v1/actors/assistant/alice"),
            (Method::GET, "/v1/actors/assistant"),
            (Method::PUT, "/v1/types/assistant"),
            (Method::GET, "/v1/secrets"),
            (Method::POST, "/v1/tokens"),
        ] {
            assert!(g.allows(&m, p).is_err(), "{m} {p}");
        }
    }

    #[test]
    fn prefixes_and_encoded_ids_are_compared_decoded() {
        let g = grant(None, Some("team-7/"), &[Scope::Files, Scope::Inputs]);
        assert!(
            g.allows(
                &Method::GET,
                "/v1/actors/assistant/team-7%2Falice/files/outputs/b.txt"
            )
            .is_ok()
        );
        // The files scope opens artifacts (`outputs/`), and HEAD as GET.
        assert!(
            g.allows(
                &Method::GET,
                "/v1/actors/assistant/team-7%2Falice/files/a/b.txt"
            )
            .is_err()
        );
        assert!(
            g.allows(&Method::HEAD, "/v1/actors/assistant/team-7%2Fa/files")
                .is_ok()
        );
        assert!(
            g.allows(&Method::HEAD, "/v1/actors/assistant/team-7%2Fa/inputs/i1")
                .is_err()
        );
        assert!(
            g.allows(&Method::POST, "/v1/actors/assistant/team-7%2Fbob/inputs/i1")
                .is_ok()
        );
        assert!(
            g.allows(&Method::GET, "/v1/actors/assistant/team-8%2Falice/files")
                .is_err()
        );
        // `team-7` alone does not start with `team-7/`.
        assert!(
            g.allows(&Method::GET, "/v1/actors/assistant/team-7/files")
                .is_err()
        );
        assert!(
            g.allows(&Method::GET, "/v1/actors/assistant/team-7%FF/files")
                .is_err()
        );
    }
}

/// Request paths and methods from anyone holding a token: a decision,
/// never a panic, and a grant opens only its own actor.
#[cfg(test)]
mod props {
    use axum::http::Method;
    use proptest::prelude::*;

    use super::*;

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(3000))]

        #[test]
        fn a_grant_opens_only_its_own_actor(
            path in prop_oneof![
                ".{0,80}",
                "/v1/actors/(assistant|other|%61ssistant)/(alice|bob|team-7%2F[a-z]{0,4}|%FF|)(/(events|inputs|files|runs|cancel|state|eval|[a-z%0-9.]{0,6})){0,3}",
            ],
            method in prop_oneof![Just(Method::GET), Just(Method::POST), Just(Method::PUT), Just(Method::DELETE)],
            prefix in any::<bool>(),
        ) {
            let all = [Scope::Send, Scope::Events, Scope::Inputs, Scope::Files];
            let grant = if prefix {
                super::tests::grant(None, Some("team-7/"), &all)
            } else {
                super::tests::grant(Some("alice"), None, &all)
            };
            if let Ok((ty, id)) = grant.allows(&method, &path) {
                prop_assert_eq!(ty, "assistant");
                if prefix {
                    prop_assert!(id.starts_with("team-7/"));
                } else {
                    prop_assert_eq!(id, "alice");
                }
            }
            let _ = Tokens::looks_like_token(&path);
        }
    }
}
