//! What of a training batch carries a loss: its sampled tokens, by sequence.

use forgelog_schemas::{TrainingBatch, UNKNOWN_POLICY_VERSION};

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
