//! The closed loop through a real broker, on the embedded default:
//! `forgelog up --demo --train --steps 2` — demo rollouts through the proxy to
//! the engine (SmolLM2, CPU), the consumers' groups, the learner's steps,
//! `PolicyPublished`, the engine's reload, the next round sampled by the new
//! version — then the log is read back.

use forgelog_schemas::{Event, Topic};
use forgelog_stream::testing::{free_local_addr, shared_broker, unique_run_id};
use forgelog_stream::{ReplayReader, StartAt};
use std::collections::BTreeSet;
use std::process::Command;

#[test]
fn the_loop_closes_through_the_log_and_each_version_is_served() {
    let rt = tokio::runtime::Runtime::new().unwrap();
    let config = rt.block_on(shared_broker());
    let home = tempfile::tempdir().unwrap();
    let run = unique_run_id("loop");
    let out = Command::new(env!("CARGO_BIN_EXE_forgelog"))
        .args(["up", "--demo", "--train", "--steps", "2"])
        .args(["--brokers", &config.brokers, "--run", &run])
        .args(["--engine-listen", &free_local_addr().to_string()])
        .args(["--proxy-listen", &free_local_addr().to_string()])
        .arg("--home")
        .arg(home.path().join("state"))
        .arg("--export-to")
        .arg(home.path().join("data"))
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        out.status.success(),
        "{stdout}\n{}",
        &stderr[stderr.len().saturating_sub(3000)..]
    );
    eprintln!("{stdout}");
    let last_line = stdout.lines().rev().find(|l| !l.trim().is_empty());
    assert!(
        last_line.is_some_and(|l| l.starts_with("reward first 5 versions: ")),
        "the loop's outcome is the last line: {stdout}"
    );

    let reader = ReplayReader::new(&config).unwrap();
    let read = |topic: Topic| -> Vec<Event> {
        reader
            .read(topic.name(), StartAt::Beginning, Some(&run))
            .unwrap()
            .into_iter()
            .filter_map(|r| r.event.ok())
            .collect()
    };
    let published: Vec<_> = read(Topic::Policy)
        .into_iter()
        .filter_map(|e| match e {
            Event::PolicyPublished(p) => Some(p),
            _ => None,
        })
        .collect();
    let versions: Vec<i64> = published.iter().map(|p| p.version).collect();
    assert_eq!(versions, [1, 2], "contiguous versions, one per step");
    // Every version but the last (published after the last round) served
    // calls: version 1 through the engine's reload.
    let served: BTreeSet<i64> = read(Topic::Calls)
        .into_iter()
        .filter_map(|e| match e {
            Event::CallFinished(c) => c.policy_version,
            _ => None,
        })
        .collect();
    for v in [0, 1] {
        assert!(
            served.contains(&v),
            "version {v} served no call: {served:?}"
        );
    }
    // A step on tokens its own version sampled: the learner's logprobs are
    // the engine's (importance ratio 1).
    // (A round whose groups all scored alike gives a step with no tokens:
    // it publishes no ratios at all.)
    for p in &published {
        let trained = p.metrics.get("tokens").is_some_and(|&t| t > 0.0);
        assert_eq!(p.metrics.contains_key("is_ratio_mean"), trained, "{p:?}");
    }
    let on_policy: Vec<_> = published
        .iter()
        .filter(|p| p.metrics.get("staleness_max") == Some(&0.0))
        .filter(|p| p.metrics.get("tokens").is_some_and(|&t| t > 0.0))
        .collect();
    if on_policy.is_empty() {
        eprintln!("no on-policy step trained any token in this run: {published:?}");
    }
    for p in on_policy {
        for k in ["is_ratio_min", "is_ratio_max", "is_ratio_mean"] {
            let r = p.metrics[k];
            assert!((r - 1.0).abs() < 1e-3, "version {}: {k} {r}", p.version);
        }
    }
}
