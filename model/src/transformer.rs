//! The decoder of the llama family (SmolLM2, Llama 2/3; Qwen2, which adds
//! q/k/v biases; Qwen3, which normalises q and k per head: [`crate::qwen3`]),
//! written to return logits at every position of a ragged batch: each
//! sequence brings its own new tokens and its own [`KvCache`]. Projections and
//! the MLP run on all rows of the batch at once; attention runs per sequence.
//!
//! The trainer takes gradients through the same code the engine samples with:
//! where candle has a fused kernel without a backward pass (softmax, RMS norm),
//! it is used only when no gradient is being tracked.
//!
//! Tensor names (Hugging Face layout; a checkpoint uses exactly these):
//! `model.embed_tokens.weight`,
//! `model.layers.{i}.input_layernorm.weight`,
//! `model.layers.{i}.self_attn.{q,k,v,o}_proj.weight` (+ `{q,k,v}_proj.bias` for Qwen2,
//! `{q,k}_norm.weight` for Qwen3),
//! `model.layers.{i}.post_attention_layernorm.weight`,
//! `model.layers.{i}.mlp.{gate,up,down}_proj.weight`,
//! `model.norm.weight`, and `lm_head.weight` unless `tie_word_embeddings`.

use crate::lora::{LoraConfig, LowRank};
use crate::qwen3::QkNorm;
use crate::{KvCache, ModelConfig};
use candle_core::{DType, Device, Module, Result, Tensor, D};
use candle_nn::{Linear, VarBuilder};

/// Which positions' logits a forward returns for each sequence.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Logits<'a> {
    /// Every new position (teacher forcing).
    All,
    /// Only the last new position (sampling: saves the `(tokens, vocab)` matrix of a long prefill).
    Last,
    /// These rows of each sequence's new tokens, in this order (training: the
    /// rows that predict sampled tokens; the output matrix, the largest, is
    /// then multiplied only where a loss is taken). An empty list: none.
    Rows(&'a [Vec<u32>]),
}

/// A LoRA adapter kept beside the weights, unmerged (what the learner
/// trains): its config and its tensors by PEFT name ([`crate::lora`]).
pub struct Adapter<'a> {
    pub lora: &'a LoraConfig,
    pub tensors: VarBuilder<'a>,
}

/// A linear projection, with its LoRA update where one adapts it.
#[derive(Clone)]
struct Projection {
    linear: Linear,
    low_rank: Option<LowRank>,
}

impl Module for Projection {
    fn forward(&self, x: &Tensor) -> Result<Tensor> {
        let y = match (&self.low_rank, self.linear.bias()) {
            // A frozen weight under an adapter: no gradient made for it.
            (Some(_), bias) => {
                let y = crate::frozen::matmul_t(x, self.linear.weight())?;
                match bias {
                    Some(b) => y.broadcast_add(b)?,
                    None => y,
                }
            }
            (None, _) => self.linear.forward(x)?,
        };
        match &self.low_rank {
            Some(update) => y + update.forward(x)?,
            None => Ok(y),
        }
    }
}

#[derive(Clone)]
struct Attention {
    q_proj: Projection,
    k_proj: Projection,
    v_proj: Projection,
    o_proj: Projection,
    qk_norm: Option<QkNorm>,
    heads: usize,
    kv_heads: usize,
    head_dim: usize,
}

#[derive(Clone)]
struct Mlp {
    gate_proj: Projection,
    up_proj: Projection,
    down_proj: Projection,
}

#[derive(Clone)]
struct Block {
    input_layernorm: Tensor,
    self_attn: Attention,
    post_attention_layernorm: Tensor,
    mlp: Mlp,
}

/// Cheap to clone: tensors are shared.
#[derive(Clone)]
pub struct Transformer {
    config: ModelConfig,
    embed_tokens: Tensor,
    layers: Vec<Block>,
    norm: Tensor,
    lm_head: Tensor,
    /// RoPE tables, `(max_position, head_dim / 2)`.
    cos: Tensor,
    sin: Tensor,
}

/// The projection `name` under `vb`, `d_in → d_out`, with its LoRA update
/// when `adapter` adapts it.
fn projection(
    vb: &VarBuilder,
    name: &str,
    (d_in, d_out): (usize, usize),
    bias: bool,
    adapter: Option<&Adapter>,
) -> Result<Projection> {
    let vb = vb.pp(name);
    let weight = vb.get((d_out, d_in), "weight")?;
    let bias = if bias {
        Some(vb.get(d_out, "bias")?)
    } else {
        None
    };
    let low_rank = match adapter {
        Some(adapter) => LowRank::load(adapter, &vb.prefix(), d_in, d_out)?,
        None => None,
    };
    Ok(Projection {
        linear: Linear::new(weight, bias),
        low_rank,
    })
}

// Serving uses candle's fused kernels; when a gradient is being tracked
// (training), the same math as ordinary differentiable ops.

/// `x / rms(x) * weight`, over the last dimension.
pub(crate) fn rms_norm(x: &Tensor, weight: &Tensor, eps: f64) -> Result<Tensor> {
    if !x.track_op() && !weight.track_op() {
        return candle_nn::ops::rms_norm(&x.contiguous()?, weight, eps as f32);
    }
    let mean_square = x.sqr()?.mean_keepdim(D::Minus1)?;
    x.broadcast_div(&(mean_square + eps)?.sqrt()?)?
        .broadcast_mul(weight)
}

/// Softmax over the last dimension.
fn softmax(x: &Tensor) -> Result<Tensor> {
    if x.track_op() {
        candle_nn::ops::softmax(x, D::Minus1)
    } else {
        candle_nn::ops::softmax_last_dim(x)
    }
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
    fn load(vb: &VarBuilder, c: &ModelConfig, adapter: Option<&Adapter>) -> Result<Attention> {
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
    fn forward(
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
enum StepPlan {
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
    fn new(batch: &[(&[u32], &mut KvCache)], cos: &Tensor, sin: &Tensor) -> Result<StepPlan> {
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

impl Mlp {
    fn load(vb: &VarBuilder, c: &ModelConfig, adapter: Option<&Adapter>) -> Result<Mlp> {
        let (hidden, ffn) = (c.hidden_size, c.intermediate_size);
        Ok(Mlp {
            gate_proj: projection(vb, "gate_proj", (hidden, ffn), false, adapter)?,
            up_proj: projection(vb, "up_proj", (hidden, ffn), false, adapter)?,
            down_proj: projection(vb, "down_proj", (ffn, hidden), false, adapter)?,
        })
    }

    /// SwiGLU: `down(silu(gate(x)) * up(x))`.
    fn forward(&self, x: &Tensor) -> Result<Tensor> {
        let gate = candle_nn::ops::silu(&self.gate_proj.forward(x)?)?;
        self.down_proj.forward(&(gate * self.up_proj.forward(x)?)?)
    }
}

impl Transformer {
    /// Builds the model from weights named as in the module docs. With
    /// `VarBuilder::from_varmap` the weights are trainable variables.
    pub fn load(vb: VarBuilder, config: &ModelConfig) -> Result<Transformer> {
        Transformer::load_adapted(vb, config, None)
    }

    /// The model of f32 `weights` by checkpoint name, on `device` (serving).
    pub fn from_weights(
        weights: &std::collections::HashMap<String, Tensor>,
        config: &ModelConfig,
        device: &Device,
    ) -> Result<Transformer> {
        Transformer::load(
            VarBuilder::from_tensors(weights.clone(), DType::F32, device),
            config,
        )
    }

    /// [`Transformer::load`] with a LoRA adapter applied unmerged: the base
    /// weights from `vb`, each adapted projection adding `(α/r) B A x`.
    pub fn load_adapted(
        vb: VarBuilder,
        config: &ModelConfig,
        adapter: Option<&Adapter>,
    ) -> Result<Transformer> {
        let c = config;
        let model = vb.pp("model");
        let embed_tokens = model.get((c.vocab_size, c.hidden_size), "embed_tokens.weight")?;
        let layers = (0..c.num_hidden_layers)
            .map(|i| {
                let vb = model.pp(format!("layers.{i}"));
                Ok(Block {
                    input_layernorm: vb.get(c.hidden_size, "input_layernorm.weight")?,
                    self_attn: Attention::load(&vb.pp("self_attn"), c, adapter)?,
                    post_attention_layernorm: vb
                        .get(c.hidden_size, "post_attention_layernorm.weight")?,
                    mlp: Mlp::load(&vb.pp("mlp"), c, adapter)?,
                })
            })
            .collect::<Result<Vec<_>>>()?;
        let norm = model.get(c.hidden_size, "norm.weight")?;
        let lm_head = if c.tie_word_embeddings {
            embed_tokens.clone()
        } else {
            vb.get((c.vocab_size, c.hidden_size), "lm_head.weight")?
        };
        // Tables and masks in the weights' dtype (bf16 training on CUDA).
        let (cos, sin) = rope_tables(c, vb.device())?;
        let (cos, sin) = (cos.to_dtype(vb.dtype())?, sin.to_dtype(vb.dtype())?);
        Ok(Transformer {
            config: c.clone(),
            embed_tokens,
            layers,
            norm,
            lm_head,
            cos,
            sin,
        })
    }

    pub fn config(&self) -> &ModelConfig {
        &self.config
    }

    pub fn device(&self) -> &Device {
        self.embed_tokens.device()
    }

    /// Logits `(tokens.len(), vocab)` for every position of `tokens`, which
    /// follow what `cache` holds; `cache` then holds them too.
    pub fn forward(&self, tokens: &[u32], cache: &mut KvCache) -> Result<Tensor> {
        let mut batch = [(tokens, cache)];
        Ok(self.forward_batch(&mut batch, Logits::All)?.remove(0))
    }

    /// One step for a ragged batch: each sequence's new tokens (a whole prompt
    /// or one sampled token) after what its own cache holds. Returns, per
    /// sequence, logits `(positions, vocab)` as `logits` asks.
    pub fn forward_batch(
        &self,
        batch: &mut [(&[u32], &mut KvCache)],
        logits: Logits,
    ) -> Result<Vec<Tensor>> {
        let eps = self.config.rms_norm_eps;
        let context = self.config.max_position_embeddings;
        let mut ids = Vec::new();
        for (tokens, cache) in batch.iter() {
            if tokens.is_empty() || cache.len() + tokens.len() > context {
                candle_core::bail!(
                    "{} new tokens after {} cached do not fit the context of {context}",
                    tokens.len(),
                    cache.len()
                );
            }
            ids.extend_from_slice(tokens);
        }
        let ids = Tensor::new(ids.as_slice(), self.device())?;
        let mut x = self.embed_tokens.index_select(&ids, 0)?;
        let plan = StepPlan::new(batch, &self.cos, &self.sin)?;
        for (i, block) in self.layers.iter().enumerate() {
            let h = rms_norm(&x, &block.input_layernorm, eps)?;
            x = (x + block.self_attn.forward(&h, i, batch, &plan)?)?;
            let h = rms_norm(&x, &block.post_attention_layernorm, eps)?;
            x = (&x + block.mlp.forward(&h)?)?;
        }
        // One output matmul for the whole batch: the output matrix is the
        // largest, and reading it once per sequence would dominate a step.
        let mut counts = Vec::with_capacity(batch.len());
        let mut rows = Vec::new();
        let mut first = 0u32;
        for (i, (tokens, cache)) in batch.iter_mut().enumerate() {
            cache.advance(tokens.len());
            let wanted = match logits {
                Logits::All => (0..tokens.len() as u32).collect(),
                Logits::Last => vec![tokens.len() as u32 - 1],
                Logits::Rows(asked) => asked.get(i).cloned().unwrap_or_default(),
            };
            if let Some(&bad) = wanted.iter().find(|&&r| r as usize >= tokens.len()) {
                candle_core::bail!(
                    "row {bad} asked of a sequence of {} new tokens",
                    tokens.len()
                );
            }
            counts.push(wanted.len());
            rows.extend(wanted.iter().map(|r| first + r));
            first += tokens.len() as u32;
        }
        let vocab = self.config.vocab_size;
        if rows.is_empty() {
            let none = Tensor::zeros((0, vocab), x.dtype(), x.device())?;
            return Ok(counts.iter().map(|_| none.clone()).collect());
        }
        let x = match logits {
            Logits::All => x,
            _ => x.index_select(&Tensor::new(rows.as_slice(), x.device())?, 0)?,
        };
        // A frozen (LoRA) output matrix gets no gradient of its own.
        let all = crate::frozen::matmul_t(&rms_norm(&x, &self.norm, eps)?, &self.lm_head)?;
        let mut outputs = Vec::with_capacity(batch.len());
        let mut row = 0;
        for count in counts {
            outputs.push(all.narrow(0, row, count)?);
            row += count;
        }
        Ok(outputs)
    }
}

fn rope_tables(c: &ModelConfig, device: &Device) -> Result<(Tensor, Tensor)> {
    let half = c.head_dim() / 2;
    let inv_freq: Vec<f32> = (0..half)
        .map(|i| 1.0 / c.rope_theta.powf(2.0 * i as f64 / c.head_dim() as f64) as f32)
        .collect();
    let inv_freq = Tensor::from_vec(inv_freq, (1, half), device)?;
    let positions = Tensor::arange(0u32, c.max_position_embeddings as u32, device)?
        .to_dtype(DType::F32)?
        .reshape((c.max_position_embeddings, 1))?;
    let angles = positions.broadcast_mul(&inv_freq)?;
    Ok((angles.cos()?, angles.sin()?))
}
