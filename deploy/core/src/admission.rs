//! When a training run may start a group's rollouts: the staleness bound
//! applied at admission, so that rollouts are not sampled by a policy the
//! learner will have left too far behind by the time it trains on them (the
//! trainer would drop their batches as stale).
//!
//! Groups are admitted in plan order. The learner takes `groups_per_step`
//! groups per step and publishes a version per step, so group `g` is trained
//! at about version `g / groups_per_step`. Sampled at version `v`, it is
//! `g / groups_per_step - v` versions stale then: group `g` may start once
//! the newest version `v` satisfies `g < (v + max_staleness + 1) * groups_per_step`.

/// The bound, as the learner is configured.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct StalenessBound {
    pub groups_per_step: usize,
    pub max_staleness: u64,
}

impl StalenessBound {
    /// Whether group `group` (its index in the plan) may start while
    /// `version` is the newest policy.
    pub fn admits(&self, group: usize, version: u64) -> bool {
        let steps_ahead = version.saturating_add(self.max_staleness).saturating_add(1);
        (group as u64) < steps_ahead.saturating_mul(self.groups_per_step.max(1) as u64)
    }

    /// The oldest version at which `group` may start.
    pub fn version_for(&self, group: usize) -> u64 {
        let step = (group / self.groups_per_step.max(1)) as u64;
        step.saturating_sub(self.max_staleness)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn on_policy_each_step_waits_for_the_version_before_it() {
        let on_policy = StalenessBound {
            groups_per_step: 2,
            max_staleness: 0,
        };
        // Version 0 samples the first step's two groups, and no more.
        assert!(on_policy.admits(0, 0) && on_policy.admits(1, 0));
        assert!(!on_policy.admits(2, 0));
        assert!(on_policy.admits(2, 1) && on_policy.admits(3, 1));
        assert!(!on_policy.admits(4, 1));
    }

    #[test]
    fn staleness_lets_rollouts_run_that_many_steps_ahead() {
        let bound = StalenessBound {
            groups_per_step: 3,
            max_staleness: 2,
        };
        assert!(bound.admits(8, 0), "steps 1 to 3 at version 0");
        assert!(!bound.admits(9, 0));
        assert!(bound.admits(9, 1));
        assert!(bound.admits(1 << 40, u64::MAX), "no overflow");
    }

    #[test]
    fn the_version_a_group_waits_for_is_the_first_that_admits_it() {
        for (groups_per_step, max_staleness) in [(1, 0), (2, 0), (3, 2), (4, 1)] {
            let bound = StalenessBound {
                groups_per_step,
                max_staleness,
            };
            for group in 0..40 {
                let v = bound.version_for(group);
                assert!(bound.admits(group, v), "{bound:?} {group}");
                assert!(v == 0 || !bound.admits(group, v - 1), "{bound:?} {group}");
            }
        }
    }
}
