//! `cargo bench -p forgelog-stream`: prints encode, spool append and produce
//! throughput, the largest `send` latency while the broker is unreachable, and
//! how fast a reader of one run reads its events and skips other runs'.
//! Produce and read figures need a broker at FORGELOG_BROKERS (default
//! 127.0.0.1:9092).

use forgelog_schemas::{testing, Codec, Event};
use forgelog_stream::{
    admin, EventProducer, ReplayReader, Spool, SpoolOptions, StartAt, StreamConfig,
};
use std::time::{Duration, Instant};

const PROMPT: usize = 2_000;
const COMPLETION: usize = 256;

fn events(n: usize, run: &str) -> Vec<Event> {
    (0..n)
        .map(|i| {
            testing::call_finished(run, &format!("s{}", i % 64), i as i64, PROMPT, COMPLETION)
                .into()
        })
        .collect()
}

fn report(what: &str, n: usize, bytes: usize, t: Duration) {
    let s = t.as_secs_f64();
    println!(
        "{what:<34} {:>10.0} events/s {:>8.1} MB/s  ({n} events, {:.2}s)",
        n as f64 / s,
        bytes as f64 / s / 1e6,
        s
    );
}

fn main() {
    let n = 20_000;
    let run = format!("bench-{}", std::process::id());
    let evs = events(n, &run);
    let codec = Codec::global();
    println!("events: CallFinished with {PROMPT} prompt + {COMPLETION} sampled tokens");

    let t = Instant::now();
    let encoded: Vec<Vec<u8>> = evs.iter().map(|e| codec.encode(e).unwrap()).collect();
    let bytes: usize = encoded.iter().map(Vec::len).sum();
    report("encode", n, bytes, t.elapsed());
    let t = Instant::now();
    for b in &encoded {
        std::hint::black_box(codec.decode(b).unwrap());
    }
    report("decode", n, bytes, t.elapsed());

    let dir = tempfile::tempdir().unwrap();
    let spool = Spool::open(dir.path(), SpoolOptions::default()).unwrap();
    let t = Instant::now();
    for (e, b) in evs.iter().zip(&encoded) {
        spool
            .append(e.topic().name(), e.key().as_bytes(), b)
            .unwrap();
    }
    report("spool append (fsync never)", n, bytes, t.elapsed());
    drop(spool);

    let rt = tokio::runtime::Runtime::new().unwrap();
    rt.block_on(async {
        // Broker down: nothing listens on port 1.
        let dir = tempfile::tempdir().unwrap();
        let down = EventProducer::start(
            &StreamConfig::new("127.0.0.1:1"),
            dir.path(),
            SpoolOptions::default(),
        )
        .unwrap();
        let mut latencies = Vec::with_capacity(10_000);
        let t = Instant::now();
        for e in evs.iter().take(10_000) {
            let s = Instant::now();
            down.send(e).unwrap();
            latencies.push(s.elapsed());
        }
        report("send, broker down", 10_000, bytes / 2, t.elapsed());
        latencies.sort();
        let us = |d: Duration| d.as_secs_f64() * 1e6;
        println!(
            "{:<34} p50 {:.1} µs, p99 {:.1} µs, max {:.1} µs",
            "send latency, broker down",
            us(latencies[latencies.len() / 2]),
            us(latencies[latencies.len() * 99 / 100]),
            us(latencies[latencies.len() - 1])
        );
        drop(down);

        let config = StreamConfig::new(forgelog_stream::default_brokers());
        if let Err(e) = admin::create_topics(&config, &Default::default()).await {
            println!("produce: skipped, no broker at {} ({e})", config.brokers);
            return;
        }
        let dir = tempfile::tempdir().unwrap();
        let producer = EventProducer::start(&config, dir.path(), SpoolOptions::default()).unwrap();
        let t = Instant::now();
        for e in &evs {
            producer.send(e).unwrap();
        }
        let sent = t.elapsed();
        producer.close(Duration::from_secs(600)).await.unwrap();
        println!(
            "{:<34} {:>10.2} s",
            "send (all, into spool)",
            sent.as_secs_f64()
        );
        report("produce to broker (acks=all)", n, bytes, t.elapsed());

        // The partitions' ends before this bench's events: a run's reader
        // fetches everything from the start it is given and keeps its run.
        let reader = ReplayReader::new(&config).unwrap();
        let topic = forgelog_schemas::Topic::Calls.name();
        for (what, wanted) in [
            ("read this run (decoded)", run.as_str()),
            ("read another run (these skipped)", "another-run"),
        ] {
            let t = Instant::now();
            let (mut seen, mut kept) = (0usize, 0usize);
            for partition in reader.partitions(topic).unwrap() {
                let (lo, hi) = reader.watermarks(topic, partition).unwrap();
                seen += (hi - lo) as usize;
            }
            reader
                .for_each(topic, StartAt::Beginning, Some(wanted), |_| {
                    kept += 1;
                    std::ops::ControlFlow::Continue(())
                })
                .unwrap();
            let s = t.elapsed().as_secs_f64();
            println!(
                "{what:<34} {:>10.0} events/s  ({seen} events in {topic}, {kept} kept, {s:.2}s)",
                seen as f64 / s
            );
        }
    });
}
