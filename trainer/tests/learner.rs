//! The learner on the tiny random-init llama: gradients against finite
//! differences, on-policy ratios with sequences the engine sampled (before
//! and after a checkpoint round trip through the engine), and staleness.

use candle_core::{DType, Device, Tensor};
use forgelog_engine::sampling::SamplerConfig;
use forgelog_engine::scheduler::GenerationRequest;
use forgelog_engine::Engine;
use forgelog_model::Policy;
use forgelog_schemas::{GroupMember, Sequence, TrainingBatch};
use forgelog_trainer::checkpoint::CheckpointStore;
use forgelog_trainer::learner::{SampledSequence, StepAssembler};
use forgelog_trainer::{Learner, LearnerConfig};
use std::collections::HashMap;

fn tiny_policy(dir: &std::path::Path) -> Policy {
    forgelog_model::testing::write_tiny_llama(dir, 7).unwrap();
    forgelog_model::load_hf_dir(dir, &Device::Cpu).unwrap()
}

/// The learner's device: `FORGELOG_TRAINER_TEST_DEVICE=cuda` (scripts/gpu-check.sh) runs
/// these checks on the GPU, against the engine on the CPU.
fn device() -> Device {
    match std::env::var("FORGELOG_TRAINER_TEST_DEVICE").as_deref() {
        Ok("cuda") => Device::new_cuda(0).expect("a CUDA device (build with --features cuda)"),
        _ => Device::Cpu,
    }
}

use forgelog_model::testing::max_abs;

fn learner(policy: &Policy, config: LearnerConfig) -> Learner {
    Learner::new(
        &policy.weights,
        policy.model.config(),
        &device(),
        DType::F32,
        config,
    )
    .unwrap()
}

/// A one-member-per-sequence group with the given rewards.
fn batch(group: &str, sequences: Vec<Sequence>, rewards: &[f64]) -> TrainingBatch {
    let rewards: Vec<Option<f64>> = rewards.iter().map(|&r| Some(r)).collect();
    let (advantages, flat) = forgelog_consumers::rewards::advantages(&rewards, 1e-6);
    TrainingBatch {
        run_id: "test".into(),
        event_id: group.into(),
        group_id: group.into(),
        task_id: "t".into(),
        no_reward_variance: flat,
        members: sequences
            .into_iter()
            .zip(rewards.iter().zip(advantages))
            .enumerate()
            .map(|(i, (s, (&reward, advantage)))| GroupMember {
                rollout_id: format!("{group}-{i}"),
                harness: "test".into(),
                reward,
                advantage,
                sequences: vec![s],
            })
            .collect(),
    }
}

fn sequence(prompt: &[u32], completion: &[u32], logprobs: &[f32], version: u32) -> Sequence {
    let n = prompt.len() + completion.len();
    Sequence {
        root: 0,
        call_indices: vec![0],
        discarded: false,
        token_ids: prompt.iter().chain(completion).copied().collect(),
        loss_mask: (0..n).map(|i| (i >= prompt.len()) as u8).collect(),
        sampling_logprobs: std::iter::repeat_n(0.0, prompt.len())
            .chain(logprobs.iter().copied())
            .collect(),
        policy_versions: std::iter::repeat_n(u32::MAX, prompt.len())
            .chain(std::iter::repeat_n(version, completion.len()))
            .collect(),
        tool_calls: 0,
    }
}

/// Sequences of the tiny llama's tokens: three of their own, then two that
/// share their first 20 tokens (a run fed from one copy of its prefix).
fn check_sequences(vocab: u32) -> Vec<SampledSequence> {
    let tokens = |seed: u32, n: usize| -> Vec<u32> {
        (0..n as u32)
            .map(|i| (seed * 131 + i * 37) % vocab)
            .collect()
    };
    let shared =
        |seed: u32| -> Vec<u32> { tokens(4, 20).into_iter().chain(tokens(seed, 4)).collect() };
    let seq = |tokens: Vec<u32>, positions: Vec<usize>, advantage: f64| SampledSequence {
        recorded: vec![0.0; positions.len()],
        tokens,
        positions,
        advantage,
    };
    vec![
        seq(tokens(1, 10), vec![6, 7, 8, 9], 1.0),
        seq(tokens(2, 8), vec![3, 5, 7], -0.7),
        seq(tokens(3, 12), vec![9, 10, 11], 0.4),
        seq(shared(5), vec![20, 22, 23], 0.9),
        seq(shared(6), vec![21, 22, 23], -0.9),
    ]
}

#[test]
fn gradients_of_the_grpo_loss_match_finite_differences() {
    let dir = tempfile::tempdir().unwrap();
    let policy = tiny_policy(dir.path());
    // Small micro-batches: the gradient is accumulated over two passes, the
    // second feeding the last two sequences from their shared prefix.
    let learner = learner(
        &policy,
        LearnerConfig {
            micro_batch_tokens: 40,
            ..Default::default()
        },
    );
    let mut seqs = check_sequences(policy.model.config().vocab_size as u32);
    let micro = forgelog_trainer::learner::micro_batches(&seqs, 40, true);
    let shape: Vec<Vec<(usize, usize)>> = micro
        .iter()
        .map(|m| m.runs.iter().map(|r| (r.prefix, r.members.len())).collect())
        .collect();
    assert_eq!(shape, [vec![(0, 1), (0, 1), (0, 1)], vec![(19, 2)]]);
    // Recorded logprobs near the current ones and one far (ratio 1.65, a
    // token PPO's clip cut), all below the truncation C = 2: there the
    // gradient the learner takes is the derivative of the loss's value.
    let at_zero = learner.evaluate(&seqs).unwrap();
    let mut ratios = at_zero.ratios.iter();
    let offsets = [0.05, -0.08, 0.1, -0.5, -0.03, 0.07, 0.0, 0.02, -0.06, 0.04];
    let mut offset = offsets.iter().cycle();
    for s in &mut seqs {
        for r in &mut s.recorded {
            *r = (ratios.next().unwrap().ln() + offset.next().unwrap()) as f32;
        }
    }
    let analytic = learner.evaluate(&seqs).unwrap();
    assert_eq!(analytic.truncated, 0);
    assert!(
        analytic.ratios.iter().any(|r| *r > 1.6),
        "{:?}",
        analytic.ratios
    );
    let names = [
        "lm_head.weight",
        "model.embed_tokens.weight",
        "model.layers.0.self_attn.q_proj.weight",
        "model.layers.0.self_attn.k_proj.weight",
        "model.layers.1.self_attn.v_proj.weight",
        "model.layers.1.mlp.down_proj.weight",
        "model.layers.0.input_layernorm.weight",
        "model.norm.weight",
    ];
    let h = 2e-3f32;
    for name in names {
        let i = learner
            .vars()
            .iter()
            .position(|(n, _)| n == name)
            .expect(name);
        let var = &learner.vars()[i].1;
        let grad = analytic.grads[i]
            .as_ref()
            .expect("a gradient")
            .flatten_all()
            .unwrap()
            .to_vec1::<f32>()
            .unwrap();
        // The entry with the largest gradient: a relative comparison means something there.
        let (k, &g) = grad
            .iter()
            .enumerate()
            .max_by(|a, b| a.1.abs().total_cmp(&b.1.abs()))
            .unwrap();
        let original = var.as_tensor().copy().unwrap();
        let shape = original.shape().clone();
        let at = |delta: f32| {
            let mut w = original.flatten_all().unwrap().to_vec1::<f32>().unwrap();
            w[k] += delta;
            var.set(&Tensor::from_vec(w, &shape, var.device()).unwrap())
                .unwrap();
            let loss = learner.evaluate(&seqs).unwrap().loss;
            var.set(&original).unwrap();
            loss
        };
        let numeric = ((at(h) - at(-h)) / (2.0 * h as f64)) as f32;
        println!("{name}[{k}]: analytic {g:.6}, finite difference {numeric:.6}");
        assert!(g.abs() > 1e-4, "{name}: gradient too small to compare");
        assert!(
            (numeric - g).abs() <= 0.01 * g.abs() + 2e-4,
            "{name}[{k}]: analytic {g} vs finite difference {numeric}"
        );
    }
}

/// A shared prefix fed once, and layers recomputed in the backward pass
/// (activation checkpointing, the default), each give the loss, ratios and
/// gradients of feeding every member whole with every activation kept.
#[test]
fn shared_prefixes_and_recomputed_layers_give_the_loss_and_gradients_of_the_plain_pass() {
    let dir = tempfile::tempdir().unwrap();
    let policy = tiny_policy(dir.path());
    let mut seqs = check_sequences(policy.model.config().vocab_size as u32);
    for (i, s) in seqs.iter_mut().enumerate() {
        s.recorded = (0..s.positions.len())
            .map(|j| -1.0 - 0.1 * (i + j) as f32)
            .collect();
    }
    let eval = |share_prefixes, checkpoint_activations| {
        learner(
            &policy,
            LearnerConfig {
                share_prefixes,
                checkpoint_activations,
                ..Default::default()
            },
        )
        .evaluate(&seqs)
        .unwrap()
    };
    let whole = eval(false, false);
    for (share, recompute) in [(true, false), (false, true), (true, true)] {
        let how = format!("shared prefixes {share}, recomputed layers {recompute}");
        let other = eval(share, recompute);
        assert!(
            (other.loss - whole.loss).abs() <= 1e-6 * whole.loss.abs().max(1.0),
            "{how}: loss {} vs {}",
            other.loss,
            whole.loss
        );
        assert_eq!(other.ratios.len(), whole.ratios.len());
        for (a, b) in other.ratios.iter().zip(&whole.ratios) {
            assert!((a - b).abs() <= 1e-5, "{how}: ratio {a} vs {b}");
        }
        let mut compared = 0;
        for (a, b) in other.grads.iter().zip(&whole.grads) {
            let (Some(a), Some(b)) = (a, b) else {
                assert!(a.is_none() && b.is_none(), "{how}");
                continue;
            };
            let (scale, diff) = (max_abs(b), max_abs(&(a - b).unwrap()));
            assert!(
                diff <= 1e-5 * scale.max(1.0),
                "{how}: gradient differs by {diff} (scale {scale})"
            );
            compared += 1;
        }
        assert_eq!(
            compared,
            other.grads.len(),
            "{how}: every weight has a gradient"
        );
    }
}

/// Samples `n` completions at temperature `t` from the engine.
async fn sample_group(engine: &Engine, prompt: &[u32], n: u64, t: f32) -> Vec<Sequence> {
    let mut out = Vec::new();
    for seed in 0..n {
        let g = engine
            .generate(GenerationRequest {
                prompt: prompt.to_vec(),
                max_tokens: 8,
                sampling: SamplerConfig {
                    temperature: t,
                    seed: Some(seed + 1),
                    ..Default::default()
                },
                stop: vec![],
                ignore_eos: true,
                grammar: None,
            })
            .await
            .unwrap();
        out.push(sequence(
            prompt,
            &g.tokens,
            &g.logprobs,
            g.policy_version as u32,
        ));
    }
    out
}

#[tokio::test]
async fn sequences_the_engine_sampled_at_the_learners_version_have_ratio_one() {
    let dir = tempfile::tempdir().unwrap();
    let policy = tiny_policy(&dir.path().join("model"));
    let temperature = 0.8;
    let mut learner = learner(
        &policy,
        LearnerConfig {
            temperature: temperature as f64,
            adamw: forgelog_trainer::AdamWConfig {
                learning_rate: 1e-3,
                ..Default::default()
            },
            ..Default::default()
        },
    );
    let engine = Engine::start(policy.clone());
    // Long enough that the group is fed from one copy of it.
    let prompt = engine
        .encode("The capital of France is a city on the Seine, and its name is")
        .unwrap();
    assert!(
        prompt.len() > forgelog_trainer::learner::MIN_SHARED_TOKENS,
        "{prompt:?}"
    );
    let store = CheckpointStore::new(
        &format!("file://{}/checkpoints", dir.path().display()),
        "run",
    )
    .unwrap();
    for version in 0..2u64 {
        let group = batch(
            &format!("g{version}"),
            sample_group(&engine, &prompt, 4, temperature).await,
            &[1.0, 0.0, 0.5, 0.0],
        );
        assert_eq!(learner.staleness(&group), 0);
        let m = learner.train_step(&[(group, 0)]).unwrap();
        println!(
            "version {version}: largest |ratio - 1| = {:.2e}, truncated fraction {}",
            m.ratio_max_deviation, m.truncated_fraction
        );
        assert_eq!(m.tokens, 32);
        assert!(m.ratio_max_deviation < 1e-3, "{m:?}");
        assert_eq!(m.truncated_fraction, 0.0);
        assert!(m.grad_norm > 0.0 && m.loss.is_finite());
        // Publish the step as the next version and have the engine serve it.
        let state = learner.next_version();
        let uri = store
            .save(
                Some(&learner.weights()),
                &learner.optimizer.moments,
                &state,
                &[],
            )
            .await
            .unwrap();
        engine
            .reload(
                &uri,
                learner.version,
                forgelog_engine::DEFAULT_MAX_CHECKPOINT_BYTES,
            )
            .await
            .unwrap();
        assert_eq!(engine.policy_version(), learner.version);
    }
    // What a restarted learner reads back is what was saved.
    let (weights, moments, state) = store.load(2, &device()).await.unwrap();
    assert_eq!(
        (state.version, state.step, state.optimizer_steps),
        (2, 2, 2)
    );
    let name = "model.layers.1.mlp.up_proj.weight";
    let diff = max_abs(&(&weights[name] - learner.weights()[name].clone()).unwrap());
    assert_eq!(diff, 0.0);
    assert_eq!(moments.len(), learner.optimizer.moments.len());
}

#[test]
fn batches_older_than_the_staleness_bound_are_dropped_and_counted() {
    let dir = tempfile::tempdir().unwrap();
    let policy = tiny_policy(dir.path());
    let mut learner = learner(&policy, LearnerConfig::default());
    learner.version = 10;
    let at = |group: &str, version: u32| {
        batch(
            group,
            vec![
                sequence(&[5, 6, 7], &[8, 9], &[-1.0, -2.0], version),
                sequence(&[5, 6, 7], &[10, 11], &[-1.5, -2.5], version),
            ],
            &[1.0, 0.0],
        )
    };
    let mut assembler = StepAssembler::new(8);
    let offered = [("fresh", 10), ("k4", 6), ("k5", 5), ("ancient", 0)];
    let admitted: Vec<bool> = offered
        .iter()
        .map(|&(g, v)| assembler.offer(&learner, at(g, v)))
        .collect();
    assert_eq!(admitted, [true, true, false, false]);
    assert_eq!(assembler.dropped_stale, 2);
    assert!(
        assembler.full(),
        "two admitted groups of 4 sampled tokens fill a step of 8"
    );
    let step = assembler.take();
    let groups: Vec<&str> = step.iter().map(|(b, _)| b.group_id.as_str()).collect();
    assert_eq!(groups, ["fresh", "k4"]);
    let m = learner.train_step(&step).unwrap();
    assert_eq!((m.groups, m.tokens, m.staleness_max), (2, 8, 4));
    assert_eq!(m.staleness_mean, 2.0);
}

#[test]
fn a_bf16_learner_trains_through_the_same_model_code() {
    let dir = tempfile::tempdir().unwrap();
    let policy = tiny_policy(dir.path());
    let mut learner = Learner::new(
        &policy.weights,
        policy.model.config(),
        &device(),
        DType::BF16,
        LearnerConfig::default(),
    )
    .unwrap();
    let group = batch(
        "g",
        vec![
            sequence(&[5, 6, 7], &[8, 9], &[-6.0, -6.0], 0),
            sequence(&[5, 6, 7], &[10, 11], &[-6.0, -6.0], 0),
        ],
        &[1.0, 0.0],
    );
    let m = learner.train_step(&[(group, 0)]).unwrap();
    assert!(m.loss.is_finite() && m.grad_norm > 0.0, "{m:?}");
    assert_eq!(learner.weights()["lm_head.weight"].dtype(), DType::BF16);
}

/// LoRA on a tiny Qwen3: only the adapter's tensors are variables and have
/// optimizer moments, the frozen weights do not move, a fresh adapter is the
/// base model, and after steps the merged weights (what a version publishes)
/// give the logits of the unmerged model that trained, which now favours the
/// rewarded completion.
#[test]
fn a_lora_learner_trains_only_the_adapter() {
    use forgelog_model::lora::{is_adapter_tensor, PROJECTIONS};
    use forgelog_model::LoraConfig;
    let dir = tempfile::tempdir().unwrap();
    forgelog_model::testing::write_tiny_qwen3(dir.path(), 3).unwrap();
    let policy = forgelog_model::load_hf_dir(dir.path(), &Device::Cpu).unwrap();
    let lora = LoraConfig::new(4, 8.0, PROJECTIONS.map(String::from).to_vec()).unwrap();
    let mut config = LearnerConfig {
        lora: Some(lora),
        ..Default::default()
    };
    config.adamw.learning_rate = 1e-2;
    let mut learner = learner(&policy, config);
    let trained = learner.weights();
    assert_eq!(
        trained.len(),
        2 * 7 * 2,
        "A and B of 7 projections in 2 layers"
    );
    assert!(trained.keys().all(|n| is_adapter_tensor(n)));
    // Compared on the CPU, where the reference model is.
    let logits = |model: &forgelog_model::Transformer| {
        model
            .forward(&[5, 6, 7, 8, 9], &mut forgelog_model::KvCache::new())
            .and_then(|l| l.to_device(&Device::Cpu))
            .unwrap()
    };
    let on_cpu = |weights: HashMap<String, Tensor>| -> HashMap<String, Tensor> {
        weights
            .into_iter()
            .map(|(n, t)| (n, t.to_device(&Device::Cpu).unwrap()))
            .collect()
    };
    let start = on_cpu(learner.model_weights().unwrap());
    for (name, w) in &policy.weights {
        assert_eq!(max_abs(&(w - &start[name]).unwrap()), 0.0, "{name}");
    }
    // Not bit-equal: with variables in it the model takes the differentiable
    // norm and softmax, the served one candle's fused kernels.
    let fresh = max_abs(&(logits(learner.model()) - logits(&policy.model)).unwrap());
    assert!(fresh < 1e-5, "a fresh adapter is the base model: {fresh}");

    let group = || {
        batch(
            "g",
            vec![
                sequence(&[5, 6, 7], &[8, 9], &[-6.0, -6.0], 0),
                sequence(&[5, 6, 7], &[10, 11], &[-6.0, -6.0], 0),
            ],
            &[1.0, 0.0],
        )
    };
    let favoured = |model: &forgelog_model::Transformer| {
        let l = model
            .forward(&[5, 6, 7], &mut forgelog_model::KvCache::new())
            .unwrap();
        let row: Vec<f32> = l.get(2).unwrap().to_vec1().unwrap();
        let lp = forgelog_model::log_softmax(&row);
        lp[8] - lp[10]
    };
    let before = favoured(learner.model());
    for _ in 0..3 {
        let m = learner.train_step(&[(group(), 0)]).unwrap();
        assert!(m.tokens > 0 && m.grad_norm > 0.0, "{m:?}");
    }
    assert!(
        favoured(learner.model()) > before + 0.1,
        "the rewarded completion gained"
    );
    assert!(learner
        .optimizer
        .moments
        .keys()
        .all(|n| is_adapter_tensor(n)));

    let merged = on_cpu(learner.model_weights().unwrap());
    let mut moved = 0;
    for (name, w) in &policy.weights {
        moved += (max_abs(&(w - &merged[name]).unwrap()) > 0.0) as usize;
    }
    assert_eq!(
        moved,
        2 * 7,
        "every adapted projection's merged weight moved"
    );
    let served = forgelog_model::Transformer::load(
        candle_nn::VarBuilder::from_tensors(merged, DType::F32, &Device::Cpu),
        policy.model.config(),
    )
    .unwrap();
    let gap = max_abs(&(logits(&served) - logits(learner.model())).unwrap());
    assert!(gap < 1e-4, "merged vs unmerged: {gap}");
}
