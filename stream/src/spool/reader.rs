//! Reading the spool back in seq order, as the drainer does.

use super::segment::{read_frame, segments};
use super::{Shared, SpoolRecord};
use std::fs::File;
use std::io::{self, BufReader};
use std::path::PathBuf;
use std::sync::atomic::Ordering;
use std::sync::Arc;

/// Reads records in seq order, only those completely written.
pub struct SpoolReader {
    dir: PathBuf,
    shared: Arc<Shared>,
    seq: u64,
    file: Option<(u64, BufReader<File>)>,
}

impl SpoolReader {
    pub(super) fn new(dir: PathBuf, shared: Arc<Shared>, seq: u64) -> SpoolReader {
        SpoolReader {
            dir,
            shared,
            seq,
            file: None,
        }
    }

    /// Seq of the record `next` returns.
    pub fn position(&self) -> u64 {
        self.seq
    }

    /// The next record, or `None` when the reader has caught up with the writer.
    pub fn next_record(&mut self) -> io::Result<Option<SpoolRecord>> {
        if self.seq >= self.shared.next_seq.load(Ordering::Acquire) {
            return Ok(None);
        }
        for _ in 0..2 {
            if self.file.is_none() {
                self.open_segment_for(self.seq)?;
            }
            let (_, r) = self.file.as_mut().expect("opened above");
            loop {
                match read_frame(r)? {
                    Some((rec, _)) if rec.seq < self.seq => continue,
                    Some((rec, _)) if rec.seq == self.seq => {
                        self.seq += 1;
                        return Ok(Some(rec));
                    }
                    Some((rec, _)) => {
                        return Err(io::Error::other(format!(
                            "spool gap: wanted seq {}, found {}",
                            self.seq, rec.seq
                        )))
                    }
                    // End of this segment: the record was written to the next one.
                    None => break,
                }
            }
            self.file = None;
            let next = segments(&self.dir)?
                .into_iter()
                .find(|(first, _)| *first == self.seq);
            if let Some((first, path)) = next {
                self.file = Some((first, BufReader::with_capacity(1 << 20, File::open(path)?)));
            }
        }
        Err(io::Error::other(format!(
            "spool record {} is missing from {}",
            self.seq,
            self.dir.display()
        )))
    }

    fn open_segment_for(&mut self, seq: u64) -> io::Result<()> {
        let seg = segments(&self.dir)?
            .into_iter()
            .rev()
            .find(|(first, _)| *first <= seq);
        let (first, path) =
            seg.ok_or_else(|| io::Error::other(format!("no spool segment holds seq {seq}")))?;
        self.file = Some((first, BufReader::with_capacity(1 << 20, File::open(path)?)));
        Ok(())
    }
}
