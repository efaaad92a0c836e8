//! Requests one node makes of another: a turn's `actors.call` to an actor
//! owned elsewhere, the hand-over of a relayed `actors.send`, and the
//! shipping of committed batches to a slot's backup.
//!
//! Calls and sends go through the public API of the node that should serve them, so
//! the receiving node's routing (the epoch check, the first claim of a
//! slot, forwarding when its own view is newer) applies unchanged: a
//! message for an actor of another node goes to that node, and a message
//! for a slot this node owns but has not claimed goes to this node's own
//! API, which claims it first.

use std::sync::Arc;
use std::time::Duration;

use percent_encoding::{NON_ALPHANUMERIC, percent_decode_str, utf8_percent_encode};

use super::TargetKey;
use crate::ids::ActorKey;

/// On a message from a turn's `actors.call`: the actors waiting above the
/// call, outermost first (`type/id` pairs, percent-encoded, comma
/// separated), so that a cycle through several nodes is still refused.
pub const CALL_CHAIN: &str = "x-marmot-call-chain";

/// On a message from a turn's `actors.call`: the call's key (see
/// `sandbox::caps::actors`), stored by the callee after
/// `CALL_KEY_PREFIX`. Like the chain, taken only from nodes.
pub const CALL_KEY: &str = "x-marmot-call-key";

/// On every message a node passes on for a turn (`actors.call`, and the
/// hand-over of a relayed `actors.send`): the body is what a guest sent,
/// which the API takes as it would from a turn on its own node, without
/// the checks it makes of a client's body (`api/actors.rs`). A client
/// that sets it only skips those checks: the guest still reads the body.
pub const FROM_ACTOR: &str = "x-marmot-from-actor";

/// Where a message for an actor goes from this node.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Target {
    /// To the actor here: this node owns its slot and has claimed it.
    Here,
    /// Through the API at this base URL.
    Via(String),
}

/// A reply from an actor on another node.
#[derive(Debug, Clone)]
pub struct PeerReply {
    /// Its status.
    pub status: u16,
    /// Its body.
    pub body: Vec<u8>,
    /// Its content type.
    pub content_type: Option<String>,
}

/// Why a request to another node did not get the actor's answer.
#[derive(Debug, thiserror::Error)]
pub enum PeerError {
    /// The actor's type is not deployed (or the actor does not exist).
    #[error("{0}")]
    NotFound(String),
    /// The node answered with an API error other than 404: its code
    /// (`mailbox_full`, `overloaded`, `actor_error`, …) and message.
    #[error("{message}")]
    Refused {
        /// The API error's code.
        code: String,
        /// What it said, the actor named.
        message: String,
    },
    /// Anything else: the node did not answer, or its answer was not an
    /// API error.
    #[error("{0}")]
    Failed(String),
}

/// The client nodes use to reach each other on behalf of actors.
#[derive(Clone)]
pub struct Peers {
    client: reqwest::Client,
    /// Sent as the bearer token (the admin token: every node has it).
    token: Option<String>,
    /// Signs a target the URL would not keep (an id `.` or `..`).
    targets: Arc<TargetKey>,
}

impl Peers {
    /// A client that authenticates with `token`.
    pub fn new(token: Option<String>) -> Self {
        Self {
            client: client(),
            targets: Arc::new(TargetKey::new(token.as_deref())),
            token,
        }
    }

    fn post(&self, base: &str, key: &ActorKey, query: &str) -> reqwest::RequestBuilder {
        let target = format!(
            "/v1/actors/{}/{}{query}",
            utf8_percent_encode(key.ty(), NON_ALPHANUMERIC),
            utf8_percent_encode(key.id(), NON_ALPHANUMERIC),
        );
        // A URL resolves `%2E%2E` as `..`: the message to actor `..` went
        // to the type's listing instead.
        let mut headers = reqwest::header::HeaderMap::new();
        let url = self
            .targets
            .url(&reqwest::Method::POST, base, &target, &mut headers);
        let req = self
            .client
            .post(url)
            .headers(headers)
            .header(reqwest::header::CONTENT_TYPE, "application/json")
            .header(FROM_ACTOR, "1");
        match &self.token {
            Some(t) => req.bearer_auth(t),
            None => req,
        }
    }

    /// Send `body` to `key` through the API at `base` and wait for its
    /// reply; `chain` holds the actors waiting above the call.
    pub async fn call(
        &self,
        base: &str,
        key: &ActorKey,
        body: Vec<u8>,
        chain: &[ActorKey],
        call_key: Option<&str>,
    ) -> Result<PeerReply, PeerError> {
        let mut req = self
            .post(base, key, "")
            .header(CALL_CHAIN, encode_chain(chain));
        if let Some(k) = call_key {
            req = req.header(CALL_KEY, k);
        }
        let resp = req
            .body(body)
            .send()
            .await
            .map_err(|e| PeerError::Failed(format!("{key}: {e}")))?;
        let status = resp.status();
        // An actor's reply carries its message id; anything else is the
        // API refusing the request.
        let from_actor = resp.headers().contains_key("x-marmot-message-id");
        let content_type = resp
            .headers()
            .get(reqwest::header::CONTENT_TYPE)
            .and_then(|v| v.to_str().ok())
            .map(str::to_owned);
        let body = resp
            .bytes()
            .await
            .map_err(|e| PeerError::Failed(format!("{key}: reading the reply: {e}")))?;
        if from_actor {
            return Ok(PeerReply {
                status: status.as_u16(),
                body: body.to_vec(),
                content_type,
            });
        }
        Err(refusal(key, status, &body))
    }

    /// Queue `body` for `key` durably through the API at `base`, under
    /// `idempotency_key` (a repeat is answered as a duplicate and queued
    /// once).
    pub async fn enqueue(
        &self,
        base: &str,
        key: &ActorKey,
        body: Vec<u8>,
        idempotency_key: &str,
    ) -> Result<(), PeerError> {
        let resp = self
            .post(base, key, "?wait=false")
            .header("idempotency-key", idempotency_key)
            .timeout(Duration::from_secs(10))
            .body(body)
            .send()
            .await
            .map_err(|e| PeerError::Failed(format!("{key}: {e}")))?;
        let status = resp.status();
        if status.is_success() {
            return Ok(());
        }
        let body = resp.bytes().await.unwrap_or_default();
        Err(refusal(key, status, &body))
    }
    /// Hand an actor's rows (a `MoveIn`, postcard) to the owner of its new
    /// slot at `base`, which answers once they are durable there and on
    /// its backup.
    pub async fn move_in(&self, base: &str, body: Vec<u8>) -> Result<(), PeerError> {
        self.internal(base, "/v1/cluster/move-in", body, Duration::from_secs(30))
            .await
            .map(drop)
    }

    /// Ask the node at `base` which copy of an actor it keeps, or have it
    /// drop that copy (postcard `DropCopy`); its JSON answer.
    pub async fn drop_copy(
        &self,
        base: &str,
        body: Vec<u8>,
    ) -> Result<serde_json::Value, PeerError> {
        let resp = self
            .internal(base, "/v1/cluster/drop-copy", body, Duration::from_secs(10))
            .await?;
        resp.json()
            .await
            .map_err(|e| PeerError::Failed(format!("{base}: {e}")))
    }

    /// Ship replicated batches (postcard) to the backup at `base`; its
    /// outcome per batch, in order (`applied`, `repeat`, `refused`,
    /// `gap`).
    pub async fn replicate(&self, base: &str, body: Vec<u8>) -> Result<Vec<String>, PeerError> {
        let timeout = replicate_timeout(body.len());
        let resp = self
            .internal(base, "/v1/cluster/replicate", body, timeout)
            .await?;
        let v: serde_json::Value = resp
            .json()
            .await
            .map_err(|e| PeerError::Failed(format!("{base}: {e}")))?;
        Ok(v["outcomes"]
            .as_array()
            .into_iter()
            .flatten()
            .map(|o| o.as_str().unwrap_or_default().to_owned())
            .collect())
    }

    /// Which of the blobs `shas` names the node at `base` lacks; it holds
    /// the others for the rows about to name them.
    pub async fn blobs_missing(
        &self,
        base: &str,
        shas: &[[u8; 32]],
    ) -> Result<Vec<[u8; 32]>, PeerError> {
        let body = postcard::to_stdvec(shas).map_err(|e| PeerError::Failed(e.to_string()))?;
        let resp = self
            .internal(
                base,
                "/v1/cluster/blobs/missing",
                body,
                Duration::from_secs(10),
            )
            .await?;
        let bytes = resp
            .bytes()
            .await
            .map_err(|e| PeerError::Failed(format!("{base}: {e}")))?;
        postcard::from_bytes(&bytes).map_err(|e| PeerError::Failed(format!("{base}: {e}")))
    }

    /// Hand blobs (postcard `[(sha, bytes)]`) to the node at `base` ahead
    /// of the rows that name them; answered once they are durable there.
    pub async fn put_blobs(&self, base: &str, body: Vec<u8>) -> Result<(), PeerError> {
        self.internal(base, "/v1/cluster/blobs", body, Duration::from_secs(60))
            .await
            .map(drop)
    }

    /// `POST` a binary `body` to a node-to-node endpoint; a successful
    /// response, or why not.
    async fn internal(
        &self,
        base: &str,
        path: &str,
        body: Vec<u8>,
        timeout: Duration,
    ) -> Result<reqwest::Response, PeerError> {
        let mut req = self
            .client
            .post(format!("{base}{path}"))
            .header(reqwest::header::CONTENT_TYPE, "application/octet-stream")
            .timeout(timeout)
            .body(body);
        if let Some(t) = &self.token {
            req = req.bearer_auth(t);
        }
        let resp = req
            .send()
            .await
            .map_err(|e| PeerError::Failed(format!("{base}: {e}")))?;
        if !resp.status().is_success() {
            let status = resp.status();
            let body = resp.text().await.unwrap_or_default();
            return Err(PeerError::Failed(format!("{base}: {status}: {body}")));
        }
        Ok(resp)
    }
}

/// The API's refusal of a request for `key`, from its error body.
fn refusal(key: &ActorKey, status: reqwest::StatusCode, body: &[u8]) -> PeerError {
    let error = serde_json::from_slice::<serde_json::Value>(body)
        .ok()
        .map(|mut v| v["error"].take());
    let field = |name: &str| {
        error
            .as_ref()
            .and_then(|e| e[name].as_str())
            .map(str::to_owned)
    };
    let message = field("message").unwrap_or_else(|| String::from_utf8_lossy(body).into_owned());
    match field("code") {
        _ if status == reqwest::StatusCode::NOT_FOUND => PeerError::NotFound(message),
        Some(code) => PeerError::Refused {
            code,
            message: format!("{key}: {status}: {message}"),
        },
        None => PeerError::Failed(format!("{key}: {status}: {message}")),
    }
}

/// The HTTP client nodes use to reach each other.
pub fn client() -> reqwest::Client {
    reqwest::Client::builder()
        .connect_timeout(Duration::from_secs(2))
        // Streams (SSE) stay open as long as the client keeps them. An idle
        // pooled connection is dropped before the peer's own keep-alive
        // timeout (30 s, `api/listen.rs`) would close it under a request.
        .pool_idle_timeout(Duration::from_secs(20))
        .build()
        .expect("a reqwest client with these settings always builds")
}

/// `chain` as the [`CALL_CHAIN`] header's value.
pub fn encode_chain(chain: &[ActorKey]) -> String {
    chain
        .iter()
        .map(|k| {
            format!(
                "{}/{}",
                utf8_percent_encode(k.ty(), NON_ALPHANUMERIC),
                utf8_percent_encode(k.id(), NON_ALPHANUMERIC)
            )
        })
        .collect::<Vec<_>>()
        .join(",")
}

/// A [`CALL_CHAIN`] header's actors; `None` if any part is not an actor.
pub fn decode_chain(value: &str) -> Option<Vec<ActorKey>> {
    if value.is_empty() {
        return Some(Vec::new());
    }
    value
        .split(',')
        .map(|part| {
            let (ty, id) = part.split_once('/')?;
            let ty = percent_decode_str(ty).decode_utf8().ok()?;
            let id = percent_decode_str(id).decode_utf8().ok()?;
            ActorKey::new(&ty, &id).ok()
        })
        .collect()
}

/// Replication requests smaller than this are quick: they get
/// [`QUICK_TIMEOUT`].
const QUICK_BYTES: usize = 1 << 20;
/// How long a quick replication request may take: as long as the owner
/// waits for a failing backup, which counts a backup that leaves one
/// unanswered as failing since it was sent. With 5 s for every request, a
/// backup that hung (paused, cut off) held every commit of its owner for
/// 5 s of timeout before the 3 s even began: 8 s (found by a cluster
/// probe).
const QUICK_TIMEOUT: Duration = super::replication::DROP_AFTER;

/// Whether a replication request of `bytes` is quick.
pub(super) fn quick_request(bytes: usize) -> bool {
    bytes < QUICK_BYTES
}

/// How long a replication request of `bytes` may take: 3 s if it is
/// quick, else 5 s as before (up to 16 MiB: slow links are not made to
/// fail by a tighter rate).
pub(super) fn replicate_timeout(bytes: usize) -> Duration {
    match quick_request(bytes) {
        true => QUICK_TIMEOUT,
        false => Duration::from_secs(5),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A peer's API error keeps its code, so that a caller on another node
    /// learns what one on the callee's node would (a full mailbox is not
    /// a broken callee); only a 404 is `NotFound`, and an answer that is
    /// no API error (a proxy's page) is a plain failure.
    #[test]
    fn a_peers_refusal_keeps_its_code() {
        use reqwest::StatusCode;
        let key = ActorKey::new("kit", "a").unwrap();
        let body = |code: &str| {
            serde_json::json!({"error": {"code": code, "message": "said so"}})
                .to_string()
                .into_bytes()
        };
        match refusal(&key, StatusCode::TOO_MANY_REQUESTS, &body("mailbox_full")) {
            PeerError::Refused { code, message } => {
                assert_eq!(code, "mailbox_full");
                assert_eq!(message, "kit/a: 429 Too Many Requests: said so");
            }
            e => panic!("{e:?}"),
        }
        assert!(matches!(
            refusal(&key, StatusCode::NOT_FOUND, &body("unknown_type")),
            PeerError::NotFound(m) if m == "said so"
        ));
        assert!(matches!(
            refusal(&key, StatusCode::BAD_GATEWAY, b"<html>bad gateway</html>"),
            PeerError::Failed(m) if m.contains("<html>bad gateway</html>")
        ));
    }

    /// Messages a node passes on for a turn say so: the API skips the
    /// checks it makes of a client's body for them (a relayed send it
    /// refused would be retried for ever).
    #[test]
    fn messages_passed_on_for_a_turn_say_they_come_from_an_actor() {
        let peers = Peers::new(Some("token".into()));
        let key = ActorKey::new("kit", "a").unwrap();
        for query in ["", "?wait=false"] {
            let req = peers
                .post("http://127.0.0.1:1", &key, query)
                .build()
                .unwrap();
            assert_eq!(req.headers()[FROM_ACTOR], "1");
        }
    }

    /// A quick replication request waits as long as the owner waits for a
    /// failing backup; a large one, 5 s as before.
    #[test]
    fn replication_requests_wait_by_their_size() {
        assert_eq!(
            replicate_timeout(300),
            super::super::replication::DROP_AFTER
        );
        assert!(quick_request((1 << 20) - 1) && !quick_request(1 << 20));
        assert_eq!(replicate_timeout(16 << 20), Duration::from_secs(5));
    }

    #[test]
    fn a_call_chain_survives_its_header() {
        let chain = vec![
            ActorKey::new("kit", "a/b,c").unwrap(),
            ActorKey::new("agent", "ünï cödé").unwrap(),
        ];
        let header = encode_chain(&chain);
        assert!(header.is_ascii());
        assert_eq!(decode_chain(&header), Some(chain));
        assert_eq!(decode_chain(""), Some(Vec::new()));
        assert_eq!(decode_chain("kit"), None);
        assert_eq!(decode_chain("kit/a,%FF/b"), None);
    }
}
