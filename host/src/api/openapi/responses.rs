//! The schemas of the bodies the API answers with (its successes; errors
//! are `Error`). Each names the fields a client may count on as
//! `required`, and stays open (no `additionalProperties: false`), so that
//! a field added later does not break a generated client. `tests/api/openapi.rs`
//! (`success_bodies_are_what_the_openapi_document_says`) checks real
//! answers against them.

use serde_json::{Value, json};

use super::schema;

fn object(required: &[&str], properties: Value) -> Value {
    json!({"type": "object", "required": required, "properties": properties})
}

fn array_of(items: Value) -> Value {
    json!({"type": "array", "items": items})
}

fn either(a: Value, b: Value) -> Value {
    json!({"anyOf": [a, b]})
}

fn int() -> Value {
    json!({"type": "integer", "minimum": 0})
}

/// Milliseconds since the Unix epoch.
fn ms() -> Value {
    json!({"type": "integer", "minimum": 0, "description": "ms since the Unix epoch"})
}

fn string() -> Value {
    json!({"type": "string"})
}

fn null() -> Value {
    json!({"type": "null"})
}

fn yes() -> Value {
    json!({"const": true})
}

/// `{field: [item, …]}`: a whole listing (not paged).
fn listing(field: &str, item: &str) -> Value {
    let mut properties = serde_json::Map::new();
    properties.insert(field.to_owned(), array_of(schema(item)));
    object(&[field], Value::Object(properties))
}

/// A cursor for the next page, `null` on the last.
fn cursor(of: Value) -> Value {
    either(of, null())
}

/// Any JSON value (what an actor stored or emitted).
fn any() -> Value {
    json!({})
}

/// `name → schema` for `components.schemas`.
pub(super) fn schemas() -> Vec<(&'static str, Value)> {
    let usage = object(
        &["calls", "input_tokens", "output_tokens", "cost_usd"],
        json!({"calls": int(), "input_tokens": int(), "output_tokens": int(),
               "cost_usd": {"type": "number", "minimum": 0,
                   "description": "for calls whose provider has prices"}}),
    );
    let kind = json!({"enum": ["wasm", "js", "agent"]});
    vec![
        ("Status", object(&["status"], json!({"status": string()}))),
        ("Usage", usage),
        (
            "TypeSummary",
            object(
                &["type", "version", "kind", "sha256"],
                json!({"type": string(), "version": int(), "kind": kind,
                       "sha256": {"type": "string", "pattern": "^[0-9a-f]{64}$"}}),
            ),
        ),
        (
            "Deployed",
            json!({"allOf": [schema("TypeSummary"), object(&["created"], json!({
                "created": {"type": "boolean",
                    "description": "false: the same code and config were current (no new version)"}}))]}),
        ),
        ("TypeList", listing("types", "TypeSummary")),
        (
            "TypeInfo",
            object(
                &[
                    "type",
                    "version",
                    "kind",
                    "created_at_ms",
                    "config",
                    "active_actors",
                    "usage",
                    "versions",
                ],
                json!({"type": string(), "version": int(), "kind": kind, "created_at_ms": ms(),
                    "config": {"type": "object",
                        "description": "as deployed, `webhook_secret` shown as `<redacted>`"},
                    "active_actors": int(), "usage": schema("Usage"),
                    "versions": array_of(object(
                        &["version", "kind", "sha256", "code_bytes", "deployed_at_ms", "config"],
                        json!({"version": int(), "kind": kind, "sha256": string(),
                               "code_bytes": int(), "deployed_at_ms": ms(),
                               "config": {"type": "object"}})))}),
            ),
        ),
        (
            "TypeDeleted",
            object(
                &["type", "deleted", "actors_deleted"],
                json!({"type": string(), "deleted": yes(), "actors_deleted": int()}),
            ),
        ),
        (
            "Removed",
            object(&["deleted"], json!({"name": string(), "deleted": yes()})),
        ),
        (
            "ActorInfo",
            object(
                &[
                    "type",
                    "id",
                    "status",
                    "version",
                    "created_at_ms",
                    "last_turn_at_ms",
                    "turns",
                    "state_bytes",
                    "state_keys",
                    "last_event_seq",
                    "first_event_seq",
                    "pending_messages",
                    "pending_alarms",
                    "pending_inputs",
                    "usage",
                ],
                json!({"type": string(), "id": string(),
                    "status": {"enum": ["active", "hibernated"]},
                    "version": int(), "created_at_ms": ms(),
                    "last_turn_at_ms": {"type": "integer", "minimum": 0, "description": "0: never"},
                    "turns": int(), "state_bytes": int(), "state_keys": int(),
                    "last_event_seq": int(),
                    "first_event_seq": {"type": "integer", "minimum": 0,
                        "description": "oldest kept (0: none yet)"},
                    "pending_messages": int(), "pending_alarms": int(),
                    "pending_inputs": int(), "usage": schema("Usage"),
                    "node": {"type": "string", "description": "in a cluster: the node it lives on"},
                    "region": {"type": "string", "description": "in a cluster: that node's region"},
                    "epoch": {"type": "integer", "minimum": 0,
                        "description": "in a cluster: its slot's fencing epoch"},
                    "backup": {"type": ["string", "null"],
                        "description": "in a cluster: the node its slot's commits are copied to"}}),
            ),
        ),
        (
            "ActorPage",
            object(
                &["actors", "next_cursor"],
                json!({"actors": array_of(schema("ActorInfo")),
                    "next_cursor": cursor(string()),
                    "unreachable_nodes": {"type": "array", "items": string(),
                        "description": "in a cluster: nodes whose actors this page lacks"}}),
            ),
        ),
        (
            "Queued",
            object(&["message_id"], json!({"message_id": string()})),
        ),
        (
            "RunWaiting",
            object(
                &["run_id", "status"],
                json!({"run_id": string(), "status": {"enum": ["waiting", "queued", "accepted"],
                        "description": "`waiting` for a person; `queued` behind a run that waits for one; `accepted`: queued and going on, but this node cannot wait for its end now (`detail` says why)"},
                    "detail": string(),
                    "waiting_for": {"type": "object",
                        "description": "`kind` (`approval`, `confirmation` or `client_tool`), `input_id`, and the tool call's `tool`, `call_id`, `arguments`"},
                    "behind": {"type": "object",
                        "description": "the run this one is queued behind: `run_id`, `waiting_for`"}}),
            ),
        ),
        (
            "StatePage",
            object(
                &["entries", "next_after"],
                json!({"entries": array_of(either(
                        object(&["key", "value"], json!({"key": string(), "value": any()})),
                        object(&["key", "value_base64"], json!({"key": string(),
                            "value_base64": {"type": "string", "contentEncoding": "base64",
                                "description": "a value that is not JSON"}})))),
                    "next_after": cursor(string())}),
            ),
        ),
        (
            "EventPage",
            object(
                &["events", "next_after"],
                json!({"events": array_of(object(
                        &["seq", "kind", "data", "at_ms"],
                        json!({"seq": int(), "kind": string(), "data": any(), "at_ms": ms()}))),
                    "next_after": int(),
                    "gap": object(&["after", "next"], json!({"after": int(), "next": int()})),
                    "reset": object(&["after", "last"], json!({"after": int(), "last": int()}))}),
            ),
        ),
        (
            "AlarmList",
            object(
                &["alarms"],
                json!({"alarms": array_of(object(
                    &["name", "schedule", "next_due_ms", "attempts", "set_at_ms"],
                    json!({"name": string(),
                        "schedule": {"oneOf": [
                            object(&["at"], json!({"at": ms()})),
                            object(&["after"], json!({"after": int()})),
                            object(&["cron", "tz"], json!({"cron": string(),
                                "tz": either(string(), null())}))]},
                        "next_due_ms": ms(), "attempts": int(), "set_at_ms": ms(),
                        "payload": any(),
                        "payload_base64": {"type": "string", "contentEncoding": "base64"}}))),
                    "next_after": string()}),
            ),
        ),
        (
            "InputList",
            object(
                &["inputs"],
                json!({"inputs": array_of(object(
                    &["id", "kind", "prompt", "schema", "status", "created_at_ms",
                      "expires_at_ms", "settled_at_ms"],
                    json!({"id": string(), "kind": string(), "prompt": string(),
                        "schema": any(),
                        "status": {"enum": ["pending", "answered", "expired", "cancelled"]},
                        "created_at_ms": ms(), "expires_at_ms": either(ms(), null()),
                        "settled_at_ms": either(ms(), null()),
                        "response": any()}))),
                    "next_after": string()}),
            ),
        ),
        (
            "InputAnswered",
            object(
                &["id", "status"],
                json!({"id": string(), "status": {"const": "answered"}}),
            ),
        ),
        (
            "EvalResult",
            object(
                &["result", "logs", "error"],
                json!({"result": any(), "logs": array_of(string()),
                    "error": either(string(), null())}),
            ),
        ),
        (
            "RunCancelling",
            object(
                &["run_id", "cancelling"],
                json!({"run_id": string(), "cancelling": yes()}),
            ),
        ),
        (
            "FilePage",
            object(
                &["files", "next_after"],
                json!({"files": array_of(object(
                        &["path", "size", "sha256", "updated_at_ms"],
                        json!({"path": string(), "size": int(),
                            "sha256": {"type": "string", "pattern": "^[0-9a-f]{64}$"},
                            "updated_at_ms": ms()}))),
                    "next_after": cursor(string())}),
            ),
        ),
        (
            "WebhookAccepted",
            object(
                &["actor", "delivery_id", "message_id", "duplicate"],
                json!({"actor": string(), "delivery_id": string(), "message_id": string(),
                    "duplicate": {"type": "boolean",
                        "description": "this delivery id was taken before: nothing new queued"}}),
            ),
        ),
        (
            "ProviderInfo",
            object(
                &["name", "format", "created_at_ms", "updated_at_ms"],
                json!({"name": string(),
                    "format": {"enum": ["openai-chat", "openai-responses", "anthropic-messages"]},
                    "base_url": string(), "key_secret": string(),
                    "headers": {"type": "object", "additionalProperties": string()},
                    "prices": {"type": "object"}, "max_completion_tokens": {"type": "boolean"},
                    "created_at_ms": ms(), "updated_at_ms": ms()}),
            ),
        ),
        ("ProviderList", listing("providers", "ProviderInfo")),
        (
            "SecretInfo",
            object(
                &["name", "hosts", "created_at_ms", "updated_at_ms"],
                json!({"name": string(), "hosts": array_of(string()),
                    "created_at_ms": ms(), "updated_at_ms": ms()}),
            ),
        ),
        ("SecretList", listing("secrets", "SecretInfo")),
        (
            "SubscriptionInfo",
            object(
                &["name", "url", "events", "types", "created_at_ms"],
                json!({"name": string(),
                    "url": {"type": "string", "description": "a password in it shown as `***`"},
                    "events": array_of(string()), "types": array_of(string()),
                    "created_at_ms": ms(),
                    "secret": {"type": "string",
                        "description": "only in the answer to the PUT that generated it"}}),
            ),
        ),
        (
            "SubscriptionList",
            listing("subscriptions", "SubscriptionInfo"),
        ),
        (
            "Delivery",
            object(
                &[
                    "id",
                    "subscription",
                    "status",
                    "actor",
                    "event_seq",
                    "kind",
                    "attempts",
                    "next_attempt_ms",
                    "last_error",
                    "created_at_ms",
                ],
                json!({"id": string(), "subscription": string(),
                    "status": {"enum": ["pending", "failed", "dead"]},
                    "actor": object(&["type", "id"], json!({"type": string(), "id": string()})),
                    "event_seq": int(), "kind": string(), "attempts": int(),
                    "next_attempt_ms": either(ms(), null()),
                    "last_error": either(string(), null()), "created_at_ms": ms()}),
            ),
        ),
        (
            "DeliveryPage",
            object(
                &["deliveries", "next_after"],
                json!({"deliveries": array_of(schema("Delivery")),
                    "next_after": cursor(string())}),
            ),
        ),
        (
            "BackupDone",
            object(
                &[
                    "path",
                    "rows",
                    "blobs",
                    "db_bytes",
                    "attempts",
                    "elapsed_ms",
                ],
                json!({"path": string(), "rows": int(), "blobs": int(), "db_bytes": int(),
                    "attempts": {"type": "integer", "minimum": 1}, "elapsed_ms": int()}),
            ),
        ),
        (
            "Token",
            object(
                &["token", "expires_at_ms", "token_id"],
                json!({"token": string(), "expires_at_ms": ms(),
                    "token_id": {"type": "string", "pattern": "^[0-9a-f]{32}$"}}),
            ),
        ),
        (
            "TokenRevoked",
            object(
                &["token_id", "revoked", "new"],
                json!({"token_id": string(), "revoked": yes(),
                    "new": {"type": "boolean", "description": "false: it was revoked before"}}),
            ),
        ),
        (
            "Moved",
            object(
                &["moved", "region", "slot", "node"],
                json!({"moved": {"type": "boolean",
                        "description": "false: it was in that region already"},
                    "region": string(), "slot": int(),
                    "node": {"type": ["string", "null"],
                        "description": "the owner of its slot now (null: none reachable)"}}),
            ),
        ),
        ("ClusterStatus", cluster_status()),
        (
            "Rebalance",
            object(
                &["requested", "slots_to_move"],
                json!({"requested": yes(), "slots_to_move": int()}),
            ),
        ),
    ]
}

/// `GET /v1/cluster`: a node that runs alone says so; one in a cluster
/// gives its view.
fn cluster_status() -> Value {
    let member = object(
        &["node_id", "region", "advertise", "alive", "slots"],
        json!({"node_id": string(), "region": either(string(), null()),
            "advertise": either(string(), null()),
            "incarnation": {"type": "string", "description": "its lease id (a string: above 2^53)"},
            "leaving": {"type": "boolean",
                "description": "stopping: handing its slots over, given no new ones"},
            "alive": {"type": ["boolean", "null"],
                "description": "null while this node's own view is stale"},
            "slots": int(), "slots_used": int(), "backup_of": int()}),
    );
    json!({"oneOf": [
        object(&["clustered", "message"], json!({"clustered": {"const": false},
            "message": string()})),
        object(
            &["node_id", "view", "controller", "revision", "slots", "slots_assigned",
              "slots_unavailable", "slots_degraded", "members"],
            json!({"node_id": string(),
                "view": {"type": "string", "description": "`live`, or why it is stale"},
                "controller": either(string(), null()), "revision": int(),
                "slots": int(), "slots_assigned": int(), "slots_unavailable": int(),
                "slots_degraded": int(), "failovers_by_this_node": int(),
                "actors_placed": int(), "actors_moving": int(),
                "max_epoch": either(int(), null()),
                "rebalance": either(object(&["requested_at_ms", "by", "slots_to_move"],
                    json!({"requested_at_ms": ms(), "by": string(), "slots_to_move": int(),
                        "handoffs": int()})), null()),
                "members": array_of(member)})),
    ]})
}
