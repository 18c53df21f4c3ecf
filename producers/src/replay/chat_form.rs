//! A call in OpenAI Chat form, whatever its dialect: the request as
//! `CallFinished.chat_request` records it and replay compares it, the answer
//! as the upstream gave it, and where two requests first differ.

use forgelog_schemas::diff::{clip, first_difference};
use forgelog_schemas::CallFinished;
use serde_json::{json, Value};

/// The request in the form `CallFinished.chat_request` records and replay compares:
/// the upstream body's `messages` and `tools` (OpenAI Chat form, whatever the dialect),
/// borrowed from the body.
#[derive(serde::Serialize)]
struct ChatForm<'a> {
    // Fields in a serde_json map's (sorted) key order, so that the text and
    // the value of a form serialize alike.
    messages: &'a Value,
    tools: &'a Value,
}

impl<'a> ChatForm<'a> {
    fn of(upstream_body: &'a Value) -> ChatForm<'a> {
        ChatForm {
            messages: &upstream_body["messages"],
            tools: upstream_body.get("tools").unwrap_or(&Value::Null),
        }
    }
}

/// The [`ChatForm`] of an upstream body, as a value (what replay compares).
pub fn chat_form(upstream_body: &Value) -> Value {
    serde_json::to_value(ChatForm::of(upstream_body)).expect("a Value serializes")
}

/// The [`ChatForm`] of an upstream body as JSON text (`CallFinished.chat_request`),
/// written without copying the messages first.
pub fn chat_form_text(upstream_body: &Value) -> String {
    serde_json::to_string(&ChatForm::of(upstream_body)).expect("a Value serializes")
}

/// The upstream answer a recorded `CallFinished` stands for, in the vLLM shape
/// [`crate::upstream::read_response`] reads: the message, finish reason, token
/// ids, logprobs, usage and policy version as they came, and the `created` time
/// the harness saw.
pub fn recorded_answer(c: &CallFinished) -> Value {
    let message: Value = serde_json::from_str(&c.chat_response).unwrap_or_else(
        |_| json!({"role": "assistant", "content": String::from_utf8_lossy(&c.response_body)}),
    );
    let sent: Value = serde_json::from_slice(&c.response_body).unwrap_or_default();
    let created = sent["created"]
        .as_i64()
        .or_else(|| sent["created_at"].as_i64())
        .unwrap_or(c.finished_at_ms / 1000);
    let logprobs: Vec<Value> = c
        .completion_token_ids
        .iter()
        .zip(&c.completion_logprobs)
        .map(|(id, lp)| json!({"token": format!("token_id:{id}"), "logprob": *lp as f64}))
        .collect();
    json!({
        "object": "chat.completion",
        "created": created,
        "model": c.model,
        "choices": [{
            "index": 0,
            "message": message,
            "finish_reason": c.finish_reason,
            "token_ids": c.completion_token_ids,
            "logprobs": {"content": logprobs},
        }],
        "prompt_token_ids": c.prompt_token_ids,
        "usage": {
            "prompt_tokens": c.usage.prompt_tokens,
            "completion_tokens": c.usage.completion_tokens,
            "total_tokens": c.usage.prompt_tokens + c.usage.completion_tokens,
        },
        "policy_version": c.policy_version,
    })
}

/// Where `got` first differs from `recorded` (both in [`chat_form`]): message by message, then the tools.
pub fn divergence(recorded: &Value, got: &Value) -> Option<(Option<usize>, String, String)> {
    let names = ("recording", "request");
    let empty = Vec::new();
    let msgs = |v: &Value| v["messages"].as_array().unwrap_or(&empty).clone();
    let (rec, req) = (msgs(recorded), msgs(got));
    for i in 0..rec.len().max(req.len()) {
        let field = format!("messages[{i}]");
        match (rec.get(i), req.get(i)) {
            (Some(a), Some(b)) => {
                // Who speaks matters more than what: a role change is named first.
                let diff = first_difference(&a["role"], &b["role"], names)
                    .map(|(_, detail)| ("role".to_string(), detail))
                    .or_else(|| first_difference(a, b, names));
                if let Some((path, detail)) = diff {
                    let path = if path.is_empty() {
                        field
                    } else {
                        format!("{field}.{path}")
                    };
                    return Some((Some(i), path, detail));
                }
            }
            (Some(a), None) => {
                return Some((
                    Some(i),
                    field,
                    format!(
                        "the request has {} messages, the recording {}; next recorded: {}",
                        req.len(),
                        rec.len(),
                        clip(a)
                    ),
                ))
            }
            (None, Some(b)) => {
                return Some((
                    Some(i),
                    field,
                    format!(
                        "the request has {} messages, the recording {}; extra: {}",
                        req.len(),
                        rec.len(),
                        clip(b)
                    ),
                ))
            }
            (None, None) => unreachable!("i < max(len)"),
        }
    }
    let none = Value::Null;
    let tools = |v: &Value| match v.get("tools") {
        Some(Value::Array(a)) if a.is_empty() => none.clone(),
        Some(t) => t.clone(),
        None => none.clone(),
    };
    first_difference(&tools(recorded), &tools(got), names).map(|(path, detail)| {
        let field = if path.is_empty() {
            "tools".to_string()
        } else {
            format!("tools.{path}")
        };
        (None, field.replace("tools.[", "tools["), detail)
    })
}
