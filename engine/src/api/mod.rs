//! The OpenAI/vLLM wire format: request fields, their validation into a
//! [`GenerationRequest`], response bodies and errors. No I/O.

use crate::grammar::{StructuredOutput, TokenGrammar, Vocabulary};
use crate::sampling::SamplerConfig;
use crate::scheduler::{Generation, GenerationRequest};
use forgelog_dialects::hermes;
use serde::Deserialize;
use serde_json::{json, Value};
use std::sync::Arc;

/// An error in OpenAI's shape: `{"error": {"message", "type", "code", "param"}}`.
#[derive(Debug, Clone, PartialEq)]
pub struct ApiError {
    pub status: u16,
    pub message: String,
    pub kind: &'static str,
    pub code: Option<&'static str>,
}

impl ApiError {
    pub fn invalid(message: impl Into<String>) -> ApiError {
        ApiError {
            status: 400,
            message: message.into(),
            kind: "invalid_request_error",
            code: None,
        }
    }

    pub fn internal(message: impl Into<String>) -> ApiError {
        ApiError {
            status: 500,
            message: message.into(),
            kind: "internal_error",
            code: None,
        }
    }

    pub fn body(&self) -> Value {
        json!({"error": {"message": self.message, "type": self.kind, "code": self.code, "param": null}})
    }
}

#[derive(Debug, Deserialize)]
#[serde(untagged)]
pub enum Stop {
    One(String),
    Many(Vec<String>),
}

/// `logprobs` is a flag in chat and a count in legacy completions.
#[derive(Debug, Deserialize)]
#[serde(untagged)]
pub enum LogprobsField {
    Flag(bool),
    Count(u32),
}

/// The sampling fields both endpoints share. Unknown fields are ignored, as
/// OpenAI clients send many.
#[derive(Debug, Default, Deserialize)]
pub struct SamplingFields {
    pub model: Option<String>,
    pub max_tokens: Option<u32>,
    pub max_completion_tokens: Option<u32>,
    pub temperature: Option<f32>,
    pub top_p: Option<f32>,
    pub top_k: Option<i64>,
    pub seed: Option<u64>,
    pub stop: Option<Stop>,
    pub logprobs: Option<LogprobsField>,
    pub top_logprobs: Option<u32>,
    pub return_token_ids: Option<bool>,
    pub stream: Option<bool>,
    pub n: Option<u32>,
    pub ignore_eos: Option<bool>,
    /// vLLM's constraint on the completion (`regex` or `choice` here).
    pub structured_outputs: Option<serde_json::Map<String, Value>>,
}

#[derive(Debug, Deserialize)]
pub struct ChatCompletionRequest {
    pub messages: Vec<Value>,
    pub tools: Option<Value>,
    #[serde(flatten)]
    pub fields: SamplingFields,
}

/// vLLM's `POST /tokenize`: a chat (rendered as `/v1/chat/completions`
/// renders it) or a prompt.
#[derive(Debug, Deserialize)]
#[serde(untagged)]
pub enum TokenizeRequest {
    Chat {
        messages: Vec<Value>,
        #[serde(default)]
        tools: Option<Value>,
    },
    Prompt {
        prompt: String,
    },
}

#[derive(Debug, Deserialize)]
#[serde(untagged)]
pub enum Prompt {
    Text(String),
    Tokens(Vec<u32>),
}

#[derive(Debug, Deserialize)]
pub struct CompletionRequest {
    pub prompt: Prompt,
    #[serde(flatten)]
    pub fields: SamplingFields,
}

/// Parses a JSON body, turning any failure into a 400.
pub fn parse<T: serde::de::DeserializeOwned>(body: &[u8]) -> Result<T, ApiError> {
    serde_json::from_slice(body)
        .map_err(|e| ApiError::invalid(format!("invalid request body: {e}")))
}

/// What the response should include besides the text.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Include {
    pub logprobs: bool,
    pub token_ids: bool,
}

/// Checks the fields against the prompt and the context and builds the
/// scheduler's request.
/// `vocabulary` is read only by a request with `structured_outputs`.
pub fn generation_request(
    fields: &SamplingFields,
    prompt: Vec<u32>,
    context: usize,
    vocabulary: impl FnOnce() -> Arc<Vocabulary>,
) -> Result<(GenerationRequest, Include), ApiError> {
    if fields.stream == Some(true) {
        return Err(ApiError::invalid(
            "stream: true is not supported by the forgelog engine; send stream: false",
        ));
    }
    if fields.n.is_some_and(|n| n != 1) {
        return Err(ApiError::invalid("only n = 1 is supported"));
    }
    if fields.top_logprobs.is_some_and(|n| n > 0) {
        return Err(ApiError::invalid(
            "top_logprobs > 0 is not supported; use top_logprobs: 0",
        ));
    }
    let temperature = fields.temperature.unwrap_or(1.0);
    if !(temperature.is_finite() && temperature >= 0.0) {
        return Err(ApiError::invalid("temperature must be a number >= 0"));
    }
    let top_p = fields.top_p.unwrap_or(1.0);
    if !(top_p > 0.0 && top_p <= 1.0) {
        return Err(ApiError::invalid("top_p must be in (0, 1]"));
    }
    let top_k = match fields.top_k {
        None | Some(-1) | Some(0) => None,
        Some(k) if k > 0 => Some(k as usize),
        Some(_) => return Err(ApiError::invalid("top_k must be -1, 0 or positive")),
    };
    if prompt.is_empty() {
        return Err(ApiError::invalid("the prompt is empty"));
    }
    let too_long = |requested: usize| {
        ApiError {
        status: 400,
        message: format!(
            "This model's maximum context length is {context} tokens. However, you requested {requested} tokens ({} in the messages, {} in the completion).",
            prompt.len(),
            requested - prompt.len()
        ),
        kind: "invalid_request_error",
        code: Some("context_length_exceeded"),
    }
    };
    if prompt.len() >= context {
        return Err(too_long(prompt.len()));
    }
    let max_tokens = match fields.max_completion_tokens.or(fields.max_tokens) {
        Some(0) => return Err(ApiError::invalid("max_tokens must be at least 1")),
        Some(n) if prompt.len() + n as usize > context => {
            return Err(too_long(prompt.len() + n as usize))
        }
        Some(n) => n as usize,
        None => context - prompt.len(),
    };
    let stop = match &fields.stop {
        None => Vec::new(),
        Some(Stop::One(s)) => vec![s.clone()],
        Some(Stop::Many(v)) => v.clone(),
    };
    let logprobs = match fields.logprobs {
        None | Some(LogprobsField::Flag(false)) => false,
        Some(_) => true,
    };
    let grammar = match &fields.structured_outputs {
        None => None,
        Some(constraint) => Some(
            StructuredOutput::from_fields(constraint)
                .and_then(|output| TokenGrammar::new(&output, vocabulary()))
                .map_err(|e| ApiError::invalid(e.to_string()))?,
        ),
    };
    let request = GenerationRequest {
        prompt,
        max_tokens,
        sampling: SamplerConfig {
            temperature,
            top_p,
            top_k,
            seed: fields.seed,
        },
        stop,
        ignore_eos: fields.ignore_eos.unwrap_or(false),
        grammar,
    };
    let include = Include {
        logprobs,
        token_ids: fields.return_token_ids.unwrap_or(false),
    };
    Ok((request, include))
}

/// vLLM's `--return-tokens-as-token-ids` spelling of a token.
pub fn token_name(id: u32) -> String {
    format!("token_id:{id}")
}

fn usage(prompt: &[u32], generation: &Generation) -> Value {
    json!({
        "prompt_tokens": prompt.len(),
        "completion_tokens": generation.tokens.len(),
        "total_tokens": prompt.len() + generation.tokens.len(),
    })
}

/// Identity of a response: id, creation time, model name.
pub struct Meta<'a> {
    pub id: String,
    pub created: u64,
    pub model: &'a str,
}

pub fn chat_response(
    meta: &Meta,
    prompt: &[u32],
    generation: &Generation,
    include: Include,
    parse_tools: bool,
) -> Value {
    let (content, tool_calls) = if parse_tools {
        let parsed = hermes::parse(&generation.text, &format!("call-{}-", meta.id));
        let calls: Vec<Value> = parsed
            .calls
            .into_iter()
            .map(|c| json!({"id": c.id, "type": "function", "function": {"name": c.name, "arguments": c.arguments}}))
            .collect();
        (parsed.text, calls)
    } else {
        (Some(generation.text.clone()), Vec::new())
    };
    let mut message = json!({"role": "assistant", "content": content});
    let mut reason = generation.finish_reason.openai();
    if !tool_calls.is_empty() {
        message["tool_calls"] = json!(tool_calls);
        reason = "tool_calls";
    }
    let logprobs = include.logprobs.then(|| {
        let content: Vec<Value> = generation
            .tokens
            .iter()
            .zip(&generation.logprobs)
            .map(|(&t, &lp)| json!({"token": token_name(t), "logprob": lp, "bytes": null, "top_logprobs": []}))
            .collect();
        json!({"content": content})
    });
    let choice =
        json!({"index": 0, "message": message, "logprobs": logprobs, "finish_reason": reason});
    envelope(meta, "chat.completion", prompt, generation, choice, include)
}

/// The response around its one `choice`; with token ids asked for, the sampled
/// ids on the choice and the prompt's on the body (vLLM's fields).
fn envelope(
    meta: &Meta,
    object: &str,
    prompt: &[u32],
    generation: &Generation,
    mut choice: Value,
    include: Include,
) -> Value {
    let mut body = json!({
        "id": meta.id,
        "object": object,
        "created": meta.created,
        "model": meta.model,
        "policy_version": generation.policy_version,
        "usage": usage(prompt, generation),
    });
    if include.token_ids {
        choice["token_ids"] = json!(generation.tokens);
        body["prompt_token_ids"] = json!(prompt);
    }
    body["choices"] = json!([choice]);
    body
}

/// Legacy completions: `logprobs` as `tokens` / `token_logprobs` lists.
pub fn completion_response(
    meta: &Meta,
    prompt: &[u32],
    generation: &Generation,
    include: Include,
) -> Value {
    let logprobs = include.logprobs.then(|| {
        json!({
            "tokens": generation.tokens.iter().map(|&t| token_name(t)).collect::<Vec<_>>(),
            "token_logprobs": generation.logprobs,
            "top_logprobs": null,
            "text_offset": null,
        })
    });
    let mut choice = json!({
        "index": 0,
        "text": generation.text,
        "logprobs": logprobs,
        "finish_reason": generation.finish_reason.openai(),
    });
    if include.token_ids {
        // Legacy completions also carry the prompt's ids on the choice.
        choice["prompt_token_ids"] = json!(prompt);
    }
    envelope(meta, "text_completion", prompt, generation, choice, include)
}

#[cfg(test)]
mod tests;
