//! `forgelog up --demo` end to end on the real engine (SmolLM2), proxy,
//! consumers and broker: it runs to its summary, the summary agrees with the
//! log, the run rebuilds identically, and the SFT export it leaves is sound.

mod support;

use forgelog_stream::testing::{free_local_addr, shared_broker, unique_run_id};
use std::process::Command;

fn forgelog() -> Command {
    Command::new(env!("CARGO_BIN_EXE_forgelog"))
}

/// The summary table's row for `name`, as numbers (the last column's "(n signal)" dropped).
fn row(stdout: &str, name: &str) -> Vec<f64> {
    let line = stdout
        .lines()
        .find(|l| l.split_whitespace().next() == Some(name))
        .unwrap_or_else(|| panic!("no {name} row in:\n{stdout}"));
    line.split_whitespace()
        .skip(1)
        .filter_map(|c| c.trim_start_matches('(').parse().ok())
        .collect()
}

/// `forgelog up --demo` of `run` on `brokers`, in `home`.
fn up_demo(brokers: &str, run: &str, home: &std::path::Path) -> Command {
    let mut up = forgelog();
    up.args(["up", "--demo", "--json", "--brokers", brokers, "--run", run])
        .args(["--engine-listen", &free_local_addr().to_string()])
        .args(["--proxy-listen", &free_local_addr().to_string()])
        .arg("--home")
        .arg(home.join("state"))
        .arg("--export-to")
        .arg(home.join("data"));
    up
}

/// The events of `run` on `topic`, as `forgelog tail` prints them.
fn tail(brokers: &str, topic: &str, run: &str) -> Vec<serde_json::Value> {
    let tail = forgelog()
        .args(["tail", topic, "--from-beginning", "--run", run])
        .args(["--brokers", brokers])
        .output()
        .unwrap();
    assert!(tail.status.success());
    String::from_utf8_lossy(&tail.stdout)
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect()
}

/// Another demo runs on the same log at the same time: each `up` derives its
/// own run's trees and groups, so neither run's are in the log twice.
#[test]
fn up_demo_runs_to_its_summary_and_leaves_a_sound_export() {
    let rt = tokio::runtime::Runtime::new().unwrap();
    let config = rt.block_on(shared_broker());
    let home = tempfile::tempdir().unwrap();
    let data = home.path().join("data");
    let run = unique_run_id("demo");
    let (beside, beside_home) = (unique_run_id("demo-beside"), tempfile::tempdir().unwrap());
    let mut neighbour = up_demo(&config.brokers, &beside, beside_home.path())
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .spawn()
        .unwrap();
    let out = up_demo(&config.brokers, &run, home.path())
        .output()
        .unwrap();
    assert!(neighbour.wait().unwrap().success());
    for r in [&run, &beside] {
        let trees = tail(&config.brokers, "forgelog.trajectories", r).len();
        let groups = tail(&config.brokers, "forgelog.batches", r).len();
        assert_eq!(
            (trees, groups),
            (16, 4),
            "run {r}'s trees and groups in the log"
        );
    }
    let json = String::from_utf8_lossy(&out.stdout).to_string();
    // With --json the words (the table among them) go to stderr.
    let stdout = String::from_utf8_lossy(&out.stderr).to_string();
    assert!(out.status.success(), "{json}\n{stdout}");
    let summary: serde_json::Value =
        serde_json::from_str(&json).unwrap_or_else(|e| panic!("{e}: {json}"));
    assert_eq!(summary["run"], run.as_str());

    // 2 dialects × 2 tasks, 4 rollouts a group; every rollout made 1..=4 calls
    // and got a tree and a verifier reward; every group became a GRPO batch.
    let total = row(&stdout, "total");
    let (rollouts, calls, tools, sampled, trees, rewards) =
        (total[0], total[1], total[2], total[3], total[4], total[5]);
    assert_eq!(rollouts, 16.0, "{stdout}");
    assert!((16.0..=64.0).contains(&calls), "{stdout}");
    assert!(sampled >= calls, "{stdout}");
    assert_eq!((trees, rewards), (16.0, 16.0), "{stdout}");
    assert_eq!(total[7], 4.0, "groups: {stdout}");
    for harness in ["demo-openai-chat", "demo-anthropic"] {
        assert_eq!(row(&stdout, harness)[0], 8.0, "{stdout}");
        // The JSON says what the table says.
        let r = &summary["by_harness"][harness];
        let table = row(&stdout, harness);
        assert_eq!(r["rollouts"].as_f64(), Some(table[0]), "{json}");
        assert_eq!(r["model_calls"].as_f64(), Some(table[1]), "{json}");
    }

    // The run re-derives identically from its recorded inputs.
    let rebuilt = forgelog()
        .args([
            "replay",
            "rebuild",
            "--run",
            &run,
            "--brokers",
            &config.brokers,
        ])
        .output()
        .unwrap();
    let said = String::from_utf8_lossy(&rebuilt.stdout);
    let rebuilt_json = forgelog()
        .args([
            "replay",
            "rebuild",
            "--json",
            "--run",
            &run,
            "--brokers",
            &config.brokers,
        ])
        .output()
        .unwrap();
    let verdict: serde_json::Value = serde_json::from_slice(&rebuilt_json.stdout).unwrap();
    assert_eq!(
        (
            &verdict["identical"],
            &verdict["trajectories"],
            &verdict["batches"]
        ),
        (&true.into(), &16.into(), &4.into()),
        "{verdict}"
    );
    // The table's tool calls are the trees' (read back from the log here).
    let trajectories = tail(&config.brokers, "forgelog.trajectories", &run);
    let logged: u64 = trajectories
        .iter()
        .map(|t| t["tool_calls"].as_u64().unwrap())
        .sum();
    assert_eq!(tools, logged as f64, "{stdout}");
    // Token in: the proxy spliced each follow-up call onto the ids the model
    // sampled, so no prompt re-tokenized them and every rollout (no
    // sub-agents, no compaction here) is one path through all its calls.
    for t in &trajectories {
        let drift: Vec<_> = t["findings"]
            .as_array()
            .unwrap()
            .iter()
            .filter(|f| f["kind"] == "drift")
            .collect();
        assert!(drift.is_empty(), "{drift:?}");
        assert_eq!(t["sequences"].as_array().unwrap().len(), 1, "{t}");
    }
    assert!(
        said.contains(&format!(
            "identical: 16 trajectories, 4 batches of run {run}"
        )),
        "{said}{}",
        String::from_utf8_lossy(&rebuilt.stderr)
    );

    // The export: one JSONL and one Parquet per harness, rows in OpenAI chat
    // form ending with the model's sampled turn, counted by the manifest.
    let dir = data.join(&run);
    let manifest: serde_json::Value =
        serde_json::from_slice(&std::fs::read(dir.join("manifest.json")).unwrap()).unwrap();
    let mut rows = 0;
    for harness in ["demo-openai-chat", "demo-anthropic"] {
        assert!(dir.join(harness).join("sft.parquet").is_file());
        let jsonl = std::fs::read_to_string(dir.join(harness).join("sft.jsonl")).unwrap();
        for line in jsonl.lines() {
            let r: serde_json::Value = serde_json::from_str(line).unwrap();
            let messages = r["messages"].as_array().unwrap();
            assert_eq!(messages[0]["role"], "system");
            assert_eq!(messages.last().unwrap()["role"], "assistant", "{line}");
            assert_eq!(r["tools"][0]["function"]["name"], "calculator");
            assert!(r["reward"].is_number(), "{line}");
            rows += 1;
        }
        // What a user does next: load it with Hugging Face datasets.
        let loaded = support::load_with_datasets(&dir.join(harness).join("sft.jsonl"));
        assert_eq!(loaded["rows"], jsonl.lines().count(), "{loaded}");
        assert_eq!(loaded["roles"][0], "system", "{loaded}");
    }
    assert!(rows >= 16, "a row per path, at least one per rollout");
    let sum = |field: &str| -> u64 {
        manifest[field]
            .as_object()
            .unwrap()
            .values()
            .map(|v| v.as_u64().unwrap())
            .sum()
    };
    assert_eq!(sum("jsonl_rows"), rows);
    assert_eq!(sum("rows"), rows, "every path has its chat view");
    assert!(
        stdout.contains(&format!("SFT export: {rows} rows")),
        "{stdout}"
    );
    assert_eq!(
        summary["export"]["manifest"]["rows"], manifest["rows"],
        "{json}"
    );
}

/// A learner that fails in the loop (its first version cannot be written: a
/// file is in the way, as a full disk was in CI) ends `up --demo --train`
/// with the learner's reason once it fails, rather than leaving the demo
/// waiting ten minutes for a version nobody will publish.
#[test]
fn a_learner_that_fails_in_the_loop_ends_up_demo_train_with_its_reason() {
    let rt = tokio::runtime::Runtime::new().unwrap();
    let config = rt.block_on(shared_broker());
    let home = tempfile::tempdir().unwrap();
    let run = unique_run_id("demo-learner-fails");
    let versions = home.path().join("state/checkpoints").join(&run);
    std::fs::create_dir_all(&versions).unwrap();
    std::fs::write(versions.join("v000001"), "in the way").unwrap();
    let out = up_demo(&config.brokers, &run, home.path())
        .args(["--train", "--steps", "2"])
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr).to_string();
    eprintln!("{stderr}");
    assert!(!out.status.success());
    assert!(
        stderr.contains("the learner failed") && stderr.contains("v000001"),
        "the learner's reason, naming what it could not write: {stderr}"
    );
    // It failed while the demo waited for version 1, after round 0's groups.
    assert!(tail(&config.brokers, "forgelog.policy", &run).is_empty());
    assert_eq!(tail(&config.brokers, "forgelog.batches", &run).len(), 4);
}
