//! JSON a client sends, read into structs as the client meant it.
//!
//! serde reads a struct from a JSON object, and also from an array of its
//! fields in order (`["js", "export default {}"]` as `{kind, code}`), which
//! no client means and no error message explains. [`array_for_object`]
//! finds where that happened, by walking what was sent beside what the
//! struct serializes back to.
//!
//! JSON has one kind of number, and JSON Schema's `integer` includes
//! `3600.0`; serde reads an integer field from `3600` only.
//! [`integral_floats`] rewrites such numbers as the integers they are.

use serde_json::Value;

/// Where `sent` had an array that `read` (what it was read into, serialized
/// back) holds as an object: a JSON-pointer-like path (`""` for the whole
/// value, `/model`, `/schedules/0`), or `None` when every object was sent
/// as one. Keys that `read` does not hold under the same name are not
/// looked into.
pub fn array_for_object(sent: &Value, read: &Value) -> Option<String> {
    match (sent, read) {
        (Value::Array(_), Value::Object(_)) => Some(String::new()),
        (Value::Object(sent), Value::Object(read)) => sent.iter().find_map(|(key, s)| {
            let r = read.get(key)?;
            array_for_object(s, r).map(|path| format!("/{key}{path}"))
        }),
        (Value::Array(sent), Value::Array(read)) if sent.len() == read.len() => sent
            .iter()
            .zip(read)
            .enumerate()
            .find_map(|(i, (s, r))| array_for_object(s, r).map(|path| format!("/{i}{path}"))),
        _ => None,
    }
}

/// Rewrite every number in `value` written with a fraction or exponent
/// but holding a whole number that fits an `i64` or `u64` (`3600.0`,
/// `1e3`) as that integer, so that serde reads it into an integer field.
/// JSON does not tell the two apart. Returns whether anything changed.
pub fn integral_floats(value: &mut Value) -> bool {
    match value {
        Value::Number(n) => {
            let Some(f) = n.as_f64().filter(|_| n.is_f64()) else {
                return false;
            };
            // 2^64 and -2^63 are exact as f64; whole numbers inside them fit.
            let whole = if f.fract() != 0.0 || !f.is_finite() {
                None
            } else if (0.0..18_446_744_073_709_551_616.0).contains(&f) {
                Some(serde_json::Number::from(f as u64))
            } else if (-9_223_372_036_854_775_808.0..0.0).contains(&f) {
                Some(serde_json::Number::from(f as i64))
            } else {
                None
            };
            whole.map(|w| *n = w).is_some()
        }
        Value::Array(items) => items
            .iter_mut()
            .fold(false, |changed, v| integral_floats(v) | changed),
        Value::Object(map) => map
            .values_mut()
            .fold(false, |changed, v| integral_floats(v) | changed),
        _ => false,
    }
}

/// JSON text a guest wrote, with every `\u` escape of a lone surrogate
/// (one that is not half of a pair) written as `\ufffd`, as WHATWG's
/// `TextEncoder` and every conversion of a JavaScript string to UTF-8 do.
/// JavaScript strings may hold lone surrogates and `JSON.stringify` escapes
/// them, which is valid JSON text that no UTF-8 string (serde_json's
/// `Value`, a client's parser) can hold. `None` when there is none.
pub fn without_lone_surrogates(text: &str) -> Option<String> {
    let bytes = text.as_bytes();
    // The code unit of the `\uXXXX` escape starting at `i`, if it is one.
    let unit = |i: usize| -> Option<u16> {
        let hex = bytes.get(i..i + 6)?;
        if hex[0] != b'\\' || hex[1] != b'u' {
            return None;
        }
        u16::from_str_radix(std::str::from_utf8(&hex[2..]).ok()?, 16).ok()
    };
    let mut out: Option<String> = None;
    let (mut i, mut copied) = (0, 0);
    while i < bytes.len() {
        if bytes[i] != b'\\' {
            i += 1;
            continue;
        }
        let Some(u) = unit(i) else {
            // Any other escape: skip the escaped character with it.
            i += 2;
            continue;
        };
        let paired = match u {
            0xD800..=0xDBFF => unit(i + 6).is_some_and(|l| (0xDC00..=0xDFFF).contains(&l)),
            0xDC00..=0xDFFF => false,
            _ => {
                i += 6;
                continue;
            }
        };
        if paired {
            i += 12;
            continue;
        }
        let o = out.get_or_insert_with(|| String::with_capacity(text.len()));
        o.push_str(&text[copied..i]);
        o.push_str("\\ufffd");
        i += 6;
        copied = i;
    }
    let mut o = out?;
    o.push_str(&text[copied..]);
    Some(o)
}

#[cfg(test)]
mod tests {
    use serde::{Deserialize, Serialize};
    use serde_json::json;

    use super::*;

    #[derive(Serialize, Deserialize)]
    struct Inner {
        a: u32,
        b: Option<String>,
    }

    #[derive(Serialize, Deserialize)]
    struct Outer {
        name: String,
        inner: Inner,
        #[serde(default)]
        list: Vec<Inner>,
    }

    fn check(sent: Value) -> Option<String> {
        let read: Outer = serde_json::from_value(sent.clone()).expect("serde reads it");
        array_for_object(&sent, &serde_json::to_value(&read).unwrap())
    }

    #[test]
    fn finds_each_struct_that_came_as_an_array() {
        assert_eq!(check(json!({"name": "x", "inner": {"a": 1}})), None);
        assert_eq!(
            check(json!({"name": "x", "inner": {"a": 1}, "list": [{"a": 2, "b": "y"}]})),
            None
        );
        assert_eq!(check(json!(["x", {"a": 1}])), Some(String::new()));
        assert_eq!(
            check(json!({"name": "x", "inner": [1, null]})),
            Some("/inner".into())
        );
        assert_eq!(
            check(json!({"name": "x", "inner": {"a": 1}, "list": [{"a": 2}, [3, "z"]]})),
            Some("/list/1".into())
        );
    }

    #[test]
    fn whole_floats_become_integers_and_the_rest_stay() {
        let mut v: Value = serde_json::from_str(
            r#"{"ttl": 3600.0, "e": 1e3, "neg": -2.0, "zero": -0.0, "half": 2.5,
                "int": 7, "big": 1e20, "min": -9223372036854775808.0,
                "list": [1.0, {"deep": 4.0}], "s": "5.0"}"#,
        )
        .unwrap();
        assert!(integral_floats(&mut v));
        assert_eq!(
            v,
            json!({"ttl": 3600, "e": 1000, "neg": -2, "zero": 0, "half": 2.5,
                   "int": 7, "big": 1e20, "min": i64::MIN,
                   "list": [1, {"deep": 4}], "s": "5.0"})
        );
        assert!(v["ttl"].is_u64() && v["neg"].is_i64() && v["big"].is_f64());
        let mut ints = json!({"a": 1, "b": [2, -3], "c": 0.5});
        assert!(!integral_floats(&mut ints), "nothing to rewrite");
        assert_eq!(ints, json!({"a": 1, "b": [2, -3], "c": 0.5}));
    }

    #[test]
    fn lone_surrogates_become_replacement_characters() {
        let fix = |t: &str| without_lone_surrogates(t);
        assert_eq!(fix(r#"{"a":"x"}"#), None);
        assert_eq!(fix(r#""\ud83d\ude00""#), None, "a pair stays");
        assert_eq!(fix(r#""\u00e9\n\\""#), None);
        assert_eq!(fix(r#""\udbff""#).as_deref(), Some(r#""\ufffd""#));
        assert_eq!(fix(r#""a\uDC00b""#).as_deref(), Some(r#""a\ufffdb""#));
        assert_eq!(
            fix(r#"["\ud800\ud800\udc00", "\ud800x"]"#).as_deref(),
            Some(r#"["\ufffd\ud800\udc00", "\ufffdx"]"#)
        );
        // An escaped backslash followed by `ud800` is text, not an escape.
        assert_eq!(fix(r#""\\ud800""#), None);
        for t in [r#""\udbff""#, r#"{"k":["\udc00\ud83d"]}"#] {
            let fixed = fix(t).unwrap();
            assert!(serde_json::from_str::<Value>(t).is_err(), "{t}");
            assert!(serde_json::from_str::<Value>(&fixed).is_ok(), "{fixed}");
        }
    }
}
