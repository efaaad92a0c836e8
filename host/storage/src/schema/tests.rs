//! The format's encodings and upgrades.

use super::*;

/// The encoding is part of the file format: a change here is a format
/// change and needs a `FORMAT_VERSION` bump.
#[test]
fn actor_record_encoding_is_stable() {
    let rec = ActorRecord {
        num: 7,
        created_at_ms: 1_700_000_000_000,
        version: 2,
        last_turn_at_ms: 1_700_000_000_500,
        turns: 3,
        last_event_seq: 4,
        first_event_seq: 1,
        state_bytes: 10,
        state_keys: 1,
    };
    let bytes = encode(&rec);
    assert_eq!(
        hex::encode(&bytes),
        "0780d095ffbc3102f4d395ffbc310304010a01"
    );
    assert_eq!(decode::<ActorRecord>("actor", &bytes).unwrap(), rec);
}

#[test]
fn alarm_record_encoding_is_stable() {
    let rec = AlarmRecord {
        schedule: AlarmSchedule::Cron {
            expr: "0 9 * * *".into(),
            tz: Some("Europe/Berlin".into()),
        },
        payload: b"{}".to_vec(),
        next_due_ms: 1_700_000_000_000,
        attempts: 1,
        boot_attempts: 0,
        set_at_ms: 1_699_999_999_000,
    };
    let bytes = encode(&rec);
    assert_eq!(
        hex::encode(&bytes),
        "0209302039202a202a202a010d4575726f70652f4265726c696e027b7d80d095ffbc31010098c895ffbc31"
    );
    assert_eq!(decode::<AlarmRecord>("alarm", &bytes).unwrap(), rec);
}

#[test]
fn format_1_files_are_migrated_and_newer_ones_refused() {
    let dir = tempfile::tempdir().unwrap();
    let db = redb::Database::create(dir.path().join("m.redb")).unwrap();
    let w = db.begin_write().unwrap();
    {
        let mut meta = w.open_table(META).unwrap();
        meta.insert("format_version", 1u32.to_le_bytes().as_slice())
            .unwrap();
        let mut inbox = w.open_table(INBOX).unwrap();
        let old = upgrade::InboxRecordV1 {
            message_id: "m1".into(),
            body: b"{}".to_vec(),
            content_type: None,
            idempotency_key: Some("k".into()),
            attempts: 2,
            enqueued_at_ms: 9,
        };
        inbox
            .insert((7, 1), postcard::to_allocvec(&old).unwrap().as_slice())
            .unwrap();
    }
    w.commit().unwrap();
    check_format(&db).unwrap();
    {
        let r = db.begin_read().unwrap();
        let inbox = r.open_table(INBOX).unwrap();
        let row = inbox.get((7, 1)).unwrap().unwrap();
        let rec: InboxRecord = decode("inbox", row.value()).unwrap();
        assert_eq!(rec.kind, InboxKind::Message);
        assert_eq!(rec.attempts, 2);
        assert_eq!(rec.idempotency_key.as_deref(), Some("k"));
        let meta = r.open_table(META).unwrap();
        let v = meta
            .get("format_version")
            .unwrap()
            .unwrap()
            .value()
            .to_vec();
        assert_eq!(v, FORMAT_VERSION.to_le_bytes());
    }
    // A file from a newer Marmot is refused, untouched.
    let w = db.begin_write().unwrap();
    w.open_table(META)
        .unwrap()
        .insert("format_version", 99u32.to_le_bytes().as_slice())
        .unwrap();
    w.commit().unwrap();
    assert!(matches!(
        check_format(&db),
        Err(FormatError::Mismatch { found: 99, .. })
    ));
}

#[test]
fn format_2_files_gain_the_file_tables() {
    let dir = tempfile::tempdir().unwrap();
    let db = redb::Database::create(dir.path().join("m.redb")).unwrap();
    let w = db.begin_write().unwrap();
    {
        let mut meta = w.open_table(META).unwrap();
        meta.insert("format_version", 2u32.to_le_bytes().as_slice())
            .unwrap();
        w.open_table(STATE)
            .unwrap()
            .insert((1, "k"), b"v".as_slice())
            .unwrap();
    }
    w.commit().unwrap();
    check_format(&db).unwrap();
    let r = db.begin_read().unwrap();
    assert!(r.open_table(FILES).is_ok());
    assert!(r.open_table(BLOB_REFS).is_ok());
    let state = r.open_table(STATE).unwrap();
    assert_eq!(state.get((1, "k")).unwrap().unwrap().value(), b"v");
    let v = r
        .open_table(META)
        .unwrap()
        .get("format_version")
        .unwrap()
        .unwrap()
        .value()
        .to_vec();
    assert_eq!(v, FORMAT_VERSION.to_le_bytes());
}

#[test]
fn format_4_files_gain_the_relay_table_and_keep_their_outbox_rows() {
    let dir = tempfile::tempdir().unwrap();
    let db = redb::Database::create(dir.path().join("m.redb")).unwrap();
    let row = DeliveryRecord {
        subscription: "s".into(),
        webhook_id: "msg_1".into(),
        actor_type: "kit".into(),
        actor_id: "a".into(),
        event_seq: 7,
        kind: "done".into(),
        payload: b"{}".to_vec(),
        created_at_ms: 5,
        attempts: 0,
        next_attempt_ms: 9,
        last_error: None,
        status: DeliveryStatus::Pending,
        traceparent: Some("00-1-2-01".into()),
    };
    let w = db.begin_write().unwrap();
    {
        let mut meta = w.open_table(META).unwrap();
        meta.insert("format_version", 4u32.to_le_bytes().as_slice())
            .unwrap();
        w.open_table(OUTBOX)
            .unwrap()
            .insert(1, encode(&row).as_slice())
            .unwrap();
    }
    w.commit().unwrap();
    check_format(&db).unwrap();
    let r = db.begin_read().unwrap();
    assert!(r.open_table(RELAY).is_ok());
    let outbox = r.open_table(OUTBOX).unwrap();
    let back: DeliveryRecord = decode("delivery", outbox.get(1).unwrap().unwrap().value()).unwrap();
    assert_eq!(back, row, "a format-4 row is not migrated again");
    let v = r
        .open_table(META)
        .unwrap()
        .get("format_version")
        .unwrap()
        .unwrap()
        .value()
        .to_vec();
    assert_eq!(v, FORMAT_VERSION.to_le_bytes());
}

#[test]
fn format_3_outbox_rows_gain_an_empty_traceparent() {
    let dir = tempfile::tempdir().unwrap();
    let db = redb::Database::create(dir.path().join("m.redb")).unwrap();
    let old = upgrade::DeliveryRecordV3 {
        subscription: "s".into(),
        webhook_id: "msg_1".into(),
        actor_type: "kit".into(),
        actor_id: "a".into(),
        event_seq: 7,
        kind: "done".into(),
        payload: b"{}".to_vec(),
        created_at_ms: 5,
        attempts: 2,
        next_attempt_ms: 9,
        last_error: Some("HTTP 500".into()),
        status: DeliveryStatus::Pending,
    };
    let w = db.begin_write().unwrap();
    {
        let mut meta = w.open_table(META).unwrap();
        meta.insert("format_version", 3u32.to_le_bytes().as_slice())
            .unwrap();
        w.open_table(OUTBOX)
            .unwrap()
            .insert(1, postcard::to_allocvec(&old).unwrap().as_slice())
            .unwrap();
    }
    w.commit().unwrap();
    check_format(&db).unwrap();
    let r = db.begin_read().unwrap();
    let row = r.open_table(OUTBOX).unwrap().get(1).unwrap().unwrap();
    let new: DeliveryRecord = decode("delivery", row.value()).unwrap();
    assert_eq!(new.webhook_id, "msg_1");
    assert_eq!(new.last_error.as_deref(), Some("HTTP 500"));
    assert_eq!((new.attempts, new.event_seq), (2, 7));
    assert_eq!(new.traceparent, None);
}

/// Part of the file format, like the actor record.
#[test]
fn file_record_encoding_is_stable() {
    let rec = FileRecord {
        size: 3,
        sha256: [7; 32],
        updated_at_ms: 1_700_000_000_000,
        body: FileBody::Inline(b"abc".to_vec()),
    };
    assert_eq!(
        hex::encode(encode(&rec)),
        "03070707070707070707070707070707070707070707070707070707070707070780d095ffbc310003616263"
    );
    let blob = FileRecord {
        body: FileBody::Blob,
        ..rec
    };
    assert_eq!(decode::<FileRecord>("file", &encode(&blob)).unwrap(), blob);
}

#[test]
fn idem_record_round_trips() {
    let rec = IdemRecord {
        outcome: IdemOutcome::Done {
            message_id: "m1".into(),
            reply: StoredReply {
                status: 200,
                body: b"{}".to_vec(),
                content_type: None,
            },
        },
        expires_at_ms: 5,
        request_sha256: Some(request_fingerprint(Some("application/json"), b"{}")),
    };
    assert_eq!(decode::<IdemRecord>("idem", &encode(&rec)).unwrap(), rec);
    assert!(!rec.refuses(Some(&request_fingerprint(Some("application/json"), b"{}"))));
    assert!(rec.refuses(Some(&request_fingerprint(Some("application/json"), b"{ }"))));
    assert!(!rec.refuses(None), "a webhook's key is its delivery id");
    // The media type is part of the request (how the body reaches the
    // actor), its spelling and parameters are not.
    let json = Some("application/json");
    assert_eq!(
        request_fingerprint(json, b"{}"),
        request_fingerprint(Some("Application/JSON; charset=utf-8"), b"{}")
    );
    assert!(rec.refuses(Some(&request_fingerprint(Some("text/plain"), b"{}"))));
    let old = IdemRecord {
        request_sha256: None,
        ..rec
    };
    assert!(!old.refuses(Some(&request_fingerprint(Some("application/json"), b"{ }"))));
}

#[test]
fn format_6_idempotency_records_gain_an_unknown_fingerprint() {
    let dir = tempfile::tempdir().unwrap();
    let db = redb::Database::create(dir.path().join("m.redb")).unwrap();
    let outcome = IdemOutcome::Queued {
        message_id: "m1".into(),
    };
    let old = upgrade::IdemRecordV6 {
        outcome: outcome.clone(),
        expires_at_ms: 77,
    };
    let w = db.begin_write().unwrap();
    {
        let mut meta = w.open_table(META).unwrap();
        meta.insert("format_version", 6u32.to_le_bytes().as_slice())
            .unwrap();
        w.open_table(IDEMPOTENCY)
            .unwrap()
            .insert(
                (3, "key-1"),
                postcard::to_allocvec(&old).unwrap().as_slice(),
            )
            .unwrap();
    }
    w.commit().unwrap();
    check_format(&db).unwrap();
    let r = db.begin_read().unwrap();
    let t = r.open_table(IDEMPOTENCY).unwrap();
    let new: IdemRecord = decode("idem", t.get((3, "key-1")).unwrap().unwrap().value()).unwrap();
    assert_eq!(
        new,
        IdemRecord {
            outcome,
            expires_at_ms: 77,
            request_sha256: None,
        }
    );
    let v = r.open_table(META).unwrap().get("format_version").unwrap();
    assert_eq!(v.unwrap().value(), FORMAT_VERSION.to_le_bytes());
}

/// The delivery worker reads a row's leading fields alone: they must stay
/// the record's first fields, in its order.
#[test]
fn a_delivery_head_is_the_start_of_its_record() {
    let rec = DeliveryRecord {
        subscription: "sub".into(),
        webhook_id: "msg_1".into(),
        actor_type: "t".into(),
        actor_id: "a".into(),
        event_seq: 7,
        kind: "k.x".into(),
        payload: vec![1; 1000],
        created_at_ms: 1,
        attempts: 2,
        next_attempt_ms: 3,
        last_error: Some("no".into()),
        status: DeliveryStatus::Pending,
        traceparent: None,
    };
    let head: DeliveryHead = decode("delivery", &encode(&rec)).unwrap();
    assert_eq!(
        head,
        DeliveryHead {
            subscription: "sub".into(),
            webhook_id: "msg_1".into(),
            actor_type: "t".into(),
            actor_id: "a".into(),
            event_seq: 7,
            kind: "k.x".into(),
        }
    );
}

#[test]
fn format_7_input_requests_are_indexed_by_status() {
    let dir = tempfile::tempdir().unwrap();
    let db = redb::Database::create(dir.path().join("m.redb")).unwrap();
    let input = |status| InputRecord {
        kind: "approval".into(),
        prompt: String::new(),
        schema: None,
        created_at_ms: 1,
        expires_at_ms: None,
        status,
    };
    let w = db.begin_write().unwrap();
    {
        let mut meta = w.open_table(META).unwrap();
        meta.insert("format_version", 7u32.to_le_bytes().as_slice())
            .unwrap();
        let mut t = w.open_table(INPUTS).unwrap();
        for (num, id, status) in [
            (3, "in_a", InputStatus::Pending),
            (3, "in_b", InputStatus::Expired { at_ms: 50 }),
            (4, "in_c", InputStatus::Cancelled { at_ms: 40 }),
        ] {
            t.insert((num, id), encode(&input(status)).as_slice())
                .unwrap();
        }
    }
    w.commit().unwrap();
    check_format(&db).unwrap();
    let r = db.begin_read().unwrap();
    let index: Vec<(u64, u64, String)> = r
        .open_table(INPUTS_BY_SETTLED)
        .unwrap()
        .iter()
        .unwrap()
        .map(|row| {
            let (k, _) = row.unwrap();
            let (num, at, id) = k.value();
            (num, at, id.to_owned())
        })
        .collect();
    assert_eq!(
        index,
        [
            (3, 0, "in_a".to_owned()),
            (3, 50, "in_b".to_owned()),
            (4, 40, "in_c".to_owned()),
        ]
    );
    let v = r.open_table(META).unwrap().get("format_version").unwrap();
    assert_eq!(v.unwrap().value(), FORMAT_VERSION.to_le_bytes());
}

#[test]
fn format_8_outbox_rows_gain_their_heads() {
    let dir = tempfile::tempdir().unwrap();
    let db = redb::Database::create(dir.path().join("m.redb")).unwrap();
    let row = |seq: u64, status| DeliveryRecord {
        subscription: "s".into(),
        webhook_id: format!("msg_{seq}"),
        actor_type: "kit".into(),
        actor_id: "a".into(),
        event_seq: seq,
        kind: "done".into(),
        payload: vec![7; 100_000],
        created_at_ms: 5,
        attempts: 3,
        next_attempt_ms: 9,
        last_error: None,
        status,
        traceparent: None,
    };
    let rows = [
        row(1, DeliveryStatus::Pending),
        row(4, DeliveryStatus::Dead),
    ];
    let w = db.begin_write().unwrap();
    {
        let mut meta = w.open_table(META).unwrap();
        meta.insert("format_version", 8u32.to_le_bytes().as_slice())
            .unwrap();
        let mut outbox = w.open_table(OUTBOX).unwrap();
        for r in &rows {
            outbox.insert(r.event_seq, encode(r).as_slice()).unwrap();
        }
    }
    w.commit().unwrap();
    check_format(&db).unwrap();
    let r = db.begin_read().unwrap();
    let heads: Vec<(u64, DeliveryHead)> = (r.open_table(OUTBOX_HEADS).unwrap().iter().unwrap())
        .map(|row| {
            let (k, v) = row.unwrap();
            (k.value(), decode("head", v.value()).unwrap())
        })
        .collect();
    assert_eq!(heads, [(1, rows[0].head()), (4, rows[1].head())]);
    let v = r.open_table(META).unwrap().get("format_version").unwrap();
    assert_eq!(v.unwrap().value(), FORMAT_VERSION.to_le_bytes());
}

/// Every stored record decoder against arbitrary and damaged bytes: an
/// error, never a panic.
mod props {
    use proptest::prelude::*;

    use super::super::*;

    macro_rules! never_panics {
    ($bytes:expr, $($ty:ty),+) => {
        $( let _ = decode::<$ty>(stringify!($ty), $bytes); )+
    };
}

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(2000))]

        #[test]
        fn decoding_arbitrary_bytes_is_an_error_not_a_panic(
            bytes in proptest::collection::vec(any::<u8>(), 0..512),
        ) {
            never_panics!(
                &bytes, ActorRecord, EventRecord, IdemRecord,
                InboxRecord, AlarmRecord, SecretRecord, ProviderRecord, UsageRecord,
                FileRecord, InputRecord, SubscriptionRecord, DeliveryRecord
            );
            let _ = crate::decode_type(&bytes);
        }

        #[test]
        fn a_truncated_inbox_row_is_an_error(
            body in proptest::collection::vec(any::<u8>(), 0..64),
            key in proptest::option::of("[a-z0-9]{1,16}"),
            attempts in any::<u32>(),
            cut in any::<proptest::sample::Index>(),
        ) {
            let rec = InboxRecord {
                message_id: "m1".into(),
                body,
                content_type: Some("application/json".into()),
                idempotency_key: key,
                attempts,
                enqueued_at_ms: 1_700_000_000_000,
                kind: InboxKind::Webhook {
                    name: "h".into(),
                    headers: vec![("a".into(), "b".into())],
                },
            };
            let bytes = encode(&rec);
            prop_assert_eq!(decode::<InboxRecord>("inbox", &bytes).ok(), Some(rec));
            let short = &bytes[..cut.index(bytes.len())];
            prop_assert!(decode::<InboxRecord>("inbox", short).is_err());
        }
    }
}

#[test]
fn format_5_relay_rows_gain_an_unknown_sender_and_both_tables_their_ids() {
    let dir = tempfile::tempdir().unwrap();
    let db = redb::Database::create(dir.path().join("m.redb")).unwrap();
    let message = InboxRecord {
        message_id: "m1".into(),
        body: b"{}".to_vec(),
        content_type: None,
        idempotency_key: Some("relay-m1".into()),
        attempts: 0,
        enqueued_at_ms: 3,
        kind: InboxKind::Message,
    };
    let old = upgrade::RelayRecordV5 {
        actor_type: "kit".into(),
        actor_id: "b".into(),
        message: message.clone(),
    };
    let delivery = DeliveryRecord {
        subscription: "s".into(),
        webhook_id: "msg_00000000000000090000000000000001".into(),
        actor_type: "kit".into(),
        actor_id: "a".into(),
        event_seq: 1,
        kind: "done".into(),
        payload: b"{}".to_vec(),
        created_at_ms: 5,
        attempts: 0,
        next_attempt_ms: 5,
        last_error: None,
        status: DeliveryStatus::Pending,
        traceparent: None,
    };
    let w = db.begin_write().unwrap();
    {
        let mut meta = w.open_table(META).unwrap();
        meta.insert("format_version", 5u32.to_le_bytes().as_slice())
            .unwrap();
        w.open_table(RELAY)
            .unwrap()
            .insert(4, postcard::to_allocvec(&old).unwrap().as_slice())
            .unwrap();
        w.open_table(OUTBOX)
            .unwrap()
            .insert(9, encode(&delivery).as_slice())
            .unwrap();
    }
    w.commit().unwrap();
    check_format(&db).unwrap();
    let r = db.begin_read().unwrap();
    let row = r.open_table(RELAY).unwrap().get(4).unwrap().unwrap();
    let new: RelayRecord = decode("relay", row.value()).unwrap();
    assert_eq!(new.message, message);
    assert_eq!((new.actor_id.as_str(), new.from), ("b", None));
    let relay_ids = r.open_table(RELAY_IDS).unwrap();
    assert_eq!(relay_ids.get("m1").unwrap().unwrap().value(), 4);
    let outbox_ids = r.open_table(OUTBOX_IDS).unwrap();
    let seq = outbox_ids.get(delivery.webhook_id.as_str()).unwrap();
    assert_eq!(seq.unwrap().value(), 9);
    // Opening it again changes nothing.
    drop((row, relay_ids, outbox_ids, r));
    check_format(&db).unwrap();
}

/// A delivery id reads back its seq; anything else, however close, is
/// `None` and never a panic (the id comes from a URL).
#[test]
fn delivery_ids_read_back_and_refuse_the_rest() {
    let id = delivery_id(0x1234);
    assert_eq!(delivery_seq(&id), Some(0x1234));
    assert_eq!(
        delivery_seq(&id.to_uppercase().replacen("MSG_", "msg_", 1)),
        Some(0x1234)
    );
    let hex = &id["msg_".len()..];
    for bad in [
        String::new(),
        hex.to_owned(),
        format!("msg_{}", &hex[1..]),
        format!("msg_{hex}0"),
        format!("msg_+{}", &hex[1..]),
        format!("msg_{}g", &hex[1..]),
        // 32 bytes, with a two-byte character across byte 16.
        format!("msg_{}é{}", "a".repeat(15), "a".repeat(15)),
    ] {
        assert_eq!(delivery_seq(&bad), None, "{bad:?}");
    }
}
