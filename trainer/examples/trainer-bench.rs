//! Training throughput at a fixed batch: SmolLM2 (or `--model`, or random
//! weights of a published `--shape`), `--sequences` sequences of `--prompt`
//! context tokens followed by `--sampled` sampled tokens, every weight
//! trained or a `--lora` adapter. Prints the forward+backward time, the
//! optimizer step, tokens per second, the model FLOP/s and, given the
//! device's `--peak-tflops`, the MFU; then a checkpoint write.
//!
//! `cargo run --release -p forgelog-trainer --example trainer-bench [-- --device cuda --dtype bf16 --shape qwen3-0.6b --peak-tflops 989]`

use candle_core::DType;
use clap::Parser;
use forgelog_model::lora::PROJECTIONS;
use forgelog_model::LoraConfig;
use forgelog_trainer::learner::SampledSequence;
use forgelog_trainer::{Learner, LearnerConfig};
use std::time::Instant;

#[derive(Parser)]
struct Args {
    #[arg(long, default_value = "smollm2")]
    model: String,
    /// Random weights of a published shape instead of `--model`
    /// (`qwen3-0.6b`, `qwen3-1.7b`, `qwen3-4b`, `qwen3-8b`): nothing is read
    /// from disk.
    #[arg(long)]
    shape: Option<String>,
    /// Train a LoRA adapter of this rank (alpha twice the rank) on every
    /// projection instead of every weight.
    #[arg(long)]
    lora: Option<usize>,
    /// The device's dense peak at `--dtype`, in TFLOP/s, for the MFU
    /// (NVIDIA's sheet: H200 989 in bf16, 67 in f32 without tensor cores).
    #[arg(long)]
    peak_tflops: Option<f64>,
    /// Skip the checkpoint write at the end (a big shape's takes minutes).
    #[arg(long)]
    no_checkpoint: bool,
    /// `cpu` or `cuda` (a build with `--features cuda`).
    #[arg(long, default_value = "cpu")]
    device: forgelog_model::DeviceKind,
    #[arg(long, default_value = "f32")]
    dtype: String,
    #[arg(long, default_value_t = 8)]
    sequences: usize,
    #[arg(long, default_value_t = 48)]
    prompt: usize,
    #[arg(long, default_value_t = 16)]
    sampled: usize,
    #[arg(long, default_value_t = 3)]
    steps: usize,
    /// Consecutive sequences that share their `--prompt` tokens, as the
    /// members of a GRPO group do
    #[arg(long, default_value_t = 1)]
    group: usize,
}

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let args = Args::parse();
    let device = args.device.open()?;
    let dtype = match args.dtype.as_str() {
        "bf16" => DType::BF16,
        _ => DType::F32,
    };
    let t = Instant::now();
    let (name, weights, config) = match &args.shape {
        Some(shape) => {
            let config = forgelog_model::testing::qwen3_shape(shape)
                .ok_or_else(|| format!("unknown --shape {shape:?}"))?;
            let weights = forgelog_model::testing::random_weights(&config, &device)?;
            (shape.clone(), weights, config)
        }
        None => {
            let policy =
                forgelog_model::load_policy(&args.model, &forgelog_stream::models_dir(), &device)?;
            let config = policy.model.config().clone();
            (args.model.clone(), policy.weights, config)
        }
    };
    let lora = match args.lora {
        Some(rank) => Some(LoraConfig::new(
            rank,
            2.0 * rank as f64,
            PROJECTIONS.map(String::from).to_vec(),
        )?),
        None => None,
    };
    let training = match &lora {
        Some(l) => format!("LoRA r={}", l.rank),
        None => "every weight".to_string(),
    };
    let mut learner = Learner::new(
        &weights,
        &config,
        &device,
        dtype,
        LearnerConfig {
            lora,
            ..LearnerConfig::default()
        },
    )?;
    drop(weights);
    let matmul = forgelog_model::testing::matmul_parameters(&config);
    println!(
        "model {name} ({:.2}B weights multiplied a token) on {:?} {dtype:?}, {training}: made in {:.1}s",
        matmul as f64 / 1e9,
        args.device,
        t.elapsed().as_secs_f64()
    );
    let vocab = learner.model().config().vocab_size as u32;
    let seqs = batch(&args, vocab);
    let fed: usize = seqs.iter().map(|s| s.tokens.len() - 1).sum();
    let sampled = args.sequences * args.sampled;
    println!(
        "batch: {} sequences x ({} context + {} sampled), in groups of {} sharing the context = {fed} tokens fed, {sampled} trained",
        args.sequences, args.prompt, args.sampled, args.group
    );
    for step in 0..args.steps {
        let t = Instant::now();
        let eval = learner.evaluate(&seqs)?;
        // A GPU runs queued work after the call returns: time it done.
        device.synchronize()?;
        let backward = t.elapsed().as_secs_f64();
        let t = Instant::now();
        learner.apply_gradients(&eval.grads)?;
        device.synchronize()?;
        let optimizer = t.elapsed().as_secs_f64();
        let total = backward + optimizer;
        // Forward 2, input gradients 2, weight gradients 2 (none under LoRA).
        let per_token = if args.lora.is_some() { 4.0 } else { 6.0 };
        let tflops = per_token * matmul as f64 * fed as f64 / total / 1e12;
        let mfu = args
            .peak_tflops
            .map(|peak| format!(", MFU {:.1}%", 100.0 * tflops / peak))
            .unwrap_or_default();
        println!(
            "step {step}: forward+backward {backward:.3}s, AdamW {optimizer:.3}s: {:.0} tokens/s fed, {:.1} sampled tokens/s trained, {tflops:.1} model TFLOP/s{mfu}",
            fed as f64 / total,
            sampled as f64 / total
        );
    }
    if args.no_checkpoint {
        return Ok(());
    }
    write_checkpoint(&learner)
}

/// `--sequences` sequences of `--prompt` context and `--sampled` sampled
/// tokens of `vocab`, the prompt shared in groups of `--group`, advantages
/// alternating in sign.
fn batch(args: &Args, vocab: u32) -> Vec<SampledSequence> {
    let len = args.prompt + args.sampled;
    (0..args.sequences)
        .map(|s| SampledSequence {
            // The prompt is the group's; what follows is the member's own.
            tokens: (0..len)
                .map(|i| {
                    let who = if i < args.prompt {
                        s / args.group.max(1)
                    } else {
                        s
                    };
                    (i as u32 * 7919 + who as u32 * 104_729) % vocab
                })
                .collect(),
            positions: (args.prompt..len).collect(),
            // About the model's own logprobs on random tokens: ratios stay finite.
            recorded: vec![-10.0; args.sampled],
            advantage: if s % 2 == 0 { 1.0 } else { -1.0 },
        })
        .collect()
}

/// Writes `learner`'s weights and AdamW moments as a checkpoint, timed.
fn write_checkpoint(learner: &Learner) -> Result<(), Box<dyn std::error::Error>> {
    let dir = tempfile::tempdir()?;
    let store = forgelog_trainer::checkpoint::CheckpointStore::new(
        &format!("file://{}", dir.path().display()),
        "bench",
    )?;
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()?;
    let t = Instant::now();
    rt.block_on(store.save(
        Some(&learner.weights()),
        &learner.optimizer.moments,
        &Default::default(),
        &[],
    ))?;
    println!(
        "checkpoint (weights + AdamW moments) written in {:.2}s",
        t.elapsed().as_secs_f64()
    );
    Ok(())
}
