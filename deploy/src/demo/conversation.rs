//! The agent's conversation, kept in one shape and written in the dialect the
//! rollout speaks: OpenAI Chat Completions or Anthropic Messages. Pure: the
//! HTTP is in the agent loop.

use super::calculator;
use serde_json::{json, Value};

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum AgentDialect {
    OpenAiChat,
    Anthropic,
}

impl AgentDialect {
    pub const ALL: [AgentDialect; 2] = [AgentDialect::OpenAiChat, AgentDialect::Anthropic];

    /// The harness name the rollouts are recorded under.
    pub fn harness(self) -> &'static str {
        match self {
            AgentDialect::OpenAiChat => "demo-openai-chat",
            AgentDialect::Anthropic => "demo-anthropic",
        }
    }

    pub fn path(self) -> &'static str {
        match self {
            AgentDialect::OpenAiChat => "/v1/chat/completions",
            AgentDialect::Anthropic => "/v1/messages",
        }
    }
}

#[derive(Debug, Clone, PartialEq)]
pub struct ToolCall {
    pub id: String,
    pub name: String,
    pub arguments: Value,
}

#[derive(Debug, Clone, PartialEq)]
pub enum Turn {
    User(String),
    Assistant {
        text: String,
        tool_calls: Vec<ToolCall>,
    },
    /// Results of the previous assistant turn's tool calls: (call id, content).
    ToolResults(Vec<(String, String)>),
}

/// Sampling for every call of a rollout.
#[derive(Debug, Clone, Copy)]
pub struct Sampling {
    pub max_tokens: u32,
    pub temperature: f64,
}

/// The request body for the next call.
pub fn request(dialect: AgentDialect, system: &str, turns: &[Turn], sampling: Sampling) -> Value {
    match dialect {
        AgentDialect::OpenAiChat => {
            let mut messages = vec![json!({"role": "system", "content": system})];
            for t in turns {
                match t {
                    Turn::User(text) => messages.push(json!({"role": "user", "content": text})),
                    Turn::Assistant { text, tool_calls } => {
                        let mut m = json!({"role": "assistant", "content": text});
                        if !tool_calls.is_empty() {
                            m["tool_calls"] = tool_calls
                                .iter()
                                .map(|c| json!({"id": c.id, "type": "function", "function": {"name": c.name, "arguments": c.arguments.to_string()}}))
                                .collect();
                        }
                        messages.push(m);
                    }
                    Turn::ToolResults(results) => messages.extend(results.iter().map(
                        |(id, content)| json!({"role": "tool", "tool_call_id": id, "content": content}),
                    )),
                }
            }
            json!({
                "model": "forgelog-demo",
                "messages": messages,
                "tools": [{"type": "function", "function": {"name": calculator::NAME, "description": calculator::DESCRIPTION, "parameters": calculator::parameters()}}],
                "max_tokens": sampling.max_tokens,
                "temperature": sampling.temperature,
            })
        }
        AgentDialect::Anthropic => {
            let messages: Vec<Value> = turns
                .iter()
                .map(|t| match t {
                    Turn::User(text) => json!({"role": "user", "content": text}),
                    Turn::Assistant { text, tool_calls } => {
                        let mut blocks = Vec::new();
                        if !text.is_empty() {
                            blocks.push(json!({"type": "text", "text": text}));
                        }
                        blocks.extend(tool_calls.iter().map(|c| {
                            json!({"type": "tool_use", "id": c.id, "name": c.name, "input": c.arguments})
                        }));
                        json!({"role": "assistant", "content": blocks})
                    }
                    Turn::ToolResults(results) => json!({"role": "user", "content": results
                        .iter()
                        .map(|(id, content)| json!({"type": "tool_result", "tool_use_id": id, "content": content}))
                        .collect::<Vec<_>>()}),
                })
                .collect();
            json!({
                "model": "forgelog-demo",
                "system": system,
                "messages": messages,
                "tools": [{"name": calculator::NAME, "description": calculator::DESCRIPTION, "input_schema": calculator::parameters()}],
                "max_tokens": sampling.max_tokens,
                "temperature": sampling.temperature,
            })
        }
    }
}

#[derive(Debug, thiserror::Error, PartialEq)]
#[error("unexpected {dialect:?} response: {reason}")]
pub struct ResponseError {
    pub dialect: AgentDialect,
    pub reason: String,
}

/// The assistant turn in a response body.
pub fn reply(dialect: AgentDialect, body: &Value) -> Result<Turn, ResponseError> {
    let err = |reason: &str| ResponseError {
        dialect,
        reason: format!("{reason}: {body}"),
    };
    match dialect {
        AgentDialect::OpenAiChat => {
            let message = &body["choices"][0]["message"];
            if !message.is_object() {
                return Err(err("no choices[0].message"));
            }
            let tool_calls = match &message["tool_calls"] {
                Value::Array(calls) => calls
                    .iter()
                    .map(|c| {
                        let f = &c["function"];
                        let arguments = f["arguments"]
                            .as_str()
                            .and_then(|a| serde_json::from_str(a).ok())
                            .unwrap_or(Value::Null);
                        Some(ToolCall {
                            id: c["id"].as_str()?.to_string(),
                            name: f["name"].as_str()?.to_string(),
                            arguments,
                        })
                    })
                    .collect::<Option<Vec<_>>>()
                    .ok_or_else(|| err("malformed tool_calls"))?,
                _ => Vec::new(),
            };
            Ok(Turn::Assistant {
                text: message["content"].as_str().unwrap_or_default().to_string(),
                tool_calls,
            })
        }
        AgentDialect::Anthropic => {
            let blocks = body["content"]
                .as_array()
                .ok_or_else(|| err("no content array"))?;
            let mut text = String::new();
            let mut tool_calls = Vec::new();
            for b in blocks {
                match b["type"].as_str() {
                    Some("text") => text.push_str(b["text"].as_str().unwrap_or_default()),
                    Some("tool_use") => tool_calls.push(ToolCall {
                        id: b["id"]
                            .as_str()
                            .ok_or_else(|| err("tool_use without id"))?
                            .to_string(),
                        name: b["name"].as_str().unwrap_or_default().to_string(),
                        arguments: b["input"].clone(),
                    }),
                    _ => {}
                }
            }
            Ok(Turn::Assistant { text, tool_calls })
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn conversation() -> Vec<Turn> {
        vec![
            Turn::User("What is 6*7?".into()),
            Turn::Assistant {
                text: String::new(),
                tool_calls: vec![ToolCall {
                    id: "c1".into(),
                    name: "calculator".into(),
                    arguments: json!({"expression": "6*7"}),
                }],
            },
            Turn::ToolResults(vec![("c1".into(), "42".into())]),
        ]
    }

    const SAMPLING: Sampling = Sampling {
        max_tokens: 32,
        temperature: 0.7,
    };

    #[test]
    fn openai_chat_requests_carry_tool_calls_and_results() {
        let r = request(AgentDialect::OpenAiChat, "sys", &conversation(), SAMPLING);
        let m = r["messages"].as_array().unwrap();
        assert_eq!(m.len(), 4);
        assert_eq!(m[0]["role"], "system");
        assert_eq!(
            m[2]["tool_calls"][0]["function"]["arguments"],
            "{\"expression\":\"6*7\"}"
        );
        assert_eq!(
            m[3],
            json!({"role": "tool", "tool_call_id": "c1", "content": "42"})
        );
        assert_eq!(r["tools"][0]["function"]["name"], "calculator");
    }

    #[test]
    fn anthropic_requests_carry_tool_use_and_tool_result_blocks() {
        let r = request(AgentDialect::Anthropic, "sys", &conversation(), SAMPLING);
        assert_eq!(r["system"], "sys");
        let m = r["messages"].as_array().unwrap();
        assert_eq!(m.len(), 3);
        assert_eq!(m[1]["content"][0]["type"], "tool_use");
        assert_eq!(m[1]["content"][0]["input"]["expression"], "6*7");
        assert_eq!(m[2]["content"][0]["tool_use_id"], "c1");
        assert_eq!(r["tools"][0]["input_schema"]["required"][0], "expression");
    }

    #[test]
    fn replies_are_read_in_both_dialects() {
        let openai = json!({"choices": [{"message": {"role": "assistant", "content": null,
            "tool_calls": [{"id": "c9", "type": "function", "function": {"name": "calculator", "arguments": "{\"expression\": \"1+1\"}"}}]}}]});
        let anthropic = json!({"content": [{"type": "text", "text": "Let me add."},
            {"type": "tool_use", "id": "c9", "name": "calculator", "input": {"expression": "1+1"}}]});
        let expected_call = ToolCall {
            id: "c9".into(),
            name: "calculator".into(),
            arguments: json!({"expression": "1+1"}),
        };
        assert_eq!(
            reply(AgentDialect::OpenAiChat, &openai).unwrap(),
            Turn::Assistant {
                text: String::new(),
                tool_calls: vec![expected_call.clone()]
            }
        );
        assert_eq!(
            reply(AgentDialect::Anthropic, &anthropic).unwrap(),
            Turn::Assistant {
                text: "Let me add.".into(),
                tool_calls: vec![expected_call]
            }
        );
        let e = reply(AgentDialect::Anthropic, &json!({"type": "error"})).unwrap_err();
        assert!(e.reason.contains("no content array"), "{e}");
    }
}
