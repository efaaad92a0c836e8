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

/// Take what is still unhandled, each as the line to log.
pub fn take(ctx: &Ctx<'_>, describe: impl Fn(&Value<'_>) -> String) -> Vec<String> {
    let noted = UNHANDLED.with(|u| std::mem::take(&mut *u.borrow_mut()));
    noted
        .into_iter()
        .filter_map(|(_, reason)| reason.restore(ctx).ok())
        .map(|reason| format!("Uncaught (in promise) {}", describe(&reason)))
        .collect()
}
