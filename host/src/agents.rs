//! The built-in agent harness, as the host sees it: a type deployed with
//! `{"kind": "agent", "agent": {…}, "config": {…}}` runs the agent
//! component (`actors/agent`, built into the binary) with its manifest.
//!
//! The harness itself is an ordinary guest written on the guest SDK: it
//! reads its manifest from the environment variable [`MANIFEST_ENV`] and
//! uses only the capabilities every guest has (`model`, `http`, `js`,
//! `actors`, `inputs`, `turn`…). The host's part is this module's check of
//! the manifest at deploy (so a bad one is a clear 400, not a failing
//! run), and the run API (`POST …` with `{"input"}` waits for the run's
//! end; `…/runs/{run_id}/cancel`). docs/agent.md describes the harness.

use std::collections::{BTreeMap, HashSet};

use serde::{Deserialize, Serialize};
use serde_json::Value;

use crate::config::TypeConfig;
use crate::egress::policy::{HostPattern, any_matches};

/// The environment variable the agent component reads its manifest from.
pub const MANIFEST_ENV: &str = "MARMOT_AGENT_MANIFEST";

/// Event kinds that end a run (what a waiting `POST` answers on).
pub const RUN_END_EVENTS: &[&str] = &["run_finished", "run_failed", "budget_exceeded"];

/// State keys of the agent component (`actors/agent/src/store.rs`) the
/// host reads to tell whether a run is still going: the active run
/// (`{"run_id", …}`) and the inputs queued behind it (`[{"run_id", …}]`).
pub const ACTIVE_RUN_KEY: &str = "agent/run";
/// See [`ACTIVE_RUN_KEY`].
pub const QUEUED_RUNS_KEY: &str = "agent/queue";
/// What the agent's input requests wait for: `agent/wait/{input_id}` →
/// `{"for": "approval" | "client" | "confirm", "run_id", "call_id", …}`.
pub const WAITS_PREFIX: &str = "agent/wait/";
/// The agent's transcript: `t/{n:012}` → one message of the chat shape
/// (an assistant's carries `tool_calls: [{id, name, arguments}]`), and the
/// next `n` under [`TRANSCRIPT_NEXT_KEY`].
pub const TRANSCRIPT_PREFIX: &str = "t/";
/// See [`TRANSCRIPT_PREFIX`].
pub const TRANSCRIPT_NEXT_KEY: &str = "agent/next";

/// An agent manifest (PRODUCT.md §5). Unknown keys are refused.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Manifest {
    /// The system prompt.
    #[serde(default)]
    pub instructions: String,
    /// Which model, and what to fall back to.
    pub model: ModelSpec,
    /// Tools the model may call.
    #[serde(default)]
    pub tools: Vec<Value>,
    /// Per-run limits.
    #[serde(default)]
    pub limits: Option<Value>,
    /// Runs started on a cron schedule: `{"name", "cron", "tz"?, "input"}`.
    #[serde(default)]
    pub schedules: Vec<ScheduleSpec>,
    /// Runs started by inbound webhooks: hook name → input (`{body}` is
    /// replaced by the payload).
    #[serde(default)]
    pub webhooks: BTreeMap<String, String>,
}

/// A run on a cron schedule.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ScheduleSpec {
    /// Unique among the agent's schedules.
    pub name: String,
    /// Cron pattern (5 fields, or 6 with seconds).
    pub cron: String,
    /// IANA time zone (UTC when absent).
    #[serde(default)]
    pub tz: Option<String>,
    /// The run's input.
    pub input: String,
}

/// The model of an agent.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ModelSpec {
    /// A provider configured on the node.
    pub provider: String,
    /// Its model name.
    pub name: String,
    /// Tried in order when the provider is unavailable.
    #[serde(default)]
    pub fallbacks: Vec<FallbackSpec>,
    /// Most tokens per model answer.
    #[serde(default)]
    pub max_output_tokens: Option<u64>,
    /// Sampling temperature.
    #[serde(default)]
    pub temperature: Option<f64>,
    /// Merged into every request body.
    #[serde(default)]
    pub provider_options: BTreeMap<String, Value>,
}

/// A fallback model.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct FallbackSpec {
    /// Provider.
    pub provider: String,
    /// Model.
    pub name: String,
}

/// Keys each tool kind accepts.
const TOOL_KEYS: &[(&str, &[&str])] = &[
    (
        "code",
        &[
            "kind",
            "name",
            "description",
            "tools",
            "timeout_ms",
            "needs_approval",
        ],
    ),
    (
        "http",
        &[
            "kind",
            "name",
            "description",
            "method",
            "url",
            "headers",
            "input_schema",
            "needs_approval",
            "idempotent",
            "reconcile",
        ],
    ),
    (
        "actor",
        &[
            "kind",
            "name",
            "description",
            "type",
            "input_schema",
            "needs_approval",
        ],
    ),
    ("client", &["kind", "name", "description", "input_schema"]),
    ("files", &["kind", "name", "description", "needs_approval"]),
];

const LIMIT_KEYS: &[&str] = &[
    "max_steps",
    "max_output_tokens",
    "max_run_ms",
    "context_tokens",
    "max_tool_calls_per_step",
];

/// Check a manifest against the type's config: tool names, endpoints
/// within `allowed_hosts`, secrets named in headers listed in `secrets`.
/// Returns the canonical JSON the component gets.
pub fn check(manifest: &Value, config: &TypeConfig) -> Result<String, String> {
    // `"max_steps": 10.0` is the integer 10 (see `json::integral_floats`).
    let mut sent = manifest.clone();
    crate::json::integral_floats(&mut sent);
    let m = Manifest::deserialize(&sent)
        .map_err(|e| format!("the agent manifest is not valid: {e}"))?;
    let read = serde_json::to_value(&m).expect("JSON encodes");
    if let Some(at) = crate::json::array_for_object(&sent, &read) {
        return Err(format!("agent{} must be an object", at.replace('/', ".")));
    }
    if m.model.provider.is_empty() || m.model.name.is_empty() {
        return Err("agent.model needs a provider and a name".into());
    }
    if m.model.max_output_tokens == Some(0) {
        return Err("agent.model.max_output_tokens must be at least 1".into());
    }
    let hosts: Vec<HostPattern> = config
        .allowed_hosts
        .iter()
        .filter_map(|h| HostPattern::parse(h).ok())
        .collect();
    let mut names = HashSet::new();
    for (i, tool) in m.tools.iter().enumerate() {
        let at = format!("agent.tools[{i}]");
        let obj = tool
            .as_object()
            .ok_or_else(|| format!("{at} must be an object"))?;
        let kind = obj.get("kind").and_then(Value::as_str).unwrap_or("");
        let keys = TOOL_KEYS
            .iter()
            .find(|(k, _)| *k == kind)
            .map(|(_, keys)| *keys)
            .ok_or_else(|| {
                format!("{at}.kind must be code, http, actor, client or files, not `{kind}`")
            })?;
        if let Some(k) = obj.keys().find(|k| !keys.contains(&k.as_str())) {
            return Err(format!("{at}: unknown key `{k}` for a {kind} tool"));
        }
        // What the harness reads as text must be text: it reads the manifest
        // with its own types, and a value it cannot read failed every run
        // of a type this check had let through (found by a probe).
        for key in ["name", "description", "method"] {
            if obj.get(key).is_some_and(|v| !v.is_string()) {
                return Err(format!("{at}.{key} must be a string"));
            }
        }
        if let Some(t) = obj.get("timeout_ms")
            && t.as_u64()
                .is_none_or(|ms| ms == 0 || ms > u64::from(u32::MAX))
        {
            return Err(format!(
                "{at}.timeout_ms must be a whole number of milliseconds, 1 to {}",
                u32::MAX
            ));
        }
        let name = obj
            .get("name")
            .and_then(Value::as_str)
            .unwrap_or(match kind {
                "code" => "code",
                "files" => "files",
                _ => "",
            });
        if name.is_empty()
            || name.len() > 64
            || !name
                .bytes()
                .all(|b| b.is_ascii_alphanumeric() || b == b'_' || b == b'-')
        {
            return Err(format!(
                "{at}.name `{name}` must be 1-64 letters, digits, `_` or `-`"
            ));
        }
        // (A script's `tools.__proto__ = …` sets the object's prototype:
        // the tool was missing from its own list.)
        if name == "__proto__" {
            return Err(format!(
                "{at}.name `__proto__` is reserved in JavaScript; choose another"
            ));
        }
        if !names.insert(name.to_owned()) {
            return Err(format!("{at}: a tool named `{name}` is defined twice"));
        }
        for key in ["needs_approval", "idempotent"] {
            if obj.get(key).is_some_and(|v| !v.is_boolean()) {
                return Err(format!("{at}.{key} must be true or false"));
            }
        }
        if let Some(s) = obj.get("input_schema") {
            if !s.is_object() {
                return Err(format!("{at}.input_schema must be a JSON Schema object"));
            }
            // Providers take a tool's arguments as an object: a schema of
            // anything else (or of no type JSON has) was refused by the
            // provider at every run, or checked nothing.
            if s.get("type") != Some(&Value::from("object")) {
                return Err(format!(
                    "{at}.input_schema must describe an object (`\"type\": \"object\"`): \
                     tool arguments are an object"
                ));
            }
            // The harness checks every call's arguments against it: one
            // it would misread checked nothing.
            marmot_core::schema::validate(s).map_err(|e| format!("{at}.input_schema: {e}"))?;
        }
        match kind {
            "http" => {
                check_endpoint(&at, obj, &hosts, config)?;
                if let Some(r) = obj.get("reconcile") {
                    let r = r
                        .as_object()
                        .ok_or_else(|| format!("{at}.reconcile must be an object"))?;
                    if let Some(k) = r
                        .keys()
                        .find(|k| !["method", "url", "headers"].contains(&k.as_str()))
                    {
                        return Err(format!("{at}.reconcile: unknown key `{k}`"));
                    }
                    if r.get("method").is_some_and(|v| !v.is_string()) {
                        return Err(format!("{at}.reconcile.method must be a string"));
                    }
                    check_endpoint(&format!("{at}.reconcile"), r, &hosts, config)?;
                    // Without the key every call would ask about the same
                    // thing, and one 2xx would mark calls done that never ran.
                    let url = r.get("url").and_then(Value::as_str).unwrap_or("");
                    if !url.contains("{idempotency_key}") {
                        return Err(format!(
                            "{at}.reconcile.url must name the call with {{idempotency_key}}"
                        ));
                    }
                }
            }
            "actor" => {
                let ty = obj.get("type").and_then(Value::as_str).unwrap_or("");
                crate::ids::validate_type_name(ty).map_err(|e| format!("{at}.type: {e}"))?;
            }
            "code" => {
                if let Some(t) = obj.get("tools") {
                    let list = t
                        .as_array()
                        .ok_or_else(|| format!("{at}.tools must be a list of tool names"))?;
                    if list.iter().any(|v| !v.is_string()) {
                        return Err(format!("{at}.tools must be a list of tool names"));
                    }
                }
            }
            _ => {}
        }
    }
    // Tools a code tool names must exist (checked once all are known).
    for tool in &m.tools {
        if tool.get("kind").and_then(Value::as_str) == Some("code") {
            for t in tool
                .get("tools")
                .and_then(Value::as_array)
                .into_iter()
                .flatten()
            {
                let t = t.as_str().unwrap_or("");
                if !names.contains(t) {
                    return Err(format!("agent code tool names `{t}`, which is not a tool"));
                }
            }
        }
    }
    let mut schedule_names = HashSet::new();
    for (i, s) in m.schedules.iter().enumerate() {
        let at = format!("agent.schedules[{i}]");
        crate::ids::validate_hook_name(&s.name).map_err(|e| format!("{at}.name: {e}"))?;
        if !schedule_names.insert(s.name.as_str()) {
            return Err(format!(
                "{at}: a schedule named `{}` is defined twice",
                s.name
            ));
        }
        crate::alarms::cron_next(&s.cron, s.tz.as_deref(), crate::clock::now_ms())
            .map_err(|e| format!("{at}: {e}"))?;
    }
    for name in m.webhooks.keys() {
        crate::ids::validate_hook_name(name).map_err(|e| format!("agent.webhooks: {e}"))?;
        if config.webhook_secret.is_none() {
            return Err("agent.webhooks needs config.webhook_secret to verify them".into());
        }
    }
    if let Some(limits) = &m.limits {
        let obj = limits.as_object().ok_or("agent.limits must be an object")?;
        for (k, v) in obj {
            if !LIMIT_KEYS.contains(&k.as_str()) {
                return Err(format!(
                    "agent.limits: unknown key `{k}` (known: {})",
                    LIMIT_KEYS.join(", ")
                ));
            }
            // The counts are read as 32-bit.
            let most = if k == "max_steps" || k == "max_tool_calls_per_step" {
                u64::from(u32::MAX)
            } else {
                u64::MAX
            };
            if v.as_u64().is_none_or(|n| n == 0 || n > most) {
                return Err(format!(
                    "agent.limits.{k} must be a positive integer (at most {most})"
                ));
            }
        }
    }
    Ok(serde_json::to_string(&sent).expect("JSON encodes"))
}

/// An http tool's `method`, `url` and `headers`.
fn check_endpoint(
    at: &str,
    obj: &serde_json::Map<String, Value>,
    hosts: &[HostPattern],
    config: &TypeConfig,
) -> Result<(), String> {
    let method = obj.get("method").and_then(Value::as_str).unwrap_or("POST");
    if !crate::config::HTTP_METHODS.contains(&method) {
        return Err(format!("{at}.method `{method}` is not an HTTP method"));
    }
    let url = obj.get("url").and_then(Value::as_str).unwrap_or("");
    let parsed = url::Url::parse(url).map_err(|e| format!("{at}.url `{url}`: {e}"))?;
    if !matches!(parsed.scheme(), "http" | "https") {
        return Err(format!("{at}.url must be http(s)"));
    }
    if crate::egress::has_secret_placeholder(parsed.as_str()) {
        return Err(format!(
            "{at}.url: a {{{{secret:NAME}}}} placeholder is substituted in header values only, \
             not in the URL"
        ));
    }
    let host = parsed.host();
    if !host.as_ref().is_some_and(|h| any_matches(hosts, h)) {
        return Err(format!(
            "{at}.url: host `{}` is not in config.allowed_hosts",
            parsed.host_str().unwrap_or("")
        ));
    }
    if let Some(h) = obj.get("headers") {
        let h = h
            .as_object()
            .ok_or_else(|| format!("{at}.headers must be an object of strings"))?;
        for (k, v) in h {
            if reqwest::header::HeaderName::from_bytes(k.as_bytes()).is_err() {
                return Err(format!("{at}.headers: `{k}` is not a valid header name"));
            }
            let v = v
                .as_str()
                .ok_or_else(|| format!("{at}.headers.{k} must be a string"))?;
            let miswritten = |text: &str| {
                if crate::egress::holds_secret_placeholder(text.as_bytes()) {
                    Err(format!(
                        "{at}.headers.{k}: a placeholder is written {{{{secret:NAME}}}}, in lower \
                         case and without spaces; this one would go out as written"
                    ))
                } else {
                    Ok(())
                }
            };
            let mut rest = v;
            while let Some(start) = rest.find("{{secret:") {
                miswritten(&rest[..start])?;
                let after = &rest[start + 9..];
                let end = after
                    .find("}}")
                    .ok_or_else(|| format!("{at}.headers.{k}: an unclosed {{{{secret:…}}}}"))?;
                let name = &after[..end];
                if !config.secrets.iter().any(|s| s == name) {
                    return Err(format!(
                        "{at}.headers.{k} names secret `{name}`, which is not in config.secrets"
                    ));
                }
                // The host substitutes secrets towards https only: every
                // call would fail (found by a probe), so say it now.
                if parsed.scheme() != "https" {
                    return Err(format!(
                        "{at}.headers.{k} names secret `{name}`, and secrets are only sent over https, not to `{url}`"
                    ));
                }
                rest = &after[end + 2..];
            }
            miswritten(rest)?;
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn config() -> TypeConfig {
        TypeConfig {
            allowed_hosts: vec!["api.example.com".into()],
            secrets: vec!["TICKETS".into()],
            ..Default::default()
        }
    }

    #[test]
    fn the_product_example_passes_and_mistakes_are_named() {
        let good = json!({
            "instructions": "You are Alice's assistant.",
            "model": {"provider": "openai", "name": "gpt-5-mini",
                      "fallbacks": [{"provider": "anthropic", "name": "claude-sonnet-4-5"}]},
            "tools": [
                {"kind": "code"},
                {"kind": "http", "name": "create_ticket", "description": "…", "method": "POST",
                 "url": "https://api.example.com/tickets", "headers": {"authorization": "Bearer {{secret:TICKETS}}"},
                 "input_schema": {"type": "object"}, "needs_approval": true},
                {"kind": "actor", "name": "ask_billing", "description": "…", "type": "billing"},
                {"kind": "client", "name": "pick_date", "description": "…", "input_schema": {"type": "object"}}
            ],
            "limits": {"max_steps": 50, "max_output_tokens": 200000}
        });
        check(&good, &config()).unwrap();
        // A whole number written as a float is that integer; a fraction is not.
        let mut floats = good.clone();
        floats["limits"]["max_steps"] = json!(50.0);
        floats["limits"]["max_output_tokens"] = json!(2e5);
        assert_eq!(check(&floats, &config()), check(&good, &config()));
        let bad = |patch: &dyn Fn(&mut Value), why: &str| {
            let mut m = good.clone();
            patch(&mut m);
            let e = check(&m, &config()).unwrap_err();
            assert!(e.contains(why), "{why}: {e}");
        };
        bad(
            &|m| m["tools"][1]["url"] = json!("https://evil.example.net/x"),
            "allowed_hosts",
        );
        for url in [
            "https://api.example.com/t?key={{secret:TICKETS}}",
            "https://api.example.com/{{secret:TICKETS}}/t",
        ] {
            bad(
                &|m| m["tools"][1]["url"] = json!(url),
                "substituted in header values only",
            );
        }
        bad(
            &|m| m["tools"][1]["headers"]["x"] = json!("{{secret:OTHER}}"),
            "config.secrets",
        );
        for header in [
            "Bearer {{ secret:TICKETS }}",
            "{{secret:TICKETS}} and {{SECRET:TICKETS}}",
            "{{Secret:TICKETS}} then {{secret:TICKETS}}",
        ] {
            bad(
                &|m| m["tools"][1]["headers"]["authorization"] = json!(header),
                "would go out as written",
            );
        }
        bad(
            &|m| m["tools"][2]["name"] = json!("create_ticket"),
            "defined twice",
        );
        bad(
            &|m| m["tools"][2]["name"] = json!("__proto__"),
            "reserved in JavaScript",
        );
        bad(
            &|m| m["tools"][1]["url"] = json!("http://api.example.com/tickets"),
            "only sent over https",
        );
        bad(
            &|m| m["tools"][3]["input_schema"] = json!({"type": "array"}),
            "must describe an object",
        );
        bad(&|m| m["tools"][0]["kind"] = json!("shell"), "kind must be");
        bad(&|m| m["tools"][3]["url"] = json!("x"), "unknown key `url`");
        bad(&|m| m["limits"]["max_steps"] = json!(0), "positive integer");
        bad(
            &|m| m["limits"]["max_steps"] = json!(2.5),
            "positive integer",
        );
        bad(&|m| m["limits"]["steps"] = json!(3), "unknown key `steps`");
        bad(
            &|m| m["model"] = json!({"provider": "openai"}),
            "missing field `name`",
        );
        // serde also reads a struct from an array of its fields in order.
        bad(
            &|m| m["model"] = json!(["openai", "gpt-5-mini"]),
            "agent.model must be an object",
        );
        bad(
            &|m| m["model"]["fallbacks"][0] = json!(["anthropic", "claude-sonnet-4-5"]),
            "agent.model.fallbacks.0 must be an object",
        );
        bad(
            &|m| m["tools"][2]["type"] = json!("Bad Type"),
            "agent.tools[2].type",
        );
        bad(&|m| m["tools"][0]["tools"] = json!(["nope"]), "not a tool");
        bad(&|m| m["tool"] = json!([]), "unknown field `tool`");
        bad(
            &|m| m["schedules"] = json!([{"name": "daily", "cron": "not a cron", "input": "x"}]),
            "agent.schedules[0]",
        );
        bad(
            &|m| m["schedules"] = json!([{"name": "d", "cron": "0 8 * * *", "input": "x"}, {"name": "d", "cron": "0 9 * * *", "input": "y"}]),
            "defined twice",
        );
        bad(
            &|m| m["webhooks"] = json!({"ticket": "{body}"}),
            "webhook_secret",
        );
        bad(
            &|m| {
                m["tools"]
                    .as_array_mut()
                    .unwrap()
                    .push(json!({"kind": "files", "url": "x"}))
            },
            "unknown key `url`",
        );
        // What the harness reads with its own types, checked here as it
        // reads them: each of these deployed, and every run then failed.
        bad(
            &|m| m["limits"]["max_steps"] = json!(99_999_999_999u64),
            "positive integer (at most 4294967295)",
        );
        bad(&|m| m["tools"][0]["timeout_ms"] = json!("x"), "timeout_ms");
        bad(
            &|m| m["tools"][0]["timeout_ms"] = json!(10_000_000_000u64),
            "timeout_ms",
        );
        bad(&|m| m["tools"][0]["timeout_ms"] = json!(0), "timeout_ms");
        bad(
            &|m| m["tools"][1]["description"] = json!(5),
            "description must be a string",
        );
        bad(
            &|m| m["tools"][0]["name"] = json!(5),
            "name must be a string",
        );
        bad(
            &|m| m["tools"][1]["method"] = json!(5),
            "method must be a string",
        );
        bad(
            &|m| {
                m["tools"][1]["reconcile"] =
                    json!({"method": 7, "url": "https://api.example.com/x/{idempotency_key}"})
            },
            "reconcile.method must be a string",
        );
        bad(
            &|m| {
                m["tools"][1]["reconcile"] =
                    json!({"method": "GET", "url": "https://api.example.com/x"})
            },
            "{idempotency_key}",
        );
        bad(
            &|m| m["tools"][1]["headers"]["bad header"] = json!("x"),
            "not a valid header name",
        );
        bad(
            &|m| m["model"]["max_output_tokens"] = json!(0),
            "max_output_tokens",
        );
        bad(
            &|m| m["tools"][0]["kind"] = json!("shell"),
            "code, http, actor, client or files",
        );
        let mut ok = good.clone();
        ok["tools"][1]["reconcile"] =
            json!({"method": "GET", "url": "https://api.example.com/t/{idempotency_key}"});
        ok["tools"]
            .as_array_mut()
            .unwrap()
            .push(json!({"kind": "files"}));
        ok["schedules"] =
            json!([{"name": "daily", "cron": "0 8 * * *", "tz": "Europe/Berlin", "input": "x"}]);
        check(&ok, &config()).unwrap();
    }
}
