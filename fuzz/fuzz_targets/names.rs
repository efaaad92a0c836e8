//! Every validator of a name or id a client chooses or sends back: any
//! string gets a yes or a clear no, and what is accepted is safe to use
//! as a key.
#![no_main]

use libfuzzer_sys::fuzz_target;
use marmot_core::ids::*;

fuzz_target!(|data: &str| {
    let _ = validate_type_name(data);
    let _ = validate_idempotency_key(data);
    let _ = validate_hook_name(data);
    let _ = validate_subscription_name(data);
    let _ = validate_secret_name(data);
    let _ = validate_provider_name(data);
    if validate_file_path(data).is_ok() {
        assert!(!data.split('/').any(|c| c == ".." || c == "."), "{data:?}");
        assert!(!data.starts_with('/'), "{data:?}");
    }
    if validate_actor_id(data).is_ok() {
        assert!(!data.is_empty());
    }
    // Delivery ids come back in URLs (`/v1/deliveries/{id}/retry`).
    if let Some(seq) = marmot_storage::schema::delivery_seq(data) {
        assert!(data.starts_with("msg_") && data.len() == 36, "{data:?}");
        assert_eq!(
            marmot_storage::schema::delivery_seq(&marmot_storage::schema::delivery_id(seq)),
            Some(seq)
        );
    }
    if let Some((ty, id)) = data.split_once(':')
        && let Ok(key) = ActorKey::new(ty, id)
    {
        assert_eq!((key.ty(), key.id()), (ty, id));
    }
});
