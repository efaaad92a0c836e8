//! Reads of committed data, served whether the actor is awake or not:
//! actor info and listings, state, input requests, alarms, events.

use serde::Serialize;

use super::Node;
use crate::catalog::{RateLimited, TypeEntry};
use crate::clock::now_ms;
use crate::ids::ActorKey;
use crate::storage::schema::{ActorRecord, EventRecord, FileRecord, InputRecord, UsageRecord};
use crate::storage::{Page, Reader, StateEntries, StorageError};

/// What `GET /v1/actors/{type}/{id}` shows.
#[derive(Debug, Clone, Serialize)]
pub struct ActorInfo {
    /// Type.
    #[serde(rename = "type")]
    pub ty: String,
    /// Id.
    pub id: String,
    /// `active` or `hibernated`.
    pub status: &'static str,
    /// Version its state belongs to.
    pub version: u32,
    /// Creation time (ms since epoch).
    pub created_at_ms: u64,
    /// Last committed turn (ms since epoch; 0: never).
    pub last_turn_at_ms: u64,
    /// Turns committed.
    pub turns: u64,
    /// State size in bytes.
    pub state_bytes: u64,
    /// State keys.
    pub state_keys: u64,
    /// Newest event seq.
    pub last_event_seq: u64,
    /// Oldest event seq still kept (0: no events yet; `last_event_seq + 1`:
    /// all removed by retention).
    pub first_event_seq: u64,
    /// Durable messages waiting.
    pub pending_messages: u64,
    /// Pending alarms.
    pub pending_alarms: u64,
    /// Pending input requests.
    pub pending_inputs: u64,
    /// Model calls committed and what they used.
    pub usage: ModelUsage,
}

/// Model usage as the API shows it.
#[derive(Debug, Clone, Copy, Default, Serialize)]
pub struct ModelUsage {
    /// Calls answered.
    pub calls: u64,
    /// Prompt tokens.
    pub input_tokens: u64,
    /// Generated tokens.
    pub output_tokens: u64,
    /// US dollars, for calls whose prices are configured.
    pub cost_usd: f64,
}

impl From<UsageRecord> for ModelUsage {
    fn from(u: UsageRecord) -> Self {
        Self {
            calls: u.calls,
            input_tokens: u.input_tokens,
            output_tokens: u.output_tokens,
            cost_usd: u.cost_nano_usd as f64 / 1e9,
        }
    }
}

impl Node {
    /// Whether `key` exists: active here, or committed.
    pub fn actor_exists(&self, key: &ActorKey) -> Result<bool, StorageError> {
        Ok(self.registry().live_stats(key).is_some()
            || self.storage.reader()?.actor(key)?.is_some())
    }

    /// Count a message to `key` against its type's (`entry`'s) rate limit,
    /// unless it repeats idempotency key `idem`: a repeat runs nothing. The
    /// API's messages and inbound webhooks both come through here.
    pub fn admit(
        &self,
        entry: &TypeEntry,
        key: &ActorKey,
        idem: Option<&str>,
    ) -> Result<(), AdmitError> {
        if !entry.is_rate_limited() {
            return Ok(());
        }
        if let Some(k) = idem
            && self.is_repeat(key, k)?
        {
            return Ok(());
        }
        Ok(entry.admit()?)
    }

    /// Whether a message to `key` with idempotency key `idem` was already
    /// taken (its outcome is kept). Committed records only; a repeat of one
    /// still in flight is counted.
    fn is_repeat(&self, key: &ActorKey, idem: &str) -> Result<bool, StorageError> {
        let r = self.storage.reader()?;
        let Some(rec) = r.actor(key)? else {
            return Ok(false);
        };
        Ok(r.idempotency(rec.num, idem)?
            .is_some_and(|i| i.expires_at_ms > crate::clock::now_ms()))
    }

    /// What is known about an actor (its committed state).
    pub fn actor_info(&self, key: &ActorKey) -> Result<Option<ActorInfo>, StorageError> {
        let r = self.storage.reader()?;
        let Some(rec) = r.actor(key)? else {
            return Ok(None);
        };
        Ok(Some(self.info_from(key, &rec, &r)?))
    }

    fn info_from(
        &self,
        key: &ActorKey,
        rec: &ActorRecord,
        r: &Reader,
    ) -> Result<ActorInfo, StorageError> {
        let live = self.registry().live_stats(key);
        let (turns, last_turn_at_ms) = match live {
            Some(Some((t, at))) if t >= rec.turns => (t, at),
            _ => (rec.turns, rec.last_turn_at_ms),
        };
        Ok(ActorInfo {
            ty: key.ty().to_owned(),
            id: key.id().to_owned(),
            status: if live.is_some() {
                "active"
            } else {
                "hibernated"
            },
            version: rec.version,
            created_at_ms: rec.created_at_ms,
            last_turn_at_ms,
            turns,
            state_bytes: rec.state_bytes,
            state_keys: rec.state_keys,
            last_event_seq: rec.last_event_seq,
            first_event_seq: rec.first_event_seq,
            pending_messages: r.inbox_len(rec.num)?,
            pending_alarms: r.alarm_count(rec.num)?,
            pending_inputs: r.pending_input_count(rec.num)?,
            usage: r.actor_usage(rec.num)?.into(),
        })
    }

    /// Model usage of all actors of `ty` (committed).
    pub fn type_usage(&self, ty: &str) -> Result<ModelUsage, StorageError> {
        Ok(self.storage.reader()?.type_usage(ty)?.into())
    }

    /// Actors of a type. In a cluster: those this node answers for (its
    /// page may then hold fewer than `limit`; the cursor is where its scan
    /// stopped).
    pub fn list_actors(
        &self,
        ty: &str,
        prefix: &str,
        cursor: Option<&str>,
        limit: usize,
    ) -> Result<Page<ActorInfo>, StorageError> {
        let r = self.storage.reader()?;
        let page = r.list_actors(ty, prefix, cursor, limit)?;
        let mut items = Vec::with_capacity(page.items.len());
        for (id, rec) in page.items {
            let key = ActorKey::new_unchecked(ty, &id);
            if self.cluster.as_ref().is_some_and(|c| !c.lists(&key)) {
                continue;
            }
            items.push(self.info_from(&key, &rec, &r)?);
        }
        Ok(Page {
            items,
            next_cursor: page.next_cursor,
        })
    }

    /// Committed state: a page of keys with `prefix` (at most `limit` and
    /// `max_bytes` of values, at least one), and whether more follow.
    pub fn read_state(
        &self,
        key: &ActorKey,
        prefix: &str,
        after: Option<&str>,
        limit: usize,
        max_bytes: usize,
    ) -> Result<Option<(StateEntries, bool)>, StorageError> {
        let r = self.storage.reader()?;
        let Some(rec) = r.actor(key)? else {
            return Ok(None);
        };
        Ok(Some(
            r.state_page(rec.num, prefix, after, limit, max_bytes)?,
        ))
    }

    /// One committed state value.
    pub fn read_state_key(
        &self,
        key: &ActorKey,
        state_key: &str,
    ) -> Result<Option<Option<Vec<u8>>>, StorageError> {
        let r = self.storage.reader()?;
        let Some(rec) = r.actor(key)? else {
            return Ok(None);
        };
        Ok(Some(r.state(rec.num, state_key)?))
    }

    /// An actor's pending input requests (committed), by id.
    pub fn pending_inputs(
        &self,
        key: &ActorKey,
    ) -> Result<Option<Vec<(String, InputRecord)>>, StorageError> {
        let r = self.storage.reader()?;
        let Some(rec) = r.actor(key)? else {
            return Ok(None);
        };
        Ok(Some(r.pending_inputs(rec.num)?))
    }

    /// A page of an actor's committed input requests that `keep`, by id
    /// after `after` (see [`crate::storage::Reader::inputs_page`]).
    pub fn inputs_page(
        &self,
        key: &ActorKey,
        after: &str,
        limit: usize,
        max_bytes: usize,
        keep: impl Fn(&InputRecord) -> bool,
    ) -> Result<Option<crate::storage::InputsPage>, StorageError> {
        let r = self.storage.reader()?;
        let Some(rec) = r.actor(key)? else {
            return Ok(None);
        };
        Ok(Some(r.inputs_page(rec.num, after, limit, max_bytes, keep)?))
    }

    /// A page of an actor's committed alarms, by name after `after` (see
    /// [`crate::storage::Reader::alarms_page`]).
    pub fn alarms_page(
        &self,
        key: &ActorKey,
        after: &str,
        limit: usize,
        max_bytes: usize,
    ) -> Result<Option<crate::storage::AlarmsPage>, StorageError> {
        let r = self.storage.reader()?;
        let Some(rec) = r.actor(key)? else {
            return Ok(None);
        };
        Ok(Some(r.alarms_page(rec.num, after, limit, max_bytes)?))
    }

    /// Committed events after `after`: at most `limit`, and no more than
    /// `max_bytes` of them as stored (at least one: a page of a log with
    /// events past `after` is never empty).
    pub fn events(
        &self,
        key: &ActorKey,
        after: u64,
        limit: usize,
        max_bytes: usize,
    ) -> Result<Option<Vec<(u64, EventRecord)>>, StorageError> {
        let r = self.storage.reader()?;
        let Some(rec) = r.actor(key)? else {
            return Ok(None);
        };
        // Events past retention are hidden at once, even before the sweep
        // deletes them; they are the oldest, so skip them page by page.
        let cutoff = self.config.events.cutoff_ms(now_ms());
        let mut after = after;
        loop {
            let mut page = r.events(rec.num, after, limit, max_bytes)?;
            let Some(last) = page.last().map(|(seq, _)| *seq) else {
                return Ok(Some(page));
            };
            page.retain(|(_, e)| e.at_ms >= cutoff);
            if !page.is_empty() {
                return Ok(Some(page));
            }
            after = last;
        }
    }

    /// An actor's files under `prefix`, after `after`, at most `limit`
    /// (committed; served whether the actor is awake or not).
    pub fn files(
        &self,
        key: &ActorKey,
        prefix: &str,
        after: Option<&str>,
        limit: usize,
    ) -> Result<Option<Vec<(String, FileRecord)>>, StorageError> {
        let r = self.storage.reader()?;
        let Some(rec) = r.actor(key)? else {
            return Ok(None);
        };
        Ok(Some(r.files(rec.num, prefix, after, limit)?))
    }

    /// One committed file of an actor (`None`: no such actor).
    pub fn file(
        &self,
        key: &ActorKey,
        path: &str,
    ) -> Result<Option<Option<FileRecord>>, StorageError> {
        let r = self.storage.reader()?;
        let Some(rec) = r.actor(key)? else {
            return Ok(None);
        };
        Ok(Some(r.file(rec.num, path)?))
    }

    /// Where the bytes of a blob-stored file are.
    pub fn blob_path(&self, sha256: &[u8; 32]) -> std::path::PathBuf {
        self.storage.blobs().path(sha256)
    }
}

impl Node {
    /// Write a consistent backup of everything committed into `dest` (a
    /// new directory on this machine) while serving.
    pub async fn backup(
        &self,
        dest: std::path::PathBuf,
    ) -> Result<crate::storage::backup::BackupReport, crate::storage::StorageError> {
        let storage = self.storage.clone();
        let extra: Vec<_> =
            crate::secrets::key_file_for_backup(&self.config.secrets, &self.config.data_dir)
                .into_iter()
                .collect();
        let report = tokio::task::spawn_blocking(move || storage.backup(&dest, &extra))
            .await
            .map_err(|e| crate::storage::StorageError::Io {
                what: "backup".into(),
                source: std::io::Error::other(e.to_string()),
            })??;
        tracing::info!(path = %report.path.display(), rows = report.rows, blobs = report.blobs,
            elapsed_ms = report.elapsed_ms, "backup written");
        Ok(report)
    }
}

/// Why a message was not admitted (see [`Node::admit`]).
#[derive(Debug, thiserror::Error)]
pub enum AdmitError {
    /// Past the type's rate limit.
    #[error(transparent)]
    RateLimited(#[from] RateLimited),
    /// Whether it repeats a taken key could not be read.
    #[error(transparent)]
    Storage(#[from] StorageError),
}
