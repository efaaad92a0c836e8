//! The subset of JSON Schema Marmot checks values against: answers to
//! input requests (the host) and the arguments of an agent's tool calls
//! (the agent component, before a call runs or is put to a person).
//!
//! Keywords: `type` (one or a list), `enum`, `const`, `properties`,
//! `required`, `additionalProperties` (boolean or schema), `items`,
//! `minItems`, `maxItems`, `minLength`, `maxLength`, `minimum`,
//! `maximum`, `exclusiveMinimum`, `exclusiveMaximum`, `anyOf`, `allOf`,
//! `oneOf`, `not`, `prefixItems`, `minProperties`, `maxProperties`;
//! others are ignored, as JSON Schema ignores keywords a validator does
//! not know: `description`, `title`, `default`, and also `pattern` and
//! `format` (no regular expressions here: this module is compiled into the
//! agent's sandbox too) and `if`/`then`/`else`. A schema these would
//! misread is refused by [`validate`] (a `$ref`, which is never resolved;
//! the tuple form of `items`, which is `prefixItems` now).

use serde_json::Value;

/// Check `v` against `schema`. The error names the path (`$.reason`) and
/// the rule broken.
pub fn check(schema: &Value, v: &Value) -> Result<(), String> {
    check_at(schema, v, "$")
}

/// Whether `schema` is one [`check`] reads as written: each keyword it
/// reads has the shape JSON Schema gives it, throughout. A `type` of no
/// JSON type (`"nonsense"`), a `required` that is not a list of names, or
/// a `$ref` (never resolved here, so nothing under it would be checked)
/// checked nothing without a word: an input request or a tool with such a
/// schema took any answer. The error names the path (`$.properties.n`).
pub fn validate(schema: &Value) -> Result<(), String> {
    validate_at(schema, "$")
}

const TYPES: [&str; 7] = [
    "null", "boolean", "string", "number", "integer", "array", "object",
];

fn validate_at(schema: &Value, path: &str) -> Result<(), String> {
    let s = match schema {
        Value::Bool(_) => return Ok(()),
        Value::Object(s) => s,
        _ => return Err(format!("{path}: a schema must be an object or a boolean")),
    };
    let known = |t: &Value| t.as_str().is_some_and(|t| TYPES.contains(&t));
    match s.get("type") {
        None => {}
        Some(t) if known(t) => {}
        Some(Value::Array(ts)) if !ts.is_empty() && ts.iter().all(known) => {}
        Some(t) => {
            return Err(format!(
                "{path}.type: {t} is not a JSON type or a list of them ({})",
                TYPES.join(", ")
            ));
        }
    }
    for key in ["$ref", "$dynamicRef"] {
        if s.contains_key(key) {
            return Err(format!(
                "{path}.{key}: references are not supported; write the schema inline"
            ));
        }
    }
    if s.get("enum").is_some_and(|e| !e.is_array()) {
        return Err(format!("{path}.enum: must be a list of values"));
    }
    if let Some(r) = s.get("required")
        && !r.as_array().is_some_and(|r| r.iter().all(Value::is_string))
    {
        return Err(format!("{path}.required: must be a list of property names"));
    }
    for key in ["minimum", "maximum", "exclusiveMinimum", "exclusiveMaximum"] {
        if s.get(key).is_some_and(|n| !n.is_number()) {
            return Err(format!("{path}.{key}: must be a number"));
        }
    }
    for key in [
        "minLength",
        "maxLength",
        "minItems",
        "maxItems",
        "minProperties",
        "maxProperties",
    ] {
        // `2.0` is a whole number to JSON Schema.
        let whole = |n: &Value| n.as_f64().is_some_and(|f| f >= 0.0 && f.fract() == 0.0);
        if s.get(key).is_some_and(|n| !whole(n)) {
            return Err(format!("{path}.{key}: must be a whole number, 0 or more"));
        }
    }
    if let Some(props) = s.get("properties") {
        let Some(props) = props.as_object() else {
            return Err(format!("{path}.properties: must be an object of schemas"));
        };
        for (k, p) in props {
            validate_at(p, &format!("{path}.properties.{k}"))?;
        }
    }
    for key in ["items", "additionalProperties", "not"] {
        if let Some(sub) = s.get(key) {
            validate_at(sub, &format!("{path}.{key}"))?;
        }
    }
    if s.get("items").is_some_and(Value::is_array) {
        return Err(format!(
            "{path}.items: a list of schemas (one per position) is written `prefixItems`"
        ));
    }
    for key in ["anyOf", "allOf", "oneOf", "prefixItems"] {
        let Some(list) = s.get(key) else { continue };
        match list.as_array() {
            Some(alts) if !alts.is_empty() => {
                for (i, alt) in alts.iter().enumerate() {
                    validate_at(alt, &format!("{path}.{key}[{i}]"))?;
                }
            }
            _ => return Err(format!("{path}.{key}: must be a non-empty list of schemas")),
        }
    }
    Ok(())
}

/// JSON Schema's equality: numbers by value (`1.0` is `1`; serde_json
/// tells an integer from a float and refused `{"n": 1.0}` against `enum:
/// [1, 2]`), the rest structurally.
fn same(a: &Value, b: &Value) -> bool {
    match (a, b) {
        (Value::Number(x), Value::Number(y)) => match (x.as_i128(), y.as_i128()) {
            // Whole numbers exactly (f64 rounds past 2^53).
            (Some(a), Some(b)) => a == b,
            _ => x.as_f64() == y.as_f64(),
        },
        (Value::Array(x), Value::Array(y)) => {
            x.len() == y.len() && x.iter().zip(y).all(|(a, b)| same(a, b))
        }
        (Value::Object(x), Value::Object(y)) => {
            x.len() == y.len() && x.iter().all(|(k, a)| y.get(k).is_some_and(|b| same(a, b)))
        }
        _ => a == b,
    }
}

fn type_matches(ty: &str, v: &Value) -> bool {
    match ty {
        "null" => v.is_null(),
        "boolean" => v.is_boolean(),
        "string" => v.is_string(),
        "number" => v.is_number(),
        "integer" => v.as_f64().is_some_and(|f| f.fract() == 0.0),
        "array" => v.is_array(),
        "object" => v.is_object(),
        _ => true,
    }
}

fn check_at(schema: &Value, v: &Value, path: &str) -> Result<(), String> {
    let s = match schema {
        Value::Bool(true) => return Ok(()),
        Value::Bool(false) => return Err(format!("{path}: no value is allowed here")),
        Value::Object(s) => s,
        _ => return Ok(()),
    };
    if let Some(ty) = s.get("type") {
        let ok = match ty {
            Value::String(t) => type_matches(t, v),
            Value::Array(ts) => ts
                .iter()
                .filter_map(Value::as_str)
                .any(|t| type_matches(t, v)),
            _ => true,
        };
        if !ok {
            return Err(format!("{path}: expected type {ty}"));
        }
    }
    if let Some(Value::Array(options)) = s.get("enum")
        && !options.iter().any(|o| same(o, v))
    {
        return Err(format!(
            "{path}: must be one of {}",
            Value::Array(options.clone())
        ));
    }
    if let Some(c) = s.get("const")
        && !same(c, v)
    {
        return Err(format!("{path}: must be {c}"));
    }
    if let Some(Value::Array(any)) = s.get("anyOf")
        && !any.iter().any(|alt| check_at(alt, v, path).is_ok())
    {
        return Err(format!("{path}: matches none of the allowed shapes"));
    }
    if let Some(Value::Array(all)) = s.get("allOf") {
        for alt in all {
            check_at(alt, v, path)?;
        }
    }
    if let Some(Value::Array(one)) = s.get("oneOf") {
        let matching = one
            .iter()
            .filter(|alt| check_at(alt, v, path).is_ok())
            .count();
        if matching != 1 {
            return Err(format!(
                "{path}: must match exactly one of the allowed shapes (it matches {matching})"
            ));
        }
    }
    if let Some(not) = s.get("not")
        && check_at(not, v, path).is_ok()
    {
        return Err(format!("{path}: matches a shape that is not allowed"));
    }
    let num = |k: &str| s.get(k).and_then(Value::as_f64);
    if let Some(x) = v.as_f64() {
        if let Some(min) = num("minimum")
            && x < min
        {
            return Err(format!("{path}: must be at least {min}"));
        }
        if let Some(max) = num("maximum")
            && x > max
        {
            return Err(format!("{path}: must be at most {max}"));
        }
        if let Some(min) = num("exclusiveMinimum")
            && x <= min
        {
            return Err(format!("{path}: must be more than {min}"));
        }
        if let Some(max) = num("exclusiveMaximum")
            && x >= max
        {
            return Err(format!("{path}: must be less than {max}"));
        }
    }
    // A count (characters, items, properties) within the schema's bounds
    // `[min, max]`; what the error says if it is below or above.
    let count = |len: usize, [min, max]: [&str; 2], [below, above]: [&str; 2]| {
        let len = len as f64;
        if num(min).is_some_and(|m| len < m) {
            return Err(format!("{path}: {below}"));
        }
        if num(max).is_some_and(|m| len > m) {
            return Err(format!("{path}: {above}"));
        }
        Ok(())
    };
    if let Some(text) = v.as_str() {
        count(
            text.chars().count(),
            ["minLength", "maxLength"],
            ["too short", "too long"],
        )?;
    }
    if let Some(items) = v.as_array() {
        count(
            items.len(),
            ["minItems", "maxItems"],
            ["too few items", "too many items"],
        )?;
        let positional = s.get("prefixItems").and_then(Value::as_array);
        for (i, item) in items.iter().enumerate() {
            let at = format!("{path}[{i}]");
            match positional.and_then(|p| p.get(i)) {
                Some(schema) => check_at(schema, item, &at)?,
                None => {
                    if let Some(item_schema) = s.get("items") {
                        check_at(item_schema, item, &at)?;
                    }
                }
            }
        }
    }
    if let Some(obj) = v.as_object() {
        count(
            obj.len(),
            ["minProperties", "maxProperties"],
            ["too few properties", "too many properties"],
        )?;
        if let Some(Value::Array(required)) = s.get("required") {
            for r in required.iter().filter_map(Value::as_str) {
                if !obj.contains_key(r) {
                    return Err(format!("{path}: missing required property `{r}`"));
                }
            }
        }
        let props = s.get("properties").and_then(Value::as_object);
        for (k, val) in obj {
            let sub = format!("{path}.{k}");
            match props.and_then(|p| p.get(k)) {
                Some(p) => check_at(p, val, &sub)?,
                None => match s.get("additionalProperties") {
                    Some(Value::Bool(false)) => {
                        return Err(format!("{path}: unexpected property `{k}`"));
                    }
                    Some(extra @ Value::Object(_)) => check_at(extra, val, &sub)?,
                    _ => {}
                },
            }
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::{check, validate};

    #[test]
    fn schemas_that_would_check_nothing_are_refused_by_path() {
        let fine = json!({"type": "object", "required": ["n"], "properties": {
            "n": {"type": ["integer", "null"], "minimum": 0, "maximum": 9.5},
            "tags": {"type": "array", "items": {"type": "string", "maxLength": 8}, "minItems": 1},
            "either": {"anyOf": [{"const": 1}, {"enum": ["a"]}]}},
            "additionalProperties": false, "description": "unknown keywords pass"});
        assert_eq!(validate(&fine), Ok(()));
        // Whole numbers written as floats, and the composing keywords.
        let composed = json!({"type": "object", "properties": {
            "name": {"type": "string", "minLength": 2.0, "pattern": "^a", "format": "email"},
            "n": {"allOf": [{"type": "integer"}, {"exclusiveMinimum": 0}], "not": {"const": 7}},
            "kind": {"oneOf": [{"const": "a"}, {"type": "integer"}]}},
            "$defs": {"unused": {"type": "string"}}});
        assert_eq!(validate(&composed), Ok(()));
        assert_eq!(
            check(&composed, &json!({"name": "ab", "n": 3, "kind": "a"})),
            Ok(())
        );
        for bad in [
            json!({"n": 0}),
            json!({"n": 7}),
            json!({"n": 2.5}),
            json!({"kind": "b"}),
        ] {
            assert!(check(&composed, &bad).is_err(), "{bad}");
        }
        let pair = json!({"type": "array", "prefixItems": [{"type": "string"}, {"type": "integer"}],
                          "items": {"type": "boolean"}, "maxItems": 3});
        assert_eq!(validate(&pair), Ok(()));
        assert_eq!(check(&pair, &json!(["a", 1, true])), Ok(()));
        assert!(check(&pair, &json!([1, "a"])).is_err());
        assert!(check(&pair, &json!(["a", 1, 2])).is_err());
        let small = json!({"type": "object", "minProperties": 1, "maxProperties": 1});
        assert!(check(&small, &json!({})).is_err());
        assert!(check(&small, &json!({"a": 1, "b": 2})).is_err());
        assert_eq!(check(&small, &json!({"a": 1})), Ok(()));
        assert_eq!(validate(&json!(true)), Ok(()));
        for (schema, says) in [
            (json!({"type": "nonsense"}), "$.type"),
            (json!({"type": []}), "$.type"),
            (
                json!({"properties": {"n": {"type": "int"}}}),
                "$.properties.n.type",
            ),
            (json!({"$ref": "https://example.com/s.json"}), "$.$ref"),
            (json!({"items": {"$ref": "#/$defs/x"}}), "$.items.$ref"),
            (json!({"required": "n"}), "$.required"),
            (json!({"enum": "a"}), "$.enum"),
            (json!({"minLength": -1}), "$.minLength"),
            (json!({"minLength": 1.5}), "$.minLength"),
            (json!({"oneOf": [{"$ref": "#/$defs/a"}]}), "$.oneOf[0].$ref"),
            (json!({"allOf": {}}), "$.allOf"),
            (json!({"not": {"type": "nope"}}), "$.not.type"),
            (json!({"items": [{"type": "string"}]}), "$.items"),
            (
                json!({"prefixItems": [{"type": "x"}]}),
                "$.prefixItems[0].type",
            ),
            (json!({"maxProperties": "2"}), "$.maxProperties"),
            (json!({"maximum": "9"}), "$.maximum"),
            (json!({"anyOf": []}), "$.anyOf"),
            (json!({"additionalProperties": 3}), "$.additionalProperties"),
            (json!("object"), "$"),
        ] {
            let e = validate(&schema).expect_err(&schema.to_string());
            assert!(e.starts_with(&format!("{says}:")), "{schema}: {e}");
        }
    }

    #[test]
    fn numbers_compare_by_value() {
        let schema = json!({"type": "object", "properties": {
            "n": {"enum": [1, 2]}, "c": {"const": {"k": [3]}}}});
        assert_eq!(
            check(&schema, &json!({"n": 1.0, "c": {"k": [3.0]}})),
            Ok(())
        );
        assert!(check(&schema, &json!({"n": 1.5})).is_err());
        assert!(check(&schema, &json!({"c": {"k": [3, 4]}})).is_err());
        let big = json!({"enum": [9_007_199_254_740_993u64]});
        assert!(check(&big, &json!(9_007_199_254_740_992u64)).is_err());
    }
}
