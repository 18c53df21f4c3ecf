//! Token in, token out: the proxy renders the prompt itself (splicing a
//! session's follow-up calls onto the ids the model sampled, see
//! [`forgelog_dialects::splice`]) and asks the engine with token ids
//! (`POST /v1/completions`, vLLM's and forgelog's engine's). The answer is
//! read as a chat completion: the proxy parses the tool calls in the text.

use super::answer::{ChoiceTokens, TokenLogprob, UpstreamAnswer};
use super::{UpstreamClient, UpstreamError};
use forgelog_dialects::splice::ChatRenderer;
use serde_json::{json, Map, Value};
use std::sync::Arc;

/// The model's tokenizer and chat template, and what the log calls them.
#[derive(Clone)]
pub struct TokenIn {
    pub renderer: Arc<dyn ChatRenderer + Send + Sync>,
    pub tokenizer_sha256: String,
    pub chat_template_sha256: String,
}

impl std::fmt::Debug for TokenIn {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("TokenIn")
            .field("tokenizer_sha256", &self.tokenizer_sha256)
            .field("chat_template_sha256", &self.chat_template_sha256)
            .finish()
    }
}

/// The fields of a chat request that a token-id completion request keeps:
/// the model and how to sample (the conversation is the prompt's ids now).
const SAMPLING_FIELDS: &[&str] = &[
    "model",
    "max_tokens",
    "temperature",
    "top_p",
    "top_k",
    "min_p",
    "seed",
    "stop",
    "presence_penalty",
    "frequency_penalty",
];

/// `POST /v1/completions` with `prompt` as token ids, sampled as `chat` (the
/// chat request the call would otherwise send) says, asking for the sampled
/// ids and their logprobs. With no `max_tokens` it may fill the `context`
/// (as a chat completion may): vLLM's completions stop at 16 tokens otherwise.
pub fn completion_request(prompt: &[u32], chat: &Value, context: Option<i64>) -> Value {
    let mut body: Map<String, Value> = SAMPLING_FIELDS
        .iter()
        .filter_map(|&k| Some((k.to_string(), chat.get(k)?.clone())))
        .filter(|(_, v)| !v.is_null())
        .collect();
    if let (false, Some(context)) = (body.contains_key("max_tokens"), context) {
        let room = context - prompt.len() as i64;
        if room > 0 {
            body.insert("max_tokens".into(), json!(room));
        }
    }
    body.insert("prompt".into(), json!(prompt));
    body.insert("logprobs".into(), json!(0));
    body.insert("return_token_ids".into(), json!(true));
    body.insert("stream".into(), json!(false));
    Value::Object(body)
}

/// A completion answer as the chat completion it stands for: the choice's
/// text becomes the assistant message, its `token_ids` and `logprobs`
/// (`token_logprobs`) the sampled tokens; the prompt's ids come from the body
/// or, as vLLM answers, the choice.
pub fn as_chat_answer(mut body: Value) -> UpstreamAnswer {
    let mut choice = body
        .get_mut("choices")
        .and_then(|c| c.get_mut(0))
        .map(Value::take)
        .unwrap_or(Value::Null);
    let token_ids = choice.get("token_ids").and_then(super::answer::ids_of);
    let logprobs = choice["logprobs"]["token_logprobs"].as_array().map(|l| {
        l.iter()
            .map(|v| TokenLogprob {
                logprob: v.as_f64().unwrap_or(f64::NAN),
                token_id: None,
            })
            .collect()
    });
    let prompt_token_ids = body
        .get("prompt_token_ids")
        .filter(|v| !v.is_null())
        .or_else(|| choice.get("prompt_token_ids"))
        .and_then(super::answer::ids_of);
    let text = choice["text"].take();
    let message = json!({"role": "assistant", "content": text});
    let finish = choice["finish_reason"].take();
    if let Some(fields) = body.as_object_mut() {
        fields.remove("prompt_token_ids");
        fields.insert(
            "choices".into(),
            json!([{"index": 0, "message": message, "finish_reason": finish}]),
        );
    }
    UpstreamAnswer {
        body,
        prompt_token_ids,
        first_choice: ChoiceTokens {
            token_ids,
            logprobs,
        },
    }
}

/// The conversation the start-up check renders: a system prompt, two user
/// turns and the answer between them.
fn probe_conversation() -> Vec<Value> {
    vec![
        json!({"role": "system", "content": "You are a careful assistant."}),
        json!({"role": "user", "content": "What is 6 times 7?"}),
        json!({"role": "assistant", "content": "6 times 7 is 42."}),
        json!({"role": "user", "content": "And 8 plus 5?"}),
    ]
}

/// Checks that the proxy renders a conversation to the ids the engine's own
/// `POST /tokenize` gives for it: otherwise the proxy's prompts would not be
/// what the engine's chat route would have sampled from. The error names the
/// first differing token.
pub async fn check_rendering(client: &UpstreamClient, token_in: &TokenIn) -> Result<(), String> {
    let messages = probe_conversation();
    let renderer = &token_in.renderer;
    let ours = renderer
        .render(&messages, None, true)
        .and_then(|text| renderer.encode(&text))?;
    let body = json!({"messages": messages, "add_generation_prompt": true});
    let theirs =
        match client.tokenize_ids(&body).await {
            Ok(Some(ids)) => ids,
            Ok(None) => return Err(
                "the engine gave no token ids from POST /tokenize to check the rendering against"
                    .into(),
            ),
            Err(e) => return Err(format!("the engine's POST /tokenize failed: {e}")),
        };
    match ours.iter().zip(&theirs).position(|(a, b)| a != b) {
        None if ours.len() == theirs.len() => Ok(()),
        at => {
            let at = at.unwrap_or(ours.len().min(theirs.len()));
            Err(format!(
                "the proxy's chat template and tokenizer render a probe conversation otherwise than the engine: \
                 first difference at token {at} (proxy {:?}, engine {:?}; {} vs {} tokens)",
                ours.get(at),
                theirs.get(at),
                ours.len(),
                theirs.len()
            ))
        }
    }
}

impl UpstreamClient {
    /// One completion of a token-id prompt, read as a chat completion.
    pub async fn complete_tokens(&self, body: &Value) -> Result<UpstreamAnswer, UpstreamError> {
        let text = serde_json::to_vec(body).expect("a Value serializes").into();
        self.post(
            self.urls.completions.clone(),
            text,
            async |r: reqwest::Response| {
                let body: Value = super::read_json(r).await?;
                Ok(as_chat_answer(body))
            },
        )
        .await
    }

    /// vLLM's `POST /tokenize` of a chat: the prompt's ids. `None` when the
    /// upstream has no such route.
    pub async fn tokenize_ids(&self, body: &Value) -> Result<Option<Vec<u32>>, UpstreamError> {
        Ok(self
            .tokenize_answer(body)
            .await?
            .and_then(|a| a.get("tokens").and_then(super::answer::ids_of)))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_completion_reads_as_the_chat_completion_it_stands_for() {
        // vLLM's shape: the prompt's ids on the choice.
        let body = json!({
            "id": "cmpl-1", "object": "text_completion", "model": "m", "created": 5,
            "usage": {"prompt_tokens": 3, "completion_tokens": 2},
            "choices": [{"index": 0, "text": "hi", "finish_reason": "stop",
                "prompt_token_ids": [1, 2, 3], "token_ids": [7, 2],
                "logprobs": {"tokens": ["a", "b"], "token_logprobs": [-0.5, -0.25], "top_logprobs": null}}],
        });
        let answer = as_chat_answer(body);
        assert_eq!(answer.prompt_token_ids, Some(vec![1, 2, 3]));
        assert_eq!(answer.first_choice.token_ids, Some(vec![7, 2]));
        let logprobs: Vec<f64> = answer
            .first_choice
            .logprobs
            .unwrap()
            .iter()
            .map(|l| l.logprob)
            .collect();
        assert_eq!(logprobs, vec![-0.5, -0.25]);
        assert_eq!(answer.body["choices"][0]["message"]["content"], "hi");
        assert_eq!(answer.body["choices"][0]["finish_reason"], "stop");
        assert_eq!(answer.body["usage"]["completion_tokens"], 2);
        // forgelog's engine: the prompt's ids on the body.
        let body = json!({"prompt_token_ids": [4], "choices": [{"text": "", "token_ids": [2],
            "logprobs": {"token_logprobs": [-1.0]}, "finish_reason": "stop"}]});
        assert_eq!(as_chat_answer(body).prompt_token_ids, Some(vec![4]));
    }

    #[test]
    fn a_completion_request_keeps_the_sampling_not_the_conversation() {
        let chat = json!({"model": "m", "messages": [{"role": "user", "content": "x"}],
            "tools": [], "temperature": 0.5, "max_tokens": 9, "stop": ["\n"], "logprobs": true,
            "top_logprobs": 0, "stream": false});
        let body = completion_request(&[5, 6], &chat, Some(100));
        assert_eq!(
            body,
            json!({"model": "m", "prompt": [5, 6], "temperature": 0.5, "max_tokens": 9,
                "stop": ["\n"], "logprobs": 0, "return_token_ids": true, "stream": false})
        );
        // No max_tokens: the rest of the context, not the engine's default.
        let open = json!({"model": "m", "max_tokens": null});
        assert_eq!(
            completion_request(&[5, 6], &open, Some(100))["max_tokens"],
            98
        );
        assert!(completion_request(&[5, 6], &open, None)
            .get("max_tokens")
            .is_none());
    }
}
