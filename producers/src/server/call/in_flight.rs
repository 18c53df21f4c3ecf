//! The calls in flight: each taken out once, by the call as it ends or by
//! the proxy shutting down.

use crate::sessions::Session;
use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};
use std::time::Instant;

/// Calls recorded as started and not yet as finished. Whoever takes a call
/// out records how it ended: the call itself, or the proxy shutting down
/// (which records those left as interrupted), never both.
#[derive(Default)]
pub struct CallsInFlight(Mutex<InFlightTable>);

/// (session id, call index) → the session and when the call arrived.
type InFlightTable = BTreeMap<(String, i64), (Arc<Session>, Instant)>;

/// The error of a call the proxy shut down under.
pub const INTERRUPTED: &str = "interrupted: the proxy shut down with the call in flight";

impl CallsInFlight {
    fn calls(&self) -> std::sync::MutexGuard<'_, InFlightTable> {
        self.0.lock().unwrap_or_else(|p| p.into_inner())
    }

    pub(super) fn start(&self, session: &Arc<Session>, index: i64, received: Instant) {
        self.calls()
            .insert((session.id.clone(), index), (session.clone(), received));
    }

    /// Takes the call out; false if it was no longer in (already recorded).
    pub(super) fn end(&self, session: &str, index: i64) -> bool {
        self.calls().remove(&(session.to_string(), index)).is_some()
    }

    pub fn len(&self) -> usize {
        self.calls().len()
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Takes every call out: (its session, its index, how long it ran).
    pub(in crate::server) fn take_all(&self) -> Vec<(Arc<Session>, i64, std::time::Duration)> {
        let calls = std::mem::take(&mut *self.calls());
        calls
            .into_iter()
            .map(|((_, index), (session, received))| (session, index, received.elapsed()))
            .collect()
    }
}
