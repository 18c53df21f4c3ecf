//! The thin HTTP shell: axum routes, session auth, limits, the upstream call,
//! event recording and SSE replay. All translation lives in [`forgelog_dialects::dialect`].

use crate::sessions::{NewSession, Session, SessionError, Sessions};
use crate::upstream::{
    read_response, rl_sampling, upstream_body, Sampled, Upstream, UpstreamClient,
};
use axum::body::{Body, Bytes};
use axum::extract::{Path, Request, State};
use axum::http::{header, HeaderMap, HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::{Json, Router};
use forgelog_api::{ApiError, Finish, Finished, ReplaySession, SessionCreated};
use forgelog_dialects::canonical::{ChatRequest, ChatResponse, FinishReason, Part};
use forgelog_dialects::dialect::sse::KEEP_ALIVE;
use forgelog_dialects::dialect::*;
use forgelog_schemas::{
    event_id, CallFinished, CallStarted, CallStatus, Event, RolloutFinished, RolloutStarted,
    SamplingParams, Usage, VerifierResult,
};
use forgelog_stream::EventProducer;
use metrics_exporter_prometheus::PrometheusHandle;
use serde_json::{json, Value};
use std::collections::HashMap;
use std::sync::atomic::{AtomicI64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

/// The `untrainable_reason` of a budget stop.
pub const BUDGET_EXHAUSTED: &str = "budget exhausted";

/// What the proxy sends upstream as `max_tokens`: the harness's, lowered to the
/// session's clamp; and left unset (the upstream fills the rest of its context)
/// when it could never fit the upstream's context, which is what clients that
/// ask for 128000 tokens of a smaller model mean.
pub fn clamp_max_tokens(
    mut sent: SamplingParams,
    session_max: Option<i64>,
    upstream_context: Option<i64>,
) -> SamplingParams {
    if let (Some(asked), Some(context)) = (sent.max_tokens, upstream_context) {
        if asked >= context {
            sent.max_tokens = None;
        }
    }
    if let Some(max) = session_max {
        sent.max_tokens = Some(sent.max_tokens.map_or(max, |asked| asked.min(max)));
    }
    sent
}

/// How the proxy behaves; [`crate::ProxyArgs`] is its command-line form.
#[derive(Debug, Clone)]
pub struct ProxyConfig {
    pub upstream: String,
    pub run_id: Option<String>,
    pub admin_token: Option<String>,
    pub body_limit: usize,
    /// Concurrent calls one session may have (not its total: that is the
    /// session's `max_model_calls`).
    pub max_calls_in_flight: u32,
    pub upstream_timeout: Duration,
    /// SSE keep-alive comment interval while the upstream is working.
    pub keep_alive: Duration,
    /// Upstream requests in flight at most (each holds a connection).
    pub max_upstream_requests: usize,
}

impl ProxyConfig {
    pub const BODY_LIMIT: usize = 32 << 20;
    pub const MAX_CALLS_IN_FLIGHT: u32 = 16;
    pub const UPSTREAM_TIMEOUT: Duration = Duration::from_secs(600);
    pub const KEEP_ALIVE: Duration = Duration::from_secs(5);
    pub const MAX_UPSTREAM_REQUESTS: usize = 1024;

    /// A proxy of `upstream` with the defaults of `forgelog proxy`'s flags: no
    /// run id (sessions name theirs), no admin token.
    pub fn new(upstream: impl Into<String>) -> ProxyConfig {
        ProxyConfig {
            upstream: upstream.into(),
            run_id: None,
            admin_token: None,
            body_limit: Self::BODY_LIMIT,
            max_calls_in_flight: Self::MAX_CALLS_IN_FLIGHT,
            upstream_timeout: Self::UPSTREAM_TIMEOUT,
            keep_alive: Self::KEEP_ALIVE,
            max_upstream_requests: Self::MAX_UPSTREAM_REQUESTS,
        }
    }
}

pub struct ProxyState {
    pub config: ProxyConfig,
    pub sessions: Sessions,
    /// `None` for `replay serve`, which records nothing.
    pub producer: Option<Arc<EventProducer>>,
    pub upstream: Upstream,
    /// The upstream's model (from the probe): harnesses name models of their own.
    pub upstream_model: String,
    /// The upstream's context length, where its model list says (`max_model_len`).
    pub upstream_context: Option<i64>,
    /// Why the upstream's answers would not be trainable, from the start-up probe.
    pub probe_warning: Option<String>,
    /// The newest policy version the upstream reported.
    policy_version: AtomicI64,
    metrics: PrometheusHandle,
}

pub fn now_ms() -> i64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_millis() as i64)
        .unwrap_or(0)
}

impl ProxyState {
    pub fn new(
        config: ProxyConfig,
        producer: Arc<EventProducer>,
        probe: crate::upstream::Probe,
    ) -> ProxyState {
        let upstream = Upstream::Live(UpstreamClient::new(
            &config.upstream,
            config.upstream_timeout,
            config.max_upstream_requests,
        ));
        ProxyState::with_upstream(config, upstream, Some(producer), probe)
    }

    /// A proxy in front of `upstream`, recording through `producer` (if any).
    pub fn with_upstream(
        config: ProxyConfig,
        upstream: Upstream,
        producer: Option<Arc<EventProducer>>,
        probe: crate::upstream::Probe,
    ) -> ProxyState {
        ProxyState {
            upstream,
            config,
            sessions: Sessions::default(),
            producer,
            upstream_model: probe.model,
            upstream_context: probe.context,
            probe_warning: probe.untrainable,
            policy_version: AtomicI64::new(-1),
            metrics: crate::metrics_handle(),
        }
    }

    fn policy_version(&self) -> Option<i64> {
        Some(self.policy_version.load(Ordering::Relaxed)).filter(|v| *v >= 0)
    }

    fn send(&self, event: Event) -> bool {
        let Some(producer) = &self.producer else {
            return true;
        };
        match producer.send(&event) {
            Ok(_) => true,
            Err(e) => {
                tracing::error!(error = %e, kind = event.kind().name(), "event NOT recorded");
                metrics::counter!("forgelog_proxy_events_refused_total").increment(1);
                false
            }
        }
    }
}

pub fn router(state: Arc<ProxyState>) -> Router {
    use tower_http::timeout::TimeoutLayer;
    // The backstop: nothing outlives the upstream timeout by much. Streams are
    // exempt in practice: their body is produced after the handler returns.
    let backstop = state.config.upstream_timeout + Duration::from_secs(30);
    Router::new()
        .route("/v1/chat/completions", post(call::<OpenAiChatDialect>))
        .route("/v1/responses", post(call::<OpenAiResponsesDialect>))
        .route("/v1/messages", post(call::<AnthropicDialect>))
        .route("/v1/messages/count_tokens", post(count_tokens))
        .route("/v1beta/models/{model_action}", post(gemini))
        .route("/v1/models", get(models))
        .route("/healthz", get(|| async { "ok" }))
        .route("/metrics", get(prometheus))
        .route("/sessions", post(create_session))
        .route("/sessions/{id}/finish", post(finish_session))
        .fallback(unrouted)
        // Bodies are read (and limited) by the handlers, to answer in the dialect's shape.
        .layer(axum::extract::DefaultBodyLimit::disable())
        .layer(TimeoutLayer::with_status_code(
            StatusCode::GATEWAY_TIMEOUT,
            backstop,
        ))
        .with_state(state)
}

fn error_response<D: DialectAdapter>(err: &DialectError) -> Response {
    let status =
        StatusCode::from_u16(err.kind.status()).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR);
    let mut response = (status, Json(D::error_body(err))).into_response();
    if status == StatusCode::PAYLOAD_TOO_LARGE {
        // The rest of the body was never read, so the connection ends here:
        // say so, or a client's pool reuses it and its next request fails.
        response
            .headers_mut()
            .insert(header::CONNECTION, HeaderValue::from_static("close"));
    }
    response
}

/// The session key from `Authorization: Bearer`, `x-api-key`, `x-goog-api-key` or Gemini's `?key=`.
fn api_key<'a>(headers: &'a HeaderMap, query: Option<&'a str>) -> Option<&'a str> {
    let h = |name: &str| headers.get(name).and_then(|v| v.to_str().ok());
    h("authorization")
        .and_then(|v| {
            v.strip_prefix("Bearer ")
                .or_else(|| v.strip_prefix("bearer "))
        })
        .or_else(|| h("x-api-key"))
        .or_else(|| h("x-goog-api-key"))
        .or(query)
        .map(str::trim)
}

async fn call<D: DialectAdapter>(
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

async fn gemini(
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

fn too_large(limit: usize) -> DialectError {
    DialectError::new(
        ErrorKind::TooLarge,
        format!("request body over {limit} bytes"),
    )
}

/// The request body as sent, undoing its `Content-Encoding` (Codex compresses
/// large Responses bodies with zstd; gzip and deflate too), at most `limit`
/// bytes decoded. The decoded body is what is recorded.
pub fn decode_body(headers: &HeaderMap, body: Bytes, limit: usize) -> Result<Bytes, DialectError> {
    use std::io::Read;
    let encoding = headers
        .get(header::CONTENT_ENCODING)
        .and_then(|v| v.to_str().ok())
        .map(|v| v.trim().to_ascii_lowercase());
    let reader: Box<dyn Read + '_> = match encoding.as_deref() {
        None | Some("" | "identity") => return Ok(body),
        Some("zstd") => Box::new(
            zstd::stream::read::Decoder::new(&body[..])
                .map_err(|e| DialectError::invalid(format!("zstd body: {e}")))?,
        ),
        Some("gzip" | "x-gzip") => Box::new(flate2::read::GzDecoder::new(&body[..])),
        Some("deflate") => Box::new(flate2::read::ZlibDecoder::new(&body[..])),
        Some(other) => {
            return Err(DialectError::invalid(format!(
                "Content-Encoding '{other}' is not supported (zstd, gzip, deflate)"
            )))
        }
    };
    let mut out = Vec::new();
    reader
        .take(limit as u64 + 1)
        .read_to_end(&mut out)
        .map_err(|e| DialectError::invalid(format!("compressed body does not decode: {e}")))?;
    if out.len() > limit {
        return Err(too_large(limit));
    }
    Ok(Bytes::from(out))
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
    fn finished(&self, status: CallStatus, error: Option<String>) -> CallFinished {
        let s = &self.session;
        CallFinished {
            run_id: s.run_id.clone(),
            event_id: event_id("CallFinished", &[&s.run_id, &s.id, &self.index.to_string()]),
            session_id: s.id.clone(),
            rollout_id: s.rollout_id.clone(),
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
            latency_ms: self.received.elapsed().as_millis() as i64,
            finished_at_ms: now_ms(),
            unparsed_tool_calls: 0,
        }
    }

    fn record(&self, event: CallFinished) {
        let status = format!("{:?}", event.status);
        metrics::counter!("forgelog_proxy_calls_total", "dialect" => format!("{:?}", self.dialect), "status" => status)
            .increment(1);
        if self.st.send(event.into()) {
            self.session.call_finished();
        }
    }

    /// Records a call that failed before or at the upstream.
    fn fail(&self, err: &DialectError, requested: Option<&SamplingParams>) {
        let status = match err.kind {
            ErrorKind::Upstream | ErrorKind::Timeout | ErrorKind::Internal => {
                CallStatus::UpstreamError
            }
            _ => CallStatus::ClientError,
        };
        let mut e = self.finished(status, Some(err.message.clone()));
        if let Some(r) = requested {
            e.sampling_requested = r.clone();
            e.sampling_sent = rl_sampling(r);
        }
        self.record(e);
    }

    /// The id the harness sees for this call's answer: deterministic per call.
    fn response_id(&self) -> String {
        let s = &self.session;
        event_id("response", &[&s.run_id, &s.id, &self.index.to_string()])[..24].to_string()
    }

    /// The session's budget is spent: a short final assistant message (plain
    /// text, no tool calls, finish `stop`) that ends any harness's loop,
    /// recorded as a budget stop, never as a trainable call.
    fn budget_stop<D: DialectAdapter>(self, req: &ChatRequest) -> (ChatResponse, Bytes) {
        let limit = self.session.max_model_calls.unwrap_or(0);
        let resp = ChatResponse {
            id: self.response_id(),
            model: if req.model.is_empty() {
                self.st.upstream_model.clone()
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

    /// Asks the upstream, records the answer; returns it and the harness's response body.
    async fn complete<D: DialectAdapter>(
        self,
        req: &ChatRequest,
    ) -> Result<(ChatResponse, Bytes), DialectError> {
        let sent = clamp_max_tokens(
            rl_sampling(&req.sampling),
            self.session.max_tokens,
            self.st.upstream_context,
        );
        let body = upstream_body(req, &sent, &self.st.upstream_model);
        let asked = Instant::now();
        let answer = self
            .st
            .upstream
            .chat(Some((&self.session.id, self.index)), &body)
            .await;
        metrics::histogram!("forgelog_proxy_upstream_seconds")
            .record(asked.elapsed().as_secs_f64());
        let answer = match answer {
            Ok(a) => a,
            Err(e) => {
                let err = e.dialect_error();
                self.fail(&err, Some(&req.sampling));
                return Err(err);
            }
        };
        let prefix = format!("call_{}_{}_", &self.session.id[..12], self.index);
        let (mut resp, sampled) = match read_response(&answer, &prefix) {
            Ok(r) => r,
            Err(err) => {
                self.fail(&err, Some(&req.sampling));
                return Err(err);
            }
        };
        // Ids and timestamps the harness sees are deterministic per call.
        resp.id = self.response_id();
        if resp.created == 0 {
            resp.created = now_ms() / 1000;
        }
        if !req.model.is_empty() {
            resp.model = req.model.clone();
        }
        if let Some(v) = sampled.policy_version {
            self.st.policy_version.fetch_max(v, Ordering::Relaxed);
        }
        if sampled.unparsed_tool_calls > 0 {
            tracing::warn!(session = %self.session.id, call = self.index, "unparseable <tool_call> text passed on as text");
            metrics::counter!("forgelog_proxy_unparsed_tool_calls_total")
                .increment(sampled.unparsed_tool_calls as u64);
        }
        let response_body = Bytes::from(D::encode_response(&resp).to_string());
        let Sampled {
            prompt_token_ids,
            completion_token_ids,
            completion_logprobs,
            finish_reason,
            policy_version,
            untrainable_reason,
            unparsed_tool_calls,
        } = sampled;
        let mut e = self.finished(CallStatus::Ok, None);
        e.unparsed_tool_calls = unparsed_tool_calls as i64;
        e.model = answer["model"]
            .as_str()
            .unwrap_or(&self.st.upstream_model)
            .to_string();
        e.trainable = untrainable_reason.is_none();
        e.untrainable_reason = untrainable_reason;
        e.prompt_token_ids = prompt_token_ids;
        e.completion_token_ids = completion_token_ids;
        e.completion_logprobs = completion_logprobs;
        e.finish_reason = finish_reason;
        e.sampling_requested = req.sampling.clone();
        e.sampling_sent = sent;
        e.policy_version = policy_version;
        e.usage = Usage {
            prompt_tokens: resp.usage.input as i64,
            completion_tokens: resp.usage.output as i64,
        };
        e.response_body = response_body.to_vec();
        // The call in OpenAI Chat form whatever the dialect (what SFT export writes):
        // the upstream request is already that form, and so is its answer.
        e.chat_request = crate::replay::chat_form(&body).to_string();
        e.chat_response = answer["choices"][0]["message"].to_string();
        self.record(e);
        Ok((resp, response_body))
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
    let raw = match axum::body::to_bytes(body, limit).await {
        Ok(b) => decode_body(&headers, b, limit),
        Err(_) => Err(too_large(limit)),
    };
    let started = CallStarted {
        run_id: session.run_id.clone(),
        event_id: event_id(
            "CallStarted",
            &[&session.run_id, &session.id, &index.to_string()],
        ),
        session_id: session.id.clone(),
        rollout_id: session.rollout_id.clone(),
        call_index: index,
        dialect: D::KIND,
        harness: session.harness.clone(),
        path,
        raw_request: raw.as_ref().map(|b| b.to_vec()).unwrap_or_default(),
        received_at_ms: now_ms(),
    };
    if !st.send(started.into()) {
        return error_response::<D>(&DialectError::new(
            ErrorKind::Internal,
            "the proxy cannot record calls right now (spool full?)",
        ));
    }
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
    // Spawned: the call is recorded in full even if the harness hangs up.
    let within_budget = session.take_model_call();
    let mut work = tokio::spawn(async move {
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
            Err(_) => error_response::<D>(&DialectError::new(
                ErrorKind::Internal,
                "the call task failed",
            )),
        };
    }
    let (tx, rx) = tokio::sync::mpsc::channel::<Bytes>(16);
    let keep_alive = st.config.keep_alive;
    tokio::spawn(async move {
        let mut tick =
            tokio::time::interval_at(tokio::time::Instant::now() + keep_alive, keep_alive);
        let events = loop {
            tokio::select! {
                done = &mut work => break match done {
                    Ok((req, Ok((resp, _)))) => D::stream_events(&resp, &req),
                    Ok((_, Err(err))) => vec![D::stream_error(&err)],
                    Err(_) => vec![D::stream_error(&DialectError::new(ErrorKind::Internal, "the call task failed"))],
                },
                _ = tick.tick() => if tx.send(Bytes::from_static(KEEP_ALIVE)).await.is_err() { return },
            }
        };
        for e in events.iter().chain(D::stream_end().as_ref()) {
            if tx.send(e.frame()).await.is_err() {
                return;
            }
        }
    });
    let body = futures::stream::unfold(rx, |mut rx| async move {
        rx.recv()
            .await
            .map(|b| (Ok::<_, std::convert::Infallible>(b), rx))
    });
    Response::builder()
        .header(header::CONTENT_TYPE, "text/event-stream")
        .header(header::CACHE_CONTROL, "no-cache")
        .body(Body::from_stream(body))
        .expect("static headers")
}

/// Anthropic's token counter: the upstream's prompt token count for the
/// request, by a 1-token completion. Not a model call of the session: not recorded.
async fn count_tokens(
    State(st): State<Arc<ProxyState>>,
    headers: HeaderMap,
    body: Bytes,
) -> Response {
    type D = AnthropicDialect;
    let body = match decode_body(&headers, body, st.config.body_limit) {
        Ok(b) => b,
        Err(e) => return error_response::<D>(&e),
    };
    if api_key(&headers, None)
        .and_then(|k| st.sessions.by_key(k))
        .is_none()
    {
        return error_response::<D>(&DialectError::new(
            ErrorKind::Authentication,
            "unknown or ended session key",
        ));
    }
    let req = match serde_json::from_slice::<Value>(&body)
        .map_err(|e| DialectError::invalid(format!("malformed JSON: {e}")))
        .and_then(|v| D::decode_request(&v, &RouteHints::default()))
    {
        Ok(r) => r,
        Err(e) => return error_response::<D>(&e),
    };
    let sent = SamplingParams {
        max_tokens: Some(1),
        ..rl_sampling(&SamplingParams::default())
    };
    match st
        .upstream
        .chat(None, &upstream_body(&req, &sent, &st.upstream_model))
        .await
    {
        Ok(a) => {
            let n = a["usage"]["prompt_tokens"]
                .as_u64()
                .or_else(|| a["prompt_token_ids"].as_array().map(|v| v.len() as u64));
            Json(json!({"input_tokens": n.unwrap_or(0)})).into_response()
        }
        Err(e) => error_response::<D>(&e.dialect_error()),
    }
}

/// Anything else. Clients probe their base URL for reachability before they
/// call it (Claude Code: `HEAD /api/hello`): a HEAD anywhere is answered 200,
/// the rest 404 with the path named (and logged, to spot what a harness expects).
async fn unrouted(req: Request) -> Response {
    if req.method() == axum::http::Method::HEAD {
        tracing::debug!(path = %req.uri().path(), "HEAD probe");
        return StatusCode::OK.into_response();
    }
    tracing::warn!(method = %req.method(), path = %req.uri().path(), "no such route");
    admin_error(
        StatusCode::NOT_FOUND,
        format!("no route {} {}", req.method(), req.uri().path()),
    )
}

async fn models(State(st): State<Arc<ProxyState>>) -> Response {
    let id = if st.upstream_model.is_empty() {
        "forgelog"
    } else {
        &st.upstream_model
    };
    // One list both OpenAI and Anthropic clients can read.
    Json(json!({
        "object": "list",
        "data": [{"id": id, "object": "model", "created": 0, "owned_by": "forgelog",
                  "type": "model", "display_name": id, "created_at": "1970-01-01T00:00:00Z"}],
        "has_more": false, "first_id": id, "last_id": id,
    }))
    .into_response()
}

async fn prometheus(State(st): State<Arc<ProxyState>>) -> String {
    metrics::gauge!("forgelog_proxy_sessions").set(st.sessions.len() as f64);
    st.metrics.render()
}

fn admin_error(status: StatusCode, message: impl Into<String>) -> Response {
    (
        status,
        Json(ApiError {
            error: message.into(),
        }),
    )
        .into_response()
}

fn is_admin(st: &ProxyState, headers: &HeaderMap) -> bool {
    match &st.config.admin_token {
        None => true,
        Some(t) => api_key(headers, None) == Some(t.as_str()),
    }
}

async fn create_session(
    State(st): State<Arc<ProxyState>>,
    headers: HeaderMap,
    body: Bytes,
) -> Response {
    if !is_admin(&st, &headers) {
        return admin_error(StatusCode::UNAUTHORIZED, "admin token required");
    }
    let new: NewSession = match &st.upstream {
        Upstream::Live(_) => match serde_json::from_slice(&body) {
            Ok(n) => n,
            Err(e) => {
                return admin_error(StatusCode::BAD_REQUEST, format!("bad session request: {e}"))
            }
        },
        Upstream::Recorded(rec) => match serde_json::from_slice::<ReplaySession>(&body)
            .map_err(|e| crate::replay::ReplayError::BadSessionRequest(e.to_string()))
            .and_then(|b| rec.new_session(&b))
        {
            Ok(n) => n,
            Err(e) => return admin_error(StatusCode::NOT_FOUND, e.to_string()),
        },
    };
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
        Err(e) => return admin_error(StatusCode::BAD_REQUEST, e.to_string()),
    };
    let started = RolloutStarted {
        run_id: s.run_id.clone(),
        event_id: event_id("RolloutStarted", &[&s.run_id, &s.rollout_id]),
        rollout_id: s.rollout_id.clone(),
        session_id: s.id.clone(),
        task_id: s.task_id.clone(),
        harness: s.harness.clone(),
        group_id: s.group_id.clone(),
        group_size,
        policy_version: st.policy_version(),
        started_at_ms: now,
    };
    if !st.send(started.into()) {
        let _ = st.sessions.end(&s.id);
        return admin_error(
            StatusCode::SERVICE_UNAVAILABLE,
            "cannot record the rollout (spool full?)",
        );
    }
    Json(SessionCreated {
        session_id: s.id.clone(),
        api_key: key,
    })
    .into_response()
}

async fn finish_session(
    State(st): State<Arc<ProxyState>>,
    Path(id): Path<String>,
    headers: HeaderMap,
    body: Bytes,
) -> Response {
    if !is_admin(&st, &headers) {
        return admin_error(StatusCode::UNAUTHORIZED, "admin token required");
    }
    let finish: Finish = match serde_json::from_slice(&body) {
        Ok(f) => f,
        Err(e) => return admin_error(StatusCode::BAD_REQUEST, format!("bad finish request: {e}")),
    };
    let s = match st.sessions.end(&id) {
        Ok(s) => s,
        Err(e) => return admin_error(StatusCode::NOT_FOUND, e.to_string()),
    };
    // Wait for calls in flight: model_calls must count their CallFinished too.
    let wait = st.config.upstream_timeout + Duration::from_secs(5);
    let _all = tokio::time::timeout(wait, s.in_flight.acquire_many(s.max_in_flight)).await;
    let model_calls = s.finished_calls();
    let finished = RolloutFinished {
        run_id: s.run_id.clone(),
        event_id: event_id("RolloutFinished", &[&s.run_id, &s.rollout_id]),
        rollout_id: s.rollout_id.clone(),
        session_id: s.id.clone(),
        exit_status: finish.exit_status,
        model_calls,
        started_at_ms: s.started_at_ms,
        finished_at_ms: now_ms(),
    };
    // A verifier that did not run is ok=false, reward=null: never a 0.
    let (ok, reward, details) = match finish.verifier {
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
    };
    let recorded = st.send(finished.into()) & st.send(verdict.into());
    if !recorded {
        return admin_error(
            StatusCode::SERVICE_UNAVAILABLE,
            "cannot record the rollout's end (spool full?)",
        );
    }
    Json(Finished {
        session_id: s.id.clone(),
        model_calls,
    })
    .into_response()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn max_tokens_clamp() {
        let asked = |n: Option<i64>| SamplingParams {
            max_tokens: n,
            ..Default::default()
        };
        let sent = |n, session, context| clamp_max_tokens(asked(n), session, context).max_tokens;
        assert_eq!(sent(Some(100), None, None), Some(100));
        assert_eq!(sent(Some(100), Some(7), None), Some(7));
        assert_eq!(sent(Some(5), Some(7), None), Some(5));
        assert_eq!(sent(None, Some(7), None), Some(7));
        // More than the upstream's whole context: unset, the upstream fills what is left.
        assert_eq!(sent(Some(128000), None, Some(8192)), None);
        assert_eq!(sent(Some(128000), Some(512), Some(8192)), Some(512));
        assert_eq!(sent(Some(1000), None, Some(8192)), Some(1000));
    }
}
