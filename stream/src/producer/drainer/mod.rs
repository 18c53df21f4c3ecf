//! The drainer: reads the spool in order and produces it to Kafka, a
//! bounded window in flight; recovers after a failure or a killed writer
//! (how: [`super`]); parks what the broker refuses for good and sends
//! a refused call's stand-in in its place.

use super::delivering::DeliveringProducer;
use crate::spool::{Checkpoint, ParkedRecord, Spool, SpoolError, SpoolReader, SpoolRecord};
use crate::{ConsumeError, StreamConfig};
use forgelog_schemas::Codec;
use futures::stream::{FuturesOrdered, StreamExt};
use recovery::Arrived;
use std::collections::HashMap;
use std::sync::Arc;
use std::time::{Duration, Instant};
use tokio::sync::watch;

mod recovery;

const WINDOW: usize = 4096;
/// The checkpoint is saved (with an fsync) every this many deliveries, and when
/// the drainer has been idle for `CHECKPOINT_IDLE`. A stale checkpoint costs
/// only a longer recovery scan after a crash, never a duplicate; saving it after
/// every quiet moment cost an fsync per event at low rates.
const CHECKPOINT_EVERY: u64 = 2048;
const CHECKPOINT_IDLE: Duration = Duration::from_millis(500);

#[derive(Debug, thiserror::Error)]
enum DrainError {
    #[error("kafka: {0}")]
    Kafka(#[from] rdkafka::error::KafkaError),
    #[error("spool: {0}")]
    Spool(#[from] SpoolError),
    #[error("spool read: {0}")]
    Io(#[from] std::io::Error),
    #[error("recovery scan: {0}")]
    Scan(#[from] ConsumeError),
    #[error("{0}")]
    Other(String),
}

pub(super) struct Drainer {
    config: rdkafka::ClientConfig,
    /// The log, for the recovery scan (bounded reads with the [`ReplayReader`]).
    stream: StreamConfig,
    spool: Arc<Spool>,
    checkpoint: Checkpoint,
}

/// A record's fate, unless the drain must stop and retry.
enum Fate {
    /// In the log at (partition, offset).
    At(i32, i64),
    /// The broker (or the client) refuses this record for good: retrying it
    /// would only hold back every record behind it.
    Refused(String),
}

type Delivered = Result<Fate, DrainError>;
/// A delivery under way: produced now, or already in the log.
type Delivery = std::pin::Pin<Box<dyn std::future::Future<Output = Delivered> + Send>>;

/// A record on its way to the log: what its delivery report is matched with.
struct Outgoing {
    seq: u64,
    topic: String,
    /// Sent in place of a record refused before.
    stood_in: bool,
}

/// Refusals no retry can change: the record itself is the problem.
fn refused_for_good(e: &rdkafka::error::KafkaError) -> bool {
    use rdkafka::types::RDKafkaErrorCode as C;
    matches!(
        e.rdkafka_error_code(),
        Some(C::MessageSizeTooLarge | C::InvalidMessageSize | C::InvalidRecord | C::InvalidMessage)
    )
}

/// The record sent in place of `rec`, which the broker refused for good
/// (`reason`): a call's stand-in ([`Codec::stand_in`]), under the same seq;
/// `None` for any other event (it stays parked).
fn stand_in(rec: &SpoolRecord, reason: &str) -> Option<SpoolRecord> {
    Some(SpoolRecord {
        seq: rec.seq,
        topic: rec.topic.clone(),
        key: rec.key.clone(),
        value: Codec::global().stand_in(&rec.value, reason)?,
    })
}

fn refused_stand_in(seq: u64, reason: &str) {
    tracing::error!(seq, %reason, "spool: the broker refused a refused call's stand-in too; its rollout stays a call short");
    metrics::counter!("forgelog_spool_stand_ins_refused_total").increment(1);
}

impl Drainer {
    pub(super) fn new(config: &StreamConfig, spool: Arc<Spool>) -> Result<Drainer, SpoolError> {
        let io = |source| SpoolError::Io {
            dir: spool.dir().to_path_buf(),
            source,
        };
        let checkpoint = Checkpoint::load(spool.dir()).map_err(io)?;
        Ok(Drainer {
            config: config.producer(spool.options().linger),
            stream: config.clone(),
            spool,
            checkpoint,
        })
    }

    pub(super) async fn run(mut self, mut stop: watch::Receiver<bool>) {
        let mut backoff = Duration::from_millis(100);
        loop {
            match self.session(&mut stop).await {
                Ok(()) => return,
                Err(e) => {
                    tracing::warn!(error = %e, pending = self.spool.pending(), "spool drain interrupted; retrying");
                    metrics::counter!("forgelog_spool_drain_errors_total").increment(1);
                }
            }
            tokio::select! {
                _ = tokio::time::sleep(backoff) => {}
                _ = stop.changed() => return,
            }
            backoff = (backoff * 2).min(Duration::from_secs(5));
        }
    }

    /// One producer's lifetime: recover, then drain until stopped or failed.
    async fn session(&mut self, stop: &mut watch::Receiver<bool>) -> Result<(), DrainError> {
        let producer = DeliveringProducer::create(&self.config)?;
        let mut already = self.recover().await?;
        // Records refused before (by this process or one killed since) and
        // not yet acknowledged: their stand-ins go in their place, made from
        // the reason parked with them, so a stand-in already in the log is
        // found by the recovery and not sent twice.
        let mut refused_before: HashMap<u64, String> = ParkedRecord::list(self.spool.dir())
            .map_err(DrainError::Io)?
            .into_iter()
            .filter(|p| p.seq >= self.checkpoint.acked_through)
            .map(|p| (p.seq, p.reason))
            .collect();
        let mut reader = self.spool.reader(self.checkpoint.acked_through);
        let mut inflight = FuturesOrdered::new();
        // When each record in flight was sent, oldest first (as `inflight`).
        let mut sent_at = std::collections::VecDeque::new();
        let mut since_checkpoint = 0u64;
        let mut last_done = Instant::now();
        // Every failure leaves the loop with `break 'session`, never `?`: what
        // is in flight must settle before the next session (below).
        macro_rules! or_end {
            ($label:lifetime, $e:expr) => {
                match $e {
                    Ok(v) => v,
                    Err(e) => break $label Err(e.into()),
                }
            };
        }
        let result: Result<(), DrainError> = 'session: loop {
            while inflight.len() < WINDOW {
                let next = self
                    .next_delivery(&producer, &mut reader, &mut already, &mut refused_before)
                    .await;
                let Some((outgoing, delivery)) = or_end!('session, next) else {
                    break;
                };
                let sent = Instant::now();
                sent_at.push_back(sent);
                inflight.push_back(async move {
                    let delivered = delivery.await;
                    (outgoing, delivered, sent, Instant::now())
                });
            }
            if inflight.is_empty() {
                if *stop.borrow() {
                    break Ok(());
                }
                let unsaved = since_checkpoint > 0;
                tokio::select! {
                    _ = self.spool.appended() => {}
                    _ = stop.changed() => {}
                    _ = tokio::time::sleep(CHECKPOINT_IDLE), if unsaved => {
                        or_end!('session, self.save());
                        since_checkpoint = 0;
                    }
                }
                continue;
            }
            // A request the broker is slow to answer is noted (and saved)
            // while it waits, not only once answered: a writer killed now
            // leaves it queued there at least that long.
            let overdue = self.checkpoint.overdue_after();
            let waiting_since = last_done.max(*sent_at.front().expect("one per record in flight"));
            let next = tokio::select! {
                next = inflight.next() => next,
                _ = tokio::time::sleep_until((waiting_since + overdue).into()) => {
                    let waited = waiting_since.elapsed();
                    if self.checkpoint.record_delivery(waited) {
                        or_end!('session, self.save());
                        since_checkpoint = 0;
                    }
                    continue;
                }
            };
            let Some((outgoing, delivered, sent, done)) = next else {
                continue;
            };
            sent_at.pop_front();
            let fate = or_end!('session, delivered);
            or_end!('session, self.acknowledge(&producer, outgoing, fate).await);
            since_checkpoint += 1;
            // How long the broker took with this record's request:
            // from its send, or from the delivery before it when it
            // waited behind that one here (a burst queued locally
            // dies with a killed writer; only requests on the wire
            // land late). A slowdown is saved at once: a writer
            // killed now leaves requests queued about that long.
            let took = done.duration_since(sent.max(last_done));
            last_done = last_done.max(done);
            let slowing = self.checkpoint.record_delivery(took);
            if since_checkpoint >= CHECKPOINT_EVERY || slowing {
                or_end!('session, self.save());
                since_checkpoint = 0;
            }
        };
        if result.is_err() {
            // Nothing of this producer may land after the next session's
            // recovery scan. Every record handed to it gets a delivery report
            // (delivered, or refused by the broker: librdkafka retries
            // transport failures without end, `message.timeout.ms=0`), so once
            // all reports are in, nothing of ours is on the wire: settled by
            // fact, not by a wait. Stopping instead purges, as the process ends.
            while !*stop.borrow() {
                tokio::select! {
                    report = inflight.next() => if report.is_none() { break },
                    // The producer is gone without a close: nobody waits.
                    changed = stop.changed() => if changed.is_err() { break },
                }
            }
            let _ = tokio::task::spawn_blocking(move || producer.shut_down()).await;
        }
        if since_checkpoint > 0 {
            self.save()?;
        }
        result
    }

    /// The next spool record's delivery, `None` while the spool has no more:
    /// a stand-in in place of a record refused before; one the recovery found
    /// in the log is not sent again.
    async fn next_delivery(
        &mut self,
        producer: &DeliveringProducer,
        reader: &mut SpoolReader,
        already: &mut Arrived,
        refused_before: &mut HashMap<u64, String>,
    ) -> Result<Option<(Outgoing, Delivery)>, DrainError> {
        let Some(rec) = reader.next_record()? else {
            return Ok(None);
        };
        if !self.checkpoint.scan_from.contains_key(&rec.topic) {
            self.mark_scan_base(&rec.topic).await?;
        }
        let stood_in_for = refused_before
            .remove(&rec.seq)
            .and_then(|reason| stand_in(&rec, &reason));
        let (rec, stood_in) = match stood_in_for {
            Some(stand_in) => (stand_in, true),
            None => (rec, false),
        };
        let outgoing = Outgoing {
            seq: rec.seq,
            topic: rec.topic.clone(),
            stood_in,
        };
        let delivery: Delivery = match already.take(&rec) {
            Some((partition, offset)) => {
                Box::pin(std::future::ready(Ok(Fate::At(partition, offset))))
            }
            None => Box::pin(self.produce(producer, rec)?),
        };
        Ok(Some((outgoing, delivery)))
    }

    /// Acknowledges a record of known `fate`. One the broker refused for
    /// good is parked, and its stand-in goes in its place.
    async fn acknowledge(
        &mut self,
        producer: &DeliveringProducer,
        outgoing: Outgoing,
        fate: Fate,
    ) -> Result<(), DrainError> {
        let Outgoing {
            seq,
            topic,
            stood_in,
        } = outgoing;
        match fate {
            Fate::At(partition, offset) => self.delivered_at(topic, partition, offset),
            Fate::Refused(reason) if stood_in => refused_stand_in(seq, &reason),
            Fate::Refused(reason) => {
                let rec = self.spool.reader(seq).next_record()?;
                let rec =
                    rec.ok_or_else(|| DrainError::Other(format!("spool record {seq} vanished")))?;
                self.spool.park(&rec, &reason)?;
                // Its stand-in goes in its place, under its seq:
                // parked first, so a crash before the ack below
                // sends this same stand-in again, once.
                if let Some(stand_in) = stand_in(&rec, &reason) {
                    match self.produce(producer, stand_in)?.await? {
                        Fate::At(partition, offset) => {
                            self.delivered_at(topic, partition, offset);
                            metrics::counter!("forgelog_spool_stand_ins_total").increment(1);
                        }
                        Fate::Refused(reason) => refused_stand_in(seq, &reason),
                    }
                }
            }
        }
        self.checkpoint.acked_through = seq + 1;
        self.spool.delivered_through(seq + 1);
        metrics::counter!("forgelog_events_delivered_total").increment(1);
        Ok(())
    }

    /// Notes that a record is at `offset`: the recovery scan starts past it.
    fn delivered_at(&mut self, topic: String, partition: i32, offset: i64) {
        let from = self
            .checkpoint
            .scan_from
            .entry(topic)
            .or_default()
            .entry(partition)
            .or_insert(0);
        *from = (*from).max(offset + 1);
    }

    /// Saves the checkpoint (and frees acknowledged segments).
    fn save(&mut self) -> Result<(), SpoolError> {
        self.spool.acknowledge(&self.checkpoint)?;
        self.checkpoint.saved();
        Ok(())
    }

    fn produce(
        &self,
        producer: &DeliveringProducer,
        rec: SpoolRecord,
    ) -> Result<impl std::future::Future<Output = Delivered> + Send, DrainError> {
        let delivery = match producer.send(&rec.topic, &rec.key, &rec.value) {
            Ok(d) => d,
            Err(e) if refused_for_good(&e) => {
                return Ok(futures::future::Either::Left(std::future::ready(Ok(
                    Fate::Refused(format!("refused by the Kafka client: {e}")),
                ))))
            }
            Err(e) => return Err(e.into()),
        };
        Ok(futures::future::Either::Right(async move {
            match delivery.await {
                Some(Ok((partition, offset))) => Ok(Fate::At(partition, offset)),
                Some(Err(e)) if refused_for_good(&e) => {
                    Ok(Fate::Refused(format!("refused by the broker: {e}")))
                }
                Some(Err(e)) => Err(DrainError::Kafka(e)),
                None => Err(DrainError::Other("producer dropped the message".into())),
            }
        }))
    }
}
