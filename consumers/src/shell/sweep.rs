//! A shell at work: resumed from its checkpoint, then sweeping its inputs,
//! each record fed to the core and what it derives sent (or skipped, where
//! a run before a crash sent it already).

use super::checkpoint::{self, Cadence, Checkpoint};
use super::{RunStats, ShellError, ShellOptions};
use crate::Processor;
use forgelog_schemas::{DeadLetter, Event, Received, Topic};
use forgelog_stream::{EventSink, LogReader};
use std::collections::{BTreeMap, HashMap};
use std::ops::ControlFlow;
use std::sync::atomic::Ordering;
use std::time::Duration;

/// Why a partition's read stopped before its end.
enum Halt {
    /// Told to stop.
    Stopped,
    /// A claim check whose event cannot be read: the partition waits there.
    Unreadable(String),
    Failed(ShellError),
}

/// One shell's state between sweeps.
pub(super) struct Shell<'a, P, L, S> {
    log: &'a L,
    sink: &'a S,
    options: &'a ShellOptions,
    rt: tokio::runtime::Handle,
    state: Checkpoint<P>,
    cadence: Cadence,
    /// Event ids written to the outputs since the checkpoint (how many
    /// times): re-derived, they are not sent again.
    written: HashMap<String, u32>,
    /// While outputs since the checkpoint were found: where the inputs
    /// ended at the resume. The run before could not have read past there,
    /// so once every position reaches it, all it sent is re-derived.
    /// Until then a checkpoint keeps the outputs' base it was restored with:
    /// the outputs' ends now lie past some still to be re-derived.
    replay_until: BTreeMap<(&'static str, i32), i64>,
    /// Partitions held at a claim they cannot read, and why.
    held: BTreeMap<(&'static str, i32), String>,
    out: Vec<Event>,
    pub(super) stats: RunStats,
}

impl<'a, P: Processor, L: LogReader, S: EventSink> Shell<'a, P, L, S> {
    /// What a crashed run left in the spool sent first, then the checkpoint
    /// restored and the outputs written since it read back.
    pub(super) fn resume(
        log: &'a L,
        sink: &'a S,
        fresh: P,
        options: &'a ShellOptions,
    ) -> Result<Self, ShellError> {
        let rt = tokio::runtime::Handle::current();
        std::fs::create_dir_all(&options.state_dir).map_err(|source| ShellError::State {
            path: options.state_dir.clone(),
            source,
        })?;
        let started = std::time::Instant::now();
        rt.block_on(sink.flush(Duration::from_secs(600)))?;
        let (state, cadence) = checkpoint::restore(log, fresh, options)?;
        let spool_flushed = started.elapsed();
        let written = written_since(log, &state, P::OUTPUT.name())?;
        let mut replay_until = BTreeMap::new();
        if !written.is_empty() {
            for topic in P::INPUTS {
                let topic = topic.name();
                for partition in log.partitions(topic)? {
                    if options.takes(partition) {
                        replay_until.insert((topic, partition), log.end(topic, partition)?);
                    }
                }
            }
        }
        tracing::debug!(
            consumer = P::NAME,
            ?spool_flushed,
            outputs_since_checkpoint = written.values().sum::<u32>(),
            ready = ?started.elapsed(),
            "resumed"
        );
        Ok(Shell {
            log,
            sink,
            options,
            rt,
            state,
            cadence,
            written,
            replay_until,
            held: BTreeMap::new(),
            out: Vec::new(),
            stats: RunStats::default(),
        })
    }

    /// Every input partition from its position to the end it has now;
    /// whether anything was read. A partition waiting on a claim it cannot
    /// read is held there (and tried again next sweep); the others go on.
    pub(super) fn sweep(&mut self) -> Result<bool, ShellError> {
        let log = self.log;
        let mut progressed = false;
        for topic in P::INPUTS {
            let topic = topic.name();
            for partition in log.partitions(topic)? {
                if !self.options.takes(partition) {
                    continue;
                }
                let from = self.state.position(topic, partition);
                let end = log.end(topic, partition)?;
                let t = std::time::Instant::now();
                let consumed = self.stats.consumed;
                let mut halt = None;
                let _ = log.for_each_in(topic, partition, from, end, |rec| {
                    match self.take(topic, partition, rec) {
                        ControlFlow::Continue(()) => ControlFlow::Continue(()),
                        ControlFlow::Break(h) => {
                            halt = Some(h);
                            ControlFlow::Break(())
                        }
                    }
                })?;
                progressed |= self.stats.consumed > consumed;
                match halt {
                    Some(Halt::Failed(e)) => return Err(e),
                    Some(Halt::Unreadable(why)) => {
                        if self.held.insert((topic, partition), why.clone()).as_ref() != Some(&why)
                        {
                            tracing::error!(topic, partition, %why, "claim check unreadable: this partition waits for it, the others go on");
                        }
                    }
                    Some(Halt::Stopped) | None => {
                        self.held.remove(&(topic, partition));
                    }
                }
                metrics::gauge!("forgelog_consumer_held_partitions", "consumer" => P::NAME)
                    .set(self.held.len() as f64);
                if self.options.stop.load(Ordering::Relaxed) {
                    return Ok(progressed);
                }
                tracing::debug!(consumer = P::NAME, topic, partition, from, end, elapsed = ?t.elapsed(), "swept");
            }
        }
        Ok(progressed)
    }

    /// One input record: fed to the core (or set aside as a dead letter),
    /// what it derives sent, its position kept, a checkpoint taken when due.
    fn take(&mut self, topic: &'static str, partition: i32, rec: Received) -> ControlFlow<Halt> {
        let options = self.options;
        if options.stop.load(Ordering::Relaxed) {
            return ControlFlow::Break(Halt::Stopped);
        }
        match rec.event {
            // A task of one partition sees a key's events only if every
            // input is keyed as the processor expects.
            Ok(event) if options.partition.is_some() && rec.key != event.key().as_bytes() => {
                return ControlFlow::Break(Halt::Failed(ShellError::NotCoPartitioned {
                    topic: topic.to_string(),
                    partition,
                    offset: rec.offset,
                    kind: event.kind().name(),
                    key: String::from_utf8_lossy(&rec.key).into_owned(),
                    expected: event.key().to_string(),
                }));
            }
            Ok(event) if !options.derives(&event) => {}
            Ok(event) => self.state.processor.process(event, &mut self.out),
            // Another run's claim is that run's to read.
            Err(_) if !rec.in_run(options.run.as_deref()) => {}
            Err(why) if forgelog_schemas::Claim::is_claim(&rec.value) => {
                return ControlFlow::Break(Halt::Unreadable(why));
            }
            Err(why) => {
                self.stats.undecodable += 1;
                metrics::counter!("forgelog_consumer_undecodable_total", "topic" => topic.to_string()).increment(1);
                tracing::warn!(topic, partition = rec.partition, offset = rec.offset, %why, "not a forgelog event: set aside in forgelog.deadletters");
                let letter = dead_letter(
                    P::NAME,
                    rec.partition,
                    rec.offset,
                    topic,
                    rec.key,
                    rec.value,
                    why,
                );
                self.out.push(letter.into());
            }
        }
        for e in self.out.drain(..) {
            match self.written.get_mut(e.event_id()) {
                Some(n) if *n > 0 => {
                    *n -= 1;
                    self.stats.skipped += 1;
                }
                _ => {
                    if let Err(err) = self.sink.send(&e) {
                        return ControlFlow::Break(Halt::Failed(err.into()));
                    }
                    self.stats.emitted += 1;
                }
            }
        }
        self.stats.consumed += 1;
        self.state
            .inputs
            .entry(topic.to_string())
            .or_default()
            .insert(partition, rec.offset + 1);
        self.cadence.consumed();
        match self.cadence.due().map(|snapshot| self.checkpoint(snapshot)) {
            Some(Err(e)) => ControlFlow::Break(Halt::Failed(e)),
            _ => ControlFlow::Continue(()),
        }
    }

    /// A checkpoint (with the core's state when `snapshot`).
    pub(super) fn checkpoint(&mut self, snapshot: bool) -> Result<(), ShellError> {
        let state = &self.state;
        if self
            .replay_until
            .iter()
            .all(|(&(topic, partition), &end)| state.position(topic, partition) >= end)
        {
            self.replay_until.clear();
            self.written.clear();
        }
        let dir = &self.options.state_dir;
        self.stats.state_bytes += checkpoint::write(
            &self.rt,
            self.sink,
            self.log,
            &mut self.state,
            dir,
            snapshot,
            !self.replay_until.is_empty(),
        )?;
        self.cadence.done(snapshot);
        Ok(())
    }

    /// After a sweep: the checkpoint due, and when `stopping`, everything
    /// sent. Stopping while a partition is held at a claim it cannot read is
    /// an error (the others' work is done and kept).
    pub(super) fn after_sweep(&mut self, stopping: bool) -> Result<(), ShellError> {
        if let Some(snapshot) = self.cadence.due_after_sweep(stopping) {
            self.checkpoint(snapshot)?;
        }
        if stopping {
            self.rt
                .block_on(self.sink.flush(Duration::from_secs(600)))?;
            // What every other partition held is derived; this one's claim
            // stays in the input, to be derived once the store serves it.
            if let Some(why) = self.held.values().next() {
                return Err(ShellError::UnreadableClaim { why: why.clone() });
            }
        }
        Ok(())
    }
}

/// Outputs (and dead letters) written after the checkpoint, by event id.
fn written_since<P>(
    log: &impl LogReader,
    state: &Checkpoint<P>,
    output: &str,
) -> Result<HashMap<String, u32>, ShellError> {
    let mut written: HashMap<String, u32> = HashMap::new();
    let dead_letters = Topic::DeadLetters.name();
    for (topic, since) in [
        (output, &state.outputs),
        (dead_letters, &state.dead_letters),
    ] {
        for partition in log.partitions(topic)? {
            let from = since.get(&partition).copied().unwrap_or(0);
            let end = log.end(topic, partition)?;
            let _ = log.for_each_in(topic, partition, from, end, |rec| {
                if let Ok(e) = rec.event {
                    *written.entry(e.event_id().to_string()).or_default() += 1;
                }
                ControlFlow::Continue(())
            })?;
        }
    }
    Ok(written)
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
