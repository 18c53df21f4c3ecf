//! An attempt's record, in its folder of the run directory: the launch
//! script's `stdout` and `stderr`, `exit` (how it ended) and `dns` (each
//! name it asked for, one question a line; no file: none). What a user reads
//! first when a harness never reaches the model.

use crate::resolver::Question;
use forgelog_deploy_core::outcome::AgentEnd;
use forgelog_deploy_core::Outcome;
use std::path::{Path, PathBuf};

/// Writes `exit` and `dns` into `dir` (stdout and stderr are there already).
pub fn write(dir: &Path, agent: &AgentEnd, asked: &[Question]) {
    let exit = match agent {
        AgentEnd::Exited(code) => format!("exited {code}\n"),
        AgentEnd::TimedOut => "timed out (the task's agent timeout)\n".into(),
        AgentEnd::Failed { stage, why } => format!("did not run ({}): {why}\n", stage.as_str()),
    };
    let _ = std::fs::create_dir_all(dir).and_then(|()| std::fs::write(dir.join("exit"), exit));
    if !asked.is_empty() {
        let lines: String = asked.iter().map(|q| format!("{q}\n")).collect();
        let _ = std::fs::write(dir.join("dns"), lines);
    }
}

/// An attempt's record as [`write`] left it.
#[derive(Debug, Clone, PartialEq)]
pub struct AttemptRecord {
    pub dir: PathBuf,
    /// How the launch script ended (`exited 0`), if the record says.
    pub exit: Option<String>,
    /// The names it looked up, each once, in the order first asked.
    pub looked_up: Vec<String>,
}

impl AttemptRecord {
    pub fn read(dir: &Path) -> AttemptRecord {
        let read = |name| std::fs::read_to_string(dir.join(name)).unwrap_or_default();
        let mut looked_up: Vec<String> = Vec::new();
        for name in read("dns").lines().filter_map(|l| l.split(' ').nth(1)) {
            if !looked_up.iter().any(|n| n == name) {
                looked_up.push(name.to_string());
            }
        }
        AttemptRecord {
            dir: dir.to_path_buf(),
            exit: read("exit").lines().next().map(str::to_string),
            looked_up,
        }
    }
}

/// What to look at first for a harness none of whose attempts reached the
/// model: `attempt`'s record (in `logs`, the run's attempt folders, where
/// there is one), how it ended, what it looked up and what it asked the
/// proxy for in vain.
pub fn silent_hint(harness: &str, attempt: &Outcome, logs: Option<&Path>) -> String {
    let mut hint = format!("hint: no attempt of {harness} reached the model: ");
    let Some(record) = logs.map(|d| AttemptRecord::read(&d.join(&attempt.attempt))) else {
        return hint + &format!("see attempt {}'s logs", attempt.attempt);
    };
    let dir = record.dir.display();
    hint += &format!("its record (stdout, stderr, exit, dns) is in {dir}");
    if let Some(exit) = &record.exit {
        hint += &format!("; it {exit}");
    }
    if !record.looked_up.is_empty() {
        let names = record.looked_up.join(", ");
        hint += &format!("; it looked up {names} (refused: no network)");
    }
    if !attempt.unrouted.is_empty() {
        let asked: Vec<String> = attempt.unrouted.iter().map(ToString::to_string).collect();
        hint += &format!("; the proxy has no route for {}", asked.join(", "));
    }
    hint
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_record_reads_back_as_written() {
        let dir = tempfile::tempdir().unwrap();
        let q = |kind: &str, name: &str| Question {
            name: name.into(),
            kind: kind.into(),
        };
        let asked = [
            q("AAAA", "api.x.ai"),
            q("A", "api.x.ai"),
            q("A", "t.example"),
        ];
        write(dir.path(), &AgentEnd::Exited(3), &asked);
        let r = AttemptRecord::read(dir.path());
        assert_eq!(r.exit.as_deref(), Some("exited 3"));
        assert_eq!(r.looked_up, ["api.x.ai", "t.example"]);
        let quiet = tempfile::tempdir().unwrap();
        write(quiet.path(), &AgentEnd::TimedOut, &[]);
        let r = AttemptRecord::read(quiet.path());
        assert!(r.exit.unwrap().starts_with("timed out"));
        assert!(r.looked_up.is_empty() && !quiet.path().join("dns").exists());
    }

    #[test]
    fn a_silent_harness_is_pointed_at_its_record_and_what_it_asked_for() {
        let logs = tempfile::tempdir().unwrap();
        let asked = [Question {
            name: "api.anthropic.com".into(),
            kind: "A".into(),
        }];
        write(&logs.path().join("a-1"), &AgentEnd::Exited(1), &asked);
        let attempt = Outcome {
            rollout_id: "r".into(),
            harness: "claude-code".into(),
            attempt: "a-1".into(),
            status: None,
            exit_status: Some(1),
            reward: None,
            model_calls: 0,
            sampled_tokens: 0,
            retries: 0,
            unrouted: vec![forgelog_api::Unrouted {
                route: "POST /v1/messages/count_tokens".into(),
                count: 2,
            }],
        };
        let hint = silent_hint("claude-code", &attempt, Some(logs.path()));
        let dir = logs.path().join("a-1");
        let expected = format!(
            "hint: no attempt of claude-code reached the model: its record (stdout, stderr, exit, dns) is in {}; it exited 1; it looked up api.anthropic.com (refused: no network); the proxy has no route for POST /v1/messages/count_tokens (2×)",
            dir.display()
        );
        assert_eq!(hint, expected);
        // A Kubernetes run keeps no record here.
        let elsewhere = silent_hint("claude-code", &attempt, None);
        assert!(elsewhere.ends_with("see attempt a-1's logs"), "{elsewhere}");
    }
}
