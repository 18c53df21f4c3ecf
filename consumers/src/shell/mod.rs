//! The thin Kafka shell around a [`Processor`]: deterministic input order,
//! checkpointed state, exactly-once output without Kafka transactions.
//!
//! **Input order.** The shell works in sweeps: each sweep reads every input
//! partition, in a fixed order (topics as the processor lists them, partitions
//! ascending), from its position to the end the partition had when the sweep
//! reached it. Over a recorded run the order of events fed to the core, and so
//! the order of everything it emits, is a function of the log alone. While
//! its inputs are still being written (a live run), a core that reads several
//! topics sees them interleaved as they arrived: it emits the same events
//! whatever the interleaving (the cores' property tests), in an order that
//! follows the arrival.
//!
//! **Exactly once.** Every `checkpoint_every` input events the shell flushes its
//! outputs, then atomically writes how far it got: the input positions and the
//! output partitions' ends (`progress.json`, a few hundred bytes). The core's
//! state itself is written with them (`state.json`, a snapshot) only every
//! [`ShellOptions::snapshot_every`] checkpoints and when the shell stops: the input between
//! a snapshot and the progress after it is the journal that carries the state
//! forward, so a large state (the calls of rollouts in flight) is not
//! rewritten whole every few thousand events. After a crash the shell first
//! drains what its spool still holds, restores the snapshot, re-reads the input
//! up to the progress record (what that derives was sent already), reads the
//! outputs written since (their deterministic event ids) and goes on from
//! there: re-derived outputs already in the log are skipped, the rest are
//! sent, in the same order a clean run sends them.

use crate::Processor;
use forgelog_schemas::{DeadLetter, Event, Topic};
use forgelog_stream::{
    ConsumeError, EventProducer, EventSink, LogReader, ReplayReader, SendError, SpoolError,
    SpoolOptions, StreamConfig,
};
use serde::{Deserialize, Serialize};
use std::collections::{BTreeMap, HashMap};
use std::ops::ControlFlow;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

#[derive(Debug, thiserror::Error)]
pub enum ShellError {
    #[error("reading the log: {0}")]
    Consume(#[from] ConsumeError),
    #[error("spool: {0}")]
    Spool(#[from] SpoolError),
    #[error("sending output: {0}")]
    Send(#[from] SendError),
    #[error("flushing output: {0}")]
    Flush(#[from] forgelog_stream::FlushTimeout),
    #[error("state {path}: {source}")]
    State {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("log layout: {0}")]
    Layout(String),
    #[error("consumer thread: {0}")]
    Thread(String),
    #[error("{topic}[{partition}]@{offset} is keyed {key:?}, not by the {kind}'s key {expected:?}: this log was written before its events were keyed for partitioned consumers. Consume it as one task (without --scale-out)")]
    NotCoPartitioned {
        topic: String,
        partition: i32,
        offset: i64,
        kind: &'static str,
        key: String,
        expected: String,
    },
    /// A claim check whose event could not be read (its store down, the
    /// object gone or altered): its partition waits there, tried again each
    /// sweep, while the others are derived (a dead letter would lose its
    /// rollout). A shell that stops when idle says so once the rest is done.
    #[error("{why}; nothing after it in its partition is derived until it reads (the claim store must serve it; then start again)")]
    UnreadableClaim { why: String },
    #[error("state {path} was written with other settings ({saved}); this run has {current}. Use a new --state directory")]
    Settings {
        path: PathBuf,
        saved: String,
        current: String,
    },
}

#[derive(Debug, Clone)]
pub struct ShellOptions {
    pub state_dir: PathBuf,
    /// Input events between checkpoints.
    pub checkpoint_every: usize,
    /// A snapshot of the core's state is written every this many checkpoints
    /// (and when the shell stops); a restart re-reads at most this many
    /// checkpoints' worth of input to carry it forward. 1: every checkpoint.
    pub snapshot_every: usize,
    /// Stop after a sweep that found nothing new (batch use, tests); otherwise run until `stop`.
    pub exit_when_idle: bool,
    pub idle_wait: Duration,
    /// Set it to end the run after the current sweep, with a final checkpoint.
    pub stop: Arc<AtomicBool>,
    /// Only this partition of each input topic: one task of a scaled-out
    /// consumer (see [`crate::scale_out`]). `None`: every partition.
    pub partition: Option<i32>,
    /// Only this run's events: a process that serves one run (`up`, `run`)
    /// derives that run's trees and groups, and leaves every other run on the
    /// same log to its own process (two processes deriving one run would
    /// each send its outputs). `None`: every run (`forgelog consume`).
    pub run: Option<String>,
}

impl ShellOptions {
    /// Whether this shell reads `partition` of its inputs.
    fn takes(&self, partition: i32) -> bool {
        self.partition.is_none_or(|only| only == partition)
    }

    /// Whether this shell feeds `event` to its core (its run, if it has one).
    fn derives(&self, event: &Event) -> bool {
        self.run.as_deref().is_none_or(|run| event.run_id() == run)
    }

    pub fn new(state_dir: impl Into<PathBuf>) -> ShellOptions {
        ShellOptions {
            state_dir: state_dir.into(),
            checkpoint_every: 1000,
            snapshot_every: SNAPSHOT_EVERY,
            exit_when_idle: false,
            idle_wait: Duration::from_millis(500),
            stop: Arc::default(),
            partition: None,
            run: None,
        }
    }
}

/// What one run of the shell did.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct RunStats {
    pub consumed: u64,
    pub emitted: u64,
    /// Re-derived after a restart and already in the log: not sent again.
    pub skipped: u64,
    /// Input messages that are not forgelog events (recorded in the log's
    /// metrics and logs, then passed over).
    pub undecodable: u64,
    /// Bytes written to the state directory's checkpoints.
    pub state_bytes: u64,
}

impl std::ops::AddAssign<&RunStats> for RunStats {
    fn add_assign(&mut self, other: &RunStats) {
        self.consumed += other.consumed;
        self.emitted += other.emitted;
        self.skipped += other.skipped;
        self.undecodable += other.undecodable;
        self.state_bytes += other.state_bytes;
    }
}

/// A snapshot: the core's state and the positions it reflects (`state.json`).
#[derive(Serialize, Deserialize)]
struct Checkpoint<P> {
    settings: String,
    /// Which checkpoint this is: a progress record with a higher number is newer.
    #[serde(default)]
    seq: u64,
    /// topic → partition → next offset to read.
    inputs: BTreeMap<String, BTreeMap<i32, i64>>,
    /// Output partition → its end when this checkpoint was taken.
    outputs: BTreeMap<i32, i64>,
    /// The same for `forgelog.deadletters`.
    #[serde(default)]
    dead_letters: BTreeMap<i32, i64>,
    processor: P,
}

impl<P> Checkpoint<P> {
    /// The next offset to read of `topic`'s `partition`.
    fn position(&self, topic: &str, partition: i32) -> i64 {
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
struct Cadence {
    checkpoint_every: usize,
    /// Input events between snapshots.
    snapshot_every: usize,
    since_checkpoint: usize,
    since_snapshot: usize,
}

impl Cadence {
    fn new(options: &ShellOptions) -> Cadence {
        let checkpoint_every = options.checkpoint_every.max(1);
        Cadence {
            checkpoint_every,
            snapshot_every: options.snapshot_every.max(1) * checkpoint_every,
            since_checkpoint: 0,
            since_snapshot: 0,
        }
    }

    fn consumed(&mut self) {
        self.since_checkpoint += 1;
        self.since_snapshot += 1;
    }

    /// Within a sweep: a checkpoint every `checkpoint_every` events; `Some(true)` for a snapshot.
    fn due(&self) -> Option<bool> {
        (self.since_checkpoint >= self.checkpoint_every)
            .then_some(self.since_snapshot >= self.snapshot_every)
    }

    /// After a sweep: whatever it consumed, and a snapshot of all since the
    /// last one when the shell stops.
    fn due_after_sweep(&self, stopping: bool) -> Option<bool> {
        (self.since_checkpoint > 0 || (stopping && self.since_snapshot > 0))
            .then_some(stopping || self.since_snapshot >= self.snapshot_every)
    }

    fn done(&mut self, snapshot: bool) {
        self.since_checkpoint = 0;
        if snapshot {
            self.since_snapshot = 0;
        }
    }
}

/// Runs `fresh` (or its checkpointed state) over its input topics in Kafka
/// until idle or forever, its outputs through a spool in its state directory.
/// Blocking: call it from a blocking thread inside a tokio runtime.
pub fn run<P: Processor>(
    config: &StreamConfig,
    fresh: P,
    options: &ShellOptions,
) -> Result<RunStats, ShellError> {
    let rt = tokio::runtime::Handle::current();
    std::fs::create_dir_all(&options.state_dir).map_err(|source| ShellError::State {
        path: options.state_dir.clone(),
        source,
    })?;
    let config = &rt.block_on(forgelog_stream::admin::within_broker_ceiling(config));
    let producer = EventProducer::start(
        config,
        options.state_dir.join("spool"),
        SpoolOptions::default(),
    )?;
    // The broker going away (a restart, a network blip) is ridden out: the
    // shell starts again from its checkpoint, which is exactly what it does
    // after a crash, so nothing is lost or sent twice.
    // Each attempt starts from the fresh state as a checkpoint holds it.
    let fresh = serde_json::to_vec(&fresh).map_err(|e| ShellError::State {
        path: options.state_dir.clone(),
        source: std::io::Error::other(e),
    })?;
    let mut backoff = Duration::from_millis(500);
    let mut failures = 0;
    let stats = loop {
        let fresh: P = serde_json::from_slice(&fresh).expect("serialized above");
        // A log older than the consumers may lack a topic they write (the
        // dead letters): it is created, as `forgelog topics create` would.
        let attempt = rt
            .block_on(forgelog_stream::admin::create_topics(
                config,
                &Default::default(),
            ))
            .map_err(|e| ShellError::Consume(ConsumeError::Broker(e.to_string())))
            .and_then(|_| ReplayReader::new(config).map_err(ShellError::from))
            .and_then(|reader| run_on(&reader, &producer, fresh, options));
        match attempt {
            Ok(stats) => break stats,
            Err(e) if e.is_transient() && !options.stop.load(Ordering::Relaxed) => {
                failures += 1;
                if options.exit_when_idle && failures > MAX_RETRIES_WHEN_IDLE {
                    return Err(e);
                }
                tracing::warn!(error = %e, ?backoff, "consumer: the log is unreachable; starting again from the checkpoint");
                metrics::counter!("forgelog_consumer_restarts_total").increment(1);
                std::thread::sleep(backoff);
                backoff = (backoff * 2).min(Duration::from_secs(10));
            }
            Err(e) => return Err(e),
        }
    };
    rt.block_on(producer.close(Duration::from_secs(600)))?;
    Ok(stats)
}

/// A batch run (`exit_when_idle`) gives up after this many failed attempts in
/// a row (about a minute and a half of backoff); a long-running one never does.
const MAX_RETRIES_WHEN_IDLE: u32 = 12;

impl ShellError {
    /// Whether the log being unreachable caused it (worth a retry), rather
    /// than the state or the settings.
    pub fn is_transient(&self) -> bool {
        matches!(
            self,
            ShellError::Consume(_)
                | ShellError::Flush(_)
                | ShellError::Send(SendError::Spool(SpoolError::Full { .. }))
        )
    }
}

/// [`run`] over any log: reads with `log`, writes with `sink` (the fast test
/// tier runs it on a `MemoryLog`). Blocking, inside a tokio runtime context.
pub fn run_on<P: Processor>(
    log: &impl LogReader,
    sink: &impl EventSink,
    fresh: P,
    options: &ShellOptions,
) -> Result<RunStats, ShellError> {
    assert!(
        options.partition.is_none() || P::CO_PARTITIONED,
        "{} is one task: it cannot run over one partition",
        P::NAME
    );
    let rt = tokio::runtime::Handle::current();
    let reader = log;
    let producer = sink;
    let state_path = options.state_dir.join("state.json");
    let state_err = |source| ShellError::State {
        path: state_path.clone(),
        source,
    };
    std::fs::create_dir_all(&options.state_dir).map_err(state_err)?;

    // 1. Whatever a crashed run left in the spool goes out first.
    let started = std::time::Instant::now();
    rt.block_on(producer.flush(Duration::from_secs(600)))?;

    // 2. The checkpoint, or a fresh start from the beginning of the inputs.
    let output = P::OUTPUT.name();
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

    let spool_flushed = started.elapsed();
    // 3. Outputs (and dead letters) written after the checkpoint: re-derived
    // ones are not sent again.
    let mut written: HashMap<String, u32> = HashMap::new();
    let dead_letters = Topic::DeadLetters.name();
    for (topic, since) in [
        (output, &state.outputs),
        (dead_letters, &state.dead_letters),
    ] {
        for partition in reader.partitions(topic)? {
            let from = since.get(&partition).copied().unwrap_or(0);
            let end = reader.end(topic, partition)?;
            let _ = reader.for_each_in(topic, partition, from, end, |rec| {
                if let Ok(e) = rec.event {
                    *written.entry(e.event_id().to_string()).or_default() += 1;
                }
                ControlFlow::Continue(())
            })?;
        }
    }

    tracing::debug!(
        consumer = P::NAME,
        ?spool_flushed,
        outputs_since_checkpoint = written.values().sum::<u32>(),
        ready = ?started.elapsed(),
        "resumed"
    );

    // 4. Sweeps. A partition waiting on a claim it cannot read is held
    // there (and tried again each sweep); the others go on.
    let mut stats = RunStats::default();
    let mut out: Vec<Event> = Vec::new();
    let mut held: BTreeMap<(&str, i32), String> = BTreeMap::new();
    loop {
        let mut progressed = false;
        'sweep: for topic in P::INPUTS {
            let topic = topic.name();
            for partition in reader
                .partitions(topic)?
                .into_iter()
                .filter(|p| options.takes(*p))
            {
                let from = state.position(topic, partition);
                let end = reader.end(topic, partition)?;
                let t = std::time::Instant::now();
                let mut failure: Option<ShellError> = None;
                let mut unreadable: Option<String> = None;
                let _ = reader.for_each_in(topic, partition, from, end, |rec| {
                    if options.stop.load(Ordering::Relaxed) {
                        return ControlFlow::Break(());
                    }
                    match rec.event {
                        // A task of one partition sees a key's events only if
                        // every input is keyed as the processor expects.
                        Ok(event) if options.partition.is_some() && rec.key != event.key().as_bytes() => {
                            failure = Some(ShellError::NotCoPartitioned {
                                topic: topic.to_string(),
                                partition,
                                offset: rec.offset,
                                kind: event.kind().name(),
                                key: String::from_utf8_lossy(&rec.key).into_owned(),
                                expected: event.key().to_string(),
                            });
                            return ControlFlow::Break(());
                        }
                        Ok(event) if !options.derives(&event) => {}
                        Ok(event) => state.processor.process(event, &mut out),
                        // Another run's claim is that run's to read.
                        Err(_) if !rec.in_run(options.run.as_deref()) => {}
                        Err(why) if forgelog_schemas::Claim::is_claim(&rec.value) => {
                            unreadable = Some(why);
                            return ControlFlow::Break(());
                        }
                        Err(why) => {
                            stats.undecodable += 1;
                            metrics::counter!("forgelog_consumer_undecodable_total", "topic" => topic.to_string()).increment(1);
                            tracing::warn!(topic, partition = rec.partition, offset = rec.offset, %why, "not a forgelog event: set aside in forgelog.deadletters");
                            out.push(dead_letter(P::NAME, rec.partition, rec.offset, topic, rec.key, rec.value, why).into());
                        }
                    }
                    for e in out.drain(..) {
                        match written.get_mut(e.event_id()) {
                            Some(n) if *n > 0 => {
                                *n -= 1;
                                stats.skipped += 1;
                            }
                            _ => {
                                if let Err(err) = producer.send(&e) {
                                    failure = Some(err.into());
                                    return ControlFlow::Break(());
                                }
                                stats.emitted += 1;
                            }
                        }
                    }
                    progressed = true;
                    stats.consumed += 1;
                    state.inputs.entry(topic.to_string()).or_default().insert(partition, rec.offset + 1);
                    cadence.consumed();
                    if let Some(snapshot) = cadence.due() {
                        match checkpoint(&rt, producer, reader, &mut state, &options.state_dir, snapshot) {
                            Ok(bytes) => stats.state_bytes += bytes,
                            Err(e) => {
                                failure = Some(e);
                                return ControlFlow::Break(());
                            }
                        }
                        cadence.done(snapshot);
                    }
                    ControlFlow::Continue(())
                })?;
                if let Some(err) = failure {
                    return Err(err);
                }
                match unreadable {
                    Some(why) => {
                        if held.insert((topic, partition), why.clone()).as_ref() != Some(&why) {
                            tracing::error!(topic, partition, %why, "claim check unreadable: this partition waits for it, the others go on");
                        }
                    }
                    None => {
                        held.remove(&(topic, partition));
                    }
                }
                metrics::gauge!("forgelog_consumer_held_partitions", "consumer" => P::NAME)
                    .set(held.len() as f64);
                if options.stop.load(Ordering::Relaxed) {
                    break 'sweep;
                }
                tracing::debug!(consumer = P::NAME, topic, partition, from, end, elapsed = ?t.elapsed(), "swept");
            }
        }
        let stopping =
            (!progressed && options.exit_when_idle) || options.stop.load(Ordering::Relaxed);
        if let Some(snapshot) = cadence.due_after_sweep(stopping) {
            stats.state_bytes += checkpoint(
                &rt,
                producer,
                reader,
                &mut state,
                &options.state_dir,
                snapshot,
            )?;
            cadence.done(snapshot);
        }
        if stopping {
            rt.block_on(producer.flush(Duration::from_secs(600)))?;
            // What every other partition held is derived; this one's claim
            // stays in the input, to be derived once the store serves it.
            if let Some(why) = held.into_values().next() {
                return Err(ShellError::UnreadableClaim { why });
            }
            return Ok(stats);
        }
        if !progressed {
            std::thread::sleep(options.idle_wait);
        }
    }
}

/// A message `consumer` could not read, as the event that sets it aside.
fn dead_letter(
    consumer: &str,
    partition: i32,
    offset: i64,
    topic: &str,
    key: Vec<u8>,
    value: Vec<u8>,
    reason: String,
) -> DeadLetter {
    let (p, o) = (partition.to_string(), offset.to_string());
    DeadLetter {
        run_id: String::new(),
        event_id: forgelog_schemas::event_id("DeadLetter", &[consumer, topic, &p, &o]),
        consumer: consumer.to_string(),
        topic: topic.to_string(),
        partition,
        offset,
        key,
        value,
        reason,
    }
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
fn checkpoint<P: Processor>(
    rt: &tokio::runtime::Handle,
    producer: &impl EventSink,
    reader: &impl LogReader,
    state: &mut Checkpoint<P>,
    dir: &Path,
    snapshot: bool,
) -> Result<u64, ShellError> {
    let t = std::time::Instant::now();
    rt.block_on(producer.flush(Duration::from_secs(600)))?;
    let flushed = t.elapsed();
    state.outputs = ends(reader, P::OUTPUT.name())?;
    state.dead_letters = ends(reader, Topic::DeadLetters.name())?;
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

#[cfg(test)]
mod tests;
