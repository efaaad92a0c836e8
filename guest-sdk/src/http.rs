//! Outbound HTTP to the hosts the actor's type allows (`allowed_hosts`).
//!
//! Header values may name a secret, `{{secret:NAME}}`: the host fills it in
//! after the request has left the sandbox, only over https to the secret's
//! own hosts, and replaces the value wherever it comes back. A fetch is a
//! side effect outside the turn's transaction: a turn run again after a
//! crash sends it again, with the same `{{idempotency-key}}`.
//!
//! ```no_run
//! use marmot_guest::http::Request;
//!
//! # fn run() -> marmot_guest::Result<()> {
//! let resp = Request::post("https://api.example.com/tickets")
//!     .header("authorization", "Bearer {{secret:TICKETS}}")
//!     .header("idempotency-key", "{{idempotency-key}}")
//!     .json(&serde_json::json!({ "title": "printer on fire" }))?
//!     .send()?;
//! let ticket: serde_json::Value = resp.json()?;
//! # Ok(()) }
//! ```

use serde::Serialize;
use serde::de::DeserializeOwned;

use crate::Result;
use crate::bindings::marmot::actor::http as host;

/// A request being built.
#[derive(Debug, Clone)]
pub struct Request(host::Request);

/// A response: status, headers, body.
#[derive(Debug, Clone)]
pub struct Response {
    /// Status code.
    pub status: u16,
    /// Headers, names in lower case.
    pub headers: Vec<(String, String)>,
    /// Body.
    pub body: Vec<u8>,
}

impl Request {
    /// A request with `method` to `url`.
    pub fn new(method: &str, url: &str) -> Self {
        Self(host::Request {
            method: method.to_owned(),
            url: url.to_owned(),
            headers: Vec::new(),
            body: None,
            timeout_ms: None,
        })
    }

    /// `GET url`.
    pub fn get(url: &str) -> Self {
        Self::new("GET", url)
    }

    /// `POST url`.
    pub fn post(url: &str) -> Self {
        Self::new("POST", url)
    }

    /// Add a header (its value may hold `{{secret:NAME}}` and
    /// `{{idempotency-key}}`).
    pub fn header(mut self, name: &str, value: &str) -> Self {
        self.0.headers.push((name.to_owned(), value.to_owned()));
        self
    }

    /// Set the body.
    pub fn body(mut self, body: impl Into<Vec<u8>>) -> Self {
        self.0.body = Some(body.into());
        self
    }

    /// Set a JSON body and its content type.
    pub fn json<T: Serialize + ?Sized>(self, value: &T) -> Result<Self> {
        let body = serde_json::to_vec(value)?;
        Ok(self.header("content-type", "application/json").body(body))
    }

    /// Give up after `ms` milliseconds (the node caps it).
    pub fn timeout_ms(mut self, ms: u32) -> Self {
        self.0.timeout_ms = Some(ms);
        self
    }

    /// Send it and read the whole response.
    pub fn send(self) -> Result<Response> {
        let r = host::fetch(&self.0)?;
        Ok(Response {
            status: r.status,
            headers: r.headers,
            body: r.body,
        })
    }

    /// Send it without waiting for the answer: it runs while the actor
    /// goes on, beside any others sent so; [`Pending::wait`] takes its
    /// answer. One still under way when the turn ends is cancelled.
    pub fn start(self) -> Result<Pending> {
        Ok(Pending(host::start(&self.0)?))
    }

    /// Send it and read the body as it arrives (server-sent events, large
    /// downloads): `read` the returned stream until it gives `None`.
    pub fn send_streaming(self) -> Result<host::StreamedResponse> {
        Ok(host::fetch_stream(&self.0)?)
    }
}

/// A request sent with [`Request::start`], its answer not yet taken.
#[derive(Debug)]
#[must_use = "a started fetch is cancelled at the end of the turn unless waited for"]
pub struct Pending(u32);

impl Pending {
    /// Wait for the answer (at once if it is in).
    pub fn wait(self) -> Result<Response> {
        let r = host::finish(self.0)?;
        Ok(Response {
            status: r.status,
            headers: r.headers,
            body: r.body,
        })
    }
}

/// Send every request at once and wait for all the answers, in the
/// requests' order: as long as the slowest one, not all of them in turn.
///
/// ```no_run
/// use marmot_guest::http::{Request, send_all};
///
/// # fn run() -> marmot_guest::Result<()> {
/// let pages = send_all(vec![
///     Request::get("https://api.example.com/a"),
///     Request::get("https://api.example.com/b"),
/// ])?;
/// for page in pages {
///     let page = page?;
/// }
/// # Ok(()) }
/// ```
///
/// A request refused before it was sent (a host not allowed) fails the
/// call; an answer that failed (a timeout) is its own `Err`.
pub fn send_all(requests: Vec<Request>) -> Result<Vec<Result<Response>>> {
    let started: Vec<Pending> = requests
        .into_iter()
        .map(Request::start)
        .collect::<Result<_>>()?;
    Ok(started.into_iter().map(Pending::wait).collect())
}

impl Response {
    /// The body as JSON.
    pub fn json<T: DeserializeOwned>(&self) -> Result<T> {
        Ok(serde_json::from_slice(&self.body)?)
    }

    /// The body as text (invalid UTF-8 replaced).
    pub fn text(&self) -> String {
        String::from_utf8_lossy(&self.body).into_owned()
    }

    /// A header's value (`name` in lower case).
    pub fn header(&self, name: &str) -> Option<&str> {
        self.headers
            .iter()
            .find(|(k, _)| k == name)
            .map(|(_, v)| v.as_str())
    }
}
