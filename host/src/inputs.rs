//! Input requests: durable waits for a person or a system.
//!
//! A turn asks with `inputs.request`; the request is a row written in the
//! turn's transaction (plus, with a deadline, one of the platform's own
//! alarms that expires it). Whoever answers posts to
//! `POST …/inputs/{id}`; the answer goes to the actor, which checks that the
//! request is still pending, runs `on-input` with it, and marks it answered
//! in the same transaction as the handler's effects. Expiry takes the same
//! path with `expired: true`. Because every transition happens in the
//! actor's own turns, an input settles exactly once: a second answer (or an
//! answer after expiry) is a 409.
//!
//! Answers must be JSON; when the request carries a JSON Schema, the answer
//! must satisfy the subset of it this module checks (see [`validate`]).

use serde_json::Value;

/// Longest `kind`, in bytes.
pub const MAX_KIND: usize = 128;
/// Longest prompt, in bytes.
pub const MAX_PROMPT: usize = 16 << 10;
/// Longest schema, in bytes.
pub const MAX_SCHEMA: usize = 64 << 10;
/// Longest answer, in bytes.
pub const MAX_ANSWER: usize = 256 << 10;
/// Longest deadline: a year.
pub const MAX_EXPIRES_IN_MS: u64 = 366 * 24 * 3600 * 1000;

/// A fresh input id: `in_` and 26 time-ordered hex digits.
pub fn new_id() -> String {
    format!("in_{}", &crate::ids::new_message_id()[..26])
}

/// Check a request's fields; the error is shown to the guest.
pub fn check_request(
    kind: &str,
    prompt: &str,
    schema: Option<&str>,
    expires_in_ms: Option<u64>,
) -> Result<(), String> {
    if kind.is_empty() || kind.len() > MAX_KIND || kind.chars().any(char::is_control) {
        return Err(format!(
            "input kind must be 1 to {MAX_KIND} bytes without control characters"
        ));
    }
    if prompt.len() > MAX_PROMPT {
        return Err(format!("input prompt exceeds {MAX_PROMPT} bytes"));
    }
    if let Some(s) = schema {
        if s.len() > MAX_SCHEMA {
            return Err(format!("input schema exceeds {MAX_SCHEMA} bytes"));
        }
        match serde_json::from_str::<Value>(s) {
            Ok(v @ (Value::Object(_) | Value::Bool(_))) => {
                // One the answer check would read otherwise checked nothing.
                marmot_core::schema::validate(&v)
                    .map_err(|e| format!("input schema is not one Marmot can check: {e}"))?;
            }
            Ok(_) => return Err("input schema must be a JSON Schema object".into()),
            Err(e) => return Err(format!("input schema is not JSON: {e}")),
        }
    }
    if let Some(ms) = expires_in_ms
        && !(1..=MAX_EXPIRES_IN_MS).contains(&ms)
    {
        return Err(format!(
            "expires-in-ms must be between 1 and {MAX_EXPIRES_IN_MS}"
        ));
    }
    Ok(())
}

/// Check an answer against the request's schema, if any (the subset of
/// JSON Schema [`marmot_core::schema`] reads). The error names the path
/// (`$.answer.reason`) and the rule broken.
pub fn validate(schema: Option<&str>, answer: &Value) -> Result<(), String> {
    let Some(schema) = schema else {
        return Ok(());
    };
    let schema: Value = serde_json::from_str(schema).map_err(|e| format!("stored schema: {e}"))?;
    marmot_core::schema::check(&schema, answer)
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    #[test]
    fn requests_are_checked() {
        assert!(check_request("approval", "ok?", None, Some(1000)).is_ok());
        assert!(check_request("", "ok?", None, None).is_err());
        assert!(check_request("a\nb", "ok?", None, None).is_err());
        assert!(check_request("q", &"x".repeat(MAX_PROMPT + 1), None, None).is_err());
        assert!(check_request("q", "", Some("{"), None).is_err());
        assert!(check_request("q", "", Some("[1]"), None).is_err());
        assert!(check_request("q", "", None, Some(0)).is_err());
        assert!(check_request("q", "", None, Some(MAX_EXPIRES_IN_MS + 1)).is_err());
    }

    #[test]
    fn answers_are_checked_against_the_schema_subset() {
        let schema = json!({
            "type": "object",
            "required": ["approved"],
            "properties": {
                "approved": {"type": "boolean"},
                "reason": {"type": "string", "maxLength": 10},
                "level": {"enum": ["low", "high"]},
                "tags": {"type": "array", "items": {"type": "string"}, "maxItems": 2},
                "n": {"type": "integer", "minimum": 1}
            },
            "additionalProperties": false
        })
        .to_string();
        let ok = |v: Value| validate(Some(&schema), &v);
        assert_eq!(ok(json!({"approved": true})), Ok(()));
        assert_eq!(
            ok(json!({"approved": true, "reason": "fine", "level": "low", "tags": ["a"], "n": 3})),
            Ok(())
        );
        let err = |v: Value| ok(v).unwrap_err();
        assert!(err(json!({})).contains("missing required property `approved`"));
        assert!(err(json!({"approved": "yes"})).contains("$.approved: expected type"));
        assert!(err(json!({"approved": true, "reason": "far too long"})).contains("too long"));
        assert!(err(json!({"approved": true, "level": "mid"})).contains("one of"));
        assert!(err(json!({"approved": true, "tags": [1]})).contains("$.tags[0]"));
        assert!(err(json!({"approved": true, "tags": ["a", "b", "c"]})).contains("too many"));
        assert!(err(json!({"approved": true, "n": 1.5})).contains("integer"));
        assert!(err(json!({"approved": true, "n": 0})).contains("at least 1"));
        assert!(err(json!({"approved": true, "x": 1})).contains("unexpected property `x`"));
        assert!(err(json!([true])).contains("expected type"));
        assert_eq!(validate(None, &json!("anything")), Ok(()));
        let any = json!({"anyOf": [{"type": "string"}, {"type": "null"}]}).to_string();
        assert_eq!(validate(Some(&any), &json!(null)), Ok(()));
        assert!(validate(Some(&any), &json!(1)).is_err());
    }
}

/// The schema subset against arbitrary schemas and answers (guests write
/// the schema, users the answer): an error or a pass, never a panic.
#[cfg(test)]
mod props {
    use proptest::prelude::*;
    use serde_json::Value;

    use super::*;

    fn json() -> impl Strategy<Value = Value> {
        let leaf = prop_oneof![
            Just(Value::Null),
            any::<bool>().prop_map(Value::Bool),
            any::<i64>().prop_map(Value::from),
            any::<f64>().prop_map(Value::from),
            prop_oneof![
                ".{0,8}",
                "(type|enum|const|properties|required|additionalProperties|items|minItems|maxItems|minLength|maxLength|minimum|maximum|anyOf|string|number|integer|object|array|boolean|null)",
            ]
            .prop_map(Value::String),
        ];
        leaf.prop_recursive(6, 64, 6, |inner| {
            prop_oneof![
                proptest::collection::vec(inner.clone(), 0..6).prop_map(Value::Array),
                proptest::collection::btree_map(
                    "(type|enum|const|properties|required|additionalProperties|items|minItems|maxItems|minLength|maxLength|minimum|maximum|anyOf|[a-z]{1,3})",
                    inner,
                    0..6,
                )
                .prop_map(|m| Value::Object(m.into_iter().collect())),
            ]
        })
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(3000))]

        #[test]
        fn arbitrary_schemas_and_answers_never_panic(schema in json(), answer in json(), raw in ".{0,40}") {
            let _ = validate(Some(&schema.to_string()), &answer);
            let _ = validate(Some(&raw), &answer);
        }
    }
}
