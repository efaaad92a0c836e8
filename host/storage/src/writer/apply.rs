//! How each [`WriteOp`] is applied inside the batch's transaction.

use marmot_core::clock::now_ms;
use marmot_core::ids::ActorKey;
use redb::ReadableTable;

use super::WriterState;
use super::ops::{Applied, EnqueueOutcome, Reply, TurnCommit, WriteOp};
use super::replica::{Placement, turn_op};
use super::tables::Tables;
use super::tracker::CommitFailed;
use crate::LOG_TARGET;
use crate::schema::*;
use crate::{StorageError, decode_type};

impl WriterState {
    pub(super) fn apply(
        &mut self,
        tables: &mut Tables<'_>,
        op: WriteOp,
        created: &mut i64,
    ) -> (Applied, Result<(), StorageError>) {
        fn done<T: Send + 'static>(
            reply: Reply<T>,
            r: Result<T, StorageError>,
        ) -> (Applied, Result<(), StorageError>) {
            match r {
                Ok(v) => (Applied::reply(reply, Ok(v)), Ok(())),
                Err(e) => {
                    let msg = e.to_string();
                    (
                        Applied::reply(
                            reply,
                            Err(StorageError::CommitFailed(CommitFailed::Storage(msg))),
                        ),
                        Err(e),
                    )
                }
            }
        }
        if let Some(key) = op.actor() {
            let placement = self.placement(key);
            if let Some(why) = refusal(placement) {
                // Refused; the rest of the batch goes on.
                let what = format!("actor {key} {why}");
                let elsewhere = matches!(placement, Placement::Elsewhere);
                return (Applied::refuse(op, &what, elsewhere), Ok(()));
            }
        }
        match op {
            WriteOp::Turn(t) => self.apply_turn(tables, *t, created),
            WriteOp::GetOrCreate {
                key,
                version,
                early: Some(fence),
                done: d,
            } => match self.create(tables, &key, version, created) {
                Ok(rec) => {
                    let _ = d.send(Ok(rec));
                    (Applied::Answered(fence), Ok(()))
                }
                Err(e) => {
                    fence.fail(&CommitFailed::Storage(e.to_string()));
                    done(d, Err(e))
                }
            },
            WriteOp::GetOrCreate {
                key,
                version,
                early: None,
                done: d,
            } => {
                let r = self.create(tables, &key, version, created);
                done(d, r)
            }
            WriteOp::Enqueue {
                key,
                version,
                message,
                idempotency_ttl_ms,
                done: d,
            } => {
                let replicated = matches!(self.placement(&key), Placement::Replicated { .. });
                let copy = replicated.then(|| message.clone());
                let r = self
                    .create(tables, &key, version, created)
                    .and_then(|rec| self.enqueue(tables, rec.num, message, idempotency_ttl_ms));
                if let (Ok(EnqueueOutcome::Queued { message_id }), Some(message)) = (&r, copy) {
                    let idempotency = message.idempotency_key.as_ref().map(|_| IdemRecord {
                        outcome: IdemOutcome::Queued {
                            message_id: message_id.clone(),
                        },
                        expires_at_ms: message.enqueued_at_ms.saturating_add(idempotency_ttl_ms),
                        request_sha256: message.request_fingerprint(),
                    });
                    let seq = self.next_inbox_seq - 1;
                    self.record(&key, || ReplicaOp::Enqueue {
                        actor_type: key.ty().to_owned(),
                        actor_id: key.id().to_owned(),
                        seq,
                        message,
                        idempotency,
                    });
                }
                done(d, r)
            }
            WriteOp::DeleteActor { key, done: d } => {
                let r = tables.delete_actor(&key);
                if let Ok(true) = r {
                    *created -= 1;
                    self.record(&key, || ReplicaOp::Delete {
                        actor_type: key.ty().to_owned(),
                        actor_id: key.id().to_owned(),
                    });
                }
                done(d, r)
            }
            WriteOp::PutType {
                record,
                code,
                done: d,
            } => done(d, tables.put_type(&record, code)),
            WriteOp::DeleteType {
                name,
                with_actors,
                done: d,
            } => {
                let r = tables.delete_type(&name, with_actors);
                if let Ok(Ok(n)) = r {
                    *created -= n as i64;
                }
                done(d, r)
            }
            WriteOp::SweepIdempotency { now_ms, done: d } => {
                done(d, tables.sweep_idempotency(now_ms))
            }
            WriteOp::PruneDeadDeliveries {
                created_before_ms,
                done: d,
            } => {
                let r = self.prune_dead_deliveries(tables, created_before_ms);
                done(d, r)
            }
            WriteOp::PutSubscription {
                name,
                record,
                done: d,
            } => {
                let r = tables.subscriptions().and_then(|t| {
                    t.insert(name.as_str(), encode(&record).as_slice())
                        .map(|old| old.is_none())
                        .map_err(StorageError::from)
                });
                if r.is_ok() {
                    self.subscriptions.set(&name, Some(record));
                    self.subscriptions_touched = true;
                }
                done(d, r)
            }
            WriteOp::DeleteSubscription { name, done: d } => {
                let r = tables
                    .subscriptions()
                    .and_then(|t| {
                        t.remove(name.as_str())
                            .map(|old| old.is_some())
                            .map_err(StorageError::from)
                    })
                    // Its deliveries, pending and dead, go with it: a new
                    // subscription that takes the name is not their
                    // destination (they used to be sent to it).
                    .and_then(|existed| {
                        self.drop_deliveries_of(tables, &name)?;
                        Ok(existed)
                    });
                if r.is_ok() {
                    self.subscriptions.set(&name, None);
                    self.subscriptions_touched = true;
                }
                done(d, r)
            }
            WriteOp::DeliveryAttempted {
                seq,
                update,
                read_as,
                done: d,
            } => {
                let r = self.delivery_attempted(tables, seq, update, read_as);
                done(d, r)
            }
            WriteOp::PutSecret {
                name,
                record,
                done: d,
            } => done(d, tables.put_secret(&name, record.as_ref())),
            WriteOp::PutProvider {
                name,
                record,
                done: d,
            } => done(d, tables.put_provider(&name, record.as_ref())),
            WriteOp::RevokeToken {
                jti,
                expires_at_ms,
                now_ms,
                done: d,
            } => done(d, tables.revoke_token(&jti, expires_at_ms, now_ms)),
            WriteOp::RecordUsage {
                key,
                num,
                usage,
                done: d,
            } => {
                let r = tables.add_usage(num, key.ty(), usage);
                self.record(&key, || ReplicaOp::Usage {
                    actor_type: key.ty().to_owned(),
                    actor_id: key.id().to_owned(),
                    usage,
                });
                done(d, r)
            }
            WriteOp::RecordStats {
                key,
                turns,
                last_turn_at_ms,
                done: d,
            } => done(d, tables.raise_stats(&key, turns, last_turn_at_ms)),
            WriteOp::Replica {
                batch,
                accept,
                done: d,
            } => {
                let r = self.apply_replica(tables, &batch, accept.as_ref(), created);
                match done(d, r) {
                    (Applied::Reply(f), r) => (Applied::Durable(f), r),
                    other => other,
                }
            }
            WriteOp::Snapshot { slots, done: d } => {
                let r = self.snapshot(tables, &slots);
                done(d, r)
            }
            WriteOp::ReadImage { key, done: d } => {
                let r = self.read_image(tables, &key);
                done(d, r)
            }
            WriteOp::MoveIn {
                image,
                slot,
                done: d,
            } => {
                let why = refusal(self.slot_placement(slot)).or_else(|| {
                    self.awaiting_snapshot(slot)
                        .then_some("has a new backup waiting for its snapshot; retry")
                });
                if let Some(why) = why {
                    let why = format!("slot {slot} {why}; the move was refused");
                    return (
                        Applied::reply(d, Err(StorageError::Unavailable(why))),
                        Ok(()),
                    );
                }
                let r = self.move_in(tables, &image, slot, created);
                done(d, r)
            }
            WriteOp::MoveOut {
                key,
                from,
                to,
                done: d,
            } => {
                let r = self.move_out(tables, &key, from, to, created);
                done(d, r)
            }
            WriteOp::DropStale {
                key,
                slot,
                created_at_ms,
                done: d,
            } => {
                // Refused without failing the batch's other writes.
                if matches!(self.slot_placement(slot), Placement::Elsewhere) {
                    let why =
                        format!("slot {slot} belongs to another node now; the copy of {key} stays");
                    return (
                        Applied::reply(d, Err(StorageError::Unavailable(why))),
                        Ok(()),
                    );
                }
                let r = self.drop_stale(tables, &key, slot, created_at_ms, created);
                done(d, r)
            }
            WriteOp::RelayDone { seqs, done: d } => {
                let r = self.relay_done(tables, &seqs);
                done(d, r)
            }
            WriteOp::RetryDelivery { id, done: d } => {
                let r = self.retry_delivery(tables, &id);
                done(d, r)
            }
            #[cfg(test)]
            WriteOp::Hold { until } => {
                let _ = until.recv();
                (Applied::Reply(Box::new(|_| {})), Ok(()))
            }
            WriteOp::Barrier { done } => (
                Applied::Reply(Box::new(move |_| {
                    let _ = done.send(());
                })),
                Ok(()),
            ),
        }
    }

    fn apply_turn(
        &mut self,
        tables: &mut Tables<'_>,
        t: TurnCommit,
        created: &mut i64,
    ) -> (Applied, Result<(), StorageError>) {
        if t.generation < t.tracker.min_generation() {
            // Why its generation was refused: an earlier commit's failure,
            // the actor's rows moving away (`Moved`, which routing sends on
            // to where the actor went), or its type's deletion.
            let why = match t.tracker.failure() {
                why @ (CommitFailed::Moved(_) | CommitFailed::TypeDeleted(_)) => why,
                _ => CommitFailed::Superseded,
            };
            return (Applied::Refused(t.on_durable, why), Ok(()));
        }
        let current = self.is_current(tables, &t);
        if let Ok(false) = current {
            // The instance outlived its rows (they moved away and back, or
            // were replaced by a snapshot): nothing of it is written, and
            // sent on, the request meets the actor as it is now.
            let why = CommitFailed::rows_moved();
            t.tracker.mark_failed(t.generation, &why);
            return (Applied::Refused(t.on_durable, why), Ok(()));
        }
        let r = current
            .and_then(|_| tables.write_turn(&t, created))
            .and_then(|()| self.write_outbox(tables, &t))
            .map(|()| self.record(&t.key, || turn_op(&t)))
            .and_then(|()| {
                if t.relay_sends {
                    return self.relay(tables, &t.key, &t.sends);
                }
                for (key, message) in &t.sends {
                    // The type was checked at send time but may have been
                    // deleted since: drop the message rather than create an
                    // actor of a type that no longer exists.
                    let ty = match tables.types()?.get(key.ty())? {
                        Some(v) => decode_type(v.value())?,
                        None => {
                            tracing::warn!(target: LOG_TARGET, from = %t.key, to = %key,
                                "message to an actor of a deleted type dropped");
                            continue;
                        }
                    };
                    let version = ty.latest().version;
                    let rec = self.get_or_create(tables, key, version, created)?;
                    self.enqueue(tables, rec.num, message.clone(), 0)?;
                }
                Ok(())
            });
        let applied = Applied::Turn {
            tracker: t.tracker,
            generation: t.generation,
            seq: t.seq,
            on_durable: t.on_durable,
        };
        (applied, r)
    }

    /// Whether `t` was computed on the actor's current rows. In a cluster
    /// an actor's rows can be replaced underneath an active instance (moved
    /// away and back, a slot's snapshot installed, both renumbering them):
    /// a turn computed on the old rows must not land on a dead number.
    fn is_current(&self, tables: &mut Tables<'_>, t: &TurnCommit) -> Result<bool, StorageError> {
        if self.replication.get().is_none() {
            return Ok(true);
        }
        Ok(match tables.current_num(&t.key)? {
            Some(num) => num == t.num,
            // Its first commit creates it.
            None => t.record.is_some(),
        })
    }

    /// Queue `sends` for the relay, each with an idempotency key derived
    /// from its message id so that handing it over twice queues it once.
    fn relay(
        &mut self,
        tables: &mut Tables<'_>,
        from: &ActorKey,
        sends: &[(ActorKey, InboxRecord)],
    ) -> Result<(), StorageError> {
        for (key, message) in sends {
            let mut message = message.clone();
            message.idempotency_key = Some(format!("relay-{}", message.message_id));
            let rec = RelayRecord {
                actor_type: key.ty().to_owned(),
                actor_id: key.id().to_owned(),
                message,
                from: Some((from.ty().to_owned(), from.id().to_owned())),
            };
            self.add_relay(tables, from, rec)?;
        }
        Ok(())
    }

    /// [`Self::get_or_create`], recorded for the backup when new.
    fn create(
        &mut self,
        tables: &mut Tables<'_>,
        key: &ActorKey,
        version: u32,
        created: &mut i64,
    ) -> Result<ActorRecord, StorageError> {
        let before = *created;
        let rec = self.get_or_create(tables, key, version, created)?;
        if *created != before {
            self.record(key, || ReplicaOp::Create {
                actor_type: key.ty().to_owned(),
                actor_id: key.id().to_owned(),
                version,
                created_at_ms: rec.created_at_ms,
            });
        }
        Ok(rec)
    }

    pub(super) fn get_or_create(
        &mut self,
        tables: &mut Tables<'_>,
        key: &ActorKey,
        version: u32,
        created: &mut i64,
    ) -> Result<ActorRecord, StorageError> {
        self.get_or_create_at(tables, key, version, now_ms(), created)
    }

    /// [`Self::get_or_create`], a new actor created at `at_ms` (a backup
    /// keeps the owner's creation time: it names the copy).
    pub(super) fn get_or_create_at(
        &mut self,
        tables: &mut Tables<'_>,
        key: &ActorKey,
        version: u32,
        at_ms: u64,
        created: &mut i64,
    ) -> Result<ActorRecord, StorageError> {
        if let Some(v) = tables.actors()?.get((key.ty(), key.id()))? {
            return Ok(decode("actor", v.value())?);
        }
        let rec = ActorRecord::new(self.next_num, at_ms, version);
        self.next_num += 1;
        tables
            .actors()?
            .insert((key.ty(), key.id()), encode(&rec).as_slice())?;
        tables.actor_keys()?.insert(rec.num, (key.ty(), key.id()))?;
        *created += 1;
        Ok(rec)
    }

    /// Outbox rows for the events of a turn that subscriptions want, in the
    /// turn's transaction: an event commits if and only if its deliveries do.
    fn write_outbox(
        &mut self,
        tables: &mut Tables<'_>,
        t: &TurnCommit,
    ) -> Result<(), StorageError> {
        if t.events.is_empty() {
            return Ok(());
        }
        let subs = self.subscriptions.snapshot();
        if subs.is_empty() {
            return Ok(());
        }
        for (seq, ev) in &t.events {
            let mut payload = None;
            for (name, sub) in subs.iter() {
                if !sub.matches(t.key.ty(), &ev.kind) {
                    continue;
                }
                let payload = payload
                    .get_or_insert_with(|| event_payload(&t.key, *seq, ev))
                    .clone();
                let dseq = self.next_delivery_seq;
                self.next_delivery_seq += 1;
                let rec = DeliveryRecord {
                    subscription: name.clone(),
                    webhook_id: delivery_id(dseq),
                    actor_type: t.key.ty().to_owned(),
                    actor_id: t.key.id().to_owned(),
                    event_seq: *seq,
                    kind: ev.kind.clone(),
                    payload,
                    created_at_ms: ev.at_ms,
                    attempts: 0,
                    next_attempt_ms: ev.at_ms,
                    last_error: None,
                    status: DeliveryStatus::Pending,
                    traceparent: t.traceparent.clone(),
                };
                self.add_delivery(tables, dseq, rec)?;
            }
        }
        Ok(())
    }

    fn enqueue(
        &mut self,
        tables: &mut Tables<'_>,
        num: u64,
        message: InboxRecord,
        ttl_ms: u64,
    ) -> Result<EnqueueOutcome, StorageError> {
        if let Some(key) = &message.idempotency_key {
            let existing = match tables.idempotency()?.get((num, key.as_str()))? {
                Some(v) => Some(decode::<IdemRecord>("idempotency", v.value())?),
                None => None,
            };
            let request = message.request_fingerprint();
            let binding = existing.filter(|r| {
                r.expires_at_ms > message.enqueued_at_ms && !r.outcome.redelivery_runs(&message)
            });
            if let Some(rec) = binding {
                return Ok(EnqueueOutcome::Duplicate {
                    same_request: !rec.refuses(request.as_ref()),
                    message_id: rec.outcome.into_message_id(),
                });
            }
            let rec = IdemRecord {
                outcome: IdemOutcome::Queued {
                    message_id: message.message_id.clone(),
                },
                expires_at_ms: message.enqueued_at_ms.saturating_add(ttl_ms),
                request_sha256: request,
            };
            tables
                .idempotency()?
                .insert((num, key.as_str()), encode(&rec).as_slice())?;
            tables
                .idem_expiry()?
                .insert((rec.expires_at_ms, num, key.as_str()), ())?;
        }
        let seq = self.next_inbox_seq;
        self.next_inbox_seq += 1;
        tables
            .inbox()?
            .insert((num, seq), encode(&message).as_slice())?;
        Ok(EnqueueOutcome::Queued {
            message_id: message.message_id,
        })
    }
}

/// Why writes placed at `p` are refused here, if they are.
fn refusal(p: Placement) -> Option<&'static str> {
    match p {
        Placement::Elsewhere => Some("belongs to another node now"),
        Placement::NoBackup => Some("has no backup, and the cluster refuses writes without one"),
        _ => None,
    }
}

/// The body of a delivery: Standard Webhooks' `{type, timestamp, data}`,
/// built once at commit so every attempt sends the same bytes. The event's
/// data goes in as stored, at any depth (parsed into a `serde_json::Value`,
/// data nested past 128 levels went out as `null`, for good: a probe).
fn event_payload(key: &ActorKey, seq: u64, ev: &EventRecord) -> Vec<u8> {
    // (Keys in the order they always had.)
    #[derive(serde::Serialize)]
    struct Body<'a> {
        data: Data<'a>,
        timestamp: String,
        #[serde(rename = "type")]
        kind: &'a str,
    }
    #[derive(serde::Serialize)]
    struct Data<'a> {
        actor_id: &'a str,
        actor_type: &'a str,
        at_ms: u64,
        data: &'a serde_json::value::RawValue,
        kind: &'a str,
        seq: u64,
    }
    let timestamp = chrono::DateTime::from_timestamp_millis(ev.at_ms as i64)
        .map(|t| t.to_rfc3339_opts(chrono::SecondsFormat::Millis, true))
        .unwrap_or_default();
    let body = Body {
        data: Data {
            actor_id: key.id(),
            actor_type: key.ty(),
            at_ms: ev.at_ms,
            data: serde_json::from_slice(&ev.data).unwrap_or(serde_json::value::RawValue::NULL),
            kind: &ev.kind,
            seq,
        },
        timestamp,
        kind: &ev.kind,
    };
    serde_json::to_vec(&body).expect("JSON values serialize")
}
