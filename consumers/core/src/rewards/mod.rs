//! `forgelog.rollouts` + `forgelog.trajectories` + `forgelog.rewards` → `forgelog.batches`:
//! the reward join and GRPO grouping.

use crate::{Processor, RecentKeys};
use forgelog_schemas::{
    event_id, Event, GroupMember, RolloutStarted, Topic, TrainingBatch, TrajectoryBuilt,
    VerifierResult,
};
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;

/// How verifier rewards become the rewards GRPO uses.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub enum RewardTransform {
    /// A correct answer (reward ≥ `correct_at`) earns `1 + 1.5 / (15 + tool_calls)`:
    /// among correct rollouts, fewer tool calls score higher.
    EfficiencyBonus { correct_at: f64 },
    /// Clamp into `[min, max]`.
    Clip { min: f64, max: f64 },
}

impl RewardTransform {
    pub fn apply(&self, reward: f64, tool_calls: i64) -> f64 {
        match *self {
            RewardTransform::EfficiencyBonus { correct_at } if reward >= correct_at => {
                1.0 + 1.5 / (15.0 + tool_calls as f64)
            }
            RewardTransform::EfficiencyBonus { .. } => reward,
            RewardTransform::Clip { min, max } => reward.clamp(min, max),
        }
    }
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct RewardConfig {
    /// Applied in order.
    pub transforms: Vec<RewardTransform>,
    /// The ε in (r − mean) / (std + ε).
    pub epsilon: f64,
}

impl Default for RewardConfig {
    fn default() -> Self {
        RewardConfig {
            transforms: Vec::new(),
            epsilon: 1e-6,
        }
    }
}

impl RewardConfig {
    /// The default join, with `--efficiency-bonus`'s transform when asked:
    /// correct answers (reward ≥ 1) score more the fewer tool calls they took.
    pub fn with_efficiency_bonus(bonus: bool) -> RewardConfig {
        RewardConfig {
            transforms: if bonus {
                vec![RewardTransform::EfficiencyBonus { correct_at: 1.0 }]
            } else {
                Vec::new()
            },
            ..Default::default()
        }
    }
}

/// Group advantages over the scored members (`None` rewards are left out of the
/// baseline and get no advantage). Returns the advantages and whether the
/// scored rewards carry no variance (fewer than two, or all equal).
pub fn advantages(rewards: &[Option<f64>], epsilon: f64) -> (Vec<Option<f64>>, bool) {
    let scored: Vec<f64> = rewards.iter().flatten().copied().collect();
    if scored.is_empty() {
        return (vec![None; rewards.len()], true);
    }
    let n = scored.len() as f64;
    let mean = scored.iter().sum::<f64>() / n;
    let std = (scored.iter().map(|r| (r - mean).powi(2)).sum::<f64>() / n).sqrt();
    let flat = scored.len() < 2 || scored.iter().all(|&r| r == scored[0]);
    let adv = rewards
        .iter()
        .map(|r| {
            r.map(|r| {
                if flat {
                    0.0
                } else {
                    (r - mean) / (std + epsilon)
                }
            })
        })
        .collect();
    (adv, flat)
}

/// Joins trajectories and verdicts by rollout in whichever order they arrive,
/// and emits a GRPO group once all `group_size` members have both.
#[derive(Debug, Default, Serialize, Deserialize)]
pub struct RewardJoin {
    config: RewardConfig,
    /// By `run_id \t group_id`.
    groups: BTreeMap<String, PendingGroup>,
    /// `run_id \t rollout_id` → group key, once the rollout's group is known.
    group_of: BTreeMap<String, String>,
    /// Verdicts that arrived before their rollout's group was known.
    early_verdicts: BTreeMap<String, VerifierResult>,
    /// `run_id \t rollout_id` of attempts given up (their rollout ran again
    /// under a new id): never members, whichever of their events comes first.
    abandoned: RecentKeys,
    emitted: RecentKeys,
}

#[derive(Debug, Default, Serialize, Deserialize)]
struct PendingGroup {
    run_id: String,
    group_id: String,
    task_id: String,
    /// From the first `RolloutStarted` read: until then the group cannot be
    /// complete, whatever its members' trajectories and verdicts (they may
    /// arrive first in a live run).
    size: Option<i64>,
    /// By rollout id: sorted, so member order is deterministic.
    members: BTreeMap<String, Member>,
}

#[derive(Debug, Default, Serialize, Deserialize)]
struct Member {
    harness: String,
    trajectory: Option<TrajectoryBuilt>,
    verdict: Option<VerifierResult>,
}

fn key(run_id: &str, id: &str) -> String {
    format!("{run_id}\t{id}")
}

impl RewardJoin {
    pub fn new(config: RewardConfig) -> RewardJoin {
        RewardJoin {
            config,
            ..Default::default()
        }
    }

    fn join_group(
        &mut self,
        run_id: &str,
        group_id: &str,
        task_id: &str,
        rollout_id: &str,
        harness: &str,
    ) -> Option<String> {
        let gk = key(run_id, group_id);
        if self.emitted.contains(&gk) || self.abandoned.contains(&key(run_id, rollout_id)) {
            return None;
        }
        let group = self
            .groups
            .entry(gk.clone())
            .or_insert_with(|| PendingGroup {
                run_id: run_id.into(),
                group_id: group_id.into(),
                task_id: task_id.into(),
                size: None,
                members: BTreeMap::new(),
            });
        let member = group.members.entry(rollout_id.into()).or_default();
        if member.harness.is_empty() {
            member.harness = harness.into();
        }
        let rk = key(run_id, rollout_id);
        self.group_of.insert(rk.clone(), gk.clone());
        if let Some(v) = self.early_verdicts.remove(&rk) {
            self.groups
                .get_mut(&gk)
                .expect("inserted")
                .members
                .get_mut(rollout_id)
                .expect("inserted")
                .verdict
                .get_or_insert(v);
        }
        Some(gk)
    }

    fn started(&mut self, e: RolloutStarted) -> Option<String> {
        let gk = self.join_group(
            &e.run_id,
            &e.group_id,
            &e.task_id,
            &e.rollout_id,
            &e.harness,
        )?;
        self.groups.get_mut(&gk)?.size = Some(e.group_size.max(1));
        Some(gk)
    }

    fn trajectory(&mut self, t: TrajectoryBuilt) -> Option<String> {
        let gk = self.join_group(
            &t.run_id,
            &t.group_id,
            &t.task_id,
            &t.rollout_id,
            &t.harness,
        )?;
        let member = self.groups.get_mut(&gk)?.members.get_mut(&t.rollout_id)?;
        member.trajectory.get_or_insert(t);
        Some(gk)
    }

    fn verdict(&mut self, v: VerifierResult) -> Option<String> {
        let rk = key(&v.run_id, &v.rollout_id);
        if v.abandoned {
            // Its group waits for the rerun instead (a removal never completes one).
            if let Some(gk) = self.group_of.remove(&rk) {
                if let Some(g) = self.groups.get_mut(&gk) {
                    g.members.remove(&v.rollout_id);
                }
            }
            self.early_verdicts.remove(&rk);
            self.abandoned.insert(rk);
            return None;
        }
        match self.group_of.get(&rk).cloned() {
            Some(gk) => {
                let member = self.groups.get_mut(&gk)?.members.get_mut(&v.rollout_id)?;
                member.verdict.get_or_insert(v);
                Some(gk)
            }
            None => {
                self.early_verdicts.entry(rk).or_insert(v);
                None
            }
        }
    }

    fn complete(&self, gk: &str) -> bool {
        self.groups.get(gk).is_some_and(|g| {
            g.size.is_some_and(|size| g.members.len() as i64 >= size)
                && g.members
                    .values()
                    .all(|m| m.trajectory.is_some() && m.verdict.is_some())
        })
    }

    fn batch(&self, g: PendingGroup) -> TrainingBatch {
        let rewards: Vec<Option<f64>> = g
            .members
            .values()
            .map(|m| {
                let v = m.verdict.as_ref().expect("complete");
                let tool_calls = m.trajectory.as_ref().map_or(0, |t| t.tool_calls);
                v.reward.filter(|_| v.ok).map(|r| {
                    self.config
                        .transforms
                        .iter()
                        .fold(r, |r, t| t.apply(r, tool_calls))
                })
            })
            .collect();
        let (adv, flat) = advantages(&rewards, self.config.epsilon);
        let members = g
            .members
            .into_iter()
            .zip(rewards.into_iter().zip(adv))
            .map(|((rollout_id, m), (reward, advantage))| GroupMember {
                rollout_id,
                harness: m.harness,
                reward,
                advantage,
                // Abandoned retries are not trained on.
                sequences: m
                    .trajectory
                    .map(|t| t.sequences.into_iter().filter(|s| !s.discarded).collect())
                    .unwrap_or_default(),
            })
            .collect();
        TrainingBatch {
            event_id: event_id("TrainingBatch", &[&g.run_id, &g.group_id]),
            run_id: g.run_id,
            group_id: g.group_id,
            task_id: g.task_id,
            no_reward_variance: flat,
            members,
        }
    }
}

impl Processor for RewardJoin {
    const NAME: &'static str = "rewards";
    const INPUTS: &'static [Topic] = &[Topic::Rollouts, Topic::Trajectories, Topic::Rewards];
    const OUTPUT: Topic = Topic::Batches;

    fn process(&mut self, event: Event, out: &mut Vec<Event>) {
        let gk = match event {
            Event::RolloutStarted(e) => self.started(e),
            Event::TrajectoryBuilt(t) => self.trajectory(t),
            Event::VerifierResult(v) => self.verdict(v),
            _ => None,
        };
        if let Some(gk) = gk.filter(|gk| self.complete(gk)) {
            let group = self.groups.remove(&gk).expect("complete groups exist");
            for rollout in group.members.keys() {
                self.group_of.remove(&key(&group.run_id, rollout));
            }
            self.emitted.insert(gk);
            out.push(self.batch(group).into());
        }
    }

    fn settings(&self) -> String {
        serde_json::to_string(&self.config).expect("config serializes")
    }
}

#[cfg(test)]
mod tests;
