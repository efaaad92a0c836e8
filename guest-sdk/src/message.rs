use serde::{Serialize, de::DeserializeOwned};

use crate::Result;
use crate::bindings::marmot::actor::types as wit;

/// A message delivered to [`Actor::on_message`](crate::Actor::on_message).
#[derive(Debug, Clone)]
pub struct Message {
    /// The message id; stable across retries of a durable message.
    pub id: String,
    /// The raw body.
    pub body: Vec<u8>,
    /// The sender's content type, if any.
    pub content_type: Option<String>,
}

impl Message {
    /// Parse the body as JSON.
    pub fn json<T: DeserializeOwned>(&self) -> Result<T> {
        Ok(serde_json::from_slice(&self.body)?)
    }

    /// Parse the body as JSON, or return `T::default()` when the body is empty.
    pub fn json_or_default<T: DeserializeOwned + Default>(&self) -> Result<T> {
        if self.body.iter().all(u8::is_ascii_whitespace) {
            Ok(T::default())
        } else {
            self.json()
        }
    }

    /// The body as UTF-8 text (lossy).
    pub fn text(&self) -> String {
        String::from_utf8_lossy(&self.body).into_owned()
    }
}

impl From<wit::Message> for Message {
    fn from(m: wit::Message) -> Self {
        Self {
            id: m.id,
            body: m.body,
            content_type: m.content_type,
        }
    }
}

/// The answer to a message.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Reply {
    /// HTTP status the caller sees.
    pub status: u16,
    /// The body.
    pub body: Vec<u8>,
    /// The content type; `application/json` when `None`.
    pub content_type: Option<String>,
}

impl Reply {
    /// A 200 reply carrying `value` as JSON.
    pub fn json<T: Serialize + ?Sized>(value: &T) -> Result<Self> {
        Ok(Self {
            status: 200,
            body: serde_json::to_vec(value)?,
            content_type: Some("application/json".into()),
        })
    }

    /// A 200 reply carrying plain text.
    pub fn text(text: impl Into<String>) -> Self {
        Self {
            status: 200,
            body: text.into().into_bytes(),
            content_type: Some("text/plain; charset=utf-8".into()),
        }
    }

    /// An empty 204 reply.
    pub fn empty() -> Self {
        Self {
            status: 204,
            body: Vec::new(),
            content_type: None,
        }
    }

    /// The same reply with another HTTP status (for example 400 or 404).
    ///
    /// A non-2xx status is still a successful turn: its writes commit.
    pub fn with_status(mut self, status: u16) -> Self {
        self.status = status;
        self
    }
}

impl From<Reply> for wit::Reply {
    fn from(r: Reply) -> Self {
        Self {
            status: r.status,
            body: r.body,
            content_type: r.content_type,
        }
    }
}
