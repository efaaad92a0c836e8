//! Guest stdout and stderr, captured per turn and forwarded to the node's
//! logs with the actor's name attached.

use std::pin::Pin;
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll};

use bytes::Bytes;
use wasmtime_wasi::cli::{IsTerminal, StdoutStream};
use wasmtime_wasi::p2::{OutputStream, Pollable, StreamError};

/// A bounded buffer that a guest's stdout or stderr writes into.
///
/// Bytes beyond the capacity are dropped and counted; the guest never sees
/// an error, so chatty code cannot fail a turn by printing.
#[derive(Clone)]
pub struct GuestOutput {
    inner: Arc<Mutex<Buffer>>,
}

struct Buffer {
    data: Vec<u8>,
    capacity: usize,
    dropped: usize,
}

impl GuestOutput {
    /// A buffer keeping at most `capacity` bytes between drains.
    pub fn new(capacity: usize) -> Self {
        Self {
            inner: Arc::new(Mutex::new(Buffer {
                data: Vec::new(),
                capacity,
                dropped: 0,
            })),
        }
    }

    fn push(&self, bytes: &[u8]) {
        let mut b = self.inner.lock().expect("guest output lock");
        let room = b.capacity.saturating_sub(b.data.len());
        let take = room.min(bytes.len());
        b.data.extend_from_slice(&bytes[..take]);
        b.dropped += bytes.len() - take;
    }

    /// Take what was written since the last drain, and how many bytes were
    /// dropped for lack of room.
    pub fn drain(&self) -> (Vec<u8>, usize) {
        let mut b = self.inner.lock().expect("guest output lock");
        let dropped = std::mem::take(&mut b.dropped);
        (std::mem::take(&mut b.data), dropped)
    }

    /// Whether anything is waiting to be drained.
    pub fn is_empty(&self) -> bool {
        let b = self.inner.lock().expect("guest output lock");
        b.data.is_empty() && b.dropped == 0
    }
}

impl IsTerminal for GuestOutput {
    fn is_terminal(&self) -> bool {
        false
    }
}

impl StdoutStream for GuestOutput {
    fn p2_stream(&self) -> Box<dyn OutputStream> {
        Box::new(self.clone())
    }

    fn async_stream(&self) -> Box<dyn tokio::io::AsyncWrite + Send + Sync> {
        Box::new(self.clone())
    }
}

#[wasmtime_wasi::async_trait]
impl OutputStream for GuestOutput {
    fn write(&mut self, bytes: Bytes) -> Result<(), StreamError> {
        self.push(&bytes);
        Ok(())
    }

    fn flush(&mut self) -> Result<(), StreamError> {
        Ok(())
    }

    fn check_write(&mut self) -> Result<usize, StreamError> {
        Ok(64 * 1024)
    }
}

#[wasmtime_wasi::async_trait]
impl Pollable for GuestOutput {
    async fn ready(&mut self) {}
}

impl tokio::io::AsyncWrite for GuestOutput {
    fn poll_write(
        self: Pin<&mut Self>,
        _cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<std::io::Result<usize>> {
        self.push(buf);
        Poll::Ready(Ok(buf.len()))
    }

    fn poll_flush(self: Pin<&mut Self>, _cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        Poll::Ready(Ok(()))
    }

    fn poll_shutdown(self: Pin<&mut Self>, _cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        Poll::Ready(Ok(()))
    }
}

/// The console lines an eval's guest echoed to stdout as it ran (each on
/// a line of its own, `\` and newline escaped as `\\` and `\n`:
/// `actors/quickjs`'s `echo_eval_line`), for an eval that hit a limit and
/// so returned none. A line the per-turn cap cut short is dropped.
pub fn eval_lines(stdout: &[u8]) -> Vec<String> {
    let text = String::from_utf8_lossy(stdout);
    let Some(end) = text.rfind('\n') else {
        return Vec::new();
    };
    text[..end].split('\n').map(unescape).collect()
}

fn unescape(line: &str) -> String {
    let mut out = String::with_capacity(line.len());
    let mut chars = line.chars();
    while let Some(c) = chars.next() {
        if c != '\\' {
            out.push(c);
            continue;
        }
        match chars.next() {
            Some('n') => out.push('\n'),
            Some(other) => out.push(other),
            None => out.push('\\'),
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn eval_lines_read_back_what_the_guest_echoed() {
        // `one`, `two \ and` + newline + `three`, an empty line, and a line
        // cut short by the cap.
        let echoed = b"one\ntwo \\\\ and\\nthree\n\ncut sho";
        assert_eq!(eval_lines(echoed), ["one", "two \\ and\nthree", ""]);
        assert!(eval_lines(b"").is_empty());
        assert!(eval_lines(b"no newline yet").is_empty());
        assert_eq!(eval_lines(b"\n"), [""]);
    }

    #[test]
    fn caps_and_counts_dropped_bytes() {
        let out = GuestOutput::new(4);
        out.push(b"abc");
        out.push(b"def");
        assert_eq!(out.drain(), (b"abcd".to_vec(), 2));
        assert!(out.is_empty());
    }
}
