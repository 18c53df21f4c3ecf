//! `forgelog replay rebuild` and `replay show` over a recorded run.

use forgelog_consumers::{rebuild::rebuild, RewardConfig};
use forgelog_schemas::{testing::recorded_run, Event, Topic};
use forgelog_stream::testing::{self, PrivateBroker};
use forgelog_stream::StreamConfig;
use std::collections::BTreeMap;
use std::process::{Command, Output};

const RUN: &str = "replay-run";

fn forgelog(args: &[&str], config: &StreamConfig) -> Output {
    Command::new(env!("CARGO_BIN_EXE_forgelog"))
        .args(args)
        .args(["--brokers", &config.brokers])
        .output()
        .unwrap()
}

fn produce(config: &StreamConfig, events: &[Event]) {
    tokio::runtime::Runtime::new()
        .unwrap()
        .block_on(testing::produce(config, events));
}

#[test]
fn rebuild_of_a_consumed_run_is_identical_and_show_draws_its_trees() {
    let broker = PrivateBroker::start().unwrap();
    let config = broker.config();
    produce(&config, &recorded_run(RUN, 3, 4, 3, 16));
    let state = tempfile::tempdir().unwrap();
    let consumed = Command::new(env!("CARGO_BIN_EXE_forgelog"))
        .args([
            "consume",
            "all",
            "--exit-when-idle",
            "--brokers",
            &config.brokers,
            "--state",
        ])
        .arg(state.path())
        .status()
        .unwrap();
    assert!(consumed.success());

    let out = forgelog(&["replay", "rebuild", "--run", RUN], &config);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert_eq!(
        String::from_utf8(out.stdout).unwrap().trim(),
        format!("identical: 12 trajectories, 3 batches of run {RUN}")
    );

    let out = forgelog(
        &[
            "replay",
            "show",
            "--run",
            RUN,
            "--rollout",
            &format!("{RUN}-g0-r0"),
        ],
        &config,
    );
    let text = String::from_utf8(out.stdout).unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    // Rollout 0 retried its second turn: one discarded path, one live one.
    assert!(text.contains("(discarded retry)"), "{text}");
    assert!(text.contains("reward"), "{text}");
    assert_eq!(text.matches("rollout ").count(), 1, "{text}");
}

#[test]
fn rebuild_names_the_field_of_an_edited_trajectory() {
    let broker = PrivateBroker::start().unwrap();
    let config = broker.config();
    let inputs = recorded_run(RUN, 2, 2, 2, 12);
    let mut by_topic: BTreeMap<Topic, Vec<Event>> = BTreeMap::new();
    for e in &inputs {
        by_topic.entry(e.topic()).or_default().push(e.clone());
    }
    let rebuilt = rebuild(&by_topic, RewardConfig::default());
    let mut trajectories = rebuilt.trajectories.clone();
    let Event::TrajectoryBuilt(t) = &mut trajectories[1] else {
        panic!()
    };
    t.sequences[0].token_ids[3] ^= 1; // one byte of one recorded trajectory
    let edited_id = t.event_id.clone();
    let outputs: Vec<Event> = trajectories.into_iter().chain(rebuilt.batches).collect();
    produce(&config, &[inputs, outputs].concat());

    let out = forgelog(&["replay", "rebuild", "--run", RUN], &config);
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("differs: TrajectoryBuilt") && err.contains(&edited_id),
        "{err}"
    );
    assert!(
        err.contains("field sequences[0].token_ids[3]") && err.contains("offset"),
        "{err}"
    );
}
