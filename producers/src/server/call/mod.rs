//! A harness's model call: the session by its key, the body within limits, the
//! call recorded as it starts, the upstream asked (or the budget stop
//! answered), the answer recorded and returned in the dialect's shape.

mod engine;
mod in_flight;
mod token_in;

pub use in_flight::{CallsInFlight, INTERRUPTED};

use super::auth::api_key;
use super::body::read_body;
use super::finish::{FinishesAnyway, Panicked};
use super::record::{failure_status, CallIds};
use super::{error_response, now_ms, stream, ProxyState, BUDGET_EXHAUSTED};
use crate::sessions::Session;
use crate::upstream::rl_sampling;
use axum::body::{Body, Bytes};
use axum::extract::{Path, Request, State};
use axum::http::{header, HeaderMap, HeaderValue};
use axum::response::{IntoResponse, Response};
use forgelog_dialects::canonical::{ChatRequest, ChatResponse, FinishReason, Part};
use forgelog_dialects::dialect::*;
use forgelog_schemas::{CallFinished, CallStatus, SamplingParams};
use serde_json::Value;
use std::collections::HashMap;
use std::sync::Arc;
use std::time::Instant;

/// The answer of a call task: the request and the response with its body.
pub(super) type Answered = (ChatRequest, Result<(ChatResponse, Bytes), DialectError>);

pub(super) async fn call<D: DialectAdapter>(
    State(st): State<Arc<ProxyState>>,
    headers: HeaderMap,
    req: Request,
) -> Response {
    let path = req.uri().path().to_string();
    let query: HashMap<String, String> = req.uri().query().map(query_pairs).unwrap_or_default();
    serve::<D>(
        st,
        headers,
        path,
        query,
        RouteHints::default(),
        req.into_body(),
    )
    .await
}

pub(super) async fn gemini(
    State(st): State<Arc<ProxyState>>,
    Path(model_action): Path<String>,
    headers: HeaderMap,
    req: Request,
) -> Response {
    let path = req.uri().path().to_string();
    let query: HashMap<String, String> = req.uri().query().map(query_pairs).unwrap_or_default();
    let (model, action) = model_action.split_once(':').unwrap_or((&model_action, ""));
    let stream = match action {
        "generateContent" => false,
        "streamGenerateContent" => true,
        other => {
            return error_response::<GeminiDialect>(&DialectError::new(
                ErrorKind::NotFound,
                format!("unknown method '{other}' (generateContent, streamGenerateContent)"),
            ))
        }
    };
    let hints = RouteHints {
        model: Some(model.to_string()),
        stream: Some(stream),
    };
    serve::<GeminiDialect>(st, headers, path, query, hints, req.into_body()).await
}

/// `a=b&c=d` → map (values are simple here: `key`, `alt`; no percent-decoding needed).
fn query_pairs(q: &str) -> HashMap<String, String> {
    q.split('&')
        .filter_map(|kv| {
            kv.split_once('=')
                .map(|(k, v)| (k.to_string(), v.to_string()))
        })
        .collect()
}

/// One recorded harness call, from arrival to the answer.
struct Call {
    st: Arc<ProxyState>,
    session: Arc<Session>,
    index: i64,
    received: Instant,
    dialect: forgelog_schemas::Dialect,
}

impl Call {
    fn ids(&self) -> CallIds<'_> {
        CallIds::of(&self.session, self.index)
    }

    fn finished(&self, status: CallStatus, error: Option<String>) -> CallFinished {
        let latency = self.received.elapsed().as_millis() as i64;
        self.ids().finished(status, error, latency, now_ms())
    }

    fn record(&self, event: CallFinished) {
        let Some(_claimed) = self.st.calls_in_flight.claim(&self.session.id, self.index) else {
            return; // recorded as interrupted by the shutdown
        };
        let dialect = self.dialect.name();
        metrics::counter!("forgelog_proxy_calls_total", "dialect" => dialect, "status" => event.status.name())
            .increment(1);
        metrics::counter!("forgelog_proxy_prompt_tokens_total", "dialect" => dialect)
            .increment(event.usage.prompt_tokens.max(0) as u64);
        metrics::counter!("forgelog_proxy_completion_tokens_total", "dialect" => dialect)
            .increment(event.usage.completion_tokens.max(0) as u64);
        let sampled = event.completion_token_ids.len();
        if self.st.send_call(&self.session, event.into()) {
            self.session.call_finished(sampled);
        }
    }

    /// Records a call that failed before or at the upstream.
    fn fail(&self, err: &DialectError, requested: Option<&SamplingParams>) {
        let mut e = self.finished(failure_status(err.kind), Some(err.message.clone()));
        if let Some(r) = requested {
            e.sampling_requested = r.clone();
            e.sampling_sent = rl_sampling(r);
        }
        self.record(e);
    }

    /// The id the harness sees for this call's answer: deterministic per call.
    fn response_id(&self) -> String {
        self.ids().response_id()
    }

    /// The session's budget is spent: a short final assistant message (plain
    /// text, no tool calls, finish `stop`) that ends any harness's loop,
    /// recorded as a budget stop, never as a trainable call.
    fn budget_stop<D: DialectAdapter>(self, req: &ChatRequest) -> (ChatResponse, Bytes) {
        let limit = self.session.max_model_calls.unwrap_or(0);
        let resp = ChatResponse {
            id: self.response_id(),
            model: if req.model.is_empty() {
                self.st.probe().model.clone()
            } else {
                req.model.clone()
            },
            created: now_ms() / 1000,
            parts: vec![Part::Text(format!(
                "Budget exhausted: this session's {limit} model calls are used up. Stopping here."
            ))],
            finish: FinishReason::Stop,
            usage: Default::default(),
        };
        let body = Bytes::from(D::encode_response(&resp).to_string());
        let mut e = self.finished(CallStatus::BudgetStop, None);
        e.model = resp.model.clone();
        e.finish_reason = Some(FinishReason::Stop.openai().to_string());
        e.sampling_requested = req.sampling.clone();
        e.untrainable_reason = Some(BUDGET_EXHAUSTED.to_string());
        e.response_body = body.to_vec();
        self.record(e);
        (resp, body)
    }
}

async fn serve<D: DialectAdapter>(
    st: Arc<ProxyState>,
    headers: HeaderMap,
    path: String,
    query: HashMap<String, String>,
    hints: RouteHints,
    body: Body,
) -> Response {
    let received = Instant::now();
    let Some(session) =
        api_key(&headers, query.get("key").map(String::as_str)).and_then(|k| st.sessions.by_key(k))
    else {
        return error_response::<D>(&DialectError::new(
            ErrorKind::Authentication,
            "unknown or ended session key",
        ));
    };
    // Taken now, refused below once the call is recorded: a 429 is a failed call too.
    let permit = session.in_flight.clone().try_acquire_owned();
    let index = session.next_call_index();
    let call = Call {
        st: st.clone(),
        session: session.clone(),
        index,
        received,
        dialect: D::KIND,
    };
    let limit = st.config.body_limit;
    let raw = read_body(&headers, body, limit).await;
    let started = CallIds::of(&session, index).started(
        D::KIND,
        &session.harness,
        path,
        raw.as_ref().map(|b| b.to_vec()).unwrap_or_default(),
        now_ms(),
    );
    // Its start and end, and the ends of the calls in flight.
    let records = st.calls_in_flight.len() as u64 + 2;
    if !st.has_room_for(records) || !st.send_call(&session, started.into()) {
        return error_response::<D>(&DialectError::new(
            ErrorKind::Unavailable,
            "the proxy cannot record calls right now (spool full?)",
        ));
    }
    st.calls_in_flight.start(&session, index, received);
    let Ok(permit) = permit else {
        let err = DialectError::new(
            ErrorKind::RateLimited,
            format!(
                "more than {} calls in flight in this session",
                session.max_in_flight
            ),
        );
        call.fail(&err, None);
        return error_response::<D>(&err);
    };
    let decoded = raw.and_then(|raw| {
        serde_json::from_slice::<Value>(&raw)
            .map_err(|e| DialectError::invalid(format!("malformed JSON: {e}")))
            .and_then(|v| D::decode_request(&v, &hints))
            .and_then(|req| check_sampling(&req.sampling).map(|()| req))
    });
    let req = match decoded {
        Ok(r) => r,
        Err(err) => {
            call.fail(&err, None);
            return error_response::<D>(&err);
        }
    };
    // Gemini's streamGenerateContent is answered as SSE, with or without `alt=sse`.
    let stream = req.stream;
    // Runs to its end, and is recorded, even if the harness hangs up.
    let within_budget = session.take_model_call();
    let work = FinishesAnyway::new(async move {
        let out = if within_budget {
            call.complete::<D>(&req).await
        } else {
            Ok(call.budget_stop::<D>(&req))
        };
        drop(permit);
        (req, out)
    });
    if !stream {
        return match work.await {
            Ok((_, Ok((_, body)))) => (
                [(
                    header::CONTENT_TYPE,
                    HeaderValue::from_static("application/json"),
                )],
                body,
            )
                .into_response(),
            Ok((_, Err(err))) => error_response::<D>(&err),
            Err(Panicked) => error_response::<D>(&DialectError::new(
                ErrorKind::Internal,
                "the call failed inside the proxy",
            )),
        };
    }
    stream::sse_response::<D>(work, st.config.keep_alive)
}
