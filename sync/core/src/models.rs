//! An engine's `GET /v1/models` answer, typed: the one reading of it for the
//! proxy's probe, the sync's read-back and the check that an engine follows
//! the policy versions.

use serde::Deserialize;
use serde_json::Value;

/// What an OpenAI-compatible engine lists: the models it serves, the one it
/// serves by default first; forgelog's engine also names the policy version
/// it serves (at the top and per model).
#[derive(Debug, Clone, Default, PartialEq, Deserialize)]
pub struct ModelList {
    #[serde(default)]
    pub data: Vec<ModelCard>,
    #[serde(default)]
    pub policy_version: Option<u64>,
}

/// One model an engine lists.
#[derive(Debug, Clone, Default, PartialEq, Deserialize)]
pub struct ModelCard {
    pub id: String,
    /// Prompt plus completion tokens at most, where the engine says it
    /// (vLLM's `max_model_len`).
    #[serde(default)]
    pub max_model_len: Option<i64>,
    #[serde(default)]
    pub policy_version: Option<u64>,
}

impl ModelList {
    /// `answer` read as a model list; `None` when it is not one.
    pub fn of(answer: &Value) -> Option<ModelList> {
        ModelList::deserialize(answer).ok()
    }

    /// The model the engine serves by default: the first it lists.
    pub fn served(&self) -> Option<&ModelCard> {
        self.data.first()
    }

    /// The policy version the engine says it serves, where it says one.
    pub fn policy_version(&self) -> Option<u64> {
        self.policy_version
            .or_else(|| self.served()?.policy_version)
    }

    /// The policy versions it lists as adapters (`policy@N`), in its order.
    pub fn adapters(&self) -> impl Iterator<Item = u64> + '_ {
        self.data
            .iter()
            .filter_map(|m| m.id.strip_prefix("policy@")?.parse().ok())
    }

    /// The newest version it lists as an adapter: what a call asks for to be
    /// sampled by the newest policy it serves.
    pub fn newest_adapter(&self) -> Option<u64> {
        self.adapters().max()
    }

    /// The adapters that leave the engine once `version` is served: those
    /// more than `window` versions older, which a staleness window of
    /// `window` no longer admits. Read from the engine, not remembered: a
    /// restarted sync retires what an earlier one left.
    pub fn stale_adapters(&self, version: u64, window: u64) -> Vec<u64> {
        let mut stale: Vec<u64> = self.adapters().filter(|v| v + window < version).collect();
        stale.sort_unstable();
        stale
    }
}
