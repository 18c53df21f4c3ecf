//! A recorded run as the proxy's upstream: which recorded call answers each
//! re-sent one, what a lenient replay answered although it differed, and
//! what it could not answer.

use super::{Matching, Recording, ReplayError, ReportEntry};
use crate::upstream::{UpstreamAnswer, UpstreamError};
use serde_json::Value;
use std::collections::{BTreeMap, BTreeSet};
use std::sync::Mutex;

pub struct RecordedUpstream {
    pub recording: Recording,
    pub matching: Matching,
    /// The recorded calls already answered, by session: a call is answered
    /// once, so calls that come in another order than recorded (sub-agents
    /// running in parallel) each find their own.
    answered: Mutex<BTreeMap<String, BTreeSet<i64>>>,
    report: Mutex<Vec<ReportEntry>>,
    /// Calls it had no answer for (a recorded failure replayed is not one).
    refused: Mutex<Vec<String>>,
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

impl RecordedUpstream {
    pub fn new(recording: Recording, matching: Matching) -> RecordedUpstream {
        RecordedUpstream {
            recording,
            matching,
            answered: Default::default(),
            report: Default::default(),
            refused: Default::default(),
        }
    }

    /// A replay of session `session_id` starts (again): all its recorded calls can answer.
    pub fn session_opened(&self, session_id: &str) {
        lock(&self.answered).remove(session_id);
    }

    /// Every call answered although it differed, in the order they came.
    pub fn report(&self) -> Vec<ReportEntry> {
        lock(&self.report).clone()
    }

    /// Every call it had no recorded answer for, in words, in the order they came.
    pub fn refused(&self) -> Vec<String> {
        lock(&self.refused).clone()
    }

    /// The recorded answer to call `index` of `session`.
    pub fn answer(
        &self,
        session: &str,
        index: i64,
        body: &Value,
    ) -> Result<UpstreamAnswer, UpstreamError> {
        // Held across the match: two calls of one session never take the same recorded one.
        let mut answered = lock(&self.answered);
        let used = answered.entry(session.to_string()).or_default();
        match self
            .recording
            .answer_with(session, index, body, &self.matching, used)
        {
            Ok(a) => {
                used.insert(a.call_index);
                drop(answered);
                if let Some(entry) = a.report {
                    tracing::warn!(
                        explained = entry.explained,
                        "replay: answered from the recording although {}",
                        entry.divergence
                    );
                    lock(&self.report).push(entry);
                }
                Ok(a.answer.into())
            }
            Err(e @ ReplayError::RecordedFailure { .. }) => {
                if let ReplayError::RecordedFailure { call_index, .. } = &e {
                    used.insert(*call_index);
                }
                Err(e.into())
            }
            Err(e) => {
                drop(answered);
                tracing::warn!(error = %e, "replay: no recorded answer");
                metrics::counter!("forgelog_replay_refused_total").increment(1);
                lock(&self.refused).push(e.to_string());
                Err(e.into())
            }
        }
    }
}
