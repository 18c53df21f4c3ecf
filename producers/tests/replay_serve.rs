//! `replay serve`: sessions recorded through the capture proxy (fake upstream,
//! real broker), re-run with the official openai and anthropic SDKs against a
//! proxy whose upstream is the recording: identical responses, streams
//! included; a changed message is refused naming session, call and message;
//! nothing is written to the log.

mod common;
use forgelog_api::{Finish, NewSession, ReplaySession, SessionClient, Verdict};

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

fn sessions_of(replay: &RunningProxy) -> SessionClient {
    SessionClient::new(replay.url(), Some(ADMIN.into()))
}

/// `replay serve` of the rig's run, which recorded `sessions` sessions.
async fn replay_of(rig: &Rig, sessions: usize) -> RunningProxy {
    let recording = load_recording(&rig.stream, &rig.run_id, None)
        .await
        .unwrap();
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
        rig.finish(&session, Some(Verdict::scored(1.0, ""))).await;
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
    let sessions = sessions_of(&replay);
    let exited = Finish {
        exit_status: Some(0),
        verifier: None,
        ..Default::default()
    };
    for (sdk, session, responses) in &recorded {
        // By the recorded session id, and by the original session request.
        let asks = [
            ReplaySession::Of {
                replay_of: session.clone(),
            },
            ReplaySession::Original(NewSession::new(
                format!("r-{sdk}"),
                "task-1",
                "sdk-test",
                "g1",
            )),
        ];
        for ask in asks {
            let created = sessions.replay(&ask).await.unwrap();
            assert_eq!(&created.session_id, session);
            let replayed = client(&replay.url(), &created.api_key, sdk, "run").await;
            assert_eq!(&replayed, responses, "{sdk}: replayed responses differ");
            let done = sessions.finish(session, &exited).await.unwrap();
            assert_eq!(done.model_calls, 3);
        }
        let created = sessions.replay_of(session).await.unwrap();
        let refused = client(&replay.url(), &created.api_key, sdk, "diverge").await;
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
        sessions.finish(session, &Finish::default()).await.unwrap();

        // Not streamed: a 400 in the dialect's own error shape.
        let key = &sessions.replay_of(session).await.unwrap().api_key;
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
        sessions.finish(session, &Finish::default()).await.unwrap();
    }
    let refused = sessions.replay_of("nope").await.unwrap_err();
    assert_eq!(refused.status(), Some(404), "{refused}");

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
    rig.finish(&session, None).await;
    rig.flush().await;

    let replay = replay_of(&rig, 1).await;
    let created = sessions_of(&replay).replay_of("r-raw").await.unwrap();
    let replayed = send(replay.url(), created.api_key).await;
    for (i, (a, b)) in recorded.iter().zip(&replayed).enumerate() {
        assert!(a == b, "call {i}:\nrecorded {a}\nreplayed {b}");
    }
    replay
        .shutdown(std::time::Duration::from_secs(1))
        .await
        .unwrap();
}
