//! Recovery: where each topic's partitions ended before our first record
//! to it, and which unacknowledged records reached the log past there.

use super::{DrainError, Drainer};
use crate::spool::SpoolRecord;
use crate::ReplayReader;
use sha2::{Digest, Sha256};
use std::collections::HashMap;

impl Drainer {
    /// Before the first message to `topic`, remember where its partitions end:
    /// nothing of ours can be before that.
    pub(super) async fn mark_scan_base(&mut self, topic: &str) -> Result<(), DrainError> {
        let (config, topic) = (self.stream.clone(), topic.to_string());
        let ends = tokio::task::spawn_blocking(move || -> Result<_, DrainError> {
            let reader = ReplayReader::new(&config)?;
            let partitions = reader.partitions(&topic).map_err(|e| {
                DrainError::Other(format!(
                    "{e} (create the topics first: forgelog topics create)"
                ))
            })?;
            let mut ends = std::collections::BTreeMap::new();
            for p in partitions {
                ends.insert(p, reader.end(&topic, p)?);
            }
            Ok((topic, ends))
        })
        .await
        .map_err(|e| DrainError::Other(e.to_string()))??;
        self.checkpoint.scan_from.insert(ends.0, ends.1);
        self.checkpoint.store(self.spool.dir())?;
        Ok(())
    }

    /// The messages past each partition's scan base: among them are any of our
    /// unacknowledged records that did reach the broker.
    pub(super) async fn recover(&mut self) -> Result<Arrived, DrainError> {
        if self.spool.next_seq() <= self.checkpoint.acked_through
            || self.checkpoint.scan_from.is_empty()
        {
            return Ok(Arrived::default());
        }
        // The writer before (a killed process, or this one's producer before
        // a failure) may have produce requests still queued at the broker:
        // read the tails before they land and they would be sent twice.
        let grace = self
            .checkpoint
            .recovery_grace(self.spool.options().recovery_grace);
        tracing::info!(
            ?grace,
            slowest_delivery_ms = self.checkpoint.slowest_delivery_ms,
            pending = self.spool.pending(),
            "spool recovery: waiting for a dead writer's requests to land"
        );
        tokio::time::sleep(grace).await;
        let scan_from = self.checkpoint.scan_from.clone();
        let config = self.stream.clone();
        let arrived = tokio::task::spawn_blocking(move || -> Result<_, DrainError> {
            let reader = ReplayReader::new(&config)?;
            let mut arrived = Arrived::default();
            for (topic, parts) in &scan_from {
                for (&partition, &from) in parts {
                    let hi = reader.end(topic, partition)?;
                    let _ = reader.for_each_in(topic, partition, from, hi, |rec| {
                        let digest = Arrived::digest(topic, &rec.key, &rec.value);
                        arrived
                            .at
                            .entry(digest)
                            .or_default()
                            .push_back((partition, rec.offset));
                        std::ops::ControlFlow::Continue(())
                    })?;
                }
            }
            Ok(arrived)
        })
        .await
        .map_err(|e| DrainError::Other(e.to_string()))??;
        if !arrived.at.is_empty() {
            tracing::info!(
                messages = arrived.at.len(),
                "spool recovery: scanned the topics' tails for records already delivered"
            );
        }
        Ok(arrived)
    }
}

/// Messages found past the scan bases, by digest of (topic, key, value); each
/// can stand for one spool record only.
#[derive(Default)]
pub(super) struct Arrived {
    at: HashMap<[u8; 32], std::collections::VecDeque<(i32, i64)>>,
}

impl Arrived {
    fn digest(topic: &str, key: &[u8], value: &[u8]) -> [u8; 32] {
        let mut h = Sha256::new();
        for part in [topic.as_bytes(), key, value] {
            h.update((part.len() as u64).to_le_bytes());
            h.update(part);
        }
        h.finalize().into()
    }

    /// Where `rec` already is in the log, if it is (consuming that message).
    pub(super) fn take(&mut self, rec: &SpoolRecord) -> Option<(i32, i64)> {
        if self.at.is_empty() {
            return None;
        }
        self.at
            .get_mut(&Self::digest(&rec.topic, &rec.key, &rec.value))?
            .pop_front()
    }
}
