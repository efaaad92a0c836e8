//! The provider's key taken out of what a call decoded, not only out of
//! the bytes that came back.
//!
//! The egress layer replaces a secret's value in a response's bytes, but a
//! provider's answer is JSON, and streamed it is JSON split over events: a
//! value written with one escape (`\u0053UPER…`), or spread over several
//! deltas, reached the guest, the event log and the live stream whole. So
//! every string the gateway decodes is scrubbed again once decoded —
//! the parsed response before it is read, the decoded answer (tool-call
//! arguments are JSON inside a JSON string), error messages — and streamed
//! deltas go through a scrubber that holds back what could be the start
//! of a value until the next delta shows it is not.

use std::collections::BTreeMap;

use serde_json::{Map, Value};

use super::chat::{Content, Delta, Message};
use super::wire::Decoded;
use crate::egress::{Scrub, TextStreamScrub};

/// Every string in `v` (object keys included) with the values replaced.
pub(super) fn value(v: &mut Value, scrub: &Scrub) {
    match v {
        Value::String(s) => text(s, scrub),
        Value::Array(items) => items.iter_mut().for_each(|i| value(i, scrub)),
        Value::Object(map) => object(map, scrub),
        Value::Null | Value::Bool(_) | Value::Number(_) => {}
    }
}

fn object(map: &mut Map<String, Value>, scrub: &Scrub) {
    let taken = std::mem::take(map);
    for (mut k, mut v) in taken {
        text(&mut k, scrub);
        value(&mut v, scrub);
        map.insert(k, v);
    }
}

fn text(s: &mut String, scrub: &Scrub) {
    *s = scrub.text(std::mem::take(s));
}

fn content(c: &mut Content, scrub: &Scrub) {
    match c {
        Content::Text(t) => text(t, scrub),
        Content::Parts(parts) => parts.iter_mut().for_each(|p| value(p, scrub)),
        Content::Json(v) => value(v, scrub),
    }
}

fn message(m: &mut Message, scrub: &Scrub) {
    match m {
        Message::System { content: c, extra } | Message::User { content: c, extra } => {
            content(c, scrub);
            object(extra, scrub);
        }
        Message::Assistant {
            content: c,
            tool_calls,
            provider_items,
            extra,
        } => {
            content(c, scrub);
            for call in tool_calls {
                text(&mut call.id, scrub);
                text(&mut call.name, scrub);
                value(&mut call.arguments, scrub);
            }
            provider_items.iter_mut().for_each(|i| value(i, scrub));
            object(extra, scrub);
        }
        Message::Tool {
            tool_call_id,
            content: c,
            extra,
            ..
        } => {
            text(tool_call_id, scrub);
            content(c, scrub);
            object(extra, scrub);
        }
    }
}

/// A decoded answer with the values replaced in every string it holds.
pub(super) fn decoded(d: &mut Decoded, scrub: &Scrub) {
    if scrub.is_empty() {
        return;
    }
    for s in [&mut d.id, &mut d.model, &mut d.provider_stop_reason]
        .into_iter()
        .flatten()
    {
        text(s, scrub);
    }
    message(&mut d.message, scrub);
    object(&mut d.usage.extra, scrub);
    object(&mut d.provider_fields, scrub);
}

/// Streamed deltas, scrubbed across their boundaries: the text, and each
/// tool call's arguments, as one stream each.
pub(super) struct Deltas {
    scrub: Scrub,
    text: TextStreamScrub,
    calls: BTreeMap<usize, TextStreamScrub>,
}

impl Deltas {
    pub(super) fn new(scrub: &Scrub) -> Self {
        Self {
            scrub: scrub.clone(),
            text: TextStreamScrub::new(scrub.clone()),
            calls: BTreeMap::new(),
        }
    }

    /// `d` as it may be released now (`None`: all of it held back).
    pub(super) fn delta(&mut self, d: Delta) -> Option<Delta> {
        match d {
            Delta::Text { text } => {
                let text = self.text.push(&text);
                (!text.is_empty()).then_some(Delta::Text { text })
            }
            Delta::ToolCall {
                index,
                id,
                name,
                arguments,
            } => {
                let arguments = self
                    .calls
                    .entry(index)
                    .or_insert_with(|| TextStreamScrub::new(self.scrub.clone()))
                    .push(&arguments);
                let id = id.map(|i| self.scrub.text(i));
                let name = name.map(|n| self.scrub.text(n));
                (id.is_some() || name.is_some() || !arguments.is_empty()).then_some(
                    Delta::ToolCall {
                        index,
                        id,
                        name,
                        arguments,
                    },
                )
            }
        }
    }

    /// What was held back, at the end of the stream.
    pub(super) fn finish(&mut self) -> Vec<Delta> {
        let mut out = Vec::new();
        let text = self.text.finish();
        if !text.is_empty() {
            out.push(Delta::Text { text });
        }
        for (index, call) in &mut self.calls {
            let arguments = call.finish();
            if !arguments.is_empty() {
                out.push(Delta::ToolCall {
                    index: *index,
                    id: None,
                    name: None,
                    arguments,
                });
            }
        }
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn scrub() -> Scrub {
        let mut s = Scrub::default();
        s.add(b"SUPERSECRETVALUE_abc123");
        s
    }

    #[test]
    fn deltas_are_scrubbed_across_their_boundaries() {
        let mut d = Deltas::new(&scrub());
        let mut text = String::new();
        let mut args = String::new();
        let pieces = [
            Delta::Text {
                text: "key: SUPE".into(),
            },
            Delta::ToolCall {
                index: 0,
                id: Some("call_1".into()),
                name: Some("look".into()),
                arguments: "{\"k\": \"SUPERSECR".into(),
            },
            Delta::Text {
                text: "RSECR".into(),
            },
            Delta::Text {
                text: "ETVALUE_abc123 end".into(),
            },
            Delta::ToolCall {
                index: 0,
                id: None,
                name: None,
                arguments: "ETVALUE_abc123\"}".into(),
            },
        ];
        let mut released = Vec::new();
        for p in pieces {
            released.extend(d.delta(p));
        }
        released.extend(d.finish());
        for r in released {
            match r {
                Delta::Text { text: t } => text.push_str(&t),
                Delta::ToolCall { arguments, .. } => args.push_str(&arguments),
            }
        }
        assert_eq!(text, "key: [redacted] end");
        assert_eq!(args, "{\"k\": \"[redacted]\"}");
    }

    #[test]
    fn decoded_strings_are_scrubbed_once_decoded() {
        // `\u0053` is `S`: the bytes never held the value.
        let raw = r#"{"content": "key=\u0053UPERSECRETVALUE_abc123",
                      "SUPERSECRETVALUE_abc123": ["supersecretvalue_ABC123"]}"#;
        // The bytes' scrub reads JSON escapes too (since 2026-12-07); the
        // decoded strings are checked all the same.
        let bytes = String::from_utf8(scrub().bytes(raw.as_bytes().to_vec())).unwrap();
        assert!(!bytes.contains("UPERSECRETVALUE_abc123"), "{bytes}");
        let mut v: Value = serde_json::from_str(raw).unwrap();
        value(&mut v, &scrub());
        assert_eq!(
            v,
            serde_json::json!({"content": "key=[redacted]", "[redacted]": ["[redacted]"]})
        );
    }
}
