//! The fast tier: the shell on a [`MemoryLog`], no broker.
use super::*;
use crate::rebuild::rebuild;
use crate::{RewardConfig, RewardJoin, TrajectoryBuilder};
use forgelog_schemas::{testing::recorded_run, Received, Topic};
use forgelog_stream::{ConsumeError, LogReader, MemoryLog};
use std::collections::BTreeMap;
use std::ops::ControlFlow;
use std::path::{Path, PathBuf};

const GROUPS: usize = 6;

/// A shell that stops once it has read everything, at once.
fn batch(state_dir: impl Into<PathBuf>) -> ShellOptions {
    ShellOptions {
        exit_when_idle: true,
        idle_wait: Duration::ZERO,
        ..ShellOptions::new(state_dir)
    }
}

fn consume(log: &MemoryLog, state: &Path) -> (RunStats, RunStats) {
    let options = |name: &str| ShellOptions {
        checkpoint_every: 7,
        ..batch(state.join(name))
    };
    let trees = run_on(
        log,
        log,
        TrajectoryBuilder::default(),
        &options("trajectories"),
    );
    let groups = run_on(
        log,
        log,
        RewardJoin::new(RewardConfig::default()),
        &options("rewards"),
    );
    (trees.unwrap(), groups.unwrap())
}

fn ids(events: &[Event]) -> Vec<String> {
    let mut ids: Vec<String> = events.iter().map(|e| e.event_id().to_string()).collect();
    ids.sort();
    ids
}

#[test]
fn on_a_memory_log_the_shells_emit_what_the_cores_derive_once_across_restarts() {
    let rt = tokio::runtime::Runtime::new().unwrap();
    let _context = rt.enter();
    let inputs = recorded_run("mem", GROUPS, 4, 3, 16);
    let log = MemoryLog::default();
    let state = tempfile::tempdir().unwrap();
    // Half the inputs, consumed; the checkpoint kept as a crash would leave it.
    let half = inputs.len() / 2;
    for e in &inputs[..half] {
        log.append(e).unwrap();
    }
    // What no forgelog producer writes: set aside, once, with the reason.
    log.append_raw(Topic::Calls.name(), b"s-x", b"garbage");
    consume(&log, state.path());
    let stale = state.path().join("stale");
    std::fs::create_dir_all(&stale).unwrap();
    for name in ["trajectories", "rewards"] {
        std::fs::copy(
            state.path().join(name).join("state.json"),
            stale.join(format!("{name}.json")),
        )
        .unwrap();
    }
    for e in &inputs[half..] {
        log.append(e).unwrap();
    }
    log.append_raw(
        Topic::Rewards.name(),
        b"r-x",
        &[0xC3, 0x01, 1, 2, 3, 4, 5, 6, 7, 8],
    );
    let (trees, _) = consume(&log, state.path());
    assert!(trees.emitted > 0);

    let mut by_topic = BTreeMap::new();
    for e in &inputs {
        by_topic
            .entry(e.topic())
            .or_insert_with(Vec::new)
            .push(e.clone());
    }
    let expected = rebuild(&by_topic, RewardConfig::default());
    let trajectories = log.events(Topic::Trajectories.name());
    let batches = log.events(Topic::Batches.name());
    assert_eq!((trajectories.len(), batches.len()), (GROUPS * 4, GROUPS));
    assert_eq!(ids(&trajectories), ids(&expected.trajectories));
    assert_eq!(ids(&batches), ids(&expected.batches));

    // A restart from where it was: nothing new. From the stale checkpoint
    // (a crash after its outputs were sent): all re-derived, none sent again.
    assert_eq!(consume(&log, state.path()).0.emitted, 0);
    for name in ["trajectories", "rewards"] {
        std::fs::copy(
            stale.join(format!("{name}.json")),
            state.path().join(name).join("state.json"),
        )
        .unwrap();
        // The crash came right after that snapshot: no progress since.
        std::fs::remove_file(state.path().join(name).join("progress.json")).unwrap();
    }
    let (trees, groups) = consume(&log, state.path());
    assert_eq!((trees.emitted, groups.emitted), (0, 0));
    assert!(trees.skipped > 0, "{trees:?}");
    assert_eq!(log.events(Topic::Trajectories.name()).len(), GROUPS * 4);
    assert_eq!(log.events(Topic::Batches.name()).len(), GROUPS);
    let mut dead: Vec<(String, String, Vec<u8>)> = log
        .events(Topic::DeadLetters.name())
        .into_iter()
        .map(|e| match e {
            Event::DeadLetter(d) => (d.consumer, d.topic, d.value),
            other => panic!("{other:?}"),
        })
        .collect();
    dead.sort();
    assert_eq!(
        dead,
        [
            (
                "rewards".into(),
                Topic::Rewards.name().into(),
                vec![0xC3, 0x01, 1, 2, 3, 4, 5, 6, 7, 8]
            ),
            (
                "trajectories".into(),
                Topic::Calls.name().into(),
                b"garbage".to_vec()
            ),
        ],
        "each set aside once, across the restarts"
    );
}

/// A process that serves one run (`up`, `run`) derives that run only: two of
/// them on one log each send their own run's trees and groups, not the
/// other's too (each would send what the other sends: every output twice).
#[test]
fn a_shell_for_one_run_derives_that_run_and_leaves_the_others() {
    let rt = tokio::runtime::Runtime::new().unwrap();
    let _context = rt.enter();
    let (a, b) = (recorded_run("a", 2, 4, 3, 8), recorded_run("b", 3, 4, 3, 8));
    let log = MemoryLog::default();
    for pair in a.iter().zip(&b) {
        log.append(pair.0).unwrap();
        log.append(pair.1).unwrap();
    }
    for e in b.iter().skip(a.len()).chain(a.iter().skip(b.len())) {
        log.append(e).unwrap();
    }
    let state = tempfile::tempdir().unwrap();
    let derive = |run: &str| {
        let options = |name: &str| ShellOptions {
            run: Some(run.to_string()),
            ..batch(state.path().join(run).join(name))
        };
        let trees = run_on(
            &log,
            &log,
            TrajectoryBuilder::default(),
            &options("trajectories"),
        );
        let groups = run_on(
            &log,
            &log,
            RewardJoin::new(RewardConfig::default()),
            &options("rewards"),
        );
        (trees.unwrap().emitted, groups.unwrap().emitted)
    };
    assert_eq!(
        derive("a"),
        (2 * 4, 2),
        "run a's trees and groups, none of b's"
    );
    assert_eq!(derive("b"), (3 * 4, 3));
    let runs = |topic: Topic| -> Vec<String> {
        let mut runs: Vec<String> = log
            .events(topic.name())
            .iter()
            .map(|e| e.run_id().to_string())
            .collect();
        runs.sort();
        runs
    };
    let expect = |per_run: usize, a: usize, b: usize| -> Vec<String> {
        std::iter::repeat_n("a".to_string(), a * per_run)
            .chain(std::iter::repeat_n("b".to_string(), b * per_run))
            .collect()
    };
    assert_eq!(runs(Topic::Trajectories), expect(4, 2, 3));
    assert_eq!(runs(Topic::Batches), expect(1, 2, 3));
}

/// Each partition's output events, in order: (partition, event id).
fn by_partition(log: &MemoryLog, topic: Topic) -> Vec<(i32, String)> {
    let mut all = Vec::new();
    for p in log.partitions(topic.name()).unwrap() {
        let end = log.end(topic.name(), p).unwrap();
        let _ = log
            .for_each_in(topic.name(), p, 0, end, |r| {
                all.push((p, r.event.unwrap().event_id().to_string()));
                ControlFlow::Continue(())
            })
            .unwrap();
    }
    all
}

/// A scaled-out trajectory builder runs one task per partition: together they
/// emit, partition by partition and in order, what one task over the whole
/// log does. A log whose calls are keyed the old way (by session) is refused
/// with the reason, not half joined.
#[test]
fn one_task_per_partition_emits_what_one_task_does_or_refuses_an_old_log() {
    let rt = tokio::runtime::Runtime::new().unwrap();
    let _context = rt.enter();
    let inputs = recorded_run("part", GROUPS, 4, 3, 16);
    let (whole, split) = (MemoryLog::new(4), MemoryLog::new(4));
    for e in &inputs {
        whole.append(e).unwrap();
        split.append(e).unwrap();
    }
    let state = tempfile::tempdir().unwrap();
    let options = |dir: &str, partition: Option<i32>| ShellOptions {
        checkpoint_every: 5,
        partition,
        ..batch(state.path().join(dir))
    };
    run_on(
        &whole,
        &whole,
        TrajectoryBuilder::default(),
        &options("whole", None),
    )
    .unwrap();
    for p in 0..4 {
        let stats = run_on(
            &split,
            &split,
            TrajectoryBuilder::default(),
            &options(&format!("p{p}"), Some(p)),
        )
        .unwrap();
        assert!(stats.emitted > 0, "partition {p}: {stats:?}");
    }
    let expected = by_partition(&whole, Topic::Trajectories);
    assert_eq!(expected.len(), GROUPS * 4);
    assert_eq!(by_partition(&split, Topic::Trajectories), expected);

    let old = MemoryLog::new(4);
    for e in &inputs {
        let key = match e {
            Event::CallFinished(c) => c.session_id.as_bytes(),
            e => e.key().as_bytes(),
        };
        let value = forgelog_schemas::Codec::global().encode(e).unwrap();
        old.append_raw(e.topic().name(), key, &value);
    }
    let refused = (0..4).find_map(|p| {
        run_on(
            &old,
            &old,
            TrajectoryBuilder::default(),
            &options(&format!("old{p}"), Some(p)),
        )
        .err()
    });
    let why = refused
        .expect("an old log consumed per partition")
        .to_string();
    assert!(
        why.contains("keyed") && why.contains("without --scale-out"),
        "{why}"
    );
}

/// Between snapshots a checkpoint records only how far it got; after a crash
/// the state is carried forward from the last snapshot by re-reading the input
/// since. Here rollouts are cut across the three thirds of the input, so the
/// state carried forward holds calls of rollouts still in flight: the last
/// run completes them, sends each trajectory once and re-sends nothing.
#[test]
fn after_a_crash_the_state_is_carried_from_its_snapshot_by_the_input_since() {
    let rt = tokio::runtime::Runtime::new().unwrap();
    let _context = rt.enter();
    let inputs = recorded_run("snap", GROUPS, 4, 3, 16);
    let log = MemoryLog::default();
    let state = tempfile::tempdir().unwrap();
    let dir = state.path().join("trajectories");
    let run = || {
        let options = ShellOptions {
            checkpoint_every: 2,
            ..batch(&dir)
        };
        run_on(&log, &log, TrajectoryBuilder::default(), &options).unwrap()
    };
    let third = inputs.len() / 3;
    for e in &inputs[..third] {
        log.append(e).unwrap();
    }
    let first = run();
    let snapshot = std::fs::read(dir.join("state.json")).unwrap();
    for e in &inputs[third..2 * third] {
        log.append(e).unwrap();
    }
    let second = run();
    let progress = std::fs::read(dir.join("progress.json")).unwrap();
    assert!(
        progress.len() * 4 < std::fs::read(dir.join("state.json")).unwrap().len(),
        "a progress record is not much smaller than a snapshot"
    );
    // Killed after its last progress record, before the snapshot that followed.
    std::fs::write(dir.join("state.json"), &snapshot).unwrap();
    for e in &inputs[2 * third..] {
        log.append(e).unwrap();
    }
    let last = run();
    let trajectories = log.events(Topic::Trajectories.name());
    assert_eq!(trajectories.len(), GROUPS * 4);
    assert_eq!(
        first.emitted + second.emitted + last.emitted,
        (GROUPS * 4) as u64
    );
    assert_eq!(
        last.skipped, 0,
        "re-sent what the input since the snapshot derived"
    );
    assert!(first.emitted > 0 && last.emitted > 0, "{first:?} {last:?}");
    let mut by_topic = BTreeMap::new();
    for e in &inputs {
        by_topic
            .entry(e.topic())
            .or_insert_with(Vec::new)
            .push(e.clone());
    }
    let expected = rebuild(&by_topic, RewardConfig::default());
    let sorted = |mut events: Vec<Event>| {
        events.sort_by(|a, b| a.event_id().cmp(b.event_id()));
        events
    };
    // (In the order the input arrived, which is not the order of a rebuild.)
    assert!(
        sorted(trajectories) == sorted(expected.trajectories),
        "not the trajectories the core derives"
    );
}

/// A claim check whose event cannot be fetched holds its partition there,
/// named where it is, while every other partition is derived; it is not set
/// aside as a dead letter (its rollout would never be built). Once the claim
/// store serves it, the shell derives past it.
#[test]
fn an_unreadable_claim_holds_its_partition_and_is_derived_once_it_reads() {
    use forgelog_stream::claims::{ClaimStore, ClaimsConfig};
    let rt = tokio::runtime::Runtime::new().unwrap();
    let _guard = rt.enter();
    let dir = tempfile::tempdir().unwrap();
    let store = ClaimStore::open(&ClaimsConfig {
        location: dir.path().join("claims").display().to_string(),
        max_record_bytes: 2048,
    })
    .unwrap();
    let log = MemoryLog::default();
    let inputs = recorded_run("claimed", 3, 2, 2, 4000);
    // Calls' claims: (partition, offset, rollout, object).
    let mut claimed = Vec::new();
    let mut calls_at = Vec::new();
    for e in &inputs {
        let encoded = forgelog_schemas::Codec::global().encode(e).unwrap();
        let record = store.record(e, encoded).unwrap();
        let (partition, offset) = log.append_raw(e.topic().name(), e.key().as_bytes(), &record);
        if let Event::CallStarted(forgelog_schemas::CallStarted { rollout_id, .. })
        | Event::CallFinished(forgelog_schemas::CallFinished { rollout_id, .. }) = e
        {
            calls_at.push((partition, offset, rollout_id.clone()));
            if let Some(claim) = forgelog_schemas::Claim::decode(&record) {
                claimed.push((partition, offset, claim.unwrap().sha256));
            }
        }
    }
    // One partition's claims gone: that partition is held at its first.
    let (held, at, _) = claimed.first().cloned().expect("some calls are claims");
    for (_, _, sha) in claimed.iter().filter(|(p, _, _)| *p == held) {
        std::fs::rename(dir.path().join("claims").join(sha), dir.path().join(sha)).unwrap();
    }
    let waiting: std::collections::BTreeSet<&str> = calls_at
        .iter()
        .filter(|(p, o, _)| *p == held && *o >= at)
        .map(|(_, _, r)| r.as_str())
        .collect();
    let by_topic = {
        let mut m = std::collections::BTreeMap::new();
        for e in &inputs {
            m.entry(e.topic()).or_insert_with(Vec::new).push(e.clone());
        }
        m
    };
    let expected = rebuild(&by_topic, RewardConfig::default()).trajectories;
    let rollouts = |events: &[Event]| -> std::collections::BTreeSet<String> {
        events
            .iter()
            .filter_map(|e| match e {
                Event::TrajectoryBuilt(t) => Some(t.rollout_id.clone()),
                _ => None,
            })
            .collect()
    };
    let options = batch(dir.path().join("trajectories"));
    let err = run_on(&log, &log, TrajectoryBuilder::default(), &options)
        .unwrap_err()
        .to_string();
    assert!(
        err.contains(&format!("claim check at forgelog.calls/{held} offset {at}")),
        "{err}"
    );
    assert!(log.events(Topic::DeadLetters.name()).is_empty());
    let built = rollouts(&log.events(Topic::Trajectories.name()));
    let others: std::collections::BTreeSet<String> = rollouts(&expected)
        .into_iter()
        .filter(|r| !waiting.contains(r.as_str()))
        .collect();
    assert!(!waiting.is_empty() && !others.is_empty(), "{waiting:?}");
    assert_eq!(built, others, "every rollout but the held partition's");
    // Back: everything is derived, as from a log without claims.
    for (_, _, sha) in claimed.iter().filter(|(p, _, _)| *p == held) {
        std::fs::rename(dir.path().join(sha), dir.path().join("claims").join(sha)).unwrap();
    }
    run_on(&log, &log, TrajectoryBuilder::default(), &options).unwrap();
    assert_eq!(ids(&log.events(Topic::Trajectories.name())), ids(&expected));
    assert!(!expected.is_empty());
}

/// Topics that say a small record ceiling (`max.message.bytes`, which a
/// stock Kafka always describes): the shell reads it at start, as the proxy
/// does, and its trajectories over it go to the claim store instead of into
/// records the broker would refuse; they read back as the core derives them.
#[test]
fn outputs_over_the_ceiling_the_brokers_topics_say_are_claimed() {
    use forgelog_stream::admin::{create_topics, TopicLayout};
    use forgelog_stream::claims::ClaimsConfig;
    let rt = tokio::runtime::Runtime::new().unwrap();
    let _guard = rt.enter();
    let broker = forgelog_stream::testing::PrivateBroker::start().unwrap();
    let dir = tempfile::tempdir().unwrap();
    let mut config = broker.config();
    config.claims = ClaimsConfig {
        location: dir.path().join("claims").display().to_string(),
        max_record_bytes: 1_000_000,
    };
    let ceiling = 32 << 10;
    let layout = TopicLayout {
        max_message_bytes: Some(ceiling),
        ..Default::default()
    };
    rt.block_on(create_topics(&config, &layout)).unwrap();
    let inputs = recorded_run("ceiling", 1, 2, 2, 4000);
    rt.block_on(forgelog_stream::testing::produce(&config, &inputs));
    let options = batch(dir.path().join("trajectories"));
    run(&config, TrajectoryBuilder::default(), &options).unwrap();

    let got = forgelog_stream::ReplayReader::new(&config)
        .unwrap()
        .read(
            Topic::Trajectories.name(),
            forgelog_stream::StartAt::Beginning,
            Some("ceiling"),
        )
        .unwrap();
    assert!(
        got.iter()
            .any(|r| forgelog_schemas::Claim::is_claim(&r.value)),
        "no trajectory was claimed"
    );
    assert!(got.iter().all(|r| r.key.len() + r.value.len() <= ceiling));
    let events: Vec<Event> = got.into_iter().map(|r| r.event.unwrap()).collect();
    let by_topic = {
        let mut m = std::collections::BTreeMap::new();
        for e in &inputs {
            m.entry(e.topic()).or_insert_with(Vec::new).push(e.clone());
        }
        m
    };
    let expected = rebuild(&by_topic, RewardConfig::default()).trajectories;
    assert!(!expected.is_empty());
    assert_eq!(ids(&events), ids(&expected));
}

/// A log that sets `stop` as a read reaches `offset` of one partition: the
/// shell reading it is stopped there (handed back, or killed after a
/// checkpoint).
struct StopAt<'a> {
    log: &'a MemoryLog,
    topic: &'static str,
    partition: i32,
    offset: i64,
    stop: Arc<AtomicBool>,
}

impl LogReader for StopAt<'_> {
    fn partitions(&self, topic: &str) -> Result<Vec<i32>, ConsumeError> {
        self.log.partitions(topic)
    }

    fn end(&self, topic: &str, partition: i32) -> Result<i64, ConsumeError> {
        self.log.end(topic, partition)
    }

    fn for_each_in(
        &self,
        topic: &str,
        partition: i32,
        from: i64,
        to: i64,
        mut f: impl FnMut(Received) -> ControlFlow<()>,
    ) -> Result<ControlFlow<()>, ConsumeError> {
        let here = (topic, partition) == (self.topic, self.partition);
        self.log.for_each_in(topic, partition, from, to, |rec| {
            if here && rec.offset >= self.offset {
                self.stop.store(true, Ordering::Relaxed);
            }
            f(rec)
        })
    }
}

/// A crash after outputs were sent leaves them in the log past the
/// checkpoint; the next shell re-derives them and sends none again. Stopped
/// before it has re-derived them all, that shell's checkpoint must not say
/// its outputs end where the log's end now (past the ones still to be
/// re-derived): the shell after it would send those again. (Three instances
/// of a scaled-out consumer killed at random, under load, wrote 5 outputs
/// twice this way, each copy right after its original.)
#[test]
fn a_shell_stopped_while_re_deriving_what_a_crash_sent_leaves_none_to_be_sent_twice() {
    let rt = tokio::runtime::Runtime::new().unwrap();
    let _context = rt.enter();
    let inputs = recorded_run("redo", GROUPS, 4, 3, 16);
    let log = MemoryLog::default();
    let state = tempfile::tempdir().unwrap();
    let dir = state.path().join("trajectories");
    let options = ShellOptions {
        checkpoint_every: 2,
        ..batch(&dir)
    };
    let third = inputs.len() / 3;
    for e in &inputs[..third] {
        log.append(e).unwrap();
    }
    run_on(&log, &log, TrajectoryBuilder::default(), &options).unwrap();
    let stale: Vec<(PathBuf, Option<Vec<u8>>)> = ["state.json", "progress.json"]
        .iter()
        .map(|f| (dir.join(f), std::fs::read(dir.join(f)).ok()))
        .collect();
    for e in &inputs[third..2 * third] {
        log.append(e).unwrap();
    }
    // The last partition a sweep reads, where it ended then.
    let last = TrajectoryBuilder::INPUTS.last().unwrap().name();
    let p = *log.partitions(last).unwrap().last().unwrap();
    let two_thirds = log.end(last, p).unwrap();
    for e in &inputs[2 * third..] {
        log.append(e).unwrap();
    }
    // Every output sent, then the crash: the checkpoint is the stale one.
    run_on(&log, &log, TrajectoryBuilder::default(), &options).unwrap();
    assert_eq!(log.events(Topic::Trajectories.name()).len(), GROUPS * 4);
    for (path, bytes) in &stale {
        match bytes {
            Some(bytes) => std::fs::write(path, bytes).unwrap(),
            None => {
                let _ = std::fs::remove_file(path);
            }
        }
    }
    // Re-derived all but the last partition's last third, then stopped.
    let stopping = StopAt {
        log: &log,
        topic: last,
        partition: p,
        offset: two_thirds,
        stop: Arc::default(),
    };
    let stopped = ShellOptions {
        stop: stopping.stop.clone(),
        exit_when_idle: false,
        ..options.clone()
    };
    let partly = run_on(&stopping, &log, TrajectoryBuilder::default(), &stopped).unwrap();
    assert!(partly.skipped > 0, "{partly:?}");
    let rest = run_on(&log, &log, TrajectoryBuilder::default(), &options).unwrap();
    assert_eq!(
        (partly.emitted, rest.emitted),
        (0, 0),
        "sent again: {partly:?} {rest:?}"
    );
    assert!(rest.skipped > 0, "{rest:?}");
    assert_eq!(log.events(Topic::Trajectories.name()).len(), GROUPS * 4);
}
