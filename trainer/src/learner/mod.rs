//! The learner: trainable weights, teacher-forced logprobs of the sampled
//! tokens, the GRPO loss, accumulation over micro-batches, AdamW. No Kafka,
//! no storage: batches in, updated weights and metrics out.

use crate::loss::{grpo_loss, token_stats, LossConfig, Normalisation, TokenInputs};
use crate::optim::{AdamW, AdamWConfig};
use candle_core::{DType, Device, Result, Tensor, Var, D};
use candle_nn::{VarBuilder, VarMap};
use forgelog_model::lora::{self, LoraConfig};
use forgelog_model::{Adapter, KvCache, Logits, ModelConfig, Transformer};
use forgelog_schemas::{TrainingBatch, UNKNOWN_POLICY_VERSION};
use std::collections::{BTreeMap, HashMap};

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
}

impl Default for LearnerConfig {
    fn default() -> LearnerConfig {
        LearnerConfig {
            loss: LossConfig::default(),
            adamw: AdamWConfig::default(),
            temperature: 1.0,
            max_staleness: 4,
            micro_batch_tokens: 1024,
            share_prefixes: true,
            lora: None,
        }
    }
}

/// The trainable part of one sequence: its tokens, and for each sampled
/// token (mask 1, not the first position) its index, recorded logprob and
/// the member's advantage.
#[derive(Debug, Clone, PartialEq)]
pub struct SampledSequence {
    pub tokens: Vec<u32>,
    pub positions: Vec<usize>,
    pub recorded: Vec<f32>,
    pub advantage: f64,
}

/// The sequences of `batch` that carry a loss: members whose verifier ran
/// (`reward` and `advantage` present) in groups whose rewards differ.
pub fn sampled_sequences(batch: &TrainingBatch) -> Vec<SampledSequence> {
    if batch.no_reward_variance {
        return Vec::new();
    }
    let mut out = Vec::new();
    for member in &batch.members {
        let (Some(_), Some(advantage)) = (member.reward, member.advantage) else {
            continue;
        };
        for s in &member.sequences {
            let n = s.token_ids.len();
            if s.loss_mask.len() != n || s.sampling_logprobs.len() != n {
                // Malformed: trained on by nobody, crashing nothing.
                tracing::warn!(
                    group = batch.group_id,
                    "sequence arrays disagree in length; skipped"
                );
                continue;
            }
            // The first token has no prefix to predict it from.
            let positions: Vec<usize> = (1..s.token_ids.len())
                .filter(|&j| s.loss_mask.get(j) == Some(&1))
                .collect();
            if positions.is_empty() {
                continue;
            }
            out.push(SampledSequence {
                recorded: positions.iter().map(|&j| s.sampling_logprobs[j]).collect(),
                tokens: s.token_ids[..=*positions.last().expect("non-empty")].to_vec(),
                positions,
                advantage,
            });
        }
    }
    out
}

/// The policy version `batch` was sampled at: the oldest version of any of
/// its sampled tokens (`None` when the engine reported none).
pub fn sampled_at(batch: &TrainingBatch) -> Option<u64> {
    batch
        .members
        .iter()
        .flat_map(|m| &m.sequences)
        .flat_map(|s| s.policy_versions.iter().zip(&s.loss_mask))
        .filter(|&(&v, &mask)| mask == 1 && v != UNKNOWN_POLICY_VERSION)
        .map(|(&v, _)| v as u64)
        .min()
}

/// What one optimizer step did.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct StepMetrics {
    pub loss: f64,
    pub ratio_mean: f64,
    pub ratio_min: f64,
    pub ratio_max: f64,
    /// Largest `|ρ − 1|`: 0 up to numerics when on policy.
    pub ratio_max_deviation: f64,
    pub clip_fraction: f64,
    /// Mean entropy (nats) of the learner's distribution at the sampled positions.
    pub entropy: f64,
    pub reward_mean: f64,
    pub tokens: usize,
    pub sequences: usize,
    pub groups: usize,
    pub staleness_mean: f64,
    pub staleness_max: u64,
    pub grad_norm: f64,
}

impl StepMetrics {
    /// As `PolicyPublished.metrics`. A step that trained no token (its
    /// groups all scored alike) has no importance ratios, clipping or entropy:
    /// those keys are left out, never reported as 0.
    pub fn to_map(&self) -> BTreeMap<String, f64> {
        let mut map = BTreeMap::from([
            ("loss".into(), self.loss),
            ("reward_mean".into(), self.reward_mean),
            ("tokens".into(), self.tokens as f64),
            ("sequences".into(), self.sequences as f64),
            ("groups".into(), self.groups as f64),
            ("staleness_mean".into(), self.staleness_mean),
            ("staleness_max".into(), self.staleness_max as f64),
            ("grad_norm".into(), self.grad_norm),
        ]);
        if self.tokens > 0 {
            map.extend([
                ("is_ratio_mean".into(), self.ratio_mean),
                ("is_ratio_min".into(), self.ratio_min),
                ("is_ratio_max".into(), self.ratio_max),
                ("clip_fraction".into(), self.clip_fraction),
                ("entropy".into(), self.entropy),
            ]);
        }
        map
    }
}

/// The loss of some sequences, its gradients, and per-token diagnostics.
pub struct Evaluation {
    pub loss: f64,
    /// Aligned with [`Learner::vars`].
    pub grads: Vec<Option<Tensor>>,
    pub ratios: Vec<f64>,
    pub clipped: usize,
    pub entropy_sum: f64,
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

    /// Teacher-forced `log_softmax(logits / T)` at each sequence's sampled
    /// tokens, concatenated in the micro-batch's order, and the entropies
    /// there (no gradient). Each run's shared prefix is fed once; its members
    /// go on from forks of its cache, so the graph flows back through it.
    fn sampled_logprobs(
        &self,
        model: &Transformer,
        micro: &MicroBatch,
    ) -> Result<(Tensor, Tensor)> {
        let mut prefix_caches: Vec<KvCache> = micro.runs.iter().map(|_| KvCache::new()).collect();
        let mut prefixes: Vec<(&[u32], &mut KvCache)> = micro
            .runs
            .iter()
            .zip(prefix_caches.iter_mut())
            .filter(|(run, _)| run.prefix > 0)
            .map(|(run, cache)| (&run.members[0].tokens[..run.prefix], cache))
            .collect();
        if !prefixes.is_empty() {
            model.forward_batch(&mut prefixes, Logits::Rows(&[]))?;
        }
        let mut caches = Vec::new();
        let mut fed = Vec::new();
        let mut rows = Vec::new();
        let mut targets = Vec::new();
        for (run, prefix) in micro.runs.iter().zip(&prefix_caches) {
            for s in &run.members {
                caches.push(prefix.fork()?);
                // Logits at row i predict token i + 1: feed up to the last
                // sampled token's predecessor, after the prefix.
                fed.push(&s.tokens[run.prefix..s.tokens.len() - 1]);
                rows.push(
                    s.positions
                        .iter()
                        .map(|&j| (j - 1 - run.prefix) as u32)
                        .collect::<Vec<_>>(),
                );
                targets.extend(s.positions.iter().map(|&j| s.tokens[j]));
            }
        }
        let mut batch: Vec<(&[u32], &mut KvCache)> =
            fed.into_iter().zip(caches.iter_mut()).collect();
        let logits = model.forward_batch(&mut batch, Logits::Rows(&rows))?;
        let logits = (Tensor::cat(&logits, 0)? / self.config.temperature)?;
        let logprobs = candle_nn::ops::log_softmax(&logits, D::Minus1)?;
        let targets = Tensor::new(targets.as_slice(), model.device())?.unsqueeze(1)?;
        let sampled = logprobs.gather(&targets, 1)?.squeeze(1)?;
        let detached = logprobs.detach();
        let entropy = (detached.exp()? * &detached)?.sum(1)?.neg()?;
        Ok((sampled, entropy))
    }

    /// The step's loss over `seqs`, its gradients summed over micro-batches,
    /// and diagnostics. Weights are not changed.
    pub fn evaluate(&self, seqs: &[SampledSequence]) -> Result<Evaluation> {
        let device = self.model.device();
        let dtype = self.vars.first().map_or(DType::F32, |(_, v)| v.dtype());
        let total_tokens: usize = seqs.iter().map(|s| s.positions.len()).sum();
        let weight_of = |s: &SampledSequence| match self.config.loss.normalisation {
            Normalisation::PerToken => 1.0 / total_tokens as f64,
            Normalisation::PerSequence => 1.0 / (s.positions.len() * seqs.len()) as f64,
        };
        let mut eval = Evaluation {
            loss: 0.0,
            grads: vec![None; self.vars.len()],
            ratios: Vec::with_capacity(total_tokens),
            clipped: 0,
            entropy_sum: 0.0,
        };
        let micro_batches = micro_batches(
            seqs,
            self.config.micro_batch_tokens,
            self.config.share_prefixes,
        );
        for micro in &micro_batches {
            let (logp, entropy) = self.sampled_logprobs(&self.model, micro)?;
            let mut recorded = Vec::new();
            let mut advantages = Vec::new();
            let mut weights = Vec::new();
            for s in micro.sequences() {
                recorded.extend(s.recorded.iter().map(|&r| r as f64));
                advantages.extend(std::iter::repeat_n(s.advantage, s.positions.len()));
                weights.extend(std::iter::repeat_n(weight_of(s), s.positions.len()));
            }
            let tensor = |v: &[f64]| Tensor::new(v, device)?.to_dtype(dtype);
            let reference = match &self.reference {
                Some(reference) => Some(self.sampled_logprobs(reference, micro)?.0.detach()),
                None => None,
            };
            let (recorded_t, advantages_t, weights_t) =
                (tensor(&recorded)?, tensor(&advantages)?, tensor(&weights)?);
            let loss = grpo_loss(
                &TokenInputs {
                    logp: &logp,
                    recorded: &recorded_t,
                    advantages: &advantages_t,
                    weights: &weights_t,
                    reference: reference.as_ref(),
                },
                &self.config.loss,
            )?;
            let grads = loss.backward()?;
            for ((_, var), sum) in self.vars.iter().zip(eval.grads.iter_mut()) {
                if let Some(g) = grads.get(var.as_tensor()) {
                    *sum = Some(match sum.take() {
                        Some(s) => (s + g)?,
                        None => g.clone(),
                    });
                }
            }
            eval.loss += loss.to_dtype(DType::F64)?.to_scalar::<f64>()?;
            let logp = logp.to_dtype(DType::F64)?.to_vec1::<f64>()?;
            for ((lp, rec), adv) in logp.iter().zip(&recorded).zip(&advantages) {
                let stats = token_stats(*lp, *rec, *adv, &self.config.loss);
                eval.ratios.push(stats.ratio);
                eval.clipped += stats.clipped as usize;
            }
            eval.entropy_sum += entropy
                .to_dtype(DType::F64)?
                .sum_all()?
                .to_scalar::<f64>()?;
        }
        Ok(eval)
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
        metrics.clip_fraction = eval.clipped as f64 / n as f64;
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
