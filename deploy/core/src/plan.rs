//! A run's plan: GRPO groups of `group_size` rollouts of one task with one
//! harness, harnesses alternating across a task's groups (so every harness
//! sees every task and no harness runs all its groups in a row), ids
//! deterministic so a restarted run finds its rollouts in the log.

use crate::outcome::RolloutStatus;

/// Tries of one rollout at most in one orchestrator's life: a failure before
/// its first model call is tried again twice (not the policy's doing: a
/// sandbox or harness that did not start); nothing else is retried.
pub const MAX_ATTEMPTS: u32 = 3;

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Group {
    pub id: String,
    pub task: String,
    pub harness: String,
    pub size: usize,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Rollout {
    /// `{group}-{member}`: the same in every run of the plan.
    pub id: String,
    pub group: String,
    pub task: String,
    pub harness: String,
    pub member: usize,
}

impl Rollout {
    /// The id attempt `attempt` (from 0) runs under: each attempt is a
    /// session of its own, so its calls never share event ids with another's.
    pub fn attempt_id(&self, attempt: u32) -> String {
        match attempt {
            0 => self.id.clone(),
            n => format!("{}~{n}", self.id),
        }
    }
}

/// Whether try `tries` (from 0) of a rollout, ending with `status`, may be
/// abandoned for another: only when it did not score and tries are left. The
/// proxy then abandons it only if it never reached the model (its calls would
/// otherwise be in the log: then it stands as a member with a null reward).
pub fn may_retry(status: RolloutStatus, tries: u32) -> bool {
    status != RolloutStatus::Scored && tries + 1 < MAX_ATTEMPTS
}

/// The rollout id and attempt number of attempt id `id` (see
/// [`Rollout::attempt_id`]).
pub fn attempt_of(id: &str) -> (&str, u32) {
    match id.rsplit_once('~') {
        Some((rollout, n)) => match n.parse() {
            Ok(n) => (rollout, n),
            Err(_) => (id, 0),
        },
        None => (id, 0),
    }
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RunPlan {
    pub run_id: String,
    pub groups: Vec<Group>,
    /// Every rollout, group by group: all of each group's members for a
    /// new run, the recorded attempts chosen for a replay.
    pub rollouts: Vec<Rollout>,
}

impl RunPlan {
    /// One group per task and harness, tasks in the order given.
    pub fn new(run_id: &str, tasks: &[String], harnesses: &[String], group_size: usize) -> RunPlan {
        let mut groups = Vec::with_capacity(tasks.len() * harnesses.len());
        for (t, task) in tasks.iter().enumerate() {
            for h in 0..harnesses.len() {
                // Rotate the harnesses per task: consecutive groups alternate.
                let harness = &harnesses[(t + h) % harnesses.len()];
                groups.push(Group {
                    id: format!("{run_id}-{task}-{harness}"),
                    task: task.clone(),
                    harness: harness.clone(),
                    size: group_size.max(1),
                });
            }
        }
        RunPlan::of_groups(run_id, groups)
    }

    /// The plan's groups `epochs` times over, in order: epoch `e` after the
    /// first is groups of their own, `{group}-e{e}` (so the first epoch's ids
    /// are the plan's, and a run resumed with more epochs goes on from them).
    pub fn epochs(self, epochs: usize) -> RunPlan {
        let groups = (0..epochs.max(1))
            .flat_map(|e| {
                self.groups.iter().map(move |g| Group {
                    id: match e {
                        0 => g.id.clone(),
                        e => format!("{}-e{e}", g.id),
                    },
                    ..g.clone()
                })
            })
            .collect();
        RunPlan::of_groups(&self.run_id, groups)
    }

    fn of_groups(run_id: &str, groups: Vec<Group>) -> RunPlan {
        let rollouts = groups
            .iter()
            .flat_map(|g| {
                (0..g.size).map(move |member| Rollout {
                    id: format!("{}-{member}", g.id),
                    group: g.id.clone(),
                    task: g.task.clone(),
                    harness: g.harness.clone(),
                    member,
                })
            })
            .collect();
        RunPlan {
            run_id: run_id.to_string(),
            groups,
            rollouts,
        }
    }

    /// Every rollout, group by group.
    pub fn rollouts(&self) -> impl Iterator<Item = Rollout> + '_ {
        self.rollouts.iter().cloned()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn names(xs: &[&str]) -> Vec<String> {
        xs.iter().map(|s| s.to_string()).collect()
    }

    #[test]
    fn every_task_meets_every_harness_and_harnesses_alternate() {
        let plan = RunPlan::new(
            "r",
            &names(&["a", "b"]),
            &names(&["codex", "claude-code"]),
            4,
        );
        let order: Vec<(&str, &str)> = plan
            .groups
            .iter()
            .map(|g| (g.task.as_str(), g.harness.as_str()))
            .collect();
        assert_eq!(
            order,
            [
                ("a", "codex"),
                ("a", "claude-code"),
                ("b", "claude-code"),
                ("b", "codex")
            ]
        );
        let rollouts: Vec<Rollout> = plan.rollouts().collect();
        assert_eq!(rollouts.len(), 16);
        assert_eq!(rollouts[5].id, "r-a-claude-code-1");
        let mut ids: Vec<&str> = rollouts.iter().map(|r| r.id.as_str()).collect();
        ids.sort();
        ids.dedup();
        assert_eq!(ids.len(), 16, "ids are unique");
        assert_eq!(
            plan,
            RunPlan::new(
                "r",
                &names(&["a", "b"]),
                &names(&["codex", "claude-code"]),
                4
            )
        );
    }

    #[test]
    fn epochs_repeat_the_groups_in_order_under_ids_of_their_own() {
        let one = RunPlan::new("r", &names(&["a", "b"]), &names(&["h"]), 2);
        let three = one.clone().epochs(3);
        let ids: Vec<&str> = three.groups.iter().map(|g| g.id.as_str()).collect();
        assert_eq!(
            ids,
            ["r-a-h", "r-b-h", "r-a-h-e1", "r-b-h-e1", "r-a-h-e2", "r-b-h-e2"]
        );
        // The first epoch is the plan itself: a run resumed with more
        // epochs finds its rollouts.
        assert_eq!(three.rollouts[..4], one.rollouts[..]);
        assert_eq!(three.rollouts.len(), 12);
        assert_eq!(three.rollouts[11].id, "r-b-h-e2-1");
        assert_eq!(three.rollouts[11].task, "b");
        assert_eq!(one.clone().epochs(1), one);
        assert_eq!(one.clone().epochs(0), one);
    }

    #[test]
    fn only_unscored_tries_are_retried_at_most_twice() {
        use crate::outcome::Stage;
        let infra = RolloutStatus::Infra(Stage::Sandbox);
        assert!(may_retry(infra, 0));
        assert!(may_retry(RolloutStatus::AgentError, 1));
        assert!(!may_retry(infra, 2), "three tries at most");
        assert!(!may_retry(RolloutStatus::Scored, 0));
        let r = RunPlan::new("r", &names(&["t"]), &names(&["h"]), 1)
            .rollouts()
            .next()
            .unwrap();
        assert_eq!(
            (r.attempt_id(0), r.attempt_id(2)),
            ("r-t-h-0".to_string(), "r-t-h-0~2".to_string())
        );
        for n in [0, 1, 17] {
            assert_eq!(attempt_of(&r.attempt_id(n)), ("r-t-h-0", n));
        }
        assert_eq!(attempt_of("a~b"), ("a~b", 0));
    }
}
