use std::fmt;

use crate::HostError;

/// Why a handler failed. Returning it fails the turn: nothing the turn wrote
/// is committed, and a waiting caller gets a 500 carrying the message.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Error {
    message: String,
}

/// `Result` with [`Error`].
pub type Result<T, E = Error> = std::result::Result<T, E>;

impl Error {
    /// An error with a human-readable message.
    pub fn new(message: impl Into<String>) -> Self {
        Self {
            message: message.into(),
        }
    }

    /// The message.
    pub fn message(&self) -> &str {
        &self.message
    }
}

impl fmt::Display for Error {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.message)
    }
}

impl std::error::Error for Error {}

impl From<serde_json::Error> for Error {
    fn from(e: serde_json::Error) -> Self {
        Self::new(format!("invalid JSON: {e}"))
    }
}

impl From<HostError> for Error {
    fn from(e: HostError) -> Self {
        let (kind, msg) = match e {
            HostError::Unsupported(m) => ("unsupported", m),
            HostError::Invalid(m) => ("invalid", m),
            HostError::LimitExceeded(m) => ("limit exceeded", m),
            HostError::Denied(m) => ("denied", m),
            HostError::NotFound(m) => ("not found", m),
            HostError::Internal(m) => ("host error", m),
        };
        Self::new(format!("{kind}: {msg}"))
    }
}

impl From<&str> for Error {
    fn from(s: &str) -> Self {
        Self::new(s)
    }
}

impl From<String> for Error {
    fn from(s: String) -> Self {
        Self::new(s)
    }
}
