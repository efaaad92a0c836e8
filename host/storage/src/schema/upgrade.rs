//! The storage format's version check and the upgrades from older formats.

use serde::Deserialize;

use super::*;
use crate::LOG_TARGET;

/// Why a database cannot be used.
#[derive(Debug, thiserror::Error)]
pub enum FormatError {
    /// Written by a different version of the format.
    #[error(
        "data directory uses storage format {found}, this marmot reads format {expected}; \
         use a matching marmot release"
    )]
    Mismatch {
        /// Version on disk.
        found: u32,
        /// Version this build understands.
        expected: u32,
    },
    /// redb failed.
    #[error(transparent)]
    Storage(#[from] redb::Error),
}

/// [`DeliveryRecord`] as formats 2 and 3 wrote it (no `traceparent`).
#[derive(Deserialize)]
#[cfg_attr(test, derive(serde::Serialize))]
pub(super) struct DeliveryRecordV3 {
    pub(super) subscription: String,
    pub(super) webhook_id: String,
    pub(super) actor_type: String,
    pub(super) actor_id: String,
    pub(super) event_seq: u64,
    pub(super) kind: String,
    pub(super) payload: Vec<u8>,
    pub(super) created_at_ms: u64,
    pub(super) attempts: u32,
    pub(super) next_attempt_ms: u64,
    pub(super) last_error: Option<String>,
    pub(super) status: DeliveryStatus,
}

/// [`RelayRecord`] as format 5 wrote it (no sender).
#[derive(Deserialize)]
#[cfg_attr(test, derive(serde::Serialize))]
pub(super) struct RelayRecordV5 {
    pub(super) actor_type: String,
    pub(super) actor_id: String,
    pub(super) message: InboxRecord,
}

/// [`IdemRecord`] as formats 1 to 6 wrote it (no request fingerprint).
#[derive(Deserialize)]
#[cfg_attr(test, derive(serde::Serialize))]
pub(super) struct IdemRecordV6 {
    pub(super) outcome: IdemOutcome,
    pub(super) expires_at_ms: u64,
}

/// [`InboxRecord`] as format 1 wrote it.
#[derive(Deserialize)]
#[cfg_attr(test, derive(serde::Serialize))]
pub(super) struct InboxRecordV1 {
    pub(super) message_id: String,
    pub(super) body: Vec<u8>,
    pub(super) content_type: Option<String>,
    pub(super) idempotency_key: Option<String>,
    pub(super) attempts: u32,
    pub(super) enqueued_at_ms: u64,
}

/// Create every table and stamp the format version on a new database, or
/// check the stamp on an existing one.
pub fn check_format(db: &redb::Database) -> Result<(), FormatError> {
    let (found, tables_complete) = {
        let read = db.begin_read().map_err(redb::Error::from)?;
        let found = match read.open_table(META) {
            Ok(meta) => meta
                .get("format_version")
                .map_err(redb::Error::from)?
                .map(|v| u32::from_le_bytes(v.value().try_into().unwrap_or([0; 4]))),
            Err(_) => None,
        };
        // Tables added within a format version are created on open.
        let complete = read.open_table(ALARM_DUE).is_ok()
            && read.open_table(FILES).is_ok()
            && read.open_table(INPUTS).is_ok()
            && read.open_table(OUTBOX_DUE).is_ok()
            && read.open_table(SECRETS).is_ok()
            && read.open_table(PROVIDERS).is_ok()
            && read.open_table(ACTOR_USAGE).is_ok()
            && read.open_table(TYPE_USAGE).is_ok()
            && read.open_table(REVOKED_TOKENS).is_ok()
            && read.open_table(RELAY).is_ok()
            && read.open_table(REPLICA_LSN).is_ok()
            && read.open_table(OUTBOX_IDS).is_ok()
            && read.open_table(RELAY_IDS).is_ok()
            && read.open_table(INPUTS_BY_SETTLED).is_ok()
            && read.open_table(OUTBOX_HEADS).is_ok();
        (found, complete)
    };
    match found {
        Some(v @ 1..=8) => return upgrade(db, v),
        Some(v) if v != FORMAT_VERSION => {
            return Err(FormatError::Mismatch {
                found: v,
                expected: FORMAT_VERSION,
            });
        }
        Some(_) if tables_complete => return Ok(()),
        _ => {}
    }
    let write = db.begin_write().map_err(redb::Error::from)?;
    {
        let mut meta = write.open_table(META).map_err(redb::Error::from)?;
        meta.insert("format_version", FORMAT_VERSION.to_le_bytes().as_slice())
            .map_err(redb::Error::from)?;
        write.open_table(TYPES).map_err(redb::Error::from)?;
        write.open_table(CODE).map_err(redb::Error::from)?;
        write.open_table(ACTORS).map_err(redb::Error::from)?;
        write.open_table(ACTOR_KEYS).map_err(redb::Error::from)?;
        write.open_table(STATE).map_err(redb::Error::from)?;
        write.open_table(EVENTS).map_err(redb::Error::from)?;
        write.open_table(IDEMPOTENCY).map_err(redb::Error::from)?;
        write.open_table(IDEM_EXPIRY).map_err(redb::Error::from)?;
        write.open_table(INBOX).map_err(redb::Error::from)?;
        write.open_table(ALARMS).map_err(redb::Error::from)?;
        write.open_table(ALARM_DUE).map_err(redb::Error::from)?;
        write.open_table(INPUTS).map_err(redb::Error::from)?;
        write.open_table(SUBSCRIPTIONS).map_err(redb::Error::from)?;
        write.open_table(OUTBOX).map_err(redb::Error::from)?;
        write.open_table(OUTBOX_DUE).map_err(redb::Error::from)?;
        write.open_table(SECRETS).map_err(redb::Error::from)?;
        write.open_table(PROVIDERS).map_err(redb::Error::from)?;
        write
            .open_table(REVOKED_TOKENS)
            .map_err(redb::Error::from)?;
        write.open_table(ACTOR_USAGE).map_err(redb::Error::from)?;
        write.open_table(TYPE_USAGE).map_err(redb::Error::from)?;
        write.open_table(FILES).map_err(redb::Error::from)?;
        write.open_table(FILE_USAGE).map_err(redb::Error::from)?;
        write
            .open_table(TYPE_FILE_USAGE)
            .map_err(redb::Error::from)?;
        write.open_table(BLOB_REFS).map_err(redb::Error::from)?;
        write.open_table(RELAY).map_err(redb::Error::from)?;
        write.open_table(REPLICA_LSN).map_err(redb::Error::from)?;
        write.open_table(OUTBOX_IDS).map_err(redb::Error::from)?;
        write.open_table(RELAY_IDS).map_err(redb::Error::from)?;
        write
            .open_table(INPUTS_BY_SETTLED)
            .map_err(redb::Error::from)?;
        write.open_table(OUTBOX_HEADS).map_err(redb::Error::from)?;
    }
    write.commit().map_err(redb::Error::from)?;
    Ok(())
}

/// Upgrade a file of format `from` (1–7) step by step: 1 → 2 inbox rows
/// gain their kind; 2 → 3 only adds tables (created on open); 3 → 4 outbox
/// rows gain their `traceparent`; 4 → 5 only adds `relay` and `replica_lsn`;
/// 5 → 6 relay rows gain their (unknown) sender, and both tables their ids;
/// 6 → 7 idempotency records gain their (unknown) request fingerprint;
/// 7 → 8 input requests are indexed by status; 8 → 9 outbox rows' heads
/// are kept apart.
fn upgrade(db: &redb::Database, from: u32) -> Result<(), FormatError> {
    if from == 1 {
        migrate_inbox_from_v1(db)?;
    }
    if from <= 3 {
        migrate_outbox_from_v3(db)?;
    }
    if from <= 5 {
        migrate_relay_from_v5(db)?;
        index_ids(db)?;
    }
    if from <= 6 {
        migrate_idempotency_from_v6(db)?;
    }
    if from <= 7 {
        index_inputs(db)?;
    }
    index_delivery_heads(db)?;
    stamp_and_check(db)
}

/// Format 8 → 9: keep every outbox row's head apart from its payload.
fn index_delivery_heads(db: &redb::Database) -> Result<(), FormatError> {
    let write = db.begin_write().map_err(redb::Error::from)?;
    let n = {
        let outbox = write.open_table(OUTBOX).map_err(redb::Error::from)?;
        let mut heads = write.open_table(OUTBOX_HEADS).map_err(redb::Error::from)?;
        let mut n = 0u64;
        for row in outbox.iter().map_err(redb::Error::from)? {
            let (k, v) = row.map_err(redb::Error::from)?;
            let head: DeliveryHead = decode("delivery", v.value())
                .map_err(|e| redb::Error::Corrupted(format!("an outbox row: {e}")))?;
            heads
                .insert(k.value(), encode(&head).as_slice())
                .map_err(redb::Error::from)?;
            n += 1;
        }
        n
    };
    write.commit().map_err(redb::Error::from)?;
    tracing::info!(target: LOG_TARGET, outbox_rows = n, "outbox heads kept apart for format 9");
    Ok(())
}

/// Format 7 → 8: index every input request by status.
fn index_inputs(db: &redb::Database) -> Result<(), FormatError> {
    let write = db.begin_write().map_err(redb::Error::from)?;
    let n = {
        let inputs = write.open_table(INPUTS).map_err(redb::Error::from)?;
        let mut index = write
            .open_table(INPUTS_BY_SETTLED)
            .map_err(redb::Error::from)?;
        let mut n = 0u64;
        for row in inputs.iter().map_err(redb::Error::from)? {
            let (k, v) = row.map_err(redb::Error::from)?;
            let (num, id) = k.value();
            let rec: InputRecord = decode("input", v.value())
                .map_err(|e| redb::Error::Corrupted(format!("an input row: {e}")))?;
            index
                .insert((num, rec.status.index_ms(), id), ())
                .map_err(redb::Error::from)?;
            n += 1;
        }
        n
    };
    write.commit().map_err(redb::Error::from)?;
    tracing::info!(target: LOG_TARGET, input_rows = n, "input requests indexed for format 8");
    Ok(())
}

/// Format 5 → 6: relay rows gain `from` (unknown for old rows: the node
/// that has them hands them over, as format 5 did).
fn migrate_relay_from_v5(db: &redb::Database) -> Result<(), FormatError> {
    let n = upgrade_rows(db, RELAY, |bytes| {
        let old: RelayRecordV5 = postcard::from_bytes(bytes)?;
        Ok(encode(&RelayRecord {
            actor_type: old.actor_type,
            actor_id: old.actor_id,
            message: old.message,
            from: None,
        }))
    })?;
    tracing::info!(target: LOG_TARGET, relay_rows = n, "relay rows upgraded to format 6");
    Ok(())
}

/// Format 6 → 7: idempotency records gain `request_sha256` (unknown for
/// old records: a repeat of their key is answered as format 6 did).
fn migrate_idempotency_from_v6(db: &redb::Database) -> Result<(), FormatError> {
    let write = db.begin_write().map_err(redb::Error::from)?;
    let n = {
        let mut t = write.open_table(IDEMPOTENCY).map_err(redb::Error::from)?;
        let mut rows = Vec::new();
        for row in t.iter().map_err(redb::Error::from)? {
            let (k, v) = row.map_err(redb::Error::from)?;
            let (num, key) = k.value();
            let old: IdemRecordV6 = postcard::from_bytes(v.value()).map_err(|e| {
                redb::Error::Corrupted(format!("an idempotency row does not decode: {e}"))
            })?;
            let new = IdemRecord {
                outcome: old.outcome,
                expires_at_ms: old.expires_at_ms,
                request_sha256: None,
            };
            rows.push((num, key.to_owned(), encode(&new)));
        }
        for (num, key, v) in &rows {
            t.insert((*num, key.as_str()), v.as_slice())
                .map_err(redb::Error::from)?;
        }
        rows.len()
    };
    write.commit().map_err(redb::Error::from)?;
    tracing::info!(target: LOG_TARGET, idempotency_rows = n, "idempotency records upgraded to format 7");
    Ok(())
}

/// Format 5 → 6: index outbox rows by `webhook-id` and relay rows by
/// message id.
fn index_ids(db: &redb::Database) -> Result<(), FormatError> {
    let write = db.begin_write().map_err(redb::Error::from)?;
    {
        let corrupt =
            |what: &str, e: DecodeError| redb::Error::Corrupted(format!("a {what} row: {e}"));
        let outbox = write.open_table(OUTBOX).map_err(redb::Error::from)?;
        let mut ids = write.open_table(OUTBOX_IDS).map_err(redb::Error::from)?;
        for row in outbox.iter().map_err(redb::Error::from)? {
            let (k, v) = row.map_err(redb::Error::from)?;
            let rec: DeliveryRecord =
                decode("delivery", v.value()).map_err(|e| corrupt("outbox", e))?;
            ids.insert(rec.webhook_id.as_str(), k.value())
                .map_err(redb::Error::from)?;
        }
        let relay = write.open_table(RELAY).map_err(redb::Error::from)?;
        let mut ids = write.open_table(RELAY_IDS).map_err(redb::Error::from)?;
        for row in relay.iter().map_err(redb::Error::from)? {
            let (k, v) = row.map_err(redb::Error::from)?;
            let rec: RelayRecord = decode("relay", v.value()).map_err(|e| corrupt("relay", e))?;
            ids.insert(rec.message.message_id.as_str(), k.value())
                .map_err(redb::Error::from)?;
        }
    }
    write.commit().map_err(redb::Error::from)?;
    Ok(())
}

/// Format 3 → 4: outbox rows gain `traceparent` (none for old rows).
fn migrate_outbox_from_v3(db: &redb::Database) -> Result<(), FormatError> {
    let n = upgrade_rows(db, OUTBOX, |bytes| {
        let old: DeliveryRecordV3 = postcard::from_bytes(bytes)?;
        Ok(encode(&DeliveryRecord {
            subscription: old.subscription,
            webhook_id: old.webhook_id,
            actor_type: old.actor_type,
            actor_id: old.actor_id,
            event_seq: old.event_seq,
            kind: old.kind,
            payload: old.payload,
            created_at_ms: old.created_at_ms,
            attempts: old.attempts,
            next_attempt_ms: old.next_attempt_ms,
            last_error: old.last_error,
            status: old.status,
            traceparent: None,
        }))
    })?;
    tracing::info!(target: LOG_TARGET, outbox_rows = n, "outbox rows upgraded to format 4");
    Ok(())
}

/// Format 1 → 2: inbox rows gain their kind (all of them were messages).
fn migrate_inbox_from_v1(db: &redb::Database) -> Result<(), FormatError> {
    let n = upgrade_rows(db, INBOX, |bytes| {
        let old: InboxRecordV1 = postcard::from_bytes(bytes)?;
        Ok(encode(&InboxRecord {
            message_id: old.message_id,
            body: old.body,
            content_type: old.content_type,
            idempotency_key: old.idempotency_key,
            attempts: old.attempts,
            enqueued_at_ms: old.enqueued_at_ms,
            kind: InboxKind::Message,
        }))
    })?;
    tracing::info!(target: LOG_TARGET, inbox_rows = n, "storage migrated from format 1 to 2");
    Ok(())
}

/// Rewrite every row of `table` (keys that are plain values, like seqs)
/// with `upgrade` of its old encoding, in one transaction; a row that does
/// not decode fails the whole upgrade. Returns the rows rewritten.
fn upgrade_rows<K>(
    db: &redb::Database,
    table: TableDefinition<'_, K, &[u8]>,
    upgrade: impl Fn(&[u8]) -> Result<Vec<u8>, postcard::Error>,
) -> Result<usize, FormatError>
where
    K: redb::Key + 'static + for<'a> redb::Value<SelfType<'a> = K> + Copy,
{
    let write = db.begin_write().map_err(redb::Error::from)?;
    let n = {
        let mut t = write.open_table(table).map_err(redb::Error::from)?;
        let mut rows = Vec::new();
        for row in t.iter().map_err(redb::Error::from)? {
            let (k, v) = row.map_err(redb::Error::from)?;
            let new = upgrade(v.value()).map_err(|e| {
                redb::Error::Corrupted(format!("a {} row does not decode: {e}", table.name()))
            })?;
            rows.push((k.value(), new));
        }
        for (k, v) in &rows {
            t.insert(*k, v.as_slice()).map_err(redb::Error::from)?;
        }
        rows.len()
    };
    write.commit().map_err(redb::Error::from)?;
    Ok(n)
}

/// Stamp the current format version, then create the tables added since.
fn stamp_and_check(db: &redb::Database) -> Result<(), FormatError> {
    let write = db.begin_write().map_err(redb::Error::from)?;
    {
        let mut meta = write.open_table(META).map_err(redb::Error::from)?;
        meta.insert("format_version", FORMAT_VERSION.to_le_bytes().as_slice())
            .map_err(redb::Error::from)?;
    }
    write.commit().map_err(redb::Error::from)?;
    tracing::info!(target: LOG_TARGET, version = FORMAT_VERSION, "storage format upgraded");
    check_format(db)
}
