//! How the text log writes a line's fields: as `tracing-subscriber`'s
//! default does (the message, then `name=value` pairs), but with control
//! characters escaped. Values come from anyone: a hook name in a URL, an
//! actor's error message, a guest's `log.info`. Written raw, a newline in
//! one forged a whole log line (`…%0A2026-12-06T11:25:25Z ERROR …` in a
//! webhook's path, found by a probe on 2026-12-06) and an escape sequence
//! could rewrite the operator's terminal. The JSON format escapes by
//! itself.

use std::fmt::{self, Write as _};

use tracing::field::{Field, Visit};
use tracing_subscriber::field::RecordFields;
use tracing_subscriber::fmt::FormatFields;
use tracing_subscriber::fmt::format::Writer;

/// The text format's fields, escaped.
#[derive(Debug, Default, Clone, Copy)]
pub(super) struct EscapedFields;

impl<'writer> FormatFields<'writer> for EscapedFields {
    fn format_fields<R: RecordFields>(&self, writer: Writer<'writer>, fields: R) -> fmt::Result {
        let mut v = Visitor {
            writer,
            first: true,
            result: Ok(()),
            buf: String::new(),
        };
        fields.record(&mut v);
        v.result
    }
}

struct Visitor<'a> {
    writer: Writer<'a>,
    first: bool,
    result: fmt::Result,
    buf: String,
}

impl Visitor<'_> {
    fn field(&mut self, field: &Field, value: fmt::Arguments<'_>) {
        if self.result.is_err() {
            return;
        }
        self.buf.clear();
        let _ = self.buf.write_fmt(value);
        let sep = if self.first { "" } else { " " };
        self.first = false;
        let name = field.name();
        self.result = if name == "message" {
            write!(self.writer, "{sep}")
        } else {
            write!(
                self.writer,
                "{sep}{}=",
                name.strip_prefix("r#").unwrap_or(name)
            )
        };
        if self.result.is_ok() {
            self.result = escape(&self.buf, &mut self.writer);
        }
    }
}

impl Visit for Visitor<'_> {
    fn record_str(&mut self, field: &Field, value: &str) {
        if field.name() == "message" {
            self.field(field, format_args!("{value}"));
        } else {
            // Quoted, as the default format writes strings.
            self.field(field, format_args!("{value:?}"));
        }
    }

    fn record_error(&mut self, field: &Field, value: &(dyn std::error::Error + 'static)) {
        self.field(field, format_args!("{value}"));
    }

    fn record_debug(&mut self, field: &Field, value: &dyn fmt::Debug) {
        self.field(field, format_args!("{value:?}"));
    }
}

/// Write `s` with every control character (and the Unicode line and
/// paragraph separators) as an escape, so a value is one line, as typed.
fn escape(s: &str, w: &mut Writer<'_>) -> fmt::Result {
    let mut rest = s;
    while let Some(at) = rest.find(needs_escape) {
        w.write_str(&rest[..at])?;
        let c = rest[at..].chars().next().expect("found a char");
        match c {
            '\n' => w.write_str("\\n")?,
            '\r' => w.write_str("\\r")?,
            '\t' => w.write_str("\\t")?,
            c => write!(w, "\\u{{{:x}}}", c as u32)?,
        }
        rest = &rest[at + c.len_utf8()..];
    }
    w.write_str(rest)
}

fn needs_escape(c: char) -> bool {
    c.is_control() || c == '\u{2028}' || c == '\u{2029}'
}

#[cfg(test)]
mod tests {
    use super::*;

    fn escaped(s: &str) -> String {
        let mut out = String::new();
        escape(s, &mut Writer::new(&mut out)).unwrap();
        out
    }

    #[test]
    fn a_value_stays_on_its_line() {
        assert_eq!(
            escaped("h\n2026-12-06T11:25:25Z ERROR forged"),
            "h\\n2026-12-06T11:25:25Z ERROR forged"
        );
        assert_eq!(escaped("a\r\tb\u{1b}[31mred"), "a\\r\\tb\\u{1b}[31mred");
        assert_eq!(escaped("x\u{2028}y\u{85}"), "x\\u{2028}y\\u{85}");
        assert_eq!(escaped("plain, ünïcode ✓"), "plain, ünïcode ✓");
    }

    #[test]
    fn a_line_written_through_a_subscriber_is_one_line() {
        use std::sync::{Arc, Mutex};
        #[derive(Clone, Default)]
        struct Sink(Arc<Mutex<Vec<u8>>>);
        impl std::io::Write for Sink {
            fn write(&mut self, b: &[u8]) -> std::io::Result<usize> {
                self.0.lock().unwrap().extend_from_slice(b);
                Ok(b.len())
            }
            fn flush(&mut self) -> std::io::Result<()> {
                Ok(())
            }
        }
        let sink = Sink::default();
        let out = sink.clone();
        let subscriber = tracing_subscriber::fmt()
            .fmt_fields(EscapedFields)
            .with_ansi(false)
            .with_writer(move || sink.clone())
            .finish();
        tracing::subscriber::with_default(subscriber, || {
            let hook = "y\n2026-12-06T11:25:25Z ERROR forged";
            let e = std::io::Error::other("bad\nline");
            tracing::info!(hook, error = %e, n = 3, "webhook {} rejected", "x\ny");
        });
        let text = String::from_utf8(out.0.lock().unwrap().clone()).unwrap();
        assert_eq!(text.lines().count(), 1, "{text}");
        assert!(
            text.contains(
                "webhook x\\ny rejected hook=\"y\\n2026-12-06T11:25:25Z ERROR forged\" \
                 error=bad\\nline n=3"
            ),
            "{text}"
        );
    }
}
