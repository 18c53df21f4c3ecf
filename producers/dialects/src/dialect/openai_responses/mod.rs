//! OpenAI Responses (`POST /v1/responses`). Stateless: `previous_response_id`
//! is refused (the harness must send the whole conversation, which is what
//! gets recorded). An assistant's text and the function calls that follow it
//! are one canonical assistant turn, in both directions.

mod items;

use super::sse::SseEvent;
use super::*;
use crate::canonical::*;
use forgelog_schemas::SamplingParams;
use items::*;
use serde_json::json;

pub struct OpenAiResponsesDialect;

fn decode_content(v: Option<&Value>) -> Result<Vec<Part>, DialectError> {
    match v {
        None | Some(Value::Null) => Ok(Vec::new()),
        Some(Value::String(s)) => Ok(vec![Part::Text(s.clone())]),
        Some(Value::Array(items)) => items
            .iter()
            .filter_map(|item| {
                let o = match obj(item, "content part") {
                    Ok(o) => o,
                    Err(e) => return Some(Err(e)),
                };
                let part = match o.get("type").and_then(Value::as_str) {
                    Some("input_text" | "output_text" | "text") => {
                        req_str(o, "text").map(|t| Part::Text(t.to_string()))
                    }
                    Some("input_image") => req_str(o, "image_url")
                        .map(|u| Part::Image(Image::from_url(u)))
                        .map_err(|_| {
                            DialectError::invalid(
                                "input_image needs 'image_url' (file_id is not supported)",
                            )
                        }),
                    // The model's own refusals and reasoning summaries carry nothing to resend.
                    Some("refusal" | "summary_text" | "reasoning_text") => return None,
                    other => Err(DialectError::invalid(format!(
                        "content part type {other:?} is not supported"
                    ))),
                };
                Some(part)
            })
            .collect(),
        Some(_) => Err(DialectError::invalid(
            "'content' must be a string or an array",
        )),
    }
}

/// Appends `part` to the last message when it has `role`, else starts one.
fn push_part(messages: &mut Vec<Message>, role: Role, part: Part) {
    match messages.last_mut() {
        Some(m) if m.role == role => m.parts.push(part),
        _ => messages.push(Message {
            role,
            parts: vec![part],
        }),
    }
}

fn decode_input(v: Option<&Value>, messages: &mut Vec<Message>) -> Result<(), DialectError> {
    let items = match v {
        None | Some(Value::Null) => return Err(DialectError::invalid("'input' is required")),
        Some(Value::String(s)) => {
            messages.push(Message::text(Role::User, s.clone()));
            return Ok(());
        }
        Some(Value::Array(a)) => a,
        Some(_) => {
            return Err(DialectError::invalid(
                "'input' must be a string or an array",
            ))
        }
    };
    for item in items {
        let o = obj(item, "input item")?;
        match opt_str(o, "type")?.unwrap_or("message") {
            "message" => {
                let role = match req_str(o, "role")? {
                    "system" | "developer" => Role::System,
                    "user" => Role::User,
                    "assistant" => Role::Assistant,
                    other => return Err(DialectError::invalid(format!("unknown role '{other}'"))),
                };
                let parts = decode_content(o.get("content"))?;
                if role == Role::Assistant {
                    for p in parts {
                        push_part(messages, role, p);
                    }
                } else {
                    messages.push(Message { role, parts });
                }
            }
            "function_call" => push_part(
                messages,
                Role::Assistant,
                Part::ToolCall(ToolCall {
                    id: req_str(o, "call_id")?.to_string(),
                    name: req_str(o, "name")?.to_string(),
                    arguments: opt_str(o, "arguments")?.unwrap_or_default().to_string(),
                }),
            ),
            "function_call_output" => {
                let content = match o.get("output") {
                    Some(Value::String(s)) => s.clone(),
                    Some(v @ Value::Array(_)) => Message {
                        role: Role::Tool,
                        parts: decode_content(Some(v))?,
                    }
                    .joined_text(),
                    _ => return Err(DialectError::invalid("function_call_output needs 'output'")),
                };
                push_part(
                    messages,
                    Role::Tool,
                    Part::ToolResult {
                        call_id: req_str(o, "call_id")?.to_string(),
                        name: None,
                        content,
                        is_error: false,
                    },
                );
            }
            // Reasoning items are the model's hidden state: nothing the prompt needs.
            "reasoning" => {}
            other => {
                return Err(DialectError::invalid(format!(
                    "input item type '{other}' is not supported"
                )))
            }
        }
    }
    Ok(())
}

/// Function tools, with those of a `namespace` group flattened in. Hosted
/// tools (`web_search`, `file_search`, `code_interpreter`, `custom`...) run on
/// OpenAI's side; the engine cannot call them, so they are left out of the
/// prompt (the raw request keeps them) rather than failing the call.
fn decode_tools(tools: &[Value], out: &mut Vec<ToolSpec>) -> Result<(), DialectError> {
    for t in tools {
        let t = obj(t, "tool")?;
        match opt_str(t, "type")? {
            Some("function") => out.push(ToolSpec {
                name: req_str(t, "name")?.to_string(),
                description: opt_str(t, "description")?.map(str::to_string),
                parameters: t.get("parameters").cloned().unwrap_or(json!({})),
            }),
            Some("namespace") => decode_tools(opt_array(t, "tools")?, out)?,
            _ => {}
        }
    }
    Ok(())
}

/// `tool_choice`; a named tool is `{"type": "function", "name": ..}`.
fn decode_tool_choice(v: Option<&Value>) -> Result<Option<ToolChoice>, DialectError> {
    decode_openai_tool_choice(v, |o| Ok(req_str(o, "name")?.to_string()))
}

impl DialectAdapter for OpenAiResponsesDialect {
    const KIND: forgelog_schemas::Dialect = forgelog_schemas::Dialect::OpenaiResponses;

    fn decode_request(body: &Value, _hints: &RouteHints) -> Result<ChatRequest, DialectError> {
        let o = obj(body, "request body")?;
        if opt_str(o, "previous_response_id")?.is_some() {
            return Err(DialectError::invalid(
                "'previous_response_id' is not supported: the proxy is stateless; send the whole conversation in 'input'",
            ));
        }
        if opt_bool(o, "background")? == Some(true) {
            return Err(DialectError::invalid("'background' is not supported"));
        }
        let mut messages = Vec::new();
        if let Some(instructions) = opt_str(o, "instructions")? {
            messages.push(Message::text(Role::System, instructions));
        }
        decode_input(o.get("input"), &mut messages)?;
        let mut tools = Vec::new();
        decode_tools(opt_array(o, "tools")?, &mut tools)?;
        Ok(ChatRequest {
            model: opt_str(o, "model")?.unwrap_or_default().to_string(),
            messages,
            tools,
            tool_choice: decode_tool_choice(o.get("tool_choice"))?,
            sampling: SamplingParams {
                temperature: opt_f64(o, "temperature")?,
                top_p: opt_f64(o, "top_p")?,
                max_tokens: opt_i64(o, "max_output_tokens")?,
                ..Default::default()
            },
            stream: opt_bool(o, "stream")?.unwrap_or(false),
            stream_usage: false,
        })
    }

    fn encode_request(req: &ChatRequest) -> Value {
        let mut input = Vec::new();
        let mut instructions = None;
        for (i, m) in req.messages.iter().enumerate() {
            match m.role {
                Role::System if i == 0 => instructions = Some(m.joined_text()),
                Role::System | Role::User => {
                    let content: Vec<Value> = m
                        .parts
                        .iter()
                        .filter_map(|p| match p {
                            Part::Text(t) => Some(json!({"type": "input_text", "text": t})),
                            Part::Image(img) => {
                                Some(json!({"type": "input_image", "image_url": img.to_url()}))
                            }
                            _ => None,
                        })
                        .collect();
                    let role = if m.role == Role::System {
                        "developer"
                    } else {
                        "user"
                    };
                    input.push(json!({"type": "message", "role": role, "content": content}));
                }
                Role::Assistant => {
                    for p in &m.parts {
                        match p {
                            Part::Text(t) => input
                                .push(json!({"type": "message", "role": "assistant",
                                "content": [{"type": "output_text", "text": t}]})),
                            Part::ToolCall(c) => input.push(json!({"type": "function_call",
                                "call_id": c.id, "name": c.name, "arguments": c.arguments})),
                            _ => {}
                        }
                    }
                }
                Role::Tool => {
                    for p in &m.parts {
                        if let Part::ToolResult {
                            call_id, content, ..
                        } = p
                        {
                            input.push(json!({"type": "function_call_output", "call_id": call_id, "output": content}));
                        }
                    }
                }
            }
        }
        let mut o = Map::new();
        o.insert("model".into(), json!(req.model));
        put(&mut o, "instructions", instructions);
        o.insert("input".into(), Value::Array(input));
        if !req.tools.is_empty() {
            let tools: Vec<Value> = req
                .tools
                .iter()
                .map(|t| {
                    let mut f = Map::new();
                    f.insert("type".into(), json!("function"));
                    f.insert("name".into(), json!(t.name));
                    put(&mut f, "description", t.description.as_ref());
                    f.insert("parameters".into(), t.parameters.clone());
                    Value::Object(f)
                })
                .collect();
            o.insert("tools".into(), Value::Array(tools));
        }
        put(
            &mut o,
            "tool_choice",
            req.tool_choice.as_ref().map(|c| match c {
                ToolChoice::Auto => json!("auto"),
                ToolChoice::None => json!("none"),
                ToolChoice::Required => json!("required"),
                ToolChoice::Named(n) => json!({"type": "function", "name": n}),
            }),
        );
        put(&mut o, "temperature", req.sampling.temperature);
        put(&mut o, "top_p", req.sampling.top_p);
        put(&mut o, "max_output_tokens", req.sampling.max_tokens);
        if req.stream {
            o.insert("stream".into(), json!(true));
        }
        Value::Object(o)
    }

    fn encode_response(resp: &ChatResponse) -> Value {
        response_object(resp, None, true)
    }

    fn decode_response(body: &Value) -> Result<ChatResponse, DialectError> {
        let o = obj(body, "response")?;
        let mut messages = Vec::new();
        decode_input(Some(o.get("output").unwrap_or(&json!([]))), &mut messages)?;
        let parts: Vec<Part> = messages.into_iter().flat_map(|m| m.parts).collect();
        let u = o.get("usage").and_then(Value::as_object);
        let count = |k: &str| u.and_then(|u| u.get(k)).and_then(Value::as_u64);
        let finish = if opt_str(o, "status")? == Some("incomplete") {
            FinishReason::Length
        } else if parts.iter().any(|p| matches!(p, Part::ToolCall(_))) {
            FinishReason::ToolCalls
        } else {
            FinishReason::Stop
        };
        Ok(ChatResponse {
            id: opt_str(o, "id")?
                .unwrap_or_default()
                .trim_start_matches("resp_")
                .to_string(),
            model: opt_str(o, "model")?.unwrap_or_default().to_string(),
            created: opt_i64(o, "created_at")?.unwrap_or(0),
            parts,
            finish,
            usage: TokenUsage {
                input: count("input_tokens").unwrap_or(0),
                output: count("output_tokens").unwrap_or(0),
            },
        })
    }

    fn stream_events(resp: &ChatResponse, req: &ChatRequest) -> Vec<SseEvent> {
        let mut events = Vec::new();
        let mut ev = |name: &'static str, mut v: Value| {
            v["type"] = json!(name);
            v["sequence_number"] = json!(events.len());
            events.push(SseEvent::named(name, v));
        };
        ev(
            "response.created",
            json!({"response": response_object(resp, Some(req), false)}),
        );
        ev(
            "response.in_progress",
            json!({"response": response_object(resp, Some(req), false)}),
        );
        let mut output_index = 0;
        let text = resp.text();
        if !text.is_empty() {
            let item_id = message_id(resp);
            let at = json!({"item_id": item_id, "output_index": output_index, "content_index": 0});
            let with = |mut base: Value, k: &str, v: Value| {
                base[k] = v;
                base
            };
            ev(
                "response.output_item.added",
                json!({"output_index": output_index, "item": message_item(resp, "", "in_progress")}),
            );
            ev(
                "response.content_part.added",
                with(at.clone(), "part", text_part("")),
            );
            ev(
                "response.output_text.delta",
                with(
                    with(at.clone(), "delta", json!(text)),
                    "logprobs",
                    json!([]),
                ),
            );
            ev(
                "response.output_text.done",
                with(with(at.clone(), "text", json!(text)), "logprobs", json!([])),
            );
            ev(
                "response.content_part.done",
                with(at, "part", text_part(&text)),
            );
            ev(
                "response.output_item.done",
                json!({"output_index": output_index, "item": message_item(resp, &text, "completed")}),
            );
            output_index += 1;
        }
        for (i, c) in resp.tool_calls().enumerate() {
            let item_id = call_item_id(resp, i);
            ev(
                "response.output_item.added",
                json!({"output_index": output_index, "item": call_item(resp, i, c, "", "in_progress")}),
            );
            ev(
                "response.function_call_arguments.delta",
                json!({"item_id": item_id, "output_index": output_index, "delta": c.arguments}),
            );
            ev(
                "response.function_call_arguments.done",
                json!({"item_id": item_id, "output_index": output_index, "name": c.name, "arguments": c.arguments}),
            );
            ev(
                "response.output_item.done",
                json!({"output_index": output_index, "item": call_item(resp, i, c, &c.arguments, "completed")}),
            );
            output_index += 1;
        }
        let done = response_object(resp, Some(req), true);
        let name = if done["status"] == "incomplete" {
            "response.incomplete"
        } else {
            "response.completed"
        };
        ev(name, json!({ "response": done }));
        events
    }

    fn error_body(err: &DialectError) -> Value {
        super::OpenAiChatDialect::error_body(err)
    }

    fn stream_error(err: &DialectError) -> SseEvent {
        SseEvent::named(
            "error",
            json!({"type": "error", "code": super::openai_chat::error_code(err), "message": err.message, "param": null, "sequence_number": 0}),
        )
    }
}
