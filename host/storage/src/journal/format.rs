//! The journal's persisted format, in one place: the constants and layout
//! of its files, the checksums, and how a log and its records are read
//! back. Writing records is `super::Journaled`'s.

use std::fs::File;
use std::io;
use std::os::unix::fs::{FileExt, MetadataExt};

// ---- Persisted format (version 1) -------------------------------------
//
// A log file is `size` bytes, preallocated with zeros (written, not sparse:
// writing into unwritten extents would make every `fdatasync` a metadata
// commit too).
//
// Header, at offset 0 (its own 4 KiB block):
//   0..16  FILE_MAGIC
//  16..20  FORMAT (u32 LE)
//  20..24  CRC-32 of bytes 24..64
//  24..32  epoch (u64 LE): which records belong to this log's current use
//  32..40  device of the database file (u64 LE)
//  40..48  inode of the database file (u64 LE)
//  48..56  creation time of the database file, ns since the epoch (u64 LE;
//          0 where the file system does not keep it)
//  56..64  zero
//
// Records, from offset BLOCK, each starting on a BLOCK boundary:
//   0..4   RECORD_MAGIC (u32 LE)
//   4..8   CRC-32 of the database file's identity (device, inode,
//          creation time, u64 LE each), then bytes 8..RECORD_HEADER + body
//          length
//   8..16  epoch (u64 LE), equal to the header's
//  16..24  seq (u64 LE): 0, 1, 2, … within the epoch
//  24..32  body length (u64 LE)
//  body: operations, in the order they were made:
//   OP_WRITE   u8, offset u64 LE, length u64 LE, the bytes
//   OP_SET_LEN u8, length u64 LE

pub(super) const FILE_MAGIC: &[u8; 16] = b"marmot-journal\0\0";
/// Version of the log format above.
pub const FORMAT: u32 = 1;
pub(super) const RECORD_MAGIC: u32 = u32::from_le_bytes(*b"MJR1");
pub(super) const BLOCK: u64 = 4096;
pub(super) const HEADER_LEN: usize = 64;
pub(super) const RECORD_HEADER: usize = 32;
pub(super) const OP_WRITE: u8 = 1;
pub(super) const OP_SET_LEN: u8 = 2;

pub(super) fn crc(bytes: &[u8]) -> u32 {
    crc32fast::hash(bytes)
}

/// A record's checksum: over the database file's identity, then `parts`
/// (bytes 8.. of the record). With the identity in it, a record left in a
/// log file by another database never validates, whatever its epoch.
pub(super) fn record_crc(identity: Identity, parts: &[&[u8]]) -> u32 {
    let mut sum = crc32fast::Hasher::new();
    for n in [identity.0, identity.1, identity.2] {
        sum.update(&n.to_le_bytes());
    }
    for p in parts {
        sum.update(p);
    }
    sum.finalize()
}

pub(super) fn u64_at(b: &[u8], at: usize) -> u64 {
    u64::from_le_bytes(b[at..at + 8].try_into().expect("8 bytes"))
}

pub(super) fn u32_at(b: &[u8], at: usize) -> u32 {
    u32::from_le_bytes(b[at..at + 4].try_into().expect("4 bytes"))
}

pub(super) fn align(n: u64) -> u64 {
    n.div_ceil(BLOCK) * BLOCK
}

/// Which database file a log belongs to: device, inode and creation time
/// (an inode number alone is often reused by the next file created).
pub(super) type Identity = (u64, u64, u64);

pub(super) fn identity_of(file: &File) -> io::Result<Identity> {
    let meta = file.metadata()?;
    let born = meta
        .created()
        .ok()
        .and_then(|t| t.duration_since(std::time::UNIX_EPOCH).ok())
        .map_or(0, |d| d.as_nanos() as u64);
    Ok((meta.dev(), meta.ino(), born))
}

pub(super) fn header_bytes(epoch: u64, identity: Identity) -> [u8; HEADER_LEN] {
    let mut h = [0u8; HEADER_LEN];
    h[..16].copy_from_slice(FILE_MAGIC);
    h[16..20].copy_from_slice(&FORMAT.to_le_bytes());
    h[24..32].copy_from_slice(&epoch.to_le_bytes());
    h[32..40].copy_from_slice(&identity.0.to_le_bytes());
    h[40..48].copy_from_slice(&identity.1.to_le_bytes());
    h[48..56].copy_from_slice(&identity.2.to_le_bytes());
    let sum = crc(&h[24..]);
    h[20..24].copy_from_slice(&sum.to_le_bytes());
    h
}

/// One operation read back from a log.
#[derive(Debug, PartialEq)]
pub(super) enum Op<'a> {
    Write(u64, &'a [u8]),
    SetLen(u64),
}

/// Where a log is read from: a file, or its bytes (tests).
pub(super) trait LogSource {
    fn size(&self) -> io::Result<u64>;
    fn read(&self, at: u64, n: usize) -> io::Result<Vec<u8>>;
}

impl LogSource for File {
    fn size(&self) -> io::Result<u64> {
        Ok(self.metadata()?.len())
    }
    fn read(&self, at: u64, n: usize) -> io::Result<Vec<u8>> {
        let mut buf = vec![0; n];
        self.read_exact_at(&mut buf, at)?;
        Ok(buf)
    }
}

impl LogSource for [u8] {
    fn size(&self) -> io::Result<u64> {
        Ok(self.len() as u64)
    }
    fn read(&self, at: u64, n: usize) -> io::Result<Vec<u8>> {
        Ok(self[at as usize..at as usize + n].to_vec())
    }
}

/// A log's epoch and its valid records' bodies, in order, if its header is
/// valid and names the database file `identity`. Reads the records one by
/// one and stops at the first that is not valid, so an empty log costs two
/// small reads, not a read of the whole file.
pub(super) fn scan(
    src: &(impl LogSource + ?Sized),
    identity: Identity,
) -> io::Result<Option<(u64, Vec<Vec<u8>>)>> {
    let size = src.size()?;
    if size < BLOCK {
        return Ok(None);
    }
    let h = src.read(0, HEADER_LEN)?;
    if &h[..16] != FILE_MAGIC
        || u32_at(&h, 16) != FORMAT
        || u32_at(&h, 20) != crc(&h[24..])
        || (u64_at(&h, 32), u64_at(&h, 40), u64_at(&h, 48)) != identity
    {
        return Ok(None);
    }
    let epoch = u64_at(&h, 24);
    let mut records = Vec::new();
    let mut at = BLOCK;
    let mut seq = 0u64;
    while at + RECORD_HEADER as u64 <= size {
        let r = src.read(at, RECORD_HEADER)?;
        let len = u64_at(&r, 24);
        let end = at + RECORD_HEADER as u64;
        if u32_at(&r, 0) != RECORD_MAGIC
            || u64_at(&r, 8) != epoch
            || u64_at(&r, 16) != seq
            || len > size - end
        {
            break;
        }
        let body = src.read(end, len as usize)?;
        if record_crc(identity, &[&r[8..], &body]) != u32_at(&r, 4) {
            break;
        }
        records.push(body);
        seq += 1;
        at = align(end + len);
    }
    Ok(Some((epoch, records)))
}

/// The operations of a record's body; `None` if it does not parse (a bug or
/// damage the checksum missed: the record is not applied).
pub(super) fn ops(body: &[u8]) -> Option<Vec<Op<'_>>> {
    let mut out = Vec::new();
    let mut at = 0;
    while at < body.len() {
        match body[at] {
            OP_WRITE => {
                let offset = u64_at(body.get(at + 1..at + 9)?, 0);
                let len = usize::try_from(u64_at(body.get(at + 9..at + 17)?, 0)).ok()?;
                let data = body.get(at + 17..(at + 17).checked_add(len)?)?;
                out.push(Op::Write(offset, data));
                at += 17 + len;
            }
            OP_SET_LEN => {
                out.push(Op::SetLen(u64_at(body.get(at + 1..at + 9)?, 0)));
                at += 9;
            }
            _ => return None,
        }
    }
    Some(out)
}
