//! Sessions rebuilt from the log: what a restarted proxy takes over.

use super::{session_id, Session, RECENT_ANSWERS};
use forgelog_dialects::splice::AnsweredCall;
use forgelog_schemas::{CallFinished, CallStatus, Event, RolloutStarted};
use std::collections::{BTreeMap, BTreeSet, VecDeque};
use std::sync::atomic::{AtomicI64, AtomicU32};
use std::sync::{Arc, Mutex};
use tokio::sync::Semaphore;

/// The session table as the log tells it: a pure fold over `forgelog.rollouts`,
/// `forgelog.rewards` and `forgelog.calls` events (in that order), no I/O.
#[derive(Debug, Default)]
pub struct SessionLog {
    pub(super) open: BTreeMap<String, OpenSession>,
    pub(super) ended: BTreeSet<String>,
}

#[derive(Debug)]
pub(super) struct OpenSession {
    pub(super) started: RolloutStarted,
    verdict_recorded: bool,
    /// Call index → its end, once recorded: (status, sampled tokens).
    calls: BTreeMap<i64, Option<(CallStatus, usize)>>,
    /// Its calls as the log holds them: the answered calls a restarted
    /// proxy splices the next prompts onto (token in).
    finished: Vec<CallFinished>,
}

impl OpenSession {
    pub(super) fn session(&self, key_sha256: &str, max_in_flight: u32) -> Session {
        let s = &self.started;
        let next = self.calls.keys().next_back().map_or(0, |i| i + 1);
        let ended = self.calls.values().flatten();
        // What took a model call from the budget: all but the harness's own
        // bad requests, and the calls left without an end (they reached the
        // upstream, as far as anyone knows).
        let used = self
            .calls
            .values()
            .filter(|end| !matches!(end, Some((CallStatus::ClientError, _))))
            .count();
        Session {
            id: s.session_id.clone(),
            run_id: s.run_id.clone(),
            rollout_id: s.rollout_id.clone(),
            task_id: s.task_id.clone(),
            harness: s.harness.clone(),
            group_id: s.group_id.clone(),
            started_at_ms: s.started_at_ms,
            max_model_calls: s
                .max_model_calls
                .map(|n| n.clamp(0, u32::MAX as i64) as u32),
            max_tokens: s.max_tokens,
            key_sha256: key_sha256.to_string(),
            restored: true,
            verdict_recorded: self.verdict_recorded,
            next_call: AtomicI64::new(next),
            model_calls: AtomicU32::new(used as u32),
            finished_calls: AtomicI64::new(ended.clone().count() as i64),
            sampled_tokens: AtomicI64::new(ended.map(|(_, n)| *n as i64).sum()),
            in_flight: Arc::new(Semaphore::new(max_in_flight as usize)),
            max_in_flight,
            // A restarted proxy records its next call of the session whole.
            memory: Mutex::default(),
            answered: Mutex::new(self.answered()),
            unrouted: Mutex::default(),
        }
    }

    /// The session's last [`RECENT_ANSWERS`] answered calls whose prompts the
    /// proxy made (token in), as it kept them: so a restarted proxy goes on
    /// splicing where its predecessor stopped, rather than rendering afresh.
    fn answered(&self) -> VecDeque<AnsweredCall> {
        let mut calls = self.finished.clone();
        // A call whose splice base is missing stays empty and is left out.
        forgelog_schemas::compact::expand_finished(&mut calls);
        calls.sort_by_key(|c| c.call_index);
        calls.dedup_by_key(|c| c.call_index);
        let answered: Vec<AnsweredCall> = calls
            .into_iter()
            .filter(|c| c.status == CallStatus::Ok && c.trainable && c.prompt_made.is_some())
            .filter(|c| !c.prompt_token_ids.is_empty())
            .filter_map(answered_call)
            .collect();
        let skip = answered.len().saturating_sub(RECENT_ANSWERS);
        answered.into_iter().skip(skip).collect()
    }
}

/// A recorded call as the proxy kept it when it answered: the request's
/// messages and tools (its OpenAI Chat form), the answer it returned, the ids.
fn answered_call(c: CallFinished) -> Option<AnsweredCall> {
    let mut chat: serde_json::Value = serde_json::from_str(&c.chat_request).ok()?;
    let answer = serde_json::from_str(&c.chat_response).ok()?;
    let serde_json::Value::Array(messages) = chat["messages"].take() else {
        return None;
    };
    Some(AnsweredCall {
        call: c.call_index,
        messages,
        tools: Some(chat["tools"].take()).filter(|t| !t.is_null()),
        answer,
        prompt_ids: c.prompt_token_ids,
        sampled_ids: c.completion_token_ids,
        prompt_text: None,
    })
}

impl SessionLog {
    pub fn apply(&mut self, event: &Event) {
        match event {
            Event::RolloutStarted(r) if !self.ended.contains(&r.session_id) => {
                self.open
                    .entry(r.session_id.clone())
                    .or_insert(OpenSession {
                        started: r.clone(),
                        verdict_recorded: false,
                        calls: BTreeMap::new(),
                        finished: Vec::new(),
                    });
            }
            Event::RolloutFinished(r) => {
                self.open.remove(&r.session_id);
                self.ended.insert(r.session_id.clone());
            }
            Event::VerifierResult(v) => {
                let id = session_id(&v.run_id, &v.rollout_id);
                if v.abandoned {
                    // Given up: its attempt is over, whatever else the log says.
                    self.open.remove(&id);
                    self.ended.insert(id);
                } else if let Some(open) = self.open.get_mut(&id) {
                    open.verdict_recorded = true;
                }
            }
            Event::CallStarted(c) => {
                if let Some(open) = self.open.get_mut(&c.session_id) {
                    open.calls.entry(c.call_index).or_insert(None);
                }
            }
            Event::CallFinished(c) => {
                if let Some(open) = self.open.get_mut(&c.session_id) {
                    open.calls
                        .insert(c.call_index, Some((c.status, c.completion_token_ids.len())));
                    open.finished.push(c.clone());
                }
            }
            _ => {}
        }
    }

    /// The earliest start among the open sessions: their calls are all later.
    pub fn oldest_open_ms(&self) -> Option<i64> {
        self.open.values().map(|o| o.started.started_at_ms).min()
    }

    /// Calls of open sessions recorded as started and never as finished (the
    /// proxy that took them died): (session id, call index).
    pub fn unfinished_calls(&self) -> Vec<(String, i64)> {
        self.open
            .iter()
            .flat_map(|(id, o)| {
                o.calls
                    .iter()
                    .filter(|(_, end)| end.is_none())
                    .map(move |(i, _)| (id.clone(), *i))
            })
            .collect()
    }

    pub fn open_sessions(&self) -> usize {
        self.open.len()
    }
}
