//! Shared by the `forgelog` binary's tests.
#![allow(dead_code)]

pub mod kit;

use forgelog_stream::testing::python_json;
use std::path::{Path, PathBuf};
use std::process::Command;

/// Loads an SFT JSONL export with Hugging Face `datasets` (offline, as a user
/// would); returns `{"rows", "columns", "roles"}` (the roles of row 0).
pub fn load_with_datasets(jsonl: &Path) -> serde_json::Value {
    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/python/load_sft.py");
    let cache = tempfile::tempdir().unwrap();
    let args = [jsonl.to_str().unwrap(), cache.path().to_str().unwrap()];
    tokio::runtime::Runtime::new()
        .unwrap()
        .block_on(python_json(&script, &args))
}

/// The shipped task set.
pub fn shipped() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("deploy/tasks")
}

/// Sandboxes of `run` still there, running or not.
pub fn containers_of(run: &str) -> usize {
    let out = Command::new("podman")
        .args([
            "ps",
            "-a",
            "-q",
            "--filter",
            &format!("label=forgelog.run={run}"),
        ])
        .output()
        .unwrap();
    String::from_utf8_lossy(&out.stdout)
        .split_whitespace()
        .count()
}

/// A copy of the shipped `hello-file` task as `root/name`, with `file` replaced by `text`.
pub fn variant(root: &Path, name: &str, file: &str, text: &str) {
    let dir = root.join(name);
    let from = shipped().join("hello-file");
    for sub in ["", "environment", "tests", "solution"] {
        std::fs::create_dir_all(dir.join(sub)).unwrap();
    }
    for f in [
        "instruction.md",
        "task.toml",
        "environment/Dockerfile",
        "tests/test.sh",
        "solution/solve.sh",
    ] {
        std::fs::copy(from.join(f), dir.join(f)).unwrap();
    }
    std::fs::write(dir.join(file), text).unwrap();
}
