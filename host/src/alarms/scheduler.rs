//! The alarm scheduler: one task per node that delivers due alarms.
//!
//! It holds in memory only the alarms due within [`HORIZON_MS`] (read from
//! the due index, re-read every `alarms.reload_ms`, 20 s), kept current
//! between reloads by notices from commits that set, move or remove alarms.
//! It reads at most `alarms.reload_batch` of them at a time: a larger
//! backlog (a node back after a long stop) is read a piece at a time, the
//! next piece as soon as most of the last one has gone out. When an alarm
//! is due — never before — it is delivered to its actor, waking it if needed,
//! and holds one of a bounded number of permits until its turn has run
//! (its commit, which takes no CPU, is awaited without one). The permits
//! are what spreads the wake-ups after a restart with many overdue alarms:
//! they go out as fast as turns run, not at once, and no more alarm turns
//! compete for the cores than that: with a permit held to durability, the
//! bound had to be 256 for commits to overlap, and 2,500 alarm handlers of
//! 15 ms of CPU each slowed every other request to 1–2 s (found by a
//! probe).
//!
//! The scheduler's memory is only a cache of the due index: anything it
//! misses (a refused delivery, a lost notice, a crash) the next reload finds,
//! and the actor checks every delivery against its current alarm, so a stale
//! entry costs at most a skipped delivery.

use std::collections::{BTreeSet, HashMap};
use std::sync::Arc;
use std::time::Duration;

use tokio::sync::{OwnedSemaphorePermit, Semaphore, mpsc};

use crate::clock::now_ms;
use crate::config::AlarmsConfig;
use crate::ids::ActorKey;
use crate::storage::Storage;
use crate::throttle::LogThrottle;

/// How far ahead the scheduler keeps alarms in memory.
pub const HORIZON_MS: u64 = 60_000;
/// Delay before delivering again an alarm whose delivery went wrong.
const REDELIVER_MS: u64 = 200;

/// The "cannot read an actor key" line's throttle.
static ACTOR_KEY_LOG: LogThrottle = LogThrottle::new(Duration::from_secs(5));

/// One alarm: (actor number, alarm name).
type AlarmId = (u64, String);

/// What the scheduler hears about.
#[derive(Debug)]
pub enum Notice {
    /// A durable commit set or moved (`Some(due)`) or removed an alarm.
    Set {
        /// Actor number.
        num: u64,
        /// Alarm name.
        name: String,
        /// When it is due now.
        due_ms: Option<u64>,
    },
    /// Re-read the due index now (this node just took over actors whose
    /// alarms were written by another node).
    Reload,
    /// A delivered alarm's turn has run: its permit is free.
    Ran,
    /// A delivered alarm is settled, or must be delivered again.
    Done {
        /// Actor number.
        num: u64,
        /// Alarm name.
        name: String,
        /// Deliver it again after this long.
        retry_in_ms: Option<u64>,
    },
}

/// A due alarm on its way to its actor.
pub struct DueAlarm {
    /// The alarm's name.
    pub name: String,
    /// The due time the scheduler saw; stale if the alarm moved since.
    pub due_ms: u64,
    /// Held until the alarm turn is over.
    pub ticket: AlarmTicket,
}

/// How the scheduler reaches actors: the actor layer implements it, and the
/// scheduler needs nothing else of it (the narrow-trait pattern of Golem's
/// `SchedulerWorkerAccess`), which keeps it testable without actors.
pub trait AlarmTarget: Send + Sync + 'static {
    /// Hand `alarm` to actor `key`, waking the actor if needed. A refusal
    /// drops the alarm's ticket, which asks for a redelivery.
    fn deliver_alarm(
        self: Arc<Self>,
        key: &ActorKey,
        alarm: DueAlarm,
    ) -> Result<(), Box<dyn std::error::Error + Send + Sync>>;
}

/// Handle to the scheduler: commits tell it about alarms through it.
#[derive(Clone)]
pub struct Scheduler {
    tx: mpsc::UnboundedSender<Notice>,
}

/// Travels with a delivered alarm. Unless the actor settles it, dropping it
/// asks for the alarm to be delivered again: a delivery lost on the way (a
/// full mailbox, a dying actor task) is never lost for good.
pub struct AlarmTicket {
    id: Option<AlarmId>,
    retry_in_ms: Option<u64>,
    tx: mpsc::UnboundedSender<Notice>,
    permit: Option<OwnedSemaphorePermit>,
}

impl AlarmTicket {
    /// The alarm's turn has run (or will not): what is left is its commit,
    /// which needs no permit. The next alarm may go.
    pub fn ran(&mut self) {
        if self.permit.take().is_some() {
            let _ = self.tx.send(Notice::Ran);
        }
    }

    /// Deliver the alarm again after `ms`: it could not run now.
    pub fn retry_later(&mut self, ms: u64) {
        self.retry_in_ms = Some(ms);
    }

    /// The alarm's outcome is durable (or there was nothing to do): no
    /// redelivery.
    pub fn settle(&mut self) {
        self.retry_in_ms = None;
    }
}

impl Drop for AlarmTicket {
    fn drop(&mut self) {
        if let Some((num, name)) = self.id.take() {
            let _ = self.tx.send(Notice::Done {
                num,
                name,
                retry_in_ms: self.retry_in_ms,
            });
        }
    }
}

impl Scheduler {
    /// A scheduler whose loop runs once [`Scheduler::start`] is called.
    pub fn new() -> (Self, mpsc::UnboundedReceiver<Notice>) {
        let (tx, rx) = mpsc::unbounded_channel();
        (Self { tx }, rx)
    }

    /// Tell the scheduler about a durable change to an alarm.
    pub fn notify(&self, notice: Notice) {
        let _ = self.tx.send(notice);
    }

    /// Run the scheduler loop: it reads the due index from `storage`
    /// (every `config.reload_ms`, `config.reload_batch` rows at most at a
    /// time) and delivers to `target`, at most `config.concurrency` alarms
    /// at a time.
    pub fn start(
        &self,
        storage: Arc<Storage>,
        target: Arc<dyn AlarmTarget>,
        config: &AlarmsConfig,
        rx: mpsc::UnboundedReceiver<Notice>,
    ) {
        let state = Loop {
            tx: self.tx.clone(),
            rx,
            queue: Queue::default(),
            in_flight: HashMap::new(),
            loaded_until: 0,
            batch: config.reload_batch.max(1),
            every: Duration::from_millis(config.reload_ms.max(1)),
            next_reload: tokio::time::Instant::now(),
            truncated: false,
            reload_asked: false,
            permits: Arc::new(Semaphore::new(config.concurrency.max(1))),
            storage,
            target,
        };
        tokio::spawn(state.run());
    }
}

/// Alarms due soon, earliest first, at most one entry per alarm.
#[derive(Default)]
struct Queue {
    by_due: BTreeSet<(u64, u64, String)>,
    due_of: HashMap<AlarmId, u64>,
}

impl Queue {
    /// Put `id` at `due`, replacing its earlier entry; `None` removes it.
    fn set(&mut self, id: AlarmId, due: Option<u64>) {
        if let Some(old) = self.due_of.remove(&id) {
            self.by_due.remove(&(old, id.0, id.1.clone()));
        }
        if let Some(due) = due {
            self.by_due.insert((due, id.0, id.1.clone()));
            self.due_of.insert(id, due);
        }
    }

    fn first_due(&self) -> Option<u64> {
        self.by_due.first().map(|e| e.0)
    }

    /// The earliest alarm if it is due at `now`.
    fn pop_due(&mut self, now: u64) -> Option<(u64, AlarmId)> {
        if self.first_due()? > now {
            return None;
        }
        let (due, num, name) = self.by_due.pop_first()?;
        let id = (num, name);
        self.due_of.remove(&id);
        Some((due, id))
    }

    fn clear(&mut self) {
        self.by_due.clear();
        self.due_of.clear();
    }

    fn len(&self) -> usize {
        self.due_of.len()
    }
}

struct Loop {
    tx: mpsc::UnboundedSender<Notice>,
    rx: mpsc::UnboundedReceiver<Notice>,
    queue: Queue,
    /// Alarms delivered and not yet settled, each with the latest due time
    /// heard while it was out (applied when it comes back).
    in_flight: HashMap<AlarmId, Option<Option<u64>>>,
    /// The queue holds every alarm due before this.
    loaded_until: u64,
    /// Most rows the queue takes from one read of the due index.
    batch: usize,
    /// How often the due index is read again.
    every: Duration,
    /// When it is read again next, unless something asks sooner.
    next_reload: tokio::time::Instant,
    /// The last read stopped at `batch` rows: more were due before the
    /// horizon.
    truncated: bool,
    /// A notice asked for a reload.
    reload_asked: bool,
    permits: Arc<Semaphore>,
    storage: Arc<Storage>,
    target: Arc<dyn AlarmTarget>,
}

impl Loop {
    async fn run(mut self) {
        self.reload().await;
        loop {
            self.fire_due();
            if self.backlog_low() {
                // Most of a truncated read has gone out: read the next
                // piece now rather than at the next periodic reload.
                self.reload().await;
                self.fire_due();
            }
            // With no permit free, the next wake-up is a settled alarm.
            let wake = match self.queue.first_due() {
                Some(due) if self.permits.available_permits() > 0 => {
                    let wait = due.saturating_sub(now_ms());
                    (tokio::time::Instant::now() + Duration::from_millis(wait))
                        .min(self.next_reload)
                }
                _ => self.next_reload,
            };
            tokio::select! {
                notice = self.rx.recv() => {
                    let Some(notice) = notice else { return };
                    self.handle(notice);
                    while let Ok(n) = self.rx.try_recv() {
                        self.handle(n);
                    }
                }
                () = tokio::time::sleep_until(wake) => {}
            }
            if self.reload_asked || tokio::time::Instant::now() >= self.next_reload {
                self.reload().await;
            }
        }
    }

    fn handle(&mut self, notice: Notice) {
        match notice {
            Notice::Reload => self.reload_asked = true,
            // The loop goes round, and fires what the permit allows.
            Notice::Ran => {}
            Notice::Set { num, name, due_ms } => {
                let due = due_ms.filter(|d| *d < self.loaded_until);
                let id = (num, name);
                match self.in_flight.get_mut(&id) {
                    Some(parked) => *parked = Some(due),
                    None => self.queue.set(id, due),
                }
            }
            Notice::Done {
                num,
                name,
                retry_in_ms,
            } => {
                let id = (num, name);
                let parked = self.in_flight.remove(&id).flatten();
                let retry_at = retry_in_ms.map(|ms| now_ms() + ms);
                let due = match parked {
                    // A commit moved or removed the alarm while it was out:
                    // that wins, but a retry still waits its back-off.
                    Some(due) => due.map(|d| retry_at.map_or(d, |r| d.max(r))),
                    None => retry_at,
                };
                if due.is_some() {
                    self.queue.set(id, due);
                }
            }
        }
    }

    /// Whether the last read of the due index stopped short and most of
    /// what it read has gone out.
    fn backlog_low(&self) -> bool {
        self.truncated && self.queue.len() <= self.batch / 4
    }

    /// Rebuild the queue from the due index: the earliest `batch` alarms
    /// due before now + horizon, overdue ones included, except those out
    /// for delivery.
    async fn reload(&mut self) {
        self.reload_asked = false;
        self.next_reload = tokio::time::Instant::now() + self.every;
        // Until a read succeeds, only the periodic reload tries again.
        self.truncated = false;
        let until = now_ms() + HORIZON_MS;
        // The rows of alarms out for delivery are still in the index (until
        // their turns commit) and are skipped: read that many more, so a
        // truncated read always queues a whole batch.
        let limit = self.batch + self.in_flight.len();
        let storage = self.storage.clone();
        // Off the runtime's workers: a large backlog takes a while to read.
        let read = tokio::task::spawn_blocking(move || {
            storage.reader().and_then(|r| r.alarms_due(0, until, limit))
        })
        .await;
        let rows = match read {
            Ok(Ok(rows)) => rows,
            // A graceful stop closed the database under the read: nothing
            // is wrong (it was an ERROR line on every such stop).
            Ok(Err(crate::storage::StorageError::ShuttingDown)) => return,
            Ok(Err(e)) => {
                tracing::error!(error = %e, "alarm scheduler: cannot read the due index");
                return;
            }
            Err(e) => {
                tracing::error!(error = %e, "alarm scheduler: the read of the due index failed");
                return;
            }
        };
        // With more rows than one batch only what was read is covered; the
        // rest comes with a later reload.
        self.truncated = rows.len() == limit;
        self.loaded_until = match rows.last() {
            Some(last) if self.truncated => last.0,
            _ => until,
        };
        self.queue.clear();
        for (due, num, name) in rows {
            let id = (num, name);
            if !self.in_flight.contains_key(&id) {
                self.queue.set(id, Some(due));
            }
        }
        tracing::debug!(
            queued = self.queue.len(),
            in_flight = self.in_flight.len(),
            truncated = self.truncated,
            "alarm scheduler reloaded"
        );
    }

    /// Deliver every alarm that is due, while permits last.
    fn fire_due(&mut self) {
        while self.permits.available_permits() > 0 {
            let Some((due, id)) = self.queue.pop_due(now_ms()) else {
                return;
            };
            let permit = self
                .permits
                .clone()
                .try_acquire_owned()
                .expect("a permit is free and only this task takes them");
            let key = match self.storage.reader().and_then(|r| r.actor_key(id.0)) {
                Ok(Some(k)) => k,
                Ok(None) => continue, // the actor was deleted with its alarms
                Err(e) => {
                    // (Each due alarm meets it while storage fails.)
                    if let Some(held_back) = ACTOR_KEY_LOG.admit() {
                        tracing::error!(error = %e, held_back, "alarm scheduler: cannot read an actor key");
                    }
                    self.queue.set(id, Some(now_ms() + 1000));
                    continue;
                }
            };
            let delivery = DueAlarm {
                name: id.1.clone(),
                due_ms: due,
                ticket: AlarmTicket {
                    id: Some(id.clone()),
                    retry_in_ms: Some(REDELIVER_MS),
                    tx: self.tx.clone(),
                    permit: Some(permit),
                },
            };
            self.in_flight.insert(id, None);
            if let Err(e) = self.target.clone().deliver_alarm(&key, delivery) {
                // The ticket went down with the envelope and asks for a
                // redelivery.
                tracing::debug!(actor = %key, error = %e, "alarm delivery refused; will retry");
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn queue_keeps_one_entry_per_alarm() {
        let mut q = Queue::default();
        let a = (1, "a".to_owned());
        q.set(a.clone(), Some(50));
        q.set(a.clone(), Some(30));
        q.set((2, "b".to_owned()), Some(40));
        assert_eq!(q.len(), 2);
        assert_eq!(q.pop_due(20), None, "never early");
        assert_eq!(q.pop_due(100), Some((30, a.clone())));
        assert_eq!(q.pop_due(100).map(|e| e.0), Some(40));
        assert_eq!(q.pop_due(100), None);
        q.set(a.clone(), Some(10));
        q.set(a, None);
        assert_eq!(q.len(), 0);
        assert_eq!(q.first_due(), None);
    }
}
