//! Rust types for the events in `avro/*.avsc`. Field order and names match the
//! schemas exactly (the serializer walks the schema); enum variant order matches
//! the Avro symbols. Per-token arrays are packed, see [`crate::packed`].

use crate::compact::Splice;
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;

/// The API dialect a harness spoke to the proxy.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Dialect {
    OpenaiChat,
    OpenaiResponses,
    AnthropicMessages,
    Gemini,
    /// A symbol this reader does not know (written by a newer schema).
    Unknown,
}

impl Dialect {
    /// The snake_case name the events use (and metrics label with).
    pub fn name(self) -> &'static str {
        match self {
            Dialect::OpenaiChat => "openai_chat",
            Dialect::OpenaiResponses => "openai_responses",
            Dialect::AnthropicMessages => "anthropic_messages",
            Dialect::Gemini => "gemini",
            Dialect::Unknown => "unknown",
        }
    }
}

/// How a call ended, from the harness's point of view.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum CallStatus {
    Ok,
    /// The harness sent something the proxy refused (4xx in its dialect).
    ClientError,
    /// The inference engine failed or timed out (5xx in the harness's dialect).
    UpstreamError,
    /// The session's call budget was spent; the proxy answered with a final message.
    BudgetStop,
    Unknown,
}

impl CallStatus {
    /// The snake_case name the events use (and metrics label with).
    pub fn name(self) -> &'static str {
        match self {
            CallStatus::Ok => "ok",
            CallStatus::ClientError => "client_error",
            CallStatus::UpstreamError => "upstream_error",
            CallStatus::BudgetStop => "budget_stop",
            CallStatus::Unknown => "unknown",
        }
    }
}

/// Sampling parameters, as the harness asked for them or as the proxy sent them upstream.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct SamplingParams {
    pub temperature: Option<f64>,
    pub top_p: Option<f64>,
    pub top_k: Option<i64>,
    pub min_p: Option<f64>,
    pub max_tokens: Option<i64>,
    pub seed: Option<i64>,
    pub presence_penalty: Option<f64>,
    pub frequency_penalty: Option<f64>,
    #[serde(default)]
    pub stop: Vec<String>,
}

#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Usage {
    pub prompt_tokens: i64,
    pub completion_tokens: i64,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct CallStarted {
    pub run_id: String,
    pub event_id: String,
    pub session_id: String,
    pub rollout_id: String,
    pub call_index: i64,
    pub dialect: Dialect,
    pub harness: String,
    pub path: String,
    #[serde(with = "crate::packed")]
    pub raw_request: Vec<u8>,
    /// Set when `raw_request` holds only what is new since an earlier call of
    /// the session (v5): [`crate::compact::expand_started`] makes it whole.
    #[serde(default)]
    pub raw_request_splice: Option<Splice>,
    pub received_at_ms: i64,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct CallFinished {
    pub run_id: String,
    pub event_id: String,
    pub session_id: String,
    pub rollout_id: String,
    pub call_index: i64,
    pub status: CallStatus,
    pub error: Option<String>,
    pub model: String,
    #[serde(with = "crate::packed")]
    pub prompt_token_ids: Vec<u32>,
    /// Set when `prompt_token_ids` holds only what is new since an earlier call
    /// of the session (v5): [`crate::compact::expand_finished`] makes it whole.
    #[serde(default)]
    pub prompt_splice: Option<Splice>,
    #[serde(with = "crate::packed")]
    pub completion_token_ids: Vec<u32>,
    /// Sampling-time logprob of each completion token (after temperature).
    #[serde(with = "crate::packed")]
    pub completion_logprobs: Vec<f32>,
    pub finish_reason: Option<String>,
    pub sampling_requested: SamplingParams,
    pub sampling_sent: SamplingParams,
    pub policy_version: Option<i64>,
    pub usage: Usage,
    pub trainable: bool,
    pub untrainable_reason: Option<String>,
    /// The body the harness received (before any SSE framing).
    #[serde(with = "crate::packed")]
    pub response_body: Vec<u8>,
    /// The request in OpenAI Chat form, whatever the dialect: `{"messages": [...], "tools": [...]}`
    /// (empty when unknown), then `"extra_body": {...}` where the proxy's
    /// operator added fields to the engine's requests. What SFT export writes.
    #[serde(default)]
    pub chat_request: String,
    /// The same for `chat_request` (in bytes, on character boundaries).
    #[serde(default)]
    pub chat_request_splice: Option<Splice>,
    /// The assistant message in OpenAI Chat form (empty when unknown).
    #[serde(default)]
    pub chat_response: String,
    pub latency_ms: i64,
    pub finished_at_ms: i64,
    /// `<tool_call>` texts in the completion the proxy could not parse, passed on
    /// as text (schema v2; 0 in events written by v1).
    #[serde(default)]
    pub unparsed_tool_calls: i64,
    /// How the proxy made the prompt's ids (schema v6); `None`: the engine
    /// rendered the chat itself, as every call before v6.
    #[serde(default)]
    pub prompt_made: Option<PromptMade>,
    /// Set when the log refused the call's own event and holds this record in
    /// its place (v7): why. See [`CallFinished::stand_in_for`].
    #[serde(default)]
    pub stand_in: Option<String>,
}

/// The prompt of a call the proxy asked the engine with token ids.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct PromptMade {
    /// The call of the session whose prompt and sampled ids this prompt
    /// starts with; `None`: the chat template over the whole request.
    #[serde(default)]
    pub spliced_from: Option<i64>,
    /// Why it was rendered afresh (the first call, an edited history, …).
    #[serde(default)]
    pub why_rendered: Option<String>,
    pub tokenizer_sha256: String,
    pub chat_template_sha256: String,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct RolloutStarted {
    pub run_id: String,
    pub event_id: String,
    pub rollout_id: String,
    pub session_id: String,
    pub task_id: String,
    pub harness: String,
    pub group_id: String,
    /// How many rollouts the group will have: the reward join waits for all of them.
    pub group_size: i64,
    pub policy_version: Option<i64>,
    pub started_at_ms: i64,
    /// The session's budget of model calls and cap on `max_tokens` (what a
    /// restarted proxy keeps enforcing). `None`: none, or before v4.
    #[serde(default)]
    pub max_model_calls: Option<i64>,
    #[serde(default)]
    pub max_tokens: Option<i64>,
    /// SHA-256 (hex) of the session's API key, never the key itself: what a
    /// restarted proxy matches a harness's key against. `None` before v4.
    #[serde(default)]
    pub api_key_sha256: Option<String>,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct RolloutFinished {
    pub run_id: String,
    pub event_id: String,
    pub rollout_id: String,
    pub session_id: String,
    pub exit_status: Option<i64>,
    pub model_calls: i64,
    pub started_at_ms: i64,
    pub finished_at_ms: i64,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct VerifierResult {
    pub run_id: String,
    pub event_id: String,
    pub rollout_id: String,
    /// The verifier ran. When false, `reward` is `None`: never score a missing verdict as 0.
    pub ok: bool,
    pub reward: Option<f64>,
    #[serde(default)]
    pub details: String,
    /// The attempt was given up and its rollout runs again under a new id
    /// (it never reached the model, or its orchestrator died): it is no
    /// member of its group. Never set on a verdict that scored.
    #[serde(default)]
    pub abandoned: bool,
}

/// Policy version stored per token when the producing call did not report one.
pub const UNKNOWN_POLICY_VERSION: u32 = u32::MAX;

/// One root-to-leaf path of a trajectory tree: a training sequence.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Sequence {
    /// Index of the tree root this path starts at (sub-agents and compactions start new roots).
    pub root: i64,
    /// The calls along the path, in order.
    pub call_indices: Vec<i64>,
    /// A retried branch that the session abandoned.
    pub discarded: bool,
    #[serde(with = "crate::packed")]
    pub token_ids: Vec<u32>,
    /// 1 for tokens the model sampled, 0 for everything the harness or tools wrote.
    #[serde(with = "crate::packed")]
    pub loss_mask: Vec<u8>,
    /// Sampling-time logprob per token; 0 where the mask is 0.
    #[serde(with = "crate::packed")]
    pub sampling_logprobs: Vec<f32>,
    /// Policy version per token; [`UNKNOWN_POLICY_VERSION`] where unknown or mask 0.
    #[serde(with = "crate::packed")]
    pub policy_versions: Vec<u32>,
    #[serde(default)]
    pub tool_calls: i64,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum FindingKind {
    /// A later prompt re-tokenized earlier sampled tokens differently.
    Drift,
    /// The call was recorded `trainable=false`; it is context only.
    NotTrainable,
    /// Token ids and logprobs disagree in length, or usage disagrees with them.
    InconsistentTokens,
    /// The call failed; it contributes nothing.
    FailedCall,
    Unknown,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Finding {
    pub kind: FindingKind,
    pub call_index: i64,
    pub detail: String,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct TrajectoryBuilt {
    pub run_id: String,
    pub event_id: String,
    pub rollout_id: String,
    pub session_id: String,
    pub task_id: String,
    pub group_id: String,
    pub harness: String,
    pub calls: i64,
    /// Calls outside discarded branches that ended in tool calls.
    #[serde(default)]
    pub tool_calls: i64,
    pub sequences: Vec<Sequence>,
    #[serde(default)]
    pub findings: Vec<Finding>,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct GroupMember {
    pub rollout_id: String,
    pub harness: String,
    /// `None` when the verifier did not run: such a member is out of the baseline and the loss.
    pub reward: Option<f64>,
    pub advantage: Option<f64>,
    pub sequences: Vec<Sequence>,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct TrainingBatch {
    pub run_id: String,
    pub event_id: String,
    pub group_id: String,
    pub task_id: String,
    /// Every scored member got the same reward: the group carries no learning signal.
    pub no_reward_variance: bool,
    pub members: Vec<GroupMember>,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct PolicyPublished {
    pub run_id: String,
    pub event_id: String,
    pub version: i64,
    pub step: i64,
    pub checkpoint_uri: String,
    #[serde(default)]
    pub metrics: BTreeMap<String, f64>,
}

/// A message a consumer could not read as a forgelog event: set aside here
/// with the reason (never skipped silently), byte for byte. Its id is
/// deterministic in (consumer, topic, partition, offset).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct DeadLetter {
    /// Empty: an unreadable message names no run.
    pub run_id: String,
    pub event_id: String,
    pub consumer: String,
    pub topic: String,
    pub partition: i32,
    pub offset: i64,
    #[serde(with = "crate::packed")]
    pub key: Vec<u8>,
    #[serde(with = "crate::packed")]
    pub value: Vec<u8>,
    pub reason: String,
}

#[cfg(test)]
mod names {
    use super::*;

    /// Metric labels and the events spell dialects and statuses alike.
    #[test]
    fn names_are_the_serialized_ones() {
        for d in [
            Dialect::OpenaiChat,
            Dialect::OpenaiResponses,
            Dialect::AnthropicMessages,
            Dialect::Gemini,
            Dialect::Unknown,
        ] {
            assert_eq!(serde_json::to_value(d).unwrap(), d.name());
        }
        for s in [
            CallStatus::Ok,
            CallStatus::ClientError,
            CallStatus::UpstreamError,
            CallStatus::BudgetStop,
            CallStatus::Unknown,
        ] {
            assert_eq!(serde_json::to_value(s).unwrap(), s.name());
        }
    }
}

/// A call's conversation in OpenAI Chat form, parsed from `chat_request` and
/// `chat_response`: what every reader of the chat view (exports, the viewer)
/// starts from.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct ChatView {
    pub messages: Vec<serde_json::Value>,
    /// Empty when the call offered none.
    pub tools: Vec<serde_json::Value>,
    /// The assistant message; `None` when unknown.
    pub answer: Option<serde_json::Value>,
}

impl CallFinished {
    /// Slims the call to what training needs, after the log refused it as it
    /// was (`note` says why, in `error`): without the bodies the harness saw
    /// and the chat form (so not replayable or exportable as SFT), keeping its
    /// tokens and logprobs.
    pub fn without_bodies(&mut self, note: &str) {
        self.response_body = Vec::new();
        self.chat_request = String::new();
        self.chat_request_splice = None;
        self.chat_response = String::new();
        let note = format!("{note}; recorded without its response and chat-form bodies");
        self.error = Some(match self.error.take() {
            Some(e) => format!("{e}; {note}"),
            None => note,
        });
    }

    /// What the log holds in place of this call's event once a broker
    /// refused that for good (`reason`): the call without its bodies, its
    /// tokens kept as context (not trained: the log lacks the call's whole
    /// record), marked [`CallFinished::stand_in`]. Its rollout
    /// still counts every call it made, so its trajectory and group are built.
    pub fn stand_in_for(mut self, reason: &str) -> CallFinished {
        let why = format!("the log refused this call's event: {reason}");
        self.without_bodies(&why);
        self.trainable = false;
        self.untrainable_reason = Some(why);
        self.stand_in = Some(reason.to_string());
        self
    }

    /// The call's chat view; `None` when it has none (an unparsable or
    /// empty `chat_request`: a call recorded without its bodies).
    pub fn chat_view(&self) -> Option<ChatView> {
        let request: serde_json::Value = serde_json::from_str(&self.chat_request).ok()?;
        let list = |key: &str| {
            request
                .get(key)
                .and_then(serde_json::Value::as_array)
                .cloned()
        };
        Some(ChatView {
            messages: list("messages")?,
            tools: list("tools").unwrap_or_default(),
            answer: serde_json::from_str::<serde_json::Value>(&self.chat_response)
                .ok()
                .filter(serde_json::Value::is_object),
        })
    }
}
