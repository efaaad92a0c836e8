//! JavaScript values as the host shows them: an error as one message with
//! its stack, a thrown value that is not an `Error` as the client reads it,
//! and strings that may hold lone surrogates as UTF-8.

use rquickjs::{Coerced, Ctx, Value};

/// A JavaScript error as one message: `Name: message` plus the stack.
pub(crate) fn describe_error(ctx: &Ctx<'_>, e: rquickjs::Error) -> String {
    if !e.is_exception() {
        return e.to_string();
    }
    let v = ctx.catch();
    describe_value(&v)
}

pub(crate) fn describe_value(v: &Value<'_>) -> String {
    if let Some(ex) = v.as_exception() {
        // Each as text that may hold lone surrogates (see `well_formed`);
        // a property that cannot be read or shown is left out.
        let text = |key: &str| {
            ex.get::<_, Option<Coerced<rquickjs::String<'_>>>>(key)
                .ok()
                .flatten()
                .and_then(|s| well_formed(&s.0).ok())
        };
        let name = text("name").unwrap_or_else(|| "Error".into());
        let message = text("message").unwrap_or_default();
        let stack = text("stack").unwrap_or_default();
        let head = if message.is_empty() {
            name
        } else {
            format!("{name}: {message}")
        };
        return if stack.trim().is_empty() {
            head
        } else {
            format!("{head}\n{}", stack.trim_end())
        };
    }
    format!("Uncaught {}", thrown(v))
}

/// What a thrown value that is not an `Error` was, as the client reads it:
/// `throw 42` is "42", `throw {code: 7}` is `{"code":7}` (it used to be
/// only "int" or "object").
pub(crate) fn thrown(v: &Value<'_>) -> String {
    if let Some(s) = v.as_string() {
        return well_formed(s).unwrap_or_default();
    }
    if v.is_undefined() {
        return "undefined".into();
    }
    if let Some(s) = v.as_symbol() {
        return match s.description() {
            Ok(d) if !d.is_undefined() => format!("Symbol({})", thrown(&d)),
            _ => "Symbol()".into(),
        };
    }
    let ctx = v.ctx();
    match ctx.json_stringify(v.clone()) {
        Ok(Some(text)) => well_formed(&text).unwrap_or_default(),
        Ok(None) => format!("a thrown {}", v.type_name()),
        Err(_) => {
            // A getter or `toJSON` threw while it was shown.
            let _ = ctx.catch();
            format!("a thrown {} that cannot be shown", v.type_name())
        }
    }
}

/// A JavaScript string as Rust text. JavaScript strings may hold lone
/// surrogates, which UTF-8 cannot; QuickJS hands those out as three-byte
/// WTF-8 sequences (`ED A0..BF ..`), which `rquickjs::String::to_string`
/// refuses, so a string reply or an error message holding one used to fail
/// or vanish. Each lone surrogate becomes U+FFFD, as
/// `String.prototype.toWellFormed` (and the prelude's `text`) does.
pub(crate) fn well_formed(s: &rquickjs::String<'_>) -> rquickjs::Result<String> {
    let c = rquickjs::CString::from_string(s.clone())?;
    #[allow(
        unsafe_code,
        reason = "reading the bytes of a C string QuickJS keeps alive while `c` lives"
    )]
    // SAFETY: `as_ptr` points at `len` bytes QuickJS owns until `c` drops.
    let bytes = unsafe { std::slice::from_raw_parts(c.as_ptr().cast::<u8>(), c.len()) };
    if let Ok(text) = std::str::from_utf8(bytes) {
        return Ok(text.to_owned());
    }
    let mut out = Vec::with_capacity(bytes.len());
    let mut rest = bytes;
    while let Some((&first, tail)) = rest.split_first() {
        // A surrogate, high or low, encoded on its own: ED A0..BF 80..BF.
        if let [0xED, 0xA0..=0xBF, 0x80..=0xBF, ..] = rest {
            out.extend_from_slice("\u{FFFD}".as_bytes());
            rest = &rest[3..];
        } else {
            out.push(first);
            rest = tail;
        }
    }
    // Anything else QuickJS might hand out that is still not UTF-8.
    Ok(String::from_utf8(out)
        .unwrap_or_else(|e| String::from_utf8_lossy(e.as_bytes()).into_owned()))
}
