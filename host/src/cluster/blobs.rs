//! Sending files' blobs to another node ahead of the rows that name them:
//! a slot's backup before the batches it applies (`replication.rs`), the
//! new owner of a moved actor before its image (`node/moves.rs`).
//!
//! The receiver says which it lacks (a node that held the slot before, or
//! got the blob with another file, has most), and those go in requests of
//! at most [`REQUEST_BYTES`], read from disk as they go: a slot's snapshot
//! with gigabytes of files is never in memory or in one request. The
//! receiver holds what it has and what it got until the rows come (see
//! `node/replicas.rs`); rows naming a blob it lacks are refused, and the
//! sender's retry asks again.

use std::sync::Arc;

use super::Peers;
use crate::storage::Storage;

/// Blob bytes per request, at most (a larger blob goes alone).
const REQUEST_BYTES: usize = 32 << 20;

/// Blob names asked about per request.
const ASK_AT_ONCE: usize = 4096;

/// Whether to ask the receiver which blobs it lacks before sending.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Ask {
    /// Ask first: blobs it may well have (a snapshot's, a moved actor's).
    First,
    /// Send them all: blobs just written by turns, which it lacks (asking
    /// cost a round trip more before every commit with a blob file).
    Never,
}

/// Make sure the node at `base` has every blob of `shas`; how many bytes
/// were sent.
pub async fn send_blobs(
    peers: &Peers,
    storage: &Arc<Storage>,
    base: &str,
    mut shas: Vec<[u8; 32]>,
    ask: Ask,
) -> anyhow::Result<u64> {
    shas.sort_unstable();
    shas.dedup();
    let mut sent = 0u64;
    for ask_about in shas.chunks(ASK_AT_ONCE) {
        let missing = match ask {
            Ask::First => peers.blobs_missing(base, ask_about).await?,
            Ask::Never => ask_about.to_vec(),
        };
        let mut request: Vec<([u8; 32], Vec<u8>)> = Vec::new();
        let mut bytes = 0;
        for sha in missing {
            anyhow::ensure!(
                ask_about.binary_search(&sha).is_ok(),
                "{base} named a blob it was not asked about"
            );
            let storage = storage.clone();
            let blob = tokio::task::spawn_blocking(move || storage.blobs().read(&sha)).await??;
            if !request.is_empty() && bytes + blob.len() > REQUEST_BYTES {
                sent += put(peers, base, &mut request).await?;
                bytes = 0;
            }
            bytes += blob.len();
            request.push((sha, blob));
        }
        if !request.is_empty() {
            sent += put(peers, base, &mut request).await?;
        }
    }
    Ok(sent)
}

/// Send the blobs of `request` (emptied); their bytes.
async fn put(
    peers: &Peers,
    base: &str,
    request: &mut Vec<([u8; 32], Vec<u8>)>,
) -> anyhow::Result<u64> {
    let bytes = request.iter().map(|(_, b)| b.len() as u64).sum();
    let body = postcard::to_stdvec(request)?;
    request.clear();
    peers.put_blobs(base, body).await?;
    Ok(bytes)
}

#[cfg(test)]
mod tests {
    use std::sync::Mutex;

    use axum::body::Bytes;
    use axum::routing::post;

    use super::*;
    use crate::config::StorageConfig;
    use crate::storage::WriterMetrics;

    /// What the receiver was asked and sent.
    #[derive(Default)]
    struct Seen {
        asked: usize,
        requests: Vec<usize>,
        got: Vec<[u8; 32]>,
    }

    /// A receiver that has `have` and records what it gets.
    async fn receiver(have: Vec<[u8; 32]>) -> (String, Arc<Mutex<Seen>>) {
        let seen = Arc::new(Mutex::new(Seen::default()));
        let (s1, s2) = (seen.clone(), seen.clone());
        let app = axum::Router::new()
            .route(
                "/v1/cluster/blobs/missing",
                post(move |body: Bytes| async move {
                    let shas: Vec<[u8; 32]> = postcard::from_bytes(&body).unwrap();
                    s1.lock().unwrap().asked += shas.len();
                    let missing: Vec<[u8; 32]> =
                        shas.into_iter().filter(|s| !have.contains(s)).collect();
                    postcard::to_stdvec(&missing).unwrap()
                }),
            )
            .route(
                "/v1/cluster/blobs",
                post(move |body: Bytes| async move {
                    let blobs: Vec<([u8; 32], Vec<u8>)> = postcard::from_bytes(&body).unwrap();
                    let mut seen = s2.lock().unwrap();
                    seen.requests
                        .push(blobs.iter().map(|(_, b)| b.len()).sum::<usize>());
                    seen.got.extend(blobs.into_iter().map(|(s, _)| s));
                    "{}"
                }),
            )
            .layer(axum::extract::DefaultBodyLimit::disable());
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let base = format!("http://{}", listener.local_addr().unwrap());
        tokio::spawn(async move { axum::serve(listener, app).await });
        (base, seen)
    }

    /// A slot's blobs go in bounded requests, whatever their total (they
    /// rode in one request of at most 512 MiB, so a slot with more file
    /// bytes never got a backup), and only those the receiver lacks.
    #[tokio::test]
    async fn blobs_go_in_bounded_requests_and_only_those_missing() {
        let dir = tempfile::tempdir().unwrap();
        let storage = Arc::new(
            Storage::open(dir.path(), &StorageConfig::default(), WriterMetrics::new()).unwrap(),
        );
        let blob = 5 << 20;
        let shas: Vec<[u8; 32]> = (0..20u8)
            .map(|i| *storage.blobs().put(&vec![i; blob]).unwrap().sha256())
            .collect();
        // The receiver has a quarter of them already.
        let have: Vec<[u8; 32]> = shas.iter().step_by(4).copied().collect();
        let (base, seen) = receiver(have.clone()).await;
        let peers = Peers::new(None);
        let mut asked = shas.clone();
        asked.extend(shas.iter().take(3)); // named twice: sent once
        let sent = send_blobs(&peers, &storage, &base, asked.clone(), Ask::First)
            .await
            .unwrap();

        {
            let seen = seen.lock().unwrap();
            assert_eq!(seen.asked, 20);
            assert_eq!(sent, 15 * blob as u64);
            let mut got = seen.got.clone();
            got.sort_unstable();
            let mut want: Vec<[u8; 32]> = shas.into_iter().filter(|s| !have.contains(s)).collect();
            want.sort_unstable();
            assert_eq!(got, want, "exactly the missing ones, each once");
            assert!(seen.requests.len() >= 3, "{:?}", seen.requests);
            for &r in &seen.requests {
                assert!(r <= REQUEST_BYTES, "a request of {r} bytes");
            }
        }

        // Blobs just written go without asking: all of them, once each.
        let (base, seen) = receiver(have).await;
        let sent = send_blobs(&peers, &storage, &base, asked, Ask::Never)
            .await
            .unwrap();
        let seen = seen.lock().unwrap();
        assert_eq!((seen.asked, sent), (0, 20 * blob as u64));
        assert_eq!(seen.got.len(), 20);
    }
}
