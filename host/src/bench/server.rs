//! A `marmot dev` child process for benchmarks that measure over HTTP or
//! read the node's RSS.

use std::net::SocketAddr;
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use anyhow::Context as _;

use super::http::Conn;

/// A node in its own process.
pub(super) struct ServerProc {
    child: Child,
    pub addr: SocketAddr,
    data: std::path::PathBuf,
}

impl ServerProc {
    /// Start `marmot dev` on `data` with `config` (TOML) and wait for readiness.
    pub async fn start(data: &Path, config: &str) -> anyhow::Result<Self> {
        Self::start_with(data, config, &[], None).await
    }

    /// [`Self::start`] with extra environment variables, and the node's
    /// log appended to `log` instead of this process's stderr.
    pub async fn start_with(
        data: &Path,
        config: &str,
        env: &[(&str, &str)],
        log: Option<&Path>,
    ) -> anyhow::Result<Self> {
        Self::start_on(free_port()?, data, config, env, log).await
    }

    /// [`Self::start_with`] on `port` (which the config may name, e.g. a
    /// cluster node's advertise URL).
    pub async fn start_on(
        port: u16,
        data: &Path,
        config: &str,
        env: &[(&str, &str)],
        log: Option<&Path>,
    ) -> anyhow::Result<Self> {
        let addr: SocketAddr = ([127, 0, 0, 1], port).into();
        let config_path = data.with_extension("toml");
        std::fs::write(&config_path, config)?;
        let stderr = match log {
            Some(path) => Stdio::from(
                std::fs::OpenOptions::new()
                    .create(true)
                    .append(true)
                    .open(path)?,
            ),
            None => Stdio::inherit(),
        };
        let child = Command::new(std::env::current_exe()?)
            .args(["dev", "--no-examples", "--listen"])
            .arg(addr.to_string())
            .arg("--data")
            .arg(data)
            .arg("--config")
            .arg(&config_path)
            .env("MARMOT_LOG", "warn")
            .envs(env.iter().copied())
            .stdout(Stdio::null())
            .stderr(stderr)
            .spawn()
            .context("cannot start the benchmark node")?;
        let mut s = Self {
            child,
            addr,
            data: data.to_owned(),
        };
        let ready = (Duration::from_secs(300), "/readyz", 200);
        wait_until_serving(&mut s.child, addr, ready, "benchmark node").await?;
        Ok(s)
    }

    /// Resident set size in bytes.
    pub fn rss(&self) -> anyhow::Result<u64> {
        rss_of(self.child.id())
    }

    /// Proportional set size (shared pages divided among their mappers):
    /// the physical memory the process accounts for.
    pub fn pss(&self) -> anyhow::Result<u64> {
        pss_of(self.child.id())
    }

    /// The process id.
    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    /// Number of memory mappings of the node.
    pub fn map_count(&self) -> anyhow::Result<usize> {
        Ok(
            std::fs::read_to_string(format!("/proc/{}/maps", self.child.id()))?
                .lines()
                .count(),
        )
    }

    /// CPU time (user + system) the node has used so far.
    pub fn cpu_time(&self) -> anyhow::Result<Duration> {
        cpu_of(self.child.id())
    }

    /// CPU time (user + system) the node's storage writer thread has used
    /// so far: it applies and commits every batch, one at a time.
    pub fn writer_cpu_time(&self) -> anyhow::Result<Duration> {
        thread_cpu_of(self.child.id(), "marmot-writer")
    }

    /// Bytes the node has sent to storage so far: what its commits made
    /// the disk write.
    pub fn written_bytes(&self) -> anyhow::Result<Written> {
        Ok(match disk_writes(&self.data) {
            Some((bytes, requests)) => Written {
                bytes,
                requests: Some(requests),
            },
            None => Written {
                bytes: written_bytes_of(self.child.id())?,
                requests: None,
            },
        })
    }

    /// Deploy the counter example with `config` (JSON).
    pub async fn deploy_counter(&self, config: serde_json::Value) -> anyhow::Result<()> {
        use base64::Engine as _;
        let manifest = serde_json::json!({
            "kind": "wasm",
            "code_base64": base64::engine::general_purpose::STANDARD.encode(crate::guests::COUNTER),
            "config": config,
        });
        let mut c = Conn::connect(self.addr).await?;
        let (status, body) = c
            .request(
                "PUT",
                "/v1/types/counter",
                "application/json",
                &serde_json::to_vec(&manifest)?,
            )
            .await?;
        anyhow::ensure!(
            status < 300,
            "deploy failed: {status} {}",
            String::from_utf8_lossy(&body)
        );
        Ok(())
    }

    /// Deploy a JavaScript type.
    pub async fn deploy_js(
        &self,
        ty: &str,
        source: &str,
        config: serde_json::Value,
    ) -> anyhow::Result<()> {
        let manifest = serde_json::json!({ "kind": "js", "code": source, "config": config });
        let mut c = Conn::connect(self.addr).await?;
        let (status, body) = c
            .request(
                "PUT",
                &format!("/v1/types/{ty}"),
                "application/json",
                &serde_json::to_vec(&manifest)?,
            )
            .await?;
        anyhow::ensure!(
            status < 300,
            "deploy failed: {status} {}",
            String::from_utf8_lossy(&body)
        );
        Ok(())
    }

    /// `kill -9` the node and reap it.
    pub fn kill9(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }

    /// Stop the node (SIGTERM, then SIGKILL).
    pub fn stop(mut self) {
        let _ = Command::new("kill")
            .arg(self.child.id().to_string())
            .status();
        let deadline = Instant::now() + Duration::from_secs(10);
        while Instant::now() < deadline {
            if let Ok(Some(_)) = self.child.try_wait() {
                return;
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

impl Drop for ServerProc {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// A free loopback port.
pub(super) fn free_port() -> anyhow::Result<u16> {
    Ok(std::net::TcpListener::bind("127.0.0.1:0")?
        .local_addr()?
        .port())
}

/// Resident set size of process `pid`, in bytes.
pub(super) fn rss_of(pid: u32) -> anyhow::Result<u64> {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status"))?;
    let kb: u64 = status
        .lines()
        .find(|l| l.starts_with("VmRSS:"))
        .and_then(|l| l.split_whitespace().nth(1))
        .and_then(|v| v.parse().ok())
        .context("no VmRSS in /proc/<pid>/status")?;
    Ok(kb * 1024)
}

/// Proportional set size of process `pid`, in bytes. RSS counts a page
/// once per mapping of it: the copy-on-write snapshot pages that every
/// JavaScript sandbox maps count once per sandbox in RSS, once in PSS.
pub(super) fn pss_of(pid: u32) -> anyhow::Result<u64> {
    let rollup = std::fs::read_to_string(format!("/proc/{pid}/smaps_rollup"))?;
    let kb: u64 = rollup
        .lines()
        .find(|l| l.starts_with("Pss:"))
        .and_then(|l| l.split_whitespace().nth(1))
        .and_then(|v| v.parse().ok())
        .context("no Pss in /proc/<pid>/smaps_rollup")?;
    Ok(kb * 1024)
}

/// Fields `ns` (1-based, as in proc(5), each from the 3rd on: the ones
/// after the parenthesised command name) of `/proc/{pid}/stat`, read once.
fn stat_fields<const N: usize>(pid: u32, ns: [usize; N]) -> anyhow::Result<[u64; N]> {
    stat_fields_at(&format!("/proc/{pid}/stat"), ns)
}

/// Fields `ns`, numbered as for [`stat_fields`], of the stat file at
/// `path` (a process's or a thread's).
fn stat_fields_at<const N: usize>(path: &str, ns: [usize; N]) -> anyhow::Result<[u64; N]> {
    let stat = std::fs::read_to_string(path)?;
    let rest = stat
        .rsplit_once(')')
        .map(|(_, r)| r)
        .context("malformed /proc/<pid>/stat")?;
    let fields: Vec<&str> = rest.split_whitespace().collect();
    let mut out = [0; N];
    for (o, n) in out.iter_mut().zip(ns) {
        *o = fields
            .get(n - 3)
            .context("short /proc/<pid>/stat")?
            .parse()?;
    }
    Ok(out)
}

/// CPU time (user + system) process `pid` has used so far.
pub(super) fn cpu_of(pid: u32) -> anyhow::Result<Duration> {
    let [utime, stime] = stat_fields(pid, [14, 15])?;
    Ok(from_ticks(utime + stime))
}

/// CPU time from clock ticks of a stat file (utime, stime): USER_HZ, which
/// is 100 on every architecture Linux supports.
fn from_ticks(ticks: u64) -> Duration {
    Duration::from_millis(ticks * 10)
}

/// CPU time (user + system) the threads of process `pid` named `name`
/// have used so far (threads that ended no longer count).
pub(super) fn thread_cpu_of(pid: u32, name: &str) -> anyhow::Result<Duration> {
    let mut ticks = 0;
    for task in std::fs::read_dir(format!("/proc/{pid}/task"))? {
        let dir = task?.path();
        // A thread may end between the listing and the reads.
        let Ok(comm) = std::fs::read_to_string(dir.join("comm")) else {
            continue;
        };
        if comm.trim_end() != name {
            continue;
        }
        if let Ok([utime, stime]) = stat_fields_at(&dir.join("stat").to_string_lossy(), [14, 15]) {
            ticks += utime + stime;
        }
    }
    Ok(from_ticks(ticks))
}

/// What was written to storage: bytes, and write requests when they are
/// known (from the block device).
#[derive(Clone, Copy, Debug)]
pub(super) struct Written {
    pub bytes: u64,
    pub requests: Option<u64>,
}

impl Written {
    pub fn saturating_sub(self, before: Written) -> Written {
        Written {
            bytes: self.bytes.saturating_sub(before.bytes),
            requests: self
                .requests
                .zip(before.requests)
                .map(|(a, b)| a.saturating_sub(b)),
        }
    }
}

/// (bytes, write requests) the block device holding `data` completed so
/// far, from `/sys/dev/block/MAJ:MIN/stat`: the whole device, so another
/// writer on it would count too (the benchmark machine is otherwise idle).
/// `None` where `data` is not on a block device (tmpfs).
///
/// Preferred to the node's `write_bytes` in `/proc/PID/io`, which counts a
/// page-cache folio each time a write makes it dirty: ext4 caches the
/// journal's sequential writes in large folios, so every commit counted a
/// whole folio (~1 MB) for a few KiB written.
pub(super) fn disk_writes(data: &Path) -> Option<(u64, u64)> {
    use std::os::unix::fs::MetadataExt as _;
    let dev = std::fs::metadata(data).ok()?.dev();
    let major = ((dev >> 32) & 0xffff_f000) | ((dev >> 8) & 0x0000_0fff);
    let minor = ((dev >> 12) & 0xffff_ff00) | (dev & 0x0000_00ff);
    let stat = std::fs::read_to_string(format!("/sys/dev/block/{major}:{minor}/stat")).ok()?;
    let fields: Vec<u64> = stat
        .split_whitespace()
        .filter_map(|f| f.parse().ok())
        .collect();
    // Field 5: writes completed; field 7: sectors written (512 bytes).
    Some((fields.get(6)? * 512, *fields.get(4)?))
}

/// Bytes process `pid` has caused to be sent to storage so far
/// (`write_bytes` of `/proc/PID/io`: page-cache pages it dirtied, whether
/// or not they have been written back yet; threads that ended included).
pub(super) fn written_bytes_of(pid: u32) -> anyhow::Result<u64> {
    let io = std::fs::read_to_string(format!("/proc/{pid}/io"))
        .with_context(|| format!("cannot read /proc/{pid}/io"))?;
    io.lines()
        .find_map(|l| l.strip_prefix("write_bytes:"))
        .and_then(|v| v.trim().parse().ok())
        .context("no write_bytes in /proc/PID/io")
}

/// Minor page faults process `pid` has taken so far: on a wake, mostly
/// copy-on-write faults on a sandbox's snapshot pages. Steadier than time
/// on a noisy machine.
pub(super) fn minor_faults_of(pid: u32) -> anyhow::Result<u64> {
    let [minflt] = stat_fields(pid, [10])?;
    Ok(minflt)
}

/// TLB shootdowns this machine's cores have taken so far (the `TLB` row
/// of `/proc/interrupts`; `None` where there is none): on a virtual
/// machine each is a VM exit, and JavaScript sandboxes cause them by
/// replacing or dropping page table entries of their memories. Counted for
/// the whole machine, so read it on an otherwise quiet one.
pub(super) fn tlb_shootdowns() -> Option<u64> {
    let interrupts = std::fs::read_to_string("/proc/interrupts").ok()?;
    let row = interrupts
        .lines()
        .find_map(|l| l.trim_start().strip_prefix("TLB:"))?;
    Some(
        row.split_whitespace()
            .map_while(|n| n.parse::<u64>().ok())
            .sum(),
    )
}

/// Wait until `GET path` on `addr` answers `status`, within `timeout`;
/// fail at once if `child` (called `what`) exits first.
pub(super) async fn wait_until_serving(
    child: &mut Child,
    addr: SocketAddr,
    (timeout, path, status): (Duration, &str, u16),
    what: &str,
) -> anyhow::Result<()> {
    let deadline = Instant::now() + timeout;
    loop {
        if let Some(exit) = child.try_wait()? {
            anyhow::bail!("{what} exited: {exit}");
        }
        if let Ok(mut c) = Conn::connect(addr).await
            && let Ok((got, _)) = c.get(path).await
            && got == status
        {
            return Ok(());
        }
        anyhow::ensure!(Instant::now() < deadline, "{what} did not become ready");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// Node configuration (TOML) that keeps `actors` actors awake at once: the
/// default configuration up to its active cap (JavaScript sandboxes
/// included), a larger cap beyond it.
pub(super) fn limits_for(actors: usize) -> String {
    let default = crate::config::Limits::default().max_active_actors;
    if actors <= default {
        String::new()
    } else {
        format!("[limits]\nmax_active_actors = {actors}\n")
    }
}
