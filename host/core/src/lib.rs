//! The leaves every Marmot host crate builds on: wall-clock time as the
//! node sees it ([`clock`]), the names users choose and their validation
//! ([`ids`]), JSON read as the client meant it ([`json`]) and checked
//! against a schema ([`schema`]), the wait an HTTP response asks for
//! ([`http`]), one log line per interval for failures that repeat
//! ([`throttle`]), and the settings of the node and of actor types
//! ([`config`]). Nothing here knows about storage, sandboxes or actors.

pub mod clock;
pub mod config;
pub mod http;
pub mod ids;
pub mod json;
pub mod schema;
pub mod throttle;
