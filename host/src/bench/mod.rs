//! `marmot bench`: benchmark scenarios (filled in below).

use clap::Args;

/// `marmot bench` arguments.
#[derive(Args)]
pub struct BenchArgs {
    /// Scenario to run.
    pub scenario: String,
}

/// Run a scenario.
pub async fn run(args: BenchArgs) -> anyhow::Result<()> {
    anyhow::bail!("unknown scenario `{}`", args.scenario)
}
