//! Anthropic Messages (`POST /v1/messages`). Tool results live inside user
//! messages here; canonically they are their own `Tool` turn, split on the way
//! in and merged back on the way out.

use super::sse::SseEvent;
use super::*;
use crate::canonical::*;
use forgelog_schemas::SamplingParams;
use serde_json::json;

pub struct AnthropicDialect;

fn block_text(v: &Value) -> Result<String, DialectError> {
    match v {
        Value::String(s) => Ok(s.clone()),
        Value::Array(items) => {
            let mut s = String::new();
            for b in items {
                let b = obj(b, "content block")?;
                if opt_str(b, "type")? == Some("text") {
                    s.push_str(req_str(b, "text")?);
                }
            }
            Ok(s)
        }
        Value::Null => Ok(String::new()),
        _ => Err(DialectError::invalid(
            "tool_result content must be a string or an array",
        )),
    }
}

fn decode_image(b: &Map<String, Value>) -> Result<Image, DialectError> {
    let s = obj(b.get("source").unwrap_or(&Value::Null), "image source")?;
    match req_str(s, "type")? {
        "base64" => Ok(Image::Base64 {
            media_type: req_str(s, "media_type")?.to_string(),
            data: req_str(s, "data")?.to_string(),
        }),
        "url" => Ok(Image::Url(req_str(s, "url")?.to_string())),
        other => Err(DialectError::invalid(format!(
            "image source '{other}' is not supported"
        ))),
    }
}

fn push(messages: &mut Vec<Message>, role: Role, part: Part) {
    match messages.last_mut() {
        Some(m) if m.role == role => m.parts.push(part),
        _ => messages.push(Message {
            role,
            parts: vec![part],
        }),
    }
}

fn decode_message(v: &Value, out: &mut Vec<Message>) -> Result<(), DialectError> {
    let o = obj(v, "message")?;
    let role = match req_str(o, "role")? {
        // Not in Anthropic's reference, but sent (Claude Code): a system turn mid-conversation.
        "system" => Role::System,
        "user" => Role::User,
        "assistant" => Role::Assistant,
        other => return Err(DialectError::invalid(format!("unknown role '{other}'"))),
    };
    // Start a fresh message per harness message, so two user turns stay two.
    let start = out.len();
    let mut cur: Vec<Message> = Vec::new();
    match o.get("content") {
        Some(Value::String(s)) => cur.push(Message::text(role, s.clone())),
        Some(Value::Array(blocks)) => {
            for b in blocks {
                let b = obj(b, "content block")?;
                let part = match req_str(b, "type")? {
                    "text" => (role, Part::Text(req_str(b, "text")?.to_string())),
                    "image" => (role, Part::Image(decode_image(b)?)),
                    "tool_use" => (
                        Role::Assistant,
                        Part::ToolCall(ToolCall {
                            id: req_str(b, "id")?.to_string(),
                            name: req_str(b, "name")?.to_string(),
                            arguments: b.get("input").cloned().unwrap_or(json!({})).to_string(),
                        }),
                    ),
                    "tool_result" => (
                        Role::Tool,
                        Part::ToolResult {
                            call_id: req_str(b, "tool_use_id")?.to_string(),
                            name: None,
                            content: block_text(b.get("content").unwrap_or(&Value::Null))?,
                            is_error: opt_bool(b, "is_error")?.unwrap_or(false),
                        },
                    ),
                    // Extended thinking is the model's hidden state; not part of the prompt.
                    "thinking" | "redacted_thinking" => continue,
                    other => {
                        return Err(DialectError::invalid(format!(
                            "content block type '{other}' is not supported"
                        )))
                    }
                };
                push(&mut cur, part.0, part.1);
            }
        }
        _ => {
            return Err(DialectError::invalid(
                "'content' must be a string or an array",
            ))
        }
    }
    if cur.is_empty() {
        cur.push(Message {
            role,
            parts: Vec::new(),
        });
    }
    debug_assert!(out.len() == start);
    out.extend(cur);
    Ok(())
}

fn encode_block(p: &Part) -> Option<Value> {
    Some(match p {
        Part::Text(t) => json!({"type": "text", "text": t}),
        Part::Image(Image::Base64 { media_type, data }) => {
            json!({"type": "image", "source": {"type": "base64", "media_type": media_type, "data": data}})
        }
        Part::Image(Image::Url(u)) => json!({"type": "image", "source": {"type": "url", "url": u}}),
        Part::ToolCall(c) => {
            json!({"type": "tool_use", "id": c.id, "name": c.name, "input": arguments_object(&c.arguments)})
        }
        Part::ToolResult {
            call_id,
            content,
            is_error,
            ..
        } => {
            let mut o = json!({"type": "tool_result", "tool_use_id": call_id, "content": content});
            if *is_error {
                o["is_error"] = json!(true);
            }
            o
        }
    })
}

fn stop_reason(f: FinishReason) -> &'static str {
    match f {
        FinishReason::Stop | FinishReason::ContentFilter => "end_turn",
        FinishReason::Length => "max_tokens",
        FinishReason::ToolCalls => "tool_use",
        FinishReason::StopSequence => "stop_sequence",
    }
}

fn msg_id(resp: &ChatResponse) -> String {
    format!("msg_{}", resp.id)
}

impl DialectAdapter for AnthropicDialect {
    const KIND: forgelog_schemas::Dialect = forgelog_schemas::Dialect::AnthropicMessages;

    fn decode_request(body: &Value, _hints: &RouteHints) -> Result<ChatRequest, DialectError> {
        let o = obj(body, "request body")?;
        let mut messages = Vec::new();
        match o.get("system") {
            None | Some(Value::Null) => {}
            Some(v) => messages.push(Message::text(Role::System, block_text(v)?)),
        }
        for m in opt_array(o, "messages")? {
            decode_message(m, &mut messages)?;
        }
        // Server tools (`web_search_20250305`...) run on Anthropic's side: the
        // engine cannot call them, so they stay out of the prompt (the raw
        // request keeps them) rather than failing the call.
        let mut tools = Vec::new();
        for t in opt_array(o, "tools")? {
            let t = obj(t, "tool")?;
            if opt_str(t, "type")?.is_some_and(|kind| kind != "custom") {
                continue;
            }
            tools.push(ToolSpec {
                name: req_str(t, "name")?.to_string(),
                description: opt_str(t, "description")?.map(str::to_string),
                parameters: t.get("input_schema").cloned().unwrap_or(json!({})),
            });
        }
        let tool_choice = match o.get("tool_choice") {
            None | Some(Value::Null) => None,
            Some(v) => {
                let c = obj(v, "tool_choice")?;
                Some(match req_str(c, "type")? {
                    "auto" => ToolChoice::Auto,
                    "any" => ToolChoice::Required,
                    "none" => ToolChoice::None,
                    "tool" => ToolChoice::Named(req_str(c, "name")?.to_string()),
                    other => {
                        return Err(DialectError::invalid(format!(
                            "unknown tool_choice '{other}'"
                        )))
                    }
                })
            }
        };
        Ok(ChatRequest {
            model: opt_str(o, "model")?.unwrap_or_default().to_string(),
            messages,
            tools,
            tool_choice,
            sampling: SamplingParams {
                temperature: opt_f64(o, "temperature")?,
                top_p: opt_f64(o, "top_p")?,
                top_k: opt_i64(o, "top_k")?,
                max_tokens: opt_i64(o, "max_tokens")?,
                stop: stop_list(o, "stop_sequences")?,
                ..Default::default()
            },
            stream: opt_bool(o, "stream")?.unwrap_or(false),
            stream_usage: false,
        })
    }

    fn encode_request(req: &ChatRequest) -> Value {
        let mut o = Map::new();
        o.insert("model".into(), json!(req.model));
        let mut msgs = &req.messages[..];
        if let Some(Message {
            role: Role::System, ..
        }) = msgs.first()
        {
            o.insert("system".into(), json!(msgs[0].joined_text()));
            msgs = &msgs[1..];
        }
        let mut out: Vec<Value> = Vec::new();
        let mut prev: Option<Role> = None;
        for m in msgs {
            let blocks: Vec<Value> = m.parts.iter().filter_map(encode_block).collect();
            // Tool results and the user text after them were one Anthropic user message.
            if prev == Some(Role::Tool) && m.role == Role::User {
                if let Some(Value::Array(content)) = out.last_mut().map(|v| &mut v["content"]) {
                    content.extend(blocks);
                    prev = Some(m.role);
                    continue;
                }
            }
            let role = match m.role {
                Role::Assistant => "assistant",
                Role::System => "system",
                Role::User | Role::Tool => "user",
            };
            out.push(json!({"role": role, "content": blocks}));
            prev = Some(m.role);
        }
        o.insert("messages".into(), Value::Array(out));
        if !req.tools.is_empty() {
            let tools: Vec<Value> = req
                .tools
                .iter()
                .map(|t| {
                    let f = tool_declaration(t, "input_schema");
                    Value::Object(f)
                })
                .collect();
            o.insert("tools".into(), Value::Array(tools));
        }
        put(
            &mut o,
            "tool_choice",
            req.tool_choice.as_ref().map(|c| match c {
                ToolChoice::Auto => json!({"type": "auto"}),
                ToolChoice::None => json!({"type": "none"}),
                ToolChoice::Required => json!({"type": "any"}),
                ToolChoice::Named(n) => json!({"type": "tool", "name": n}),
            }),
        );
        let s = &req.sampling;
        put(&mut o, "temperature", s.temperature);
        put(&mut o, "top_p", s.top_p);
        put(&mut o, "top_k", s.top_k);
        put(&mut o, "max_tokens", s.max_tokens);
        if !s.stop.is_empty() {
            o.insert("stop_sequences".into(), json!(s.stop));
        }
        if req.stream {
            o.insert("stream".into(), json!(true));
        }
        Value::Object(o)
    }

    fn encode_response(resp: &ChatResponse) -> Value {
        let content: Vec<Value> = resp.parts.iter().filter_map(encode_block).collect();
        json!({
            "id": msg_id(resp), "type": "message", "role": "assistant", "model": resp.model,
            "content": content, "stop_reason": stop_reason(resp.finish), "stop_sequence": null,
            "usage": {"input_tokens": resp.usage.input, "output_tokens": resp.usage.output},
        })
    }

    fn decode_response(body: &Value) -> Result<ChatResponse, DialectError> {
        let o = obj(body, "response")?;
        let mut msgs = Vec::new();
        decode_message(
            &json!({"role": "assistant", "content": o.get("content").cloned().unwrap_or(json!([]))}),
            &mut msgs,
        )?;
        let u = o.get("usage").and_then(Value::as_object);
        let count = |k: &str| u.and_then(|u| u.get(k)).and_then(Value::as_u64);
        Ok(ChatResponse {
            id: opt_str(o, "id")?
                .unwrap_or_default()
                .trim_start_matches("msg_")
                .to_string(),
            model: opt_str(o, "model")?.unwrap_or_default().to_string(),
            created: 0,
            parts: msgs.into_iter().flat_map(|m| m.parts).collect(),
            finish: match opt_str(o, "stop_reason")? {
                Some("max_tokens") => FinishReason::Length,
                Some("tool_use") => FinishReason::ToolCalls,
                Some("stop_sequence") => FinishReason::StopSequence,
                _ => FinishReason::Stop,
            },
            usage: TokenUsage {
                input: count("input_tokens").unwrap_or(0),
                output: count("output_tokens").unwrap_or(0),
            },
        })
    }

    fn stream_events(resp: &ChatResponse, _req: &ChatRequest) -> Vec<SseEvent> {
        let mut events = vec![SseEvent::named(
            "message_start",
            json!({"type": "message_start", "message": {
                "id": msg_id(resp), "type": "message", "role": "assistant", "model": resp.model,
                "content": [], "stop_reason": null, "stop_sequence": null,
                "usage": {"input_tokens": resp.usage.input, "output_tokens": 0},
            }}),
        )];
        for (index, p) in resp.parts.iter().enumerate() {
            let (start, delta) = match p {
                Part::Text(t) => (
                    json!({"type": "text", "text": ""}),
                    json!({"type": "text_delta", "text": t}),
                ),
                Part::ToolCall(c) => (
                    json!({"type": "tool_use", "id": c.id, "name": c.name, "input": {}}),
                    json!({"type": "input_json_delta",
                           "partial_json": arguments_object(&c.arguments).to_string()}),
                ),
                _ => continue,
            };
            events.push(SseEvent::named(
                "content_block_start",
                json!({"type": "content_block_start", "index": index, "content_block": start}),
            ));
            events.push(SseEvent::named(
                "content_block_delta",
                json!({"type": "content_block_delta", "index": index, "delta": delta}),
            ));
            events.push(SseEvent::named(
                "content_block_stop",
                json!({"type": "content_block_stop", "index": index}),
            ));
        }
        events.push(SseEvent::named(
            "message_delta",
            json!({"type": "message_delta",
            "delta": {"stop_reason": stop_reason(resp.finish), "stop_sequence": null},
            "usage": {"output_tokens": resp.usage.output}}),
        ));
        events.push(SseEvent::named(
            "message_stop",
            json!({"type": "message_stop"}),
        ));
        events
    }

    fn error_body(err: &DialectError) -> Value {
        let kind = match err.kind {
            ErrorKind::InvalidRequest | ErrorKind::ContextLength => "invalid_request_error",
            ErrorKind::Authentication => "authentication_error",
            ErrorKind::NotFound => "not_found_error",
            ErrorKind::TooLarge => "request_too_large",
            ErrorKind::RateLimited => "rate_limit_error",
            ErrorKind::Upstream | ErrorKind::Timeout | ErrorKind::Unavailable => "overloaded_error",
            ErrorKind::Internal => "api_error",
        };
        // Anthropic's own wording, which clients match to start compacting.
        let message = match err.kind {
            ErrorKind::ContextLength => format!("prompt is too long: {}", err.message),
            _ => err.message.clone(),
        };
        json!({"type": "error", "error": {"type": kind, "message": message}})
    }

    fn stream_error(err: &DialectError) -> SseEvent {
        SseEvent::named("error", Self::error_body(err))
    }
}
