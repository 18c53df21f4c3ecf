//! The recorded upstream of `forgelog replay serve`: a run's calls as the log
//! holds them, answering a re-running harness call by call. Pure: built from
//! events, it maps (session, call index, canonical request) to the upstream
//! answer the proxy got then, or to a [`Divergence`] naming the first message
//! that differs. The proxy around it is the live one with this as its upstream,
//! so dialects, ids and stream shapes come out of the same code as recorded.

use forgelog_api::{NewSession, ReplaySession};
use forgelog_schemas::diff::{clip, first_difference};
use forgelog_schemas::{CallFinished, CallStatus, Event, RolloutStarted};
use serde_json::{json, Value};
use std::collections::BTreeMap;

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
#[derive(Debug, Clone, PartialEq)]
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

/// The request in the form `CallFinished.chat_request` records and replay compares:
/// the upstream body's `messages` and `tools` (OpenAI Chat form, whatever the dialect).
pub fn chat_form(upstream_body: &Value) -> Value {
    json!({
        "messages": upstream_body["messages"],
        "tools": upstream_body.get("tools").cloned().unwrap_or_default(),
    })
}

/// The upstream answer a recorded `CallFinished` stands for, in the vLLM shape
/// [`crate::upstream::read_response`] reads: the message, finish reason, token
/// ids, logprobs, usage and policy version as they came, and the `created` time
/// the harness saw.
pub fn recorded_answer(c: &CallFinished) -> Value {
    let message: Value = serde_json::from_str(&c.chat_response).unwrap_or_else(
        |_| json!({"role": "assistant", "content": String::from_utf8_lossy(&c.response_body)}),
    );
    let sent: Value = serde_json::from_slice(&c.response_body).unwrap_or_default();
    let created = sent["created"]
        .as_i64()
        .or_else(|| sent["created_at"].as_i64())
        .unwrap_or(c.finished_at_ms / 1000);
    let logprobs: Vec<Value> = c
        .completion_token_ids
        .iter()
        .zip(&c.completion_logprobs)
        .map(|(id, lp)| json!({"token": format!("token_id:{id}"), "logprob": *lp as f64}))
        .collect();
    json!({
        "object": "chat.completion",
        "created": created,
        "model": c.model,
        "choices": [{
            "index": 0,
            "message": message,
            "finish_reason": c.finish_reason,
            "token_ids": c.completion_token_ids,
            "logprobs": {"content": logprobs},
        }],
        "prompt_token_ids": c.prompt_token_ids,
        "usage": {
            "prompt_tokens": c.usage.prompt_tokens,
            "completion_tokens": c.usage.completion_tokens,
            "total_tokens": c.usage.prompt_tokens + c.usage.completion_tokens,
        },
        "policy_version": c.policy_version,
    })
}

/// Where `got` first differs from `recorded` (both in [`chat_form`]): message by message, then the tools.
pub fn divergence(recorded: &Value, got: &Value) -> Option<(Option<usize>, String, String)> {
    let names = ("recording", "request");
    let empty = Vec::new();
    let msgs = |v: &Value| v["messages"].as_array().unwrap_or(&empty).clone();
    let (rec, req) = (msgs(recorded), msgs(got));
    for i in 0..rec.len().max(req.len()) {
        let field = format!("messages[{i}]");
        match (rec.get(i), req.get(i)) {
            (Some(a), Some(b)) => {
                // Who speaks matters more than what: a role change is named first.
                let diff = first_difference(&a["role"], &b["role"], names)
                    .map(|(_, detail)| ("role".to_string(), detail))
                    .or_else(|| first_difference(a, b, names));
                if let Some((path, detail)) = diff {
                    let path = if path.is_empty() {
                        field
                    } else {
                        format!("{field}.{path}")
                    };
                    return Some((Some(i), path, detail));
                }
            }
            (Some(a), None) => {
                return Some((
                    Some(i),
                    field,
                    format!(
                        "the request has {} messages, the recording {}; next recorded: {}",
                        req.len(),
                        rec.len(),
                        clip(a)
                    ),
                ))
            }
            (None, Some(b)) => {
                return Some((
                    Some(i),
                    field,
                    format!(
                        "the request has {} messages, the recording {}; extra: {}",
                        req.len(),
                        rec.len(),
                        clip(b)
                    ),
                ))
            }
            (None, None) => unreachable!("i < max(len)"),
        }
    }
    let none = Value::Null;
    let tools = |v: &Value| match v.get("tools") {
        Some(Value::Array(a)) if a.is_empty() => none.clone(),
        Some(t) => t.clone(),
        None => none.clone(),
    };
    first_difference(&tools(recorded), &tools(got), names).map(|(path, detail)| {
        let field = if path.is_empty() {
            "tools".to_string()
        } else {
            format!("tools.{path}")
        };
        (None, field.replace("tools.[", "tools["), detail)
    })
}

impl Recording {
    /// The recording of run `run_id` in `events` (any order; others' events are skipped).
    pub fn from_events<'a>(run_id: &str, events: impl IntoIterator<Item = &'a Event>) -> Recording {
        let mut rollouts: BTreeMap<String, RolloutStarted> = BTreeMap::new();
        let mut started: BTreeMap<(String, i64), ()> = BTreeMap::new();
        let mut finished: BTreeMap<(String, i64), &CallFinished> = BTreeMap::new();
        for e in events.into_iter().filter(|e| e.run_id() == run_id) {
            match e {
                Event::RolloutStarted(r) => {
                    rollouts.insert(r.session_id.clone(), r.clone());
                }
                Event::CallStarted(c) => {
                    started.insert((c.session_id.clone(), c.call_index), ());
                }
                Event::CallFinished(c) => {
                    finished.insert((c.session_id.clone(), c.call_index), c);
                }
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
        for ((session_id, index), c) in &finished {
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
                *index,
                RecordedCall {
                    call_index: *index,
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
        let s = self
            .sessions
            .get(session_id)
            .ok_or_else(|| ReplayError::UnknownSession {
                session_id: session_id.to_string(),
                run_id: self.run_id.clone(),
            })?;
        let Some(call) = s.calls.get(&call_index) else {
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
            .then(|| divergence(&call.chat_request, &chat_form(upstream_body)))
            .flatten();
        if let Some((message, field, detail)) = compared {
            return Err(ReplayError::Diverged(Box::new(Divergence {
                session_id: session_id.to_string(),
                call_index,
                message,
                field,
                detail,
            })));
        }
        call.outcome
            .clone()
            .map_err(|f| ReplayError::RecordedFailure {
                session_id: session_id.to_string(),
                call_index,
                status: f.status,
                error: f.error,
            })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::upstream::read_response;

    fn rollout(run: &str, session: &str, rollout: &str) -> Event {
        RolloutStarted {
            run_id: run.into(),
            event_id: format!("rs-{rollout}"),
            rollout_id: rollout.into(),
            session_id: session.into(),
            task_id: "t".into(),
            harness: "h".into(),
            group_id: "g".into(),
            group_size: 2,
            policy_version: None,
            started_at_ms: 1,
            max_model_calls: None,
            max_tokens: None,
            api_key_sha256: None,
        }
        .into()
    }

    fn body(messages: Value) -> Value {
        json!({"model": "m", "messages": messages, "logprobs": true, "stream": false})
    }

    fn finished(run: &str, session: &str, index: i64, messages: Value) -> CallFinished {
        let mut c = forgelog_schemas::testing::call_finished(run, session, index, 3, 2);
        c.model = "smol".into();
        c.completion_logprobs = vec![-0.25, -1.5];
        c.finish_reason = Some("tool_calls".into());
        c.policy_version = Some(3);
        c.response_body = br#"{"id":"chatcmpl-x","created":1700000000}"#.to_vec();
        c.chat_request = chat_form(&body(messages)).to_string();
        c.chat_response = json!({"role": "assistant", "content": "hi", "tool_calls": [{"id": "call_0", "type": "function", "function": {"name": "f", "arguments": "{\"a\":1}"}}]}).to_string();
        c
    }

    fn recording() -> Recording {
        let m0 = json!([{"role": "user", "content": "Hi"}]);
        let m1 = json!([{"role": "user", "content": "Hi"}, {"role": "assistant", "content": "hi"}, {"role": "user", "content": "More"}]);
        let mut failed = finished("run", "s1", 2, json!([]));
        failed.status = CallStatus::UpstreamError;
        failed.error = Some("upstream answered HTTP 500".into());
        failed.chat_request = String::new();
        let events: Vec<Event> = vec![
            rollout("run", "s1", "r1"),
            finished("run", "s1", 1, m1).into(),
            finished("run", "s1", 0, m0).into(),
            failed.into(),
            finished("other-run", "s1", 3, json!([])).into(),
            rollout("run", "s2", "r2"),
        ];
        Recording::from_events("run", &events)
    }

    #[test]
    fn a_recorded_answer_reads_back_as_the_recorded_response() {
        let c = finished("run", "s1", 0, json!([]));
        let (resp, sampled) = read_response(&recorded_answer(&c), "p_").unwrap();
        assert_eq!(resp.created, 1_700_000_000);
        assert_eq!(resp.text(), "hi");
        assert_eq!(resp.tool_calls().next().unwrap().arguments, "{\"a\":1}");
        assert_eq!((resp.usage.input, resp.usage.output), (3, 2));
        assert_eq!(sampled.prompt_token_ids, c.prompt_token_ids);
        assert_eq!(sampled.completion_token_ids, c.completion_token_ids);
        assert_eq!(sampled.completion_logprobs, c.completion_logprobs);
        assert_eq!(sampled.policy_version, Some(3));
        assert_eq!(sampled.finish_reason.as_deref(), Some("tool_calls"));
        assert_eq!(sampled.untrainable_reason, None);
    }

    #[test]
    fn calls_are_answered_by_index_when_the_conversation_matches() {
        let rec = recording();
        assert_eq!(rec.model, "smol");
        assert_eq!(rec.sessions.len(), 2);
        assert_eq!(
            rec.sessions["s1"].calls.len(),
            3,
            "the other run's call is not ours"
        );
        let a = rec
            .answer("s1", 0, &body(json!([{"role": "user", "content": "Hi"}])))
            .unwrap();
        assert_eq!(a["choices"][0]["token_ids"], json!([5, 18]));
        // The same conversation with other sampling and model is the same call.
        let mut other = body(json!([{"role": "user", "content": "Hi"}]));
        other["temperature"] = json!(0.1);
        other["model"] = json!("another");
        assert!(rec.answer("s1", 0, &other).is_ok());
    }

    #[test]
    fn a_changed_message_names_session_call_message_and_field() {
        let rec = recording();
        let changed = body(
            json!([{"role": "user", "content": "Hi"}, {"role": "assistant", "content": "hi"}, {"role": "user", "content": "Less"}]),
        );
        let ReplayError::Diverged(d) = rec.answer("s1", 1, &changed).unwrap_err() else {
            panic!()
        };
        assert_eq!(
            (d.session_id.as_str(), d.call_index, d.message),
            ("s1", 1, Some(2))
        );
        assert_eq!(d.field, "messages[2].content");
        let text = d.to_string();
        assert!(
            text.contains("session s1, call 1: message 2 differs")
                && text.contains("recording \"More\", request \"Less\""),
            "{text}"
        );
        let other_role = body(json!([{"role": "system", "content": "Hi"}]));
        let ReplayError::Diverged(d) = rec.answer("s1", 0, &other_role).unwrap_err() else {
            panic!()
        };
        assert_eq!((d.message, d.field.as_str()), (Some(0), "messages[0].role"));
        assert!(
            d.detail.contains("recording \"user\", request \"system\""),
            "{d}"
        );
        let shorter = body(json!([{"role": "user", "content": "Hi"}]));
        let ReplayError::Diverged(d) = rec.answer("s1", 1, &shorter).unwrap_err() else {
            panic!()
        };
        assert_eq!(d.message, Some(1));
        assert!(
            d.detail
                .contains("the request has 1 messages, the recording 3"),
            "{d}"
        );
        let mut tools = body(json!([{"role": "user", "content": "Hi"}]));
        tools["tools"] = json!([{"type": "function", "function": {"name": "f"}}]);
        let ReplayError::Diverged(d) = rec.answer("s1", 0, &tools).unwrap_err() else {
            panic!()
        };
        assert_eq!((d.message, d.field.as_str()), (None, "tools"));
    }

    #[test]
    fn failures_unknown_calls_and_sessions_are_errors() {
        let rec = recording();
        // Recorded without its request (it failed before the upstream): the
        // harness gets the recorded failure whatever it sends now.
        let e = rec
            .answer(
                "s1",
                2,
                &body(json!([{"role": "user", "content": "anything"}])),
            )
            .unwrap_err();
        assert!(
            matches!(
                e,
                ReplayError::RecordedFailure {
                    status: CallStatus::UpstreamError,
                    ..
                }
            ),
            "{e}"
        );
        let e = rec.answer("s1", 9, &body(json!([]))).unwrap_err();
        assert_eq!(
            e.to_string(),
            "session s1, call 9: not in the recording (it holds calls 0, 1, 2)"
        );
        assert!(matches!(
            rec.answer("s9", 0, &body(json!([]))),
            Err(ReplayError::UnknownSession { .. })
        ));
    }

    #[test]
    fn replay_sessions_are_asked_for_by_id_or_by_the_original_request() {
        let rec = recording();
        let request = |v: Value| -> ReplaySession { serde_json::from_value(v).unwrap() };
        let by_id = rec
            .new_session(&request(json!({"replay_of": "s2"})))
            .unwrap();
        assert_eq!(by_id.rollout_id, "r2");
        let by_rollout = rec
            .new_session(&request(json!({"replay_of": "r1"})))
            .unwrap();
        assert_eq!(
            (by_rollout.run_id.as_deref(), by_rollout.group_size),
            (Some("run"), Some(2))
        );
        let original = json!({"rollout_id": "r1", "task_id": "t", "harness": "h", "group_id": "g"});
        assert_eq!(
            rec.new_session(&request(original)).unwrap().rollout_id,
            "r1"
        );
        assert!(matches!(
            rec.new_session(&request(json!({"replay_of": "nope"}))),
            Err(ReplayError::UnknownSession { .. })
        ));
        let other_run = json!({"run_id": "x", "rollout_id": "r1", "task_id": "t", "harness": "h", "group_id": "g"});
        assert!(rec.new_session(&request(other_run)).is_err());
    }

    /// mini-swe-agent's replay used to end at its recorded budget stops
    /// (refused: recorded with no request) and retry until its timeout: the
    /// replay session has the recorded budget, so the proxy stops it there again.
    #[test]
    fn a_replay_session_keeps_the_recorded_budget() {
        let mut stop = finished("run", "s1", 3, json!([]));
        stop.status = CallStatus::BudgetStop;
        stop.chat_request = String::new();
        let mut events: Vec<Event> = vec![rollout("run", "s1", "r1")];
        for i in 0..3 {
            events.push(finished("run", "s1", i, json!([])).into());
        }
        events.push(stop.into());
        let rec = Recording::from_events("run", &events);
        let request: ReplaySession = serde_json::from_value(json!({"replay_of": "r1"})).unwrap();
        assert_eq!(rec.new_session(&request).unwrap().max_model_calls, Some(3));
        // Recorded since v4: the budget as the session had it.
        let Event::RolloutStarted(mut r) = rollout("run", "s2", "r2") else {
            unreachable!()
        };
        r.max_model_calls = Some(6);
        let rec = Recording::from_events("run", &[r.into()]);
        let request: ReplaySession = serde_json::from_value(json!({"replay_of": "r2"})).unwrap();
        assert_eq!(rec.new_session(&request).unwrap().max_model_calls, Some(6));
    }
}
