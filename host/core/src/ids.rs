//! Names users choose: actor types, actor ids, idempotency keys, state keys,
//! hook and subscription names.
//!
//! Validation lives here so that the HTTP API, the CLI and the guest-facing
//! capabilities agree on what is allowed.

use std::fmt;
use std::sync::Arc;

/// An actor's address: `(type, id)`. Cheap to clone.
#[derive(Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct ActorKey {
    ty: Arc<str>,
    id: Arc<str>,
}

impl ActorKey {
    /// Validate and build a key.
    pub fn new(ty: &str, id: &str) -> Result<Self, IdError> {
        validate_type_name(ty)?;
        validate_actor_id(id)?;
        Ok(Self::new_unchecked(ty, id))
    }

    /// Build a key from names read back from storage (already validated).
    pub fn new_unchecked(ty: &str, id: &str) -> Self {
        Self {
            ty: ty.into(),
            id: id.into(),
        }
    }

    /// The actor type.
    pub fn ty(&self) -> &str {
        &self.ty
    }

    /// The actor id.
    pub fn id(&self) -> &str {
        &self.id
    }
}

impl fmt::Debug for ActorKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}/{:?}", self.ty, self.id)
    }
}

impl fmt::Display for ActorKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}/{}", self.ty, self.id)
    }
}

/// A name or id that is not allowed.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum IdError {
    /// Bad actor type name.
    #[error("invalid actor type `{name}`: {why}")]
    Type {
        /// The name (truncated).
        name: String,
        /// Why.
        why: &'static str,
    },
    /// Bad actor id.
    #[error("invalid actor id: {why}")]
    Id {
        /// Why.
        why: &'static str,
    },
    /// Bad idempotency key.
    #[error("invalid Idempotency-Key: {why}")]
    IdempotencyKey {
        /// Why.
        why: &'static str,
    },
    /// Bad file path.
    #[error("invalid file path: {why}")]
    Path {
        /// Why.
        why: &'static str,
    },
    /// Bad hook or subscription name.
    #[error("{what} `{name}` must be 1 to {MAX_NAME} of A-Z a-z 0-9 . _ -")]
    Name {
        /// What the name names.
        what: NameKind,
        /// The name (truncated).
        name: String,
    },
}

/// Things named by short names (`A-Za-z0-9._-`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum NameKind {
    /// An inbound webhook's name.
    Hook,
    /// An outbound webhook subscription.
    Subscription,
    /// A secret in the node's secret store.
    Secret,
    /// A model provider.
    Provider,
}

impl fmt::Display for NameKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            NameKind::Hook => "hook name",
            NameKind::Subscription => "subscription name",
            NameKind::Secret => "secret name",
            NameKind::Provider => "provider name",
        })
    }
}

/// Longest actor type name.
pub const MAX_TYPE_NAME: usize = 64;
/// Longest actor id, in bytes.
pub const MAX_ACTOR_ID: usize = 256;
/// Longest state key, in bytes.
pub const MAX_STATE_KEY: usize = 1024;
/// Longest idempotency key.
pub const MAX_IDEMPOTENCY_KEY: usize = 256;
/// Longest hook or subscription name.
pub const MAX_NAME: usize = 64;

/// Type names: 1–64 characters of `a-z`, `0-9`, `-`, `_`, starting with a
/// letter or digit (they appear in URLs, metrics and logs).
pub fn validate_type_name(name: &str) -> Result<(), IdError> {
    let err = |why| IdError::Type {
        name: name.chars().take(80).collect(),
        why,
    };
    if name.is_empty() {
        return Err(err("must not be empty"));
    }
    if name.len() > MAX_TYPE_NAME {
        return Err(err("must be at most 64 characters"));
    }
    if !name
        .bytes()
        .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-' || b == b'_')
    {
        return Err(err("may only contain a-z, 0-9, '-' and '_'"));
    }
    if !name.as_bytes()[0].is_ascii_alphanumeric() {
        return Err(err("must start with a letter or digit"));
    }
    Ok(())
}

/// Actor ids: UTF-8, 1–256 bytes, no control characters.
pub fn validate_actor_id(id: &str) -> Result<(), IdError> {
    if id.is_empty() {
        return Err(IdError::Id {
            why: "must not be empty",
        });
    }
    if id.len() > MAX_ACTOR_ID {
        return Err(IdError::Id {
            why: "must be at most 256 bytes",
        });
    }
    if id.chars().any(char::is_control) {
        return Err(IdError::Id {
            why: "must not contain control characters",
        });
    }
    Ok(())
}

/// Idempotency keys: 1–256 bytes of visible ASCII.
pub fn validate_idempotency_key(key: &str) -> Result<(), IdError> {
    if key.is_empty() || key.len() > MAX_IDEMPOTENCY_KEY {
        return Err(IdError::IdempotencyKey {
            why: "must be 1 to 256 characters",
        });
    }
    if !key.bytes().all(|b| b.is_ascii_graphic()) {
        return Err(IdError::IdempotencyKey {
            why: "must be visible ASCII without spaces",
        });
    }
    Ok(())
}

/// Longest file path, in bytes.
pub const MAX_FILE_PATH: usize = 1024;

/// Actor file paths: relative and `/`-separated, 1–1024 bytes of UTF-8;
/// no empty, `.` or `..` segment (so no leading, trailing or doubled `/`),
/// no NUL, backslash or other control characters, segments of at most 255
/// bytes. A path names one file in the actor's own tree and nothing else.
pub fn validate_file_path(path: &str) -> Result<(), IdError> {
    let err = |why| Err(IdError::Path { why });
    if path.is_empty() {
        return err("must not be empty");
    }
    if path.len() > MAX_FILE_PATH {
        return err("must be at most 1024 bytes");
    }
    if path.chars().any(|c| c.is_control() || c == '\\') {
        return err("must not contain NUL, backslashes or control characters");
    }
    for segment in path.split('/') {
        match segment {
            "" => {
                return err(
                    "must be relative, without empty segments (`//`, leading or trailing `/`)",
                );
            }
            "." | ".." => return err("must not contain `.` or `..` segments"),
            s if s.len() > 255 => return err("segments must be at most 255 bytes"),
            _ => {}
        }
    }
    Ok(())
}

/// Hook names (the last segment of `/v1/hooks/{type}/{id}/{name}`, keys of
/// `webhook_routes`): 1–64 of `A-Za-z0-9._-`.
pub fn validate_hook_name(name: &str) -> Result<(), IdError> {
    validate_name(NameKind::Hook, name)
}

/// Outbound webhook subscription names: like hook names.
pub fn validate_subscription_name(name: &str) -> Result<(), IdError> {
    validate_name(NameKind::Subscription, name)
}

/// Secret names (`{{secret:NAME}}`, `/v1/secrets/{name}`): like hook
/// names, so that they fit a URL and a placeholder unescaped.
pub fn validate_secret_name(name: &str) -> Result<(), IdError> {
    validate_name(NameKind::Secret, name)
}

/// Model provider names: 1–64 characters of `A-Za-z0-9._-`.
pub fn validate_provider_name(name: &str) -> Result<(), IdError> {
    validate_name(NameKind::Provider, name)
}

fn validate_name(what: NameKind, name: &str) -> Result<(), IdError> {
    if name.is_empty()
        || name.len() > MAX_NAME
        || !name
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b"._-".contains(&b))
    {
        return Err(IdError::Name {
            what,
            name: name.chars().take(80).collect(),
        });
    }
    Ok(())
}

/// A new message id: 48 bits of milliseconds then 80 random bits, as 32 hex
/// digits, so ids sort by time.
pub fn new_message_id() -> String {
    let ms = crate::clock::now_ms() & 0xffff_ffff_ffff;
    let r: u128 = rand::random::<u128>() & ((1u128 << 80) - 1);
    format!("{:032x}", (u128::from(ms) << 80) | r)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn type_names() {
        assert!(validate_type_name("counter").is_ok());
        assert!(validate_type_name("a-b_c9").is_ok());
        assert!(validate_type_name("").is_err());
        assert!(validate_type_name("Counter").is_err());
        assert!(validate_type_name("-x").is_err());
        assert!(validate_type_name("a/b").is_err());
        assert!(validate_type_name(&"a".repeat(65)).is_err());
    }

    #[test]
    fn actor_ids() {
        assert!(validate_actor_id("alice").is_ok());
        assert!(validate_actor_id("ticket/42 ünïcode").is_ok());
        assert!(validate_actor_id(&"x".repeat(256)).is_ok());
        assert!(validate_actor_id(&"x".repeat(257)).is_err());
        assert!(validate_actor_id("").is_err());
        assert!(validate_actor_id("a\nb").is_err());
        assert!(validate_actor_id("a\u{7f}b").is_err());
    }

    #[test]
    fn file_paths() {
        for ok in [
            "a",
            "outputs/report.md",
            "a b/ünï.txt",
            ".hidden",
            "a..b",
            "x/.y",
        ] {
            assert!(validate_file_path(ok).is_ok(), "{ok:?}");
        }
        for bad in [
            "",
            "/etc/passwd",
            "a/",
            "a//b",
            ".",
            "..",
            "../x",
            "a/../b",
            "a/./b",
            "a\\b",
            "a\0b",
            "a\nb",
        ] {
            assert!(validate_file_path(bad).is_err(), "{bad:?}");
        }
        assert!(validate_file_path(&"x".repeat(1025)).is_err());
        assert!(validate_file_path(&"x".repeat(256)).is_err());
    }

    #[test]
    fn hook_and_subscription_names() {
        assert!(validate_hook_name("github").is_ok());
        assert!(validate_hook_name("a.b-c_d").is_ok());
        assert!(validate_hook_name("").is_err());
        assert!(validate_hook_name("a/b").is_err());
        assert!(validate_hook_name(&"a".repeat(65)).is_err());
        let e = validate_subscription_name("a b").unwrap_err().to_string();
        assert!(e.starts_with("subscription name `a b`"), "{e}");
    }

    #[test]
    fn message_ids_sort_by_time() {
        let a = new_message_id();
        std::thread::sleep(std::time::Duration::from_millis(2));
        let b = new_message_id();
        assert_eq!(a.len(), 32);
        assert!(a < b);
    }
}

/// Names from URLs and guests: validation never panics, and what passes
/// keeps the documented bounds.
#[cfg(test)]
mod props {
    use proptest::prelude::*;

    use super::*;

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(3000))]

        #[test]
        fn validation_never_panics_and_keeps_its_bounds(s in prop_oneof![".{0,300}", "[a-z0-9./_-]{0,40}"]) {
            if validate_actor_id(&s).is_ok() {
                prop_assert!(!s.is_empty() && s.len() <= 256 && !s.chars().any(char::is_control));
            }
            if validate_type_name(&s).is_ok() {
                prop_assert!(!s.is_empty() && !s.contains('/'));
            }
            if validate_idempotency_key(&s).is_ok() {
                prop_assert!(s.bytes().all(|b| b.is_ascii_graphic() || b == b' '));
            }
            if validate_file_path(&s).is_ok() {
                prop_assert!(!s.split('/').any(|seg| seg == ".." || seg == "." || seg.is_empty()));
                prop_assert!(!s.starts_with('/') && !s.contains('\\'));
            }
            let _ = validate_hook_name(&s);
            let _ = validate_subscription_name(&s);
            let _ = validate_secret_name(&s);
            let _ = validate_provider_name(&s);
            let _ = ActorKey::new(&s, &s);
        }
    }
}
