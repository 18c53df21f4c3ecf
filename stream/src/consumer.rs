//! Typed consumers: a group member that commits only when told, and the replay
//! reader that reads a topic's history without joining any group.

use crate::run_index::{Gap, Indexed};
use crate::StreamConfig;
use forgelog_schemas::{Codec, Received, Topic};
use rdkafka::consumer::{BaseConsumer, CommitMode, Consumer, StreamConsumer};
use rdkafka::message::BorrowedMessage;
use rdkafka::{Message, Offset, TopicPartitionList};
use std::cell::Cell;
use std::collections::BTreeMap;
use std::ops::ControlFlow;
use std::time::{Duration, Instant};

/// A message as the consumers read it.
fn received(msg: &BorrowedMessage<'_>) -> Received {
    crate::claims::receive(
        msg.topic(),
        msg.partition(),
        msg.offset(),
        msg.key().unwrap_or_default(),
        msg.payload().unwrap_or_default(),
    )
}

/// Whether the message is an event of a run other than `run`, by its first
/// bytes: a reader of one run skips the others' events without decoding them.
/// Anything not plainly another run's is decoded (and reported if it must be).
fn of_another_run(msg: &BorrowedMessage<'_>, run: &str) -> bool {
    msg.payload()
        .and_then(|value| Codec::global().peek_run_id(value))
        .is_some_and(|id| id != run)
}

/// Errors that say the broker cannot be reached now, which the client rides
/// out by itself (it reconnects).
fn broker_unreachable(e: &rdkafka::error::KafkaError) -> bool {
    use rdkafka::types::RDKafkaErrorCode as C;
    matches!(
        e.rdkafka_error_code(),
        Some(C::BrokerTransportFailure | C::AllBrokersDown | C::OperationTimedOut | C::Resolve)
    )
}

/// The broker cannot be reached: said once, in words, naming where it was looked for.
#[derive(Debug, Clone, thiserror::Error)]
#[error("the broker at {brokers} cannot be reached ({reason}); is it running? (`forgelog broker`; --brokers or FORGELOG_BROKERS say where)")]
pub struct Unreachable {
    pub brokers: String,
    pub reason: String,
}

/// `e` as [`Unreachable`] when it says the broker at `brokers` cannot be
/// reached, else as it is: in the error type of the caller.
pub(crate) fn classify<E>(brokers: &str, e: rdkafka::error::KafkaError) -> E
where
    E: From<Unreachable> + From<rdkafka::error::KafkaError>,
{
    if !broker_unreachable(&e) {
        return e.into();
    }
    Unreachable {
        brokers: brokers.to_string(),
        reason: e
            .rdkafka_error_code()
            .map_or_else(|| e.to_string(), |c| c.to_string()),
    }
    .into()
}

#[derive(Debug, thiserror::Error)]
pub enum ConsumeError {
    #[error("kafka: {0}")]
    Kafka(#[from] rdkafka::error::KafkaError),
    #[error(transparent)]
    Unreachable(#[from] Unreachable),
    #[error("{0}")]
    Broker(String),
}

/// A consumer-group member over forgelog topics. Offsets are committed only by
/// [`EventConsumer::commit`], after the caller has written its output.
pub struct EventConsumer {
    inner: StreamConsumer,
}

impl EventConsumer {
    pub fn new(
        config: &StreamConfig,
        group: &str,
        topics: &[Topic],
    ) -> Result<EventConsumer, ConsumeError> {
        let inner: StreamConsumer = config.consumer(group).create()?;
        let names: Vec<&str> = topics.iter().map(|t| t.name()).collect();
        inner.subscribe(&names)?;
        Ok(EventConsumer { inner })
    }

    /// The next message. The broker going away is not an error here:
    /// librdkafka reports it and reconnects on its own, so this waits.
    pub async fn recv(&self) -> Result<Received, ConsumeError> {
        loop {
            match self.inner.recv().await {
                Ok(msg) => return Ok(received(&msg)),
                Err(e) if broker_unreachable(&e) => {
                    tracing::debug!(error = %e, "consumer: broker unreachable; waiting");
                }
                Err(e) => return Err(e.into()),
            }
        }
    }

    /// Commits "everything up to and including these messages" (synchronously).
    pub fn commit(&self, processed: &[(&str, i32, i64)]) -> Result<(), ConsumeError> {
        let mut tpl = TopicPartitionList::new();
        for &(topic, partition, offset) in processed {
            tpl.add_partition_offset(topic, partition, Offset::Offset(offset + 1))?;
        }
        self.inner.commit(&tpl, CommitMode::Sync)?;
        Ok(())
    }
}

/// Where a replay starts in every partition.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum StartAt {
    Beginning,
    Offset(i64),
    /// The first message at or after this time (ms since the epoch).
    Timestamp(i64),
}

/// Reads a topic from a start point to the end it had when the read began,
/// partition by partition in offset order, without joining a group: the same
/// input always gives the same sequence.
pub struct ReplayReader {
    consumer: BaseConsumer,
    /// Metadata and watermark queries on a connection of their own: on the
    /// reading one they would queue behind its fetch long-polls.
    meta: BaseConsumer,
    timeout: Duration,
    brokers: String,
    /// Where each run starts ([`crate::run_index`]): a run's reads seek.
    index: crate::run_index::RunIndex,
    /// Messages fetched from the broker so far (what a read cost).
    fetched: std::sync::atomic::AtomicU64,
}

impl ReplayReader {
    /// A metadata query's error, in words where the broker is unreachable.
    fn meta_error(&self, e: rdkafka::error::KafkaError) -> ConsumeError {
        classify(&self.brokers, e)
    }

    pub fn new(config: &StreamConfig) -> Result<ReplayReader, ConsumeError> {
        let mut reading = config.consumer("forgelog-replay");
        // Bounded reads want what is there now, not to wait for more.
        reading.set("fetch.wait.max.ms", "10");
        Ok(ReplayReader {
            consumer: reading.create()?,
            meta: config.consumer("forgelog-replay-meta").create()?,
            timeout: Duration::from_secs(10),
            brokers: config.brokers.clone(),
            index: crate::run_index::RunIndex::new(config, Duration::from_secs(10)),
            fetched: Default::default(),
        })
    }

    /// Messages this reader has fetched from the broker so far.
    pub fn messages_fetched(&self) -> u64 {
        self.fetched.load(std::sync::atomic::Ordering::Relaxed)
    }

    /// Partition ids of `topic`, sorted.
    pub fn partitions(&self, topic: &str) -> Result<Vec<i32>, ConsumeError> {
        let md = self
            .meta
            .fetch_metadata(Some(topic), self.timeout)
            .map_err(|e| self.meta_error(e))?;
        let t = md
            .topics()
            .first()
            .ok_or_else(|| ConsumeError::Broker(format!("no metadata for {topic}")))?;
        if let Some(e) = t.error() {
            return Err(ConsumeError::Broker(format!("topic {topic}: {e:?}")));
        }
        let mut ids: Vec<i32> = t.partitions().iter().map(|p| p.id()).collect();
        ids.sort();
        Ok(ids)
    }

    /// Calls `f` with every message of `topic` from `start` to the end the topic
    /// has now, keeping only events of run `run` when given (undecodable messages
    /// are always passed on), until `f` breaks. A run's read from the
    /// beginning starts each partition where the run index says the run
    /// starts, skips the gap it knows past the run's records, and writes
    /// what it found (see [`crate::run_index`]).
    pub fn for_each(
        &self,
        topic: &str,
        start: StartAt,
        run: Option<&str>,
        mut f: impl FnMut(Received) -> ControlFlow<()>,
    ) -> Result<(), ConsumeError> {
        let partitions = self.partitions(topic)?;
        let indexed_run = run.filter(|_| start == StartAt::Beginning);
        let index = indexed_run.map_or_else(Indexed::default, |run| {
            self.index.of(topic, &partitions, run)
        });
        // What this read found: where the run starts in partitions scanned
        // from their beginning, and the gap past its records in partitions
        // read to their end.
        let (mut found, mut gaps) = (BTreeMap::new(), BTreeMap::new());
        for partition in partitions {
            let (lo, hi) = self.watermarks(topic, partition)?;
            let (indexed, gap) = index.of(topic, partition, hi, indexed_run.unwrap_or_default());
            let from = match start {
                StartAt::Beginning => indexed.map_or(lo, |at| at.max(lo)),
                StartAt::Offset(o) => o.clamp(lo, hi),
                StartAt::Timestamp(ms) => self.offset_at(topic, partition, ms, hi)?,
            };
            let (first, last) = (Cell::new(None), Cell::new(None));
            let mut visit = |msg: &BorrowedMessage<'_>| {
                if run.is_some_and(|run| of_another_run(msg, run)) {
                    return ControlFlow::Continue(());
                }
                let rec = received(msg);
                if !rec.in_run(run) {
                    return ControlFlow::Continue(());
                }
                if first.get().is_none() {
                    first.set(Some(rec.offset));
                }
                last.set(Some(rec.offset));
                f(rec)
            };
            // The run's records lie before the gap or past it.
            let before = gap.map_or(hi, |g| g.end.max(from));
            let mut flow = self.for_each_message_in(topic, partition, from, before, &mut visit)?;
            if let (Some(g), false) = (gap, flow.is_break()) {
                // A gap follows the run's last record before it: one that
                // does not is not this log's, and is read through.
                let after = if g.end > from && last.get() != Some(g.end - 1) {
                    tracing::warn!(
                        topic,
                        partition,
                        run = indexed_run.unwrap_or_default(),
                        "the run index's gap [{}, {}) does not follow a record of the run: \
                         it is not this log's; reading through it",
                        g.end,
                        g.checked
                    );
                    before
                } else {
                    g.checked.max(from)
                };
                flow = self.for_each_message_in(topic, partition, after, hi, &mut visit)?;
            }
            let (first, last) = (first.get(), last.get());
            if indexed_run.is_some() && indexed.is_none() {
                // Read from the beginning: the run starts at its first record,
                // or (none) after everything there is now. A read cut short
                // by `f` saw the first record, which is where it stopped.
                if let Some(at) = first.or((!flow.is_break()).then_some(hi)) {
                    found.insert(partition, at);
                }
            }
            if flow.is_break() {
                break;
            }
            if indexed_run.is_some() {
                // Read to the end: nothing of the run past its last record.
                let end = last.map_or(from, |l| l + 1);
                let now = Gap { end, checked: hi };
                if gap != Some(now) {
                    gaps.insert(partition, now);
                }
            }
        }
        self.consumer.unassign()?;
        if let Some(run) = indexed_run {
            let written = self
                .index
                .mark(topic, run, &found)
                .and_then(|()| self.index.mark_gaps(topic, run, &gaps));
            if let Err(e) = written {
                tracing::debug!(topic, run, "run index not written ({e})");
            }
        }
        Ok(())
    }

    /// The first offset of `partition` at or after time `ms` (`hi` if none).
    fn offset_at(
        &self,
        topic: &str,
        partition: i32,
        ms: i64,
        hi: i64,
    ) -> Result<i64, ConsumeError> {
        let mut q = TopicPartitionList::new();
        q.add_partition_offset(topic, partition, Offset::Offset(ms))?;
        let found = self
            .meta
            .offsets_for_times(q, self.timeout)
            .map_err(|e| self.meta_error(e))?;
        Ok(
            match found.find_partition(topic, partition).map(|e| e.offset()) {
                Some(Offset::Offset(o)) => o,
                _ => hi,
            },
        )
    }

    /// Low and high watermarks of one partition: the first offset still kept,
    /// and the offset the next message will get.
    pub fn watermarks(&self, topic: &str, partition: i32) -> Result<(i64, i64), ConsumeError> {
        self.meta
            .fetch_watermarks(topic, partition, self.timeout)
            .map_err(|e| self.meta_error(e))
    }

    /// High watermark (the offset the next message will get) of one partition.
    pub fn end(&self, topic: &str, partition: i32) -> Result<i64, ConsumeError> {
        Ok(self.watermarks(topic, partition)?.1)
    }

    /// Calls `f` with the messages of one partition in `[from, to)`, in offset
    /// order, until `f` breaks (which this returns).
    pub fn for_each_in(
        &self,
        topic: &str,
        partition: i32,
        from: i64,
        to: i64,
        mut f: impl FnMut(Received) -> ControlFlow<()>,
    ) -> Result<ControlFlow<()>, ConsumeError> {
        self.for_each_message_in(topic, partition, from, to, |msg| f(received(msg)))
    }

    /// [`Self::for_each_in`] with the messages as the client has them, undecoded.
    fn for_each_message_in(
        &self,
        topic: &str,
        partition: i32,
        from: i64,
        to: i64,
        mut f: impl FnMut(&BorrowedMessage<'_>) -> ControlFlow<()>,
    ) -> Result<ControlFlow<()>, ConsumeError> {
        if from >= to {
            return Ok(ControlFlow::Continue(()));
        }
        let mut tpl = TopicPartitionList::new();
        tpl.add_partition_offset(topic, partition, Offset::Offset(from))?;
        // The reading client learns the topic first: assigned a partition of
        // a topic it had no metadata for, librdkafka waited about 300 ms a
        // partition before fetching (a 3-partition topic of 24 records read
        // in 0.94 s, 0.07 s with this; `benches/run-seek.rs`).
        let _ = self.consumer.fetch_metadata(Some(topic), self.timeout);
        self.consumer.assign(&tpl)?;
        let mut next = from;
        let mut idle_since = Instant::now();
        while next < to {
            match self.consumer.poll(Duration::from_millis(200)) {
                Some(msg) => {
                    let msg = msg?;
                    self.fetched
                        .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                    idle_since = Instant::now();
                    next = msg.offset() + 1;
                    if msg.offset() >= to {
                        break;
                    }
                    if f(&msg).is_break() {
                        self.consumer.unassign()?;
                        return Ok(ControlFlow::Break(()));
                    }
                }
                None if idle_since.elapsed() > self.timeout * 3 => {
                    return Err(ConsumeError::Broker(format!(
                        "read of {topic}/{partition} stalled at offset {next} of {to}"
                    )));
                }
                None => {}
            }
        }
        self.consumer.unassign()?;
        Ok(ControlFlow::Continue(()))
    }

    /// All of `topic` (or one run of it) from `start`, in partition then offset order.
    pub fn read(
        &self,
        topic: &str,
        start: StartAt,
        run: Option<&str>,
    ) -> Result<Vec<Received>, ConsumeError> {
        let mut out = Vec::new();
        self.for_each(topic, start, run, |r| {
            out.push(r);
            ControlFlow::Continue(())
        })?;
        Ok(out)
    }

    /// Calls `f` with every new message of `topic` (from the end it has now) as it
    /// arrives, until `f` breaks.
    pub fn follow(
        &self,
        topic: &str,
        run: Option<&str>,
        mut f: impl FnMut(Received) -> ControlFlow<()>,
    ) -> Result<(), ConsumeError> {
        let mut tpl = TopicPartitionList::new();
        for partition in self.partitions(topic)? {
            tpl.add_partition_offset(topic, partition, Offset::End)?;
        }
        self.consumer.assign(&tpl)?;
        loop {
            if let Some(msg) = self.consumer.poll(Duration::from_millis(500)) {
                let msg = msg?;
                if run.is_some_and(|run| of_another_run(&msg, run)) {
                    continue;
                }
                let rec = received(&msg);
                if rec.in_run(run) && f(rec).is_break() {
                    self.consumer.unassign()?;
                    return Ok(());
                }
            }
        }
    }
}
