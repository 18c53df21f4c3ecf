//! forgelog-model: the policy itself. The llama family's decoder (llama,
//! Qwen2, Qwen3: [`Architecture`]) returning logits at every position
//! (teacher forcing) over ragged batches with a KV cache per sequence,
//! loading from GGUF (dequantized to f32) or a Hugging Face directory, the
//! tokenizer and the chat template.
//!
//! Weights are named as in Hugging Face checkpoints (see [`transformer`]); a
//! checkpoint the trainer writes is one `model.safetensors` with those names.

pub mod chat;
pub mod config;
mod device;
mod frozen;
pub mod hf;
mod kv_cache;
pub mod load;
pub mod lora;
pub mod qwen3;
pub mod segment_cache;
#[cfg(feature = "testing")]
pub mod testing;
pub mod transformer;

pub use chat::{ChatCodec, ChatTemplate, TemplateError};
pub use config::{Architecture, ModelConfig};
pub use device::DeviceKind;
pub use kv_cache::KvCache;
pub use load::{
    default_gguf_path, load_chat_codec, load_gguf, load_hf_dir, load_policy, load_tokenizer,
    weights_from_safetensors, LoadError, Policy,
};
pub use lora::LoraConfig;
pub use transformer::Logits;
pub use transformer::{Adapter, Transformer};

/// Numerically stable `log_softmax` of one row of logits, in f64 for the sums
/// so that the engine and a teacher-forced check compute the same numbers.
pub fn log_softmax(logits: &[f32]) -> Vec<f32> {
    let max = logits.iter().copied().fold(f32::NEG_INFINITY, f32::max);
    let sum: f64 = logits.iter().map(|&l| ((l - max) as f64).exp()).sum();
    let log_sum = sum.ln() as f32 + max;
    logits.iter().map(|&l| l - log_sum).collect()
}
