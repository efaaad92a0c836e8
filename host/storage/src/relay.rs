//! Reading the relay: messages sent by this node's actors in a cluster,
//! waiting to be handed to their recipients' owners.

use redb::ReadableTable;

use crate::schema::{RELAY, RelayRecord, decode};
use crate::{Reader, StorageError};

impl Reader {
    /// Up to `limit` relayed messages, oldest first.
    pub fn relay_page(&self, limit: usize) -> Result<Vec<(u64, RelayRecord)>, StorageError> {
        let relay = self.txn.open_table(RELAY)?;
        let mut out = Vec::new();
        for row in relay.iter()?.take(limit) {
            let (k, v) = row?;
            out.push((k.value(), decode("relay", v.value())?));
        }
        Ok(out)
    }
}
