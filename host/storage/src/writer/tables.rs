//! Every table of a write transaction, and the row-level writes the ops
//! are made of (keeping secondary indexes in step with their tables).

use marmot_core::ids::ActorKey;
use redb::{ReadableTable, WriteTransaction};

use super::ops::TurnCommit;
use crate::schema::*;
use crate::{StorageError, encode_type};

/// Every table of one batch's transaction, each opened when the batch
/// first uses it and kept open to the end of the batch: opening a redb
/// table costs a lookup in the table tree and, on close, a root update, so
/// opening all of them for every batch was a tenth of the writer's CPU
/// (a counter's turn touches one or two).
macro_rules! tables {
    ($($name:ident: $def:ident => $k:ty, $v:ty;)*) => {
        pub(super) struct Tables<'t> {
            txn: &'t WriteTransaction,
            /// Blobs whose last reference this transaction removed.
            pub(super) unreferenced: Vec<([u8; 32], u64)>,
            $($name: Option<redb::Table<'t, $k, $v>>,)*
        }

        impl<'t> Tables<'t> {
            /// The tables of `txn`, none opened yet.
            pub(super) fn of(txn: &'t WriteTransaction) -> Self {
                Self { txn, unreferenced: Vec::new(), $($name: None,)* }
            }

            $(
                pub(super) fn $name(&mut self) -> Result<&mut redb::Table<'t, $k, $v>, StorageError> {
                    let txn = self.txn;
                    Ok(match &mut self.$name {
                        Some(table) => table,
                        slot => slot.insert(txn.open_table($def)?),
                    })
                }
            )*
        }
    };
}

tables! {
    types: TYPES => &'static str, &'static [u8];
    code: CODE => (&'static str, u32), &'static [u8];
    actors: ACTORS => (&'static str, &'static str), &'static [u8];
    actor_keys: ACTOR_KEYS => u64, (&'static str, &'static str);
    state: STATE => (u64, &'static str), &'static [u8];
    events: EVENTS => (u64, u64), &'static [u8];
    idempotency: IDEMPOTENCY => (u64, &'static str), &'static [u8];
    idem_expiry: IDEM_EXPIRY => (u64, u64, &'static str), ();
    inbox: INBOX => (u64, u64), &'static [u8];
    alarms: ALARMS => (u64, &'static str), &'static [u8];
    alarm_due: ALARM_DUE => (u64, u64, &'static str), ();
    inputs: INPUTS => (u64, &'static str), &'static [u8];
    inputs_by_settled: INPUTS_BY_SETTLED => (u64, u64, &'static str), ();
    subscriptions: SUBSCRIPTIONS => &'static str, &'static [u8];
    outbox: OUTBOX => u64, &'static [u8];
    outbox_heads: OUTBOX_HEADS => u64, &'static [u8];
    outbox_due: OUTBOX_DUE => (u64, u64), ();
    outbox_ids: OUTBOX_IDS => &'static str, u64;
    secrets: SECRETS => &'static str, &'static [u8];
    providers: PROVIDERS => &'static str, &'static [u8];
    revoked_tokens: REVOKED_TOKENS => &'static str, u64;
    actor_usage: ACTOR_USAGE => u64, &'static [u8];
    type_usage: TYPE_USAGE => &'static str, &'static [u8];
    files: FILES => (u64, &'static str), &'static [u8];
    file_usage: FILE_USAGE => u64, &'static [u8];
    type_file_usage: TYPE_FILE_USAGE => &'static str, u64;
    blob_refs: BLOB_REFS => &'static [u8; 32], u64;
    relay: RELAY => u64, &'static [u8];
    relay_ids: RELAY_IDS => &'static str, u64;
    replica_lsn: REPLICA_LSN => u32, &'static [u8];
}

impl Tables<'_> {
    /// Write everything a turn produced.
    pub(super) fn write_turn(
        &mut self,
        t: &TurnCommit,
        created: &mut i64,
    ) -> Result<(), StorageError> {
        let num = t.num;
        if let Some(record) = &t.record {
            let was = self
                .actors()?
                .insert((t.key.ty(), t.key.id()), encode(record).as_slice())?;
            if was.is_none() {
                drop(was);
                *created += 1;
                self.actor_keys()?.insert(num, (t.key.ty(), t.key.id()))?;
            }
        }
        for (k, v) in &t.state {
            match v {
                Some(v) => {
                    self.state()?.insert((num, k.as_str()), v.as_ref())?;
                }
                None => {
                    self.state()?.remove((num, k.as_str()))?;
                }
            }
        }
        for (seq, ev) in &t.events {
            self.events()?.insert((num, *seq), encode(ev).as_slice())?;
        }
        if let Some(below) = t.trim_events_below {
            let old = seqs(&*self.events()?, num, below)?;
            for seq in old {
                self.events()?.remove((num, seq))?;
            }
        }
        if let Some((key, rec)) = &t.idempotency {
            self.idempotency()?
                .insert((num, key.as_str()), encode(rec).as_slice())?;
            self.idem_expiry()?
                .insert((rec.expires_at_ms, num, key.as_str()), ())?;
        }
        if let Some(seq) = t.inbox_done {
            self.inbox()?.remove((num, seq))?;
        }
        if let Some((seq, rec)) = &t.inbox_update {
            self.inbox()?.insert((num, *seq), encode(rec).as_slice())?;
        }
        for (name, rec) in &t.alarms {
            self.write_alarm(num, name, rec.as_ref())?;
        }
        if !t.files.is_empty() {
            self.write_files(num, t.key.ty(), &t.files)?;
        }
        if let Some(u) = t.usage {
            self.add_usage(num, t.key.ty(), u)?;
        }
        for (id, rec) in &t.inputs {
            self.write_input(num, id, rec.as_ref())?;
        }
        Ok(())
    }

    /// Write (`Some`) or delete (`None`) input request `id` of actor `num`,
    /// keeping [`INPUTS_BY_SETTLED`] in step.
    fn write_input(
        &mut self,
        num: u64,
        id: &str,
        rec: Option<&InputRecord>,
    ) -> Result<(), StorageError> {
        let old = self
            .inputs()?
            .get((num, id))?
            .map(|v| decode::<InputRecord>("input", v.value()))
            .transpose()?;
        if let (Some(r), Some(old)) = (rec, &old)
            && matches!(r.status, InputStatus::Cancelled { .. })
            && old.status != InputStatus::Pending
        {
            // The cancelling turn read the request pending, but a commit of
            // the actor applied before this one settled it (an answer in
            // flight): that stands. (One made and cancelled by the same
            // turn is not written yet.)
            return Ok(());
        }
        if let Some(old) = old {
            self.inputs_by_settled()?
                .remove((num, old.status.index_ms(), id))?;
        }
        match rec {
            Some(r) => {
                self.inputs()?.insert((num, id), encode(r).as_slice())?;
                self.inputs_by_settled()?
                    .insert((num, r.status.index_ms(), id), ())?;
            }
            None => {
                self.inputs()?.remove((num, id))?;
            }
        }
        Ok(())
    }

    /// Write (`Some`) or delete (`None`) files of actor `num` (of type
    /// `ty`), keeping its usage, its type's usage and the blob references
    /// in step.
    fn write_files(
        &mut self,
        num: u64,
        ty: &str,
        files: &[(String, Option<FileRecord>)],
    ) -> Result<(), StorageError> {
        let mut usage: FileUsage = match self.file_usage()?.get(num)? {
            Some(v) => decode("file usage", v.value())?,
            None => FileUsage::default(),
        };
        let (mut added, mut removed) = (0u64, 0u64);
        for (path, rec) in files {
            let old = self
                .files()?
                .get((num, path.as_str()))?
                .map(|v| decode::<FileRecord>("file", v.value()))
                .transpose()?;
            if let Some(old) = &old {
                removed += old.size;
                usage.files -= 1;
                if old.body == FileBody::Blob {
                    self.blob_ref(&old.sha256, old.size, -1)?;
                }
            }
            match rec {
                Some(r) => {
                    added += r.size;
                    usage.files += 1;
                    if r.body == FileBody::Blob {
                        self.blob_ref(&r.sha256, r.size, 1)?;
                    }
                    self.files()?
                        .insert((num, path.as_str()), encode(r).as_slice())?;
                }
                None => {
                    self.files()?.remove((num, path.as_str()))?;
                }
            }
        }
        usage.bytes = usage.bytes + added - removed;
        if usage == FileUsage::default() {
            self.file_usage()?.remove(num)?;
        } else {
            self.file_usage()?.insert(num, encode(&usage).as_slice())?;
        }
        let type_bytes = self.type_file_usage()?.get(ty)?.map_or(0, |v| v.value());
        let type_bytes = (type_bytes + added).saturating_sub(removed);
        if type_bytes == 0 {
            self.type_file_usage()?.remove(ty)?;
        } else {
            self.type_file_usage()?.insert(ty, type_bytes)?;
        }
        Ok(())
    }

    /// Add `delta` references to blob `sha256`, of `size` bytes (a row at
    /// zero goes, and the blob is noted as [`Tables::unreferenced`]).
    fn blob_ref(&mut self, sha256: &[u8; 32], size: u64, delta: i64) -> Result<(), StorageError> {
        let n = self.blob_refs()?.get(sha256)?.map_or(0, |v| v.value());
        let n = n.saturating_add_signed(delta);
        if n == 0 {
            self.blob_refs()?.remove(sha256)?;
            self.unreferenced.push((*sha256, size));
        } else {
            self.blob_refs()?.insert(sha256, n)?;
        }
        Ok(())
    }

    /// Write (`Some`) or remove one secret; whether one existed before.
    pub(super) fn put_secret(
        &mut self,
        name: &str,
        rec: Option<&SecretRecord>,
    ) -> Result<bool, StorageError> {
        let existed = match rec {
            Some(r) => self
                .secrets()?
                .insert(name, encode(r).as_slice())?
                .is_some(),
            None => self.secrets()?.remove(name)?.is_some(),
        };
        Ok(existed)
    }

    /// Add model usage to actor `num` and its type `ty`.
    pub(super) fn add_usage(
        &mut self,
        num: u64,
        ty: &str,
        delta: UsageRecord,
    ) -> Result<(), StorageError> {
        let actor: UsageRecord = match self.actor_usage()?.get(num)? {
            Some(v) => decode("usage", v.value())?,
            None => UsageRecord::default(),
        };
        self.actor_usage()?
            .insert(num, encode(&actor.plus(delta)).as_slice())?;
        let total: UsageRecord = match self.type_usage()?.get(ty)? {
            Some(v) => decode("usage", v.value())?,
            None => UsageRecord::default(),
        };
        self.type_usage()?
            .insert(ty, encode(&total.plus(delta)).as_slice())?;
        Ok(())
    }

    /// Raise `key`'s turn count and last turn's time to these where its
    /// record is behind (see `WriteOp::RecordStats`); nothing if it is
    /// gone.
    pub(super) fn raise_stats(
        &mut self,
        key: &ActorKey,
        turns: u64,
        last_turn_at_ms: u64,
    ) -> Result<(), StorageError> {
        let Some(mut rec) = self
            .actors()?
            .get((key.ty(), key.id()))?
            .map(|v| decode::<ActorRecord>("actor", v.value()))
            .transpose()?
        else {
            return Ok(());
        };
        if turns <= rec.turns && last_turn_at_ms <= rec.last_turn_at_ms {
            return Ok(());
        }
        rec.turns = rec.turns.max(turns);
        rec.last_turn_at_ms = rec.last_turn_at_ms.max(last_turn_at_ms);
        self.actors()?
            .insert((key.ty(), key.id()), encode(&rec).as_slice())?;
        Ok(())
    }

    /// The number `key` has now, if it exists.
    pub(super) fn current_num(&mut self, key: &ActorKey) -> Result<Option<u64>, StorageError> {
        match self.actors()?.get((key.ty(), key.id()))? {
            Some(v) => Ok(Some(decode::<ActorRecord>("actor", v.value())?.num)),
            None => Ok(None),
        }
    }

    /// Every actor (key and record) `pick` selects.
    pub(super) fn actors_where(
        &mut self,
        pick: impl Fn(&ActorKey) -> bool,
    ) -> Result<Vec<(ActorKey, ActorRecord)>, StorageError> {
        let mut out = Vec::new();
        for row in self.actors()?.iter()? {
            let (k, v) = row?;
            let (ty, id) = k.value();
            let Ok(key) = ActorKey::new(ty, id) else {
                continue;
            };
            if pick(&key) {
                out.push((key, decode("actor", v.value())?));
            }
        }
        Ok(out)
    }

    /// All of actor `key`'s rows but its outgoing ones (which take a scan
    /// of their tables: [`Self::outgoing_where`]).
    pub(super) fn actor_image(
        &mut self,
        key: &ActorKey,
        record: ActorRecord,
    ) -> Result<ActorImage, StorageError> {
        let num = record.num;
        let mut image = ActorImage {
            actor_type: key.ty().to_owned(),
            actor_id: key.id().to_owned(),
            record,
            state: Vec::new(),
            events: Vec::new(),
            idempotency: Vec::new(),
            inbox: Vec::new(),
            alarms: Vec::new(),
            inputs: Vec::new(),
            files: Vec::new(),
            usage: None,
            deliveries: Vec::new(),
            relays: Vec::new(),
        };
        for row in self.state()?.range((num, "")..)? {
            let (k, v) = row?;
            let (n, name) = k.value();
            if n != num {
                break;
            }
            image.state.push((name.to_owned(), v.value().to_vec()));
        }
        for row in self.events()?.range((num, 0)..=(num, u64::MAX))? {
            let (k, v) = row?;
            image
                .events
                .push((k.value().1, decode("event", v.value())?));
        }
        for row in self.inbox()?.range((num, 0)..=(num, u64::MAX))? {
            let (k, v) = row?;
            image.inbox.push((k.value().1, decode("inbox", v.value())?));
        }
        macro_rules! named {
            ($table:expr, $into:expr, $what:literal) => {
                for row in $table.range((num, "")..)? {
                    let (k, v) = row?;
                    let (n, name) = k.value();
                    if n != num {
                        break;
                    }
                    $into.push((name.to_owned(), decode($what, v.value())?));
                }
            };
        }
        named!(self.idempotency()?, image.idempotency, "idempotency");
        named!(self.alarms()?, image.alarms, "alarm");
        named!(self.inputs()?, image.inputs, "input");
        named!(self.files()?, image.files, "file");
        image.usage = match self.actor_usage()?.get(num)? {
            Some(v) => Some(decode("usage", v.value())?),
            None => None,
        };
        Ok(image)
    }

    /// Write or remove one model provider; whether one existed.
    pub(super) fn put_provider(
        &mut self,
        name: &str,
        rec: Option<&ProviderRecord>,
    ) -> Result<bool, StorageError> {
        let existed = match rec {
            Some(r) => self
                .providers()?
                .insert(name, encode(r).as_slice())?
                .is_some(),
            None => self.providers()?.remove(name)?.is_some(),
        };
        Ok(existed)
    }

    /// Revoke client token `jti` (expiring at `expires_at_ms`), dropping
    /// revocations of tokens expired by `now_ms`; whether it is new.
    pub(super) fn revoke_token(
        &mut self,
        jti: &str,
        expires_at_ms: u64,
        now_ms: u64,
    ) -> Result<bool, StorageError> {
        self.revoked_tokens()?.retain(|_, exp| exp > now_ms)?;
        Ok(self.revoked_tokens()?.insert(jti, expires_at_ms)?.is_none())
    }

    /// Set, move or remove one alarm, keeping the due index in step.
    pub(super) fn write_alarm(
        &mut self,
        num: u64,
        name: &str,
        rec: Option<&AlarmRecord>,
    ) -> Result<(), StorageError> {
        let old = self
            .alarms()?
            .get((num, name))?
            .map(|v| decode::<AlarmRecord>("alarm", v.value()))
            .transpose()?;
        if let Some(old) = old {
            self.alarm_due()?.remove((old.next_due_ms, num, name))?;
        }
        match rec {
            Some(r) => {
                self.alarms()?.insert((num, name), encode(r).as_slice())?;
                self.alarm_due()?.insert((r.next_due_ms, num, name), ())?;
            }
            None => {
                self.alarms()?.remove((num, name))?;
            }
        }
        Ok(())
    }

    pub(super) fn put_type(
        &mut self,
        record: &TypeRecord,
        code: Option<(u32, Vec<u8>)>,
    ) -> Result<(), StorageError> {
        self.types()?
            .insert(record.name.as_str(), encode_type(record).as_slice())?;
        if let Some((version, bytes)) = code {
            let name = record.name.as_str();
            self.code()?.insert((name, version), bytes.as_slice())?;
            // Turns run the latest version only (an actor on an older one
            // is upgraded first), so older code is never read again. The
            // one before stays for a turn that chose it just before this
            // deploy and loads it now; every older one goes. Each deploy
            // kept its code for good: a type deployed from CI grew the data
            // directory by its whole component every time.
            let mut stale = Vec::new();
            for row in self
                .code()?
                .range((name, 0)..(name, version.saturating_sub(1)))?
            {
                stale.push(row?.0.value().1);
            }
            for v in stale {
                self.code()?.remove((name, v))?;
            }
        }
        Ok(())
    }

    pub(super) fn delete_type(
        &mut self,
        name: &str,
        with_actors: bool,
    ) -> Result<Result<u64, u64>, StorageError> {
        let mut deleted = 0;
        if !with_actors {
            // Counted in the deleting commit: an actor made (or handed
            // over) since the caller counted is seen here, and the delete
            // refused; it was deleted with the type, unasked (a probe).
            let mut left = 0;
            for row in self.actors()?.range((name, "")..)? {
                if row?.0.value().0 != name {
                    break;
                }
                left += 1;
            }
            if left > 0 {
                return Ok(Err(left));
            }
        }
        if with_actors {
            let mut ids = Vec::new();
            for row in self.actors()?.range((name, "")..)? {
                let (k, _) = row?;
                let (ty, id) = k.value();
                if ty != name {
                    break;
                }
                ids.push(id.to_owned());
            }
            for id in ids {
                if self.delete_actor(&ActorKey::new_unchecked(name, &id))? {
                    deleted += 1;
                }
            }
        }
        let mut versions = Vec::new();
        for row in self.code()?.range((name, 0)..=(name, u32::MAX))? {
            versions.push(row?.0.value().1);
        }
        for v in versions {
            self.code()?.remove((name, v))?;
        }
        self.type_file_usage()?.remove(name)?;
        self.type_usage()?.remove(name)?;
        self.types()?.remove(name)?;
        Ok(Ok(deleted))
    }

    pub(super) fn sweep_idempotency(&mut self, now_ms: u64) -> Result<u64, StorageError> {
        let mut expired: Vec<(u64, u64, String)> = Vec::new();
        for row in self.idem_expiry()?.range((0, 0, "")..(now_ms, 0, ""))? {
            let (k, _) = row?;
            let (at, num, key) = k.value();
            expired.push((at, num, key.to_owned()));
            if expired.len() >= 10_000 {
                break;
            }
        }
        let mut removed = 0;
        for (at, num, key) in &expired {
            self.idem_expiry()?.remove((*at, *num, key.as_str()))?;
            // Only remove the record if it still carries this expiry (a
            // newer record for the same key has a later one).
            let current = self
                .idempotency()?
                .get((*num, key.as_str()))?
                .map(|v| decode::<IdemRecord>("idempotency", v.value()))
                .transpose()?;
            if current.is_some_and(|r| r.expires_at_ms == *at) {
                self.idempotency()?.remove((*num, key.as_str()))?;
                removed += 1;
            }
        }
        Ok(removed)
    }

    /// Remove an actor and every row it owns. Returns whether it existed.
    pub(super) fn delete_actor(&mut self, key: &ActorKey) -> Result<bool, StorageError> {
        let rec: ActorRecord = {
            let Some(v) = self.actors()?.remove((key.ty(), key.id()))? else {
                return Ok(false);
            };
            decode("actor", v.value())?
        };
        let num = rec.num;
        self.actor_keys()?.remove(num)?;
        self.actor_usage()?.remove(num)?;
        for k in string_keys(&*self.state()?, num)? {
            self.state()?.remove((num, k.as_str()))?;
        }
        for k in string_keys(&*self.idempotency()?, num)? {
            self.idempotency()?.remove((num, k.as_str()))?;
        }
        for name in string_keys(&*self.alarms()?, num)? {
            self.write_alarm(num, &name, None)?;
        }
        // Rows and index go without reading a record (one that did not
        // decode would keep the actor from being deleted).
        for id in string_keys(&*self.inputs()?, num)? {
            self.inputs()?.remove((num, id.as_str()))?;
        }
        let mut indexed = Vec::new();
        for row in self.inputs_by_settled()?.range((num, 0, "")..)? {
            let (k, _) = row?;
            let (n, at, id) = k.value();
            if n != num {
                break;
            }
            indexed.push((at, id.to_owned()));
        }
        for (at, id) in indexed {
            self.inputs_by_settled()?.remove((num, at, id.as_str()))?;
        }
        let paths: Vec<(String, Option<FileRecord>)> = string_keys(&*self.files()?, num)?
            .into_iter()
            .map(|p| (p, None))
            .collect();
        if !paths.is_empty() {
            self.write_files(num, key.ty(), &paths)?;
        }
        for s in seqs(&*self.events()?, num, u64::MAX)? {
            self.events()?.remove((num, s))?;
        }
        for s in seqs(&*self.inbox()?, num, u64::MAX)? {
            self.inbox()?.remove((num, s))?;
        }
        Ok(true)
    }
}

/// Seqs of actor `num` below `below` in an `(actor, seq)` table.
fn seqs(
    t: &redb::Table<'_, (u64, u64), &'static [u8]>,
    num: u64,
    below: u64,
) -> Result<Vec<u64>, StorageError> {
    let mut v = Vec::new();
    for row in t.range((num, 0)..(num, below))? {
        v.push(row?.0.value().1);
    }
    if below == u64::MAX && t.get((num, u64::MAX))?.is_some() {
        v.push(u64::MAX);
    }
    Ok(v)
}

/// Keys of actor `num` in an `(actor, key)` table.
fn string_keys(
    t: &redb::Table<'_, (u64, &'static str), &'static [u8]>,
    num: u64,
) -> Result<Vec<String>, StorageError> {
    let mut v = Vec::new();
    for row in t.range((num, "")..)? {
        let (k, _) = row?;
        let (n, key) = k.value();
        if n != num {
            break;
        }
        v.push(key.to_owned());
    }
    Ok(v)
}
