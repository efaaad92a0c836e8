//! The JavaScript runtime of one sandbox: set-up, the actor module, turns,
//! and scripts.

use std::cell::RefCell;
use std::time::Duration;

use rquickjs::context::EvalOptions;
use rquickjs::function::This;
use rquickjs::loader::{BuiltinLoader, BuiltinResolver};
use rquickjs::promise::PromiseState;
use rquickjs::{Context, Ctx, Function, Module, Object, Persistent, Runtime, Value};

use crate::bindings::PreloadFailure;
use crate::bindings::exports::marmot::actor::js_runtime::EvalOutcome;
use crate::bindings::marmot::actor::js_module;
use crate::bindings::marmot::actor::types::{
    Alarm, Context as TurnContext, InputAnswer, Message, Reply, Webhook,
};
use crate::describe::{describe_error, well_formed};
use crate::host_api::{self, CONSOLE, ConsoleSink};
use crate::rejections;

const PRELUDE: &str = include_str!("prelude.js");

/// Run once before the snapshot is taken, then collected: a handler's
/// usual work (parse a module's functions, build and serialize objects,
/// settle a promise). See "What a sandbox copies of the snapshot" in
/// docs/design.md.
const WARMUP: &str = r#"(() => {
  const handlers = {
    onMessage(body, ctx) {
      const by = body?.by ?? 1;
      const o = { n: by, list: [1, 2, 3].map((x) => x * by), text: `n=${by}`, id: ctx.id };
      return JSON.parse(JSON.stringify(o));
    },
  };
  for (let i = 0; i < 4; i++) handlers.onMessage({ by: i }, { id: "w" });
  Promise.resolve(1).then((v) => v + 1);
})();"#;

/// The `marmot` module re-exports what the prelude built.
const MARMOT_MODULE: &str = "const m = globalThis.__marmot_module;\n\
    export const { state, events, alarms, inputs, actors, files, model, log } = m;\n\
    export default m;\n";

/// QuickJS's own stack limit: deep recursion becomes a catchable
/// `RangeError` well before the host's wasm stack limit traps.
const MAX_JS_STACK: usize = 256 * 1024;
/// Bytes allocated between cycle collections. Reference counting frees most
/// garbage at once; the cycle collector walks (and so writes to) every
/// object, which copies the snapshot's shared pages into each sandbox. A
/// higher threshold keeps short turns from ever running it.
const GC_THRESHOLD: usize = 2 << 20;
/// Largest reply or eval result.
const MAX_RESULT_BYTES: usize = 1 << 20;

thread_local! {
    static ENGINE: RefCell<Option<Engine>> = const { RefCell::new(None) };
    /// Whether the module's default export has an `onInput` handler (set
    /// when the module is loaded).
    static ON_INPUT: std::cell::Cell<bool> = const { std::cell::Cell::new(false) };
    /// Whether it has an `onAlarm` handler.
    static ON_ALARM: std::cell::Cell<bool> = const { std::cell::Cell::new(false) };
    /// While [`Engine::preload`] runs the module's top level: `Some`, with
    /// the first thing it did that only a turn may do.
    static PRELOADING: RefCell<Option<Option<&'static str>>> = const { RefCell::new(None) };
    /// Whether this preload is the host's check of a top level that the
    /// snapshot preload refused for its randomness or timers (see
    /// [`PRELOAD_CHECK_ENV`]).
    static CHECKING: std::cell::Cell<bool> = const { std::cell::Cell::new(false) };
}

/// Set (to anything) in the environment of a preload that only checks
/// that the module's top level runs to its end, and is never snapshotted:
/// randomness and timers, which a snapshot must not freeze, work there as
/// in a turn, so a top level that draws a random number and then throws
/// is refused at deploy instead of failing every actor's first turn. The
/// `marmot` API stays refused (no actor, and it may have effects).
pub const PRELOAD_CHECK_ENV: &str = "MARMOT_PRELOAD_CHECK";

/// The handlers a module's default export may have; a turn of each kind
/// calls its own.
const HANDLERS: [&str; 5] = ["onMessage", "onAlarm", "onWebhook", "onInput", "onUpgrade"];

/// Whether the module's top level is being preloaded; if so, `what` is
/// recorded as the reason the preload fails (the caller then throws).
/// Randomness and timers must not be frozen into a snapshot every actor of
/// the type starts from: each sandbox would draw the same numbers.
pub fn refused_in_preload(what: &'static str) -> bool {
    if CHECKING.with(std::cell::Cell::get) {
        return false;
    }
    PRELOADING.with(|p| match &mut *p.borrow_mut() {
        Some(first) => {
            first.get_or_insert(what);
            true
        }
        None => false,
    })
}

/// Whether the module can take an input request's answer: an input it
/// asks for without `onInput` could never settle (an answer was a 500 and
/// the request stayed pending; its expiry failed for ever).
pub fn takes_inputs() -> bool {
    ON_INPUT.with(std::cell::Cell::get)
}

/// Whether the module can run an alarm: one set without `onAlarm` failed
/// each of its attempts when due, long after the turn that set it.
pub fn takes_alarms() -> bool {
    ON_ALARM.with(std::cell::Cell::get)
}

/// Set up the runtime (idempotent). Runs inside `wizer-initialize` so the
/// snapshot already holds an initialized engine.
pub fn init() {
    ENGINE.with(|e| {
        if e.borrow().is_none() {
            *e.borrow_mut() = Some(Engine::new());
        }
    });
}

#[cfg(target_family = "wasm")]
#[allow(
    unsafe_code,
    reason = "Marmot's addition to QuickJS (vendor/rquickjs-sys)"
)]
unsafe extern "C" {
    /// Whether the snapshot is sealed: while it is, the reference counts of
    /// what was allocated before the seal stay untouched (immortal snapshot
    /// objects, `vendor/rquickjs-sys/MARMOT.md`).
    safe fn JS_SetSnapshotSealed(sealed: bool);
}

/// Build on the snapshot again (`wizer-preload`): what is allocated from now
/// on joins it, and its objects count references as usual until sealed.
#[cfg(target_family = "wasm")]
pub fn unseal_snapshot() {
    JS_SetSnapshotSealed(false);
}

/// The snapshot is about to be taken: fill the heap's free chunks
/// ([`seal_heap`]) if `fill`, and from now on leave the reference counts of
/// everything allocated so far alone, so that a sandbox's turns do not write
/// to the snapshot's pages only to count references to its objects (each
/// page written is copied into the sandbox).
#[cfg(target_family = "wasm")]
pub fn seal_snapshot(fill: bool) {
    if fill {
        seal_heap();
    }
    JS_SetSnapshotSealed(true);
}

/// Use up every free chunk of the heap before the snapshot is taken, so
/// that a sandbox's allocations come from memory past the snapshot instead
/// of from chunks freed during start-up, which lie scattered over the
/// snapshot's pages: each one a turn reused copied a whole shared page into
/// the sandbox. The chunks are leaked on purpose; they are part of the
/// snapshot, mapped and shared by every sandbox, so they cost no sandbox
/// anything. Stops at the first allocation that had to grow the memory.
#[cfg(target_family = "wasm")]
fn seal_heap() {
    use std::alloc::{Layout, alloc, dealloc};
    // The smallest chunk wasi-libc's malloc hands out.
    let layout = Layout::from_size_align(16, 8).expect("valid layout");
    let pages = core::arch::wasm32::memory_size(0);
    for _ in 0..(1 << 20) {
        // SAFETY: a non-zero-sized layout; the block is leaked or freed
        // with the same layout.
        #[allow(unsafe_code, reason = "raw allocations to fill the heap's free chunks")]
        unsafe {
            let p = alloc(layout);
            if p.is_null() {
                return;
            }
            if core::arch::wasm32::memory_size(0) != pages {
                dealloc(p, layout);
                return;
            }
        }
    }
}

/// Run `f` on this sandbox's engine.
pub fn with<R>(f: impl FnOnce(&mut Engine) -> R) -> R {
    init();
    ENGINE.with(|e| f(e.borrow_mut().as_mut().expect("engine initialized")))
}

pub struct Engine {
    // Dropped before the runtime: fields drop in declaration order.
    handlers: Option<Persistent<Object<'static>>>,
    /// The prelude's `__marmot_turn` and `__marmot_timers.clear`, looked up
    /// once (both are non-writable globals): every turn calls them.
    make_turn: Persistent<Function<'static>>,
    clear_timers: Persistent<Function<'static>>,
    context: Context,
    _runtime: Runtime,
}

impl Engine {
    fn new() -> Self {
        let runtime = Runtime::new().expect("QuickJS runtime");
        rejections::track(&runtime);
        runtime.set_max_stack_size(MAX_JS_STACK);
        runtime.set_gc_threshold(GC_THRESHOLD);
        runtime.set_loader(
            BuiltinResolver::default().with_module("marmot"),
            BuiltinLoader::default().with_module("marmot", MARMOT_MODULE),
        );
        let context = Context::full(&runtime).expect("QuickJS context");
        let (make_turn, clear_timers) = context.with(|ctx| {
            host_api::install(&ctx).expect("host API");
            let opts = script_options("marmot:prelude");
            if let Err(e) = ctx.eval_with_options::<(), _>(PRELUDE, opts) {
                panic!("prelude failed: {}", describe_error(&ctx, e));
            }
            let make_turn: Function<'_> = ctx.globals().get("__marmot_turn").expect("prelude");
            let clear: Function<'_> = timers(&ctx)
                .and_then(|t| t.get("clear").map_err(|e| describe_error(&ctx, e)))
                .expect("prelude");
            (
                Persistent::save(&ctx, make_turn),
                Persistent::save(&ctx, clear),
            )
        });
        // Warm up: what a first turn would grow (the parser's buffers, the
        // atom and shape tables) grows here, once, in the snapshot that
        // every sandbox shares, instead of in each sandbox's own pages.
        context.with(|ctx| {
            if let Err(e) = ctx.eval_with_options::<(), _>(WARMUP, script_options("marmot:warmup"))
            {
                panic!("warm-up failed: {}", describe_error(&ctx, e));
            }
            run_jobs(&ctx).expect("warm-up jobs");
            rejections::clear();
        });
        // Collect what start-up left behind so the snapshot is compact.
        runtime.run_gc();
        Self {
            handlers: None,
            make_turn,
            clear_timers,
            context,
            _runtime: runtime,
        }
    }

    /// Load the module and run its top level now, in `wizer-preload`, so
    /// that the snapshot taken next holds it evaluated: every sandbox of the
    /// type version starts with its module loaded, and a wake neither parses
    /// nor evaluates it. [`PreloadFailure::Refused`] if the top level does what only
    /// a turn may (randomness, timers; the `marmot` API traps outside a
    /// turn): such a module is loaded by each sandbox's first turn, as
    /// before. [`PreloadFailure::Invalid`] if no turn could run it: the top level
    /// threw, or the default export has no handler.
    #[cfg_attr(
        not(target_family = "wasm"),
        allow(dead_code, reason = "reached only through the wasm export")
    )]
    pub fn preload(&mut self) -> Result<(), PreloadFailure> {
        PRELOADING.with(|p| *p.borrow_mut() = Some(None));
        CHECKING.with(|c| c.set(std::env::var_os(PRELOAD_CHECK_ENV).is_some()));
        let context = self.context.clone();
        let loaded = context.with(|ctx| {
            let handlers = self.handlers(&ctx)?;
            let mut any = false;
            for name in HANDLERS {
                // A getter that throws is what the author should read about,
                // not "none of the handlers".
                let handler = handlers.get::<_, Value<'_>>(name).map_err(|e| {
                    format!(
                        "reading `{name}` of the default export threw: {}",
                        describe_error(&ctx, e)
                    )
                })?;
                // (`onMessage: 5` read as "none of the handlers".)
                if !handler.is_function() && !handler.is_undefined() && !handler.is_null() {
                    let what = match handler.type_name() {
                        "int" | "float" => "number",
                        other => other,
                    };
                    return Err(format!(
                        "`{name}` of the default export must be a function, not a {what}"
                    ));
                }
                any |= handler.is_function();
            }
            if any {
                Ok(())
            } else {
                Err(format!(
                    "the default export has none of the handlers {}",
                    HANDLERS.join(", ")
                ))
            }
        });
        let refused = PRELOADING.with(|p| p.borrow_mut().take()).flatten();
        if let Some(what) = refused {
            return Err(PreloadFailure::Refused(format!(
                "the module's top level uses {what}"
            )));
        }
        loaded.map_err(PreloadFailure::Invalid)?;
        // Collect what the parse left behind so the snapshot is compact.
        self._runtime.run_gc();
        Ok(())
    }

    /// The module's default export, loading the module on first use.
    fn handlers<'js>(&mut self, ctx: &Ctx<'js>) -> Result<Object<'js>, String> {
        if let Some(h) = &self.handlers {
            return h.clone().restore(ctx).map_err(|e| describe_error(ctx, e));
        }
        let (name, source) = js_module::source();
        let (module, promise) = Module::declare(ctx.clone(), name.as_str(), source)
            .and_then(|m| m.eval())
            .map_err(|e| describe_error(ctx, e))?;
        settle(ctx, promise.into_value(), "the module's top level")?;
        let ns = module.namespace().map_err(|e| describe_error(ctx, e))?;
        let default: Value<'js> = ns.get("default").map_err(|e| describe_error(ctx, e))?;
        let Some(obj) = default.as_object().cloned() else {
            return Err(format!(
                "module `{name}` must `export default` an object with handlers such as onMessage"
            ));
        };
        let exports = |name| {
            obj.get::<_, Value<'js>>(name)
                .is_ok_and(|f| f.is_function())
        };
        ON_INPUT.with(|c| c.set(exports("onInput")));
        ON_ALARM.with(|c| c.set(exports("onAlarm")));
        self.handlers = Some(Persistent::save(ctx, obj.clone()));
        Ok(obj)
    }

    /// Call `handler(arg, ctx)` on the module and wait for it to settle.
    fn call<'js>(
        &mut self,
        ctx: &Ctx<'js>,
        handler: &str,
        turn: &TurnContext,
        arg: Value<'js>,
        required: bool,
    ) -> Result<Value<'js>, String> {
        let handlers = self.handlers(ctx)?;
        let f: Value<'js> = handlers.get(handler).map_err(|e| describe_error(ctx, e))?;
        let Some(f) = f.as_function().cloned() else {
            if required {
                return Err(format!("the module exports no `{handler}` handler"));
            }
            return Ok(Value::new_undefined(ctx.clone()));
        };
        let jsctx = self
            .turn_context(ctx, turn)
            .map_err(|e| describe_error(ctx, e))?;
        CONSOLE.with(|c| *c.borrow_mut() = ConsoleSink::Turn);
        let result = f
            .call::<_, Value<'js>>((This(handlers), arg, jsctx))
            .map_err(|e| describe_error(ctx, e));
        let settled = result.and_then(|v| settle(ctx, v, "the handler's promise"));
        if host_api::take_timers_touched() {
            self.clear_timers(ctx);
        }
        rejections::report(ctx);
        settled
    }

    /// The handlers' context argument: `{ type, id, version, messageId }`.
    fn turn_context<'js>(
        &self,
        ctx: &Ctx<'js>,
        turn: &TurnContext,
    ) -> rquickjs::Result<Value<'js>> {
        self.make_turn.clone().restore(ctx)?.call((
            turn.actor_type.as_str(),
            turn.id.as_str(),
            turn.version,
            turn.turn_id.as_str(),
        ))
    }

    /// Drop the timers a turn left pending.
    fn clear_timers(&self, ctx: &Ctx<'_>) {
        if let Ok(clear) = self.clear_timers.clone().restore(ctx) {
            let _ = clear.call::<_, ()>(());
        }
    }

    pub fn on_message(&mut self, turn: TurnContext, msg: Message) -> Result<Reply, String> {
        let context = self.context.clone();
        context.with(|ctx| {
            let body = message_body(&ctx, &msg)?;
            let v = self.call(&ctx, "onMessage", &turn, body, true)?;
            reply(&ctx, v)
        })
    }

    pub fn on_alarm(&mut self, turn: TurnContext, alarm: Alarm) -> Result<(), String> {
        let context = self.context.clone();
        context.with(|ctx| {
            let o = Object::new(ctx.clone()).map_err(|e| describe_error(&ctx, e))?;
            let payload = parse_or_text(&ctx, &alarm.payload)?;
            (|| -> rquickjs::Result<()> {
                o.set("name", alarm.name)?;
                o.set("payload", payload)?;
                o.set("dueAt", alarm.due_at as f64)?;
                Ok(())
            })()
            .map_err(|e| describe_error(&ctx, e))?;
            self.call(&ctx, "onAlarm", &turn, o.into_value(), true)
                .map(drop)
        })
    }

    pub fn on_webhook(&mut self, turn: TurnContext, req: Webhook) -> Result<(), String> {
        let context = self.context.clone();
        context.with(|ctx| {
            let o = Object::new(ctx.clone()).map_err(|e| describe_error(&ctx, e))?;
            let body = parse_or_text(&ctx, &req.body)?;
            (|| -> rquickjs::Result<()> {
                let headers = Object::new(ctx.clone())?;
                for (k, v) in req.headers {
                    headers.set(k, v)?;
                }
                o.set("name", req.name)?;
                o.set("headers", headers)?;
                o.set("body", body)?;
                Ok(())
            })()
            .map_err(|e| describe_error(&ctx, e))?;
            self.call(&ctx, "onWebhook", &turn, o.into_value(), true)
                .map(drop)
        })
    }

    pub fn on_input(&mut self, turn: TurnContext, input: InputAnswer) -> Result<(), String> {
        let context = self.context.clone();
        context.with(|ctx| {
            let o = Object::new(ctx.clone()).map_err(|e| describe_error(&ctx, e))?;
            let response = if input.expired {
                Value::new_undefined(ctx.clone())
            } else {
                parse_or_text(&ctx, &input.response)?
            };
            (|| -> rquickjs::Result<()> {
                o.set("id", input.id)?;
                o.set("kind", input.kind)?;
                o.set("response", response)?;
                o.set("expired", input.expired)?;
                Ok(())
            })()
            .map_err(|e| describe_error(&ctx, e))?;
            self.call(&ctx, "onInput", &turn, o.into_value(), true)
                .map(drop)
        })
    }

    pub fn on_upgrade(&mut self, turn: TurnContext, from: u32) -> Result<(), String> {
        let context = self.context.clone();
        context.with(|ctx| {
            let from = Value::new_number(ctx.clone(), f64::from(from));
            self.call(&ctx, "onUpgrade", &turn, from, false).map(drop)
        })
    }

    /// Compile `source` as a module without running it.
    pub fn check(&mut self, name: &str, source: &str) -> Result<(), String> {
        let context = self.context.clone();
        context.with(|ctx| {
            Module::declare(ctx.clone(), name, source)
                .map(drop)
                .map_err(|e| describe_error(&ctx, e))
        })
    }

    /// [`Self::eval`]'s script in `ctx`: its result as JSON (`None`: no
    /// value), or why it failed.
    fn eval_in(&mut self, ctx: &Ctx<'_>, code: &str) -> Result<Option<String>, String> {
        let mut opts = script_options("eval.js");
        opts.promise = true;
        let v = ctx
            .eval_with_options::<Value<'_>, _>(code, opts)
            .map_err(|e| describe_error(ctx, e))?;
        // With top-level await the script's value arrives as `{ value }`.
        let wrapped = settle(ctx, v, "the script")?;
        let value: Value<'_> = match wrapped.as_object() {
            Some(o) => o.get("value").map_err(|e| describe_error(ctx, e))?,
            None => wrapped,
        };
        let value = settle(ctx, value, "the script's result")?;
        self.clear_timers(ctx);
        if value.is_undefined() {
            return Ok(None);
        }
        json_text(ctx, value, "the script's result").map(Some)
    }

    /// Run a script; its last expression (awaited if a promise) is the result.
    pub fn eval(&mut self, code: &str) -> EvalOutcome {
        CONSOLE.with(|c| {
            *c.borrow_mut() = ConsoleSink::Eval {
                lines: Vec::new(),
                bytes: 0,
                dropped: 0,
            }
        });
        let context = self.context.clone();
        let outcome: Result<Option<String>, String> = context.with(|ctx| {
            let outcome = self.eval_in(&ctx, code);
            rejections::report(&ctx);
            outcome
        });
        let (logs, dropped) =
            CONSOLE.with(
                |c| match std::mem::replace(&mut *c.borrow_mut(), ConsoleSink::Turn) {
                    ConsoleSink::Eval { lines, dropped, .. } => (lines, dropped),
                    ConsoleSink::Turn => (Vec::new(), 0),
                },
            );
        let mut logs = logs;
        if dropped > 0 {
            logs.push(format!(
                "[marmot] {dropped} console line(s) dropped: output is capped at {} lines / {} bytes",
                host_api::MAX_EVAL_LOG_LINES,
                host_api::MAX_EVAL_LOG_BYTES
            ));
        }
        match outcome {
            Ok(result) => EvalOutcome {
                result,
                logs,
                error: None,
            },
            Err(error) => EvalOutcome {
                result: None,
                logs,
                error: Some(error),
            },
        }
    }
}

fn script_options(name: &str) -> EvalOptions {
    let mut opts = EvalOptions::default();
    opts.global = true;
    opts.strict = false;
    opts.backtrace_barrier = true;
    opts.filename = Some(name.to_owned());
    opts
}

/// The parsed JSON value when the request is JSON, else a string;
/// `undefined` for an empty body. A body declared JSON must parse; one
/// declared `text/plain` stays text; anything else (no content type, or
/// curl's default form encoding) is JSON when it parses as JSON.
fn message_body<'js>(ctx: &Ctx<'js>, msg: &Message) -> Result<Value<'js>, String> {
    if msg.body.iter().all(u8::is_ascii_whitespace) {
        return Ok(Value::new_undefined(ctx.clone()));
    }
    let is_json = msg.content_type.as_deref().and_then(|c| {
        let c = c.to_ascii_lowercase();
        if c.contains("json") {
            Some(true)
        } else if c.starts_with("text/plain") {
            Some(false)
        } else {
            None
        }
    });
    let text = String::from_utf8_lossy(&msg.body).into_owned();
    match is_json {
        Some(false) => text_value(ctx, text),
        Some(true) => ctx.json_parse(text).map_err(|e| {
            format!(
                "the message body is not valid JSON: {}",
                describe_error(ctx, e)
            )
        }),
        None => match ctx.json_parse(text.clone()) {
            Ok(v) => Ok(v),
            Err(_) => {
                let _ = ctx.catch();
                text_value(ctx, text)
            }
        },
    }
}

fn parse_or_text<'js>(ctx: &Ctx<'js>, bytes: &[u8]) -> Result<Value<'js>, String> {
    let text = String::from_utf8_lossy(bytes).into_owned();
    match ctx.json_parse(text.clone()) {
        Ok(v) => Ok(v),
        Err(_) => {
            let _ = ctx.catch();
            text_value(ctx, text)
        }
    }
}

fn text_value<'js>(ctx: &Ctx<'js>, text: String) -> Result<Value<'js>, String> {
    rquickjs::String::from_str(ctx.clone(), &text)
        .map(|s| s.into_value())
        .map_err(|e| describe_error(ctx, e))
}

/// Strings reply as text; everything else as JSON.
fn reply<'js>(ctx: &Ctx<'js>, v: Value<'js>) -> Result<Reply, String> {
    if let Some(s) = v.as_string() {
        let s = well_formed(s).map_err(|e| describe_error(ctx, e))?;
        if s.len() > MAX_RESULT_BYTES {
            return Err(format!(
                "the reply exceeds the limit of {MAX_RESULT_BYTES} bytes"
            ));
        }
        return Ok(Reply {
            status: 200,
            body: s.into_bytes(),
            content_type: Some("text/plain; charset=utf-8".into()),
        });
    }
    let text = if v.is_undefined() {
        "null".to_owned()
    } else {
        json_text(ctx, v, "the reply")?
    };
    Ok(Reply {
        status: 200,
        body: text.into_bytes(),
        content_type: Some("application/json".into()),
    })
}

fn json_text<'js>(ctx: &Ctx<'js>, v: Value<'js>, what: &str) -> Result<String, String> {
    let text = match ctx.json_stringify(v) {
        Ok(Some(s)) => {
            crate::host_api::well_formed_json(s.to_string().map_err(|e| describe_error(ctx, e))?)
        }
        Ok(None) => {
            return Err(format!(
                "{what} is not JSON-serializable (a function or symbol?)"
            ));
        }
        Err(e) => {
            return Err(format!(
                "{what} is not JSON-serializable: {}",
                describe_error(ctx, e)
            ));
        }
    };
    if text.len() > MAX_RESULT_BYTES {
        return Err(format!(
            "{what} is {} bytes of JSON, over the limit of {MAX_RESULT_BYTES} bytes",
            text.len()
        ));
    }
    Ok(text)
}

/// Drive the job queue (and timers) until `v` — if it is a promise —
/// settles; its value, or its rejection as an error.
fn settle<'js>(ctx: &Ctx<'js>, v: Value<'js>, what: &str) -> Result<Value<'js>, String> {
    let Some(p) = v.as_promise().cloned() else {
        return Ok(v);
    };
    loop {
        run_jobs(ctx)?;
        match p.state() {
            PromiseState::Resolved => {
                return p
                    .result::<Value<'js>>()
                    .expect("resolved")
                    .map_err(|e| describe_error(ctx, e));
            }
            PromiseState::Rejected => {
                // Reported as the run's own error, not as unhandled.
                rejections::forget(ctx, p.as_value());
                return Err(match p.result::<Value<'js>>() {
                    Some(Err(e)) => describe_error(ctx, e),
                    _ => "the promise was rejected".to_owned(),
                });
            }
            PromiseState::Pending => {
                let next = timer_delay(ctx)?;
                // A fetch's answer, or the next timer, whichever comes first.
                if !wait_for_a_fetch(ctx, next)? {
                    if next < 0.0 {
                        return Err(format!(
                            "{what} never settles: it waits for something that cannot \
                             happen within the turn"
                        ));
                    }
                    if next > 0.0 {
                        std::thread::sleep(
                            Duration::try_from_secs_f64(next / 1000.0).unwrap_or(Duration::MAX),
                        );
                    }
                }
                fire_timers(ctx)?;
            }
        }
    }
}

fn run_jobs(ctx: &Ctx<'_>) -> Result<(), String> {
    while ctx.execute_pending_job() {}
    Ok(())
}

fn timers<'js>(ctx: &Ctx<'js>) -> Result<Object<'js>, String> {
    ctx.globals()
        .get::<_, Object<'js>>("__marmot_timers")
        .map_err(|e| describe_error(ctx, e))
}

fn timer_delay(ctx: &Ctx<'_>) -> Result<f64, String> {
    let next: Function<'_> = timers(ctx)?
        .get("next")
        .map_err(|e| describe_error(ctx, e))?;
    next.call::<_, f64>(()).map_err(|e| describe_error(ctx, e))
}

/// Wait up to `timeout_ms` (< 0: no limit) for a started fetch to answer
/// and settle its promise; false if no fetch is under way.
fn wait_for_a_fetch(ctx: &Ctx<'_>, timeout_ms: f64) -> Result<bool, String> {
    let fetches: Object<'_> = ctx
        .globals()
        .get("__marmot_fetches")
        .map_err(|e| describe_error(ctx, e))?;
    let wait: Function<'_> = fetches.get("wait").map_err(|e| describe_error(ctx, e))?;
    wait.call::<_, bool>((timeout_ms,))
        .map_err(|e| describe_error(ctx, e))
}

fn fire_timers(ctx: &Ctx<'_>) -> Result<(), String> {
    let fire: Function<'_> = timers(ctx)?
        .get("fire")
        .map_err(|e| describe_error(ctx, e))?;
    fire.call::<_, ()>(()).map_err(|e| describe_error(ctx, e))
}
