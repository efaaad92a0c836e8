//! The node's bound on the outbound response bodies it holds at once.
//!
//! A buffered fetch (a guest's `http.fetch`, a model call that does not
//! stream) reads its whole response into the host's memory before the
//! caller sees any of it. Each is capped (`egress.max_response_bytes`,
//! 16 MiB), and a type's fetches in flight by its `http_concurrency`, but
//! nothing bounded the sum: one type with `http_concurrency = 128` fetching
//! 8 MiB bodies from a slow server got a node in a 1 GiB cgroup killed by
//! the kernel within three seconds. Every buffered body is now charged
//! against `limits.egress_response_budget_bytes`:
//!
//! * a body of declared length is charged that length before it is read,
//!   waiting for room (in arrival order) within the request's own timeout;
//!   a body larger than the whole budget is charged the whole budget, so it
//!   is read alone rather than never;
//! * a body of unknown length (chunked) is charged what its buffer holds
//!   as it grows, waiting for room the same way. Waiting while holding part
//!   of the budget can deadlock: when a growth would leave *every* holder
//!   waiting for another's bytes, the waiting body that holds least (the
//!   one asking, if none holds less) fails, with a message naming the
//!   limit, and what it held lets the others go on. Failing the one asking
//!   would fail the body that just made progress, again and again: in a
//!   burst of 128 chunked 8 MiB bodies on a 64 MiB budget that failed 104
//!   of them. A charge never passes the whole budget: a body that outgrows
//!   it is read alone.
//!
//! The charge is held until the body is handed on (to the guest, or parsed
//! by the model gateway). Streamed bodies (`fetch-stream`, streamed model
//! calls) hold one chunk at a time and are not charged.

use std::sync::{Arc, Mutex};

use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::gauge::Gauge;
use tokio::sync::{Notify, OwnedSemaphorePermit, Semaphore};
use tokio::time::Instant;

/// Charges are counted in units of this many bytes (rounded up), so that a
/// budget past 4 GiB still fits the semaphore's `u32` acquisitions.
const UNIT: u64 = 1 << 10;

/// Bytes of buffered outbound responses, against the budget.
pub struct ResponseBudget {
    /// The budget in bytes (`u64::MAX`: none).
    limit: u64,
    /// The budget in units.
    whole: u32,
    units: Arc<Semaphore>,
    parties: Mutex<Parties>,
    /// Signalled whenever a charge is given back.
    released: Notify,
    held: Gauge,
    refused: Counter,
}

/// Who holds part of the budget, and which of them wait for more.
#[derive(Default)]
struct Parties {
    holders: usize,
    waiters: Vec<Waiting>,
    next_id: u64,
}

/// A holder waiting for more.
struct Waiting {
    id: u64,
    /// What it holds.
    units: u32,
    /// Chosen to give up (it holds least, and every holder was waiting).
    yields: bool,
}

impl Parties {
    /// Holders waiting and not chosen to give up.
    fn waiting(&self) -> usize {
        self.waiters.iter().filter(|w| !w.yields).count()
    }
}

/// A response's charge, given back when dropped.
pub struct ResponseCharge {
    budget: Arc<ResponseBudget>,
    permit: Option<OwnedSemaphorePermit>,
}

/// The budget had no room for a growth.
#[derive(Debug)]
pub struct NoRoom {
    /// Bytes charged (to every response) when it was refused.
    pub held: u64,
    /// The budget.
    pub limit: u64,
    /// Every holder would have waited for another: the growth could never
    /// have fit (else its request's deadline passed while it waited).
    pub deadlock: bool,
}

impl ResponseBudget {
    /// A budget of `limit` bytes (`u64::MAX`: none), counted in `held` and
    /// `refused`.
    pub fn new(limit: u64, held: Gauge, refused: Counter) -> Arc<Self> {
        let whole = (limit / UNIT).clamp(1, u64::from(u32::MAX)) as u32;
        Arc::new(Self {
            limit,
            whole,
            units: Arc::new(Semaphore::new(whole as usize)),
            parties: Mutex::default(),
            released: Notify::new(),
            held,
            refused,
        })
    }

    /// No bound (a client without a node: tools, unit tests).
    pub fn unbounded() -> Arc<Self> {
        Self::new(u64::MAX, Gauge::default(), Counter::default())
    }

    /// The budget in bytes (`u64::MAX`: none).
    pub fn limit(&self) -> u64 {
        self.limit
    }

    /// Bytes charged now.
    pub fn held(&self) -> u64 {
        self.held.get().max(0) as u64
    }

    /// A charge of nothing, to [`grow`](Self::grow).
    pub fn empty(self: &Arc<Self>) -> ResponseCharge {
        ResponseCharge {
            budget: self.clone(),
            permit: None,
        }
    }

    /// Wait until `bytes` (at most the whole budget) fit, then charge them;
    /// refused if `deadline` comes first.
    pub async fn reserve(
        self: &Arc<Self>,
        bytes: u64,
        deadline: Instant,
    ) -> Result<ResponseCharge, NoRoom> {
        let mut charge = self.empty();
        let n = bytes.div_ceil(UNIT).min(u64::from(self.whole)) as u32;
        if n > 0 {
            let acquire = self.units.clone().acquire_many_owned(n);
            let permit = tokio::time::timeout_at(deadline, acquire)
                .await
                .map_err(|_| self.no_room(false))?
                .expect("the budget's semaphore is never closed");
            charge.add(permit);
        }
        Ok(charge)
    }

    /// Charge `bytes` more to `charge` (a charge stops at the whole
    /// budget), waiting for room until `deadline`, unless every holder
    /// would then be waiting and this one holds least.
    pub async fn grow(
        &self,
        charge: &mut ResponseCharge,
        bytes: u64,
        deadline: Instant,
    ) -> Result<(), NoRoom> {
        let mine = charge.units();
        let n = bytes.div_ceil(UNIT).min(u64::from(self.whole - mine)) as u32;
        if n == 0 {
            return Ok(());
        }
        loop {
            // Listen before looking, so that a release in between is seen.
            let released = self.released.notified();
            tokio::pin!(released);
            released.as_mut().enable();
            let waiter = {
                let mut parties = self.parties.lock().unwrap();
                if let Ok(permit) = self.units.clone().try_acquire_many_owned(n) {
                    drop(parties);
                    charge.add(permit);
                    return Ok(());
                }
                // Holding nothing, a wait blocks no one.
                if mine > 0 && parties.waiting() + 1 >= parties.holders {
                    let least = parties
                        .waiters
                        .iter_mut()
                        .filter(|w| !w.yields && w.units < mine)
                        .min_by_key(|w| w.units);
                    let Some(least) = least else {
                        drop(parties);
                        return Err(self.no_room(true));
                    };
                    least.yields = true;
                    self.released.notify_waiters();
                }
                Waiter::enter(self, &mut parties, mine)
            };
            let got = tokio::select! {
                permit = self.units.clone().acquire_many_owned(n) => {
                    permit.expect("the budget's semaphore is never closed")
                }
                () = released => {
                    if waiter.yields() {
                        return Err(self.no_room(true));
                    }
                    // Something was given back: look again.
                    continue;
                }
                () = tokio::time::sleep_until(deadline) => return Err(self.no_room(false)),
            };
            drop(waiter);
            charge.add(got);
            return Ok(());
        }
    }

    fn no_room(&self, deadlock: bool) -> NoRoom {
        self.refused.inc();
        NoRoom {
            held: self.held(),
            limit: self.limit,
            deadlock,
        }
    }
}

/// A holder listed as waiting for more, until dropped (however its wait
/// ends: room, a release, its deadline, or its fetch being dropped).
struct Waiter<'a> {
    budget: &'a ResponseBudget,
    /// Its id in the list (`None`: it holds nothing, so it is not listed).
    id: Option<u64>,
}

impl<'a> Waiter<'a> {
    fn enter(budget: &'a ResponseBudget, parties: &mut Parties, units: u32) -> Self {
        let id = (units > 0).then(|| {
            let id = parties.next_id;
            parties.next_id += 1;
            parties.waiters.push(Waiting {
                id,
                units,
                yields: false,
            });
            id
        });
        Self { budget, id }
    }

    /// Whether it was chosen to give up.
    fn yields(&self) -> bool {
        let parties = self.budget.parties.lock().unwrap();
        self.id
            .is_some_and(|id| parties.waiters.iter().any(|w| w.id == id && w.yields))
    }
}

impl Drop for Waiter<'_> {
    fn drop(&mut self) {
        if let Some(id) = self.id {
            let mut parties = self.budget.parties.lock().unwrap();
            parties.waiters.retain(|w| w.id != id);
        }
    }
}

impl ResponseCharge {
    fn add(&mut self, permit: OwnedSemaphorePermit) {
        let budget = &self.budget;
        budget
            .held
            .inc_by(permit.num_permits() as i64 * UNIT as i64);
        match &mut self.permit {
            Some(p) => p.merge(permit),
            None => {
                budget.parties.lock().unwrap().holders += 1;
                self.permit = Some(permit);
            }
        }
    }

    fn units(&self) -> u32 {
        self.permit.as_ref().map_or(0, |p| p.num_permits() as u32)
    }

    /// Bytes charged (rounded up to whole units).
    pub fn bytes(&self) -> u64 {
        u64::from(self.units()) * UNIT
    }
}

impl Drop for ResponseCharge {
    fn drop(&mut self) {
        let Some(permit) = self.permit.take() else {
            return;
        };
        let budget = &self.budget;
        budget
            .held
            .dec_by(permit.num_permits() as i64 * UNIT as i64);
        drop(permit);
        budget.parties.lock().unwrap().holders -= 1;
        budget.released.notify_waiters();
    }
}

impl std::fmt::Debug for ResponseCharge {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ResponseCharge")
            .field("bytes", &self.bytes())
            .finish()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    fn budget(units: u64) -> Arc<ResponseBudget> {
        ResponseBudget::new(units * UNIT, Gauge::default(), Counter::default())
    }

    fn soon() -> Instant {
        Instant::now() + Duration::from_secs(10)
    }

    #[tokio::test]
    async fn declared_lengths_wait_for_room_and_charges_come_back_when_dropped() {
        let budget = budget(100);
        let a = budget.reserve(60 * UNIT, soon()).await.unwrap();
        assert_eq!(budget.held(), 60 * UNIT);
        let b = tokio::spawn({
            let budget = budget.clone();
            async move { budget.reserve(50 * UNIT, soon()).await.unwrap() }
        });
        tokio::time::sleep(Duration::from_millis(30)).await;
        assert!(!b.is_finished(), "a charge past the budget did not wait");
        drop(a);
        let b = b.await.unwrap();
        assert_eq!((b.bytes(), budget.held()), (50 * UNIT, 50 * UNIT));
        drop(b);
        assert_eq!(budget.held(), 0);
    }

    #[tokio::test]
    async fn growth_waits_for_a_holder_that_is_still_reading() {
        let budget = budget(10);
        let reading = budget.reserve(8 * UNIT, soon()).await.unwrap();
        let mut grown = budget.empty();
        budget.grow(&mut grown, 1, soon()).await.unwrap();
        assert_eq!(grown.bytes(), UNIT, "one byte costs a whole unit");
        // 2 more units do not fit while the reader holds 8: wait for it.
        let wait = tokio::spawn({
            let budget = budget.clone();
            async move {
                budget.grow(&mut grown, 2 * UNIT, soon()).await.unwrap();
                grown
            }
        });
        tokio::time::sleep(Duration::from_millis(30)).await;
        assert!(!wait.is_finished());
        drop(reading);
        let grown = wait.await.unwrap();
        assert_eq!(grown.bytes(), 3 * UNIT);
        assert_eq!(budget.refused.get(), 0);
    }

    #[tokio::test]
    async fn growth_that_would_leave_every_holder_waiting_fails_at_once() {
        let budget = budget(10);
        let (mut a, mut b) = (budget.empty(), budget.empty());
        budget.grow(&mut a, 5 * UNIT, soon()).await.unwrap();
        budget.grow(&mut b, 4 * UNIT, soon()).await.unwrap();
        // `a` waits for room: `b` may still finish.
        let a_waits = tokio::spawn({
            let budget = budget.clone();
            async move {
                let r = budget.grow(&mut a, 3 * UNIT, soon()).await;
                (r, a)
            }
        });
        tokio::time::sleep(Duration::from_millis(30)).await;
        assert!(!a_waits.is_finished());
        // `b` wanting more too would leave both waiting forever: refused.
        let no = budget.grow(&mut b, 3 * UNIT, soon()).await.unwrap_err();
        assert!(no.deadlock);
        assert_eq!((no.held, no.limit), (9 * UNIT, 10 * UNIT));
        assert_eq!(b.bytes(), 4 * UNIT, "a refused growth charges nothing");
        // Its fetch fails and gives its bytes back; `a` goes on.
        drop(b);
        let (r, a) = a_waits.await.unwrap();
        r.unwrap();
        assert_eq!(a.bytes(), 8 * UNIT);
        assert_eq!(budget.refused.get(), 1);
    }

    #[tokio::test]
    async fn in_a_deadlock_the_waiting_body_that_holds_least_gives_up() {
        let budget = budget(10);
        let (mut small, mut large) = (budget.empty(), budget.empty());
        budget.grow(&mut small, 2 * UNIT, soon()).await.unwrap();
        budget.grow(&mut large, 6 * UNIT, soon()).await.unwrap();
        let small_waits = tokio::spawn({
            let budget = budget.clone();
            async move { budget.grow(&mut small, 3 * UNIT, soon()).await }
        });
        tokio::time::sleep(Duration::from_millis(30)).await;
        assert!(!small_waits.is_finished());
        // The larger one asks too: the smaller gives up, and the larger
        // gets what it held.
        let grew = tokio::time::timeout(
            Duration::from_secs(5),
            budget.grow(&mut large, 3 * UNIT, soon()),
        );
        grew.await
            .expect("the larger body was left waiting")
            .unwrap();
        assert_eq!(large.bytes(), 9 * UNIT);
        let no = small_waits.await.unwrap().unwrap_err();
        assert!(no.deadlock);
        assert!(budget.parties.lock().unwrap().waiters.is_empty());
    }

    #[tokio::test]
    async fn a_holder_left_waiting_alone_after_a_release_gives_up() {
        let budget = budget(10);
        let (mut a, mut b) = (budget.empty(), budget.empty());
        budget.grow(&mut a, 6 * UNIT, soon()).await.unwrap();
        budget.grow(&mut b, 4 * UNIT, soon()).await.unwrap();
        let c = tokio::spawn({
            let budget = budget.clone();
            async move { budget.reserve(5 * UNIT, soon()).await.unwrap() }
        });
        tokio::time::sleep(Duration::from_millis(10)).await;
        // `a` waits behind the reservation, while `b` may still finish.
        let a_waits = tokio::spawn({
            let budget = budget.clone();
            async move { budget.grow(&mut a, 4 * UNIT, soon()).await }
        });
        tokio::time::sleep(Duration::from_millis(30)).await;
        assert!(!a_waits.is_finished());
        // `b` finishes; what it gives back goes to the reservation queued
        // first, which needs more still, and `a` is now the only holder, so
        // nothing it waits for can come: it fails instead, and its bytes
        // complete the reservation.
        drop(b);
        let no = tokio::time::timeout(Duration::from_secs(5), a_waits)
            .await
            .expect("a holder waited with nobody left to give anything back")
            .unwrap()
            .unwrap_err();
        assert!(no.deadlock);
        assert_eq!(c.await.unwrap().bytes(), 5 * UNIT);
    }

    #[tokio::test]
    async fn a_wait_ends_at_the_deadline_and_a_dropped_wait_is_not_counted() {
        let budget = budget(10);
        let reading = budget.reserve(9 * UNIT, soon()).await.unwrap();
        let mut a = budget.empty();
        budget.grow(&mut a, UNIT, soon()).await.unwrap();
        let deadline = Instant::now() + Duration::from_millis(50);
        let no = budget.grow(&mut a, 5 * UNIT, deadline).await.unwrap_err();
        assert!(!no.deadlock);
        let deadline = Instant::now() + Duration::from_millis(50);
        let no = budget.reserve(5 * UNIT, deadline).await.unwrap_err();
        assert!(!no.deadlock);
        assert_eq!(budget.refused.get(), 2);
        // A growth whose fetch is dropped while it waits leaves no count.
        let dropped = tokio::time::timeout(
            Duration::from_millis(30),
            budget.grow(&mut a, 5 * UNIT, soon()),
        );
        assert!(dropped.await.is_err());
        assert!(budget.parties.lock().unwrap().waiters.is_empty());
        drop((reading, a));
        assert_eq!(budget.parties.lock().unwrap().holders, 0);
        assert_eq!(budget.held(), 0);
    }

    #[tokio::test]
    async fn no_charge_passes_the_whole_budget() {
        let budget = budget(10);
        let c = budget.reserve(1 << 30, soon()).await.unwrap();
        assert_eq!(c.bytes(), 10 * UNIT);
        let mut other = budget.empty();
        let d = Instant::now() + Duration::from_millis(20);
        assert!(budget.grow(&mut other, 1, d).await.is_err());
        drop(c);
        // A growing body stops being charged at the whole budget.
        budget.grow(&mut other, 1 << 30, soon()).await.unwrap();
        budget.grow(&mut other, 1 << 30, soon()).await.unwrap();
        assert_eq!(other.bytes(), 10 * UNIT);
        // No budget at all: anything fits.
        let none = ResponseBudget::unbounded();
        assert!(none.reserve(u64::MAX / 2, soon()).await.unwrap().bytes() > 0);
    }
}
