//! `forgelog export sft`: a run as a supervised fine-tuning dataset;
//! `forgelog export rl`: its groups for offline RL and preference tuning;
//! `forgelog export atif`: its rollouts as ATIF trajectories (Harbor's format);
//! `forgelog export model`: a trained version as a Hugging Face model folder.

use crate::source::SourceArgs;
use crate::BrokerArgs;
use anyhow::{bail, Context, Result};
use forgelog_consumers::export;
use forgelog_deploy::kit::Kit;
use forgelog_schemas::Topic;
use forgelog_stream::ReplayReader;
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
        source: SourceArgs,
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
        source: SourceArgs,
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
        source: SourceArgs,
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
    /// The run as one file: its events of every topic in log order (an Avro object container file,
    /// each record with its topic, partition, offset and SHA-256), claim checks resolved, with the
    /// SHA-256 of the tokenizer, chat template, tasks and harness launch scripts it used. Every
    /// per-run command reads it with --bundle FILE in place of a broker
    ///
    /// Example: forgelog export bundle --run run-1 --to run-1.bundle.avro --tasks ./tasks
    Bundle {
        /// The run to bundle
        #[arg(long, env = "FORGELOG_RUN")]
        run: String,
        /// The file to write (replaced whole, or left as it was)
        #[arg(long)]
        to: PathBuf,
        /// The task directories the run ran (hashed by task id into the bundle)
        #[arg(long)]
        tasks: Option<PathBuf>,
        #[command(flatten)]
        broker: BrokerArgs,
    },
}

pub fn run(rt: &tokio::runtime::Runtime, action: ExportAction) -> Result<()> {
    let (kind, run, to, filter, source) = match action {
        ExportAction::Sft {
            run,
            to,
            only_successful,
            min_reward,
            source,
        } => {
            let filter = export::ExportFilter {
                only_successful,
                min_reward,
            };
            (export::ExportKind::Sft, run, to, filter, source)
        }
        ExportAction::Rl { run, to, source } => {
            (export::ExportKind::Rl, run, to, Default::default(), source)
        }
        ExportAction::Atif {
            run,
            to,
            only_successful,
            source,
        } => {
            let filter = export::ExportFilter {
                only_successful,
                min_reward: None,
            };
            (export::ExportKind::Atif, run, to, filter, source)
        }
        ExportAction::Model {
            run,
            version,
            to,
            broker,
        } => return export_model(rt, &run, version, &to, &broker),
        ExportAction::Bundle {
            run,
            to,
            tasks,
            broker,
        } => return export_bundle(&run, &to, tasks.as_deref(), &broker),
    };
    let reader = source.open_known(&run)?;
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
    let published = forgelog_stream::published_policies(&reader, Some(run))?;
    let Some(policy) = forgelog_stream::policy_version(&published, version) else {
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

/// `export bundle`: the run's events in one file, with the hashes of what
/// it was made with.
fn export_bundle(
    run: &str,
    to: &std::path::Path,
    tasks: Option<&std::path::Path>,
    broker: &BrokerArgs,
) -> Result<()> {
    let reader = ReplayReader::new(&broker.config())?;
    let started = forgelog_consumers::rebuild::read_run(&reader, Topic::Rollouts, run)?;
    let events = started.iter().filter_map(|r| r.event.as_ref().ok());
    let hashes = Kit::of_started(events, tasks)
        .with_context(|| format!("the tasks of run {run}"))?
        .hashes()?
        .into_iter()
        .filter_map(|(what, sha)| Some((what, vec![sha?])))
        .collect();
    let working = crate::spinner(format!("bundling run {run}"));
    let manifest = forgelog_stream::bundle::write_bundle(&reader, run, to, hashes)?;
    working.finish_and_clear();
    println!("{}", to.display());
    let topics: Vec<String> = manifest
        .topics
        .iter()
        .map(|(t, n)| format!("{t} {n}"))
        .collect();
    eprintln!(
        "bundled run {run}: {} records ({}){}; {} hashes",
        manifest.records,
        topics.join(", "),
        match manifest.left_out {
            0 => String::new(),
            n => format!(", {n} undecodable records of the topics left out"),
        },
        manifest.hashes.len()
    );
    Ok(())
}
