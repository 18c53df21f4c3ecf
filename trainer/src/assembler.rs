//! What a step trains on: batches gathered until a step's worth of sampled
//! tokens, the stale ones dropped and counted.

use crate::learner::{sampled_sequences, Learner};
use forgelog_schemas::TrainingBatch;

/// Gathers admitted batches until a step's worth of sampled tokens; batches
/// staler than the learner allows are dropped and counted, never trained on.
#[derive(Debug, Default)]
pub struct StepAssembler {
    pub tokens_per_step: usize,
    /// Full at this many groups too, whatever their tokens.
    pub groups_per_step: Option<usize>,
    pending: Vec<(TrainingBatch, u64)>,
    tokens: usize,
    pub dropped_stale: u64,
}

impl StepAssembler {
    pub fn new(tokens_per_step: usize) -> StepAssembler {
        StepAssembler {
            tokens_per_step,
            ..Default::default()
        }
    }

    /// Admits `batch` for the next step of `learner`, or drops it; returns whether admitted.
    pub fn offer(&mut self, learner: &Learner, batch: TrainingBatch) -> bool {
        let staleness = learner.staleness(&batch);
        if !learner.admits(staleness) {
            self.dropped_stale += 1;
            tracing::info!(group = batch.group_id, staleness, "dropped a stale batch");
            return false;
        }
        self.tokens += sampled_sequences(&batch)
            .iter()
            .map(|s| s.positions.len())
            .sum::<usize>();
        self.pending.push((batch, staleness));
        true
    }

    /// A step's worth of tokens, or of groups, is waiting.
    pub fn full(&self) -> bool {
        self.tokens >= self.tokens_per_step
            || self
                .groups_per_step
                .is_some_and(|g| self.pending.len() >= g)
    }

    pub fn is_empty(&self) -> bool {
        self.pending.is_empty()
    }

    /// The admitted batches, with their staleness, for one step.
    pub fn take(&mut self) -> Vec<(TrainingBatch, u64)> {
        self.tokens = 0;
        std::mem::take(&mut self.pending)
    }
}
