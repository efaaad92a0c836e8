//! The subset of JSON Schema Marmot checks values against: answers to
//! input requests (the host) and the arguments of an agent's tool calls
//! (the agent component, before a call runs or is put to a person).
//!
//! Keywords: `type` (one or a list), `enum`, `const`, `properties`,
//! `required`, `additionalProperties` (boolean or schema), `items`,
//! `minItems`, `maxItems`, `minLength`, `maxLength`, `minimum`,
//! `maximum`, `anyOf`; others are ignored, as JSON Schema ignores unknown
//! keywords.

use serde_json::Value;

/// Check `v` against `schema`. The error names the path (`$.reason`) and
/// the rule broken.
pub fn check(schema: &Value, v: &Value) -> Result<(), String> {
    check_at(schema, v, "$")
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
    }
    if let Some(text) = v.as_str() {
        let len = text.chars().count() as f64;
        if num("minLength").is_some_and(|m| len < m) {
            return Err(format!("{path}: too short"));
        }
        if num("maxLength").is_some_and(|m| len > m) {
            return Err(format!("{path}: too long"));
        }
    }
    if let Some(items) = v.as_array() {
        let len = items.len() as f64;
        if num("minItems").is_some_and(|m| len < m) {
            return Err(format!("{path}: too few items"));
        }
        if num("maxItems").is_some_and(|m| len > m) {
            return Err(format!("{path}: too many items"));
        }
        if let Some(item_schema) = s.get("items") {
            for (i, item) in items.iter().enumerate() {
                check_at(item_schema, item, &format!("{path}[{i}]"))?;
            }
        }
    }
    if let Some(obj) = v.as_object() {
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

    use super::check;

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
