//! A message as read back from the log: where it sits, its raw bytes and what
//! they decode to. Pure data: the Kafka client fills it, the pure cores
//! (replay comparison, tests) read it.

use crate::{Codec, Event};

/// One message as read from the log.
#[derive(Debug, Clone, PartialEq)]
pub struct Received {
    pub topic: String,
    pub partition: i32,
    pub offset: i64,
    pub key: Vec<u8>,
    /// The raw value, for byte-level comparison and re-encoding checks.
    pub value: Vec<u8>,
    /// The decoded event; a message that is not a forgelog event is an error
    /// here, for the caller to record and skip, never a crash.
    pub event: Result<Event, String>,
}

impl Received {
    /// Decodes `value` with the process's [`Codec`].
    pub fn decode(topic: &str, partition: i32, offset: i64, key: &[u8], value: &[u8]) -> Received {
        Received {
            topic: topic.to_string(),
            partition,
            offset,
            key: key.to_vec(),
            value: value.to_vec(),
            event: Codec::global().decode(value).map_err(|e| e.to_string()),
        }
    }

    /// Whether this message belongs to `run` (any run when `None`). One that
    /// does not decode belongs to the run its first field names when it names
    /// one (a claim check whose event cannot be fetched, say), else to every
    /// run, so that it gets reported.
    pub fn in_run(&self, run: Option<&str>) -> bool {
        match (&self.event, run) {
            (_, None) => true,
            (Ok(e), Some(r)) => e.run_id() == r,
            (Err(_), Some(r)) => Codec::global()
                .peek_run_id(&self.value)
                .is_none_or(|id| id == r),
        }
    }
}
