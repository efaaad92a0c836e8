//! Bytes of files that turns in flight add to their type, counted before
//! they commit.
//!
//! A type's file quota used to be checked against what was committed plus
//! the checking turn's own change, so turns of different actors running at
//! once each saw room that only one of them had: eight concurrent 200 kB
//! writes stored 1.2 MB against an 800 kB quota. A turn now reserves what
//! it adds as it writes, and the reservation is let go when its commit is
//! over (the committed count has it then) or the turn fails. Between the
//! two, bytes are counted twice for a moment, which can only refuse early,
//! never let a type past its quota.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

/// Reserved bytes per type, on this node.
#[derive(Debug, Default)]
pub struct FileReservations {
    by_type: Mutex<HashMap<String, u64>>,
}

/// One turn's reservation for its type; let go when dropped.
#[derive(Debug)]
pub struct Reservation {
    owner: Arc<FileReservations>,
    ty: String,
    bytes: u64,
}

impl FileReservations {
    /// An empty reservation for a turn of `ty`.
    pub fn start(self: &Arc<Self>, ty: &str) -> Reservation {
        Reservation {
            owner: self.clone(),
            ty: ty.to_owned(),
            bytes: 0,
        }
    }

    /// Bytes reserved for `ty` by every turn.
    pub fn reserved(&self, ty: &str) -> u64 {
        self.lock().get(ty).copied().unwrap_or(0)
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<String, u64>> {
        self.by_type.lock().unwrap_or_else(|e| e.into_inner())
    }
}

impl Reservation {
    /// Reserve `bytes` more if the type then holds at most `limit`:
    /// `committed` (what its committed files take), plus what every turn
    /// reserved, plus `own_change` (this turn's net change so far, negative
    /// when it deleted more than it wrote) minus this turn's own
    /// reservation (already in `own_change`), plus `bytes`. Otherwise the
    /// total it would make, and nothing is reserved.
    pub fn grow(
        &mut self,
        bytes: u64,
        committed: u64,
        own_change: i64,
        limit: u64,
    ) -> Result<(), u64> {
        let mut by_type = self.owner.lock();
        let all = by_type.get(&self.ty).copied().unwrap_or(0);
        let others = all.saturating_sub(self.bytes);
        let after = committed
            .saturating_add(others)
            .saturating_add_signed(own_change)
            .saturating_add(bytes);
        if after > limit {
            return Err(after);
        }
        *by_type.entry(self.ty.clone()).or_default() = all + bytes;
        self.bytes += bytes;
        Ok(())
    }

    /// Bytes this turn reserved.
    pub fn bytes(&self) -> u64 {
        self.bytes
    }
}

impl Drop for Reservation {
    fn drop(&mut self) {
        if self.bytes == 0 {
            return;
        }
        let mut by_type = self.owner.lock();
        if let Some(n) = by_type.get_mut(&self.ty) {
            *n = n.saturating_sub(self.bytes);
            if *n == 0 {
                by_type.remove(&self.ty);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn turns_of_one_type_share_its_room_and_give_it_back() {
        let r = Arc::new(FileReservations::default());
        let mut a = r.start("t");
        let mut b = r.start("t");
        assert_eq!(a.grow(500, 200, 0, 1000), Ok(()));
        // b sees a's 500: 200 + 500 + 400 > 1000.
        assert_eq!(b.grow(400, 200, 0, 1000), Err(1100));
        assert_eq!(b.grow(300, 200, 0, 1000), Ok(()));
        // a's own reservation is in its own change, not counted twice.
        assert_eq!(a.grow(0, 200, 500, 1000), Ok(()));
        // Another type is apart.
        let mut c = r.start("u");
        assert_eq!(c.grow(1000, 0, 0, 1000), Ok(()));
        assert_eq!(r.reserved("t"), 800);
        drop(a);
        assert_eq!(r.reserved("t"), 300);
        drop(b);
        drop(c);
        assert_eq!(r.reserved("t"), 0);
        assert!(r.lock().is_empty());
    }
}
