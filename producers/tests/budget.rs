//! Per-session limits: the call budget (a final "budget exhausted" answer in
//! the harness's own dialect and streaming mode, recorded as a budget stop),
//! the max_tokens clamp (requested vs sent recorded), and a prompt over the
//! upstream's context answered as each dialect's context-length error.

mod common;
use forgelog_api::Verdict;

use common::*;
use forgelog_producers::fake_upstream::FakeOptions;
use forgelog_schemas::{CallStatus, Topic};
use serde_json::{json, Value};

/// The `data:` payloads of an SSE body, with their `event:` names.
fn sse(body: &str) -> Vec<(Option<String>, Value)> {
    body.split("\n\n")
        .filter(|f| f.contains("data: "))
        .map(|f| {
            let event = f
                .lines()
                .find_map(|l| l.strip_prefix("event: "))
                .map(str::to_string);
            let data = f.lines().find_map(|l| l.strip_prefix("data: ")).unwrap();
            (event, serde_json::from_str(data).unwrap_or(json!(data)))
        })
        .collect()
}

async fn post_raw(rig: &Rig, path: &str, key: &str, body: &Value) -> (u16, String) {
    let r = rig
        .http
        .post(format!("{}{path}", rig.proxy.url()))
        .header("x-api-key", key)
        .json(body)
        .send()
        .await
        .unwrap();
    (r.status().as_u16(), r.text().await.unwrap())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn past_the_budget_every_dialect_gets_a_final_answer_recorded_as_a_budget_stop() {
    let rig = Rig::start(
        forgelog_stream::testing::shared_broker().await,
        Default::default(),
        "proxy-budget",
    )
    .await;
    let (session, key) = rig
        .session_with("r-budget", |s| s.max_model_calls(2).max_tokens(7))
        .await;
    let weather = json!([{"type": "function", "function": {"name": "get_weather", "parameters": {"type": "object"}}}]);

    // Within the budget: served, max_tokens clamped from 100 to 7 (the fake cuts at 7 bytes).
    let ask = json!({"model": "m", "max_tokens": 100, "messages": [{"role": "user", "content": "hello there"}]});
    let (status, v) = rig.post("/v1/chat/completions", Some(&key), &ask).await;
    assert_eq!(status, 200, "{v}");
    assert_eq!(v["choices"][0]["message"]["content"], "Echo: h");
    assert_eq!(v["choices"][0]["finish_reason"], "length");
    let (status, _) = rig
        .post(
            "/v1/chat/completions",
            Some(&key),
            &json!({"messages": [{"role": "user", "content": "hi"}], "tools": weather}),
        )
        .await;
    assert_eq!(status, 200);

    // Past it, OpenAI Chat, not streamed: plain text, no tool calls, finish "stop".
    let (status, v) = rig
        .post(
            "/v1/chat/completions",
            Some(&key),
            &json!({"messages": [{"role": "user", "content": "more"}], "tools": weather}),
        )
        .await;
    assert_eq!(status, 200, "{v}");
    let message = &v["choices"][0]["message"];
    assert!(message["content"]
        .as_str()
        .unwrap()
        .starts_with("Budget exhausted"));
    assert!(message.get("tool_calls").is_none(), "{v}");
    assert_eq!(v["choices"][0]["finish_reason"], "stop");

    // Anthropic Messages, streamed: the full event sequence, stop_reason end_turn.
    let (status, body) = post_raw(
        &rig,
        "/v1/messages?beta=true",
        &key,
        &json!({"model": "claude-x", "max_tokens": 128000, "stream": true,
                "messages": [{"role": "user", "content": "more"}]}),
    )
    .await;
    assert_eq!(status, 200, "{body}");
    let events = sse(&body);
    let names: Vec<&str> = events.iter().filter_map(|e| e.0.as_deref()).collect();
    assert_eq!(names.first(), Some(&"message_start"));
    assert_eq!(names.last(), Some(&"message_stop"));
    let delta = events
        .iter()
        .find(|e| e.0.as_deref() == Some("message_delta"))
        .unwrap();
    assert_eq!(delta.1["delta"]["stop_reason"], "end_turn");
    assert!(body.contains("Budget exhausted"));
    assert!(!body.contains("tool_use"));

    // OpenAI Responses, streamed: response.completed with one message item.
    let (status, body) = post_raw(
        &rig,
        "/v1/responses",
        &key,
        &json!({"model": "m", "stream": true, "input": "more"}),
    )
    .await;
    assert_eq!(status, 200, "{body}");
    let events = sse(&body);
    let done = events.last().unwrap();
    assert_eq!(done.0.as_deref(), Some("response.completed"));
    let output = done.1["response"]["output"].as_array().unwrap();
    assert_eq!(output.len(), 1);
    assert_eq!(output[0]["type"], "message");

    // OpenAI Chat, streamed: a text chunk, finish "stop", then [DONE].
    let (status, body) = post_raw(
        &rig,
        "/v1/chat/completions",
        &key,
        &json!({"stream": true, "messages": [{"role": "user", "content": "more"}]}),
    )
    .await;
    assert_eq!(status, 200);
    assert!(body.trim_end().ends_with("data: [DONE]"), "{body}");
    assert!(body.contains("\"finish_reason\":\"stop\""), "{body}");

    // The upstream answered the proxy's start-up probe and the budget's two calls only.
    assert_eq!(rig.upstream.answers().len(), 3);
    let done = rig.finish(&session, Some(Verdict::scored(1.0, ""))).await;
    assert_eq!(done.model_calls, 6);
    rig.flush().await;
    let (started, calls) = calls_of(&rig.events(Topic::Calls).await, &session);
    assert_eq!((started, calls.len()), (6, 6));
    let first = calls.iter().find(|c| c.call_index == 0).unwrap();
    assert_eq!(first.status, CallStatus::Ok);
    assert!(first.trainable);
    assert_eq!(first.sampling_requested.max_tokens, Some(100));
    assert_eq!(first.sampling_sent.max_tokens, Some(7));
    let clamped_default = calls.iter().find(|c| c.call_index == 1).unwrap();
    assert_eq!(clamped_default.sampling_requested.max_tokens, None);
    assert_eq!(clamped_default.sampling_sent.max_tokens, Some(7));
    for c in calls.iter().filter(|c| c.call_index >= 2) {
        assert_eq!(c.status, CallStatus::BudgetStop, "call {}", c.call_index);
        assert!(!c.trainable);
        assert_eq!(c.untrainable_reason.as_deref(), Some("budget exhausted"));
        assert!(c.prompt_token_ids.is_empty() && c.completion_token_ids.is_empty());
        assert_eq!(c.finish_reason.as_deref(), Some("stop"));
        assert!(String::from_utf8_lossy(&c.response_body).contains("Budget exhausted"));
    }
    let anthropic = calls.iter().find(|c| c.call_index == 3).unwrap();
    assert_eq!(anthropic.sampling_requested.max_tokens, Some(128000));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_prompt_over_the_context_is_each_dialects_context_length_error() {
    let options = FakeOptions {
        context: Some(400),
        ..Default::default()
    };
    let rig = Rig::start(
        forgelog_stream::testing::shared_broker().await,
        options,
        "proxy-context",
    )
    .await;
    assert_eq!(rig.proxy.state.probe().context, Some(400));
    let (session, key) = rig.session("r-context").await;
    let long = "word ".repeat(200);

    let (status, v) = rig
        .post(
            "/v1/chat/completions",
            Some(&key),
            &json!({"messages": [{"role": "user", "content": long}]}),
        )
        .await;
    assert_eq!(status, 400, "{v}");
    assert_eq!(v["error"]["code"], "context_length_exceeded");
    assert_eq!(v["error"]["type"], "invalid_request_error");
    assert!(v["error"]["message"]
        .as_str()
        .unwrap()
        .starts_with("This model's maximum context length is 400 tokens"));

    let (status, body) = post_raw(
        &rig,
        "/v1/messages",
        &key,
        &json!({"model": "c", "max_tokens": 10, "messages": [{"role": "user", "content": long}]}),
    )
    .await;
    assert_eq!(status, 400, "{body}");
    let v: Value = serde_json::from_str(&body).unwrap();
    assert_eq!(v["error"]["type"], "invalid_request_error");
    assert!(v["error"]["message"]
        .as_str()
        .unwrap()
        .starts_with("prompt is too long: "));

    let (status, body) = post_raw(
        &rig,
        "/v1/responses",
        &key,
        &json!({"model": "m", "stream": true, "input": long}),
    )
    .await;
    assert_eq!(status, 200);
    let events = sse(&body);
    let (name, err) = events.last().unwrap();
    assert_eq!(name.as_deref(), Some("error"));
    assert_eq!(err["code"], "context_length_exceeded");

    // 128000 tokens asked of a 400-token model: sent unset, served.
    let (status, v) = rig
        .post(
            "/v1/chat/completions",
            Some(&key),
            &json!({"max_tokens": 128000, "messages": [{"role": "user", "content": "short"}]}),
        )
        .await;
    assert_eq!(status, 200, "{v}");

    rig.finish(&session, Some(Verdict::failed(Value::Null)))
        .await;
    rig.flush().await;
    let (_, calls) = calls_of(&rig.events(Topic::Calls).await, &session);
    assert_eq!(calls.len(), 4);
    for c in calls.iter().filter(|c| c.call_index < 3) {
        assert_eq!(c.status, CallStatus::ClientError, "call {}", c.call_index);
        assert!(!c.trainable);
    }
    let served = calls.iter().find(|c| c.call_index == 3).unwrap();
    assert_eq!(served.status, CallStatus::Ok);
    assert_eq!(served.sampling_requested.max_tokens, Some(128000));
    assert_eq!(served.sampling_sent.max_tokens, None);
}
