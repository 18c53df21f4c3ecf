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
//! sent, in the same order a clean run sends them. Until its positions pass
//! where the inputs ended when it resumed (the run before read no further),
//! its checkpoints keep the output ends it restored: stopped or killed in
//! between, the next run still finds the outputs not yet re-derived.

mod checkpoint;
mod sweep;

pub use checkpoint::SNAPSHOT_EVERY;

use crate::Processor;
use forgelog_schemas::Event;
use forgelog_stream::{
    ConsumeError, EventProducer, EventSink, LogReader, ReplayReader, SendError, SpoolError,
    SpoolOptions, StreamConfig,
};
use std::path::PathBuf;
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
    let mut shell = sweep::Shell::resume(log, sink, fresh, options)?;
    loop {
        let progressed = shell.sweep()?;
        let stopping =
            (!progressed && options.exit_when_idle) || options.stop.load(Ordering::Relaxed);
        shell.after_sweep(stopping)?;
        if stopping {
            return Ok(shell.stats);
        }
        if !progressed {
            std::thread::sleep(options.idle_wait);
        }
    }
}

#[cfg(test)]
mod tests;
