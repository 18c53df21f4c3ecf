//! A tiny random-init llama with a tiny BPE tokenizer trained on the spot, as
//! a Hugging Face directory, for fast tests of the model and the engine.

use crate::chat::CHATML;
use crate::LlamaConfig;
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

pub fn tiny_config(vocab_size: usize) -> LlamaConfig {
    LlamaConfig {
        vocab_size,
        hidden_size: 32,
        intermediate_size: 64,
        num_hidden_layers: 2,
        num_attention_heads: 4,
        num_key_value_heads: 2,
        rope_theta: 10_000.0,
        rms_norm_eps: 1e-5,
        max_position_embeddings: 96,
        tie_word_embeddings: false,
        attention_bias: false,
    }
}

/// Deterministic weights in `[-scale, scale)` (norm weights near 1) for `config`.
pub fn tiny_weights(config: &LlamaConfig, seed: u64) -> HashMap<String, Tensor> {
    let mut state = seed;
    let mut uniform = move || {
        state = state
            .wrapping_mul(6364136223846793005)
            .wrapping_add(1442695040888963407);
        ((state >> 40) as f32 / (1u64 << 24) as f32) * 2.0 - 1.0
    };
    let c = config;
    let (h, d, ffn) = (c.hidden_size, c.head_dim(), c.intermediate_size);
    let mut shapes: Vec<(String, Vec<usize>)> = vec![
        ("model.embed_tokens.weight".into(), vec![c.vocab_size, h]),
        ("model.norm.weight".into(), vec![h]),
        ("lm_head.weight".into(), vec![c.vocab_size, h]),
    ];
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
    if c.attention_bias {
        for i in 0..c.num_hidden_layers {
            let p = format!("model.layers.{i}.self_attn");
            shapes.extend([
                (format!("{p}.q_proj.bias"), vec![c.num_attention_heads * d]),
                (format!("{p}.k_proj.bias"), vec![c.num_key_value_heads * d]),
                (format!("{p}.v_proj.bias"), vec![c.num_key_value_heads * d]),
            ]);
        }
    }
    shapes
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

/// Writes a loadable Hugging Face llama directory: `config.json`,
/// `model.safetensors`, `tokenizer.json`, `tokenizer_config.json` (ChatML).
pub fn write_tiny_llama(dir: &Path, seed: u64) -> std::io::Result<LlamaConfig> {
    write_tiny(dir, seed, "llama", None)
}

/// [`write_tiny_llama`] with a context of `context` positions (a real
/// harness's prompt is thousands of tokens).
pub fn write_tiny_llama_with_context(
    dir: &Path,
    seed: u64,
    context: usize,
) -> std::io::Result<LlamaConfig> {
    write_tiny(dir, seed, "llama", Some(context))
}

/// The same as a Qwen2 directory (q/k/v biases).
pub fn write_tiny_qwen2(dir: &Path, seed: u64) -> std::io::Result<LlamaConfig> {
    write_tiny(dir, seed, "qwen2", None)
}

fn write_tiny(
    dir: &Path,
    seed: u64,
    model_type: &str,
    context: Option<usize>,
) -> std::io::Result<LlamaConfig> {
    std::fs::create_dir_all(dir)?;
    let tokenizer = tiny_tokenizer();
    tokenizer
        .save(dir.join("tokenizer.json"), false)
        .map_err(std::io::Error::other)?;
    let mut config = tiny_config(tokenizer.get_vocab_size(true));
    config.attention_bias = model_type == "qwen2";
    if let Some(context) = context {
        config.max_position_embeddings = context;
    }
    let mut config_json = serde_json::to_value(&config)?;
    config_json["model_type"] = json!(model_type);
    std::fs::write(dir.join("config.json"), config_json.to_string())?;
    std::fs::write(
        dir.join("tokenizer_config.json"),
        json!({"chat_template": CHATML, "eos_token": "<|im_end|>", "bos_token": null}).to_string(),
    )?;
    candle_core::safetensors::save(&tiny_weights(&config, seed), dir.join("model.safetensors"))
        .map_err(std::io::Error::other)?;
    Ok(config)
}
