//! Bulk loading for benchmarks: write many actors straight into a closed
//! database, far faster than running a turn per actor.

use std::path::Path;

use marmot_core::clock::now_ms;
use redb::{ReadableDatabase, ReadableTable};

use super::StorageError;
use super::schema::*;

/// Add `n` counter actors `b0 … b{n-1}` of type `ty` (each with `n` = 1 in
/// its state) to the database in `dir`, calling `progress(done, n)` after
/// each chunk. The node must not be running.
pub fn populate_counters(
    dir: &Path,
    ty: &str,
    n: usize,
    mut progress: impl FnMut(usize, usize),
) -> Result<(), StorageError> {
    let config = super::StorageConfig::default();
    let db = super::open_database(
        &dir.join("marmot.redb"),
        config.cache_bytes,
        config.journal_bytes,
        &super::journal::JournalMetrics::new(),
    )?;
    check_format(&db)?;
    let version = {
        let r = db.begin_read()?;
        let types = r.open_table(TYPES)?;
        let rec = types
            .get(ty)?
            .map(|v| super::decode_type(v.value()))
            .transpose()?
            .ok_or_else(|| {
                StorageError::Db(redb::Error::Corrupted(format!(
                    "type `{ty}` is not deployed"
                )))
            })?;
        rec.latest().version
    };
    let mut next = {
        let r = db.begin_read()?;
        r.open_table(ACTOR_KEYS)?
            .last()?
            .map_or(1, |(k, _)| k.value() + 1)
    };
    let now = now_ms();
    const CHUNK: usize = 100_000;
    for start in (0..n).step_by(CHUNK) {
        let txn = db.begin_write()?;
        {
            let mut actors = txn.open_table(ACTORS)?;
            let mut keys = txn.open_table(ACTOR_KEYS)?;
            let mut state = txn.open_table(STATE)?;
            for i in start..(start + CHUNK).min(n) {
                let id = format!("b{i}");
                let mut rec = ActorRecord::new(next, now, version);
                rec.turns = 1;
                rec.last_turn_at_ms = now;
                rec.state_bytes = 2;
                rec.state_keys = 1;
                actors.insert((ty, id.as_str()), encode(&rec).as_slice())?;
                keys.insert(next, (ty, id.as_str()))?;
                state.insert((next, "n"), b"1".as_slice())?;
                next += 1;
            }
        }
        txn.commit()?;
        progress((start + CHUNK).min(n), n);
    }
    Ok(())
}
