//! `forgelog replay rebuild` over the log: reads a run's inputs and outputs and
//! hands them to the pure core ([`rebuild`], [`compare`]).

pub use crate::core::rebuild::*;
use crate::core::RewardConfig;
use forgelog_schemas::{Received, Topic};
use forgelog_stream::{ConsumeError, LogReader};
use std::collections::BTreeMap;

/// Reads run `run`'s events of `topic` in log order, from the log or a bundle.
pub fn read_run(
    reader: &impl LogReader,
    topic: Topic,
    run: &str,
) -> Result<Vec<Received>, ConsumeError> {
    reader.read_run(topic.name(), run)
}

/// Rebuilds run `run` from the log and compares; `Ok(None)` when identical.
pub fn rebuild_and_compare(
    reader: &impl LogReader,
    run: &str,
    rewards: RewardConfig,
) -> Result<(Rebuilt, Option<Difference>), ConsumeError> {
    let mut inputs = BTreeMap::new();
    for topic in [Topic::Calls, Topic::Rollouts, Topic::Rewards] {
        let events = read_run(reader, topic, run)?
            .into_iter()
            .filter_map(|r| r.event.ok())
            .collect();
        inputs.insert(topic, events);
    }
    let rebuilt = rebuild(&inputs, rewards);
    let stored_trajectories = read_run(reader, Topic::Trajectories, run)?;
    let diff = compare(
        Topic::Trajectories,
        &rebuilt.trajectories,
        &stored_trajectories,
    )
    .or_else(|| {
        read_run(reader, Topic::Batches, run)
            .ok()
            .and_then(|stored| compare(Topic::Batches, &rebuilt.batches, &stored))
    });
    Ok((rebuilt, diff))
}
