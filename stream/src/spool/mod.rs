//! The local spool: an append-only, segmented, CRC-checked file log that holds
//! events until the broker has acknowledged them.
//!
//! Every event goes through the spool (write-ahead), so `send` costs one local
//! `write` and never a network round trip, and a process killed at any point
//! loses nothing it accepted. The drainer ([`crate::producer`]) reads records in
//! order and deletes segments once everything in them is acknowledged.

mod checkpoint;
mod parked;
mod reader;
mod record;
mod segment;
mod status;

pub use checkpoint::Checkpoint;
pub use parked::ParkedRecord;
pub use reader::SpoolReader;
pub use record::SpoolRecord;
pub use status::SpoolStatus;

use segment::{complete_records, segment_path, segments};
use std::fs::{self, File, OpenOptions};
use std::io::{self, Seek, SeekFrom, Write};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

/// When appended records are forced to disk. The data survives a killed process
/// in every mode (it is in the page cache); only `Always` survives power loss
/// for every acknowledged `send`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FsyncPolicy {
    Never,
    Always,
    EveryN(u32),
}

#[derive(Debug, Clone)]
pub struct SpoolOptions {
    /// A segment is closed and a new one started past this size.
    pub segment_bytes: u64,
    /// `send` fails with [`SpoolError::Full`] rather than grow past this.
    pub max_bytes: u64,
    pub fsync: FsyncPolicy,
    /// After a crash, how long the drainer waits before it reads the topics'
    /// tails for records already delivered. The dead writer's produce
    /// requests still queued at the broker land in that time, are found, and
    /// are not sent twice. Kafka bounds nothing here: this is the longest the
    /// broker is assumed to take with a request it has received, when it was
    /// fast; a writer that saw it slow leaves a longer wait in its checkpoint
    /// ([`Checkpoint::recovery_grace`]).
    pub recovery_grace: Duration,
    /// How long the drainer's Kafka client lets a partition's batch wait
    /// for more records ([`StreamConfig::producer`](crate::StreamConfig)).
    /// The records are durable in the spool already: the wait only delays
    /// what readers of the log see, and a flush.
    pub linger: Duration,
}

impl Default for SpoolOptions {
    fn default() -> Self {
        SpoolOptions {
            segment_bytes: 64 << 20,
            max_bytes: 8 << 30,
            fsync: FsyncPolicy::Never,
            recovery_grace: Duration::from_secs(3),
            linger: Duration::from_millis(100),
        }
    }
}

#[derive(Debug, thiserror::Error)]
pub enum SpoolError {
    #[error("spool {dir} is full ({bytes} of {max} bytes): the broker has been away too long; event refused")]
    Full { dir: PathBuf, bytes: u64, max: u64 },
    #[error("spool {dir} is in use by another process (a running proxy?): `forgelog spool status` reads it without opening it")]
    InUse { dir: PathBuf },
    #[error("spool {dir}: {source}")]
    Io { dir: PathBuf, source: io::Error },
    /// The producer's claim store did not open.
    #[error("claim store {0}")]
    Claims(#[from] crate::store::StoreError),
}

/// State the writer publishes to readers.
#[derive(Debug, Default)]
struct Shared {
    /// Every record with a smaller seq is completely written.
    next_seq: AtomicU64,
    /// Every record with a smaller seq is acknowledged by the broker.
    acked: AtomicU64,
    bytes: AtomicU64,
    appended: tokio::sync::Notify,
    drained: tokio::sync::Notify,
}

struct ActiveSegment {
    file: File,
    first_seq: u64,
    len: u64,
    unsynced: u32,
    buf: Vec<u8>,
}

/// A spool directory opened for appending and draining.
pub struct Spool {
    dir: PathBuf,
    options: SpoolOptions,
    active: Mutex<ActiveSegment>,
    shared: Arc<Shared>,
    /// Held (flock) while open: one writer per directory, or the second one's
    /// open would cut the first one's record in mid-write as a torn tail.
    _lock: File,
}

/// The lock file every open spool holds.
const LOCK_FILE: &str = "LOCK";

/// Takes the spool directory's lock, or says who holds it.
fn lock(dir: &Path) -> Result<File, SpoolError> {
    let file = OpenOptions::new()
        .create(true)
        .truncate(false)
        .write(true)
        .open(dir.join(LOCK_FILE))
        .map_err(|source| SpoolError::Io {
            dir: dir.to_path_buf(),
            source,
        })?;
    match file.try_lock() {
        Ok(()) => Ok(file),
        Err(std::fs::TryLockError::WouldBlock) => Err(SpoolError::InUse {
            dir: dir.to_path_buf(),
        }),
        Err(std::fs::TryLockError::Error(source)) => Err(SpoolError::Io {
            dir: dir.to_path_buf(),
            source,
        }),
    }
}

impl Spool {
    /// Whether a live writer holds the spool in `dir` (one never opened is free).
    pub fn in_use(dir: &Path) -> bool {
        dir.join(LOCK_FILE).exists() && matches!(lock(dir), Err(SpoolError::InUse { .. }))
    }

    /// Opens (or creates) the spool in `dir`, cutting off a torn tail left by a crash.
    pub fn open(dir: impl Into<PathBuf>, options: SpoolOptions) -> Result<Spool, SpoolError> {
        let dir = dir.into();
        let io_err = |source| SpoolError::Io {
            dir: dir.clone(),
            source,
        };
        fs::create_dir_all(&dir).map_err(io_err)?;
        let lock = lock(&dir)?;
        let checkpoint = Checkpoint::load(&dir).map_err(io_err)?;
        let segs = segments(&dir).map_err(io_err)?;
        let mut bytes = 0;
        for (_, p) in &segs {
            bytes += fs::metadata(p).map_err(io_err)?.len();
        }
        let (first_seq, next_seq, len, path) = match segs.last() {
            None => {
                let seq = checkpoint.acked_through;
                (seq, seq, 0, segment_path(&dir, seq))
            }
            Some((first, path)) => {
                let (next, good) = complete_records(path, *first).map_err(io_err)?;
                let size = fs::metadata(path).map_err(io_err)?.len();
                if size != good {
                    tracing::warn!(segment = %path.display(), cut = size - good, "spool: cutting off a torn tail");
                    bytes -= size - good;
                }
                (
                    *first,
                    next.max(checkpoint.acked_through),
                    good,
                    path.clone(),
                )
            }
        };
        let file = OpenOptions::new()
            .create(true)
            .truncate(false)
            .write(true)
            .open(&path)
            .map_err(io_err)?;
        file.set_len(len).map_err(io_err)?;
        let mut file = file;
        file.seek(SeekFrom::End(0)).map_err(io_err)?;
        let shared = Arc::new(Shared::default());
        shared.next_seq.store(next_seq, Ordering::Release);
        shared
            .acked
            .store(checkpoint.acked_through, Ordering::Release);
        shared.bytes.store(bytes, Ordering::Release);
        metrics::gauge!("forgelog_spool_bytes").set(bytes as f64);
        Ok(Spool {
            dir,
            options,
            active: Mutex::new(ActiveSegment {
                file,
                first_seq,
                len,
                unsynced: 0,
                buf: Vec::new(),
            }),
            shared,
            _lock: lock,
        })
    }

    pub fn dir(&self) -> &Path {
        &self.dir
    }

    pub fn options(&self) -> &SpoolOptions {
        &self.options
    }

    /// Appends one record; returns its seq. Local disk only: never waits on the broker.
    pub fn append(&self, topic: &str, key: &[u8], value: &[u8]) -> Result<u64, SpoolError> {
        let io_err = |source| SpoolError::Io {
            dir: self.dir.clone(),
            source,
        };
        let mut active = self.active.lock().unwrap_or_else(|p| p.into_inner());
        let seq = self.shared.next_seq.load(Ordering::Acquire);
        let mut buf = std::mem::take(&mut active.buf);
        buf.clear();
        SpoolRecord::encode_into(seq, topic, key, value, &mut buf);
        let bytes = self.shared.bytes.load(Ordering::Acquire);
        if bytes + buf.len() as u64 > self.options.max_bytes {
            metrics::counter!("forgelog_spool_full_total").increment(1);
            active.buf = buf;
            return Err(SpoolError::Full {
                dir: self.dir.clone(),
                bytes,
                max: self.options.max_bytes,
            });
        }
        if active.len > 0 && active.len + buf.len() as u64 > self.options.segment_bytes {
            // A closed segment is complete on disk under any policy but `Never`,
            // where a 64 MiB sync would stall this caller for tens of ms.
            if self.options.fsync != FsyncPolicy::Never {
                active.file.sync_data().map_err(io_err)?;
            }
            let file = OpenOptions::new()
                .create(true)
                .append(true)
                .open(segment_path(&self.dir, seq))
                .map_err(io_err)?;
            *active = ActiveSegment {
                file,
                first_seq: seq,
                len: 0,
                unsynced: 0,
                buf: Vec::new(),
            };
        }
        let written = active.file.write_all(&buf);
        if let Err(e) = written {
            // Leave no partial frame behind: the next open would cut it anyway.
            let len = active.len;
            let _ = active.file.set_len(len);
            let _ = active.file.seek(SeekFrom::Start(len));
            active.buf = buf;
            return Err(io_err(e));
        }
        active.len += buf.len() as u64;
        active.unsynced += 1;
        let sync = match self.options.fsync {
            FsyncPolicy::Never => false,
            FsyncPolicy::Always => true,
            FsyncPolicy::EveryN(n) => active.unsynced >= n,
        };
        if sync {
            active.file.sync_data().map_err(io_err)?;
            active.unsynced = 0;
        }
        let total = self
            .shared
            .bytes
            .fetch_add(buf.len() as u64, Ordering::AcqRel)
            + buf.len() as u64;
        active.buf = buf;
        self.shared.next_seq.store(seq + 1, Ordering::Release);
        drop(active);
        metrics::gauge!("forgelog_spool_bytes").set(total as f64);
        self.shared.appended.notify_one();
        Ok(seq)
    }

    /// Seq the next append gets.
    pub fn next_seq(&self) -> u64 {
        self.shared.next_seq.load(Ordering::Acquire)
    }

    /// Every record below this seq is acknowledged by the broker.
    pub fn acked(&self) -> u64 {
        self.shared.acked.load(Ordering::Acquire)
    }

    /// Records appended and not yet acknowledged.
    pub fn pending(&self) -> u64 {
        self.next_seq() - self.acked()
    }

    pub fn bytes(&self) -> u64 {
        self.shared.bytes.load(Ordering::Acquire)
    }

    /// Whether `bytes` more fit now: under the cap, and on the spool's disk.
    pub fn has_room(&self, bytes: u64) -> bool {
        self.bytes() + bytes <= self.options.max_bytes
            && disk_free(&self.dir).is_none_or(|free| free >= bytes)
    }

    /// A reader positioned at `seq`.
    pub fn reader(&self, seq: u64) -> SpoolReader {
        SpoolReader::new(self.dir.clone(), self.shared.clone(), seq)
    }

    /// Waits until something is appended (returns at once if an append happened since the last wait).
    pub async fn appended(&self) {
        self.shared.appended.notified().await
    }

    /// Waits until the acknowledged position moves.
    pub async fn drained(&self) {
        self.shared.drained.notified().await
    }

    /// Records that the broker has acknowledged everything below `seq`
    /// (`flush` waits for this), before the checkpoint that makes it durable.
    pub fn delivered_through(&self, seq: u64) {
        self.shared.acked.fetch_max(seq, Ordering::AcqRel);
        self.shared.drained.notify_waiters();
    }

    /// Sets `rec` aside in `parked/` with `reason` (the broker refused it for
    /// good), so that the records behind it can be delivered.
    pub fn park(&self, rec: &SpoolRecord, reason: &str) -> Result<ParkedRecord, SpoolError> {
        let parked =
            ParkedRecord::store(&self.dir, rec, reason).map_err(|source| SpoolError::Io {
                dir: self.dir.clone(),
                source,
            })?;
        tracing::error!(seq = rec.seq, topic = %rec.topic, bytes = parked.bytes, %reason,
            "spool: the broker refuses this record for good; parked in {}/parked", self.dir.display());
        metrics::counter!("forgelog_spool_parked_total").increment(1);
        Ok(parked)
    }

    /// Saves `checkpoint`, records what it acknowledges as delivered and
    /// deletes the segments that hold nothing newer.
    pub fn acknowledge(&self, checkpoint: &Checkpoint) -> Result<(), SpoolError> {
        let io_err = |source| SpoolError::Io {
            dir: self.dir.clone(),
            source,
        };
        checkpoint.store(&self.dir).map_err(io_err)?;
        self.delivered_through(checkpoint.acked_through);
        let active_first = self
            .active
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .first_seq;
        let segs = segments(&self.dir).map_err(io_err)?;
        for pair in segs.windows(2) {
            let ((_, path), (next_first, _)) = (&pair[0], &pair[1]);
            if *next_first <= checkpoint.acked_through && *next_first <= active_first {
                let len = fs::metadata(path).map(|m| m.len()).unwrap_or(0);
                fs::remove_file(path).map_err(io_err)?;
                let left = self.shared.bytes.fetch_sub(len, Ordering::AcqRel) - len;
                metrics::gauge!("forgelog_spool_bytes").set(left as f64);
            }
        }
        Ok(())
    }
}

/// Bytes free to an unprivileged writer on the file system of `dir`.
fn disk_free(dir: &Path) -> Option<u64> {
    use std::os::unix::ffi::OsStrExt;
    let path = std::ffi::CString::new(dir.as_os_str().as_bytes()).ok()?;
    // SAFETY: statvfs(3) fills the struct it is given from a NUL-terminated
    // path; all-zero is a valid statvfs.
    let stat = unsafe {
        let mut stat: libc::statvfs = std::mem::zeroed();
        (libc::statvfs(path.as_ptr(), &mut stat) == 0).then_some(stat)
    }?;
    Some(stat.f_bavail as u64 * stat.f_frsize as u64)
}

#[cfg(test)]
mod tests;
