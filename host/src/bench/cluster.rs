//! `cluster`: what routing through a cluster costs, side by side in one run.
//!
//! A single-member etcd (Debian's `etcd-server`) and two nodes in their own
//! processes, plus a node without a cluster as the baseline, all on
//! loopback. The same closed-loop load (durable counter turns, `--connections`
//! connections, `--duration` seconds, `--rounds` rounds alternating A B C …)
//! goes to:
//!
//! * `alone`: the node without a cluster;
//! * `no-backup`: a node that is a cluster of its own (routing, fencing,
//!   the writer's placement check; no backup to wait for);
//! * `owner`: node 1, for actors node 1 owns, with node 2 as their backup
//!   (every commit makes a round trip to it before its reply is released);
//! * `forwarded`: node 1, for actors node 2 owns (one extra HTTP hop on
//!   loopback, plus the body buffered for a possible retry).
//!
//! Node 1 is in region `eu`, node 2 in `us`; half of the actors are
//! created in each (`?region=`). It prints turns/s, p50/p99 and the
//! ratios; then times `--moves` moves of node 1's actors to `us` and back;
//! then kills node 2 (`kill
//! -9`) `--failovers` times (restarting it in between) and prints how long
//! its actors took to answer again through node 1 — lease TTL 5 s (the
//! default) plus the controller's 2 s grace, by design.

use std::net::SocketAddr;
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use anyhow::Context as _;

use super::http::Conn;
use super::server::{ServerProc, free_port};
use super::{BenchArgs, Percentiles};

/// A throwaway single-member etcd.
struct Etcd {
    child: Child,
    url: String,
}

impl Etcd {
    fn start(dir: &Path) -> anyhow::Result<Self> {
        let (client, peer) = (free_port()?, free_port()?);
        let url = format!("http://127.0.0.1:{client}");
        let peer_url = format!("http://127.0.0.1:{peer}");
        let child = Command::new("etcd")
            .arg("--name=bench")
            .arg(format!("--data-dir={}", dir.join("etcd").display()))
            .arg(format!("--listen-client-urls={url}"))
            .arg(format!("--advertise-client-urls={url}"))
            .arg(format!("--listen-peer-urls={peer_url}"))
            .arg(format!("--initial-advertise-peer-urls={peer_url}"))
            .arg(format!("--initial-cluster=bench={peer_url}"))
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .context("cannot start etcd (Debian package etcd-server; scripts/test installs it)")?;
        let deadline = Instant::now() + Duration::from_secs(20);
        while std::net::TcpStream::connect(("127.0.0.1", client)).is_err() {
            anyhow::ensure!(Instant::now() < deadline, "etcd did not start");
            std::thread::sleep(Duration::from_millis(50));
        }
        Ok(Self { child, url })
    }
}

impl Drop for Etcd {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

pub(super) async fn cluster(args: &BenchArgs) -> anyhow::Result<()> {
    let actors = args.actors.unwrap_or(1_000);
    let duration = Duration::from_secs(args.duration);
    let conns = args.connections;
    let dir = tempfile::tempdir()?;
    let etcd = Etcd::start(dir.path())?;
    let alone = ServerProc::start(&dir.path().join("alone"), "").await?;
    let solo = {
        let port = free_port()?;
        let config = format!(
            "[cluster]\nnode_id = \"solo\"\nadvertise = \"http://127.0.0.1:{port}\"\netcd = [\"{}\"]\netcd_prefix = \"/solo\"\n",
            etcd.url
        );
        ServerProc::start_on(port, &dir.path().join("solo"), &config, &[], None).await?
    };
    let mut nodes = Vec::new();
    let mut configs = Vec::new();
    for (id, region) in [("n1", "eu"), ("n2", "us")] {
        let port = free_port()?;
        let config = format!(
            "[cluster]\nnode_id = \"{id}\"\nregion = \"{region}\"\nadvertise = \"http://127.0.0.1:{port}\"\netcd = [\"{}\"]\n",
            etcd.url
        );
        nodes.push(ServerProc::start_on(port, &dir.path().join(id), &config, &[], None).await?);
        configs.push((port, config));
    }
    wait_for_slots(nodes[0].addr, 2, 100).await?;
    wait_for_slots(solo.addr, 1, 100).await?;
    // A deploy on node 1 reaches node 2.
    nodes[0].deploy_counter(serde_json::json!({})).await?;
    alone.deploy_counter(serde_json::json!({})).await?;
    solo.deploy_counter(serde_json::json!({})).await?;

    // Create the actors through node 1, half of them in node 2's region,
    // and sort them by owner.
    let mut owned: [Vec<String>; 2] = [Vec::new(), Vec::new()];
    let mut c = Conn::connect(nodes[0].addr).await?;
    for i in 0..actors * 2 {
        let path = format!("/v1/actors/counter/a{i}");
        let region = if i % 2 == 0 { "eu" } else { "us" };
        c.post(&format!("{path}?region={region}"), br#"{"by":1}"#)
            .await?;
        let (_, info) = c.get(&path).await?;
        let info: serde_json::Value = serde_json::from_slice(&info)?;
        match info["node"].as_str() {
            Some("n1") if owned[0].len() < actors => owned[0].push(path),
            Some("n2") if owned[1].len() < actors => owned[1].push(path),
            _ => {}
        }
        if owned.iter().all(|o| o.len() == actors) {
            break;
        }
    }
    for addr in [alone.addr, solo.addr] {
        let mut c = Conn::connect(addr).await?;
        for p in &owned[0] {
            c.post(p, br#"{"by":1}"#).await?;
        }
    }
    println!(
        "cluster: 2 nodes on one etcd, {actors} actors per side, {conns} connections, {}s × {} rounds",
        args.duration, args.rounds
    );

    let sides: [(&str, SocketAddr, &Vec<String>); 4] = [
        ("alone", alone.addr, &owned[0]),
        ("no-backup", solo.addr, &owned[0]),
        ("owner", nodes[0].addr, &owned[0]),
        ("forwarded", nodes[0].addr, &owned[1]),
    ];
    let mut results: Vec<Vec<(f64, Percentiles)>> = vec![Vec::new(); sides.len()];
    for round in 0..args.rounds {
        for (i, (name, addr, paths)) in sides.iter().enumerate() {
            let (rate, lat) = load(*addr, paths, conns, duration).await?;
            println!(
                "  round {} {name:<9} {rate:>9.0} turns/s  p50 {:>6.2} ms  p99 {:>6.2} ms",
                round + 1,
                ms(lat.p50),
                ms(lat.p99)
            );
            results[i].push((rate, lat));
        }
    }
    let best = |i: usize| {
        results[i]
            .iter()
            .max_by(|a, b| a.0.total_cmp(&b.0))
            .cloned()
            .expect("at least one round")
    };
    let (alone_r, alone_l) = best(0);
    let (solo_r, solo_l) = best(1);
    let (owner_r, owner_l) = best(2);
    let (fwd_r, fwd_l) = best(3);
    println!("  best of {} rounds:", args.rounds);
    println!(
        "  no-backup / alone  {:.2}×  (p50 {:+.3} ms: routing and fencing)",
        solo_r / alone_r,
        ms(solo_l.p50) - ms(alone_l.p50)
    );
    println!(
        "  owner / no-backup  {:.2}×  (p50 {:+.3} ms, p99 {:+.3} ms: the synchronous backup)",
        owner_r / solo_r,
        ms(owner_l.p50) - ms(solo_l.p50),
        ms(owner_l.p99) - ms(solo_l.p99)
    );
    println!(
        "  forwarded / owner  {:.2}×  (p50 {:+.3} ms, p99 {:+.3} ms: the extra hop)",
        fwd_r / owner_r,
        ms(fwd_l.p50) - ms(owner_l.p50),
        ms(fwd_l.p99) - ms(owner_l.p99)
    );
    drop(solo);
    drop(alone);
    moves(nodes[0].addr, &owned[0], args.moves).await?;

    // Failovers: kill -9 node 2 and time until one of its actors answers
    // through node 1 (served by node 1, its backup). Node 2 comes back
    // (as an empty-handed member) before the next one; each round uses
    // an actor it owns then, with node 1 as the backup.
    let mut times = Vec::new();
    for round in 0..args.failovers {
        // (After a failover the used slots stay with node 1: node 2 gets
        // unused ones back.)
        wait_for_slots(nodes[0].addr, 2, 1).await?;
        let Some(victim) = actor_owned_by(nodes[0].addr, "n2", round).await? else {
            anyhow::bail!("no actor with n2 as owner and n1 as backup");
        };
        nodes[1].kill9();
        let killed = Instant::now();
        let deadline = killed + Duration::from_secs(60);
        loop {
            let mut c = Conn::connect(nodes[0].addr).await?;
            let (status, _) = c
                .request("POST", &victim, "application/json", br#"{"by":1}"#)
                .await?;
            if status == 200 {
                break;
            }
            anyhow::ensure!(Instant::now() < deadline, "no failover within 60 s");
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        let t = killed.elapsed();
        println!(
            "  failover {}: served again {:.2} s after kill -9",
            round + 1,
            t.as_secs_f64()
        );
        times.push(t);
        let (port, config) = &configs[1];
        nodes[1] = ServerProc::start_on(*port, &dir.path().join("n2"), config, &[], None).await?;
    }
    if !times.is_empty() {
        let p = Percentiles::of(&mut times);
        println!(
            "  failover time over {} kills: p50 {:.2} s, p99 {:.2} s (lease TTL 5 s + 2 s grace)",
            times.len(),
            p.p50.as_secs_f64(),
            p.p99.as_secs_f64()
        );
    }
    drop(nodes);
    drop(etcd);
    Ok(())
}

/// Move `count` of node 1's actors (`paths`) to node 2's region and back,
/// through node 1, and print how long a move takes (fence, copy to the new
/// owner and its backup, switch, drop).
async fn moves(node: SocketAddr, paths: &[String], count: usize) -> anyhow::Result<()> {
    if count == 0 {
        return Ok(());
    }
    let mut c = Conn::connect(node).await?;
    let mut times = Vec::new();
    for path in paths.iter().cycle().take(count) {
        for region in ["us", "eu"] {
            let started = Instant::now();
            let (status, body) = c
                .request(
                    "POST",
                    &format!("{path}/move?region={region}"),
                    "application/json",
                    b"",
                )
                .await?;
            anyhow::ensure!(
                status == 200,
                "moving {path} to {region}: {status} {}",
                String::from_utf8_lossy(&body)
            );
            times.push(started.elapsed());
        }
    }
    let p = Percentiles::of(&mut times);
    println!(
        "  moves between regions ({} of them, state of a counter): p50 {:.2} ms, p99 {:.2} ms",
        times.len(),
        ms(p.p50),
        ms(p.p99)
    );
    Ok(())
}

/// An actor (a fresh one per `round`) owned by `owner` with a backup, as
/// `node` routes it: created through `node` (in the owner's region, us)
/// until one lands there.
async fn actor_owned_by(
    node: SocketAddr,
    owner: &str,
    round: usize,
) -> anyhow::Result<Option<String>> {
    let mut c = Conn::connect(node).await?;
    for i in 0..200 {
        let path = format!("/v1/actors/counter/failover-{round}-{i}");
        let (status, _) = c
            .request(
                "POST",
                &format!("{path}?region=us"),
                "application/json",
                br#"{"by":1}"#,
            )
            .await?;
        if status != 200 {
            continue;
        }
        let (_, info) = c.get(&path).await?;
        let info: serde_json::Value = serde_json::from_slice(&info)?;
        if info["node"] == owner && !info["backup"].is_null() {
            return Ok(Some(path));
        }
    }
    Ok(None)
}

fn ms(d: Duration) -> f64 {
    d.as_secs_f64() * 1e3
}

/// Wait until node `addr` sees every slot assigned and `members` live
/// nodes holding more than `min` each.
async fn wait_for_slots(addr: SocketAddr, members: usize, min: u64) -> anyhow::Result<()> {
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let mut c = Conn::connect(addr).await?;
        let (_, body) = c.get("/v1/cluster").await?;
        let v: serde_json::Value = serde_json::from_slice(&body)?;
        let both = v["members"].as_array().is_some_and(|m| {
            m.iter()
                .filter(|m| m["alive"] == true && m["slots"].as_u64() > Some(min))
                .count()
                == members
        });
        if v["slots_assigned"] == 1024 && both {
            return Ok(());
        }
        anyhow::ensure!(Instant::now() < deadline, "the cluster did not settle: {v}");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// Closed-loop durable turns over `paths` from `conns` connections.
async fn load(
    addr: SocketAddr,
    paths: &[String],
    conns: usize,
    duration: Duration,
) -> anyhow::Result<(f64, Percentiles)> {
    let started = Instant::now();
    let deadline = started + duration;
    let mut tasks = Vec::with_capacity(conns);
    for t in 0..conns {
        let paths = paths.to_vec();
        tasks.push(tokio::spawn(async move {
            let mut c = Conn::connect(addr).await?;
            let mut lat = Vec::new();
            let mut i = t * 7919;
            while Instant::now() < deadline {
                i += 1;
                let s = Instant::now();
                let (status, _) = c
                    .request(
                        "POST",
                        &paths[i % paths.len()],
                        "application/json",
                        br#"{"by":1}"#,
                    )
                    .await?;
                anyhow::ensure!(status == 200, "a turn failed with {status}");
                lat.push(s.elapsed());
            }
            anyhow::Ok(lat)
        }));
    }
    let mut all = Vec::new();
    for t in tasks {
        all.extend(t.await??);
    }
    let rate = all.len() as f64 / started.elapsed().as_secs_f64();
    Ok((rate, Percentiles::of(&mut all)))
}
