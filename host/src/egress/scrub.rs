//! Secret values replaced in what comes back from the network: whole
//! texts ([`Scrub`]), bodies that arrive in chunks ([`StreamScrub`]) and
//! text that arrives in pieces ([`TextStreamScrub`]).

use url::Url;
use zeroize::Zeroizing;

/// Replaces secret values in what comes back. Values match regardless of
/// ASCII case (a URL parser lowercases a host, so a value a server put in
/// a redirect's host comes back lowercased), and each byte of a value
/// also as URL and HTML encoders write one (see [`spells`]).
#[derive(Clone, Default)]
pub struct Scrub {
    needles: Vec<Zeroizing<Vec<u8>>>,
    /// The first two bytes of each value, lower-cased (a bit each of
    /// 65,536; empty until a value is added): the scans look for values
    /// only where one may start. Each value has several spellings, and
    /// looking for every one at every byte made a large body's scrub
    /// several times slower (found by probes).
    starts: Vec<u64>,
    /// The first byte of each value, lower-cased (a bit each of 256): what
    /// an escape at a place must decode to for a value to start there.
    firsts: [u64; 4],
}

/// What a scrubbed secret is replaced with.
pub const REDACTED: &str = "[redacted]";

impl Scrub {
    /// Also replace `value`, as it is and as JSON encoders write it inside
    /// a string (see [`json_spellings`]): a server that echoes a key in a
    /// JSON error body escapes it, and the guest or the agent harness that
    /// parses the body would get the value whole (found by a probe: PHP's
    /// `\/` for `/`, Python's `\u00e9` for `é`).
    pub fn add(&mut self, value: &[u8]) {
        for spelling in json_spellings(value) {
            self.add_spelling(&spelling);
        }
        self.add_spelling(value);
    }

    fn add_spelling(&mut self, value: &[u8]) {
        if !value.is_empty() && !self.needles.iter().any(|n| n.eq_ignore_ascii_case(value)) {
            if self.starts.is_empty() {
                self.starts = vec![0; 1024];
            }
            // A one-byte value sets every pair it starts.
            let seconds: Vec<u8> = match value.get(1) {
                Some(b) => vec![*b],
                None => (0..=255).collect(),
            };
            for second in seconds {
                let at = pair(value[0], second);
                self.starts[at / 64] |= 1 << (at % 64);
            }
            let first = usize::from(value[0].to_ascii_lowercase());
            self.firsts[first / 64] |= 1 << (first % 64);
            self.needles.push(Zeroizing::new(value.to_vec()));
            // Longest first: a value that contains another is replaced
            // whole, not around the shorter one.
            self.needles.sort_by_key(|n| std::cmp::Reverse(n.len()));
        }
    }

    /// Whether there is anything to replace.
    pub fn is_empty(&self) -> bool {
        self.needles.is_empty()
    }

    /// Whether `url` carries a secret value, as it is or percent-decoded.
    pub fn found_in_url(&self, url: &Url) -> bool {
        let raw = url.as_str().as_bytes();
        let decoded: Vec<u8> = percent_encoding::percent_decode(raw).collect();
        self.found_in(raw) || self.found_in(&decoded)
    }

    /// Whether `text` holds a whole secret value, in any ASCII case.
    pub fn found_in(&self, text: &[u8]) -> bool {
        (0..text.len()).any(|i| self.value_at(&text[i..]).is_some())
    }

    /// Whether a value, or the start of one, may begin `text` (judged by
    /// its first two bytes, or its only one; a byte that may start an
    /// encoded one could stand for any).
    fn may_start(&self, text: &[u8]) -> bool {
        let (Some(&first), false) = (text.first(), self.starts.is_empty()) else {
            return false;
        };
        if ENCODED_STARTS.contains(&first) {
            // What it stands for, or the byte as it is, must start a value
            // (each escape of a body full of `%` ran every value's match:
            // seconds of CPU for 8 MB, found by a re-probe).
            return match decode_one(text) {
                Decoded::Cut => true,
                Decoded::Bytes(bytes, _, _) => {
                    self.first_is(bytes[0])
                        || self.first_is(first)
                        || (first == b'+' && self.first_is(b' '))
                }
            };
        }
        let seconds = match text.get(1) {
            Some(&b) if !ENCODED_STARTS.contains(&b) => b..=b,
            _ => 0..=255,
        };
        seconds.into_iter().any(|second| {
            let at = pair(first, second);
            self.starts[at / 64] & (1 << (at % 64)) != 0
        })
    }

    /// Whether a value starts with byte `b` (in any ASCII case).
    fn first_is(&self, b: u8) -> bool {
        let b = usize::from(b.to_ascii_lowercase());
        self.firsts[b / 64] & (1 << (b % 64)) != 0
    }

    /// How many bytes of `text`, from its start, spell the longest value
    /// it starts with.
    fn value_at(&self, text: &[u8]) -> Option<usize> {
        if !self.may_start(text) {
            return None;
        }
        // Longest first.
        self.needles.iter().find_map(|n| match spells(text, n) {
            Spelled::Whole(len) => Some(len),
            _ => None,
        })
    }

    /// `bytes` with every secret value replaced.
    ///
    /// A text that ends with the start of a value, half of it or more
    /// (and at least [`PARTIAL_SECRET`] bytes: an answer cut off by
    /// `max_tokens` mid-key, a stream that ended there), has that start
    /// replaced too: that much of a key is worth keeping. (Redacted in the live preview only, it was
    /// kept in the stored answer.)
    pub fn bytes(&self, bytes: Vec<u8>) -> Vec<u8> {
        let mut out = self.whole_values(bytes);
        if let Some(at) = self.cut_tail(&out) {
            out.truncate(at);
            out.extend_from_slice(REDACTED.as_bytes());
        }
        out
    }

    /// Where the start of a value that `bytes` ends with begins, if
    /// enough of it is there.
    fn cut_tail(&self, bytes: &[u8]) -> Option<usize> {
        // A byte of a value takes at most `MAX_ENCODED` of the text.
        let longest = self.needles.first().map_or(0, |n| n.len());
        let from = bytes.len().saturating_sub(longest * MAX_ENCODED);
        (from..bytes.len()).find(|&i| {
            self.may_start(&bytes[i..])
                && self.needles.iter().any(|n| {
                    matches!(spells(&bytes[i..], n),
                    Spelled::Start(part) if part >= PARTIAL_SECRET.max(n.len() / 2))
                })
        })
    }

    /// `bytes` with every whole value replaced: one pass, left to right,
    /// the longest value at each place (a copy only once one is found).
    fn whole_values(&self, bytes: Vec<u8>) -> Vec<u8> {
        let mut out: Option<Vec<u8>> = None;
        let mut copied = 0;
        let mut i = 0;
        while i < bytes.len() {
            match self.value_at(&bytes[i..]) {
                Some(len) => {
                    let o = out.get_or_insert_with(|| Vec::with_capacity(bytes.len()));
                    o.extend_from_slice(&bytes[copied..i]);
                    o.extend_from_slice(REDACTED.as_bytes());
                    i += len;
                    copied = i;
                }
                None => i += 1,
            }
        }
        match out {
            Some(mut o) => {
                o.extend_from_slice(&bytes[copied..]);
                o
            }
            None => bytes,
        }
    }

    /// `text` with every secret value replaced.
    pub fn text(&self, text: String) -> String {
        match String::from_utf8(self.bytes(text.into_bytes())) {
            Ok(s) => s,
            Err(e) => String::from_utf8_lossy(e.as_bytes()).into_owned(),
        }
    }
}

/// JSON encoders' defaults, one spelling each: the characters (besides
/// `"`, `\` and control characters, which every encoder escapes) each
/// writes as `\uXXXX`, whether it writes everything outside ASCII so, and
/// whether it writes `/` as `\/`. One set for all of them matched no real
/// encoder: a value with `+` and `=` was written by Gson with `=` escaped
/// and `+` not (found by a probe).
const ENCODERS: &[(&[char], bool, bool)] = &[
    // serde_json, JavaScript, Ruby: as it is (but `"`, `\`, controls).
    (&[], false, false),
    // Python's `ensure_ascii`.
    (&[], true, false),
    // PHP.
    (&[], true, true),
    // PHP with `JSON_UNESCAPED_UNICODE`.
    (&[], false, true),
    // Go.
    (&['<', '>', '&', '\u{2028}', '\u{2029}'], false, false),
    // Gson.
    (&['<', '>', '&', '=', '\''], false, false),
    // .NET's System.Text.Json.
    (&['<', '>', '&', '\'', '+', '`', '"'], true, false),
];

/// How `value` (UTF-8) may be written inside a JSON string besides as it
/// is: as each of [`ENCODERS`] writes it. Hex digits match in either case,
/// as every value does. A value with none of those characters has no
/// other spelling.
fn json_spellings(value: &[u8]) -> Vec<Vec<u8>> {
    let Ok(text) = std::str::from_utf8(value) else {
        return Vec::new();
    };
    let mut out: Vec<Vec<u8>> = Vec::new();
    for &(escaped, non_ascii, slash) in ENCODERS {
        let mut s = String::with_capacity(text.len());
        for c in text.chars() {
            match c {
                c if escaped.contains(&c) => escape_u(&mut s, c),
                '"' => s.push_str("\\\""),
                '\\' => s.push_str("\\\\"),
                '/' if slash => s.push_str("\\/"),
                '\n' => s.push_str("\\n"),
                '\r' => s.push_str("\\r"),
                '\t' => s.push_str("\\t"),
                c if c < ' ' => escape_u(&mut s, c),
                c if !c.is_ascii() && non_ascii => escape_u(&mut s, c),
                c => s.push(c),
            }
        }
        if s.as_bytes() != value && !out.iter().any(|o| o == s.as_bytes()) {
            out.push(s.into_bytes());
        }
    }
    out
}

/// Where the pair of bytes `a`, `b` is in [`Scrub`]'s bit set.
fn pair(a: u8, b: u8) -> usize {
    usize::from(a.to_ascii_lowercase()) << 8 | usize::from(b.to_ascii_lowercase())
}

/// `c` as JSON's `\uXXXX`, a surrogate pair outside the BMP.
fn escape_u(s: &mut String, c: char) {
    let mut units = [0u16; 2];
    for unit in c.encode_utf16(&mut units) {
        s.push_str(&format!("\\u{unit:04x}"));
    }
}

/// The shortest start of a secret cut off at a text's end that is
/// replaced rather than kept: half the secret, and at least this (a key's
/// public prefix, `sk-proj-`, is 8 bytes, and a text may well end with it).
const PARTIAL_SECRET: usize = 12;

/// [`Scrub`] over a body that arrives in chunks: a value split across two
/// chunks is replaced too, because a chunk's tail that could be the start
/// of a value waits for the next one.
pub struct StreamScrub {
    scrub: Scrub,
    pending: Vec<u8>,
}

impl StreamScrub {
    /// Scrub a stream with `scrub`'s values.
    pub fn new(scrub: Scrub) -> Self {
        Self {
            scrub,
            pending: Vec::new(),
        }
    }

    /// Add `chunk`; returns what can be released now. Only what could be
    /// the start of a value is held back: the tail from the first place
    /// where the rest of the buffer is a proper prefix of one. (It used to
    /// hold back the last `longest value − 1` bytes whatever they were:
    /// with a real key of 100–170 characters, a keyed provider's answer
    /// streamed nothing live until that much more text had come.)
    pub fn push(&mut self, chunk: &[u8]) -> Vec<u8> {
        if self.scrub.needles.is_empty() {
            return chunk.to_vec();
        }
        self.pending.extend_from_slice(chunk);
        let buf = std::mem::take(&mut self.pending);
        let mut out = Vec::with_capacity(buf.len());
        let mut i = 0;
        'scan: while i < buf.len() {
            let rest = &buf[i..];
            // Neither a value nor the start of one begins here.
            if !self.scrub.may_start(rest) {
                out.push(rest[0]);
                i += 1;
                continue;
            }
            // Longest first: a value that may still grow into a longer
            // one waits rather than being replaced around it.
            for needle in &self.scrub.needles {
                match spells(rest, needle) {
                    Spelled::Whole(len) => {
                        out.extend_from_slice(REDACTED.as_bytes());
                        i += len;
                        continue 'scan;
                    }
                    Spelled::Start(_) => break 'scan,
                    Spelled::No => {}
                }
            }
            out.push(buf[i]);
            i += 1;
        }
        self.pending = buf[i..].to_vec();
        out
    }

    /// The values it replaces.
    pub(super) fn values(&self) -> &Scrub {
        &self.scrub
    }

    /// The end of the stream: release what was held back. What was held
    /// may be the start of a value cut off by the end (a provider echoing
    /// a key when the connection dropped): [`Scrub::bytes`] replaces it
    /// if enough of it is there.
    pub fn finish(&mut self) -> Vec<u8> {
        self.scrub.bytes(std::mem::take(&mut self.pending))
    }
}

/// [`StreamScrub`] over text that arrives in pieces (a model's answer,
/// delta by delta): what it releases always ends on a character boundary.
pub struct TextStreamScrub {
    bytes: StreamScrub,
    /// Released bytes that end in the middle of a character.
    partial: Vec<u8>,
}

impl TextStreamScrub {
    /// Scrub a text stream with `scrub`'s values.
    pub fn new(scrub: Scrub) -> Self {
        Self {
            bytes: StreamScrub::new(scrub),
            partial: Vec::new(),
        }
    }

    /// Add `piece`; returns what can be released now (maybe nothing).
    pub fn push(&mut self, piece: &str) -> String {
        let out = self.bytes.push(piece.as_bytes());
        self.release(out, false)
    }

    /// The end of the stream: release what was held back.
    pub fn finish(&mut self) -> String {
        let out = self.bytes.finish();
        self.release(out, true)
    }

    fn release(&mut self, out: Vec<u8>, last: bool) -> String {
        self.partial.extend_from_slice(&out);
        let whole = match std::str::from_utf8(&self.partial) {
            Ok(_) => self.partial.len(),
            Err(e) if e.error_len().is_none() && !last => e.valid_up_to(),
            Err(_) => self.partial.len(),
        };
        let rest = self.partial.split_off(whole);
        let text = std::mem::replace(&mut self.partial, rest);
        match String::from_utf8(text) {
            Ok(t) => t,
            Err(e) => String::from_utf8_lossy(e.as_bytes()).into_owned(),
        }
    }
}

/// How the start of a text spells a value.
#[derive(Debug, PartialEq, Eq)]
enum Spelled {
    /// Whole, in this many bytes of the text.
    Whole(usize),
    /// The text ends after this many bytes of the value (or inside an
    /// escape that may stand for the next one).
    Start(usize),
    /// Not at all.
    No,
}

/// Bytes that may begin one byte of a value written encoded.
const ENCODED_STARTS: &[u8] = b"%&+\\";

/// Most bytes one byte of a value takes encoded (`&#x000002F;`).
const MAX_ENCODED: usize = 12;

/// How `hay` spells `needle` from its start, ignoring ASCII case: the
/// value as it is, or with any of its bytes written as URL and HTML
/// encoders write them, mixed as they like: `%2F` (either case of hex),
/// `+` for a space, `&#47;`, `&#x2F;`, `&amp;`. A server that reflects a
/// key in a redirect's query (percent-encoded), a form or an HTML error
/// page handed it to the guest whole, since only its plain and JSON
/// spellings were looked for (found by a probe).
fn spells(hay: &[u8], needle: &[u8]) -> Spelled {
    // The value as it is: a value with `%` or `&` of its own is not read
    // as escapes of some other one.
    if hay.len() >= needle.len() && hay[..needle.len()].eq_ignore_ascii_case(needle) {
        return Spelled::Whole(needle.len());
    }
    if hay.len() < needle.len() && needle[..hay.len()].eq_ignore_ascii_case(hay) {
        return Spelled::Start(hay.len());
    }
    let (mut i, mut j) = (0, 0);
    while j < needle.len() {
        let Some(rest) = hay.get(i..).filter(|r| !r.is_empty()) else {
            return Spelled::Start(j);
        };
        if rest[0] == b'+' && matches!(needle[j], b'+' | b' ') {
            (i, j) = (i + 1, j + 1);
            continue;
        }
        // The byte as it is, when what follows it is no escape of the
        // value's next byte: a value's own `%41` echoed with its `&` as
        // `&amp;` is read `%`, `4`, `1`.
        let raw = rest[0].eq_ignore_ascii_case(&needle[j]);
        match decode_one(rest) {
            Decoded::Bytes(bytes, n, used)
                if needle
                    .get(j..j + n)
                    .is_some_and(|want| want.eq_ignore_ascii_case(&bytes[..n])) =>
            {
                (i, j) = (i + used, j + n);
            }
            _ if raw => (i, j) = (i + 1, j + 1),
            Decoded::Cut => return Spelled::Start(j),
            Decoded::Bytes(..) => return Spelled::No,
        }
    }
    Spelled::Whole(i)
}

/// The first byte (or character) `text` writes.
enum Decoded {
    /// The first this many of these bytes (a character's UTF-8), written
    /// in this many bytes of `text`.
    Bytes([u8; 4], usize, usize),
    /// `text` ends inside what may be an escape.
    Cut,
}

/// What `text` (not empty) starts with, its escapes read: `%XX`, and
/// HTML's numeric character references and the five XML entities. What
/// is no escape is the byte itself.
fn decode_one(text: &[u8]) -> Decoded {
    let byte = |b: u8, used| Decoded::Bytes([b, 0, 0, 0], 1, used);
    let hex = |b: u8| char::from(b).to_digit(16);
    match text[0] {
        b'%' => match (text.get(1).map(|&b| hex(b)), text.get(2).map(|&b| hex(b))) {
            (Some(Some(hi)), Some(Some(lo))) => byte((hi * 16 + lo) as u8, 3),
            (None, _) | (Some(Some(_)), None) => Decoded::Cut,
            _ => byte(b'%', 1),
        },
        b'&' => {
            let window = &text[..text.len().min(MAX_ENCODED)];
            // A numeric reference ends at its last digit (HTML reads `&#47`
            // as `/`), a named one at its `;`.
            let numeric = window.get(1) == Some(&b'#');
            let hex_ref = numeric && matches!(window.get(2), Some(b'x' | b'X'));
            let from = if numeric { 2 + usize::from(hex_ref) } else { 1 };
            let body = window[from.min(window.len())..]
                .iter()
                .take_while(|b| match (numeric, hex_ref) {
                    (true, true) => b.is_ascii_hexdigit(),
                    (true, false) => b.is_ascii_digit(),
                    _ => b.is_ascii_alphanumeric(),
                })
                .count();
            let end = from + body;
            let Some(&next) = window.get(end) else {
                // The text (or the window) ends inside it.
                return if window.len() < MAX_ENCODED {
                    Decoded::Cut
                } else {
                    byte(b'&', 1)
                };
            };
            let closed = next == b';';
            if body == 0 || (!numeric && !closed) {
                return byte(b'&', 1);
            }
            match entity(&text[1..end]) {
                Some(c) => {
                    let mut utf8 = [0; 4];
                    let n = c.encode_utf8(&mut utf8).len();
                    Decoded::Bytes(utf8, n, end + usize::from(closed))
                }
                None => byte(b'&', 1),
            }
        }
        b'\\' => backslash(text),
        b => byte(b, 1),
    }
}

/// What a backslash escape (JSON's, JavaScript's) at the start of `text`
/// stands for: `\uXXXX` (a surrogate pair too), `\xHH`, `\/`, `\\`,
/// `\"`, `\'`. Every mix of them is read, not only the spellings of
/// [`ENCODERS`] (Go's html/template writes `\/` and `\u002b` together:
/// found by a re-probe).
fn backslash(text: &[u8]) -> Decoded {
    let byte = |b: u8, used| Decoded::Bytes([b, 0, 0, 0], 1, used);
    // `Some(Ok(v))`: the hex digits at `at..at + n`; `None`: the text
    // ends first; `Some(Err)`: not hex.
    let hex = |at: usize, n: usize| -> Option<Result<u32, ()>> {
        let digits = text.get(at..(at + n).min(text.len()))?;
        if !digits.iter().all(u8::is_ascii_hexdigit) {
            return Some(Err(()));
        }
        if digits.len() < n {
            return None;
        }
        let s = std::str::from_utf8(digits).map_err(|_| ());
        Some(s.and_then(|s| u32::from_str_radix(s, 16).map_err(|_| ())))
    };
    let char_at = |c: char, used| {
        let mut utf8 = [0; 4];
        let n = c.encode_utf8(&mut utf8).len();
        Decoded::Bytes(utf8, n, used)
    };
    match text.get(1) {
        None => Decoded::Cut,
        Some(&c @ (b'/' | b'\\' | b'"' | b'\'')) => byte(c, 2),
        Some(b'x') => match hex(2, 2) {
            None => Decoded::Cut,
            Some(Ok(v)) => byte(v as u8, 4),
            Some(Err(())) => byte(b'\\', 1),
        },
        Some(b'u') => match hex(2, 4) {
            None => Decoded::Cut,
            Some(Err(())) => byte(b'\\', 1),
            // The low half must follow, as `\uXXXX`.
            Some(Ok(high @ 0xD800..=0xDBFF)) => match (text.get(6), text.get(7), hex(8, 4)) {
                (None, ..) | (Some(b'\\'), None, _) | (Some(b'\\'), Some(b'u'), None) => {
                    Decoded::Cut
                }
                (Some(b'\\'), Some(b'u'), Some(Ok(low @ 0xDC00..=0xDFFF))) => {
                    let c = 0x10000 + ((high - 0xD800) << 10) + (low - 0xDC00);
                    char::from_u32(c).map_or(byte(b'\\', 1), |c| char_at(c, 12))
                }
                _ => byte(b'\\', 1),
            },
            Some(Ok(unit)) => char::from_u32(unit).map_or(byte(b'\\', 1), |c| char_at(c, 6)),
        },
        Some(_) => byte(b'\\', 1),
    }
}

/// HTML's named references of the ASCII characters a key may hold (and
/// XML's five).
const NAMED: &[(&str, char)] = &[
    ("amp", '&'),
    ("lt", '<'),
    ("gt", '>'),
    ("quot", '"'),
    ("apos", '\''),
    ("sol", '/'),
    ("bsol", '\\'),
    ("plus", '+'),
    ("equals", '='),
    ("colon", ':'),
    ("semi", ';'),
    ("comma", ','),
    ("period", '.'),
    ("lowbar", '_'),
    ("hyphen", '-'),
    ("dash", '-'),
    ("num", '#'),
    ("dollar", '$'),
    ("percnt", '%'),
    ("excl", '!'),
    ("quest", '?'),
    ("commat", '@'),
    ("ast", '*'),
    ("Hat", '^'),
    ("grave", '`'),
    ("tilde", '~'),
    ("verbar", '|'),
    ("vert", '|'),
    ("lpar", '('),
    ("rpar", ')'),
    ("lsqb", '['),
    ("rsqb", ']'),
    ("lcub", '{'),
    ("rcub", '}'),
];

/// The character an HTML reference (between `&` and `;`) stands for.
fn entity(name: &[u8]) -> Option<char> {
    let name = std::str::from_utf8(name).ok()?;
    let code = match name.strip_prefix('#') {
        Some(n) => match n.strip_prefix(['x', 'X']) {
            Some(h) => u32::from_str_radix(h, 16).ok()?,
            None => n.parse().ok()?,
        },
        None => NAMED
            .iter()
            .find(|(n, _)| *n == name)
            .map(|(_, c)| u32::from(*c))?,
    };
    char::from_u32(code)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_value_containing_another_is_replaced_whole() {
        let mut s = Scrub::default();
        s.add(b"sk-1");
        s.add(b"sk-1234");
        assert_eq!(
            s.bytes(b"x sk-1234 y sk-1".to_vec()),
            b"x [redacted] y [redacted]".to_vec()
        );
        let mut stream = StreamScrub::new(s);
        let mut out = stream.push(b"x sk-12");
        out.extend(stream.push(b"34 y"));
        out.extend(stream.finish());
        assert_eq!(out, b"x [redacted] y".to_vec());
    }

    /// Only what could start a value waits: text that cannot is released
    /// at once however long the values are.
    #[test]
    fn a_stream_holds_back_only_what_could_start_a_value() {
        let mut s = Scrub::default();
        let key = format!("sk-proj-{}", "Q".repeat(150));
        s.add(key.as_bytes());
        let mut stream = StreamScrub::new(s);
        assert_eq!(stream.push(b"word0 "), b"word0 ".to_vec());
        assert_eq!(stream.push(b"word1 s"), b"word1 ".to_vec());
        assert_eq!(stream.push(b"o "), b"so ".to_vec());
        assert_eq!(stream.push(b"sk-proj-QQ"), Vec::<u8>::new());
        let mut out = stream.push(&key.as_bytes()[10..]);
        out.extend(stream.push(b" done"));
        assert_eq!(out, b"[redacted] done".to_vec());
        // A key cut off by the end of the stream: its start is not released.
        let cut = format!("then {}", &key[..100]);
        assert_eq!(stream.push(cut.as_bytes()), b"then ".to_vec());
        assert_eq!(stream.finish(), b"[redacted]".to_vec());
        // A few bytes that merely could start one are.
        assert_eq!(stream.push(b"ok sk-"), b"ok ".to_vec());
        assert_eq!(stream.finish(), b"sk-".to_vec());
        // A value's start found again inside a false start.
        let mut s = Scrub::default();
        s.add(b"aab");
        let mut stream = StreamScrub::new(s);
        let mut out = stream.push(b"aa");
        out.extend(stream.push(b"ab!"));
        assert_eq!(out, b"a[redacted]!".to_vec());
    }

    /// A text ending with enough of a key's start (cut by `max_tokens`)
    /// keeps none of it; a few bytes that could start one stay.
    #[test]
    fn a_text_cut_off_inside_a_value_keeps_none_of_it() {
        let mut s = Scrub::default();
        s.add(b"sk-PROBE7-abcdefghijklmnop0123456789");
        assert_eq!(
            s.text("tail sk-PROBE7-abcdefghijklmnop012345678".into()),
            "tail [redacted]"
        );
        assert_eq!(
            s.text("ok sk-PROBE7-abcdefgh".into()),
            "ok [redacted]",
            "half of it"
        );
        // Less (a key's public prefix ends many texts) stays.
        assert_eq!(s.text("ok sk-PROBE7".into()), "ok sk-PROBE7");
        assert_eq!(s.text("ok sk-".into()), "ok sk-");
        assert_eq!(
            s.text("a sk-PROBE7-abcdefghijklmnop0123456789 b".into()),
            "a [redacted] b"
        );
    }

    #[test]
    fn scrub_replaces_every_occurrence_of_every_value() {
        let mut s = Scrub::default();
        s.add(b"sk-123");
        s.add(b"other");
        s.add(b"");
        assert_eq!(
            s.bytes(b"a sk-123 b sk-123other".to_vec()),
            b"a [redacted] b [redacted][redacted]".to_vec()
        );
        assert_eq!(s.text("nothing here".into()), "nothing here");
        assert_eq!(s.bytes(b"sk-12".to_vec()), b"sk-12".to_vec());
    }

    #[test]
    fn text_streams_are_scrubbed_across_pieces_and_released_on_character_boundaries() {
        let mut s = Scrub::default();
        s.add("clé-secrète".as_bytes());
        let mut t = TextStreamScrub::new(s);
        let mut out = String::new();
        for piece in ["key: cl", "é-se", "crète! ", "naïve ", "café"] {
            out.push_str(&t.push(piece));
        }
        out.push_str(&t.finish());
        assert_eq!(out, "key: [redacted]! naïve café");
        // Without values, pieces pass through at once.
        let mut t = TextStreamScrub::new(Scrub::default());
        assert_eq!(t.push("é"), "é");
    }

    #[test]
    fn scrub_ignores_ascii_case_and_finds_values_in_urls_encoded_or_not() {
        let mut s = Scrub::default();
        s.add(b"SuperSecret_9");
        s.add(b"supersecret_9");
        assert_eq!(s.needles.len(), 1, "one value, whatever its case");
        assert_eq!(
            s.text("host supersecret_9.invalid, SUPERSECRET_9".into()),
            "host [redacted].invalid, [redacted]"
        );
        let mut stream = StreamScrub::new(s.clone());
        let mut out = stream.push(b"a SUPERsec");
        out.extend(stream.push(b"ret_9 b"));
        out.extend(stream.finish());
        assert_eq!(out, b"a [redacted] b".to_vec());
        let url = |u: &str| Url::parse(u).unwrap();
        assert!(s.found_in_url(&url("https://x.test/?k=supersecret_9")));
        assert!(s.found_in_url(&url("https://supersecret_9.test/")));
        assert!(s.found_in_url(&url("https://x.test/%53uperSecret%5F9")));
        assert!(!s.found_in_url(&url("https://x.test/?k=supersecret")));
    }

    /// A value echoed URL- or HTML-encoded, each byte either way, is
    /// found and replaced, whole, in a stream split inside an escape, and
    /// cut off at a text's end; text that merely has `%`, `&` and `+` is
    /// left alone.
    #[test]
    fn values_written_as_url_and_html_encoders_write_them_are_replaced() {
        let key = "sk-SECRET-S-abc123/+=XYZ é";
        let mut s = Scrub::default();
        s.add(key.as_bytes());
        for spelled in [
            "sk-SECRET-S-abc123%2F%2B%3DXYZ%20%C3%A9",
            "sk-SECRET-S-abc123%2f%2b%3dXYZ+%c3%a9",
            "sk-SECRET-S-abc123/+%3DXYZ é",
            "%73%6B-SECRET-S-abc123/+=XYZ é",
            "sk-SECRET-S-abc123&#x2F;&#43;&#61;XYZ&#32;&eacute;",
            "sk-SECRET-S-abc123&#47;&#x2b;&#X3D;XYZ &#233;",
            "sk-SECRET-S-abc123&#47&#43&#61XYZ&#32;&#233;",
            "sk-SECRET-S-abc123&sol;&plus;&equals;XYZ&#x000020;%C3%A9",
            // JSON and JavaScript escapes, mixed as no one encoder writes
            // them (Go's html/template: `\/` with `\u002b`).
            "sk-SECRET-S-abc123\\/\\u002b=XYZ \\u00e9",
            "sk\\x2dSECRET-S-abc123\\x2F+\\u003DXYZ\\u0020\\u00E9",
        ] {
            if spelled.contains("&eacute;") {
                // Named references beyond XML's five are not read: the
                // value is not found, and nothing breaks.
                let body = format!("?token={spelled}&x=1");
                assert_eq!(s.text(body.clone()), body);
                continue;
            }
            let body = format!("Location: /cb?token={spelled}&x=1");
            assert_eq!(
                s.text(body),
                "Location: /cb?token=[redacted]&x=1",
                "{spelled}"
            );
            // Streamed a byte at a time: every escape is split.
            let mut stream = StreamScrub::new(s.clone());
            let mut out = Vec::new();
            for b in format!("<p>{spelled}</p>").bytes() {
                out.extend(stream.push(&[b]));
            }
            out.extend(stream.finish());
            assert_eq!(out, b"<p>[redacted]</p>".to_vec(), "{spelled}");
            // Cut off by the end, well past half of it.
            let cut = &spelled[..spelled.len() - 4];
            assert_eq!(s.text(format!("a {cut}")), "a [redacted]", "{cut}");
        }
        for plain in [
            "100% & more+less &amp; %zz &#xZZ; sk-SECRET",
            "&",
            "%",
            "a+b",
        ] {
            assert_eq!(s.text(plain.into()), plain);
        }
        // A value with escapes of its own is found as it is.
        let mut s = Scrub::default();
        s.add(b"pw%41&amp;x-123456");
        assert_eq!(s.text("[pw%41&amp;x-123456]".into()), "[[redacted]]");
        assert_eq!(s.text("[pw%2541%26amp%3Bx-123456]".into()), "[[redacted]]");
        // A character outside the BMP, as a surrogate pair, in a mix.
        let mut e = Scrub::default();
        e.add("k-😀-secret-123".as_bytes());
        assert_eq!(
            e.text(r#"{"k":"k\x2d\ud83d\ude00-secret\u002d123"}"#.into()),
            r#"{"k":"[redacted]"}"#
        );
        // Its `&` escaped again (HTML), its `%41` left as it is.
        assert_eq!(s.text("[pw%41&amp;amp;x-123456]".into()), "[[redacted]]");
    }

    /// A value echoed inside a JSON string, escaped as some encoder
    /// writes it, is found and replaced too.
    #[test]
    fn values_escaped_as_json_encoders_write_them_are_replaced() {
        let mut s = Scrub::default();
        let key = "tk-SECRET/VALUE+TOOL/dddd4444";
        s.add(key.as_bytes());
        for body in [
            r#"{"error":"bad key tk-SECRET\/VALUE+TOOL\/dddd4444"}"#,
            r#"{"error":"bad key tk-SECRET/VALUE+TOOL/dddd4444"}"#,
        ] {
            assert_eq!(s.text(body.into()), r#"{"error":"bad key [redacted]"}"#);
        }
        let mut s = Scrub::default();
        s.add("clé<\"x\">&\\y😀".as_bytes());
        for spelled in [
            // serde_json, JavaScript
            r#"clé<\"x\">&\\y😀"#,
            // Python's json.dumps
            r#"cl\u00e9<\"x\">&\\y\ud83d\ude00"#,
            // PHP's json_encode, upper-case hex too
            r#"cl\u00E9<\"x\">&\\y\uD83D\uDE00"#,
            // Go's encoding/json
            r#"clé\u003c\"x\"\u003e\u0026\\y😀"#,
        ] {
            let body = format!(r#"{{"echo":"{spelled}"}}"#);
            assert_eq!(s.text(body), r#"{"echo":"[redacted]"}"#, "{spelled}");
        }
        // .NET's: `+` (in base64 keys) as `\u002B`.
        let mut s = Scrub::default();
        s.add(b"qK7vR2+pXw9ZbY3mN8tL1s");
        assert_eq!(
            s.text(r#"{"dotnet":"qK7vR2\u002BpXw9ZbY3mN8tL1s"}"#.into()),
            r#"{"dotnet":"[redacted]"}"#
        );
        // Gson's: `=` (a base64 key's padding) as `\u003d`.
        let mut s = Scrub::default();
        s.add(b"c2stYWJjZGVm==");
        assert_eq!(
            s.text(r#"{"e":"c2stYWJjZGVm\u003d\u003d"}"#.into()),
            r#"{"e":"[redacted]"}"#
        );
        // One encoder's spelling each, never a mix: Go escapes `>` and `&`
        // but not `+` or `=`; .NET `+` but not `/` or `=`; Gson `=` but
        // not `+` (one set for all matched none of them).
        for (value, spelled) in [
            ("ab+c/é>&=Z", r#"ab+c/é\u003e\u0026=Z"#),
            ("Ab3+xY/9zQkLmN0pQ==", r#"Ab3\u002BxY/9zQkLmN0pQ=="#),
            ("Ab3+xY/9zQkLmN0pQ==", r#"Ab3+xY/9zQkLmN0pQ\u003d\u003d"#),
            ("Ab3+xY/9zQkLmN0pQ==", r#"Ab3+xY\/9zQkLmN0pQ=="#),
            ("tok'en=abc<d", r#"tok'en=abc\u003cd"#),
        ] {
            let mut s = Scrub::default();
            s.add(value.as_bytes());
            let body = format!(r#"{{"e":"{spelled}"}}"#);
            assert_eq!(s.text(body), r#"{"e":"[redacted]"}"#, "{spelled}");
        }
        // A value with nothing to escape has one spelling.
        let mut s = Scrub::default();
        s.add(b"sk-plain_123");
        assert_eq!(s.needles.len(), 1);
    }

    #[test]
    fn stream_scrub_catches_values_split_across_chunks() {
        let mut s = Scrub::default();
        s.add(b"SECRET");
        let mut stream = StreamScrub::new(s);
        let mut out = Vec::new();
        for chunk in [&b"data: SEC"[..], b"RET and SE", b"CRET", b"SECR", b"ET!"] {
            out.extend(stream.push(chunk));
        }
        out.extend(stream.finish());
        assert_eq!(
            String::from_utf8(out).unwrap(),
            "data: [redacted] and [redacted][redacted]!"
        );
        // Without values, chunks pass straight through.
        let mut plain = StreamScrub::new(Scrub::default());
        assert_eq!(plain.push(b"abc"), b"abc");
        assert!(plain.finish().is_empty());
    }
}
