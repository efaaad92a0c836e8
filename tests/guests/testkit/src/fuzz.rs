//! Random host calls straight through the raw WIT bindings (no SDK
//! wrappers to tidy the arguments): every import, random arguments, a
//! deterministic sequence per seed. The host must answer each with a value
//! or an error, never a panic or a wrong trap.

use marmot_guest::bindings::marmot::actor::{
    actors, alarms, events, files, http, inputs, js, log, model, state,
};
use serde_json::{Value, json};

/// xorshift64*: small, deterministic, good enough to pick arguments.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        let mut x = self.0;
        x ^= x >> 12;
        x ^= x << 25;
        x ^= x >> 27;
        self.0 = x;
        x.wrapping_mul(0x2545_f491_4f6c_dd1d)
    }

    fn below(&mut self, n: u64) -> u64 {
        self.next() % n.max(1)
    }

    fn pick<'a>(&mut self, items: &[&'a str]) -> &'a str {
        items[self.below(items.len() as u64) as usize]
    }

    /// Strings a host must not trust: empty, huge, control characters,
    /// traversal, unicode, JSON-ish, look-alikes of real names.
    fn string(&mut self) -> String {
        match self.below(12) {
            0 => String::new(),
            1 => "a".repeat(self.below(70_000) as usize),
            2 => "../../etc/passwd".into(),
            3 => "outputs/../../x".into(),
            4 => "\0\u{1}\r\n\t".into(),
            5 => "ünïcødé/🦫/ключ".into(),
            6 => "{\"messages\":[{\"role\":\"user\",\"content\":\"hi\"}]}".into(),
            7 => self
                .pick(&["kit", "counter", "fuzz", "KIT", "k it", "marmot"])
                .into(),
            8 => "/".repeat(self.below(300) as usize),
            9 => format!("{}", self.next()),
            10 => (0..self.below(40))
                .map(|_| char::from_u32(self.below(0x11_0000) as u32).unwrap_or('?'))
                .collect(),
            _ => format!("k{}", self.below(20)),
        }
    }

    fn bytes(&mut self) -> Vec<u8> {
        match self.below(5) {
            0 => Vec::new(),
            1 => vec![0xff; self.below(2_000_000) as usize],
            2 => b"{\"op\":\"get\",\"key\":\"n\"}".to_vec(),
            _ => (0..self.below(300)).map(|_| self.next() as u8).collect(),
        }
    }

    fn opt<T>(&mut self, f: impl FnOnce(&mut Self) -> T) -> Option<T> {
        (self.below(2) == 0).then(|| f(self))
    }
}

/// Make `calls` random host calls from `seed`; returns how many returned a
/// value and how many an error, per interface.
pub fn run(seed: u64, calls: u32) -> Value {
    let mut rng = Rng(seed | 1);
    let mut tally = std::collections::BTreeMap::<&str, [u32; 2]>::new();
    let mut count = |name: &'static str, ok: bool| {
        tally.entry(name).or_default()[usize::from(!ok)] += 1;
    };
    for _ in 0..calls {
        match rng.below(19) {
            0 => count("state.get", state::get(&rng.string()).is_some()),
            1 => {
                let (k, v) = (rng.string(), rng.bytes());
                count("state.set", state::set(&k, &v).is_ok())
            }
            2 => count("state.delete", state::delete(&rng.string())),
            3 => {
                let (prefix, after) = (rng.string(), rng.opt(Rng::string));
                let limit = rng.next() as u32;
                state::list(&prefix, after.as_deref(), limit);
                count("state.list", true)
            }
            4 => {
                let (kind, data) = (rng.string(), rng.bytes());
                count("events.emit", events::emit(&kind, &data).is_ok())
            }
            5 => {
                let schedule = match rng.below(3) {
                    0 => alarms::Schedule::At(rng.next()),
                    1 => alarms::Schedule::After(rng.next()),
                    _ => alarms::Schedule::Cron(alarms::Cron {
                        expr: rng
                            .pick(&[
                                "*/5 * * * *",
                                "61 * * * *",
                                "",
                                "@yearly",
                                "* * * * * * * *",
                            ])
                            .into(),
                        tz: rng.opt(|r| {
                            r.pick(&["Europe/Berlin", "Mars/Olympus", "", "UTC+99"])
                                .into()
                        }),
                    }),
                };
                let (name, payload) = (rng.string(), rng.bytes());
                count(
                    "alarms.set",
                    alarms::set(&name, &schedule, &payload).is_ok(),
                )
            }
            6 => count("alarms.cancel", alarms::cancel(&rng.string()).is_ok()),
            7 => count("alarms.list", alarms::list().is_ok()),
            8 => {
                let req = inputs::InputRequest {
                    kind: rng.string(),
                    prompt: rng.string(),
                    schema: rng.opt(|r| {
                        r.pick(&["{\"type\":\"object\"}", "{", "{\"type\":\"nope\"}", "[]"])
                            .into()
                    }),
                    expires_in_ms: rng.opt(Rng::next),
                };
                count("inputs.request", inputs::request(&req).is_ok())
            }
            9 => {
                let (ty, id, body) = (rng.string(), rng.string(), rng.bytes());
                count("actors.call", actors::call(&ty, &id, &body).is_ok())
            }
            10 => {
                let (ty, id, body) = (rng.string(), rng.string(), rng.bytes());
                count("actors.send", actors::send(&ty, &id, &body).is_ok())
            }
            11 | 12 => {
                let req = http::Request {
                    method: rng.pick(&["GET", "POST", "", "G E T", "CONNECT"]).into(),
                    url: rng
                        .pick(&[
                            "http://169.254.169.254/latest/meta-data",
                            "http://127.0.0.1:1/",
                            "https://example.invalid/",
                            "file:///etc/passwd",
                            "not a url",
                            "http://[::1]:1/",
                        ])
                        .into(),
                    headers: (0..rng.below(4))
                        .map(|_| (rng.string(), rng.string()))
                        .collect(),
                    body: rng.opt(Rng::bytes),
                    timeout_ms: rng.opt(|r| r.next() as u32),
                };
                if rng.below(2) == 0 {
                    count("http.fetch", http::fetch(&req).is_ok())
                } else {
                    count("http.fetch-stream", http::fetch_stream(&req).is_ok())
                }
            }
            13 => count("model.chat", model::chat(&rng.string()).is_ok()),
            14 => count("files.read", files::read(&rng.string()).is_ok()),
            15 => {
                let (path, data) = (rng.string(), rng.bytes());
                count("files.write", files::write(&path, &data).is_ok())
            }
            16 => {
                let ok = if rng.below(2) == 0 {
                    files::list(&rng.string()).is_ok()
                } else {
                    files::delete(&rng.string()).is_ok()
                };
                count("files.list/delete", ok)
            }
            17 => {
                let level = match rng.below(5) {
                    0 => log::Level::Trace,
                    1 => log::Level::Debug,
                    2 => log::Level::Info,
                    3 => log::Level::Warn,
                    _ => log::Level::Error,
                };
                let fields: Vec<(String, String)> = (0..rng.below(5))
                    .map(|_| (rng.string(), rng.string()))
                    .collect();
                log::log(level, &rng.string(), &fields);
                count("log", true)
            }
            _ => {
                let req = js::EvalRequest {
                    code: rng
                        .pick(&[
                            "1 + 1",
                            "while (true) {}",
                            "throw new Error('x')",
                            "(",
                            "marmot.state.get('n')",
                        ])
                        .into(),
                    tools: (0..rng.below(3)).map(|_| rng.string()).collect(),
                    timeout_ms: rng.opt(|r| r.below(200) as u32),
                };
                count("js.eval", js::eval(&req).is_ok())
            }
        }
    }
    json!(
        tally
            .into_iter()
            .map(|(k, [ok, err])| (k.to_owned(), json!({"ok": ok, "err": err})))
            .collect::<serde_json::Map<_, _>>()
    )
}
