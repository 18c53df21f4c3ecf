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

use crate::lora::LoraConfig;
use crate::{KvCache, ModelConfig};
use attention::{Attention, StepPlan};
use candle_core::{DType, Device, Result, Tensor, D};
use candle_nn::VarBuilder;
use projection::Mlp;

mod attention;
mod projection;

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
        let ids: Vec<u32> = self.fed(batch)?.concat();
        let mut x = self.embed(&ids)?;
        let plan = StepPlan::new(batch, &self.cos, &self.sin)?;
        for layer in 0..self.layers.len() {
            x = self.block(layer, &x, batch, &plan)?;
        }
        let mut lens = Vec::with_capacity(batch.len());
        for (tokens, cache) in batch.iter_mut() {
            cache.advance(tokens.len());
            lens.push(tokens.len());
        }
        self.logits(&x, &lens, logits)
    }

    /// Each sequence's new tokens, once each is known to fit the context
    /// after what its cache holds.
    fn fed<'a>(&self, batch: &[(&'a [u32], &mut KvCache)]) -> Result<Vec<&'a [u32]>> {
        let context = self.config.max_position_embeddings;
        let mut fed = Vec::with_capacity(batch.len());
        for (tokens, cache) in batch {
            if tokens.is_empty() || cache.len() + tokens.len() > context {
                candle_core::bail!(
                    "{} new tokens after {} cached do not fit the context of {context}",
                    tokens.len(),
                    cache.len()
                );
            }
            fed.push(*tokens);
        }
        Ok(fed)
    }

    /// The embeddings of `ids`, `(ids.len(), hidden)`: the first layer's input.
    pub fn embed(&self, ids: &[u32]) -> Result<Tensor> {
        let ids = Tensor::new(ids, self.device())?;
        self.embed_tokens.index_select(&ids, 0)
    }

    pub fn num_layers(&self) -> usize {
        self.layers.len()
    }

    /// Layer `layer` alone on a ragged batch's rows `x` (a forward one layer
    /// at a time: a training step that recomputes each layer in its backward
    /// pass). Each cache gets the layer's keys and values after what it
    /// holds; [`KvCache::advance`] moves it on once every layer has run.
    pub fn layer(
        &self,
        layer: usize,
        x: &Tensor,
        batch: &mut [(&[u32], &mut KvCache)],
    ) -> Result<Tensor> {
        self.fed(batch)?;
        if layer >= self.layers.len() {
            candle_core::bail!("layer {layer} of a model of {}", self.layers.len());
        }
        let plan = StepPlan::new(batch, &self.cos, &self.sin)?;
        self.block(layer, x, batch, &plan)
    }

    /// A pre-norm block: attention, then the MLP, each added to its input.
    fn block(
        &self,
        layer: usize,
        x: &Tensor,
        batch: &mut [(&[u32], &mut KvCache)],
        plan: &StepPlan,
    ) -> Result<Tensor> {
        let (block, eps) = (&self.layers[layer], self.config.rms_norm_eps);
        let h = rms_norm(x, &block.input_layernorm, eps)?;
        let x = (x + block.self_attn.forward(&h, layer, batch, plan)?)?;
        let h = rms_norm(&x, &block.post_attention_layernorm, eps)?;
        &x + block.mlp.forward(&h)?
    }

    /// The logits `logits` asks for from the last layer's rows `x` of a
    /// ragged batch whose sequences fed `lens` tokens each.
    pub fn logits(&self, x: &Tensor, lens: &[usize], logits: Logits) -> Result<Vec<Tensor>> {
        // One output matmul for the whole batch: the output matrix is the
        // largest, and reading it once per sequence would dominate a step.
        let mut counts = Vec::with_capacity(lens.len());
        let mut rows = Vec::new();
        let mut first = 0u32;
        for (i, &len) in lens.iter().enumerate() {
            let wanted = match logits {
                Logits::All => (0..len as u32).collect(),
                Logits::Last => vec![len as u32 - 1],
                Logits::Rows(asked) => asked.get(i).cloned().unwrap_or_default(),
            };
            if let Some(&bad) = wanted.iter().find(|&&r| r as usize >= len) {
                candle_core::bail!("row {bad} asked of a sequence of {len} new tokens");
            }
            counts.push(wanted.len());
            rows.extend(wanted.iter().map(|r| first + r));
            first += len as u32;
        }
        let vocab = self.config.vocab_size;
        if rows.is_empty() {
            let none = Tensor::zeros((0, vocab), x.dtype(), x.device())?;
            return Ok(counts.iter().map(|_| none.clone()).collect());
        }
        let x = match logits {
            Logits::All => x.clone(),
            _ => x.index_select(&Tensor::new(rows.as_slice(), x.device())?, 0)?,
        };
        // A frozen (LoRA) output matrix gets no gradient of its own.
        let eps = self.config.rms_norm_eps;
        let all = crate::frozen::matmul_t(&rms_norm(&x, &self.norm, eps)?, &self.lm_head)?;
        let mut outputs = Vec::with_capacity(lens.len());
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
