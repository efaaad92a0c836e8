//! Webhooks out: subscriptions and the delivery worker.
//!
//! A subscription names a URL, the event kinds it wants (`*`, `order.*`,
//! exact kinds), optionally actor types, and a signing secret. When a turn
//! commits events, the storage writer adds one outbox row per matching
//! (event, subscription) *in the same transaction*, so an event is delivered
//! if and only if it committed. The row holds the exact body and a
//! `webhook-id` that every attempt reuses.
//!
//! The worker here sends due rows: signed per Standard Webhooks, at most
//! `webhooks.concurrency` at once and `webhooks.per_destination` per host,
//! with timeouts and a capped read of the response. A 2xx deletes the row;
//! anything else reschedules it (exponential back-off with jitter) until
//! `max_attempts`, after which it is dead: kept, listed, and replayable with
//! `POST /v1/deliveries/{id}/retry`. A 410 Gone kills it at once. The outcome
//! of an attempt is durable before the row can be picked again, so a crash
//! at any point means at most a repeat of the same `webhook-id`.
//!
//! In a cluster the rows, and each attempt's outcome, are replicated to the
//! backup of the emitting actor's slot; only the slot's owner delivers
//! (`Writer::sends_for`), so after a failover or a move the new owner goes
//! on where the old one stopped. An attempt in flight when the slot changed
//! hands may be repeated by the new owner, with the same `webhook-id`.

use std::collections::{HashMap, HashSet};
use std::ops::ControlFlow;
use std::sync::Arc;
use std::time::Duration;
use tracing::Instrument as _;

use tokio::sync::mpsc;

use crate::clock::now_ms;
use crate::config::WebhooksConfig;
use crate::metrics::{HookLabels, Metrics};
use crate::storage::schema::{DeliveryRecord, DeliveryStatus, SubscriptionRecord};
use crate::storage::{Storage, StorageError, WriteOp};

/// Environment variable that overrides `webhooks.retry_base_ms`.
pub const RETRY_BASE_ENV: &str = "MARMOT_WEBHOOK_RETRY_BASE_MS";
/// Entries a subscription's `events` or `types` may list.
const MAX_FILTER: usize = 256;
/// Response bytes kept for `last_error`.
const MAX_ERROR_BODY: usize = 1024;
/// Due rows read per pass at most (a pass that stops short continues
/// there the next time).
const EXAMINE: usize = 4096;
/// Walks one wake-up may take (a sweep of this many times `EXAMINE` rows).
const MAX_PASSES: u32 = 16;

/// The retry schedule.
#[derive(Debug, Clone, Copy)]
pub struct Schedule {
    /// First delay.
    pub base_ms: u64,
    /// Longest delay.
    pub max_delay_ms: u64,
    /// Attempts before dead.
    pub max_attempts: u32,
}

impl Schedule {
    /// The delay after failed attempt `attempt` (1-based) without jitter.
    pub fn nominal_delay_ms(&self, attempt: u32) -> u64 {
        self.base_ms
            .saturating_mul(1u64 << attempt.saturating_sub(1).min(40))
            .min(self.max_delay_ms)
    }

    /// The delay with jitter: nominal to nominal + 25 %, so the nominal
    /// schedule is a lower bound on how long a delivery is retried.
    pub fn delay_ms(&self, attempt: u32) -> u64 {
        let nominal = self.nominal_delay_ms(attempt);
        nominal + rand::random_range(0..=nominal / 4)
    }
}

/// What a client asks for with `PUT /v1/subscriptions/{name}`.
#[derive(Debug, Clone, serde::Deserialize)]
#[serde(deny_unknown_fields)]
pub struct SubscriptionSpec {
    /// `http://` or `https://` URL.
    pub url: String,
    /// Event kinds (default: all).
    #[serde(default)]
    pub events: Option<Vec<String>>,
    /// Actor types (default: all).
    #[serde(default)]
    pub types: Vec<String>,
    /// `whsec_…`; generated when absent.
    #[serde(default)]
    pub secret: Option<String>,
}

impl SubscriptionSpec {
    /// Check and turn into a record; the second value is the secret if it
    /// was generated here (to be shown once).
    pub fn into_record(self, now_ms: u64) -> Result<(SubscriptionRecord, Option<String>), String> {
        let url = reqwest::Url::parse(&self.url).map_err(|e| format!("url: {e}"))?;
        if !matches!(url.scheme(), "http" | "https") || url.host_str().is_none() {
            return Err("url must be an http:// or https:// URL with a host".into());
        }
        let events = self.events.unwrap_or_else(|| vec!["*".into()]);
        if events.is_empty() {
            return Err("events must name at least one kind (or `*`)".into());
        }
        if events.len() > MAX_FILTER || self.types.len() > MAX_FILTER {
            return Err(format!(
                "events and types may each list at most {MAX_FILTER} entries (every event is \
                 matched against them as it commits)"
            ));
        }
        for e in &events {
            let body = e.strip_suffix('*').unwrap_or(e);
            if e.is_empty()
                || e.len() > 128
                || body.contains('*')
                || e.chars().any(char::is_control)
            {
                return Err(format!(
                    "event pattern `{e}` must be `*`, a kind, or a kind prefix ending in `*`"
                ));
            }
        }
        for t in &self.types {
            crate::ids::validate_type_name(t).map_err(|e| e.to_string())?;
        }
        let (secret, generated) = match self.secret {
            Some(s) => {
                super::check_secret(&s)?;
                (s, None)
            }
            None => {
                let s = super::new_secret();
                (s.clone(), Some(s))
            }
        };
        Ok((
            SubscriptionRecord {
                url: url.to_string(),
                events,
                types: self.types,
                secret,
                created_at_ms: now_ms,
            },
            generated,
        ))
    }
}

/// A subscription as the API shows it (never its secret).
pub fn subscription_json(name: &str, s: &SubscriptionRecord) -> serde_json::Value {
    serde_json::json!({
        "name": name,
        "url": shown_url(&s.url),
        "events": s.events,
        "types": s.types,
        "created_at_ms": s.created_at_ms,
    })
}

/// A subscription's URL as the API shows it: a password in it (basic
/// auth for the receiver) is replaced with `***`, like the signing secret
/// it is never shown back.
fn shown_url(url: &str) -> String {
    match reqwest::Url::parse(url) {
        Ok(mut u) if u.password().is_some() => {
            let _ = u.set_password(Some("***"));
            u.to_string()
        }
        _ => url.to_owned(),
    }
}

/// A delivery as the API shows it.
pub fn delivery_json(d: &DeliveryRecord) -> serde_json::Value {
    serde_json::json!({
        "id": d.webhook_id,
        "subscription": d.subscription,
        "status": d.label(),
        "actor": { "type": d.actor_type, "id": d.actor_id },
        "event_seq": d.event_seq,
        "kind": d.kind,
        "attempts": d.attempts,
        "next_attempt_ms": (d.status == DeliveryStatus::Pending).then_some(d.next_attempt_ms),
        "last_error": d.last_error,
        "created_at_ms": d.created_at_ms,
    })
}

/// Start the delivery worker: it reads due outbox rows from `storage`,
/// records every attempt there, and counts them in `metrics`.
pub fn start(storage: Arc<Storage>, metrics: Arc<Metrics>, config: WebhooksConfig) {
    tokio::spawn(run(Worker { storage, metrics }, config));
}

/// What a delivery uses.
#[derive(Clone)]
struct Worker {
    storage: Arc<Storage>,
    metrics: Arc<Metrics>,
}

/// `host[:port]` of a URL: with the subscription, the unit of the
/// per-destination limit.
fn destination(url: &str) -> String {
    reqwest::Url::parse(url)
        .ok()
        .and_then(|u| {
            u.host_str()
                .map(|h| format!("{h}:{}", u.port_or_known_default().unwrap_or(0)))
        })
        .unwrap_or_default()
}

async fn run(w: Worker, cfg: WebhooksConfig) {
    let base_ms = match std::env::var(RETRY_BASE_ENV).ok().map(|v| v.trim().parse()) {
        Some(Ok(ms)) => {
            tracing::warn!(
                retry_base_ms = ms,
                "{RETRY_BASE_ENV} overrides the webhook retry base"
            );
            ms
        }
        Some(Err(e)) => {
            tracing::warn!(error = %e, retry_base_ms = cfg.retry_base_ms,
                "{RETRY_BASE_ENV} is not a number of milliseconds; ignored");
            cfg.retry_base_ms
        }
        None => cfg.retry_base_ms,
    };
    let schedule = Schedule {
        base_ms,
        max_delay_ms: cfg.retry_max_delay_ms.max(base_ms),
        max_attempts: cfg.max_attempts.max(1),
    };
    let client = match reqwest::Client::builder()
        .connect_timeout(Duration::from_millis(cfg.connect_timeout_ms))
        .timeout(Duration::from_millis(cfg.timeout_ms))
        .redirect(reqwest::redirect::Policy::none())
        .user_agent(concat!("marmot/", env!("CARGO_PKG_VERSION")))
        .build()
    {
        Ok(c) => c,
        Err(e) => {
            tracing::error!(error = %e, "cannot build the webhook HTTP client; outbound webhooks are off");
            return;
        }
    };
    let ready = w.storage.outbox_ready().clone();
    let (done_tx, mut done_rx) = mpsc::unbounded_channel::<Finished>();
    let mut in_flight: HashSet<u64> = HashSet::new();
    let mut per_dest: HashMap<String, usize> = HashMap::new();
    // Destinations whose last attempt failed, and the attempts in flight
    // to them: each gets one attempt at a time, and all of them together
    // half the slots. Sixteen receivers that hung held all 64 slots for
    // their whole timeout, again and again as their retries came due
    // before anything else, and a healthy receiver's events waited
    // 10–40 s (a probe).
    let mut failing: HashSet<String> = HashSet::new();
    let mut failing_in_flight = 0usize;
    let failing_share = (cfg.concurrency.max(1) / 2).max(1);
    let mut resume = (0, 0);
    // Walks since the last wait.
    let mut passes = 0;
    loop {
        let now = now_ms();
        let writer = w.storage.writer();
        let subs = w.storage.subscriptions().snapshot();
        // (A deleted subscription's destination is forgotten.)
        failing.retain(|d| {
            d.split('\n')
                .next()
                .is_some_and(|name| subs.contains_key(name))
        });
        // Rows of a batch whose backups have not acknowledged it yet wait
        // (the output gate); their release wakes this loop.
        let released = writer
            .released()
            .deliveries
            .load(std::sync::atomic::Ordering::Acquire);
        // Rows whose destination is already at its limit are stepped over,
        // and a walk that ran out of budget continues where it stopped the
        // next time: a receiver that hangs with thousands of rows due holds
        // up only its own (it used to hold up every row behind the first
        // 512 due, which were all its own).
        let mut starting: HashMap<u64, (SubscriptionRecord, String, bool)> = HashMap::new();
        let scan = w.storage.reader().and_then(|r| {
            r.scan_deliveries_due(now, resume, EXAMINE, |seq, rec| {
                // In a cluster, only the owner of the emitting actor's slot
                // delivers (its backup keeps a copy of each row and of what
                // became of it, and delivers once it owns the slot).
                let mine = crate::ids::ActorKey::new(&rec.actor_type, &rec.actor_id)
                    .is_ok_and(|k| writer.sends_for(&k));
                if !mine || seq > released || in_flight.contains(&seq) {
                    return ControlFlow::Continue(false);
                }
                if in_flight.len() >= cfg.concurrency.max(1) {
                    return ControlFlow::Break(());
                }
                let Some(sub) = subs.get(&rec.subscription).filter(|s| s.matches(&rec.actor_type, &rec.kind)) else {
                    tracing::info!(subscription = %rec.subscription, webhook_id = %rec.webhook_id,
                        "subscription deleted, or its filter no longer matches; dropping its delivery");
                    writer.submit(WriteOp::DeliveryAttempted {
                        seq,
                        update: None,
                        read_as: None,
                        done: tokio::sync::oneshot::channel().0,
                    });
                    return ControlFlow::Continue(false);
                };
                // Per subscription too: another subscription's hanging
                // path on the same host held every slot, so this one's rows
                // waited for all of that one's timeouts.
                let dest = format!("{}\n{}", rec.subscription, destination(&sub.url));
                let is_failing = failing.contains(&dest);
                if is_failing && failing_in_flight >= failing_share {
                    return ControlFlow::Continue(false);
                }
                let limit = if is_failing { 1 } else { cfg.per_destination.max(1) };
                let n = per_dest.entry(dest.clone()).or_default();
                if *n >= limit {
                    return ControlFlow::Continue(false);
                }
                *n += 1;
                in_flight.insert(seq);
                failing_in_flight += usize::from(is_failing);
                starting.insert(seq, (sub.clone(), dest, is_failing));
                ControlFlow::Continue(true)
            })
        });
        let taken = match scan {
            Ok(scan) => {
                resume = scan.resume.unwrap_or((0, 0));
                scan.taken
            }
            Err(crate::storage::StorageError::ShuttingDown) => return,
            Err(e) => {
                tracing::error!(error = %e, "webhook worker cannot read the outbox");
                // What was counted as started is not.
                for (seq, (_, dest, was_failing)) in starting.drain() {
                    in_flight.remove(&seq);
                    release(&mut per_dest, &dest);
                    failing_in_flight -= usize::from(was_failing);
                }
                tokio::time::sleep(Duration::from_secs(1)).await;
                continue;
            }
        };
        for (seq, rec) in taken {
            let Some((sub, dest, was_failing)) = starting.remove(&seq) else {
                continue;
            };
            let (w, client, done_tx) = (w.clone(), client.clone(), done_tx.clone());
            tokio::spawn(async move {
                let span = tracing::info_span!(
                    "webhook_out",
                    subscription = %rec.subscription,
                    webhook_id = %rec.webhook_id,
                    actor_type = %rec.actor_type,
                    actor_id = %rec.actor_id,
                    event_seq = rec.event_seq,
                    attempt = rec.attempts + 1,
                );
                // Each attempt continues the trace of the turn that
                // emitted the event.
                if let Some(parent) = rec
                    .traceparent
                    .as_deref()
                    .and_then(crate::telemetry::Parent::from_traceparent)
                {
                    parent.adopt(&span);
                }
                let delivered = w
                    .attempt(&client, seq, rec, &sub, schedule)
                    .instrument(span)
                    .await;
                let _ = done_tx.send(Finished {
                    seq,
                    dest,
                    was_failing,
                    delivered,
                });
            });
        }
        // A walk that ran out of budget with room left goes on at once, up
        // to one sweep of every due row per wake-up: it used to wait for the
        // next (a second, when every row was due), so a healthy receiver
        // behind 20,000 rows of a hanging one got 4 deliveries a second.
        if resume != (0, 0) && in_flight.len() < cfg.concurrency.max(1) && passes < MAX_PASSES {
            passes += 1;
            tokio::task::yield_now().await;
            continue;
        }
        passes = 0;
        // Sleep until something changes: new rows, a finished attempt (a
        // slot and maybe a row free again), or the next retry coming due.
        let next = w
            .storage
            .reader()
            .and_then(|r| r.next_delivery_due_after(now))
            .ok()
            .flatten()
            .map_or(1000, |t| t.saturating_sub(now_ms()).min(1000));
        tokio::select! {
            () = ready.notified() => {}
            Some(first) = done_rx.recv() => {
                let mut finished = vec![first];
                while let Ok(x) = done_rx.try_recv() {
                    finished.push(x);
                }
                for f in finished {
                    in_flight.remove(&f.seq);
                    release(&mut per_dest, &f.dest);
                    failing_in_flight -= usize::from(f.was_failing);
                    if f.delivered {
                        failing.remove(&f.dest);
                    } else {
                        failing.insert(f.dest);
                    }
                }
            }
            () = tokio::time::sleep(Duration::from_millis(next)) => {}
        }
        if let Ok(depth) = w.storage.reader().and_then(|r| r.pending_deliveries()) {
            w.metrics.webhook_queue_depth.set(depth as i64);
        }
    }
}

/// An attempt that finished, as its worker loop counts it.
struct Finished {
    seq: u64,
    /// Subscription and `host:port`.
    dest: String,
    /// It was started as one of a failing destination's.
    was_failing: bool,
    delivered: bool,
}

/// One attempt at `dest` finished (or never started).
fn release(per_dest: &mut HashMap<String, usize>, dest: &str) {
    if let Some(n) = per_dest.get_mut(dest) {
        *n -= 1;
        if *n == 0 {
            per_dest.remove(dest);
        }
    }
}

impl Worker {
    /// One attempt; its outcome is durable before this returns. Whether
    /// the receiver took it.
    async fn attempt(
        &self,
        client: &reqwest::Client,
        seq: u64,
        mut rec: DeliveryRecord,
        sub: &SubscriptionRecord,
        schedule: Schedule,
    ) -> bool {
        let read_as = (rec.attempts, rec.next_attempt_ms);
        let ts = (now_ms() / 1000) as i64;
        let signature = super::sign(
            &super::secret_key(&sub.secret),
            &rec.webhook_id,
            ts,
            &rec.payload,
        );
        let sent = client
            .post(&sub.url)
            .header("content-type", "application/json")
            .header("webhook-id", &rec.webhook_id)
            .header("webhook-timestamp", ts.to_string())
            .header("webhook-signature", signature)
            .headers(crate::telemetry::outgoing_headers())
            .body(rec.payload.clone())
            .send()
            .await;
        // A receiver's `Retry-After` (429, 503, …): the next attempt waits
        // at least that long (at most the schedule's longest delay).
        let mut asked_wait = None;
        let failure = match sent {
            Ok(resp) if resp.status().is_success() => None,
            Ok(mut resp) => {
                let status = resp.status();
                let headers: Vec<(String, String)> = resp
                    .headers()
                    .iter()
                    .filter(|(k, _)| {
                        k.as_str().starts_with("retry-after") || *k == reqwest::header::LOCATION
                    })
                    .filter_map(|(k, v)| Some((k.as_str().to_owned(), v.to_str().ok()?.to_owned())))
                    .collect();
                asked_wait = marmot_core::http::retry_after(&headers, std::time::SystemTime::now());
                let mut body = Vec::new();
                while body.len() < MAX_ERROR_BODY {
                    match resp.chunk().await {
                        Ok(Some(c)) => body.extend_from_slice(&c),
                        _ => break,
                    }
                }
                body.truncate(MAX_ERROR_BODY);
                let text = String::from_utf8_lossy(&body);
                let mut error = format!("HTTP {}: {}", status.as_u16(), text.trim());
                if status.is_redirection() {
                    // (It said only "HTTP 301: ".)
                    let location = headers
                        .iter()
                        .find(|(k, _)| k == "location")
                        .map_or("none", |(_, v)| v.as_str());
                    error = format!(
                        "HTTP {}: redirects are not followed (Location: {}); \
                         subscribe the URL it names",
                        status.as_u16(),
                        // (A password in it is masked, as in the URL.)
                        shown_url(location).chars().take(256).collect::<String>()
                    );
                }
                Some((error, status == reqwest::StatusCode::GONE))
            }
            Err(e) => Some((transport_error(&e), false)),
        };
        let (update, outcome) = match failure {
            None => (None, "delivered"),
            Some((error, gone)) => {
                rec.attempts += 1;
                rec.last_error = Some(error.clone());
                if gone || rec.attempts >= schedule.max_attempts {
                    rec.status = DeliveryStatus::Dead;
                    tracing::warn!(subscription = %rec.subscription, webhook_id = %rec.webhook_id,
                    attempts = rec.attempts, error = %error, "webhook delivery is dead (dead-letter list)");
                    (Some(rec), "dead")
                } else {
                    let asked = asked_wait.map_or(0, |d| d.as_millis() as u64);
                    let delay = schedule
                        .delay_ms(rec.attempts)
                        .max(asked.min(schedule.max_delay_ms));
                    rec.next_attempt_ms = now_ms() + delay;
                    tracing::info!(subscription = %rec.subscription, webhook_id = %rec.webhook_id,
                    attempt = rec.attempts, retry_in_ms = delay, error = %error, "webhook delivery failed; will retry");
                    (Some(rec), "failed")
                }
            }
        };
        self.metrics
            .webhook_deliveries
            .get_or_create(&HookLabels { outcome })
            .inc();
        let r: Result<(), StorageError> = self
            .storage
            .writer()
            .call(|done| WriteOp::DeliveryAttempted {
                seq,
                update,
                read_as: Some(read_as),
                done,
            })
            .await;
        if let Err(e) = r {
            // The row stays as it was: it will be attempted again (same id).
            tracing::error!(error = %e, seq, "cannot record a webhook delivery attempt");
        }
        outcome == "delivered"
    }
}

/// A transport error without the URL (it may carry credentials).
fn transport_error(e: &reqwest::Error) -> String {
    let kind = if e.is_timeout() {
        "timed out"
    } else if e.is_connect() {
        "connection failed"
    } else {
        "request failed"
    };
    let mut msg = kind.to_owned();
    let mut source = std::error::Error::source(e);
    while let Some(s) = source {
        msg = format!("{kind}: {s}");
        source = s.source();
    }
    msg
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_password_in_a_subscription_url_is_never_shown_back() {
        assert_eq!(
            shown_url("https://hooks:s3cret@example.com/in?x=1"),
            "https://hooks:***@example.com/in?x=1"
        );
        assert_eq!(
            shown_url("https://example.com/in"),
            "https://example.com/in"
        );
        assert_eq!(
            shown_url("https://user@example.com/"),
            "https://user@example.com/"
        );
    }

    #[test]
    fn the_default_schedule_retries_for_more_than_a_day() {
        let c = crate::config::WebhooksConfig::default();
        let s = Schedule {
            base_ms: c.retry_base_ms,
            max_delay_ms: c.retry_max_delay_ms,
            max_attempts: c.max_attempts,
        };
        // Delays between attempt 1 and the last: the nominal schedule is a
        // lower bound (jitter only adds).
        let total: u64 = (1..s.max_attempts).map(|a| s.nominal_delay_ms(a)).sum();
        assert!(total >= 24 * 3600 * 1000, "{} h", total / 3_600_000);
        for a in 1..30 {
            let d = s.delay_ms(a);
            let n = s.nominal_delay_ms(a);
            assert!(d >= n && d <= n + n / 4);
            assert!(n <= c.retry_max_delay_ms);
        }
        // Jittered: retries of many deliveries failing together spread
        // over the quarter above the nominal delay instead of coming back
        // at once.
        let n = s.nominal_delay_ms(5);
        let delays: Vec<u64> = (0..200).map(|_| s.delay_ms(5)).collect();
        let distinct: std::collections::BTreeSet<u64> = delays.iter().copied().collect();
        assert!(distinct.len() > 100, "{} distinct delays", distinct.len());
        let (lo, hi) = (distinct.first().unwrap(), distinct.last().unwrap());
        assert!(
            *lo < n + n / 16 && *hi > n + n * 3 / 16,
            "delays {lo}..{hi} around {n}"
        );
    }

    #[test]
    fn subscription_specs_are_checked() {
        let ok = SubscriptionSpec {
            url: "https://example.com/hook".into(),
            events: Some(vec!["order.*".into(), "note_added".into()]),
            types: vec!["notes".into()],
            secret: None,
        };
        let (rec, generated) = ok.clone().into_record(1).unwrap();
        assert!(generated.is_some() && rec.secret == generated.unwrap());
        assert!(rec.matches("notes", "order.paid"));
        assert!(rec.matches("notes", "note_added"));
        assert!(!rec.matches("notes", "note_deleted"));
        assert!(!rec.matches("counter", "order.paid"));
        for bad in [
            SubscriptionSpec {
                url: "ftp://x/".into(),
                ..ok.clone()
            },
            SubscriptionSpec {
                url: "not a url".into(),
                ..ok.clone()
            },
            SubscriptionSpec {
                events: Some(vec![]),
                ..ok.clone()
            },
            SubscriptionSpec {
                events: Some(vec!["a*b".into()]),
                ..ok.clone()
            },
            SubscriptionSpec {
                types: vec!["Bad Type".into()],
                ..ok.clone()
            },
            SubscriptionSpec {
                secret: Some("hunter2".into()),
                ..ok.clone()
            },
        ] {
            assert!(bad.into_record(1).is_err());
        }
        assert_eq!(destination("https://a.example/x"), "a.example:443");
        assert_eq!(destination("http://127.0.0.1:9000/x"), "127.0.0.1:9000");
    }
}
