//! Turning a finished turn into one commit: the actor record, numbered
//! events and retention, idempotency and inbox bookkeeping, alarms, inputs
//! and sends, all in one [`TurnCommit`]; and what happens once it is
//! durable (the output gate: replies, stream frames, scheduler notices,
//! recipients woken).

use std::time::Instant;

use tokio::sync::oneshot;

use super::super::TurnError;
use super::ActorTask;
use crate::alarms::scheduler::Notice;
use crate::clock::now_ms;
use crate::ids::ActorKey;
use crate::sandbox::FinishedTurn;
use crate::storage::schema::{AlarmRecord, EventRecord, IdemRecord, InboxRecord, InputRecord};
use crate::storage::{CommitFailed, TurnCommit, WriteOp};

/// Where a commit's outcome goes.
pub(super) type OnDurable = Box<dyn FnOnce(Result<(), CommitFailed>) + Send>;

/// Extra rows a commit carries besides the turn's own writes.
#[derive(Default)]
pub(super) struct CommitExtras {
    /// Bookkeeping only (no handler ran): not counted as a turn.
    pub bookkeeping: bool,
    /// Write the actor record even if only its statistics changed.
    pub force_record: bool,
    pub idempotency: Option<(String, IdemRecord)>,
    pub inbox_done: Option<u64>,
    pub inbox_update: Option<(u64, InboxRecord)>,
    pub events: Vec<(String, Vec<u8>)>,
    /// An alarm moved or removed by its own firing, unless the turn itself
    /// wrote the same alarm.
    pub alarm: Option<(String, Option<AlarmRecord>)>,
    /// Input requests settled (`Some`) or pruned (`None`).
    pub inputs: Vec<(String, Option<InputRecord>)>,
}

impl ActorTask {
    /// Turn a finished turn into one commit and hand it to the writer.
    pub(super) fn submit(
        &mut self,
        finished: FinishedTurn,
        mut extras: CommitExtras,
        on_durable: OnDurable,
    ) {
        let max_events = self.env.config.limits.max_events_per_actor;
        let now = now_ms();
        let age_cut = self.age_cut();
        let record = self.record.as_mut().expect("record loaded");
        if !extras.bookkeeping {
            record.turns += 1;
            record.last_turn_at_ms = now;
        }
        record.state_bytes = finished.state_bytes;
        record.state_keys = finished.state_keys;
        let mut events = Vec::with_capacity(finished.events.len() + extras.events.len());
        for (kind, data) in finished.events.into_iter().chain(extras.events.drain(..)) {
            record.last_event_seq += 1;
            events.push((
                record.last_event_seq,
                EventRecord {
                    kind,
                    data,
                    at_ms: now,
                },
            ));
        }
        if record.first_event_seq == 0 && !events.is_empty() {
            record.first_event_seq = events[0].0;
            self.oldest_event_at_ms = Some(now);
        }
        let (trim_events_below, by_count) = retention_cut(
            record.first_event_seq,
            record.last_event_seq,
            max_events,
            age_cut,
        );
        if by_count {
            self.oldest_event_at_ms = None;
        }
        if let Some(first) = trim_events_below {
            record.first_event_seq = first;
        }
        let last_event_seq = record.last_event_seq;
        let seq = if self.seq > self.submitted_seq {
            self.seq
        } else {
            // A commit without a turn of its own (recovery bookkeeping).
            self.seq += 1;
            self.seq
        };
        self.submitted_seq = seq;
        // Only records whose commits are in flight stay here (a committed
        // one is read from disk), looked over at every commit: they were
        // pruned past 1024 entries only, so an awake actor held up to 1024
        // replies of up to 1 MiB each (found by a probe: 1 GB for two
        // actors), then until its next keyed message.
        if !self.idem_pending.is_empty() {
            let committed = self.shared.tracker.committed_seq();
            self.idem_pending.retain(|_, (s, _)| *s > committed);
        }
        if let Some((k, rec)) = &extras.idempotency {
            self.idem_pending.insert(k.clone(), (seq, rec.clone()));
        }
        let write_record = extras.force_record
            || self
                .persisted
                .as_ref()
                .is_none_or(|p| !p.same_durable_fields(record));
        self.shared.note_turn(record.turns, record.last_turn_at_ms);
        let record = write_record.then(|| record.clone());
        if record.is_some() {
            self.persisted = record.clone();
        }
        let mut alarms = finished.alarm_writes;
        if let Some((name, rec)) = extras.alarm.take()
            && !alarms.iter().any(|(n, _)| *n == name)
        {
            self.carry.note_alarm(&name, rec.as_ref());
            alarms.push((name, rec));
        }
        let mut inputs = finished.input_writes;
        inputs.append(&mut extras.inputs);
        self.prune_settled_inputs(&mut inputs);
        let traceparent = finished
            .span
            .as_ref()
            .and_then(crate::telemetry::traceparent_of);
        let on_durable = match finished.span {
            // The turn's span ends once its commit is durable.
            Some(span) => {
                let submitted = Instant::now();
                Box::new(move |r: Result<(), CommitFailed>| {
                    span.record("commit_us", submitted.elapsed().as_micros() as u64);
                    on_durable(r);
                    drop(span);
                }) as OnDurable
            }
            None => on_durable,
        };
        let reservation = finished.file_reservation.filter(|r| r.bytes() > 0);
        let on_durable = if finished.blob_holds.is_empty() && reservation.is_none() {
            on_durable
        } else {
            // The turn's blobs stay held, and the bytes its files add to
            // the type reserved, until its commit is over; then those
            // blobs no committed file refers to go.
            let holds = finished.blob_holds;
            let storage = self.env.storage.clone();
            let runtime = tokio::runtime::Handle::current();
            Box::new(move |r: Result<(), CommitFailed>| {
                // Given back first: a client that writes again on the reply
                // must not find its own bytes counted twice.
                drop(reservation);
                on_durable(r);
                let _enter = runtime.enter();
                crate::sandbox::release_blobs(storage, holds);
            })
        };
        let sends = finished.sends;
        let on_durable = if finished.send_claims.is_empty() {
            on_durable
        } else {
            // Counted against their recipients' inboxes until now: on disk
            // (counted as queued from here on), or taken back.
            let mut claims = finished.send_claims;
            Box::new(move |r: Result<(), CommitFailed>| {
                if r.is_ok() {
                    claims.iter_mut().for_each(|c| c.queued());
                }
                drop(claims);
                on_durable(r);
            }) as OnDurable
        };
        // In a cluster the relay hands sends over (the writer wakes it).
        let relay_sends = self.env.cluster.is_some();
        let on_durable = if sends.is_empty() || relay_sends {
            on_durable
        } else {
            // The recipients' inboxes got rows in this commit: wake them.
            let env = self.env.clone();
            let to: Vec<ActorKey> = sends.iter().map(|(k, ..)| k.clone()).collect();
            // This runs on the writer thread: wake the recipients from a
            // task instead, so the next commit batch does not wait for them.
            let runtime = tokio::runtime::Handle::current();
            Box::new(move |r: Result<(), CommitFailed>| {
                if r.is_ok() {
                    runtime.spawn(async move {
                        for key in &to {
                            // The writer drops sends to a type deleted since.
                            if env.catalog.get(key.ty()).is_some() {
                                env.poke(key);
                            }
                        }
                    });
                }
                on_durable(r);
            })
        };
        let usage = finished.usage;
        let on_durable = if usage.is_empty() {
            on_durable
        } else {
            // Budgets count the turn's model usage as committed once it
            // is; if the commit fails, the calls were still paid for, so
            // they count all the same (in memory; storage lost them).
            let ledger = self.env.models.ledger().clone();
            let key = self.key.clone();
            Box::new(move |r: Result<(), CommitFailed>| {
                if r.is_err() {
                    tracing::warn!(actor = %key, "a turn's model usage was not committed; it counts against budgets until restart");
                }
                ledger.committed(&key, &usage.record, usage.held);
                on_durable(r);
            })
        };
        let on_durable = self.notify_scheduler(&alarms, on_durable);
        let on_durable = if events.is_empty() {
            on_durable
        } else {
            // Live streams read committed events only: tell them once durable.
            let bus = self.env.event_bus.clone();
            let key = self.key.clone();
            Box::new(move |r: Result<(), CommitFailed>| {
                if r.is_ok() {
                    bus.publish(&key, last_event_seq);
                }
                on_durable(r);
            })
        };
        let commit = TurnCommit {
            key: self.key.clone(),
            tracker: self.shared.tracker.clone(),
            generation: self.generation,
            seq,
            num: self.record().num,
            record,
            state: finished.writes,
            events,
            trim_events_below,
            idempotency: extras.idempotency,
            inbox_done: extras.inbox_done,
            inbox_update: extras.inbox_update,
            alarms,
            inputs,
            sends,
            relay_sends,
            files: finished.files,
            usage: (!usage.is_empty()).then_some(usage.record),
            traceparent,
            on_durable,
        };
        self.env
            .storage
            .writer()
            .submit(WriteOp::Turn(Box::new(commit)));
    }

    /// Submit a bookkeeping commit and wait until it is durable (or failed).
    pub(super) async fn submit_and_wait(
        &mut self,
        extras: CommitExtras,
    ) -> Result<(), CommitFailed> {
        let (tx, rx) = oneshot::channel();
        self.submit(
            self.unchanged(),
            extras,
            Box::new(move |r| {
                let _ = tx.send(r);
            }),
        );
        rx.await.unwrap_or(Err(CommitFailed::ShuttingDown))
    }

    /// Where retention by age cuts the log: the first seq to keep, if some
    /// events are past the cut-off. Only durable events can be that old
    /// (anything in flight was written just now), so the disk is enough.
    fn age_cut(&mut self) -> Option<u64> {
        let cutoff = self.env.config.events.cutoff_ms(now_ms());
        let rec = self.record.as_ref()?;
        let (num, first, last) = (rec.num, rec.first_event_seq, rec.last_event_seq);
        if cutoff == 0 || first == 0 || first > last {
            return None;
        }
        if self.oldest_event_at_ms.is_some_and(|t| t >= cutoff) {
            return None;
        }
        let reader = match self.env.storage.reader() {
            Ok(r) => r,
            Err(e) => {
                tracing::warn!(actor = %self.key, error = %e, "cannot read events for retention");
                return None;
            }
        };
        let mut keep_from = first;
        let mut after = first - 1;
        loop {
            let page = match reader.events(num, after, 1024, usize::MAX) {
                Ok(p) => p,
                Err(e) => {
                    tracing::warn!(actor = %self.key, error = %e, "cannot read events for retention");
                    return None;
                }
            };
            let Some((last_read, _)) = page.last() else {
                // Everything durable is past retention.
                self.oldest_event_at_ms = None;
                break;
            };
            let last_read = *last_read;
            if let Some((seq, e)) = page.iter().find(|(_, e)| e.at_ms >= cutoff) {
                keep_from = *seq;
                self.oldest_event_at_ms = Some(e.at_ms);
                break;
            }
            keep_from = last_read + 1;
            after = last_read;
        }
        (keep_from > first).then_some(keep_from)
    }

    /// Tell the scheduler about alarms a commit sets, moves or removes,
    /// once it is durable (before that the change may still vanish).
    fn notify_scheduler(
        &self,
        alarms: &[(String, Option<AlarmRecord>)],
        on_durable: OnDurable,
    ) -> OnDurable {
        if alarms.is_empty() {
            return on_durable;
        }
        let changes: Vec<(String, Option<u64>)> = alarms
            .iter()
            .map(|(name, rec)| (name.clone(), rec.as_ref().map(|r| r.next_due_ms)))
            .collect();
        let scheduler = self.env.scheduler.clone();
        let num = self.record().num;
        Box::new(move |r| {
            if r.is_ok() {
                for (name, due_ms) in changes {
                    scheduler.notify(Notice::Set { num, name, due_ms });
                }
            }
            on_durable(r);
        })
    }

    /// Send `result` once turn `seq` of this actor is durable (at once if it
    /// already is); if that commit failed, send the failure instead.
    pub(super) fn release_when_durable<T: Send + 'static>(
        &self,
        seq: u64,
        result: Result<T, TurnError>,
        reply: oneshot::Sender<Result<T, TurnError>>,
    ) {
        if seq == 0 || self.shared.tracker.committed_seq() >= seq {
            let _ = reply.send(result);
            return;
        }
        let tracker = self.shared.tracker.clone();
        let generation = self.generation;
        tokio::spawn(async move {
            tracker.wait_committed(seq, generation).await;
            let result = if tracker.min_generation() > generation {
                Err(tracker.failure().into())
            } else {
                result
            };
            let _ = reply.send(result);
        });
    }
}

/// Where retention cuts a log holding events `first..=last` after a commit:
/// at most `max_events` are kept, and none before `age_cut` (the first seq
/// retention by age keeps). Returns the first seq to keep if older events
/// must go, and whether the count (rather than age) decided it.
fn retention_cut(
    first: u64,
    last: u64,
    max_events: u64,
    age_cut: Option<u64>,
) -> (Option<u64>, bool) {
    if first > 0 && last >= first + max_events {
        let count_cut = last + 1 - max_events;
        if age_cut.is_none_or(|t| t < count_cut) {
            return (Some(count_cut), true);
        }
    }
    (age_cut, false)
}

#[cfg(test)]
mod tests {
    use super::retention_cut;

    #[test]
    fn retention_keeps_at_most_max_events() {
        // No events yet, or fewer than the cap: nothing to cut.
        assert_eq!(retention_cut(0, 0, 10, None), (None, false));
        assert_eq!(retention_cut(1, 10, 10, None), (None, false));
        // One over the cap: the oldest goes.
        assert_eq!(retention_cut(1, 11, 10, None), (Some(2), true));
        assert_eq!(retention_cut(5, 100, 10, None), (Some(91), true));
    }

    #[test]
    fn retention_by_age_and_count_keeps_the_later_cut() {
        // Age cuts further than the count: age decides.
        assert_eq!(retention_cut(1, 20, 10, Some(15)), (Some(15), false));
        // Count cuts further: count decides.
        assert_eq!(retention_cut(1, 20, 10, Some(5)), (Some(11), true));
        // Under the cap, age alone.
        assert_eq!(retention_cut(1, 5, 10, Some(3)), (Some(3), false));
    }
}
