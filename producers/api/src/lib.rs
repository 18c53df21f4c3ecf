//! The capture proxy's session API, as types: what `POST /sessions` and
//! `POST /sessions/{id}/finish` take and answer. The proxy serves them; the
//! orchestrator, `forgelog up`, the demo and the tests call them through
//! [`SessionClient`] (feature `client`). Nobody writes this JSON by hand.
//!
//! A session is one rollout: the harness holds only its `api_key`; the
//! orchestrator (holding the admin token) creates and finishes it.

use serde::{Deserialize, Serialize};
use serde_json::Value;

#[cfg(feature = "client")]
mod client;
#[cfg(feature = "client")]
pub use client::{ClientError, SessionClient};

/// `POST /sessions`: a rollout's session on the live proxy.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct NewSession {
    /// The run; the proxy's `--run` when absent.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub run_id: Option<String>,
    pub rollout_id: String,
    pub task_id: String,
    pub harness: String,
    pub group_id: String,
    /// Rollouts in the group (the reward join waits for this many).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub group_size: Option<i64>,
    /// Model calls the session may make; past it the proxy answers with a
    /// final "budget exhausted" message and records a budget stop.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_model_calls: Option<u32>,
    /// The most completion tokens the proxy asks the upstream for per call.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_tokens: Option<i64>,
}

impl NewSession {
    /// A session of rollout `rollout_id`, with no budget or token clamp.
    pub fn new(
        rollout_id: impl Into<String>,
        task_id: impl Into<String>,
        harness: impl Into<String>,
        group_id: impl Into<String>,
    ) -> NewSession {
        NewSession {
            run_id: None,
            rollout_id: rollout_id.into(),
            task_id: task_id.into(),
            harness: harness.into(),
            group_id: group_id.into(),
            group_size: None,
            max_model_calls: None,
            max_tokens: None,
        }
    }

    pub fn in_run(mut self, run_id: impl Into<String>) -> NewSession {
        self.run_id = Some(run_id.into());
        self
    }

    pub fn group_size(mut self, n: i64) -> NewSession {
        self.group_size = Some(n);
        self
    }

    pub fn max_model_calls(mut self, n: u32) -> NewSession {
        self.max_model_calls = Some(n);
        self
    }

    pub fn max_tokens(mut self, n: i64) -> NewSession {
        self.max_tokens = Some(n);
        self
    }

    /// What no session can be opened with, said as the caller named it:
    /// a blank id (a rollout `""` keys every consumer's state by nothing)
    /// or a size below 1 (a group of 0 that the reward join takes as 1, a
    /// token clamp of 0 that every call fails on). Found by probing
    /// `POST /sessions`, which took them.
    pub fn check(&self) -> Result<(), String> {
        let ids = [
            ("run_id", self.run_id.as_deref()),
            ("rollout_id", Some(self.rollout_id.as_str())),
            ("task_id", Some(self.task_id.as_str())),
            ("harness", Some(self.harness.as_str())),
            ("group_id", Some(self.group_id.as_str())),
        ];
        if let Some((name, _)) = ids
            .iter()
            .find(|(_, id)| id.is_some_and(|id| id.trim().is_empty()))
        {
            return Err(format!("'{name}' must not be blank"));
        }
        for (name, n) in [
            ("group_size", self.group_size),
            ("max_tokens", self.max_tokens),
        ] {
            if let Some(n) = n.filter(|&n| n < 1) {
                return Err(format!("'{name}' must be 1 or more, not {n}"));
            }
        }
        Ok(())
    }
}

/// `POST /sessions` on `replay serve`: re-run a recorded session, named by its
/// session or rollout id, or by the original request.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(untagged)]
pub enum ReplaySession {
    Of { replay_of: String },
    Original(NewSession),
}

/// The answer to `POST /sessions`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct SessionCreated {
    pub session_id: String,
    /// The harness's API key (or bearer token) for this session's calls.
    pub api_key: String,
}

/// `POST /sessions/{id}/finish`: how the rollout ended.
#[derive(Debug, Clone, PartialEq, Default, Serialize, Deserialize)]
pub struct Finish {
    /// The harness's exit status, when it exited.
    #[serde(default)]
    pub exit_status: Option<i64>,
    /// The verifier's verdict; absent when it did not run.
    #[serde(default)]
    pub verifier: Option<Verdict>,
    /// When the session made no model call and the verdict did not score,
    /// record the attempt as abandoned (the orchestrator runs the rollout
    /// again under a new id) instead of as a member of its group.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub abandon_if_unused: bool,
}

/// `POST /sessions/abandon`: give up an attempt whose orchestrator died
/// before finishing it (the proxy may no longer hold its session). Records a
/// verdict with `abandoned: true`, so its group waits for the rerun instead.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct AbandonAttempt {
    /// The run; the proxy's `--run` when absent.
    #[serde(default)]
    pub run_id: Option<String>,
    /// The attempt's rollout id, as its `POST /sessions` named it.
    pub rollout_id: String,
    pub why: String,
}

/// What the task's verifier said. `ok` is whether it ran and produced a
/// reward; when it is false the reward is recorded as null, never 0.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Verdict {
    pub ok: bool,
    #[serde(default)]
    pub reward: Option<f64>,
    /// A string, or any JSON (recorded as its text).
    #[serde(default)]
    pub details: Value,
}

impl Verdict {
    /// A verifier that ran and scored `reward`.
    pub fn scored(reward: f64, details: impl Into<Value>) -> Verdict {
        Verdict {
            ok: true,
            reward: Some(reward),
            details: details.into(),
        }
    }

    /// A verifier that did not produce a reward, and why.
    pub fn failed(details: impl Into<Value>) -> Verdict {
        Verdict {
            ok: false,
            reward: None,
            details: details.into(),
        }
    }

    /// Rewards are bounded: GRPO normalizes a group's rewards, and one of
    /// 1e300 turns every advantage of its group into NaN.
    pub const MAX_ABS_REWARD: f64 = 1e6;

    /// Why this verdict cannot be recorded, if it cannot.
    pub fn invalid(&self) -> Option<String> {
        let r = self.reward?;
        (!(r.is_finite() && r.abs() <= Self::MAX_ABS_REWARD)).then(|| {
            format!(
                "reward {r} is out of range (finite, at most {} in magnitude)",
                Self::MAX_ABS_REWARD
            )
        })
    }

    /// `details` as the text recorded in `VerifierResult.details`.
    pub fn details_text(&self) -> String {
        match &self.details {
            Value::String(s) => s.clone(),
            Value::Null => String::new(),
            other => other.to_string(),
        }
    }
}

/// The answer to `POST /sessions/{id}/finish`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Finished {
    pub session_id: String,
    /// `CallFinished` events this proxy recorded for the session.
    pub model_calls: i64,
    /// Tokens the model sampled in those calls.
    #[serde(default)]
    pub sampled_tokens: i64,
    /// The attempt was recorded as abandoned: run the rollout again.
    #[serde(default)]
    pub abandoned: bool,
    /// Requests with the session's key to routes the proxy does not have:
    /// what the harness probed for, in order (the first 16 routes).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub unrouted: Vec<Unrouted>,
}

/// Requests to one route the proxy does not have.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Unrouted {
    /// `METHOD /path` (no query).
    pub route: String,
    pub count: u32,
}

impl std::fmt::Display for Unrouted {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self.count {
            1 => write!(f, "{}", self.route),
            n => write!(f, "{} ({n}×)", self.route),
        }
    }
}

/// Every error of the session API: `{"error": "..."}` with a 4xx/5xx status.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ApiError {
    pub error: String,
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn a_new_session_reads_the_documented_json() {
        let s: NewSession = serde_json::from_value(json!({
            "run_id": "r", "rollout_id": "ro", "task_id": "t", "harness": "codex",
            "group_id": "g", "group_size": 4, "max_model_calls": 6
        }))
        .unwrap();
        assert_eq!(
            s,
            NewSession::new("ro", "t", "codex", "g")
                .in_run("r")
                .group_size(4)
                .max_model_calls(6)
        );
        // Optional fields are left out, not sent as null.
        let v = serde_json::to_value(NewSession::new("ro", "t", "h", "g")).unwrap();
        assert_eq!(
            v,
            json!({"rollout_id": "ro", "task_id": "t", "harness": "h", "group_id": "g"})
        );
        assert!(serde_json::from_value::<NewSession>(json!({"rollout_id": "x"})).is_err());
    }

    #[test]
    fn a_replay_request_is_an_id_or_the_original_request() {
        let by_id: ReplaySession = serde_json::from_value(json!({"replay_of": "s-1"})).unwrap();
        assert_eq!(
            by_id,
            ReplaySession::Of {
                replay_of: "s-1".into()
            }
        );
        let original: ReplaySession = serde_json::from_value(
            json!({"rollout_id": "ro", "task_id": "t", "harness": "h", "group_id": "g"}),
        )
        .unwrap();
        assert!(matches!(original, ReplaySession::Original(n) if n.rollout_id == "ro"));
    }

    #[test]
    fn verdict_details_are_text_or_json() {
        assert_eq!(Verdict::scored(1.0, "ok").details_text(), "ok");
        assert_eq!(Verdict::failed(Value::Null).details_text(), "");
        assert_eq!(
            Verdict::failed(json!({"status": "reward_missing"})).details_text(),
            r#"{"status":"reward_missing"}"#
        );
        let f: Finish = serde_json::from_value(json!({})).unwrap();
        assert_eq!(f, Finish::default());
    }
}
