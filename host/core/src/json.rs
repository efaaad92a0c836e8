//! JSON a client sends, read into structs as the client meant it.
//!
//! serde reads a struct from a JSON object, and also from an array of its
//! fields in order (`["js", "export default {}"]` as `{kind, code}`), which
//! no client means and no error message explains. [`array_for_object`]
//! finds where that happened, by walking what was sent beside what the
//! struct serializes back to.

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
}
