//! Token in, token out: the proxy renders the prompt itself (splicing a
//! session's follow-up calls onto the ids the model sampled, see
//! [`forgelog_dialects::splice`]) and asks the engine with token ids
//! (`POST /v1/completions`, vLLM's and forgelog's engine's). The answer is
//! read as a chat completion: the proxy parses the tool calls in the text.

use super::answer::{token_id_of, ChoiceTokens, TokenLogprob, UpstreamAnswer};
use super::{UpstreamClient, UpstreamError};
use forgelog_dialects::splice::ChatRenderer;
use serde::{Deserialize, Serialize};
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

/// `POST /v1/completions` with `prompt` as token ids, sampled as the chat
/// request says (with the operator's `--extra-body` fields), asking for the
/// sampled tokens' logprobs with each token named by its id (`token_id:N`).
/// Not vLLM's `return_token_ids`: that also echoes every prompt id, which the
/// proxy sent itself and would read back on every call. Serialized as it
/// stands: a long prompt's ids are written straight from the slice.
#[derive(Debug, Serialize)]
pub struct CompletionRequest<'a> {
    #[serde(flatten)]
    sampling: Map<String, Value>,
    prompt: &'a [u32],
    logprobs: u32,
    return_tokens_as_token_ids: bool,
    stream: bool,
}

/// The completion request for `prompt`, sampled as `chat` (the chat request
/// the call would otherwise send) says. With no `max_tokens` it may fill the
/// `context` (as a chat completion may): vLLM's completions stop at 16
/// tokens otherwise.
pub fn completion_request<'a>(
    prompt: &'a [u32],
    chat: &Value,
    context: Option<i64>,
    extra: &super::ExtraBody,
) -> CompletionRequest<'a> {
    let mut sampling: Map<String, Value> = SAMPLING_FIELDS
        .iter()
        .filter_map(|&k| Some((k.to_string(), chat.get(k)?.clone())))
        .filter(|(_, v)| !v.is_null())
        .collect();
    sampling.extend(extra.fields().clone());
    if let (false, Some(context)) = (sampling.contains_key("max_tokens"), context) {
        let room = context - prompt.len() as i64;
        if room > 0 {
            sampling.insert("max_tokens".into(), json!(room));
        }
    }
    CompletionRequest {
        sampling,
        prompt,
        logprobs: 0,
        return_tokens_as_token_ids: true,
        stream: false,
    }
}

/// A completion answer: its first choice typed, the rest as JSON. The
/// prompt's ids an engine echoes anyway (on the body, or on the choice as
/// vLLM writes them with `return_token_ids`) are skipped unread: the proxy
/// sent them.
#[derive(Debug, Default)]
struct Completion {
    body: Map<String, Value>,
    choice: Option<CompletionChoice>,
}

#[derive(Debug, Default, Deserialize)]
struct CompletionChoice {
    #[serde(default)]
    text: Option<String>,
    #[serde(default)]
    finish_reason: Value,
    #[serde(default)]
    token_ids: Option<Vec<u32>>,
    #[serde(default)]
    logprobs: Option<LegacyLogprobs>,
}

/// Legacy completions' logprobs: lists with an entry per sampled token.
#[derive(Debug, Default, Deserialize)]
struct LegacyLogprobs {
    #[serde(default)]
    token_logprobs: Option<Vec<Option<f64>>>,
    /// The tokens, named `token_id:N` as asked; read loosely (an engine's
    /// other names cost the call its ids, never its answer).
    #[serde(default)]
    tokens: Value,
}

impl<'de> Deserialize<'de> for Completion {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct Visitor;
        impl<'de> serde::de::Visitor<'de> for Visitor {
            type Value = Completion;
            fn expecting(&self, f: &mut std::fmt::Formatter) -> std::fmt::Result {
                f.write_str("a completion object")
            }
            fn visit_map<A: serde::de::MapAccess<'de>>(
                self,
                mut map: A,
            ) -> Result<Completion, A::Error> {
                let mut out = Completion::default();
                while let Some(key) = map.next_key::<String>()? {
                    match key.as_str() {
                        "prompt_token_ids" => {
                            map.next_value::<serde::de::IgnoredAny>()?;
                        }
                        "choices" => {
                            let choices: Vec<CompletionChoice> = map.next_value()?;
                            out.choice = choices.into_iter().next();
                        }
                        _ => {
                            out.body.insert(key, map.next_value()?);
                        }
                    }
                }
                Ok(out)
            }
        }
        d.deserialize_map(Visitor)
    }
}

/// A completion answer to `prompt` as the chat completion it stands for: the
/// choice's text becomes the assistant message, its `token_ids` (or else its
/// tokens' names) and `token_logprobs` the sampled tokens, `prompt` the
/// prompt's ids, unless the engine counts another number of prompt tokens
/// (then it did not sample from exactly these, and the call is not
/// trainable).
pub fn read_completion(text: &[u8], prompt: &[u32]) -> serde_json::Result<UpstreamAnswer> {
    let Completion { mut body, choice } = serde_json::from_slice(text)?;
    let choice = choice.unwrap_or_default();
    let counted = body
        .get("usage")
        .and_then(|u| u.get("prompt_tokens"))
        .and_then(Value::as_u64);
    let prompt_token_ids =
        (counted.is_none_or(|n| n == prompt.len() as u64)).then(|| prompt.to_vec());
    let LegacyLogprobs {
        token_logprobs,
        tokens,
    } = choice.logprobs.unwrap_or_default();
    // Every token named by its id, or none taken from the names.
    let named: Option<Vec<u32>> = tokens
        .as_array()
        .and_then(|t| t.iter().map(|n| n.as_str().and_then(token_id_of)).collect());
    let token_ids = choice.token_ids.or(named);
    let logprobs = token_logprobs.map(|l| {
        l.into_iter()
            .map(|v| TokenLogprob {
                logprob: v.unwrap_or(f64::NAN),
                token_id: None,
            })
            .collect()
    });
    let message = json!({"role": "assistant", "content": choice.text});
    body.insert(
        "choices".into(),
        json!([{"index": 0, "message": message, "finish_reason": choice.finish_reason}]),
    );
    Ok(UpstreamAnswer {
        body: Value::Object(body),
        prompt_token_ids,
        first_choice: ChoiceTokens {
            token_ids,
            logprobs,
        },
    })
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
                 first difference at token {at} (proxy {:?}, engine {:?}; {} vs {} tokens); does the engine serve \
                 the model the proxy renders for? (`--tokenizer none`: the engine renders)",
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
    pub async fn complete_tokens(
        &self,
        body: &CompletionRequest<'_>,
    ) -> Result<UpstreamAnswer, UpstreamError> {
        // Sized for the ids at once (up to 6 digits and a comma each): grown
        // by doubling, a long prompt's request was copied over and over.
        let mut text = Vec::with_capacity(7 * body.prompt.len() + 1024);
        serde_json::to_writer(&mut text, body).expect("a completion request serializes");
        self.post(
            self.urls.completions.clone(),
            text.into(),
            async |r: reqwest::Response| {
                let text = super::read_bytes(r).await?;
                read_completion(&text, body.prompt)
                    .map_err(|e| UpstreamError::NotJson(e.to_string()))
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
        // vLLM's shape: the prompt's ids echoed on the choice.
        let body = json!({
            "id": "cmpl-1", "object": "text_completion", "model": "m", "created": 5,
            "usage": {"prompt_tokens": 3, "completion_tokens": 2},
            "choices": [{"index": 0, "text": "hi", "finish_reason": "stop",
                "prompt_token_ids": [1, 2, 3], "token_ids": [7, 2],
                "logprobs": {"tokens": ["a", "b"], "token_logprobs": [-0.5, null], "top_logprobs": null}}],
        });
        let answer = read_completion(body.to_string().as_bytes(), &[1, 2, 3]).unwrap();
        assert_eq!(answer.prompt_token_ids, Some(vec![1, 2, 3]));
        assert_eq!(answer.first_choice.token_ids, Some(vec![7, 2]));
        let logprobs: Vec<f64> = answer
            .first_choice
            .logprobs
            .unwrap()
            .iter()
            .map(|l| l.logprob)
            .collect();
        assert_eq!(logprobs[0], -0.5);
        assert!(logprobs[1].is_nan(), "a null logprob is no number");
        assert_eq!(answer.body["choices"][0]["message"]["content"], "hi");
        assert_eq!(answer.body["choices"][0]["finish_reason"], "stop");
        assert_eq!(answer.body["usage"]["completion_tokens"], 2);
        assert!(answer.body.get("prompt_token_ids").is_none());
        // forgelog's engine: the prompt's ids on the body.
        let body = json!({"prompt_token_ids": [4], "choices": [{"text": "", "token_ids": [2],
            "logprobs": {"token_logprobs": [-1.0]}, "finish_reason": "stop"}]});
        let answer = read_completion(body.to_string().as_bytes(), &[4]).unwrap();
        assert_eq!(answer.prompt_token_ids, Some(vec![4]));
        assert!(answer.body.get("prompt_token_ids").is_none());
        // Asked as now: no prompt echoed, the sampled ids in the tokens' names.
        let body = json!({"usage": {"prompt_tokens": 2, "completion_tokens": 2},
            "choices": [{"text": "hi", "logprobs": {"tokens": ["token_id:7", "token_id:2"],
                "token_logprobs": [-0.5, -0.25]}}]});
        let answer = read_completion(body.to_string().as_bytes(), &[1, 2]).unwrap();
        assert_eq!(answer.prompt_token_ids, Some(vec![1, 2]));
        assert_eq!(answer.first_choice.token_ids, Some(vec![7, 2]));
        // A token not named by its id: no ids from the names at all, and
        // the answer read all the same.
        for tokens in [
            json!(["token_id:7", "i"]),
            json!(["token_id:7", null]),
            json!({"a": 1}),
        ] {
            let body = json!({"choices": [{"text": "hi", "logprobs": {"tokens": tokens,
                "token_logprobs": [-0.5, -0.25]}}]});
            let answer = read_completion(body.to_string().as_bytes(), &[1]).unwrap();
            assert_eq!(answer.first_choice.token_ids, None, "{tokens}");
            assert_eq!(answer.body["choices"][0]["message"]["content"], "hi");
        }
        // An engine that counts other prompt tokens did not sample from these.
        let body = json!({"usage": {"prompt_tokens": 5}, "choices": [{"text": "x"}]});
        let answer = read_completion(body.to_string().as_bytes(), &[4]).unwrap();
        assert_eq!(answer.prompt_token_ids, None);
        assert!(read_completion(b"[1]", &[4]).is_err());
    }

    #[test]
    fn a_completion_request_keeps_the_sampling_not_the_conversation() {
        let chat = json!({"model": "m", "messages": [{"role": "user", "content": "x"}],
            "tools": [], "temperature": 0.5, "max_tokens": 9, "stop": ["\n"], "logprobs": true,
            "top_logprobs": 0, "stream": false});
        let none = crate::upstream::ExtraBody::default();
        let body =
            serde_json::to_value(completion_request(&[5, 6], &chat, Some(100), &none)).unwrap();
        assert_eq!(
            body,
            json!({"model": "m", "prompt": [5, 6], "temperature": 0.5, "max_tokens": 9,
                "stop": ["\n"], "logprobs": 0, "return_tokens_as_token_ids": true, "stream": false})
        );
        // No max_tokens: the rest of the context, not the engine's default.
        let open = json!({"model": "m", "max_tokens": null});
        let sent = |context| {
            serde_json::to_value(completion_request(&[5, 6], &open, context, &none)).unwrap()
        };
        assert_eq!(sent(Some(100))["max_tokens"], 98);
        assert!(sent(None).get("max_tokens").is_none());
        // The operator's fields go along; the conversation still does not.
        let extra = r#"{"structured_outputs": {"regex": "a"}}"#.parse().unwrap();
        let body = serde_json::to_value(completion_request(&[5], &chat, None, &extra)).unwrap();
        assert_eq!(body["structured_outputs"], json!({"regex": "a"}));
        assert_eq!(body["temperature"], 0.5);
        assert!(body.get("messages").is_none());
    }
}
