//! Trimming idle JavaScript sandboxes: giving back the snapshot pages a
//! sandbox copied but left as it found them.
//!
//! A sandbox's linear memory starts as its snapshot, mapped copy-on-write.
//! QuickJS writes to shared objects on every turn (a reference count taken
//! and dropped again, a list link moved and moved back), so a turn copies
//! some 25 snapshot pages into the sandbox, and after the turn more than
//! half of them hold exactly what the snapshot holds. Once a sandbox has
//! been idle a moment, the actor asks for a trim: every private page of its
//! memory that equals the same page of a *pristine* instance of the same
//! compiled engine is discarded with `madvise(MADV_DONTNEED)`. For a
//! private mapping that maps the snapshot's page again (or the zero page,
//! past the snapshot), which is what the page already held: the guest
//! cannot tell. Its next turn copies the page again if it writes to it.
//!
//! The pristine instance ([`Pristine`]) is an instance of the compiled
//! engine that never runs a turn, held by the sandboxes trimmed against it.
//! It runs one call, `report-memory-origin` (how the host learns where a
//! sandbox's memory is mapped); any page that call wrote is never trimmed,
//! since the pristine page then no longer shows what `MADV_DONTNEED` would
//! restore. Where the memory is comes from wasmtime's lift of that call's
//! argument, never from what the guest says ([`link`]). Only the built-in
//! engine's sandboxes are trimmed this way: other code has no snapshot
//! its turns write back unchanged. Which pages are private comes from
//! `/proc/self/pagemap`; without it (not Linux, or no access) nothing is
//! trimmed.

use std::fs::File;
use std::sync::{Mutex, OnceLock};

use wasmtime::StoreContextMut;
use wasmtime::component::__internal::{CanonicalAbiInfo, InstanceType, InterfaceType, LiftContext};
use wasmtime::component::{ComponentType, Lift, Linker, WasmList};

use super::host::Host;
use super::run::Instance;

/// The host import the engine calls from `report-memory-origin`.
pub(super) const ORIGIN_IMPORT: &str = "memory-origin";
/// The engine export that calls it.
pub(super) const ORIGIN_EXPORT: &str = "report-memory-origin";

/// Where a guest's linear memory is mapped in this process.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) struct MemoryOrigin {
    /// The address of the guest's byte 0.
    pub(super) start: usize,
    /// Its size when it said so, in bytes.
    pub(super) size: usize,
}

/// Define [`ORIGIN_IMPORT`]: the memory is the one the `at` list was
/// lifted from, as wasmtime maps it. What the guest says about addresses
/// (`addr`, `size`) is not needed, so not believed.
pub(super) fn link(linker: &mut Linker<Host>) -> wasmtime::Result<()> {
    linker.root().func_wrap(
        ORIGIN_IMPORT,
        |mut store: StoreContextMut<'_, Host>,
         (memory, _addr, _size): (CallersMemory, u32, u64)| {
            if store.data().origin_asked {
                store.data_mut().memory_origin = Some(memory.0);
            }
            Ok(())
        },
    )
}

/// A `list<u8>` argument, lifted (bounds-checked) as any list is, and
/// kept only for where the memory it was lifted from is: the caller's
/// whole linear memory as wasmtime's lift sees it, so a guest cannot name
/// any other address.
///
/// wasmtime's public API gives a host function no view of a component's
/// memory; its lifting context does, through the traits `bindgen!` and
/// `#[derive(Lift)]` implement (`#[doc(hidden)]`, so tied to the pinned
/// wasmtime: `tests/js_memory.rs` and `fresh_instances_start_with_the_pages_first_turns_write`
/// in `tests/lifecycle.rs` fail if this stops finding the memory).
struct CallersMemory(MemoryOrigin);

impl CallersMemory {
    fn of(memory: &[u8]) -> Self {
        Self(MemoryOrigin {
            start: memory.as_ptr() as usize,
            size: memory.len(),
        })
    }
}

// SAFETY: the canonical ABI shape (lowered form, size, alignment, type
// check) is `WasmList<u8>`'s, to which lifting is delegated.
#[allow(unsafe_code, reason = "a component type with WasmList<u8>'s ABI")]
unsafe impl ComponentType for CallersMemory {
    type Lower = <WasmList<u8> as ComponentType>::Lower;
    const ABI: CanonicalAbiInfo = <WasmList<u8> as ComponentType>::ABI;

    fn typecheck(ty: &InterfaceType, types: &InstanceType<'_>) -> wasmtime::Result<()> {
        <WasmList<u8> as ComponentType>::typecheck(ty, types)
    }
}

// SAFETY: lifts exactly as `WasmList<u8>` does (so a list out of bounds is
// refused as it would be), then reads nothing but the memory's extent.
#[allow(unsafe_code, reason = "a component type with WasmList<u8>'s ABI")]
unsafe impl Lift for CallersMemory {
    fn linear_lift_from_flat(
        cx: &mut LiftContext<'_>,
        ty: InterfaceType,
        src: &Self::Lower,
    ) -> wasmtime::Result<Self> {
        WasmList::<u8>::linear_lift_from_flat(cx, ty, src)?;
        Ok(Self::of(cx.memory()))
    }

    fn linear_lift_from_memory(
        cx: &mut LiftContext<'_>,
        ty: InterfaceType,
        bytes: &[u8],
    ) -> wasmtime::Result<Self> {
        WasmList::<u8>::linear_lift_from_memory(cx, ty, bytes)?;
        Ok(Self::of(cx.memory()))
    }
}

/// An instance of a compiled engine that never runs a turn: its memory is
/// the snapshot as every instance of that engine starts.
pub(super) struct Pristine {
    /// Kept, never called again: its memory must stay mapped and unwritten.
    _instance: Mutex<Instance>,
    /// Where its memory starts.
    origin: usize,
    /// Pages compared: the memory as it was instantiated.
    pages: usize,
    /// Pages `report-memory-origin` wrote in it (its stack): not trimmed.
    written: Vec<bool>,
}

impl Pristine {
    /// `instance`, fresh from instantiation and then only asked for
    /// `origin`.
    pub(super) fn new(instance: Instance, origin: MemoryOrigin) -> std::io::Result<Self> {
        let pages = origin.size / page_size();
        let entries = pagemap_entries(origin.start, pages)?;
        Ok(Self {
            _instance: Mutex::new(instance),
            origin: origin.start,
            pages,
            // A page swapped out since the call wrote it counts as written.
            written: entries
                .iter()
                .map(|&e| is_private(e) || e & SWAPPED != 0)
                .collect(),
        })
    }
}

/// What one trim found and gave back, in pages.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Trimmed {
    /// Private pages of the compared memory before the trim.
    pub private: usize,
    /// Of those, pages discarded because they equalled the snapshot.
    pub released: usize,
    /// Pages of the store's fiber stack discarded (see
    /// [`stack`](super::stack)).
    pub stack: usize,
}

/// Discard the private pages of the `sandbox` memory that equal the same
/// pages of `pristine`, and the resident pages of `stack` (start, length);
/// with the runs of memory pages discarded (start, length).
///
/// The caller holds the sandbox's store exclusively, so no guest code runs
/// in this memory while it is compared and trimmed, nor on the store's
/// fiber `stack`, and `pristine` is an instance of the same compiled
/// engine.
pub(super) fn trim(
    sandbox: MemoryOrigin,
    pristine: &Pristine,
    stack: Option<(usize, usize)>,
) -> std::io::Result<(Trimmed, Vec<(usize, usize)>)> {
    let page = page_size();
    let origin = sandbox.start;
    if !origin.is_multiple_of(page) || !pristine.origin.is_multiple_of(page) {
        return Ok((Trimmed::default(), Vec::new()));
    }
    let pages = pristine.pages.min(sandbox.size / page);
    let entries = pagemap_entries(origin, pages)?;
    let mut out = Trimmed::default();
    let mut release = vec![false; entries.len()];
    for (i, &entry) in entries.iter().enumerate() {
        if !is_private(entry) {
            continue;
        }
        out.private += 1;
        if pristine.written[i] || !page_eq(origin + i * page, pristine.origin + i * page, page) {
            continue;
        }
        out.released += 1;
        release[i] = true;
    }
    let runs = page_runs(origin, &release, page);
    let mut all = runs.clone();
    if let Some((resident, run)) = stack_run(stack)? {
        out.stack = resident;
        all.push(run);
    }
    discard(&all)?;
    Ok((out, runs))
}

/// Discard the resident pages of `stack` (start, length), a fiber stack
/// no code runs on.
pub(super) fn trim_stack(stack: Option<(usize, usize)>) -> std::io::Result<Trimmed> {
    let mut out = Trimmed::default();
    if let Some((resident, run)) = stack_run(stack)? {
        out.stack = resident;
        discard(&[run])?;
    }
    Ok(out)
}

/// `stack`, with how many of its pages hold memory of their own, if any
/// do. (Finding the stack read its lowest page, which maps the shared zero
/// page there: present, but not this process's; discarded with the rest.)
fn stack_run(stack: Option<(usize, usize)>) -> std::io::Result<Option<(usize, (usize, usize))>> {
    let Some((start, len)) = stack else {
        return Ok(None);
    };
    let resident = pagemap_entries(start, len / page_size())?
        .iter()
        .filter(|&&e| is_private(e))
        .count();
    Ok((resident > 0).then_some((resident, (start, len))))
}

/// Runs of the pages marked in `pages` (page `i` at `start + i * page`),
/// as (start, length) in bytes, neighbours joined.
pub(super) fn page_runs(start: usize, pages: &[bool], page: usize) -> Vec<(usize, usize)> {
    let mut runs: Vec<(usize, usize)> = Vec::new();
    for (i, _) in pages.iter().enumerate().filter(|(_, marked)| **marked) {
        let at = start + i * page;
        match runs.last_mut() {
            Some((run, len)) if *run + *len == at => *len += page,
            _ => runs.push((at, page)),
        }
    }
    runs
}

/// The system's page size.
pub fn page_size() -> usize {
    static PAGE: OnceLock<usize> = OnceLock::new();
    *PAGE.get_or_init(|| {
        #[allow(unsafe_code, reason = "sysconf has no preconditions")]
        // SAFETY: `sysconf` only reads a system constant.
        let n = unsafe { libc::sysconf(libc::_SC_PAGESIZE) };
        usize::try_from(n).ok().filter(|&n| n > 0).unwrap_or(4096)
    })
}

/// Pagemap entry bits (Documentation/admin-guide/mm/pagemap.rst).
pub(super) const PRESENT: u64 = 1 << 63;
const SWAPPED: u64 = 1 << 62;
const FILE_OR_SHARED: u64 = 1 << 61;
const EXCLUSIVE: u64 = 1 << 56;

/// Whether a pagemap entry is a page present in memory, mapped only here,
/// and not the file's page (nor the zero page, which is not exclusive):
/// a copy this process made when the page was written.
pub(super) fn is_private(entry: u64) -> bool {
    entry & PRESENT != 0 && entry & FILE_OR_SHARED == 0 && entry & EXCLUSIVE != 0
}

/// Whether a pagemap entry is the mapped file's own page (the snapshot's,
/// in a sandbox's memory): mapped read-only in a private mapping, so
/// discarding it maps the same page again.
pub(super) fn shows_the_file(entry: u64) -> bool {
    entry & PRESENT != 0 && entry & FILE_OR_SHARED != 0
}

/// `/proc/self/pagemap` entries of `pages` pages from `start`.
pub(super) fn pagemap_entries(start: usize, pages: usize) -> std::io::Result<Vec<u64>> {
    use std::os::unix::fs::FileExt;
    static PAGEMAP: OnceLock<File> = OnceLock::new();
    let file = match PAGEMAP.get() {
        Some(file) => file,
        // Tried again next time if it fails (say, out of descriptors).
        None => {
            let opened = File::open("/proc/self/pagemap")?;
            PAGEMAP.get_or_init(|| opened)
        }
    };
    let mut buf = vec![0u8; pages * 8];
    file.read_exact_at(&mut buf, (start / page_size()) as u64 * 8)?;
    Ok(buf
        .chunks_exact(8)
        .map(|c| u64::from_le_bytes(c.try_into().expect("8 bytes")))
        .collect())
}

/// Whether the `len` bytes at `a` and at `b` are equal.
fn page_eq(a: usize, b: usize, len: usize) -> bool {
    #[allow(unsafe_code, reason = "reading two sandboxes' memories in place")]
    // SAFETY: both ranges lie inside linear memories that stay mapped while
    // their instances live (the caller holds one, the pristine instance
    // holds the other), and no guest code runs in either meanwhile: the
    // caller holds the sandbox's store, and the pristine instance never
    // runs again. Wasm memory is plain bytes: any content is a valid `u8`.
    unsafe {
        std::slice::from_raw_parts(a as *const u8, len)
            == std::slice::from_raw_parts(b as *const u8, len)
    }
}

/// Drop this process's mapping of the pages in `runs` (start, length).
/// Each page must hold what the mapping shows without it: a private copy
/// equal to the snapshot's page, or the snapshot's page itself, checked by
/// the caller with no guest code run since; or be a page of a fiber stack
/// no code runs on, whose content is dead.
///
/// All in one call where the kernel allows (see [`advise`](super::advise)):
/// one TLB shootdown instead of one per run, which on a virtual machine is
/// most of a trim's cost.
pub(super) fn discard(runs: &[(usize, usize)]) -> std::io::Result<()> {
    static BATCHING: super::advise::Batching = super::advise::Batching::new();
    #[allow(unsafe_code, reason = "discarding pages of a guest's memory")]
    // SAFETY: every run is page-aligned and inside a sandbox's linear
    // memory, a private mapping; every page in it equals what the mapping
    // shows once this process's entry is gone (checked by the caller, with
    // no guest code run since), so no one can observe the discard. Or it
    // is a store's idle fiber stack, which holds no live frame, and reads
    // as zero after, as a stack fresh from the pool.
    unsafe {
        super::advise::advise(runs, libc::MADV_DONTNEED, &BATCHING)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn runs_join_neighbouring_pages() {
        let pages = [false, true, true, false, true, false, false, true];
        assert_eq!(page_runs(0, &pages, 10), [(10, 20), (40, 10), (70, 10)]);
        assert_eq!(page_runs(1000, &pages, 10)[0], (1010, 20));
        assert!(page_runs(0, &[false; 3], 10).is_empty());
    }

    #[test]
    fn private_means_present_and_not_the_files_page() {
        assert!(is_private(PRESENT | EXCLUSIVE));
        assert!(!is_private(PRESENT), "the zero page is not exclusive");
        assert!(!is_private(PRESENT | FILE_OR_SHARED | EXCLUSIVE));
        assert!(!is_private(0));
        assert!(!is_private(SWAPPED | EXCLUSIVE));
    }
}
