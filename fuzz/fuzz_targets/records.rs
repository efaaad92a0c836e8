//! Every stored record decoder: a corrupted row is an error, never a panic,
//! and whatever decodes re-encodes to bytes that decode to the same value.
#![no_main]

use libfuzzer_sys::fuzz_target;
use marmot_storage::schema::*;

macro_rules! check {
    ($data:expr, $($ty:ty),+) => {$(
        if let Ok(v) = decode::<$ty>(stringify!($ty), $data) {
            let again: $ty = decode(stringify!($ty), &encode(&v)).expect("re-encoded record decodes");
            assert_eq!(again, v, "{} changed on a round trip", stringify!($ty));
        }
    )+};
}

fuzz_target!(|data: &[u8]| {
    check!(
        data, ActorRecord, EventRecord, IdemRecord, InboxRecord, AlarmRecord, SecretRecord,
        ProviderRecord, UsageRecord, FileRecord, InputRecord, SubscriptionRecord, DeliveryRecord
    );
    // Type records are JSON (their config skips empty fields, which
    // postcard cannot carry).
    if let Ok(v) = serde_json::from_slice::<TypeRecord>(data) {
        let again: TypeRecord = serde_json::from_slice(&serde_json::to_vec(&v).unwrap())
            .expect("re-encoded type record decodes");
        assert_eq!(again, v, "TypeRecord changed on a round trip");
    }
});
