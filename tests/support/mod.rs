//! Shared by the `forgelog` binary's tests.
#![allow(dead_code)]

use forgelog_stream::testing::venv_python;
use std::path::Path;
use std::process::Command;

/// Loads an SFT JSONL export with Hugging Face `datasets` (offline, as a user
/// would); returns `{"rows", "columns", "roles"}` (the roles of row 0).
pub fn load_with_datasets(jsonl: &Path) -> serde_json::Value {
    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/python/load_sft.py");
    let cache = tempfile::tempdir().unwrap();
    let out = Command::new(venv_python())
        .arg(script)
        .arg(jsonl)
        .arg(cache.path())
        .current_dir(cache.path())
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "datasets could not load {}:\n{stdout}\n{}",
        jsonl.display(),
        String::from_utf8_lossy(&out.stderr)
    );
    serde_json::from_str(stdout.lines().last().unwrap_or(""))
        .unwrap_or_else(|e| panic!("load_sft.py printed no JSON ({e}):\n{stdout}"))
}
