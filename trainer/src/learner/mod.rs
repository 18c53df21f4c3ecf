//! The learner: trainable weights, teacher-forced logprobs of the sampled
//! tokens, the GRPO loss, accumulation over micro-batches, AdamW. No Kafka,
//! no storage: batches in, updated weights and metrics out.

use crate::loss::LossConfig;
use crate::optim::{AdamW, AdamWConfig};
use candle_core::{DType, Device, Result, Tensor, Var};
use candle_nn::{VarBuilder, VarMap};
use forgelog_model::lora::{self, LoraConfig};
use forgelog_model::{Adapter, ModelConfig, Transformer};
use forgelog_schemas::TrainingBatch;
use std::collections::HashMap;

mod evaluate;
mod feed;
mod layerwise;
mod sequences;
mod step_metrics;

pub use evaluate::Evaluation;
pub use sequences::{sampled_at, sampled_sequences, SampledSequence};
pub use step_metrics::StepMetrics;

/// The default bound of a forward/backward pass, in fed rows (a shared prompt
/// counted once): an 850-token agent prompt and about three of its answers.
pub const MICRO_BATCH_TOKENS: usize = 1536;

#[derive(Debug, Clone, PartialEq)]
pub struct LearnerConfig {
    pub loss: LossConfig,
    pub adamw: AdamWConfig,
    /// The sampling temperature the engine used: recorded logprobs are
    /// `log_softmax(logits / T)`, so the learner's must be too.
    pub temperature: f64,
    /// Batches sampled at version `v` train the learner at `v + k` only for `k ≤` this.
    pub max_staleness: u64,
    /// Rows per forward/backward; a step sums the gradients of its micro-batches.
    pub micro_batch_tokens: usize,
    /// Feed the prompt a group's members share once for all of them (the
    /// same loss and gradients, for less work; off only to compare).
    pub share_prefixes: bool,
    /// Train a LoRA adapter on frozen weights instead of the weights.
    pub lora: Option<LoraConfig>,
    /// Keep only each layer's input in the forward and recompute the layer
    /// in the backward: one layer's activations held at a time instead of
    /// every layer's, for one more forward's work.
    pub checkpoint_activations: bool,
}

impl Default for LearnerConfig {
    fn default() -> LearnerConfig {
        LearnerConfig {
            loss: LossConfig::default(),
            adamw: AdamWConfig::default(),
            temperature: 1.0,
            max_staleness: 4,
            micro_batch_tokens: MICRO_BATCH_TOKENS,
            share_prefixes: true,
            lora: None,
            checkpoint_activations: true,
        }
    }
}

pub struct Learner {
    model: Transformer,
    /// What trains, sorted by name (deterministic order for the optimizer
    /// and checkpoints): every weight, or with LoRA only the adapter's
    /// tensors (PEFT names).
    vars: Vec<(String, Var)>,
    /// With LoRA, the frozen weights the adapter sits on.
    frozen: Option<HashMap<String, Tensor>>,
    reference: Option<Transformer>,
    pub optimizer: AdamW,
    pub config: LearnerConfig,
    /// The policy version the weights are (0: the initial weights).
    pub version: u64,
    pub step: u64,
}

impl Learner {
    /// Trainable copies of `weights` (checkpoint names) in `dtype` on
    /// `device`. With `config.lora`, the weights stay frozen and the adapter
    /// trains: the one among `weights` under PEFT names (a resumed run's), or
    /// a fresh one (PEFT's start: the base model exactly).
    pub fn new(
        weights: &HashMap<String, Tensor>,
        model_config: &ModelConfig,
        device: &Device,
        dtype: DType,
        config: LearnerConfig,
    ) -> Result<Learner> {
        let (adapter, base): (HashMap<_, _>, HashMap<_, _>) = weights
            .iter()
            .map(|(n, t)| (n.clone(), t.clone()))
            .partition(|(n, _)| lora::is_adapter_tensor(n));
        let to = |t: &Tensor| t.to_device(device)?.to_dtype(dtype);
        let trainable = match &config.lora {
            None => base.clone(),
            Some(_) if !adapter.is_empty() => adapter,
            Some(lora) => lora::init_adapter(model_config, lora, 0, device)?,
        };
        let varmap = VarMap::new();
        let mut vars = Vec::with_capacity(trainable.len());
        {
            let mut data = varmap.data().lock().expect("varmap lock");
            for (name, tensor) in &trainable {
                let var = Var::from_tensor(&to(tensor)?)?;
                data.insert(name.clone(), var.clone());
                vars.push((name.clone(), var));
            }
        }
        vars.sort_by(|a, b| a.0.cmp(&b.0));
        let trained = VarBuilder::from_varmap(&varmap, dtype, device);
        let frozen_copy = || -> Result<HashMap<String, Tensor>> {
            base.iter()
                .map(|(n, t)| Ok((n.clone(), to(t)?.detach())))
                .collect()
        };
        let (model, frozen, reference) = match &config.lora {
            None => {
                let model = Transformer::load(trained, model_config)?;
                // KL is to the initial weights: a frozen copy of them.
                let reference = match config.loss.kl_coefficient {
                    Some(_) => Some(Transformer::load(
                        VarBuilder::from_tensors(frozen_copy()?, dtype, device),
                        model_config,
                    )?),
                    None => None,
                };
                (model, None, reference)
            }
            Some(lora) => {
                let frozen = frozen_copy()?;
                let base_vb = VarBuilder::from_tensors(frozen.clone(), dtype, device);
                let adapter = Adapter {
                    lora,
                    tensors: trained,
                };
                let model =
                    Transformer::load_adapted(base_vb.clone(), model_config, Some(&adapter))?;
                // The frozen weights are the initial policy: KL's reference as they are.
                let reference = match config.loss.kl_coefficient {
                    Some(_) => Some(Transformer::load(base_vb, model_config)?),
                    None => None,
                };
                (model, Some(frozen), reference)
            }
        };
        Ok(Learner {
            model,
            vars,
            frozen,
            reference,
            optimizer: AdamW::new(config.adamw.clone()),
            config,
            version: 0,
            step: 0,
        })
    }

    pub fn model(&self) -> &Transformer {
        &self.model
    }

    pub fn vars(&self) -> &[(String, Var)] {
        &self.vars
    }

    /// What trains, by checkpoint name: the weights, or with LoRA the
    /// adapter's tensors (PEFT names).
    pub fn weights(&self) -> HashMap<String, Tensor> {
        self.vars
            .iter()
            .map(|(n, v)| (n.clone(), v.as_tensor().detach()))
            .collect()
    }

    /// The weights a model of this version has, by checkpoint name: with
    /// LoRA, the frozen ones with the adapter merged in (what an engine
    /// serving full weights loads).
    pub fn model_weights(&self) -> Result<HashMap<String, Tensor>> {
        match (&self.frozen, &self.config.lora) {
            (Some(frozen), Some(lora)) => {
                lora::merge(frozen, &self.weights(), self.model.config(), lora)
                    .map_err(|e| candle_core::Error::Msg(e.to_string()))
            }
            _ => Ok(self.weights()),
        }
    }

    /// Starts the next policy version: bumps `version` and returns the state to
    /// checkpoint with its weights (no consumer offsets: the caller adds its own).
    pub fn next_version(&mut self) -> crate::checkpoint::TrainerState {
        self.version += 1;
        crate::checkpoint::TrainerState {
            version: self.version,
            step: self.step,
            optimizer_steps: self.optimizer.steps,
            ..Default::default()
        }
    }

    /// How many versions behind the learner `batch` was sampled (0 when unknown).
    pub fn staleness(&self, batch: &TrainingBatch) -> u64 {
        sampled_at(batch).map_or(0, |v| self.version.saturating_sub(v))
    }

    /// Whether a batch this stale may train the learner.
    pub fn admits(&self, staleness: u64) -> bool {
        staleness <= self.config.max_staleness
    }

    /// One AdamW update with `grads` (from [`Learner::evaluate`]); returns the gradient norm.
    pub fn apply_gradients(&mut self, grads: &[Option<Tensor>]) -> Result<f64> {
        self.optimizer.step(&self.vars, grads)
    }

    /// One optimizer step on `batches` (each with its staleness), which the
    /// caller has already admitted.
    pub fn train_step(&mut self, batches: &[(TrainingBatch, u64)]) -> Result<StepMetrics> {
        let seqs: Vec<SampledSequence> = batches
            .iter()
            .flat_map(|(b, _)| sampled_sequences(b))
            .collect();
        let rewards: Vec<f64> = batches
            .iter()
            .flat_map(|(b, _)| b.members.iter().filter_map(|m| m.reward))
            .collect();
        let mut metrics = StepMetrics {
            groups: batches.len(),
            sequences: seqs.len(),
            reward_mean: mean(&rewards),
            staleness_mean: mean(&batches.iter().map(|(_, s)| *s as f64).collect::<Vec<_>>()),
            staleness_max: batches.iter().map(|(_, s)| *s).max().unwrap_or(0),
            ..Default::default()
        };
        self.step += 1;
        if seqs.is_empty() {
            return Ok(metrics);
        }
        let eval = self.evaluate(&seqs)?;
        metrics.grad_norm = self.apply_gradients(&eval.grads)?;
        let n = eval.ratios.len();
        metrics.tokens = n;
        metrics.loss = eval.loss;
        metrics.ratio_mean = mean(&eval.ratios);
        metrics.ratio_min = eval.ratios.iter().copied().fold(f64::INFINITY, f64::min);
        metrics.ratio_max = eval
            .ratios
            .iter()
            .copied()
            .fold(f64::NEG_INFINITY, f64::max);
        metrics.ratio_max_deviation = eval
            .ratios
            .iter()
            .map(|r| (r - 1.0).abs())
            .fold(0.0, f64::max);
        metrics.truncated_fraction = eval.truncated as f64 / n as f64;
        metrics.entropy = eval.entropy_sum / n as f64;
        Ok(metrics)
    }
}

fn mean(xs: &[f64]) -> f64 {
    if xs.is_empty() {
        0.0
    } else {
        xs.iter().sum::<f64>() / xs.len() as f64
    }
}

pub use crate::assembler::StepAssembler;

mod micro_batch;
pub use micro_batch::{micro_batches, MicroBatch, SharedRun, MIN_SHARED_TOKENS};

#[cfg(test)]
mod tests;
