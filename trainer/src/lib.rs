//! forgelog-trainer: the candle GRPO learner.
//!
//! [`loss`] is the objective as pure tensor math, [`optim`] AdamW with
//! gradient clipping, [`learner`] the weights, teacher-forced logprobs and
//! steps (no I/O), [`checkpoint`] the object_store layout. [`run`] is the thin
//! Kafka shell: `forgelog.batches` in, checkpoints and `PolicyPublished` on
//! `forgelog.policy` out, offsets committed only after both are written.

mod assembler;
pub mod checkpoint;
pub mod learner;
pub mod loss;
pub mod optim;
mod train;

use candle_core::{DType, Device};
use checkpoint::CheckpointError;
pub use forgelog_model::LoraConfig;
use forgelog_stream::{EventProducer, ReplayReader, StreamConfig};
pub use learner::{Learner, LearnerConfig, StepMetrics};
pub use loss::{LossConfig, Normalisation};
pub use optim::AdamWConfig;
use std::collections::BTreeMap;
use std::path::PathBuf;
use std::time::Duration;
pub use train::train;

#[derive(Debug, thiserror::Error)]
pub enum TrainError {
    #[error(transparent)]
    Load(#[from] forgelog_model::LoadError),
    #[error("model: {0}")]
    Candle(#[from] candle_core::Error),
    #[error(transparent)]
    Checkpoint(#[from] CheckpointError),
    #[error("reading the log: {0}")]
    Consume(#[from] forgelog_stream::ConsumeError),
    #[error("spool: {0}")]
    Spool(#[from] forgelog_stream::SpoolError),
    #[error("publishing: {0}")]
    Send(#[from] forgelog_stream::SendError),
    #[error("publishing: {0}")]
    Flush(#[from] forgelog_stream::FlushTimeout),
    #[error("device: {0}")]
    Device(String),
    #[error("{0}")]
    Invalid(String),
}

pub use forgelog_model::DeviceKind;

/// `forgelog train`: GRPO on `forgelog.batches`, publishing policies.
#[derive(Debug, Clone, clap::Args)]
pub struct TrainArgs {
    /// `smollm2`, a .gguf file, or a Hugging Face llama/qwen2/qwen3 directory: the
    /// initial policy (version 0), the one the engine starts with.
    #[arg(long, default_value = "smollm2")]
    pub model: String,
    /// Where to train: cpu, or cuda (a build with `--features cuda`)
    #[arg(long, default_value_t = DeviceKind::Cpu)]
    pub device: DeviceKind,
    /// Where checkpoints go (object_store URL); default `file://$PWD/.forgelog/checkpoints`.
    #[arg(long)]
    pub checkpoints: Option<String>,
    /// Batches sampled more than this many versions ago are dropped.
    #[arg(long, default_value_t = 4)]
    pub max_staleness: u64,
    /// Kafka bootstrap servers (comma-separated host:port)
    #[arg(long, env = "FORGELOG_BROKERS", default_value = forgelog_stream::DEFAULT_BROKERS)]
    pub brokers: String,
    /// The run whose batches are trained and whose policies are published.
    #[arg(long, env = "FORGELOG_RUN", default_value = "default")]
    pub run: String,
    /// Sampled tokens per optimizer step (batches are gathered until there are this many).
    #[arg(long, default_value_t = 4096, value_parser = forgelog_config::value::one_or_more)]
    pub tokens_per_step: usize,
    /// Also step once this many groups are waiting, whatever their tokens
    /// (a driver that samples in rounds of known size: one step per round)
    #[arg(long, value_parser = forgelog_config::value::one_or_more)]
    pub groups_per_step: Option<usize>,
    /// Rows per forward/backward pass, a shared prompt counted once
    /// (gradients accumulate over them): the activation memory of one pass,
    /// which grows with each row's context too (one 1,350-row trajectory on
    /// SmolLM2's shape, CPU: 2.1 GB with each layer recomputed, 17.3 GB with
    /// --keep-activations). The default holds an 850-token agent prompt and
    /// a few of its group's answers, so the prompt is fed once for them.
    #[arg(long, default_value_t = learner::MICRO_BATCH_TOKENS, value_parser = forgelog_config::value::one_or_more)]
    pub micro_batch_tokens: usize,
    /// Keep every layer's activations for the backward pass instead of
    /// recomputing each layer there (activation checkpointing, the default):
    /// one forward less per step, and memory that grows with every layer (on
    /// the CPU, keeping them was the slower: 56.5 s against 39.3 s for that
    /// trajectory's forward and backward)
    #[arg(long)]
    pub keep_activations: bool,
    /// Publish a policy every this many steps.
    #[arg(long, default_value_t = 1, value_parser = clap::value_parser!(u64).range(1..))]
    pub publish_every: u64,
    /// Keep the checkpoints of only this many newest versions (none: every
    /// version's model folder). The optimizer moments, twice the weights'
    /// size, are kept for the newest version only either way.
    #[arg(long, value_parser = clap::value_parser!(u64).range(1..))]
    pub keep_versions: Option<u64>,
    /// AdamW's learning rate.
    #[arg(long, default_value_t = 1e-6, value_parser = forgelog_config::value::above_zero)]
    pub learning_rate: f64,
    /// AdamW's decoupled weight decay.
    #[arg(long, default_value_t = 0.0, value_parser = forgelog_config::value::zero_or_more)]
    pub weight_decay: f64,
    /// Gradients are scaled down to at most this global L2 norm before a step.
    #[arg(long, default_value_t = 1.0, value_parser = forgelog_config::value::above_zero)]
    pub max_grad_norm: f64,
    /// Truncation C of each token's importance weight, the policy now over
    /// the one that sampled (engine/learner mismatch, staleness).
    #[arg(long, default_value_t = 2.0, value_parser = forgelog_config::value::above_zero)]
    pub is_cap: f64,
    /// How a step's token losses are averaged.
    #[arg(long, default_value = "per-token", value_parser = normalisation_parser())]
    pub normalisation: Normalisation,
    /// β of a KL penalty to the initial policy (off when absent).
    #[arg(long, value_parser = forgelog_config::value::zero_or_more)]
    pub kl: Option<f64>,
    /// The engine's sampling temperature (recorded logprobs are after it).
    #[arg(long, default_value_t = 1.0, value_parser = forgelog_config::value::above_zero)]
    pub temperature: f64,
    /// `f32` or `bf16` (CUDA only).
    #[arg(long, default_value = "f32")]
    pub dtype: String,
    /// Train a LoRA adapter of this rank on frozen weights (none: every
    /// weight trains). Each version then holds the adapter as PEFT's folder
    /// files (and, with `--lora-publish merged`, the merged weights beside).
    #[arg(long, value_parser = forgelog_config::value::one_or_more)]
    pub lora_rank: Option<usize>,
    /// With --lora-rank, what a version publishes: the adapter alone (a few
    /// MB; forgelog's engine merges it onto its base at load, vLLM loads it as
    /// a LoRA) or the merged full weights too (what an engine that reloads
    /// whole weights needs: `forgelog sync --sync-mode weights`).
    #[arg(long, value_enum, default_value_t = LoraPublish::Adapter)]
    pub lora_publish: LoraPublish,
    /// LoRA's α: the update is scaled by α / rank (default: twice the rank).
    #[arg(long, value_parser = forgelog_config::value::above_zero)]
    pub lora_alpha: Option<f64>,
    /// The projections LoRA adapts, in every layer.
    #[arg(
        long,
        value_delimiter = ',',
        default_value = "q_proj,k_proj,v_proj,o_proj,gate_proj,up_proj,down_proj"
    )]
    pub lora_targets: Vec<String>,
    /// Train with what has arrived once no batch came for this long (seconds).
    #[arg(long, default_value_t = 30.0, value_parser = forgelog_config::value::zero_or_more)]
    pub idle_flush: f64,
    /// Stop after this many steps (tests, experiments).
    #[arg(long)]
    pub max_steps: Option<u64>,
    /// The producer spool; default `.forgelog/trainer-spool/RUN`.
    #[arg(long)]
    pub spool: Option<PathBuf>,
    /// Serve Prometheus metrics (`/metrics`) on this address
    #[arg(long)]
    pub metrics_listen: Option<std::net::SocketAddr>,
}

/// What a LoRA version publishes.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum LoraPublish {
    /// PEFT's two files alone; `checkpoint_uri` names the adapter's weights.
    Adapter,
    /// The adapter and the merged full weights; `checkpoint_uri` names the latter.
    Merged,
}

/// `--normalisation`: one of [`Normalisation::NAMES`], listed in `--help`.
fn normalisation_parser() -> impl clap::builder::TypedValueParser<Value = Normalisation> {
    use clap::builder::TypedValueParser;
    clap::builder::PossibleValuesParser::new(Normalisation::NAMES)
        .map(|s| s.parse().expect("one of the possible values"))
}

impl Default for TrainArgs {
    /// Every setting as `forgelog train` with no flags has it (its
    /// `FORGELOG_BROKERS` and `FORGELOG_RUN` read as the flags' are): one
    /// home for the defaults, which callers in this process override by
    /// field, not by building a command line.
    fn default() -> TrainArgs {
        use clap::{Args, FromArgMatches};
        let command = TrainArgs::augment_args(clap::Command::new("train"));
        TrainArgs::from_arg_matches(&command.get_matches_from(["train"]))
            .expect("every flag of `forgelog train` has a default or is optional")
    }
}

impl TrainArgs {
    /// The LoRA the flags ask for, checked.
    pub fn lora(&self) -> Result<Option<LoraConfig>, TrainError> {
        let Some(rank) = self.lora_rank else {
            return Ok(None);
        };
        let alpha = self.lora_alpha.unwrap_or(2.0 * rank as f64);
        LoraConfig::new(rank, alpha, self.lora_targets.clone())
            .map(Some)
            .map_err(|e| TrainError::Invalid(format!("--lora-*: {e}")))
    }

    pub fn learner_config(&self) -> LearnerConfig {
        LearnerConfig {
            loss: LossConfig {
                is_cap: self.is_cap,
                normalisation: self.normalisation,
                kl_coefficient: self.kl,
            },
            adamw: AdamWConfig {
                learning_rate: self.learning_rate,
                weight_decay: self.weight_decay,
                max_grad_norm: self.max_grad_norm,
                ..Default::default()
            },
            temperature: self.temperature,
            max_staleness: self.max_staleness,
            micro_batch_tokens: self.micro_batch_tokens,
            share_prefixes: true,
            lora: self.lora().ok().flatten(),
            checkpoint_activations: !self.keep_activations,
        }
    }
}

fn device_and_dtype(args: &TrainArgs) -> Result<(Device, DType), TrainError> {
    let device = args.device.open().map_err(TrainError::Device)?;
    let dtype = match (args.dtype.as_str(), args.device) {
        ("f32", _) => DType::F32,
        ("bf16", DeviceKind::Cuda) => DType::BF16,
        (other, _) => {
            return Err(TrainError::Invalid(format!(
                "dtype {other:?} is not supported on {:?} (f32 everywhere, bf16 on cuda)",
                args.device
            )))
        }
    };
    Ok((device, dtype))
}

/// `forgelog train`: [`train`] on the Kafka log, publishing through a spool.
pub async fn run(args: TrainArgs) -> Result<(), TrainError> {
    let stream = StreamConfig::new(&args.brokers);
    // A broker away at start (restarting, not up yet) is waited for, as the
    // engine and the consumers wait for it: a trainer restarted while it was
    // away used to exit, and the run never trained again.
    let mut backoff = Duration::from_millis(500);
    loop {
        match forgelog_stream::admin::create_topics(&stream, &Default::default()).await {
            Ok(_) => break,
            // Unreachable, or a request cut off by its going away.
            Err(
                e @ (forgelog_stream::admin::AdminError::Unreachable(_)
                | forgelog_stream::admin::AdminError::Kafka(_)),
            ) => {
                tracing::warn!(error = %e, ?backoff, "trainer: waiting for the broker");
                tokio::time::sleep(backoff).await;
                backoff = (backoff * 2).min(Duration::from_secs(10));
            }
            Err(e) => return Err(TrainError::Invalid(format!("topics: {e}"))),
        }
    }
    let spool = args
        .spool
        .clone()
        .unwrap_or_else(|| PathBuf::from(".forgelog/trainer-spool").join(&args.run));
    let producer = EventProducer::start(&stream, spool, Default::default())?;
    let reader = ReplayReader::new(&stream)?;
    let metrics = match args.metrics_listen {
        Some(addr) => Some(
            forgelog_http::telemetry::serve(addr)
                .await
                .map_err(|e| TrainError::Invalid(format!("--metrics-listen: {e}")))?,
        ),
        None => None,
    };
    let trained = train(&args, &reader, &producer).await;
    producer.close(Duration::from_secs(600)).await?;
    if let Some(server) = metrics {
        server.shutdown(Duration::from_secs(1)).await;
    }
    trained
}

/// The metrics line `forgelog train` and the examples print.
pub fn describe(step: u64, m: &StepMetrics) -> String {
    let map: BTreeMap<String, f64> = m.to_map();
    let fields: Vec<String> = map.iter().map(|(k, v)| format!("{k}={v:.4}")).collect();
    format!("step {step}: {}", fields.join(" "))
}

#[cfg(test)]
mod tests;
