//! The fake engine's answers: a chat completion, and a completion of a
//! token-id prompt, each refused over the context as vLLM refuses it.

use super::model::{decode, encode, logprob, parse_prompt, render_prompt, END, END_ID};
use super::script::Turn;
use super::{FakeUpstream, MODEL, POLICY_VERSION};
use axum::http::StatusCode;
use serde_json::{json, Value};

impl FakeUpstream {
    /// Refuses a prompt of `prompt` tokens (plus the `max_tokens` asked) over
    /// the context, as vLLM does.
    fn within_context(&self, prompt: usize, req: &Value) -> Result<(), (StatusCode, String)> {
        let Some(context) = self.options.context else {
            return Ok(());
        };
        let asked = req["max_tokens"].as_u64().unwrap_or(0) as usize;
        if prompt >= context || prompt + asked > context {
            return Err((
                StatusCode::BAD_REQUEST,
                format!("This model's maximum context length is {context} tokens. However, you requested {} tokens ({prompt} in the messages, {asked} in the completion). Please reduce the length of the messages or completion.", prompt + asked),
            ));
        }
        Ok(())
    }

    /// A chat completion (`/v1/chat/completions`): the engine renders the
    /// prompt and parses the tool calls itself.
    pub fn answer(&self, req: &Value) -> Result<Value, (StatusCode, String)> {
        let Turn {
            mut text,
            mut tool_calls,
            mut finish,
        } = self.turn(req)?;
        if let Some(max) = req["max_tokens"].as_u64() {
            if (text.len() as u64) > max {
                text.truncate(max as usize);
                finish = "length";
                tool_calls = Value::Null;
            }
        }
        let messages = req["messages"].as_array().cloned().unwrap_or_default();
        let prompt_ids = encode(&render_prompt(&messages, req.get("tools")));
        self.within_context(prompt_ids.len(), req)?;
        let completion_ids: Vec<u32> = text.bytes().map(u32::from).collect();
        let mut message = json!({"role": "assistant", "content": text});
        if !tool_calls.is_null() {
            message["tool_calls"] = tool_calls;
        }
        let mut answer = json!({
            "id": "chatcmpl-fake", "object": "chat.completion", "created": 1_700_000_000, "model": MODEL,
            "choices": [{"index": 0, "message": message, "finish_reason": finish}],
            "usage": usage(&prompt_ids, &completion_ids),
        });
        if !self.options.without_ids {
            let content: Vec<Value> = completion_ids.iter().enumerate()
                .map(|(i, id)| json!({"token": format!("token_id:{id}"), "logprob": logprob(i), "bytes": [id], "top_logprobs": []}))
                .collect();
            answer["prompt_token_ids"] = json!(prompt_ids);
            answer["choices"][0]["token_ids"] = json!(completion_ids);
            answer["choices"][0]["logprobs"] = json!({"content": content});
            answer["policy_version"] = json!(POLICY_VERSION);
        }
        Ok(answer)
    }

    /// A completion of a token-id prompt (`/v1/completions`, token in): the
    /// conversation is read back from the ids; the model writes its tool calls
    /// as Hermes text and ends its turn with [`END`]. Also returns the answer
    /// in chat form, as [`assert_calls_match`](super::assert_calls_match)
    /// reads answers.
    pub(super) fn complete(&self, req: &Value) -> Result<(Value, Value), (StatusCode, String)> {
        let prompt_ids = req["prompt"]
            .as_array()
            .and_then(|ids| {
                ids.iter()
                    .map(|v| v.as_u64().map(|n| n as u32))
                    .collect::<Option<Vec<u32>>>()
            })
            .ok_or((
                StatusCode::BAD_REQUEST,
                "`prompt` must be token ids".to_string(),
            ))?;
        let (messages, tools) = parse_prompt(&decode(&prompt_ids));
        let turn = self.turn(&json!({"messages": messages, "tools": tools}))?;
        self.within_context(prompt_ids.len(), req)?;
        let chat_form =
            json!({"role": "assistant", "content": turn.text, "tool_calls": turn.tool_calls});
        let said = forgelog_dialects::hf::hf_message_with_hermes_calls(&chat_form);
        let mut completion_ids = encode(said["content"].as_str().unwrap_or_default());
        completion_ids.push(END_ID);
        let mut finish = "stop";
        if let Some(max) = req["max_tokens"].as_u64() {
            if completion_ids.len() as u64 > max {
                completion_ids.truncate(max as usize);
                finish = "length";
            }
        }
        let text = decode(&completion_ids);
        let text = text.strip_suffix(END).unwrap_or(&text);
        let logprobs: Vec<f32> = (0..completion_ids.len()).map(logprob).collect();
        let content: Vec<Value> = logprobs.iter().map(|l| json!({"logprob": l})).collect();
        // As vLLM answers: the ids (the prompt's echoed) with
        // `return_token_ids`; each token named by its id with
        // `return_tokens_as_token_ids`, else by its text.
        let tokens: Vec<String> = if req["return_tokens_as_token_ids"] == true {
            completion_ids
                .iter()
                .map(|id| format!("token_id:{id}"))
                .collect()
        } else {
            completion_ids.iter().map(|&id| decode(&[id])).collect()
        };
        let mut answer = json!({
            "id": "cmpl-fake", "object": "text_completion", "created": 1_700_000_000, "model": MODEL,
            "choices": [{"index": 0, "text": text, "finish_reason": finish,
                "logprobs": {"tokens": tokens, "token_logprobs": logprobs}}],
            "usage": usage(&prompt_ids, &completion_ids),
            "policy_version": POLICY_VERSION,
        });
        if req["return_token_ids"] == true {
            answer["choices"][0]["prompt_token_ids"] = json!(prompt_ids);
            answer["choices"][0]["token_ids"] = json!(completion_ids);
        }
        let chat = json!({"prompt_token_ids": prompt_ids,
            "choices": [{"token_ids": completion_ids, "logprobs": {"content": content}}]});
        Ok((answer, chat))
    }
}

fn usage(prompt: &[u32], completion: &[u32]) -> Value {
    json!({"prompt_tokens": prompt.len(), "completion_tokens": completion.len(),
           "total_tokens": prompt.len() + completion.len()})
}
