use super::*;
use forgelog_dialects::dialect::*;

/// An upstream that is not a URL fails each call with its own words, as
/// an unreachable one does, and the proxy goes on.
#[tokio::test]
async fn an_upstream_that_is_no_url_is_named_in_each_failure() {
    let client = UpstreamClient::new("not a url/", Duration::from_secs(1), 1);
    let req = ChatRequest::default();
    let upstream = upstream_request(&req, &SamplingParams::default(), "m", &ExtraBody::default());
    for _ in 0..2 {
        let err = client.chat(&upstream).await.unwrap_err();
        assert!(
            matches!(&err, UpstreamError::Connect(m)
            if m.starts_with("not a url/v1/chat/completions: ")),
            "{err}"
        );
    }
}

/// A context-length refusal from the engine (ours or vLLM) becomes each
/// dialect's own: OpenAI's `context_length_exceeded` code, Anthropic's
/// "prompt is too long", Gemini's INVALID_ARGUMENT; all 400.
#[test]
fn context_length_errors_in_each_dialect() {
    let ours = json!({"error": {"message": "This model's maximum context length is 8192 tokens. However, you requested 9000 tokens (8990 in the messages, 10 in the completion).", "type": "invalid_request_error", "code": "context_length_exceeded"}});
    let vllm = json!({"object": "error", "message": "This model's maximum context length is 8192 tokens. However, you requested 9000 tokens.", "type": "BadRequestError", "param": null, "code": 400});
    for body in [ours, vllm] {
        let err = UpstreamError::Status {
            status: 400,
            body: body.to_string(),
        }
        .dialect_error();
        assert_eq!(err.kind, ErrorKind::ContextLength);
        assert_eq!(err.kind.status(), 400);
        assert!(err
            .message
            .starts_with("This model's maximum context length is 8192 tokens."));
        let chat = OpenAiChatDialect::error_body(&err);
        assert_eq!(chat["error"]["code"], "context_length_exceeded");
        assert_eq!(chat["error"]["type"], "invalid_request_error");
        assert_eq!(OpenAiResponsesDialect::error_body(&err), chat);
        assert_eq!(
            OpenAiResponsesDialect::stream_error(&err).json()["code"],
            "context_length_exceeded"
        );
        let anthropic = AnthropicDialect::error_body(&err);
        assert_eq!(anthropic["error"]["type"], "invalid_request_error");
        assert!(anthropic["error"]["message"]
            .as_str()
            .unwrap()
            .starts_with("prompt is too long: This model's maximum context length"));
        assert_eq!(
            GeminiDialect::error_body(&err)["error"]["status"],
            "INVALID_ARGUMENT"
        );
    }
    // Other 4xx stay plain invalid requests, with no code.
    let other = UpstreamError::Status {
        status: 400,
        body: json!({"error": {"message": "top_p must be in (0, 1]"}}).to_string(),
    }
    .dialect_error();
    assert_eq!(other.kind, ErrorKind::InvalidRequest);
    assert_eq!(
        OpenAiChatDialect::error_body(&other)["error"]["code"],
        Value::Null
    );
}
