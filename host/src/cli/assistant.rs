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
/// exists. Returns the fake provider to keep it running.
pub async fn deploy(node: &Arc<Node>) -> anyhow::Result<Option<FakeProvider>> {
    let fake = match tokio::net::TcpListener::bind(FAKE_ADDR).await {
        Ok(l) => Some(FakeProvider::start(l, Behaviour::Echo, None)),
        Err(e) => {
            tracing::warn!(addr = FAKE_ADDR, error = %e, "the fake model and demo help desk cannot start; the assistant needs a real provider");
            None
        }
    };
    let model = provider(node, fake.is_some()).await?;
    if node.catalog().get("assistant").is_some() {
        tracing::info!(
            ty = "assistant",
            "a type of this name exists, so the bundled example is not deployed"
        );
        return Ok(fake);
    }
    let mut manifest: Value = serde_json::from_str(crate::guests::ASSISTANT)
        .context("examples/assistant/assistant.json")?;
    if let Some(name) = model {
        manifest["agent"]["model"]["name"] = json!(name);
    }
    let config: TypeConfig = serde_json::from_value(manifest["config"].clone())?;
    let canonical =
        crate::agents::check(&manifest["agent"], &config).map_err(anyhow::Error::msg)?;
    let d = node
        .deploy("assistant", CodeKind::Agent, canonical.into_bytes(), config)
        .await
        .context("failed to deploy the `assistant` example")?;
    tracing::info!(ty = "assistant", version = d.version, "example ready");
    Ok(fake)
}

/// Make provider `default` unless the user has one; the model name to use
/// with it (`None`: keep the manifest's).
async fn provider(node: &Arc<Node>, fake: bool) -> anyhow::Result<Option<String>> {
    let providers = node.models().providers();
    if providers.get("default").is_some() {
        return Ok(None);
    }
    let env = |k: &str| std::env::var(k).ok().filter(|v| !v.is_empty());
    let model = env("MARMOT_MODEL");
    let (spec, name, why) = if let Some(key) = env("OPENAI_API_KEY") {
        node.secrets()
            .put(
                "OPENAI_API_KEY",
                key.as_bytes(),
                vec!["api.openai.com".into()],
            )
            .await?;
        (
            json!({"format": "openai-chat", "key_secret": "OPENAI_API_KEY"}),
            model.unwrap_or_else(|| "gpt-5-mini".into()),
            "OPENAI_API_KEY",
        )
    } else if let Some(key) = env("ANTHROPIC_API_KEY") {
        node.secrets()
            .put(
                "ANTHROPIC_API_KEY",
                key.as_bytes(),
                vec!["api.anthropic.com".into()],
            )
            .await?;
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
