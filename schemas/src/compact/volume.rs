//! What compaction saves: a session's bytes in the log against its final
//! transcript (the `log-volume` bench prints it).

use super::expand_events;

/// What one session's calls cost in the log, as stored and as they would be
/// stored whole, against its final transcript: the last successful call's
/// events stored whole (its whole prompt, request and answer).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct SessionVolume {
    pub calls: usize,
    pub log_bytes: usize,
    pub whole_bytes: usize,
    pub transcript_bytes: usize,
}

impl SessionVolume {
    /// From one session's `CallStarted` and `CallFinished` events as the log
    /// holds them (other events are not counted).
    pub fn of<'a>(events: impl IntoIterator<Item = &'a crate::Event>) -> SessionVolume {
        use crate::{Codec, Event};
        let size = |e: &Event| Codec::global().encode(e).map_or(0, |b| b.len());
        let mut stored: Vec<Event> = events
            .into_iter()
            .filter(|e| matches!(e, Event::CallStarted(_) | Event::CallFinished(_)))
            .cloned()
            .collect();
        let log_bytes = stored.iter().map(size).sum();
        expand_events(&mut stored);
        let last_ok = stored
            .iter()
            .filter_map(|e| match e {
                Event::CallFinished(c) if c.status == crate::CallStatus::Ok => Some(c.call_index),
                _ => None,
            })
            .max();
        let transcript_bytes = stored
            .iter()
            .filter(|e| match e {
                Event::CallStarted(c) => Some(c.call_index) == last_ok,
                Event::CallFinished(c) => Some(c.call_index) == last_ok,
                _ => false,
            })
            .map(size)
            .sum();
        SessionVolume {
            calls: stored
                .iter()
                .filter(|e| matches!(e, Event::CallFinished(_)))
                .count(),
            log_bytes,
            whole_bytes: stored.iter().map(size).sum(),
            transcript_bytes,
        }
    }

    /// Bytes in the log per byte of the final transcript.
    pub fn ratio(&self) -> f64 {
        self.log_bytes as f64 / self.transcript_bytes.max(1) as f64
    }

    /// The same, had every call been stored whole.
    pub fn whole_ratio(&self) -> f64 {
        self.whole_bytes as f64 / self.transcript_bytes.max(1) as f64
    }
}

impl std::fmt::Display for SessionVolume {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "{} calls, final transcript {} bytes: {} bytes in the log ({:.2}×), {} stored whole ({:.2}×)",
            self.calls,
            self.transcript_bytes,
            self.log_bytes,
            self.ratio(),
            self.whole_bytes,
            self.whole_ratio()
        )
    }
}
