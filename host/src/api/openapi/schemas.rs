//! The schemas of the document: the names and ids users choose (as
//! `crate::ids` validates them) and the request bodies (as serde reads
//! them; `tests.rs` holds the two together). The answers' are in
//! `responses.rs`.

use serde_json::{Value, json};

use super::schema;

/// `schema`, or `null` (an optional field serde reads `null` into as
/// absent).
fn nullable(schema: Value) -> Value {
    json!({"anyOf": [schema, {"type": "null"}]})
}

/// The names and ids users choose, as `crate::ids` validates them (a
/// JSON Schema `maxLength` counts characters where the limits count
/// bytes; the descriptions say so).
pub(super) mod names {
    use serde_json::{Value, json};

    use crate::ids::{
        MAX_ACTOR_ID, MAX_FILE_PATH, MAX_IDEMPOTENCY_KEY, MAX_NAME, MAX_STATE_KEY, MAX_TYPE_NAME,
    };

    /// No control characters (`char::is_control`: Unicode's Cc).
    const NO_CONTROLS: &str = "^[^\\u0000-\\u001f\\u007f-\\u009f]+$";

    pub(in crate::api::openapi) fn type_name() -> Value {
        json!({"type": "string", "minLength": 1, "maxLength": MAX_TYPE_NAME,
               "pattern": "^[a-z0-9][a-z0-9_-]*$"})
    }

    pub(in crate::api::openapi) fn actor_id() -> Value {
        json!({"type": "string", "minLength": 1, "maxLength": MAX_ACTOR_ID,
               "pattern": NO_CONTROLS,
               "description": format!("1 to {MAX_ACTOR_ID} bytes of UTF-8 without control characters")})
    }

    /// Secret, provider, subscription and hook names.
    pub(in crate::api::openapi) fn short_name() -> Value {
        json!({"type": "string", "minLength": 1, "maxLength": MAX_NAME,
               "pattern": "^[A-Za-z0-9._-]+$"})
    }

    pub(in crate::api::openapi) fn state_key() -> Value {
        json!({"type": "string", "minLength": 1, "maxLength": MAX_STATE_KEY,
               "description": format!("at most {MAX_STATE_KEY} bytes")})
    }

    /// No control character or backslash.
    /// Non-empty segments of at most 255 characters, without control
    /// characters or backslashes.
    const FILE_SEGMENTS: &str = "^[^/\\u0000-\\u001f\\u007f-\\u009f\\\\]{1,255}(/[^/\\u0000-\\u001f\\u007f-\\u009f\\\\]{1,255})*$";

    /// A prefix of file paths (`?prefix=`): any string, as in the guest's
    /// `files.list`.
    pub(in crate::api::openapi) fn file_prefix() -> Value {
        json!({"type": "string", "maxLength": MAX_FILE_PATH})
    }

    pub(in crate::api::openapi) fn file_path() -> Value {
        json!({"type": "string", "minLength": 1, "maxLength": MAX_FILE_PATH,
               "pattern": FILE_SEGMENTS,
               "description": format!("relative and `/`-separated, at most {MAX_FILE_PATH} bytes; no empty, `.` or `..` segment, no backslash or control character, segments of at most 255 bytes")})
    }

    pub(in crate::api::openapi) fn idempotency_key() -> Value {
        json!({"type": "string", "minLength": 1, "maxLength": MAX_IDEMPOTENCY_KEY,
               "pattern": "^[!-~]+$"})
    }

    /// A client token's `token_id`.
    pub(in crate::api::openapi) fn token_id() -> Value {
        json!({"type": "string", "pattern": "^[0-9A-Fa-f]{32}$"})
    }

    /// A delivery's id.
    pub(in crate::api::openapi) fn delivery_id() -> Value {
        json!({"type": "string", "pattern": "^msg_[0-9A-Fa-f]{32}$"})
    }

    /// Ids the node hands out (input requests, agent runs): an unknown one
    /// is a 404.
    pub(in crate::api::openapi) fn handed_out() -> Value {
        json!({"type": "string", "minLength": 1})
    }
}

pub(super) fn components() -> Value {
    let mut c = json!({
        "securitySchemes": {"bearer": {"type": "http", "scheme": "bearer",
            "description": "the admin token, or a client token from POST /v1/tokens"}},
        "schemas": {
            "Error": {"type": "object", "required": ["error"], "properties": {"error": {
                "type": "object", "required": ["code", "message"], "properties": {
                    "code": {"type": "string", "description": "snake_case"},
                    "message": {"type": "string"}}}}},
            "Manifest": {"oneOf": [
                {"type": "object", "required": ["kind", "code"], "additionalProperties": false,
                 "properties": {"kind": {"const": "js"},
                    "code": {"type": "string", "description": "the module's source"},
                    "config": schema("TypeConfig")}},
                {"type": "object", "required": ["kind", "code_base64"], "additionalProperties": false,
                 "properties": {"kind": {"const": "wasm"},
                    "code_base64": {"type": "string", "contentEncoding": "base64",
                        "description": "the component"},
                    "config": schema("TypeConfig")}},
                {"type": "object", "required": ["kind", "agent"], "additionalProperties": false,
                 "properties": {"kind": {"const": "agent"},
                    "agent": {"type": "object", "description": "the agent's settings (docs/agent.md)"},
                    "config": schema("TypeConfig")}}]},
            "TypeConfig": type_config(),
            "Secret": {"type": "object", "required": ["value", "hosts"],
                "additionalProperties": false, "properties": {
                "value": {"type": "string", "minLength": crate::secrets::MIN_VALUE_BYTES / 4, "description": format!(
                    "write-only; {} to {} bytes of UTF-8 (so at least {} characters)",
                    crate::secrets::MIN_VALUE_BYTES, crate::secrets::MAX_VALUE_BYTES,
                    crate::secrets::MIN_VALUE_BYTES / 4)},
                "hosts": {"type": "array", "minItems": 1, "maxItems": crate::secrets::MAX_HOSTS,
                    "items": {"type": "string", "minLength": 1},
                    "description": "the only hosts it may be sent to (https): `api.example.com`, `*.example.com`"}}},
            "Provider": {"type": "object", "required": ["format"],
                "additionalProperties": false, "properties": {
                "format": {"enum": ["openai-chat", "openai-responses", "anthropic-messages"]},
                "base_url": nullable(json!({"type": "string", "format": "iri",
                    "description": "defaults to the vendor's own API"})),
                "key_secret": nullable(names::short_name()),
                "headers": {"type": "object",
                    "propertyNames": {"pattern": "^[!#$%&'*+.^_`|~0-9A-Za-z-]+$"},
                    "additionalProperties": {"type": "string", "pattern": HEADER_VALUE,
                        "not": {"pattern": "\\{\\{"},
                        "description": "sent as is: no placeholders (keys belong in `key_secret`)"}},
                "prices": {"type": "object", "additionalProperties": {
                    "type": "object", "required": ["input_per_mtok", "output_per_mtok"],
                    "additionalProperties": false, "properties": {
                    "input_per_mtok": {"type": "number", "minimum": 0},
                    "output_per_mtok": {"type": "number", "minimum": 0}}}},
                "max_completion_tokens": nullable(json!({"type": "boolean",
                    "description": "openai-chat only"}))},
                "if": {"properties": {"format": {"const": "openai-chat"}}},
                "else": {"properties": {"max_completion_tokens": {"type": "null"}}}},
            "Subscription": {"type": "object", "required": ["url"],
                "additionalProperties": false, "properties": {
                "url": {"type": "string", "format": "iri", "pattern": "^https?://[^/?#]",
                    "description": "http:// or https://, with a host"},
                "events": nullable(json!({"type": "array", "minItems": 1,
                    "items": {"type": "string", "minLength": 1, "maxLength": 128,
                        "pattern": "^[^*\\u0000-\\u001f\\u007f-\\u009f]*\\*?$"},
                    "description": "`*`, event kinds, or kind prefixes ending in `*` (default: all)"})),
                "types": {"type": "array", "items": names::type_name(),
                    "description": "actor types (default: all)"},
                "secret": nullable(json!({"type": "string", "pattern": WEBHOOK_SECRET,
                    "description": "`whsec_` + base64 of at least 16 bytes; generated (and shown once) when a new subscription names none; a replace that names none keeps the current one"}))}},
            "TokenRequest": {"type": "object", "required": ["type", "scopes", "ttl_s"],
                "additionalProperties": false, "properties": {
                "type": {"type": "string"}, "id": nullable(json!({"type": "string"})),
                "id_prefix": nullable(json!({"type": "string"})),
                "scopes": {"type": "array", "minItems": 1,
                    "items": {"enum": ["send", "events", "inputs", "files"]}},
                "ttl_s": {"type": "integer", "minimum": 1, "maximum": crate::tokens::MAX_TTL_S}}}
        }
    });
    for (name, s) in super::responses::schemas() {
        c["schemas"][name] = s;
    }
    c
}

/// A webhook secret as `crate::webhooks::check_secret` reads it: `whsec_`
/// and the padded base64 (canonical: unused bits zero) of at least 16
/// bytes, that is five full groups and then a group of one to three bytes,
/// or six groups or more.
pub(super) const WEBHOOK_SECRET: &str = "^whsec_(?:[A-Za-z0-9+/]{4}){5,}\
    (?:[A-Za-z0-9+/]{4}|[A-Za-z0-9+/][AQgw]==|[A-Za-z0-9+/]{2}[AEIMQUYcgkosw048]=)$";

/// A header value `http::HeaderValue::from_str` takes: no control
/// characters but tab.
const HEADER_VALUE: &str = "^[^\\u0000-\\u0008\\u000a-\\u001f\\u007f]*$";

/// A type's config (`crate::config::TypeConfig`); every key optional.
fn type_config() -> Value {
    let ms = |what: &str, days: u64| {
        let maximum = days * 86_400_000;
        nullable(json!({"type": "integer", "minimum": 1, "maximum": maximum, "description": what}))
    };
    let strings =
        |what: &str| json!({"type": "array", "items": {"type": "string"}, "description": what});
    let limit = || nullable(json!({"type": "integer", "minimum": 0}));
    let usd = || nullable(json!({"type": "number", "minimum": 0}));
    json!({"type": "object", "additionalProperties": false, "properties": {
        "idle_timeout_ms": ms("hibernate after this long without work", 7),
        "turn_timeout_ms": ms("wall-clock limit of one turn", 1),
        "cpu_slice_ms": ms("CPU a guest may burn without calling the host", 1),
        "max_memory_bytes": nullable(json!({"type": "integer", "minimum": 1 << 20,
            "description": "guest linear memory (at most the node's `limits.max_guest_memory_bytes`)"})),
        "allowed_hosts": strings("hosts the `http` capability may reach (default: none)"),
        "allowed_methods": {"type": "array", "items": {"enum": crate::config::HTTP_METHODS},
            "description": "HTTP methods it may use (default: all)"},
        "max_redirects": nullable(json!({"type": "integer", "minimum": 0, "maximum": 20})),
        "http_concurrency": nullable(json!({"type": "integer", "minimum": 1})),
        "rate_limit_per_s": nullable(json!({"type": "integer", "minimum": 1, "maximum": u32::MAX,
            "description": "messages per second the type's actors take on this node, together \
                (client messages, webhooks, other actors' sends and calls); default: no limit"})),
        "rate_limit_burst": nullable(json!({"type": "integer", "minimum": 1, "maximum": u32::MAX,
            "description": "messages taken at once above the rate (default: one second's worth)"})),
        "secrets": {"type": "array", "items": names::short_name(),
            "description": "secrets the type may name"},
        "webhook_secret": nullable(json!({"type": "string", "pattern": WEBHOOK_SECRET,
            "description": "`whsec_` + base64 of at least 16 bytes; never shown back"})),
        "webhook_routes": {"type": "object", "propertyNames": names::short_name(),
            "additionalProperties": {"type": "string", "pattern": "^/"},
            "description": "hook name → JSON pointer to the actor id in the payload (needs `webhook_secret`)"},
        "env": {"type": "object", "additionalProperties": {"type": "string"}},
        "budget": nullable(json!({"type": "object", "additionalProperties": false, "properties": {
            "max_tokens": limit(), "max_cost_usd": usd(),
            "actor_max_tokens": limit(), "actor_max_cost_usd": usd()}}))},
        "dependentRequired": {"rate_limit_burst": ["rate_limit_per_s"]}})
}
