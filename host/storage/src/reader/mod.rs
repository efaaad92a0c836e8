//! Reading: a consistent read-only view of everything committed, with
//! typed accessors per table; the outbox's and the relay's in [`outbox`].

mod outbox;

use redb::{ReadableTable, ReadableTableMetadata};

use crate::schema::*;
use crate::{StorageError, decode_type};
use marmot_core::ids::ActorKey;

pub use outbox::{DeliveryPage, DueScan};

/// State entries: (key, value), in key order.
pub type StateEntries = Vec<(String, Vec<u8>)>;

/// A page of input requests by id, and whether more follow.
pub type InputsPage = (Vec<(String, InputRecord)>, bool);

/// A page of alarms by name, and whether more follow.
pub type AlarmsPage = (Vec<(String, AlarmRecord)>, bool);

/// A table of per-actor rows keyed by name: state, alarms, inputs, files.
type NamedTable = redb::TableDefinition<'static, (u64, &'static str), &'static [u8]>;

/// What [`Reader::named_page`] does with one row.
enum Row<T> {
    /// Put it in the page.
    Take(T),
    /// Leave it out and go on.
    Skip,
    /// Stop: no row past this one belongs to the listing.
    End,
}

/// A read transaction with typed accessors.
pub struct Reader {
    pub(crate) txn: redb::ReadTransaction,
}

/// One page of a listing.
#[derive(Debug)]
pub struct Page<T> {
    /// The items.
    pub items: Vec<T>,
    /// Where the next page starts, if there is one.
    pub next_cursor: Option<String>,
}

impl Reader {
    /// Every type record.
    pub fn types(&self) -> Result<Vec<TypeRecord>, StorageError> {
        let t = self.txn.open_table(TYPES)?;
        let mut out = Vec::new();
        for row in t.iter()? {
            let (_, v) = row?;
            out.push(decode_type(v.value())?);
        }
        Ok(out)
    }

    /// The code of one version.
    pub fn code(&self, ty: &str, version: u32) -> Result<Option<Vec<u8>>, StorageError> {
        let t = self.txn.open_table(CODE)?;
        Ok(t.get((ty, version))?.map(|v| v.value().to_vec()))
    }

    /// An actor's record.
    pub fn actor(&self, key: &ActorKey) -> Result<Option<ActorRecord>, StorageError> {
        let t = self.txn.open_table(ACTORS)?;
        match t.get((key.ty(), key.id()))? {
            Some(v) => Ok(Some(decode("actor", v.value())?)),
            None => Ok(None),
        }
    }

    /// The key of actor number `num`.
    pub fn actor_key(&self, num: u64) -> Result<Option<ActorKey>, StorageError> {
        let t = self.txn.open_table(ACTOR_KEYS)?;
        Ok(t.get(num)?.map(|v| {
            let (ty, id) = v.value();
            ActorKey::new_unchecked(ty, id)
        }))
    }

    /// Number of actors on disk.
    pub fn actor_count(&self) -> Result<u64, StorageError> {
        Ok(self.txn.open_table(ACTORS)?.len()?)
    }

    /// Number of actors of one type (walks the type's range).
    pub fn count_actors_of_type(&self, ty: &str) -> Result<u64, StorageError> {
        let t = self.txn.open_table(ACTORS)?;
        let mut n = 0;
        for row in t.range((ty, "")..)? {
            let (k, _) = row?;
            if k.value().0 != ty {
                break;
            }
            n += 1;
        }
        Ok(n)
    }

    /// Actors of `ty` whose id starts with `prefix`, after `cursor`.
    pub fn list_actors(
        &self,
        ty: &str,
        prefix: &str,
        cursor: Option<&str>,
        limit: usize,
    ) -> Result<Page<(String, ActorRecord)>, StorageError> {
        let t = self.txn.open_table(ACTORS)?;
        let start = match cursor {
            Some(c) if c >= prefix => c,
            _ => prefix,
        };
        let mut items = Vec::new();
        let mut next_cursor = None;
        for row in t.range((ty, start)..)? {
            let (k, v) = row?;
            let (kty, id) = k.value();
            if kty != ty || !id.starts_with(prefix) {
                break;
            }
            if Some(id) == cursor {
                continue;
            }
            if items.len() == limit {
                next_cursor = items.last().map(|(id, _): &(String, _)| id.clone());
                break;
            }
            items.push((id.to_owned(), decode("actor", v.value())?));
        }
        Ok(Page { items, next_cursor })
    }

    /// One state value.
    pub fn state(&self, num: u64, key: &str) -> Result<Option<Vec<u8>>, StorageError> {
        let t = self.txn.open_table(STATE)?;
        Ok(t.get((num, key))?.map(|v| v.value().to_vec()))
    }

    /// State entries with `prefix`, after `start_after`, at most `limit`.
    pub fn state_range(
        &self,
        num: u64,
        prefix: &str,
        start_after: Option<&str>,
        limit: usize,
    ) -> Result<StateEntries, StorageError> {
        Ok(self
            .state_page(num, prefix, start_after, limit, usize::MAX)?
            .0)
    }

    /// A page of state entries with `prefix`, after `start_after`: at most
    /// `limit` of them and `max_bytes` of values (always at least one, if
    /// there is one), and whether more follow.
    pub fn state_page(
        &self,
        num: u64,
        prefix: &str,
        start_after: Option<&str>,
        limit: usize,
        max_bytes: usize,
    ) -> Result<(StateEntries, bool), StorageError> {
        let start = match start_after {
            Some(a) if a >= prefix => a,
            _ => prefix,
        };
        self.named_page(STATE, num, start, limit, max_bytes, |key, value| {
            Ok(if !key.starts_with(prefix) {
                Row::End
            } else if Some(key) == start_after {
                Row::Skip
            } else {
                Row::Take(value.to_vec())
            })
        })
    }

    /// Events with seq > `after`, at most `limit`, and no more than
    /// `max_bytes` as stored (always at least one, if there is one).
    pub fn events(
        &self,
        num: u64,
        after: u64,
        limit: usize,
        max_bytes: usize,
    ) -> Result<Vec<(u64, EventRecord)>, StorageError> {
        let t = self.txn.open_table(EVENTS)?;
        let mut out = Vec::new();
        let mut bytes = 0usize;
        for row in t.range((num, after.saturating_add(1))..=(num, u64::MAX))? {
            if out.len() == limit {
                break;
            }
            let (k, v) = row?;
            let v = v.value();
            bytes = bytes.saturating_add(v.len());
            if bytes > max_bytes && !out.is_empty() {
                break;
            }
            out.push((k.value().1, decode("event", v)?));
        }
        Ok(out)
    }

    /// One event.
    pub fn event(&self, num: u64, seq: u64) -> Result<Option<EventRecord>, StorageError> {
        let t = self.txn.open_table(EVENTS)?;
        match t.get((num, seq))? {
            Some(v) => Ok(Some(decode("event", v.value())?)),
            None => Ok(None),
        }
    }

    /// Actors (by number, ascending from `from_num`) whose oldest event was
    /// written before `cutoff_ms`, at most `limit` of them; and where to go
    /// on from (`None`: the scan reached the end).
    pub fn actors_with_events_before(
        &self,
        cutoff_ms: u64,
        from_num: u64,
        limit: usize,
    ) -> Result<(Vec<u64>, Option<u64>), StorageError> {
        let t = self.txn.open_table(EVENTS)?;
        let mut out = Vec::new();
        let mut num = from_num;
        loop {
            // The first row at or after (num, 0) is the oldest event of the
            // next actor that has any: one seek per actor, not per event.
            let Some(row) = t.range((num, 0)..)?.next() else {
                return Ok((out, None));
            };
            let (k, v) = row?;
            let (n, _) = k.value();
            let ev: EventRecord = decode("event", v.value())?;
            if ev.at_ms < cutoff_ms {
                out.push(n);
                if out.len() == limit {
                    return Ok((out, n.checked_add(1)));
                }
            }
            match n.checked_add(1) {
                Some(next) => num = next,
                None => return Ok((out, None)),
            }
        }
    }

    /// An idempotency record.
    pub fn idempotency(&self, num: u64, key: &str) -> Result<Option<IdemRecord>, StorageError> {
        let t = self.txn.open_table(IDEMPOTENCY)?;
        match t.get((num, key))? {
            Some(v) => Ok(Some(decode("idempotency", v.value())?)),
            None => Ok(None),
        }
    }

    /// Inbox rows of one actor with seq > `after`, oldest first.
    pub fn inbox(
        &self,
        num: u64,
        after: u64,
        limit: usize,
    ) -> Result<Vec<(u64, InboxRecord)>, StorageError> {
        let t = self.txn.open_table(INBOX)?;
        let mut out = Vec::new();
        for row in t.range((num, after.saturating_add(1))..=(num, u64::MAX))? {
            if out.len() == limit {
                break;
            }
            let (k, v) = row?;
            out.push((k.value().1, decode("inbox", v.value())?));
        }
        Ok(out)
    }

    /// Pending alarms of one actor, by name.
    pub fn alarms(&self, num: u64) -> Result<Vec<(String, AlarmRecord)>, StorageError> {
        let t = self.txn.open_table(ALARMS)?;
        let mut out = Vec::new();
        for row in t.range((num, "")..)? {
            let (k, v) = row?;
            let (n, name) = k.value();
            if n != num {
                break;
            }
            out.push((name.to_owned(), decode("alarm", v.value())?));
        }
        Ok(out)
    }

    /// A page of one actor's own alarms (not the platform's, such as input
    /// expiries) by name after `after`: at most `limit`, and no more than
    /// `max_bytes` of them as stored (at least one).
    pub fn alarms_page(
        &self,
        num: u64,
        after: &str,
        limit: usize,
        max_bytes: usize,
    ) -> Result<AlarmsPage, StorageError> {
        self.named_page(ALARMS, num, after, limit, max_bytes, |name, value| {
            Ok(if name == after || is_internal_alarm(name) {
                Row::Skip
            } else {
                Row::Take(decode("alarm", value)?)
            })
        })
    }

    /// Number of pending alarms of one actor (the platform's own, such as
    /// input expiries, not counted).
    pub fn alarm_count(&self, num: u64) -> Result<u64, StorageError> {
        let t = self.txn.open_table(ALARMS)?;
        let mut n = 0;
        for row in t.range((num, "")..)? {
            let (k, _) = row?;
            let (n2, name) = k.value();
            if n2 != num {
                break;
            }
            if !is_internal_alarm(name) {
                n += 1;
            }
        }
        Ok(n)
    }

    /// A page of one actor's input requests that `keep`, by id after
    /// `after` (exclusive): at most `limit` of them, and past the first
    /// no more than `max_bytes` of stored records; whether more follow.
    /// Each record is read (answer and all) one at a time, so a listing
    /// holds a page, not every answer the actor keeps.
    pub fn inputs_page(
        &self,
        num: u64,
        after: &str,
        limit: usize,
        max_bytes: usize,
        keep: impl Fn(&InputRecord) -> bool,
    ) -> Result<InputsPage, StorageError> {
        self.named_page(INPUTS, num, after, limit, max_bytes, |id, value| {
            if id == after {
                return Ok(Row::Skip);
            }
            let rec: InputRecord = decode("input", value)?;
            Ok(if keep(&rec) {
                Row::Take(rec)
            } else {
                Row::Skip
            })
        })
    }

    /// A page of one actor's rows of a table keyed by (actor, name), from
    /// `start` in name order: what `row` takes of each, at most `limit` of
    /// them and, past the first, no more than `max_bytes` as stored; and
    /// whether more follow. Each row is read and decoded one at a time, so
    /// a listing holds a page, not the actor's whole table.
    fn named_page<T>(
        &self,
        table: NamedTable,
        num: u64,
        start: &str,
        limit: usize,
        max_bytes: usize,
        mut row: impl FnMut(&str, &[u8]) -> Result<Row<T>, StorageError>,
    ) -> Result<(Vec<(String, T)>, bool), StorageError> {
        let t = self.txn.open_table(table)?;
        let mut out = Vec::new();
        let mut bytes = 0usize;
        for entry in t.range((num, start)..)? {
            let (k, v) = entry?;
            let (n, name) = k.value();
            if n != num {
                break;
            }
            let value = v.value();
            let item = match row(name, value)? {
                Row::Take(item) => item,
                Row::Skip => continue,
                Row::End => break,
            };
            if out.len() == limit || (!out.is_empty() && bytes + value.len() > max_bytes) {
                return Ok((out, true));
            }
            bytes += value.len();
            out.push((name.to_owned(), item));
        }
        Ok((out, false))
    }

    /// One input request.
    pub fn input(&self, num: u64, id: &str) -> Result<Option<InputRecord>, StorageError> {
        let t = self.txn.open_table(INPUTS)?;
        match t.get((num, id))? {
            Some(v) => Ok(Some(decode("input", v.value())?)),
            None => Ok(None),
        }
    }

    /// Ids of one actor's input requests in `[from_ms, to_ms)` of
    /// [`INPUTS_BY_SETTLED`] (0 is pending), ordered by when they settled.
    fn input_ids(
        &self,
        num: u64,
        from_ms: u64,
        to_ms: u64,
    ) -> Result<Vec<(u64, String)>, StorageError> {
        let t = self.txn.open_table(INPUTS_BY_SETTLED)?;
        let mut out = Vec::new();
        for row in t.range((num, from_ms, "")..(num, to_ms, ""))? {
            let (k, _) = row?;
            let (_, at, id) = k.value();
            out.push((at, id.to_owned()));
        }
        Ok(out)
    }

    /// One actor's pending input requests, by id.
    pub fn pending_inputs(&self, num: u64) -> Result<Vec<(String, InputRecord)>, StorageError> {
        let mut out = Vec::new();
        for (_, id) in self.input_ids(num, 0, 1)? {
            if let Some(r) = self.input(num, &id)? {
                out.push((id, r));
            }
        }
        Ok(out)
    }

    /// Number of pending input requests of one actor.
    pub fn pending_input_count(&self, num: u64) -> Result<u64, StorageError> {
        Ok(self.input_ids(num, 0, 1)?.len() as u64)
    }

    /// One actor's settled input requests to prune: those settled before
    /// `before_ms`, and the oldest beyond the newest `keep`.
    pub fn inputs_to_prune(
        &self,
        num: u64,
        before_ms: u64,
        keep: u64,
    ) -> Result<Vec<String>, StorageError> {
        let settled = self.input_ids(num, 1, u64::MAX)?;
        let old = settled.iter().take_while(|(at, _)| *at < before_ms).count();
        let over = settled
            .len()
            .saturating_sub(usize::try_from(keep).unwrap_or(usize::MAX));
        Ok(settled
            .into_iter()
            .take(old.max(over))
            .map(|(_, id)| id)
            .collect())
    }

    /// One alarm.
    pub fn alarm(&self, num: u64, name: &str) -> Result<Option<AlarmRecord>, StorageError> {
        let t = self.txn.open_table(ALARMS)?;
        match t.get((num, name))? {
            Some(v) => Ok(Some(decode("alarm", v.value())?)),
            None => Ok(None),
        }
    }

    /// Alarms due in `[from, to)`, earliest first, at most `limit`.
    pub fn alarms_due(
        &self,
        from_ms: u64,
        to_ms: u64,
        limit: usize,
    ) -> Result<Vec<(u64, u64, String)>, StorageError> {
        let t = self.txn.open_table(ALARM_DUE)?;
        let mut out = Vec::new();
        for row in t.range((from_ms, 0, "")..(to_ms, 0, ""))? {
            if out.len() == limit {
                break;
            }
            let (k, _) = row?;
            let (due, num, name) = k.value();
            out.push((due, num, name.to_owned()));
        }
        Ok(out)
    }

    /// Durable messages and webhooks waiting in every inbox on this node.
    pub fn inbox_rows(&self) -> Result<u64, StorageError> {
        Ok(self.txn.open_table(INBOX)?.len()?)
    }

    /// One file of an actor.
    pub fn file(&self, num: u64, path: &str) -> Result<Option<FileRecord>, StorageError> {
        let t = self.txn.open_table(FILES)?;
        match t.get((num, path))? {
            Some(v) => Ok(Some(decode("file", v.value())?)),
            None => Ok(None),
        }
    }

    /// Files of an actor whose path starts with `prefix`, after
    /// `start_after`, in path order, at most `limit`.
    pub fn files(
        &self,
        num: u64,
        prefix: &str,
        start_after: Option<&str>,
        limit: usize,
    ) -> Result<Vec<(String, FileRecord)>, StorageError> {
        let start = match start_after {
            Some(a) if a >= prefix => a,
            _ => prefix,
        };
        let page = self.named_page(FILES, num, start, limit, usize::MAX, |path, value| {
            Ok(if !path.starts_with(prefix) {
                Row::End
            } else if Some(path) == start_after {
                Row::Skip
            } else {
                Row::Take(decode("file", value)?)
            })
        })?;
        Ok(page.0)
    }

    /// How much an actor keeps in files.
    pub fn file_usage(&self, num: u64) -> Result<FileUsage, StorageError> {
        let t = self.txn.open_table(FILE_USAGE)?;
        match t.get(num)? {
            Some(v) => Ok(decode("file usage", v.value())?),
            None => Ok(FileUsage::default()),
        }
    }

    /// Bytes of files all actors of `ty` keep.
    pub fn type_file_bytes(&self, ty: &str) -> Result<u64, StorageError> {
        let t = self.txn.open_table(TYPE_FILE_USAGE)?;
        Ok(t.get(ty)?.map_or(0, |v| v.value()))
    }

    /// Whether any file refers to blob `sha256`.
    pub fn blob_referenced(&self, sha256: &[u8; 32]) -> Result<bool, StorageError> {
        let t = self.txn.open_table(BLOB_REFS)?;
        Ok(t.get(sha256)?.is_some_and(|v| v.value() > 0))
    }

    /// Every secret record, by name.
    pub fn secrets(&self) -> Result<Vec<(String, SecretRecord)>, StorageError> {
        let t = self.txn.open_table(SECRETS)?;
        let mut out = Vec::new();
        for row in t.iter()? {
            let (k, v) = row?;
            out.push((k.value().to_owned(), decode("secret", v.value())?));
        }
        Ok(out)
    }

    /// One secret record.
    pub fn secret(&self, name: &str) -> Result<Option<SecretRecord>, StorageError> {
        let t = self.txn.open_table(SECRETS)?;
        match t.get(name)? {
            Some(v) => Ok(Some(decode("secret", v.value())?)),
            None => Ok(None),
        }
    }

    /// Model usage of actor `num`.
    pub fn actor_usage(&self, num: u64) -> Result<UsageRecord, StorageError> {
        let t = self.txn.open_table(ACTOR_USAGE)?;
        match t.get(num)? {
            Some(v) => Ok(decode("usage", v.value())?),
            None => Ok(UsageRecord::default()),
        }
    }

    /// Model usage of all actors of `ty`.
    pub fn type_usage(&self, ty: &str) -> Result<UsageRecord, StorageError> {
        let t = self.txn.open_table(TYPE_USAGE)?;
        match t.get(ty)? {
            Some(v) => Ok(decode("usage", v.value())?),
            None => Ok(UsageRecord::default()),
        }
    }

    /// Every model provider, by name.
    pub fn providers(&self) -> Result<Vec<(String, ProviderRecord)>, StorageError> {
        let t = self.txn.open_table(PROVIDERS)?;
        let mut out = Vec::new();
        for row in t.iter()? {
            let (k, v) = row?;
            out.push((k.value().to_owned(), decode("provider", v.value())?));
        }
        Ok(out)
    }

    /// Revoked client tokens not yet expired at `now_ms`: (id, expiry ms).
    pub fn revoked_tokens(&self, now_ms: u64) -> Result<Vec<(String, u64)>, StorageError> {
        let t = self.txn.open_table(REVOKED_TOKENS)?;
        let mut out = Vec::new();
        for row in t.iter()? {
            let (k, v) = row?;
            if v.value() > now_ms {
                out.push((k.value().to_owned(), v.value()));
            }
        }
        Ok(out)
    }

    /// One model provider.
    pub fn provider(&self, name: &str) -> Result<Option<ProviderRecord>, StorageError> {
        let t = self.txn.open_table(PROVIDERS)?;
        match t.get(name)? {
            Some(v) => Ok(Some(decode("provider", v.value())?)),
            None => Ok(None),
        }
    }

    /// Number of inbox rows of one actor.
    pub fn inbox_len(&self, num: u64) -> Result<u64, StorageError> {
        Ok(self.inbox_stats(num)?.0)
    }

    /// How many inbox rows actor `num` has, and their bytes.
    pub fn inbox_stats(&self, num: u64) -> Result<(u64, u64), StorageError> {
        let t = self.txn.open_table(INBOX)?;
        let (mut n, mut bytes) = (0, 0);
        for row in t.range((num, 0)..=(num, u64::MAX))? {
            let (_, v) = row?;
            n += 1;
            bytes += v.value().len() as u64;
        }
        Ok((n, bytes))
    }

    /// Actor numbers that have inbox rows, each once, plus the highest seq.
    pub fn inbox_actors(&self) -> Result<(Vec<u64>, u64), StorageError> {
        let t = self.txn.open_table(INBOX)?;
        let mut actors: Vec<u64> = Vec::new();
        let mut max_seq = 0;
        for row in t.iter()? {
            let (k, _) = row?;
            let (num, seq) = k.value();
            if actors.last() != Some(&num) {
                actors.push(num);
            }
            max_seq = max_seq.max(seq);
        }
        Ok((actors, max_seq))
    }
}
