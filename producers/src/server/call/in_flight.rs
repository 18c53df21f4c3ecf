//! The calls in flight: each taken out once, by the call as it ends or by
//! the proxy shutting down.

use crate::sessions::Session;
use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};
use std::time::Instant;

/// Calls recorded as started and not yet as finished. Whoever claims a call
/// records how it ended: the call itself, or the proxy shutting down
/// (which records those left as interrupted), never both.
///
/// A claimed call stays counted until its record is sent: a shutdown that
/// saw the table empty between the claim and the send used to close the
/// log before the call's `CallFinished` reached it.
#[derive(Default)]
pub struct CallsInFlight(Mutex<InFlightTable>);

/// (session id, call index) → the session, when the call arrived, and
/// whether it is claimed (its end being recorded).
type InFlightTable = BTreeMap<(String, i64), (Arc<Session>, Instant, bool)>;

/// The error of a call the proxy shut down under.
pub const INTERRUPTED: &str = "interrupted: the proxy shut down with the call in flight";

/// A claimed call: it leaves the table when this is dropped, after its
/// record is sent.
pub(super) struct Claimed<'a> {
    table: &'a CallsInFlight,
    key: (String, i64),
}

impl Drop for Claimed<'_> {
    fn drop(&mut self) {
        self.table.calls().remove(&self.key);
    }
}

impl CallsInFlight {
    fn calls(&self) -> std::sync::MutexGuard<'_, InFlightTable> {
        self.0.lock().unwrap_or_else(|p| p.into_inner())
    }

    pub(super) fn start(&self, session: &Arc<Session>, index: i64, received: Instant) {
        self.calls().insert(
            (session.id.clone(), index),
            (session.clone(), received, false),
        );
    }

    /// Claims the call for its own record; `None` if the shutdown took it.
    pub(super) fn claim(&self, session: &str, index: i64) -> Option<Claimed<'_>> {
        let key = (session.to_string(), index);
        match self.calls().get_mut(&key) {
            Some((_, _, claimed @ false)) => *claimed = true,
            _ => return None,
        }
        Some(Claimed { table: self, key })
    }

    /// Calls started and not yet recorded as finished, claimed ones included.
    pub fn len(&self) -> usize {
        self.calls().len()
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Takes every unclaimed call out: (its session, its index, how long it
    /// ran). Claimed ones stay until their records are sent.
    pub(in crate::server) fn take_all(&self) -> Vec<(Arc<Session>, i64, std::time::Duration)> {
        let mut calls = self.calls();
        let unclaimed: Vec<_> = calls
            .iter()
            .filter(|(_, (_, _, claimed))| !claimed)
            .map(|(key, _)| key.clone())
            .collect();
        unclaimed
            .into_iter()
            .filter_map(|key| calls.remove_entry(&key))
            .map(|((_, index), (session, received, _))| (session, index, received.elapsed()))
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::sessions::{NewSession, Sessions};

    /// A shutdown between a call's claim and its record's send used to see
    /// no call in flight and close the log under it.
    #[test]
    fn a_claimed_call_counts_until_its_record_is_sent_and_is_never_taken_twice() {
        let sessions = Sessions::default();
        let (s, _) = sessions
            .create(NewSession::new("r", "t", "h", "g"), Some("run"), 4, 0)
            .unwrap();
        let table = CallsInFlight::default();
        table.start(&s, 0, Instant::now());
        table.start(&s, 1, Instant::now());
        let claimed = table.claim(&s.id, 0).expect("call 0 is in flight");
        assert!(table.claim(&s.id, 0).is_none(), "claimed once only");
        let taken: Vec<i64> = table.take_all().into_iter().map(|(_, i, _)| i).collect();
        assert_eq!(taken, [1], "the shutdown takes only the unclaimed call");
        assert!(table.claim(&s.id, 1).is_none(), "the shutdown recorded it");
        assert_eq!(table.len(), 1, "the claimed call is still sending");
        drop(claimed);
        assert!(table.is_empty());
    }
}
