//! The consumers over a recorded run: two clean runs give byte-identical output
//! topics, and a run killed with SIGKILL at 20+ random points (restarted each
//! time) gives exactly the same bytes as a clean one.

use forgelog_schemas::{testing::recorded_run, Topic};
use forgelog_stream::testing::{self, PrivateBroker};
use forgelog_stream::{ReplayReader, StreamConfig};
use std::process::{Child, Command};
use std::time::Duration;

const RUN: &str = "crash-run";
const GROUPS: usize = 40;

/// A broker holding the recorded run's input topics.
fn broker_with_run() -> PrivateBroker {
    let broker = PrivateBroker::start().unwrap();
    let config = broker.config();
    let events = recorded_run(RUN, GROUPS, 4, 4, 40);
    tokio::runtime::Runtime::new()
        .unwrap()
        .block_on(testing::produce(&config, &events));
    broker
}

fn consume(which: &str, config: &StreamConfig, state: &std::path::Path) -> Child {
    Command::new(env!("CARGO_BIN_EXE_forgelog"))
        .args([
            "consume",
            which,
            "--exit-when-idle",
            "--checkpoint-every",
            "20",
            "--brokers",
            &config.brokers,
            "--state",
        ])
        .arg(state)
        .env("RUST_LOG", "error")
        .spawn()
        .unwrap()
}

/// Every output partition's messages: (partition, offset, key, value).
/// (topic, partition, offset, key, value)
type Message = (String, i32, i64, Vec<u8>, Vec<u8>);

fn outputs(config: &StreamConfig) -> Vec<Message> {
    let reader = ReplayReader::new(config).unwrap();
    let mut all = Vec::new();
    for topic in [Topic::Trajectories, Topic::Batches] {
        for r in reader
            .read(topic.name(), forgelog_stream::StartAt::Beginning, None)
            .unwrap()
        {
            all.push((r.topic, r.partition, r.offset, r.key, r.value));
        }
    }
    all
}

#[test]
fn killed_consumers_produce_exactly_what_a_clean_run_does() {
    let clean_a = broker_with_run();
    let clean_b = broker_with_run();
    let crashed = broker_with_run();
    for b in [&clean_a, &clean_b] {
        let state = tempfile::tempdir().unwrap();
        assert!(consume("all", &b.config(), state.path())
            .wait()
            .unwrap()
            .success());
    }
    let reference = outputs(&clean_a.config());
    let trajectories = reference
        .iter()
        .filter(|m| m.0 == Topic::Trajectories.name())
        .count();
    let batches = reference
        .iter()
        .filter(|m| m.0 == Topic::Batches.name())
        .count();
    assert_eq!((trajectories, batches), (GROUPS * 4, GROUPS));
    assert_eq!(
        outputs(&clean_b.config()),
        reference,
        "two clean runs differ"
    );

    let state = tempfile::tempdir().unwrap();
    let config = crashed.config();
    let mut rng = 0x2545_f491_4f6c_dd1du64;
    let mut kills = 0;
    // Each consumer in turn: SIGKILL at random points, restart, until it finishes.
    for which in ["trajectories", "rewards"] {
        let mut kills_here = 0;
        loop {
            let mut child = consume(which, &config, state.path());
            rng ^= rng << 13;
            rng ^= rng >> 7;
            rng ^= rng << 17;
            std::thread::sleep(Duration::from_millis(30 + rng % 300));
            if child.try_wait().unwrap().is_some() {
                break; // finished before the kill
            }
            child.kill().unwrap();
            child.wait().unwrap();
            kills_here += 1;
        }
        assert!(consume(which, &config, state.path())
            .wait()
            .unwrap()
            .success());
        assert!(
            kills_here >= 10,
            "only {kills_here} kills of {which} landed before it finished"
        );
        kills += kills_here;
    }
    let got = outputs(&config);
    assert_eq!(got.len(), reference.len(), "lost or duplicated outputs");
    assert!(got == reference, "output differs from a clean run's");
    println!(
        "{kills} kills; {} outputs byte-identical to a clean run",
        got.len()
    );
}
