//! The run index (`forgelog_stream::run_index`) on a real broker: a run's
//! read scans once and writes where the run starts and the gap past its
//! records; every later read of the run seeks there, skips the gap, and
//! fetches only the run's own records when the other runs came before or
//! after it; records the run gains later are found; an index that is not
//! this log's (past a partition's end) is noticed, read past, and written
//! again.

use forgelog_schemas::testing::recorded_run;
use forgelog_schemas::{Received, Topic};
use forgelog_stream::run_index::{gaps_group_of, Gap};
use forgelog_stream::testing::{produce, PrivateBroker};
use forgelog_stream::{LogReader, ReplayReader, StreamConfig};
use rdkafka::consumer::{BaseConsumer, CommitMode, Consumer};
use rdkafka::{ClientConfig, Offset, TopicPartitionList};

/// A record's topic, partition, offset and bytes.
type Placed = (String, i32, i64, Vec<u8>);

/// Where each of the run's records sat, and its bytes, per topic.
fn records(reader: &ReplayReader, run: &str) -> Vec<Placed> {
    let mut out = Vec::new();
    for topic in Topic::ALL {
        let read: Vec<Received> = reader.read_run(topic.name(), run).unwrap();
        out.extend(
            read.into_iter()
                .map(|r| (r.topic, r.partition, r.offset, r.value)),
        );
    }
    out
}

/// One read of `run` by a fresh reader: its records and what it fetched.
fn read(config: &StreamConfig, run: &str) -> (Vec<Placed>, u64) {
    let reader = ReplayReader::new(config).unwrap();
    let got = records(&reader, run);
    (got, reader.messages_fetched())
}

#[test]
fn a_runs_reads_seek_to_where_it_starts_and_a_foreign_index_is_read_past() {
    let broker = PrivateBroker::start().unwrap();
    let config = broker.config();
    let rt = tokio::runtime::Runtime::new().unwrap();
    // Older runs first, then ours: every partition holds the others' records
    // before any of ours.
    for i in 0..4 {
        rt.block_on(produce(
            &config,
            &recorded_run(&format!("older-{i}"), 3, 4, 3, 16),
        ));
    }
    rt.block_on(produce(&config, &recorded_run("ours", 1, 2, 2, 8)));

    let (first, scanned) = read(&config, "ours");
    assert!(!first.is_empty());
    let (second, seeking) = read(&config, "ours");
    assert_eq!(first, second, "the same records either way");
    assert!(
        scanned > 10 * first.len() as u64,
        "the first read scanned the log: {scanned} fetched for {} records",
        first.len()
    );
    assert_eq!(
        seeking,
        second.len() as u64,
        "the second read fetched only the run's own records"
    );

    // An index that says the run starts past a partition's end (another
    // log's): noticed, that partition scanned, the index written again.
    let group = forgelog_stream::run_index::group_of("ours");
    commit_foreign(&config, &group, (Topic::Calls.name(), 0), 1_000_000);
    let (third, read_past) = read(&config, "ours");
    assert_eq!(first, third, "nothing lost to a foreign index");
    assert!(read_past > seeking, "{read_past} fetched, not {seeking}");
    let (fourth, mended) = read(&config, "ours");
    assert_eq!(first, fourth);
    assert_eq!(mended, seeking, "the index written again");
}

/// Commits `offset` for `partition` of `topic` in `group`, as another log's
/// index would have it.
fn commit_foreign(
    config: &StreamConfig,
    group: &str,
    (topic, partition): (&str, i32),
    offset: i64,
) {
    let mut client = ClientConfig::new();
    client
        .set("bootstrap.servers", &config.brokers)
        .set("group.id", group);
    let client: BaseConsumer = client.create().unwrap();
    let mut foreign = TopicPartitionList::new();
    foreign
        .add_partition_offset(topic, partition, Offset::Offset(offset))
        .unwrap();
    client.commit(&foreign, CommitMode::Sync).unwrap();
}

#[test]
fn a_runs_reads_skip_the_runs_after_it_and_find_what_it_gains_later() {
    let broker = PrivateBroker::start().unwrap();
    let config = broker.config();
    let rt = tokio::runtime::Runtime::new().unwrap();
    let run = |name: &str, groups| recorded_run(name, groups, 4, 3, 16);
    rt.block_on(produce(&config, &run("before", 1)));
    rt.block_on(produce(&config, &recorded_run("ours", 1, 2, 2, 8)));
    let later: Vec<_> = (0..4).map(|i| run(&format!("later-{i}"), 2)).collect();
    for r in &later {
        rt.block_on(produce(&config, r));
    }
    let later_records: usize = later.iter().map(Vec::len).sum();

    let (first, scanned) = read(&config, "ours");
    let (second, seeking) = read(&config, "ours");
    assert_eq!(first, second, "the same records either way");
    assert!(scanned > 10 * first.len() as u64, "{scanned} fetched");
    assert_eq!(
        seeking,
        second.len() as u64,
        "the second read fetched only the run's own records: not the run before it, not the {later_records} records of the runs after it"
    );

    // The run gains records (a resumed run), and another run comes after.
    let more = recorded_run("ours", 1, 1, 2, 4);
    let after = run("after", 1);
    rt.block_on(produce(&config, &more));
    rt.block_on(produce(&config, &after));
    let (third, gained) = read(&config, "ours");
    assert_eq!(
        third.len(),
        first.len() + more.len(),
        "what the run gained is read"
    );
    assert!(first.iter().all(|r| third.contains(r)));
    assert!(
        gained <= (third.len() + after.len()) as u64,
        "{gained} fetched: the gap was skipped, what came since was read"
    );
    // The gap now lies past the records gained: what came between the two
    // parts of the run is read, nothing after it.
    let (fourth, between) = read(&config, "ours");
    assert_eq!(third, fourth);
    assert!(
        between <= (fourth.len() + later_records) as u64,
        "{between} fetched"
    );

    // A gap past a partition's end (another log's index): noticed, read
    // past, written again.
    let foreign = Gap {
        end: 0,
        checked: 1_000_000,
    };
    let calls = (Topic::Calls.name(), 0);
    commit_foreign(
        &config,
        &gaps_group_of("ours"),
        calls,
        foreign.pack().unwrap(),
    );
    let (fifth, read_past) = read(&config, "ours");
    assert_eq!(fourth, fifth, "nothing lost to a foreign gap");
    assert!(read_past > between, "{read_past} fetched, not {between}");
    let (sixth, mended) = read(&config, "ours");
    assert_eq!(fourth, sixth);
    assert_eq!(mended, between, "the index written again");

    // A gap inside the partition that does not follow a record of the run
    // (it starts past another run's record between the run's two parts):
    // noticed, read through, and the run's later part still read.
    let mut places: Vec<(&str, i32)> = fourth.iter().map(|r| (r.0.as_str(), r.1)).collect();
    places.dedup();
    let (place, between_parts) = places
        .into_iter()
        .find_map(|place| {
            let offsets: Vec<i64> = fourth
                .iter()
                .filter(|r| (r.0.as_str(), r.1) == place)
                .map(|r| r.2)
                .collect();
            let hole = (offsets[0]..*offsets.last()?).find(|o| !offsets.contains(o))?;
            Some((place, hole))
        })
        .expect("another run's record between the run's two parts");
    let foreign = Gap {
        end: between_parts + 1,
        checked: read_end(&config, place),
    };
    commit_foreign(
        &config,
        &gaps_group_of("ours"),
        place,
        foreign.pack().unwrap(),
    );
    let (seventh, _) = read(&config, "ours");
    assert_eq!(
        fourth, seventh,
        "nothing lost to a gap that is not the log's"
    );
}

/// The end (high watermark) of `partition` of `topic` now.
fn read_end(config: &StreamConfig, (topic, partition): (&str, i32)) -> i64 {
    ReplayReader::new(config)
        .unwrap()
        .end(topic, partition)
        .unwrap()
}
