//! What the fake model says next, steered by the conversation: the agent's
//! step, a call of the first tool offered, or an echo of the user.

use super::agent::{agent_steps, agent_turn};
use super::{text_of, FakeUpstream};
use axum::http::StatusCode;
use serde_json::{json, Value};

/// What the fake model says next: its text, tool calls (or null) and why it stopped.
pub(super) struct Turn {
    pub(super) text: String,
    pub(super) tool_calls: Value,
    pub(super) finish: &'static str,
}

impl Turn {
    /// A turn that stops for its tool calls, if it has any.
    fn new(text: String, tool_calls: Value) -> Turn {
        let finish = if tool_calls.is_null() {
            "stop"
        } else {
            "tool_calls"
        };
        Turn {
            text,
            tool_calls,
            finish,
        }
    }
}

impl FakeUpstream {
    /// The next turn of the conversation in `req` (`messages`, `tools`).
    pub(super) fn turn(&self, req: &Value) -> Result<Turn, (StatusCode, String)> {
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
        let (text, tool_calls) = match agent_steps(&messages).or(self.options.agent_steps) {
            Some(steps) => agent_turn(req, &messages, steps),
            None => scripted(req, &messages, &last_user),
        };
        Ok(Turn::new(text, tool_calls))
    }
}

/// Without the agent: a call of the first tool offered, unless a tool's
/// result came last; else an echo of the last user message.
fn scripted(req: &Value, messages: &[Value], last_user: &str) -> (String, Value) {
    let last_is_tool = messages.last().is_some_and(|m| m["role"] == "tool");
    match req["tools"][0]["function"]["name"].as_str() {
        Some(name) if !last_is_tool => tool_call(name, last_user),
        _ => (echo(last_user), Value::Null),
    }
}

/// A call of tool `name`: as `tool_calls`, or as Hermes text (`[hermes]`),
/// or as Hermes text whose JSON does not parse (`[badtool]`).
fn tool_call(name: &str, last_user: &str) -> (String, Value) {
    if last_user.contains("[badtool]") {
        // Bare keys and one brace short; the braces are spelled as values
        // so that this source's own still pair up.
        let (open, close) = ('{', '}');
        let text = format!("Let me check.<tool_call>{open}\"name\": \"{name}\", \"arguments\": {open}city: Paris{close}</tool_call>");
        return (text, Value::Null);
    }
    if last_user.contains("[hermes]") {
        let text = format!("Let me check.<tool_call>{{\"name\": \"{name}\", \"arguments\": {{\"city\": \"Paris\"}}}}</tool_call>");
        return (text, Value::Null);
    }
    let calls = json!([{"id": "chatcmpl-tool-1", "type": "function",
        "function": {"name": name, "arguments": "{\"city\": \"Paris\"}"}}]);
    ("Calling the tool.".to_string(), calls)
}

/// `Echo: ` and the first 24 letters, digits and spaces of `last_user`.
fn echo(last_user: &str) -> String {
    let words: String = last_user
        .chars()
        .filter(|c| c.is_alphanumeric() || *c == ' ')
        .take(24)
        .collect();
    format!("Echo: {words}")
}
