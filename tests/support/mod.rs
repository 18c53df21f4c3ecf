//! Shared by the `forgelog` binary's tests.
#![allow(dead_code)]

use forgelog_stream::testing::python_json;
use std::path::Path;

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
