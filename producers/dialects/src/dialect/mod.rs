//! One pure, I/O-free adapter per API dialect, translating between the
//! dialect's JSON and the [`crate::canonical`] model in both directions,
//! streaming included. Shared here: the error kinds every dialect shapes in
//! its own way, SSE framing, and small JSON readers.

pub mod anthropic;
pub mod gemini;
pub mod openai_chat;
pub mod openai_responses;
pub mod sse;

pub use anthropic::AnthropicDialect;
pub use gemini::GeminiDialect;
pub use openai_chat::OpenAiChatDialect;
pub use openai_responses::OpenAiResponsesDialect;

use crate::canonical::{ChatRequest, ChatResponse, ToolChoice};
use serde_json::{Map, Value};
use sse::SseEvent;

/// What went wrong, independent of how a dialect spells it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ErrorKind {
    InvalidRequest,
    /// The prompt (plus the completion asked for) does not fit the model's context.
    ContextLength,
    Authentication,
    NotFound,
    TooLarge,
    RateLimited,
    Upstream,
    Timeout,
    /// The proxy cannot take a call now (its spool is full): a later try may pass.
    Unavailable,
    Internal,
}

impl ErrorKind {
    pub fn status(self) -> u16 {
        match self {
            ErrorKind::InvalidRequest | ErrorKind::ContextLength => 400,
            ErrorKind::Authentication => 401,
            ErrorKind::NotFound => 404,
            ErrorKind::TooLarge => 413,
            ErrorKind::RateLimited => 429,
            ErrorKind::Upstream => 502,
            ErrorKind::Timeout => 504,
            ErrorKind::Unavailable => 503,
            ErrorKind::Internal => 500,
        }
    }
}

/// A request the proxy refuses or could not serve, before dialect shaping.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
#[error("{message}")]
pub struct DialectError {
    pub kind: ErrorKind,
    pub message: String,
}

impl DialectError {
    pub fn new(kind: ErrorKind, message: impl Into<String>) -> DialectError {
        DialectError {
            kind,
            message: message.into(),
        }
    }

    pub fn invalid(message: impl Into<String>) -> DialectError {
        DialectError::new(ErrorKind::InvalidRequest, message)
    }
}

/// Sampling settings no engine can honour (a negative `max_tokens` or
/// temperature, a `top_p` over 1, a NaN) are the harness's error in every
/// dialect: refused here, not forwarded and recorded as trainable.
pub fn check_sampling(s: &forgelog_schemas::SamplingParams) -> Result<(), DialectError> {
    let refuse = |field: &str, value: &dyn std::fmt::Display, must: &str| {
        Err(DialectError::invalid(format!(
            "{field} {value} is out of range: {must}"
        )))
    };
    if let Some(n) = s.max_tokens.filter(|n| *n < 1) {
        return refuse("max_tokens", &n, "at least 1");
    }
    if let Some(t) = s.temperature.filter(|t| !(t.is_finite() && *t >= 0.0)) {
        return refuse("temperature", &t, "0 or more");
    }
    for (field, value) in [("top_p", s.top_p), ("min_p", s.min_p)] {
        if let Some(p) = value.filter(|p| !(0.0..=1.0).contains(p)) {
            return refuse(field, &p, "between 0 and 1");
        }
    }
    if let Some(k) = s.top_k.filter(|k| *k < -1) {
        return refuse("top_k", &k, "-1 (off) or more");
    }
    for (field, value) in [
        ("presence_penalty", s.presence_penalty),
        ("frequency_penalty", s.frequency_penalty),
    ] {
        if let Some(p) = value.filter(|p| !(p.is_finite() && (-2.0..=2.0).contains(p))) {
            return refuse(field, &p, "between -2 and 2");
        }
    }
    Ok(())
}

/// What the route adds to the body: Gemini names the model and streaming in the path.
#[derive(Debug, Clone, Default)]
pub struct RouteHints {
    pub model: Option<String>,
    pub stream: Option<bool>,
}

/// How one harness-facing API dialect maps to the canonical model: requests
/// in, responses, streams and errors out. `KIND` is what the log records.
pub trait DialectAdapter: Send + Sync + 'static {
    const KIND: forgelog_schemas::Dialect;

    /// Harness request → canonical.
    fn decode_request(body: &Value, hints: &RouteHints) -> Result<ChatRequest, DialectError>;
    /// Canonical → the dialect's request (tests, and the upstream for OpenAI chat).
    fn encode_request(req: &ChatRequest) -> Value;
    /// Canonical → the dialect's non-streaming response body.
    fn encode_response(resp: &ChatResponse) -> Value;
    /// The dialect's response body → canonical.
    fn decode_response(body: &Value) -> Result<ChatResponse, DialectError>;
    /// Canonical → the dialect's streaming events, in order.
    fn stream_events(resp: &ChatResponse, req: &ChatRequest) -> Vec<SseEvent>;
    /// The error body, in the dialect's own shape.
    fn error_body(err: &DialectError) -> Value;
    /// An error inside an already started stream.
    fn stream_error(err: &DialectError) -> SseEvent {
        SseEvent::data(Self::error_body(err))
    }
    /// Streams end with this (OpenAI chat's `[DONE]`), if anything.
    fn stream_end() -> Option<SseEvent> {
        None
    }
}

/// OpenAI's `tool_choice` (Chat and Responses): "auto", "none", "required",
/// or an object naming one tool, whose name `named` reads (the two APIs nest
/// it differently).
pub(crate) fn decode_openai_tool_choice(
    v: Option<&Value>,
    named: impl FnOnce(&Map<String, Value>) -> Result<String, DialectError>,
) -> Result<Option<ToolChoice>, DialectError> {
    Ok(match v {
        None | Some(Value::Null) => None,
        Some(Value::String(s)) => Some(match s.as_str() {
            "auto" => ToolChoice::Auto,
            "none" => ToolChoice::None,
            "required" => ToolChoice::Required,
            other => {
                return Err(DialectError::invalid(format!(
                    "unknown tool_choice '{other}'"
                )))
            }
        }),
        Some(v) => Some(ToolChoice::Named(named(obj(v, "tool_choice")?)?)),
    })
}

// Small JSON readers that turn wrong types into clear client errors.

pub(crate) fn obj<'a>(v: &'a Value, what: &str) -> Result<&'a Map<String, Value>, DialectError> {
    v.as_object()
        .ok_or_else(|| DialectError::invalid(format!("{what} must be an object")))
}

pub(crate) fn opt_str<'a>(
    o: &'a Map<String, Value>,
    key: &str,
) -> Result<Option<&'a str>, DialectError> {
    match o.get(key) {
        None | Some(Value::Null) => Ok(None),
        Some(Value::String(s)) => Ok(Some(s)),
        Some(_) => Err(DialectError::invalid(format!("'{key}' must be a string"))),
    }
}

pub(crate) fn req_str<'a>(o: &'a Map<String, Value>, key: &str) -> Result<&'a str, DialectError> {
    opt_str(o, key)?.ok_or_else(|| DialectError::invalid(format!("'{key}' is required")))
}

pub(crate) fn opt_f64(o: &Map<String, Value>, key: &str) -> Result<Option<f64>, DialectError> {
    match o.get(key) {
        None | Some(Value::Null) => Ok(None),
        Some(Value::Number(n)) => Ok(n.as_f64()),
        Some(_) => Err(DialectError::invalid(format!("'{key}' must be a number"))),
    }
}

pub(crate) fn opt_i64(o: &Map<String, Value>, key: &str) -> Result<Option<i64>, DialectError> {
    match o.get(key) {
        None | Some(Value::Null) => Ok(None),
        Some(Value::Number(n)) => n
            .as_i64()
            .map(Some)
            .ok_or_else(|| DialectError::invalid(format!("'{key}' must be an integer"))),
        Some(_) => Err(DialectError::invalid(format!("'{key}' must be an integer"))),
    }
}

pub(crate) fn opt_bool(o: &Map<String, Value>, key: &str) -> Result<Option<bool>, DialectError> {
    match o.get(key) {
        None | Some(Value::Null) => Ok(None),
        Some(Value::Bool(b)) => Ok(Some(*b)),
        Some(_) => Err(DialectError::invalid(format!("'{key}' must be a boolean"))),
    }
}

pub(crate) fn opt_array<'a>(
    o: &'a Map<String, Value>,
    key: &str,
) -> Result<&'a [Value], DialectError> {
    match o.get(key) {
        None | Some(Value::Null) => Ok(&[]),
        Some(Value::Array(a)) => Ok(a),
        Some(_) => Err(DialectError::invalid(format!("'{key}' must be an array"))),
    }
}

/// `stop` as a string or an array of strings.
pub(crate) fn stop_list(o: &Map<String, Value>, key: &str) -> Result<Vec<String>, DialectError> {
    match o.get(key) {
        None | Some(Value::Null) => Ok(Vec::new()),
        Some(Value::String(s)) => Ok(vec![s.clone()]),
        Some(Value::Array(a)) => a
            .iter()
            .map(|v| {
                v.as_str()
                    .map(str::to_string)
                    .ok_or_else(|| DialectError::invalid(format!("'{key}' must hold strings")))
            })
            .collect(),
        Some(_) => Err(DialectError::invalid(format!(
            "'{key}' must be a string or an array of strings"
        ))),
    }
}

/// Rejects `n`/`candidateCount` above 1: one call, one sampled sequence.
pub(crate) fn single_choice(o: &Map<String, Value>, key: &str) -> Result<(), DialectError> {
    match opt_i64(o, key)? {
        Some(n) if n != 1 => Err(DialectError::invalid(format!(
            "'{key}'={n} is not supported: the proxy samples one completion per call"
        ))),
        _ => Ok(()),
    }
}

/// Tool-call arguments as an object (Anthropic and Gemini carry objects, OpenAI text).
pub(crate) fn arguments_object(arguments: &str) -> Value {
    match serde_json::from_str::<Value>(arguments) {
        Ok(v @ Value::Object(_)) => v,
        _ if arguments.trim().is_empty() => Value::Object(Map::new()),
        // Not an object: keep the text rather than lose it.
        _ => serde_json::json!({ "_raw": arguments }),
    }
}

/// Inserts `value` under `key` unless it is `None`.
/// A tool declaration as every dialect spells it: `name`, `description` when
/// given, and the argument schema under the dialect's own key.
pub(crate) fn tool_declaration(
    tool: &crate::canonical::ToolSpec,
    schema_key: &str,
) -> Map<String, Value> {
    let mut f = Map::new();
    f.insert("name".into(), Value::String(tool.name.clone()));
    put(&mut f, "description", tool.description.as_ref());
    f.insert(schema_key.into(), tool.parameters.clone());
    f
}

pub(crate) fn put<T: serde::Serialize>(o: &mut Map<String, Value>, key: &str, value: Option<T>) {
    if let Some(v) = value {
        o.insert(
            key.to_string(),
            serde_json::to_value(v).expect("serializable"),
        );
    }
}

#[cfg(test)]
mod sampling_tests {
    use super::check_sampling;
    use forgelog_schemas::SamplingParams;

    #[test]
    fn sampling_no_engine_can_honour_is_refused() {
        let ok = SamplingParams {
            max_tokens: Some(1),
            temperature: Some(0.0),
            top_p: Some(1.0),
            top_k: Some(-1),
            ..Default::default()
        };
        assert!(check_sampling(&ok).is_ok());
        assert!(check_sampling(&SamplingParams::default()).is_ok());
        for bad in [
            SamplingParams {
                max_tokens: Some(0),
                ..ok.clone()
            },
            SamplingParams {
                max_tokens: Some(-5),
                ..ok.clone()
            },
            SamplingParams {
                temperature: Some(-0.1),
                ..ok.clone()
            },
            SamplingParams {
                temperature: Some(f64::NAN),
                ..ok.clone()
            },
            SamplingParams {
                top_p: Some(1.5),
                ..ok.clone()
            },
            SamplingParams {
                min_p: Some(-1.0),
                ..ok.clone()
            },
            SamplingParams {
                top_k: Some(-2),
                ..ok.clone()
            },
            SamplingParams {
                presence_penalty: Some(9.0),
                ..ok.clone()
            },
        ] {
            let err = check_sampling(&bad).unwrap_err();
            assert!(
                err.message.contains("out of range"),
                "{bad:?}: {}",
                err.message
            );
        }
    }
}
