//! The spool's files: segments named by their first seq, each a run of
//! CRC-framed records whose torn tail (a crash mid-write) reads as its end.

use super::record::FRAME_HEADER;
use super::SpoolRecord;
use std::fs::{self, File};
use std::io::{self, BufReader, Read};
use std::path::{Path, PathBuf};

pub(super) fn segment_path(dir: &Path, first_seq: u64) -> PathBuf {
    dir.join(format!("{first_seq:020}.seg"))
}

/// Segments in the directory, by first seq.
pub(super) fn segments(dir: &Path) -> io::Result<Vec<(u64, PathBuf)>> {
    let mut out = Vec::new();
    for entry in fs::read_dir(dir)? {
        let path = entry?.path();
        if path.extension().is_some_and(|e| e == "seg") {
            if let Some(seq) = path
                .file_stem()
                .and_then(|s| s.to_str())
                .and_then(|s| s.parse().ok())
            {
                out.push((seq, path));
            }
        }
    }
    out.sort();
    Ok(out)
}

/// Reads one framed record; `Ok(None)` at a clean end, a torn frame or a bad CRC.
pub(super) fn read_frame(r: &mut impl Read) -> io::Result<Option<(SpoolRecord, u64)>> {
    let mut header = [0u8; FRAME_HEADER];
    if let Err(e) = r.read_exact(&mut header) {
        return if e.kind() == io::ErrorKind::UnexpectedEof {
            Ok(None)
        } else {
            Err(e)
        };
    }
    let (len, crc) = SpoolRecord::frame_header(&header);
    let mut payload = vec![0u8; len];
    if let Err(e) = r.read_exact(&mut payload) {
        return if e.kind() == io::ErrorKind::UnexpectedEof {
            Ok(None)
        } else {
            Err(e)
        };
    }
    if crc32fast::hash(&payload) != crc {
        return Ok(None);
    }
    Ok(SpoolRecord::decode_payload(&payload).map(|r| (r, (FRAME_HEADER + len) as u64)))
}

/// Where the complete records of the segment starting at `first` end: the
/// seq after the last one, and its byte length (what follows is torn, or being
/// written).
pub(super) fn complete_records(path: &Path, first: u64) -> io::Result<(u64, u64)> {
    let mut r = BufReader::new(File::open(path)?);
    let (mut next, mut good) = (first, 0u64);
    while let Some((rec, n)) = read_frame(&mut r)? {
        if rec.seq != next {
            break;
        }
        next += 1;
        good += n;
    }
    Ok((next, good))
}
