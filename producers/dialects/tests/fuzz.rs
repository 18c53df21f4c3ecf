//! Fuzzing the dialect parsers with proptest: any JSON (built from each
//! dialect's own field names, so that it reaches deep), any bytes, and valid
//! requests with one part replaced by anything. A parser may refuse; it must
//! never panic. `PROPTEST_CASES` raises the count (CI runs the default).

use forgelog_dialects::canonical::*;
use forgelog_dialects::dialect::*;
use proptest::prelude::*;
use serde_json::{json, Value};

/// Field names and values the four dialects read.
const WORDS: &[&str] = &[
    "model",
    "messages",
    "role",
    "content",
    "type",
    "text",
    "tool_calls",
    "function",
    "name",
    "arguments",
    "id",
    "tool_call_id",
    "tools",
    "parameters",
    "input",
    "system",
    "user",
    "assistant",
    "tool",
    "developer",
    "max_tokens",
    "max_completion_tokens",
    "max_output_tokens",
    "temperature",
    "top_p",
    "top_k",
    "stop",
    "stop_sequences",
    "stream",
    "tool_use",
    "tool_result",
    "tool_use_id",
    "image",
    "image_url",
    "url",
    "source",
    "base64",
    "data",
    "media_type",
    "input_text",
    "output_text",
    "input_image",
    "message",
    "function_call",
    "function_call_output",
    "call_id",
    "output",
    "instructions",
    "contents",
    "parts",
    "functionCall",
    "functionResponse",
    "args",
    "response",
    "generationConfig",
    "maxOutputTokens",
    "stopSequences",
    "systemInstruction",
    "inlineData",
    "mimeType",
    "choices",
    "finish_reason",
    "usage",
    "candidates",
    "stop_reason",
    "thinking",
    "reasoning",
    "seed",
    "logprobs",
    "tool_choice",
    "auto",
    "required",
    "none",
    "any",
    "is_error",
    "cache_control",
    "status",
    "incomplete",
    "delta",
    "index",
    "text/plain",
    "image/png",
    "prompt_tokens",
    "completion_tokens",
    "input_tokens",
    "output_tokens",
    "finishReason",
    "STOP",
    "MAX_TOKENS",
    "end_turn",
    "length",
    "tool_calls",
    "model_version",
];

fn word() -> impl Strategy<Value = String> {
    prop::sample::select(WORDS).prop_map(str::to_string)
}

fn json_value() -> impl Strategy<Value = Value> {
    let leaf = prop_oneof![
        Just(Value::Null),
        any::<bool>().prop_map(Value::Bool),
        any::<i64>().prop_map(|n| json!(n)),
        (-1e6f64..1e6).prop_map(|f| json!(f)),
        "[ -~]{0,12}".prop_map(Value::String),
        word().prop_map(Value::String),
    ];
    leaf.prop_recursive(6, 96, 8, |inner| {
        prop_oneof![
            prop::collection::vec(inner.clone(), 0..5).prop_map(Value::Array),
            prop::collection::vec((word(), inner), 0..8)
                .prop_map(|kv| Value::Object(kv.into_iter().collect())),
        ]
    })
}

fn hints() -> impl Strategy<Value = RouteHints> {
    (prop::option::of(word()), prop::option::of(any::<bool>()))
        .prop_map(|(model, stream)| RouteHints { model, stream })
}

/// Everything a dialect does with what a harness sent it: no panics.
fn exercise<D: DialectAdapter>(body: &Value, hints: &RouteHints) {
    if let Ok(req) = D::decode_request(body, hints) {
        let _ = D::encode_request(&req);
        let resp = ChatResponse {
            id: "r".into(),
            model: req.model.clone(),
            created: 0,
            parts: vec![Part::Text("ok".into())],
            finish: FinishReason::Stop,
            usage: Default::default(),
        };
        let _ = D::stream_events(&resp, &req);
    }
    if let Ok(resp) = D::decode_response(body) {
        let _ = D::encode_response(&resp);
    }
    let _ = D::error_body(&DialectError::invalid("x"));
}

fn exercise_all(body: &Value, hints: &RouteHints) {
    exercise::<OpenAiChatDialect>(body, hints);
    exercise::<OpenAiResponsesDialect>(body, hints);
    exercise::<AnthropicDialect>(body, hints);
    exercise::<GeminiDialect>(body, hints);
}

/// A valid request of each dialect (the same conversation in each spelling).
fn valid_requests() -> Vec<Value> {
    let req = ChatRequest {
        model: "m".into(),
        messages: vec![
            Message::text(Role::System, "Be terse."),
            Message::text(Role::User, "Weather?"),
            Message {
                role: Role::Assistant,
                parts: vec![
                    Part::Text("Checking.".into()),
                    Part::ToolCall(ToolCall {
                        id: "c1".into(),
                        name: "get_weather".into(),
                        arguments: r#"{"city":"Paris"}"#.into(),
                    }),
                ],
            },
            Message {
                role: Role::Tool,
                parts: vec![Part::ToolResult {
                    call_id: "c1".into(),
                    name: Some("get_weather".into()),
                    content: "sunny".into(),
                    is_error: false,
                }],
            },
        ],
        tools: vec![ToolSpec {
            name: "get_weather".into(),
            description: None,
            parameters: json!({"type": "object"}),
        }],
        ..Default::default()
    };
    vec![
        OpenAiChatDialect::encode_request(&req),
        OpenAiResponsesDialect::encode_request(&req),
        AnthropicDialect::encode_request(&req),
        GeminiDialect::encode_request(&req),
    ]
}

/// `value` with the node at `path` (indices taken modulo each level's
/// width) replaced by `with`.
fn replace_at(value: &mut Value, path: &[usize], with: Value) {
    let Some((&step, rest)) = path.split_first() else {
        *value = with;
        return;
    };
    let child = match value {
        Value::Object(map) if !map.is_empty() => {
            let key = map
                .keys()
                .nth(step % map.len())
                .cloned()
                .expect("non-empty");
            map.get_mut(&key)
        }
        Value::Array(items) if !items.is_empty() => {
            let n = items.len();
            items.get_mut(step % n)
        }
        _ => None,
    };
    match child {
        Some(child) => replace_at(child, rest, with),
        None => *value = with,
    }
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(1024))]

    #[test]
    fn any_json_is_refused_or_read_never_a_panic(body in json_value(), hints in hints()) {
        exercise_all(&body, &hints);
    }

    #[test]
    fn any_bytes_are_refused_or_read_never_a_panic(bytes in prop::collection::vec(any::<u8>(), 0..512)) {
        if let Ok(body) = serde_json::from_slice::<Value>(&bytes) {
            exercise_all(&body, &RouteHints::default());
        }
    }

    #[test]
    fn a_valid_request_with_any_part_replaced_never_panics(
        which in 0usize..4,
        path in prop::collection::vec(any::<usize>(), 0..6),
        with in json_value(),
        hints in hints(),
    ) {
        let mut body = valid_requests().swap_remove(which);
        replace_at(&mut body, &path, with);
        exercise_all(&body, &hints);
    }
}
