//! Training throughput at a fixed batch: SmolLM2 (or `--model`), `--sequences`
//! sequences of `--prompt` context tokens followed by `--sampled` sampled
//! tokens. Prints the forward+backward time, the optimizer step, a
//! checkpoint write, and tokens per second.
//!
//! `cargo run --release -p forgelog-trainer --bin trainer-bench [-- --device cuda]`

use candle_core::{DType, Device};
use clap::Parser;
use forgelog_trainer::learner::SampledSequence;
use forgelog_trainer::{Learner, LearnerConfig};
use std::time::Instant;

#[derive(Parser)]
struct Args {
    #[arg(long, default_value = "smollm2")]
    model: String,
    #[arg(long, default_value = "cpu")]
    device: String,
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
    let device = match args.device.as_str() {
        "cuda" => Device::new_cuda(0)?,
        _ => Device::Cpu,
    };
    let dtype = match args.dtype.as_str() {
        "bf16" => DType::BF16,
        _ => DType::F32,
    };
    let t = Instant::now();
    let policy = forgelog_model::load_policy(&args.model, &forgelog_stream::models_dir(), &device)?;
    let mut learner = Learner::new(
        &policy.weights,
        policy.model.config(),
        &device,
        dtype,
        LearnerConfig::default(),
    )?;
    drop(policy);
    println!(
        "model {} on {:?} {dtype:?}: loaded in {:.1}s",
        args.model,
        args.device,
        t.elapsed().as_secs_f64()
    );
    let vocab = learner.model().config().vocab_size as u32;
    let len = args.prompt + args.sampled;
    let seqs: Vec<SampledSequence> = (0..args.sequences)
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
        .collect();
    let fed: usize = seqs.iter().map(|s| s.tokens.len() - 1).sum();
    let sampled = args.sequences * args.sampled;
    println!(
        "batch: {} sequences x ({} context + {} sampled), in groups of {} sharing the context = {fed} tokens fed, {sampled} trained",
        args.sequences, args.prompt, args.sampled, args.group
    );
    for step in 0..args.steps {
        let t = Instant::now();
        let eval = learner.evaluate(&seqs)?;
        let backward = t.elapsed().as_secs_f64();
        let t = Instant::now();
        learner.apply_gradients(&eval.grads)?;
        let optimizer = t.elapsed().as_secs_f64();
        let total = backward + optimizer;
        println!(
            "step {step}: forward+backward {backward:.2}s, AdamW {optimizer:.2}s: {:.0} tokens/s fed, {:.1} sampled tokens/s trained",
            fed as f64 / total,
            sampled as f64 / total
        );
    }
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
        &learner.weights(),
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
