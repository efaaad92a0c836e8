//! Giving back the execution stack of an idle instance.
//!
//! Guest code runs on a fiber stack from the engine's pool: a guard page,
//! then [`ASYNC_STACK_SIZE`] bytes. A wasmtime store keeps the last stack
//! it ran on for its next call and hands it back to the pool (which
//! decommits it) only when the store is dropped, and wasmtime has no call
//! to hand it back sooner. So an awake actor holds every stack page its
//! turns touched: 8 KB for a Rust counter (a sixth of its memory), 12 KB
//! for a JavaScript one.
//!
//! A trim finds the stack and discards its pages. It calls a host function
//! of the store the way a guest export is called (`call_async`, so on the
//! store's fiber), and the function returns an address of its own frame: a
//! point on the stack the store just ran on, and so the stack the store
//! keeps once the call returns, unused until its next call (the caller
//! holds the store). No guest code runs. [`bounds`] then finds where
//! that stack starts and ends by asking the kernel which pages around the
//! point are mapped readable, and accepts only the shape of a pooled
//! stack: exactly [`ASYNC_STACK_SIZE`] readable bytes with unreadable
//! pages on both sides (its own guard below, the next stack's guard or the
//! end of the pool above), the point inside. Anything else — another
//! layout in a later wasmtime, a last stack with memory right above it —
//! is left alone.
//!
//! Discarded pages read as zero again, as a stack fresh from the pool does
//! (`async_stack_zeroing`); the next call touches what it needs.

use super::trim::page_size;

/// The size of every fiber stack in the engine's pool: address space, of
/// which only the pages a call touched are ever resident, and the pool
/// decommits those when it gets the stack back. Deep JavaScript needs
/// more than 1 MiB (see `max_wasm_stack`).
pub const ASYNC_STACK_SIZE: usize = 8 << 20;

/// The bytes of the pooled stack of `len` bytes (rounded up to pages) that
/// `point` lies on, as (start, length); `None` if the memory around
/// `point` is not shaped like one.
pub(super) fn bounds(point: usize, len: usize) -> Option<(usize, usize)> {
    let page = page_size();
    let len = len.next_multiple_of(page);
    if !readable(point) {
        return None;
    }
    // The first unreadable page above the point: the stack's end.
    let limit = point.checked_add(len)?;
    let mut end = (point / page + 1).checked_mul(page)?;
    while readable(end) {
        end = end.checked_add(page)?;
        if end > limit {
            return None;
        }
    }
    let start = end.checked_sub(len)?;
    let shaped = start <= point && readable(start) && !readable(start.checked_sub(page)?);
    shaped.then_some((start, len))
}

/// Whether this process can read the byte at `addr`: the kernel says, so
/// an unmapped or inaccessible address is an answer, not a fault.
fn readable(addr: usize) -> bool {
    let mut byte = 0u8;
    let local = libc::iovec {
        iov_base: (&raw mut byte).cast(),
        iov_len: 1,
    };
    let remote = libc::iovec {
        iov_base: addr as *mut libc::c_void,
        iov_len: 1,
    };
    #[allow(unsafe_code, reason = "the kernel reads another address for us")]
    // SAFETY: `local` is one writable byte of this frame; `remote` is only
    // read by the kernel, which fails with EFAULT instead of faulting.
    let n = unsafe { libc::process_vm_readv(libc::getpid(), &local, 1, &remote, 1, 0) };
    n == 1
}

#[cfg(test)]
mod tests {
    use super::*;

    /// `pages` pages mapped inaccessible, with `rw` (first page, count)
    /// made readable and writable; unmapped on drop.
    struct Layout {
        base: usize,
        len: usize,
    }

    impl Layout {
        fn new(pages: usize, rw: &[(usize, usize)]) -> Self {
            let page = page_size();
            let len = pages * page;
            #[allow(unsafe_code, reason = "a test mapping")]
            // SAFETY: a fresh anonymous mapping, then protections changed
            // inside it only.
            unsafe {
                let base = libc::mmap(
                    std::ptr::null_mut(),
                    len,
                    libc::PROT_NONE,
                    libc::MAP_PRIVATE | libc::MAP_ANONYMOUS,
                    -1,
                    0,
                );
                assert_ne!(base, libc::MAP_FAILED);
                for &(first, count) in rw {
                    let at = base.cast::<u8>().add(first * page);
                    let r =
                        libc::mprotect(at.cast(), count * page, libc::PROT_READ | libc::PROT_WRITE);
                    assert_eq!(r, 0);
                    // Resident, as a used stack is.
                    at.write(1);
                }
                Self {
                    base: base as usize,
                    len,
                }
            }
        }

        fn page(&self, i: usize) -> usize {
            self.base + i * page_size()
        }
    }

    impl Drop for Layout {
        fn drop(&mut self) {
            #[allow(unsafe_code, reason = "a test mapping")]
            // SAFETY: unmaps exactly what `new` mapped.
            unsafe {
                libc::munmap(self.base as *mut libc::c_void, self.len);
            }
        }
    }

    #[test]
    fn a_pooled_stack_is_found_from_any_point_on_it() {
        let page = page_size();
        // guard, 8-page stack, guard, 8-page stack, guard.
        let l = Layout::new(19, &[(1, 8), (10, 8)]);
        let len = 8 * page;
        for point in [l.page(1), l.page(4) + 100, l.page(8) + page - 1] {
            assert_eq!(bounds(point, len), Some((l.page(1), len)));
        }
        assert_eq!(bounds(l.page(12) + 8, len), Some((l.page(10), len)));
        // Not on a stack: a guard page.
        assert_eq!(bounds(l.page(9), len), None);
    }

    #[test]
    fn other_shapes_are_left_alone() {
        let page = page_size();
        let len = 8 * page;
        // Readable memory right above the stack: its end cannot be told.
        let l = Layout::new(20, &[(1, 12)]);
        assert_eq!(bounds(l.page(3), len), None);
        // A smaller readable region than a stack.
        let l = Layout::new(20, &[(10, 6)]);
        assert_eq!(bounds(l.page(12), len), None);
        // No guard below: readable memory runs on past the stack's start.
        let l = Layout::new(12, &[(0, 10)]);
        assert_eq!(bounds(l.page(9), len), None);
    }
}
