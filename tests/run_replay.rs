//! `forgelog run --replay`: each of the kit's harnesses runs a shipped
//! task in its sandbox through `forgelog run` (the fake upstream playing a
//! two-step agent), then re-runs it with `--replay` in the same image, bundle,
//! paths and home, every call answered from the recording (and once more
//! with its clock pinned at the recorded start). Each re-run must end as recorded (exit
//! status, model calls, reward, the model turns in the harness's own
//! output) with no call refused and no difference left unexplained; and a task changed since the recording must show up in the
//! report at the first call it reaches (replayed from the run's bundle, with
//! no broker, which says the task differs before anything runs).

mod support;

use forgelog_schemas::Event;
use forgelog_stream::testing::unique_run_id;
use serde_json::Value;
use std::collections::BTreeMap;
use std::process::{Command, Output};
use support::sandboxes::{assert_tool_results_hold_their_output, fixture, run_dir, stderr_of};
use support::{containers_of, shipped, variant};

/// Every harness of the kit's table.
fn kit() -> Vec<&'static str> {
    forgelog_deploy::harness::pinned().map(|h| h.name).collect()
}

fn replay(brokers: &str, tasks: &std::path::Path, run: &str, extra: &[&str]) -> (Output, Value) {
    let dir = tempfile::tempdir().unwrap();
    let report = dir.path().join("report.json");
    let out = Command::new(env!("CARGO_BIN_EXE_forgelog"))
        .arg("run")
        .arg(tasks)
        .args(["--replay", run, "--brokers", brokers, "--concurrency", "4"])
        .arg("--report")
        .arg(&report)
        .args(extra)
        .output()
        .unwrap();
    eprintln!(
        "forgelog run --replay {run}: {}\n{}",
        out.status,
        String::from_utf8_lossy(&out.stdout)
    );
    let report = std::fs::read(&report)
        .map(|b| serde_json::from_slice(&b).unwrap())
        .unwrap_or_else(|e| panic!("no report ({e}): {}", stderr_of(&out)));
    (out, report)
}

/// The fake agent's turns in a harness's output, in order: "Running step N",
/// "Done after N".
fn model_turns(text: &str) -> Vec<String> {
    let mut turns: Vec<(usize, String)> = ["Running step ", "Done after "]
        .iter()
        .flat_map(|p| {
            text.match_indices(p).map(move |(i, _)| {
                let n: String = text[i + p.len()..]
                    .chars()
                    .take_while(char::is_ascii_digit)
                    .collect();
                (i, format!("{p}{n}"))
            })
        })
        .collect();
    turns.sort();
    turns.into_iter().map(|(_, t)| t).collect()
}

#[test]
fn every_kit_harness_replays_as_recorded_and_a_changed_task_shows_where_it_diverges() {
    let f = fixture();
    let run = unique_run_id("replay-kit");
    let out = f
        .command(&shipped(), &run, &kit().join(","), 1)
        .args(["--task", "hello-file"])
        .output()
        .unwrap();
    assert!(out.status.success(), "{}", stderr_of(&out));
    let recorded = f.events(&run);

    assert_tool_results_hold_their_output(&recorded);

    let (out, report) = replay(&f.stream.brokers, &shipped(), &run, &[]);
    let attempts = report["attempts"].as_array().unwrap();
    assert_eq!(attempts.len(), kit().len(), "{report:#}");
    for a in attempts {
        assert_eq!(a["differences"], serde_json::json!([]), "{a:#}");
        assert_eq!(a["replayed"], a["recorded"], "{a:#}");
        // Every harness reached the model and exited 0.
        assert!(a["recorded"]["model_calls"].as_i64().unwrap() >= 1, "{a:#}");
        assert_eq!(a["recorded"]["exit_status"], 0, "{a:#}");
    }
    assert_eq!(report["refused"], serde_json::json!([]), "{report:#}");
    // Every difference is explained (volatile text): none is the harness
    // doing something else. (Qwen Code's one-shot shell lost a quick
    // command's output, `Output: (empty)`, and Gemini CLI listed its skills
    // in glob order, until their launch scripts chose the PTY shell and
    // turned skills off.)
    let harness_of: BTreeMap<String, String> = recorded
        .iter()
        .filter_map(|e| match e {
            Event::RolloutStarted(r) => Some((r.session_id.clone(), r.harness.clone())),
            _ => None,
        })
        .collect();
    let unexplained: Vec<(&String, &Value)> = report["divergences"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|d| d["explained"] == false)
        .map(|d| (&harness_of[d["session_id"].as_str().unwrap()], d))
        .collect();
    assert!(
        unexplained.is_empty(),
        "unexplained differences: {unexplained:#?}"
    );
    assert!(
        out.status.success(),
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        stderr_of(&out)
    );
    // The harnesses' own output holds their model turns (the fake agent's
    // "Running step N." and "Done after N steps."): the same, in the same
    // order, as when recorded.
    let turns = |dir: &str, harness: &str| {
        let out = std::fs::read_to_string(
            run_dir(dir)
                .join("attempts")
                .join(format!("{run}-hello-file-{harness}-0"))
                .join("stdout"),
        )
        .unwrap();
        model_turns(&out)
    };
    for harness in kit() {
        let recorded_turns = turns(&run, harness);
        assert!(
            !recorded_turns.is_empty(),
            "{harness}: no model turn in its output"
        );
        assert_eq!(
            turns(&format!("{run}.replay"), harness),
            recorded_turns,
            "{harness}'s model turns"
        );
    }
    // The replay recorded nothing in the recorded run.
    assert_eq!(f.events(&run).len(), recorded.len());
    assert_eq!(
        containers_of(&format!("{run}.replay")),
        0,
        "sandboxes left behind"
    );

    // Claude Code again, its clock pinned at the recorded start (libfaketime
    // in its sandbox; Claude Code writes today's date into its prompt).
    let claude = format!("{run}-hello-file-claude-code-0");
    let (out, report) = replay(
        &f.stream.brokers,
        &shipped(),
        &run,
        &["--rollout", &claude, "--pin-clock"],
    );
    assert!(out.status.success(), "{report:#}{}", stderr_of(&out));
    assert_eq!(report["attempts"][0]["differences"], serde_json::json!([]));
    assert!(
        String::from_utf8_lossy(&out.stderr).contains("clocks pinned"),
        "{}",
        stderr_of(&out)
    );

    // The task changed since the recording: the re-run is still answered from
    // the recording, and the report names the first call that differs and
    // what differs in it.
    let changed = tempfile::tempdir().unwrap();
    variant(
        changed.path(),
        "hello-file",
        "instruction.md",
        "Create a file hello.txt containing the word goodbye, then say done.\n",
    );
    // The recording read from the run's bundle, with no broker: the bundle
    // holds the task's hash, so the change is said before anything runs.
    let bundle = tempfile::tempdir().unwrap();
    let bundle = bundle.path().join("run.bundle.avro");
    let out = Command::new(env!("CARGO_BIN_EXE_forgelog"))
        .args([
            "export",
            "bundle",
            "--run",
            &run,
            "--brokers",
            &f.stream.brokers,
        ])
        .arg("--to")
        .arg(&bundle)
        .arg("--tasks")
        .arg(shipped())
        .output()
        .unwrap();
    assert!(out.status.success(), "{}", stderr_of(&out));
    let no_broker = forgelog_stream::testing::free_local_addr().to_string();
    let rollout = format!("{run}-hello-file-mini-swe-agent-0");
    let (out, report) = replay(
        &no_broker,
        changed.path(),
        &run,
        &["--rollout", &rollout, "--bundle", bundle.to_str().unwrap()],
    );
    assert!(
        String::from_utf8_lossy(&out.stderr)
            .contains("warning: task/hello-file differs from the one the bundle's run used"),
        "{}",
        stderr_of(&out)
    );
    assert_eq!(out.status.code(), Some(1), "{}", stderr_of(&out));
    assert_eq!(report["attempts"].as_array().unwrap().len(), 1);
    let first = &report["divergences"][0];
    assert_eq!(first["call_index"], 0, "{report:#}");
    assert_eq!(first["explained"], false, "{report:#}");
    assert!(
        first["detail"].as_str().unwrap().contains("goodbye"),
        "{first:#}"
    );
    assert!(
        String::from_utf8_lossy(&out.stderr).contains("calls differed unexplained"),
        "{}",
        stderr_of(&out)
    );
}
