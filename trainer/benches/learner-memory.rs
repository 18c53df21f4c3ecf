//! The learner's peak memory for a Qwen3-0.6B shape (random weights, f32,
//! CPU): full fine-tuning against LoRA. Counts every byte the process
//! allocates (a counting global allocator), from before the weights are made
//! to the end of one GRPO step (a group of 2 sequences of 96 prompt + 32
//! sampled tokens): the weights as loaded, the learner's copy of them or its
//! adapter, gradients, AdamW's moments and the activations a backward pass
//! keeps.
//!
//! Then the activations of one long agent trajectory (SmolLM2's shape: a
//! 1,350-row mini-swe-agent rollout is what ran the suite out of memory),
//! every layer's kept against each layer recomputed in the backward pass
//! (activation checkpointing, the learner's default), and the time each
//! takes.
//!
//! `cargo bench -p forgelog-trainer --bench learner-memory` (about 13 GB of
//! memory at its peak, a few minutes on 2 cores after the release build).

use candle_core::{DType, Device};
use forgelog_model::lora::PROJECTIONS;
use forgelog_model::{LoraConfig, ModelConfig};
use forgelog_trainer::learner::SampledSequence;
use forgelog_trainer::{Learner, LearnerConfig};
use std::alloc::{GlobalAlloc, Layout, System};
use std::sync::atomic::{AtomicUsize, Ordering};

struct Counting;
static CURRENT: AtomicUsize = AtomicUsize::new(0);
static PEAK: AtomicUsize = AtomicUsize::new(0);

// SAFETY: every call is System's; the counters only observe sizes.
unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        let p = unsafe { System.alloc(layout) };
        if !p.is_null() {
            let now = CURRENT.fetch_add(layout.size(), Ordering::Relaxed) + layout.size();
            PEAK.fetch_max(now, Ordering::Relaxed);
        }
        p
    }
    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        unsafe { System.dealloc(ptr, layout) };
        CURRENT.fetch_sub(layout.size(), Ordering::Relaxed);
    }
    unsafe fn alloc_zeroed(&self, layout: Layout) -> *mut u8 {
        let p = unsafe { System.alloc_zeroed(layout) };
        if !p.is_null() {
            let now = CURRENT.fetch_add(layout.size(), Ordering::Relaxed) + layout.size();
            PEAK.fetch_max(now, Ordering::Relaxed);
        }
        p
    }
    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        let p = unsafe { System.realloc(ptr, layout, new_size) };
        if !p.is_null() {
            CURRENT.fetch_sub(layout.size(), Ordering::Relaxed);
            let now = CURRENT.fetch_add(new_size, Ordering::Relaxed) + new_size;
            PEAK.fetch_max(now, Ordering::Relaxed);
        }
        p
    }
}

#[global_allocator]
static ALLOCATOR: Counting = Counting;

/// One group: two members after the same 96-token prompt, 32 sampled tokens each.
fn group(vocab: u32) -> Vec<SampledSequence> {
    let member = |seed: u32, advantage: f64| {
        let tokens: Vec<u32> = (0..128u32)
            .map(|i| {
                if i < 96 {
                    (i * 7919) % vocab
                } else {
                    (i * 104_729 + seed) % vocab
                }
            })
            .collect();
        SampledSequence {
            recorded: vec![-2.0; 32],
            positions: (96..128).collect(),
            tokens,
            advantage,
        }
    };
    vec![member(1, 1.0), member(2, -1.0)]
}

/// Peak bytes from nothing to the end of one step of `config` on `seqs`;
/// where they go, phase by phase, on stderr.
fn peak_of_one_step(model: &ModelConfig, config: LearnerConfig, seqs: &[SampledSequence]) -> usize {
    let gb = |b: usize| b as f64 / 1e9;
    let start = CURRENT.load(Ordering::Relaxed);
    let held = || CURRENT.load(Ordering::Relaxed) - start;
    // The peak of what follows, above what is held as it starts.
    let phase = |name: &str, run: &mut dyn FnMut()| {
        let before = CURRENT.load(Ordering::Relaxed);
        PEAK.store(before, Ordering::Relaxed);
        run();
        let peak = PEAK.load(Ordering::Relaxed);
        eprintln!(
            "  {name}: peak {:.2} GB above the {:.2} GB held before it, {:.2} GB held after",
            gb(peak - before),
            gb(before - start),
            gb(held()),
        );
        peak - start
    };
    let mut peaks = Vec::new();
    let mut weights = None;
    peaks.push(phase("the weights made", &mut || {
        weights = Some(forgelog_model::testing::tiny_weights(model, 1))
    }));
    let mut learner = None;
    peaks.push(phase(
        "the learner made from them, they dropped",
        &mut || {
            let w = weights.take().unwrap();
            learner =
                Some(Learner::new(&w, model, &Device::Cpu, DType::F32, config.clone()).unwrap());
        },
    ));
    let mut learner = learner.unwrap();
    let mut eval = None;
    peaks.push(phase(
        "forward and backward (activations, gradients)",
        &mut || {
            let started = std::time::Instant::now();
            eval = Some(learner.evaluate(seqs).unwrap());
            eprintln!(
                "  forward and backward took {:.1} s",
                started.elapsed().as_secs_f64()
            );
        },
    ));
    peaks.push(phase("AdamW's update (moments made)", &mut || {
        learner
            .apply_gradients(&eval.take().unwrap().grads)
            .unwrap();
    }));
    drop(learner);
    peaks.into_iter().max().unwrap_or(0)
}

fn main() {
    // `cargo bench` passes `--bench`; nothing else is read.
    let model = forgelog_model::testing::qwen3_shape("qwen3-0.6b").expect("a known shape");
    let params: usize = forgelog_model::testing::tiny_weights_shapes(&model)
        .iter()
        .map(|(_, shape)| shape.iter().product::<usize>())
        .sum();
    let gb = |b: usize| b as f64 / 1e9;
    let seqs = group(model.vocab_size as u32);
    let full = peak_of_one_step(&model, LearnerConfig::default(), &seqs);
    eprintln!(
        "full: {:.2} GB ({:.1} bytes a parameter)",
        gb(full),
        full as f64 / params as f64
    );
    let lora = LoraConfig::new(16, 32.0, PROJECTIONS.map(String::from).to_vec()).unwrap();
    let adapter: usize = forgelog_model::lora::adapted_projections(&model, &lora)
        .iter()
        .map(|(_, d_in, d_out)| lora.rank * (d_in + d_out))
        .sum();
    let config = LearnerConfig {
        lora: Some(lora),
        ..Default::default()
    };
    let with_lora = peak_of_one_step(&model, config, &seqs);
    eprintln!(
        "lora r=16, all 7 projections: {:.2} GB ({} adapter parameters, {:.2}% of {})",
        gb(with_lora),
        adapter,
        100.0 * adapter as f64 / params as f64,
        params
    );
    println!("learner peak bytes for a Qwen3-0.6B shape: full {full}, lora {with_lora}");

    let smollm2 = smollm2_shape();
    let trajectory = [agent_trajectory(smollm2.vocab_size as u32)];
    let step = |checkpoint_activations| {
        let config = LearnerConfig {
            checkpoint_activations,
            ..Default::default()
        };
        peak_of_one_step(&smollm2, config, &trajectory)
    };
    let (kept, recomputed) = (step(false), step(true));
    println!(
        "learner peak bytes for a {}-row trajectory on SmolLM2's shape: every layer's activations kept {kept}, each layer recomputed {recomputed}",
        trajectory[0].tokens.len() - 1
    );
}

/// SmolLM2-135M's shape (its GGUF's metadata), random weights.
fn smollm2_shape() -> ModelConfig {
    ModelConfig {
        architecture: forgelog_model::Architecture::Llama,
        vocab_size: 49_152,
        hidden_size: 576,
        intermediate_size: 1536,
        num_hidden_layers: 30,
        num_attention_heads: 9,
        num_key_value_heads: 3,
        head_dim: None,
        rope_theta: 100_000.0,
        rms_norm_eps: 1e-5,
        max_position_embeddings: 8192,
        tie_word_embeddings: true,
    }
}

/// A mini-swe-agent rollout as the learner sees it: an 850-token prompt,
/// then two calls' answers (160 sampled tokens each) around a tool result:
/// 1,351 tokens.
fn agent_trajectory(vocab: u32) -> SampledSequence {
    let tokens: Vec<u32> = (0..1351u32).map(|i| (i * 7919 + 13) % vocab).collect();
    let positions: Vec<usize> = (850..1010).chain(1191..1351).collect();
    SampledSequence {
        recorded: vec![-2.0; positions.len()],
        positions,
        tokens,
        advantage: 1.0,
    }
}
