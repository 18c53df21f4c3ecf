//! Throughput and latency of the engine on a real model (or random weights of
//! a published `--shape`), without HTTP:
//! `cargo run --release -p forgelog-engine --example engine-bench [-- --model smollm2 --tokens 64 --device cuda]`.
//! Prints decode tokens/s at batch 1 and 16, time to first token, where a
//! scheduler step's time went (the engine's `forgelog_engine_step_seconds`),
//! and peak RSS.

use clap::Parser;
use forgelog_engine::sampling::SamplerConfig;
use forgelog_engine::scheduler::GenerationRequest;
use forgelog_engine::Engine;
use serde_json::json;
use std::time::{Duration, Instant};

#[derive(Parser)]
struct Args {
    #[arg(long, default_value = "smollm2")]
    model: String,
    /// Random weights of a published shape instead of `--model`
    /// (`qwen3-0.6b`, `qwen3-1.7b`, `qwen3-4b`, `qwen3-8b`), with a tiny
    /// tokenizer: the cost of a token depends on the shape, not the values.
    #[arg(long)]
    shape: Option<String>,
    /// `cpu` or `cuda` (a build with `--features cuda`).
    #[arg(long, default_value = "cpu")]
    device: forgelog_model::DeviceKind,
    /// Tokens each request samples (stop tokens ignored).
    #[arg(long, default_value_t = 64)]
    tokens: usize,
    #[arg(long, value_delimiter = ',', default_value = "1,16")]
    batches: Vec<usize>,
    /// Pad the chat prompt with filler text to about this many tokens (long-context decode).
    #[arg(long)]
    prompt_tokens: Option<usize>,
}

/// `(phase, seconds in all, steps)` of the engine's step histogram so far,
/// from its Prometheus text.
fn step_phases() -> Vec<(String, f64, f64)> {
    let text = forgelog_http::telemetry::render();
    let value = |phase: &str, suffix: &str| {
        let key = format!("forgelog_engine_step_seconds_{suffix}{{phase=\"{phase}\"}} ");
        text.lines()
            .find_map(|l| l.strip_prefix(&key))
            .and_then(|v| v.trim().parse::<f64>().ok())
            .unwrap_or(0.0)
    };
    ["schedule", "forward", "sample"]
        .iter()
        .map(|p| (p.to_string(), value(p, "sum"), value(p, "count")))
        .collect()
}

fn peak_rss_mb() -> f64 {
    let status = std::fs::read_to_string("/proc/self/status").unwrap_or_default();
    let kb = status
        .lines()
        .find_map(|l| l.strip_prefix("VmHWM:"))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse::<f64>().ok())
        .unwrap_or(0.0);
    kb / 1024.0
}

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let args = Args::parse();
    let started = Instant::now();
    let device = args.device.open()?;
    let policy = match &args.shape {
        Some(shape) => {
            let config = forgelog_model::testing::qwen3_shape(shape)
                .ok_or_else(|| format!("unknown --shape {shape:?}"))?;
            forgelog_model::testing::random_policy(&config, shape, &device)?
        }
        None => forgelog_model::load_policy(&args.model, &forgelog_stream::models_dir(), &device)?,
    };
    println!("model {} loaded in {:.2?}", policy.name, started.elapsed());
    forgelog_http::telemetry::recorder();
    let engine = Engine::start(policy);
    let filler = "The quick brown fox jumps over the lazy dog. "
        .repeat(args.prompt_tokens.unwrap_or(0) / 10);
    let content = format!("{filler}What is the capital of France?");
    let prompt = engine.chat_prompt(&[json!({"role": "user", "content": content})], None)?;
    let request = |seed: u64| GenerationRequest {
        prompt: prompt.clone(),
        max_tokens: args.tokens,
        sampling: SamplerConfig {
            temperature: 1.0,
            seed: Some(seed),
            ..Default::default()
        },
        stop: Vec::new(),
        ignore_eos: true,
        grammar: None,
    };
    engine.generate(request(0)).await?; // warm-up
    println!(
        "prompt {} tokens, {} sampled per request",
        prompt.len(),
        args.tokens
    );
    for &batch in &args.batches {
        let before = step_phases();
        let started = Instant::now();
        let handles: Vec<_> = (0..batch as u64)
            .map(|seed| {
                let (engine, request) = (engine.clone(), request(seed));
                tokio::spawn(async move { engine.generate(request).await })
            })
            .collect();
        let mut first_token = Vec::new();
        for handle in handles {
            first_token.push(handle.await??.time_to_first_token);
        }
        let wall = started.elapsed();
        let mean_ttft = first_token.iter().sum::<Duration>() / batch as u32;
        let tokens = batch * args.tokens;
        println!(
            "batch {batch:>2}: {:>7.1} tokens/s ({tokens} tokens in {wall:.2?}), time to first token {mean_ttft:.2?} mean, {:.2?} max",
            tokens as f64 / wall.as_secs_f64(),
            first_token.iter().max().unwrap(),
        );
        let after = step_phases();
        let phases: Vec<String> = after
            .iter()
            .zip(&before)
            .map(|((phase, sum, count), (_, sum0, count0))| {
                let steps = (count - count0).max(1.0);
                format!("{phase} {:.2} ms", 1e3 * (sum - sum0) / steps)
            })
            .collect();
        let steps = after.first().map_or(0.0, |a| a.2) - before.first().map_or(0.0, |b| b.2);
        println!("  {steps:.0} steps, per step: {}", phases.join(", "));
    }
    println!("peak RSS {:.0} MB", peak_rss_mb());
    Ok(())
}
