//! The document names every route of the router, and only those, and
//! describes what they accept as the server reads it.

use std::collections::BTreeSet;

use super::*;

/// (method, path) of every route in the router's source, paths in
/// OpenAPI spelling (`{*key}` → `{key}`).
fn router_routes() -> BTreeSet<(String, String)> {
    let src = include_str!("../mod.rs");
    let mut out = BTreeSet::new();
    let mut rest = src;
    while let Some(i) = rest.find(".route(") {
        rest = &rest[i + ".route(".len()..];
        // The route's arguments end at the parenthesis that closes it.
        let mut depth = 1;
        let end = rest
            .char_indices()
            .find(|&(_, c)| {
                match c {
                    '(' => depth += 1,
                    ')' => depth -= 1,
                    _ => {}
                }
                depth == 0
            })
            .map(|(j, _)| j)
            .expect("balanced route call");
        let args = &rest[..end];
        let path = args.split('"').nth(1).expect("a path literal");
        let path = path.replace("{*", "{");
        for method in ["get", "post", "put", "delete"] {
            let called = args.contains(&format!(" {method}("))
                || args.contains(&format!("\t{method}("))
                || args.contains(&format!("\n{method}("))
                || args.contains(&format!(".{method}("))
                || args.contains(&format!("::{method}("))
                || args.contains(&format!(",{method}("));
            if called {
                out.insert((method.to_owned(), path.clone()));
            }
        }
    }
    out
}

fn documented() -> BTreeSet<(String, String)> {
    operations()
        .iter()
        .map(|o| (o.method.to_owned(), o.path.to_owned()))
        .collect()
}

#[test]
fn the_document_and_the_router_name_the_same_operations() {
    let routes = router_routes();
    assert!(
        routes.len() > 30,
        "parsed {} routes: {routes:?}",
        routes.len()
    );
    let docs = documented();
    let missing: Vec<_> = routes.difference(&docs).collect();
    let extra: Vec<_> = docs.difference(&routes).collect();
    assert!(
        missing.is_empty(),
        "routes without documentation: {missing:?}"
    );
    assert!(extra.is_empty(), "documented but not routed: {extra:?}");
}

#[test]
fn operations_are_unique_and_complete() {
    let ops = operations();
    let ids: BTreeSet<_> = ops.iter().map(|o| o.id).collect();
    assert_eq!(ids.len(), ops.len(), "operation ids are unique");
    let doc = document();
    assert_eq!(doc["openapi"], "3.1.0");
    for op in &ops {
        // Every path parameter of the path is declared, and no other.
        let declared: BTreeSet<String> = op
            .params
            .iter()
            .filter(|p| p["in"] == "path")
            .map(|p| p["name"].as_str().unwrap().to_owned())
            .collect();
        let in_path: BTreeSet<String> = op
            .path
            .split('{')
            .skip(1)
            .map(|s| s.split('}').next().unwrap().to_owned())
            .collect();
        assert_eq!(declared, in_path, "{} {}", op.method, op.path);
        assert!(!op.responses.is_empty(), "{}", op.id);
    }
}

/// The fields serde reads for `T` (which denies unknown fields), taken
/// from its error for an unknown one: "unknown field `…`, expected one of
/// `a`, `b`" (or "expected `a`").
fn fields_of<T: serde::de::DeserializeOwned>() -> BTreeSet<String> {
    let err = match serde_json::from_str::<T>(r#"{"\u0000": 0}"#) {
        Ok(_) => panic!("an unknown field was accepted"),
        Err(e) => e.to_string(),
    };
    let (_, expected) = err
        .split_once(", expected ")
        .unwrap_or_else(|| panic!("not an unknown-field error: {err}"));
    let expected = expected.split(" at line").next().unwrap();
    expected
        .split('`')
        .skip(1)
        .step_by(2)
        .map(str::to_owned)
        .collect()
}

fn properties(schema: &Value) -> BTreeSet<String> {
    schema["properties"]
        .as_object()
        .unwrap_or_else(|| panic!("no properties: {schema}"))
        .keys()
        .cloned()
        .collect()
}

/// Each request body's schema names exactly the fields the server reads,
/// and refuses others as the server does (`additionalProperties: false`
/// where serde denies unknown fields).
#[test]
fn body_schemas_name_the_fields_the_server_reads() {
    let doc = document();
    let schemas = &doc["components"]["schemas"];
    let pairs = [
        ("TypeConfig", fields_of::<crate::config::TypeConfig>()),
        ("Secret", fields_of::<super::super::secrets::SecretSpec>()),
        (
            "Provider",
            fields_of::<crate::models::providers::ProviderSpec>(),
        ),
        (
            "Subscription",
            fields_of::<crate::webhooks::outbound::SubscriptionSpec>(),
        ),
        ("TokenRequest", fields_of::<crate::tokens::TokenRequest>()),
    ];
    for (name, fields) in pairs {
        let schema = &schemas[name];
        assert_eq!(properties(schema), fields, "{name}");
        assert_eq!(schema["additionalProperties"], false, "{name}");
    }
    let budget = &schemas["TypeConfig"]["properties"]["budget"]["anyOf"][0];
    assert_eq!(properties(budget), fields_of::<crate::config::Budget>());
    let price = &schemas["Provider"]["properties"]["prices"]["additionalProperties"];
    assert_eq!(
        properties(price),
        fields_of::<crate::models::providers::Price>()
    );
    // The manifest is one of three shapes; together they name its fields.
    let shapes = schemas["Manifest"]["oneOf"].as_array().unwrap();
    let kinds: BTreeSet<&str> = shapes
        .iter()
        .map(|s| s["properties"]["kind"]["const"].as_str().unwrap())
        .collect();
    assert_eq!(kinds, BTreeSet::from(["agent", "js", "wasm"]));
    let all: BTreeSet<String> = shapes.iter().flat_map(properties).collect();
    assert_eq!(all, fields_of::<super::super::types::Manifest>());
}

/// Whether `T` reads `{"field": null}` (as absent) or refuses it as a
/// null, against whether the schema of `field` allows `null`.
fn nulls_match<T: serde::de::DeserializeOwned>(name: &str, schema: &Value) {
    for (field, s) in schema["properties"].as_object().unwrap() {
        let read = serde_json::from_value::<T>(json!({ field: null }));
        let refused = matches!(&read, Err(e) if e.to_string().contains("invalid type: null"));
        let documented = s["anyOf"]
            .as_array()
            .is_some_and(|a| a.contains(&json!({"type": "null"})));
        assert_eq!(documented, !refused, "{name}.{field}: {:?}", read.err());
    }
}

/// A field serde reads `null` into is documented nullable, and no other.
#[test]
fn nullable_fields_are_the_optional_ones() {
    let doc = document();
    let schemas = &doc["components"]["schemas"];
    nulls_match::<crate::config::TypeConfig>("TypeConfig", &schemas["TypeConfig"]);
    nulls_match::<crate::config::Budget>(
        "budget",
        &schemas["TypeConfig"]["properties"]["budget"]["anyOf"][0],
    );
    nulls_match::<super::super::secrets::SecretSpec>("Secret", &schemas["Secret"]);
    nulls_match::<crate::models::providers::ProviderSpec>("Provider", &schemas["Provider"]);
    nulls_match::<crate::webhooks::outbound::SubscriptionSpec>(
        "Subscription",
        &schemas["Subscription"],
    );
    nulls_match::<crate::tokens::TokenRequest>("TokenRequest", &schemas["TokenRequest"]);
}

/// Every path parameter says what it accepts; operations behind the
/// token say they answer 401 and 403, and only open ones need none; the
/// operations a client token can open (asked of the token code) say they
/// may answer 429.
#[test]
fn parameters_auth_and_rate_limits_are_described() {
    let doc = document();
    let mut reachable = BTreeSet::new();
    for (path, item) in doc["paths"].as_object().unwrap() {
        for (method, op) in item.as_object().unwrap() {
            let at = format!("{method} {path}");
            for p in op["parameters"].as_array().unwrap() {
                let s = &p["schema"];
                if p["in"] == "path" {
                    assert!(
                        s.get("pattern").is_some() || s.get("minLength").is_some(),
                        "{at}: path parameter {} accepts anything: {s}",
                        p["name"]
                    );
                }
            }
            let responses = op["responses"].as_object().unwrap();
            let open = super::super::edge::is_open(path);
            assert_eq!(op.get("security") == Some(&json!([])), open, "{at}");
            if !open {
                for status in ["401", "403"] {
                    assert!(responses.contains_key(status), "{at}: {status}");
                }
            }
            if responses.contains_key("429") && !open {
                reachable.insert(at.clone());
            }
            // The edge's 400 (two `Authorization` headers) anywhere, and a
            // body that stops arriving wherever one is taken.
            assert!(responses.contains_key("400"), "{at}: 400");
            if op.get("requestBody").is_some() {
                assert!(responses.contains_key("408"), "{at}: 408");
            }
        }
    }
    for at in [
        "post /v1/actors/{type}/{id}",
        "get /v1/actors/{type}/{id}/events",
        "post /v1/actors/{type}/{id}/inputs/{input}",
        "get /v1/actors/{type}/{id}/files/{path}",
    ] {
        assert!(reachable.contains(at), "{at} takes client tokens");
    }
    let hooks = &doc["paths"]["/v1/hooks/{type}/{id}/{name}"]["post"]["responses"];
    assert!(
        hooks.get("429").is_some(),
        "a type's rate limit holds hooks too"
    );
    for at in [
        "get /v1/types",
        "delete /v1/actors/{type}/{id}",
        "post /v1/tokens",
    ] {
        assert!(!reachable.contains(at), "{at} is for the admin token only");
    }
}

/// The document's pattern for a webhook secret takes exactly what
/// `webhooks::check_secret` takes: every key length around the 16-byte
/// minimum, canonically encoded, and strings near them (a bit left over in
/// the last character, padding missing or doubled, other characters).
#[test]
fn the_webhook_secret_pattern_is_the_check() {
    use base64::Engine as _;
    let pattern = regex::Regex::new(schemas::WEBHOOK_SECRET).unwrap();
    let agree = |s: &str| {
        assert_eq!(
            pattern.is_match(s),
            crate::webhooks::check_secret(s).is_ok(),
            "{s:?}"
        );
    };
    let alphabet = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/=-_ ";
    let mut seed = 0x2545_f491_4f6c_dd1d_u64;
    let mut next = move || {
        seed ^= seed << 13;
        seed ^= seed >> 7;
        seed ^= seed << 17;
        seed
    };
    let mut accepted = 0;
    for len in 0..40 {
        let key: Vec<u8> = (0..len).map(|_| next() as u8).collect();
        let encoded = base64::engine::general_purpose::STANDARD.encode(&key);
        let good = format!("whsec_{encoded}");
        agree(&good);
        accepted += usize::from(crate::webhooks::check_secret(&good).is_ok());
        agree(&format!("whsec_{}", encoded.trim_end_matches('=')));
        agree(&format!("whsec_{encoded}="));
        agree(&encoded);
        // Each character in turn replaced by another of the alphabet.
        for i in 0..encoded.len() {
            let mut bytes = encoded.clone().into_bytes();
            bytes[i] = alphabet[next() as usize % alphabet.len()];
            agree(&format!("whsec_{}", String::from_utf8(bytes).unwrap()));
        }
    }
    assert_eq!(accepted, 40 - 16, "keys of 16 to 39 bytes");
}

/// What the document says of a provider's `max_completion_tokens` and
/// header values is what `ProviderSpec::validate` takes: the flag for
/// `openai-chat` only, header values without control characters (tab
/// aside) or placeholders.
#[test]
fn provider_rules_are_described_as_validated() {
    use crate::models::providers::ProviderSpec;
    let doc = document();
    let provider = &doc["components"]["schemas"]["Provider"];
    let formats = provider["properties"]["format"]["enum"].as_array().unwrap();
    for format in formats {
        let spec: ProviderSpec =
            serde_json::from_value(json!({"format": format, "max_completion_tokens": true}))
                .unwrap();
        let described = provider["if"]["properties"]["format"]["const"] == *format;
        assert_eq!(spec.validate("p").is_ok(), described, "{format}");
    }
    assert_eq!(
        provider["else"]["properties"]["max_completion_tokens"]["type"],
        "null"
    );
    let value = &provider["properties"]["headers"]["additionalProperties"];
    let pattern = regex::Regex::new(value["pattern"].as_str().unwrap()).unwrap();
    let placeholder = regex::Regex::new(value["not"]["pattern"].as_str().unwrap()).unwrap();
    for v in [
        "plain",
        "tab\there",
        "caf\u{e9}",
        "",
        "bell\u{7}",
        "line\nbreak",
        "del\u{7f}",
        "nul\u{0}",
        "{{secret:K}}",
        "one { brace",
    ] {
        let spec: ProviderSpec =
            serde_json::from_value(json!({"format": "openai-chat", "headers": {"x-team": v}}))
                .unwrap();
        let described = pattern.is_match(v) && !placeholder.is_match(v);
        assert_eq!(spec.validate("p").is_ok(), described, "{v:?}");
    }
}

/// A subscription's event patterns and URL as the document describes them
/// are what `SubscriptionSpec::into_record` takes.
#[test]
fn subscription_patterns_are_described_as_validated() {
    use crate::webhooks::outbound::SubscriptionSpec;
    let doc = document();
    let sub = &doc["components"]["schemas"]["Subscription"]["properties"];
    let items = &sub["events"]["anyOf"][0]["items"];
    let event = regex::Regex::new(items["pattern"].as_str().unwrap()).unwrap();
    let max = items["maxLength"].as_u64().unwrap() as usize;
    for e in [
        "*",
        "turn.*",
        "turn.failed",
        "",
        "a*b",
        "**",
        "*a",
        "tab\tbed",
        "é*",
    ] {
        let spec: SubscriptionSpec =
            serde_json::from_value(json!({"url": "http://x/", "events": [e]})).unwrap();
        let described = !e.is_empty() && e.len() <= max && event.is_match(e);
        assert_eq!(spec.into_record(0).is_ok(), described, "{e:?}");
    }
    // URLs as written; the server's WHATWG parser also takes (and shows
    // back normalized) spellings such as `https:///x` or `HTTPS:x`.
    let url = regex::Regex::new(sub["url"]["pattern"].as_str().unwrap()).unwrap();
    for u in ["http://x/", "https://a.example/h?q", "http://", "ftp://x/"] {
        let spec: SubscriptionSpec = serde_json::from_value(json!({"url": u})).unwrap();
        assert_eq!(spec.into_record(0).is_ok(), url.is_match(u), "{u:?}");
    }
}

/// Every success answer with a JSON body has a schema that says what is
/// in it (not "any JSON"), and every `$ref` names a schema of the
/// document. `tests/api/openapi.rs` checks real answers against them.
#[test]
fn success_bodies_have_schemas_and_refs_resolve() {
    fn refs(v: &Value, out: &mut Vec<String>) {
        match v {
            Value::Object(m) => {
                if let Some(r) = m.get("$ref").and_then(Value::as_str) {
                    out.push(r.to_owned());
                }
                m.values().for_each(|v| refs(v, out));
            }
            Value::Array(a) => a.iter().for_each(|v| refs(v, out)),
            _ => {}
        }
    }
    let doc = document();
    let mut unnamed = Vec::new();
    for (path, item) in doc["paths"].as_object().unwrap() {
        for (method, op) in item.as_object().unwrap() {
            for (status, r) in op["responses"].as_object().unwrap() {
                let json = &r["content"]["application/json"]["schema"];
                if status.starts_with('2') && (json == &json!({})) {
                    unnamed.push(format!("{method} {path} {status}"));
                }
            }
        }
    }
    assert!(
        unnamed.is_empty(),
        "success bodies of any shape: {unnamed:?}"
    );
    let mut all = Vec::new();
    refs(&doc, &mut all);
    assert!(all.len() > 50, "only {} refs", all.len());
    for r in all {
        let name = r.strip_prefix("#/components/schemas/").unwrap_or(&r);
        assert!(
            doc["components"]["schemas"].get(name).is_some(),
            "a $ref to no schema: {r}"
        );
    }
}
