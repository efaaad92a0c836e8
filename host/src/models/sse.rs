//! Server-sent events, as providers stream them: `event:` and `data:`
//! lines, a blank line ending each event (the WHATWG rules, minus `id:`
//! and `retry:`, which no provider needs).

/// One event.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SseEvent {
    /// The `event:` field (`message` when absent).
    pub event: String,
    /// The `data:` lines, joined with `\n`.
    pub data: String,
}

/// Splits a byte stream into events, whatever the chunking.
#[derive(Debug, Default)]
pub struct SseParser {
    buf: Vec<u8>,
    /// Bytes at the start of `buf` known to hold no newline: a long line
    /// arriving in many chunks is scanned once, not once per chunk (that
    /// was quadratic: 12 MiB without a newline took 2.5 s of CPU).
    scanned: usize,
    event: Option<String>,
    data: Option<String>,
}

/// The longest line a provider may send before the stream is refused.
const MAX_LINE: usize = 8 << 20;

impl SseParser {
    /// Feed bytes; the events they complete.
    pub fn push(&mut self, chunk: &[u8]) -> Result<Vec<SseEvent>, String> {
        self.buf.extend_from_slice(chunk);
        let mut out = Vec::new();
        let mut start = 0;
        let mut from = self.scanned;
        while let Some(n) = self.buf[from..].iter().position(|&b| b == b'\n') {
            let mut line = &self.buf[start..from + n];
            start = from + n + 1;
            from = start;
            if line.last() == Some(&b'\r') {
                line = &line[..line.len() - 1];
            }
            let line = String::from_utf8_lossy(line).into_owned();
            if let Some(e) = self.line(&line) {
                out.push(e);
            }
        }
        self.buf.drain(..start);
        self.scanned = self.buf.len();
        if self.buf.len() > MAX_LINE {
            return Err("the provider sent a line longer than 8 MiB".into());
        }
        Ok(out)
    }

    /// The end of the stream: an event not yet ended by a blank line.
    pub fn finish(&mut self) -> Option<SseEvent> {
        if !self.buf.is_empty() {
            self.scanned = 0;
            let line = String::from_utf8_lossy(&std::mem::take(&mut self.buf)).into_owned();
            if let Some(e) = self.line(line.trim_end_matches('\r')) {
                return Some(e);
            }
        }
        self.line("")
    }

    fn line(&mut self, line: &str) -> Option<SseEvent> {
        if line.is_empty() {
            let data = self.data.take();
            let event = self.event.take();
            return data.map(|data| SseEvent {
                event: event.unwrap_or_else(|| "message".into()),
                data,
            });
        }
        if line.starts_with(':') {
            return None;
        }
        let (field, value) = match line.split_once(':') {
            Some((f, v)) => (f, v.strip_prefix(' ').unwrap_or(v)),
            None => (line, ""),
        };
        match field {
            "event" => self.event = Some(value.to_owned()),
            "data" => match &mut self.data {
                Some(d) => {
                    d.push('\n');
                    d.push_str(value);
                }
                None => self.data = Some(value.to_owned()),
            },
            _ => {}
        }
        None
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn events_survive_any_chunking() {
        let text = b"event: a\ndata: {\"x\":1}\n\n: comment\r\ndata: one\r\ndata: two\r\n\r\ndata: [DONE]\n\n";
        let whole = SseParser::default().push(text).unwrap();
        assert_eq!(whole.len(), 3);
        assert_eq!(whole[0].event, "a");
        assert_eq!(whole[1].data, "one\ntwo");
        assert_eq!(whole[1].event, "message");
        for size in 1..text.len() {
            let mut p = SseParser::default();
            let mut got = Vec::new();
            for c in text.chunks(size) {
                got.extend(p.push(c).unwrap());
            }
            assert_eq!(got, whole, "chunk size {size}");
        }
    }

    #[test]
    fn a_final_event_without_a_blank_line_is_kept() {
        let mut p = SseParser::default();
        assert!(p.push(b"data: last").unwrap().is_empty());
        assert_eq!(p.finish().unwrap().data, "last");
        assert!(p.finish().is_none());
    }
}
