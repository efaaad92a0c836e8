//! Memory: RSS with many active actors, and what many hibernated ones add.

use super::BenchArgs;
use super::http::create_actors;
use super::server::ServerProc;

const MB: f64 = 1024.0 * 1024.0;

/// RSS with `n` active counters (default 10,000).
pub(super) async fn active(args: &BenchArgs) -> anyhow::Result<()> {
    let n = args.actors.unwrap_or(10_000);
    let dir = tempfile::Builder::new().prefix("marmot-bench-").tempdir()?;
    let config = format!("[limits]\nmax_active_actors = {}\n", n + 1000);
    let server = ServerProc::start(&dir.path().join("data"), &config).await?;
    server
        .deploy_counter(serde_json::json!({"idle_timeout_ms": 3_600_000}))
        .await?;
    create_actors(server.addr, 1).await?;
    let base = server.rss()?;
    create_actors(server.addr, n).await?;
    let full = server.rss()?;
    println!("scenario rss-active ({n} active counter actors)");
    println!(
        "  RSS idle node: {:.1} MB   with {n} active: {:.1} MB   per actor: {:.1} KB",
        base as f64 / MB,
        full as f64 / MB,
        (full.saturating_sub(base)) as f64 / n as f64 / 1024.0
    );
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
    crate::storage::bulk::populate_counters(&data, "counter", n)?;
    eprintln!("  done in {:.1}s", started.elapsed().as_secs_f64());

    let started = std::time::Instant::now();
    let server = ServerProc::start(&data, config).await?;
    let restart = started.elapsed();
    create_actors(server.addr, 10).await?;
    let full = server.rss()?;
    let db = std::fs::metadata(data.join("marmot.redb"))?.len();
    println!("scenario rss-hibernated ({n} hibernated actors on disk)");
    println!(
        "  RSS with 10 actors on disk: {:.1} MB   with {n}: {:.1} MB   added: {:.1} MB   (database {:.0} MB, restart to ready {:.2}s)",
        base as f64 / MB,
        full as f64 / MB,
        full.saturating_sub(base) as f64 / MB,
        db as f64 / MB,
        restart.as_secs_f64()
    );
    server.stop();
    Ok(())
}
