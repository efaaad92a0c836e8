//! In-process tests of behaviour that needs a fault the HTTP API cannot
//! cause.

use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;

use super::Node;
use crate::actor::{TurnError, TurnReply};
use crate::config::{NodeConfig, TypeConfig};
use crate::ids::ActorKey;
use crate::storage::schema::CodeKind;

async fn node() -> (tempfile::TempDir, Arc<Node>) {
    let dir = tempfile::tempdir().unwrap();
    let node = Node::start(NodeConfig::for_dir(dir.path().join("data")))
        .await
        .unwrap();
    node.deploy(
        "counter",
        CodeKind::Wasm,
        crate::guests::COUNTER.to_vec(),
        TypeConfig::default(),
    )
    .await
    .unwrap();
    (dir, node)
}

async fn send(node: &Arc<Node>, body: &'static str) -> Result<TurnReply, TurnError> {
    let key = ActorKey::new("counter", "a").unwrap();
    let fut = node.send(&key, Bytes::from_static(body.as_bytes()), None, None);
    tokio::time::timeout(Duration::from_secs(10), fut)
        .await
        .expect("the actor answered (it must not hang after a failed commit)")
}

/// A new version's deploy drops the older ones' compiled code from the
/// catalog (each JavaScript version kept ~6 MB until a restart), and an
/// actor still at an older version wakes into the new one.
#[tokio::test]
async fn deploys_keep_only_the_latest_compiled_version() {
    let (_dir, node) = node().await;
    assert_eq!(
        send(&node, r#"{"by": 5}"#).await.unwrap().body,
        r#"{"n":5}"#
    );
    for i in 0..3 {
        let config = TypeConfig {
            idle_timeout_ms: Some(60_000 + i),
            ..TypeConfig::default()
        };
        let d = node
            .deploy(
                "counter",
                CodeKind::Wasm,
                crate::guests::COUNTER.to_vec(),
                config,
            )
            .await
            .unwrap();
        assert!(d.created);
    }
    let entry = node.catalog().get("counter").unwrap();
    assert_eq!(entry.cached_versions(), [4]);
    assert_eq!(
        send(&node, r#"{"by": 1}"#).await.unwrap().body,
        r#"{"n":6}"#
    );
    assert_eq!(entry.cached_versions(), [4]);
}

/// A deploy numbered by the cluster keeps its number (a gap for versions
/// this node missed); the same code under it again is a no-op; other code
/// under it, or a number behind the latest, is refused; the next deploy
/// goes on from it.
#[tokio::test]
async fn numbered_deploys_keep_the_clusters_numbers() {
    use super::DeployError;
    let (_dir, node) = node().await;
    let config = |idle: u64| TypeConfig {
        idle_timeout_ms: Some(idle),
        ..TypeConfig::default()
    };
    let code = || crate::guests::COUNTER.to_vec();
    let d = node
        .deploy_numbered("counter", CodeKind::Wasm, code(), config(61_000), 3)
        .await
        .unwrap();
    assert!(d.created && d.version == 3);
    let again = node
        .deploy_numbered("counter", CodeKind::Wasm, code(), config(61_000), 3)
        .await
        .unwrap();
    assert!(!again.created);
    for (idle, version) in [(62_000, 3), (62_000, 2)] {
        let e = node
            .deploy_numbered("counter", CodeKind::Wasm, code(), config(idle), version)
            .await
            .unwrap_err();
        assert!(matches!(e, DeployError::VersionConflict(_)), "{e}");
    }
    let next = node
        .deploy("counter", CodeKind::Wasm, code(), config(63_000))
        .await
        .unwrap();
    assert_eq!(next.version, 4);
    assert_eq!(
        send(&node, r#"{"by": 2}"#).await.unwrap().body,
        r#"{"n":2}"#
    );
}

/// Regression: after a failed commit, an actor whose next turn wrote
/// nothing waited forever for the lost commit.
#[tokio::test]
async fn a_failed_commit_fails_its_turn_and_the_actor_recovers_from_disk() {
    let (_dir, node) = node().await;
    assert_eq!(
        send(&node, r#"{"by": 5}"#).await.unwrap().body,
        r#"{"n":5}"#
    );
    node.storage.writer().inject_commit_failures(1);
    let lost = send(&node, r#"{"by": 1}"#).await;
    assert!(matches!(lost, Err(TurnError::Storage(_))), "{lost:?}");
    // Read-only turn: sees what is on disk, and answers.
    assert_eq!(
        send(&node, r#"{"by": 0}"#).await.unwrap().body,
        r#"{"n":5}"#
    );
    assert_eq!(
        send(&node, r#"{"by": 2}"#).await.unwrap().body,
        r#"{"n":7}"#
    );
    let metrics = node.metrics().render();
    assert!(
        metrics.contains("marmot_commit_failures_total 1"),
        "{metrics}"
    );
}

/// A read-only reply that depends on a commit in flight is held back
/// until that commit is durable, and fails with it.
#[tokio::test]
async fn replies_depending_on_a_failed_commit_are_never_released() {
    let (_dir, node) = node().await;
    send(&node, r#"{"by": 1}"#).await.unwrap();
    let key = ActorKey::new("counter", "a").unwrap();
    // Pipelined: the write and the read are both queued before the
    // write's commit fails. The read runs after the write's turn, on its
    // state (`n` 11), and must fail with its commit; or, if the failure
    // came first and the actor reloaded, it sees `n` 1. The first is the
    // case that tests the gate, and it must come up.
    let mut held = 0;
    for _ in 0..10 {
        node.storage.writer().inject_commit_failures(1);
        let (w, r) = tokio::join!(
            node.send(&key, Bytes::from_static(br#"{"by": 10}"#), None, None),
            node.send(&key, Bytes::from_static(br#"{"by": 0}"#), None, None),
        );
        assert!(w.is_err(), "the write's commit failed: {w:?}");
        match r {
            Ok(reply) => assert_eq!(reply.body, r#"{"n":1}"#, "a read saw a lost write"),
            Err(e) => {
                assert!(matches!(e, TurnError::Storage(_)), "{e:?}");
                held += 1;
            }
        }
    }
    assert!(held > 0, "no read ran behind the failing write");
    assert_eq!(
        send(&node, r#"{"by": 0}"#).await.unwrap().body,
        r#"{"n":1}"#
    );
}

/// Guarantee 3 for events: a turn's events reach the event log and live
/// streams only once its commit is durable, so a failed commit publishes
/// none, and the next event takes the sequence number it would have had.
#[tokio::test]
async fn events_of_a_failed_commit_reach_no_stream_and_no_log() {
    let (_dir, node) = node().await;
    let key = ActorKey::new("counter", "a").unwrap();
    let mut sub = node.event_bus().subscribe(&key).unwrap();
    async fn published(sub: &mut crate::streams::Subscription) {
        tokio::time::timeout(Duration::from_secs(10), sub.changed.changed())
            .await
            .expect("the event was published")
            .unwrap();
    }
    let log = |node: &Arc<Node>| {
        let reader = node.storage.reader().unwrap();
        let num = reader.actor(&key).unwrap().expect("the actor exists").num;
        reader
            .events(num, 0, 100, usize::MAX)
            .unwrap()
            .into_iter()
            .map(|(seq, e)| (seq, e.kind, String::from_utf8(e.data).unwrap()))
            .collect::<Vec<_>>()
    };
    // The counter emits `milestone` at every multiple of 100.
    send(&node, r#"{"by": 100}"#).await.unwrap();
    published(&mut sub).await;
    assert_eq!(*sub.changed.borrow_and_update(), 1);

    node.storage.writer().inject_commit_failures(1);
    let lost = send(&node, r#"{"by": 100}"#).await;
    assert!(matches!(lost, Err(TurnError::Storage(_))), "{lost:?}");
    // A read after it: whatever the failed turn would publish, it has.
    assert_eq!(
        send(&node, r#"{"by": 0}"#).await.unwrap().body,
        r#"{"n":100}"#
    );
    assert!(
        !sub.changed.has_changed().unwrap(),
        "a stream was told of an event whose commit failed"
    );
    assert_eq!(log(&node).len(), 1, "{:?}", log(&node));

    send(&node, r#"{"by": 100}"#).await.unwrap();
    published(&mut sub).await;
    assert_eq!(*sub.changed.borrow_and_update(), 2);
    let log = log(&node);
    assert_eq!(log.len(), 2, "{log:?}");
    assert_eq!((log[1].0, log[1].1.as_str()), (2, "milestone"));
    assert_eq!(log[1].2, r#"{"n":200}"#);
}

/// The compiled-code cache keeps what this node uses, however old its
/// file's time, and removes what nobody has used for the retention: a
/// component of an older build, say.
#[tokio::test]
async fn the_code_cache_sweep_keeps_the_code_in_use_and_removes_the_rest() {
    let (dir, node) = node().await;
    let cache = dir.path().join("data/cache");
    let month_ago = std::time::SystemTime::now() - Duration::from_secs(30 * 24 * 3600);
    let stale = cache.join("0123abcd-olderbuild.cwasm");
    std::fs::write(&stale, b"compiled by an older build").unwrap();
    let ours: Vec<_> = std::fs::read_dir(&cache)
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| p.extension().is_some_and(|x| x == "cwasm") && *p != stale)
        .collect();
    assert!(!ours.is_empty(), "deploying the counter cached its code");
    for path in ours.iter().chain([&stale]) {
        let f = std::fs::File::options().write(true).open(path).unwrap();
        f.set_modified(month_ago).unwrap();
    }

    node.sweep_code_cache().await;

    assert!(!stale.exists(), "unused for a month: removed");
    for path in &ours {
        assert!(path.exists(), "in use: kept ({})", path.display());
        let modified = std::fs::metadata(path).unwrap().modified().unwrap();
        assert!(modified > month_ago, "in use: marked fresh for other nodes");
    }
    let metrics = node.metrics().render();
    assert!(
        metrics.contains("marmot_code_cache_removed_files_total 1"),
        "{metrics}"
    );
    // The counter still runs from the cache.
    assert_eq!(
        send(&node, r#"{"by": 1}"#).await.unwrap().body,
        r#"{"n":1}"#
    );
}

/// Compiled code the node no longer holds (a replaced version, a deleted
/// type) ages out of the cache like any other file: it counted as used
/// until the node restarted, ~6 MB per JavaScript deploy (found by a
/// probe).
#[tokio::test]
async fn code_no_longer_deployed_ages_out_of_the_cache() {
    let dir = tempfile::tempdir().unwrap();
    let node = Node::start(NodeConfig::for_dir(dir.path().join("data")))
        .await
        .unwrap();
    let cache = dir.path().join("data/cache");
    let types = || -> std::collections::HashSet<std::path::PathBuf> {
        std::fs::read_dir(&cache)
            .unwrap()
            .map(|e| e.unwrap().path())
            .filter(|p| {
                let name = p.file_name().unwrap().to_string_lossy();
                name.starts_with("quickjs-type-") && name.ends_with(".cwasm")
            })
            .collect()
    };
    let deploy = |ty: &'static str, n: u32| {
        let module = format!("export default {{ onMessage() {{ return {{ n: {n} }}; }} }};");
        let node = node.clone();
        async move {
            node.deploy(ty, CodeKind::Js, module.into_bytes(), TypeConfig::default())
                .await
                .unwrap()
        }
    };
    deploy("page", 1).await;
    let first = types();
    assert_eq!(first.len(), 1, "{first:?}");
    deploy("page", 2).await;
    deploy("gone", 3).await;
    let gone: Vec<_> = types().difference(&first).cloned().collect();
    assert_eq!(gone.len(), 2, "{gone:?}");
    node.delete_type("gone", false).await.unwrap();
    let key = ActorKey::new("page", "a").unwrap();
    let turn = node.send(&key, Bytes::from_static(b"{}"), None, None).await;
    assert_eq!(turn.unwrap().body, r#"{"n":2}"#);
    let month_ago = std::time::SystemTime::now() - Duration::from_secs(30 * 24 * 3600);
    for path in types() {
        let f = std::fs::File::options().write(true).open(&path).unwrap();
        f.set_modified(month_ago).unwrap();
    }

    node.sweep_code_cache().await;

    // Left: the one version deployed, in use.
    let left = types();
    assert_eq!(left.len(), 1, "{left:?}");
    assert!(left.is_disjoint(&first), "the replaced version was kept");
    let turn = node.send(&key, Bytes::from_static(b"{}"), None, None).await;
    assert_eq!(turn.unwrap().body, r#"{"n":2}"#);
}

/// A JavaScript module no turn could run is refused when a user deploys
/// it, and taken from a peer's catalog, where an earlier build may have
/// deployed it: a node catching up must not stop at it, and serves it as
/// the peer does (each turn says what is wrong).
#[tokio::test]
async fn a_peer_catalog_installs_a_module_a_user_deploy_refuses() {
    let dir = tempfile::tempdir().unwrap();
    let mut config = NodeConfig::for_dir(dir.path().join("data"));
    // The integration tests' compiled-code cache, if there is one: the
    // engine compiled once, not again here.
    config.cache_dir = Some(
        std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../target/tmp/marmot-code-cache"),
    );
    let node = Node::start(config).await.unwrap();
    let module = b"export const notHandlers = 1;".to_vec();
    let user = node
        .deploy(
            "legacy",
            CodeKind::Js,
            module.clone(),
            TypeConfig::default(),
        )
        .await;
    let refused = format!("{:?}", user.expect_err("a user deploy is refused"));
    assert!(refused.contains("export default"), "{refused}");
    assert!(node.catalog.get("legacy").is_none(), "nothing deployed");

    let peer = node
        .deploy_from_peer("legacy", CodeKind::Js, module, TypeConfig::default(), 1)
        .await
        .expect("a peer's type is installed");
    assert!(peer.created);
    let key = ActorKey::new("legacy", "a").unwrap();
    let turn = node.send(&key, Bytes::from_static(b"{}"), None, None).await;
    let failed = format!("{:?}", turn.expect_err("no turn can run it"));
    assert!(failed.contains("export default"), "{failed}");
}

/// Checks a user's deploy gained later (timeout bounds, starting the code
/// under its memory limit) do not stop a node from installing a version
/// from a peer's catalog, which an earlier build took: a node catching up
/// stopped at the first such type, and took none after it, nor the
/// cluster's token revocations (found by a review).
#[tokio::test]
async fn a_peer_catalog_installs_versions_that_later_checks_refuse() {
    let (_dir, node) = node().await;
    let code = || crate::guests::COUNTER.to_vec();
    for (ty, config) in [
        (
            "month",
            TypeConfig {
                idle_timeout_ms: Some(30 * 24 * 3600 * 1000),
                ..Default::default()
            },
        ),
        (
            "tight",
            TypeConfig {
                max_memory_bytes: Some(1 << 20),
                ..Default::default()
            },
        ),
    ] {
        let user = node
            .deploy(ty, CodeKind::Wasm, code(), config.clone())
            .await;
        assert!(user.is_err(), "{ty}: a user deploy is refused");
        let peer = node
            .deploy_from_peer(ty, CodeKind::Wasm, code(), config, 1)
            .await
            .unwrap_or_else(|e| panic!("{ty}: a peer's version is installed: {e}"));
        assert!(peer.created, "{ty}");
    }
}

/// Code whose `report-memory-origin` never returns, installed from a
/// peer's catalog (no deploy check there): each message to it fails in
/// about its CPU slice, naming the export, and never hangs; other actors
/// are served meanwhile.
#[tokio::test]
async fn an_origin_report_that_never_returns_fails_each_message_quickly() {
    const SPINNING: &[u8] = include_bytes!(env!("MARMOT_GUEST_MARMOT_SPINNING_ORIGIN"));
    let (_dir, node) = node().await;
    let config = TypeConfig {
        cpu_slice_ms: Some(300),
        ..Default::default()
    };
    node.deploy_from_peer("spinner", CodeKind::Wasm, SPINNING.to_vec(), config, 1)
        .await
        .expect("a peer's version is installed");
    let key = ActorKey::new("spinner", "a").unwrap();
    for _ in 0..2 {
        let started = std::time::Instant::now();
        let fut = node.send(&key, Bytes::from_static(b"{}"), None, None);
        let r = tokio::time::timeout(Duration::from_secs(10), fut)
            .await
            .expect("it answered");
        let e = format!("{:?}", r.expect_err("no message can run it"));
        assert!(e.contains("report-memory-origin"), "{e}");
        assert!(
            started.elapsed() < Duration::from_secs(3),
            "{:?}",
            started.elapsed()
        );
        assert!(send(&node, r#"{"by": 1}"#).await.is_ok());
    }
}

/// The CPU limit counts the CPU a guest ran, not the wall-clock time its
/// worker was off the core: a loop that needs about half its slice
/// completes while five busy threads share its core (it takes longer
/// than its slice by the clock), and one that needs several slices still
/// traps there.
#[tokio::test]
async fn a_guest_is_charged_its_threads_cpu_not_the_time_it_waited_for_a_core() {
    const LOOP: &str = "export default { onMessage(m) { let x = 0; \
        for (let i = 0; i < m.n; i++) { x = (x + i) % 1000003; } return { x }; } };";
    let (_dir, node) = node().await;
    let deploy = |ty: &'static str, slice_ms: u64| {
        let node = node.clone();
        async move {
            let config = TypeConfig {
                cpu_slice_ms: Some(slice_ms),
                ..Default::default()
            };
            node.deploy(ty, CodeKind::Js, LOOP.as_bytes().to_vec(), config)
                .await
                .unwrap();
        }
    };
    // A turn runs on this test's one runtime thread: the thread's CPU
    // clock measures it.
    let cpu = || crate::sandbox::thread_cpu_time().expect("a thread CPU clock");
    let run = |ty: &'static str, n: u64| {
        let node = node.clone();
        async move {
            let key = ActorKey::new(ty, "a").unwrap();
            let body = Bytes::from(format!(r#"{{"n": {n}}}"#));
            let (started, cpu_before) = (std::time::Instant::now(), cpu());
            let r =
                tokio::time::timeout(Duration::from_secs(60), node.send(&key, body, None, None))
                    .await
                    .expect("it answered");
            (r, started.elapsed(), cpu() - cpu_before)
        }
    };
    // A loop of `n` that runs about 150 ms of CPU.
    deploy("calibrate", 60_000).await;
    let mut n = 100_000;
    let alone = loop {
        let (r, _, ran) = run("calibrate", n).await;
        r.expect("the calibration loop runs");
        if ran >= Duration::from_millis(150) {
            break ran;
        }
        n *= 2;
    };
    let slice = alone * 2;
    deploy("meter", slice.as_millis() as u64).await;

    // Five threads spin on the core this test's runtime is pinned to.
    let core = Pinned::first_core();
    let stop = Arc::new(std::sync::atomic::AtomicBool::new(false));
    let burners: Vec<_> = (0..5)
        .map(|_| {
            let stop = stop.clone();
            std::thread::spawn(move || {
                let _pin = Pinned::to(core);
                while !stop.load(std::sync::atomic::Ordering::Relaxed) {
                    std::hint::spin_loop();
                }
            })
        })
        .collect();
    let pinned = Pinned::to(core);
    let (fits, fits_took, _) = run("meter", n).await;
    let (over, over_took, _) = run("meter", n * 8).await;
    drop(pinned);
    stop.store(true, std::sync::atomic::Ordering::Relaxed);
    for b in burners {
        b.join().unwrap();
    }

    assert!(
        fits_took > slice,
        "the core was shared: {fits_took:?} by the clock, slice {slice:?}"
    );
    fits.unwrap_or_else(|e| {
        panic!("~{alone:?} of CPU fits a {slice:?} slice (took {fits_took:?}): {e:?}")
    });
    let e = format!(
        "{:?}",
        over.expect_err("eight times as much is over the slice")
    );
    assert!(e.contains("CPU limit"), "{e} (after {over_took:?})");
}

/// Pins the calling thread to one core while held (Linux).
struct Pinned;

impl Pinned {
    /// The first core this thread may run on.
    #[allow(unsafe_code, reason = "reading this thread's cores")]
    fn first_core() -> usize {
        // SAFETY: a zeroed cpu_set_t is empty; sched_getaffinity writes it.
        let mut set: libc::cpu_set_t = unsafe { std::mem::zeroed() };
        let rc = unsafe { libc::sched_getaffinity(0, size_of::<libc::cpu_set_t>(), &mut set) };
        assert_eq!(rc, 0, "sched_getaffinity");
        (0..libc::CPU_SETSIZE as usize)
            .find(|&c| unsafe { libc::CPU_ISSET(c, &set) })
            .expect("a core")
    }

    #[allow(unsafe_code, reason = "pinning this thread")]
    fn to(core: usize) -> PinGuard {
        // SAFETY: as above; the sets are plain values on this stack.
        let mut old: libc::cpu_set_t = unsafe { std::mem::zeroed() };
        let mut set: libc::cpu_set_t = unsafe { std::mem::zeroed() };
        unsafe {
            assert_eq!(
                libc::sched_getaffinity(0, size_of::<libc::cpu_set_t>(), &mut old),
                0
            );
            libc::CPU_SET(core, &mut set);
            assert_eq!(
                libc::sched_setaffinity(0, size_of::<libc::cpu_set_t>(), &set),
                0
            );
        }
        PinGuard(old)
    }
}

/// Gives the thread back the cores it had.
struct PinGuard(libc::cpu_set_t);

impl Drop for PinGuard {
    #[allow(unsafe_code, reason = "unpinning this thread")]
    fn drop(&mut self) {
        // SAFETY: the set was read by sched_getaffinity for this thread.
        unsafe { libc::sched_setaffinity(0, size_of::<libc::cpu_set_t>(), &self.0) };
    }
}
