use super::*;
use crate::scheduler::FinishReason;

fn fields(json: Value) -> SamplingFields {
    serde_json::from_value(json).unwrap()
}

fn vocabulary() -> Arc<Vocabulary> {
    Arc::new(Vocabulary::of(&forgelog_model::testing::tiny_tokenizer()))
}

#[test]
fn context_and_field_errors_are_400s() {
    let err = generation_request(&fields(json!({})), vec![1; 10], 10, vocabulary).unwrap_err();
    assert_eq!(
        (err.status, err.code),
        (400, Some("context_length_exceeded"))
    );
    assert!(err.message.contains("context length"));
    let err = generation_request(
        &fields(json!({"max_tokens": 5})),
        vec![1; 8],
        10,
        vocabulary,
    )
    .unwrap_err();
    assert_eq!(err.code, Some("context_length_exceeded"));
    for bad in [
        json!({"stream": true}),
        json!({"temperature": -1.0}),
        json!({"top_p": 0.0}),
        json!({"n": 2}),
    ] {
        let err = generation_request(&fields(bad.clone()), vec![1], 10, vocabulary).unwrap_err();
        assert_eq!(err.status, 400, "{bad}");
    }
    assert!(parse::<CompletionRequest>(b"{not json").is_err());
    assert!(parse::<ChatCompletionRequest>(br#"{"messages": 3}"#).is_err());
}

#[test]
fn tool_calls_become_openai_tool_calls_and_tokens_stay_raw() {
    let generation = Generation {
        tokens: vec![10, 11, 2],
        logprobs: vec![-0.5, -0.25, -0.125],
        text: "<tool_call>{\"name\": \"add\", \"arguments\": {\"a\": 1}}</tool_call>".into(),
        finish_reason: FinishReason::Stop,
        policy_version: 4,
        time_to_first_token: Default::default(),
    };
    let meta = Meta {
        id: "chatcmpl-1".into(),
        created: 0,
        model: "m",
    };
    let include = Include {
        logprobs: true,
        token_ids: true,
    };
    let body = chat_response(&meta, &[1, 2, 3], &generation, include, true);
    let choice = &body["choices"][0];
    assert_eq!(choice["finish_reason"], "tool_calls");
    assert_eq!(choice["message"]["content"], Value::Null);
    assert_eq!(
        choice["message"]["tool_calls"][0]["function"]["name"],
        "add"
    );
    assert_eq!(choice["token_ids"], json!([10, 11, 2]));
    assert_eq!(
        choice["logprobs"]["content"][2],
        json!({"token": "token_id:2", "logprob": -0.125, "bytes": null, "top_logprobs": []})
    );
    assert_eq!(
        (
            body["policy_version"].clone(),
            body["prompt_token_ids"].clone()
        ),
        (json!(4), json!([1, 2, 3]))
    );
    assert_eq!(
        body["usage"],
        json!({"prompt_tokens": 3, "completion_tokens": 3, "total_tokens": 6})
    );
    // Without tools in the request the text is left alone.
    let plain = chat_response(&meta, &[1], &generation, include, false);
    assert_eq!(plain["choices"][0]["finish_reason"], "stop");
    assert!(plain["choices"][0]["message"]["content"]
        .as_str()
        .unwrap()
        .starts_with("<tool_call>"));
}

#[test]
fn defaults_fill_the_context_and_sample_at_temperature_one() {
    let (request, include) = generation_request(
        &fields(json!({"logprobs": true})),
        vec![1, 2],
        10,
        vocabulary,
    )
    .unwrap();
    assert_eq!(request.max_tokens, 8);
    assert_eq!(request.sampling, SamplerConfig::default());
    assert_eq!(
        include,
        Include {
            logprobs: true,
            token_ids: false
        }
    );
}
