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
//!   waiting for room within the request's own timeout;
//! * a body of unknown length (chunked) is charged what its buffer holds
//!   as it grows, waiting for room the same way.
//!
//! Room that comes free goes first to the bodies that hold most (they are
//! furthest along, and what they finish with frees the most), then in
//! arrival order; nobody passes the one whose turn it is. Waiting while
//! holding part of the budget can deadlock: when every body holding part
//! of it waits for more, the one holding least gives up (its fetch fails
//! with a message naming the limit) and what it held lets the others go
//! on. A charge never passes the whole budget: a body larger than that is
//! read alone rather than never.
//!
//! Why this order: with room handed out in arrival order, and the body
//! asking failing when all others wait, a burst of 128 chunked 8 MiB
//! bodies on a 64 MiB budget failed 104 of them: freed room went to many
//! small holders, each grew a little and all waited again, and the body
//! failing was the one that had just made progress.
//!
//! The charge is held until the body is handed on (to the guest, or parsed
//! by the model gateway). Streamed bodies (`fetch-stream`, streamed model
//! calls) hold one chunk at a time and are not charged; a streamed model
//! call answered with one JSON document instead is read whole, and charged
//! as it grows like a body of unknown length.

use std::sync::{Arc, Mutex};

use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::gauge::Gauge;
use tokio::sync::Notify;
use tokio::time::Instant;

/// Bytes of buffered outbound responses, against the budget.
pub struct ResponseBudget {
    /// The budget in bytes (`u64::MAX`: none).
    limit: u64,
    state: Mutex<State>,
    held: Gauge,
    refused: Counter,
}

/// What is free, who holds the rest and who waits for it.
struct State {
    free: u64,
    /// Charges holding something.
    holders: usize,
    asks: Vec<Ask>,
    next_id: u64,
}

/// A wait for room.
struct Ask {
    id: u64,
    bytes: u64,
    /// What the asker holds already (0: a body not yet charged).
    holds: u64,
    granted: bool,
    /// Chosen to give up: every holder was waiting, and it held least.
    yields: bool,
    wake: Arc<Notify>,
}

/// A response's charge, given back when dropped.
pub struct ResponseCharge {
    budget: Arc<ResponseBudget>,
    bytes: u64,
}

/// The budget had no room for a charge.
#[derive(Debug)]
pub struct NoRoom {
    /// Bytes charged (to every response) when it was refused.
    pub held: u64,
    /// The budget.
    pub limit: u64,
    /// Every body holding part of the budget was waiting for more, and this
    /// one held least (else its request's deadline passed while it waited).
    pub deadlock: bool,
}

impl State {
    /// Grant what fits, in order: most held first, then first come; stop
    /// at the first ask that does not fit. Then, if every holder waits,
    /// choose the one holding least to give up.
    fn dispatch(&mut self) {
        loop {
            let next = self
                .asks
                .iter_mut()
                .filter(|a| !a.granted && !a.yields)
                .min_by_key(|a| (std::cmp::Reverse(a.holds), a.id));
            let Some(ask) = next else { break };
            if ask.bytes > self.free {
                break;
            }
            self.free -= ask.bytes;
            ask.granted = true;
            ask.wake.notify_one();
        }
        // A grant not yet taken, or a body already giving up, will change
        // things: look again then.
        if self.asks.iter().any(|a| a.granted || a.yields) {
            return;
        }
        let waiting = |a: &&mut Ask| a.holds > 0;
        let stuck = self.asks.iter_mut().filter(waiting).count();
        if stuck > 0 && stuck == self.holders {
            // Of those holding least, the latest to ask.
            let least = self
                .asks
                .iter_mut()
                .filter(waiting)
                .min_by_key(|a| (a.holds, std::cmp::Reverse(a.id)))
                .expect("some holder waits");
            least.yields = true;
            least.wake.notify_one();
        }
    }
}

impl ResponseBudget {
    /// A budget of `limit` bytes (`u64::MAX`: none), counted in `held` and
    /// `refused`.
    pub fn new(limit: u64, held: Gauge, refused: Counter) -> Arc<Self> {
        Arc::new(Self {
            limit,
            state: Mutex::new(State {
                free: limit,
                holders: 0,
                asks: Vec::new(),
                next_id: 0,
            }),
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
        self.limit - self.state.lock().unwrap().free
    }

    /// A charge of nothing, to [`grow`](Self::grow).
    pub fn empty(self: &Arc<Self>) -> ResponseCharge {
        ResponseCharge {
            budget: self.clone(),
            bytes: 0,
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
        self.grow(&mut charge, bytes, deadline).await?;
        Ok(charge)
    }

    /// Charge `bytes` more to `charge` (a charge stops at the whole
    /// budget), waiting for room until `deadline`; refused if the charge
    /// is chosen to give up instead (see the module's documentation).
    pub async fn grow(
        &self,
        charge: &mut ResponseCharge,
        bytes: u64,
        deadline: Instant,
    ) -> Result<(), NoRoom> {
        let bytes = bytes.min(self.limit - charge.bytes);
        if bytes == 0 {
            return Ok(());
        }
        let mut ask = Asking::enter(self, bytes, charge.bytes);
        loop {
            match ask.outcome() {
                Some(true) => {
                    ask.keep();
                    charge.add(bytes);
                    return Ok(());
                }
                Some(false) => return Err(self.no_room(true)),
                None => {}
            }
            if tokio::time::timeout_at(deadline, ask.wake.notified())
                .await
                .is_err()
            {
                // Granted just now? Then it is ours after all.
                if ask.outcome() == Some(true) {
                    continue;
                }
                return Err(self.no_room(false));
            }
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

    /// Give `bytes` back (a charge dropped, or a grant nobody took).
    fn give_back(&self, bytes: u64) {
        let mut state = self.state.lock().unwrap();
        state.free += bytes;
        state.holders -= 1;
        self.settle(&mut state);
    }

    /// Hand out what fits, and count what is held.
    fn settle(&self, state: &mut State) {
        state.dispatch();
        self.held
            .set((self.limit - state.free).min(i64::MAX as u64) as i64);
    }
}

/// An ask in the budget's list, until dropped: however the wait ends (a
/// grant, giving up, the deadline, or the fetch being dropped), the ask
/// leaves the list, and a grant not kept goes back.
struct Asking<'a> {
    budget: &'a ResponseBudget,
    id: u64,
    wake: Arc<Notify>,
    kept: bool,
}

impl<'a> Asking<'a> {
    fn enter(budget: &'a ResponseBudget, bytes: u64, holds: u64) -> Self {
        let wake = Arc::new(Notify::new());
        let mut state = budget.state.lock().unwrap();
        let id = state.next_id;
        state.next_id += 1;
        state.asks.push(Ask {
            id,
            bytes,
            holds,
            granted: false,
            yields: false,
            wake: wake.clone(),
        });
        budget.settle(&mut state);
        Self {
            budget,
            id,
            wake,
            kept: false,
        }
    }

    /// `Some(true)`: granted; `Some(false)`: chosen to give up; `None`:
    /// still waiting.
    fn outcome(&self) -> Option<bool> {
        let state = self.budget.state.lock().unwrap();
        let ask = state.asks.iter().find(|a| a.id == self.id)?;
        if ask.granted {
            Some(true)
        } else if ask.yields {
            Some(false)
        } else {
            None
        }
    }

    /// The grant is taken: dropping the ask leaves it charged.
    fn keep(&mut self) {
        self.kept = true;
    }
}

impl Drop for Asking<'_> {
    fn drop(&mut self) {
        let mut state = self.budget.state.lock().unwrap();
        let Some(i) = state.asks.iter().position(|a| a.id == self.id) else {
            return;
        };
        let ask = state.asks.swap_remove(i);
        if ask.granted && !self.kept {
            state.free += ask.bytes;
        }
        // Whoever was next behind it, or waiting on it, may go on now.
        self.budget.settle(&mut state);
    }
}

impl ResponseCharge {
    fn add(&mut self, bytes: u64) {
        if self.bytes == 0 {
            self.budget.state.lock().unwrap().holders += 1;
        }
        self.bytes += bytes;
    }

    /// Bytes charged.
    pub fn bytes(&self) -> u64 {
        self.bytes
    }
}

impl Drop for ResponseCharge {
    fn drop(&mut self) {
        if self.bytes > 0 {
            self.budget.give_back(self.bytes);
        }
    }
}

impl std::fmt::Debug for ResponseCharge {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ResponseCharge")
            .field("bytes", &self.bytes)
            .finish()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    const UNIT: u64 = 1 << 10;

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
        budget.grow(&mut grown, UNIT, soon()).await.unwrap();
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
        assert!(budget.state.lock().unwrap().asks.is_empty());
    }

    #[tokio::test]
    async fn freed_room_goes_first_to_the_body_that_holds_most() {
        let budget = budget(10);
        let (mut a, mut b) = (budget.empty(), budget.empty());
        budget.grow(&mut a, 6 * UNIT, soon()).await.unwrap();
        budget.grow(&mut b, 4 * UNIT, soon()).await.unwrap();
        // A reservation asks first, then `a` asks for more.
        let c = tokio::spawn({
            let budget = budget.clone();
            async move { budget.reserve(4 * UNIT, soon()).await.unwrap() }
        });
        tokio::time::sleep(Duration::from_millis(10)).await;
        let a_waits = tokio::spawn({
            let budget = budget.clone();
            async move {
                budget.grow(&mut a, 4 * UNIT, soon()).await.unwrap();
                a
            }
        });
        tokio::time::sleep(Duration::from_millis(30)).await;
        assert!(!a_waits.is_finished() && !c.is_finished());
        // `b` finishes: `a`, which holds most, goes on; the reservation
        // waits until `a` is done.
        drop(b);
        let a = a_waits.await.unwrap();
        assert_eq!(a.bytes(), 10 * UNIT);
        tokio::time::sleep(Duration::from_millis(30)).await;
        assert!(!c.is_finished());
        drop(a);
        assert_eq!(c.await.unwrap().bytes(), 4 * UNIT);
    }

    #[tokio::test]
    async fn a_holder_left_waiting_with_no_one_to_free_room_gives_up() {
        let budget = budget(10);
        let (mut a, mut b) = (budget.empty(), budget.empty());
        budget.grow(&mut a, 3 * UNIT, soon()).await.unwrap();
        budget.grow(&mut b, 7 * UNIT, soon()).await.unwrap();
        // `a` waits for more while `b` reads on. When `b` asks for more too,
        // both would wait for ever: `a`, holding less, gives up, and `b`
        // gets what `a` held.
        let a_waits = tokio::spawn({
            let budget = budget.clone();
            async move { budget.grow(&mut a, 2 * UNIT, soon()).await }
        });
        tokio::time::sleep(Duration::from_millis(30)).await;
        assert!(!a_waits.is_finished());
        let b_grows = budget.grow(&mut b, 8 * UNIT, soon());
        let grew = tokio::time::timeout(Duration::from_secs(5), b_grows);
        grew.await.expect("b was left waiting").unwrap();
        assert_eq!(b.bytes(), 10 * UNIT, "a charge stops at the whole budget");
        let no = a_waits.await.unwrap().unwrap_err();
        assert!(no.deadlock);
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
        assert!(budget.state.lock().unwrap().asks.is_empty());
        drop((reading, a));
        assert_eq!(budget.state.lock().unwrap().holders, 0);
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
