//! The committed fixture is a real recording: calls made with the official
//! openai and anthropic SDKs through the capture proxy to `forgelog engine`
//! on SmolLM2, each trainable, in two GRPO groups with verifier verdicts.
//!
//! `FORGELOG_WRITE_FIXTURES=1 cargo test -p forgelog-replay-tests --test record_fixture`
//! records it again (needs the SmolLM2 GGUF, tansu and the Python venv; about
//! a minute) and rewrites `fixtures/smollm2-run/` with its golden outputs.

use forgelog_consumers::{rebuild::rebuild, RewardConfig};
use forgelog_producers::server::ProxyConfig;
use forgelog_producers::RunningProxy;
use forgelog_replay_tests::{by_topic, decode, encode, fixture_dir, golden, RUN};
use forgelog_schemas::{CallStatus, Dialect, Event, Topic};
use forgelog_stream::testing::{python_json, PrivateBroker};
use forgelog_stream::{ReplayReader, StartAt};
use serde_json::{json, Value};
use std::collections::BTreeMap;
use std::path::PathBuf;
use std::time::Duration;

/// (group, rollout, sdk, seed, verifier ran)
const ROLLOUTS: [(&str, &str, &str, &str, bool); 4] = [
    ("g0", "g0-openai", "openai", "0", true),
    ("g0", "g0-anthropic", "anthropic", "0", true),
    ("g1", "g1-openai", "openai", "10", true),
    ("g1", "g1-anthropic", "anthropic", "10", false),
];

/// The verifier: does the first answer name Paris (in its text or a tool
/// call's arguments) and end on its own, not cut off at `max_tokens`?
fn verdict(responses: &Value) -> Value {
    let first = &responses[0];
    let paris = first.to_string().to_lowercase().contains("paris");
    let finish = first["choices"][0]["finish_reason"]
        .as_str()
        .or(first["stop_reason"].as_str())
        .unwrap_or_default();
    let ended = !matches!(finish, "length" | "max_tokens");
    let reward = if paris && ended { 1.0 } else { 0.0 };
    json!({"ok": true, "reward": reward, "details": format!("names Paris: {paris}, finish: {finish}")})
}

async fn record() {
    let broker = PrivateBroker::start().expect("tansu (scripts/setup.sh)");
    let config = broker.config();
    forgelog_stream::admin::create_topics(&config, &Default::default())
        .await
        .unwrap();
    let engine_url = forgelog_engine::testing::smollm2().0.base.clone();
    let spool = tempfile::tempdir().unwrap();
    let proxy = RunningProxy::start(
        ProxyConfig {
            upstream: engine_url,
            run_id: Some(RUN.into()),
            admin_token: None,
            body_limit: 1 << 20,
            max_calls_per_session: 4,
            upstream_timeout: Duration::from_secs(300),
            keep_alive: Duration::from_secs(5),
            max_upstream_requests: 8,
        },
        &config,
        spool.path().to_path_buf(),
        "127.0.0.1:0".parse().unwrap(),
    )
    .await
    .unwrap();
    assert_eq!(
        proxy.state.probe_warning, None,
        "SmolLM2 answers are trainable"
    );
    let http = reqwest::Client::new();
    let script = PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("../producers/tests/clients/replay_session.py");
    let mut sdk_responses = BTreeMap::new();
    for (group, rollout, sdk, seed, verified) in ROLLOUTS {
        let post = |path: String, body: Value| {
            let http = http.clone();
            async move {
                let r = http.post(path).body(body.to_string()).send().await.unwrap();
                assert!(r.status().is_success());
                r.json::<Value>().await.unwrap()
            }
        };
        let s = post(
            format!("{}/sessions", proxy.url()),
            json!({"rollout_id": rollout, "task_id": "weather-paris", "harness": format!("{sdk}-sdk"), "group_id": group, "group_size": 2}),
        )
        .await;
        let session = s["session_id"].as_str().unwrap().to_string();
        let responses = python_json(
            &script,
            &[
                &proxy.url(),
                s["api_key"].as_str().unwrap(),
                sdk,
                "run",
                seed,
            ],
        )
        .await;
        let verifier = if verified {
            verdict(&responses)
        } else {
            Value::Null
        };
        post(
            format!("{}/sessions/{session}/finish", proxy.url()),
            json!({"exit_status": 0, "verifier": verifier}),
        )
        .await;
        sdk_responses.insert(session, json!({"sdk": sdk, "responses": responses}));
    }
    proxy.shutdown(Duration::from_secs(60)).await.unwrap();

    let events = tokio::task::spawn_blocking(move || {
        let reader = ReplayReader::new(&config).unwrap();
        let mut events = Vec::new();
        for topic in [Topic::Calls, Topic::Rollouts, Topic::Rewards] {
            for r in reader
                .read(topic.name(), StartAt::Beginning, Some(RUN))
                .unwrap()
            {
                events.push(r.event.unwrap());
            }
        }
        events
    })
    .await
    .unwrap();
    let dir = fixture_dir();
    std::fs::create_dir_all(dir.join("golden")).unwrap();
    std::fs::write(dir.join("events.bin"), encode(&events).unwrap()).unwrap();
    let mut sdk = serde_json::to_string_pretty(&sdk_responses).unwrap();
    sdk.push('\n');
    std::fs::write(dir.join("golden/sdk_responses.json"), sdk).unwrap();
    for (name, text) in golden(&rebuild(&by_topic(&events), RewardConfig::default())) {
        std::fs::write(dir.join("golden").join(name), text).unwrap();
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_fixture_is_a_trainable_smollm2_recording_in_two_dialects() {
    if std::env::var_os("FORGELOG_WRITE_FIXTURES").is_some() {
        record().await;
    }
    let bytes = std::fs::read(fixture_dir().join("events.bin")).expect("committed fixture");
    assert!(bytes.len() < 512 << 10, "fixture is {} bytes", bytes.len());
    let events = decode(&bytes).unwrap();
    assert!(events.iter().all(|e| e.run_id() == RUN));
    let dialects: std::collections::BTreeSet<Dialect> = events
        .iter()
        .filter_map(|e| match e {
            Event::CallStarted(c) => Some(c.dialect),
            _ => None,
        })
        .collect();
    assert_eq!(
        dialects.into_iter().collect::<Vec<_>>(),
        [Dialect::OpenaiChat, Dialect::AnthropicMessages]
    );
    let finished: Vec<_> = events
        .iter()
        .filter_map(|e| match e {
            Event::CallFinished(c) => Some(c),
            _ => None,
        })
        .collect();
    assert_eq!(finished.len(), 3 * ROLLOUTS.len());
    for c in finished {
        assert_eq!(c.status, CallStatus::Ok, "{:?}", c.error);
        assert!(c.trainable, "{:?}", c.untrainable_reason);
        assert!(c.model.to_lowercase().contains("smollm2"), "{}", c.model);
        assert_eq!(c.completion_token_ids.len(), c.completion_logprobs.len());
        assert!(!c.completion_token_ids.is_empty());
    }
    let verdicts: Vec<_> = events
        .iter()
        .filter_map(|e| match e {
            Event::VerifierResult(v) => Some((v.ok, v.reward)),
            _ => None,
        })
        .collect();
    assert_eq!(verdicts.len(), ROLLOUTS.len());
    assert_eq!(verdicts.iter().filter(|v| v.1.is_none()).count(), 1);
}
