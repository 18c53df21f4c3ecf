//! A run's rollouts read back from the log one at a time, each with its calls
//! made whole, in memory bounded by what is in flight rather than by the run:
//! the trajectories are spilled to a temporary file (an index of them is
//! kept), then the calls are read in log order and each rollout is handed on
//! as soon as its calls are in. A rollout's calls share a key (its rollout id,
//! or its session id in older logs), so they sit in one partition, in order.

use super::RolloutScore;
use forgelog_schemas::{CallFinished, Event, Topic, TrainingBatch, TrajectoryBuilt};
use forgelog_stream::{ConsumeError, LogReader};
use std::collections::BTreeMap;
use std::io::{Read, Seek, SeekFrom, Write};
use std::ops::ControlFlow;

/// topic → partition → offset after the last message read.
pub type SourceOffsets = BTreeMap<String, BTreeMap<i32, i64>>;

#[derive(Debug, thiserror::Error)]
pub enum SourceError {
    #[error("reading the log: {0}")]
    Log(#[from] ConsumeError),
    #[error("spilling trajectories to a temporary file: {0}")]
    Spill(#[from] std::io::Error),
    #[error("a spilled trajectory does not decode: {0}")]
    Decode(String),
}

/// What the run's training batches say of its rollouts and groups.
#[derive(Debug, Default)]
pub struct RunBatches {
    /// Reward and advantage by rollout id.
    pub scores: BTreeMap<String, RolloutScore>,
    /// Group id → its members' rollout ids.
    pub groups: BTreeMap<String, Vec<String>>,
}

/// Reads `topic`'s events of `run`, one at a time, noting how far it read.
fn each_event<E: From<SourceError>>(
    reader: &impl LogReader,
    topic: Topic,
    run: &str,
    offsets: &mut SourceOffsets,
    mut f: impl FnMut(Event, &[u8]) -> Result<(), E>,
) -> Result<(), E> {
    let log = |e: ConsumeError| E::from(SourceError::from(e));
    let seen = offsets.entry(topic.name().to_string()).or_default();
    let mut failed = None;
    // A break is a failure, returned just below.
    reader
        .for_each_of_run(topic.name(), run, |r| match r.event {
            Ok(event) if event.run_id() == run => match f(event, &r.value) {
                Ok(()) => {
                    let read = seen.entry(r.partition).or_default();
                    *read = (*read).max(r.offset + 1);
                    ControlFlow::Continue(())
                }
                Err(e) => {
                    failed = Some(e);
                    ControlFlow::Break(())
                }
            },
            _ => ControlFlow::Continue(()),
        })
        .map_err(log)?;
    match failed {
        Some(e) => Err(e),
        None => Ok(()),
    }
}

/// The run's batches: each rollout's score, each group's members.
pub fn batches(
    reader: &impl LogReader,
    run: &str,
    offsets: &mut SourceOffsets,
) -> Result<RunBatches, SourceError> {
    let mut out = RunBatches::default();
    each_event::<SourceError>(reader, Topic::Batches, run, offsets, |e, _| {
        if let Event::TrainingBatch(TrainingBatch {
            group_id, members, ..
        }) = e
        {
            let ids = members.iter().map(|m| m.rollout_id.clone()).collect();
            for m in members {
                let score = RolloutScore {
                    reward: m.reward,
                    advantage: m.advantage,
                };
                out.scores.insert(m.rollout_id, score);
            }
            out.groups.insert(group_id, ids);
        }
        Ok(())
    })?;
    Ok(out)
}

/// Where a rollout's latest trajectory sits in the spill.
struct Spilled {
    at: u64,
    len: usize,
    calls: i64,
    /// Its place among the latest trajectories, in log order.
    order: usize,
}

/// Hands `f` each rollout of `run` that has a trajectory (the latest one read,
/// if it is in the log twice) with its calls made whole: as soon as the calls
/// it was built from are read, then, in log order, the rest with the calls
/// that are there. Returns how many rollouts it handed on.
pub fn each_rollout<E: From<SourceError>>(
    reader: &impl LogReader,
    run: &str,
    offsets: &mut SourceOffsets,
    mut f: impl FnMut(TrajectoryBuilt, Vec<CallFinished>) -> Result<(), E>,
) -> Result<usize, E> {
    let mut spill = tempfile::tempfile().map_err(SourceError::from)?;
    let mut index: BTreeMap<String, Spilled> = BTreeMap::new();
    let mut at = 0u64;
    let mut read = 0usize;
    each_event::<E>(reader, Topic::Trajectories, run, offsets, |e, value| {
        if let Event::TrajectoryBuilt(t) = e {
            spill.write_all(value).map_err(SourceError::from)?;
            let spilled = Spilled {
                at,
                len: value.len(),
                calls: t.calls,
                order: read,
            };
            index.insert(t.rollout_id, spilled);
            at += value.len() as u64;
            read += 1;
        }
        Ok(())
    })?;
    let mut load = |s: &Spilled| -> Result<TrajectoryBuilt, SourceError> {
        let mut bytes = vec![0; s.len];
        spill.seek(SeekFrom::Start(s.at))?;
        spill.read_exact(&mut bytes)?;
        // The record as the log holds it: a large trajectory is a claim.
        match forgelog_stream::claims::decode(&bytes) {
            Ok(Event::TrajectoryBuilt(t)) => Ok(t),
            Ok(other) => Err(SourceError::Decode(other.kind().name().into())),
            Err(e) => Err(SourceError::Decode(e)),
        }
    };
    let whole = |calls: BTreeMap<i64, CallFinished>| {
        let mut calls: Vec<CallFinished> = calls.into_values().collect();
        forgelog_schemas::compact::expand_finished(&mut calls);
        calls
    };

    // By rollout: its calls read so far (the first of each index stands, as
    // the trajectory builder keeps it).
    let mut pending: BTreeMap<String, BTreeMap<i64, CallFinished>> = BTreeMap::new();
    let mut handed = 0;
    each_event::<E>(reader, Topic::Calls, run, offsets, |e, _| {
        let Event::CallFinished(c) = e else {
            return Ok(());
        };
        let Some(spilled) = index.get(&c.rollout_id) else {
            return Ok(()); // no trajectory: nothing of it is exported
        };
        let rollout = c.rollout_id.clone();
        let calls = pending.entry(rollout.clone()).or_default();
        calls.entry(c.call_index).or_insert(c);
        if calls.len() as i64 >= spilled.calls {
            let calls = pending.remove(&rollout).expect("present");
            let spilled = index.remove(&rollout).expect("present");
            f(load(&spilled)?, whole(calls))?;
            handed += 1;
        }
        Ok(())
    })?;
    // Those whose calls are not all in the log, in log order.
    let mut rest: Vec<(String, Spilled)> = std::mem::take(&mut index).into_iter().collect();
    rest.sort_by_key(|(_, s)| s.order);
    for (rollout, spilled) in rest {
        let calls = pending.remove(&rollout).unwrap_or_default();
        f(load(&spilled)?, whole(calls))?;
        handed += 1;
    }
    Ok(handed)
}
