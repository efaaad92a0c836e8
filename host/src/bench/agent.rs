//! `marmot bench agent`: the built-in agent harness against the fake
//! provider (in this process), with the node as a separate `marmot dev`
//! process so its CPU and memory are its own.
//!
//! 1. **Overhead per step.** Runs of one model step that calls a tool
//!    (`files`, which commits with its turn), the tool step, and a final
//!    model step: the second run of each of 200 conversations (the first
//!    woke the actor). Model time is a plain
//!    streamed request to the fake with the same shape, measured in the
//!    same rounds; overhead per step = (run − 2 × model p50) / 3 steps, each
//!    including its commit (the run is 5 turns: input, step, prepare, exec,
//!    step).
//! 2. **Concurrent runs.** `--actors` (default 1,000) agents each start a
//!    run at once; the fake streams every answer over about 200 ms. Node
//!    CPU and RSS are sampled during the runs.
//! 3. **Hibernated.** The agents go idle and hibernate: RSS after, and the
//!    database bytes per agent. Phases 2 and 3 run three times, with
//!    different agents: RSS after the later waves shows whether what stays resident
//!    grows with the agents hibernated (it should not: it is the
//!    allocator's and the pools' reuse, not the agents').

use std::time::{Duration, Instant};

use serde_json::json;

use super::server::ServerProc;
use super::{BenchArgs, Percentiles, progress};
use crate::fake_provider::{Behaviour, FakeProvider};

const MB: f64 = 1024.0 * 1024.0;

pub(super) async fn agent(args: &BenchArgs) -> anyhow::Result<()> {
    let n = args.actors.unwrap_or(1000);
    let rounds = 200;
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
    let fake = FakeProvider::start(listener, Behaviour::Echo, None);
    let dir = tempfile::Builder::new().prefix("marmot-bench-").tempdir()?;
    let data = dir.path().join("data");
    let config = format!("[limits]\nmax_active_actors = {}\n", n + 1000);
    let server = ServerProc::start(&data, &config).await?;
    let base = format!("http://{}", server.addr);
    let http = reqwest::Client::builder()
        .no_proxy()
        .pool_max_idle_per_host(n + 16)
        .timeout(Duration::from_secs(600))
        .build()?;
    let put = |path: String, body: serde_json::Value| {
        let http = http.clone();
        let url = format!("{base}{path}");
        async move {
            let r = http.put(url).json(&body).send().await?;
            anyhow::ensure!(r.status().is_success(), "PUT {path}: {}", r.text().await?);
            anyhow::Ok(())
        }
    };
    put(
        "/v1/providers/fake".into(),
        json!({"format": "openai-chat", "base_url": fake.base_url("127.0.0.1")}),
    )
    .await?;
    put(
        "/v1/types/bot".into(),
        json!({"kind": "agent",
               "agent": {"instructions": "Benchmark agent.", "model": {"provider": "fake", "name": "m"},
                         "tools": [{"kind": "files"}]},
               "config": {"idle_timeout_ms": 3_000}}),
    )
    .await?;

    // 1. Overhead per step, alternating with plain model requests.
    let tool_input = r#"call files {"op":"write","path":"outputs/r.md","content":"x"}"#;
    let plain_body = json!({"model": "m", "stream": true, "stream_options": {"include_usage": true},
        "messages": [{"role": "system", "content": "Benchmark agent."}, {"role": "user", "content": "hello"}],
        "tools": [{"type": "function", "function": {"name": "files", "parameters": {"type": "object"}}}]});
    let model_url = format!("{}/chat/completions", fake.base_url("127.0.0.1"));
    let mut model = Vec::with_capacity(rounds);
    let mut runs = Vec::with_capacity(rounds);
    let run = |actor: String| {
        let http = http.clone();
        let url = format!("{base}/v1/actors/bot/{actor}");
        async move {
            let r = http
                .post(url)
                .json(&json!({"input": tool_input}))
                .send()
                .await?;
            anyhow::ensure!(r.status() == 200, "run: {}", r.text().await?);
            let body: serde_json::Value = r.json().await?;
            anyhow::ensure!(body["steps"] == 2, "unexpected run: {body}");
            anyhow::Ok(())
        }
    };
    // A conversation's history grows with every run and every model step
    // sends all of it, so one agent run over and over measures a growing
    // transcript; each round is the second run of its own conversation.
    for i in 0..rounds + 10 {
        run(format!("s{i}")).await?;
        let t = Instant::now();
        http.post(&model_url)
            .json(&plain_body)
            .send()
            .await?
            .bytes()
            .await?;
        let m = t.elapsed();
        let t = Instant::now();
        run(format!("s{i}")).await?;
        let took = t.elapsed();
        if i >= 10 {
            model.push(m);
            runs.push(took);
        }
        progress("runs", i + 1, rounds + 10);
    }
    let model_p = Percentiles::of(&mut model);
    let mut per_step: Vec<Duration> = runs
        .iter()
        .map(|r| r.saturating_sub(model_p.p50 * 2) / 3)
        .collect();
    let run_p = Percentiles::of(&mut runs);
    let step_p = Percentiles::of(&mut per_step);
    println!("scenario agent (node in its own process, fake provider in this one)");
    println!("  plain streamed model request     {}", model_p.line());
    println!("  run: model → tool → model        {}", run_p.line());
    println!(
        "  harness overhead per step        {}   (target p50 ≤ 1 ms, commit included)",
        step_p.line()
    );

    // 2 and 3, three times with different agents: the later waves show
    // whether memory left after hibernation grows with the agents
    // hibernated.
    fake.set_timing(Duration::ZERO, Duration::from_millis(40));
    for (k, wave) in ["u", "v", "w"].into_iter().enumerate() {
        concurrent_wave(&server, &http, &base, n, wave).await?;
        let (active, rss_idle) = hibernated(&server).await?;
        let db = std::fs::metadata(data.join("marmot.redb"))?.len();
        let agents = (rounds + 10) + n * (k + 1);
        println!(
            "  after hibernation: {active} active, RSS {:.1} MB; database {:.1} MB for {agents} agents ({:.1} KB per agent, transcripts and events included)",
            rss_idle as f64 / MB,
            db as f64 / MB,
            db as f64 / agents as f64 / 1024.0
        );
    }
    server.stop();
    Ok(())
}

/// `n` agents (`{prefix}{i}`) start a run at once; prints wall time, run
/// latency, and the node's CPU and RSS during the runs.
async fn concurrent_wave(
    server: &ServerProc,
    http: &reqwest::Client,
    base: &str,
    n: usize,
    prefix: &str,
) -> anyhow::Result<()> {
    let input = "tell me something short"; // "You said: …": 5 words, 5 × 40 ms
    let rss_before = server.rss()?;
    let cpu_before = server.cpu_time()?;
    let started = Instant::now();
    let pid = server.pid();
    let peak = std::sync::Arc::new(std::sync::atomic::AtomicU64::new(rss_before));
    let sampler = {
        let peak = peak.clone();
        tokio::spawn(async move {
            loop {
                if let Ok(r) = super::server::rss_of(pid) {
                    peak.fetch_max(r, std::sync::atomic::Ordering::Relaxed);
                }
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
        })
    };
    let tasks: Vec<_> = (0..n)
        .map(|i| {
            let http = http.clone();
            let url = format!("{base}/v1/actors/bot/{prefix}{i}");
            tokio::spawn(async move {
                let t = Instant::now();
                let r = http.post(url).json(&json!({"input": input})).send().await?;
                anyhow::ensure!(r.status() == 200, "run: {}", r.text().await?);
                anyhow::Ok(t.elapsed())
            })
        })
        .collect();
    let mut lat = Vec::with_capacity(n);
    for (i, t) in tasks.into_iter().enumerate() {
        lat.push(t.await??);
        progress("concurrent runs", i + 1, n);
    }
    let wall = started.elapsed();
    let cpu = server.cpu_time()?.saturating_sub(cpu_before);
    sampler.abort();
    let peak = peak.load(std::sync::atomic::Ordering::Relaxed);
    let lat_p = Percentiles::of(&mut lat);
    println!(
        "  {n} concurrent runs, answers streamed over ~200 ms: all done in {:.2}s; per run {}",
        wall.as_secs_f64(),
        lat_p.line()
    );
    println!(
        "  node CPU {:.2}s ({:.1} ms per run); RSS before {:.1} MB, peak during the runs {:.1} MB ({:.1} KB per awake agent)",
        cpu.as_secs_f64(),
        cpu.as_secs_f64() * 1e3 / n as f64,
        rss_before as f64 / MB,
        peak as f64 / MB,
        peak.saturating_sub(rss_before) as f64 / n as f64 / 1024.0
    );
    Ok(())
}

/// Waits (up to a minute) until no actor is active; the count and the
/// node's RSS then.
async fn hibernated(server: &ServerProc) -> anyhow::Result<(f64, u64)> {
    let active = || async {
        let text = super::http::metrics(server.addr).await?;
        anyhow::Ok(super::http::sample(&text, "marmot_actors_active").unwrap_or(-1.0))
    };
    let deadline = Instant::now() + Duration::from_secs(60);
    while active().await? > 0.0 && Instant::now() < deadline {
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    Ok((active().await?, server.rss()?))
}
