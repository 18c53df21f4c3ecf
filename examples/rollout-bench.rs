//! The rollout bench: `forgelog run` on the shipped tasks with real harnesses
//! in podman sandboxes, against the fake upstream (a two-step agent) and a
//! broker of its own. Prints, per harness, the time from a rollout's session
//! to its first model call (network namespace, container start, harness
//! start-up: p50/p99), the rollouts per minute, and the orchestrator's CPU
//! per rollout as `forgelog run` reports it.
//!
//! ```sh
//! cargo build --bin forgelog --example rollout-bench
//! target/debug/examples/rollout-bench [HARNESSES] [GROUP_SIZE] [CONCURRENCY]
//! ```
//! (defaults: the four harnesses, 2, 8). Root: sandboxes need network namespaces.

use forgelog_producers::fake_upstream::{self, FakeOptions};
use forgelog_schemas::{Event, Topic};
use forgelog_stream::testing::PrivateBroker;
use forgelog_stream::{ReplayReader, StartAt, StreamConfig};
use std::collections::BTreeMap;
use std::path::Path;
use std::process::Command;
use std::time::Instant;

fn percentile(sorted: &[i64], p: f64) -> i64 {
    sorted[((sorted.len() - 1) as f64 * p).round() as usize]
}

fn main() {
    let mut args = std::env::args().skip(1);
    let harnesses = args
        .next()
        .unwrap_or_else(|| "claude-code,codex,opencode,mini-swe-agent".into());
    let group: usize = args.next().map_or(2, |g| g.parse().expect("GROUP_SIZE"));
    let concurrency: usize = args.next().map_or(8, |c| c.parse().expect("CONCURRENCY"));
    let exe = std::env::current_exe().unwrap();
    let forgelog = exe.parent().unwrap().parent().unwrap().join("forgelog");
    assert!(
        forgelog.exists(),
        "build it first: cargo build --bin forgelog"
    );
    let tasks = Path::new(env!("CARGO_MANIFEST_DIR")).join("deploy/tasks");

    let rt = tokio::runtime::Runtime::new().unwrap();
    let broker = PrivateBroker::start().expect("tansu (scripts/setup.sh installs it)");
    let stream = StreamConfig::new(broker.addr.to_string());
    let (upstream, _) = rt
        .block_on(fake_upstream::spawn(
            "127.0.0.1:0".parse().unwrap(),
            FakeOptions {
                agent_steps: Some(2),
                ..Default::default()
            },
        ))
        .unwrap();
    let run = format!("bench-{}", std::process::id());
    let started = Instant::now();
    let out = Command::new(&forgelog)
        .arg("run")
        .arg(&tasks)
        .args(["--harness", &harnesses, "--run", &run])
        .args(["--group-size", &group.to_string()])
        .args(["--concurrency", &concurrency.to_string()])
        .args(["--upstream", &format!("http://{upstream}")])
        .args(["--brokers", &stream.brokers, "--max-model-calls", "8"])
        .output()
        .unwrap();
    let wall = started.elapsed().as_secs_f64();
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "{stdout}{}",
        String::from_utf8_lossy(&out.stderr)
    );

    let reader = ReplayReader::new(&stream).unwrap();
    let mut session_at: BTreeMap<String, (String, i64)> = BTreeMap::new();
    let mut first_call: BTreeMap<String, i64> = BTreeMap::new();
    for topic in [Topic::Rollouts, Topic::Calls] {
        for r in reader
            .read(topic.name(), StartAt::Beginning, Some(&run))
            .unwrap()
        {
            match r.event.unwrap() {
                Event::RolloutStarted(s) => {
                    session_at.insert(s.rollout_id, (s.harness, s.started_at_ms));
                }
                Event::CallStarted(c) => {
                    let t = first_call.entry(c.rollout_id).or_insert(c.received_at_ms);
                    *t = (*t).min(c.received_at_ms);
                }
                _ => {}
            }
        }
    }
    let mut by_harness: BTreeMap<String, Vec<i64>> = BTreeMap::new();
    for (rollout, (harness, at)) in &session_at {
        if let Some(first) = first_call.get(rollout) {
            by_harness
                .entry(harness.clone())
                .or_default()
                .push(first - at);
        }
    }
    println!("{stdout}");
    println!("session to first model call (network, container, harness start-up):");
    for (h, mut ms) in by_harness {
        ms.sort();
        println!(
            "  {h:<16} p50 {:>6} ms  p99 {:>6} ms  ({} rollouts)",
            percentile(&ms, 0.5),
            percentile(&ms, 0.99),
            ms.len()
        );
    }
    let n = session_at.len();
    println!(
        "{n} rollouts in {wall:.1} s at concurrency {concurrency}: {:.1} rollouts/minute",
        n as f64 * 60.0 / wall
    );
}
