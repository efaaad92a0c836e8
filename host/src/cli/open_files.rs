//! The limit on open files: raised to what the system allows.
//!
//! Every client connection, live event stream, outbound request and
//! cluster peer holds a file descriptor, and so does the memory image
//! wasmtime makes for each module a node instantiates (a memfd). Many
//! systems start services with a soft limit of 1,024 (systemd's default)
//! under a far higher hard one. A node at its soft limit leaves new
//! connections unaccepted and cannot make the first instance of a type
//! (measured: with a soft limit of 256 and 400 connections, every request
//! to a new type failed). So, as Go's runtime does, the node raises its
//! soft limit to the hard one before it starts any thread, and says so;
//! it warns when even the hard limit is low.

/// Below this many open files the node warns.
const LOW: u64 = 4096;

/// What the process runs with, for the start-up log.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum OpenFiles {
    /// The soft limit was raised to `to`.
    Raised { from: u64, to: u64 },
    /// The soft limit was already as high as allowed.
    AtMost(u64),
    /// The limit could not be read or changed (not Linux, or refused).
    AsTheSystemSays,
}

/// Raise the soft limit on open files as far as the hard limit (and the
/// kernel's `fs.nr_open`, when the hard limit is unlimited) allow. Call
/// before starting threads.
pub(super) fn raise() -> OpenFiles {
    let Some((soft, hard)) = get() else {
        return OpenFiles::AsTheSystemSays;
    };
    let ceiling = if hard == libc::RLIM_INFINITY {
        // An unlimited hard limit still stops at `fs.nr_open`.
        std::fs::read_to_string("/proc/sys/fs/nr_open")
            .ok()
            .and_then(|s| s.trim().parse().ok())
            .unwrap_or(1 << 20)
    } else {
        hard
    };
    if soft >= ceiling {
        return OpenFiles::AtMost(soft);
    }
    if set(ceiling, hard) {
        OpenFiles::Raised {
            from: soft,
            to: ceiling,
        }
    } else {
        OpenFiles::AsTheSystemSays
    }
}

/// The soft and hard limits.
#[cfg(target_os = "linux")]
fn get() -> Option<(u64, u64)> {
    let mut lim = libc::rlimit {
        rlim_cur: 0,
        rlim_max: 0,
    };
    // SAFETY: `lim` is a valid, writable `rlimit` for the call to fill.
    #[allow(unsafe_code, reason = "one getrlimit into a local")]
    let rc = unsafe { libc::getrlimit(libc::RLIMIT_NOFILE, &mut lim) };
    (rc == 0).then_some((lim.rlim_cur, lim.rlim_max))
}

/// Set the soft limit; whether the kernel took it.
#[cfg(target_os = "linux")]
fn set(soft: u64, hard: u64) -> bool {
    let lim = libc::rlimit {
        rlim_cur: soft,
        rlim_max: hard,
    };
    // SAFETY: `lim` is a valid `rlimit` the call only reads.
    #[allow(unsafe_code, reason = "one setrlimit from a local")]
    let rc = unsafe { libc::setrlimit(libc::RLIMIT_NOFILE, &lim) };
    rc == 0
}

#[cfg(not(target_os = "linux"))]
fn get() -> Option<(u64, u64)> {
    None
}

#[cfg(not(target_os = "linux"))]
fn set(_: u64, _: u64) -> bool {
    false
}

impl OpenFiles {
    /// The soft limit the node runs with, if known.
    fn limit(self) -> Option<u64> {
        match self {
            Self::Raised { to, .. } => Some(to),
            Self::AtMost(n) => Some(n),
            Self::AsTheSystemSays => None,
        }
    }

    /// One line for the log: a warning when the limit is low.
    pub(super) fn log(self) {
        if let Some(limit) = self.limit()
            && limit < LOW
        {
            tracing::warn!(
                limit,
                "the open-files limit is low: every connection and event stream takes one; \
                 raise the hard limit (LimitNOFILE= in a systemd unit, ulimit -Hn)"
            );
            return;
        }
        match self {
            Self::Raised { from, to } => {
                tracing::info!(from, to, "open-files limit raised to the hard limit")
            }
            Self::AtMost(limit) => tracing::info!(limit, "open-files limit"),
            Self::AsTheSystemSays => tracing::info!("open-files limit as the system sets it"),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const CHILD: &str = "MARMOT_TEST_OPEN_FILES_CHILD";

    #[cfg(target_os = "linux")]
    #[test]
    fn the_soft_limit_is_raised_to_the_hard_one() {
        let (_, hard) = get().expect("getrlimit");
        let Some(soft) = std::env::var(CHILD)
            .ok()
            .and_then(|s| s.parse::<u64>().ok())
        else {
            let low = 256.min(hard);
            // The limit is the process's: lower it in a child of its own.
            return crate::test_child::rerun(
                "cli::open_files::tests::the_soft_limit_is_raised_to_the_hard_one",
                &[(CHILD, Some(&low.to_string()))],
            );
        };
        // As a service manager would have started us.
        assert!(set(soft, hard), "lower the soft limit to {soft}");
        let raised = raise();
        let (now, still_hard) = get().unwrap();
        assert_eq!(still_hard, hard, "the hard limit is left alone");
        if soft < hard {
            assert_eq!(
                raised,
                OpenFiles::Raised {
                    from: soft,
                    to: now
                }
            );
            assert!(now > soft, "the soft limit went up: {now}");
        } else {
            assert_eq!(raised, OpenFiles::AtMost(soft));
        }
        // Raising again changes nothing.
        assert_eq!(raise(), OpenFiles::AtMost(now));
    }
}
