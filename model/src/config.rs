//! The architecture's hyper-parameters, read from GGUF metadata or a Hugging
//! Face `config.json`.

use serde::{Deserialize, Serialize};

/// Llama-family hyper-parameters. Qwen2 is the same architecture with biases
/// on the q/k/v projections (`attention_bias`).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct LlamaConfig {
    pub vocab_size: usize,
    pub hidden_size: usize,
    pub intermediate_size: usize,
    pub num_hidden_layers: usize,
    pub num_attention_heads: usize,
    pub num_key_value_heads: usize,
    #[serde(default = "default_rope_theta")]
    pub rope_theta: f64,
    #[serde(default = "default_rms_norm_eps")]
    pub rms_norm_eps: f64,
    #[serde(default = "default_context")]
    pub max_position_embeddings: usize,
    #[serde(default)]
    pub tie_word_embeddings: bool,
    #[serde(default)]
    pub attention_bias: bool,
}

fn default_rope_theta() -> f64 {
    10_000.0
}
fn default_rms_norm_eps() -> f64 {
    1e-6
}
fn default_context() -> usize {
    4096
}

impl LlamaConfig {
    pub fn head_dim(&self) -> usize {
        self.hidden_size / self.num_attention_heads
    }
}
