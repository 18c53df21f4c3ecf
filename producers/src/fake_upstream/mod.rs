//! A small vLLM-compatible engine for tests and the load bench: deterministic
//! byte-level "tokens", fixed logprobs, an optional fixed delay. It answers
//! with token ids and logprobs the way vLLM does with `return_token_ids` and
//! `--return-tokens-as-token-ids`, plus our engine's `policy_version`.
//!
//! Its "model" has a chat template ([`CHAT_TEMPLATE`]) and a tokenizer (one
//! token per byte, and [`END`] for the end of a turn) that
//! [`write_model_dir`] writes as a Hugging Face folder, so the proxy can render
//! its prompts (token in) through its real loading code; `/v1/completions`
//! takes those ids, reads the conversation back from them and answers as the
//! chat route would, its tool calls as Hermes text ending in [`END`].
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

/// The end of a turn: the one token that is not a byte.
pub const END: &str = "<|end|>";
pub const END_ID: u32 = 256;

/// The fake model's chat template, as its `tokenizer_config.json` carries it:
/// the tools as JSON, then each message's role and text (tool calls as Hermes
/// text, as a template that shows none is given them), each closed by [`END`].
pub const CHAT_TEMPLATE: &str = "{% if tools %}<|tools|>{{ tools | tojson }}<|end|>\n{% endif %}{% for m in messages %}<|{{ m.role }}|>{{ m.content }}<|end|>\n{% endfor %}{% if add_generation_prompt %}<|assistant|>{% endif %}";

/// [`CHAT_TEMPLATE`] rendered here, with a generation prompt (the tools as
/// Hugging Face's `tojson` writes them).
pub fn render_prompt(messages: &[Value], tools: Option<&Value>) -> String {
    let mut s = String::new();
    if let Some(tools) = tools.filter(|t| t.as_array().is_some_and(|a| !a.is_empty())) {
        let tools = forgelog_dialects::hf::tojson(tools, None);
        s.push_str(&format!("<|tools|>{tools}{END}\n"));
    }
    for m in messages {
        let m = forgelog_dialects::hf::hf_message_with_hermes_calls(m);
        let role = m["role"].as_str().unwrap_or("?");
        let content = m["content"].as_str().unwrap_or_default();
        s.push_str(&format!("<|{role}|>{content}{END}\n"));
    }
    s.push_str("<|assistant|>");
    s
}

/// The fake tokenizer: a byte a token, [`END`] one of its own.
pub fn encode(text: &str) -> Vec<u32> {
    let mut ids = Vec::with_capacity(text.len());
    for (i, piece) in text.split(END).enumerate() {
        if i > 0 {
            ids.push(END_ID);
        }
        ids.extend(piece.bytes().map(u32::from));
    }
    ids
}

pub fn decode(ids: &[u32]) -> String {
    let mut bytes = Vec::with_capacity(ids.len());
    for &id in ids {
        match u8::try_from(id) {
            Ok(b) => bytes.push(b),
            Err(_) => bytes.extend_from_slice(END.as_bytes()),
        }
    }
    String::from_utf8_lossy(&bytes).into_owned()
}

/// The conversation and tools a prompt of [`CHAT_TEMPLATE`] holds.
fn parse_prompt(text: &str) -> (Vec<Value>, Option<Value>) {
    let mut tools = None;
    let mut messages = Vec::new();
    let closed = format!("{END}\n");
    for turn in text.split(&closed).filter(|t| *t != "<|assistant|>") {
        let Some((role, content)) = turn.strip_prefix("<|").and_then(|t| t.split_once("|>")) else {
            continue;
        };
        match role {
            "tools" => tools = serde_json::from_str(content).ok(),
            _ => messages.push(json!({"role": role, "content": content})),
        }
    }
    (messages, tools)
}

/// The fake model as a Hugging Face folder (`config.json`, `tokenizer.json`,
/// `tokenizer_config.json`): what `forgelog proxy --tokenizer DIR` loads to
/// render this upstream's prompts. The tokenizer is a byte-level BPE with no
/// merges, so its ids are the bytes (GPT-2's byte-to-character map) and
/// [`END`] is [`END_ID`].
pub fn write_model_dir(dir: &std::path::Path) -> std::io::Result<()> {
    // GPT-2's map: printable Latin-1 bytes are their own character, the rest
    // are 256, 257, ... in byte order.
    let printable = |b: u32| matches!(b, 33..=126 | 161..=172 | 174..=255);
    let mut vocab = serde_json::Map::new();
    let mut shifted = 256;
    for b in 0..256u32 {
        let c = if printable(b) {
            b
        } else {
            shifted += 1;
            shifted - 1
        };
        let c = char::from_u32(c).expect("a Latin-1 or shifted code point");
        vocab.insert(c.to_string(), json!(b));
    }
    vocab.insert(END.into(), json!(END_ID));
    // GPT-2's word split first (as real byte-level tokenizers do): with no
    // merges the ids are the bytes either way, and words are what BPE caches.
    let byte_level = json!({"type": "ByteLevel", "add_prefix_space": false, "trim_offsets": false, "use_regex": true});
    let tokenizer = json!({
        "version": "1.0", "truncation": null, "padding": null,
        "added_tokens": [{"id": END_ID, "content": END, "single_word": false, "lstrip": false,
            "rstrip": false, "normalized": false, "special": true}],
        "normalizer": null, "pre_tokenizer": byte_level, "post_processor": null, "decoder": byte_level,
        "model": {"type": "BPE", "dropout": null, "unk_token": null, "continuing_subword_prefix": null,
            "end_of_word_suffix": null, "fuse_unk": false, "byte_fallback": false, "vocab": vocab, "merges": []},
    });
    let config = json!({"model_type": MODEL, "eos_token_id": END_ID});
    let tokenizer_config =
        json!({"chat_template": CHAT_TEMPLATE, "eos_token": END, "bos_token": null});
    std::fs::create_dir_all(dir)?;
    for (name, value) in [
        ("config.json", config),
        ("tokenizer.json", tokenizer),
        ("tokenizer_config.json", tokenizer_config),
    ] {
        std::fs::write(dir.join(name), serde_json::to_vec_pretty(&value)?)?;
    }
    Ok(())
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

/// What the fake model says next: its text, tool calls (or null) and why it stopped.
struct Turn {
    text: String,
    tool_calls: Value,
    finish: &'static str,
}

impl FakeUpstream {
    /// The next turn of the conversation in `req` (`messages`, `tools`).
    fn turn(&self, req: &Value) -> Result<Turn, (StatusCode, String)> {
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
        let text = match (first_tool, last_is_tool) {
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
        let finish = if tool_calls.is_null() {
            "stop"
        } else {
            "tool_calls"
        };
        Ok(Turn {
            text,
            tool_calls,
            finish,
        })
    }

    /// Refuses a prompt of `prompt` tokens (plus the `max_tokens` asked) over
    /// the context, as vLLM does.
    fn within_context(&self, prompt: usize, req: &Value) -> Result<(), (StatusCode, String)> {
        let Some(context) = self.options.context else {
            return Ok(());
        };
        let asked = req["max_tokens"].as_u64().unwrap_or(0) as usize;
        if prompt >= context || prompt + asked > context {
            return Err((
                StatusCode::BAD_REQUEST,
                format!("This model's maximum context length is {context} tokens. However, you requested {} tokens ({prompt} in the messages, {asked} in the completion). Please reduce the length of the messages or completion.", prompt + asked),
            ));
        }
        Ok(())
    }

    /// A chat completion (`/v1/chat/completions`): the engine renders the
    /// prompt and parses the tool calls itself.
    pub fn answer(&self, req: &Value) -> Result<Value, (StatusCode, String)> {
        let Turn {
            mut text,
            mut tool_calls,
            mut finish,
        } = self.turn(req)?;
        if let Some(max) = req["max_tokens"].as_u64() {
            if (text.len() as u64) > max {
                text.truncate(max as usize);
                finish = "length";
                tool_calls = Value::Null;
            }
        }
        let messages = req["messages"].as_array().cloned().unwrap_or_default();
        let prompt_ids = encode(&render_prompt(&messages, req.get("tools")));
        self.within_context(prompt_ids.len(), req)?;
        let completion_ids: Vec<u32> = text.bytes().map(u32::from).collect();
        let mut message = json!({"role": "assistant", "content": text});
        if !tool_calls.is_null() {
            message["tool_calls"] = tool_calls;
        }
        let mut answer = json!({
            "id": "chatcmpl-fake", "object": "chat.completion", "created": 1_700_000_000, "model": MODEL,
            "choices": [{"index": 0, "message": message, "finish_reason": finish}],
            "usage": usage(&prompt_ids, &completion_ids),
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

    /// A completion of a token-id prompt (`/v1/completions`, token in): the
    /// conversation is read back from the ids; the model writes its tool calls
    /// as Hermes text and ends its turn with [`END`]. Also returns the answer
    /// in chat form, as [`assert_calls_match`] reads answers.
    fn complete(&self, req: &Value) -> Result<(Value, Value), (StatusCode, String)> {
        let prompt_ids = req["prompt"]
            .as_array()
            .and_then(|ids| {
                ids.iter()
                    .map(|v| v.as_u64().map(|n| n as u32))
                    .collect::<Option<Vec<u32>>>()
            })
            .ok_or((
                StatusCode::BAD_REQUEST,
                "`prompt` must be token ids".to_string(),
            ))?;
        let (messages, tools) = parse_prompt(&decode(&prompt_ids));
        let turn = self.turn(&json!({"messages": messages, "tools": tools}))?;
        self.within_context(prompt_ids.len(), req)?;
        let chat_form =
            json!({"role": "assistant", "content": turn.text, "tool_calls": turn.tool_calls});
        let said = forgelog_dialects::hf::hf_message_with_hermes_calls(&chat_form);
        let mut completion_ids = encode(said["content"].as_str().unwrap_or_default());
        completion_ids.push(END_ID);
        let mut finish = "stop";
        if let Some(max) = req["max_tokens"].as_u64() {
            if completion_ids.len() as u64 > max {
                completion_ids.truncate(max as usize);
                finish = "length";
            }
        }
        let text = decode(&completion_ids);
        let text = text.strip_suffix(END).unwrap_or(&text);
        let logprobs: Vec<f32> = (0..completion_ids.len()).map(logprob).collect();
        let content: Vec<Value> = logprobs.iter().map(|l| json!({"logprob": l})).collect();
        let chat = json!({"prompt_token_ids": prompt_ids,
            "choices": [{"token_ids": completion_ids, "logprobs": {"content": content}}]});
        let answer = json!({
            "id": "cmpl-fake", "object": "text_completion", "created": 1_700_000_000, "model": MODEL,
            "choices": [{"index": 0, "text": text, "finish_reason": finish,
                "prompt_token_ids": prompt_ids, "token_ids": completion_ids,
                "logprobs": {"token_logprobs": logprobs}}],
            "usage": usage(&prompt_ids, &completion_ids),
            "policy_version": POLICY_VERSION,
        });
        Ok((answer, chat))
    }
}

fn usage(prompt: &[u32], completion: &[u32]) -> Value {
    json!({"prompt_tokens": prompt.len(), "completion_tokens": completion.len(),
           "total_tokens": prompt.len() + completion.len()})
}

/// vLLM's `/tokenize` of a chat: one token per byte of the rendered prompt,
/// as the completions count them.
async fn tokenize(State(up): State<Arc<FakeUpstream>>, Json(req): Json<Value>) -> Response {
    if up.options.without_tokenize {
        return StatusCode::NOT_FOUND.into_response();
    }
    let messages = req["messages"].as_array().cloned().unwrap_or_default();
    let tokens = encode(&render_prompt(&messages, req.get("tools")));
    Json(json!({"count": tokens.len(), "max_model_len": up.options.context, "tokens": tokens}))
        .into_response()
}

async fn chat(State(up): State<Arc<FakeUpstream>>, Json(req): Json<Value>) -> Response {
    if req["stream"] == true {
        return (StatusCode::BAD_REQUEST, "the fake upstream does not stream").into_response();
    }
    let messages = req["messages"].as_array().cloned().unwrap_or_default();
    up.wait(&messages).await;
    up.respond(up.answer(&req).map(|a| (a.clone(), a)))
}

async fn completions(State(up): State<Arc<FakeUpstream>>, Json(req): Json<Value>) -> Response {
    if req["stream"] == true {
        return (StatusCode::BAD_REQUEST, "the fake upstream does not stream").into_response();
    }
    let prompt: Vec<u32> = serde_json::from_value(req["prompt"].clone()).unwrap_or_default();
    up.wait(&parse_prompt(&decode(&prompt)).0).await;
    up.respond(up.complete(&req))
}

impl FakeUpstream {
    /// The configured delay, or 3 s where the last message says `[slow]`,
    /// or an hour where it says `[hang]` (the proxy's start-up probe is
    /// answered at once all the same).
    async fn wait(&self, messages: &[Value]) {
        let last = messages.last().map(|m| text_of(&m["content"]));
        let delay = match last {
            Some(text) if text.contains("[hang]") => Duration::from_secs(3600),
            Some(text) if text.contains("[slow]") => Duration::from_secs(3),
            _ => self.options.delay,
        };
        if !delay.is_zero() {
            tokio::time::sleep(delay).await;
        }
    }

    /// The answer on the wire (kept in chat form), or the error in vLLM's shape.
    fn respond(&self, answered: Result<(Value, Value), (StatusCode, String)>) -> Response {
        match answered {
            Ok((wire, kept)) => {
                if self.options.keep_answers {
                    self.answers.lock().expect("answers lock").push(kept);
                }
                Json(wire).into_response()
            }
            Err((status, msg)) => (
                status,
                Json(json!({"object": "error", "message": msg, "type": "BadRequestError", "param": null, "code": status.as_u16()})),
            )
                .into_response(),
        }
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
        .route("/v1/completions", post(completions))
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
