//! The events of a proxied call and of a session, built from plain values: no
//! clock, no I/O, no channel (the shell passes the times in and sends them).
//! Event ids are deterministic: the same call of the same session is the same
//! event, whoever records it.

use crate::sessions::Session;
use forgelog_api::Finish;
use forgelog_dialects::dialect::ErrorKind;
use forgelog_schemas::{
    event_id, CallFinished, CallStarted, CallStatus, Dialect, RolloutFinished, RolloutStarted,
    SamplingParams, Usage, VerifierResult,
};

/// Which call of which session.
#[derive(Debug, Clone, Copy)]
pub struct CallIds<'a> {
    pub run_id: &'a str,
    pub session_id: &'a str,
    pub rollout_id: &'a str,
    pub index: i64,
}

impl<'a> CallIds<'a> {
    pub fn of(session: &'a Session, index: i64) -> CallIds<'a> {
        CallIds {
            run_id: &session.run_id,
            session_id: &session.id,
            rollout_id: &session.rollout_id,
            index,
        }
    }

    fn id(&self, kind: &str) -> String {
        event_id(
            kind,
            &[self.run_id, self.session_id, &self.index.to_string()],
        )
    }

    /// The request as it arrived (decoded from its `Content-Encoding`).
    pub fn started(
        &self,
        dialect: Dialect,
        harness: &str,
        path: String,
        raw_request: Vec<u8>,
        received_at_ms: i64,
    ) -> CallStarted {
        CallStarted {
            run_id: self.run_id.to_string(),
            event_id: self.id("CallStarted"),
            session_id: self.session_id.to_string(),
            rollout_id: self.rollout_id.to_string(),
            call_index: self.index,
            dialect,
            harness: harness.to_string(),
            path,
            raw_request,
            received_at_ms,
            raw_request_splice: None,
        }
    }

    /// How the call ended, with nothing sampled: the shell fills in what the
    /// upstream answered.
    pub fn finished(
        &self,
        status: CallStatus,
        error: Option<String>,
        latency_ms: i64,
        finished_at_ms: i64,
    ) -> CallFinished {
        CallFinished {
            run_id: self.run_id.to_string(),
            event_id: self.id("CallFinished"),
            session_id: self.session_id.to_string(),
            rollout_id: self.rollout_id.to_string(),
            call_index: self.index,
            status,
            error,
            model: String::new(),
            prompt_token_ids: Vec::new(),
            completion_token_ids: Vec::new(),
            completion_logprobs: Vec::new(),
            finish_reason: None,
            sampling_requested: SamplingParams::default(),
            sampling_sent: SamplingParams::default(),
            policy_version: None,
            usage: Usage::default(),
            trainable: false,
            untrainable_reason: None,
            response_body: Vec::new(),
            chat_request: String::new(),
            chat_response: String::new(),
            latency_ms,
            finished_at_ms,
            unparsed_tool_calls: 0,
            prompt_splice: None,
            chat_request_splice: None,
            prompt_made: None,
            stand_in: None,
        }
    }

    /// The id the harness sees for this call's answer.
    pub fn response_id(&self) -> String {
        event_id(
            "response",
            &[self.run_id, self.session_id, &self.index.to_string()],
        )[..24]
            .to_string()
    }
}

/// A refused or failed call's status: the upstream's failures apart from the
/// harness's own.
pub fn failure_status(kind: ErrorKind) -> CallStatus {
    match kind {
        ErrorKind::Upstream | ErrorKind::Timeout | ErrorKind::Unavailable | ErrorKind::Internal => {
            CallStatus::UpstreamError
        }
        _ => CallStatus::ClientError,
    }
}

pub fn rollout_started(
    s: &Session,
    group_size: i64,
    policy_version: Option<i64>,
    started_at_ms: i64,
) -> RolloutStarted {
    RolloutStarted {
        run_id: s.run_id.clone(),
        event_id: event_id("RolloutStarted", &[&s.run_id, &s.rollout_id]),
        rollout_id: s.rollout_id.clone(),
        session_id: s.id.clone(),
        task_id: s.task_id.clone(),
        harness: s.harness.clone(),
        group_id: s.group_id.clone(),
        group_size,
        policy_version,
        started_at_ms,
        max_model_calls: s.max_model_calls.map(i64::from),
        max_tokens: s.max_tokens,
        api_key_sha256: Some(s.key_sha256.clone()),
    }
}

/// The rollout's end and its verdict. A verifier that did not run, or ran and
/// said `ok: false`, is a null reward: never a 0.
pub fn rollout_ended(
    s: &Session,
    finish: &Finish,
    model_calls: i64,
    finished_at_ms: i64,
) -> (RolloutFinished, VerifierResult) {
    let finished = RolloutFinished {
        run_id: s.run_id.clone(),
        event_id: event_id("RolloutFinished", &[&s.run_id, &s.rollout_id]),
        rollout_id: s.rollout_id.clone(),
        session_id: s.id.clone(),
        exit_status: finish.exit_status,
        model_calls,
        started_at_ms: s.started_at_ms,
        finished_at_ms,
    };
    let (ok, reward, details) = match &finish.verifier {
        Some(v) => (v.ok, if v.ok { v.reward } else { None }, v.details_text()),
        None => (false, None, "verifier did not run".to_string()),
    };
    let verdict = VerifierResult {
        run_id: s.run_id.clone(),
        event_id: event_id("VerifierResult", &[&s.run_id, &s.rollout_id]),
        rollout_id: s.rollout_id.clone(),
        ok,
        reward,
        details,
        abandoned: finish.abandon_if_unused && model_calls == 0 && !ok,
    };
    (finished, verdict)
}

/// The verdict of an attempt given up without a session (its orchestrator
/// died): abandoned, so its group waits for the rerun. Its id is the one a
/// finish of the same attempt would have had: readers keep the first.
pub fn abandoned(run_id: &str, rollout_id: &str, why: &str) -> VerifierResult {
    VerifierResult {
        run_id: run_id.into(),
        event_id: event_id("VerifierResult", &[run_id, rollout_id]),
        rollout_id: rollout_id.into(),
        ok: false,
        reward: None,
        details: why.into(),
        abandoned: true,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::sessions::{NewSession, Sessions};
    use forgelog_api::Verdict;

    fn session() -> std::sync::Arc<Session> {
        let new = NewSession::new("ro", "t", "h", "g");
        Sessions::default()
            .create(new, Some("run"), 4, 1_000)
            .unwrap()
            .0
    }

    #[test]
    fn call_events_have_deterministic_ids_and_the_times_given() {
        let s = session();
        let ids = CallIds::of(&s, 3);
        let started = ids.started(Dialect::Gemini, "h", "/p".into(), b"{}".to_vec(), 5);
        let finished = ids.finished(CallStatus::ClientError, Some("bad".into()), 7, 12);
        assert_eq!(
            started.event_id,
            CallIds::of(&s, 3)
                .started(Dialect::Gemini, "x", "/q".into(), vec![], 9)
                .event_id
        );
        assert_ne!(started.event_id, finished.event_id);
        assert_ne!(
            finished.event_id,
            CallIds::of(&s, 4)
                .finished(CallStatus::Ok, None, 0, 0)
                .event_id
        );
        assert_eq!(
            (
                started.received_at_ms,
                finished.latency_ms,
                finished.finished_at_ms
            ),
            (5, 7, 12)
        );
        assert_eq!((finished.call_index, finished.trainable), (3, false));
        assert_eq!(ids.response_id().len(), 24);
        assert_eq!(
            failure_status(ErrorKind::Timeout),
            CallStatus::UpstreamError
        );
        assert_eq!(failure_status(ErrorKind::TooLarge), CallStatus::ClientError);
    }

    #[test]
    fn a_verifier_that_did_not_score_is_a_null_reward_never_zero() {
        let s = session();
        let end = |verifier| Finish {
            exit_status: Some(0),
            verifier,
            ..Default::default()
        };
        let (finished, v) = rollout_ended(&s, &end(Some(Verdict::scored(0.5, "ok"))), 2, 9);
        assert_eq!(
            (v.ok, v.reward, v.details.as_str()),
            (true, Some(0.5), "ok")
        );
        assert_eq!(
            (
                finished.model_calls,
                finished.started_at_ms,
                finished.finished_at_ms
            ),
            (2, 1_000, 9)
        );
        let not_ok = Verdict {
            ok: false,
            reward: Some(1.0),
            details: "crashed".into(),
        };
        let (_, v) = rollout_ended(&s, &end(Some(not_ok)), 2, 9);
        assert_eq!((v.ok, v.reward), (false, None));
        let (_, v) = rollout_ended(&s, &end(None), 0, 9);
        assert_eq!(
            (v.ok, v.reward, v.details.as_str()),
            (false, None, "verifier did not run")
        );
        let started = rollout_started(&s, 4, Some(2), 1_000);
        assert_eq!((started.group_size, started.policy_version), (4, Some(2)));
        assert_eq!(started.event_id, rollout_started(&s, 1, None, 0).event_id);
    }
}
