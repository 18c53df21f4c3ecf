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
/// (`reward` and `advantage` present) in groups whose rewards differ; in
/// each, the tokens the model sampled (mask 1) with a choice. A token
/// recorded at logprob 0 had none: a grammar (vLLM's `structured_outputs`)
/// allowed it alone, or the model was certain of it (its gradient is nil
/// then anyway). Trained on, a forced token moves the policy by which
/// rollouts happened to be longer, not by what they chose: through vLLM
/// under a grammar, a step lowered the forced tokens of the rollouts that
/// solved the task (by 0.09 on average) while it raised their choices.
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
                .filter(|&j| s.loss_mask[j] == 1 && s.sampling_logprobs[j] < 0.0)
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

#[cfg(test)]
mod tests {
    use super::*;
    use forgelog_schemas::{GroupMember, Sequence};

    fn batch(mask: Vec<u8>, logprobs: Vec<f32>) -> TrainingBatch {
        let n = mask.len();
        TrainingBatch {
            run_id: "r".into(),
            event_id: "e".into(),
            group_id: "g".into(),
            task_id: "t".into(),
            no_reward_variance: false,
            members: vec![GroupMember {
                rollout_id: "r-0".into(),
                harness: "h".into(),
                reward: Some(1.0),
                advantage: Some(0.5),
                sequences: vec![Sequence {
                    root: 0,
                    call_indices: vec![0],
                    discarded: false,
                    token_ids: (0..n as u32).collect(),
                    loss_mask: mask,
                    sampling_logprobs: logprobs,
                    policy_versions: vec![0; n],
                    tool_calls: 0,
                }],
            }],
        }
    }

    #[test]
    fn the_loss_reads_the_sampled_tokens_the_model_had_a_choice_over() {
        // The prompt (mask 0), a chosen token, a forced one (logprob 0), a
        // tool's output (mask 0), a chosen one, a NaN the engine sent.
        let b = batch(
            vec![0, 0, 1, 1, 0, 1, 1],
            vec![0.0, 0.0, -0.7, 0.0, 0.0, -1.2, f32::NAN],
        );
        let seqs = sampled_sequences(&b);
        assert_eq!(seqs.len(), 1);
        assert_eq!(seqs[0].positions, [2, 5]);
        assert_eq!(seqs[0].recorded, [-0.7, -1.2]);
        assert_eq!(seqs[0].tokens, [0, 1, 2, 3, 4, 5]);
        // Nothing chosen: nothing to train.
        assert!(sampled_sequences(&batch(vec![0, 1], vec![0.0, 0.0])).is_empty());
    }
}
