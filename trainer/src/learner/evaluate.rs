//! The loss of a step and its gradients: teacher-forced logprobs of the
//! sampled tokens, micro-batch by micro-batch.

use super::feed::Feed;
use super::layerwise::LayerInputs;
use super::{micro_batches, Learner, MicroBatch, SampledSequence};
use crate::loss::{grpo_loss, token_stats, Normalisation, TokenInputs};
use candle_core::backprop::GradStore;
use candle_core::{DType, Result, Tensor, D};
use forgelog_model::Transformer;

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

impl Learner {
    /// Teacher-forced `log_softmax(logits / T)` at each sequence's sampled
    /// tokens, concatenated in the micro-batch's order, and the entropies
    /// there (no gradient), each shared prefix fed once ([`Feed`]).
    fn sampled_logprobs(
        &self,
        model: &Transformer,
        micro: &MicroBatch,
    ) -> Result<(Tensor, Tensor)> {
        let feed = Feed::of(micro);
        self.at_targets(feed.forward(model)?, &feed.targets)
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
        let logits = inputs.top_logits(&self.model)?;
        let (logp, entropy) = self.at_targets(logits, &inputs.feed.targets)?;
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
