//! Attention with rotary positions and a KV cache per sequence: per
//! sequence over a ragged batch, or batched when every sequence decodes one
//! token.

use super::projection::{projection, Projection};
use super::{softmax, Adapter};
use crate::qwen3::QkNorm;
use crate::{KvCache, ModelConfig};
use candle_core::{Device, Module, Result, Tensor, D};
use candle_nn::VarBuilder;

#[derive(Clone)]
pub(super) struct Attention {
    q_proj: Projection,
    k_proj: Projection,
    v_proj: Projection,
    o_proj: Projection,
    qk_norm: Option<QkNorm>,
    heads: usize,
    kv_heads: usize,
    head_dim: usize,
}

/// Rotates the two halves of each head (the Hugging Face layout):
/// `[x1, x2] -> [x1 cos - x2 sin, x2 cos + x1 sin]`. `x`: `(heads, t, head_dim)`.
fn rope(x: &Tensor, cos: &Tensor, sin: &Tensor) -> Result<Tensor> {
    let half = x.dim(D::Minus1)? / 2;
    let x1 = x.narrow(D::Minus1, 0, half)?;
    let x2 = x.narrow(D::Minus1, half, half)?;
    let rotated_1 = (x1.broadcast_mul(cos)? - x2.broadcast_mul(sin)?)?;
    let rotated_2 = (x2.broadcast_mul(cos)? + x1.broadcast_mul(sin)?)?;
    Tensor::cat(&[rotated_1, rotated_2], D::Minus1)
}

/// Additive mask for `t` new queries after `past` cached positions: query `i`
/// sees keys `0..=past + i`.
fn causal_mask(t: usize, past: usize, device: &Device) -> Result<Tensor> {
    let keys = past + t;
    let mask: Vec<f32> = (0..t)
        .flat_map(|i| (0..keys).map(move |j| if j > past + i { f32::NEG_INFINITY } else { 0.0 }))
        .collect();
    Tensor::from_vec(mask, (t, keys), device)
}

impl Attention {
    pub(super) fn load(
        vb: &VarBuilder,
        c: &ModelConfig,
        adapter: Option<&Adapter>,
    ) -> Result<Attention> {
        let (hidden, head_dim) = (c.hidden_size, c.head_dim());
        let (q_out, kv_out) = (
            c.num_attention_heads * head_dim,
            c.num_key_value_heads * head_dim,
        );
        let bias = c.qkv_bias();
        Ok(Attention {
            q_proj: projection(vb, "q_proj", (hidden, q_out), bias, adapter)?,
            k_proj: projection(vb, "k_proj", (hidden, kv_out), bias, adapter)?,
            v_proj: projection(vb, "v_proj", (hidden, kv_out), bias, adapter)?,
            o_proj: projection(vb, "o_proj", (q_out, hidden), false, adapter)?,
            qk_norm: QkNorm::load(vb, c)?,
            heads: c.num_attention_heads,
            kv_heads: c.num_key_value_heads,
            head_dim,
        })
    }

    /// `x`: `(rows, hidden)`, the rows of all sequences one after the other.
    pub(super) fn forward(
        &self,
        x: &Tensor,
        layer: usize,
        batch: &mut [(&[u32], &mut KvCache)],
        plan: &StepPlan,
    ) -> Result<Tensor> {
        let (q, k, v) = (
            self.q_proj.forward(x)?,
            self.k_proj.forward(x)?,
            self.v_proj.forward(x)?,
        );
        let out = match plan {
            StepPlan::Decode { cos, sin, mask } => {
                self.decode((&q, &k, &v), layer, batch, (cos, sin), mask)?
            }
            StepPlan::Ragged { rope, masks } => {
                self.ragged((&q, &k, &v), layer, batch, rope, masks)?
            }
        };
        self.o_proj.forward(&out)
    }

    /// Queries and keys, heads in the last dimension, as RoPE takes them: the
    /// architecture's per-head norm if it has one, and the queries scaled by
    /// `1/sqrt(head_dim)` (cheaper than scaling the scores).
    fn normalise(&self, q: Tensor, k: Tensor) -> Result<(Tensor, Tensor)> {
        let (q, k) = match &self.qk_norm {
            Some(norm) => norm.forward(&q, &k)?,
            None => (q, k),
        };
        Ok(((q * (1.0 / (self.head_dim as f64).sqrt()))?, k))
    }

    /// Attention per sequence, whatever its number of new tokens. Grouped-query
    /// attention is a reshape of the queries to `(kv_heads, heads / kv_heads * t,
    /// head_dim)`: no copy of the keys and values per query head.
    fn ragged(
        &self,
        (q, k, v): (&Tensor, &Tensor, &Tensor),
        layer: usize,
        batch: &mut [(&[u32], &mut KvCache)],
        rope_tables: &[(Tensor, Tensor)],
        masks: &[Option<Tensor>],
    ) -> Result<Tensor> {
        let (h, kvh, d) = (self.heads, self.kv_heads, self.head_dim);
        let mut outputs = Vec::with_capacity(batch.len());
        let mut row = 0;
        for (i, (tokens, cache)) in batch.iter_mut().enumerate() {
            let t = tokens.len();
            let heads_of = |m: &Tensor, n: usize| -> Result<Tensor> {
                m.narrow(0, row, t)?
                    .reshape((t, n, d))?
                    .transpose(0, 1)?
                    .contiguous()
            };
            let (cos, sin) = &rope_tables[i];
            let (q, k) = self.normalise(heads_of(q, h)?, heads_of(k, kvh)?)?;
            let (q, k) = (rope(&q, cos, sin)?, rope(&k, cos, sin)?);
            let (k, v) = cache.append(layer, k, heads_of(v, kvh)?)?;
            let keys = k.dim(1)?;
            let q = q.reshape((kvh, h / kvh * t, d))?;
            let mut scores = q.matmul(&k.t()?)?;
            if let Some(mask) = &masks[i] {
                scores = scores
                    .reshape((kvh, h / kvh, t, keys))?
                    .broadcast_add(mask)?
                    .reshape((kvh, h / kvh * t, keys))?;
            }
            let out = softmax(&scores)?.matmul(&v)?.reshape((h, t, d))?;
            outputs.push(out.transpose(0, 1)?.reshape((t, h * d))?);
            row += t;
        }
        Tensor::cat(&outputs, 0)
    }

    /// The same attention for a batch of one new token per sequence, as a few
    /// batched ops instead of a few per sequence: caches are zero-padded to
    /// the longest and the padding masked out.
    fn decode(
        &self,
        (q, k, v): (&Tensor, &Tensor, &Tensor),
        layer: usize,
        batch: &mut [(&[u32], &mut KvCache)],
        (cos, sin): (&Tensor, &Tensor),
        mask: &Tensor,
    ) -> Result<Tensor> {
        let (h, kvh, d, b) = (self.heads, self.kv_heads, self.head_dim, batch.len());
        let (q, k) = self.normalise(q.reshape((b, h, d))?, k.reshape((b, kvh, d))?)?;
        let (q, k) = (rope(&q, cos, sin)?, rope(&k, cos, sin)?);
        let v = v.reshape((b, kvh, d))?;
        let mut keys = Vec::with_capacity(b);
        let mut values = Vec::with_capacity(b);
        for (i, (_, cache)) in batch.iter_mut().enumerate() {
            let new_k = k.get(i)?.unsqueeze(1)?;
            let new_v = v.get(i)?.unsqueeze(1)?.contiguous()?;
            let (k_all, v_all) = cache.append(layer, new_k, new_v)?;
            keys.push(k_all);
            values.push(v_all);
        }
        let longest = mask.dim(D::Minus1)?;
        let pad = |m: &Tensor| m.pad_with_zeros(1, 0, longest - m.dim(1)?);
        let keys = Tensor::stack(&keys.iter().map(pad).collect::<Result<Vec<_>>>()?, 0)?;
        let values = Tensor::stack(&values.iter().map(pad).collect::<Result<Vec<_>>>()?, 0)?;
        let q = q.reshape((b, kvh, h / kvh, d))?;
        let scores = q.matmul(&keys.t()?)?.broadcast_add(mask)?;
        softmax(&scores)?.matmul(&values)?.reshape((b, h * d))
    }
}

/// What every layer of one step shares: rotary tables at each sequence's
/// positions and the attention masks.
pub(super) enum StepPlan {
    /// Every sequence feeds one token after a non-empty cache.
    Decode {
        /// `(batch, 1, head_dim / 2)`.
        cos: Tensor,
        sin: Tensor,
        /// `(batch, 1, 1, longest)`: `-inf` over each cache's padding.
        mask: Tensor,
    },
    Ragged {
        /// `(t, head_dim / 2)` per sequence.
        rope: Vec<(Tensor, Tensor)>,
        /// The causal mask of each sequence feeding more than one token.
        masks: Vec<Option<Tensor>>,
    },
}

impl StepPlan {
    pub(super) fn new(
        batch: &[(&[u32], &mut KvCache)],
        cos: &Tensor,
        sin: &Tensor,
    ) -> Result<StepPlan> {
        let device = cos.device();
        let decode = batch.len() > 1
            && batch
                .iter()
                .all(|(tokens, cache)| tokens.len() == 1 && !cache.is_empty());
        if decode {
            let positions: Vec<u32> = batch.iter().map(|(_, c)| c.len() as u32).collect();
            let positions = Tensor::new(positions.as_slice(), device)?;
            let longest = batch.iter().map(|(_, c)| c.len() + 1).max().unwrap_or(0);
            let mask: Vec<f32> = batch
                .iter()
                .flat_map(|(_, c)| {
                    let len = c.len() + 1;
                    (0..longest).map(move |j| if j < len { 0.0 } else { f32::NEG_INFINITY })
                })
                .collect();
            return Ok(StepPlan::Decode {
                cos: cos.index_select(&positions, 0)?.unsqueeze(1)?,
                sin: sin.index_select(&positions, 0)?.unsqueeze(1)?,
                mask: Tensor::from_vec(mask, (batch.len(), 1, 1, longest), device)?
                    .to_dtype(cos.dtype())?,
            });
        }
        let mut rope = Vec::with_capacity(batch.len());
        let mut masks = Vec::with_capacity(batch.len());
        for (tokens, cache) in batch {
            let (t, past) = (tokens.len(), cache.len());
            rope.push((cos.narrow(0, past, t)?, sin.narrow(0, past, t)?));
            masks.push(if t > 1 {
                Some(causal_mask(t, past, device)?.to_dtype(cos.dtype())?)
            } else {
                None
            });
        }
        Ok(StepPlan::Ragged { rope, masks })
    }
}
