//! The journal on its own: what it writes, what opening replays, and what
//! it refuses to replay. Crash behaviour with the whole node is in
//! `tests/crash.rs` and `marmot bench torture`.

use super::*;
use redb::{ReadableDatabase, TableDefinition};
use std::sync::{Arc, Mutex};

const T: TableDefinition<'static, u64, &[u8]> = TableDefinition::new("t");

fn db(path: &Path, size: u64) -> redb::Database {
    db_counted(path, size, &JournalMetrics::new())
}

/// [`db`], counting into `metrics`.
fn db_counted(path: &Path, size: u64, metrics: &JournalMetrics) -> redb::Database {
    let backend = open(path, size, metrics.clone()).unwrap();
    redb::Builder::new().create_with_backend(backend).unwrap()
}

fn put(db: &redb::Database, k: u64, v: &[u8]) {
    let w = db.begin_write().unwrap();
    w.open_table(T).unwrap().insert(k, v).unwrap();
    w.commit().unwrap();
}

fn get(db: &redb::Database, k: u64) -> Option<Vec<u8>> {
    let r = db.begin_read().unwrap();
    let t = r.open_table(T).unwrap();
    t.get(k).unwrap().map(|v| v.value().to_vec())
}

/// The bytes of `path` as the disk would hold them if nothing written since
/// `snapshot` had reached it: what a power loss leaves of a file nobody
/// synced.
fn lose_unsynced(path: &Path, snapshot: &[u8]) {
    std::fs::write(path, snapshot).unwrap();
}

#[test]
fn a_record_round_trips_through_scan_and_ops() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("m.redb");
    let backend = open(&path, 64 * BLOCK, JournalMetrics::new()).unwrap();
    backend.set_len(3 * BLOCK).unwrap();
    backend.write(BLOCK, &[7; 100]).unwrap();
    backend.write(2 * BLOCK + 5, b"hello").unwrap();
    backend.sync_data().unwrap();
    backend.write(0, b"second").unwrap();
    backend.sync_data().unwrap();
    drop(backend); // as a crash would: close() empties the journal

    let identity = identity_of(&File::open(&path).unwrap()).unwrap();
    let bytes = std::fs::read(&log_paths(&path)[0]).unwrap();
    let (_, records) = scan(&bytes[..], identity).unwrap().expect("a valid log");
    assert_eq!(records.len(), 2);
    assert_eq!(
        ops(&records[0]).unwrap(),
        vec![
            Op::SetLen(3 * BLOCK),
            Op::Write(BLOCK, &[7; 100]),
            Op::Write(2 * BLOCK + 5, b"hello"),
        ]
    );
    assert_eq!(ops(&records[1]).unwrap(), vec![Op::Write(0, b"second")]);
    // Another file's logs are not this file's.
    assert!(
        scan(&bytes[..], (identity.0, identity.1, identity.2 + 1))
            .unwrap()
            .is_none()
    );
}

#[test]
fn commits_survive_losing_every_unsynced_write_to_the_database_file() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("m.redb");
    // Logs large enough for every commit below: a checkpoint would sync
    // the file, which `lose_unsynced` cannot tell.
    let size = 4096 * BLOCK;
    {
        let db = db(&path, size);
        put(&db, 0, b"before");
    }
    // The database file as synced at that point (opening replays and syncs).
    let synced = std::fs::read(&path).unwrap();
    let metrics = JournalMetrics::new();
    let crash_logs;
    {
        let db = db_counted(&path, size, &metrics);
        for k in 1..=200u64 {
            put(&db, k, &vec![k as u8; 3000]);
        }
        // The power goes now (a clean close would sync the file).
        crash_logs = log_paths(&path).map(|p| std::fs::read(p).unwrap());
    }
    assert_eq!(metrics.checkpoints.get(), 0);
    lose_unsynced(&path, &synced);
    for (p, bytes) in log_paths(&path).iter().zip(&crash_logs) {
        std::fs::write(p, bytes).unwrap();
    }
    let db = db(&path, size);
    assert_eq!(get(&db, 0).as_deref(), Some(&b"before"[..]));
    for k in 1..=200u64 {
        assert_eq!(get(&db, k), Some(vec![k as u8; 3000]), "key {k}");
    }
}

#[test]
fn a_torn_last_record_is_not_replayed_and_the_one_before_is() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("m.redb");
    let size = 64 * BLOCK;
    {
        let db = db(&path, size);
        put(&db, 1, b"one");
    }
    let synced = std::fs::read(&path).unwrap();
    let log = log_paths(&path)[0].clone();
    let (before_two, after_two);
    {
        let db = db(&path, size);
        put(&db, 2, b"two");
        before_two = std::fs::read(&log).unwrap();
        put(&db, 3, b"three");
        after_two = std::fs::read(&log).unwrap();
    }
    // The third commit's record reached the log only in part.
    let first_diff = before_two
        .iter()
        .zip(&after_two)
        .position(|(a, b)| a != b)
        .expect("the last commit wrote a record");
    let mut torn = after_two.clone();
    let cut = first_diff + 100;
    torn[cut..].copy_from_slice(&before_two[cut..]);
    std::fs::write(&log, &torn).unwrap();
    lose_unsynced(&path, &synced);

    let db = db(&path, size);
    assert_eq!(get(&db, 1).as_deref(), Some(&b"one"[..]));
    assert_eq!(get(&db, 2).as_deref(), Some(&b"two"[..]));
    assert_eq!(get(&db, 3), None, "a torn commit is not half there");
}

/// Run `run` on the database at `path`, then leave the files as a
/// `kill -9` right after it would: the database file and the logs as they
/// were when `run` returned (a clean close would sync the file and empty
/// the logs).
fn crash_with(path: &Path, size: u64, run: impl FnOnce(&redb::Database)) {
    let (file, logs) = {
        let db = db(path, size);
        run(&db);
        (
            std::fs::read(path).unwrap(),
            log_paths(path).map(|p| std::fs::read(p).unwrap()),
        )
    };
    std::fs::write(path, file).unwrap();
    for (p, bytes) in log_paths(path).iter().zip(&logs) {
        std::fs::write(p, bytes).unwrap();
    }
}

#[test]
fn logs_of_a_database_file_that_was_replaced_are_not_replayed() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("m.redb");
    let size = 64 * BLOCK;
    crash_with(&path, size, |db| {
        for k in 0..30 {
            put(db, k, &[7; 3000]);
        }
    });
    // The file is deleted and another database put where it was (as a
    // restore would, possibly on the same inode); the old logs, full of
    // records, stay behind. The new database starts its logs at the same
    // epochs, so only the records' checksums (which cover the file's
    // identity) tell the old records, beyond its own, from its own.
    std::fs::remove_file(&path).unwrap();
    {
        let other = dir.path().join("other.redb");
        let db = redb::Database::create(&other).unwrap();
        let w = db.begin_write().unwrap();
        w.open_table(T)
            .unwrap()
            .insert(100, &b"new database"[..])
            .unwrap();
        w.commit().unwrap();
        drop(db);
        std::fs::copy(&other, &path).unwrap();
    }
    crash_with(&path, size, |db| put(db, 101, b"after the restore"));
    let db = db(&path, size);
    for k in 0..30 {
        assert_eq!(get(&db, k), None, "key {k} of the old database");
    }
    assert_eq!(get(&db, 100).as_deref(), Some(&b"new database"[..]));
    assert_eq!(get(&db, 101).as_deref(), Some(&b"after the restore"[..]));
}

#[test]
fn a_commit_larger_than_a_log_goes_to_the_database_file_and_empties_the_logs() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("m.redb");
    let size = 16 * BLOCK; // 64 KiB logs
    let metrics = JournalMetrics::new();
    // The power goes right after the large commit (a clean close would
    // sync the file and empty the logs whatever the commit did).
    let (file, logs) = {
        let db = db_counted(&path, size, &metrics);
        put(&db, 1, b"small");
        put(&db, 1, &vec![9; 200_000]);
        (
            std::fs::read(&path).unwrap(),
            log_paths(&path).map(|p| std::fs::read(p).unwrap()),
        )
    };
    assert!(
        metrics.direct.get() >= 1,
        "the large commit skipped the logs"
    );
    // The logs hold no record: the small commit's, replayed over the large
    // one, would put back older pages.
    let identity = identity_of(&File::open(&path).unwrap()).unwrap();
    for bytes in &logs {
        let records = scan(&bytes[..], identity).unwrap().map(|(_, r)| r);
        assert_eq!(records.map(|r| r.len()), Some(0), "a log kept records");
    }
    std::fs::write(&path, file).unwrap();
    for (p, bytes) in log_paths(&path).iter().zip(&logs) {
        std::fs::write(p, bytes).unwrap();
    }
    let db = db(&path, size);
    assert_eq!(get(&db, 1), Some(vec![9; 200_000]));
}

#[test]
fn a_log_is_reused_only_after_the_database_file_was_synced() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("m.redb");
    let size = 32 * BLOCK;
    let metrics = JournalMetrics::new();
    // The database file as of its last sync: all a power loss leaves of it.
    // Each sync is slow, so the writer fills the other log meanwhile and
    // comes back to this one before the file has its records.
    let (synced, hook) = slow_syncs_keeping_the_file(&path);
    let (image, logs) = {
        let backend = open_observed(&path, size, metrics.clone(), Some(hook), true).unwrap();
        let db = redb::Builder::new().create_with_backend(backend).unwrap();
        for k in 0..300u64 {
            put(&db, k, &[k as u8; 2000]);
        }
        // The power goes now (closing would sync the file).
        (
            synced.lock().unwrap().clone(),
            log_paths(&path).map(|p| std::fs::read(p).unwrap()),
        )
    };
    // Each switch after the first needs the other log checkpointed, and
    // some had to wait for it.
    assert!(
        metrics.checkpoints.get() >= 10,
        "{}",
        metrics.checkpoints.get()
    );
    assert!(metrics.waits.get() > 0, "no switch waited");
    // A log reused before the file had its records would have lost them.
    std::fs::write(&path, &image).unwrap();
    for (p, bytes) in log_paths(&path).iter().zip(&logs) {
        std::fs::write(p, bytes).unwrap();
    }
    let db = db(&path, size);
    for k in 0..300u64 {
        assert_eq!(get(&db, k), Some(vec![k as u8; 2000]), "key {k}");
    }
}

#[test]
fn a_damaged_record_body_refuses_the_open_and_changes_nothing() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("m.redb");
    {
        let backend = open(&path, 64 * BLOCK, JournalMetrics::new()).unwrap();
        backend.write(0, b"x").unwrap();
        backend.sync_data().unwrap();
        drop(backend); // as a crash would: close() empties the journal
    }
    // A body whose checksum holds but whose operation is unknown.
    let log = log_paths(&path)[0].clone();
    let mut bytes = std::fs::read(&log).unwrap();
    let at = BLOCK as usize;
    bytes[at + RECORD_HEADER] = 0xee;
    let identity = identity_of(&File::open(&path).unwrap()).unwrap();
    let sum = record_crc(identity, &[&bytes[at + 8..at + RECORD_HEADER + 18]]);
    bytes[at + 4..at + 8].copy_from_slice(&sum.to_le_bytes());
    std::fs::write(&log, &bytes).unwrap();
    let db_before = std::fs::read(&path).unwrap();

    let err = open(&path, 64 * BLOCK, JournalMetrics::new()).unwrap_err();
    assert!(err.to_string().contains("damaged"), "{err}");
    assert_eq!(std::fs::read(&log).unwrap(), bytes, "the log was kept");
    assert_eq!(std::fs::read(&path).unwrap(), db_before);
}

#[test]
fn a_second_handle_on_the_same_journal_is_refused_before_it_replays_anything() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("m.redb");
    let first = db(&path, 64 * BLOCK);
    put(&first, 1, b"one");
    let logs = log_paths(&path).map(|p| std::fs::read(p).unwrap());
    let db_before = std::fs::read(&path).unwrap();
    assert!(matches!(
        open(&path, 64 * BLOCK, JournalMetrics::new()),
        Err(redb::DatabaseError::DatabaseAlreadyOpen)
    ));
    assert_eq!(log_paths(&path).map(|p| std::fs::read(p).unwrap()), logs);
    assert_eq!(std::fs::read(&path).unwrap(), db_before);
    put(&first, 2, b"two");
    drop(first);
    // Closed, the journal opens again.
    let again = db(&path, 64 * BLOCK);
    assert_eq!(get(&again, 2).as_deref(), Some(&b"two"[..]));
}

/// A hook that makes every checkpoint's sync 10 ms slower and keeps the
/// database file's bytes as of its last sync (what a power loss leaves).
fn slow_syncs_keeping_the_file(path: &Path) -> (Arc<Mutex<Vec<u8>>>, OnSynced) {
    let synced = Arc::new(Mutex::new(Vec::new()));
    let hook = {
        let (path, synced) = (path.to_owned(), synced.clone());
        OnSynced(Arc::new(move |done| {
            if done {
                *synced.lock().unwrap() = std::fs::read(&path).unwrap();
            } else {
                std::thread::sleep(std::time::Duration::from_millis(10));
            }
        }))
    };
    (synced, hook)
}

/// xorshift64*: a fixed sequence per seed, so a failure can be replayed.
fn next(state: &mut u64) -> u64 {
    *state ^= *state >> 12;
    *state ^= *state << 25;
    *state ^= *state >> 27;
    state.wrapping_mul(0x2545_f491_4f6c_dd1d)
}

#[test]
fn random_commits_survive_a_power_loss_amid_log_switches_and_slow_checkpoints() {
    use std::collections::BTreeMap;
    // Logs of 96 KiB: commits switch logs every few commits, wait for
    // checkpoints, and the largest skip the journal altogether.
    let size = 24 * BLOCK;
    for seed in 1..=8u64 {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("m.redb");
        // What the database file holds for sure: its bytes at its last sync
        // (a power loss may leave anything written since, or nothing). A
        // slow disk: the writer fills the other log meanwhile and must wait
        // before reusing this one.
        let (synced, hook) = slow_syncs_keeping_the_file(&path);
        let metrics = JournalMetrics::new();
        let mut model: BTreeMap<u64, Vec<u8>> = BTreeMap::new();
        let mut rng = seed.wrapping_mul(0x9e37_79b9_7f4a_7c15) | 1;
        let commits = 40 + next(&mut rng) % 40;
        let crash_at = commits / 2 + next(&mut rng) % (commits / 2);
        let mut crash = None;
        {
            // Odd seeds write the logs through the page cache and
            // `fdatasync`, as on a file system without direct I/O.
            let direct = seed % 2 == 0;
            let backend = open_observed(&path, size, metrics.clone(), Some(hook), direct).unwrap();
            if !direct {
                assert!(!backend.state.lock().unwrap().logs[0].direct);
            }
            let db = redb::Builder::new().create_with_backend(backend).unwrap();
            for c in 0..commits {
                if c == crash_at {
                    // The power goes: the logs keep what they hold (each
                    // record was durable when its commit returned), the
                    // database file what it held at its last sync.
                    crash = Some((
                        synced.lock().unwrap().clone(),
                        log_paths(&path).map(|p| std::fs::read(p).unwrap()),
                        model.clone(),
                    ));
                }
                let w = db.begin_write().unwrap();
                {
                    let mut t = w.open_table(T).unwrap();
                    for _ in 0..1 + next(&mut rng) % 4 {
                        let k = next(&mut rng) % 40;
                        if next(&mut rng).is_multiple_of(5) {
                            t.remove(k).unwrap();
                            model.remove(&k);
                        } else {
                            // Now and then one larger than a log.
                            let len = match next(&mut rng) % 40 {
                                0 => 150_000,
                                n => [10, 900, 5000, 9000][(n % 4) as usize],
                            };
                            let v = vec![(k ^ c) as u8; len];
                            t.insert(k, v.as_slice()).unwrap();
                            model.insert(k, v);
                        }
                    }
                }
                w.commit().unwrap();
            }
        }
        assert!(metrics.checkpoints.get() > 0, "seed {seed}: no checkpoint");
        assert!(metrics.waits.get() > 0, "seed {seed}: no commit waited");
        let (image, logs, model) = crash.expect("crashed");
        std::fs::write(&path, &image).unwrap();
        for (p, bytes) in log_paths(&path).iter().zip(&logs) {
            std::fs::write(p, bytes).unwrap();
        }
        let db = db(&path, size);
        for k in 0..40 {
            assert_eq!(get(&db, k), model.get(&k).cloned(), "seed {seed}, key {k}");
        }
    }
}

#[test]
fn a_closed_database_file_is_whole_without_its_journal() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("m.redb");
    {
        let db = db(&path, 64 * BLOCK);
        put(&db, 1, b"one");
        put(&db, 2, &[2; 10_000]);
    }
    let identity = identity_of(&File::open(&path).unwrap()).unwrap();
    for log in log_paths(&path) {
        let bytes = std::fs::read(log).unwrap();
        let (_, records) = scan(&bytes[..], identity).unwrap().unwrap();
        assert!(records.is_empty(), "a clean close empties the journal");
    }
    // Opened by plain redb, without the journal.
    let db = redb::Database::open(&path).unwrap();
    assert_eq!(get(&db, 1).as_deref(), Some(&b"one"[..]));
    assert_eq!(get(&db, 2), Some(vec![2; 10_000]));
}

#[test]
fn records_left_by_another_database_file_never_validate_even_at_the_same_epoch() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("m.redb");
    {
        let backend = open(&path, 64 * BLOCK, JournalMetrics::new()).unwrap();
        for i in 0..2u8 {
            backend.write(0, &[i; 100]).unwrap();
            backend.sync_data().unwrap();
        }
        drop(backend); // as a crash would
    }
    // Another database file where that one was: opening it starts its logs
    // at the same epochs, over the old records.
    std::fs::remove_file(&path).unwrap();
    std::fs::write(&path, b"").unwrap();
    drop(open(&path, 64 * BLOCK, JournalMetrics::new()).unwrap());
    let identity = identity_of(&File::open(&path).unwrap()).unwrap();
    let bytes = std::fs::read(&log_paths(&path)[0]).unwrap();
    let (epoch, records) = scan(&bytes[..], identity).unwrap().expect("the new header");
    assert_eq!(epoch, 2, "the old records' epoch");
    assert!(
        records.is_empty(),
        "{} old records validated",
        records.len()
    );
}

#[test]
fn turning_the_journal_off_replays_it_first_and_removes_its_files() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("m.redb");
    drop(db(&path, 64 * BLOCK));
    // Synced by the clean close: what a power cut keeps of the file.
    let synced = std::fs::read(&path).unwrap();
    crash_with(&path, 64 * BLOCK, |db| put(db, 1, b"journaled"));
    lose_unsynced(&path, &synced);
    let db = crate::open_database(&path, 1 << 20, 0, &JournalMetrics::new()).unwrap();
    assert_eq!(get(&db, 1).as_deref(), Some(&b"journaled"[..]));
    assert!(log_paths(&path).iter().all(|p| !p.exists()));
}
