//! What one turn sees and writes.
//!
//! A [`TurnState`] is moved into the store before a handler runs and taken
//! out afterwards. Host capabilities buffer every write in it; nothing reaches
//! storage until the actor turns a successful [`TurnState`] into a commit. A
//! failed turn is dropped with its buffer, which is how "a turn that traps
//! commits nothing" holds.
//!
//! Reads go, in order, through the turn's own writes, the actor's
//! [`StateCache`] (values it read or wrote during this activation, including
//! writes whose commit is still in flight) and finally a redb read
//! transaction. The cache is authoritative for every key it holds because
//! this activation is the only writer of the actor's state.

use std::collections::{BTreeMap, HashMap};
use std::sync::Arc;

use bytes::Bytes;

use crate::ids::{ActorKey, MAX_STATE_KEY};
use crate::storage::schema::{
    AlarmRecord, AlarmSchedule, InboxKind, InboxRecord, InputRecord, InputStatus,
};
use crate::storage::{Storage, StorageError};

/// The last commit an actor submitted before a turn, and its generation.
/// A request that leaves mid-turn (`actors.call`) must not depend on
/// earlier turns that could still fail to commit.
#[derive(Clone)]
pub struct DurableBefore {
    /// The actor's commit bookkeeping.
    pub tracker: Arc<crate::storage::CommitTracker>,
    /// Submitted seq to wait for.
    pub seq: u64,
    /// The actor's generation (a failed commit raises the tracker's).
    pub generation: u64,
}

/// Limits that apply inside a turn.
#[derive(Debug, Clone)]
pub struct TurnLimits {
    /// Largest state value.
    pub max_value_bytes: usize,
    /// Largest total state.
    pub max_state_bytes: u64,
    /// Largest event payload.
    pub max_event_bytes: usize,
    /// Events one turn may emit.
    pub max_events_per_turn: usize,
    /// Log lines one turn may write.
    pub max_log_lines: u32,
    /// Longest log line kept.
    pub max_log_line_bytes: usize,
    /// Bytes of state one turn may write (keys plus values).
    pub max_turn_write_bytes: usize,
    /// Values read from disk are cached only while the actor's cache holds
    /// less than this.
    pub max_cache_bytes: usize,
    /// Alarms one actor may have pending.
    pub max_alarms: usize,
    /// Largest alarm payload.
    pub max_alarm_payload_bytes: usize,
    /// Input requests one actor may have pending.
    pub max_pending_inputs: u64,
    /// Messages one turn may send with `actors.send`.
    pub max_sends_per_turn: usize,
    /// Largest message body.
    pub max_message_bytes: usize,
}

/// What an actor keeps between its turns: what it has read, so the next
/// turn need not read it again, including changes not yet durable.
#[derive(Debug, Default)]
pub struct Carry {
    /// State values.
    pub cache: StateCache,
    /// The actor's alarms, once a turn needed them.
    pub alarms: Option<BTreeMap<String, AlarmRecord>>,
    /// How many input requests are pending, once a turn needed it.
    pub pending_inputs: Option<u64>,
}

/// A cached state value.
#[derive(Debug, Clone)]
struct Cached {
    value: Option<Bytes>,
    /// Turn that wrote it (0: read from disk). Entries written by a turn whose
    /// commit is not yet durable must not be evicted.
    written_by: u64,
}

/// Values an active actor has read or written, so hot keys never touch redb.
#[derive(Debug, Default)]
pub struct StateCache {
    entries: HashMap<String, Cached>,
    bytes: usize,
}

impl StateCache {
    fn get(&self, key: &str) -> Option<&Option<Bytes>> {
        self.entries.get(key).map(|c| &c.value)
    }

    fn insert(&mut self, key: String, value: Option<Bytes>, written_by: u64) {
        let key_len = key.len();
        let value_len = value.as_ref().map_or(0, Bytes::len);
        match self.entries.insert(key, Cached { value, written_by }) {
            Some(old) => {
                self.bytes = self.bytes - old.value.as_ref().map_or(0, Bytes::len) + value_len;
            }
            None => self.bytes += key_len + value_len,
        }
    }

    /// Approximate memory held.
    pub fn bytes(&self) -> usize {
        self.bytes
    }

    /// Drop entries whose writes are durable (or that came from disk) when
    /// the cache grew beyond `cap` bytes.
    pub fn trim(&mut self, cap: usize, committed_seq: u64) {
        if self.bytes <= cap {
            return;
        }
        let mut bytes = 0;
        self.entries.retain(|k, c| {
            let keep = c.written_by > committed_seq;
            if keep {
                bytes += k.len() + c.value.as_ref().map_or(0, Bytes::len);
            }
            keep
        });
        self.bytes = bytes;
    }
}

/// The per-turn buffer and state view.
pub struct TurnState {
    /// The actor.
    pub key: ActorKey,
    /// Its actor number.
    pub num: u64,
    /// Code version running the turn.
    pub version: u32,
    /// This turn's sequence number within the activation.
    pub seq: u64,
    /// The actor's cache, moved in for the turn.
    pub cache: StateCache,
    /// State written by this turn, in key order (`None` deletes).
    pub writes: BTreeMap<String, Option<Bytes>>,
    /// Total state size, including this turn's writes.
    pub state_bytes: u64,
    /// Number of state keys, including this turn's writes.
    pub state_keys: u64,
    /// Events emitted by this turn: (kind, JSON data).
    pub events: Vec<(String, Vec<u8>)>,
    /// Seq the next emitted event gets.
    pub next_event_seq: u64,
    /// Log lines written so far.
    pub log_lines: u32,
    /// Bytes written by `set` so far.
    write_bytes: usize,
    /// The actor's alarms: loaded on first use, plus this turn's changes.
    pub alarms: AlarmBook,
    /// Pending input requests (count loaded on first use) and this turn's.
    pub inputs: InputBook,
    /// Callers above this turn (`actors.call`), for cycle detection.
    pub chain: super::host::CallChain,
    /// This actor's commits before this turn: `actors.call` waits for them.
    pub durable_before: Option<DurableBefore>,
    /// Messages sent with `actors.send`, queued when the turn commits.
    pub sends: Vec<(ActorKey, InboxRecord)>,
    /// Limits.
    pub limits: Arc<TurnLimits>,
    storage: Arc<Storage>,
}

/// Why a guest call was refused; shown to the guest.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Refusal {
    /// A malformed argument.
    Invalid(String),
    /// A limit was reached.
    Limit(String),
}

impl TurnState {
    /// A turn for actor `num` whose record says it holds `state_bytes` in
    /// `state_keys` keys and whose last event is `last_event_seq`.
    #[allow(clippy::too_many_arguments, reason = "plain data constructor")]
    pub fn new(
        key: ActorKey,
        num: u64,
        version: u32,
        seq: u64,
        carry: Carry,
        state_bytes: u64,
        state_keys: u64,
        last_event_seq: u64,
        limits: Arc<TurnLimits>,
        storage: Arc<Storage>,
    ) -> Self {
        Self {
            key,
            num,
            version,
            seq,
            cache: carry.cache,
            writes: BTreeMap::new(),
            state_bytes,
            state_keys,
            events: Vec::new(),
            next_event_seq: last_event_seq + 1,
            log_lines: 0,
            write_bytes: 0,
            alarms: AlarmBook {
                known: carry.alarms,
                writes: BTreeMap::new(),
            },
            inputs: InputBook {
                pending: carry.pending_inputs,
                created: Vec::new(),
            },
            chain: Arc::from([]),
            durable_before: None,
            sends: Vec::new(),
            limits,
            storage,
        }
    }

    /// The value under `key` as this turn sees it.
    pub fn get(&mut self, key: &str) -> Result<Option<Bytes>, StorageError> {
        if check_key(key).is_err() {
            return Ok(None);
        }
        if let Some(v) = self.writes.get(key) {
            return Ok(v.clone());
        }
        if let Some(v) = self.cache.get(key) {
            return Ok(v.clone());
        }
        let v = self
            .storage
            .reader()?
            .state(self.num, key)?
            .map(Bytes::from);
        // A turn that reads a lot must not grow the cache without bound.
        if self.cache.bytes() < self.limits.max_cache_bytes {
            self.cache.insert(key.to_owned(), v.clone(), 0);
        }
        Ok(v)
    }

    /// Buffer a write of `value` under `key`.
    pub fn set(&mut self, key: String, value: Bytes) -> Result<Result<(), Refusal>, StorageError> {
        if let Err(r) = check_key(&key) {
            return Ok(Err(r));
        }
        if value.len() > self.limits.max_value_bytes {
            return Ok(Err(Refusal::Limit(format!(
                "state value of {} bytes exceeds the limit of {} bytes",
                value.len(),
                self.limits.max_value_bytes
            ))));
        }
        let written = key.len() + value.len();
        if self.write_bytes + written > self.limits.max_turn_write_bytes {
            return Ok(Err(Refusal::Limit(format!(
                "a turn may write at most {} bytes of state",
                self.limits.max_turn_write_bytes
            ))));
        }
        let old = self.get(&key)?;
        let old_size = old.as_ref().map_or(0, |v| (key.len() + v.len()) as u64);
        let new_size = (key.len() + value.len()) as u64;
        let total = self.state_bytes - old_size + new_size;
        if new_size > old_size && total > self.limits.max_state_bytes {
            return Ok(Err(Refusal::Limit(format!(
                "actor state would grow to {total} bytes, over the limit of {} bytes",
                self.limits.max_state_bytes
            ))));
        }
        self.state_bytes = total;
        self.write_bytes += written;
        if old.is_none() {
            self.state_keys += 1;
        }
        self.writes.insert(key, Some(value));
        Ok(Ok(()))
    }

    /// Buffer a delete; returns whether the key existed.
    pub fn delete(&mut self, key: &str) -> Result<bool, StorageError> {
        if check_key(key).is_err() {
            return Ok(false);
        }
        let Some(old) = self.get(key)? else {
            return Ok(false);
        };
        self.state_bytes -= (key.len() + old.len()) as u64;
        self.state_keys -= 1;
        self.writes.insert(key.to_owned(), None);
        Ok(true)
    }

    /// Entries with `prefix` in key order, after `start_after`, at most `limit`.
    pub fn list(
        &mut self,
        prefix: &str,
        start_after: Option<&str>,
        limit: usize,
    ) -> Result<Vec<(String, Bytes)>, StorageError> {
        let in_range = |k: &str| k.starts_with(prefix) && start_after.is_none_or(|a| k > a);
        // This activation's view overrides disk: cache first, then this
        // turn's writes on top.
        let mut overlay: BTreeMap<&str, &Option<Bytes>> = BTreeMap::new();
        for (k, c) in &self.cache.entries {
            if in_range(k) {
                overlay.insert(k, &c.value);
            }
        }
        for (k, v) in &self.writes {
            if in_range(k) {
                overlay.insert(k, v);
            }
        }
        // Deleted keys may hide disk rows, so read that many more.
        let hidden = overlay.values().filter(|v| v.is_none()).count();
        let disk = self.storage.reader()?.state_range(
            self.num,
            prefix,
            start_after,
            limit.saturating_add(hidden),
        )?;
        let mut merged: BTreeMap<String, Bytes> =
            disk.into_iter().map(|(k, v)| (k, Bytes::from(v))).collect();
        for (k, v) in overlay {
            match v {
                Some(v) => {
                    merged.insert(k.to_owned(), v.clone());
                }
                None => {
                    merged.remove(k);
                }
            }
        }
        Ok(merged.into_iter().take(limit).collect())
    }

    /// Buffer an event; returns its seq.
    pub fn emit(&mut self, kind: String, data: Vec<u8>) -> Result<u64, Refusal> {
        if kind.is_empty() || kind.len() > 128 || kind.chars().any(char::is_control) {
            return Err(Refusal::Invalid(
                "event kind must be 1 to 128 bytes without control characters".into(),
            ));
        }
        if data.len() > self.limits.max_event_bytes {
            return Err(Refusal::Limit(format!(
                "event data of {} bytes exceeds the limit of {} bytes",
                data.len(),
                self.limits.max_event_bytes
            )));
        }
        if self.events.len() >= self.limits.max_events_per_turn {
            return Err(Refusal::Limit(format!(
                "a turn may emit at most {} events",
                self.limits.max_events_per_turn
            )));
        }
        if serde_json::from_slice::<serde::de::IgnoredAny>(&data).is_err() {
            return Err(Refusal::Invalid("event data must be JSON".into()));
        }
        let seq = self.next_event_seq;
        self.next_event_seq += 1;
        self.events.push((kind, data));
        Ok(seq)
    }

    /// The actor's pending alarms as this turn sees them.
    fn alarm_view(&mut self) -> Result<BTreeMap<String, AlarmRecord>, StorageError> {
        if self.alarms.known.is_none() {
            let on_disk = self.storage.reader()?.alarms(self.num)?;
            self.alarms.known = Some(on_disk.into_iter().collect());
        }
        let mut view = self.alarms.known.clone().unwrap_or_default();
        for (name, rec) in &self.alarms.writes {
            match rec {
                Some(r) => {
                    view.insert(name.clone(), r.clone());
                }
                None => {
                    view.remove(name);
                }
            }
        }
        Ok(view)
    }

    /// Set (or replace) alarm `name`.
    pub fn alarm_set(
        &mut self,
        name: String,
        schedule: AlarmSchedule,
        payload: Vec<u8>,
        now_ms: u64,
    ) -> Result<Result<(), Refusal>, StorageError> {
        if let Err(e) = crate::alarms::check_name(&name) {
            return Ok(Err(Refusal::Invalid(e.to_string())));
        }
        if payload.len() > self.limits.max_alarm_payload_bytes {
            return Ok(Err(Refusal::Limit(format!(
                "alarm payload of {} bytes exceeds the limit of {} bytes",
                payload.len(),
                self.limits.max_alarm_payload_bytes
            ))));
        }
        let due = match crate::alarms::first_due(&schedule, now_ms) {
            Ok(d) => d,
            Err(e) => return Ok(Err(Refusal::Invalid(e.to_string()))),
        };
        let view = self.alarm_view()?;
        let user_alarms = view
            .keys()
            .filter(|n| !crate::alarms::is_internal(n))
            .count();
        if !view.contains_key(&name) && user_alarms >= self.limits.max_alarms {
            return Ok(Err(Refusal::Limit(format!(
                "an actor may have at most {} pending alarms",
                self.limits.max_alarms
            ))));
        }
        let rec = AlarmRecord {
            schedule,
            payload,
            next_due_ms: due,
            attempts: 0,
            boot_attempts: 0,
            set_at_ms: now_ms,
        };
        self.alarms.writes.insert(name, Some(rec));
        Ok(Ok(()))
    }

    /// Cancel alarm `name`; whether it was pending.
    pub fn alarm_cancel(&mut self, name: &str) -> Result<bool, StorageError> {
        if crate::alarms::is_internal(name) {
            return Ok(false);
        }
        let existed = self.alarm_view()?.contains_key(name);
        if existed {
            self.alarms.writes.insert(name.to_owned(), None);
        }
        Ok(existed)
    }

    /// Pending alarms, by name (the platform's own are not shown).
    pub fn alarm_list(&mut self) -> Result<Vec<(String, AlarmRecord)>, StorageError> {
        Ok(self
            .alarm_view()?
            .into_iter()
            .filter(|(n, _)| !crate::alarms::is_internal(n))
            .collect())
    }

    /// Ask for input: a pending request committed with the turn, expired by
    /// one of the platform's alarms if it has a deadline, announced with an
    /// `input_requested` event. Returns its id.
    pub fn input_request(
        &mut self,
        kind: String,
        prompt: String,
        schema: Option<String>,
        expires_in_ms: Option<u64>,
        now_ms: u64,
    ) -> Result<Result<String, Refusal>, StorageError> {
        if let Err(e) =
            crate::inputs::check_request(&kind, &prompt, schema.as_deref(), expires_in_ms)
        {
            return Ok(Err(Refusal::Invalid(e)));
        }
        let pending = match self.inputs.pending {
            Some(p) => p,
            None => {
                let p = self.storage.reader()?.pending_input_count(self.num)?;
                self.inputs.pending = Some(p);
                p
            }
        };
        if pending + self.inputs.created.len() as u64 >= self.limits.max_pending_inputs {
            return Ok(Err(Refusal::Limit(format!(
                "an actor may have at most {} pending input requests",
                self.limits.max_pending_inputs
            ))));
        }
        let id = crate::inputs::new_id();
        let expires_at_ms = expires_in_ms.map(|ms| now_ms + ms);
        let announce = serde_json::json!({
            "id": id,
            "kind": kind,
            "prompt": prompt,
            "schema": schema.as_deref().and_then(|s| serde_json::from_str::<serde_json::Value>(s).ok()),
            "expires_at_ms": expires_at_ms,
        });
        if let Err(r) = self.emit("input_requested".into(), announce.to_string().into_bytes()) {
            return Ok(Err(r));
        }
        if let Some(due) = expires_at_ms {
            self.alarms.writes.insert(
                crate::alarms::input_expiry_alarm(&id),
                Some(AlarmRecord {
                    schedule: AlarmSchedule::At(due),
                    payload: Vec::new(),
                    next_due_ms: due,
                    attempts: 0,
                    boot_attempts: 0,
                    set_at_ms: now_ms,
                }),
            );
        }
        self.inputs.created.push((
            id.clone(),
            InputRecord {
                kind,
                prompt,
                schema,
                created_at_ms: now_ms,
                expires_at_ms,
                status: InputStatus::Pending,
            },
        ));
        Ok(Ok(id))
    }

    /// Queue a message to `to` (a type at `version` for a new actor), sent
    /// durably if and only if this turn commits.
    pub fn actor_send(&mut self, to: ActorKey, body: Vec<u8>, now_ms: u64) -> Result<(), Refusal> {
        if self.sends.len() >= self.limits.max_sends_per_turn {
            return Err(Refusal::Limit(format!(
                "a turn may send at most {} messages",
                self.limits.max_sends_per_turn
            )));
        }
        if body.len() > self.limits.max_message_bytes {
            return Err(Refusal::Limit(format!(
                "a message of {} bytes exceeds the limit of {} bytes",
                body.len(),
                self.limits.max_message_bytes
            )));
        }
        let message = InboxRecord {
            message_id: crate::ids::new_message_id(),
            body,
            content_type: Some("application/json".into()),
            idempotency_key: None,
            attempts: 0,
            enqueued_at_ms: now_ms,
            kind: InboxKind::Message,
        };
        self.sends.push((to, message));
        Ok(())
    }

    /// Fold this turn's writes into the caches (the turn succeeded) and give
    /// them back to the actor along with the writes to commit.
    pub fn finish(mut self) -> (Carry, FinishedTurn) {
        let writes: Vec<(String, Option<Bytes>)> =
            std::mem::take(&mut self.writes).into_iter().collect();
        for (k, v) in &writes {
            self.cache.insert(k.clone(), v.clone(), self.seq);
        }
        let alarm_writes: Vec<(String, Option<AlarmRecord>)> =
            std::mem::take(&mut self.alarms.writes)
                .into_iter()
                .collect();
        if let Some(known) = &mut self.alarms.known {
            for (name, rec) in &alarm_writes {
                match rec {
                    Some(r) => {
                        known.insert(name.clone(), r.clone());
                    }
                    None => {
                        known.remove(name);
                    }
                }
            }
        }
        let created = self.inputs.created.len() as u64;
        let carry = Carry {
            cache: self.cache,
            alarms: self.alarms.known,
            pending_inputs: self.inputs.pending.map(|p| p + created),
        };
        let finished = FinishedTurn {
            writes,
            events: self.events,
            state_bytes: self.state_bytes,
            state_keys: self.state_keys,
            alarm_writes,
            input_writes: self
                .inputs
                .created
                .into_iter()
                .map(|(id, r)| (id, Some(r)))
                .collect(),
            sends: self.sends,
        };
        (carry, finished)
    }

    /// Discard this turn's writes and give the caches back.
    pub fn abandon(self) -> Carry {
        Carry {
            cache: self.cache,
            alarms: self.alarms.known,
            pending_inputs: self.inputs.pending,
        }
    }
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
    /// Messages to other actors: (recipient, its type's version for a new
    /// actor, the inbox row).
    pub sends: Vec<(ActorKey, InboxRecord)>,
}

/// An actor's input requests as a turn sees them.
#[derive(Debug, Default)]
pub struct InputBook {
    /// Pending requests before this turn; `None` until first needed.
    pub pending: Option<u64>,
    /// Requests this turn made.
    pub created: Vec<(String, InputRecord)>,
}

/// An actor's alarms as a turn sees them.
#[derive(Debug, Default)]
pub struct AlarmBook {
    /// Pending alarms (on disk plus earlier turns of this activation);
    /// `None` until first needed.
    pub known: Option<BTreeMap<String, AlarmRecord>>,
    /// This turn's sets (`Some`) and cancels (`None`).
    pub writes: BTreeMap<String, Option<AlarmRecord>>,
}

fn check_key(key: &str) -> Result<(), Refusal> {
    if key.is_empty() {
        return Err(Refusal::Invalid("state key must not be empty".into()));
    }
    if key.len() > MAX_STATE_KEY {
        return Err(Refusal::Invalid(format!(
            "state key of {} bytes exceeds the limit of {MAX_STATE_KEY} bytes",
            key.len()
        )));
    }
    Ok(())
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
    use crate::metrics::Metrics;
    use crate::storage::schema::ActorRecord;
    use crate::storage::{CommitTracker, TurnCommit, WriteOp};

    fn limits() -> Arc<TurnLimits> {
        Arc::new(TurnLimits {
            max_value_bytes: 64,
            max_state_bytes: 4096,
            max_event_bytes: 1024,
            max_events_per_turn: 10,
            max_log_lines: 10,
            max_log_line_bytes: 100,
            max_turn_write_bytes: 1 << 20,
            max_cache_bytes: 1 << 20,
            max_alarms: 10,
            max_alarm_payload_bytes: 1024,
            max_pending_inputs: 10,
            max_sends_per_turn: 10,
            max_message_bytes: 1 << 20,
        })
    }

    fn size(m: &BTreeMap<String, Vec<u8>>) -> u64 {
        m.iter().map(|(k, v)| (k.len() + v.len()) as u64).sum()
    }

    #[tokio::test]
    async fn state_matches_a_btreemap_model() {
        for seed in 0..8u64 {
            run_model(seed).await;
        }
    }

    async fn run_model(seed: u64) {
        let dir = tempfile::tempdir().unwrap();
        let storage = Arc::new(
            Storage::open(
                dir.path(),
                &StorageConfig::default(),
                Arc::new(Metrics::new()),
            )
            .unwrap(),
        );
        let key = ActorKey::new("t", "a").unwrap();
        let k2 = key.clone();
        let mut record: ActorRecord = storage
            .writer()
            .call(|done| WriteOp::GetOrCreate {
                key: k2,
                version: 1,
                done,
            })
            .await
            .unwrap();
        let tracker = Arc::new(CommitTracker::default());
        let mut rng = StdRng::seed_from_u64(seed);
        let mut committed: BTreeMap<String, Vec<u8>> = BTreeMap::new();
        let mut carry = Carry::default();
        let keys: Vec<String> = (0..24)
            .map(|i| format!("{}/{i}", ["a", "b", "ab"][i % 3]))
            .collect();
        let mut seq = 0;
        let mut pending = Vec::new();
        // Alarms: name → due, as committed.
        let mut committed_alarms: BTreeMap<String, u64> = BTreeMap::new();
        const NOW: u64 = 1_000_000;
        for _turn in 0..120 {
            seq += 1;
            let mut turn = TurnState::new(
                key.clone(),
                record.num,
                1,
                seq,
                std::mem::take(&mut carry),
                record.state_bytes,
                record.state_keys,
                0,
                limits(),
                storage.clone(),
            );
            let mut model = committed.clone();
            let mut alarm_model = committed_alarms.clone();
            for _ in 0..rng.random_range(1..8) {
                let k = &keys[rng.random_range(0..keys.len())];
                let name = ["x", "y", "z", "w"][rng.random_range(0..4)].to_owned();
                match rng.random_range(0..13) {
                    10 => {
                        let after = rng.random_range(0..1000);
                        let r = turn
                            .alarm_set(name.clone(), AlarmSchedule::After(after), vec![], NOW)
                            .unwrap();
                        assert_eq!(r, Ok(()));
                        alarm_model.insert(name, NOW + after);
                    }
                    11 => {
                        let existed = turn.alarm_cancel(&name).unwrap();
                        assert_eq!(existed, alarm_model.remove(&name).is_some(), "seed {seed}");
                    }
                    12 => {
                        let got: BTreeMap<String, u64> = turn
                            .alarm_list()
                            .unwrap()
                            .into_iter()
                            .map(|(n, r)| (n, r.next_due_ms))
                            .collect();
                        assert_eq!(got, alarm_model, "seed {seed}: alarm list");
                    }
                    0..=3 => {
                        let len = rng.random_range(0..80);
                        let v = vec![b'v'; len];
                        let r = turn.set(k.clone(), Bytes::from(v.clone())).unwrap();
                        let mut next = model.clone();
                        next.insert(k.clone(), v);
                        if len > 64 || size(&next) > 4096 && size(&next) > size(&model) {
                            assert!(r.is_err(), "seed {seed}: over-limit set accepted");
                        } else {
                            assert_eq!(r, Ok(()));
                            model = next;
                        }
                    }
                    4..=5 => {
                        let existed = turn.delete(k).unwrap();
                        assert_eq!(
                            existed,
                            model.remove(k).is_some(),
                            "seed {seed}: delete {k}"
                        );
                    }
                    6..=7 => {
                        let got = turn.get(k).unwrap().map(|b| b.to_vec());
                        assert_eq!(got.as_ref(), model.get(k), "seed {seed}: get {k}");
                    }
                    _ => {
                        let prefix = ["a", "b", "ab/", ""][rng.random_range(0..4)];
                        let after = rng
                            .random_bool(0.3)
                            .then(|| keys[rng.random_range(0..keys.len())].clone());
                        let limit = rng.random_range(1..10);
                        let got: Vec<(String, Vec<u8>)> = turn
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
            assert_eq!(turn.state_bytes, size(&model), "seed {seed}: state_bytes");
            assert_eq!(
                turn.state_keys,
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
                carry.cache.trim(0, tracker.committed_seq());
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
    }
}
