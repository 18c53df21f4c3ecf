//! Records the replay fixture again: calls made with the official openai and
//! anthropic SDKs through the capture proxy to `forgelog engine` on SmolLM2,
//! in two GRPO groups with verifier verdicts; rewrites `fixtures/smollm2-run/`
//! (events and golden outputs). Needs the SmolLM2 GGUF, tansu and the Python
//! venv (`scripts/setup.sh`); about a minute.
//!
//! `cargo run -p forgelog-replay-tests --example record-fixture`

use forgelog_api::{Finish, NewSession, SessionClient, Verdict};
use forgelog_consumers::{rebuild::rebuild, RewardConfig};
use forgelog_producers::server::ProxyConfig;
use forgelog_producers::RunningProxy;
use forgelog_replay_tests::{by_topic, encode, fixture_dir, write_golden, FIXTURE_ROLLOUTS, RUN};
use forgelog_schemas::Topic;
use forgelog_stream::testing::{python_json, PrivateBroker};
use forgelog_stream::{ReplayReader, StartAt};
use serde_json::{json, Value};
use std::collections::BTreeMap;
use std::path::PathBuf;
use std::time::Duration;

/// The verifier: does the first answer name Paris (in its text or a tool
/// call's arguments) and end on its own, not cut off at `max_tokens`?
fn verdict(responses: &Value) -> Verdict {
    let first = &responses[0];
    let paris = first.to_string().to_lowercase().contains("paris");
    let finish = first["choices"][0]["finish_reason"]
        .as_str()
        .or(first["stop_reason"].as_str())
        .unwrap_or_default();
    let ended = !matches!(finish, "length" | "max_tokens");
    let reward = if paris && ended { 1.0 } else { 0.0 };
    Verdict::scored(reward, format!("names Paris: {paris}, finish: {finish}"))
}

#[tokio::main(flavor = "multi_thread", worker_threads = 2)]
async fn main() {
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
            max_calls_in_flight: 4,
            upstream_timeout: Duration::from_secs(300),
            keep_alive: Duration::from_secs(5),
            max_upstream_requests: 8,
            shutdown_grace: Duration::from_secs(5),
            replicas: None,
            token_in: None,
            policy_adapters: false,
            extra_body: Default::default(),
        },
        &config,
        spool.path().to_path_buf(),
        "127.0.0.1:0".parse().unwrap(),
    )
    .await
    .unwrap();
    assert_eq!(
        proxy.state.probe().untrainable,
        None,
        "SmolLM2 answers are trainable"
    );
    let sessions = SessionClient::new(proxy.url(), None);
    let script = PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("../producers/tests/clients/replay_session.py");
    let mut sdk_responses = BTreeMap::new();
    for (group, rollout, sdk, seed, verified) in FIXTURE_ROLLOUTS {
        let new =
            NewSession::new(rollout, "weather-paris", format!("{sdk}-sdk"), group).group_size(2);
        let created = sessions.create(&new).await.unwrap();
        let session = created.session_id;
        let responses =
            python_json(&script, &[&proxy.url(), &created.api_key, sdk, "run", seed]).await;
        let finish = Finish {
            exit_status: Some(0),
            verifier: verified.then(|| verdict(&responses)),
            ..Default::default()
        };
        sessions.finish(&session, &finish).await.unwrap();
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
    write_golden(&rebuild(&by_topic(&events), RewardConfig::default())).unwrap();
    eprintln!("recorded {} events into {}", events.len(), dir.display());
}
