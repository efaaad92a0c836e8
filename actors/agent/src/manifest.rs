//! The agent manifest, as deployed (`{"kind": "agent", "agent": {…}}`).
//! The host checked it at deploy; this reads it leniently.

use serde::Deserialize;
use serde_json::{Map, Value, json};

/// The environment variable the host puts the manifest in.
const MANIFEST_ENV: &str = "MARMOT_AGENT_MANIFEST";

#[derive(Debug, Clone, Deserialize)]
pub struct Manifest {
    #[serde(default)]
    pub instructions: String,
    pub model: ModelSpec,
    #[serde(default)]
    pub tools: Vec<Tool>,
    #[serde(default)]
    pub limits: Limits,
    /// Runs started by the clock.
    #[serde(default)]
    pub schedules: Vec<ScheduleSpec>,
    /// Runs started by inbound webhooks: hook name → the input, where
    /// `{body}` is replaced by the payload.
    #[serde(default)]
    pub webhooks: Map<String, Value>,
}

/// A run on a cron schedule.
#[derive(Debug, Clone, serde::Serialize, Deserialize)]
pub struct ScheduleSpec {
    pub name: String,
    pub cron: String,
    pub tz: Option<String>,
    pub input: String,
}

#[derive(Debug, Clone, Deserialize)]
pub struct ModelSpec {
    pub provider: String,
    pub name: String,
    #[serde(default)]
    pub fallbacks: Vec<Fallback>,
    pub max_output_tokens: Option<u64>,
    pub temperature: Option<f64>,
    #[serde(default)]
    pub provider_options: Map<String, Value>,
}

#[derive(Debug, Clone, Deserialize)]
pub struct Fallback {
    pub provider: String,
    pub name: String,
}

/// Per-run limits.
#[derive(Debug, Clone, Deserialize)]
#[serde(default)]
pub struct Limits {
    /// Model steps.
    pub max_steps: u32,
    /// Generated tokens over the run.
    pub max_output_tokens: u64,
    /// Wall time from the run's start.
    pub max_run_ms: u64,
    /// Estimated prompt tokens (bytes / 4) above which the transcript is
    /// compacted before the next step.
    pub context_tokens: u64,
    /// Tool calls one model answer may have made; the rest are answered
    /// "not run" (a model answering with 200 calls a step made 600 of
    /// them in a run of 3 steps: a probe).
    pub max_tool_calls_per_step: u32,
}

impl Default for Limits {
    fn default() -> Self {
        Self {
            max_steps: 50,
            max_output_tokens: 200_000,
            max_run_ms: 3_600_000,
            context_tokens: 100_000,
            max_tool_calls_per_step: 32,
        }
    }
}

/// One tool.
#[derive(Debug, Clone, Deserialize)]
#[serde(tag = "kind", rename_all = "lowercase")]
pub enum Tool {
    /// Model-written JavaScript in a child sandbox.
    Code {
        #[serde(default = "code_name")]
        name: String,
        #[serde(default)]
        description: String,
        /// Tools callable from the script (default: every http and actor
        /// tool that needs no approval).
        tools: Option<Vec<String>>,
        timeout_ms: Option<u32>,
        #[serde(default)]
        needs_approval: bool,
    },
    /// A declared HTTP endpoint.
    Http {
        name: String,
        #[serde(default)]
        description: String,
        #[serde(default = "post")]
        method: String,
        url: String,
        #[serde(default)]
        headers: Map<String, Value>,
        input_schema: Option<Value>,
        #[serde(default)]
        needs_approval: bool,
        /// Safe to send again after a crash (default: GET and HEAD).
        idempotent: Option<bool>,
        /// Asks the endpoint whether a call took effect, by its
        /// idempotency key (`{idempotency_key}` in the URL).
        reconcile: Option<Endpoint>,
    },
    /// Another actor.
    Actor {
        name: String,
        #[serde(default)]
        description: String,
        #[serde(rename = "type")]
        actor_type: String,
        input_schema: Option<Value>,
        #[serde(default)]
        needs_approval: bool,
    },
    /// The actor's files (`outputs/` are artifacts users can download).
    Files {
        #[serde(default = "files_name")]
        name: String,
        #[serde(default)]
        description: String,
        #[serde(default)]
        needs_approval: bool,
    },
    /// Run by the client: an input request answered with the result.
    Client {
        name: String,
        #[serde(default)]
        description: String,
        input_schema: Option<Value>,
    },
}

#[derive(Debug, Clone, Deserialize)]
pub struct Endpoint {
    #[serde(default = "get")]
    pub method: String,
    pub url: String,
    #[serde(default)]
    pub headers: Map<String, Value>,
}

fn code_name() -> String {
    "code".into()
}

fn files_name() -> String {
    "files".into()
}

fn post() -> String {
    "POST".into()
}

fn get() -> String {
    "GET".into()
}

impl Manifest {
    /// The manifest the host gave this type.
    pub fn load() -> Result<Manifest, String> {
        let text = std::env::var(MANIFEST_ENV)
            .map_err(|_| format!("no agent manifest ({MANIFEST_ENV} is not set)"))?;
        serde_json::from_str(&text).map_err(|e| format!("the agent manifest is not valid: {e}"))
    }

    pub fn tool(&self, name: &str) -> Option<&Tool> {
        self.tools.iter().find(|t| t.name() == name)
    }

    /// The tools as the model sees them (the chat shape's `tools`).
    pub fn definitions(&self) -> Vec<Value> {
        self.tools.iter().map(|t| t.definition(self)).collect()
    }

    /// Why `args` do not fit the input schema the model was shown for
    /// `tool`, if they do not: such a call is answered with the reason and
    /// never run or put to a person (the schema was only shown, and a
    /// call the endpoint could not take reached it, approved).
    pub fn check_arguments(&self, tool: &Tool, args: &Value) -> Result<(), String> {
        let definition = tool.definition(self);
        marmot_core::schema::check(&definition["input_schema"], args)
    }

    /// The tools a code tool's script may call: http and actor tools that
    /// need no approval, while no tool of their kind needs one (a script
    /// with the capability could reach a gated endpoint directly, so it
    /// gets neither).
    pub fn script_tools(&self, allowed: Option<&[String]>) -> Vec<&Tool> {
        let (http_gated, actors_gated) = self.gated();
        self.tools
            .iter()
            .filter(|t| match t {
                Tool::Http { .. } => !http_gated,
                Tool::Actor { .. } => !actors_gated,
                _ => false,
            })
            .filter(|t| !t.needs_approval())
            .filter(|t| allowed.is_none_or(|a| a.iter().any(|n| n == t.name())))
            .collect()
    }
}

impl Manifest {
    /// Whether some http tool, and some actor tool, needs an approval.
    pub fn gated(&self) -> (bool, bool) {
        let gated =
            |kind: fn(&Tool) -> bool| self.tools.iter().any(|t| kind(t) && t.needs_approval());
        (
            gated(|t| matches!(t, Tool::Http { .. })),
            gated(|t| matches!(t, Tool::Actor { .. })),
        )
    }
}

impl Tool {
    pub fn name(&self) -> &str {
        match self {
            Tool::Code { name, .. }
            | Tool::Http { name, .. }
            | Tool::Actor { name, .. }
            | Tool::Files { name, .. }
            | Tool::Client { name, .. } => name,
        }
    }

    pub fn needs_approval(&self) -> bool {
        match self {
            Tool::Code { needs_approval, .. }
            | Tool::Http { needs_approval, .. }
            | Tool::Files { needs_approval, .. }
            | Tool::Actor { needs_approval, .. } => *needs_approval,
            Tool::Client { .. } => false,
        }
    }

    /// Whether running it twice is harmless.
    pub fn idempotent(&self) -> bool {
        match self {
            Tool::Http {
                idempotent, method, ..
            } => idempotent.unwrap_or(matches!(method.as_str(), "GET" | "HEAD")),
            // Its writes commit with the turn: a cut-off run wrote nothing.
            Tool::Files { .. } => true,
            _ => false,
        }
    }

    fn definition(&self, manifest: &Manifest) -> Value {
        let object = json!({ "type": "object" });
        let (name, description, schema) = match self {
            Tool::Code {
                name,
                description,
                tools,
                ..
            } => {
                let callable: Vec<String> = manifest
                    .script_tools(tools.as_deref())
                    .iter()
                    .map(|t| format!("`await {}(args)`", script_callee(t.name())))
                    .collect();
                let mut d = if description.is_empty() {
                    "Run JavaScript in a sandbox. The value of the last expression (or what the \
                     script awaits last) is the result; console.log output is returned too."
                        .to_owned()
                } else {
                    description.clone()
                };
                if !callable.is_empty() {
                    d.push_str(&format!(
                        " These tools are async functions in the script: {}.",
                        callable.join(", ")
                    ));
                }
                (
                    name,
                    d,
                    json!({ "type": "object", "properties": { "code": { "type": "string",
                            "description": "The JavaScript to run" } }, "required": ["code"] }),
                )
            }
            Tool::Http {
                name,
                description,
                input_schema,
                ..
            }
            | Tool::Client {
                name,
                description,
                input_schema,
            } => (
                name,
                description.clone(),
                input_schema.clone().unwrap_or(object),
            ),
            Tool::Files {
                name, description, ..
            } => (
                name,
                if description.is_empty() {
                    "Read, write, list or delete files in this agent's workspace. Files under \
                     outputs/ can be downloaded by the user."
                        .to_owned()
                } else {
                    description.clone()
                },
                json!({ "type": "object", "properties": {
                    "op": { "enum": ["read", "write", "list", "delete"] },
                    "path": { "type": "string", "description": "Relative path, e.g. outputs/report.md" },
                    "content": { "type": "string", "description": "For write" } },
                    "required": ["op"] }),
            ),
            Tool::Actor {
                name,
                description,
                input_schema,
                ..
            } => (
                name,
                description.clone(),
                input_schema.clone().unwrap_or_else(|| {
                    json!({ "type": "object", "properties": {
                        "id": { "type": "string", "description": "Which actor" },
                        "message": { "description": "What to send it" } },
                        "required": ["id", "message"] })
                }),
            ),
        };
        json!({ "name": name, "description": description, "input_schema": schema })
    }
}

/// How a script names tool `name`: `tools.name`, or `tools["my-tool"]`
/// when the name is not an identifier (`tools.my-tool(args)` reads as a
/// subtraction).
fn script_callee(name: &str) -> String {
    let identifier =
        name.bytes().next().is_some_and(|b| !b.is_ascii_digit()) && !name.contains('-');
    if identifier {
        format!("tools.{name}")
    } else {
        format!("tools[\"{name}\"]")
    }
}

#[cfg(test)]
mod tests {
    use super::script_callee;

    #[test]
    fn a_tool_whose_name_is_no_identifier_is_named_by_index() {
        assert_eq!(script_callee("create_ticket"), "tools.create_ticket");
        assert_eq!(script_callee("my-tool"), r#"tools["my-tool"]"#);
        assert_eq!(script_callee("2fa"), r#"tools["2fa"]"#);
    }
}
