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
        data, VersionRecord, TypeRecord, ActorRecord, EventRecord, IdemRecord, InboxRecord,
        AlarmRecord, SecretRecord, ProviderRecord, UsageRecord, FileRecord, InputRecord,
        SubscriptionRecord, DeliveryRecord
    );
});
