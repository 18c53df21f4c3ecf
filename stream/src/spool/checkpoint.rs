//! What the drainer has had acknowledged, saved atomically beside the segments.

use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;
use std::io::{self, Write};
use std::path::Path;

const FILE: &str = "checkpoint.json";

#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Checkpoint {
    /// Every record below this seq is acknowledged by the broker.
    pub acked_through: u64,
    /// Per topic and partition, the offset after the last acknowledged record
    /// below `acked_through` (or the end of the partition when the spool first
    /// wrote to it). After a crash, any unacknowledged record that did arrive is
    /// past this point: scanning from here tells what not to send again.
    pub scan_from: BTreeMap<String, BTreeMap<i32, i64>>,
}

impl Checkpoint {
    pub fn load(dir: &Path) -> io::Result<Checkpoint> {
        match std::fs::read(dir.join(FILE)) {
            Ok(bytes) => serde_json::from_slice(&bytes).map_err(io::Error::other),
            Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(Checkpoint::default()),
            Err(e) => Err(e),
        }
    }

    /// Write to a temporary file, sync, rename: a crash leaves the old or the new one.
    pub fn store(&self, dir: &Path) -> io::Result<()> {
        let tmp = dir.join(format!("{FILE}.tmp"));
        let mut f = std::fs::File::create(&tmp)?;
        f.write_all(&serde_json::to_vec(self).map_err(io::Error::other)?)?;
        f.sync_data()?;
        std::fs::rename(&tmp, dir.join(FILE))
    }
}
