//! `cargo bench --bench run-seek`: what one run's reads cost when the log
//! holds many other runs, against the same run alone in a log. Two private
//! brokers: one holds the measured run (12 rollouts in 3 groups, with its
//! trees and groups); the other holds `FORGELOG_BENCH_OTHERS` (default 100)
//! runs like it, then the measured run. Each per-run command is timed as a
//! user runs it (the `forgelog` binary): `export sft`, `report`, `replay
//! rebuild`, and a proxy restart with `--run` (start to `/healthz`). The
//! first read of a run scans the log and writes the run index; the figures
//! are for the reads after it, with the first reads' beside them. A third
//! broker holds the other runs after the measured one: the first read scans
//! past them and writes the gap they fill, which the reads after it skip.
//!
//! Prints `per-run read with 100x other runs in the log: export A x, report
//! B x, rebuild C x, proxy restart D s` and the log sizes.

use forgelog_consumers::{rebuild::rebuild, RewardConfig};
use forgelog_schemas::testing::recorded_run;
use forgelog_schemas::{Event, Topic};
use forgelog_stream::testing::{free_local_addr, produce, PrivateBroker};
use std::collections::BTreeMap;
use std::process::Command;
use std::time::{Duration, Instant};

const RUN: &str = "measured";

/// A recorded run's inputs (8 groups of 8 rollouts, 4 turns each) with the
/// trees and groups the consumers derive.
fn consumed(run: &str) -> Vec<Event> {
    let inputs = recorded_run(run, 8, 8, 4, 32);
    let mut by_topic: BTreeMap<Topic, Vec<Event>> = BTreeMap::new();
    for e in &inputs {
        by_topic.entry(e.topic()).or_default().push(e.clone());
    }
    let rebuilt = rebuild(&by_topic, RewardConfig::default());
    [inputs, rebuilt.trajectories, rebuilt.batches].concat()
}

/// Seconds `args` took through the binary (which must succeed).
fn timed(brokers: &str, args: &[&str]) -> f64 {
    let started = Instant::now();
    let out = Command::new(env!("CARGO_BIN_EXE_forgelog"))
        .args(args)
        .args(["--brokers", brokers])
        .output()
        .unwrap();
    let took = started.elapsed().as_secs_f64();
    assert!(
        out.status.success(),
        "forgelog {args:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    if std::env::var_os("FORGELOG_BENCH_SHOW").is_some() {
        eprintln!(
            "--- forgelog {args:?}: {took:.2} s\n{}",
            String::from_utf8_lossy(&out.stderr)
        );
    }
    took
}

/// Seconds from starting `forgelog proxy --run RUN` to its `/healthz`:
/// the restore of the run's open sessions from the log happens in between.
fn proxy_restart(rt: &tokio::runtime::Runtime, brokers: &str, upstream: &str) -> f64 {
    let listen = free_local_addr();
    let spool = tempfile::tempdir().unwrap();
    let started = Instant::now();
    let mut proxy = Command::new(env!("CARGO_BIN_EXE_forgelog"))
        .args(["proxy", "--run", RUN, "--upstream", upstream])
        .args(["--brokers", brokers, "--listen", &listen.to_string()])
        .args(["--admin-token", "fl-bench", "--spool"])
        .arg(spool.path())
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .spawn()
        .unwrap();
    let url = format!("http://{listen}/healthz");
    let took = loop {
        if rt
            .block_on(reqwest::get(&url))
            .is_ok_and(|r| r.status().is_success())
        {
            break started.elapsed().as_secs_f64();
        }
        assert!(
            started.elapsed() < Duration::from_secs(300),
            "the proxy never served"
        );
        std::thread::sleep(Duration::from_millis(20));
    };
    let _ = proxy.kill();
    let _ = proxy.wait();
    took
}

/// Records fetched and seconds taken by one read of the run's every topic
/// in this process, as the commands read it (the index written by then).
fn fetched(brokers: &str) -> (u64, f64) {
    use forgelog_stream::LogReader;
    let reader =
        forgelog_stream::ReplayReader::new(&forgelog_stream::StreamConfig::new(brokers)).unwrap();
    let started = Instant::now();
    for topic in Topic::ALL {
        reader.read_run(topic.name(), RUN).unwrap();
    }
    (reader.messages_fetched(), started.elapsed().as_secs_f64())
}

/// (first, later) seconds of each command on the log at `brokers`.
fn measure(
    rt: &tokio::runtime::Runtime,
    brokers: &str,
    upstream: &str,
) -> BTreeMap<&'static str, (f64, f64)> {
    let out = tempfile::tempdir().unwrap();
    let to = |i: usize| out.path().join(format!("sft-{i}")).display().to_string();
    let (a, b) = (to(0), to(1));
    let mut figures = BTreeMap::new();
    let pair = |f: &dyn Fn(usize) -> f64| (f(0), f(1));
    figures.insert(
        "export",
        pair(&|i| {
            timed(
                brokers,
                &["export", "sft", "--run", RUN, "--to", [&a, &b][i]],
            )
        }),
    );
    figures.insert(
        "report",
        pair(&|_| timed(brokers, &["report", "--run", RUN])),
    );
    figures.insert(
        "rebuild",
        pair(&|_| timed(brokers, &["replay", "rebuild", "--run", RUN])),
    );
    figures.insert(
        "proxy restart",
        pair(&|_| proxy_restart(rt, brokers, upstream)),
    );
    figures
}

fn main() {
    let others: usize = std::env::var("FORGELOG_BENCH_OTHERS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(100);
    let rt = tokio::runtime::Runtime::new().unwrap();
    let (upstream, _) = rt
        .block_on(forgelog_producers::fake_upstream::spawn(
            "127.0.0.1:0".parse().unwrap(),
            Default::default(),
        ))
        .unwrap();
    let upstream = format!("http://{upstream}");
    let measured = consumed(RUN);

    let alone = PrivateBroker::start().expect("a private broker");
    rt.block_on(produce(&alone.config(), &measured));
    let big = PrivateBroker::start().expect("a private broker");
    let started = Instant::now();
    let before: Vec<Event> = (0..others)
        .flat_map(|i| consumed(&format!("other-{i}")))
        .collect();
    let events = before.len();
    rt.block_on(produce(&big.config(), &before));
    rt.block_on(produce(&big.config(), &measured));
    // The same runs written after the measured one: the run index's gap past
    // the run's records.
    let after = PrivateBroker::start().expect("a private broker");
    rt.block_on(produce(&after.config(), &measured));
    rt.block_on(produce(&after.config(), &before));
    println!(
        "logs: the run alone {} events; with {others} other runs {} events (written in {:.0} s)",
        measured.len(),
        events + measured.len(),
        started.elapsed().as_secs_f64()
    );

    let small = measure(&rt, &alone.config().brokers, &upstream);
    let large = measure(&rt, &big.config().brokers, &upstream);
    let mut ratios = Vec::new();
    for (name, (first, later)) in &large {
        let (alone_first, alone_later) = small[name];
        println!(
            "{name:>14}: alone {alone_first:.2} s then {alone_later:.2} s; with {others} other runs \
             {first:.2} s (first read: scans, writes the index) then {later:.2} s"
        );
        if *name != "proxy restart" {
            ratios.push(format!("{name} {:.2} x", later / alone_later));
        }
    }
    let restart = large["proxy restart"].1;
    let later = measure(&rt, &after.config().brokers, &upstream);
    let behind: Vec<String> = later
        .iter()
        .map(|(name, (first, t))| {
            format!(
                "{name} {first:.2} s then {t:.2} s ({:.2} x)",
                t / small[name].1
            )
        })
        .collect();
    println!(
        "with the {others} other runs written after the run instead (the first read scans past them, the later ones skip them): {}",
        behind.join(", ")
    );
    // What a read costs the client (records fetched) against what it costs
    // tansu, whose fetch sums the bytes from its offset to the partition's
    // end: a run early in a long partition pays for what follows it.
    let reads: Vec<String> = [
        ("alone", &alone),
        ("after the others", &big),
        ("before the others", &after),
    ]
    .iter()
    .map(|(name, broker)| {
        let (n, took) = fetched(&broker.config().brokers);
        format!("{name} {n} records fetched in {took:.2} s")
    })
    .collect();
    println!(
        "one read of the run's topics, in process: {}",
        reads.join("; ")
    );
    println!(
        "per-run read with {others}x other runs in the log: {}, proxy restart {restart:.2} s",
        ratios.join(", ")
    );
}
