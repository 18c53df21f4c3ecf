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
    /// The slowest delivery (send to acknowledgement) the drainer saw lately,
    /// in milliseconds: how long the broker was taking with our requests. A
    /// writer killed while the broker is that slow may have requests queued
    /// there for about as long, so the next owner waits longer before its
    /// scan (see [`Checkpoint::recovery_grace`]).
    #[serde(default)]
    pub slowest_delivery_ms: u64,
    /// What the last save stored of it (not saved itself).
    #[serde(skip)]
    pub(crate) saved_slowest_ms: u64,
}

/// The grace is at least this many times the slowest recent delivery: a
/// request queued behind others at a slow broker waits about as long as they
/// took, and a few times that covers the spread measured under load.
const SLOW_BROKER_FACTOR: u32 = 4;
/// A delivery slower than this, and twice what was last saved, is saved at once.
const SLOWDOWN_MS: u64 = 250;
/// However slow the broker was, a recovery waits no longer than this.
pub const MAX_RECOVERY_GRACE: std::time::Duration = std::time::Duration::from_secs(60);

impl Checkpoint {
    /// How long a recovery waits for a dead writer's queued requests before
    /// it scans for them: `floor`, or longer when the broker was slow when
    /// this checkpoint was saved.
    pub fn recovery_grace(&self, floor: std::time::Duration) -> std::time::Duration {
        let slow = std::time::Duration::from_millis(self.slowest_delivery_ms) * SLOW_BROKER_FACTOR;
        floor.max(slow.min(MAX_RECOVERY_GRACE))
    }

    /// Remembers a delivery that took `took`, in the decaying maximum the
    /// next save stores. True when it is a slowdown worth saving at once:
    /// twice what the last save stored, and over a quarter second.
    pub fn record_delivery(&mut self, took: std::time::Duration) -> bool {
        let took = u64::try_from(took.as_millis()).unwrap_or(u64::MAX);
        let slowing = took > SLOWDOWN_MS && took > 2 * self.saved_slowest_ms;
        self.slowest_delivery_ms = self.slowest_delivery_ms.max(took);
        slowing
    }

    /// How long a request may wait for its answer before the wait so far is
    /// a slowdown worth saving ([`Checkpoint::record_delivery`]): a writer
    /// killed while its request is overdue leaves that request queued at the
    /// broker, and the next owner must wait for it longer than the floor.
    pub fn overdue_after(&self) -> std::time::Duration {
        std::time::Duration::from_millis(SLOWDOWN_MS.max(2 * self.saved_slowest_ms) + 1)
    }

    /// After a save: the remembered slowest delivery halves, so a slow spell
    /// is remembered for a few saves after the broker is fast again.
    pub fn saved(&mut self) {
        self.saved_slowest_ms = self.slowest_delivery_ms;
        self.slowest_delivery_ms /= 2;
    }

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

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    #[test]
    fn a_slow_broker_lengthens_the_grace_up_to_its_cap() {
        let floor = Duration::from_secs(3);
        let mut c = Checkpoint::default();
        assert_eq!(c.recovery_grace(floor), floor);
        assert!(
            !c.record_delivery(Duration::from_millis(200)),
            "fast: not saved at once"
        );
        assert_eq!(
            c.recovery_grace(floor),
            floor,
            "4 x 200 ms is under the floor"
        );
        assert!(
            c.record_delivery(Duration::from_secs(2)),
            "a slowdown is saved at once"
        );
        assert_eq!(c.recovery_grace(floor), Duration::from_secs(8));
        c.saved();
        // Decays while deliveries are fast; a delivery no slower than twice
        // what was saved is not a slowdown.
        assert_eq!(c.recovery_grace(floor), Duration::from_secs(4));
        assert!(!c.record_delivery(Duration::from_millis(3000)));
        assert!(c.record_delivery(Duration::from_millis(4001)));
        c.record_delivery(Duration::from_secs(3600));
        assert_eq!(c.recovery_grace(floor), MAX_RECOVERY_GRACE);
    }

    #[test]
    fn a_request_waiting_past_the_last_slowdown_is_overdue() {
        let mut c = Checkpoint::default();
        assert_eq!(c.overdue_after(), Duration::from_millis(251));
        assert!(
            c.record_delivery(c.overdue_after()),
            "an overdue request's wait is a slowdown"
        );
        c.saved();
        assert_eq!(c.overdue_after(), Duration::from_millis(503));
        assert!(!c.record_delivery(Duration::from_millis(502)));
        assert!(c.record_delivery(c.overdue_after()));
    }

    #[test]
    fn a_checkpoint_written_before_the_delivery_times_loads() {
        let old: Checkpoint =
            serde_json::from_str(r#"{"acked_through":7,"scan_from":{}}"#).unwrap();
        assert_eq!(old.acked_through, 7);
        assert_eq!(
            old.recovery_grace(Duration::from_secs(3)),
            Duration::from_secs(3)
        );
    }
}
