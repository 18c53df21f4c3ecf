//! Gemini (`POST /v1beta/models/{model}:generateContent` and
//! `:streamGenerateContent`). The model and streaming come from the path.
//! Gemini's function calls may lack ids; the proxy gives them `call_N` and
//! matches responses to calls by name, oldest unanswered first.

use super::sse::SseEvent;
use super::*;
use crate::canonical::*;
use forgelog_schemas::SamplingParams;
use serde_json::json;

mod field_names;
use field_names::lower_camel_fields;

pub struct GeminiDialect;

fn decode_parts(
    parts: &[Value],
    role: Role,
    pending: &mut Vec<(String, String)>,
    next_id: &mut usize,
    out: &mut Vec<Message>,
) -> Result<(), DialectError> {
    let push = |out: &mut Vec<Message>, role: Role, part: Part| match out.last_mut() {
        Some(m) if m.role == role => m.parts.push(part),
        _ => out.push(Message {
            role,
            parts: vec![part],
        }),
    };
    let first = out.len();
    for p in parts {
        let p = obj(p, "part")?;
        if p.get("thought").and_then(Value::as_bool) == Some(true) {
            continue; // the model's thinking: not part of the prompt
        }
        if let Some(t) = opt_str(p, "text")? {
            push(out, role, Part::Text(t.to_string()));
        } else if let Some(d) = p.get("inlineData") {
            let d = obj(d, "inlineData")?;
            push(
                out,
                role,
                Part::Image(Image::Base64 {
                    media_type: req_str(d, "mimeType")?.to_string(),
                    data: req_str(d, "data")?.to_string(),
                }),
            );
        } else if let Some(d) = p.get("fileData") {
            push(
                out,
                role,
                Part::Image(Image::Url(
                    req_str(obj(d, "fileData")?, "fileUri")?.to_string(),
                )),
            );
        } else if let Some(c) = p.get("functionCall") {
            let c = obj(c, "functionCall")?;
            let name = req_str(c, "name")?.to_string();
            let id = match opt_str(c, "id")? {
                Some(id) => id.to_string(),
                None => {
                    *next_id += 1;
                    format!("call_{}", *next_id - 1)
                }
            };
            pending.push((id.clone(), name.clone()));
            let args = c.get("args").cloned().unwrap_or(json!({}));
            push(
                out,
                Role::Assistant,
                Part::ToolCall(ToolCall {
                    id,
                    name,
                    arguments: args.to_string(),
                }),
            );
        } else if let Some(r) = p.get("functionResponse") {
            let r = obj(r, "functionResponse")?;
            let name = req_str(r, "name")?.to_string();
            let call_id = match opt_str(r, "id")? {
                Some(id) => id.to_string(),
                None => match pending.iter().position(|(_, n)| *n == name) {
                    Some(i) => pending.remove(i).0,
                    None => name.clone(),
                },
            };
            pending.retain(|(id, _)| *id != call_id);
            let content = r.get("response").cloned().unwrap_or(json!({})).to_string();
            push(
                out,
                Role::Tool,
                Part::ToolResult {
                    call_id,
                    name: Some(name),
                    content,
                    is_error: false,
                },
            );
        } else {
            return Err(DialectError::invalid("part kind is not supported (text, inlineData, fileData, functionCall, functionResponse)"));
        }
    }
    if out.len() == first {
        out.push(Message {
            role,
            parts: Vec::new(),
        });
    }
    Ok(())
}

fn encode_part(p: &Part) -> Value {
    match p {
        Part::Text(t) => json!({"text": t}),
        Part::Image(Image::Base64 { media_type, data }) => {
            json!({"inlineData": {"mimeType": media_type, "data": data}})
        }
        Part::Image(Image::Url(u)) => json!({"fileData": {"fileUri": u}}),
        Part::ToolCall(c) => {
            json!({"functionCall": {"id": c.id, "name": c.name, "args": arguments_object(&c.arguments)}})
        }
        Part::ToolResult {
            call_id,
            name,
            content,
            ..
        } => {
            let response = match serde_json::from_str::<Value>(content) {
                Ok(v @ Value::Object(_)) => v,
                _ => json!({"result": content}),
            };
            json!({"functionResponse": {"id": call_id, "name": name.clone().unwrap_or_default(), "response": response}})
        }
    }
}

fn finish_reason(f: FinishReason) -> &'static str {
    match f {
        FinishReason::Length => "MAX_TOKENS",
        FinishReason::ContentFilter => "SAFETY",
        _ => "STOP",
    }
}

fn response_chunk(
    resp: &ChatResponse,
    parts: Vec<Value>,
    finish: Option<&str>,
    usage: bool,
) -> Value {
    let mut candidate = json!({"content": {"role": "model", "parts": parts}, "index": 0});
    if let Some(f) = finish {
        candidate["finishReason"] = json!(f);
    }
    let mut o =
        json!({"candidates": [candidate], "modelVersion": resp.model, "responseId": resp.id});
    if usage {
        o["usageMetadata"] = json!({"promptTokenCount": resp.usage.input,
            "candidatesTokenCount": resp.usage.output, "totalTokenCount": resp.usage.input + resp.usage.output});
    }
    o
}

impl DialectAdapter for GeminiDialect {
    const KIND: forgelog_schemas::Dialect = forgelog_schemas::Dialect::Gemini;

    fn decode_request(body: &Value, hints: &RouteHints) -> Result<ChatRequest, DialectError> {
        let body = lower_camel_fields(body);
        let o = obj(&body, "request body")?;
        let mut messages = Vec::new();
        if let Some(si) = o.get("systemInstruction") {
            let si = obj(si, "systemInstruction")?;
            let mut sys = Vec::new();
            decode_parts(
                opt_array(si, "parts")?,
                Role::System,
                &mut Vec::new(),
                &mut 0,
                &mut sys,
            )?;
            messages.push(Message::text(
                Role::System,
                sys.iter().map(Message::joined_text).collect::<String>(),
            ));
        }
        let (mut pending, mut next_id) = (Vec::new(), 0);
        for c in opt_array(o, "contents")? {
            let c = obj(c, "content")?;
            let role = match opt_str(c, "role")?.unwrap_or("user") {
                "user" => Role::User,
                "model" => Role::Assistant,
                other => return Err(DialectError::invalid(format!("unknown role '{other}'"))),
            };
            decode_parts(
                opt_array(c, "parts")?,
                role,
                &mut pending,
                &mut next_id,
                &mut messages,
            )?;
        }
        let mut tools = Vec::new();
        for t in opt_array(o, "tools")? {
            let t = obj(t, "tool")?;
            let decls = opt_array(t, "functionDeclarations")?;
            if decls.is_empty() {
                return Err(DialectError::invalid(
                    "only functionDeclarations tools are supported",
                ));
            }
            for d in decls {
                let d = obj(d, "functionDeclaration")?;
                tools.push(ToolSpec {
                    name: req_str(d, "name")?.to_string(),
                    description: opt_str(d, "description")?.map(str::to_string),
                    parameters: d
                        .get("parameters")
                        .or_else(|| d.get("parametersJsonSchema"))
                        .cloned()
                        .unwrap_or(json!({})),
                });
            }
        }
        let tool_choice = match o
            .get("toolConfig")
            .and_then(|t| t.get("functionCallingConfig"))
        {
            None => None,
            Some(v) => {
                let c = obj(v, "functionCallingConfig")?;
                let names = opt_array(c, "allowedFunctionNames")?;
                Some(match opt_str(c, "mode")?.unwrap_or("AUTO") {
                    "ANY" if names.len() == 1 => {
                        ToolChoice::Named(names[0].as_str().unwrap_or_default().to_string())
                    }
                    "ANY" => ToolChoice::Required,
                    "NONE" => ToolChoice::None,
                    _ => ToolChoice::Auto,
                })
            }
        };
        let empty = Map::new();
        let g = match o.get("generationConfig") {
            Some(v) => obj(v, "generationConfig")?,
            None => &empty,
        };
        single_choice(g, "candidateCount")?;
        Ok(ChatRequest {
            model: hints.model.clone().unwrap_or_default(),
            messages,
            tools,
            tool_choice,
            sampling: SamplingParams {
                temperature: opt_f64(g, "temperature")?,
                top_p: opt_f64(g, "topP")?,
                top_k: opt_i64(g, "topK")?,
                max_tokens: opt_i64(g, "maxOutputTokens")?,
                seed: opt_i64(g, "seed")?,
                presence_penalty: opt_f64(g, "presencePenalty")?,
                frequency_penalty: opt_f64(g, "frequencyPenalty")?,
                stop: stop_list(g, "stopSequences")?,
                ..Default::default()
            },
            stream: hints.stream.unwrap_or(false),
            stream_usage: false,
        })
    }

    fn encode_request(req: &ChatRequest) -> Value {
        let mut o = Map::new();
        let mut msgs = &req.messages[..];
        if let Some(Message {
            role: Role::System, ..
        }) = msgs.first()
        {
            o.insert(
                "systemInstruction".into(),
                json!({"parts": [{"text": msgs[0].joined_text()}]}),
            );
            msgs = &msgs[1..];
        }
        let contents: Vec<Value> = msgs
            .iter()
            .map(|m| {
                let role = if m.role == Role::Assistant {
                    "model"
                } else {
                    "user"
                };
                json!({"role": role, "parts": m.parts.iter().map(encode_part).collect::<Vec<_>>()})
            })
            .collect();
        o.insert("contents".into(), Value::Array(contents));
        if !req.tools.is_empty() {
            let decls: Vec<Value> = req
                .tools
                .iter()
                .map(|t| {
                    let f = tool_declaration(t, "parameters");
                    Value::Object(f)
                })
                .collect();
            o.insert("tools".into(), json!([{"functionDeclarations": decls}]));
        }
        if let Some(c) = &req.tool_choice {
            let cfg = match c {
                ToolChoice::Auto => json!({"mode": "AUTO"}),
                ToolChoice::None => json!({"mode": "NONE"}),
                ToolChoice::Required => json!({"mode": "ANY"}),
                ToolChoice::Named(n) => json!({"mode": "ANY", "allowedFunctionNames": [n]}),
            };
            o.insert("toolConfig".into(), json!({"functionCallingConfig": cfg}));
        }
        let s = &req.sampling;
        let mut g = Map::new();
        put(&mut g, "temperature", s.temperature);
        put(&mut g, "topP", s.top_p);
        put(&mut g, "topK", s.top_k);
        put(&mut g, "maxOutputTokens", s.max_tokens);
        put(&mut g, "seed", s.seed);
        put(&mut g, "presencePenalty", s.presence_penalty);
        put(&mut g, "frequencyPenalty", s.frequency_penalty);
        if !s.stop.is_empty() {
            g.insert("stopSequences".into(), json!(s.stop));
        }
        if !g.is_empty() {
            o.insert("generationConfig".into(), Value::Object(g));
        }
        Value::Object(o)
    }

    fn encode_response(resp: &ChatResponse) -> Value {
        let parts: Vec<Value> = resp.parts.iter().map(encode_part).collect();
        response_chunk(resp, parts, Some(finish_reason(resp.finish)), true)
    }

    fn decode_response(body: &Value) -> Result<ChatResponse, DialectError> {
        let o = obj(body, "response")?;
        let cand = opt_array(o, "candidates")?
            .first()
            .ok_or_else(|| DialectError::invalid("no candidates"))?;
        let c = obj(cand, "candidate")?;
        let content = obj(c.get("content").unwrap_or(&Value::Null), "content")?;
        let mut msgs = Vec::new();
        decode_parts(
            opt_array(content, "parts")?,
            Role::Assistant,
            &mut Vec::new(),
            &mut 0,
            &mut msgs,
        )?;
        let parts: Vec<Part> = msgs.into_iter().flat_map(|m| m.parts).collect();
        let has_calls = parts.iter().any(|p| matches!(p, Part::ToolCall(_)));
        let u = o.get("usageMetadata").and_then(Value::as_object);
        let count = |k: &str| u.and_then(|u| u.get(k)).and_then(Value::as_u64);
        Ok(ChatResponse {
            id: opt_str(o, "responseId")?.unwrap_or_default().to_string(),
            model: opt_str(o, "modelVersion")?.unwrap_or_default().to_string(),
            created: 0,
            finish: match opt_str(c, "finishReason")? {
                Some("MAX_TOKENS") => FinishReason::Length,
                Some("SAFETY") => FinishReason::ContentFilter,
                _ if has_calls => FinishReason::ToolCalls,
                _ => FinishReason::Stop,
            },
            parts,
            usage: TokenUsage {
                input: count("promptTokenCount").unwrap_or(0),
                output: count("candidatesTokenCount").unwrap_or(0),
            },
        })
    }

    fn stream_events(resp: &ChatResponse, _req: &ChatRequest) -> Vec<SseEvent> {
        // One chunk per part; the last carries the finish reason and usage.
        let n = resp.parts.len();
        if n == 0 {
            return vec![SseEvent::data(response_chunk(
                resp,
                vec![],
                Some(finish_reason(resp.finish)),
                true,
            ))];
        }
        resp.parts
            .iter()
            .enumerate()
            .map(|(i, p)| {
                let last = i + 1 == n;
                SseEvent::data(response_chunk(
                    resp,
                    vec![encode_part(p)],
                    last.then(|| finish_reason(resp.finish)),
                    last,
                ))
            })
            .collect()
    }

    fn error_body(err: &DialectError) -> Value {
        let status = match err.kind {
            ErrorKind::InvalidRequest | ErrorKind::ContextLength | ErrorKind::TooLarge => {
                "INVALID_ARGUMENT"
            }
            ErrorKind::Authentication => "UNAUTHENTICATED",
            ErrorKind::NotFound => "NOT_FOUND",
            ErrorKind::RateLimited => "RESOURCE_EXHAUSTED",
            ErrorKind::Upstream | ErrorKind::Unavailable => "UNAVAILABLE",
            ErrorKind::Timeout => "DEADLINE_EXCEEDED",
            ErrorKind::Internal => "INTERNAL",
        };
        json!({"error": {"code": err.kind.status(), "message": err.message, "status": status}})
    }
}
