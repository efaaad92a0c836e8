//! Backups copy every table of the schema, and restores check what they
//! copy.

use redb::TableHandle;

use super::*;

#[test]
fn backups_copy_every_table_of_the_schema() {
    let dir = tempfile::tempdir().unwrap();
    let db = redb::Database::create(dir.path().join("x.redb")).unwrap();
    check_format(&db).unwrap();
    let read = db.begin_read().unwrap();
    let mut existing: Vec<String> = read
        .list_tables()
        .unwrap()
        .map(|t| t.name().to_owned())
        .collect();
    existing.sort();
    let mut copied: Vec<String> = for_each_table!(names!())
        .into_iter()
        .map(str::to_owned)
        .collect();
    copied.sort();
    assert_eq!(copied, existing, "a table of the schema is not backed up");
    // Nor one a writer would create on first use: every table the
    // schema module declares is in the list.
    let schema = include_str!("../schema/mod.rs");
    let mut declared: Vec<String> = schema
        .split("TableDefinition::new(\"")
        .skip(1)
        .map(|rest| rest.split('"').next().unwrap().to_owned())
        .collect();
    declared.sort();
    assert_eq!(copied, declared, "a declared table is not backed up");
}

/// A restored copy is a new store: a cluster node started on it does
/// not take it for the data it last joined with (it may be older).
#[tokio::test]
async fn a_restored_copy_gets_a_store_id_of_its_own() {
    async fn store_id(d: &Path) -> String {
        let storage =
            crate::Storage::open(d, &crate::StorageConfig::default(), Default::default()).unwrap();
        let id = storage.store_id().unwrap();
        storage.close().await;
        id
    }
    let dir = tempfile::tempdir().unwrap();
    let backup = dir.path().join("backup");
    std::fs::create_dir_all(&backup).unwrap();
    // Not while a node runs on it: what it committed last may be only
    // in its journal, which a restore does not read.
    let running = crate::Storage::open(
        &backup,
        &crate::StorageConfig::default(),
        Default::default(),
    )
    .unwrap();
    let err = restore(&backup, &dir.path().join("early"), &[])
        .unwrap_err()
        .to_string();
    assert!(err.contains("running node"), "{err}");
    assert!(!dir.path().join("early").exists());
    running.close().await;
    let original = store_id(&backup).await;
    assert_eq!(original.len(), 32);
    assert_eq!(store_id(&backup).await, original, "kept across opens");
    let data = dir.path().join("data");
    restore(&backup, &data, &[]).unwrap();
    let restored = store_id(&data).await;
    assert_eq!(restored.len(), 32);
    assert_ne!(restored, original);
}

/// A backup killed mid-way leaves `DEST.partial`, whose database may
/// be a valid redb file with nothing in it (created; its copy never
/// committed). Restored, it was an empty node, "restored".
#[test]
fn a_cut_off_backup_is_refused_and_nothing_is_copied() {
    let dir = tempfile::tempdir().unwrap();
    // Empty; and stamped, as a copy committed before its key file was
    // copied would be.
    for (name, stamped) in [("nightly", false), ("nightly.partial", true)] {
        let backup = dir.path().join(name);
        std::fs::create_dir_all(&backup).unwrap();
        let db = redb::Database::create(backup.join("marmot.redb")).unwrap();
        if stamped {
            check_format(&db).unwrap();
        }
        drop(db);
        let data = dir.path().join("data");
        let err = restore(&backup, &data, &[]).unwrap_err().to_string();
        assert!(err.contains("cut off"), "{name}: {err}");
        assert!(!data.exists(), "{name}: {err}");
        if stamped {
            // Also named by a path that ends elsewhere (as `.` does
            // from inside it: that has no file name).
            std::fs::create_dir(backup.join("sub")).unwrap();
            let err = restore(&backup.join("sub").join(".."), &data, &[])
                .unwrap_err()
                .to_string();
            assert!(err.contains("cut off"), "{name}/sub/..: {err}");
        }
    }
}

#[test]
fn a_backup_from_a_newer_build_is_refused_and_nothing_is_copied() {
    let dir = tempfile::tempdir().unwrap();
    let backup = dir.path().join("backup");
    std::fs::create_dir_all(&backup).unwrap();
    {
        let db = redb::Database::create(backup.join("marmot.redb")).unwrap();
        let w = db.begin_write().unwrap();
        w.open_table(META)
            .unwrap()
            .insert(
                "format_version",
                (FORMAT_VERSION + 1).to_le_bytes().as_slice(),
            )
            .unwrap();
        w.commit().unwrap();
    }
    let data = dir.path().join("data");
    let err = restore(&backup, &data, &[]).unwrap_err();
    assert!(
        matches!(err, StorageError::Format(FormatError::Mismatch { .. })),
        "{err}"
    );
    assert!(!data.join("marmot.redb").exists());
    // Not a backup at all.
    assert!(restore(dir.path(), &data, &[]).is_err());
}
