//! Messages (content parts, tool calls, tool results), tools and
//! `tool_choice` in the Chat Completions shape, both ways.

use crate::canonical::*;
use crate::dialect::*;
use serde_json::json;

pub(super) fn decode_content(v: &Value) -> Result<Vec<Part>, DialectError> {
    match v {
        Value::Null => Ok(Vec::new()),
        Value::String(s) => Ok(vec![Part::Text(s.clone())]),
        Value::Array(items) => items
            .iter()
            .map(|item| {
                let o = obj(item, "content part")?;
                match req_str(o, "type")? {
                    "text" | "input_text" | "output_text" => {
                        Ok(Part::Text(req_str(o, "text")?.to_string()))
                    }
                    "image_url" => {
                        let url = match o.get("image_url") {
                            Some(Value::String(s)) => s.as_str(),
                            Some(v) => req_str(obj(v, "image_url")?, "url")?,
                            None => return Err(DialectError::invalid("'image_url' is required")),
                        };
                        Ok(Part::Image(Image::from_url(url)))
                    }
                    other => Err(DialectError::invalid(format!(
                        "content part type '{other}' is not supported"
                    ))),
                }
            })
            .collect(),
        _ => Err(DialectError::invalid(
            "'content' must be a string or an array",
        )),
    }
}

pub(crate) fn decode_tool_calls(v: &[Value]) -> Result<Vec<Part>, DialectError> {
    v.iter()
        .map(|c| {
            let o = obj(c, "tool call")?;
            let f = obj(
                o.get("function")
                    .ok_or_else(|| DialectError::invalid("tool call needs 'function'"))?,
                "function",
            )?;
            let arguments = match f.get("arguments") {
                Some(Value::String(s)) => s.clone(),
                Some(Value::Null) | None => String::new(),
                Some(v) => v.to_string(),
            };
            Ok(Part::ToolCall(ToolCall {
                id: opt_str(o, "id")?.unwrap_or_default().to_string(),
                name: req_str(f, "name")?.to_string(),
                arguments,
            }))
        })
        .collect()
}

pub(super) fn decode_message(v: &Value) -> Result<Message, DialectError> {
    let o = obj(v, "message")?;
    let content = decode_content(o.get("content").unwrap_or(&Value::Null))?;
    Ok(match req_str(o, "role")? {
        "system" | "developer" => Message {
            role: Role::System,
            parts: content,
        },
        "user" => Message {
            role: Role::User,
            parts: content,
        },
        "assistant" => {
            let mut parts = content;
            parts.extend(decode_tool_calls(opt_array(o, "tool_calls")?)?);
            Message {
                role: Role::Assistant,
                parts,
            }
        }
        "tool" => Message {
            role: Role::Tool,
            parts: vec![Part::ToolResult {
                call_id: req_str(o, "tool_call_id")?.to_string(),
                name: opt_str(o, "name")?.map(str::to_string),
                content: Message {
                    role: Role::Tool,
                    parts: content,
                }
                .joined_text(),
                is_error: false,
            }],
        },
        other => return Err(DialectError::invalid(format!("unknown role '{other}'"))),
    })
}

pub(super) fn decode_tools(tools: &[Value]) -> Result<Vec<ToolSpec>, DialectError> {
    tools
        .iter()
        .map(|t| {
            let o = obj(t, "tool")?;
            let f = obj(
                o.get("function")
                    .ok_or_else(|| DialectError::invalid("only function tools are supported"))?,
                "function",
            )?;
            Ok(ToolSpec {
                name: req_str(f, "name")?.to_string(),
                description: opt_str(f, "description")?.map(str::to_string),
                parameters: f.get("parameters").cloned().unwrap_or(json!({})),
            })
        })
        .collect()
}

/// `tool_choice`; a named tool is `{"type": "function", "function": {"name": ..}}`.
pub(super) fn decode_tool_choice(v: Option<&Value>) -> Result<Option<ToolChoice>, DialectError> {
    decode_openai_tool_choice(v, |o| {
        let f = obj(
            o.get("function").unwrap_or(&Value::Null),
            "tool_choice.function",
        )?;
        Ok(req_str(f, "name")?.to_string())
    })
}

pub(crate) fn encode_tool_choice(c: &ToolChoice) -> Value {
    match c {
        ToolChoice::Auto => json!("auto"),
        ToolChoice::None => json!("none"),
        ToolChoice::Required => json!("required"),
        ToolChoice::Named(n) => json!({"type": "function", "function": {"name": n}}),
    }
}

fn encode_parts(parts: &[Part]) -> Value {
    // Plain text stays a string: what most servers and chat templates expect.
    if let [Part::Text(t)] = parts {
        return json!(t);
    }
    let items: Vec<Value> = parts
        .iter()
        .filter_map(|p| match p {
            Part::Text(t) => Some(json!({"type": "text", "text": t})),
            Part::Image(i) => Some(json!({"type": "image_url", "image_url": {"url": i.to_url()}})),
            _ => None,
        })
        .collect();
    if items.is_empty() {
        Value::Null
    } else {
        Value::Array(items)
    }
}

pub(crate) fn encode_tool_call(c: &ToolCall) -> Value {
    json!({"id": c.id, "type": "function", "function": {"name": c.name, "arguments": c.arguments}})
}

pub(super) fn encode_messages(messages: &[Message]) -> Vec<Value> {
    let mut out = Vec::new();
    for m in messages {
        match m.role {
            Role::Tool => {
                for p in &m.parts {
                    if let Part::ToolResult {
                        call_id,
                        name,
                        content,
                        ..
                    } = p
                    {
                        let mut o = Map::new();
                        o.insert("role".into(), json!("tool"));
                        o.insert("tool_call_id".into(), json!(call_id));
                        put(&mut o, "name", name.as_ref());
                        o.insert("content".into(), json!(content));
                        out.push(Value::Object(o));
                    }
                }
            }
            role => {
                let role = match role {
                    Role::System => "system",
                    Role::User => "user",
                    _ => "assistant",
                };
                let content: Vec<Part> = m
                    .parts
                    .iter()
                    .filter(|p| !matches!(p, Part::ToolCall(_)))
                    .cloned()
                    .collect();
                let mut o = Map::new();
                o.insert("role".into(), json!(role));
                o.insert("content".into(), encode_parts(&content));
                let calls: Vec<Value> = m
                    .parts
                    .iter()
                    .filter_map(|p| match p {
                        Part::ToolCall(c) => Some(encode_tool_call(c)),
                        _ => None,
                    })
                    .collect();
                if !calls.is_empty() {
                    o.insert("tool_calls".into(), Value::Array(calls));
                }
                out.push(Value::Object(o));
            }
        }
    }
    out
}
