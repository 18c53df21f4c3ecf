//! Fields an operator adds to every request the proxy sends the engine
//! (`--extra-body`, as the OpenAI SDK's `extra_body`): vLLM's
//! `structured_outputs`, `repetition_penalty`, `priority`, … The fields the
//! proxy owns are refused: the conversation, how it samples (the harness's
//! temperature, length, seed and stops, the rest neutral) and the ids and
//! logprobs it records. A field that changes how tokens are drawn (a
//! grammar, a penalty) changes the distribution the recorded logprobs come
//! from: vLLM with `--logprobs-mode processed_logprobs` reports those of
//! the constrained draw, which the learner's forward pass does not apply.

use serde_json::{Map, Value};
use std::str::FromStr;
use std::sync::Arc;

/// The fields the proxy sets itself.
const OWNED: &[&str] = &[
    "model",
    "messages",
    "prompt",
    "tools",
    "tool_choice",
    "n",
    "stream",
    "stream_options",
    "logprobs",
    "top_logprobs",
    "return_token_ids",
    "return_tokens_as_token_ids",
    "temperature",
    "top_p",
    "top_k",
    "min_p",
    "max_tokens",
    "max_completion_tokens",
    "seed",
    "stop",
    "presence_penalty",
    "frequency_penalty",
];

/// A JSON object whose fields go on every request to the engine; each call
/// records them (`CallFinished.chat_request`'s `extra_body`).
#[derive(Debug, Clone, Default, PartialEq)]
pub struct ExtraBody {
    fields: Map<String, Value>,
    /// The fields as JSON text, written once for every call's record.
    text: Arc<str>,
}

#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum ExtraBodyError {
    #[error("not JSON: {0}")]
    NotJson(String),
    #[error(
        "not a JSON object of fields, such as '{{\"structured_outputs\": {{\"regex\": \"...\"}}}}'"
    )]
    NotAnObject,
    #[error("`{0}` is the proxy's own field (it sets the conversation, how the engine samples, and the ids and logprobs it records)")]
    Owned(String),
}

impl ExtraBody {
    pub fn is_empty(&self) -> bool {
        self.fields.is_empty()
    }

    pub fn fields(&self) -> &Map<String, Value> {
        &self.fields
    }

    /// The fields as JSON text (`{}` when there are none).
    pub fn text(&self) -> &str {
        if self.fields.is_empty() {
            "{}"
        } else {
            &self.text
        }
    }
}

impl FromStr for ExtraBody {
    type Err = ExtraBodyError;

    fn from_str(s: &str) -> Result<ExtraBody, ExtraBodyError> {
        let value: Value =
            serde_json::from_str(s).map_err(|e| ExtraBodyError::NotJson(e.to_string()))?;
        let Value::Object(fields) = value else {
            return Err(ExtraBodyError::NotAnObject);
        };
        if let Some(owned) = fields.keys().find(|k| OWNED.contains(&k.as_str())) {
            return Err(ExtraBodyError::Owned(owned.clone()));
        }
        let text = Value::Object(fields.clone()).to_string().into();
        Ok(ExtraBody { fields, text })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_extra_body_is_an_object_of_fields_the_proxy_does_not_set() {
        let extra: ExtraBody = r#"{"structured_outputs": {"regex": "a|b"}, "priority": 2}"#
            .parse()
            .unwrap();
        assert_eq!(extra.fields().len(), 2);
        assert_eq!(
            extra.text(),
            r#"{"priority":2,"structured_outputs":{"regex":"a|b"}}"#
        );
        assert!(ExtraBody::default().is_empty());
        assert_eq!(ExtraBody::default().text(), "{}");

        let refused = |s: &str| s.parse::<ExtraBody>().unwrap_err().to_string();
        assert!(refused("{").starts_with("not JSON"));
        assert!(refused("[1]").contains("not a JSON object"));
        let owned = refused(r#"{"priority": 1, "top_p": 0.9}"#);
        assert!(
            owned.starts_with("`top_p` is the proxy's own field"),
            "{owned}"
        );
        assert!(refused(r#"{"messages": []}"#).contains("`messages`"));
    }
}
