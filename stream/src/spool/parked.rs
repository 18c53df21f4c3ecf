//! Records the broker refused for good (over its message size limit, say),
//! set aside in `parked/` so that the records behind them flow: each as its
//! framed record (`SEQ.rec`, the spool's own format) beside the reason
//! (`SEQ.why`). Nothing is dropped; an operator can see, fix and re-send.

use super::record::SpoolRecord;
use std::fs;
use std::io::{self, Write};
use std::path::{Path, PathBuf};

const DIR: &str = "parked";

#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
pub struct ParkedRecord {
    pub seq: u64,
    pub topic: String,
    /// The framed record's size.
    pub bytes: u64,
    pub reason: String,
}

impl ParkedRecord {
    fn paths(dir: &Path, seq: u64) -> (PathBuf, PathBuf) {
        let parked = dir.join(DIR);
        (
            parked.join(format!("{seq:020}.rec")),
            parked.join(format!("{seq:020}.why")),
        )
    }

    /// Writes `rec` and `reason` to `dir/parked/`, synced, the record before its
    /// reason: a reason file means a whole record.
    pub(super) fn store(dir: &Path, rec: &SpoolRecord, reason: &str) -> io::Result<ParkedRecord> {
        fs::create_dir_all(dir.join(DIR))?;
        let (rec_path, why_path) = Self::paths(dir, rec.seq);
        let mut frame = Vec::new();
        SpoolRecord::encode_into(rec.seq, &rec.topic, &rec.key, &rec.value, &mut frame);
        for (path, bytes) in [(&rec_path, &frame[..]), (&why_path, reason.as_bytes())] {
            let mut f = fs::File::create(path)?;
            f.write_all(bytes)?;
            f.sync_data()?;
        }
        Ok(ParkedRecord {
            seq: rec.seq,
            topic: rec.topic.clone(),
            bytes: frame.len() as u64,
            reason: reason.to_string(),
        })
    }

    /// The parked records of the spool in `dir`, by seq.
    pub fn list(dir: &Path) -> io::Result<Vec<ParkedRecord>> {
        let parked = dir.join(DIR);
        let entries = match fs::read_dir(&parked) {
            Ok(e) => e,
            Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(Vec::new()),
            Err(e) => return Err(e),
        };
        let mut out = Vec::new();
        for entry in entries {
            let path = entry?.path();
            let Some(seq) = path
                .file_name()
                .and_then(|n| n.to_str())
                .and_then(|n| n.strip_suffix(".why"))
                .and_then(|n| n.parse().ok())
            else {
                continue;
            };
            let (rec_path, _) = Self::paths(dir, seq);
            let reason = fs::read_to_string(&path)?;
            let frame = fs::read(&rec_path)?;
            let topic = super::segment::read_frame(&mut &frame[..])?
                .map(|(r, _)| r.topic)
                .unwrap_or_default();
            out.push(ParkedRecord {
                seq,
                topic,
                bytes: frame.len() as u64,
                reason,
            });
        }
        out.sort_by_key(|p| p.seq);
        Ok(out)
    }

    /// The parked record itself.
    pub fn record(&self, dir: &Path) -> io::Result<Option<SpoolRecord>> {
        let frame = fs::read(Self::paths(dir, self.seq).0)?;
        Ok(super::segment::read_frame(&mut &frame[..])?.map(|(r, _)| r))
    }
}
