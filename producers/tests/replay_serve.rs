//! `replay serve`: sessions recorded through the capture proxy (fake upstream,
//! real broker), re-run with the official openai and anthropic SDKs against a
//! proxy whose upstream is the recording: identical responses, streams
//! included; a changed message is refused naming session, call and message;
//! nothing is written to the log.

mod common;

use common::*;
use forgelog_producers::{load_recording, RunningProxy};
use forgelog_schemas::Topic;
use forgelog_stream::testing::python_json;
use serde_json::{json, Value};
use std::path::PathBuf;

async fn client(url: &str, key: &str, sdk: &str, mode: &str) -> Value {
    let script = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests/clients/replay_session.py");
    python_json(&script, &[url, key, sdk, mode]).await
}

async fn post(http: &reqwest::Client, url: String, body: Value) -> (u16, Value) {
    let r = http
        .post(url)
        .bearer_auth(ADMIN)
        .body(body.to_string())
        .send()
        .await
        .unwrap();
    (r.status().as_u16(), r.json().await.unwrap())
}

/// `replay serve` of the rig's run, which recorded `sessions` sessions.
async fn replay_of(rig: &Rig, sessions: usize) -> RunningProxy {
    let recording = load_recording(&rig.stream, &rig.run_id).await.unwrap();
    assert_eq!(recording.sessions.len(), sessions);
    RunningProxy::replay(
        config("unused".into(), &rig.run_id),
        recording,
        "127.0.0.1:0".parse().unwrap(),
    )
    .await
    .unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn recorded_sdk_sessions_replay_identically_and_a_changed_message_is_named() {
    let rig = Rig::start(
        forgelog_stream::testing::shared_broker().await,
        Default::default(),
        "replay-serve",
    )
    .await;
    let mut recorded = Vec::new();
    for sdk in ["openai", "anthropic"] {
        let (session, key) = rig.session(&format!("r-{sdk}")).await;
        let responses = client(&rig.proxy.url(), &key, sdk, "run").await;
        assert_eq!(responses.as_array().unwrap().len(), 3, "{responses}");
        rig.finish(&session, json!({"ok": true, "reward": 1.0}))
            .await;
        recorded.push((sdk, session, responses));
    }
    rig.flush().await;
    let calls_before = rig.events(Topic::Calls).await.len();
    assert_eq!(
        calls_before, 12,
        "3 calls per session, started and finished"
    );

    let replay = replay_of(&rig, 2).await;
    let http = reqwest::Client::new();
    let sessions = format!("{}/sessions", replay.url());
    for (sdk, session, responses) in &recorded {
        // By the recorded session id, and by the original session request.
        let asks = [
            json!({"replay_of": session}),
            json!({"rollout_id": format!("r-{sdk}"), "task_id": "task-1", "harness": "sdk-test", "group_id": "g1"}),
        ];
        for ask in asks {
            let (status, v) = post(&http, sessions.clone(), ask).await;
            assert_eq!(status, 200, "{v}");
            assert_eq!(v["session_id"], *session);
            let key = v["api_key"].as_str().unwrap();
            let replayed = client(&replay.url(), key, sdk, "run").await;
            assert_eq!(&replayed, responses, "{sdk}: replayed responses differ");
            let (status, v) = post(
                &http,
                format!("{sessions}/{session}/finish"),
                json!({"exit_status": 0}),
            )
            .await;
            assert_eq!((status, v["model_calls"].as_i64()), (200, Some(3)), "{v}");
        }
        let (_, v) = post(&http, sessions.clone(), json!({"replay_of": session})).await;
        let refused = client(
            &replay.url(),
            v["api_key"].as_str().unwrap(),
            sdk,
            "diverge",
        )
        .await;
        // The second call streams: the refusal comes as the stream's error event
        // (openai raises APIError; anthropic an APIStatusError of the 200 stream).
        assert!(
            refused["status"] == "in-stream" || refused["status"] == 200,
            "{refused}"
        );
        let error = refused["error"].as_str().unwrap();
        assert!(
            error.contains(&format!(
                "session {session}, call 1: message 3 differs from the recording"
            )) && error.contains("field messages[3].content"),
            "{sdk}: {error}"
        );
        post(&http, format!("{sessions}/{session}/finish"), json!({})).await;

        // Not streamed: a 400 in the dialect's own error shape.
        let (_, v) = post(&http, sessions.clone(), json!({"replay_of": session})).await;
        let key = v["api_key"].as_str().unwrap();
        let (path, body) = match *sdk {
            "openai" => (
                "/v1/chat/completions",
                json!({"model": "m", "messages": [{"role": "user", "content": "Hi"}]}),
            ),
            _ => (
                "/v1/messages",
                json!({"model": "m", "max_tokens": 8, "messages": [{"role": "user", "content": "Hi"}]}),
            ),
        };
        let r = http
            .post(format!("{}{path}", replay.url()))
            .bearer_auth(key)
            .header("x-api-key", key)
            .body(body.to_string())
            .send()
            .await
            .unwrap();
        assert_eq!(r.status(), 400);
        let v: Value = r.json().await.unwrap();
        assert_eq!(v["error"]["type"], "invalid_request_error", "{v}");
        let message = v["error"]["message"].as_str().unwrap();
        assert!(
            message.contains(&format!("session {session}, call 0: message 0 differs"))
                && message.contains("field messages[0]"),
            "{message}"
        );
        post(&http, format!("{sessions}/{session}/finish"), json!({})).await;
    }
    let (status, v) = post(&http, sessions.clone(), json!({"replay_of": "nope"})).await;
    assert_eq!(status, 404, "{v}");

    replay
        .shutdown(std::time::Duration::from_secs(1))
        .await
        .unwrap();
    assert_eq!(
        rig.events(Topic::Calls).await.len(),
        calls_before,
        "replay serve writes nothing to the log"
    );
}

/// The two dialects no SDK drives here, over raw HTTP: a replayed call's
/// body, streamed or not, is byte for byte the recorded one.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn responses_and_gemini_calls_replay_byte_for_byte() {
    let rig = Rig::start(
        forgelog_stream::testing::shared_broker().await,
        Default::default(),
        "replay-raw",
    )
    .await;
    let weather = json!({"type": "object", "properties": {"city": {"type": "string"}}});
    let calls = [
        (
            "/v1/responses",
            json!({"model": "m", "input": "Weather in Paris?", "tools": [{"type": "function", "name": "get_weather", "parameters": weather}]}),
        ),
        (
            "/v1/responses",
            json!({"model": "m", "input": "Stream please", "stream": true}),
        ),
        (
            "/v1beta/models/g:generateContent",
            json!({"contents": [{"role": "user", "parts": [{"text": "Weather?"}]}], "tools": [{"functionDeclarations": [{"name": "get_weather", "parameters": weather}]}]}),
        ),
        (
            "/v1beta/models/g:streamGenerateContent?alt=sse",
            json!({"contents": [{"role": "user", "parts": [{"text": "Stream please"}]}]}),
        ),
    ];
    // Keep-alive comments depend on timing, not on the call.
    let send = |base: String, key: String| {
        let calls = calls.clone();
        async move {
            let http = reqwest::Client::new();
            let mut bodies = Vec::new();
            for (path, body) in calls {
                let r = http
                    .post(format!("{base}{path}"))
                    .bearer_auth(&key)
                    .header("x-goog-api-key", &key)
                    .body(body.to_string())
                    .send()
                    .await
                    .unwrap();
                assert_eq!(r.status(), 200, "{path}");
                let text = r.text().await.unwrap();
                bodies.push(text.replace(": keep-alive\n\n", ""));
            }
            bodies
        }
    };
    let (session, key) = rig.session("r-raw").await;
    let recorded = send(rig.proxy.url(), key).await;
    assert!(
        recorded[1].contains("event: response.completed"),
        "{}",
        recorded[1]
    );
    assert!(recorded[2].contains("functionCall"), "{}", recorded[2]);
    rig.finish(&session, Value::Null).await;
    rig.flush().await;

    let replay = replay_of(&rig, 1).await;
    let (_, v) = post(
        &reqwest::Client::new(),
        format!("{}/sessions", replay.url()),
        json!({"replay_of": "r-raw"}),
    )
    .await;
    let replayed = send(replay.url(), v["api_key"].as_str().unwrap().to_string()).await;
    for (i, (a, b)) in recorded.iter().zip(&replayed).enumerate() {
        assert!(a == b, "call {i}:\nrecorded {a}\nreplayed {b}");
    }
    replay
        .shutdown(std::time::Duration::from_secs(1))
        .await
        .unwrap();
}
