//! Bytes of files that turns in flight add to their type, counted before
//! they commit.
//!
//! A type's file quota used to be checked against what was committed plus
//! the checking turn's own change, so turns of different actors running at
//! once each saw room that only one of them had: eight concurrent 200 kB
//! writes stored 1.2 MB against an 800 kB quota. A turn now reserves its
//! net growth as it writes (a delete, a smaller overwrite or a rolled-back
//! child script shrinks it), and the reservation is let go when its commit
//! is over (the committed count has it then) or the turn fails. The
//! committed count is read while the reservations are locked, and a
//! reservation is let go only after its commit, so no bytes go uncounted;
//! between a commit and its release they count twice for a moment, which
//! can only refuse early, never let a type past its quota.

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
    /// Reserve room for `bytes` more if the type then holds at most
    /// `limit`: what its committed files take (`committed`, read while the
    /// reservations are locked, so that no commit slips between the two
    /// counts), plus what other turns reserved, plus `own_change` (this
    /// turn's net change so far) and `bytes`. On success the reservation is
    /// this turn's net growth, `own_change + bytes`; otherwise nothing
    /// changes and the total it would have made is returned.
    pub fn grow<E>(
        &mut self,
        bytes: u64,
        committed: impl FnOnce() -> Result<u64, E>,
        own_change: i64,
        limit: u64,
    ) -> Result<Result<(), u64>, E> {
        let mut by_type = self.owner.lock();
        let all = by_type.get(&self.ty).copied().unwrap_or(0);
        let others = all.saturating_sub(self.bytes);
        let after = committed()?
            .saturating_add(others)
            .saturating_add_signed(own_change)
            .saturating_add(bytes);
        if after > limit {
            return Ok(Err(after));
        }
        let target = own_change.saturating_add_unsigned(bytes).max(0) as u64;
        Self::set(&mut by_type, &self.ty, &mut self.bytes, target);
        Ok(Ok(()))
    }

    /// This turn's net change is now `own_change` (it deleted, or rolled
    /// writes back): a reservation above it shrinks to it, so that other
    /// turns do not count bytes this one no longer adds. Never grows.
    pub fn shrink_to(&mut self, own_change: i64) {
        let target = own_change.max(0) as u64;
        if target < self.bytes {
            let mut by_type = self.owner.lock();
            Self::set(&mut by_type, &self.ty, &mut self.bytes, target);
        }
    }

    fn set(by_type: &mut HashMap<String, u64>, ty: &str, bytes: &mut u64, target: u64) {
        let all = by_type.get(ty).copied().unwrap_or(0);
        let new = all.saturating_sub(*bytes).saturating_add(target);
        if new == 0 {
            by_type.remove(ty);
        } else {
            by_type.insert(ty.to_owned(), new);
        }
        *bytes = target;
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
        let at = |n: u64| move || Ok::<u64, ()>(n);
        let mut a = r.start("t");
        let mut b = r.start("t");
        assert_eq!(a.grow(500, at(200), 0, 1000), Ok(Ok(())));
        // b sees a's 500: 200 + 500 + 400 > 1000.
        assert_eq!(b.grow(400, at(200), 0, 1000), Ok(Err(1100)));
        assert_eq!(b.grow(300, at(200), 0, 1000), Ok(Ok(())));
        // a's own reservation is in its own change, not counted twice.
        assert_eq!(a.grow(0, at(200), 500, 1000), Ok(Ok(())));
        // Another type is apart.
        let mut c = r.start("u");
        assert_eq!(c.grow(1000, at(0), 0, 1000), Ok(Ok(())));
        assert_eq!(r.reserved("t"), 800);
        // a deletes what it wrote (net change 0): the room is back for b.
        a.shrink_to(0);
        assert_eq!(r.reserved("t"), 300);
        assert_eq!(b.grow(500, at(200), 300, 1000), Ok(Ok(())));
        assert_eq!(r.reserved("t"), 800);
        // A write that only replaces what the turn deleted reserves nothing
        // more than the net growth.
        assert_eq!(a.grow(100, at(200), -100, 1000), Ok(Ok(())));
        assert_eq!(a.bytes(), 0);
        drop(a);
        assert_eq!(r.reserved("t"), 800);
        drop(b);
        drop(c);
        assert_eq!(r.reserved("t"), 0);
        assert!(r.lock().is_empty());
        // The committed count's error comes back as it is.
        let mut d = r.start("t");
        assert_eq!(d.grow(1, || Err::<u64, &str>("disk"), 0, 10), Err("disk"));
    }
}
