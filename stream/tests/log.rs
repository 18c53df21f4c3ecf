//! The Kafka layer against a real broker: the shared one for volume and
//! ordering, a private one for the fault tests that kill it.

use forgelog_schemas::Topic;
use forgelog_schemas::{testing::call_finished, Codec, Event};
use forgelog_stream::testing::{shared_broker, unique_run_id, PrivateBroker};
use forgelog_stream::{
    EventConsumer, EventProducer, Received, ReplayReader, SpoolOptions, StartAt, StreamConfig,
};
use std::collections::{BTreeMap, HashSet};
use std::time::{Duration, Instant};

const SESSIONS: usize = 50;

fn event(run: &str, i: usize, prompt: usize) -> Event {
    call_finished(
        run,
        &format!("s{}", i % SESSIONS),
        (i / SESSIONS) as i64,
        prompt,
        16,
    )
    .into()
}

/// Every event of `run` arrived once; per key, in the order sent.
fn assert_exactly_once_in_order(received: &[Received], run: &str, n: usize, prompt: usize) {
    let mut seen = HashSet::new();
    let mut last_index: BTreeMap<Vec<u8>, i64> = BTreeMap::new();
    for r in received {
        let Ok(Event::CallFinished(c)) = &r.event else {
            panic!("not a CallFinished: {:?}", r.event)
        };
        assert_eq!(c.run_id, run);
        assert!(
            seen.insert(c.event_id.clone()),
            "duplicate event {} (session {}, call {})",
            c.event_id,
            c.session_id,
            c.call_index
        );
        let prev = last_index.insert(r.key.clone(), c.call_index);
        assert!(
            prev.is_none_or(|p| p < c.call_index),
            "session {} out of order: {prev:?} then {}",
            c.session_id,
            c.call_index
        );
        let i = c.call_index as usize * SESSIONS + c.session_id[1..].parse::<usize>().unwrap();
        assert_eq!(
            r.value,
            Codec::global().encode(&event(run, i, prompt)).unwrap(),
            "bytes differ for event {i}"
        );
    }
    assert_eq!(seen.len(), n, "events missing");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_volume_of_calls_round_trips_byte_identical_in_key_order() {
    // A broker of its own: 800 MB in the shared topics would slow every other
    // test's full-topic reads (tansu's fetch is linear in what follows the offset).
    let broker = PrivateBroker::start().unwrap();
    let config = broker.config();
    forgelog_stream::admin::create_topics(&config, &Default::default())
        .await
        .unwrap();
    let run = unique_run_id("volume");
    // 20,000 calls of 2 KB in CI; `scripts/test.sh --soak` sends 200,000.
    let n = 20_000 * forgelog_stream::testing::soak_scale();
    let spool = tempfile::tempdir().unwrap();
    let producer = EventProducer::start(&config, spool.path(), SpoolOptions::default()).unwrap();
    for i in 0..n {
        producer.send(&event(&run, i, 2_000)).unwrap();
    }
    producer.close(Duration::from_secs(600)).await.unwrap();

    let consumer =
        EventConsumer::new(&config, &unique_run_id("volume-group"), &[Topic::Calls]).unwrap();
    let mut mine = Vec::with_capacity(n);
    let deadline = Instant::now() + Duration::from_secs(600);
    while mine.len() < n {
        assert!(
            Instant::now() < deadline,
            "only {} of {n} events came back",
            mine.len()
        );
        let r = tokio::time::timeout(Duration::from_secs(60), consumer.recv())
            .await
            .expect("consumer stalled")
            .unwrap();
        if r.in_run(Some(&run)) {
            mine.push(r);
        }
    }
    let last: Vec<_> = mine
        .iter()
        .map(|r| (r.topic.as_str(), r.partition, r.offset))
        .collect();
    consumer.commit(&last).unwrap();
    assert_exactly_once_in_order(&mine, &run, n, 2_000);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn consumer_group_resumes_after_its_last_commit() {
    let config = shared_broker().await;
    let run = unique_run_id("resume");
    let spool = tempfile::tempdir().unwrap();
    let producer = EventProducer::start(&config, spool.path(), SpoolOptions::default()).unwrap();
    for i in 0..200 {
        producer.send(&event(&run, i, 10)).unwrap();
    }
    producer.close(Duration::from_secs(60)).await.unwrap();
    let group = unique_run_id("resume-group");

    async fn take(
        config: &forgelog_stream::StreamConfig,
        group: &str,
        run: &str,
        n: usize,
    ) -> Vec<Received> {
        let c = EventConsumer::new(config, group, &[Topic::Calls]).unwrap();
        let mut out = Vec::new();
        while out.len() < n {
            let r = tokio::time::timeout(Duration::from_secs(30), c.recv())
                .await
                .expect("stalled")
                .unwrap();
            if r.in_run(Some(run)) {
                out.push(r);
            }
        }
        // Commit the highest offset taken in each partition.
        let mut last: BTreeMap<(String, i32), i64> = BTreeMap::new();
        for r in &out {
            last.insert((r.topic.clone(), r.partition), r.offset);
        }
        let offsets: Vec<_> = last
            .iter()
            .map(|((t, p), o)| (t.as_str(), *p, *o))
            .collect();
        c.commit(&offsets).unwrap();
        out
    }
    // Each consumer takes a whole partition's worth in order, so "first 80" is a
    // prefix per partition; the second member must see exactly the rest.
    let first = take(&config, &group, &run, 80).await;
    let rest_len = 200 - first.len();
    let rest = take(&config, &group, &run, rest_len).await;
    let all: Vec<Received> = first.into_iter().chain(rest).collect();
    assert_exactly_once_in_order(&all, &run, 200, 10);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn replay_reader_returns_identical_sequences() {
    let config = shared_broker().await;
    let run = unique_run_id("replay");
    let spool = tempfile::tempdir().unwrap();
    let producer = EventProducer::start(&config, spool.path(), SpoolOptions::default()).unwrap();
    for i in 0..500 {
        producer.send(&event(&run, i, 50)).unwrap();
    }
    producer.close(Duration::from_secs(60)).await.unwrap();
    let (a, b) = tokio::task::spawn_blocking({
        let config = config.clone();
        let run = run.clone();
        move || {
            let reader = ReplayReader::new(&config).unwrap();
            let a = reader
                .read(Topic::Calls.name(), StartAt::Beginning, Some(&run))
                .unwrap();
            let b = ReplayReader::new(&config)
                .unwrap()
                .read(Topic::Calls.name(), StartAt::Beginning, Some(&run))
                .unwrap();
            (a, b)
        }
    })
    .await
    .unwrap();
    assert_eq!(a.len(), 500);
    assert_eq!(a, b);
    assert!(
        a.windows(2)
            .all(|w| (w[0].partition, w[0].offset) < (w[1].partition, w[1].offset)),
        "not in partition order"
    );
    assert_exactly_once_in_order(&a, &run, 500, 50);
}

/// A reader of one run gets exactly that run's events, in log order, with
/// other runs' interleaved (skipped by their first bytes) and a message that is
/// no event at all (passed on, undecoded, to be reported).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_run_is_read_apart_from_other_runs_and_garbage_still_shows() {
    use rdkafka::producer::{BaseProducer, BaseRecord, Producer};
    let broker = PrivateBroker::start().unwrap();
    let config = broker.config();
    forgelog_stream::admin::create_topics(&config, &Default::default())
        .await
        .unwrap();
    let spool = tempfile::tempdir().unwrap();
    let producer = EventProducer::start(&config, spool.path(), SpoolOptions::default()).unwrap();
    for i in 0..120 {
        let run = ["run-a", "run-b", "run-c"][i % 3];
        producer.send(&event(run, i / 3, 10)).unwrap();
    }
    producer.close(Duration::from_secs(60)).await.unwrap();
    let raw: BaseProducer = rdkafka::ClientConfig::new()
        .set("bootstrap.servers", &config.brokers)
        .create()
        .unwrap();
    raw.send(
        BaseRecord::to(Topic::Calls.name())
            .key("k")
            .payload("not an event"),
    )
    .unwrap();
    raw.flush(Duration::from_secs(30)).unwrap();
    let read = move |run: Option<&str>| {
        ReplayReader::new(&config)
            .unwrap()
            .read(Topic::Calls.name(), StartAt::Beginning, run)
            .unwrap()
    };
    let (all, a) = tokio::task::spawn_blocking(move || (read(None), read(Some("run-a"))))
        .await
        .unwrap();
    assert_eq!(all.len(), 121);
    let garbage = |r: &&Received| r.event.is_err();
    assert_eq!(all.iter().filter(garbage).count(), 1);
    let expected: Vec<&Received> = all
        .iter()
        .filter(|r| r.event.as_ref().map_or(true, |e| e.run_id() == "run-a"))
        .collect();
    assert_eq!(a.iter().collect::<Vec<_>>(), expected);
    assert_eq!(a.iter().filter(garbage).count(), 1);
    let events: Vec<Received> = a.iter().filter(|r| r.event.is_ok()).cloned().collect();
    assert_exactly_once_in_order(&events, "run-a", 40, 10);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn broker_killed_sends_never_wait_and_everything_arrives_once_in_order() {
    let mut broker = PrivateBroker::start().unwrap();
    let config = broker.config();
    forgelog_stream::admin::create_topics(&config, &Default::default())
        .await
        .unwrap();
    let run = unique_run_id("broker-kill");
    let spool = tempfile::tempdir().unwrap();
    let producer = EventProducer::start(&config, spool.path(), SpoolOptions::default()).unwrap();
    // Some traffic while the broker is up.
    for i in 0..100 {
        producer.send(&event(&run, i, 100)).unwrap();
    }
    producer.flush(Duration::from_secs(30)).await.unwrap();

    broker.kill();
    let n = 10_000;
    for i in 100..n {
        producer.send(&event(&run, i, 100)).unwrap();
    }
    // Nothing can have been delivered: every send returned without the broker.
    tokio::time::sleep(Duration::from_millis(500)).await;
    assert_eq!(producer.spool().pending(), (n - 100) as u64);
    assert!(producer.flush(Duration::from_millis(300)).await.is_err());

    broker.restart().unwrap();
    producer.close(Duration::from_secs(120)).await.unwrap();
    let got = tokio::task::spawn_blocking(move || {
        ReplayReader::new(&config)
            .unwrap()
            .read(Topic::Calls.name(), StartAt::Beginning, Some(&run))
            .map(|v| (v, run))
    })
    .await
    .unwrap()
    .unwrap();
    assert_exactly_once_in_order(&got.0, &got.1, n, 100);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn flush_waits_for_the_broker_and_the_checkpoint_follows_once_quiet() {
    let config = shared_broker().await;
    let run = unique_run_id("checkpoint");
    let spool = tempfile::tempdir().unwrap();
    let producer = EventProducer::start(&config, spool.path(), SpoolOptions::default()).unwrap();
    for i in 0..20 {
        producer.send(&event(&run, i, 10)).unwrap();
    }
    producer.flush(Duration::from_secs(30)).await.unwrap();
    assert_eq!(producer.spool().acked(), 20);
    assert_eq!(producer.spool().pending(), 0);
    // The durable checkpoint is saved when the drainer has been quiet a moment
    // (not after every delivery: that was an fsync per event at low rates).
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let saved = forgelog_stream::spool::Checkpoint::load(spool.path()).unwrap();
        if saved.acked_through == 20 {
            assert!(saved.scan_from.contains_key(Topic::Calls.name()));
            break;
        }
        assert!(Instant::now() < deadline, "checkpoint still at {saved:?}");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    // More events, then close: close saves the checkpoint on its way out.
    for i in 20..30 {
        producer.send(&event(&run, i, 10)).unwrap();
    }
    producer.close(Duration::from_secs(30)).await.unwrap();
    let saved = forgelog_stream::spool::Checkpoint::load(spool.path()).unwrap();
    assert_eq!(saved.acked_through, 30);
}

/// What a killed drainer leaves in `dir`: `events` in its spool, sent but
/// never heard back about, past a checkpoint whose scan base is where the
/// calls topic ends now and which says deliveries took `slowest_delivery_ms`.
fn dead_writers_spool(
    config: &StreamConfig,
    dir: &std::path::Path,
    events: &[Event],
    slowest_delivery_ms: u64,
) {
    let spool = forgelog_stream::Spool::open(dir, SpoolOptions::default()).unwrap();
    for e in events {
        let value = Codec::global().encode(e).unwrap();
        spool
            .append(e.topic().name(), e.key().as_bytes(), &value)
            .unwrap();
    }
    let mut checkpoint = forgelog_stream::spool::Checkpoint::default();
    checkpoint
        .scan_from
        .insert(Topic::Calls.name().to_string(), calls_topic_ends(config));
    checkpoint.slowest_delivery_ms = slowest_delivery_ms;
    checkpoint.store(dir).unwrap();
}

/// The dead writer's queued requests land: the same records, from a
/// producer of their own.
async fn land_late(config: &StreamConfig, events: &[Event]) {
    let queued = tempfile::tempdir().unwrap();
    let late = EventProducer::start(config, queued.path(), SpoolOptions::default()).unwrap();
    for e in events {
        late.send(e).unwrap();
    }
    late.close(Duration::from_secs(30)).await.unwrap();
}

/// The next owner's flush and close, then the run's calls: each event once, in order.
async fn assert_sent_once(config: &StreamConfig, next_owner: EventProducer, run: &str) {
    next_owner.flush(Duration::from_secs(60)).await.unwrap();
    next_owner.close(Duration::from_secs(30)).await.unwrap();
    let got = ReplayReader::new(config)
        .unwrap()
        .read(Topic::Calls.name(), StartAt::Beginning, Some(run))
        .unwrap();
    assert_exactly_once_in_order(&got, run, SESSIONS, 10);
}

/// A killed drainer's last produce requests can still be queued at the broker
/// when the next owner of its spool starts. They land while it waits out the
/// recovery grace, its scan of the tails finds them, and nothing is sent
/// twice; read at once, they would be sent again.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_dead_writers_late_requests_are_found_not_sent_twice() {
    let config = shared_broker().await;
    let run = unique_run_id("late-requests");
    let dir = tempfile::tempdir().unwrap();
    let events: Vec<Event> = (0..SESSIONS).map(|i| event(&run, i, 10)).collect();
    dead_writers_spool(&config, dir.path(), &events, 0);
    let options = SpoolOptions {
        recovery_grace: Duration::from_secs(10),
        ..SpoolOptions::default()
    };
    let started = Instant::now();
    let next_owner = EventProducer::start(&config, dir.path(), options).unwrap();
    land_late(&config, &events).await;
    assert!(
        started.elapsed() < Duration::from_secs(10),
        "the late requests took longer than the grace: {:?}",
        started.elapsed()
    );
    assert_sent_once(&config, next_owner, &run).await;
}

/// The same, with the dead writer's requests landing after the default
/// grace: the broker was slow when it died (its checkpoint says deliveries
/// took 2 s), so the next owner waits four times that before its scan. With
/// the fixed 3 s grace these records would be sent twice.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_writer_that_saw_a_slow_broker_is_waited_for_longer() {
    let config = shared_broker().await;
    let run = unique_run_id("slow-broker");
    let dir = tempfile::tempdir().unwrap();
    let events: Vec<Event> = (0..SESSIONS).map(|i| event(&run, i, 10)).collect();
    dead_writers_spool(&config, dir.path(), &events, 2000);
    let floor = SpoolOptions::default().recovery_grace;
    let started = Instant::now();
    let next_owner = EventProducer::start(&config, dir.path(), SpoolOptions::default()).unwrap();
    // Queued past the default grace, then landing.
    tokio::time::sleep(floor + Duration::from_millis(1500)).await;
    land_late(&config, &events).await;
    let landed = started.elapsed();
    assert!(
        landed > floor && landed < Duration::from_secs(8),
        "the late requests landed after {landed:?}: not between the default grace and the slow broker's"
    );
    assert_sent_once(&config, next_owner, &run).await;
}

/// An event over the message limit used to enter the spool, be refused by the
/// client on every retry, and hold back every event behind it, for good.
/// Refused, a call is parked and a stand-in takes its place in the log (its
/// tokens, not its bodies), so its rollout still counts every call; a writer
/// killed after the stand-in landed and before its ack never sends it twice.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_oversize_event_is_refused_at_send_and_an_oversize_record_never_jams_the_spool() {
    let config = shared_broker().await;
    let run = unique_run_id("oversize");
    let scan_base = calls_topic_ends(&config);
    let spool_dir = tempfile::tempdir().unwrap();
    let mut huge = call_finished(&run, "s0", 99, 10, 16);
    huge.response_body = vec![b'x'; forgelog_stream::MAX_MESSAGE_BYTES + 1];
    {
        let producer =
            EventProducer::start(&config, spool_dir.path(), SpoolOptions::default()).unwrap();
        let err = producer.send(&huge.clone().into()).unwrap_err();
        assert!(err.to_string().contains("over the log's"), "{err}");
        assert_eq!(
            producer.spool().next_seq(),
            0,
            "the refused event is not spooled"
        );
        producer.close(Duration::from_secs(5)).await.unwrap();
    }
    // A spool an older producer wrote: the oversize record between good ones.
    let old_spool = |dir: &std::path::Path| {
        let spool = forgelog_stream::Spool::open(dir, SpoolOptions::default()).unwrap();
        let codec = Codec::global();
        for i in 0..10 {
            let e = event(&run, i, 10);
            if i == 3 {
                let value = codec.encode(&huge.clone().into()).unwrap();
                spool.append(Topic::Calls.name(), b"s0", &value).unwrap();
            }
            spool
                .append(
                    e.topic().name(),
                    e.key().as_bytes(),
                    &codec.encode(&e).unwrap(),
                )
                .unwrap();
        }
        spool
    };
    drop(old_spool(spool_dir.path()));
    let producer =
        EventProducer::start(&config, spool_dir.path(), SpoolOptions::default()).unwrap();
    producer.flush(Duration::from_secs(60)).await.unwrap();
    producer.close(Duration::from_secs(5)).await.unwrap();
    let status = forgelog_stream::SpoolStatus::read(spool_dir.path()).unwrap();
    assert_eq!(status.pending, 0);
    let [parked] = &status.parked[..] else {
        panic!("one parked record expected: {:?}", status.parked)
    };
    assert_eq!(parked.seq, 3);
    assert!(parked.reason.contains("too large"), "{}", parked.reason);
    let rec = parked.record(spool_dir.path()).unwrap().unwrap();
    assert_eq!(
        rec.value,
        Codec::global().encode(&huge.clone().into()).unwrap()
    );
    let assert_log = || {
        let got = ReplayReader::new(&config)
            .unwrap()
            .read(Topic::Calls.name(), StartAt::Beginning, Some(&run))
            .unwrap();
        let (stand_ins, calls): (Vec<Received>, Vec<Received>) = got.into_iter().partition(
            |r| matches!(&r.event, Ok(Event::CallFinished(c)) if c.event_id == huge.event_id),
        );
        assert_exactly_once_in_order(&calls, &run, 10, 10);
        let [stand_in] = &stand_ins[..] else {
            panic!("one stand-in expected, {} in the log", stand_ins.len())
        };
        let Ok(Event::CallFinished(stand_in)) = &stand_in.event else {
            unreachable!()
        };
        assert_eq!(stand_in.stand_in.as_deref(), Some(parked.reason.as_str()));
        assert_eq!(
            (&stand_in.prompt_token_ids, &stand_in.completion_token_ids),
            (&huge.prompt_token_ids, &huge.completion_token_ids),
            "its tokens kept"
        );
        assert!(stand_in.response_body.is_empty() && !stand_in.trainable);
    };
    assert_log();

    // Killed after the stand-in landed, before its ack: the next owner of
    // the spool sends it again only if the log lacks it.
    let dead = tempfile::tempdir().unwrap();
    let spool = old_spool(dead.path());
    spool.park(&rec, &parked.reason).unwrap();
    drop(spool);
    let mut checkpoint = forgelog_stream::spool::Checkpoint::default();
    checkpoint
        .scan_from
        .insert(Topic::Calls.name().to_string(), scan_base);
    checkpoint.store(dead.path()).unwrap();
    let next_owner = EventProducer::start(&config, dead.path(), SpoolOptions::default()).unwrap();
    next_owner.flush(Duration::from_secs(60)).await.unwrap();
    next_owner.close(Duration::from_secs(5)).await.unwrap();
    assert_log();
}

/// Where each partition of the calls topic ends now.
fn calls_topic_ends(config: &StreamConfig) -> BTreeMap<i32, i64> {
    let reader = ReplayReader::new(config).unwrap();
    let topic = Topic::Calls.name();
    reader
        .partitions(topic)
        .unwrap()
        .into_iter()
        .map(|p| (p, reader.end(topic, p).unwrap()))
        .collect()
}

/// A group consumer (the engine's policy follower) used to fail with
/// `BrokerTransportFailure` when its broker went away; it waits instead, and
/// gets what is sent after the broker is back.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_group_consumer_waits_out_a_broker_restart() {
    let mut broker = PrivateBroker::start().unwrap();
    let config = broker.config();
    forgelog_stream::admin::create_topics(&config, &Default::default())
        .await
        .unwrap();
    let run = unique_run_id("consumer-restart");
    let send = |i: usize| {
        let config = config.clone();
        let e = event(&run, i, 10);
        async move {
            let spool = tempfile::tempdir().unwrap();
            let p = EventProducer::start(&config, spool.path(), SpoolOptions::default()).unwrap();
            p.send(&e).unwrap();
            p.close(Duration::from_secs(60)).await.unwrap();
        }
    };
    send(0).await;
    let consumer = std::sync::Arc::new(
        EventConsumer::new(&config, &unique_run_id("restart-group"), &[Topic::Calls]).unwrap(),
    );
    let first = tokio::time::timeout(Duration::from_secs(60), consumer.recv())
        .await
        .unwrap()
        .unwrap();
    assert!(first.in_run(Some(&run)));
    broker.kill();
    let waiting = {
        let consumer = consumer.clone();
        tokio::spawn(async move { consumer.recv().await })
    };
    tokio::time::sleep(Duration::from_secs(3)).await;
    assert!(
        !waiting.is_finished(),
        "recv gave up while the broker was down"
    );
    broker.restart().unwrap();
    send(SESSIONS).await;
    let second = tokio::time::timeout(Duration::from_secs(60), waiting)
        .await
        .expect("nothing after the restart")
        .unwrap()
        .unwrap();
    let Ok(Event::CallFinished(c)) = second.event else {
        panic!("{:?}", second.event)
    };
    assert_eq!((c.run_id.as_str(), c.call_index), (run.as_str(), 1));
}
