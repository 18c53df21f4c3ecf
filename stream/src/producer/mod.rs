//! The typed, spool-backed producer.
//!
//! `send` encodes the event and appends it to the spool: no network, no await.
//! A drainer task reads the spool in order and produces to Kafka with an
//! idempotent producer, a bounded window of messages in flight. After any
//! failure, or a restart after `kill -9`, the drainer waits out a grace for
//! the requests the writer before it left queued at the broker (longer when
//! that writer saw the broker slow), then reads the
//! topics' tails past its checkpoint and matches them, byte for byte (by
//! digest), against its unacknowledged records: those already there are not
//! sent again. Nothing lost, nothing twice. Events carry deterministic ids, so
//! two identical messages are the same event by definition.
//!
//! Messages carry no headers: tansu 0.6 looks headers up with a full scan of
//! its header table for every record fetched, which makes reads quadratic.

use crate::claims::ClaimStore;
use crate::spool::{Spool, SpoolError, SpoolOptions};
use crate::{StreamConfig, MAX_EVENT_BYTES};
use drainer::Drainer;
use forgelog_schemas::{Codec, EncodeError, Event};
use std::path::PathBuf;
use std::sync::Arc;
use std::time::{Duration, Instant};
use tokio::sync::watch;

mod delivering;
mod drainer;

#[derive(Debug, thiserror::Error)]
pub enum SendError {
    #[error(transparent)]
    Encode(#[from] EncodeError),
    #[error(transparent)]
    Spool(#[from] SpoolError),
    #[error("a {kind} event of {bytes} bytes could not be kept as a claim check: {source}")]
    Claim {
        kind: &'static str,
        bytes: usize,
        source: crate::store::StoreError,
    },
    #[error("a {kind} event of {bytes} bytes is over the log's {max}-byte limit: not recorded")]
    TooLarge {
        kind: &'static str,
        bytes: usize,
        max: usize,
    },
}

impl SendError {
    /// `event` as the log's record, if it fits the largest event the clients
    /// take (a larger one would be refused after the caller was told it is
    /// recorded): encoded, and with `claims`, a claim for it when it is over
    /// the largest record the broker serves.
    pub(crate) fn encode_for_log(
        event: &Event,
        claims: Option<&ClaimStore>,
    ) -> Result<Vec<u8>, SendError> {
        let value = Codec::global().encode(event)?;
        let bytes = value.len() + event.key().len();
        let kind = event.kind().name();
        if bytes > MAX_EVENT_BYTES {
            metrics::counter!("forgelog_events_too_large_total").increment(1);
            return Err(SendError::TooLarge {
                kind,
                bytes,
                max: MAX_EVENT_BYTES,
            });
        }
        match claims {
            Some(claims) => claims
                .record(event, value)
                .map_err(|source| SendError::Claim {
                    kind,
                    bytes,
                    source,
                }),
            None => Ok(value),
        }
    }
}

#[derive(Debug, thiserror::Error)]
#[error("{pending} events still in the spool after {waited:?}: the broker at {brokers} is not taking them")]
pub struct FlushTimeout {
    pub pending: u64,
    pub waited: Duration,
    pub brokers: String,
}

/// Sends events to their topics through the local spool.
pub struct EventProducer {
    spool: Arc<Spool>,
    claims: ClaimStore,
    brokers: String,
    stop: watch::Sender<bool>,
    /// Taken by the first [`EventProducer::close`].
    drainer: std::sync::Mutex<Option<tokio::task::JoinHandle<()>>>,
}

impl EventProducer {
    /// Opens the spool in `spool_dir` and starts draining it (including anything
    /// a previous process left there). Must be called inside a tokio runtime.
    pub fn start(
        config: &StreamConfig,
        spool_dir: impl Into<PathBuf>,
        options: SpoolOptions,
    ) -> Result<Self, SpoolError> {
        let claims = ClaimStore::open(&config.claims)?;
        let spool = Arc::new(Spool::open(spool_dir, options)?);
        let (stop, stop_rx) = watch::channel(false);
        let drainer = Drainer::new(config, spool.clone())?;
        let drainer = tokio::spawn(drainer.run(stop_rx));
        Ok(EventProducer {
            spool,
            claims,
            brokers: config.brokers.clone(),
            stop,
            drainer: std::sync::Mutex::new(Some(drainer)),
        })
    }

    /// Encodes `event` and appends it to the spool; returns its spool seq.
    /// Never waits for the broker.
    pub fn send(&self, event: &Event) -> Result<u64, SendError> {
        let value = SendError::encode_for_log(event, Some(&self.claims))?;
        let seq = self
            .spool
            .append(event.topic().name(), event.key().as_bytes(), &value)?;
        metrics::counter!("forgelog_events_sent_total", "topic" => event.topic().name())
            .increment(1);
        Ok(seq)
    }

    /// Where events too large for a record go.
    pub fn claims(&self) -> &ClaimStore {
        &self.claims
    }

    pub fn spool(&self) -> &Spool {
        &self.spool
    }

    /// Waits until everything sent so far is acknowledged by the broker.
    pub async fn flush(&self, timeout: Duration) -> Result<(), FlushTimeout> {
        let target = self.spool.next_seq();
        let start = Instant::now();
        loop {
            let waiting = self.spool.drained();
            if self.spool.acked() >= target {
                return Ok(());
            }
            let left = timeout.saturating_sub(start.elapsed());
            if left.is_zero() {
                return Err(FlushTimeout {
                    pending: target - self.spool.acked(),
                    waited: timeout,
                    brokers: self.brokers.clone(),
                });
            }
            let _ = tokio::time::timeout(left.min(Duration::from_millis(200)), waiting).await;
        }
    }

    /// Flushes (up to `timeout`), then stops the drainer, which saves what
    /// the broker acknowledged. What is not acknowledged, or sent after
    /// this, stays in the spool for the next start. Shared, because a task
    /// that outlives a shutdown (a call hung upstream) may still hold the
    /// producer: the spool must say what was delivered all the same.
    pub async fn close(&self, timeout: Duration) -> Result<(), FlushTimeout> {
        let flushed = self.flush(timeout).await;
        let _ = self.stop.send(true);
        let drainer = self
            .drainer
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .take();
        if let Some(drainer) = drainer {
            let _ = drainer.await;
        }
        flushed
    }
}
