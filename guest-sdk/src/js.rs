//! Run model-written JavaScript in a child sandbox: its own CPU, memory
//! and time limits, and only the capabilities named in `tools` (`state`,
//! `events`, `files`, `http`, …), which it reaches through the global
//! `marmot`. It runs inside this turn: what it writes commits with the turn
//! if it succeeds, and nothing of it stays if it throws or hits a limit.
//!
//! ```no_run
//! # fn run() -> marmot_guest::Result<()> {
//! let out = marmot_guest::js::eval("marmot.state.get('n') * 2", &["state"])?;
//! match out.error {
//!     None => println!("{:?}", out.result),
//!     Some(e) => println!("the script failed: {e}"),
//! }
//! # Ok(()) }
//! ```

use crate::Result;
use crate::bindings::marmot::actor::js as host;

pub use host::EvalResult;

/// Run `code` (a script whose last expression, or awaited value, is the
/// result, as JSON text) with `tools`.
pub fn eval(code: &str, tools: &[&str]) -> Result<EvalResult> {
    eval_with(code, tools, None)
}

/// [`eval`] with at most `timeout_ms` of CPU and wall time.
pub fn eval_with(code: &str, tools: &[&str], timeout_ms: Option<u32>) -> Result<EvalResult> {
    let req = host::EvalRequest {
        code: code.to_owned(),
        tools: tools.iter().map(|t| (*t).to_owned()).collect(),
        timeout_ms,
    };
    Ok(host::eval(&req)?)
}
