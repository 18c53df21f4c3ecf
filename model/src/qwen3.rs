//! Qwen3 dense (0.6B to 32B) is llama's decoder ([`crate::transformer`]) with
//! one more step inside attention and a head size of its own:
//!
//! - each query head and each key head is RMS-normalised over its own
//!   `head_dim` values, with a learned weight per dimension, *before* RoPE:
//!   `q_h ← q_h / rms(q_h) ⊙ w_q` and `k_h ← k_h / rms(k_h) ⊙ w_k`
//!   (`self_attn.q_norm.weight` and `self_attn.k_norm.weight`, `[head_dim]`,
//!   shared by all heads of a layer);
//! - `head_dim` is a hyper-parameter (128 at every size), not
//!   `hidden / heads`: q maps `hidden → heads · head_dim`, o maps it back;
//! - no biases, `rms_norm_eps` 1e-6, `rope_theta` 1e6, embeddings tied up to 4B.
//!
//! Pre-norm blocks, grouped-query attention, RoPE and SwiGLU are llama's and
//! run as they do there, through the same differentiable code.

use crate::transformer::rms_norm;
use crate::ModelConfig;
use candle_core::{Result, Tensor};
use candle_nn::VarBuilder;

/// The per-head norms of one layer's queries and keys.
#[derive(Clone)]
pub(crate) struct QkNorm {
    q_norm: Tensor,
    k_norm: Tensor,
    eps: f64,
}

impl QkNorm {
    /// `vb` is the layer's `self_attn`; `None` for architectures without it.
    pub(crate) fn load(vb: &VarBuilder, c: &ModelConfig) -> Result<Option<QkNorm>> {
        if !c.qk_norm() {
            return Ok(None);
        }
        Ok(Some(QkNorm {
            q_norm: vb.get(c.head_dim(), "q_norm.weight")?,
            k_norm: vb.get(c.head_dim(), "k_norm.weight")?,
            eps: c.rms_norm_eps,
        }))
    }

    /// `q` and `k` with their heads in the last dimension's place
    /// (`(…, head_dim)`), normalised head by head.
    pub(crate) fn forward(&self, q: &Tensor, k: &Tensor) -> Result<(Tensor, Tensor)> {
        Ok((
            rms_norm(q, &self.q_norm, self.eps)?,
            rms_norm(k, &self.k_norm, self.eps)?,
        ))
    }
}
