//! The consumers over a recorded run: two clean runs give byte-identical output
//! topics, and a run killed with SIGKILL at 20 random points (restarted each
//! time; 20 × `FORGELOG_SOAK` with the soak flag) gives exactly the same bytes
//! as a clean one.

use forgelog_schemas::{testing::recorded_run, Topic};
use forgelog_stream::testing::{self, PrivateBroker};
use forgelog_stream::{ReplayReader, StreamConfig};
use std::path::Path;
use std::process::{Child, Command};
use std::time::{Duration, Instant};

const RUN: &str = "crash-run";
const GROUPS: usize = 40;
/// A restarted consumer must checkpoint new progress within this. Measured
/// here: median ~130 ms; up to ~1.2 s when its spool still held events, as a
/// fresh idempotent librdkafka producer waits 0.5–1 s for its producer id
/// before its first delivery. (Killing at a fixed 30–330 ms after the start,
/// as this test once did, killed those restarts before any progress: on a
/// slower machine it ran for 10 minutes.)
const RESTART_BUDGET: Duration = Duration::from_secs(30);

/// Input events a consumer's checkpoint says it has consumed (0 before its first).
fn consumed(state_file: &Path) -> i64 {
    let Ok(bytes) = std::fs::read(state_file) else {
        return 0;
    };
    let state: serde_json::Value = serde_json::from_slice(&bytes).expect("state.json is JSON");
    state["inputs"]
        .as_object()
        .into_iter()
        .flat_map(|topics| topics.values())
        .filter_map(|partitions| partitions.as_object())
        .flat_map(|partitions| partitions.values())
        .filter_map(|offset| offset.as_i64())
        .sum()
}

/// Groups in the recorded run: more with the soak flag, so that more kills fit.
fn groups() -> usize {
    GROUPS * testing::soak_scale()
}

/// A broker holding the recorded run's input topics.
fn broker_with_run() -> PrivateBroker {
    let broker = PrivateBroker::start().unwrap();
    let config = broker.config();
    let events = recorded_run(RUN, groups(), 4, 4, 40);
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
    assert_eq!((trajectories, batches), (groups() * 4, groups()));
    assert_eq!(
        outputs(&clean_b.config()),
        reference,
        "two clean runs differ"
    );

    let state = tempfile::tempdir().unwrap();
    let config = crashed.config();
    let kills_each = 10 * testing::soak_scale();
    let mut rng = 0x2545_f491_4f6c_dd1du64;
    let mut kills = 0;
    let mut restarts: Vec<Duration> = Vec::new();
    // Each consumer in turn: restart it, wait until its checkpoint moves (so
    // every restart is known to make progress), then SIGKILL it at a random
    // point up to a few checkpoints later; until `kills_each` kills landed.
    for which in ["trajectories", "rewards"] {
        let state_file = state.path().join(which).join("state.json");
        let mut kills_here = 0;
        while kills_here < kills_each {
            let before = consumed(&state_file);
            let started = Instant::now();
            let mut child = consume(which, &config, state.path());
            let finished = loop {
                if child.try_wait().unwrap().is_some() {
                    break true;
                }
                if consumed(&state_file) > before {
                    break false;
                }
                assert!(
                    started.elapsed() < RESTART_BUDGET,
                    "restart {kills_here} of {which} made no progress in {RESTART_BUDGET:?}"
                );
                std::thread::sleep(Duration::from_millis(2));
            };
            restarts.push(started.elapsed());
            assert!(
                !finished,
                "{which} finished after only {kills_here} of {kills_each} kills: checkpoint more often"
            );
            rng ^= rng << 13;
            rng ^= rng >> 7;
            rng ^= rng << 17;
            std::thread::sleep(Duration::from_millis(rng % 40));
            child.kill().unwrap(); // SIGKILL, possibly mid-checkpoint
            child.wait().unwrap();
            kills_here += 1;
        }
        assert!(consume(which, &config, state.path())
            .wait()
            .unwrap()
            .success());
        kills += kills_here;
    }
    let got = outputs(&config);
    assert_eq!(got.len(), reference.len(), "lost or duplicated outputs");
    assert!(got == reference, "output differs from a clean run's");
    restarts.sort();
    println!(
        "{kills} kills; {} outputs byte-identical to a clean run; restart to first new checkpoint: \
         min {:?}, median {:?}, max {:?}",
        got.len(),
        restarts[0],
        restarts[restarts.len() / 2],
        restarts[restarts.len() - 1]
    );
}

/// A long-running consumer whose broker is killed and restarted used to exit
/// (`BrokerTransportFailure`) and stay down. Both consumers, side by side as
/// `forgelog up` runs them, ride the restart out: nothing lost, nothing twice.
///
/// Side by side, the join reads trajectories while they are being written, so
/// the order its groups complete in follows when they arrived: the batches
/// are compared as events (byte for byte, by key), the trajectories in order.
#[test]
fn consumers_ride_out_a_broker_restart() {
    let clean = broker_with_run();
    let state = tempfile::tempdir().unwrap();
    assert!(consume("all", &clean.config(), state.path())
        .wait()
        .unwrap()
        .success());
    let reference = outputs(&clean.config());
    let count = |all: &[Message], topic: Topic| all.iter().filter(|m| m.0 == topic.name()).count();

    let mut flaky = broker_with_run();
    let config = flaky.config();
    let state = tempfile::tempdir().unwrap();
    let mut child = Command::new(env!("CARGO_BIN_EXE_forgelog"))
        .args(["consume", "all", "--checkpoint-every", "20", "--brokers"])
        .arg(&config.brokers)
        .arg("--state")
        .arg(state.path())
        .env("RUST_LOG", "error")
        .spawn()
        .unwrap();
    let state_file = state.path().join("trajectories").join("state.json");
    let started = Instant::now();
    while consumed(&state_file) == 0 {
        assert!(
            started.elapsed() < RESTART_BUDGET,
            "no progress before the kill"
        );
        std::thread::sleep(Duration::from_millis(5));
    }
    flaky.kill();
    std::thread::sleep(Duration::from_secs(3));
    assert!(
        child.try_wait().unwrap().is_none(),
        "the consumers exited with their broker down"
    );
    flaky.restart().unwrap();
    let deadline = Instant::now() + Duration::from_secs(180);
    loop {
        assert!(child.try_wait().unwrap().is_none(), "the consumers exited");
        let now = outputs(&config);
        if count(&now, Topic::Batches) >= count(&reference, Topic::Batches) {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "{} of {} batches after the restart",
            count(&now, Topic::Batches),
            count(&reference, Topic::Batches)
        );
        std::thread::sleep(Duration::from_millis(500));
    }
    // A moment more: nothing further (a duplicate) may arrive.
    std::thread::sleep(Duration::from_secs(2));
    let _ = child.kill();
    let _ = child.wait();
    let got = outputs(&config);
    assert_eq!(got.len(), reference.len(), "outputs lost or duplicated");
    let in_order = |all: &[Message]| -> Vec<Message> {
        all.iter()
            .filter(|m| m.0 == Topic::Trajectories.name())
            .cloned()
            .collect()
    };
    assert!(
        in_order(&got) == in_order(&reference),
        "trajectories differ from a clean run's"
    );
    let as_events = |all: &[Message]| -> Vec<(Vec<u8>, Vec<u8>)> {
        let mut batches: Vec<_> = all
            .iter()
            .filter(|m| m.0 == Topic::Batches.name())
            .map(|m| (m.3.clone(), m.4.clone()))
            .collect();
        batches.sort();
        batches
    };
    assert!(
        as_events(&got) == as_events(&reference),
        "batches differ from a clean run's"
    );
}
