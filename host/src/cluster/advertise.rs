//! The check a node makes of its own `advertise` URL before it joins:
//! peers send it requests and copies of writes there, so an address that
//! reaches nothing would make it a member every other node waits on.

use std::time::Duration;

use anyhow::Context;

/// How long the connection to the advertised address may take.
const CONNECT: Duration = Duration::from_secs(3);

/// Whether `advertise` takes a TCP connection (this node's listener must
/// be bound already, so that the connection can land in its backlog when
/// the address is its own). What answers is not checked: a proxy or a
/// port mapping in between is fine; an address where nothing listens, a
/// host that does not resolve or drops the connection is refused, saying
/// which and what the node listens on. A node advertising a port nothing
/// listened on joined, was made a backup, and held every owner's writes
/// for 21 s (a probe).
pub async fn check_advertise(advertise: &str, listen: std::net::SocketAddr) -> anyhow::Result<()> {
    let url = url::Url::parse(advertise).context("cluster.advertise is not a URL")?;
    let (Some(host), Some(port)) = (url.host_str(), url.port_or_known_default()) else {
        anyhow::bail!("cluster.advertise `{advertise}` names no host and port");
    };
    let host = host.trim_start_matches('[').trim_end_matches(']');
    let why =
        match tokio::time::timeout(CONNECT, tokio::net::TcpStream::connect((host, port))).await {
            Ok(Ok(_)) => return Ok(()),
            Ok(Err(e)) => e.to_string(),
            Err(_) => format!("no connection within {CONNECT:?}"),
        };
    anyhow::bail!(
        "cluster.advertise `{advertise}` does not reach this node ({why}); other nodes send \
         it requests and copies of writes there. Set it to an address they can reach that \
         leads to this node's listener on {listen}"
    )
}
