//! GRPO on a verifiable task, end to end in one process: one-digit addition,
//! "answer with the number only", groups of 8 sampled by the in-process
//! engine, turned into events as the proxy and verifier would record them,
//! through the pure consumer cores (trajectories, reward join) into
//! `TrainingBatch`es, trained by the learner on SmolLM2 (CPU), each step
//! published as a checkpoint the engine reloads. Seeded. The verifier gives 1
//! for the right number, 0.5 for a wrong number alone (the format), else 0:
//! SmolLM2-135M almost never answers right at first, so exact match alone
//! would leave every group without reward variance.
//!
//! `cargo run --release -p forgelog-trainer --example grpo_addition`
//! (`GRPO_STEPS`, `GRPO_LR`, `GRPO_SEED` override the defaults.)

use candle_core::{DType, Device};
use forgelog_consumers::{Processor, RewardConfig, RewardJoin, TrajectoryBuilder};
use forgelog_engine::sampling::SamplerConfig;
use forgelog_engine::scheduler::GenerationRequest;
use forgelog_engine::Engine;
use forgelog_schemas::{event_id, Event, RolloutFinished, RolloutStarted, VerifierResult};
use forgelog_trainer::checkpoint::CheckpointStore;
use forgelog_trainer::{AdamWConfig, Learner, LearnerConfig};
use serde_json::json;
use std::time::Instant;

const GROUP: usize = 8;
const RUN: &str = "grpo-addition";

fn env<T: std::str::FromStr>(name: &str, default: T) -> T {
    std::env::var(name)
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

/// SplitMix64, for the task stream.
fn next(state: &mut u64) -> u64 {
    *state = state.wrapping_add(0x9E37_79B9_7F4A_7C15);
    let mut z = *state;
    z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    z ^ (z >> 31)
}

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let steps: usize = env("GRPO_STEPS", 30);
    let learning_rate: f64 = env("GRPO_LR", 2e-5);
    let seed: u64 = env("GRPO_SEED", 7);
    let temperature = 0.7f32;

    let policy =
        forgelog_model::load_policy("smollm2", &forgelog_stream::models_dir(), &Device::Cpu)?;
    let mut learner = Learner::new(
        &policy.weights,
        policy.model.config(),
        &Device::Cpu,
        DType::F32,
        LearnerConfig {
            temperature: temperature as f64,
            adamw: AdamWConfig {
                learning_rate,
                ..Default::default()
            },
            ..Default::default()
        },
    )?;
    let engine = Engine::start(policy);
    let checkpoints = tempfile::tempdir()?;
    let store = CheckpointStore::new(&format!("file://{}", checkpoints.path().display()), RUN)?;
    let mut trajectories = TrajectoryBuilder::default();
    let mut rewards = RewardJoin::new(RewardConfig::default());
    let mut rng = seed;
    let mut reward_means = Vec::with_capacity(steps);
    let started = Instant::now();

    for step in 0..steps {
        let t0 = Instant::now();
        let (a, b) = (next(&mut rng) % 10, next(&mut rng) % 10);
        let question = format!("What is {a} + {b}? Answer with the number only.");
        let prompt = engine.chat_prompt(&[json!({"role": "user", "content": question})], None)?;
        let group = format!("step-{step}");
        let generations = futures_join(&engine, &prompt, temperature, seed, step).await?;

        let (events, verdicts) = recorded(&group, &question, &prompt, &generations, a + b);
        let batch = joined(&mut trajectories, &mut rewards, events, verdicts)?;
        let staleness = learner.staleness(&batch);
        let answers: Vec<String> = generations
            .iter()
            .map(|g| format!("{:?}", g.text.trim()))
            .collect();
        let m = learner.train_step(&[(batch, staleness)])?;
        reward_means.push(m.reward_mean);
        if m.tokens > 0 {
            // Publish: the engine samples the next group from the new weights.
            let state = learner.next_version();
            let uri = store
                .save(
                    Some(&learner.weights()),
                    &learner.optimizer.moments,
                    &state,
                    &[],
                )
                .await?;
            engine
                .reload(
                    &uri,
                    learner.version,
                    forgelog_engine::DEFAULT_MAX_CHECKPOINT_BYTES,
                )
                .await?;
        }
        println!(
            "step {step:>2} {a}+{b}: reward {:.3} loss {:+.4} ratio [{:.4}, {:.4}] max|ratio-1| {:.1e} truncated {:.3} entropy {:.3} tokens {} staleness {} version {} ({:.1}s) {}",
            m.reward_mean,
            m.loss,
            m.ratio_min,
            m.ratio_max,
            m.ratio_max_deviation,
            m.truncated_fraction,
            m.entropy,
            m.tokens,
            m.staleness_max,
            learner.version,
            t0.elapsed().as_secs_f64(),
            answers.join(" ")
        );
    }
    let mean = |xs: &[f64]| xs.iter().sum::<f64>() / xs.len().max(1) as f64;
    let k = 5.min(reward_means.len());
    println!(
        "mean reward first 5 steps: {:.3}, last 5 steps: {:.3} ({steps} steps, {:.0}s)",
        mean(&reward_means[..k]),
        mean(&reward_means[reward_means.len() - k..]),
        started.elapsed().as_secs_f64()
    );
    Ok(())
}

/// What the proxy, orchestrator and verifier would have written for a
/// group's `generations` of `prompt`: the rollouts' events, and a verdict
/// each scored against `sum`.
fn recorded(
    group: &str,
    question: &str,
    prompt: &[u32],
    generations: &[forgelog_engine::scheduler::Generation],
    sum: u64,
) -> (Vec<Event>, Vec<VerifierResult>) {
    let mut events: Vec<Event> = Vec::new();
    let mut verdicts = Vec::new();
    for (i, g) in generations.iter().enumerate() {
        let rollout = format!("{group}-r{i}");
        let session = format!("session-{rollout}");
        events.push(
            RolloutStarted {
                run_id: RUN.into(),
                event_id: event_id("RolloutStarted", &[RUN, &rollout]),
                rollout_id: rollout.clone(),
                session_id: session.clone(),
                task_id: question.to_string(),
                harness: "example".into(),
                group_id: group.to_string(),
                group_size: GROUP as i64,
                policy_version: Some(g.policy_version as i64),
                started_at_ms: 0,
                max_model_calls: None,
                max_tokens: None,
                api_key_sha256: None,
            }
            .into(),
        );
        let mut call = forgelog_schemas::testing::call_finished(RUN, &session, 0, 0, 0);
        call.rollout_id = rollout.clone();
        call.prompt_token_ids = prompt.to_vec();
        call.completion_token_ids = g.tokens.clone();
        call.completion_logprobs = g.logprobs.clone();
        call.policy_version = Some(g.policy_version as i64);
        call.usage.prompt_tokens = prompt.len() as i64;
        call.usage.completion_tokens = g.tokens.len() as i64;
        events.push(call.into());
        events.push(
            RolloutFinished {
                run_id: RUN.into(),
                event_id: event_id("RolloutFinished", &[RUN, &rollout]),
                rollout_id: rollout.clone(),
                session_id: session,
                exit_status: Some(0),
                model_calls: 1,
                started_at_ms: 0,
                finished_at_ms: 0,
            }
            .into(),
        );
        let reward = score(&g.text, sum);
        verdicts.push(VerifierResult {
            run_id: RUN.into(),
            event_id: event_id("VerifierResult", &[RUN, &rollout]),
            rollout_id: rollout,
            ok: true,
            reward: Some(reward),
            details: g.text.clone(),
            abandoned: false,
        });
    }
    (events, verdicts)
}

/// The group's training batch, as the trajectory and reward consumers join it.
fn joined(
    trajectories: &mut TrajectoryBuilder,
    rewards: &mut RewardJoin,
    events: Vec<Event>,
    verdicts: Vec<VerifierResult>,
) -> Result<forgelog_schemas::TrainingBatch, Box<dyn std::error::Error>> {
    let mut built = Vec::new();
    for e in &events {
        trajectories.process(e.clone(), &mut built);
    }
    let mut batches = Vec::new();
    for e in events
        .into_iter()
        .filter(|e| matches!(e, Event::RolloutStarted(_)))
    {
        rewards.process(e, &mut batches);
    }
    for e in built {
        rewards.process(e, &mut batches);
    }
    for v in verdicts {
        rewards.process(v.into(), &mut batches);
    }
    match batches.pop() {
        Some(Event::TrainingBatch(b)) => Ok(b),
        other => Err(format!("expected one TrainingBatch, got {other:?}").into()),
    }
}

/// 1 for exactly the sum; 0.5 for a number only (the asked-for format), but
/// the wrong one; 0 otherwise.
fn score(answer: &str, sum: u64) -> f64 {
    let answer = answer.trim().trim_end_matches('.');
    if answer == sum.to_string() {
        1.0
    } else if !answer.is_empty() && answer.chars().all(|c| c.is_ascii_digit()) {
        0.5
    } else {
        0.0
    }
}

/// The group's completions, sampled concurrently (the engine batches them).
async fn futures_join(
    engine: &Engine,
    prompt: &[u32],
    temperature: f32,
    seed: u64,
    step: usize,
) -> Result<Vec<forgelog_engine::scheduler::Generation>, forgelog_engine::EngineError> {
    let handles: Vec<_> = (0..GROUP)
        .map(|i| {
            let (engine, prompt) = (engine.clone(), prompt.to_vec());
            tokio::spawn(async move {
                engine
                    .generate(GenerationRequest {
                        prompt,
                        max_tokens: 4,
                        sampling: SamplerConfig {
                            temperature,
                            seed: Some(seed * 1_000_003 + (step * GROUP + i) as u64),
                            ..Default::default()
                        },
                        stop: vec![],
                        ignore_eos: false,
                        grammar: None,
                    })
                    .await
            })
        })
        .collect();
    let mut out = Vec::with_capacity(GROUP);
    for h in handles {
        out.push(h.await.expect("generation task")?);
    }
    Ok(out)
}
