//! What one turn sees and writes: a [`TurnState`] made of one context per
//! capability, each defined beside its host functions in [`super::caps`]
//! (as wasmtime-wasi keeps one context per WASI interface). A new
//! capability adds a context there and a field here.
//!
//! A turn's state is moved into the store before its handler runs and taken
//! out afterwards. Capabilities buffer every write in it; nothing reaches
//! storage until the actor commits a successful turn ([`FinishedTurn`]). A
//! failed turn is dropped with its buffers, which is how "a turn that traps
//! commits nothing" holds. What the actor keeps between turns (caches of
//! what it read, including changes still in flight to disk) travels as a
//! [`Carry`].

use std::collections::BTreeMap;
use std::sync::Arc;

use bytes::Bytes;

use super::caps::actors::{ActorLimits, ActorsCtx, CallChain, DurableBefore};
use super::caps::alarms::{AlarmLimits, AlarmsCtx, KnownAlarms};
use super::caps::events::{EventLimits, EventsCtx};
use super::caps::files::{FileCache, FileLimits, FilesCtx};
use super::caps::http::HttpCtx;
use super::caps::inputs::{InputLimits, InputsCtx};
use super::caps::log::{LogCtx, LogLimits};
use super::caps::model::{ModelCtx, TurnUsage};
use super::caps::state::{StateCache, StateCtx, StateLimits};
use crate::ids::ActorKey;
use crate::storage::blobs::BlobHold;
use crate::storage::schema::{AlarmRecord, FileRecord, InboxRecord, InputRecord};
use crate::storage::{Reader, Storage, StorageError};

/// The limits of every capability inside a turn.
#[derive(Debug, Clone)]
pub struct TurnLimits {
    /// `state`.
    pub state: StateLimits,
    /// `events`.
    pub events: EventLimits,
    /// `log`.
    pub log: LogLimits,
    /// `alarms`.
    pub alarms: AlarmLimits,
    /// `inputs`.
    pub inputs: InputLimits,
    /// `actors`.
    pub actors: ActorLimits,
    /// `files`.
    pub files: FileLimits,
}

/// Read access to what one actor has committed: where a turn's view falls
/// back to when its caches do not know.
#[derive(Clone)]
pub struct ActorDisk {
    storage: Arc<Storage>,
    /// The actor number.
    pub num: u64,
}

impl ActorDisk {
    /// A consistent view of everything committed.
    pub fn reader(&self) -> Result<Reader, StorageError> {
        self.storage.reader()
    }

    /// Where blob `sha256` is.
    pub fn blob_path(&self, sha256: &[u8; 32]) -> std::path::PathBuf {
        self.storage.blobs().path(sha256)
    }

    /// Store a blob durably and hold it (blocking).
    pub fn put_blob(&self, bytes: &[u8]) -> Result<BlobHold, StorageError> {
        self.storage.blobs().put(bytes)
    }

    /// A reservation of file bytes for a turn of type `ty` (see
    /// [`crate::storage::reservations`]).
    pub fn reserve_files(&self, ty: &str) -> crate::storage::reservations::Reservation {
        self.storage.file_reservations().start(ty)
    }

    /// Let go of `holds`; blobs no committed file refers to are removed.
    pub fn release_blobs(&self, holds: Vec<BlobHold>) {
        release_blobs(self.storage.clone(), holds);
    }
}

/// Let go of `holds` (a turn's blobs, once its commit is over or the turn
/// failed), and remove those no committed file refers to. Runs on a
/// blocking thread; call from within the runtime.
pub fn release_blobs(storage: Arc<Storage>, holds: Vec<BlobHold>) {
    if holds.is_empty() {
        return;
    }
    let shas: Vec<[u8; 32]> = holds.iter().map(|h| *h.sha256()).collect();
    drop(holds);
    tokio::task::spawn_blocking(move || {
        for sha in shas {
            if let Err(e) = storage
                .blobs()
                .release_if_unused(&sha, |h| storage.blob_referenced_now(h))
            {
                tracing::warn!(error = %e, "cannot remove an unused blob; the collector will");
            }
        }
    });
}

/// What an actor keeps between its turns: what it has read, so the next
/// turn need not read it again, including changes not yet durable.
#[derive(Debug, Default)]
pub struct Carry {
    state: StateCache,
    alarms: KnownAlarms,
    pending_inputs: Option<u64>,
    files: FileCache,
}

impl Carry {
    /// Drop cached state values whose writes are durable once the cache
    /// holds more than `cap` bytes.
    pub fn trim(&mut self, cap: usize, committed_seq: u64) {
        self.state.trim(cap, committed_seq);
        self.files.trim(committed_seq);
    }

    /// Bytes of state keys and values cached.
    pub fn state_bytes(&self) -> usize {
        self.state.bytes()
    }

    /// The actor's alarms as its turns see them, read with `load` if no
    /// turn of this activation needed them yet (then nothing about them is
    /// in flight, and disk is current).
    pub fn alarm(
        &mut self,
        name: &str,
        load: impl FnOnce() -> Result<Vec<(String, AlarmRecord)>, StorageError>,
    ) -> Result<Option<AlarmRecord>, StorageError> {
        if self.alarms.is_none() {
            self.alarms = Some(load()?.into_iter().collect());
        }
        Ok(self.alarms.as_ref().and_then(|a| a.get(name)).cloned())
    }

    /// A commit outside a turn set (`Some`) or removed alarm `name`.
    pub fn note_alarm(&mut self, name: &str, rec: Option<&AlarmRecord>) {
        if let Some(known) = &mut self.alarms {
            match rec {
                Some(r) => known.insert(name.to_owned(), r.clone()),
                None => known.remove(name),
            };
        }
    }

    /// A commit outside a turn settled one pending input request.
    pub fn note_input_settled(&mut self) {
        if let Some(p) = &mut self.pending_inputs {
            *p = p.saturating_sub(1);
        }
    }
}

/// Where a turn starts from: the actor's record as its last turn left it.
#[derive(Debug, Clone, Copy)]
pub struct ActorCounts {
    /// Total state size.
    pub state_bytes: u64,
    /// Number of state keys.
    pub state_keys: u64,
    /// Seq of the newest event.
    pub last_event_seq: u64,
}

/// The per-turn buffers and views, one per capability.
pub struct TurnState {
    /// The actor.
    pub key: ActorKey,
    /// Code version running the turn.
    pub version: u32,
    /// This turn's sequence number within the activation.
    pub seq: u64,
    /// What started the turn (stable across a re-run after a crash).
    pub turn_id: String,
    /// Earlier starts of this delivery (`turn.attempt`).
    pub attempt: u32,
    /// `state`.
    pub state: StateCtx,
    /// `events`.
    pub events: EventsCtx,
    /// `alarms`.
    pub alarms: AlarmsCtx,
    /// `inputs`.
    pub inputs: InputsCtx,
    /// `actors`.
    pub actors: ActorsCtx,
    /// `log`.
    pub log: LogCtx,
    /// `http`.
    pub http: HttpCtx,
    /// `files`.
    pub files: FilesCtx,
    /// `model`.
    pub model: ModelCtx,
}

/// Why a guest call was refused; shown to the guest.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Refusal {
    /// A malformed argument.
    Invalid(String),
    /// A limit was reached.
    Limit(String),
    /// What the call names does not exist (or not any more).
    NotFound(String),
}

/// Who a turn runs for and where it starts.
pub struct TurnStart {
    /// The actor.
    pub key: ActorKey,
    /// Its actor number.
    pub num: u64,
    /// Code version running the turn.
    pub version: u32,
    /// The turn's sequence number within the activation.
    pub seq: u64,
    /// Shown to the guest (`ctx.turn_id`): the message id, or what else
    /// started the turn; stable when the turn is run again after a crash.
    pub turn_id: String,
    /// The actor's record as its last turn left it.
    pub counts: ActorCounts,
    /// Callers above this turn (`actors.call`).
    pub chain: CallChain,
    /// This actor's commits before this turn.
    pub durable_before: Option<DurableBefore>,
    /// Earlier starts of this delivery that a crash may have cut off
    /// (`turn.attempt`).
    pub attempt: u32,
    /// What names the turn if it may run again (recovered after a crash,
    /// retried after a failure, asked again under the same
    /// `Idempotency-Key`): its `actors.call`s carry keys made from it.
    pub calls_id: Option<String>,
}

impl TurnState {
    /// A turn starting from `start`, with what the actor carried over.
    pub fn new(
        start: TurnStart,
        carry: Carry,
        limits: &TurnLimits,
        storage: &Arc<Storage>,
    ) -> Self {
        let disk = ActorDisk {
            storage: storage.clone(),
            num: start.num,
        };
        let c = start.counts;
        let ty = start.key.ty().to_owned();
        let calls_of = start.calls_id.map(|id| (start.key.clone(), id));
        Self {
            key: start.key,
            version: start.version,
            seq: start.seq,
            turn_id: start.turn_id,
            attempt: start.attempt,
            state: StateCtx::new(
                disk.clone(),
                limits.state,
                carry.state,
                c.state_bytes,
                c.state_keys,
            ),
            events: EventsCtx::new(limits.events, c.last_event_seq),
            alarms: AlarmsCtx::new(disk.clone(), limits.alarms, carry.alarms),
            inputs: InputsCtx::new(disk.clone(), limits.inputs, carry.pending_inputs),
            files: FilesCtx::new(disk, limits.files, ty, carry.files),
            actors: ActorsCtx::new(limits.actors, start.chain, start.durable_before, calls_of),
            log: LogCtx::new(limits.log.clone()),
            http: HttpCtx::default(),
            model: ModelCtx::new(start.num),
        }
    }

    /// The turn succeeded: fold its writes into the caches and give them
    /// back to the actor along with the writes to commit.
    pub fn finish(self) -> (Carry, FinishedTurn) {
        let (cache, state) = self.state.finish(self.seq);
        let (alarms, alarm_writes) = self.alarms.finish();
        let (pending_inputs, created) = self.inputs.finish();
        let (files_cache, files, blob_holds, file_reservation) = self.files.finish(self.seq);
        let carry = Carry {
            state: cache,
            alarms,
            pending_inputs,
            files: files_cache,
        };
        let (sends, send_claims) = self.actors.finish();
        let finished = FinishedTurn {
            writes: state.writes,
            events: self.events.finish(),
            state_bytes: state.state_bytes,
            state_keys: state.state_keys,
            alarm_writes,
            input_writes: created.into_iter().map(|(id, r)| (id, Some(r))).collect(),
            sends,
            send_claims,
            files,
            blob_holds,
            file_reservation: Some(file_reservation),
            // Filled in from the turn's outcome, which has it whatever the
            // result.
            usage: Default::default(),
            span: None,
        };
        (carry, finished)
    }

    /// A point to roll back to: a child script (`js.eval`) that fails
    /// leaves nothing of what it wrote in its caller's turn.
    pub fn savepoint(&self) -> Savepoint {
        Savepoint {
            state: self.state.savepoint(),
            events: self.events.savepoint(),
            alarms: self.alarms.savepoint(),
            inputs: self.inputs.savepoint(),
            actors: self.actors.savepoint(),
            files: self.files.savepoint(),
        }
    }

    /// Undo everything written since `sp`.
    pub fn rollback(&mut self, sp: Savepoint) {
        self.state.rollback(sp.state);
        self.events.rollback(sp.events);
        self.alarms.rollback(sp.alarms);
        self.inputs.rollback(sp.inputs);
        self.actors.rollback(sp.actors);
        self.files.rollback(sp.files);
    }

    /// The turn failed: discard its writes and give the caches back.
    pub fn abandon(self) -> Carry {
        Carry {
            state: self.state.abandon(),
            alarms: self.alarms.abandon(),
            pending_inputs: self.inputs.abandon(),
            files: self.files.abandon(),
        }
    }
}

/// What [`TurnState::rollback`] restores.
pub struct Savepoint {
    state: super::caps::state::StateSavepoint,
    events: usize,
    alarms: BTreeMap<String, Option<AlarmRecord>>,
    inputs: (usize, usize),
    actors: usize,
    files: super::caps::files::FilesSavepoint,
}

/// A successful turn's results.
#[derive(Debug, Default)]
pub struct FinishedTurn {
    /// State writes to commit.
    pub writes: Vec<(String, Option<Bytes>)>,
    /// Events to commit, in order.
    pub events: Vec<(String, Vec<u8>)>,
    /// Total state size after the turn.
    pub state_bytes: u64,
    /// Number of keys after the turn.
    pub state_keys: u64,
    /// Alarms set (`Some`) or cancelled (`None`) by the turn.
    pub alarm_writes: Vec<(String, Option<AlarmRecord>)>,
    /// Input requests made by the turn.
    pub input_writes: Vec<(String, Option<InputRecord>)>,
    /// Messages to other actors: (recipient, the inbox row).
    pub sends: Vec<(ActorKey, InboxRecord)>,
    /// Their counts against their recipients' inboxes, settled when the
    /// commit is over.
    pub send_claims: Vec<Box<dyn crate::sandbox::caps::actors::InboxClaim>>,
    /// Files written (`Some`) or deleted (`None`).
    pub files: Vec<(String, Option<FileRecord>)>,
    /// The blobs those files need, held until the commit is over.
    pub blob_holds: Vec<BlobHold>,
    /// The bytes those files add to their type, counted against its quota
    /// until the commit is over.
    pub file_reservation: Option<crate::storage::reservations::Reservation>,
    /// Model usage of the turn, and the part of it held in the budget
    /// ledger until the commit is durable.
    pub usage: TurnUsage,
    /// The turn's span while traces are exported: kept open until the
    /// commit is durable, which then records its time (the actor layer
    /// sets it).
    pub span: Option<tracing::Span>,
}

impl FinishedTurn {
    /// Whether the turn wrote nothing: no state, events, alarms, input
    /// requests or messages to other actors.
    pub fn is_empty(&self) -> bool {
        self.writes.is_empty()
            && self.events.is_empty()
            && self.alarm_writes.is_empty()
            && self.input_writes.is_empty()
            && self.sends.is_empty()
            && self.files.is_empty()
            && self.usage.is_empty()
    }

    /// A commit that changes no state (bookkeeping only) of an actor
    /// holding `counts`.
    pub fn unchanged(counts: ActorCounts) -> Self {
        Self {
            state_bytes: counts.state_bytes,
            state_keys: counts.state_keys,
            ..Default::default()
        }
    }
}

#[cfg(test)]
mod tests {
    //! Model-based test: random turns of state operations, some committed and
    //! some abandoned, with the cache dropped now and then (hibernation),
    //! checked step by step against a `BTreeMap` and finally against disk.

    use std::collections::BTreeMap;

    use rand::rngs::StdRng;
    use rand::{Rng, SeedableRng};
    use tokio::sync::oneshot;

    use super::*;
    use crate::config::StorageConfig;
    use crate::sandbox::caps::actors::ActorLimits;
    use crate::sandbox::caps::alarms::AlarmLimits;
    use crate::sandbox::caps::events::EventLimits;
    use crate::sandbox::caps::files::FileLimits;
    use crate::sandbox::caps::inputs::InputLimits;
    use crate::sandbox::caps::log::LogLimits;
    use crate::sandbox::caps::state::StateLimits;
    use crate::storage::schema::{ActorRecord, AlarmSchedule};
    use crate::storage::{CommitTracker, TurnCommit, WriteOp, WriterMetrics};

    fn limits() -> TurnLimits {
        TurnLimits {
            state: StateLimits {
                max_value_bytes: 64,
                // Below what the model's 24 keys can hold (~1.6 KB), so
                // sets past it are refused now and then.
                max_state_bytes: 512,
                max_turn_write_bytes: 1 << 20,
                max_cache_bytes: 1 << 20,
            },
            events: EventLimits {
                max_event_bytes: 1024,
                max_events_per_turn: 10,
                max_turn_event_bytes: 4096,
            },
            log: LogLimits {
                max_lines: 10,
                max_line_bytes: 100,
                budget: std::sync::Arc::new(crate::sandbox::LogBudget::new(
                    1 << 20,
                    Default::default(),
                )),
            },
            alarms: AlarmLimits {
                max_alarms: 10,
                max_payload_bytes: 1024,
            },
            inputs: InputLimits { max_pending: 10 },
            actors: ActorLimits {
                max_sends_per_turn: 10,
                max_turn_send_bytes: 4 << 20,
                max_message_bytes: 1 << 20,
            },
            files: FileLimits {
                max_file_bytes: 1 << 20,
                max_actor_bytes: 1 << 30,
                max_actor_files: 1000,
                max_type_bytes: 1 << 30,
                inline_max_bytes: 1024,
            },
        }
    }

    fn size(m: &BTreeMap<String, Vec<u8>>) -> u64 {
        m.iter().map(|(k, v)| (k.len() + v.len()) as u64).sum()
    }

    #[tokio::test]
    async fn state_matches_a_btreemap_model() {
        let mut over = 0;
        for seed in 0..8u64 {
            over += run_model(seed).await;
        }
        assert!(over > 0, "no set went past max_state_bytes");
    }

    /// Returns how many sets the state quota refused.
    async fn run_model(seed: u64) -> usize {
        let dir = tempfile::tempdir().unwrap();
        let storage = Arc::new(
            Storage::open(dir.path(), &StorageConfig::default(), WriterMetrics::new()).unwrap(),
        );
        let key = ActorKey::new("t", "a").unwrap();
        let k2 = key.clone();
        let mut record: ActorRecord = storage
            .writer()
            .call(|done| WriteOp::GetOrCreate {
                key: k2,
                version: 1,
                early: None,
                done,
            })
            .await
            .unwrap();
        let tracker = Arc::new(CommitTracker::default());
        let mut rng = StdRng::seed_from_u64(seed);
        let limits = limits();
        let mut committed: BTreeMap<String, Vec<u8>> = BTreeMap::new();
        let mut carry = Carry::default();
        let keys: Vec<String> = (0..24)
            .map(|i| format!("{}/{i}", ["a", "b", "ab"][i % 3]))
            .collect();
        let mut pending = Vec::new();
        // Alarms: name → due, as committed.
        let mut committed_alarms: BTreeMap<String, u64> = BTreeMap::new();
        let mut over_quota = 0;
        const NOW: u64 = 1_000_000;
        for seq in 1..=120 {
            let start = TurnStart {
                key: key.clone(),
                num: record.num,
                version: 1,
                seq,
                turn_id: format!("t{seq}"),
                counts: ActorCounts {
                    state_bytes: record.state_bytes,
                    state_keys: record.state_keys,
                    last_event_seq: 0,
                },
                chain: Arc::from([]),
                durable_before: None,
                attempt: 0,
                calls_id: None,
            };
            let mut turn = TurnState::new(start, std::mem::take(&mut carry), &limits, &storage);
            let mut model = committed.clone();
            let mut alarm_model = committed_alarms.clone();
            for _ in 0..rng.random_range(1..8) {
                let k = &keys[rng.random_range(0..keys.len())];
                let name = ["x", "y", "z", "w"][rng.random_range(0..4)].to_owned();
                match rng.random_range(0..13) {
                    10 => {
                        let after = rng.random_range(0..1000);
                        let r = turn
                            .alarms
                            .set(name.clone(), AlarmSchedule::After(after), vec![], NOW)
                            .unwrap();
                        assert_eq!(r, Ok(()));
                        alarm_model.insert(name, NOW + after);
                    }
                    11 => {
                        let existed = turn.alarms.cancel(&name).unwrap();
                        assert_eq!(existed, alarm_model.remove(&name).is_some(), "seed {seed}");
                    }
                    12 => {
                        let got: BTreeMap<String, u64> = turn
                            .alarms
                            .list()
                            .unwrap()
                            .into_iter()
                            .map(|(n, r)| (n, r.next_due_ms))
                            .collect();
                        assert_eq!(got, alarm_model, "seed {seed}: alarm list");
                    }
                    0..=3 => {
                        let len = rng.random_range(0..80);
                        let v = vec![b'v'; len];
                        let r = turn.state.set(k.clone(), Bytes::from(v.clone())).unwrap();
                        let mut next = model.clone();
                        next.insert(k.clone(), v);
                        let max = limits.state.max_state_bytes;
                        if len > 64 || size(&next) > max && size(&next) > size(&model) {
                            assert!(r.is_err(), "seed {seed}: over-limit set accepted");
                            over_quota += usize::from(len <= 64);
                        } else {
                            assert_eq!(r, Ok(()));
                            model = next;
                        }
                    }
                    4..=5 => {
                        let existed = turn.state.delete(k).unwrap();
                        assert_eq!(
                            existed,
                            model.remove(k).is_some(),
                            "seed {seed}: delete {k}"
                        );
                    }
                    6..=7 => {
                        let got = turn.state.get(k).unwrap().map(|b| b.to_vec());
                        assert_eq!(got.as_ref(), model.get(k), "seed {seed}: get {k}");
                    }
                    _ => {
                        let prefix = ["a", "b", "ab/", ""][rng.random_range(0..4)];
                        let after = rng
                            .random_bool(0.3)
                            .then(|| keys[rng.random_range(0..keys.len())].clone());
                        let limit = rng.random_range(1..10);
                        let got: Vec<(String, Vec<u8>)> = turn
                            .state
                            .list(prefix, after.as_deref(), limit)
                            .unwrap()
                            .into_iter()
                            .map(|(k, v)| (k, v.to_vec()))
                            .collect();
                        let want: Vec<(String, Vec<u8>)> = model
                            .iter()
                            .filter(|(k, _)| {
                                k.starts_with(prefix) && after.as_ref().is_none_or(|a| *k > a)
                            })
                            .take(limit)
                            .map(|(k, v)| (k.clone(), v.clone()))
                            .collect();
                        assert_eq!(got, want, "seed {seed}: list {prefix:?} after {after:?}");
                    }
                }
            }
            assert_eq!(
                turn.state.state_bytes,
                size(&model),
                "seed {seed}: state_bytes"
            );
            assert_eq!(
                turn.state.state_keys,
                model.len() as u64,
                "seed {seed}: state_keys"
            );
            if rng.random_bool(0.8) {
                let (c, finished) = turn.finish();
                carry = c;
                committed = model;
                committed_alarms = alarm_model;
                record.state_bytes = finished.state_bytes;
                record.state_keys = finished.state_keys;
                record.turns += 1;
                let (tx, rx) = oneshot::channel();
                storage.writer().submit(WriteOp::Turn(Box::new(TurnCommit {
                    key: key.clone(),
                    tracker: tracker.clone(),
                    generation: 0,
                    seq,
                    num: record.num,
                    record: Some(record.clone()),
                    alarms: finished.alarm_writes,
                    inputs: finished.input_writes,
                    sends: finished.sends,
                    relay_sends: false,
                    files: finished.files,
                    usage: None,
                    traceparent: None,
                    state: finished.writes,
                    events: Vec::new(),
                    trim_events_below: None,
                    idempotency: None,
                    inbox_done: None,
                    inbox_update: None,
                    on_durable: Box::new(move |r| {
                        let _ = tx.send(r);
                    }),
                })));
                pending.push(rx);
            } else {
                carry = turn.abandon();
            }
            if rng.random_bool(0.1) {
                // Hibernate: wait for commits, forget everything in memory.
                for rx in pending.drain(..) {
                    rx.await.unwrap().unwrap();
                }
                carry = Carry::default();
            } else if rng.random_bool(0.2) {
                carry.trim(0, tracker.committed_seq());
            }
        }
        for rx in pending.drain(..) {
            rx.await.unwrap().unwrap();
        }
        let on_disk: BTreeMap<String, Vec<u8>> = storage
            .reader()
            .unwrap()
            .state_range(record.num, "", None, 1000)
            .unwrap()
            .into_iter()
            .collect();
        assert_eq!(
            on_disk, committed,
            "seed {seed}: disk differs from the model"
        );
        let reader = storage.reader().unwrap();
        let alarms_on_disk: BTreeMap<String, u64> = reader
            .alarms(record.num)
            .unwrap()
            .into_iter()
            .map(|(n, r)| (n, r.next_due_ms))
            .collect();
        assert_eq!(
            alarms_on_disk, committed_alarms,
            "seed {seed}: alarms on disk"
        );
        // The due index holds exactly one entry per alarm, at its due time.
        let index: Vec<(u64, u64, String)> = reader.alarms_due(0, u64::MAX, 1000).unwrap();
        let want: Vec<(u64, u64, String)> = {
            let mut v: Vec<_> = committed_alarms
                .iter()
                .map(|(n, d)| (*d, record.num, n.clone()))
                .collect();
            v.sort();
            v
        };
        assert_eq!(index, want, "seed {seed}: due index");
        assert_eq!(reader.alarm_count(record.num).unwrap(), want.len() as u64);
        let rec = reader.actor(&key).unwrap().unwrap();
        assert_eq!(rec.state_bytes, size(&committed));
        assert_eq!(rec.state_keys, committed.len() as u64);
        over_quota
    }
}
