//! `GET /v1/openapi.json`: an OpenAPI 3.1 description of the HTTP API,
//! built here from one table of operations (those on actors in
//! `actors.rs`, the cluster's in `cluster.rs`; the schemas of names and
//! request bodies in `schemas.rs`, of answers in `responses.rs`). Tests
//! compare the table with the router's routes (both ways) and the body
//! schemas with what serde reads, and `tests/api/openapi.rs` asks every
//! operation of the served document whether it answers as documented
//! (docs/design.md, "The API description").

use serde_json::{Map, Value, json};

use super::extract::Page;

mod actors;
mod cluster;
mod responses;
mod schemas;

use schemas::{components, names};

/// In an operation's responses: any other status (OpenAPI's `default`).
const ANY_STATUS: u16 = 0;

/// One operation: method, path (OpenAPI spelling), id, summary, its
/// parameters, request body and responses.
struct Op {
    method: &'static str,
    path: &'static str,
    id: &'static str,
    summary: &'static str,
    params: Vec<Value>,
    body: Option<Value>,
    /// Status, description, and the schema of its JSON body (or, from
    /// [`media_types`], its bodies by media type).
    responses: Vec<(u16, &'static str, Option<Value>)>,
}

/// A response's bodies by media type, where it has more than JSON.
fn media_types(content: Value) -> Value {
    json!({ MEDIA_TYPES: content })
}

/// The key [`media_types`] wraps its map in (no JSON Schema keyword).
const MEDIA_TYPES: &str = "x-media-types";

fn path_param(name: &str, description: &str, schema: Value) -> Value {
    json!({"name": name, "in": "path", "required": true, "description": description,
           "schema": schema})
}

fn query(name: &str, ty: &str, description: &str) -> Value {
    query_with(name, description, json!({"type": ty}))
}

fn query_with(name: &str, description: &str, schema: Value) -> Value {
    json!({"name": name, "in": "query", "required": false, "description": description,
           "schema": schema})
}

/// `param`, required.
fn required(mut param: Value) -> Value {
    param["required"] = json!(true);
    param
}

/// `?limit=`.
fn limit(page: Page) -> Value {
    query_with(
        "limit",
        &format!(
            "page size (default {}; a larger ask gets {})",
            page.default, page.max
        ),
        json!({"type": "integer", "minimum": 1, "maximum": u64::MAX}),
    )
}

fn header(name: &str, description: &str, schema: Value) -> Value {
    json!({"name": name, "in": "header", "required": false, "description": description,
           "schema": schema})
}

fn actor() -> Vec<Value> {
    let mut ty = path_param("type", "actor type", names::type_name());
    let mut id = path_param("id", "actor id (percent-encode `/`)", names::actor_id());
    // The example `marmot dev` deploys, so that a client (or a fuzzer)
    // pointed at a dev node reaches an actor.
    ty["example"] = json!("counter");
    id["example"] = json!("alice");
    vec![ty, id]
}

fn with(mut v: Vec<Value>, more: impl IntoIterator<Item = Value>) -> Vec<Value> {
    v.extend(more);
    v
}

fn schema(name: &str) -> Value {
    json!({"$ref": format!("#/components/schemas/{name}")})
}

fn json_body(s: Value) -> Value {
    json!({"required": true, "content": {"application/json": {"schema": s}}})
}

fn any_json() -> Value {
    json!({})
}

/// Every operation of the API.
fn operations() -> Vec<Op> {
    let name = |what| vec![path_param("name", what, names::short_name())];
    let mut ops = vec![
        Op {
            method: "get",
            path: "/healthz",
            id: "healthz",
            summary: "Liveness",
            params: vec![],
            body: None,
            responses: vec![(200, "alive", Some(schema("Status")))],
        },
        Op {
            method: "get",
            path: "/readyz",
            id: "readyz",
            summary: "Readiness: storage open, recovery done",
            params: vec![],
            body: None,
            responses: vec![
                (
                    200,
                    "ready (`degraded_slots` and a `message` when some slots of this node have no backup)",
                    Some(schema("Status")),
                ),
                (503, "not yet", None),
            ],
        },
        Op {
            method: "get",
            path: "/metrics",
            id: "metrics",
            summary: "Prometheus metrics (text)",
            params: vec![],
            body: None,
            responses: vec![(200, "metrics", None)],
        },
        Op {
            method: "get",
            path: "/v1/openapi.json",
            id: "openapi",
            summary: "This document",
            params: vec![],
            body: None,
            responses: vec![(
                200,
                "OpenAPI 3.1",
                Some(json!({"type": "object", "required": ["openapi", "info", "paths"]})),
            )],
        },
        Op {
            method: "get",
            path: "/v1/types",
            id: "listTypes",
            summary: "Deployed types",
            params: vec![],
            body: None,
            responses: vec![(200, "types", Some(schema("TypeList")))],
        },
        Op {
            method: "put",
            path: "/v1/types/{type}",
            id: "deployType",
            summary: "Deploy a new version: a Wasm component (application/wasm), a JavaScript module (text/javascript) or a JSON manifest",
            params: vec![path_param("type", "type name", names::type_name())],
            body: Some(json!({"required": true, "content": {
                "application/json": {"schema": schema("Manifest")},
                "application/wasm": {"schema": {"type": "string", "format": "binary"}},
                "application/octet-stream": {"schema": {"type": "string", "format": "binary"}},
                "text/javascript": {"schema": {"type": "string"}},
                "application/javascript": {"schema": {"type": "string"}}}})),
            responses: vec![
                (201, "deployed", Some(schema("Deployed"))),
                (
                    200,
                    "the current version has this code and config: nothing deployed",
                    Some(schema("Deployed")),
                ),
                (400, "bad code or manifest; nothing changed", None),
                (413, "code too large", None),
                (415, "no Content-Type, or one that is not deployable", None),
            ],
        },
        Op {
            method: "get",
            path: "/v1/types/{type}",
            id: "getType",
            summary: "Versions and config of a type",
            params: vec![path_param("type", "type name", names::type_name())],
            body: None,
            responses: vec![
                (200, "the type", Some(schema("TypeInfo"))),
                (404, "unknown type", None),
            ],
        },
        Op {
            method: "delete",
            path: "/v1/types/{type}",
            id: "deleteType",
            summary: "Delete a type (409 while actors exist, unless force)",
            params: vec![
                path_param("type", "type name", names::type_name()),
                query("force", "boolean", "delete its actors too"),
            ],
            body: None,
            responses: vec![
                (200, "deleted", Some(schema("TypeDeleted"))),
                (404, "unknown type", None),
                (409, "actors exist", None),
            ],
        },
        Op {
            method: "post",
            path: "/v1/hooks/{type}/{id}/{name}",
            id: "inboundWebhook",
            summary: "Inbound webhook (Standard Webhooks or GitHub signature; no bearer token)",
            params: vec![
                path_param("type", "actor type", names::type_name()),
                path_param(
                    "id",
                    "actor id, or `_` to route by the type's webhook_routes",
                    names::actor_id(),
                ),
                path_param("name", "hook name", names::short_name()),
            ],
            body: Some(json!({"required": true, "content": {"*/*": {"schema": {}}}})),
            responses: vec![
                (
                    202,
                    "verified and durable (run, or queued)",
                    Some(schema("WebhookAccepted")),
                ),
                (400, "bad name or route", None),
                (
                    422,
                    "routed by the payload, which lacks the route's field",
                    None,
                ),
                (
                    401,
                    "bad, missing or stale signature (refused from the headers, before the body is read)",
                    None,
                ),
                (
                    404,
                    "no webhook endpoint: an unknown type, or one without a webhook_secret",
                    None,
                ),
                (
                    503,
                    "overloaded, or the node's request body budget is spent; not stored (Retry-After)",
                    None,
                ),
            ],
        },
        Op {
            method: "get",
            path: "/v1/providers",
            id: "listProviders",
            summary: "Model providers",
            params: vec![],
            body: None,
            responses: vec![(200, "providers", Some(schema("ProviderList")))],
        },
        Op {
            method: "put",
            path: "/v1/providers/{name}",
            id: "putProvider",
            summary: "Set a model provider",
            params: name("provider name"),
            body: Some(json_body(schema("Provider"))),
            responses: vec![
                (200, "replaced", Some(schema("ProviderInfo"))),
                (201, "created", Some(schema("ProviderInfo"))),
                (400, "bad provider", None),
            ],
        },
        Op {
            method: "get",
            path: "/v1/providers/{name}",
            id: "getProvider",
            summary: "One model provider",
            params: name("provider name"),
            body: None,
            responses: vec![
                (200, "the provider", Some(schema("ProviderInfo"))),
                (404, "no such provider", None),
            ],
        },
        Op {
            method: "delete",
            path: "/v1/providers/{name}",
            id: "deleteProvider",
            summary: "Remove a model provider",
            params: name("provider name"),
            body: None,
            responses: vec![
                (200, "removed", Some(schema("Removed"))),
                (404, "no such provider", None),
            ],
        },
        Op {
            method: "get",
            path: "/v1/secrets",
            id: "listSecrets",
            summary: "Secret names, hosts and versions (never values)",
            params: vec![],
            body: None,
            responses: vec![(200, "secrets", Some(schema("SecretList")))],
        },
        Op {
            method: "put",
            path: "/v1/secrets/{name}",
            id: "putSecret",
            summary: "Set a secret (write-only)",
            params: name("secret name"),
            body: Some(json_body(schema("Secret"))),
            responses: vec![
                (200, "replaced", Some(schema("SecretInfo"))),
                (201, "created", Some(schema("SecretInfo"))),
                (400, "bad secret", None),
                (413, "value too large", None),
            ],
        },
        Op {
            method: "delete",
            path: "/v1/secrets/{name}",
            id: "deleteSecret",
            summary: "Remove a secret",
            params: name("secret name"),
            body: None,
            responses: vec![
                (200, "removed", Some(schema("Removed"))),
                (404, "no such secret", None),
            ],
        },
        Op {
            method: "get",
            path: "/v1/subscriptions",
            id: "listSubscriptions",
            summary: "Outbound webhook subscriptions",
            params: vec![],
            body: None,
            responses: vec![(200, "subscriptions", Some(schema("SubscriptionList")))],
        },
        Op {
            method: "put",
            path: "/v1/subscriptions/{name}",
            id: "putSubscription",
            summary: "Set an outbound webhook subscription",
            params: name("subscription name"),
            body: Some(json_body(schema("Subscription"))),
            responses: vec![
                (200, "replaced", Some(schema("SubscriptionInfo"))),
                (201, "created", Some(schema("SubscriptionInfo"))),
                (400, "bad subscription", None),
            ],
        },
        Op {
            method: "get",
            path: "/v1/subscriptions/{name}",
            id: "getSubscription",
            summary: "One subscription (never its secret)",
            params: name("subscription name"),
            body: None,
            responses: vec![
                (200, "the subscription", Some(schema("SubscriptionInfo"))),
                (404, "no such subscription", None),
            ],
        },
        Op {
            method: "delete",
            path: "/v1/subscriptions/{name}",
            id: "deleteSubscription",
            summary: "Remove a subscription",
            params: name("subscription name"),
            body: None,
            responses: vec![
                (200, "removed", Some(schema("Removed"))),
                (404, "no such subscription", None),
            ],
        },
        Op {
            method: "get",
            path: "/v1/deliveries",
            id: "listDeliveries",
            summary: "Outbound deliveries not yet delivered",
            params: vec![
                query_with(
                    "status",
                    "only these",
                    json!({"enum": ["pending", "failed", "dead"]}),
                ),
                query("subscription", "string", "one subscription's"),
                query_with(
                    "after",
                    "continue after this delivery id",
                    names::delivery_id(),
                ),
                limit(Page::LIST),
            ],
            body: None,
            responses: vec![(200, "deliveries", Some(schema("DeliveryPage")))],
        },
        Op {
            method: "post",
            path: "/v1/deliveries/{id}/retry",
            id: "retryDelivery",
            summary: "Replay a failed or dead delivery now",
            params: vec![path_param("id", "delivery id", names::delivery_id())],
            body: None,
            responses: vec![
                (
                    202,
                    "queued again, to be attempted now",
                    Some(schema("Delivery")),
                ),
                (404, "no such delivery", None),
                (
                    409,
                    "its subscription was deleted or no longer wants it (subscription_gone); kept",
                    None,
                ),
            ],
        },
        Op {
            method: "post",
            path: "/v1/backup",
            id: "backup",
            summary: "Write a consistent backup (database and blobs) into a new directory on the node's machine, while serving",
            params: vec![],
            body: Some(json_body(json!({"type": "object", "required": ["to"],
                "additionalProperties": false,
                "properties": {"to": {"type": "string", "description": "absolute path that does not exist yet"}}}))),
            responses: vec![
                (200, "written", Some(schema("BackupDone"))),
                (400, "bad request", None),
                (409, "the directory exists", None),
                (500, "backup failed", None),
            ],
        },
        Op {
            method: "post",
            path: "/v1/tokens",
            id: "mintToken",
            summary: "Mint a client token for one actor (or id prefix) and some verbs",
            params: vec![],
            body: Some(json_body(schema("TokenRequest"))),
            responses: vec![
                (201, "minted", Some(schema("Token"))),
                (400, "bad request", None),
                (404, "unknown type", None),
            ],
        },
        Op {
            method: "delete",
            path: "/v1/tokens/{id}",
            id: "revokeToken",
            summary: "Revoke a client token by its token_id",
            params: vec![path_param("id", "token_id", names::token_id())],
            body: None,
            responses: vec![
                (
                    200,
                    "revoked (also when it was before)",
                    Some(schema("TokenRevoked")),
                ),
                (400, "not a token id", None),
            ],
        },
    ];
    ops.extend(actors::operations());
    ops.extend(cluster::operations());
    ops
}

/// Responses every operation of a kind can give, whatever its handler
/// does: the edge layer's (auth, two `Authorization` headers, client-token
/// and per-type rate limits) and the extractors' (a bad path, query or
/// body is a 400 naming it; an unknown type a 404; a body that stops
/// arriving a 408). Added where the table does not say more.
fn common_responses(op: &Op) -> Vec<(u16, &'static str)> {
    // The edge refuses two `Authorization` headers on every route, so any
    // operation can be a 400 (found by schemathesis).
    let mut out = vec![(
        400,
        "a path, query, header or body that is not valid; nothing changed (`error.code` says which)",
    )];
    if op.path.contains("{type}") {
        out.push((404, "no such type (or actor, or what the path names)"));
    }
    if op.body.is_some() {
        out.push((413, "a body larger than this operation takes"));
        out.push((
            408,
            "the body did not arrive within `limits.body_timeout_ms` and its size's allowance (`body_timeout`); nothing changed",
        ));
    }
    // Open, but held to the type's `rate_limit_per_s` like a client token.
    if op.path.starts_with("/v1/hooks/") {
        out.push((429, "the type's rate limit (Retry-After); nothing changed"));
    }
    if op.path.starts_with("/v1/") && op.path != "/v1/openapi.json" {
        out.push((
            503,
            "not now, nothing changed (Retry-After): storage failing, or the node's request body budget spent",
        ));
    }
    if !super::edge::is_open(op.path) {
        out.push((401, "missing, wrong, expired or revoked token"));
        out.push((403, "a client token that does not open this request"));
        if client_token_reaches(op) {
            out.push((
                429,
                "the client token's or the actor's rate limit (Retry-After)",
            ));
        }
    }
    out
}

/// Whether a client token can open `op` at all (given the right actor,
/// scopes and file): asked of the token code itself, with every scope (a
/// file path is one of the artifacts it may download).
fn client_token_reaches(op: &Op) -> bool {
    let path = op
        .path
        .replace("{type}", "t")
        .replace("{id}", "i")
        .replace("{path}", "outputs/x")
        .split('/')
        .map(|seg| if seg.starts_with('{') { "x" } else { seg })
        .collect::<Vec<_>>()
        .join("/");
    let grant = crate::tokens::Grant {
        jti: String::new(),
        ty: "t".into(),
        id: Some("i".into()),
        id_prefix: None,
        scopes: crate::tokens::Scope::ALL.to_vec(),
        iat: 0,
        exp: u64::MAX,
    };
    let method = op.method.to_ascii_uppercase();
    axum::http::Method::from_bytes(method.as_bytes()).is_ok_and(|m| grant.allows(&m, &path).is_ok())
}

/// The document.
pub(super) fn document() -> Value {
    let mut paths = Map::new();
    for op in operations() {
        let mut responses = Map::new();
        let error = || json!({"application/json": {"schema": schema("Error")}});
        for &(status, description) in &common_responses(&op) {
            responses.insert(
                status.to_string(),
                json!({"description": description, "content": error()}),
            );
        }
        // The table's own say wins over the common description.
        for (status, description, body) in op.responses {
            let mut r = json!({"description": description});
            if let Some(content) = body.as_ref().and_then(|s| s.get(MEDIA_TYPES)) {
                r["content"] = content.clone();
            } else if let Some(s) = body {
                r["content"] = json!({"application/json": {"schema": s}});
            } else if status >= 400 {
                r["content"] = error();
            }
            let key = match status {
                ANY_STATUS => "default".to_owned(),
                n => n.to_string(),
            };
            responses.insert(key, r);
        }
        let mut o = json!({
            "operationId": op.id,
            "summary": op.summary,
            "parameters": op.params,
            "responses": responses,
        });
        if super::edge::is_open(op.path) {
            o["security"] = json!([]);
        }
        if let Some(b) = op.body {
            o["requestBody"] = b;
        }
        let entry = paths
            .entry(op.path)
            .or_insert_with(|| Value::Object(Map::new()));
        entry[op.method] = o;
    }
    json!({
        "openapi": "3.1.0",
        "info": {"title": "Marmot", "version": env!("CARGO_PKG_VERSION"),
                 "description": "Durable actors on WebAssembly: PRODUCT.md §3"},
        "security": [{"bearer": []}],
        "paths": paths,
        "components": components(),
    })
}

/// `GET /v1/openapi.json`.
pub(super) async fn serve() -> axum::Json<Value> {
    axum::Json(document())
}

#[cfg(test)]
mod tests;
