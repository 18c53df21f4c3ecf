//! The loss of a step and its gradients: teacher-forced logprobs of the
//! sampled tokens, micro-batch by micro-batch.

use super::layerwise::LayerInputs;
use super::{micro_batches, Learner, MicroBatch, SampledSequence};
use crate::loss::{grpo_loss, token_stats, Normalisation, TokenInputs};
use candle_core::backprop::GradStore;
use candle_core::{DType, Result, Tensor, D};
use forgelog_model::{KvCache, Logits, Transformer};

/// The loss of some sequences, its gradients, and per-token diagnostics.
pub struct Evaluation {
    pub loss: f64,
    /// Aligned with [`Learner::vars`].
    pub grads: Vec<Option<Tensor>>,
    pub ratios: Vec<f64>,
    /// Tokens whose importance weight was truncated.
    pub truncated: usize,
    pub entropy_sum: f64,
}

/// The rows of each member's logits that predict its sampled tokens (after
/// its run's prefix), and those tokens, in the micro-batch's order.
fn sampled_rows(micro: &MicroBatch) -> (Vec<Vec<u32>>, Vec<u32>) {
    let mut rows = Vec::new();
    let mut targets = Vec::new();
    for run in &micro.runs {
        for s in &run.members {
            rows.push(
                s.positions
                    .iter()
                    .map(|&j| (j - 1 - run.prefix) as u32)
                    .collect::<Vec<_>>(),
            );
            targets.extend(s.positions.iter().map(|&j| s.tokens[j]));
        }
    }
    (rows, targets)
}

impl Learner {
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
        for (run, prefix) in micro.runs.iter().zip(&prefix_caches) {
            for s in &run.members {
                caches.push(prefix.fork()?);
                // Logits at row i predict token i + 1: feed up to the last
                // sampled token's predecessor, after the prefix.
                fed.push(&s.tokens[run.prefix..s.tokens.len() - 1]);
            }
        }
        let mut batch: Vec<(&[u32], &mut KvCache)> =
            fed.into_iter().zip(caches.iter_mut()).collect();
        let (rows, targets) = sampled_rows(micro);
        let logits = model.forward_batch(&mut batch, Logits::Rows(&rows))?;
        self.at_targets(logits, &targets)
    }

    /// `log_softmax(logits / T)` at `targets`, and the entropies (no gradient).
    fn at_targets(&self, logits: Vec<Tensor>, targets: &[u32]) -> Result<(Tensor, Tensor)> {
        let logits = (Tensor::cat(&logits, 0)? / self.config.temperature)?;
        let logprobs = candle_nn::ops::log_softmax(&logits, D::Minus1)?;
        let targets = Tensor::new(targets, logits.device())?.unsqueeze(1)?;
        let sampled = logprobs.gather(&targets, 1)?.squeeze(1)?;
        let detached = logprobs.detach();
        let entropy = (detached.exp()? * &detached)?.sum(1)?.neg()?;
        Ok((sampled, entropy))
    }

    /// [`Learner::sampled_logprobs`] by the trained model, with its forward
    /// kept layer by layer when activations are checkpointed.
    fn trained_logprobs<'a>(
        &self,
        micro: &MicroBatch<'a>,
    ) -> Result<(Tensor, Tensor, Option<LayerInputs<'a>>)> {
        if !self.config.checkpoint_activations {
            let (logp, entropy) = self.sampled_logprobs(&self.model, micro)?;
            return Ok((logp, entropy, None));
        }
        let inputs = LayerInputs::forward(&self.model, micro)?;
        let (rows, targets) = sampled_rows(micro);
        let logits = inputs.top_logits(&self.model, &rows)?;
        let (logp, entropy) = self.at_targets(logits, &targets)?;
        Ok((logp, entropy, Some(inputs)))
    }

    /// Adds the gradients in `grads` of what trains to `sums`.
    fn accumulate(&self, grads: &GradStore, sums: &mut [Option<Tensor>]) -> Result<()> {
        for ((_, var), sum) in self.vars.iter().zip(sums.iter_mut()) {
            if let Some(g) = grads.get(var.as_tensor()) {
                *sum = Some(match sum.take() {
                    Some(s) => (s + g)?,
                    None => g.clone(),
                });
            }
        }
        Ok(())
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
            truncated: 0,
            entropy_sum: 0.0,
        };
        let micro_batches = micro_batches(
            seqs,
            self.config.micro_batch_tokens,
            self.config.share_prefixes,
        );
        for micro in &micro_batches {
            let (logp, entropy, layers) = self.trained_logprobs(micro)?;
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
            match layers {
                Some(inputs) => {
                    inputs.backward(&self.model, grads, |g| self.accumulate(g, &mut eval.grads))?
                }
                None => self.accumulate(&grads, &mut eval.grads)?,
            }
            eval.loss += loss.to_dtype(DType::F64)?.to_scalar::<f64>()?;
            let logp = logp.to_dtype(DType::F64)?.to_vec1::<f64>()?;
            for (lp, rec) in logp.iter().zip(&recorded) {
                let stats = token_stats(*lp, *rec, &self.config.loss);
                eval.ratios.push(stats.ratio);
                eval.truncated += stats.truncated as usize;
            }
            eval.entropy_sum += entropy
                .to_dtype(DType::F64)?
                .sum_all()?
                .to_scalar::<f64>()?;
        }
        Ok(eval)
    }
}
