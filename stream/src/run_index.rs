//! Where each run's records lie in each partition of the log, kept in the log
//! itself: the committed offsets of two consumer groups of the run's own,
//! which the broker stores durably beside the topics. No consumer joins such
//! a group; offsets are only committed to them.
//!
//! - `forgelog.run-index.RUN`: where the run starts. A read of the run from
//!   the start of a partition found the run's first record there, or none up
//!   to the partition's end then (so every later record of the run is past
//!   it).
//! - `forgelog.run-index-gaps.RUN`: a [`Gap`], where the run's records end as
//!   far as a complete read looked: none of them lies in `[end, checked)`.
//!   Runs written after this one fill that gap; a later read skips it and
//!   reads on from `checked`, where records the run gained since would be.
//!
//! Each offset is written only where it is a fact, and the log is
//! append-only, so it holds for ever, whoever writes it and in whatever
//! order: two readers racing write two true bounds (a gap is one committed
//! offset, so its two ends are never paired from two reads). A read of one
//! run then costs what the run holds, what came between its records, and
//! what arrived since the last read: not everything the log holds before
//! and after it.
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

/// The consumer group whose committed offsets are `run`'s [`Gap`]s.
pub fn gaps_group_of(run: &str) -> String {
    format!("forgelog.run-index-gaps.{run}")
}

/// Offsets of one partition past the run's last record that hold none of
/// its records: `[end, checked)`, as a complete read found them.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Gap {
    pub end: i64,
    pub checked: i64,
}

impl Gap {
    /// Bits of the packed offset that hold the gap's width (`checked - end`).
    const WIDTH_BITS: u32 = 31;
    const MAX_WIDTH: i64 = (1 << Self::WIDTH_BITS) - 1;
    /// `checked` must fit the rest of a non-negative i64.
    const MAX_CHECKED: i64 = (1 << (63 - Self::WIDTH_BITS)) - 1;

    /// The gap as one committed offset: `checked` above the width. A wider
    /// gap is narrowed from its start (a smaller gap is still a true one);
    /// past `MAX_CHECKED` (4 billion offsets in a partition) none is kept.
    pub fn pack(self) -> Option<i64> {
        if self.end < 0 || self.end > self.checked || self.checked > Self::MAX_CHECKED {
            return None;
        }
        let width = (self.checked - self.end).min(Self::MAX_WIDTH);
        Some(self.checked << Self::WIDTH_BITS | width)
    }

    pub fn unpack(packed: i64) -> Option<Gap> {
        if packed < 0 {
            return None;
        }
        let checked = packed >> Self::WIDTH_BITS;
        let end = checked - (packed & Self::MAX_WIDTH);
        Some(Gap { end, checked })
    }
}

/// The run index as one reader asks it: a client per group, made on first use.
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

    fn client(&self, group: String) -> Result<Arc<BaseConsumer>, ConsumeError> {
        let mut clients = self.clients.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(c) = clients.get(&group) {
            return Ok(c.clone());
        }
        let client: Arc<BaseConsumer> = Arc::new(self.config.consumer(&group).create()?);
        clients.insert(group, client.clone());
        Ok(client)
    }

    /// `group`'s committed offsets in `partitions` of `topic`, where it has one.
    fn committed(
        &self,
        group: String,
        topic: &str,
        partitions: &[i32],
    ) -> Result<BTreeMap<i32, i64>, ConsumeError> {
        let mut tpl = TopicPartitionList::new();
        for &p in partitions {
            tpl.add_partition(topic, p);
        }
        let committed = self.client(group)?.committed_offsets(tpl, self.timeout)?;
        Ok(committed
            .elements()
            .iter()
            .filter_map(|e| match e.offset() {
                Offset::Offset(at) => Some((e.partition(), at)),
                _ => None,
            })
            .collect())
    }

    fn commit(
        &self,
        group: String,
        topic: &str,
        offsets: impl IntoIterator<Item = (i32, i64)>,
    ) -> Result<(), ConsumeError> {
        let mut tpl = TopicPartitionList::new();
        for (p, at) in offsets {
            tpl.add_partition_offset(topic, p, Offset::Offset(at))?;
        }
        if tpl.count() > 0 {
            self.client(group)?.commit(&tpl, CommitMode::Sync)?;
        }
        Ok(())
    }

    /// What the index knows of `run` in `partitions` of `topic`: where it
    /// starts and the gap past its records (nothing when it cannot be asked:
    /// the read then scans).
    pub(crate) fn of(&self, topic: &str, partitions: &[i32], run: &str) -> Indexed {
        let known = self.starts(topic, partitions, run).and_then(|starts| {
            let gaps = self.gaps(topic, partitions, run)?;
            Ok(Indexed { starts, gaps })
        });
        known.unwrap_or_else(|e| {
            tracing::debug!(topic, run, "run index not read ({e}): scanning");
            Indexed::default()
        })
    }

    /// Where `run` starts in each of `partitions` of `topic`, where the
    /// index knows.
    fn starts(
        &self,
        topic: &str,
        partitions: &[i32],
        run: &str,
    ) -> Result<BTreeMap<i32, i64>, ConsumeError> {
        self.committed(group_of(run), topic, partitions)
    }

    /// Notes that `run` has no record of `topic` before these offsets.
    pub(crate) fn mark(
        &self,
        topic: &str,
        run: &str,
        starts: &BTreeMap<i32, i64>,
    ) -> Result<(), ConsumeError> {
        self.commit(group_of(run), topic, starts.iter().map(|(&p, &at)| (p, at)))
    }

    /// The gap past `run`'s records in each of `partitions` of `topic`,
    /// where the index knows one.
    fn gaps(
        &self,
        topic: &str,
        partitions: &[i32],
        run: &str,
    ) -> Result<BTreeMap<i32, Gap>, ConsumeError> {
        let packed = self.committed(gaps_group_of(run), topic, partitions)?;
        Ok(packed
            .into_iter()
            .filter_map(|(p, v)| Some((p, Gap::unpack(v)?)))
            .collect())
    }

    /// Notes that `run` has no record of `topic` in these gaps.
    pub(crate) fn mark_gaps(
        &self,
        topic: &str,
        run: &str,
        gaps: &BTreeMap<i32, Gap>,
    ) -> Result<(), ConsumeError> {
        let packed = gaps.iter().filter_map(|(&p, g)| Some((p, g.pack()?)));
        self.commit(gaps_group_of(run), topic, packed)
    }
}

/// What the run index said of one run in one topic's partitions.
#[derive(Default)]
pub(crate) struct Indexed {
    pub(crate) starts: BTreeMap<i32, i64>,
    pub(crate) gaps: BTreeMap<i32, Gap>,
}

impl Indexed {
    /// Where the run starts in `partition` and the gap past its records, as
    /// far as they are this log's: an index past the partition's end `hi`
    /// (another log's, or a topic made again) is read past, saying so.
    pub(crate) fn of(
        &self,
        topic: &str,
        partition: i32,
        hi: i64,
        run: &str,
    ) -> (Option<i64>, Option<Gap>) {
        let start = self.starts.get(&partition).copied();
        let gap = self.gaps.get(&partition).copied();
        let past_end = start.is_some_and(|at| at > hi) || gap.is_some_and(|g| g.checked > hi);
        if past_end {
            tracing::warn!(
                topic,
                partition,
                run,
                "the run index ({start:?}, {gap:?}) lies past the partition's end ({hi}): \
                 it is not this log's; scanning"
            );
            return (None, None);
        }
        (start, gap)
    }
}

#[cfg(test)]
mod tests {
    use super::Gap;
    use proptest::prelude::*;

    #[test]
    fn a_gap_packs_into_one_offset_and_back() {
        let g = Gap {
            end: 17,
            checked: 1_000_000,
        };
        assert_eq!(Gap::unpack(g.pack().unwrap()), Some(g));
        let empty = Gap { end: 0, checked: 0 };
        assert_eq!(Gap::unpack(empty.pack().unwrap()), Some(empty));
        // Not a gap, or too far into a partition to keep.
        assert_eq!(Gap { end: 5, checked: 4 }.pack(), None);
        assert_eq!(
            Gap {
                end: -1,
                checked: 4
            }
            .pack(),
            None
        );
        assert_eq!(
            Gap {
                end: 0,
                checked: 1 << 33
            }
            .pack(),
            None
        );
        assert_eq!(Gap::unpack(-1), None);
    }

    proptest! {
        /// What comes back is a gap inside the one packed: never wider, so
        /// never skipping a record the read did not rule out; exact where it
        /// fits.
        #[test]
        fn an_unpacked_gap_lies_inside_the_packed_one(end in 0i64..1 << 32, width in 0i64..1 << 34) {
            let g = Gap { end, checked: end + width };
            match g.pack() {
                None => prop_assert!(g.checked > Gap::MAX_CHECKED),
                Some(v) => {
                    prop_assert!(v >= 0);
                    let back = Gap::unpack(v).unwrap();
                    prop_assert_eq!(back.checked, g.checked);
                    prop_assert!(back.end >= g.end && back.end <= back.checked);
                    if width <= Gap::MAX_WIDTH {
                        prop_assert_eq!(back, g);
                    }
                }
            }
        }
    }
}
