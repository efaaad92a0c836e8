//! `marmot dev`'s assistant example (`examples/assistant`): a model
//! provider named `default` (a real one when credentials are in the
//! environment, else the fake provider with its demo help desk), then the
//! agent type itself.

use std::sync::Arc;

use anyhow::Context as _;
use serde_json::{Value, json};

use crate::config::{NodeConfig, TypeConfig};
use crate::fake_provider::{Behaviour, FakeProvider};
use crate::models::ProviderSpec;
use crate::node::Node;
use crate::storage::schema::CodeKind;

/// Where the fake provider and its help desk listen (a loopback address of
/// its own, so that the example's http tool may reach it without opening
/// the node's API address to guests).
pub const FAKE_ADDR: &str = "127.0.0.77:7879";

/// What `dev` opens for the example before the node starts: guests may
/// reach the demo help desk's address.
pub fn prepare_config(config: &mut NodeConfig) {
    let desk = "127.0.0.77/32".to_owned();
    if !config.egress.allow_private.contains(&desk) {
        config.egress.allow_private.push(desk);
    }
}

/// Set up the provider and deploy the example where no type `assistant`
/// exists, or where it is the example as an earlier start deployed it for
/// another model. Returns the fake provider to keep it running.
pub async fn deploy(node: &Arc<Node>) -> anyhow::Result<Option<FakeProvider>> {
    let fake = match tokio::net::TcpListener::bind(FAKE_ADDR).await {
        Ok(l) => Some(FakeProvider::start(l, Behaviour::Echo, None)),
        Err(e) => {
            tracing::warn!(addr = FAKE_ADDR, error = %e, "the fake model and demo help desk cannot start");
            None
        }
    };
    let model = provider(node, fake.is_some()).await?;
    if fake.is_none() && node.models().providers().get("default").is_none() {
        tracing::warn!(
            "no model provider `default`: the assistant needs one (set OPENAI_API_KEY, \
             ANTHROPIC_API_KEY or MARMOT_MODEL_URL, or PUT /v1/providers/default)"
        );
    }
    let mut manifest: Value = serde_json::from_str(crate::guests::ASSISTANT)
        .context("examples/assistant/assistant.json")?;
    if let Some(name) = &model {
        manifest["agent"]["model"]["name"] = json!(name);
    }
    let config: TypeConfig = serde_json::from_value(manifest["config"].clone())?;
    let canonical =
        crate::agents::check(&manifest["agent"], &config).map_err(anyhow::Error::msg)?;
    if let Some(entry) = node.catalog().get("assistant") {
        let current = node
            .storage()
            .reader()
            .and_then(|r| r.code("assistant", entry.latest_version()))?;
        let follow = model.is_some()
            && current
                .as_deref()
                .is_some_and(|c| for_another_model(c, &canonical));
        if !follow {
            tracing::info!(
                ty = "assistant",
                "a type of this name exists, so the bundled example is not deployed"
            );
            return Ok(fake);
        }
    }
    let d = node
        .deploy("assistant", CodeKind::Agent, canonical.into_bytes(), config)
        .await
        .context("failed to deploy the `assistant` example")?;
    tracing::info!(ty = "assistant", version = d.version, "example ready");
    Ok(fake)
}

/// Whether the deployed agent manifest `current` is `wanted` but for the
/// model's name: the example as a start with other credentials deployed
/// it (which would send the fake's model name to a real provider). One
/// the user changed otherwise is theirs, and stays.
fn for_another_model(current: &[u8], wanted: &str) -> bool {
    let (Ok(mut current), Ok(wanted)) = (
        serde_json::from_slice::<Value>(current),
        serde_json::from_str::<Value>(wanted),
    ) else {
        return false;
    };
    if current["model"]["name"] == wanted["model"]["name"] {
        return false;
    }
    current["model"]["name"] = wanted["model"]["name"].clone();
    current == wanted
}

/// Make provider `default`: from credentials in the environment, which
/// every start applies (a key set or rotated since the data directory was
/// made is used: it used to be ignored once `default` existed), else the
/// fake provider unless the user has one. The model name to use with it
/// (`None`: keep what is deployed).
async fn provider(node: &Arc<Node>, fake: bool) -> anyhow::Result<Option<String>> {
    let providers = node.models().providers();
    let env = |k: &str| std::env::var(k).ok().filter(|v| !v.is_empty());
    let model = env("MARMOT_MODEL");
    let secret = |name: &'static str, host: &str, key: String| {
        let host = host.to_owned();
        async move {
            node.secrets()
                .put(name, key.as_bytes(), vec![host])
                .await
                .with_context(|| format!("cannot store {name}"))
        }
    };
    let (spec, name, why) = if let Some(key) = env("OPENAI_API_KEY") {
        secret("OPENAI_API_KEY", "api.openai.com", key).await?;
        (
            json!({"format": "openai-chat", "key_secret": "OPENAI_API_KEY"}),
            model.unwrap_or_else(|| "gpt-5-mini".into()),
            "OPENAI_API_KEY",
        )
    } else if let Some(key) = env("ANTHROPIC_API_KEY") {
        secret("ANTHROPIC_API_KEY", "api.anthropic.com", key).await?;
        (
            json!({"format": "anthropic-messages", "key_secret": "ANTHROPIC_API_KEY"}),
            model.unwrap_or_else(|| "claude-sonnet-4-5".into()),
            "ANTHROPIC_API_KEY",
        )
    } else if let Some(url) = env("MARMOT_MODEL_URL") {
        (
            json!({"format": "openai-chat", "base_url": url}),
            model.unwrap_or_else(|| "default".into()),
            "MARMOT_MODEL_URL",
        )
    } else if providers.get("default").is_some() {
        return Ok(None);
    } else if fake {
        (
            json!({"format": "openai-chat", "base_url": format!("http://{FAKE_ADDR}/v1")}),
            "fake".into(),
            "no credentials: the fake model",
        )
    } else {
        return Ok(None);
    };
    let spec: ProviderSpec = serde_json::from_value(spec)?;
    providers.put("default", spec).await?;
    tracing::info!(provider = "default", model = %name, from = why, "model provider ready");
    Ok(Some(name))
}
