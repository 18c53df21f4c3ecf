//! The architecture's hyper-parameters, read from GGUF metadata or a Hugging
//! Face `config.json` (whose field names these are).

use serde::{Deserialize, Serialize};

/// The decoder families forgelog runs: one [`crate::Transformer`] with what
/// each adds to llama's.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Architecture {
    /// SmolLM2, Llama 2/3: no biases.
    #[default]
    Llama,
    /// Qwen2 and Qwen2.5(-Coder): biases on the q/k/v projections.
    Qwen2,
    /// Qwen3 dense: a per-head RMS norm of queries and keys before RoPE
    /// ([`crate::qwen3`]), a head size of its own, no biases.
    Qwen3,
}

impl Architecture {
    pub const ALL: [Architecture; 3] = [
        Architecture::Llama,
        Architecture::Qwen2,
        Architecture::Qwen3,
    ];

    /// As `config.json`'s `model_type` says it.
    pub fn model_type(self) -> &'static str {
        match self {
            Architecture::Llama => "llama",
            Architecture::Qwen2 => "qwen2",
            Architecture::Qwen3 => "qwen3",
        }
    }

    /// `transformers`' class for it, as `config.json`'s `architectures` names it.
    pub fn causal_lm_class(self) -> &'static str {
        match self {
            Architecture::Llama => "LlamaForCausalLM",
            Architecture::Qwen2 => "Qwen2ForCausalLM",
            Architecture::Qwen3 => "Qwen3ForCausalLM",
        }
    }

    pub fn from_model_type(model_type: &str) -> Option<Architecture> {
        Architecture::ALL
            .into_iter()
            .find(|a| a.model_type() == model_type)
    }
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ModelConfig {
    #[serde(rename = "model_type", default)]
    pub architecture: Architecture,
    pub vocab_size: usize,
    pub hidden_size: usize,
    pub intermediate_size: usize,
    pub num_hidden_layers: usize,
    pub num_attention_heads: usize,
    pub num_key_value_heads: usize,
    /// Qwen3 sizes its heads apart from `hidden_size / num_attention_heads`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub head_dim: Option<usize>,
    #[serde(default = "default_rope_theta")]
    pub rope_theta: f64,
    #[serde(default = "default_rms_norm_eps")]
    pub rms_norm_eps: f64,
    #[serde(default = "default_context")]
    pub max_position_embeddings: usize,
    #[serde(default)]
    pub tie_word_embeddings: bool,
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

impl ModelConfig {
    pub fn head_dim(&self) -> usize {
        self.head_dim
            .unwrap_or(self.hidden_size / self.num_attention_heads)
    }

    /// The same config with `head_dim` left out where it is
    /// `hidden / heads` anyway, so that a config compares equal however it
    /// was written.
    pub fn canonical(mut self) -> ModelConfig {
        if self.head_dim == Some(self.hidden_size / self.num_attention_heads) {
            self.head_dim = None;
        }
        self
    }

    /// Biases on the q/k/v projections (Qwen2's).
    pub fn qkv_bias(&self) -> bool {
        self.architecture == Architecture::Qwen2
    }

    /// The per-head q/k RMS norm before RoPE (Qwen3's).
    pub fn qk_norm(&self) -> bool {
        self.architecture == Architecture::Qwen3
    }
}
