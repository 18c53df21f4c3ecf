//! What a spool holds, read without writing a byte: safe on the spool of a
//! running producer, whose last record may be half written at that moment.

use super::segment::{complete_records, segments};
use super::{Checkpoint, ParkedRecord, SpoolError, LOCK_FILE};
use std::fs::{self, File};
use std::path::Path;

#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
pub struct SpoolStatus {
    /// Records written and not yet acknowledged by the broker.
    pub pending: u64,
    /// Every record below this seq is acknowledged.
    pub acked_through: u64,
    /// Segment bytes on disk.
    pub bytes: u64,
    /// Bytes after the last complete record: one being written, or a torn
    /// tail a crash left (cut off when a producer next opens the spool).
    pub incomplete_tail: u64,
    /// Records the broker refused for good, set aside so the rest could flow.
    pub parked: Vec<ParkedRecord>,
    /// Whether a process holds the spool open now.
    pub in_use: bool,
}

impl SpoolStatus {
    pub fn read(dir: &Path) -> Result<SpoolStatus, SpoolError> {
        let io_err = |source| SpoolError::Io {
            dir: dir.to_path_buf(),
            source,
        };
        if !dir.is_dir() {
            return Err(io_err(std::io::Error::new(
                std::io::ErrorKind::NotFound,
                "no spool here",
            )));
        }
        let in_use = match File::open(dir.join(LOCK_FILE)) {
            // A shared lock is refused only while a writer holds its exclusive one.
            Ok(f) => matches!(f.try_lock_shared(), Err(fs::TryLockError::WouldBlock)),
            Err(_) => false,
        };
        let checkpoint = Checkpoint::load(dir).map_err(io_err)?;
        let segs = segments(dir).map_err(io_err)?;
        let mut bytes = 0;
        for (_, p) in &segs {
            bytes += fs::metadata(p).map_err(io_err)?.len();
        }
        let (next_seq, incomplete_tail) = match segs.last() {
            None => (checkpoint.acked_through, 0),
            Some((first, path)) => {
                let (next, good) = complete_records(path, *first).map_err(io_err)?;
                let size = fs::metadata(path).map_err(io_err)?.len();
                (next, size.saturating_sub(good))
            }
        };
        Ok(SpoolStatus {
            pending: next_seq.saturating_sub(checkpoint.acked_through),
            acked_through: checkpoint.acked_through,
            bytes,
            incomplete_tail,
            parked: ParkedRecord::list(dir).map_err(io_err)?,
            in_use,
        })
    }
}
