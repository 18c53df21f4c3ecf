//! OpenAI Chat Completions (`POST /v1/chat/completions`). Also the shape the
//! upstream (vLLM) speaks, so [`OpenAiChatDialect::encode_request`] builds the
//! upstream request and [`OpenAiChatDialect::decode_response`] reads its answer.

use super::sse::SseEvent;
use super::*;
use crate::canonical::*;
use forgelog_schemas::SamplingParams;
use serde_json::json;

mod messages;

use messages::{decode_content, decode_message, decode_tool_choice, decode_tools, encode_messages};
pub(crate) use messages::{decode_tool_calls, encode_tool_call, encode_tool_choice};

pub struct OpenAiChatDialect;

/// The OpenAI sampling fields of `o`.
pub(crate) fn decode_sampling(o: &Map<String, Value>) -> Result<SamplingParams, DialectError> {
    Ok(SamplingParams {
        temperature: opt_f64(o, "temperature")?,
        top_p: opt_f64(o, "top_p")?,
        top_k: opt_i64(o, "top_k")?,
        min_p: opt_f64(o, "min_p")?,
        max_tokens: match opt_i64(o, "max_completion_tokens")? {
            Some(n) => Some(n),
            None => opt_i64(o, "max_tokens")?,
        },
        seed: opt_i64(o, "seed")?,
        presence_penalty: opt_f64(o, "presence_penalty")?,
        frequency_penalty: opt_f64(o, "frequency_penalty")?,
        stop: stop_list(o, "stop")?,
    })
}

pub(crate) fn encode_sampling(o: &mut Map<String, Value>, s: &SamplingParams) {
    put(o, "temperature", s.temperature);
    put(o, "top_p", s.top_p);
    put(o, "top_k", s.top_k);
    put(o, "min_p", s.min_p);
    put(o, "max_tokens", s.max_tokens);
    put(o, "seed", s.seed);
    put(o, "presence_penalty", s.presence_penalty);
    put(o, "frequency_penalty", s.frequency_penalty);
    if !s.stop.is_empty() {
        o.insert("stop".into(), json!(s.stop));
    }
}

/// OpenAI's error `code`: set where clients act on it.
pub(crate) fn error_code(err: &DialectError) -> Value {
    match err.kind {
        ErrorKind::ContextLength => json!("context_length_exceeded"),
        _ => Value::Null,
    }
}

fn chat_id(resp: &ChatResponse) -> String {
    format!("chatcmpl-{}", resp.id)
}

fn usage(u: &TokenUsage) -> Value {
    json!({"prompt_tokens": u.input, "completion_tokens": u.output, "total_tokens": u.input + u.output})
}

impl DialectAdapter for OpenAiChatDialect {
    const KIND: forgelog_schemas::Dialect = forgelog_schemas::Dialect::OpenaiChat;

    fn decode_request(body: &Value, _hints: &RouteHints) -> Result<ChatRequest, DialectError> {
        let o = obj(body, "request body")?;
        single_choice(o, "n")?;
        let mut messages: Vec<Message> = Vec::new();
        for m in opt_array(o, "messages")? {
            let m = decode_message(m)?;
            // Consecutive tool messages answer one assistant turn: one canonical Tool turn.
            match messages.last_mut() {
                Some(last) if last.role == Role::Tool && m.role == Role::Tool => {
                    last.parts.extend(m.parts)
                }
                _ => messages.push(m),
            }
        }
        if messages.is_empty() {
            return Err(DialectError::invalid("'messages' must not be empty"));
        }
        let stream_usage = match o.get("stream_options") {
            Some(v @ Value::Object(_)) => {
                opt_bool(obj(v, "stream_options")?, "include_usage")?.unwrap_or(false)
            }
            _ => false,
        };
        Ok(ChatRequest {
            model: opt_str(o, "model")?.unwrap_or_default().to_string(),
            messages,
            tools: decode_tools(opt_array(o, "tools")?)?,
            tool_choice: decode_tool_choice(o.get("tool_choice"))?,
            sampling: decode_sampling(o)?,
            stream: opt_bool(o, "stream")?.unwrap_or(false),
            stream_usage,
        })
    }

    fn encode_request(req: &ChatRequest) -> Value {
        let mut o = Map::new();
        o.insert("model".into(), json!(req.model));
        o.insert(
            "messages".into(),
            Value::Array(encode_messages(&req.messages)),
        );
        if !req.tools.is_empty() {
            let tools: Vec<Value> = req
                .tools
                .iter()
                .map(|t| {
                    let f = tool_declaration(t, "parameters");
                    json!({"type": "function", "function": f})
                })
                .collect();
            o.insert("tools".into(), Value::Array(tools));
        }
        put(
            &mut o,
            "tool_choice",
            req.tool_choice.as_ref().map(encode_tool_choice),
        );
        encode_sampling(&mut o, &req.sampling);
        if req.stream {
            o.insert("stream".into(), json!(true));
            if req.stream_usage {
                o.insert("stream_options".into(), json!({"include_usage": true}));
            }
        }
        Value::Object(o)
    }

    fn encode_response(resp: &ChatResponse) -> Value {
        let text = resp.text();
        let calls: Vec<Value> = resp.tool_calls().map(encode_tool_call).collect();
        let mut message = Map::new();
        message.insert("role".into(), json!("assistant"));
        message.insert(
            "content".into(),
            if text.is_empty() && !calls.is_empty() {
                Value::Null
            } else {
                json!(text)
            },
        );
        if !calls.is_empty() {
            message.insert("tool_calls".into(), Value::Array(calls));
        }
        json!({
            "id": chat_id(resp),
            "object": "chat.completion",
            "created": resp.created,
            "model": resp.model,
            "choices": [{"index": 0, "message": message, "finish_reason": resp.finish.openai(), "logprobs": null}],
            "usage": usage(&resp.usage),
        })
    }

    fn decode_response(body: &Value) -> Result<ChatResponse, DialectError> {
        let o = obj(body, "response")?;
        let choice = opt_array(o, "choices")?
            .first()
            .ok_or_else(|| DialectError::invalid("response has no choices"))?;
        let c = obj(choice, "choice")?;
        let m = obj(c.get("message").unwrap_or(&Value::Null), "message")?;
        let mut parts = decode_content(m.get("content").unwrap_or(&Value::Null))?;
        parts.retain(|p| !matches!(p, Part::Text(t) if t.is_empty()));
        parts.extend(decode_tool_calls(opt_array(m, "tool_calls")?)?);
        let u = o.get("usage").and_then(Value::as_object);
        let count = |k: &str| u.and_then(|u| u.get(k)).and_then(Value::as_u64);
        Ok(ChatResponse {
            id: opt_str(o, "id")?
                .unwrap_or_default()
                .trim_start_matches("chatcmpl-")
                .to_string(),
            model: opt_str(o, "model")?.unwrap_or_default().to_string(),
            created: opt_i64(o, "created")?.unwrap_or(0),
            parts,
            finish: FinishReason::from_openai(opt_str(c, "finish_reason")?.unwrap_or("stop")),
            usage: TokenUsage {
                input: count("prompt_tokens").unwrap_or(0),
                output: count("completion_tokens").unwrap_or(0),
            },
        })
    }

    fn stream_events(resp: &ChatResponse, req: &ChatRequest) -> Vec<SseEvent> {
        let chunk = |delta: Value, finish: Value| {
            SseEvent::data(json!({
                "id": chat_id(resp), "object": "chat.completion.chunk", "created": resp.created,
                "model": resp.model,
                "choices": [{"index": 0, "delta": delta, "finish_reason": finish, "logprobs": null}],
            }))
        };
        let mut events = vec![chunk(
            json!({"role": "assistant", "content": ""}),
            Value::Null,
        )];
        let text = resp.text();
        if !text.is_empty() {
            events.push(chunk(json!({"content": text}), Value::Null));
        }
        for (i, c) in resp.tool_calls().enumerate() {
            events.push(chunk(
                json!({"tool_calls": [{"index": i, "id": c.id, "type": "function",
                    "function": {"name": c.name, "arguments": ""}}]}),
                Value::Null,
            ));
            events.push(chunk(
                json!({"tool_calls": [{"index": i, "function": {"arguments": c.arguments}}]}),
                Value::Null,
            ));
        }
        events.push(chunk(json!({}), json!(resp.finish.openai())));
        if req.stream_usage {
            events.push(SseEvent::data(json!({
                "id": chat_id(resp), "object": "chat.completion.chunk", "created": resp.created,
                "model": resp.model, "choices": [], "usage": usage(&resp.usage),
            })));
        }
        events
    }

    fn error_body(err: &DialectError) -> Value {
        let kind = match err.kind {
            ErrorKind::InvalidRequest
            | ErrorKind::ContextLength
            | ErrorKind::NotFound
            | ErrorKind::TooLarge => "invalid_request_error",
            ErrorKind::Authentication => "authentication_error",
            ErrorKind::RateLimited => "rate_limit_error",
            _ => "api_error",
        };
        json!({"error": {"message": err.message, "type": kind, "param": null, "code": error_code(err)}})
    }

    fn stream_end() -> Option<SseEvent> {
        Some(SseEvent {
            event: None,
            data: "[DONE]".into(),
        })
    }
}
