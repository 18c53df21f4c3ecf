//! A small vLLM-compatible engine for tests and the load bench: deterministic
//! byte-level "tokens", fixed logprobs, an optional fixed delay. It answers
//! with token ids and logprobs the way vLLM does with `return_token_ids` and
//! `--return-tokens-as-token-ids`, plus our engine's `policy_version`.
//!
//! Behaviour is steered by the last user message, so tests need no setup:
//! with tools offered it calls the first tool (`[hermes]` in the message: as
//! Hermes `<tool_call>` text instead of `tool_calls`; `[badtool]`: such text
//! with JSON that does not parse); `[fail]` answers 500;
//! `[slow]` waits 3 s.
//!
//! `[agent:N]` in any user message plays a tiny agent for real harnesses: while
//! fewer than N tool results are in the conversation it runs a shell command
//! through the harness's shell-like tool (`bash`, `shell`, `exec_command`...,
//! arguments built from the tool's JSON schema), then answers plain text;
//! `FakeOptions::agent_steps` plays it in every conversation. With
//! `[delegate]` too, its first step hands "Run one step. [agent:1]" to a
//! sub-agent tool (one named `agent` or `task`) where the harness offers one.

use axum::extract::State;
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::{Json, Router};
use serde_json::{json, Value};
use std::net::SocketAddr;
use std::sync::{Arc, Mutex};
use std::time::Duration;

pub const MODEL: &str = "fake-llm";
pub const POLICY_VERSION: i64 = 7;

#[derive(Debug, Clone, Default)]
pub struct FakeOptions {
    pub delay: Duration,
    /// Answer like a backend without token ids or logprobs.
    pub without_ids: bool,
    /// Keep every answer (tests compare the log against them).
    pub keep_answers: bool,
    /// A context length, reported as `max_model_len`; a prompt (plus the
    /// `max_tokens` asked for) over it is refused the way vLLM does.
    pub context: Option<usize>,
    /// Play the `[agent:N]` agent in every conversation, without the marker
    /// (for real harnesses on unmodified task instructions).
    pub agent_steps: Option<usize>,
    /// Have no `/tokenize` (as backends other than vLLM and forgelog's engine).
    pub without_tokenize: bool,
}

#[derive(Default)]
pub struct FakeUpstream {
    pub options: FakeOptions,
    pub answers: Mutex<Vec<Value>>,
}

fn text_of(content: &Value) -> String {
    match content {
        Value::String(s) => s.clone(),
        Value::Array(parts) => parts.iter().filter_map(|p| p["text"].as_str()).collect(),
        _ => String::new(),
    }
}

/// The chat template: what the "engine" sees, one byte per token.
pub fn render_prompt(messages: &[Value]) -> String {
    let mut s = String::new();
    for m in messages {
        s.push_str("<|");
        s.push_str(m["role"].as_str().unwrap_or("?"));
        s.push_str("|>");
        s.push_str(&text_of(&m["content"]));
        if let Some(calls) = m["tool_calls"].as_array() {
            for c in calls {
                s.push_str(&c["function"].to_string());
            }
        }
        s.push('\n');
    }
    s.push_str("<|assistant|>");
    s
}

/// The sampled logprob of the `i`-th completion token: exact in f32.
pub fn logprob(i: usize) -> f32 {
    -((i % 8) as f32 + 1.0) / 16.0
}

/// N of `[agent:N]` in any user message.
fn agent_steps(messages: &[Value]) -> Option<usize> {
    messages
        .iter()
        .filter(|m| m["role"] == "user")
        .find_map(|m| {
            let text = text_of(&m["content"]);
            let rest = &text[text.find("[agent:")? + "[agent:".len()..];
            rest[..rest.find(']')?].trim().parse().ok()
        })
}

/// The agent's answer at this point: text, and the tool call (or null).
fn agent_turn(req: &Value, messages: &[Value], steps: usize) -> (String, Value) {
    let done = messages.iter().filter(|m| m["role"] == "tool").count();
    let tools = req["tools"].as_array().cloned().unwrap_or_default();
    let named = |pick: &dyn Fn(&str) -> bool| {
        tools
            .iter()
            .find(|t| pick(&t["function"]["name"].as_str().unwrap_or("").to_lowercase()))
    };
    let shell = named(&|n| ["bash", "shell", "exec"].iter().any(|k| n.contains(k)));
    let delegate = messages
        .iter()
        .any(|m| m["role"] == "user" && text_of(&m["content"]).contains("[delegate]"));
    let sub_agent = named(&|n| n == "agent" || n == "task").filter(|_| delegate && done == 0);
    let (tool, command, text) = match (sub_agent, shell) {
        (Some(tool), _) if steps > 0 => (
            tool,
            "Run one step. [agent:1]".to_string(),
            "Delegating step 1.".to_string(),
        ),
        (_, Some(tool)) if done < steps => (
            tool,
            format!("echo forgelog step {}", done + 1),
            format!("Running step {}.", done + 1),
        ),
        _ => return (format!("Done after {done} steps."), Value::Null),
    };
    let arguments = arguments_for(&tool["function"]["parameters"], &command);
    let call = json!([{"id": format!("call_step_{}", done + 1), "type": "function",
        "function": {"name": tool["function"]["name"], "arguments": arguments.to_string()}}]);
    (text, call)
}

/// Arguments that satisfy a tool's JSON schema: every required property, the
/// command where a string (a command, or a sub-agent's prompt) or an argv array
/// is asked for; optional booleans false (run in the foreground, no extras).
fn arguments_for(schema: &Value, command: &str) -> Value {
    let mut args = serde_json::Map::new();
    if let Some(props) = schema["properties"].as_object() {
        for (name, prop) in props {
            if prop["type"] == "boolean" {
                args.insert(name.clone(), json!(false));
            }
        }
    }
    let required = schema["required"].as_array().cloned().unwrap_or_default();
    for name in required.iter().filter_map(Value::as_str) {
        let prop = &schema["properties"][name];
        let value = match prop["type"].as_str() {
            Some("array") => json!(["bash", "-lc", command]),
            Some("integer" | "number") => json!(10000),
            Some("boolean") => json!(false),
            Some("object") => json!({}),
            _ if name.contains("command") || name == "cmd" || name == "prompt" => json!(command),
            // A kind to pick (a sub-agent's type): the general one.
            _ if name.ends_with("type") => json!("general"),
            _ => json!(format!("{name} for {command}")),
        };
        args.insert(name.to_string(), value);
    }
    Value::Object(args)
}

impl FakeUpstream {
    pub fn answer(&self, req: &Value) -> Result<Value, (StatusCode, String)> {
        let messages = req["messages"].as_array().cloned().unwrap_or_default();
        let last_user = messages
            .iter()
            .rev()
            .find(|m| m["role"] == "user")
            .map(|m| text_of(&m["content"]))
            .unwrap_or_default();
        if last_user.contains("[fail]") {
            return Err((
                StatusCode::INTERNAL_SERVER_ERROR,
                "fake upstream failure".into(),
            ));
        }
        let last_is_tool = messages.last().is_some_and(|m| m["role"] == "tool");
        let first_tool = req["tools"][0]["function"]["name"].as_str();
        let mut tool_calls = Value::Null;
        let agent = agent_steps(&messages)
            .or(self.options.agent_steps)
            .map(|n| agent_turn(req, &messages, n));
        let mut text = match (first_tool, last_is_tool) {
            _ if agent.is_some() => {
                let (text, calls) = agent.expect("checked");
                tool_calls = calls;
                text
            }
            (Some(name), false) if last_user.contains("[badtool]") => {
                format!("Let me check.<tool_call>{{\"name\": \"{name}\", \"arguments\": {{city: Paris}}</tool_call>")
            }
            (Some(name), false) if last_user.contains("[hermes]") => {
                format!("Let me check.<tool_call>{{\"name\": \"{name}\", \"arguments\": {{\"city\": \"Paris\"}}}}</tool_call>")
            }
            (Some(name), false) => {
                tool_calls = json!([{"id": "chatcmpl-tool-1", "type": "function",
                    "function": {"name": name, "arguments": "{\"city\": \"Paris\"}"}}]);
                "Calling the tool.".to_string()
            }
            _ => {
                let words: String = last_user
                    .chars()
                    .filter(|c| c.is_alphanumeric() || *c == ' ')
                    .take(24)
                    .collect();
                format!("Echo: {words}")
            }
        };
        let mut finish = if tool_calls.is_null() {
            "stop"
        } else {
            "tool_calls"
        };
        if let Some(max) = req["max_tokens"].as_u64() {
            if (text.len() as u64) > max {
                text.truncate(max as usize);
                finish = "length";
                tool_calls = Value::Null;
            }
        }
        let prompt = render_prompt(&messages);
        if let Some(context) = self.options.context {
            let asked = req["max_tokens"].as_u64().unwrap_or(0) as usize;
            if prompt.len() >= context || prompt.len() + asked > context {
                return Err((
                    StatusCode::BAD_REQUEST,
                    format!("This model's maximum context length is {context} tokens. However, you requested {} tokens ({} in the messages, {asked} in the completion). Please reduce the length of the messages or completion.", prompt.len() + asked, prompt.len()),
                ));
            }
        }
        let prompt_ids: Vec<u32> = prompt.bytes().map(u32::from).collect();
        let completion_ids: Vec<u32> = text.bytes().map(u32::from).collect();
        let mut message = json!({"role": "assistant", "content": text});
        if !tool_calls.is_null() {
            message["tool_calls"] = tool_calls;
        }
        let mut answer = json!({
            "id": "chatcmpl-fake", "object": "chat.completion", "created": 1_700_000_000, "model": MODEL,
            "choices": [{"index": 0, "message": message, "finish_reason": finish}],
            "usage": {"prompt_tokens": prompt_ids.len(), "completion_tokens": completion_ids.len(),
                      "total_tokens": prompt_ids.len() + completion_ids.len()},
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
}

/// vLLM's `/tokenize` of a chat: one token per byte of the rendered prompt,
/// as the completions count them.
async fn tokenize(State(up): State<Arc<FakeUpstream>>, Json(req): Json<Value>) -> Response {
    if up.options.without_tokenize {
        return StatusCode::NOT_FOUND.into_response();
    }
    let messages = req["messages"].as_array().cloned().unwrap_or_default();
    let count = render_prompt(&messages).len();
    Json(json!({"count": count, "max_model_len": up.options.context, "tokens": []})).into_response()
}

async fn chat(State(up): State<Arc<FakeUpstream>>, Json(req): Json<Value>) -> Response {
    if req["stream"] == true {
        return (StatusCode::BAD_REQUEST, "the fake upstream does not stream").into_response();
    }
    let slow = req["messages"]
        .as_array()
        .and_then(|m| m.last())
        .is_some_and(|m| text_of(&m["content"]).contains("[slow]"));
    let delay = if slow {
        Duration::from_secs(3)
    } else {
        up.options.delay
    };
    if !delay.is_zero() {
        tokio::time::sleep(delay).await;
    }
    match up.answer(&req) {
        Ok(a) => {
            if up.options.keep_answers {
                up.answers.lock().expect("answers lock").push(a.clone());
            }
            Json(a).into_response()
        }
        // vLLM's error shape.
        Err((status, msg)) => (
            status,
            Json(json!({"object": "error", "message": msg, "type": "BadRequestError", "param": null, "code": status.as_u16()})),
        )
            .into_response(),
    }
}

pub fn router(up: Arc<FakeUpstream>) -> Router {
    Router::new()
        .route(
            "/v1/models",
            get(|State(up): State<Arc<FakeUpstream>>| async move {
                let mut model = json!({"id": MODEL, "object": "model"});
                if let Some(n) = up.options.context {
                    model["max_model_len"] = json!(n);
                }
                Json(json!({"object": "list", "data": [model]}))
            }),
        )
        .route("/v1/chat/completions", post(chat))
        .route("/tokenize", post(tokenize))
        // Takes what a real engine takes: the proxy's limits are under test.
        .layer(axum::extract::DefaultBodyLimit::max(64 << 20))
        .with_state(up)
}

/// Serves a fake upstream on `listen` in this runtime; returns its address.
pub async fn spawn(
    listen: SocketAddr,
    options: FakeOptions,
) -> std::io::Result<(SocketAddr, Arc<FakeUpstream>)> {
    let up = Arc::new(FakeUpstream {
        options,
        answers: Mutex::default(),
    });
    let listener = crate::bind(listen)?;
    let addr = listener.local_addr()?;
    let app = router(up.clone());
    tokio::spawn(async move { axum::serve(listener, app).await });
    Ok((addr, up))
}

/// Every ok CallFinished carries exactly the ids and logprobs some upstream answer
/// had, and the policy version it reported.
/// (A test helper: panics on the first call that does not.)
pub fn assert_calls_match(
    calls: &[forgelog_schemas::CallFinished],
    answers: &[Value],
    policy_version: i64,
) {
    for c in calls
        .iter()
        .filter(|c| c.status == forgelog_schemas::CallStatus::Ok)
    {
        // Equal requests may get answers equal in ids whose logprobs differ in
        // the last bits (an engine's prefix cache, batching): the call must be
        // exactly one of them.
        let ids = |v: &Value| {
            v.as_array()
                .unwrap()
                .iter()
                .map(|x| x.as_u64().unwrap() as u32)
                .collect::<Vec<_>>()
        };
        let logprobs = |a: &Value| -> Vec<f32> {
            a["choices"][0]["logprobs"]["content"]
                .as_array()
                .unwrap()
                .iter()
                .map(|t| t["logprob"].as_f64().unwrap() as f32)
                .collect()
        };
        let same_ids: Vec<&Value> = answers
            .iter()
            .filter(|a| {
                ids(&a["prompt_token_ids"]) == c.prompt_token_ids
                    && ids(&a["choices"][0]["token_ids"]) == c.completion_token_ids
            })
            .collect();
        assert!(
            !same_ids.is_empty(),
            "call {} has token ids no upstream answer had",
            c.call_index
        );
        assert!(
            same_ids
                .iter()
                .any(|a| logprobs(a) == c.completion_logprobs),
            "call {}: logprobs {:?} are none of the answers' with its ids: {:?}",
            c.call_index,
            c.completion_logprobs,
            same_ids.iter().map(|a| logprobs(a)).collect::<Vec<_>>()
        );
        assert!(
            c.trainable,
            "call {}: {:?}",
            c.call_index, c.untrainable_reason
        );
        assert_eq!(c.policy_version, Some(policy_version));
        assert_eq!(c.sampling_sent.top_p, Some(1.0));
        assert_eq!(c.sampling_sent.top_k, Some(-1));
        assert!(!c.response_body.is_empty());
    }
}

#[cfg(test)]
mod tests;
