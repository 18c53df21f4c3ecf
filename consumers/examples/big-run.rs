//! `cargo run --release -p forgelog-consumers --example big-run -- RUN GROUPS`:
//! writes a synthetic recorded run (GROUPS groups of 8 rollouts, 12 calls each
//! growing by 600 tokens a turn) to the broker at `FORGELOG_BROKERS` and runs
//! both consumers over it to idle, so that `forgelog export` has a run of
//! that size to read (how the export's peak memory was measured).

use forgelog_consumers::{run_consumers, Consumers, RewardConfig, ShellOptions};
use forgelog_stream::StreamConfig;

#[tokio::main]
async fn main() {
    let mut args = std::env::args().skip(1);
    let run = args.next().expect("RUN");
    let groups: usize = args.next().expect("GROUPS").parse().expect("a number");
    let brokers = std::env::var("FORGELOG_BROKERS").unwrap_or_else(|_| "127.0.0.1:9092".into());
    let config = StreamConfig::new(&brokers);
    let events = forgelog_schemas::testing::recorded_run(&run, groups, 8, 12, 600);
    for chunk in events.chunks(2000) {
        forgelog_stream::testing::produce(&config, chunk).await;
    }
    drop(events);
    let state = tempfile::tempdir().unwrap();
    let options = ShellOptions {
        exit_when_idle: true,
        ..ShellOptions::new(state.path())
    };
    let stats = run_consumers(
        &config,
        Consumers::All,
        &options,
        RewardConfig::default(),
        false,
    )
    .await
    .unwrap();
    eprintln!("{run}: {groups} groups; consumers {stats:?}");
}
