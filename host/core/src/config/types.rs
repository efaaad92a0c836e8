//! Per-type configuration: what a deploy may set, and what it resolves to
//! with the node's [`TypeDefaults`].

use std::collections::BTreeMap;
use std::time::Duration;

use serde::{Deserialize, Serialize};

use super::{Limits, TypeDefaults};

/// Per-type configuration, sent with a deploy and stored with the version.
///
/// Every key is optional; unset ones use the node's [`TypeDefaults`].
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct TypeConfig {
    /// Hibernate after this long without work.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub idle_timeout_ms: Option<u64>,
    /// Wall-clock limit of one turn.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub turn_timeout_ms: Option<u64>,
    /// CPU a guest may burn without calling the host.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub cpu_slice_ms: Option<u64>,
    /// Guest linear memory.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub max_memory_bytes: Option<u64>,
    /// Hosts the `http` capability may reach: `api.example.com`,
    /// `*.example.com`. None by default.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub allowed_hosts: Vec<String>,
    /// HTTP methods the `http` capability may use (default: all of GET,
    /// HEAD, POST, PUT, PATCH, DELETE, OPTIONS).
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub allowed_methods: Vec<String>,
    /// Redirects an outbound request follows (default 0: none, the guest
    /// gets the 3xx). Every hop is checked like the first; secrets are
    /// never sent to a host other than the one they were written for.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub max_redirects: Option<u32>,
    /// Outbound requests in flight at once across the type's actors
    /// (default 16).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub http_concurrency: Option<u32>,
    /// Messages per second the type's actors take on this node, together:
    /// client messages, inbound webhooks, and other actors' `actors.send`
    /// and `actors.call`. Past it a client gets 429 `rate_limited` with
    /// `Retry-After`, a turn's send or call fails with `limit-exceeded`.
    /// Alarms and input answers are not counted. Unlimited by default.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub rate_limit_per_s: Option<u32>,
    /// Messages taken at once above the rate (default: one second's worth).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub rate_limit_burst: Option<u32>,
    /// Secrets the type may name.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub secrets: Vec<String>,
    /// Secret for verifying inbound webhooks (`whsec_…`). Never shown back.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub webhook_secret: Option<String>,
    /// Inbound webhooks posted to `/v1/hooks/{type}/_/{name}` go to the
    /// actor whose id is at this JSON pointer (RFC 6901) in the payload,
    /// by hook name: `{"zendesk": "/ticket/id"}`.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub webhook_routes: BTreeMap<String, String>,
    /// Environment visible to the guest through WASI.
    #[serde(skip_serializing_if = "BTreeMap::is_empty")]
    pub env: BTreeMap<String, String>,
    /// Limits on model spending (tokens, and dollars where the providers'
    /// prices are configured), for all actors of the type together and for
    /// each one.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub budget: Option<Budget>,
}

/// A type's model budget: totals since the type was created (or the actor
/// first called a model). A call that could exceed one is refused before
/// it is sent, with `budget_exceeded`.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct Budget {
    /// Tokens (prompt + generated) of all the type's actors.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub max_tokens: Option<u64>,
    /// US dollars of all the type's actors.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub max_cost_usd: Option<Usd>,
    /// Tokens of one actor.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub actor_max_tokens: Option<u64>,
    /// US dollars of one actor.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub actor_max_cost_usd: Option<Usd>,
}

impl Budget {
    /// Whether any limit is set.
    pub fn limits_anything(&self) -> bool {
        self.max_tokens.is_some()
            || self.max_cost_usd.is_some()
            || self.actor_max_tokens.is_some()
            || self.actor_max_cost_usd.is_some()
    }

    /// Whether a dollar limit is set (then prices are needed).
    pub fn limits_cost(&self) -> bool {
        self.max_cost_usd.is_some() || self.actor_max_cost_usd.is_some()
    }
}

/// An amount of US dollars, kept in billionths so sums are exact; written
/// as a number of dollars (`12.5`).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct Usd {
    /// Billionths of a dollar.
    pub nano: u64,
}

impl Usd {
    /// From billionths of a dollar.
    pub fn from_nano(nano: u64) -> Self {
        Self { nano }
    }

    /// As dollars.
    pub fn dollars(self) -> f64 {
        self.nano as f64 / 1e9
    }
}

impl Serialize for Usd {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_f64(self.dollars())
    }
}

impl<'de> Deserialize<'de> for Usd {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let v = f64::deserialize(d)?;
        if !v.is_finite() || !(0.0..=1e9).contains(&v) {
            return Err(serde::de::Error::custom(
                "a dollar amount must be a number from 0 to 1e9",
            ));
        }
        Ok(Usd {
            nano: (v * 1e9).round() as u64,
        })
    }
}

/// A day in milliseconds: the bound of a type's timeouts.
const DAY_MS: u64 = 86_400_000;

/// Methods the `http` capability knows (upper case).
pub const HTTP_METHODS: &[&str] = &["GET", "HEAD", "POST", "PUT", "PATCH", "DELETE", "OPTIONS"];

impl TypeConfig {
    /// Check the values against the node's limits. Values whose format
    /// belongs to a capability (the `webhook_secret`) are checked by that
    /// capability at deploy.
    pub fn validate(&self, limits: &Limits) -> Result<(), String> {
        if let Some(m) = self.max_memory_bytes {
            if m < (1 << 20) {
                return Err("config.max_memory_bytes must be at least 1 MiB".into());
            }
            if m > limits.max_guest_memory_bytes {
                return Err(format!(
                    "config.max_memory_bytes ({m}) exceeds this node's limit ({})",
                    limits.max_guest_memory_bytes
                ));
            }
        }
        for (name, v) in [
            ("idle_timeout_ms", self.idle_timeout_ms),
            ("turn_timeout_ms", self.turn_timeout_ms),
            ("cpu_slice_ms", self.cpu_slice_ms),
        ] {
            if v == Some(0) {
                return Err(format!("config.{name} must be greater than 0"));
            }
        }
        for k in self.env.keys() {
            if k.is_empty() || k.contains('=') || k.contains('\0') {
                return Err(format!("config.env has an invalid variable name `{k}`"));
            }
        }
        for (name, pointer) in &self.webhook_routes {
            crate::ids::validate_hook_name(name)
                .map_err(|e| format!("config.webhook_routes: {e}"))?;
            if !pointer.starts_with('/') {
                return Err(format!(
                    "config.webhook_routes.{name} must be a JSON pointer such as `/ticket/id`"
                ));
            }
        }
        for m in &self.allowed_methods {
            if !HTTP_METHODS.contains(&m.as_str()) {
                return Err(format!(
                    "config.allowed_methods: `{m}` is not one of {}",
                    HTTP_METHODS.join(", ")
                ));
            }
        }
        if self.max_redirects.is_some_and(|n| n > 20) {
            return Err("config.max_redirects may be at most 20".into());
        }
        if self.rate_limit_per_s == Some(0) {
            return Err(
                "config.rate_limit_per_s must be at least 1 (leave it out for no limit)".into(),
            );
        }
        if self.rate_limit_burst == Some(0) {
            return Err("config.rate_limit_burst must be at least 1".into());
        }
        if self.rate_limit_burst.is_some() && self.rate_limit_per_s.is_none() {
            return Err("config.rate_limit_burst needs a config.rate_limit_per_s".into());
        }
        if self.http_concurrency == Some(0) {
            return Err("config.http_concurrency must be at least 1".into());
        }
        for name in &self.secrets {
            crate::ids::validate_secret_name(name).map_err(|e| format!("config.secrets: {e}"))?;
        }
        if !self.webhook_routes.is_empty() && self.webhook_secret.is_none() {
            return Err("config.webhook_routes needs a config.webhook_secret".into());
        }
        Ok(())
    }

    /// The upper bounds of a new deploy's timeouts: a day at most for a
    /// turn or its CPU slice (an agent's turn waits on model calls for
    /// minutes, never days), a week to hibernate. A type could set both
    /// to 2^64 − 1 ms and have no limit at all (found by a probe). Not
    /// [`Self::validate`]: a version deployed before the bounds, installed
    /// from a peer's catalog, is taken as it was.
    pub fn validate_bounds(&self) -> Result<(), String> {
        for (name, v, max) in [
            ("idle_timeout_ms", self.idle_timeout_ms, 7 * DAY_MS),
            ("turn_timeout_ms", self.turn_timeout_ms, DAY_MS),
            ("cpu_slice_ms", self.cpu_slice_ms, DAY_MS),
        ] {
            if let Some(v) = v.filter(|v| *v > max) {
                return Err(format!("config.{name} may be at most {max} ({v} given)"));
            }
        }
        Ok(())
    }

    /// The settings with defaults applied; `js` selects the JavaScript
    /// defaults where they differ.
    pub fn resolve(&self, d: &TypeDefaults, js: bool) -> ResolvedTypeConfig {
        let memory_default = if js {
            d.js_max_memory_bytes
        } else {
            d.max_memory_bytes
        };
        // Held to the bounds of a new deploy (`validate_bounds`) here too: a
        // version deployed before them, or a node default past them, would
        // have no limit (found by a probe).
        let ms = |v: u64, max: u64| Duration::from_millis(v.min(max));
        ResolvedTypeConfig {
            idle_timeout: ms(
                self.idle_timeout_ms.unwrap_or(d.idle_timeout_ms),
                7 * DAY_MS,
            ),
            turn_timeout: ms(self.turn_timeout_ms.unwrap_or(d.turn_timeout_ms), DAY_MS),
            cpu_slice: ms(self.cpu_slice_ms.unwrap_or(d.cpu_slice_ms), DAY_MS),
            cpu_slice_is_total: false,
            max_memory_bytes: self.max_memory_bytes.unwrap_or(memory_default),
            env: self.env.clone(),
            budget: self.budget.filter(Budget::limits_anything),
            http: ResolvedHttp {
                allowed_hosts: self.allowed_hosts.clone(),
                allowed_methods: if self.allowed_methods.is_empty() {
                    HTTP_METHODS.iter().map(|m| (*m).to_owned()).collect()
                } else {
                    self.allowed_methods.clone()
                },
                secrets: self.secrets.clone(),
                max_redirects: self.max_redirects.unwrap_or(0),
                concurrency: self.http_concurrency.unwrap_or(16),
            },
        }
    }

    /// The config as shown by the API: secrets redacted.
    pub fn redacted(&self) -> Self {
        let mut c = self.clone();
        if c.webhook_secret.is_some() {
            c.webhook_secret = Some("<redacted>".into());
        }
        c
    }
}

/// A type's settings with defaults applied.
#[derive(Debug, Clone)]
pub struct ResolvedTypeConfig {
    /// Hibernate after this long without work.
    pub idle_timeout: Duration,
    /// Wall-clock limit of one turn.
    pub turn_timeout: Duration,
    /// CPU a guest may burn without calling the host.
    pub cpu_slice: Duration,
    /// `cpu_slice` is all the CPU a run may burn, host calls or not
    /// (scripts: PRODUCT.md's "JS eval: 2 s CPU"). A turn's slice starts
    /// again at each host call instead: a handler that waits on the host
    /// between stretches of work is not stopped for the sum of them.
    pub cpu_slice_is_total: bool,
    /// Guest linear memory.
    pub max_memory_bytes: u64,
    /// WASI environment.
    pub env: BTreeMap<String, String>,
    /// Model budget, if it limits anything.
    pub budget: Option<Budget>,
    /// Outbound HTTP: host patterns, methods, secrets, redirects and
    /// concurrency (unchecked text; the `http` capability parses it).
    pub http: ResolvedHttp,
}

/// A type's outbound HTTP settings with defaults applied.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ResolvedHttp {
    /// Host patterns it may reach (none: no outbound HTTP).
    pub allowed_hosts: Vec<String>,
    /// Methods it may use (upper case).
    pub allowed_methods: Vec<String>,
    /// Secrets it may name.
    pub secrets: Vec<String>,
    /// Redirects followed.
    pub max_redirects: u32,
    /// Requests in flight at once across the type's actors.
    pub concurrency: u32,
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A version deployed before the bounds, or a node default past them,
    /// runs under them all the same.
    #[test]
    fn timeouts_resolve_within_their_bounds() {
        let huge = TypeConfig {
            idle_timeout_ms: Some(u64::MAX),
            turn_timeout_ms: Some(u64::MAX),
            cpu_slice_ms: Some(u64::MAX),
            ..Default::default()
        };
        assert!(huge.validate_bounds().is_err());
        let r = huge.resolve(&TypeDefaults::default(), true);
        assert_eq!(r.idle_timeout, Duration::from_millis(7 * DAY_MS));
        assert_eq!(r.turn_timeout, Duration::from_millis(DAY_MS));
        assert_eq!(r.cpu_slice, Duration::from_millis(DAY_MS));
        let small = TypeConfig {
            turn_timeout_ms: Some(2_000),
            ..Default::default()
        };
        let r = small.resolve(&TypeDefaults::default(), false);
        assert_eq!(r.turn_timeout, Duration::from_secs(2));
    }
}
