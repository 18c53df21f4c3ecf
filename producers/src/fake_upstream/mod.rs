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

mod agent;
mod answer;
mod calls_match;
mod model;
mod script;

pub use calls_match::assert_calls_match;
pub use model::{
    decode, encode, logprob, render_prompt, write_model_dir, CHAT_TEMPLATE, END, END_ID,
};

use axum::extract::State;
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::{Json, Router};
use model::parse_prompt;
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

#[cfg(test)]
mod tests;
