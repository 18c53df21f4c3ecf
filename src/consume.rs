//! `forgelog consume`: the stream consumers.

use crate::BrokerArgs;
use anyhow::Result;
use forgelog_consumers::{run_consumers, Consumers, RewardConfig, ShellOptions};
use std::path::PathBuf;

#[derive(clap::Args)]
pub struct ConsumeArgs {
    /// Which consumer: trajectories, rewards, or all (both)
    #[arg(value_enum)]
    which: Which,
    /// State directory (checkpoints and output spool), one subdirectory per consumer
    #[arg(long, default_value = ".forgelog/consumers")]
    state: PathBuf,
    /// Exit after a sweep that finds nothing new (batch processing of a recorded run)
    #[arg(long, conflicts_with = "scale_out")]
    exit_when_idle: bool,
    /// Share the work with the other instances started on the same --state
    /// directory (a shared volume across machines): trajectories by input
    /// partition, the reward join as one task that moves to a live instance
    #[arg(long)]
    scale_out: bool,
    /// Input events between checkpoints
    #[arg(long, default_value_t = 1000, value_parser = forgelog_config::value::one_or_more)]
    checkpoint_every: usize,
    /// Checkpoints between snapshots of the consumers' state (the others
    /// record positions only; a restart re-reads the input since the snapshot)
    #[arg(long, default_value_t = forgelog_consumers::shell::SNAPSHOT_EVERY, value_parser = forgelog_config::value::one_or_more)]
    snapshot_every: usize,
    /// Reward correct answers (reward >= 1) with 1 + 1.5/(15 + tool_calls)
    #[arg(long)]
    efficiency_bonus: bool,
    /// Serve Prometheus metrics (`/metrics`) on this address
    #[arg(long)]
    metrics_listen: Option<std::net::SocketAddr>,
    #[command(flatten)]
    broker: BrokerArgs,
}

#[derive(Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
enum Which {
    Trajectories,
    Rewards,
    All,
}

pub fn run(rt: &tokio::runtime::Runtime, args: ConsumeArgs) -> Result<()> {
    let which = match args.which {
        Which::Trajectories => Consumers::Trajectories,
        Which::Rewards => Consumers::Rewards,
        Which::All => Consumers::All,
    };
    let options = ShellOptions {
        checkpoint_every: args.checkpoint_every,
        snapshot_every: args.snapshot_every,
        exit_when_idle: args.exit_when_idle,
        ..ShellOptions::new(args.state)
    };
    let rewards = RewardConfig::with_efficiency_bonus(args.efficiency_bonus);
    let stats = rt.block_on(async {
        let metrics = match args.metrics_listen {
            Some(addr) => Some(forgelog_http::telemetry::serve(addr).await?),
            None => None,
        };
        let stats = run_consumers(
            &args.broker.config(),
            which,
            &options,
            rewards,
            args.scale_out,
        )
        .await;
        if let Some(server) = metrics {
            server.shutdown(std::time::Duration::from_secs(1)).await;
        }
        anyhow::Ok(stats?)
    })?;
    for (name, stats) in stats {
        eprintln!("{name}: {stats:?}");
    }
    Ok(())
}
