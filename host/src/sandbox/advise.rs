//! One `madvise` advice for many runs of guest memory in one system call.
//!
//! Trims discard, and wakes populate, pages scattered over a sandbox's
//! memory: a dozen runs or more. `process_madvise` takes them all at once
//! where the kernel allows any advice for the calling process (Linux
//! 6.14+, `PIDFD_SELF`): for a discard that is one TLB shootdown instead
//! of one per run (on a virtual machine an interprocessor interrupt each,
//! most of a trim's cost), and for a populate one kernel entry instead of
//! one per run (16 scattered pages: 35 → 25 µs on a 2-core AMD VM, a
//! C loop, single-threaded). Elsewhere, one `madvise` per run.

use std::sync::atomic::{AtomicBool, Ordering};

/// `pidfd` meaning the calling process.
const PIDFD_SELF: libc::c_int = -10000;

/// Errors after which `process_madvise` is not tried again for an advice:
/// the kernel is too old for the call, for the advice or for `PIDFD_SELF`,
/// or it is not allowed here.
const PERMANENT: [libc::c_int; 4] = [libc::ENOSYS, libc::EINVAL, libc::EBADF, libc::EPERM];

/// Whether `process_madvise` is still worth trying for one advice; starts
/// true, cleared for good by an error in [`PERMANENT`].
pub(super) struct Batching(AtomicBool);

impl Batching {
    pub(super) const fn new() -> Self {
        Self(AtomicBool::new(true))
    }
}

/// Apply `advice` to every run of `runs` (start, length in bytes; page
/// aligned): in one `process_madvise` call if `batching` allows, else (or
/// to finish what a partial call left) one `madvise` per run. Runs the
/// batched call covered may be advised twice, so `advice` must be one for
/// which that is harmless (`MADV_DONTNEED`, `MADV_POPULATE_*`).
///
/// # Safety
///
/// Every run must be memory `advice` may act on without breaking what the
/// process believes about it: the caller says why, per advice.
#[allow(unsafe_code, reason = "advising memory the caller vouches for")]
pub(super) unsafe fn advise(
    runs: &[(usize, usize)],
    advice: libc::c_int,
    batching: &Batching,
) -> std::io::Result<()> {
    if runs.len() > 1
        && runs.len() <= libc::UIO_MAXIOV as usize
        && batching.0.load(Ordering::Relaxed)
    {
        let iov: Vec<libc::iovec> = runs
            .iter()
            .map(|&(start, len)| libc::iovec {
                iov_base: start as *mut libc::c_void,
                iov_len: len,
            })
            .collect();
        let total: usize = runs.iter().map(|r| r.1).sum();
        #[allow(unsafe_code, reason = "advising ranges the caller vouched for")]
        // SAFETY: `iov` lists exactly the runs the caller vouched for, and
        // lives across the call; the kernel only reads it.
        let r = unsafe {
            libc::syscall(
                libc::SYS_process_madvise,
                PIDFD_SELF,
                iov.as_ptr(),
                iov.len(),
                advice,
                0,
            )
        };
        if usize::try_from(r).is_ok_and(|done| done == total) {
            return Ok(());
        }
        if r < 0
            && std::io::Error::last_os_error()
                .raw_os_error()
                .is_some_and(|e| PERMANENT.contains(&e))
        {
            batching.0.store(false, Ordering::Relaxed);
        }
    }
    for &(start, len) in runs {
        #[allow(unsafe_code, reason = "advising ranges the caller vouched for")]
        // SAFETY: the caller vouched for every run.
        let r = unsafe { libc::madvise(start as *mut libc::c_void, len, advice) };
        if r != 0 {
            return Err(std::io::Error::last_os_error());
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::sandbox::test_mapping::Mapping;

    /// Several runs advised at once: each run is discarded (reads as zero
    /// again), the pages between them are left alone, batched or not.
    #[test]
    fn discards_every_run_and_nothing_else() {
        for batching in [Batching::new(), Batching(AtomicBool::new(false))] {
            let m = Mapping::new(8);
            for page in 0..8 {
                m.write(page);
            }
            let runs = [m.run(1, 1), m.run(3, 2), m.run(7, 1)];
            #[allow(unsafe_code, reason = "discarding the test's own pages")]
            // SAFETY: the runs lie in the test's mapping, whose content is
            // only read again below.
            unsafe { advise(&runs, libc::MADV_DONTNEED, &batching) }.expect("discard");
            for page in 0..8 {
                let want = if [1, 3, 4, 7].contains(&page) { 0 } else { 1 };
                assert_eq!(m.read(page), want, "page {page}");
            }
        }
    }
}
