//! Where a process's physical memory is, by kind of mapping: the PSS of
//! every mapping in `/proc/PID/smaps`, summed by what the mapping holds.
//! The memory scenarios print it per actor, so that a change shows where
//! it moved memory, not only how much.

use std::ops::Sub;

use anyhow::Context;

/// PSS in bytes, by kind of mapping.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub(super) struct PssByKind {
    /// Writable private mappings of a file: guest linear memories mapped
    /// copy-on-write from a memory image (the compiled code's file, or a
    /// `memfd` when the code was compiled in this process): the image's
    /// shared pages, a share each, and the pages the guest copied. Also
    /// the data segments of the binary and its libraries, which do not
    /// grow with actors.
    pub(super) guest_images: u64,
    /// Anonymous mappings exactly one fiber stack long right above an
    /// inaccessible mapping exactly one page long (its guard): the pool's
    /// stacks (each store keeps the one it last ran on). A guest's linear
    /// memory can hold an anonymous region of the same length (a Rust
    /// guest's 1 MiB shadow stack), but the memory pool's guards are
    /// larger.
    pub(super) stacks: u64,
    /// Every other anonymous mapping: the host heap (wasmtime's instance
    /// state, stores, actor tasks, the database cache), pool memory past
    /// the images, tables.
    pub(super) other_anon: u64,
    /// Other file-backed mappings: the binary, libraries, compiled code.
    pub(super) files: u64,
}

impl Sub for PssByKind {
    type Output = PssByKind;

    fn sub(self, base: PssByKind) -> PssByKind {
        PssByKind {
            guest_images: self.guest_images.saturating_sub(base.guest_images),
            stacks: self.stacks.saturating_sub(base.stacks),
            other_anon: self.other_anon.saturating_sub(base.other_anon),
            files: self.files.saturating_sub(base.files),
        }
    }
}

impl PssByKind {
    /// One line, each kind in KB per `n` actors.
    pub(super) fn per_actor(&self, n: usize) -> String {
        let kb = |b: u64| b as f64 / n.max(1) as f64 / 1024.0;
        format!(
            "guest memory images {:.1} KB, fiber stacks {:.1} KB, other anonymous \
             (heap, pools, tables) {:.1} KB, files {:.1} KB",
            kb(self.guest_images),
            kb(self.stacks),
            kb(self.other_anon),
            kb(self.files)
        )
    }
}

/// [`PssByKind`] of process `pid`.
pub(super) fn pss_by_kind(pid: u32) -> anyhow::Result<PssByKind> {
    let smaps = std::fs::read_to_string(format!("/proc/{pid}/smaps"))?;
    use crate::sandbox::{ASYNC_STACK_SIZE, page_size};
    parse(&smaps, ASYNC_STACK_SIZE as u64, page_size() as u64)
}

/// Sum `smaps` (the text of `/proc/PID/smaps`) by kind; `stack` is the
/// length of a fiber stack, `page` of its guard.
fn parse(smaps: &str, stack: u64, page: u64) -> anyhow::Result<PssByKind> {
    let mut out = PssByKind::default();
    let mut kind: Option<fn(&mut PssByKind) -> &mut u64> = None;
    // The mapping before: where it ends, and whether it is one
    // inaccessible page.
    let mut below: Option<(u64, bool)> = None;
    for line in smaps.lines() {
        let mut fields = line.split_whitespace();
        let Some(first) = fields.next() else { continue };
        if let Some((from, to)) = first.split_once('-')
            && let (Ok(from), Ok(to)) = (u64::from_str_radix(from, 16), u64::from_str_radix(to, 16))
        {
            // address perms offset dev inode [name]
            let perms = fields.next().unwrap_or("");
            let name = fields.nth(3).unwrap_or("");
            let guarded = below == Some((from, true));
            below = Some((to, perms == "---p" && to - from == page));
            kind = Some(if name.starts_with('/') && perms == "rw-p" {
                |k| &mut k.guest_images
            } else if name.starts_with('/') {
                |k| &mut k.files
            } else if name.is_empty() && to - from == stack && guarded {
                |k| &mut k.stacks
            } else {
                |k| &mut k.other_anon
            });
        } else if first == "Pss:" {
            let kb: u64 = fields
                .next()
                .and_then(|v| v.parse().ok())
                .context("a Pss line without a number")?;
            let pick = kind.context("a Pss line before any mapping")?;
            *pick(&mut out) += kb * 1024;
        }
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn mappings_are_summed_by_kind() {
        let smaps = "\
7e9ba8df0000-7e9ba8eef000 rw-p 00000000 00:00 0 
Rss:                   8 kB
Pss:                   8 kB
7e9ba8eef000-7e9ba8f80000 rw-p 00000000 00:01 1542                       /memfd:wasm-memory-image (deleted)
Pss:                 104 kB
Pss_Dirty:           104 kB
7e9bacf00000-7e9bacf91000 rw-p 00020000 08:01 77                         /data/code/quickjs.cwasm
Pss:                  20 kB
7df7a1fac000-7df7a1fbc000 ---p 00000000 00:00 0 
Pss:                   0 kB
7df7a1fbc000-7df7a20bc000 rw-p 00000000 00:00 0 
Pss:                   8 kB
7df7a20bc000-7df7a21ac000 rw-p 00000000 00:00 0 
Pss:                   4 kB
7df7a21ac000-7df7a21ad000 ---p 00000000 00:00 0 
Pss:                   0 kB
7df7a21ad000-7df7a22ad000 rw-p 00000000 00:00 0 
Pss:                  12 kB
55d0c0000000-55d0c1000000 r-xp 00000000 08:01 42                         /usr/bin/marmot
Pss:                  40 kB
7ffd00000000-7ffd00021000 rw-p 00000000 00:00 0                          [stack]
Pss:                   4 kB
";
        let k = parse(smaps, 1 << 20, 4096).unwrap();
        assert_eq!(
            k,
            PssByKind {
                guest_images: 124 << 10,
                stacks: 12 << 10,
                other_anon: 24 << 10,
                files: 40 << 10,
            }
        );
        assert!(parse("Pss: 4 kB\n", 1 << 20, 4096).is_err());
    }
}
