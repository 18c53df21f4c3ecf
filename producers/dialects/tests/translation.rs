//! Golden translation tests per dialect, both directions and streaming, and
//! property tests: canonical → dialect → canonical loses nothing the dialect can carry.

use forgelog_dialects::canonical::*;
use forgelog_dialects::dialect::*;
use forgelog_schemas::SamplingParams;
use proptest::prelude::*;
use serde_json::{json, Value};

fn weather_tool() -> ToolSpec {
    ToolSpec {
        name: "get_weather".into(),
        description: Some("Weather in a city".into()),
        parameters: json!({"type": "object", "properties": {"city": {"type": "string"}}}),
    }
}

fn call(id: &str) -> ToolCall {
    ToolCall {
        id: id.into(),
        name: "get_weather".into(),
        arguments: r#"{"city":"Paris"}"#.into(),
    }
}

/// The conversation every golden request below spells in its own dialect.
fn conversation(call_id: &str) -> Vec<Message> {
    vec![
        Message::text(Role::System, "Be terse."),
        Message {
            role: Role::User,
            parts: vec![
                Part::Text("Weather in Paris?".into()),
                Part::Image(Image::Base64 {
                    media_type: "image/png".into(),
                    data: "iVBO".into(),
                }),
            ],
        },
        Message {
            role: Role::Assistant,
            parts: vec![
                Part::Text("Checking.".into()),
                Part::ToolCall(call(call_id)),
            ],
        },
        Message {
            role: Role::Tool,
            parts: vec![Part::ToolResult {
                call_id: call_id.into(),
                name: None,
                content: "sunny".into(),
                is_error: false,
            }],
        },
    ]
}

fn response() -> ChatResponse {
    ChatResponse {
        id: "abc".into(),
        model: "m".into(),
        created: 1,
        parts: vec![
            Part::Text("Checking.".into()),
            Part::ToolCall(call("call_1")),
        ],
        finish: FinishReason::ToolCalls,
        usage: TokenUsage {
            input: 10,
            output: 5,
        },
    }
}

fn request() -> ChatRequest {
    ChatRequest {
        model: "m".into(),
        messages: vec![Message::text(Role::User, "hi")],
        ..Default::default()
    }
}

fn hints() -> RouteHints {
    RouteHints::default()
}

#[test]
fn openai_chat_golden() {
    let body = json!({
        "model": "gpt-x", "temperature": 0.7, "max_completion_tokens": 100, "stop": "END", "stream": true,
        "stream_options": {"include_usage": true},
        "messages": [
            {"role": "developer", "content": "Be terse."},
            {"role": "user", "content": [{"type": "text", "text": "Weather in Paris?"}, {"type": "image_url", "image_url": {"url": "data:image/png;base64,iVBO"}}]},
            {"role": "assistant", "content": "Checking.", "tool_calls": [{"id": "c1", "type": "function", "function": {"name": "get_weather", "arguments": "{\"city\":\"Paris\"}"}}]},
            {"role": "tool", "tool_call_id": "c1", "content": "sunny"}],
        "tools": [{"type": "function", "function": {"name": "get_weather", "description": "Weather in a city", "parameters": {"type": "object", "properties": {"city": {"type": "string"}}}}}],
        "tool_choice": {"type": "function", "function": {"name": "get_weather"}},
    });
    let req = OpenAiChatDialect::decode_request(&body, &hints()).unwrap();
    assert_eq!(req.messages, conversation("c1"));
    assert_eq!(req.tools, vec![weather_tool()]);
    assert_eq!(
        req.tool_choice,
        Some(ToolChoice::Named("get_weather".into()))
    );
    assert_eq!(
        req.sampling,
        SamplingParams {
            temperature: Some(0.7),
            max_tokens: Some(100),
            stop: vec!["END".into()],
            ..Default::default()
        }
    );
    assert!(req.stream && req.stream_usage);

    let out = OpenAiChatDialect::encode_response(&response());
    assert_eq!(out["id"], "chatcmpl-abc");
    assert_eq!(
        out["choices"][0]["message"],
        json!({"role": "assistant", "content": "Checking.",
        "tool_calls": [{"id": "call_1", "type": "function", "function": {"name": "get_weather", "arguments": "{\"city\":\"Paris\"}"}}]})
    );
    assert_eq!(out["choices"][0]["finish_reason"], "tool_calls");
    assert_eq!(
        out["usage"],
        json!({"prompt_tokens": 10, "completion_tokens": 5, "total_tokens": 15})
    );

    let mut r = request();
    r.stream_usage = true;
    let events = OpenAiChatDialect::stream_events(&response(), &r);
    let deltas: Vec<Value> = events
        .iter()
        .map(|e| e.json()["choices"][0]["delta"].clone())
        .collect();
    assert_eq!(deltas[0], json!({"role": "assistant", "content": ""}));
    assert_eq!(deltas[1], json!({"content": "Checking."}));
    assert_eq!(
        deltas[2]["tool_calls"][0]["function"]["name"],
        "get_weather"
    );
    assert_eq!(
        deltas[3]["tool_calls"][0]["function"]["arguments"],
        "{\"city\":\"Paris\"}"
    );
    assert_eq!(
        events[4].json()["choices"][0]["finish_reason"],
        "tool_calls"
    );
    assert_eq!(events[5].json()["usage"]["total_tokens"], 15);
    assert_eq!(events.len(), 6);
    assert_eq!(
        OpenAiChatDialect::stream_end().unwrap().frame(),
        "data: [DONE]\n\n"
    );
}

#[test]
fn openai_responses_golden() {
    let body = json!({
        "model": "gpt-x", "instructions": "Be terse.", "max_output_tokens": 64,
        "input": [
            {"role": "user", "content": [{"type": "input_text", "text": "Weather in Paris?"}, {"type": "input_image", "image_url": "data:image/png;base64,iVBO"}]},
            {"type": "message", "role": "assistant", "id": "msg_1", "content": [{"type": "output_text", "text": "Checking."}]},
            {"type": "function_call", "id": "fc_1", "call_id": "c1", "name": "get_weather", "arguments": "{\"city\":\"Paris\"}"},
            {"type": "function_call_output", "call_id": "c1", "output": "sunny"}],
        "tools": [{"type": "function", "name": "get_weather", "description": "Weather in a city", "parameters": {"type": "object", "properties": {"city": {"type": "string"}}}}],
    });
    let req = OpenAiResponsesDialect::decode_request(&body, &hints()).unwrap();
    assert_eq!(
        req.messages,
        conversation("c1"),
        "text and the function call are one assistant turn"
    );
    assert_eq!(req.tools, vec![weather_tool()]);
    assert_eq!(req.sampling.max_tokens, Some(64));
    let err = OpenAiResponsesDialect::decode_request(
        &json!({"input": "x", "previous_response_id": "resp_1"}),
        &hints(),
    )
    .unwrap_err();
    assert_eq!(err.kind, ErrorKind::InvalidRequest);

    let out = OpenAiResponsesDialect::encode_response(&response());
    assert_eq!(out["id"], "resp_abc");
    assert_eq!(out["status"], "completed");
    assert_eq!(
        out["output"][0],
        json!({"type": "message", "id": "msg_abc", "status": "completed", "role": "assistant",
        "content": [{"type": "output_text", "text": "Checking.", "annotations": [], "logprobs": []}]})
    );
    assert_eq!(
        out["output"][1],
        json!({"type": "function_call", "id": "fc_abc_0", "call_id": "call_1", "name": "get_weather",
        "arguments": "{\"city\":\"Paris\"}", "status": "completed"})
    );

    let events = OpenAiResponsesDialect::stream_events(&response(), &request());
    let kinds: Vec<&str> = events.iter().map(|e| e.event.unwrap()).collect();
    assert_eq!(
        kinds,
        [
            "response.created",
            "response.in_progress",
            "response.output_item.added",
            "response.content_part.added",
            "response.output_text.delta",
            "response.output_text.done",
            "response.content_part.done",
            "response.output_item.done",
            "response.output_item.added",
            "response.function_call_arguments.delta",
            "response.function_call_arguments.done",
            "response.output_item.done",
            "response.completed"
        ]
    );
    for (i, e) in events.iter().enumerate() {
        assert_eq!(e.json()["type"], e.event.unwrap());
        assert_eq!(e.json()["sequence_number"], i);
    }
    // The same item id from `added` to `done`.
    assert_eq!(
        events[2].json()["item"]["id"],
        events[7].json()["item"]["id"]
    );
    assert_eq!(events[4].json()["item_id"], "msg_abc");
    assert_eq!(
        events[8].json()["item"]["id"],
        events[11].json()["item"]["id"]
    );
    assert_eq!(events[9].json()["item_id"], "fc_abc_0");
    assert_eq!(events[12].json()["response"]["output"], out["output"]);
}

#[test]
fn anthropic_golden() {
    let body = json!({
        "model": "claude-x", "max_tokens": 256, "system": [{"type": "text", "text": "Be terse."}], "stop_sequences": ["END"],
        "messages": [
            {"role": "user", "content": [{"type": "text", "text": "Weather in Paris?"}, {"type": "image", "source": {"type": "base64", "media_type": "image/png", "data": "iVBO"}}]},
            {"role": "assistant", "content": [{"type": "text", "text": "Checking."}, {"type": "tool_use", "id": "c1", "name": "get_weather", "input": {"city": "Paris"}}]},
            {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "c1", "content": [{"type": "text", "text": "sunny"}]}]}],
        "tools": [{"name": "get_weather", "description": "Weather in a city", "input_schema": {"type": "object", "properties": {"city": {"type": "string"}}}}],
        "tool_choice": {"type": "any"},
    });
    let req = AnthropicDialect::decode_request(&body, &hints()).unwrap();
    assert_eq!(req.messages, conversation("c1"));
    assert_eq!(req.tool_choice, Some(ToolChoice::Required));
    assert_eq!(req.sampling.max_tokens, Some(256));
    assert_eq!(req.sampling.stop, vec!["END".to_string()]);
    let err =
        AnthropicDialect::decode_request(&json!({"max_tokens": "many", "messages": []}), &hints())
            .unwrap_err();
    assert_eq!(
        AnthropicDialect::error_body(&err),
        json!({"type": "error", "error": {"type": "invalid_request_error", "message": "'max_tokens' must be an integer"}})
    );

    let out = AnthropicDialect::encode_response(&response());
    assert_eq!(
        out,
        json!({"id": "msg_abc", "type": "message", "role": "assistant", "model": "m",
        "content": [{"type": "text", "text": "Checking."}, {"type": "tool_use", "id": "call_1", "name": "get_weather", "input": {"city": "Paris"}}],
        "stop_reason": "tool_use", "stop_sequence": null, "usage": {"input_tokens": 10, "output_tokens": 5}})
    );

    let events = AnthropicDialect::stream_events(&response(), &request());
    let kinds: Vec<&str> = events.iter().map(|e| e.event.unwrap()).collect();
    assert_eq!(
        kinds,
        [
            "message_start",
            "content_block_start",
            "content_block_delta",
            "content_block_stop",
            "content_block_start",
            "content_block_delta",
            "content_block_stop",
            "message_delta",
            "message_stop"
        ]
    );
    assert_eq!(
        events[2].json()["delta"],
        json!({"type": "text_delta", "text": "Checking."})
    );
    assert_eq!(
        events[4].json()["content_block"],
        json!({"type": "tool_use", "id": "call_1", "name": "get_weather", "input": {}})
    );
    assert_eq!(
        events[5].json()["delta"],
        json!({"type": "input_json_delta", "partial_json": "{\"city\":\"Paris\"}"})
    );
    assert_eq!(events[5].json()["index"], 1);
    assert_eq!(events[7].json()["delta"]["stop_reason"], "tool_use");
    assert_eq!(events[7].json()["usage"]["output_tokens"], 5);
}

/// Proto3 JSON's other spelling, the proto field names (Google ADK sends
/// `parameters_json_schema`): read as the lowerCamelCase request, and the
/// client's own keys (a call's arguments, a schema's properties) kept.
#[test]
fn gemini_reads_proto_field_names() {
    let camel = json!({
        "systemInstruction": {"parts": [{"text": "Be terse."}]},
        "contents": [
            {"role": "user", "parts": [{"text": "Open it."}, {"inlineData": {"mimeType": "image/png", "data": "iVBO"}}]},
            {"role": "model", "parts": [{"functionCall": {"name": "open_file", "args": {"file_path": "a.txt"}}}]},
            {"role": "user", "parts": [{"functionResponse": {"name": "open_file", "response": {"line_count": 3}}}]}],
        "tools": [{"functionDeclarations": [{"name": "open_file", "parametersJsonSchema": {"type": "object", "properties": {"file_path": {"type": "string"}}, "required": ["file_path"]}}]}],
        "toolConfig": {"functionCallingConfig": {"mode": "ANY", "allowedFunctionNames": ["open_file"]}},
        "generationConfig": {"maxOutputTokens": 99, "topK": 40, "stopSequences": ["END"]},
    });
    let proto = json!({
        "system_instruction": {"parts": [{"text": "Be terse."}]},
        "contents": [
            {"role": "user", "parts": [{"text": "Open it."}, {"inline_data": {"mime_type": "image/png", "data": "iVBO"}}]},
            {"role": "model", "parts": [{"function_call": {"name": "open_file", "args": {"file_path": "a.txt"}}}]},
            {"role": "user", "parts": [{"function_response": {"name": "open_file", "response": {"line_count": 3}}}]}],
        "tools": [{"function_declarations": [{"name": "open_file", "parameters_json_schema": {"type": "object", "properties": {"file_path": {"type": "string"}}, "required": ["file_path"]}}]}],
        "tool_config": {"function_calling_config": {"mode": "ANY", "allowed_function_names": ["open_file"]}},
        "generation_config": {"max_output_tokens": 99, "top_k": 40, "stop_sequences": ["END"]},
    });
    let hints = RouteHints {
        model: Some("gemini-x".into()),
        stream: Some(false),
    };
    let read = GeminiDialect::decode_request(&proto, &hints).unwrap();
    assert_eq!(read, GeminiDialect::decode_request(&camel, &hints).unwrap());
    assert_eq!(
        read.tools[0].parameters["required"],
        json!(["file_path"]),
        "the tool's schema is read, its keys kept"
    );
    assert_eq!(read.sampling.max_tokens, Some(99));
    let chat = OpenAiChatDialect::encode_request(&read);
    assert_eq!(
        chat["messages"][2]["tool_calls"][0]["function"]["arguments"],
        r#"{"file_path":"a.txt"}"#
    );
}

#[test]
fn gemini_golden() {
    let body = json!({
        "systemInstruction": {"parts": [{"text": "Be terse."}]},
        "contents": [
            {"role": "user", "parts": [{"text": "Weather in Paris?"}, {"inlineData": {"mimeType": "image/png", "data": "iVBO"}}]},
            {"role": "model", "parts": [{"text": "Checking."}, {"functionCall": {"name": "get_weather", "args": {"city": "Paris"}}}]},
            {"role": "user", "parts": [{"functionResponse": {"name": "get_weather", "response": {"forecast": "sunny"}}}]}],
        "tools": [{"functionDeclarations": [{"name": "get_weather", "description": "Weather in a city", "parameters": {"type": "object", "properties": {"city": {"type": "string"}}}}]}],
        "generationConfig": {"temperature": 0.5, "maxOutputTokens": 99, "topK": 40},
    });
    let hints = RouteHints {
        model: Some("gemini-x".into()),
        stream: Some(true),
    };
    let req = GeminiDialect::decode_request(&body, &hints).unwrap();
    let mut expected = conversation("call_0");
    expected[3] = Message {
        role: Role::Tool,
        parts: vec![Part::ToolResult {
            call_id: "call_0".into(),
            name: Some("get_weather".into()),
            content: r#"{"forecast":"sunny"}"#.into(),
            is_error: false,
        }],
    };
    assert_eq!(
        req.messages, expected,
        "ids are given to Gemini's calls and matched by name"
    );
    assert_eq!((req.model.as_str(), req.stream), ("gemini-x", true));
    assert_eq!(
        req.sampling,
        SamplingParams {
            temperature: Some(0.5),
            max_tokens: Some(99),
            top_k: Some(40),
            ..Default::default()
        }
    );
    let err = GeminiDialect::decode_request(
        &json!({"contents": [], "generationConfig": {"candidateCount": 2}}),
        &hints,
    )
    .unwrap_err();
    assert_eq!(GeminiDialect::error_body(&err)["error"]["code"], 400);

    let out = GeminiDialect::encode_response(&response());
    assert_eq!(
        out["candidates"][0]["content"]["parts"],
        json!([{"text": "Checking."}, {"functionCall": {"id": "call_1", "name": "get_weather", "args": {"city": "Paris"}}}])
    );
    assert_eq!(out["candidates"][0]["finishReason"], "STOP");
    assert_eq!(
        out["usageMetadata"],
        json!({"promptTokenCount": 10, "candidatesTokenCount": 5, "totalTokenCount": 15})
    );
    let events = GeminiDialect::stream_events(&response(), &request());
    assert_eq!(events.len(), 2);
    assert!(events[0].json().get("usageMetadata").is_none());
    assert_eq!(events[1].json()["candidates"][0]["finishReason"], "STOP");
    assert_eq!(events[1].frame().slice(0..6), "data: ");
}

// Property tests: what each dialect can carry survives canonical → dialect → canonical.

fn text() -> impl Strategy<Value = String> {
    "[a-zA-Z0-9 .,!?<>{}\"]{1,20}"
}

fn args() -> impl Strategy<Value = String> {
    prop::collection::btree_map("[a-z]{1,5}", any::<i32>(), 0..3)
        .prop_map(|m| serde_json::to_string(&m).unwrap())
}

fn tool_call() -> impl Strategy<Value = ToolCall> {
    ("[a-z0-9_]{3,8}", "[a-z_]{1,8}", args()).prop_map(|(id, name, arguments)| ToolCall {
        id: format!("call_{id}"),
        name,
        arguments,
    })
}

fn image() -> impl Strategy<Value = Image> {
    prop_oneof![
        "[A-Za-z0-9+/]{4,12}".prop_map(|data| Image::Base64 {
            media_type: "image/png".into(),
            data
        }),
        "[a-z]{3,8}".prop_map(|p| Image::Url(format!("https://example.com/{p}.png"))),
    ]
}

/// A conversation in the normal form every dialect carries: optional leading
/// system prompt; user turns of text and images; assistant turns of text then
/// tool calls; each call answered by one tool turn.
fn conversation_strategy(gemini: bool) -> impl Strategy<Value = Vec<Message>> {
    let user = prop::collection::vec(
        prop_oneof![text().prop_map(Part::Text), image().prop_map(Part::Image)],
        1..3,
    )
    .prop_map(|parts| {
        vec![Message {
            role: Role::User,
            parts,
        }]
    });
    let assistant = (
        prop::option::of(text()),
        prop::collection::vec(tool_call(), 0..3),
        text(),
    )
        .prop_map(move |(t, calls, answer)| {
            let mut parts: Vec<Part> = t.into_iter().map(Part::Text).collect();
            let mut calls = calls;
            for (i, c) in calls.iter_mut().enumerate() {
                if gemini {
                    c.id = format!("call_g{i}_{}", c.id); // Gemini carries ids only as given
                }
            }
            parts.extend(calls.iter().cloned().map(Part::ToolCall));
            if parts.is_empty() {
                parts.push(Part::Text("ok".into()));
            }
            let mut turn = vec![Message {
                role: Role::Assistant,
                parts,
            }];
            if !calls.is_empty() {
                turn.push(Message {
                    role: Role::Tool,
                    parts: calls
                        .iter()
                        .map(|c| Part::ToolResult {
                            call_id: c.id.clone(),
                            name: gemini.then(|| c.name.clone()),
                            content: if gemini {
                                format!("{{\"r\":{}}}", answer.len())
                            } else {
                                answer.clone()
                            },
                            is_error: false,
                        })
                        .collect(),
                });
            }
            turn
        });
    (
        prop::option::of(text()),
        prop::collection::vec((user, assistant), 1..4),
    )
        .prop_map(|(system, turns)| {
            let mut m: Vec<Message> = system
                .into_iter()
                .map(|s| Message::text(Role::System, s))
                .collect();
            for (u, a) in turns {
                m.extend(u);
                m.extend(a);
            }
            m
        })
}

fn sampling() -> impl Strategy<Value = SamplingParams> {
    (
        prop::option::of(0.0f64..2.0),
        prop::option::of(1i64..4096),
        prop::collection::vec("[A-Z]{1,4}", 0..2),
    )
        .prop_map(|(temperature, max_tokens, stop)| SamplingParams {
            temperature,
            max_tokens,
            stop,
            ..Default::default()
        })
}

fn roundtrip<D: DialectAdapter>(req: &ChatRequest) -> ChatRequest {
    let hints = RouteHints {
        model: Some(req.model.clone()),
        stream: Some(req.stream),
    };
    D::decode_request(&D::encode_request(req), &hints).unwrap()
}

fn response_strategy() -> impl Strategy<Value = ChatResponse> {
    (
        prop::option::of(text()),
        prop::collection::vec(tool_call(), 0..3),
        0u64..1000,
        0u64..1000,
    )
        .prop_map(|(t, calls, input, output)| {
            let mut parts: Vec<Part> = t.into_iter().map(Part::Text).collect();
            parts.extend(calls.into_iter().map(Part::ToolCall));
            let finish = if parts.iter().any(|p| matches!(p, Part::ToolCall(_))) {
                FinishReason::ToolCalls
            } else {
                FinishReason::Stop
            };
            ChatResponse {
                id: "x1".into(),
                model: "m".into(),
                created: 0,
                parts,
                finish,
                usage: TokenUsage { input, output },
            }
        })
}

proptest! {
    #[test]
    fn requests_roundtrip(messages in conversation_strategy(false), gm in conversation_strategy(true), sampling in sampling(), tools in prop::bool::ANY) {
        let req = ChatRequest {
            model: "m".into(), messages, sampling, stream: false,
            tools: if tools { vec![weather_tool()] } else { vec![] }, ..Default::default()
        };
        prop_assert_eq!(&roundtrip::<OpenAiChatDialect>(&req), &req);
        prop_assert_eq!(&roundtrip::<AnthropicDialect>(&req), &req);
        // Responses carries temperature and length, not stop strings.
        let mut r = req.clone();
        r.sampling.stop.clear();
        prop_assert_eq!(&roundtrip::<OpenAiResponsesDialect>(&r), &r);
        let g = ChatRequest { messages: gm, ..req };
        prop_assert_eq!(&roundtrip::<GeminiDialect>(&g), &g);
    }

    #[test]
    fn responses_roundtrip(resp in response_strategy()) {
        let openai = OpenAiChatDialect::decode_response(&OpenAiChatDialect::encode_response(&resp)).unwrap();
        prop_assert_eq!(&openai, &resp);
        let mut with_created = resp.clone();
        with_created.created = 0;
        prop_assert_eq!(&OpenAiResponsesDialect::decode_response(&OpenAiResponsesDialect::encode_response(&resp)).unwrap(), &with_created);
        prop_assert_eq!(&AnthropicDialect::decode_response(&AnthropicDialect::encode_response(&resp)).unwrap(), &with_created);
        let mut g = with_created.clone();
        g.id = resp.id.clone();
        prop_assert_eq!(&GeminiDialect::decode_response(&GeminiDialect::encode_response(&resp)).unwrap(), &g);
    }
}

/// What Claude Code sends: a system turn inside `messages`, newer top-level
/// fields (`thinking`, `context_management`, `output_config`, `metadata`),
/// `cache_control` on blocks, 128000 max_tokens and a server tool.
#[test]
fn anthropic_claude_code_shapes() {
    let body = json!({
        "model": "claude-opus-x", "max_tokens": 128000, "stream": true,
        "thinking": {"type": "adaptive"}, "context_management": {"edits": [{"type": "clear_thinking_20251015", "keep": "all"}]},
        "output_config": {"effort": "high"}, "metadata": {"user_id": "u"},
        "system": [{"type": "text", "text": "You are Claude Code.", "cache_control": {"type": "ephemeral"}}],
        "messages": [
            {"role": "user", "content": [{"type": "text", "text": "<system-reminder>ctx</system-reminder>"}]},
            {"role": "system", "content": "Mid-conversation instructions."},
            {"role": "user", "content": [{"type": "text", "text": "Say hi.", "cache_control": {"type": "ephemeral"}}]},
            {"role": "assistant", "content": [{"type": "thinking", "thinking": "hmm", "signature": "s"}, {"type": "text", "text": "Hi."}]}],
        "tools": [
            {"name": "Bash", "description": "Run", "input_schema": {"type": "object"}},
            {"type": "web_search_20250305", "name": "web_search", "max_uses": 5}],
    });
    let req = AnthropicDialect::decode_request(&body, &hints()).unwrap();
    assert_eq!(
        req.messages,
        vec![
            Message::text(Role::System, "You are Claude Code."),
            Message::text(Role::User, "<system-reminder>ctx</system-reminder>"),
            Message::text(Role::System, "Mid-conversation instructions."),
            Message::text(Role::User, "Say hi."),
            Message::text(Role::Assistant, "Hi."),
        ]
    );
    assert_eq!(req.tools.len(), 1, "the server tool is left out");
    assert_eq!(req.tools[0].name, "Bash");
    assert_eq!(req.sampling.max_tokens, Some(128000));
    assert!(req.stream);
    // A later system turn is written back as one, not as a user turn.
    let again = AnthropicDialect::encode_request(&req);
    assert_eq!(
        again["messages"][1],
        json!({"role": "system", "content": [{"type": "text", "text": "Mid-conversation instructions."}]})
    );
    assert_eq!(
        AnthropicDialect::decode_request(&again, &hints())
            .unwrap()
            .messages,
        req.messages
    );
}

/// What Codex sends: developer messages with ids, `namespace` tool groups, a
/// hosted `web_search` tool, reasoning/include/store/client_metadata fields.
#[test]
fn responses_codex_shapes() {
    let body = json!({
        "model": "gpt-x", "stream": true, "store": false, "parallel_tool_calls": true,
        "reasoning": {"summary": "auto"}, "include": ["reasoning.encrypted_content"],
        "prompt_cache_key": "k", "client_metadata": {"thread_id": "t"}, "tool_choice": "auto",
        "input": [
            {"type": "message", "id": "msg_1", "role": "developer", "content": [{"type": "input_text", "text": "You are Codex."}]},
            {"type": "message", "id": "msg_2", "role": "user", "content": [{"type": "input_text", "text": "Say hi."}]}],
        "tools": [
            {"type": "function", "name": "exec_command", "strict": false, "parameters": {"type": "object", "properties": {"cmd": {"type": "string"}}}},
            {"type": "namespace", "name": "multi_agent_v1", "description": "Sub-agents", "tools": [
                {"type": "function", "name": "spawn_agent", "parameters": {"type": "object"}},
                {"type": "function", "name": "close_agent", "parameters": {"type": "object"}}]},
            {"type": "web_search", "external_web_access": true}],
    });
    let req = OpenAiResponsesDialect::decode_request(&body, &hints()).unwrap();
    let names: Vec<&str> = req.tools.iter().map(|t| t.name.as_str()).collect();
    assert_eq!(names, ["exec_command", "spawn_agent", "close_agent"]);
    assert_eq!(
        req.messages,
        vec![
            Message::text(Role::System, "You are Codex."),
            Message::text(Role::User, "Say hi."),
        ]
    );
    assert_eq!(req.tool_choice, Some(ToolChoice::Auto));
}

/// OpenCode's chat requests: `stream_options.include_usage` gets a usage chunk before [DONE].
#[test]
fn chat_stream_options_usage_chunk() {
    let body = json!({"model": "m", "stream": true, "stream_options": {"include_usage": true}, "max_tokens": 32000,
        "messages": [{"role": "system", "content": "Title this."}, {"role": "user", "content": "hi"}]});
    let req = OpenAiChatDialect::decode_request(&body, &hints()).unwrap();
    assert!(req.stream_usage);
    let events = OpenAiChatDialect::stream_events(&response(), &req);
    let last = events.last().unwrap().json();
    assert_eq!(last["choices"], json!([]));
    assert_eq!(
        last["usage"],
        json!({"prompt_tokens": 10, "completion_tokens": 5, "total_tokens": 15})
    );
}
