//! The log as two small traits, so the shells around the pure cores run on
//! Kafka in production and on [`MemoryLog`] in the fast test tier (no broker,
//! no network: the same shell code, in milliseconds).

use crate::{ConsumeError, EventProducer, FlushTimeout, ReplayReader, SendError};
use forgelog_schemas::{Codec, Event, PolicyPublished, Received, Topic};
use futures::future::BoxFuture;
use std::collections::BTreeMap;
use std::ops::ControlFlow;
use std::sync::Mutex;
use std::time::Duration;

/// Where a shell writes its events (a trait object: the proxy holds one).
pub trait EventSink: Send + Sync {
    /// Takes `event` (never waiting for the log).
    fn send(&self, event: &Event) -> Result<(), SendError>;
    /// Waits until everything sent is in the log, for up to `timeout`.
    fn flush(&self, timeout: Duration) -> BoxFuture<'_, Result<(), FlushTimeout>>;
    /// Whether `records` more, each as large as the log holds inline, can be
    /// taken now (a spool's cap and its disk): what starts something whose
    /// end must be recorded asks first.
    fn has_room_for(&self, records: u64) -> bool {
        let _ = records;
        true
    }
}

/// Bounded reads of what the log holds now, partition by partition.
pub trait LogReader {
    /// Partition ids of `topic`, ascending.
    fn partitions(&self, topic: &str) -> Result<Vec<i32>, ConsumeError>;
    /// The offset the next message of a partition will get.
    fn end(&self, topic: &str, partition: i32) -> Result<i64, ConsumeError>;
    /// Calls `f` with the messages of one partition in `[from, to)`, in offset
    /// order, until `f` breaks (which this returns).
    fn for_each_in(
        &self,
        topic: &str,
        partition: i32,
        from: i64,
        to: i64,
        f: impl FnMut(Received) -> ControlFlow<()>,
    ) -> Result<ControlFlow<()>, ConsumeError>;

    /// Calls `f` with run `run`'s messages of `topic` (and any that do not
    /// decode: whose they are nobody can say), partition by partition in
    /// offset order, until `f` breaks: the one way every per-run command
    /// reads a run, from the log (which starts where the run index says the
    /// run starts) or a bundle.
    fn for_each_of_run(
        &self,
        topic: &str,
        run: &str,
        mut f: impl FnMut(Received) -> ControlFlow<()>,
    ) -> Result<(), ConsumeError> {
        for partition in self.partitions(topic)? {
            let end = self.end(topic, partition)?;
            let flow = self.for_each_in(topic, partition, 0, end, |r| {
                if r.in_run(Some(run)) {
                    f(r)
                } else {
                    ControlFlow::Continue(())
                }
            })?;
            if flow.is_break() {
                break;
            }
        }
        Ok(())
    }

    /// [`LogReader::for_each_of_run`], collected.
    fn read_run(&self, topic: &str, run: &str) -> Result<Vec<Received>, ConsumeError> {
        let mut out = Vec::new();
        self.for_each_of_run(topic, run, |r| {
            out.push(r);
            ControlFlow::Continue(())
        })?;
        Ok(out)
    }

    /// Run `run`'s events of `topics`, topic by topic, each in log order
    /// (what does not decode is left out: the consumers dead-letter it).
    fn run_events(&self, run: &str, topics: &[Topic]) -> Result<Vec<Event>, ConsumeError> {
        let mut events = Vec::new();
        for topic in topics {
            let read = self.read_run(topic.name(), run)?;
            events.extend(read.into_iter().filter_map(|r| r.event.ok()));
        }
        Ok(events)
    }
}

/// The newest `PolicyPublished` on `forgelog.policy` (of `run`, when given;
/// the first read of a version published twice): where a restarted trainer
/// resumes, and the one policy a restarted engine loads (not every version
/// before it).
pub fn newest_policy(
    log: &impl LogReader,
    run: Option<&str>,
) -> Result<Option<PolicyPublished>, ConsumeError> {
    let published = published_policies(log, run)?;
    Ok(policy_version(&published, None).cloned())
}

/// Of `published` (in the order read), version `version`, or the newest
/// when `None`; of a version published twice, the first read, wherever a
/// version is looked up (a trainer resuming, an engine loading, an export).
pub fn policy_version(
    published: &[PolicyPublished],
    version: Option<i64>,
) -> Option<&PolicyPublished> {
    let version = version.or_else(|| published.iter().map(|p| p.version).max())?;
    published.iter().find(|p| p.version == version)
}

/// Every `PolicyPublished` on `forgelog.policy` (of `run`, when given), in
/// the order read: partition by partition, each in log order.
pub fn published_policies(
    log: &impl LogReader,
    run: Option<&str>,
) -> Result<Vec<PolicyPublished>, ConsumeError> {
    let topic = Topic::Policy.name();
    let mut published = Vec::new();
    for partition in log.partitions(topic)? {
        let end = log.end(topic, partition)?;
        let _ = log.for_each_in(topic, partition, 0, end, |rec| {
            if let Ok(Event::PolicyPublished(p)) = rec.event {
                if run.is_none_or(|r| r == p.run_id) {
                    published.push(p);
                }
            }
            ControlFlow::Continue(())
        })?;
    }
    Ok(published)
}

impl EventSink for EventProducer {
    fn send(&self, event: &Event) -> Result<(), SendError> {
        EventProducer::send(self, event).map(|_| ())
    }

    fn flush(&self, timeout: Duration) -> BoxFuture<'_, Result<(), FlushTimeout>> {
        Box::pin(EventProducer::flush(self, timeout))
    }

    fn has_room_for(&self, records: u64) -> bool {
        // A record's key, topic and framing besides its value.
        const FRAMING: u64 = 1 << 10;
        let largest = self.claims().max_record_bytes() as u64 + FRAMING;
        self.spool().has_room(records.saturating_mul(largest))
    }
}

impl LogReader for ReplayReader {
    fn partitions(&self, topic: &str) -> Result<Vec<i32>, ConsumeError> {
        ReplayReader::partitions(self, topic)
    }

    fn end(&self, topic: &str, partition: i32) -> Result<i64, ConsumeError> {
        ReplayReader::end(self, topic, partition)
    }

    fn for_each_in(
        &self,
        topic: &str,
        partition: i32,
        from: i64,
        to: i64,
        f: impl FnMut(Received) -> ControlFlow<()>,
    ) -> Result<ControlFlow<()>, ConsumeError> {
        ReplayReader::for_each_in(self, topic, partition, from, to, f)
    }

    /// Other runs' messages are skipped by their first bytes, undecoded; the
    /// read starts where the run index says the run starts, and writes the
    /// index where it had to scan.
    fn for_each_of_run(
        &self,
        topic: &str,
        run: &str,
        f: impl FnMut(Received) -> ControlFlow<()>,
    ) -> Result<(), ConsumeError> {
        self.for_each(topic, crate::StartAt::Beginning, Some(run), f)
    }
}

/// The log in memory: every forgelog topic with `partitions` partitions,
/// messages keyed and partitioned as the Kafka producer does (murmur2 of the
/// key), appended at once. For tests of the shells; nothing survives the process.
#[derive(Debug)]
pub struct MemoryLog {
    partitions: usize,
    topics: Mutex<BTreeMap<String, Vec<Partition>>>,
}

/// One partition's messages, (key, value) by offset.
type Partition = Vec<(Vec<u8>, Vec<u8>)>;

impl Default for MemoryLog {
    fn default() -> MemoryLog {
        MemoryLog::new(3)
    }
}

impl MemoryLog {
    pub fn new(partitions: usize) -> MemoryLog {
        MemoryLog {
            partitions: partitions.max(1),
            topics: Mutex::default(),
        }
    }

    /// The topics (a panic while holding them leaves them whole: every change
    /// is one push).
    fn lock(&self) -> std::sync::MutexGuard<'_, BTreeMap<String, Vec<Partition>>> {
        self.topics.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Appends `event` to its topic; returns (partition, offset).
    pub fn append(&self, event: &Event) -> Result<(i32, i64), SendError> {
        let value = SendError::encode_for_log(event, None)?;
        Ok(self.append_raw(event.topic().name(), event.key().as_bytes(), &value))
    }

    /// Appends a message as any producer could: not necessarily an event.
    pub fn append_raw(&self, topic: &str, key: &[u8], value: &[u8]) -> (i32, i64) {
        let partition = (kafka_murmur2(key) & 0x7fff_ffff) as usize % self.partitions;
        let mut topics = self.lock();
        let topic = topics
            .entry(topic.to_string())
            .or_insert_with(|| vec![Vec::new(); self.partitions]);
        topic[partition].push((key.to_vec(), value.to_vec()));
        (partition as i32, topic[partition].len() as i64 - 1)
    }

    /// Every event of `topic`, in partition then offset order.
    pub fn events(&self, topic: &str) -> Vec<Event> {
        let topics = self.lock();
        topics
            .get(topic)
            .into_iter()
            .flatten()
            .flatten()
            .map(|(_, v)| Codec::global().decode(v).expect("appended by this log"))
            .collect()
    }
}

impl EventSink for MemoryLog {
    fn send(&self, event: &Event) -> Result<(), SendError> {
        self.append(event).map(|_| ())
    }

    fn flush(&self, _: Duration) -> BoxFuture<'_, Result<(), FlushTimeout>> {
        Box::pin(std::future::ready(Ok(())))
    }
}

impl LogReader for MemoryLog {
    fn partitions(&self, _topic: &str) -> Result<Vec<i32>, ConsumeError> {
        Ok((0..self.partitions as i32).collect())
    }

    fn end(&self, topic: &str, partition: i32) -> Result<i64, ConsumeError> {
        let topics = self.lock();
        Ok(topics
            .get(topic)
            .map_or(0, |t| t[partition as usize].len() as i64))
    }

    fn for_each_in(
        &self,
        topic: &str,
        partition: i32,
        from: i64,
        to: i64,
        mut f: impl FnMut(Received) -> ControlFlow<()>,
    ) -> Result<ControlFlow<()>, ConsumeError> {
        // Copied out first: `f` may append to the log (a shell sending outputs).
        let messages: Partition = {
            let topics = self.lock();
            let all = topics
                .get(topic)
                .map(|t| &t[partition as usize][..])
                .unwrap_or(&[]);
            let (from, to) = (from.max(0) as usize, (to.max(0) as usize).min(all.len()));
            all.get(from..to).unwrap_or(&[]).to_vec()
        };
        for (i, (key, value)) in messages.into_iter().enumerate() {
            let offset = from.max(0) + i as i64;
            if f(crate::claims::receive(
                topic, partition, offset, &key, &value,
            ))
            .is_break()
            {
                return Ok(ControlFlow::Break(()));
            }
        }
        Ok(ControlFlow::Continue(()))
    }
}

/// Kafka's default partitioner hash (MurmurHash2, seed 0x9747b28c), as the
/// Java client and librdkafka's `murmur2_random` compute it.
fn kafka_murmur2(data: &[u8]) -> u32 {
    const M: u32 = 0x5bd1_e995;
    const R: u32 = 24;
    let mut h: u32 = 0x9747_b28c ^ data.len() as u32;
    let mut chunks = data.chunks_exact(4);
    for c in &mut chunks {
        let mut k = u32::from_le_bytes([c[0], c[1], c[2], c[3]]);
        k = k.wrapping_mul(M);
        k ^= k >> R;
        k = k.wrapping_mul(M);
        h = h.wrapping_mul(M);
        h ^= k;
    }
    let tail = chunks.remainder();
    if tail.len() >= 3 {
        h ^= (tail[2] as u32) << 16;
    }
    if tail.len() >= 2 {
        h ^= (tail[1] as u32) << 8;
    }
    if !tail.is_empty() {
        h ^= tail[0] as u32;
        h = h.wrapping_mul(M);
    }
    h ^= h >> 13;
    h = h.wrapping_mul(M);
    h ^= h >> 15;
    h
}

#[cfg(test)]
mod tests {
    use super::*;
    use forgelog_schemas::testing::call_finished;

    #[test]
    fn murmur2_matches_kafkas_partitioner() {
        // Values of Kafka's own Utils.murmur2 (every tail length).
        for (key, hash) in [
            ("1", -1993445489),
            ("12", 126087238),
            ("123", -267702483),
            ("1234", -1614185708),
            ("12345", -1188365604),
        ] {
            assert_eq!(kafka_murmur2(key.as_bytes()) as i32, hash, "{key}");
        }
    }

    #[test]
    fn a_session_stays_in_one_partition_in_order_and_reads_are_bounded() {
        let log = MemoryLog::default();
        for i in 0..6 {
            log.append(&call_finished("r", &format!("s{}", i % 2), i, 4, 2).into())
                .unwrap();
        }
        let topic = "forgelog.calls";
        let mut seen = Vec::new();
        for p in log.partitions(topic).unwrap() {
            let end = log.end(topic, p).unwrap();
            let flow = log.for_each_in(topic, p, 0, end, |r| {
                let Ok(Event::CallFinished(c)) = r.event else {
                    panic!("a call")
                };
                seen.push((c.session_id, c.call_index, r.partition, r.offset));
                ControlFlow::Continue(())
            });
            assert!(flow.unwrap().is_continue());
        }
        assert_eq!(seen.len(), 6);
        for s in ["s0", "s1"] {
            let mine: Vec<_> = seen.iter().filter(|x| x.0 == s).collect();
            assert!(
                mine.windows(2).all(|w| w[0].1 < w[1].1 && w[0].2 == w[1].2),
                "{mine:?}"
            );
        }
        assert_eq!(log.events(topic).len(), 6);
        let p = seen[0].2;
        let mut firsts = 0;
        let flow = log.for_each_in(topic, p, 1, 100, |_| {
            firsts += 1;
            ControlFlow::Break(())
        });
        assert!(flow.unwrap().is_break());
        assert_eq!(firsts, 1);
    }

    #[test]
    fn the_newest_policy_is_the_first_read_of_the_highest_version() {
        let log = MemoryLog::new(1);
        let published = |run: &str, version: i64, uri: &str| {
            let p = forgelog_schemas::PolicyPublished {
                run_id: run.into(),
                event_id: format!("{run}-{version}-{uri}"),
                version,
                step: version,
                checkpoint_uri: uri.into(),
                metrics: Default::default(),
            };
            log.append(&Event::PolicyPublished(p)).unwrap();
        };
        published("a", 1, "a1");
        published("b", 9, "b9");
        published("a", 3, "first");
        published("a", 2, "a2");
        published("a", 3, "again");
        let versions: Vec<i64> = published_policies(&log, Some("a"))
            .unwrap()
            .iter()
            .map(|p| p.version)
            .collect();
        assert_eq!(versions, [1, 3, 2, 3]);
        let newest = newest_policy(&log, Some("a")).unwrap().unwrap();
        assert_eq!(
            (newest.version, newest.checkpoint_uri.as_str()),
            (3, "first")
        );
        assert_eq!(newest_policy(&log, None).unwrap().unwrap().version, 9);
        assert!(newest_policy(&log, Some("c")).unwrap().is_none());
        // A version asked for by number is the same first read.
        let of_a = published_policies(&log, Some("a")).unwrap();
        let asked = |v| policy_version(&of_a, v).map(|p| p.checkpoint_uri.as_str());
        assert_eq!(asked(Some(3)), Some("first"));
        assert_eq!(asked(None), Some("first"));
        assert_eq!(asked(Some(2)), Some("a2"));
        assert_eq!(asked(Some(4)), None);
        assert_eq!(policy_version(&[], None), None);
    }
}
