//! Memory: RSS and PSS with many active actors, and what many hibernated
//! ones add.

use super::BenchArgs;
use super::http::create_actors;
use super::server::ServerProc;
use super::smaps::pss_by_kind;

const MB: f64 = 1024.0 * 1024.0;

/// RSS with `n` active counters (default 10,000).
pub(super) async fn active(args: &BenchArgs) -> anyhow::Result<()> {
    let n = args.actors.unwrap_or(10_000);
    let dir = tempfile::Builder::new().prefix("marmot-bench-").tempdir()?;
    let config = super::server::limits_for(n);
    let data = dir.path().join("data");
    let server = ServerProc::start(&data, &config).await?;
    server
        .deploy_counter(serde_json::json!({"idle_timeout_ms": 3_600_000}))
        .await?;
    // Measure a node that loads the type from its compiled-code cache, as
    // every node does after its first deploy: compiler memory is not counted.
    server.stop();
    let server = ServerProc::start(&data, &config).await?;
    create_actors(server.addr, 1).await?;
    let (base, base_pss) = (server.rss()?, server.pss()?);
    let base_kinds = pss_by_kind(server.pid())?;
    create_actors(server.addr, n).await?;
    let (full, full_pss) = (server.rss()?, server.pss()?);
    let full_kinds = pss_by_kind(server.pid())?;
    let maps = server.map_count()?;
    println!("scenario rss-active ({n} active counter actors, each with its own instance)");
    println!(
        "  RSS idle node: {:.1} MB   with {n} active: {:.1} MB   per actor: {:.1} KB",
        base as f64 / MB,
        full as f64 / MB,
        (full.saturating_sub(base)) as f64 / n as f64 / 1024.0
    );
    println!(
        "  PSS idle node: {:.1} MB   with {n} active: {:.1} MB   per actor: {:.1} KB",
        base_pss as f64 / MB,
        full_pss as f64 / MB,
        (full_pss.saturating_sub(base_pss)) as f64 / n as f64 / 1024.0
    );
    println!(
        "  PSS per actor by mapping: {}",
        (full_kinds - base_kinds).per_actor(n)
    );
    // Idle a moment, every instance is trimmed: its stack pages go back.
    // Done when the count has grown and then held for a second.
    let cpu_before = server.cpu_time()?;
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(60);
    let mut last = 0.0;
    while std::time::Instant::now() < deadline {
        tokio::time::sleep(std::time::Duration::from_secs(1)).await;
        let now = super::http::trimmed_stack_pages(server.addr).await?;
        if now > 0.0 && now == last {
            break;
        }
        last = now;
    }
    let cpu = server.cpu_time()?.saturating_sub(cpu_before);
    let (idle_pss, idle_kinds) = (server.pss()?, pss_by_kind(server.pid())?);
    println!(
        "  once idle and trimmed ({last:.0} stack pages given back): PSS {:.1} MB, per actor \
         {:.1} KB   node CPU per actor trimmed {:.0} µs (the idle node's own included)",
        idle_pss as f64 / MB,
        (idle_pss.saturating_sub(base_pss)) as f64 / n as f64 / 1024.0,
        cpu.as_secs_f64() * 1e6 / n as f64
    );
    println!("    by mapping: {}", (idle_kinds - base_kinds).per_actor(n));
    println!("  memory mappings: {maps} (Linux default limit 65530)");
    server.stop();
    Ok(())
}

/// RSS added by `n` hibernated actors on disk (default 1,000,000).
pub(super) async fn hibernated(args: &BenchArgs) -> anyhow::Result<()> {
    let n = args.actors.unwrap_or(1_000_000);
    let dir = tempfile::Builder::new().prefix("marmot-bench-").tempdir()?;
    let data = dir.path().join("data");
    let config = "";
    // An empty node with the type deployed: the baseline.
    let server = ServerProc::start(&data, config).await?;
    server.deploy_counter(serde_json::json!({})).await?;
    server.stop();
    let server = ServerProc::start(&data, config).await?;
    create_actors(server.addr, 10).await?;
    let base = server.rss()?;
    server.stop();

    eprintln!("  writing {n} hibernated actors to disk…");
    let started = std::time::Instant::now();
    crate::storage::bulk::populate_counters(&data, "counter", n, |done, n| {
        super::progress_line("bulk insert", done, n)
    })?;
    eprintln!("  done in {:.1}s", started.elapsed().as_secs_f64());

    let started = std::time::Instant::now();
    let server = ServerProc::start(&data, config).await?;
    let restart = started.elapsed();
    create_actors(server.addr, 10).await?;
    let full = server.rss()?;
    let db = std::fs::metadata(data.join("marmot.redb"))?.len();
    // Wake a sample of the hibernated actors (read-only turns) from the
    // full database.
    let mut conn = super::http::Conn::connect(server.addr).await?;
    let mut lat = Vec::new();
    let sample = 2000.min(n);
    for _ in 0..sample {
        let i = rand::random_range(0..n);
        let t = std::time::Instant::now();
        let body = conn
            .post(&format!("/v1/actors/counter/b{i}"), br#"{"by":0}"#)
            .await?;
        lat.push(t.elapsed());
        anyhow::ensure!(
            &body[..] == br#"{"n":1}"#,
            "unexpected reply from b{i}: {body:?}"
        );
    }
    let woke = server.rss()?;
    println!("scenario rss-hibernated ({n} hibernated actors on disk)");
    println!(
        "  RSS with 10 actors on disk: {:.1} MB   with {n}: {:.1} MB   added: {:.1} MB   (database {:.0} MB, restart to ready {:.2}s)",
        base as f64 / MB,
        full as f64 / MB,
        full.saturating_sub(base) as f64 / MB,
        db as f64 / MB,
        restart.as_secs_f64()
    );
    println!(
        "  wake {sample} random hibernated actors over HTTP (read-only turn): {}",
        super::Percentiles::of(&mut lat).line()
    );
    println!(
        "  RSS after those wakes: {:.1} MB (instances stay until the idle timeout)",
        woke as f64 / MB
    );
    server.stop();
    Ok(())
}

/// RSS with `n` active JavaScript counters (default 1,000).
pub(super) async fn js_active(args: &BenchArgs) -> anyhow::Result<()> {
    let n = args.actors.unwrap_or(1_000);
    let dir = tempfile::Builder::new().prefix("marmot-bench-").tempdir()?;
    let config = super::server::limits_for(n);
    let data = dir.path().join("data");
    let server = ServerProc::start(&data, &config).await?;
    server
        .deploy_js(
            "jscounter",
            super::inproc::JS_COUNTER,
            serde_json::json!({"idle_timeout_ms": 3_600_000}),
        )
        .await?;
    // As for Rust actors: measure a node that loads the engine from its cache.
    server.stop();
    let server = ServerProc::start(&data, &config).await?;
    super::http::create_typed(server.addr, "jscounter", 1).await?;
    let (base, base_pss) = (server.rss()?, server.pss()?);
    let base_kinds = pss_by_kind(server.pid())?;
    let trims_before = super::http::trims(server.addr).await?;
    super::http::create_typed(server.addr, "jscounter", n).await?;
    let (full, full_pss) = (server.rss()?, server.pss()?);
    let full_kinds = pss_by_kind(server.pid())?;
    let trimmed_early = super::http::trims(server.addr).await? - trims_before;
    println!("scenario js-rss ({n} active JavaScript counter actors, each with its own sandbox)");
    let per_actor = |total: u64, base: u64| total.saturating_sub(base) as f64 / n as f64 / 1024.0;
    println!(
        "  RSS idle node: {:.1} MB   with {n} active: {:.1} MB   per actor: {:.1} KB",
        base as f64 / MB,
        full as f64 / MB,
        per_actor(full, base)
    );
    println!(
        "  PSS idle node: {:.1} MB   with {n} active: {:.1} MB   per actor: {:.1} KB   \
         (right after the last first turn; {trimmed_early:.0} sandboxes already trimmed)",
        base_pss as f64 / MB,
        full_pss as f64 / MB,
        per_actor(full_pss, base_pss)
    );
    println!("    by mapping: {}", (full_kinds - base_kinds).per_actor(n));
    // Every sandbox is trimmed once it has been idle a moment.
    let (cpu_before, trims_at) = (server.cpu_time()?, super::http::trims(server.addr).await?);
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(60);
    while super::http::trims(server.addr).await? - trims_before < n as f64
        && std::time::Instant::now() < deadline
    {
        tokio::time::sleep(std::time::Duration::from_millis(200)).await;
    }
    let (idle, idle_pss) = (server.rss()?, server.pss()?);
    let idle_kinds = pss_by_kind(server.pid())?;
    let trims_now = super::http::trims(server.addr).await?;
    let cpu = server.cpu_time()?.saturating_sub(cpu_before);
    println!(
        "  once idle and trimmed ({:.0} sandboxes): RSS {:.1} MB, per actor {:.1} KB   \
         PSS {:.1} MB, per actor {:.1} KB   node CPU per trim {:.0} µs",
        trims_now - trims_before,
        idle as f64 / MB,
        per_actor(idle, base),
        idle_pss as f64 / MB,
        per_actor(idle_pss, base_pss),
        cpu.as_secs_f64() * 1e6 / (trims_now - trims_at).max(1.0)
    );
    println!("    by mapping: {}", (idle_kinds - base_kinds).per_actor(n));
    println!(
        "  memory mappings: {} (Linux default limit 65530)",
        server.map_count()?
    );
    server.stop();
    Ok(())
}
