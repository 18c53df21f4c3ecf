//! The run index (`forgelog_stream::run_index`) on a real broker: a run's
//! read scans once and writes where the run starts; every later read of the
//! run seeks there and fetches only the run's own records when the other
//! runs came before it; an index that is not this log's (past a partition's
//! end) is noticed, read past, and written again.

use forgelog_schemas::testing::recorded_run;
use forgelog_schemas::{Received, Topic};
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
    let topic = Topic::Calls.name();
    let mut client = ClientConfig::new();
    client
        .set("bootstrap.servers", &config.brokers)
        .set("group.id", forgelog_stream::run_index::group_of("ours"));
    let client: BaseConsumer = client.create().unwrap();
    let mut foreign = TopicPartitionList::new();
    foreign
        .add_partition_offset(topic, 0, Offset::Offset(1_000_000))
        .unwrap();
    client.commit(&foreign, CommitMode::Sync).unwrap();
    let (third, read_past) = read(&config, "ours");
    assert_eq!(first, third, "nothing lost to a foreign index");
    assert!(read_past > seeking, "{read_past} fetched, not {seeking}");
    let (fourth, mended) = read(&config, "ours");
    assert_eq!(first, fourth);
    assert_eq!(mended, seeking, "the index written again");
}
