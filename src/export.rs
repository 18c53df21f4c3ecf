//! `forgelog export sft`: a run as a supervised fine-tuning dataset.

use crate::BrokerArgs;
use anyhow::Result;
use forgelog_consumers::export;
use forgelog_schemas::Topic;
use forgelog_stream::ReplayReader;

#[derive(clap::Subcommand)]
pub enum ExportAction {
    /// JSONL (OpenAI Chat `messages`) and Parquet (`input_ids`, `loss_mask`, `labels`) per harness, plus a manifest
    Sft {
        #[arg(long)]
        run: String,
        /// Destination: a directory path, file:///abs/dir, or s3://bucket/prefix (AWS_* variables configure S3)
        #[arg(long)]
        to: String,
        /// Only rollouts whose verifier ran and gave a reward above 0
        #[arg(long)]
        only_successful: bool,
        /// Only rollouts with at least this reward
        #[arg(long)]
        min_reward: Option<f64>,
        #[command(flatten)]
        broker: BrokerArgs,
    },
}

pub fn run(rt: &tokio::runtime::Runtime, action: ExportAction) -> Result<()> {
    let ExportAction::Sft {
        run,
        to,
        only_successful,
        min_reward,
        broker,
    } = action;
    let reader = ReplayReader::new(&broker.config())?;
    // An unknown run is a mistake, not an empty dataset.
    let rollouts = forgelog_consumers::rebuild::read_run(&reader, Topic::Rollouts, &run)?;
    if rollouts.is_empty() {
        eprintln!(
            "forgelog export: run {run} has no rollouts in the log at {} (a typo? `forgelog tail forgelog.rollouts` lists runs)",
            broker.brokers
        );
        std::process::exit(2);
    }
    let filter = export::ExportFilter {
        only_successful,
        min_reward,
    };
    let working = crate::spinner(format!("exporting run {run} to {to}"));
    let (manifest, written) = rt
        .block_on(export::export_run(&reader, &run, &to, filter))
        .map_err(|e| anyhow::anyhow!(e))?;
    working.finish_and_clear();
    for path in written {
        println!("{path}");
    }
    eprintln!(
        "exported {} rows ({} filtered out)",
        manifest.rows.values().sum::<usize>(),
        manifest.filtered_out
    );
    Ok(())
}
