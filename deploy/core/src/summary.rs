//! What a run did, per harness: the table `forgelog run` prints at the end.

use crate::outcome::RolloutStatus;
use std::collections::BTreeMap;
use std::fmt;

/// How one rollout of the plan ended in this run.
#[derive(Debug, Clone, PartialEq)]
pub struct Outcome {
    pub rollout_id: String,
    pub harness: String,
    /// The attempt that ended it (its session's rollout id).
    pub attempt: String,
    /// `None`: it had finished in the log before this run started.
    pub status: Option<RolloutStatus>,
    /// The harness's exit status, when it exited in this run.
    pub exit_status: Option<i64>,
    pub reward: Option<f64>,
    pub model_calls: i64,
    pub sampled_tokens: i64,
    /// Attempts given up before it (they never reached the model).
    pub retries: u32,
    /// What its attempt asked the proxy for that the proxy has no route for.
    pub unrouted: Vec<forgelog_api::Unrouted>,
}

/// One harness's row.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct HarnessSummary {
    pub harness: String,
    pub rollouts: usize,
    /// Finished before this run (resumed runs skip them).
    pub already_done: usize,
    pub scored: usize,
    /// Scored with a reward of at least 1.
    pub passed: usize,
    reward_sum: f64,
    /// Unscored rollouts by status name (`agent_timeout`, `infra:image`...).
    pub failures: BTreeMap<String, usize>,
    pub retries: u32,
    pub model_calls: i64,
    pub sampled_tokens: i64,
}

impl HarnessSummary {
    /// Over the scored rollouts of this run.
    pub fn mean_reward(&self) -> Option<f64> {
        (self.scored > 0).then(|| self.reward_sum / self.scored as f64)
    }

    pub fn pass_rate(&self) -> Option<f64> {
        (self.scored > 0).then(|| self.passed as f64 / self.scored as f64)
    }

    /// Infrastructure failures (never the policy's doing).
    pub fn infra(&self) -> usize {
        self.failures
            .iter()
            .filter(|(k, _)| k.starts_with("infra:"))
            .map(|(_, n)| n)
            .sum()
    }
}

/// How the rollouts this process ran ended, one row per harness in name
/// order (the run itself, as the log says, is `forgelog_deploy::demo::summary::RunSummary`).
#[derive(Debug, Clone, Default, PartialEq)]
pub struct OutcomeSummary {
    pub harnesses: Vec<HarnessSummary>,
}

impl OutcomeSummary {
    pub fn of(outcomes: &[Outcome]) -> OutcomeSummary {
        let mut rows: BTreeMap<&str, HarnessSummary> = BTreeMap::new();
        for o in outcomes {
            let row = rows.entry(&o.harness).or_insert_with(|| HarnessSummary {
                harness: o.harness.clone(),
                ..Default::default()
            });
            row.rollouts += 1;
            row.retries += o.retries;
            row.model_calls += o.model_calls;
            row.sampled_tokens += o.sampled_tokens;
            match (o.status, o.reward) {
                (None, _) => row.already_done += 1,
                (Some(RolloutStatus::Scored), Some(r)) => {
                    row.scored += 1;
                    row.reward_sum += r;
                    row.passed += usize::from(r >= 1.0);
                }
                (Some(s), _) => *row.failures.entry(s.name()).or_default() += 1,
            }
        }
        OutcomeSummary {
            harnesses: rows.into_values().collect(),
        }
    }

    /// Each harness none of whose attempts in this process reached the
    /// model, with one such attempt: where a user looks first when their
    /// harness never talks to the proxy.
    pub fn silent_harnesses<'a>(
        &'a self,
        outcomes: &'a [Outcome],
    ) -> impl Iterator<Item = (&'a str, &'a Outcome)> + 'a {
        self.harnesses
            .iter()
            .filter(|h| h.rollouts > h.already_done && h.model_calls == 0)
            .filter_map(|h| {
                let attempt = outcomes
                    .iter()
                    .find(|o| o.harness == h.harness && o.status.is_some())?;
                Some((h.harness.as_str(), attempt))
            })
    }

    /// Rollouts that ended unscored for infrastructure reasons, in all.
    pub fn infra(&self) -> usize {
        self.harnesses.iter().map(HarnessSummary::infra).sum()
    }
}

impl fmt::Display for OutcomeSummary {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let pct = |x: Option<f64>| x.map_or("-".into(), |x| format!("{:.0}%", x * 100.0));
        let num = |x: Option<f64>| x.map_or("-".into(), |x| format!("{x:.3}"));
        writeln!(
            f,
            "{:<16} {:>8} {:>6} {:>6} {:>6} {:>7} {:>7} {:>8} {:>10}  unscored",
            "harness", "rollouts", "done", "scored", "pass", "reward", "retries", "calls", "tokens"
        )?;
        for h in &self.harnesses {
            let failures: Vec<String> =
                h.failures.iter().map(|(k, n)| format!("{k} {n}")).collect();
            writeln!(
                f,
                "{:<16} {:>8} {:>6} {:>6} {:>6} {:>7} {:>7} {:>8} {:>10}  {}",
                h.harness,
                h.rollouts,
                h.already_done,
                h.scored,
                pct(h.pass_rate()),
                num(h.mean_reward()),
                h.retries,
                h.model_calls,
                h.sampled_tokens,
                if failures.is_empty() {
                    "-".into()
                } else {
                    failures.join(", ")
                }
            )?;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::outcome::Stage;

    fn o(harness: &str, status: Option<RolloutStatus>, reward: Option<f64>) -> Outcome {
        Outcome {
            rollout_id: "r".into(),
            harness: harness.into(),
            attempt: "r".into(),
            status,
            exit_status: None,
            reward,
            model_calls: 2,
            sampled_tokens: 10,
            retries: u32::from(status == Some(RolloutStatus::Infra(Stage::Image))),
            unrouted: Vec::new(),
        }
    }

    #[test]
    fn a_harness_whose_attempts_never_reached_the_model_is_named() {
        let silent = |harness: &str, status| Outcome {
            model_calls: 0,
            attempt: format!("{harness}-a"),
            ..o(harness, status, None)
        };
        let outcomes = [
            o("codex", Some(RolloutStatus::Scored), Some(1.0)),
            silent("mine", Some(RolloutStatus::AgentTimeout)),
            silent("mine", Some(RolloutStatus::AgentTimeout)),
            // Done before this process: nothing to say of it.
            silent("resumed", None),
        ];
        let s = OutcomeSummary::of(&outcomes);
        let named: Vec<_> = s
            .silent_harnesses(&outcomes)
            .map(|(h, o)| (h, o.attempt.as_str()))
            .collect();
        assert_eq!(named, [("mine", "mine-a")]);
    }

    #[test]
    fn rows_count_scores_failures_and_skipped_rollouts_per_harness() {
        let s = OutcomeSummary::of(&[
            o("codex", Some(RolloutStatus::Scored), Some(1.0)),
            o("codex", Some(RolloutStatus::Scored), Some(0.0)),
            o("codex", Some(RolloutStatus::Infra(Stage::Image)), None),
            o("codex", None, Some(1.0)),
            o("aider", Some(RolloutStatus::AgentTimeout), None),
        ]);
        let [aider, codex] = &s.harnesses[..] else {
            panic!("{s:?}")
        };
        assert_eq!(
            (aider.rollouts, aider.scored, aider.mean_reward()),
            (1, 0, None)
        );
        assert_eq!(aider.failures["agent_timeout"], 1);
        assert_eq!(
            (
                codex.rollouts,
                codex.already_done,
                codex.scored,
                codex.passed
            ),
            (4, 1, 2, 1)
        );
        assert_eq!(
            (codex.mean_reward(), codex.pass_rate()),
            (Some(0.5), Some(0.5))
        );
        assert_eq!((codex.infra(), codex.retries, codex.model_calls), (1, 1, 8));
        assert_eq!(s.infra(), 1);
        let table = s.to_string();
        assert!(table.contains("infra:image 1"), "{table}");
        assert_eq!(table.lines().count(), 3);
    }
}
