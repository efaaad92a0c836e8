//! The node's model providers (`PUT /v1/providers/{name}`): where each API
//! is, which wire format it speaks, which secret holds its key, and what
//! its models cost. Stored in redb as given; validated on write and again
//! when the node starts.

use std::collections::{BTreeMap, HashMap};
use std::sync::{Arc, RwLock};

use serde::{Deserialize, Serialize};
use url::Url;

use super::wire::{EncodeOptions, Format};
use crate::egress::policy::HostPattern;
use crate::ids::{IdError, validate_provider_name, validate_secret_name};
use crate::storage::schema::ProviderRecord;
use crate::storage::{Storage, StorageError, WriteOp};

/// A provider as the API takes it and shows it.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ProviderSpec {
    /// `openai-chat`, `openai-responses` or `anthropic-messages`.
    pub format: String,
    /// The API's base URL (`https://api.openai.com/v1`); the format's path
    /// (`/chat/completions`, `/responses`, `/messages`) is added to it.
    /// Defaults to the vendor's own API.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub base_url: Option<String>,
    /// The secret holding the API key (optional for local servers). The
    /// secret's `hosts` must allow the base URL's host, over https.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub key_secret: Option<String>,
    /// Extra headers sent with every call (`OpenAI-Organization`,
    /// `anthropic-beta`). Not for keys: those go in the secret store.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub headers: BTreeMap<String, String>,
    /// Prices per model, to report the cost of calls and enforce cost
    /// budgets.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub prices: BTreeMap<String, Price>,
    /// `openai-chat` only: send `max_completion_tokens` instead of
    /// `max_tokens`. Defaults to true for api.openai.com, false elsewhere.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_completion_tokens: Option<bool>,
}

/// What a model's tokens cost, in US dollars per million.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Price {
    /// Per million prompt tokens.
    pub input_per_mtok: f64,
    /// Per million generated tokens.
    pub output_per_mtok: f64,
}

/// A validated provider, ready to call.
#[derive(Debug, Clone)]
pub struct Provider {
    /// Its name.
    pub name: String,
    /// Its wire format.
    pub format: Format,
    /// Base URL, ending in `/`.
    pub base_url: Url,
    /// Secret holding the key.
    pub key_secret: Option<String>,
    /// Extra headers.
    pub headers: Vec<(String, String)>,
    /// Prices by model.
    pub prices: HashMap<String, Price>,
    /// How requests are written.
    pub encode: EncodeOptions,
}

impl Provider {
    /// Where a call goes.
    pub fn endpoint(&self) -> Url {
        self.base_url
            .join(self.format.path())
            .expect("a relative path joins any base")
    }

    /// The price of `model`, when configured.
    pub fn price(&self, model: &str) -> Option<Price> {
        self.prices.get(model).copied()
    }
}

/// What the API shows of a provider.
#[derive(Debug, Clone, Serialize)]
pub struct ProviderInfo {
    /// Its name.
    pub name: String,
    /// As configured.
    #[serde(flatten)]
    pub spec: ProviderSpec,
    /// When it was first set.
    pub created_at_ms: u64,
    /// When it last changed.
    pub updated_at_ms: u64,
}

/// Why a provider operation failed.
#[derive(Debug, thiserror::Error)]
pub enum ProviderConfigError {
    /// A bad name.
    #[error(transparent)]
    Name(#[from] IdError),
    /// A bad configuration.
    #[error("{0}")]
    Invalid(String),
    /// No such provider.
    #[error("no provider `{0}`")]
    NotFound(String),
    /// Storage failed.
    #[error(transparent)]
    Storage(#[from] StorageError),
}

/// Headers a provider's config may not set: the gateway owns them.
const RESERVED_HEADERS: &[&str] = &[
    "authorization",
    "x-api-key",
    "api-key",
    "proxy-authorization",
    "host",
    "content-type",
    "content-length",
    "transfer-encoding",
    "connection",
    "cookie",
    "accept-encoding",
];

impl ProviderSpec {
    /// Check the spec and build the provider it describes.
    pub fn validate(&self, name: &str) -> Result<Provider, ProviderConfigError> {
        let invalid = ProviderConfigError::Invalid;
        let format = Format::parse(&self.format).ok_or_else(|| {
            invalid(format!(
                "format must be one of {}, not `{}`",
                Format::ALL.map(|(n, _)| n).join(", "),
                self.format
            ))
        })?;
        let base = self.base_url.clone().unwrap_or_else(|| {
            match format {
                Format::AnthropicMessages => "https://api.anthropic.com/v1",
                _ => "https://api.openai.com/v1",
            }
            .into()
        });
        let mut base_url = Url::parse(&base)
            .map_err(|e| invalid(format!("base_url `{base}` is not a URL: {e}")))?;
        if !matches!(base_url.scheme(), "http" | "https") || base_url.host().is_none() {
            return Err(invalid(format!("base_url `{base}` must be an http(s) URL")));
        }
        if !base_url.username().is_empty() || base_url.password().is_some() {
            return Err(invalid(
                "base_url must not hold credentials; put the key in the secret store and name it in key_secret".into(),
            ));
        }
        if base_url.query().is_some() || base_url.fragment().is_some() {
            return Err(invalid("base_url must not have a query or fragment".into()));
        }
        if !base_url.path().ends_with('/') {
            let path = format!("{}/", base_url.path());
            base_url.set_path(&path);
        }
        if let Some(secret) = &self.key_secret {
            validate_secret_name(secret)?;
            if base_url.scheme() != "https" {
                return Err(invalid(format!(
                    "a key is only ever sent over https: base_url `{base}` must be https to use key_secret"
                )));
            }
        }
        let mut headers = Vec::new();
        for (k, v) in &self.headers {
            let lower = k.to_ascii_lowercase();
            if RESERVED_HEADERS.contains(&lower.as_str()) || lower.starts_with("proxy-") {
                return Err(invalid(format!(
                    "header `{k}` is set by the gateway (keys belong in key_secret)"
                )));
            }
            if reqwest::header::HeaderName::from_bytes(k.as_bytes()).is_err()
                || reqwest::header::HeaderValue::from_str(v).is_err()
            {
                return Err(invalid(format!("header `{k}` is not a valid HTTP header")));
            }
            if v.contains("{{") {
                return Err(invalid(format!(
                    "header `{k}`: placeholders are not substituted here; use key_secret"
                )));
            }
            headers.push((lower, v.clone()));
        }
        for (model, p) in &self.prices {
            let ok = |x: f64| x.is_finite() && x >= 0.0;
            if !ok(p.input_per_mtok) || !ok(p.output_per_mtok) {
                return Err(invalid(format!(
                    "prices of `{model}` must be non-negative numbers"
                )));
            }
        }
        if self.max_completion_tokens.is_some() && format != Format::OpenAiChat {
            return Err(invalid(
                "max_completion_tokens applies to the openai-chat format only".into(),
            ));
        }
        let max_completion_tokens = self
            .max_completion_tokens
            .unwrap_or(base_url.host_str() == Some("api.openai.com"));
        Ok(Provider {
            name: name.to_owned(),
            format,
            base_url,
            key_secret: self.key_secret.clone(),
            headers,
            prices: self.prices.iter().map(|(k, v)| (k.clone(), *v)).collect(),
            encode: EncodeOptions {
                max_completion_tokens,
            },
        })
    }
}

/// The providers, cached in memory.
pub struct Providers {
    storage: Arc<Storage>,
    cache: RwLock<HashMap<String, Arc<Provider>>>,
    write_lock: tokio::sync::Mutex<()>,
}

impl Providers {
    /// Load every provider. One that no longer validates is skipped with
    /// an error in the log (it still shows in the list and can be fixed
    /// with a PUT).
    pub fn open(storage: Arc<Storage>) -> Result<Self, StorageError> {
        let mut cache = HashMap::new();
        for (name, rec) in storage.reader()?.providers()? {
            match entry(&name, &rec) {
                Ok((provider, _)) => {
                    cache.insert(name, provider);
                }
                Err(e) => {
                    tracing::error!(provider = %name, error = %e, "stored provider is not valid; fix it with PUT /v1/providers/{name}");
                }
            }
        }
        Ok(Self {
            storage,
            cache: RwLock::new(cache),
            write_lock: tokio::sync::Mutex::new(()),
        })
    }

    /// The provider called `name`.
    pub fn get(&self, name: &str) -> Option<Arc<Provider>> {
        self.cache
            .read()
            .expect("providers lock")
            .get(name)
            .cloned()
    }

    /// A key whose secret exists must be one the provider may be sent:
    /// a provider was set whose every call was then refused ("secret `K`
    /// may not be sent to …"; a probe). A secret not set yet may be set
    /// later, with the right hosts.
    fn check_key_hosts(&self, provider: &Provider) -> Result<(), ProviderConfigError> {
        let Some(secret) = &provider.key_secret else {
            return Ok(());
        };
        let Some(rec) = self.storage.reader()?.secret(secret)? else {
            return Ok(());
        };
        let hosts: Vec<HostPattern> = rec
            .hosts
            .iter()
            .filter_map(|h| HostPattern::parse(h).ok())
            .collect();
        let url = &provider.base_url;
        if url
            .host()
            .is_some_and(|h| crate::egress::policy::any_matches(&hosts, &h))
        {
            return Ok(());
        }
        Err(ProviderConfigError::Invalid(format!(
            "key_secret `{secret}` may be sent only to {}, not to base_url's host `{}`: add the \
             host to the secret (PUT /v1/secrets/{secret}) or name another secret",
            rec.hosts.join(", "),
            url.host_str().unwrap_or("")
        )))
    }

    /// Set (or replace) a provider; what the API shows, and whether it is
    /// new.
    pub async fn put(
        &self,
        name: &str,
        spec: ProviderSpec,
    ) -> Result<(ProviderInfo, bool), ProviderConfigError> {
        validate_provider_name(name)?;
        spec.validate(name)?;
        let _guard = self.write_lock.lock().await;
        let now = crate::clock::now_ms();
        let old = self.storage.reader()?.provider(name)?;
        let record = ProviderRecord {
            config_json: serde_json::to_string(&spec).expect("a spec serializes"),
            created_at_ms: old.as_ref().map_or(now, |r| r.created_at_ms),
            updated_at_ms: now,
        };
        let (provider, info) = entry(name, &record)?;
        self.check_key_hosts(&provider)?;
        let existed = self
            .storage
            .writer()
            .call(|done| WriteOp::PutProvider {
                name: name.to_owned(),
                record: Some(record),
                done,
            })
            .await?;
        self.cache
            .write()
            .expect("providers lock")
            .insert(name.to_owned(), provider);
        tracing::info!(provider = name, format = %spec.format, "provider set");
        Ok((info, !existed))
    }

    /// Make this node's providers those of `peer` (records as a peer of the
    /// cluster stores them): set those that differ, delete those the peer
    /// does not have. Returns the providers changed.
    pub async fn adopt(
        &self,
        peer: &[(String, ProviderRecord)],
    ) -> Result<usize, ProviderConfigError> {
        let local: HashMap<String, ProviderRecord> =
            self.storage.reader()?.providers()?.into_iter().collect();
        let mut changed = 0;
        for (name, theirs) in peer {
            if local
                .get(name)
                .is_some_and(|m| m.config_json == theirs.config_json)
            {
                continue;
            }
            let spec = serde_json::from_str(&theirs.config_json).map_err(|e| {
                ProviderConfigError::Invalid(format!("a peer's provider `{name}`: {e}"))
            })?;
            self.put(name, spec).await?;
            changed += 1;
        }
        for name in local.keys() {
            if !peer.iter().any(|(n, _)| n == name) {
                self.delete(name).await?;
                changed += 1;
            }
        }
        Ok(changed)
    }

    /// Every provider, by name.
    pub fn list(&self) -> Result<Vec<ProviderInfo>, ProviderConfigError> {
        let mut out = Vec::new();
        for (name, rec) in self.storage.reader()?.providers()? {
            let spec = serde_json::from_str(&rec.config_json).map_err(|e| {
                ProviderConfigError::Invalid(format!("stored provider `{name}`: {e}"))
            })?;
            out.push(ProviderInfo {
                name,
                spec,
                created_at_ms: rec.created_at_ms,
                updated_at_ms: rec.updated_at_ms,
            });
        }
        Ok(out)
    }

    /// Delete a provider; whether it existed.
    pub async fn delete(&self, name: &str) -> Result<bool, ProviderConfigError> {
        validate_provider_name(name)?;
        let _guard = self.write_lock.lock().await;
        let existed = self
            .storage
            .writer()
            .call(|done| WriteOp::PutProvider {
                name: name.to_owned(),
                record: None,
                done,
            })
            .await?;
        self.cache.write().expect("providers lock").remove(name);
        if existed {
            tracing::info!(provider = name, "provider deleted");
        }
        Ok(existed)
    }
}

/// A stored provider, validated, and what the API shows of it.
fn entry(
    name: &str,
    rec: &ProviderRecord,
) -> Result<(Arc<Provider>, ProviderInfo), ProviderConfigError> {
    let spec: ProviderSpec = serde_json::from_str(&rec.config_json)
        .map_err(|e| ProviderConfigError::Invalid(format!("stored provider `{name}`: {e}")))?;
    let provider = Arc::new(spec.validate(name)?);
    let info = ProviderInfo {
        name: name.to_owned(),
        spec,
        created_at_ms: rec.created_at_ms,
        updated_at_ms: rec.updated_at_ms,
    };
    Ok((provider, info))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn spec(v: serde_json::Value) -> Result<Provider, String> {
        let s: ProviderSpec = serde_json::from_value(v).map_err(|e| e.to_string())?;
        s.validate("p").map_err(|e| e.to_string())
    }

    #[test]
    fn specs_are_checked() {
        let p = spec(serde_json::json!({"format": "openai-chat"})).unwrap();
        assert_eq!(
            p.endpoint().as_str(),
            "https://api.openai.com/v1/chat/completions"
        );
        assert!(p.encode.max_completion_tokens);
        let p =
            spec(serde_json::json!({"format": "anthropic-messages", "key_secret": "K"})).unwrap();
        assert_eq!(
            p.endpoint().as_str(),
            "https://api.anthropic.com/v1/messages"
        );
        let p = spec(
            serde_json::json!({"format": "openai-chat", "base_url": "http://127.0.0.1:11434/v1"}),
        )
        .unwrap();
        assert_eq!(
            p.endpoint().as_str(),
            "http://127.0.0.1:11434/v1/chat/completions"
        );
        assert!(!p.encode.max_completion_tokens);

        for (bad, why) in [
            (serde_json::json!({"format": "gemini"}), "format must be"),
            (
                serde_json::json!({"format": "openai-chat", "base_url": "ftp://x/"}),
                "http(s)",
            ),
            (
                serde_json::json!({"format": "openai-chat", "base_url": "https://u:p@x/"}),
                "credentials",
            ),
            (
                serde_json::json!({"format": "openai-chat", "base_url": "http://x/v1", "key_secret": "K"}),
                "https",
            ),
            (
                serde_json::json!({"format": "openai-chat", "key_secret": "bad name"}),
                "secret name",
            ),
            (
                serde_json::json!({"format": "openai-chat", "headers": {"Authorization": "x"}}),
                "key_secret",
            ),
            (
                serde_json::json!({"format": "openai-chat", "prices": {"m": {"input_per_mtok": -1, "output_per_mtok": 1}}}),
                "non-negative",
            ),
            (
                serde_json::json!({"format": "anthropic-messages", "max_completion_tokens": true}),
                "openai-chat",
            ),
            (
                serde_json::json!({"format": "openai-chat", "api_key": "sk-x"}),
                "unknown field",
            ),
        ] {
            let e = spec(bad.clone()).unwrap_err();
            assert!(e.contains(why), "{bad}: {e}");
        }
    }
}
