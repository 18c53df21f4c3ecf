//! The thin HTTP shell of the capture proxy, a concept a file: [`call`] (a
//! harness's model call: auth, limits, the upstream, recording), [`stream`]
//! (answering as SSE), [`admin`] (the session API), [`meta`] (models, token
//! counts, metrics, probes), [`auth`] and [`body`]; [`record`] builds the
//! events, with no I/O. All translation lives in `forgelog-dialects`.

mod admin;
mod auth;
mod body;
mod call;
mod finish;
mod meta;
pub mod record;
mod replicas;
mod stream;

pub use body::decode_body;
pub use call::{CallsInFlight, INTERRUPTED};
pub use replicas::{Replicas, HOP};

use crate::sessions::{Session, Sessions};
use crate::upstream::{Probe, Upstream, UpstreamClient};
use axum::http::{header, HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::{Json, Router};
use forgelog_api::ApiError;
use forgelog_dialects::dialect::{
    AnthropicDialect, DialectAdapter, DialectError, OpenAiChatDialect, OpenAiResponsesDialect,
};
use forgelog_schemas::{Event, SamplingParams};
use forgelog_stream::{EventSink, SendError};
use metrics_exporter_prometheus::PrometheusHandle;
use std::sync::atomic::{AtomicI64, Ordering};
use std::sync::Arc;
use std::time::Duration;

/// The largest session-API request body (`POST /sessions`, `/finish`, ...).
pub const SESSION_BODY_LIMIT: usize = 1 << 20;

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
    /// How long a stopping proxy lets the calls in flight finish.
    pub shutdown_grace: Duration,
    /// One of several replicas behind one address: each holds the sessions it
    /// owns and passes the others' requests on ([`replicas`]).
    pub replicas: Option<Replicas>,
    /// The model's tokenizer and chat template: with them the proxy makes
    /// the prompts' ids itself, splicing follow-up calls onto what the model
    /// sampled, and asks the engine with ids; without, the engine renders chats.
    pub token_in: Option<crate::upstream::TokenIn>,
    /// The upstream serves each policy version as a LoRA adapter named
    /// `policy@N` (`forgelog sync --sync-mode adapter`): each call asks for the
    /// newest one it lists and is stamped with that version (the base model,
    /// before any, is version 0).
    pub policy_adapters: bool,
    /// Fields added to every request to the engine (`--extra-body`), recorded with each call.
    pub extra_body: crate::upstream::ExtraBody,
}

impl ProxyConfig {
    /// The largest body whose call still fits one event of the log (its
    /// `CallStarted` holds the body; its `CallFinished` about as much again).
    pub const BODY_LIMIT: usize = 7 << 20;
    pub const MAX_CALLS_IN_FLIGHT: u32 = 16;
    pub const UPSTREAM_TIMEOUT: Duration = Duration::from_secs(600);
    pub const KEEP_ALIVE: Duration = Duration::from_secs(5);
    pub const MAX_UPSTREAM_REQUESTS: usize = 1024;
    /// How long a stopping proxy waits for the calls in flight before it
    /// records them as interrupted.
    pub const SHUTDOWN_GRACE: Duration = Duration::from_secs(10);

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
            shutdown_grace: Self::SHUTDOWN_GRACE,
            replicas: None,
            token_in: None,
            policy_adapters: false,
            extra_body: Default::default(),
        }
    }
}

pub struct ProxyState {
    pub config: ProxyConfig,
    pub sessions: Sessions,
    /// Where calls are recorded: the spool-backed producer (or a memory log in
    /// tests); `None` for `replay serve`, which records nothing.
    pub events: Option<Arc<dyn EventSink>>,
    pub upstream: Upstream,
    /// What the upstream said of itself: its model (harnesses name models of
    /// their own), its context length, why its answers would not be
    /// trainable. Probed at start, and again while that probe fails.
    probe: std::sync::RwLock<Arc<Probe>>,
    /// When the upstream was last probed again; held while probing.
    reprobed: tokio::sync::Mutex<Option<std::time::Instant>>,
    /// The newest policy version the upstream reported.
    policy_version: AtomicI64,
    /// Calls started and not finished: at shutdown, recorded as interrupted.
    pub calls_in_flight: CallsInFlight,
    metrics: PrometheusHandle,
    /// Passes requests on to the replica that owns their session.
    replica_client: reqwest::Client,
}

pub fn now_ms() -> i64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_millis() as i64)
        .unwrap_or(0)
}

impl ProxyState {
    pub const REPROBE_EVERY: Duration = Duration::from_secs(2);

    pub fn new(
        config: ProxyConfig,
        events: Arc<dyn EventSink>,
        probe: crate::upstream::Probe,
    ) -> ProxyState {
        let upstream = Upstream::Live(UpstreamClient::new(
            &config.upstream,
            config.upstream_timeout,
            config.max_upstream_requests,
        ));
        ProxyState::with_upstream(config, upstream, Some(events), probe)
    }

    /// A proxy in front of `upstream`, recording into `events` (if any).
    pub fn with_upstream(
        config: ProxyConfig,
        upstream: Upstream,
        events: Option<Arc<dyn EventSink>>,
        probe: crate::upstream::Probe,
    ) -> ProxyState {
        let sessions = match upstream {
            Upstream::Live(_) => Sessions::of_replica(config.replicas.clone()),
            Upstream::Recorded(_) => Sessions::replaying(),
        };
        // No overall timeout: an answer streams for as long as the owner's
        // upstream works, with keep-alives.
        let replica_client = reqwest::Client::builder()
            .connect_timeout(Duration::from_secs(5))
            .read_timeout(config.upstream_timeout + Duration::from_secs(30))
            .build()
            .expect("an HTTP client without TLS builds");
        ProxyState {
            upstream,
            config,
            sessions,
            events,
            probe: std::sync::RwLock::new(Arc::new(probe)),
            reprobed: tokio::sync::Mutex::new(None),
            policy_version: AtomicI64::new(-1),
            calls_in_flight: CallsInFlight::default(),
            metrics: crate::metrics_handle(),
            replica_client,
        }
    }

    /// Waits (until `deadline`) for the calls in flight to finish, then
    /// records those left as interrupted: every `CallStarted` gets its
    /// `CallFinished`. How many were interrupted.
    pub async fn settle_calls(&self, deadline: tokio::time::Instant) -> usize {
        while !self.calls_in_flight.is_empty() && tokio::time::Instant::now() < deadline {
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        let interrupted = self.calls_in_flight.take_all();
        let n = interrupted.len();
        for (session, index, ran) in interrupted {
            tracing::warn!(session = %session.id, call = index, "call interrupted by the shutdown");
            self.record_interrupted(&session, index, INTERRUPTED, ran);
        }
        // Calls claimed before the take are sending their records now.
        while !self.calls_in_flight.is_empty() {
            tokio::time::sleep(Duration::from_millis(1)).await;
        }
        n
    }

    /// Records call `index` of `session`, which ran for `ran`, as ended by an
    /// interruption (`why`).
    pub fn record_interrupted(
        &self,
        session: &crate::sessions::Session,
        index: i64,
        why: &str,
        ran: Duration,
    ) {
        let call = record::CallIds::of(session, index).finished(
            forgelog_schemas::CallStatus::UpstreamError,
            Some(why.to_string()),
            ran.as_millis() as i64,
            now_ms(),
        );
        if self.send(call.into()) {
            session.call_finished(0);
        }
    }

    /// The upstream as last probed.
    pub fn probe(&self) -> Arc<Probe> {
        self.probe.read().unwrap_or_else(|p| p.into_inner()).clone()
    }

    /// The upstream as probed, probing it again first (at most every
    /// [`Self::REPROBE_EVERY`]) while no probe has succeeded: a proxy started
    /// while its engine was down used to fail every call (unknown model name,
    /// unclamped `max_tokens`) until restarted.
    pub(crate) async fn probed(&self) -> Arc<Probe> {
        let probe = self.probe();
        let Upstream::Live(client) = &self.upstream else {
            return probe;
        };
        if !probe.model.is_empty() {
            return probe;
        }
        // One call probes; the others go on with what is known.
        let Ok(mut last) = self.reprobed.try_lock() else {
            return probe;
        };
        if last.is_some_and(|t| t.elapsed() < Self::REPROBE_EVERY) {
            return probe;
        }
        *last = Some(std::time::Instant::now());
        match client.probe().await {
            Ok(new) => {
                tracing::info!(model = %new.model, untrainable = ?new.untrainable, "upstream probed again: it answers now");
                *self.probe.write().unwrap_or_else(|p| p.into_inner()) = Arc::new(new);
            }
            Err(e) => tracing::warn!(error = %e, "upstream probe failed again"),
        }
        self.probe()
    }

    fn policy_version(&self) -> Option<i64> {
        Some(self.policy_version.load(Ordering::Relaxed)).filter(|v| *v >= 0)
    }

    /// Whether `records` more fit where events wait for the broker: what
    /// opens a call or a session is refused (503) rather than begun with an
    /// end that cannot be recorded (found by probing a spool on a full disk).
    fn has_room_for(&self, records: u64) -> bool {
        self.events.as_ref().is_none_or(|e| e.has_room_for(records))
    }

    /// Records `event`; false (logged, counted) if it could not be.
    fn send(&self, event: Event) -> bool {
        self.record(event) != Recorded::Not
    }

    /// Records a call's event as what is new since the session's recent calls
    /// (schema v5), then remembers it for the next ones: only a call that is
    /// in the log may be what a later one is stored against.
    fn send_call(&self, session: &Session, mut event: Event) -> bool {
        let whole = match &mut event {
            Event::CallStarted(e) => session.memory().compact_started(e),
            Event::CallFinished(e) => session.memory().compact_finished(e),
            _ => return self.send(event),
        };
        let whole = match self.record(event) {
            Recorded::Not => return false,
            Recorded::WithoutBodies => whole.without_chat_request(),
            Recorded::Whole => whole,
        };
        session.memory().remember(whole);
        true
    }

    fn record(&self, mut event: Event) -> Recorded {
        let Some(events) = &self.events else {
            return Recorded::Whole;
        };
        let mut sent = events.send(&event).map(|_| Recorded::Whole);
        if let (
            Err(too_large @ (SendError::TooLarge { .. } | SendError::Claim { .. })),
            Event::CallFinished(call),
        ) = (&sent, &mut event)
        {
            // A call is large by its bodies; its tokens, what training needs,
            // are small (and with the claim store down, fit a record).
            call.without_bodies(&too_large.to_string());
            sent = events.send(&event).map(|_| Recorded::WithoutBodies);
        }
        sent.unwrap_or_else(|e| {
            tracing::error!(error = %e, kind = event.kind().name(), "event NOT recorded");
            metrics::counter!("forgelog_proxy_events_refused_total").increment(1);
            Recorded::Not
        })
    }
}

/// How an event went into the log.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Recorded {
    Whole,
    /// A call too large for the log, recorded without its bodies.
    WithoutBodies,
    Not,
}

pub fn router(state: Arc<ProxyState>) -> Router {
    use tower_http::timeout::TimeoutLayer;
    // The backstop: nothing outlives the upstream timeout by much. Streams are
    // exempt in practice: their body is produced after the handler returns.
    let backstop = state.config.upstream_timeout + Duration::from_secs(30);
    // A live proxy opens new sessions; `replay serve` only re-runs recorded ones.
    let create_sessions = match state.upstream {
        Upstream::Live(_) => post(admin::create_session),
        Upstream::Recorded(_) => post(admin::create_replay_session),
    };
    // The session API answers the admin token only, checked before any body is read.
    let session_api = Router::new()
        .route("/sessions", create_sessions)
        .route("/sessions/{id}/finish", post(admin::finish_session))
        .route("/sessions/abandon", post(admin::abandon_attempt))
        // Session requests are small: an admin's mistake must not fill memory either.
        .layer(axum::extract::DefaultBodyLimit::max(SESSION_BODY_LIMIT))
        .route_layer(axum::middleware::from_fn_with_state(
            state.clone(),
            auth::admin_only,
        ));
    Router::new()
        .route(
            "/v1/chat/completions",
            post(call::call::<OpenAiChatDialect>),
        )
        .route("/v1/responses", post(call::call::<OpenAiResponsesDialect>))
        .route("/v1/messages", post(call::call::<AnthropicDialect>))
        .route("/v1/messages/count_tokens", post(meta::count_tokens))
        .route("/v1beta/models/{model_action}", post(call::gemini))
        .route("/v1/models", get(meta::models))
        .route("/healthz", get(|| async { "ok" }))
        .route("/metrics", get(meta::prometheus))
        .merge(session_api)
        .fallback(meta::unrouted)
        // Bodies are read (and limited) by the handlers, to answer in the dialect's shape.
        .layer(axum::extract::DefaultBodyLimit::disable())
        .layer(TimeoutLayer::with_status_code(
            StatusCode::GATEWAY_TIMEOUT,
            backstop,
        ))
        // Before anything reads the body: a request for another replica's
        // session goes there whole.
        .layer(axum::middleware::from_fn_with_state(
            state.clone(),
            replicas::to_owner,
        ))
        .with_state(state)
}

/// A refusal in dialect `D`'s own error shape.
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

/// A session-API error: `{"error": "..."}`.
fn admin_error(status: StatusCode, message: impl Into<String>) -> Response {
    (
        status,
        Json(ApiError {
            error: message.into(),
        }),
    )
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
