//! `forgelog tasks check` with real podman sandboxes (runc, images built from
//! the local base image, scripts/base-image.sh): every shipped task's reference
//! solution scores 1 through its own verifier; and every way a rollout can
//! fail comes out as its typed status with a null reward, never a 0, with no
//! sandbox left behind.

mod support;

use std::path::Path;
use std::process::{Command, Output};
use support::{containers_of, faulty_variants, shipped, variant};

fn tasks_check(dir: &Path, run: &str) -> Output {
    Command::new(env!("CARGO_BIN_EXE_forgelog"))
        .args(["tasks", "check", "--run", run])
        .arg(dir)
        .output()
        .unwrap()
}

/// (task, status, reward) per line of the report.
fn report(out: &Output) -> Vec<(String, String, String)> {
    String::from_utf8_lossy(&out.stdout)
        .lines()
        .filter(|l| !l.starts_with("tasks:"))
        .map(|l| {
            let w: Vec<&str> = l.split_whitespace().collect();
            (w[0].to_string(), w[1].to_string(), w[3].to_string())
        })
        .collect()
}

/// Both task sets: the main one and the learning curve's (scripts/curve.sh),
/// whose commands file must hold each of its tasks' answers.
#[test]
fn every_shipped_solution_scores_one_through_its_own_verifier() {
    let curve = Path::new(env!("CARGO_MANIFEST_DIR")).join("deploy/curve-tasks");
    for (dir, at_least) in [(shipped(), 12), (curve.clone(), 4)] {
        let run = format!("shipped-{}", std::process::id());
        let out = tasks_check(&dir, &run);
        let said = String::from_utf8_lossy(&out.stdout);
        assert!(
            out.status.success(),
            "{said}{}",
            String::from_utf8_lossy(&out.stderr)
        );
        let rows = report(&out);
        assert!(rows.len() >= at_least, "{said}");
        for (task, status, reward) in &rows {
            assert_eq!(
                (status.as_str(), reward.as_str()),
                ("scored", "1"),
                "{task}: {said}"
            );
        }
        assert!(
            said.contains(&format!("tasks: {} passed, 0 failed", rows.len())),
            "{said}"
        );
    }
    // The curve's grammar offers each task's answer: its solution's last line.
    let commands = std::fs::read_to_string(curve.join("commands.txt")).unwrap();
    for task in std::fs::read_dir(&curve).unwrap() {
        let task = task.unwrap().path();
        if !task.is_dir() {
            continue;
        }
        let solve = std::fs::read_to_string(task.join("solution/solve.sh")).unwrap();
        let answer = solve.lines().last().unwrap();
        assert!(
            commands.lines().any(|c| c == answer),
            "{}'s answer `{answer}` is not among the curve's commands",
            task.display()
        );
    }
}

#[test]
fn each_failure_is_its_typed_status_with_a_null_reward_and_no_sandbox_is_left() {
    let root = tempfile::tempdir().unwrap();
    let r = root.path();
    faulty_variants(r);
    variant(r, "agent-fails", "solution/solve.sh", "exit 4\n");

    let run = format!("faults-{}", std::process::id());
    let out = tasks_check(r, &run);
    let said = String::from_utf8_lossy(&out.stdout);
    assert_eq!(out.status.code(), Some(1), "{said}");
    let mut rows = report(&out);
    rows.sort();
    let expected = [
        ("agent-fails", "agent_error", "null"),
        ("agent-hangs", "agent_timeout", "null"),
        ("image-missing", "infra:image", "null"),
        ("reward-missing", "reward_missing", "null"),
        ("reward-nan", "reward_invalid", "null"),
        ("verifier-crashes", "verifier_error", "null"),
        ("wrong-answer", "scored", "0"),
    ];
    let got: Vec<(&str, &str, &str)> = rows
        .iter()
        .map(|(a, b, c)| (a.as_str(), b.as_str(), c.as_str()))
        .collect();
    assert_eq!(got, expected, "{said}");
    assert!(said.contains("tasks: 0 passed, 7 failed"), "{said}");
    assert_eq!(containers_of(&run), 0, "sandboxes left behind");
}
