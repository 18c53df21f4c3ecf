//! The committed SmolLM2 recording, replayed three ways: through the pure
//! cores (the golden outputs), through the broker and the consumer shells
//! (`replay rebuild` finds them identical, and names an edited byte), and
//! through `replay serve` with the official SDKs (the responses they got when
//! it was recorded, byte for byte).
//!
//! `cargo run -p forgelog-replay-tests --example write-golden` rewrites the
//! golden trajectories and batches from the fixture (after an intended change
//! to the cores).

use forgelog_api::{Finish, SessionClient};
use forgelog_consumers::rebuild::{read_run, rebuild, rebuild_and_compare};
use forgelog_consumers::{
    shell, Processor, RewardConfig, RewardJoin, ShellOptions, TrajectoryBuilder,
};
use forgelog_producers::server::ProxyConfig;
use forgelog_producers::{load_recording, RunningProxy};
use forgelog_replay_tests::{by_topic, edit_token, fixture_dir, golden, RUN};
use forgelog_schemas::{Event, Topic};
use forgelog_stream::testing::{self, python_json, PrivateBroker};
use forgelog_stream::{ReplayReader, StreamConfig};
use serde_json::Value;
use std::path::PathBuf;
use std::time::Duration;

fn fixture() -> Vec<Event> {
    forgelog_replay_tests::fixture().expect("committed fixture")
}

fn golden_file(name: &str) -> String {
    std::fs::read_to_string(fixture_dir().join("golden").join(name)).expect("golden file")
}

/// A private broker holding the fixture's input topics.
async fn broker_with_fixture() -> (PrivateBroker, StreamConfig) {
    let broker = PrivateBroker::start().expect("tansu (scripts/setup.sh)");
    let config = broker.config();
    testing::produce(&config, &fixture()).await;
    (broker, config)
}

#[test]
fn the_pure_cores_rebuild_the_golden_outputs() {
    let events = fixture();
    let rebuilt = rebuild(&by_topic(&events), RewardConfig::default());
    assert_eq!(rebuilt.trajectories.len(), 4, "one tree per rollout");
    assert_eq!(rebuilt.batches.len(), 2, "two groups of two");
    let sampled: usize = rebuilt
        .trajectories
        .iter()
        .filter_map(|e| match e {
            Event::TrajectoryBuilt(t) => Some(t),
            _ => None,
        })
        .flat_map(|t| &t.sequences)
        .map(|s| s.loss_mask.iter().filter(|m| **m == 1).count())
        .sum();
    assert!(sampled > 100, "{sampled} sampled tokens to train on");
    // The same input, rebuilt again: the same bytes (no clock, no hash order).
    assert_eq!(
        rebuild(&by_topic(&events), RewardConfig::default()),
        rebuilt
    );
    for (name, text) in golden(&rebuilt) {
        assert!(
            text == golden_file(name),
            "golden/{name} differs from what the cores derive now \
             (`cargo run -p forgelog-replay-tests --example write-golden` rewrites it)"
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn consumed_through_the_broker_it_rebuilds_identically_and_an_edit_is_named() {
    let (_broker, config) = broker_with_fixture().await;
    let state = tempfile::tempdir().unwrap();
    let options = |name: &str| ShellOptions {
        exit_when_idle: true,
        idle_wait: Duration::from_millis(100),
        ..ShellOptions::new(state.path().join(name))
    };
    let (c, o) = (config.clone(), options(TrajectoryBuilder::NAME));
    tokio::task::spawn_blocking(move || shell::run(&c, TrajectoryBuilder::default(), &o))
        .await
        .unwrap()
        .unwrap();
    let (c, o) = (config.clone(), options(RewardJoin::NAME));
    tokio::task::spawn_blocking(move || {
        shell::run(&c, RewardJoin::new(RewardConfig::default()), &o)
    })
    .await
    .unwrap()
    .unwrap();

    let c = config.clone();
    let (stored, identical) = tokio::task::spawn_blocking(move || {
        let reader = ReplayReader::new(&c).unwrap();
        let (_, diff) = rebuild_and_compare(&reader, RUN, RewardConfig::default()).unwrap();
        (read_run(&reader, Topic::Trajectories, RUN).unwrap(), diff)
    })
    .await
    .unwrap();
    assert_eq!(identical, None, "replay rebuild: identical");
    // What the shells wrote is the golden output.
    let written: Vec<Event> = stored.iter().map(|r| r.event.clone().unwrap()).collect();
    let mut doc = serde_json::to_string_pretty(&written).unwrap();
    doc.push('\n');
    let mut golden: Vec<Value> = serde_json::from_str(&golden_file("trajectories.json")).unwrap();
    let mut got: Vec<Value> = serde_json::from_str(&doc).unwrap();
    let by_rollout = |v: &Value| v["rollout_id"].as_str().unwrap_or_default().to_string();
    golden.sort_by_key(by_rollout);
    got.sort_by_key(by_rollout);
    assert_eq!(got, golden, "the shell's trajectories are the golden ones");

    // One byte of one recorded trajectory, edited and written after it.
    let target = &stored[1];
    let edited = edit_token(target.event.as_ref().unwrap(), 0, 3);
    let c = config.clone();
    let topic = Topic::Trajectories.name();
    let partition = target.partition;
    let end = tokio::task::spawn_blocking(move || {
        ReplayReader::new(&c)
            .unwrap()
            .end(topic, partition)
            .unwrap()
    })
    .await
    .unwrap();
    testing::produce(&config, std::slice::from_ref(&edited)).await;
    let c = config.clone();
    let (_, diff) = tokio::task::spawn_blocking(move || {
        rebuild_and_compare(
            &ReplayReader::new(&c).unwrap(),
            RUN,
            RewardConfig::default(),
        )
        .unwrap()
    })
    .await
    .unwrap();
    let d = diff.expect("the edit is found");
    assert_eq!(d.event, "TrajectoryBuilt");
    assert_eq!(d.event_id, edited.event_id());
    assert_eq!(d.field, "sequences[0].token_ids[3]");
    assert_eq!(d.stored_at, Some((partition, end)));
    assert!(d.to_string().contains(&format!("offset {end}")), "{d}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn replay_serve_gives_the_sdks_what_they_got_from_smollm2() {
    let (_broker, config) = broker_with_fixture().await;
    let recording = load_recording(&config, RUN, None).await.unwrap();
    assert_eq!(recording.sessions.len(), 4);
    let proxy = RunningProxy::replay(
        ProxyConfig {
            upstream: String::new(),
            run_id: Some(RUN.into()),
            admin_token: None,
            body_limit: 1 << 20,
            max_calls_in_flight: 4,
            upstream_timeout: Duration::from_secs(10),
            keep_alive: Duration::from_secs(5),
            max_upstream_requests: 8,
            shutdown_grace: Duration::from_secs(5),
            replicas: None,
            token_in: None,
            policy_adapters: false,
            extra_body: Default::default(),
        },
        recording,
        "127.0.0.1:0".parse().unwrap(),
    )
    .await
    .unwrap();
    let script = PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("../producers/tests/clients/replay_session.py");
    let recorded: Value = serde_json::from_str(&golden_file("sdk_responses.json")).unwrap();
    let sessions = SessionClient::new(proxy.url(), None);
    for (session, rec) in recorded.as_object().unwrap() {
        let sdk = rec["sdk"].as_str().unwrap();
        // Sampling (the seed) is not part of the comparison: only the conversation is.
        for mode in ["run", "diverge"] {
            let created = sessions.replay_of(session).await.unwrap();
            let got = python_json(&script, &[&proxy.url(), &created.api_key, sdk, mode]).await;
            if mode == "run" {
                assert_eq!(got, rec["responses"], "{sdk} session {session}");
            } else {
                let error = got["error"].as_str().unwrap();
                assert!(
                    error.contains(&format!("session {session}, call 1: message 3 differs")),
                    "{error}"
                );
            }
            sessions.finish(session, &Finish::default()).await.unwrap();
        }
    }
    proxy.shutdown(Duration::from_secs(1)).await.unwrap();
}
