//! At most one log line per interval for a failure that may repeat
//! thousands of times a second: with the disk full, every due alarm and
//! every commit failed, and wrote 600 error lines a second (a probe).

use std::sync::Mutex;
use std::time::{Duration, Instant};

/// Says whether to log now, and how many times it said no since.
#[derive(Debug)]
pub struct LogThrottle {
    every: Duration,
    state: Mutex<State>,
}

#[derive(Debug, Default)]
struct State {
    last: Option<Instant>,
    held_back: u64,
}

impl LogThrottle {
    /// One line per `every`.
    pub const fn new(every: Duration) -> Self {
        Self {
            every,
            state: Mutex::new(State {
                last: None,
                held_back: 0,
            }),
        }
    }

    /// `Some(n)`: log now, saying `n` like it were held back since the
    /// last line; `None`: not now (counted).
    pub fn admit(&self) -> Option<u64> {
        let mut s = self.state.lock().unwrap_or_else(|e| e.into_inner());
        let now = Instant::now();
        if s.last.is_some_and(|t| now.duration_since(t) < self.every) {
            s.held_back += 1;
            return None;
        }
        s.last = Some(now);
        Some(std::mem::take(&mut s.held_back))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn one_line_per_interval_with_the_count_held_back() {
        let t = LogThrottle::new(Duration::from_millis(50));
        assert_eq!(t.admit(), Some(0));
        for _ in 0..5 {
            assert_eq!(t.admit(), None);
        }
        std::thread::sleep(Duration::from_millis(60));
        assert_eq!(t.admit(), Some(5));
        assert_eq!(t.admit(), None);
    }
}
