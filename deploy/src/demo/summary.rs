//! The demo's summary table, computed from the run's events in the log (not
//! from what the agent believes happened): a pure function of those events.

use forgelog_schemas::Event;
use std::collections::BTreeMap;
use std::fmt;

/// One row of the table: one harness, or the total.
#[derive(Debug, Clone, Default, PartialEq, serde::Serialize)]
pub struct Row {
    pub rollouts: usize,
    pub model_calls: usize,
    pub tool_calls: i64,
    pub tokens_sampled: usize,
    pub trees: usize,
    pub rewards: usize,
    pub reward_sum: f64,
    pub groups: usize,
    /// Groups whose rewards differ, so GRPO has a signal to learn from.
    pub groups_with_signal: usize,
}

impl Row {
    fn add(&mut self, o: &Row) {
        self.rollouts += o.rollouts;
        self.model_calls += o.model_calls;
        self.tool_calls += o.tool_calls;
        self.tokens_sampled += o.tokens_sampled;
        self.trees += o.trees;
        self.rewards += o.rewards;
        self.reward_sum += o.reward_sum;
        self.groups += o.groups;
        self.groups_with_signal += o.groups_with_signal;
    }
}

#[derive(Debug, Clone, Default, PartialEq, serde::Serialize)]
pub struct RunSummary {
    pub by_harness: BTreeMap<String, Row>,
}

impl RunSummary {
    pub fn of(events: &[Event]) -> RunSummary {
        let harness_of: BTreeMap<&str, &str> = events
            .iter()
            .filter_map(|e| match e {
                Event::RolloutStarted(r) => Some((r.rollout_id.as_str(), r.harness.as_str())),
                _ => None,
            })
            .collect();
        let mut s = RunSummary::default();
        for e in events {
            let rollout = match e {
                Event::RolloutStarted(r) => r.rollout_id.as_str(),
                Event::CallFinished(c) => c.rollout_id.as_str(),
                Event::TrajectoryBuilt(t) => t.rollout_id.as_str(),
                Event::VerifierResult(v) => v.rollout_id.as_str(),
                Event::TrainingBatch(b) => b.members.first().map_or("", |m| m.rollout_id.as_str()),
                _ => continue,
            };
            let harness = harness_of.get(rollout).copied().unwrap_or("unknown");
            let row = s.by_harness.entry(harness.to_string()).or_default();
            match e {
                Event::RolloutStarted(_) => row.rollouts += 1,
                Event::CallFinished(c) => {
                    row.model_calls += 1;
                    row.tokens_sampled += c.completion_token_ids.len();
                }
                Event::TrajectoryBuilt(t) => {
                    row.trees += 1;
                    row.tool_calls += t.tool_calls;
                }
                Event::VerifierResult(v) => {
                    if let Some(reward) = v.reward {
                        row.rewards += 1;
                        row.reward_sum += reward;
                    }
                }
                Event::TrainingBatch(b) => {
                    row.groups += 1;
                    row.groups_with_signal += usize::from(!b.no_reward_variance);
                }
                _ => {}
            }
        }
        s
    }

    pub fn total(&self) -> Row {
        let mut t = Row::default();
        for r in self.by_harness.values() {
            t.add(r);
        }
        t
    }
}

impl fmt::Display for RunSummary {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        writeln!(
            f,
            "{:<18} {:>8} {:>7} {:>6} {:>8} {:>6} {:>8} {:>11} {:>13}",
            "harness",
            "rollouts",
            "calls",
            "tools",
            "sampled",
            "trees",
            "rewards",
            "mean reward",
            "groups (GRPO)"
        )?;
        let total = self.total();
        let rows = self.by_harness.iter().map(|(h, r)| (h.as_str(), r));
        for (name, r) in rows.chain(std::iter::once(("total", &total))) {
            let mean = if r.rewards == 0 {
                "-".to_string()
            } else {
                format!("{:.2}", r.reward_sum / r.rewards as f64)
            };
            let groups = format!("{} ({} signal)", r.groups, r.groups_with_signal);
            writeln!(
                f,
                "{name:<18} {:>8} {:>7} {:>6} {:>8} {:>6} {:>8} {mean:>11} {groups:>13}",
                r.rollouts, r.model_calls, r.tool_calls, r.tokens_sampled, r.trees, r.rewards
            )?;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use forgelog_consumers::rebuild::rebuild;
    use forgelog_schemas::testing::recorded_run;

    #[test]
    fn counts_come_from_the_recorded_and_derived_events() {
        let mut events = recorded_run("r", 2, 3, 2, 5);
        let mut inputs: BTreeMap<_, Vec<Event>> = BTreeMap::new();
        for e in &events {
            inputs.entry(e.topic()).or_default().push(e.clone());
        }
        let derived = rebuild(&inputs, Default::default());
        events.extend(derived.trajectories.iter().cloned());
        events.extend(derived.batches.iter().cloned());
        let count = |f: fn(&Event) -> bool| events.iter().filter(|e| f(e)).count();
        let t = RunSummary::of(&events).total();
        assert_eq!(t.rollouts, 6);
        assert_eq!(
            t.model_calls,
            count(|e| matches!(e, Event::CallFinished(_)))
        );
        assert_eq!(t.trees, 6);
        assert_eq!(t.groups, 2);
        let rewarded = count(|e| matches!(e, Event::VerifierResult(v) if v.reward.is_some()));
        assert!(rewarded > 0);
        assert_eq!(t.rewards, rewarded);
        let sampled: usize = events
            .iter()
            .map(|e| match e {
                Event::CallFinished(c) => c.completion_token_ids.len(),
                _ => 0,
            })
            .sum();
        assert!(sampled > 0);
        assert_eq!(t.tokens_sampled, sampled);

        let s = RunSummary::of(&events);
        assert_eq!(s.by_harness.len(), 2, "opencode and claude-code");
        let table = s.to_string();
        assert!(
            table.lines().last().unwrap().starts_with("total"),
            "{table}"
        );
        assert_eq!(table.lines().count(), 4, "{table}");
    }
}
