//! Writes one event of every kind, encoded by today's schemas, into
//! `tests/fixtures/<VERSION>/` (`VERSION` is the first argument, e.g. `v3`):
//! done once when a new schema version is released; released versions' files
//! are never rewritten. The codec tests then decode every version's files.
//!
//! `cargo run -p forgelog-schemas --example write-fixtures -- v3`

#[path = "../tests/samples/mod.rs"]
mod samples;

use forgelog_schemas::Codec;

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let version = std::env::args()
        .nth(1)
        .ok_or("usage: write-fixtures VERSION (e.g. v3)")?;
    let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("tests/fixtures")
        .join(&version);
    if dir.exists() {
        return Err(format!(
            "{} exists: a released version is never rewritten",
            dir.display()
        )
        .into());
    }
    std::fs::create_dir_all(&dir)?;
    for e in samples::all() {
        let path = dir.join(format!("{}.avro", e.kind().name()));
        std::fs::write(&path, Codec::global().encode(&e)?)?;
        eprintln!("{}", path.display());
    }
    Ok(())
}
