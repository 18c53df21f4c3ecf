//! What the log already holds of a run, so a restarted `forgelog run --run R`
//! resumes: a rollout with a finished attempt that was not abandoned is done;
//! attempts started and never finished (their orchestrator died) are given up
//! before the rollout runs again under the next attempt id.

use crate::plan::{attempt_of, Rollout};
use forgelog_schemas::Event;
use std::collections::{BTreeMap, BTreeSet};

/// A run's attempts as its log tells them. Fed the run's `RolloutStarted`,
/// `RolloutFinished` and `VerifierResult` events in any order.
#[derive(Debug, Default, Clone)]
pub struct RunHistory {
    /// Attempt numbers started, by rollout id.
    started: BTreeMap<String, BTreeSet<u32>>,
    finished: BTreeSet<String>,
    abandoned: BTreeSet<String>,
    /// Rewards by attempt id: what a finished rollout scored (null: did not).
    rewards: BTreeMap<String, Option<f64>>,
}

/// What to do with one rollout of the plan.
#[derive(Debug, Clone, PartialEq)]
pub enum Resume {
    /// Attempt `attempt` finished: not run again.
    Done {
        attempt: String,
        reward: Option<f64>,
    },
    /// Run it as attempt `next`, after giving up the `dangling` attempts.
    Run { next: u32, dangling: Vec<String> },
}

impl RunHistory {
    pub fn observe(&mut self, event: &Event) {
        match event {
            Event::RolloutStarted(s) => {
                let (rollout, n) = attempt_of(&s.rollout_id);
                self.started
                    .entry(rollout.to_string())
                    .or_default()
                    .insert(n);
            }
            Event::RolloutFinished(f) => {
                self.finished.insert(f.rollout_id.clone());
            }
            Event::VerifierResult(v) => {
                if v.abandoned {
                    self.abandoned.insert(v.rollout_id.clone());
                }
                self.rewards
                    .insert(v.rollout_id.clone(), v.reward.filter(|_| v.ok));
            }
            _ => {}
        }
    }

    /// Rollouts the log knows of.
    pub fn len(&self) -> usize {
        self.started.len()
    }

    pub fn is_empty(&self) -> bool {
        self.started.is_empty()
    }

    pub fn resume(&self, rollout: &Rollout) -> Resume {
        let Some(attempts) = self.started.get(&rollout.id) else {
            return Resume::Run {
                next: 0,
                dangling: Vec::new(),
            };
        };
        let ids = attempts.iter().map(|&n| rollout.attempt_id(n));
        let (done, open): (Vec<String>, Vec<String>) = ids
            .filter(|id| !self.abandoned.contains(id))
            .partition(|id| self.finished.contains(id));
        match done.into_iter().last() {
            Some(attempt) => Resume::Done {
                reward: self.rewards.get(&attempt).copied().flatten(),
                attempt,
            },
            None => Resume::Run {
                next: attempts.last().map_or(0, |n| n + 1),
                dangling: open,
            },
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::plan::RunPlan;
    use forgelog_schemas::testing::recorded_run;
    use forgelog_schemas::{RolloutStarted, VerifierResult};

    fn started(id: &str) -> Event {
        let Some(Event::RolloutStarted(s)) = recorded_run("r", 1, 1, 1, 4).first().cloned() else {
            unreachable!()
        };
        RolloutStarted {
            rollout_id: id.into(),
            ..s
        }
        .into()
    }

    fn finished(id: &str, abandoned: bool) -> Vec<Event> {
        let run = recorded_run("r", 1, 1, 1, 4);
        let mut out = Vec::new();
        for e in run {
            match e {
                Event::RolloutFinished(mut f) => {
                    f.rollout_id = id.into();
                    out.push(f.into());
                }
                Event::VerifierResult(v) => out.push(
                    VerifierResult {
                        rollout_id: id.into(),
                        ok: !abandoned,
                        reward: (!abandoned).then_some(0.5),
                        abandoned,
                        ..v
                    }
                    .into(),
                ),
                _ => {}
            }
        }
        out
    }

    #[test]
    fn finished_rollouts_are_done_and_dangling_attempts_are_given_up() {
        let plan = RunPlan::new("r", &["t".into()], &["h".into()], 4);
        let rollouts: Vec<Rollout> = plan.rollouts().collect();
        let [a, b, c, d] = &rollouts[..] else {
            unreachable!()
        };
        let mut events = vec![started(&a.id)];
        events.extend(finished(&a.id, false));
        // b: attempt 0 abandoned (no model call), attempt 1 then killed.
        events.push(started(&b.id));
        events.extend(finished(&b.id, true));
        events.push(started(&b.attempt_id(1)));
        // c: killed during attempt 0; d: never started.
        events.push(started(&c.id));
        for order in [events.clone(), events.into_iter().rev().collect()] {
            let mut h = RunHistory::default();
            order.iter().for_each(|e| h.observe(e));
            assert_eq!(
                h.resume(a),
                Resume::Done {
                    attempt: a.id.clone(),
                    reward: Some(0.5)
                }
            );
            assert_eq!(
                h.resume(b),
                Resume::Run {
                    next: 2,
                    dangling: vec![b.attempt_id(1)]
                }
            );
            assert_eq!(
                h.resume(c),
                Resume::Run {
                    next: 1,
                    dangling: vec![c.id.clone()]
                }
            );
            assert_eq!(
                h.resume(d),
                Resume::Run {
                    next: 0,
                    dangling: vec![]
                }
            );
        }
    }
}
