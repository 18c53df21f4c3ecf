//! The official Python SDKs (openai, anthropic) and raw HTTP for Gemini against
//! the proxy and the real broker: in front of the fake vLLM upstream (whose
//! scripted answers exercise tool calls in every shape) and in front of the
//! real engine on SmolLM2. Each checks that the log carries the token ids and
//! logprobs the upstream returned, byte for byte.

mod common;
use forgelog_api::Verdict;

use common::*;
use forgelog_schemas::{CallStatus, Event, Topic};
use forgelog_stream::testing::python_json;
use serde_json::{json, Value};
use std::path::PathBuf;

/// Runs one client script in a session; checks the session's events against the upstream.
async fn run_client(script: &str, rollout: &str) {
    let rig = Rig::start(
        forgelog_stream::testing::shared_broker().await,
        Default::default(),
        "proxy-sdk",
    )
    .await;
    run_client_on(&rig, script, rollout).await;
}

/// Returns the session's CallFinished events.
async fn run_client_on(
    rig: &Rig,
    script: &str,
    rollout: &str,
) -> Vec<forgelog_schemas::CallFinished> {
    let (session, key) = rig.session(rollout).await;
    let path = PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("tests/clients")
        .join(script);
    // The script prints {"calls": N}.
    let expected = python_json(&path, &[&rig.proxy.url(), &key]).await;
    let expected = expected["calls"].as_u64().unwrap() as usize;

    let finished = rig
        .finish(&session, Some(Verdict::scored(1.0, "passed")))
        .await;
    assert_eq!(finished.model_calls, expected as i64);
    rig.flush().await;
    let calls = rig.events(Topic::Calls).await;
    let (started, done) = calls_of(&calls, &session);
    assert_eq!(
        (started, done.len()),
        (expected, expected),
        "one CallStarted and one CallFinished per call"
    );
    let ok = done.iter().filter(|c| c.status == CallStatus::Ok).count();
    assert!(ok >= expected - 1, "{ok} ok calls of {expected}");
    rig.assert_calls_match_upstream(&done);
    let indices: Vec<i64> = done.iter().map(|c| c.call_index).collect();
    assert_eq!(indices, (0..expected as i64).collect::<Vec<_>>());

    let rollouts = rig.events(Topic::Rollouts).await;
    assert!(rollouts.iter().any(
        |e| matches!(e, Event::RolloutStarted(r) if r.session_id == session && r.group_size == 2)
    ));
    assert!(rollouts.iter().any(|e| matches!(e, Event::RolloutFinished(r) if r.session_id == session && r.model_calls == expected as i64)));
    let rewards = rig.events(Topic::Rewards).await;
    assert!(rewards.iter().any(|e| matches!(e, Event::VerifierResult(v) if v.rollout_id == rollout && v.ok && v.reward == Some(1.0))));
    done
}

/// Both SDKs, every dialect they speak, and Gemini over raw HTTP, streamed and
/// not, against SmolLM2.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sdks_against_the_real_engine() {
    let rig = Rig::start_on_engine(
        forgelog_stream::testing::shared_broker().await,
        "proxy-sdk-engine",
    )
    .await;
    let done = run_client_on(&rig, "engine_sdks.py", "r-engine").await;
    assert_eq!(done.len(), 11);
    assert!(done.iter().all(|c| c.status == CallStatus::Ok), "{done:?}");
    // The probe at start, then one engine answer per call.
    assert_eq!(rig.upstream.answers().len(), 12);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn openai_chat_sdk() {
    run_client("openai_chat.py", "r-chat").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn openai_responses_sdk() {
    run_client("openai_responses.py", "r-responses").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn anthropic_sdk() {
    let rig = Rig::start(
        forgelog_stream::testing::shared_broker().await,
        Default::default(),
        "proxy-sdk",
    )
    .await;
    let done = run_client_on(&rig, "anthropic_messages.py", "r-anthropic").await;
    // What /metrics says of those calls: by dialect and status in the events'
    // snake_case, with their tokens, every metric described.
    let metrics = reqwest::get(format!("{}/metrics", rig.proxy.url()))
        .await
        .unwrap()
        .text()
        .await
        .unwrap();
    let value = |series: &str| -> f64 {
        metrics
            .lines()
            .find(|l| l.starts_with(series))
            .and_then(|l| l.rsplit(' ').next()?.parse().ok())
            .unwrap_or_else(|| panic!("no {series} in\n{metrics}"))
    };
    let ok = done.iter().filter(|c| c.status == CallStatus::Ok).count();
    assert_eq!(
        value("forgelog_proxy_calls_total{dialect=\"anthropic_messages\",status=\"ok\"}"),
        ok as f64
    );
    let sampled: i64 = done.iter().map(|c| c.usage.completion_tokens).sum();
    assert_eq!(
        value("forgelog_proxy_completion_tokens_total{dialect=\"anthropic_messages\"}"),
        sampled as f64
    );
    assert!(metrics.contains("# TYPE forgelog_proxy_upstream_seconds histogram"));
    for line in metrics.lines().filter(|l| l.starts_with("# TYPE ")) {
        let name = line.split_whitespace().nth(2).unwrap();
        assert!(
            metrics.contains(&format!("# HELP {name} ")),
            "no help for {name}"
        );
    }
}

/// Gemini over raw HTTP: generateContent with a function call, the function's
/// response, and streamGenerateContent as SSE.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn gemini_raw_http() {
    let rig = Rig::start(
        forgelog_stream::testing::shared_broker().await,
        Default::default(),
        "proxy-gemini",
    )
    .await;
    let (session, key) = rig.session("r-gemini").await;
    let url = |action: &str| format!("{}/v1beta/models/gemini-test:{action}", rig.proxy.url());
    let tools = json!([{"functionDeclarations": [{"name": "get_weather", "parameters": {"type": "object", "properties": {"city": {"type": "string"}}}}]}]);
    let mut contents = vec![json!({"role": "user", "parts": [{"text": "Weather in Paris?"}]})];
    let body = json!({"contents": contents, "tools": tools, "systemInstruction": {"parts": [{"text": "Be terse."}]}});
    let r: Value = rig
        .http
        .post(url("generateContent"))
        .header("x-goog-api-key", &key)
        .body(body.to_string())
        .send()
        .await
        .unwrap()
        .json_value()
        .await;
    let parts = r["candidates"][0]["content"]["parts"]
        .as_array()
        .unwrap()
        .clone();
    assert_eq!(parts[1]["functionCall"]["name"], "get_weather", "{r}");
    assert_eq!(parts[1]["functionCall"]["args"], json!({"city": "Paris"}));
    assert_eq!(r["candidates"][0]["finishReason"], "STOP");
    contents.push(json!({"role": "model", "parts": parts}));
    contents.push(json!({"role": "user", "parts": [{"functionResponse": {"name": "get_weather", "response": {"forecast": "sunny"}}}]}));
    let body = json!({"contents": contents, "tools": tools});
    let r: Value = rig
        .http
        .post(format!("{}?key={key}", url("generateContent")))
        .body(body.to_string())
        .send()
        .await
        .unwrap()
        .json_value()
        .await;
    assert!(
        r["candidates"][0]["content"]["parts"][0]["text"]
            .as_str()
            .unwrap()
            .starts_with("Echo: Weather in Paris"),
        "{r}"
    );

    let body = json!({"contents": [{"role": "user", "parts": [{"text": "Stream please"}]}]});
    let resp = rig
        .http
        .post(format!("{}?alt=sse", url("streamGenerateContent")))
        .header("x-goog-api-key", &key)
        .body(body.to_string())
        .send()
        .await
        .unwrap();
    assert_eq!(resp.headers()["content-type"], "text/event-stream");
    let text = resp.text().await.unwrap();
    let chunks: Vec<Value> = text
        .lines()
        .filter_map(|l| l.strip_prefix("data: "))
        .map(|d| serde_json::from_str(d).unwrap())
        .collect();
    let streamed: String = chunks
        .iter()
        .flat_map(|c| {
            c["candidates"][0]["content"]["parts"]
                .as_array()
                .unwrap()
                .clone()
        })
        .filter_map(|p| p["text"].as_str().map(str::to_string))
        .collect();
    assert_eq!(streamed, "Echo: Stream please");
    assert_eq!(
        chunks.last().unwrap()["usageMetadata"]["candidatesTokenCount"],
        19
    );

    // Errors in Gemini's shape: bad key, wrong-typed field (recorded), unknown method.
    let r = rig
        .http
        .post(url("generateContent"))
        .header("x-goog-api-key", "nope")
        .body("{}")
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 401);
    assert_eq!(r.json_value().await["error"]["status"], "UNAUTHENTICATED");
    let r = rig
        .http
        .post(url("generateContent"))
        .header("x-goog-api-key", &key)
        .body(r#"{"contents": "hi"}"#)
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 400);
    assert_eq!(r.json_value().await["error"]["status"], "INVALID_ARGUMENT");

    rig.finish(&session, None).await;
    rig.flush().await;
    let (started, done) = calls_of(&rig.events(Topic::Calls).await, &session);
    assert_eq!((started, done.len()), (4, 4));
    assert_eq!(done[3].status, CallStatus::ClientError);
    rig.assert_calls_match_upstream(&done);
    let rewards = rig.events(Topic::Rewards).await;
    assert!(rewards.iter().any(|e| matches!(e, Event::VerifierResult(v) if v.rollout_id == "r-gemini" && !v.ok && v.reward.is_none())), "no verifier: ok=false, reward=null");
}

trait JsonValue {
    async fn json_value(self) -> Value;
}

impl JsonValue for reqwest::Response {
    async fn json_value(self) -> Value {
        let bytes = self.bytes().await.unwrap();
        serde_json::from_slice(&bytes)
            .unwrap_or_else(|e| panic!("not JSON ({e}): {}", String::from_utf8_lossy(&bytes)))
    }
}
