//! The peer for side-by-side runs: Cloudflare's workerd running the same
//! counter as a Durable Object on its local SQLite storage.
//!
//! The worker speaks Marmot's protocol for the counter (`POST
//! /v1/actors/counter/{id}` with `{"by": n}` → `{"n": …}`), so the same wrk
//! script drives both. The object reads and writes through the ordinary
//! Durable Object storage API (`ctx.storage.get/put`), which with
//! `enableSql = true` is SQLite, with the runtime's own output gate: a reply
//! waits for its write to be durable. Nothing is tuned down: default
//! compatibility settings, one process, as `workerd serve` runs it.

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use anyhow::Context as _;

use super::server::wait_until_serving;

/// The worker: a router and the counter object.
const WORKER_JS: &str = r#"import { DurableObject } from "cloudflare:workers";

export class Counter extends DurableObject {
  async fetch(request) {
    const text = await request.text();
    const by = (text ? JSON.parse(text).by : undefined) ?? 1;
    const n = ((await this.ctx.storage.get("n")) ?? 0) + by;
    if (by !== 0) await this.ctx.storage.put("n", n);
    return Response.json({ n });
  }
}

export default {
  async fetch(request, env) {
    const m = /^\/v1\/actors\/counter\/([^/]+)$/.exec(new URL(request.url).pathname);
    if (!m) return new Response("not found", { status: 404 });
    return env.COUNTER.get(env.COUNTER.idFromName(m[1])).fetch(request);
  },
};
"#;

/// `workerd serve` configuration; the socket address and the storage
/// directory are given on the command line.
const CONFIG_CAPNP: &str = r#"using Workerd = import "/workerd/workerd.capnp";

const config :Workerd.Config = (
  services = [
    (name = "main", worker = .counter),
    (name = "storage", disk = (writable = true)),
  ],
  sockets = [(name = "http", address = "127.0.0.1:0", http = (), service = "main")],
);

const counter :Workerd.Worker = (
  compatibilityDate = "2025-01-01",
  modules = [(name = "worker.js", esModule = embed "worker.js")],
  durableObjectNamespaces = [
    (className = "Counter", uniqueKey = "marmot-bench-counter", enableSql = true),
  ],
  durableObjectStorage = (localDisk = "storage"),
  bindings = [(name = "COUNTER", durableObjectNamespace = "Counter")],
);
"#;

/// A running workerd.
pub(super) struct Workerd {
    child: Child,
    pub addr: SocketAddr,
    pub version: String,
}

impl Workerd {
    /// Find the binary: `--workerd`/`MARMOT_WORKERD`, else where
    /// `scripts/bench-vs-workerd` installs it.
    pub fn locate(given: Option<&Path>) -> anyhow::Result<PathBuf> {
        if let Some(p) = given {
            anyhow::ensure!(p.is_file(), "workerd not found at {}", p.display());
            return Ok(p.to_owned());
        }
        let installed =
            Path::new("target/peers/workerd/node_modules/@cloudflare/workerd-linux-64/bin/workerd");
        anyhow::ensure!(
            installed.is_file(),
            "workerd is not installed: run scripts/bench-vs-workerd, or pass --workerd PATH"
        );
        Ok(installed.to_owned())
    }

    /// Start workerd in `dir` (config, worker and storage go there).
    pub async fn start(bin: &Path, dir: &Path) -> anyhow::Result<Self> {
        let version = Command::new(bin)
            .arg("--version")
            .output()
            .map(|o| String::from_utf8_lossy(&o.stdout).trim().to_owned())
            .context("cannot run workerd")?;
        std::fs::write(dir.join("config.capnp"), CONFIG_CAPNP)?;
        std::fs::write(dir.join("worker.js"), WORKER_JS)?;
        let storage = dir.join("storage");
        std::fs::create_dir_all(&storage)?;
        let port = std::net::TcpListener::bind("127.0.0.1:0")?
            .local_addr()?
            .port();
        let addr: SocketAddr = ([127, 0, 0, 1], port).into();
        let mut cmd = Command::new(bin);
        cmd.arg("serve")
            .arg(dir.join("config.capnp"))
            .arg(format!("--socket-addr=http={addr}"))
            .arg(format!("--directory-path=storage={}", storage.display()))
            .stdout(Stdio::null())
            .stderr(Stdio::inherit());
        with_system_huge_pages(&mut cmd);
        let child = cmd.spawn().context("cannot start workerd")?;
        let mut w = Self {
            child,
            addr,
            version,
        };
        // The worker answers 404 to anything but a counter.
        let ready = (Duration::from_secs(60), "/", 404);
        wait_until_serving(&mut w.child, addr, ready, "workerd").await?;
        Ok(w)
    }

    /// The process id, for RSS and CPU readings.
    pub fn pid(&self) -> u32 {
        self.child.id()
    }
}

impl Drop for Workerd {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// `marmot` turns transparent huge pages off for itself
/// (`cli/hugepages.rs`), and a child inherits that: the peer gets the
/// system's setting back, as its own users run it.
#[cfg(target_os = "linux")]
fn with_system_huge_pages(cmd: &mut Command) {
    use std::os::unix::process::CommandExt as _;
    // SAFETY: runs between fork and exec; `prctl` is a system call with
    // integer arguments (async-signal-safe), and nothing is allocated.
    #[allow(unsafe_code, reason = "a prctl between fork and exec")]
    unsafe {
        cmd.pre_exec(|| {
            libc::prctl(libc::PR_SET_THP_DISABLE, 0, 0, 0, 0);
            Ok(())
        });
    }
}

#[cfg(not(target_os = "linux"))]
fn with_system_huge_pages(_: &mut Command) {}
