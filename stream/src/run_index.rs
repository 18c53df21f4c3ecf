//! Where each run starts in each partition of the log, kept in the log itself:
//! the committed offsets of a consumer group of the run's own
//! (`forgelog.run-index.RUN`), which the broker stores durably beside the
//! topics. No consumer joins such a group; offsets are only committed to it.
//!
//! An offset is written only where it is a fact: a read of the run from the
//! start of a partition found the run's first record there, or found none up
//! to the partition's end then (so every later record of the run is past
//! it). The log is append-only, so such a lower bound holds for ever, whoever
//! writes it and in whatever order: two readers racing write two true bounds.
//! A reader of one run then starts each partition there instead of at
//! offset 0, and reads a run in time that grows with the run and with what
//! came after it, not with everything the log held before it.
//!
//! Kafka forgets the offsets of a group nobody consumes with after
//! `offsets.retention.minutes` (7 days by default); the index is then
//! written again by the next read, which scans.

use crate::{ConsumeError, StreamConfig};
use rdkafka::consumer::{BaseConsumer, CommitMode, Consumer};
use rdkafka::{Offset, TopicPartitionList};
use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

/// The consumer group whose committed offsets say where `run` starts.
pub fn group_of(run: &str) -> String {
    format!("forgelog.run-index.{run}")
}

/// The run index as one reader asks it: a client per run, made on first use.
pub(crate) struct RunIndex {
    config: StreamConfig,
    timeout: Duration,
    clients: Mutex<BTreeMap<String, Arc<BaseConsumer>>>,
}

impl RunIndex {
    pub(crate) fn new(config: &StreamConfig, timeout: Duration) -> RunIndex {
        RunIndex {
            config: config.clone(),
            timeout,
            clients: Mutex::default(),
        }
    }

    fn client(&self, run: &str) -> Result<Arc<BaseConsumer>, ConsumeError> {
        let mut clients = self.clients.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(c) = clients.get(run) {
            return Ok(c.clone());
        }
        let client: BaseConsumer = self.config.consumer(&group_of(run)).create()?;
        let client = Arc::new(client);
        clients.insert(run.to_string(), client.clone());
        Ok(client)
    }

    /// Where `run` starts in each of `partitions` of `topic`, where the
    /// index knows.
    pub(crate) fn starts(
        &self,
        topic: &str,
        partitions: &[i32],
        run: &str,
    ) -> Result<BTreeMap<i32, i64>, ConsumeError> {
        let mut tpl = TopicPartitionList::new();
        for &p in partitions {
            tpl.add_partition(topic, p);
        }
        let committed = self.client(run)?.committed_offsets(tpl, self.timeout)?;
        Ok(committed
            .elements()
            .iter()
            .filter_map(|e| match e.offset() {
                Offset::Offset(at) => Some((e.partition(), at)),
                _ => None,
            })
            .collect())
    }

    /// Notes that `run` has no record of `topic` before these offsets.
    pub(crate) fn mark(
        &self,
        topic: &str,
        run: &str,
        starts: &BTreeMap<i32, i64>,
    ) -> Result<(), ConsumeError> {
        let mut tpl = TopicPartitionList::new();
        for (&p, &at) in starts {
            tpl.add_partition_offset(topic, p, Offset::Offset(at))?;
        }
        self.client(run)?.commit(&tpl, CommitMode::Sync)?;
        Ok(())
    }
}
