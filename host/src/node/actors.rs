//! Messages to actors and requests to them: send and wait, enqueue
//! durably, run a script, answer an input request, delete.

use std::sync::Arc;

use bytes::Bytes;

use super::Node;
use crate::actor::{AnswerDelivery, Envelope, EvalReply, TurnError, TurnReply};
use crate::clock::now_ms;
use crate::ids::{ActorKey, new_message_id};
use crate::sandbox::CallChain;
use crate::storage::schema::{InboxKind, InboxRecord};
use crate::storage::{EnqueueOutcome, WriteOp};

impl Node {
    /// Send a message and wait for the reply (released once durable).
    pub async fn send(
        &self,
        key: &ActorKey,
        body: Bytes,
        content_type: Option<String>,
        idempotency_key: Option<String>,
    ) -> Result<TurnReply, TurnError> {
        self.actors
            .send(key, body, content_type, idempotency_key, Arc::from([]))
            .await
    }

    /// [`Self::send`] on behalf of a turn's `actors.call` on another node:
    /// `chain` holds the actors waiting above it, outermost first (the
    /// caller checked the call itself; the chain goes on with any call
    /// this turn makes).
    pub async fn send_in_chain(
        &self,
        key: &ActorKey,
        body: Bytes,
        content_type: Option<String>,
        chain: CallChain,
        call_key: Option<String>,
    ) -> Result<TurnReply, TurnError> {
        self.actors
            .send(key, body, content_type, call_key, chain)
            .await
    }

    /// Durably enqueue a message; returns its id once it is on disk.
    pub async fn enqueue(
        &self,
        key: &ActorKey,
        body: Bytes,
        content_type: Option<String>,
        idempotency_key: Option<String>,
    ) -> Result<EnqueueOutcome, TurnError> {
        let message = InboxRecord {
            message_id: new_message_id(),
            body: body.to_vec(),
            content_type,
            idempotency_key,
            attempts: 0,
            enqueued_at_ms: now_ms(),
            kind: InboxKind::Message,
        };
        let ttl = self.config.limits.idempotency_ttl_ms;
        self.enqueue_record(key, message, ttl).await
    }

    /// Durably queue an inbox row (message or webhook) for `key`, creating
    /// the actor if needed; its idempotency key, if any, lives `ttl_ms`.
    /// A key taken by a message with another body is refused.
    pub(super) async fn enqueue_record(
        &self,
        key: &ActorKey,
        message: InboxRecord,
        ttl_ms: u64,
    ) -> Result<EnqueueOutcome, TurnError> {
        let ty = self
            .catalog
            .get(key.ty())
            .ok_or_else(|| TurnError::UnknownType(key.ty().to_owned()))?;
        let bytes = message.body.len() as u64;
        let admitted = self
            .actors
            .inboxes
            .admit(key, bytes, || self.actors.inbox_on_disk(key));
        let counted = admitted.is_ok();
        if let Err(full) = admitted {
            // A retry of a message already taken (its key, a webhook's id)
            // is answered as the first time, full inbox or not: it was
            // told to retry a message the node held (found by a
            // re-probe). The writer tells the two apart.
            if !self.already_taken(key, &message)? {
                return Err(full);
            }
        }
        let k = key.clone();
        let version = ty.latest_version();
        let outcome = self
            .storage
            .writer()
            .call(|done| WriteOp::Enqueue {
                key: k,
                version,
                message,
                idempotency_ttl_ms: ttl_ms,
                done,
            })
            .await;
        if counted && !matches!(outcome, Ok(EnqueueOutcome::Queued { .. })) {
            self.actors.inboxes.not_queued(key, bytes);
        }
        let outcome = outcome?;
        match &outcome {
            EnqueueOutcome::Queued { .. } => self.actors.poke(key),
            EnqueueOutcome::Duplicate {
                message_id,
                same_request: false,
            } => return Err(TurnError::IdempotencyKeyReused(message_id.clone())),
            EnqueueOutcome::Duplicate { .. } => {}
        }
        Ok(outcome)
    }

    /// Whether `message`'s idempotency key already took a message of
    /// `key`'s (not expired).
    fn already_taken(&self, key: &ActorKey, message: &InboxRecord) -> Result<bool, TurnError> {
        let Some(k) = &message.idempotency_key else {
            return Ok(false);
        };
        let r = self.storage.reader()?;
        let Some(rec) = r.actor(key)? else {
            return Ok(false);
        };
        Ok(r.idempotency(rec.num, k)?
            .is_some_and(|i| i.expires_at_ms > crate::clock::now_ms()))
    }

    /// Run a model-written script in a fresh JavaScript sandbox bound to the
    /// actor's state; its writes commit only if it succeeds.
    pub async fn eval(&self, key: &ActorKey, code: String) -> Result<EvalReply, TurnError> {
        self.actors
            .ask(key, |reply| Envelope::Eval(code, reply))
            .await
    }

    /// Delete an actor and everything it owns. Returns false if it did not exist.
    pub async fn delete_actor(self: &Arc<Self>, key: &ActorKey) -> Result<bool, TurnError> {
        if self.catalog.get(key.ty()).is_none() {
            return Err(TurnError::UnknownType(key.ty().to_owned()));
        }
        if !self.registry().is_active(key) && self.storage.reader()?.actor(key)?.is_none() {
            return Ok(false);
        }
        let deleted = self.actors.delete(key).await?;
        if deleted {
            tracing::info!(actor = %key, "actor deleted");
        }
        if deleted && self.cluster.is_some() {
            // etcd keeps only the placements of actors that exist (the
            // sweep removes an entry this misses); `forget_placement` does
            // nothing for an actor that has none.
            if let Err(e) = self.forget_placement(key).await {
                tracing::warn!(actor = %key, error = %e, "cannot remove a deleted actor's placement entry yet");
            }
        }
        Ok(deleted)
    }

    /// Answer one of an actor's input requests: runs its `on-input` turn and
    /// returns once that is durable.
    pub async fn answer_input(
        &self,
        key: &ActorKey,
        input_id: &str,
        response: Vec<u8>,
    ) -> Result<(), TurnError> {
        // Do not wake an actor that does not exist.
        if self.storage.reader()?.actor(key)?.is_none() {
            return Err(TurnError::NotFound);
        }
        self.actors
            .ask(key, |reply| {
                Envelope::Answer(Box::new(AnswerDelivery {
                    input_id: input_id.to_owned(),
                    response,
                    reply,
                }))
            })
            .await
    }
}
