//! The check a node makes of its own `advertise` URL before it joins:
//! peers send it requests and copies of writes there, so an address that
//! leads elsewhere would make it a member every other node waits on.

use std::time::Duration;

use anyhow::Context;
use tokio::io::{AsyncReadExt, AsyncWriteExt};

/// How long the request through the advertised address may take.
const ASK: Duration = Duration::from_secs(3);

/// Whether a request to `advertise` reaches this node: `GET
/// {advertise}/healthz?advertise-check=NONCE`, answered by `listener`
/// (bound, not yet serving) with the nonce, through whatever lies between
/// (a proxy, a port mapping). An address where nothing listens, or where
/// something else answers (another node, etcd), is refused, saying which
/// and what the node listens on. A node advertising a port nothing
/// listened on joined, was made a backup, and held every owner's writes
/// for 21 s (a probe); one advertising another node's address (a config
/// copied and not changed) joined too, and a rebalance then all but
/// stopped the cluster's writes (a re-probe of a check that only
/// connected).
pub async fn check_advertise(
    advertise: &str,
    listener: &tokio::net::TcpListener,
) -> anyhow::Result<()> {
    let listen = listener.local_addr()?;
    let nonce = format!("{:032x}", rand::random::<u128>());
    let url = format!(
        "{}/healthz?advertise-check={nonce}",
        advertise.trim_end_matches('/')
    );
    let ask = async {
        let answer = super::peer_client()
            .get(&url)
            .timeout(ASK)
            .send()
            .await
            .context("no answer")?;
        answer.text().await.context("no whole answer")
    };
    let why = tokio::select! {
        answered = ask => match answered {
            Ok(text) if text == nonce => return Ok(()),
            Ok(_) => "something else answers there".to_owned(),
            Err(e) => format!("{e:#}"),
        },
        never = answer_checks(listener, &nonce) => match never {},
    };
    anyhow::bail!(
        "cluster.advertise `{advertise}` does not reach this node ({why}); other nodes send \
         it requests and copies of writes there. Set it to an address they can reach that \
         leads to this node's listener on {listen}"
    )
}

/// Answer every request on `listener` with `nonce` if it asks for it (a
/// request head that holds it), until dropped.
async fn answer_checks(
    listener: &tokio::net::TcpListener,
    nonce: &str,
) -> std::convert::Infallible {
    loop {
        let Ok((mut conn, _)) = listener.accept().await else {
            tokio::time::sleep(Duration::from_millis(10)).await;
            continue;
        };
        let mut head = vec![0u8; 8 << 10];
        let mut read = 0;
        let got = tokio::time::timeout(ASK, async {
            while read < head.len() {
                match conn.read(&mut head[read..]).await {
                    Ok(0) | Err(_) => break,
                    Ok(n) => read += n,
                }
                if head[..read].windows(4).any(|w| w == b"\r\n\r\n") {
                    break;
                }
            }
        })
        .await;
        let asked = got.is_ok()
            && head[..read]
                .windows(nonce.len())
                .any(|w| w == nonce.as_bytes());
        let body = if asked { nonce } else { "" };
        let answer = format!(
            "HTTP/1.1 200 OK\r\ncontent-type: text/plain\r\ncontent-length: {}\r\n\
             connection: close\r\n\r\n{body}",
            body.len()
        );
        let _ = conn.write_all(answer.as_bytes()).await;
        let _ = conn.shutdown().await;
    }
}
