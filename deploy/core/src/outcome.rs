//! How a rollout ended, as a typed status, and the verdict the log records.
//!
//! A reward only when the agent finished within its time, the verifier
//! exited (with any code: a failing test suite is a score) and wrote a valid
//! finite number. Anything else is `ok: false, reward: null` with its status:
//! `agent_timeout`, `agent_error`, `verifier_timeout`, `verifier_error`,
//! `reward_missing`, `reward_invalid`, or `infra:<stage>` for what is not the
//! policy's doing (an image that is missing, a sandbox that died). Never a 0.

use crate::reward::{Reward, RewardError};
use forgelog_api::Verdict;
use serde_json::json;

/// Where the infrastructure failed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Stage {
    /// Building or finding the task's image.
    Image,
    /// Creating or starting the sandbox.
    Sandbox,
    /// Starting the harness (its bundle, its session).
    Harness,
    /// Copying the tests in, starting the verifier.
    Verifier,
    /// A cluster that did not run the sandbox: unschedulable, image not
    /// pulled, stuck pending past its timeout.
    Schedule,
}

impl Stage {
    pub fn as_str(self) -> &'static str {
        match self {
            Stage::Image => "image",
            Stage::Sandbox => "sandbox",
            Stage::Harness => "harness",
            Stage::Verifier => "verifier",
            Stage::Schedule => "schedule",
        }
    }
}

/// How the harness ended.
#[derive(Debug, Clone, PartialEq)]
pub enum AgentEnd {
    Exited(i32),
    /// Stopped at the task's agent timeout.
    TimedOut,
    /// It could not run: not the policy's doing.
    Failed {
        stage: Stage,
        why: String,
    },
}

/// How the verifier ended.
#[derive(Debug, Clone, PartialEq)]
pub enum VerifierEnd {
    /// It exited with `code` (killed by a signal: `None`), having written this.
    Ran {
        code: Option<i32>,
        reward: Result<Reward, RewardError>,
    },
    TimedOut,
    Failed {
        stage: Stage,
        why: String,
    },
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RolloutStatus {
    Scored,
    AgentTimeout,
    AgentError,
    VerifierTimeout,
    VerifierError,
    RewardMissing,
    RewardInvalid,
    Infra(Stage),
}

impl RolloutStatus {
    /// As recorded in the verdict's details.
    pub fn name(self) -> String {
        match self {
            RolloutStatus::Scored => "scored".into(),
            RolloutStatus::AgentTimeout => "agent_timeout".into(),
            RolloutStatus::AgentError => "agent_error".into(),
            RolloutStatus::VerifierTimeout => "verifier_timeout".into(),
            RolloutStatus::VerifierError => "verifier_error".into(),
            RolloutStatus::RewardMissing => "reward_missing".into(),
            RolloutStatus::RewardInvalid => "reward_invalid".into(),
            RolloutStatus::Infra(stage) => format!("infra:{}", stage.as_str()),
        }
    }

    pub fn is_infra(self) -> bool {
        matches!(self, RolloutStatus::Infra(_))
    }
}

/// Both ends of an attempt that failed at `stage`, before or around the
/// agent (no sandbox, no image, no pod): infrastructure, not the policy.
pub fn infra(stage: Stage, why: String) -> (AgentEnd, VerifierEnd) {
    (
        AgentEnd::Failed {
            stage,
            why: why.clone(),
        },
        VerifierEnd::Failed { stage, why },
    )
}

/// The status of a rollout that ended so, and its verdict: `details` is JSON
/// with the status, how the agent and the verifier ended, and what the
/// verifier wrote (kept even when the reward is null, for debugging).
pub fn judge(agent: &AgentEnd, verifier: &VerifierEnd) -> (RolloutStatus, Verdict) {
    let (status, why) = match (agent, verifier) {
        (AgentEnd::Failed { stage, why }, _) | (_, VerifierEnd::Failed { stage, why }) => {
            (RolloutStatus::Infra(*stage), why.clone())
        }
        (AgentEnd::TimedOut, _) => (RolloutStatus::AgentTimeout, String::new()),
        (AgentEnd::Exited(code), _) if *code != 0 => (
            RolloutStatus::AgentError,
            format!("the harness exited {code}"),
        ),
        (_, VerifierEnd::TimedOut) => (RolloutStatus::VerifierTimeout, String::new()),
        (_, VerifierEnd::Ran { reward: Ok(_), .. }) => (RolloutStatus::Scored, String::new()),
        (
            _,
            VerifierEnd::Ran {
                code: Some(0),
                reward: Err(RewardError::Missing),
            },
        ) => (
            RolloutStatus::RewardMissing,
            RewardError::Missing.to_string(),
        ),
        (
            _,
            VerifierEnd::Ran {
                code,
                reward: Err(RewardError::Missing),
            },
        ) => (
            RolloutStatus::VerifierError,
            match code {
                Some(c) => format!("the verifier exited {c} without a reward"),
                None => "the verifier was killed by a signal".into(),
            },
        ),
        (_, VerifierEnd::Ran { reward: Err(e), .. }) => {
            (RolloutStatus::RewardInvalid, e.to_string())
        }
    };
    let written = match verifier {
        VerifierEnd::Ran { reward: Ok(r), .. } => json!({"reward": r.value, "parts": r.parts}),
        _ => json!(null),
    };
    let details = json!({
        "status": status.name(),
        "why": why,
        "agent": match agent {
            AgentEnd::Exited(c) => json!({"exit": c}),
            AgentEnd::TimedOut => json!("timed_out"),
            AgentEnd::Failed { .. } => json!("failed"),
        },
        "verifier": match verifier {
            VerifierEnd::Ran { code, .. } => json!({"exit": code}),
            VerifierEnd::TimedOut => json!("timed_out"),
            VerifierEnd::Failed { .. } => json!("failed"),
        },
        "written": written,
    });
    let verdict = match (status, verifier) {
        (RolloutStatus::Scored, VerifierEnd::Ran { reward: Ok(r), .. }) => {
            Verdict::scored(r.value, details)
        }
        _ => Verdict::failed(details),
    };
    (status, verdict)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::BTreeMap;

    fn scored(x: f64) -> VerifierEnd {
        VerifierEnd::Ran {
            code: Some(1),
            reward: Ok(Reward {
                value: x,
                parts: BTreeMap::new(),
            }),
        }
    }

    #[test]
    fn only_an_agent_that_finished_and_a_verifier_that_wrote_a_number_score() {
        let (s, v) = judge(&AgentEnd::Exited(0), &scored(0.0));
        assert_eq!(
            (s, v.ok, v.reward),
            (RolloutStatus::Scored, true, Some(0.0))
        );
        let cases = [
            (AgentEnd::TimedOut, scored(1.0), "agent_timeout"),
            (AgentEnd::Exited(2), scored(1.0), "agent_error"),
            (
                AgentEnd::Exited(0),
                VerifierEnd::TimedOut,
                "verifier_timeout",
            ),
            (
                AgentEnd::Exited(0),
                VerifierEnd::Ran {
                    code: Some(0),
                    reward: Err(RewardError::Missing),
                },
                "reward_missing",
            ),
            (
                AgentEnd::Exited(0),
                VerifierEnd::Ran {
                    code: Some(3),
                    reward: Err(RewardError::Missing),
                },
                "verifier_error",
            ),
            (
                AgentEnd::Exited(0),
                VerifierEnd::Ran {
                    code: None,
                    reward: Err(RewardError::Missing),
                },
                "verifier_error",
            ),
            (
                AgentEnd::Exited(0),
                VerifierEnd::Ran {
                    code: Some(0),
                    reward: Err(RewardError::Invalid {
                        file: "reward.txt",
                        why: "NaN".into(),
                    }),
                },
                "reward_invalid",
            ),
            (
                AgentEnd::Failed {
                    stage: Stage::Image,
                    why: "no image forgelog/x".into(),
                },
                VerifierEnd::Failed {
                    stage: Stage::Verifier,
                    why: "not run".into(),
                },
                "infra:image",
            ),
            (
                AgentEnd::TimedOut,
                VerifierEnd::Failed {
                    stage: Stage::Sandbox,
                    why: "the sandbox died".into(),
                },
                "infra:sandbox",
            ),
        ];
        for (agent, verifier, name) in cases {
            let (status, verdict) = judge(&agent, &verifier);
            assert_eq!(status.name(), name);
            assert_eq!(
                (verdict.ok, verdict.reward),
                (false, None),
                "{name}: never a 0"
            );
            assert_eq!(verdict.details["status"], name);
        }
        // What the verifier wrote is kept when the reward is null.
        let (_, v) = judge(&AgentEnd::TimedOut, &scored(1.0));
        assert_eq!(v.details["written"]["reward"], 1.0);
        assert!(RolloutStatus::Infra(Stage::Harness).is_infra());
    }
}
