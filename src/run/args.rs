//! `forgelog run`'s flags.

use super::cluster::KubeArgs;
use crate::BrokerArgs;
use forgelog_config::value::{above_zero, one_or_more};
use std::net::SocketAddr;
use std::path::PathBuf;

#[derive(Debug, Clone, clap::Args)]
pub struct RunArgs {
    /// A directory of Harbor-style task directories (e.g. deploy/tasks)
    pub tasks_dir: PathBuf,
    /// Harnesses, comma-separated: the kit's (deploy/harnesses/kit.txt), solve
    /// (the task's reference solution), or a launch script path (NAME.sh)
    #[arg(long, value_delimiter = ',', default_value = "mini-swe-agent",
          long_help = harness_help())]
    pub harness: Vec<String>,
    /// Rollouts per GRPO group (one task, one harness)
    #[arg(long, default_value_t = 8, value_parser = one_or_more)]
    pub group_size: usize,
    /// Each task's groups this many times over, one epoch after another:
    /// a training run sees every task again with the policy trained so far
    #[arg(long, default_value_t = 1, value_parser = clap::value_parser!(u32).range(1..))]
    pub epochs: u32,
    /// Rollouts running at once
    #[arg(long, default_value_t = 8, value_parser = one_or_more)]
    pub concurrency: usize,
    /// Only these tasks (by directory name; repeatable)
    #[arg(long = "task")]
    pub tasks: Vec<String>,
    #[command(flatten)]
    pub serving: crate::upstream::ServingArgs,
    /// Use this running `forgelog proxy` instead of starting one (it needs --admin-token)
    #[arg(long, conflicts_with_all = ["upstream", "tokenizer"], value_parser = forgelog_http::http_url_arg)]
    pub proxy: Option<String>,
    /// The admin token of --proxy
    #[arg(long, env = "FORGELOG_ADMIN_TOKEN", value_parser = forgelog_http::admin_token_arg)]
    pub admin_token: Option<String>,
    #[command(flatten)]
    pub broker: BrokerArgs,
    /// The run id; an existing run resumes (default: run-<unix time>)
    #[arg(long, env = "FORGELOG_RUN")]
    pub run: Option<String>,
    /// Model calls per rollout, past which the proxy stops the harness (0:
    /// no limit): a harness looping on a model that never finishes costs
    /// this many calls, not the task's whole timeout of them
    #[arg(long, default_value_t = 100)]
    pub max_model_calls: u32,
    /// Completion tokens per model call (default: a quarter of the context
    /// the engine reports, as vLLM's max_model_len; a harness that asks for
    /// none, as mini-swe-agent, would let a small model fill the rest)
    #[arg(long)]
    pub max_tokens: Option<i64>,
    /// Where rollouts run: podman sandboxes here, or one Job per attempt on Kubernetes
    #[arg(long, default_value = "local", value_parser = ["local", "kube"])]
    pub backend: String,
    /// Where the proxy this run starts listens
    #[arg(long, default_value = "127.0.0.1:0")]
    pub proxy_listen: SocketAddr,
    #[command(flatten)]
    pub kube: KubeArgs,
    /// Train --model on the run's groups with GRPO: the learner publishes
    /// versions the engine loads (the embedded one, or --upstream with
    /// --engine), and groups start only while the policy that samples them
    /// is within --max-staleness
    #[arg(long, conflicts_with = "proxy")]
    pub train: bool,
    /// With --train: train a LoRA adapter of this rank on frozen weights
    /// (with --engine vllm --sync-mode adapter, the engine loads each one)
    #[arg(long, requires = "train", value_parser = one_or_more)]
    pub lora_rank: Option<usize>,
    /// With --train: groups per learner step (one version each)
    #[arg(long, default_value_t = 1, value_parser = one_or_more)]
    pub groups_per_step: usize,
    /// With --train: versions a group's policy may lag the learner when it
    /// is trained (0: every group sampled by the newest version)
    #[arg(long, default_value_t = 1)]
    pub max_staleness: u64,
    /// With --train: the learner's rate
    #[arg(long, default_value_t = 1e-5, value_parser = above_zero)]
    pub learning_rate: f64,
    /// With --train: rows per forward/backward pass of the learner
    /// (`forgelog train --micro-batch-tokens`): its activation memory. Each
    /// layer is recomputed in the backward pass, so a pass holds one layer's
    /// activations: 2.1 GB for a 1,350-row trajectory on SmolLM2's shape on
    /// CPU (17.3 GB with every layer's kept); fewer rows cost more passes
    #[arg(long, requires = "train", default_value_t = forgelog_trainer::learner::MICRO_BATCH_TOKENS, value_parser = one_or_more)]
    pub micro_batch_tokens: usize,
    /// Re-run the recorded rollouts of this run in the same environment (task
    /// image, harness bundle, paths and home), answered from the recording,
    /// and compare how each ended
    #[arg(long, value_name = "RUN", conflicts_with_all = ["train", "upstream", "proxy", "harness", "tasks", "group_size", "epochs"])]
    pub replay: Option<String>,
    /// With --replay: read the recorded run from this bundle (`forgelog
    /// export bundle`) instead of the log; tasks and launch scripts that
    /// differ from those it names by SHA-256 are said before anything starts
    #[arg(long, requires = "replay")]
    pub bundle: Option<PathBuf>,
    /// With --replay: only this rollout or attempt (repeatable)
    #[arg(long = "rollout", requires = "replay")]
    pub rollouts: Vec<String>,
    /// With --replay: refuse a call that differs from the recording instead
    /// of answering it and reporting the difference
    #[arg(long, requires = "replay")]
    pub strict: bool,
    /// With --replay: a regular expression for more volatile text (repeatable)
    #[arg(long, requires = "replay", conflicts_with = "strict")]
    pub volatile: Vec<String>,
    /// With --replay: pin each re-run's clock at its recorded start
    /// (libfaketime), so dates a harness writes come out as recorded; some
    /// harnesses misbehave under it (timed waits fail, output is lost), so by
    /// default the clock is the real one and the report explains the dates
    #[arg(long, requires = "replay")]
    pub pin_clock: bool,
    /// With --replay: write the comparison and the replay report here as JSON
    #[arg(long, requires = "replay")]
    pub report: Option<PathBuf>,
}

/// `--harness`'s long help: the kit's names, read from its table.
fn harness_help() -> String {
    format!(
        "Harnesses, comma-separated: {}, solve (the task's reference solution), \
         or a launch script path (NAME.sh)",
        forgelog_deploy::harness::kit_names()
    )
}
