//! The recorded upstream of `forgelog replay serve`: a run's calls as the log
//! holds them, answering a re-running harness call by call. Pure: built from
//! events, it maps (session, call index, canonical request) to the upstream
//! answer the proxy got then, or to a [`Divergence`] naming the first message
//! that differs. The proxy around it is the live one with this as its upstream,
//! so dialects, ids and stream shapes come out of the same code as recorded.

mod chat_form;
mod lenient;
mod recorded;

pub use chat_form::{chat_form, chat_form_text, divergence, recorded_answer};
pub use lenient::{report_text, Matching, Normaliser, ReportEntry};
pub use recorded::RecordedUpstream;

use forgelog_api::{NewSession, ReplaySession};
use forgelog_schemas::{CallFinished, CallStatus, Event, RolloutStarted};
use serde_json::Value;
use std::collections::{BTreeMap, BTreeSet};

/// One recorded call: what the proxy asked upstream (in OpenAI Chat form) and what came back.
#[derive(Debug, Clone, PartialEq)]
pub struct RecordedCall {
    pub call_index: i64,
    /// `{"messages": [...], "tools": ...}` as recorded in `CallFinished.chat_request`.
    pub chat_request: Value,
    pub outcome: Result<Value, RecordedFailure>,
}

/// A call that did not get an answer when it was recorded.
#[derive(Debug, Clone, PartialEq)]
pub struct RecordedFailure {
    pub status: CallStatus,
    pub error: String,
}

/// A recorded session: its rollout and its calls by index.
#[derive(Debug, Clone, PartialEq)]
pub struct RecordedSession {
    pub rollout: RolloutStarted,
    pub calls: BTreeMap<i64, RecordedCall>,
    /// Calls that started but have no `CallFinished` (the proxy stopped mid-call).
    pub unfinished: Vec<i64>,
}

impl RecordedSession {
    /// The session's call budget: as `RolloutStarted` recorded it (v4), or, in
    /// older recordings, as its first budget stop shows it (the calls before it
    /// that took one: all but the harness's own bad requests).
    pub fn budget(&self) -> Option<u32> {
        if let Some(n) = self.rollout.max_model_calls {
            return Some(n.clamp(0, u32::MAX as i64) as u32);
        }
        let (&first_stop, _) = self
            .calls
            .iter()
            .find(|(_, c)| matches!(&c.outcome, Err(f) if f.status == CallStatus::BudgetStop))?;
        let took = self
            .calls
            .range(..first_stop)
            .filter(|(_, c)| !matches!(&c.outcome, Err(f) if f.status == CallStatus::ClientError))
            .count();
        Some(took as u32)
    }
}

/// Where a re-sent call left the recording.
#[derive(Debug, Clone, PartialEq, serde::Serialize)]
pub struct Divergence {
    pub session_id: String,
    pub call_index: i64,
    /// The first differing message (OpenAI Chat form index); `None` when only the tools differ.
    pub message: Option<usize>,
    /// Path of the first differing field, e.g. `messages[3].content` or `tools[0].function.name`.
    pub field: String,
    pub detail: String,
}

impl std::fmt::Display for Divergence {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "replay diverged: session {}, call {}: ",
            self.session_id, self.call_index
        )?;
        match self.message {
            Some(m) => write!(f, "message {m} differs from the recording")?,
            None => write!(f, "the tools differ from the recording")?,
        }
        write!(f, " (field {}: {})", self.field, self.detail)
    }
}

#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum ReplayError {
    #[error("{0}")]
    Diverged(Box<Divergence>),
    #[error("session {session_id} is not in the recording of run {run_id}")]
    UnknownSession { session_id: String, run_id: String },
    #[error(
        "session {session_id}, call {call_index}: not in the recording (it holds calls {recorded})"
    )]
    NotRecorded {
        session_id: String,
        call_index: i64,
        recorded: String,
    },
    #[error("session {session_id}, call {call_index}: recorded as {status:?}: {error}")]
    RecordedFailure {
        session_id: String,
        call_index: i64,
        status: CallStatus,
        error: String,
    },
    #[error("{0} is not a model call of a session: nothing was recorded for it")]
    NotACall(&'static str),
    #[error("bad replay session request: {0}")]
    BadSessionRequest(String),
}

/// A run's sessions as recorded: what `replay serve` answers from.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Recording {
    pub run_id: String,
    /// By session id.
    pub sessions: BTreeMap<String, RecordedSession>,
    /// The model the recorded upstream named (of the first answered call).
    pub model: String,
}

impl Recording {
    /// The recording of run `run_id` in `events` (any order; others' events are skipped).
    pub fn from_events<'a>(run_id: &str, events: impl IntoIterator<Item = &'a Event>) -> Recording {
        let mut rollouts: BTreeMap<String, RolloutStarted> = BTreeMap::new();
        let mut started: BTreeMap<(String, i64), ()> = BTreeMap::new();
        let mut finished: Vec<CallFinished> = Vec::new();
        for e in events.into_iter().filter(|e| e.run_id() == run_id) {
            match e {
                Event::RolloutStarted(r) => {
                    rollouts.insert(r.session_id.clone(), r.clone());
                }
                Event::CallStarted(c) => {
                    started.insert((c.session_id.clone(), c.call_index), ());
                }
                Event::CallFinished(c) => finished.push(c.clone()),
                _ => {}
            }
        }
        let mut rec = Recording {
            run_id: run_id.to_string(),
            ..Default::default()
        };
        for (session_id, rollout) in rollouts {
            rec.sessions.insert(
                session_id,
                RecordedSession {
                    rollout,
                    calls: BTreeMap::new(),
                    unfinished: Vec::new(),
                },
            );
        }
        // The chat forms whole again (stored relative to earlier calls, v5).
        forgelog_schemas::compact::expand_finished(&mut finished);
        // One per call (the log is at-least-once), in call order.
        let finished: BTreeMap<(&str, i64), &CallFinished> = finished
            .iter()
            .map(|c| ((c.session_id.as_str(), c.call_index), c))
            .collect();
        for (&(session_id, index), c) in &finished {
            let Some(s) = rec.sessions.get_mut(session_id) else {
                continue;
            };
            let outcome = match c.status {
                CallStatus::Ok => {
                    if rec.model.is_empty() {
                        rec.model = c.model.clone();
                    }
                    Ok(recorded_answer(c))
                }
                status => Err(RecordedFailure {
                    status,
                    error: c.error.clone().unwrap_or_default(),
                }),
            };
            s.calls.insert(
                index,
                RecordedCall {
                    call_index: index,
                    chat_request: serde_json::from_str(&c.chat_request).unwrap_or_default(),
                    outcome,
                },
            );
        }
        for (session_id, index) in started.into_keys() {
            if let Some(s) = rec.sessions.get_mut(&session_id) {
                if !s.calls.contains_key(&index) {
                    s.unfinished.push(index);
                }
            }
        }
        rec
    }

    /// The recorded session with this session or rollout id.
    pub fn find(&self, session_or_rollout: &str) -> Option<&RecordedSession> {
        self.sessions.get(session_or_rollout).or_else(|| {
            self.sessions
                .values()
                .find(|s| s.rollout.rollout_id == session_or_rollout)
        })
    }

    /// A replay session request: `{"replay_of": "<session or rollout id>"}`, or the
    /// same body the recorded session was created with (an unchanged orchestrator).
    /// Either way it must name a recorded session of this run.
    pub fn new_session(&self, request: &ReplaySession) -> Result<NewSession, ReplayError> {
        let (session, named) = match request {
            ReplaySession::Of { replay_of } => (self.find(replay_of), replay_of),
            ReplaySession::Original(new) => {
                let run = new.run_id.as_deref().unwrap_or(&self.run_id);
                if run != self.run_id {
                    return Err(ReplayError::BadSessionRequest(format!(
                        "run {run} is not the replayed run {}",
                        self.run_id
                    )));
                }
                let found = self
                    .sessions
                    .values()
                    .find(|s| s.rollout.rollout_id == new.rollout_id);
                (found, &new.rollout_id)
            }
        };
        let s = session.ok_or_else(|| ReplayError::UnknownSession {
            session_id: named.clone(),
            run_id: self.run_id.clone(),
        })?;
        let r = &s.rollout;
        // Replayed answers are the recorded ones; the budget is the recorded
        // one too, so the harness meets its budget stops where it did.
        let mut new = NewSession::new(&r.rollout_id, &r.task_id, &r.harness, &r.group_id)
            .in_run(&self.run_id)
            .group_size(r.group_size);
        if let Some(budget) = s.budget() {
            new = new.max_model_calls(budget);
        }
        Ok(new)
    }

    /// The upstream answer recorded for call `call_index` of session `session_id`,
    /// if `upstream_body` asks what was asked then (compared in [`chat_form`]).
    pub fn answer(
        &self,
        session_id: &str,
        call_index: i64,
        upstream_body: &Value,
    ) -> Result<Value, ReplayError> {
        self.answer_with(
            session_id,
            call_index,
            upstream_body,
            &Matching::Strict,
            &BTreeSet::new(),
        )
        .map(|a| a.answer)
    }

    /// [`Recording::answer`] under `matching`, with the session's recorded
    /// calls in `answered` already taken. The call is answered by the
    /// recorded call it asks the same as: the one at its index, else another
    /// not yet answered (calls made in parallel, sub-agents, come in any
    /// order; what a call sends is its place in the tree); a lenient replay
    /// then looks again with volatile text masked, and at last answers the
    /// call at its index anyway and says how it differed.
    pub fn answer_with(
        &self,
        session_id: &str,
        call_index: i64,
        upstream_body: &Value,
        matching: &Matching,
        answered: &BTreeSet<i64>,
    ) -> Result<Answered, ReplayError> {
        let s = self
            .sessions
            .get(session_id)
            .ok_or_else(|| ReplayError::UnknownSession {
                session_id: session_id.to_string(),
                run_id: self.run_id.clone(),
            })?;
        let got = chat_form(upstream_body);
        let free =
            |c: &&RecordedCall| !answered.contains(&c.call_index) && !c.chat_request.is_null();
        // The call at this index first, then the others in call order.
        let candidates = || {
            s.calls
                .get(&call_index)
                .into_iter()
                .chain(s.calls.values().filter(move |c| c.call_index != call_index))
                .filter(free)
        };
        let same = candidates().find(|c| divergence(&c.chat_request, &got).is_none());
        let similar = || match matching {
            Matching::Lenient(n) => {
                let masked = n.normalise(&got);
                candidates().find(|c| divergence(&n.normalise(&c.chat_request), &masked).is_none())
            }
            Matching::Strict => None,
        };
        let Some(call) = same.or_else(similar).or_else(|| s.calls.get(&call_index)) else {
            let mut recorded: Vec<String> = s.calls.keys().map(i64::to_string).collect();
            if recorded.is_empty() {
                recorded.push("none".into());
            }
            let unfinished = if s.unfinished.contains(&call_index) {
                " (it started but never finished)"
            } else {
                ""
            };
            return Err(ReplayError::NotRecorded {
                session_id: session_id.to_string(),
                call_index,
                recorded: format!("{}{unfinished}", recorded.join(", ")),
            });
        };
        // A call recorded without its request (a failure before the upstream,
        // a budget stop) is answered as it was: nothing to compare.
        let compared = (!call.chat_request.is_null())
            .then(|| divergence(&call.chat_request, &got))
            .flatten();
        let mut report = None;
        if let Some((message, field, detail)) = compared {
            let found = Divergence {
                session_id: session_id.to_string(),
                call_index: call.call_index,
                message,
                field,
                detail,
            };
            let Matching::Lenient(normaliser) = matching else {
                return Err(ReplayError::Diverged(Box::new(found)));
            };
            // Explained: the two differ only where the normaliser masks.
            let explained = divergence(
                &normaliser.normalise(&call.chat_request),
                &normaliser.normalise(&got),
            )
            .is_none();
            report = Some(ReportEntry {
                divergence: found,
                explained,
            });
        }
        let answer = call
            .outcome
            .clone()
            .map_err(|f| ReplayError::RecordedFailure {
                session_id: session_id.to_string(),
                call_index: call.call_index,
                status: f.status,
                error: f.error,
            })?;
        Ok(Answered {
            answer,
            call_index: call.call_index,
            report,
        })
    }
}

/// A recorded answer, and how the request differed from the recording when
/// a lenient replay answered it anyway.
#[derive(Debug, Clone, PartialEq)]
pub struct Answered {
    pub answer: Value,
    /// The recorded call that answered.
    pub call_index: i64,
    pub report: Option<ReportEntry>,
}

#[cfg(test)]
mod tests;
