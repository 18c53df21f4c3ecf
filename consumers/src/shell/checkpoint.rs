//! What a shell writes to carry on after a crash: the core's state with its
//! input positions and output ends (a snapshot, `state.json`), the positions
//! alone between snapshots (`progress.json`), and when each is due.

use super::{ShellError, ShellOptions};
use crate::Processor;
use forgelog_schemas::Topic;
use forgelog_stream::{ConsumeError, EventSink, LogReader};
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;
use std::ops::ControlFlow;
use std::path::Path;
use std::time::Duration;

/// A snapshot: the core's state and the positions it reflects (`state.json`).
#[derive(Serialize, Deserialize)]
pub(super) struct Checkpoint<P> {
    pub(super) settings: String,
    /// Which checkpoint this is: a progress record with a higher number is newer.
    #[serde(default)]
    pub(super) seq: u64,
    /// topic → partition → next offset to read.
    pub(super) inputs: BTreeMap<String, BTreeMap<i32, i64>>,
    /// Output partition → its end when this checkpoint was taken.
    pub(super) outputs: BTreeMap<i32, i64>,
    /// The same for `forgelog.deadletters`.
    #[serde(default)]
    pub(super) dead_letters: BTreeMap<i32, i64>,
    pub(super) processor: P,
}

impl<P> Checkpoint<P> {
    /// The next offset to read of `topic`'s `partition`.
    pub(super) fn position(&self, topic: &str, partition: i32) -> i64 {
        self.inputs
            .get(topic)
            .and_then(|p| p.get(&partition))
            .copied()
            .unwrap_or(0)
    }
}

/// What every checkpoint writes (`progress.json`): the snapshot's fields but
/// the core's state.
#[derive(Serialize, Deserialize)]
struct Progress {
    seq: u64,
    inputs: BTreeMap<String, BTreeMap<i32, i64>>,
    outputs: BTreeMap<i32, i64>,
    dead_letters: BTreeMap<i32, i64>,
}

/// [`ShellOptions::snapshot_every`]'s default.
pub const SNAPSHOT_EVERY: usize = 10;

/// When a checkpoint is due, and whether it is a snapshot: input events
/// counted since the last of each.
pub(super) struct Cadence {
    checkpoint_every: usize,
    /// Input events between snapshots.
    snapshot_every: usize,
    since_checkpoint: usize,
    pub(super) since_snapshot: usize,
}

impl Cadence {
    pub(super) fn new(options: &ShellOptions) -> Cadence {
        let checkpoint_every = options.checkpoint_every.max(1);
        Cadence {
            checkpoint_every,
            snapshot_every: options.snapshot_every.max(1) * checkpoint_every,
            since_checkpoint: 0,
            since_snapshot: 0,
        }
    }

    pub(super) fn consumed(&mut self) {
        self.since_checkpoint += 1;
        self.since_snapshot += 1;
    }

    /// Within a sweep: a checkpoint every `checkpoint_every` events; `Some(true)` for a snapshot.
    pub(super) fn due(&self) -> Option<bool> {
        (self.since_checkpoint >= self.checkpoint_every)
            .then_some(self.since_snapshot >= self.snapshot_every)
    }

    /// After a sweep: whatever it consumed, and a snapshot of all since the
    /// last one when the shell stops.
    pub(super) fn due_after_sweep(&self, stopping: bool) -> Option<bool> {
        (self.since_checkpoint > 0 || (stopping && self.since_snapshot > 0))
            .then_some(stopping || self.since_snapshot >= self.snapshot_every)
    }

    pub(super) fn done(&mut self, snapshot: bool) {
        self.since_checkpoint = 0;
        if snapshot {
            self.since_snapshot = 0;
        }
    }
}

/// The state `options.state_dir` holds (or a fresh start from the beginning
/// of the inputs), carried forward to its newest progress record by
/// re-reading the input between them; with the cadence that follows.
pub(super) fn restore<P: Processor>(
    reader: &impl LogReader,
    fresh: P,
    options: &ShellOptions,
) -> Result<(Checkpoint<P>, Cadence), ShellError> {
    let state_path = options.state_dir.join("state.json");
    let state_err = |source| ShellError::State {
        path: state_path.clone(),
        source,
    };
    let mut state = match std::fs::read(&state_path) {
        Ok(bytes) => serde_json::from_slice::<Checkpoint<P>>(&bytes)
            .map_err(|e| state_err(std::io::Error::other(e)))?,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Checkpoint {
            settings: fresh.settings(),
            seq: 0,
            inputs: BTreeMap::new(),
            outputs: BTreeMap::new(),
            dead_letters: BTreeMap::new(),
            processor: fresh,
        },
        Err(e) => return Err(state_err(e)),
    };
    let current = P::settings(&state.processor);
    if state.settings != current {
        return Err(ShellError::Settings {
            path: state_path,
            saved: state.settings,
            current,
        });
    }
    // A newer progress record: the input between the snapshot and it carries
    // the state forward (everything that derives was sent before it was written).
    let progress_path = options.state_dir.join("progress.json");
    let mut cadence = Cadence::new(options);
    match std::fs::read(&progress_path) {
        Ok(bytes) => {
            let progress: Progress =
                serde_json::from_slice(&bytes).map_err(|e| ShellError::State {
                    path: progress_path.clone(),
                    source: std::io::Error::other(e),
                })?;
            if progress.seq > state.seq {
                cadence.since_snapshot = catch_up(reader, &mut state, &progress.inputs, options)?;
                state.seq = progress.seq;
                state.inputs = progress.inputs;
                state.outputs = progress.outputs;
                state.dead_letters = progress.dead_letters;
            }
        }
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
        Err(source) => {
            return Err(ShellError::State {
                path: progress_path,
                source,
            })
        }
    }
    Ok((state, cadence))
}

/// Each partition of `topic` → the offset its next message will get.
fn ends(reader: &impl LogReader, topic: &str) -> Result<BTreeMap<i32, i64>, ConsumeError> {
    reader
        .partitions(topic)?
        .into_iter()
        .map(|p| Ok((p, reader.end(topic, p)?)))
        .collect()
}

/// Outputs acknowledged, then the positions and output ends, atomically: with
/// the core's state (a snapshot) or without it. Returns the bytes written.
/// With `keep_output_base` the output ends stay those restored (outputs the
/// run before sent are still to be re-derived past them).
pub(super) fn write<P: Processor>(
    rt: &tokio::runtime::Handle,
    producer: &impl EventSink,
    reader: &impl LogReader,
    state: &mut Checkpoint<P>,
    dir: &Path,
    snapshot: bool,
    keep_output_base: bool,
) -> Result<u64, ShellError> {
    let t = std::time::Instant::now();
    rt.block_on(producer.flush(Duration::from_secs(600)))?;
    let flushed = t.elapsed();
    if !keep_output_base {
        state.outputs = ends(reader, P::OUTPUT.name())?;
        state.dead_letters = ends(reader, Topic::DeadLetters.name())?;
    }
    state.seq += 1;
    let (path, bytes) = if snapshot {
        (dir.join("state.json"), serde_json::to_vec(state))
    } else {
        let progress = Progress {
            seq: state.seq,
            inputs: state.inputs.clone(),
            outputs: state.outputs.clone(),
            dead_letters: state.dead_letters.clone(),
        };
        (dir.join("progress.json"), serde_json::to_vec(&progress))
    };
    let state_err = |source| ShellError::State {
        path: path.clone(),
        source,
    };
    let bytes = bytes.map_err(|e| state_err(std::io::Error::other(e)))?;
    let tmp = path.with_extension("json.tmp");
    {
        use std::io::Write;
        let mut f = std::fs::File::create(&tmp).map_err(state_err)?;
        f.write_all(&bytes).map_err(state_err)?;
        f.sync_data().map_err(state_err)?;
    }
    std::fs::rename(&tmp, &path).map_err(state_err)?;
    tracing::debug!(consumer = P::NAME, snapshot, ?flushed, total = ?t.elapsed(), bytes = bytes.len(), "checkpoint");
    Ok(bytes.len() as u64)
}

/// Feeds the core the input between its snapshot's positions and `to`, in
/// sweep order, dropping what it derives (sent before `to` was recorded).
/// Returns the events fed.
fn catch_up<P: Processor>(
    reader: &impl LogReader,
    state: &mut Checkpoint<P>,
    to: &BTreeMap<String, BTreeMap<i32, i64>>,
    options: &ShellOptions,
) -> Result<usize, ShellError> {
    let mut fed = 0;
    let mut out = Vec::new();
    for topic in P::INPUTS {
        let topic = topic.name();
        for (&partition, &end) in to.get(topic).into_iter().flatten() {
            if !options.takes(partition) {
                continue;
            }
            let from = state.position(topic, partition);
            let _ = reader.for_each_in(topic, partition, from, end, |rec| {
                match rec.event {
                    Ok(event) if options.derives(&event) => {
                        state.processor.process(event, &mut out);
                        out.clear();
                    }
                    _ => {}
                }
                fed += 1;
                ControlFlow::Continue(())
            })?;
        }
    }
    Ok(fed)
}
