//! `forgelog export sft`: a run as a supervised fine-tuning dataset;
//! `forgelog export rl`: its groups for offline RL and preference tuning;
//! `forgelog export atif`: its rollouts as ATIF trajectories (Harbor's format);
//! `forgelog export model`: a trained version as a Hugging Face model folder.

use crate::BrokerArgs;
use anyhow::{bail, Result};
use forgelog_consumers::export;
use forgelog_schemas::Event;
use forgelog_schemas::Topic;
use forgelog_stream::{ReplayReader, StartAt};
use std::path::PathBuf;

#[derive(clap::Subcommand)]
pub enum ExportAction {
    /// Per harness a JSONL (`messages` as chat templates read them) and a Parquet (`input_ids`, masks, `labels`, logprobs, provenance), a dataset card and a manifest
    ///
    /// Example: forgelog export sft --run run-1 --to ./run-1-sft --only-successful
    Sft {
        /// The run to export
        #[arg(long, env = "FORGELOG_RUN")]
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
    /// Every path of a run for offline RL (tokens, sampling logprobs, policy versions,
    /// rewards, advantages, groups) and preference data from groups whose rewards
    /// differ: DPO pairs and KTO examples in TRL's conversational shapes
    ///
    /// Example: forgelog export rl --run run-1 --to ./run-1-rl
    Rl {
        /// The run to export
        #[arg(long, env = "FORGELOG_RUN")]
        run: String,
        /// Destination: a directory path, file:///abs/dir, or s3://bucket/prefix
        #[arg(long)]
        to: String,
        #[command(flatten)]
        broker: BrokerArgs,
    },
    /// Each rollout as an ATIF trajectory (Harbor's Agent Trajectory Interchange
    /// Format): steps with their messages, tool calls and results, and per sampled
    /// turn the exact token ids and logprobs; sub-agents embedded
    ///
    /// Example: forgelog export atif --run run-1 --to ./run-1-atif
    Atif {
        /// The run to export
        #[arg(long, env = "FORGELOG_RUN")]
        run: String,
        /// Destination: a directory path, file:///abs/dir, or s3://bucket/prefix
        #[arg(long)]
        to: String,
        /// Only rollouts whose verifier ran and gave a reward above 0
        #[arg(long)]
        only_successful: bool,
        #[command(flatten)]
        broker: BrokerArgs,
    },
    /// A policy version a run's trainer published, as a Hugging Face model folder
    /// (config, tokenizer with its chat template, generation config, weights) that
    /// `transformers` and vLLM load
    ///
    /// Example: forgelog export model --run run-1 --version 30 --to ./smollm2-grpo-v30
    Model {
        /// The run whose trainer published the version
        #[arg(long, env = "FORGELOG_RUN")]
        run: String,
        /// The policy version (default: the newest the run published)
        #[arg(long)]
        version: Option<i64>,
        /// The folder to write (created; files in it are replaced)
        #[arg(long)]
        to: PathBuf,
        #[command(flatten)]
        broker: BrokerArgs,
    },
}

pub fn run(rt: &tokio::runtime::Runtime, action: ExportAction) -> Result<()> {
    let (kind, run, to, filter, broker) = match action {
        ExportAction::Sft {
            run,
            to,
            only_successful,
            min_reward,
            broker,
        } => {
            let filter = export::ExportFilter {
                only_successful,
                min_reward,
            };
            (export::ExportKind::Sft, run, to, filter, broker)
        }
        ExportAction::Rl { run, to, broker } => {
            (export::ExportKind::Rl, run, to, Default::default(), broker)
        }
        ExportAction::Atif {
            run,
            to,
            only_successful,
            broker,
        } => {
            let filter = export::ExportFilter {
                only_successful,
                min_reward: None,
            };
            (export::ExportKind::Atif, run, to, filter, broker)
        }
        ExportAction::Model {
            run,
            version,
            to,
            broker,
        } => return export_model(rt, &run, version, &to, &broker),
    };
    let reader = ReplayReader::new(&broker.config())?;
    // An unknown run is a mistake, not an empty dataset.
    let rollouts = forgelog_consumers::rebuild::read_run(&reader, Topic::Rollouts, &run)?;
    if rollouts.is_empty() {
        bail!(
            "export: run {run} has no rollouts in the log at {} (a typo? `forgelog tail forgelog.rollouts` lists runs)",
            broker.brokers
        );
    }
    let working = crate::spinner(format!("exporting run {run} to {to}"));
    let (manifest, written) = rt
        .block_on(export::export_run(&reader, &run, &to, kind, filter))
        .map_err(|e| anyhow::anyhow!(e))?;
    working.finish_and_clear();
    for path in written {
        println!("{path}");
    }
    let unit = match kind {
        export::ExportKind::Atif => "trajectories",
        _ => "rows",
    };
    eprintln!(
        "exported {} {unit} ({} filtered out){}",
        manifest.rows.values().sum::<usize>(),
        manifest.filtered_out,
        match kind {
            export::ExportKind::Sft | export::ExportKind::Atif => String::new(),
            export::ExportKind::Rl => format!(
                ", {} DPO pairs, {} KTO examples",
                manifest.dpo_pairs.unwrap_or_default(),
                manifest.kto_examples.unwrap_or_default()
            ),
        }
    );
    Ok(())
}

fn export_model(
    rt: &tokio::runtime::Runtime,
    run: &str,
    version: Option<i64>,
    to: &std::path::Path,
    broker: &BrokerArgs,
) -> Result<()> {
    let reader = ReplayReader::new(&broker.config())?;
    let published: Vec<_> = reader
        .read(Topic::Policy.name(), StartAt::Beginning, Some(run))?
        .into_iter()
        .filter_map(|r| match r.event {
            Ok(Event::PolicyPublished(p)) if p.run_id == run => Some(p),
            _ => None,
        })
        .collect();
    let chosen = match version {
        Some(v) => published.iter().find(|p| p.version == v),
        None => published.iter().max_by_key(|p| p.version),
    };
    let Some(policy) = chosen else {
        let versions: Vec<String> = published.iter().map(|p| p.version.to_string()).collect();
        let why = if versions.is_empty() {
            "no policy version in the log".to_string()
        } else {
            // Only a version asked for can be missing from a non-empty list.
            format!(
                "no version {}; it has {}",
                version.unwrap_or_default(),
                versions.join(", ")
            )
        };
        bail!("export model: run {run} published {why} (version 0 is the model the run started from: --model)");
    };
    let written = rt
        .block_on(forgelog_trainer::checkpoint::export_model_folder(
            &policy.checkpoint_uri,
            to,
        ))
        .map_err(|e| anyhow::anyhow!(e))?;
    for path in written {
        println!("{}", path.display());
    }
    eprintln!(
        "exported run {run}'s policy version {} (step {}) from {}",
        policy.version, policy.step, policy.checkpoint_uri
    );
    Ok(())
}
