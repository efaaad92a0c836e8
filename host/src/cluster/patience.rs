//! A starting node's patience with etcd: etcd and the nodes may be started
//! together, or a member may be down, and neither should stop a node from
//! joining while some member answers.

use std::time::{Duration, Instant};

/// etcd gave no answer in time (see [`super::within`]).
#[derive(Debug, thiserror::Error)]
#[error("etcd did not answer within {0:?}")]
pub(super) struct NoAnswer(pub(super) Duration);

/// How long a starting node keeps asking while etcd cannot be reached:
/// etcd and the nodes may be started together, or a member may be down.
const STARTUP_PATIENCE: Duration = Duration::from_secs(60);

/// `step`, asked again (with growing pauses, for up to
/// [`STARTUP_PATIENCE`]) while it fails because etcd cannot be reached;
/// an answer, even a refusal, is returned at once.
pub(super) async fn patiently<T, F, Fut>(what: &str, mut step: F) -> anyhow::Result<T>
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = anyhow::Result<T>>,
{
    let deadline = Instant::now() + STARTUP_PATIENCE;
    let mut pause = Duration::from_millis(100);
    loop {
        match step().await {
            Err(e) if unreachable(&e) && Instant::now() + pause < deadline => {
                tracing::warn!(error = %format!("{e:#}"), retry_in_ms = pause.as_millis() as u64, "{what}: etcd cannot be reached yet");
                tokio::time::sleep(pause).await;
                pause = (pause * 2).min(Duration::from_secs(2));
            }
            // One sentence first (it ended on the raw gRPC error alone).
            Err(e) if unreachable(&e) => {
                return Err(e.context(format!(
                    "{what}: etcd could not be reached for {STARTUP_PATIENCE:?}; giving up (is \
                     it running, and are the `etcd` endpoints of [cluster] right?)"
                )));
            }
            result => return result,
        }
    }
}

/// Whether `e` says etcd could not be reached (a member down, starting or
/// cut off) rather than answering: worth asking again.
fn unreachable(e: &anyhow::Error) -> bool {
    // gRPC status codes: 4 is DEADLINE_EXCEEDED, 14 UNAVAILABLE.
    e.chain().any(|cause| {
        cause.is::<NoAnswer>()
            || match cause.downcast_ref::<etcd_client::Error>() {
                Some(etcd_client::Error::TransportError(_)) => true,
                Some(etcd_client::Error::GRpcStatus(status)) => {
                    matches!(status.code() as i32, 4 | 14)
                }
                _ => false,
            }
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_a_missing_answer_is_worth_asking_again() {
        let timed_out = anyhow::Error::new(NoAnswer(Duration::from_secs(1)));
        assert!(unreachable(
            &timed_out.context("cannot get a lease from etcd")
        ));
        let refused = anyhow::Error::new(etcd_client::Error::InvalidArgs("bad".into()));
        assert!(!unreachable(&refused));
        assert!(!unreachable(&anyhow::anyhow!(
            "another live node is registered as `n1`"
        )));
    }

    #[tokio::test]
    async fn a_refusal_ends_the_wait_at_once_and_a_missing_answer_is_retried() {
        let mut calls = 0;
        let r: anyhow::Result<()> = patiently("testing", || {
            calls += 1;
            let n = calls;
            async move {
                if n < 3 {
                    Err(NoAnswer(Duration::from_secs(1)).into())
                } else {
                    anyhow::bail!("the cluster in etcd uses another layout")
                }
            }
        })
        .await;
        assert!(r.unwrap_err().to_string().contains("another layout"));
        assert_eq!(calls, 3, "asked again twice, then stopped at the refusal");
    }
}
