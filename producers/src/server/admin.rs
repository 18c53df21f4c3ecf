//! The session API (`forgelog-api`'s types): the orchestrator opens a session
//! per rollout (`RolloutStarted`) and finishes it with the verifier's verdict
//! (`RolloutFinished`, `VerifierResult`), with the admin token.

use super::{admin_error, now_ms, record, ProxyState};
use crate::sessions::{NewSession, SessionError};
use crate::upstream::Upstream;
use axum::body::Bytes;
use axum::extract::{Path, State};
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use axum::Json;
use forgelog_api::{AbandonAttempt, Finish, Finished, ReplaySession, SessionCreated};
use std::sync::Arc;
use std::time::Duration;

/// `POST /sessions` on the live proxy: a new rollout's session.
pub(super) async fn create_session(State(st): State<Arc<ProxyState>>, body: Bytes) -> Response {
    let new = serde_json::from_slice::<NewSession>(&body).map_err(|e| e.to_string());
    match new.and_then(|new| new.check().map(|()| new)) {
        Ok(new) => open_session(&st, new),
        Err(why) => admin_error(
            StatusCode::BAD_REQUEST,
            format!("bad session request: {why}"),
        ),
    }
}

/// `POST /sessions` on `replay serve`: a session that re-runs a recorded one.
pub(super) async fn create_replay_session(
    State(st): State<Arc<ProxyState>>,
    body: Bytes,
) -> Response {
    let Upstream::Recorded(recording) = &st.upstream else {
        return admin_error(StatusCode::NOT_FOUND, "this proxy replays no recording");
    };
    let new = serde_json::from_slice::<ReplaySession>(&body)
        .map_err(|e| crate::replay::ReplayError::BadSessionRequest(e.to_string()))
        .and_then(|b| recording.recording.new_session(&b));
    match new {
        Ok(new) => {
            let run = new.run_id.as_deref().unwrap_or(&recording.recording.run_id);
            recording.session_opened(&crate::sessions::session_id(run, &new.rollout_id));
            open_session(&st, new)
        }
        Err(e) => admin_error(StatusCode::NOT_FOUND, e.to_string()),
    }
}

/// Creates the session and records `RolloutStarted`.
fn open_session(st: &ProxyState, new: NewSession) -> Response {
    let full = || {
        admin_error(
            StatusCode::SERVICE_UNAVAILABLE,
            "cannot record the rollout (spool full?)",
        )
    };
    // Its start, end and verdict must fit, or it is not opened (and its
    // rollout id is not taken).
    if !st.has_room_for(3) {
        return full();
    }
    let group_size = new.group_size.unwrap_or(1);
    let now = now_ms();
    let (s, key) = match st.sessions.create(
        new,
        st.config.run_id.as_deref(),
        st.config.max_calls_in_flight,
        now,
    ) {
        Ok(x) => x,
        Err(e @ SessionError::Exists(_)) => {
            return admin_error(StatusCode::CONFLICT, e.to_string())
        }
        Err(e @ SessionError::OtherReplica(_)) => {
            return admin_error(StatusCode::MISDIRECTED_REQUEST, e.to_string())
        }
        Err(e) => return admin_error(StatusCode::BAD_REQUEST, e.to_string()),
    };
    let started = record::rollout_started(&s, group_size, st.policy_version(), now);
    if !st.send(started.into()) {
        let _ = st.sessions.end(&s.id);
        return full();
    }
    Json(SessionCreated {
        session_id: s.id.clone(),
        api_key: key,
    })
    .into_response()
}

pub(super) async fn finish_session(
    State(st): State<Arc<ProxyState>>,
    Path(id): Path<String>,
    body: Bytes,
) -> Response {
    let finish: Finish = match serde_json::from_slice(&body) {
        Ok(f) => f,
        Err(e) => return admin_error(StatusCode::BAD_REQUEST, format!("bad finish request: {e}")),
    };
    // Refused before the session ends: the orchestrator can send it again.
    if let Some(why) = finish.verifier.as_ref().and_then(|v| v.invalid()) {
        return admin_error(
            StatusCode::BAD_REQUEST,
            format!("bad finish request: {why}"),
        );
    }
    end_session(&st, &id, &finish).await
}

/// Ends session `id`: waits for its calls in flight, records how it ended.
async fn end_session(st: &ProxyState, id: &str, finish: &Finish) -> Response {
    let s = match st.sessions.end(id) {
        Ok(s) => s,
        Err(e) => return admin_error(StatusCode::NOT_FOUND, e.to_string()),
    };
    // Wait for calls in flight: model_calls must count their CallFinished too.
    let wait = st.config.upstream_timeout + Duration::from_secs(5);
    let _all = tokio::time::timeout(wait, s.in_flight.acquire_many(s.max_in_flight)).await;
    let model_calls = s.finished_calls();
    let (finished, verdict) = record::rollout_ended(&s, finish, model_calls, now_ms());
    let verdict_abandoned = verdict.abandoned;
    // The verdict first: a proxy killed between the two leaves the session
    // open in the log, and its restarted successor, which sees the verdict,
    // records the end only when the orchestrator finishes again.
    let verdict_sent = s.verdict_recorded || st.send(verdict.into());
    let recorded = verdict_sent && st.send(finished.into());
    if !recorded {
        return admin_error(
            StatusCode::SERVICE_UNAVAILABLE,
            "cannot record the rollout's end (spool full?)",
        );
    }
    Json(Finished {
        session_id: s.id.clone(),
        model_calls,
        sampled_tokens: s.sampled_tokens(),
        abandoned: verdict_abandoned,
        unrouted: s.unrouted(),
    })
    .into_response()
}

/// `POST /sessions/abandon`: an attempt whose orchestrator died. A session
/// this proxy still holds is finished as abandoned (unless it reached the
/// model: then its calls stand and it is finished as it is); one it does not
/// know, or took over from the log when it restarted, gets an abandoned
/// verdict only.
pub(super) async fn abandon_attempt(State(st): State<Arc<ProxyState>>, body: Bytes) -> Response {
    let a: AbandonAttempt = match serde_json::from_slice(&body) {
        Ok(a) => a,
        Err(e) => return admin_error(StatusCode::BAD_REQUEST, format!("bad abandon request: {e}")),
    };
    let Some(run_id) = a.run_id.or_else(|| st.config.run_id.clone()) else {
        return admin_error(StatusCode::BAD_REQUEST, SessionError::NoRunId.to_string());
    };
    let session_id = crate::sessions::session_id(&run_id, &a.rollout_id);
    match st.sessions.by_id(&session_id) {
        Some(s) if !s.restored => {
            let finish = Finish {
                exit_status: None,
                verifier: Some(forgelog_api::Verdict::failed(a.why)),
                abandon_if_unused: true,
            };
            return end_session(&st, &session_id, &finish).await;
        }
        // Taken over from the log after a restart: the harness ran under the
        // proxy (and orchestrator) that died, so it is gone, as if unknown.
        Some(_) => {
            let _ = st.sessions.end(&session_id);
        }
        None => {}
    }
    if !st.send(record::abandoned(&run_id, &a.rollout_id, &a.why).into()) {
        return admin_error(
            StatusCode::SERVICE_UNAVAILABLE,
            "cannot record the abandoned attempt (spool full?)",
        );
    }
    Json(Finished {
        session_id,
        model_calls: 0,
        sampled_tokens: 0,
        abandoned: true,
        unrouted: Vec::new(),
    })
    .into_response()
}
