//! The outbound webhook subscriptions, kept in memory.
//!
//! The writer reads them for every committed event (to write outbox rows in
//! the same transaction) and changes them when a subscription op commits;
//! the API and the delivery worker read them. A snapshot is an `Arc`, so
//! readers never block the writer.

use std::collections::BTreeMap;
use std::sync::{Arc, RwLock};

use super::StorageError;
use super::schema::{SUBSCRIPTIONS, SubscriptionRecord, decode};

/// Subscriptions by name.
pub type SubscriptionMap = BTreeMap<String, SubscriptionRecord>;

/// The current subscriptions.
#[derive(Default)]
pub struct Subscriptions {
    current: RwLock<Arc<SubscriptionMap>>,
}

impl Subscriptions {
    /// Load them from disk.
    pub(super) fn load(db: &redb::Database) -> Result<Self, StorageError> {
        use redb::{ReadableDatabase, ReadableTable};
        let r = db.begin_read()?;
        let t = r.open_table(SUBSCRIPTIONS)?;
        let mut map = SubscriptionMap::new();
        for row in t.iter()? {
            let (k, v) = row?;
            map.insert(k.value().to_owned(), decode("subscription", v.value())?);
        }
        Ok(Self {
            current: RwLock::new(Arc::new(map)),
        })
    }

    /// A snapshot.
    pub fn snapshot(&self) -> Arc<SubscriptionMap> {
        self.current.read().expect("subscriptions lock").clone()
    }

    /// Replace the whole set (after a failed commit: back to what is on disk).
    pub(super) fn replace(&self, map: SubscriptionMap) {
        *self.current.write().expect("subscriptions lock") = Arc::new(map);
    }

    /// Change one subscription (`None` removes it).
    pub(super) fn set(&self, name: &str, rec: Option<SubscriptionRecord>) {
        let mut w = self.current.write().expect("subscriptions lock");
        let mut map = SubscriptionMap::clone(&w);
        match rec {
            Some(r) => {
                map.insert(name.to_owned(), r);
            }
            None => {
                map.remove(name);
            }
        }
        *w = Arc::new(map);
    }
}
