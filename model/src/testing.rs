//! Tiny random-init llama, Qwen2 and Qwen3 models with a tiny BPE tokenizer
//! trained on the spot, as Hugging Face directories, for fast tests of the
//! model and the engine.

use crate::chat::CHATML;
use crate::{Architecture, ModelConfig};
use candle_core::{Device, Tensor};
use serde_json::json;
use std::collections::HashMap;
use std::path::Path;
use tokenizers::models::bpe::{BpeTrainer, BPE};
use tokenizers::models::TrainerWrapper;
use tokenizers::pre_tokenizers::byte_level::ByteLevel;
use tokenizers::{AddedToken, Tokenizer};

const CORPUS: &[&str] = &[
    "The capital of France is Paris.",
    "What is the capital of France?",
    "Hello, how are you today? I am fine, thank you.",
    "The quick brown fox jumps over the lazy dog.",
    "1 + 2 = 3, 10 * 10 = 100",
    "<tool_call>{\"name\": \"add\", \"arguments\": {\"a\": 1}}</tool_call>",
];

/// A byte-level BPE of about 300 tokens with `<|endoftext|>`=0,
/// `<|im_start|>`=1 and `<|im_end|>`=2, like SmolLM2's.
pub fn tiny_tokenizer() -> Tokenizer {
    let specials =
        ["<|endoftext|>", "<|im_start|>", "<|im_end|>"].map(|t| AddedToken::from(t, true));
    let mut trainer: TrainerWrapper = BpeTrainer::builder()
        .vocab_size(300)
        .min_frequency(1)
        .show_progress(false)
        .special_tokens(specials.to_vec())
        .initial_alphabet(ByteLevel::alphabet().into_iter().collect())
        .build()
        .into();
    let mut tokenizer = Tokenizer::new(BPE::default());
    tokenizer.with_pre_tokenizer(Some(ByteLevel::new(false, true, true)));
    tokenizer.with_decoder(Some(ByteLevel::default()));
    tokenizer
        .train(&mut trainer, CORPUS.iter().copied())
        .expect("train the tiny tokenizer");
    tokenizer
        .add_special_tokens(specials)
        .expect("add the special tokens");
    tokenizer
}

pub fn tiny_config(vocab_size: usize) -> ModelConfig {
    ModelConfig {
        architecture: Architecture::Llama,
        vocab_size,
        hidden_size: 32,
        intermediate_size: 64,
        num_hidden_layers: 2,
        num_attention_heads: 4,
        num_key_value_heads: 2,
        head_dim: None,
        rope_theta: 10_000.0,
        rms_norm_eps: 1e-5,
        max_position_embeddings: 96,
        tie_word_embeddings: false,
    }
}

/// [`tiny_config`] as Qwen3 shapes it (see [`write_tiny_qwen3`]).
pub fn tiny_qwen3_config(vocab_size: usize) -> ModelConfig {
    ModelConfig {
        architecture: Architecture::Qwen3,
        head_dim: Some(16),
        tie_word_embeddings: true,
        rms_norm_eps: 1e-6,
        rope_theta: 1_000_000.0,
        max_position_embeddings: 256,
        ..tiny_config(vocab_size)
    }
}

/// The published shape of a Qwen3 dense model (its `config.json`) by
/// name: `qwen3-0.6b`, `qwen3-1.7b`, `qwen3-4b`, `qwen3-8b`. Benches fill
/// it with [`tiny_weights`] (reproducible, slow) or [`random_weights`] (on
/// the device, at once): the cost of a step depends on the shape, not the
/// values.
pub fn qwen3_shape(name: &str) -> Option<ModelConfig> {
    let (hidden_size, intermediate_size, num_hidden_layers, num_attention_heads, tied) = match name
    {
        "qwen3-0.6b" => (1024, 3072, 28, 16, true),
        "qwen3-1.7b" => (2048, 6144, 28, 16, true),
        "qwen3-4b" => (2560, 9728, 36, 32, true),
        "qwen3-8b" => (4096, 12288, 36, 32, false),
        _ => return None,
    };
    Some(ModelConfig {
        architecture: Architecture::Qwen3,
        vocab_size: 151_936,
        hidden_size,
        intermediate_size,
        num_hidden_layers,
        num_attention_heads,
        num_key_value_heads: 8,
        head_dim: Some(128),
        rope_theta: 1_000_000.0,
        rms_norm_eps: 1e-6,
        max_position_embeddings: 40_960,
        tie_word_embeddings: tied,
    })
}

/// The weights one token's forward pass multiplies by: every projection
/// and the output head (tied or not), not the embedding lookup nor the
/// norms. A training step costs about `6 ×` this per token fed (`4 ×` when
/// the weights take no gradient, as under LoRA), attention aside.
pub fn matmul_parameters(config: &ModelConfig) -> usize {
    let head = config.vocab_size * config.hidden_size;
    tiny_weights_shapes(config)
        .iter()
        .filter(|(name, shape)| shape.len() == 2 && name.contains(".layers."))
        .map(|(_, shape)| shape.iter().product::<usize>())
        .sum::<usize>()
        + head
}

/// [`tiny_weights`]' names and shapes filled on `device` by its own
/// generator: uniform with a variance of one over the fan-in (norms 1), a
/// big shape's in a moment where [`tiny_weights`] spends minutes on one
/// core. Not reproducible: for benches, whose cost depends on the shape
/// alone.
pub fn random_weights(
    config: &ModelConfig,
    device: &Device,
) -> candle_core::Result<HashMap<String, Tensor>> {
    tiny_weights_shapes(config)
        .into_iter()
        .map(|(name, shape)| {
            let fan_in = *shape.last().unwrap_or(&1) as f32;
            let tensor = if name.ends_with("norm.weight") {
                Tensor::ones(shape, candle_core::DType::F32, device)?
            } else {
                let bound = (3.0 / fan_in).sqrt();
                Tensor::rand(-bound, bound, shape, device)?
            };
            Ok((name, tensor))
        })
        .collect()
}

/// A policy of `config` on `device` with [`random_weights`], the
/// [`tiny_tokenizer`] and ChatML: what the engine needs to sample, for
/// benches of a shape no package ships. Ids past the tokenizer's ~300
/// decode to nothing.
pub fn random_policy(
    config: &ModelConfig,
    name: &str,
    device: &Device,
) -> candle_core::Result<crate::Policy> {
    let weights = random_weights(config, device)?;
    let model = crate::Transformer::load(
        candle_nn::VarBuilder::from_tensors(weights.clone(), candle_core::DType::F32, device),
        config,
    )?;
    let tokenizer = tiny_tokenizer();
    let stop_token_ids = tokenizer.token_to_id("<|im_end|>").into_iter().collect();
    Ok(crate::Policy {
        name: name.into(),
        model,
        tokenizer,
        chat_template: crate::ChatTemplate::new(CHATML, "", "<|im_end|>"),
        stop_token_ids,
        weights,
    })
}

/// The name and shape of every weight of `config`.
pub fn tiny_weights_shapes(config: &ModelConfig) -> Vec<(String, Vec<usize>)> {
    let c = config;
    let (h, d, ffn) = (c.hidden_size, c.head_dim(), c.intermediate_size);
    let mut shapes: Vec<(String, Vec<usize>)> = vec![
        ("model.embed_tokens.weight".into(), vec![c.vocab_size, h]),
        ("model.norm.weight".into(), vec![h]),
    ];
    if !c.tie_word_embeddings {
        shapes.push(("lm_head.weight".into(), vec![c.vocab_size, h]));
    }
    for i in 0..c.num_hidden_layers {
        let p = format!("model.layers.{i}");
        shapes.extend([
            (format!("{p}.input_layernorm.weight"), vec![h]),
            (format!("{p}.post_attention_layernorm.weight"), vec![h]),
            (
                format!("{p}.self_attn.q_proj.weight"),
                vec![c.num_attention_heads * d, h],
            ),
            (
                format!("{p}.self_attn.k_proj.weight"),
                vec![c.num_key_value_heads * d, h],
            ),
            (
                format!("{p}.self_attn.v_proj.weight"),
                vec![c.num_key_value_heads * d, h],
            ),
            (
                format!("{p}.self_attn.o_proj.weight"),
                vec![h, c.num_attention_heads * d],
            ),
            (format!("{p}.mlp.gate_proj.weight"), vec![ffn, h]),
            (format!("{p}.mlp.up_proj.weight"), vec![ffn, h]),
            (format!("{p}.mlp.down_proj.weight"), vec![h, ffn]),
        ]);
    }
    for i in 0..c.num_hidden_layers {
        let p = format!("model.layers.{i}.self_attn");
        if c.qkv_bias() {
            shapes.extend([
                (format!("{p}.q_proj.bias"), vec![c.num_attention_heads * d]),
                (format!("{p}.k_proj.bias"), vec![c.num_key_value_heads * d]),
                (format!("{p}.v_proj.bias"), vec![c.num_key_value_heads * d]),
            ]);
        }
        if c.qk_norm() {
            shapes.extend([
                (format!("{p}.q_norm.weight"), vec![d]),
                (format!("{p}.k_norm.weight"), vec![d]),
            ]);
        }
    }
    shapes
}

/// Deterministic weights in `[-scale, scale)` (norm weights near 1) for `config`.
pub fn tiny_weights(config: &ModelConfig, seed: u64) -> HashMap<String, Tensor> {
    let mut state = seed;
    let mut uniform = move || {
        state = state
            .wrapping_mul(6364136223846793005)
            .wrapping_add(1442695040888963407);
        ((state >> 40) as f32 / (1u64 << 24) as f32) * 2.0 - 1.0
    };
    tiny_weights_shapes(config)
        .into_iter()
        .map(|(name, shape)| {
            let n: usize = shape.iter().product();
            let values: Vec<f32> = if name.ends_with("norm.weight") {
                (0..n).map(|_| 1.0 + 0.1 * uniform()).collect()
            } else {
                (0..n).map(|_| 0.5 * uniform()).collect()
            };
            let tensor = Tensor::from_vec(values, shape, &Device::Cpu).expect("shape matches");
            (name, tensor)
        })
        .collect()
}

/// A Qwen3-style chat template, written here: ChatML, tools offered in the
/// system turn and called in Hermes `<tool_call>` form, tool results as user
/// turns, and Qwen3's habit of dropping an assistant turn's `<think>` block
/// once a later user turn follows it (the history re-renders earlier turns,
/// so the token-in splice forks there and says so).
pub const QWEN3_STYLE_TEMPLATE: &str = r#"{%- set ns = namespace(last_user=-1) %}
{%- for m in messages %}{%- if m.role == 'user' %}{%- set ns.last_user = loop.index0 %}{%- endif %}{%- endfor %}
{%- if tools %}
{{- '<|im_start|>system\n' }}{%- if messages[0].role == 'system' %}{{- messages[0].content + '\n\n' }}{%- endif %}
{{- '# Tools\n\n<tools>' }}{%- for t in tools %}{{- '\n' + (t | tojson) }}{%- endfor %}
{{- '\n</tools>\n\nCall one as <tool_call>{"name": NAME, "arguments": ARGS}</tool_call>.<|im_end|>\n' }}
{%- elif messages[0].role == 'system' %}
{{- '<|im_start|>system\n' + messages[0].content + '<|im_end|>\n' }}
{%- endif %}
{%- for m in messages %}
{%- if m.role == 'system' and loop.first %}
{%- elif m.role == 'assistant' %}
{%- set content = m.content or '' %}
{%- if loop.index0 < ns.last_user and '</think>' in content %}{%- set content = content.split('</think>')[-1].lstrip('\n') %}{%- endif %}
{{- '<|im_start|>assistant\n' + content }}
{%- for call in m.tool_calls or [] %}
{{- '\n<tool_call>\n{"name": "' + call.function.name + '", "arguments": ' + (call.function.arguments if call.function.arguments is string else call.function.arguments | tojson) + '}\n</tool_call>' }}
{%- endfor %}
{{- '<|im_end|>\n' }}
{%- elif m.role == 'tool' %}
{{- '<|im_start|>user\n<tool_response>\n' + m.content + '\n</tool_response><|im_end|>\n' }}
{%- else %}
{{- '<|im_start|>' + m.role + '\n' + m.content + '<|im_end|>\n' }}
{%- endif %}
{%- endfor %}
{%- if add_generation_prompt %}{{- '<|im_start|>assistant\n' }}{%- endif %}"#;

/// Writes a loadable Hugging Face llama directory: `config.json`,
/// `model.safetensors`, `tokenizer.json`, `tokenizer_config.json` (ChatML).
pub fn write_tiny_llama(dir: &Path, seed: u64) -> std::io::Result<ModelConfig> {
    write_tiny(dir, seed, |_| {}, CHATML)
}

/// [`write_tiny_llama`] with a context of `context` positions (a real
/// harness's prompt is thousands of tokens).
pub fn write_tiny_llama_with_context(
    dir: &Path,
    seed: u64,
    context: usize,
) -> std::io::Result<ModelConfig> {
    write_tiny(dir, seed, |c| c.max_position_embeddings = context, CHATML)
}

/// The same as a Qwen2 directory (q/k/v biases), with room for a few turns.
pub fn write_tiny_qwen2(dir: &Path, seed: u64) -> std::io::Result<ModelConfig> {
    let qwen2 = |c: &mut ModelConfig| {
        c.architecture = Architecture::Qwen2;
        c.max_position_embeddings = 256;
    };
    write_tiny(dir, seed, qwen2, CHATML)
}

/// A Qwen3 directory: per-head q/k norms, heads of 16 where
/// `hidden / heads` is 8 (so `head_dim` must be read, not derived), tied
/// embeddings as Qwen3-0.6B has, eps 1e-6, rope theta 1e6, and
/// [`QWEN3_STYLE_TEMPLATE`].
pub fn write_tiny_qwen3(dir: &Path, seed: u64) -> std::io::Result<ModelConfig> {
    let qwen3 = |c: &mut ModelConfig| *c = tiny_qwen3_config(c.vocab_size);
    write_tiny(dir, seed, qwen3, QWEN3_STYLE_TEMPLATE)
}

fn write_tiny(
    dir: &Path,
    seed: u64,
    configure: impl FnOnce(&mut ModelConfig),
    template: &str,
) -> std::io::Result<ModelConfig> {
    std::fs::create_dir_all(dir)?;
    let tokenizer = tiny_tokenizer();
    tokenizer
        .save(dir.join("tokenizer.json"), false)
        .map_err(std::io::Error::other)?;
    let mut config = tiny_config(tokenizer.get_vocab_size(true));
    configure(&mut config);
    std::fs::write(dir.join("config.json"), serde_json::to_vec(&config)?)?;
    std::fs::write(
        dir.join("tokenizer_config.json"),
        json!({"chat_template": template, "eos_token": "<|im_end|>", "bos_token": null})
            .to_string(),
    )?;
    candle_core::safetensors::save(&tiny_weights(&config, seed), dir.join("model.safetensors"))
        .map_err(std::io::Error::other)?;
    Ok(config)
}

/// An adapter for `config` that changes the model: PEFT's start
/// ([`crate::lora::init_adapter`]) with every `B` filled too (a fresh `B` is
/// zero, which would hide a wrong merge).
pub fn tiny_adapter(
    config: &ModelConfig,
    lora: &crate::LoraConfig,
    seed: u64,
) -> HashMap<String, Tensor> {
    let mut adapter =
        crate::lora::init_adapter(config, lora, seed, &Device::Cpu).expect("adapter shapes");
    for (name, tensor) in adapter.iter_mut() {
        if name.ends_with("lora_B.weight") {
            let n = tensor.elem_count() as u32;
            let filled = Tensor::arange(seed as u32, seed as u32 + n, &Device::Cpu)
                .and_then(|t| t.to_dtype(candle_core::DType::F32))
                .and_then(|t| (t * 0.7)?.sin())
                .and_then(|t| (t * 0.05)?.reshape(tensor.dims()))
                .expect("fill B");
            *tensor = filled;
        }
    }
    adapter
}

/// The largest absolute entry of `t` (f32).
pub fn max_abs(t: &Tensor) -> f32 {
    t.abs()
        .and_then(|t| t.max_all())
        .and_then(|t| t.to_dtype(candle_core::DType::F32))
        .and_then(|t| t.to_scalar::<f32>())
        .expect("a tensor of numbers")
}

/// The largest absolute difference of two tensors of one shape.
pub fn max_abs_diff(a: &Tensor, b: &Tensor) -> f32 {
    max_abs(&(a - b).expect("tensors of one shape"))
}
