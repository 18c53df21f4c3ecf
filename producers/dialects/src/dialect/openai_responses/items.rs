//! The Responses API's output items and response object, as the answer and
//! its stream events carry them.

use crate::canonical::*;
use serde_json::{json, Value};

pub(super) fn resp_id(resp: &ChatResponse) -> String {
    format!("resp_{}", resp.id)
}

pub(super) fn message_id(resp: &ChatResponse) -> String {
    format!("msg_{}", resp.id)
}

pub(super) fn call_item_id(resp: &ChatResponse, i: usize) -> String {
    format!("fc_{}_{i}", resp.id)
}

pub(super) fn text_part(text: &str) -> Value {
    json!({"type": "output_text", "text": text, "annotations": [], "logprobs": []})
}

pub(super) fn message_item(resp: &ChatResponse, text: &str, status: &str) -> Value {
    let content = if status == "completed" {
        vec![text_part(text)]
    } else {
        vec![]
    };
    json!({"type": "message", "id": message_id(resp), "status": status, "role": "assistant", "content": content})
}

pub(super) fn call_item(
    resp: &ChatResponse,
    i: usize,
    c: &ToolCall,
    arguments: &str,
    status: &str,
) -> Value {
    json!({"type": "function_call", "id": call_item_id(resp, i), "call_id": c.id, "name": c.name,
           "arguments": arguments, "status": status})
}

/// The response object; `output` empty and status `in_progress` for `response.created`.
pub(super) fn response_object(resp: &ChatResponse, req: Option<&ChatRequest>, done: bool) -> Value {
    let text = resp.text();
    let mut output = Vec::new();
    if done {
        if !text.is_empty() {
            output.push(message_item(resp, &text, "completed"));
        }
        for (i, c) in resp.tool_calls().enumerate() {
            output.push(call_item(resp, i, c, &c.arguments, "completed"));
        }
    }
    let incomplete = done && resp.finish == FinishReason::Length;
    let status = match (done, incomplete) {
        (false, _) => "in_progress",
        (true, true) => "incomplete",
        (true, false) => "completed",
    };
    let sampling = req.map(|r| &r.sampling);
    json!({
        "id": resp_id(resp),
        "object": "response",
        "created_at": resp.created,
        "status": status,
        "model": resp.model,
        "output": output,
        "error": null,
        "incomplete_details": if incomplete { json!({"reason": "max_output_tokens"}) } else { Value::Null },
        "instructions": null,
        "metadata": {},
        "parallel_tool_calls": true,
        "temperature": sampling.and_then(|s| s.temperature),
        "top_p": sampling.and_then(|s| s.top_p),
        "max_output_tokens": sampling.and_then(|s| s.max_tokens),
        "tool_choice": "auto",
        "tools": [],
        "text": {"format": {"type": "text"}},
        "usage": if done { json!({
            "input_tokens": resp.usage.input,
            "input_tokens_details": {"cached_tokens": 0},
            "output_tokens": resp.usage.output,
            "output_tokens_details": {"reasoning_tokens": 0},
            "total_tokens": resp.usage.input + resp.usage.output,
        }) } else { Value::Null },
    })
}
