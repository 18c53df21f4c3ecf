//! The metrics one optimizer step reports.

use std::collections::BTreeMap;

/// What one optimizer step did.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct StepMetrics {
    pub loss: f64,
    pub ratio_mean: f64,
    pub ratio_min: f64,
    pub ratio_max: f64,
    /// Largest `|ρ − 1|`: 0 up to numerics when on policy.
    pub ratio_max_deviation: f64,
    /// Tokens whose importance weight was truncated at `C`.
    pub truncated_fraction: f64,
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
    /// groups all scored alike) has no importance ratios, truncation or entropy:
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
                ("truncated_fraction".into(), self.truncated_fraction),
                ("entropy".into(), self.entropy),
            ]);
        }
        map
    }
}
