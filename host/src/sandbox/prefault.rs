//! Copying up front the pages a fresh instance is about to write: the
//! snapshot pages of a JavaScript sandbox, and the data image, heap and
//! stack pages of an actor built with the Rust SDK (both export
//! `report-memory-origin`, so the host knows where their memory is).
//!
//! A fresh sandbox's linear memory is its snapshot, mapped copy-on-write
//! with no page table entries yet. QuickJS first reads most of the pages a
//! turn writes (a reference count, a list link): the read maps the file's
//! page read-only (and, by fault-around, up to 15 neighbours with it), and
//! the write then faults again to copy it. Replacing that read-only entry
//! has to flush it from every core that runs the process: on a virtual
//! machine an interprocessor interrupt each, which under load cost more
//! than the copy itself (`marmot bench http-spread --js --actors 16000`:
//! a quarter of the node's CPU in `flush_tlb_mm_range`). A write to a page
//! with no entry yet needs no flush.
//!
//! So each compiled engine ([`WriteSet`], one per
//! [`Prepared`](super::Prepared)) learns which pages of its memory its
//! sandboxes copy in their first turn: the pages private to the sandbox in
//! `/proc/self/pagemap` after the first turn of each of its first
//! [`SAMPLES`] sandboxes, kept if every sample copied them. From then on a
//! fresh sandbox has those pages populated writable
//! (`madvise(MADV_POPULATE_WRITE)`) before its first turn runs: the same
//! copies, without the faults and the flushes. Every [`RELEARN_AFTER`]
//! prefaulted sandboxes the next [`SAMPLES`] run unpopulated and the set is
//! learned again from them, so it follows the load rather than whatever
//! came first (a node's first sandboxes of a type are often creations,
//! whose first turn writes pages a wake's does not). A trimmed sandbox (see
//! [`trim`](super::trim)) that runs again has the pages the trim gave back
//! populated the same way ([`populate`]). Populating copies the snapshot's
//! page, so the guest cannot tell.
//!
//! `MARMOT_JS_PREFAULT=0` turns it off (for both kinds), to measure it side by side.

use std::sync::atomic::{AtomicBool, AtomicU32, Ordering};
use std::sync::{Arc, Mutex, OnceLock, RwLock};

use super::trim::{
    MemoryOrigin, discard, is_private, page_runs, page_size, pagemap_entries, shows_the_file,
};

/// First turns sampled each time a compiled engine's write set is learned.
const SAMPLES: u32 = 8;

/// Fresh sandboxes prefaulted from one learned set before the next
/// [`SAMPLES`] learn it again. A sample runs unpopulated (its faults, and
/// flushes if other cores run the process), so one in ~1,000.
const RELEARN_AFTER: u32 = 1024;

/// Prefaults in a row whose check found no snapshot page mapped (see
/// [`unmap_snapshot_pages`]) after which a learned set stops checking.
const CLEAN_CHECKS: u32 = 16;

/// The pages fresh sandboxes of one compiled engine write in their first
/// turn: learned from samples, and learned again from time to time.
pub(super) struct WriteSet {
    learning: Mutex<Learning>,
    /// The pages learned last, if any yet.
    runs: RwLock<Option<Runs>>,
    relearn_after: u32,
    /// Prefaults in a row, since the set was last learned, that found no
    /// page of it mapped read-only. At [`CLEAN_CHECKS`] the rest of them
    /// skip the check: reading `/proc/self/pagemap` for the set's span
    /// cost 11-18 µs of a ~145 µs JavaScript wake (2026-12-04, AMD VM),
    /// and what the origin question maps is the same for every sandbox of
    /// one compiled engine (the same code reading the same snapshot), so
    /// where it found nothing 16 times it will not find anything later.
    /// Were it wrong, populating would still copy the right pages, with a
    /// flush each.
    clean_checks: AtomicU32,
}

/// Runs of pages, as (offset from the memory's start, length) in bytes.
type Runs = Arc<[(usize, usize)]>;

/// One round of samples.
struct Learning {
    /// Which round (a sample reports to the round that handed it out).
    round: u32,
    /// Samples handed out this round. The first round hands one to every
    /// fresh sandbox until it has learned (there is nothing to prefault
    /// with yet); a later one hands out [`SAMPLES`], and hands out again
    /// the ones whose turn failed (they never report) when it is due again.
    handed: u32,
    /// Samples reported this round.
    reported: u32,
    /// Fresh sandboxes prefaulted since the set was last learned, or the
    /// round last opened.
    prefaulted: u32,
    /// Pages private in every sample of this round so far (`None` before
    /// the first).
    written: Option<Vec<bool>>,
}

/// A fresh sandbox chosen as a sample: run it unpopulated and report its
/// pages with [`WriteSet::learn`] after its first turn.
pub(super) struct Sample {
    round: u32,
}

impl Default for WriteSet {
    fn default() -> Self {
        Self::relearning_after(RELEARN_AFTER)
    }
}

/// Whether this kernel populates pages on request (Linux 5.14+); cleared
/// the first time it refuses.
static POPULATE: AtomicBool = AtomicBool::new(true);

impl WriteSet {
    fn relearning_after(relearn_after: u32) -> Self {
        Self {
            learning: Mutex::new(Learning {
                round: 0,
                handed: 0,
                reported: 0,
                prefaulted: 0,
                written: None,
            }),
            runs: RwLock::new(None),
            relearn_after,
            clean_checks: AtomicU32::new(0),
        }
    }

    /// Whether the next fresh sandbox is a sample. If not, the caller
    /// prefaults it.
    pub(super) fn sample(&self) -> Option<Sample> {
        if !enabled() {
            return None;
        }
        let mut learning = self.learning.lock().expect("write set lock");
        let first = self.runs.read().expect("write set lock").is_none();
        if !first && learning.handed >= SAMPLES {
            learning.prefaulted += 1;
            if learning.prefaulted < self.relearn_after {
                return None;
            }
            // Due: open the round, or open it again for the samples that
            // never reported.
            learning.prefaulted = 0;
            learning.handed = learning.reported;
        }
        learning.handed += 1;
        Some(Sample {
            round: learning.round,
        })
    }

    /// Take the pages private to a sandbox's memory at `origin`, just
    /// after its first turn, as one sample.
    pub(super) fn learn(&self, sample: Sample, origin: MemoryOrigin) -> std::io::Result<()> {
        let page = page_size();
        if !origin.start.is_multiple_of(page) {
            return Ok(());
        }
        let seen: Vec<bool> = pagemap_entries(origin.start, origin.size / page)?
            .into_iter()
            .map(is_private)
            .collect();
        let mut learning = self.learning.lock().expect("write set lock");
        if sample.round != learning.round {
            // Its round learned enough without it.
            return Ok(());
        }
        let written = match learning.written.take() {
            None => seen,
            Some(mut written) => {
                written.truncate(seen.len());
                for (w, s) in written.iter_mut().zip(seen) {
                    *w &= s;
                }
                written
            }
        };
        learning.reported += 1;
        if learning.reported < SAMPLES {
            learning.written = Some(written);
            return Ok(());
        }
        let runs: Runs = page_runs(0, &written, page).into();
        tracing::debug!(
            round = learning.round,
            pages = written.iter().filter(|&&w| w).count(),
            "learned the pages a fresh instance writes in its first turn"
        );
        *self.runs.write().expect("write set lock") = Some(runs);
        self.clean_checks.store(0, Ordering::Relaxed);
        *learning = Learning {
            round: learning.round.wrapping_add(1),
            handed: SAMPLES,
            reported: 0,
            prefaulted: 0,
            written: None,
        };
        Ok(())
    }

    /// Populate the learned pages of a fresh sandbox's memory at `origin`
    /// writable; the number of pages asked for.
    ///
    /// The caller holds the sandbox's store, which has not run a turn.
    pub(super) fn prefault(&self, origin: MemoryOrigin) -> std::io::Result<usize> {
        let Some(runs) = self.runs.read().expect("write set lock").clone() else {
            return Ok(0);
        };
        if !origin.start.is_multiple_of(page_size()) {
            return Ok(0);
        }
        // The memory may be smaller than the sampled ones were.
        let runs: Vec<(usize, usize)> = runs
            .iter()
            .filter_map(|&(offset, len)| {
                let len = len.min(origin.size.saturating_sub(offset));
                (len > 0).then_some((origin.start + offset, len))
            })
            .collect();
        if self.clean_checks.load(Ordering::Relaxed) < CLEAN_CHECKS {
            if unmap_snapshot_pages(&runs)? {
                self.clean_checks.store(0, Ordering::Relaxed);
            } else {
                self.clean_checks.fetch_add(1, Ordering::Relaxed);
            }
        }
        populate(&runs)
    }
}

/// Unmap the pages of `runs` (sorted, page-aligned, inside a sandbox's
/// memory whose store the caller holds) that show the snapshot's page
/// read-only, all in one call; whether there were any.
///
/// Asking code where its memory is (`report-memory-origin`) runs guest
/// code, and a read it makes of the snapshot maps the snapshot pages
/// around it read-only (fault-around, 64 KiB by default). Populating such
/// a page writable replaces its entry, which flushes it from every other
/// core running the process: one interprocessor interrupt per page.
/// Unmapped together first, they cost one flush, and populating them costs
/// none. Neither the JavaScript engine nor the SDK reads anything there
/// any more (until 2026-12-04 the engine's export read wit-bindgen's
/// once-only constructor flag among its statics, and this found 5 of a
/// counter's 16 pages mapped on every wake), so this finds nothing, and a
/// write set stops asking once [`CLEAN_CHECKS`] prefaults in a row found
/// nothing; it stays for code that does read, and kernels set to map more
/// around a fault.
fn unmap_snapshot_pages(runs: &[(usize, usize)]) -> std::io::Result<bool> {
    let (Some(&(first, _)), Some(&(last, last_len))) = (runs.first(), runs.last()) else {
        return Ok(false);
    };
    let page = page_size();
    let entries = pagemap_entries(first, (last + last_len - first) / page)?;
    let mut mapped = vec![false; entries.len()];
    for &(start, len) in runs {
        let from = (start - first) / page;
        for i in from..from + len / page {
            mapped[i] = shows_the_file(entries[i]);
        }
    }
    let to_unmap = page_runs(first, &mapped, page);
    discard(&to_unmap)?;
    Ok(!to_unmap.is_empty())
}

/// Whether prefaulting is on: `MARMOT_JS_PREFAULT=0` turns it off, to
/// measure what it does side by side.
pub(super) fn enabled() -> bool {
    static ON: OnceLock<bool> = OnceLock::new();
    *ON.get_or_init(|| std::env::var_os("MARMOT_JS_PREFAULT").is_none_or(|v| v != "0"))
        && POPULATE.load(Ordering::Relaxed)
}

/// Populate the pages of `runs` (start, length; page-aligned, inside a
/// sandbox's accessible linear memory, whose store the caller holds)
/// writable, all in one call where the kernel allows (see
/// [`advise`](super::advise)); the number of pages asked for.
pub(super) fn populate(runs: &[(usize, usize)]) -> std::io::Result<usize> {
    static BATCHING: super::advise::Batching = super::advise::Batching::new();
    if !enabled() {
        return Ok(0);
    }
    #[allow(unsafe_code, reason = "populating pages of a guest's memory")]
    // SAFETY: every run is page-aligned and inside a sandbox's accessible
    // linear memory, a private mapping, and no guest code runs in it
    // meanwhile (the caller holds the store). Populating writes nothing:
    // each page keeps the content the guest would have read.
    let r = unsafe { super::advise::advise(runs, libc::MADV_POPULATE_WRITE, &BATCHING) };
    if let Err(e) = r {
        if e.raw_os_error() == Some(libc::EINVAL) {
            // Not this kernel (before 5.14).
            POPULATE.store(false, Ordering::Relaxed);
        }
        return Err(e);
    }
    Ok(runs.iter().map(|r| r.1 / page_size()).sum())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::sandbox::test_mapping::Mapping;

    #[test]
    fn learns_the_pages_every_sample_wrote_then_populates_them() {
        let set = WriteSet::default();
        for sample in 0..SAMPLES {
            let taken = set.sample().expect("a sample");
            let m = Mapping::new(16);
            for page in [2, 3, 7] {
                m.write(page);
            }
            // Written by one sample only: not learned.
            if sample == 0 {
                m.write(9);
            }
            set.learn(taken, m.origin()).unwrap();
        }
        assert!(set.sample().is_none());
        let fresh = Mapping::new(16);
        assert_eq!(fresh.private(), Vec::<usize>::new());
        assert_eq!(set.prefault(fresh.origin()).unwrap(), 3);
        assert_eq!(fresh.private(), vec![2, 3, 7]);
        // A smaller memory gets the learned pages that fit in it.
        let small = Mapping::new(3);
        assert_eq!(set.prefault(small.origin()).unwrap(), 1);
        assert_eq!(small.private(), vec![2]);
    }

    #[test]
    fn the_set_is_learned_again_from_later_samples() {
        let set = WriteSet::relearning_after(3);
        let report = |taken: Sample, pages: &[usize]| {
            let m = Mapping::new(16);
            for &page in pages {
                m.write(page);
            }
            set.learn(taken, m.origin()).unwrap();
        };
        let sample = |pages: &[usize]| report(set.sample().expect("a sample"), pages);
        // The first round samples every fresh sandbox until it has learned;
        // one still out then reports too late to count.
        let late = set.sample().expect("a sample");
        for _ in 0..SAMPLES {
            sample(&[2, 3, 7]);
        }
        report(late, &[9]);
        // Prefaulted from the first set until the third sandbox since.
        for _ in 0..2 {
            assert!(set.sample().is_none());
            let fresh = Mapping::new(16);
            set.prefault(fresh.origin()).unwrap();
            assert_eq!(fresh.private(), vec![2, 3, 7]);
        }
        // The load changed: the next samples write other pages. A round
        // hands out only its samples, and one whose turn failed never
        // reports: the round waits, prefaulting from the old set, until it
        // is due again.
        let _lost = set.sample().expect("a sample");
        for _ in 1..SAMPLES {
            sample(&[2, 5]);
        }
        for _ in 0..2 {
            assert!(set.sample().is_none());
        }
        let fresh = Mapping::new(16);
        set.prefault(fresh.origin()).unwrap();
        assert_eq!(fresh.private(), vec![2, 3, 7]);
        sample(&[2, 5]);
        assert!(set.sample().is_none());
        let fresh = Mapping::new(16);
        assert_eq!(set.prefault(fresh.origin()).unwrap(), 2);
        assert_eq!(fresh.private(), vec![2, 5]);
    }

    #[test]
    fn snapshot_pages_mapped_read_only_are_unmapped_before_populating() {
        let m = Mapping::of_file(6);
        for page in 0..6 {
            assert_eq!(m.read(page), page as u8 + 1);
        }
        m.write(3);
        assert_eq!(m.present(), [0, 1, 2, 3, 4, 5]);
        assert_eq!(m.private(), [3]);
        let runs = [m.run(1, 3), m.run(5, 1)];
        unmap_snapshot_pages(&runs).unwrap();
        // The file's pages in the runs are gone; the written copy and the
        // pages outside the runs stay.
        assert_eq!(m.present(), [0, 3, 4]);
        assert_eq!(m.private(), [3]);
        assert_eq!(populate(&runs).unwrap(), 4);
        assert_eq!(m.private(), [1, 2, 3, 5]);
        let bytes: Vec<u8> = (0..6).map(|page| m.read(page)).collect();
        assert_eq!(bytes, [1, 2, 3, 1, 5, 6], "the guest sees no difference");
    }

    #[test]
    fn stops_looking_for_mapped_pages_once_none_are_found_until_learned_again() {
        let set = WriteSet::relearning_after(2 * CLEAN_CHECKS);
        // Learn pages 1 and 2, from `first` and as many more samples as
        // that takes.
        let learn = |set: &WriteSet, mut first: Option<Sample>| {
            for _ in 0..SAMPLES {
                let taken = first
                    .take()
                    .unwrap_or_else(|| set.sample().expect("a sample"));
                let m = Mapping::of_file(4);
                m.write(1);
                m.write(2);
                set.learn(taken, m.origin()).unwrap();
            }
        };
        let checks = |set: &WriteSet| set.clean_checks.load(Ordering::Relaxed);
        // A fresh sandbox of `Mapping::of_file(4)`, page 1 read (mapped
        // read-only) if `read`, prefaulted; what it shows after.
        let prefault = |set: &WriteSet, read: bool| {
            let m = Mapping::of_file(4);
            if read {
                m.read(1);
            }
            assert!(set.sample().is_none());
            assert_eq!(set.prefault(m.origin()).unwrap(), 2);
            let bytes: Vec<u8> = (0..4).map(|page| m.read(page)).collect();
            assert_eq!(bytes, [1, 2, 3, 4], "the guest sees no difference");
            m.private()
        };
        learn(&set, None);
        for _ in 0..3 {
            prefault(&set, false);
        }
        assert_eq!(checks(&set), 3);
        // Found one: counting starts again.
        prefault(&set, true);
        assert_eq!(checks(&set), 0);
        for _ in 0..CLEAN_CHECKS {
            prefault(&set, false);
        }
        assert_eq!(checks(&set), CLEAN_CHECKS);
        // No longer looked for: populating copies the mapped page all the
        // same (replacing its entry, a flush on a busy machine).
        assert_eq!(prefault(&set, true), [1, 2]);
        assert_eq!(checks(&set), CLEAN_CHECKS);
        // Learned again (the round is due): looked for again.
        let due = std::iter::repeat_with(|| set.sample())
            .take(2 * CLEAN_CHECKS as usize)
            .flatten()
            .next();
        assert!(due.is_some(), "a round of samples is due");
        learn(&set, due);
        assert_eq!(checks(&set), 0);
    }
}
