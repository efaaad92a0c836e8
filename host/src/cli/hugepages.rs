//! Transparent huge pages for the process's heap: off unless asked for.
//!
//! mimalloc asks the kernel for transparent huge pages on its arenas, and a
//! fault in a fresh 2 MiB range then zeroes a whole huge page. On the VM
//! we measured on, that zeroing was a fifth of the worker threads' CPU
//! while new JavaScript actors arrived (wasmtime's instance allocations),
//! and the CPU per new actor fell by a third without it, while turns on
//! active actors stayed within the noise (numbers in docs/design.md,
//! "Transparent huge pages off"). So the `marmot` binary turns them off
//! for itself, as `MIMALLOC_ALLOW_THP=0` would, before it starts any
//! thread; setting `MIMALLOC_ALLOW_THP` leaves the choice to mimalloc.

/// What the process runs with, for the start-up log.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum HugePages {
    /// Turned off here (`prctl(PR_SET_THP_DISABLE)`).
    Off,
    /// `MIMALLOC_ALLOW_THP` is set: mimalloc decided.
    LeftToMimalloc,
    /// The kernel refused (not Linux, or too old): as the system says.
    AsTheSystemSays,
}

/// Turn transparent huge pages off for this process unless
/// `MIMALLOC_ALLOW_THP` is set. Call before starting threads.
///
/// The flag is inherited across `fork` and `exec`, so a `marmot` started
/// by another (`marmot bench` starts its servers) would find it set: with
/// `MIMALLOC_ALLOW_THP` set to anything but a "no" it is cleared again,
/// and with a "no" mimalloc has set it itself.
pub(super) fn turn_off_unless_asked() -> HugePages {
    let Some(asked) = std::env::var_os("MIMALLOC_ALLOW_THP") else {
        return if set_disabled(true) {
            HugePages::Off
        } else {
            HugePages::AsTheSystemSays
        };
    };
    // mimalloc's spellings of "no".
    let no = ["0", "false", "off", "no"];
    let asked = asked.to_string_lossy().trim().to_ascii_lowercase();
    if !no.contains(&asked.as_str()) {
        set_disabled(false);
    }
    HugePages::LeftToMimalloc
}

/// Whether the kernel took the setting.
#[cfg(target_os = "linux")]
fn set_disabled(disabled: bool) -> bool {
    // SAFETY: `PR_SET_THP_DISABLE` takes integer arguments only and
    // changes a flag of this process's address space.
    #[allow(unsafe_code, reason = "one prctl with integer arguments")]
    let rc = unsafe { libc::prctl(libc::PR_SET_THP_DISABLE, u64::from(disabled), 0, 0, 0) };
    rc == 0
}

#[cfg(not(target_os = "linux"))]
fn set_disabled(_: bool) -> bool {
    false
}

impl HugePages {
    /// One line for the log.
    pub(super) fn log(self) {
        match self {
            Self::Off => tracing::info!(
                "transparent huge pages off for this process \
                 (set MIMALLOC_ALLOW_THP=1 to keep them)"
            ),
            Self::LeftToMimalloc => {
                tracing::info!("transparent huge pages as MIMALLOC_ALLOW_THP says")
            }
            Self::AsTheSystemSays => {
                tracing::info!("transparent huge pages as the system's settings say")
            }
        }
    }
}

#[cfg(all(test, target_os = "linux"))]
mod tests {
    use super::*;

    const CHILD: &str = "MARMOT_TEST_THP_CHILD";

    fn thp_disabled() -> i32 {
        // SAFETY: integer arguments only; reads a flag.
        #[allow(unsafe_code, reason = "reading the flag back")]
        unsafe {
            libc::prctl(libc::PR_GET_THP_DISABLE, 0, 0, 0, 0)
        }
    }

    /// Run `test` again in a child process (the flag belongs to the whole
    /// process, and this binary's other tests must keep the system's
    /// setting), with `MIMALLOC_ALLOW_THP` set to `allow` or unset.
    fn in_child(test: &str, allow: Option<&str>) {
        crate::test_child::rerun(test, &[(CHILD, Some("1")), ("MIMALLOC_ALLOW_THP", allow)]);
    }

    #[test]
    fn huge_pages_are_turned_off_for_the_process() {
        if std::env::var_os(CHILD).is_none() {
            return in_child(
                "cli::hugepages::tests::huge_pages_are_turned_off_for_the_process",
                None,
            );
        }
        assert!(set_disabled(false), "start from the system's setting");
        assert_eq!(turn_off_unless_asked(), HugePages::Off);
        assert_eq!(thp_disabled(), 1, "the kernel reports them off");
    }

    #[test]
    fn asking_for_huge_pages_clears_an_inherited_flag() {
        if std::env::var_os(CHILD).is_none() {
            return in_child(
                "cli::hugepages::tests::asking_for_huge_pages_clears_an_inherited_flag",
                Some("1"),
            );
        }
        // As a parent `marmot` would have left it.
        assert!(set_disabled(true));
        assert_eq!(thp_disabled(), 1);
        assert_eq!(turn_off_unless_asked(), HugePages::LeftToMimalloc);
        assert_eq!(thp_disabled(), 0, "on again, as asked");
    }
}
