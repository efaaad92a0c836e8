//! The subset of JSON Schema Marmot checks values against: answers to
//! input requests (the host) and the arguments of an agent's tool calls
//! (the agent component, before a call runs or is put to a person).
//!
//! Keywords: `type` (one or a list), `enum`, `const`, `properties`,
//! `required`, `additionalProperties` (boolean or schema),
//! `patternProperties`, `propertyNames`, `dependentRequired`,
//! `dependentSchemas`, `items`, `prefixItems`, `contains` (with
//! `minContains`, `maxContains`), `uniqueItems`, `minItems`, `maxItems`,
//! `minLength`, `maxLength`, `pattern`, `minimum`, `maximum`,
//! `exclusiveMinimum`, `exclusiveMaximum`, `multipleOf`, `anyOf`, `allOf`,
//! `oneOf`, `not`, `if`/`then`/`else`, `minProperties`, `maxProperties`.
//! Others are ignored, as JSON Schema ignores keywords a validator does
//! not know: annotations (`description`, `title`, `default`, `examples`)
//! and `format`, which JSON Schema 2020-12 makes an annotation unless a
//! validator opts in. A schema these would misread is refused by
//! [`validate`]: a `$ref` (never resolved), `unevaluatedProperties` and
//! `unevaluatedItems` (which need every other keyword's annotations), the
//! tuple form of `items` (which is `prefixItems` now), and a `pattern`
//! this module's regular expressions cannot take (they are Rust's syntax,
//! `regex-lite`, without look-around or backreferences: an ECMA-262
//! pattern that uses them is refused, not ignored). Until 2026-12-07
//! `pattern`, `multipleOf`, `uniqueItems` and the rest of the list above
//! past `maxProperties` were ignored, so an answer breaking them was
//! taken (a probe).

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
    for key in ["unevaluatedProperties", "unevaluatedItems"] {
        if s.contains_key(key) {
            return Err(format!(
                "{path}.{key}: not supported; use additionalProperties or items"
            ));
        }
    }
    if let Some(p) = s.get("pattern") {
        let Some(p) = p.as_str() else {
            return Err(format!(
                "{path}.pattern: must be a regular expression (a string)"
            ));
        };
        regex(p).map_err(|e| format!("{path}.pattern: {e}"))?;
    }
    if let Some(m) = s.get("multipleOf")
        && !m.as_f64().is_some_and(|m| m > 0.0)
    {
        return Err(format!("{path}.multipleOf: must be a number above 0"));
    }
    if s.get("uniqueItems").is_some_and(|u| !u.is_boolean()) {
        return Err(format!("{path}.uniqueItems: must be true or false"));
    }
    if let Some(d) = s.get("dependentRequired") {
        let names = |v: &Value| v.as_array().is_some_and(|r| r.iter().all(Value::is_string));
        if !d.as_object().is_some_and(|d| d.values().all(names)) {
            return Err(format!(
                "{path}.dependentRequired: must map property names to lists of names"
            ));
        }
    }
    for key in ["patternProperties", "dependentSchemas"] {
        let Some(map) = s.get(key) else { continue };
        let Some(map) = map.as_object() else {
            return Err(format!("{path}.{key}: must be an object of schemas"));
        };
        for (k, sub) in map {
            if key == "patternProperties" {
                regex(k).map_err(|e| format!("{path}.{key}: {e}"))?;
            }
            validate_at(sub, &format!("{path}.{key}.{k}"))?;
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
        "minContains",
        "maxContains",
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
    for key in [
        "items",
        "additionalProperties",
        "not",
        "if",
        "then",
        "else",
        "propertyNames",
        "contains",
    ] {
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

/// Longest `pattern` taken: a schema comes from a request or a deploy, and
/// a pattern is compiled at every check.
const MAX_PATTERN: usize = 1_000;

/// A `pattern` (or a `patternProperties` name) as a regular expression;
/// the error says why it cannot be one here.
fn regex(pattern: &str) -> Result<regex_lite::Regex, String> {
    if pattern.len() > MAX_PATTERN {
        return Err(format!(
            "a pattern of {} bytes is longer than the {MAX_PATTERN} taken",
            pattern.len()
        ));
    }
    regex_lite::RegexBuilder::new(pattern)
        .size_limit(1 << 20)
        .build()
        .map_err(|e| {
            format!(
                "`{pattern}` is not a regular expression Marmot can check (Rust syntax, no \
                 look-around or backreferences): {e}"
            )
        })
}

/// Whether `x` is a whole multiple of `m` (> 0): exactly for integers,
/// within rounding for the rest (`0.3` is a multiple of `0.1`).
fn multiple_of(x: &serde_json::Number, m: &serde_json::Number) -> bool {
    if let (Some(x), Some(m)) = (x.as_i128(), m.as_i128()) {
        return x % m == 0;
    }
    let (Some(x), Some(m)) = (x.as_f64(), m.as_f64()) else {
        return false;
    };
    let q = x / m;
    q.is_finite() && (q - q.round()).abs() <= 1e-9 * q.abs().max(1.0)
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
    if let Some(cond) = s.get("if") {
        let branch = if check_at(cond, v, path).is_ok() {
            s.get("then")
        } else {
            s.get("else")
        };
        if let Some(branch) = branch {
            check_at(branch, v, path)?;
        }
    }
    if let (Some(Value::Number(x)), Some(Value::Number(m))) = (Some(v), s.get("multipleOf"))
        && !multiple_of(x, m)
    {
        return Err(format!("{path}: must be a multiple of {m}"));
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
        if let Some(p) = s.get("pattern").and_then(Value::as_str)
            && !regex(p).is_ok_and(|re| re.is_match(text))
        {
            return Err(format!("{path}: does not match the pattern `{p}`"));
        }
    }
    if let Some(items) = v.as_array() {
        count(
            items.len(),
            ["minItems", "maxItems"],
            ["too few items", "too many items"],
        )?;
        if s.get("uniqueItems") == Some(&Value::Bool(true)) {
            for (i, a) in items.iter().enumerate() {
                if let Some(j) = items[..i].iter().position(|b| same(a, b)) {
                    return Err(format!("{path}: items {j} and {i} are the same"));
                }
            }
        }
        if let Some(want) = s.get("contains") {
            let n = items
                .iter()
                .filter(|item| check_at(want, item, path).is_ok())
                .count();
            let at_least = num("minContains").unwrap_or(1.0);
            if (n as f64) < at_least {
                return Err(format!(
                    "{path}: {n} items match `contains`, fewer than {at_least}"
                ));
            }
            if num("maxContains").is_some_and(|m| n as f64 > m) {
                return Err(format!("{path}: {n} items match `contains`, too many"));
            }
        }
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
        if let Some(Value::Object(deps)) = s.get("dependentRequired") {
            for (k, needs) in deps.iter().filter(|(k, _)| obj.contains_key(*k)) {
                for r in needs
                    .as_array()
                    .into_iter()
                    .flatten()
                    .filter_map(Value::as_str)
                {
                    if !obj.contains_key(r) {
                        return Err(format!("{path}: `{k}` needs property `{r}` too"));
                    }
                }
            }
        }
        if let Some(Value::Object(deps)) = s.get("dependentSchemas") {
            for (_, dep) in deps.iter().filter(|(k, _)| obj.contains_key(*k)) {
                check_at(dep, v, path)?;
            }
        }
        let props = s.get("properties").and_then(Value::as_object);
        let patterns: Vec<(regex_lite::Regex, &Value)> = match s.get("patternProperties") {
            Some(Value::Object(p)) => p
                .iter()
                .filter_map(|(k, sub)| regex(k).ok().map(|re| (re, sub)))
                .collect(),
            _ => Vec::new(),
        };
        for (k, val) in obj {
            let sub = format!("{path}.{k}");
            if let Some(names) = s.get("propertyNames") {
                check_at(names, &Value::String(k.clone()), &sub)?;
            }
            // A property is checked by its `properties` schema and by
            // every `patternProperties` schema its name matches; only one
            // neither names is "additional".
            let mut named = false;
            if let Some(p) = props.and_then(|p| p.get(k)) {
                check_at(p, val, &sub)?;
                named = true;
            }
            for (re, p) in &patterns {
                if re.is_match(k) {
                    check_at(p, val, &sub)?;
                    named = true;
                }
            }
            if !named {
                match s.get("additionalProperties") {
                    Some(Value::Bool(false)) => {
                        return Err(format!("{path}: unexpected property `{k}`"));
                    }
                    Some(extra @ Value::Object(_)) => check_at(extra, val, &sub)?,
                    _ => {}
                }
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

    /// Each assertion keyword past the first list is checked: each was
    /// ignored, so an answer breaking it was taken (a probe).
    #[test]
    fn every_assertion_keyword_is_checked() {
        for (schema, good, bad) in [
            (json!({"pattern": "^a+$"}), json!("aaa"), json!("b")),
            // Unanchored, as JSON Schema has it.
            (json!({"pattern": "b"}), json!("abc"), json!("ac")),
            (json!({"multipleOf": 2}), json!(4), json!(3)),
            (json!({"multipleOf": 0.1}), json!(0.3), json!(0.35)),
            (
                json!({"uniqueItems": true}),
                json!([1, "1", [1]]),
                json!([1, 1.0]),
            ),
            (
                json!({"contains": {"const": 3}, "maxContains": 1}),
                json!([1, 3]),
                json!([3, 3]),
            ),
            (
                json!({"contains": {"type": "string"}, "minContains": 2}),
                json!(["a", 1, "b"]),
                json!(["a", 1]),
            ),
            (
                json!({"dependentRequired": {"card": ["cvc"]}}),
                json!({"card": 1, "cvc": 2}),
                json!({"card": 1}),
            ),
            (
                json!({"dependentSchemas": {"card": {"required": ["cvc"]}}}),
                json!({"other": 1}),
                json!({"card": 1}),
            ),
            (
                json!({"patternProperties": {"^x-": {"type": "string"}},
                       "additionalProperties": false}),
                json!({"x-a": "s"}),
                json!({"x-a": 1}),
            ),
            (
                json!({"patternProperties": {"^x-": true}, "additionalProperties": false}),
                json!({"x-a": 1}),
                json!({"y": 1}),
            ),
            (
                json!({"propertyNames": {"maxLength": 3}}),
                json!({"abc": 1}),
                json!({"abcd": 1}),
            ),
            (
                json!({"if": {"properties": {"kind": {"const": "refund"}}},
                       "then": {"required": ["amount"]}, "else": {"maxProperties": 1}}),
                json!({"kind": "refund", "amount": 3}),
                json!({"kind": "refund"}),
            ),
            (
                json!({"if": {"properties": {"kind": {"const": "refund"}}},
                       "then": {"required": ["amount"]}, "else": {"maxProperties": 1}}),
                json!({"kind": "note"}),
                json!({"kind": "note", "x": 1}),
            ),
        ] {
            assert_eq!(validate(&schema), Ok(()), "{schema}");
            assert_eq!(check(&schema, &good), Ok(()), "{schema} {good}");
            assert!(check(&schema, &bad).is_err(), "{schema} took {bad}");
        }
        let e = check(&json!({"pattern": "^a"}), &json!("b")).unwrap_err();
        assert_eq!(e, "$: does not match the pattern `^a`");
        // What cannot be checked as written is refused, saying why.
        for (schema, says) in [
            (
                json!({"pattern": "(?=a)"}),
                "$.pattern: `(?=a)` is not a regular expression",
            ),
            (
                json!({"pattern": 5}),
                "$.pattern: must be a regular expression",
            ),
            (
                json!({"patternProperties": {"(": {}}}),
                "$.patternProperties: `(` is not",
            ),
            (
                json!({"pattern": "a".repeat(1001)}),
                "$.pattern: a pattern of 1001 bytes",
            ),
            (
                json!({"multipleOf": 0}),
                "$.multipleOf: must be a number above 0",
            ),
            (json!({"uniqueItems": "yes"}), "$.uniqueItems"),
            (
                json!({"dependentRequired": {"a": "b"}}),
                "$.dependentRequired",
            ),
            (
                json!({"unevaluatedProperties": false}),
                "$.unevaluatedProperties",
            ),
            (json!({"if": {"type": "nope"}}), "$.if.type"),
            (json!({"contains": {"$ref": "#"}}), "$.contains.$ref"),
            (json!({"minContains": -1}), "$.minContains"),
        ] {
            let e = validate(&schema).expect_err(&schema.to_string());
            assert!(e.starts_with(says), "{schema}: {e}");
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
