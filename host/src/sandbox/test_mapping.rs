//! Private test mappings: pages of anonymous memory, or of a file mapped
//! private as a sandbox maps its snapshot, unmapped on drop.

use super::trim::{MemoryOrigin, PRESENT, is_private, page_size, pagemap_entries};

/// `pages` pages of private memory, unmapped on drop.
pub(super) struct Mapping {
    start: usize,
    len: usize,
}

impl Mapping {
    pub(super) fn new(pages: usize) -> Self {
        Self::map(pages, libc::MAP_ANONYMOUS, -1)
    }

    /// `pages` pages of a file whose page `i` holds `i + 1` in every
    /// byte, mapped private: as a sandbox maps its snapshot.
    pub(super) fn of_file(pages: usize) -> Self {
        use std::io::Write;
        use std::os::fd::AsRawFd;
        let mut file = tempfile::tempfile().expect("temporary file");
        for i in 0..pages {
            file.write_all(&vec![i as u8 + 1; page_size()]).unwrap();
        }
        // The mapping keeps the file once it is closed.
        Self::map(pages, 0, file.as_raw_fd())
    }

    fn map(pages: usize, flags: libc::c_int, fd: libc::c_int) -> Self {
        let len = pages * page_size();
        #[allow(unsafe_code, reason = "a test mapping")]
        // SAFETY: a fresh private mapping, of anonymous memory or of a
        // file only this test has; nothing else refers to it.
        let p = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                len,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_PRIVATE | flags,
                fd,
                0,
            )
        };
        assert_ne!(p, libc::MAP_FAILED);
        Self {
            start: p as usize,
            len,
        }
    }

    pub(super) fn read(&self, page: usize) -> u8 {
        #[allow(unsafe_code, reason = "a test mapping")]
        // SAFETY: inside the mapping, which is readable.
        unsafe {
            std::ptr::read_volatile((self.start + page * page_size()) as *const u8)
        }
    }

    pub(super) fn run(&self, page: usize, pages: usize) -> (usize, usize) {
        (self.start + page * page_size(), pages * page_size())
    }

    /// The pages present in memory.
    pub(super) fn present(&self) -> Vec<usize> {
        self.pages_where(|e| e & PRESENT != 0)
    }

    pub(super) fn write(&self, page: usize) {
        #[allow(unsafe_code, reason = "a test mapping")]
        // SAFETY: inside the mapping, which is readable and writable.
        unsafe {
            *((self.start + page * page_size()) as *mut u8) = 1;
        }
    }

    pub(super) fn origin(&self) -> MemoryOrigin {
        MemoryOrigin {
            start: self.start,
            size: self.len,
        }
    }

    /// The pages this process copied (see [`is_private`]).
    pub(super) fn private(&self) -> Vec<usize> {
        self.pages_where(is_private)
    }

    /// The pages whose pagemap entry satisfies `pick`.
    fn pages_where(&self, pick: impl Fn(u64) -> bool) -> Vec<usize> {
        pagemap_entries(self.start, self.len / page_size())
            .expect("pagemap")
            .into_iter()
            .enumerate()
            .filter(|&(_, e)| pick(e))
            .map(|(i, _)| i)
            .collect()
    }
}

impl Drop for Mapping {
    fn drop(&mut self) {
        #[allow(unsafe_code, reason = "a test mapping")]
        // SAFETY: the mapping made in `new`, no longer used.
        unsafe {
            libc::munmap(self.start as *mut libc::c_void, self.len);
        }
    }
}
