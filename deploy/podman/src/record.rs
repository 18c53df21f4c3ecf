//! An attempt's record, in its folder of the run directory: the launch
//! script's `stdout` and `stderr`, `exit` (how it ended) and `dns` (each
//! name it asked for, one question a line; no file: none). What a user reads
//! first when a harness never reaches the model.

use crate::resolver::Question;
use forgelog_deploy_core::outcome::AgentEnd;
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
}
