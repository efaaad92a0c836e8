//! Promises rejected with nothing to handle them: `fetch(url)` without an
//! `await` whose request failed, a `.then` chain without a `.catch`. Such
//! a failure left no trace; now each one still unhandled when its turn (or
//! script) ends is logged as `console.error` would: `Uncaught (in promise)
//! …`, in the node's log for a turn, among the logs an eval returns.
//!
//! QuickJS reports a rejection without a handler when it happens, and
//! again when a handler is attached later (`Promise.reject(e)` and then
//! `.catch(…)`): the first report is only noted, the second takes it off,
//! and what is left when the run ends is reported. The reasons are shown
//! then, not from inside the engine's callback (showing one may run its
//! `toJSON`).

use std::cell::RefCell;

use rquickjs::{Ctx, Persistent, Runtime, Value};

use crate::describe::{describe_value, thrown};

/// The most noted at once (a loop rejecting millions keeps the first).
const MAX_NOTED: usize = 100;

/// A rejected promise and its reason.
type Noted = (Persistent<Value<'static>>, Persistent<Value<'static>>);

thread_local! {
    static UNHANDLED: RefCell<Vec<Noted>> = const { RefCell::new(Vec::new()) };
}

/// Have `runtime` note rejections nothing handles.
pub fn track(runtime: &Runtime) {
    runtime.set_host_promise_rejection_tracker(Some(Box::new(
        |ctx: Ctx<'_>, promise: Value<'_>, reason: Value<'_>, handled: bool| {
            if handled {
                forget(&ctx, &promise);
                return;
            }
            UNHANDLED.with(|u| {
                let mut u = u.borrow_mut();
                if u.len() < MAX_NOTED {
                    u.push((
                        Persistent::save(&ctx, promise),
                        Persistent::save(&ctx, reason),
                    ));
                }
            });
        },
    )));
}

/// `promise` has a handler after all (or is one the runtime waits on and
/// reports itself: a handler's own promise).
pub fn forget<'js>(ctx: &Ctx<'js>, promise: &Value<'js>) {
    UNHANDLED.with(|u| {
        u.borrow_mut().retain(|(p, _)| {
            p.clone()
                .restore(ctx)
                .map_or(true, |p: Value<'js>| &p != promise)
        });
    });
}

/// Log what is still unhandled as a run ends, as `console.error` would.
pub fn report(ctx: &Ctx<'_>) {
    let noted = UNHANDLED.with(|u| std::mem::take(&mut *u.borrow_mut()));
    for (_, reason) in noted {
        if let Ok(reason) = reason.restore(ctx) {
            let line = format!("Uncaught (in promise) {}", describe(&reason));
            crate::host_api::console_line("error", line);
        }
    }
}

/// Forget what is noted (the snapshot's warm-up: none of it is a run's).
pub fn clear() {
    UNHANDLED.with(|u| u.borrow_mut().clear());
}

/// A rejection's reason as text: an `Error` with its stack, else the value.
fn describe(v: &Value<'_>) -> String {
    if v.as_exception().is_some() {
        describe_value(v)
    } else {
        thrown(v)
    }
}
