//! The consumers over a recorded run: two clean runs give byte-identical output
//! topics, and a run killed with SIGKILL at 20 random points (restarted each
//! time; 20 × `FORGELOG_SOAK` with the soak flag) gives exactly the same bytes
//! as a clean one.

use forgelog_schemas::{testing::recorded_run, Event, Topic};
use forgelog_stream::admin::TopicLayout;
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

/// Input events a consumer's last checkpoint says it has consumed (0 before
/// its first): its progress record or its snapshot, whichever is further.
fn consumed(consumer_state: &Path) -> i64 {
    ["progress.json", "state.json"]
        .into_iter()
        .filter_map(|file| std::fs::read(consumer_state.join(file)).ok())
        .map(|bytes| {
            let state: serde_json::Value =
                serde_json::from_slice(&bytes).expect("checkpoints are JSON");
            state["inputs"]
                .as_object()
                .into_iter()
                .flat_map(|topics| topics.values())
                .filter_map(|partitions| partitions.as_object())
                .flat_map(|partitions| partitions.values())
                .filter_map(|offset| offset.as_i64())
                .sum()
        })
        .max()
        .unwrap_or(0)
}

/// Groups in the recorded run: more with the soak flag, so that more kills fit.
fn groups() -> usize {
    GROUPS * testing::soak_scale()
}

/// A broker holding the recorded run's input topics.
fn broker_with_run() -> PrivateBroker {
    broker_with(recorded_run(RUN, groups(), 4, 4, 40), 3)
}

/// A broker holding `events`, over topics of `partitions` partitions.
fn broker_with(events: Vec<Event>, partitions: i32) -> PrivateBroker {
    let broker = PrivateBroker::start().unwrap();
    let config = broker.config();
    tokio::runtime::Runtime::new().unwrap().block_on(async {
        let layout = TopicLayout {
            partitions,
            ..Default::default()
        };
        forgelog_stream::admin::create_topics(&config, &layout)
            .await
            .unwrap();
        testing::produce(&config, &events).await
    });
    broker
}

/// Both consumers over the whole log once, from a fresh state, to its end:
/// the reference a crashed run is compared with.
fn consume_cleanly(config: &StreamConfig) {
    let state = tempfile::tempdir().unwrap();
    assert!(consume("all", config, state.path())
        .wait()
        .unwrap()
        .success());
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

/// Messages whose topic, key and value an earlier message has: where the
/// copy is, where the first one is, and the copy's key.
fn repeated(all: &[Message]) -> Vec<String> {
    let mut first = std::collections::HashMap::new();
    all.iter()
        .filter_map(|(topic, partition, offset, key, value)| {
            let at = first
                .entry((topic, key, value))
                .or_insert((*partition, *offset));
            (*at != (*partition, *offset)).then(|| {
                let key = String::from_utf8_lossy(key);
                format!("{topic}[{partition}]@{offset} (first at {at:?}) key {key}")
            })
        })
        .collect()
}

#[test]
fn killed_consumers_produce_exactly_what_a_clean_run_does() {
    let clean_a = broker_with_run();
    let clean_b = broker_with_run();
    let crashed = broker_with_run();
    for b in [&clean_a, &clean_b] {
        consume_cleanly(&b.config());
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
        let state_file = state.path().join(which);
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
    consume_cleanly(&clean.config());
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
    let state_file = state.path().join("trajectories");
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
    assert_eq!(
        got.len(),
        reference.len(),
        "outputs lost or duplicated; sent twice: {:?}",
        repeated(&got)
    );
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

/// `forgelog consume WHICH --scale-out` on a shared state directory.
fn scaled(which: &str, config: &StreamConfig, state: &Path) -> Child {
    Command::new(env!("CARGO_BIN_EXE_forgelog"))
        .args(["consume", which, "--scale-out", "--checkpoint-every", "10"])
        .args(["--brokers", &config.brokers, "--state"])
        .arg(state)
        .env("RUST_LOG", "error")
        .spawn()
        .unwrap()
}

/// The tasks each live instance says it holds (`members/*`), by member.
fn holdings(members: &Path) -> Vec<Vec<String>> {
    let Ok(entries) = std::fs::read_dir(members) else {
        return Vec::new();
    };
    entries
        .filter_map(|e| std::fs::read(e.ok()?.path()).ok())
        .filter_map(|b| serde_json::from_slice::<serde_json::Value>(&b).ok())
        .map(|v| {
            v["tasks"]
                .as_array()
                .into_iter()
                .flatten()
                .filter_map(|t| Some(t.as_str()?.to_string()))
                .collect()
        })
        .collect()
}

/// Scale-out: three instances of each consumer share one state directory over
/// six partitions; every second or two one of them, at random, is killed with
/// -9 and started again. The trajectory builder's partitions are shared out
/// (two each) and move to the living; the reward join, one task, moves to
/// whichever instance is alive. The outputs are byte-identical to one clean
/// instance's: the same events at the same offsets, nothing lost or twice.
#[test]
fn three_instances_killed_at_random_produce_what_one_clean_instance_does() {
    let events = recorded_run(RUN, 3 * groups(), 4, 4, 40);
    let clean = broker_with(events.clone(), 6);
    consume_cleanly(&clean.config());
    let reference = outputs(&clean.config());
    let count = |all: &[Message], topic: &str| all.iter().filter(|m| m.0 == topic).count();

    let shared = broker_with(events, 6);
    let config = shared.config();
    let state = tempfile::tempdir().unwrap();
    let mut rng = 0x9e37_79b9_7f4a_7c15u64;
    let mut next = move |n: u64| {
        rng ^= rng << 13;
        rng ^= rng >> 7;
        rng ^= rng << 17;
        rng % n
    };
    let mut kills = Vec::new();
    let mut spread = 0;
    // One consumer after the other, as a batch run has them: the join then
    // reads whole trajectories, and its batches come in the clean order.
    for (which, topic) in [
        ("trajectories", Topic::Trajectories.name()),
        ("rewards", Topic::Batches.name()),
    ] {
        let dir = state.path().join(which);
        let members = dir.join("members");
        let mut instances: Vec<Child> = (0..3)
            .map(|_| scaled(which, &config, state.path()))
            .collect();
        let want = count(&reference, topic);
        let deadline = Instant::now() + Duration::from_secs(300);
        let mut killed = 0;
        loop {
            let held = holdings(&members);
            if which == "trajectories"
                && held.len() == 3
                && held.iter().all(|tasks| tasks.len() == 2)
            {
                spread += 1;
            }
            let done = count(&outputs(&config), topic);
            if done >= want {
                break;
            }
            assert!(
                Instant::now() < deadline,
                "{which}: {done} of {want} outputs after {killed} kills"
            );
            std::thread::sleep(Duration::from_millis(800 + next(1200)));
            let victim = next(3) as usize;
            instances[victim].kill().unwrap(); // SIGKILL
            instances[victim].wait().unwrap();
            instances[victim] = scaled(which, &config, state.path());
            killed += 1;
        }
        // A moment more: nothing further (a duplicate) may arrive.
        std::thread::sleep(Duration::from_secs(3));
        for mut child in instances {
            assert!(
                child.try_wait().unwrap().is_none(),
                "an instance of {which} exited"
            );
            child.kill().unwrap();
            child.wait().unwrap();
        }
        kills.push((which, killed));
    }
    let got = outputs(&config);
    assert_eq!(
        got.len(),
        reference.len(),
        "outputs lost or duplicated; sent twice: {:?}",
        repeated(&got)
    );
    assert!(got == reference, "outputs differ from one clean instance's");
    assert!(
        spread > 0,
        "the six partitions were never spread two by two over three instances"
    );
    println!(
        "kills {kills:?}; {} outputs byte-identical to one clean instance; \
         samples with the partitions spread two by two: {spread}",
        got.len()
    );
    for (which, killed) in kills {
        assert!(
            killed >= 3,
            "{which} finished after only {killed} kills: give it more work"
        );
    }
}
