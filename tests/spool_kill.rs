//! `kill -9` the process draining a spool, again and again: every event still
//! reaches the log exactly once and in order.

use forgelog_schemas::{testing::call_finished, Codec, Event, Topic};
use forgelog_stream::spool::Checkpoint;
use forgelog_stream::testing::{shared_broker, unique_run_id};
use forgelog_stream::{ReplayReader, Spool, SpoolOptions, StartAt, StreamConfig};
use std::collections::{BTreeMap, HashSet};
use std::process::{Child, Command};
use std::time::{Duration, Instant};

const N: usize = 10_000;
const SESSIONS: usize = 20;

fn drain(config: &StreamConfig, dir: &std::path::Path) -> Child {
    Command::new(env!("CARGO_BIN_EXE_forgelog"))
        .args(["spool", "drain", "--dir"])
        .arg(dir)
        .args(["--brokers", &config.brokers])
        .spawn()
        .unwrap()
}

#[test]
fn killing_the_drainer_mid_drain_loses_and_duplicates_nothing() {
    let rt = tokio::runtime::Runtime::new().unwrap();
    let config = rt.block_on(shared_broker());
    let run = unique_run_id("drain-kill");
    let dir = tempfile::tempdir().unwrap();
    {
        // What a proxy leaves behind when the broker was away: a full spool.
        let spool = Spool::open(dir.path(), SpoolOptions::default()).unwrap();
        for i in 0..N {
            let e: Event = call_finished(
                &run,
                &format!("s{}", i % SESSIONS),
                (i / SESSIONS) as i64,
                2_000,
                64,
            )
            .into();
            spool
                .append(
                    e.topic().name(),
                    e.key().as_bytes(),
                    &Codec::global().encode(&e).unwrap(),
                )
                .unwrap();
        }
    }
    // Each drainer is killed as soon as its checkpoint passes the next fifth:
    // a local signal, so a fast drain cannot finish between two polls of the
    // broker. Up to a window of records is then in flight or delivered but not
    // checkpointed, which is what the next drainer's recovery scan must sort out.
    let mut kills_mid_drain = 0;
    for k in 1..=4 {
        let mut child = drain(&config, dir.path());
        let target = (k * N / 5) as u64;
        let deadline = Instant::now() + Duration::from_secs(120);
        loop {
            assert!(Instant::now() < deadline, "drain made no progress");
            if child.try_wait().unwrap().is_some() {
                break;
            }
            let acked = Checkpoint::load(dir.path()).map_or(0, |c| c.acked_through);
            if acked >= target {
                child.kill().unwrap(); // SIGKILL
                child.wait().unwrap();
                if acked < N as u64 {
                    kills_mid_drain += 1;
                }
                break;
            }
            std::thread::sleep(Duration::from_millis(1));
        }
    }
    assert!(
        kills_mid_drain >= 2,
        "only {kills_mid_drain} kills landed mid-drain"
    );
    let status = drain(&config, dir.path()).wait().unwrap();
    assert!(status.success(), "final drain failed: {status}");

    let got = ReplayReader::new(&config)
        .unwrap()
        .read(Topic::Calls.name(), StartAt::Beginning, Some(&run))
        .unwrap();
    let mut seen = HashSet::new();
    let mut last: BTreeMap<Vec<u8>, i64> = BTreeMap::new();
    for r in &got {
        let Ok(Event::CallFinished(c)) = &r.event else {
            panic!("{:?}", r.event)
        };
        assert!(
            seen.insert(c.event_id.clone()),
            "duplicate: session {} call {}",
            c.session_id,
            c.call_index
        );
        let prev = last.insert(r.key.clone(), c.call_index);
        assert!(
            prev.is_none_or(|p| p < c.call_index),
            "out of order in session {}",
            c.session_id
        );
    }
    assert_eq!(seen.len(), N, "events lost");
    println!("{kills_mid_drain} kills mid-drain; {N} events arrived exactly once, in order");
}
