//! A harness's model call: the session by its key, the body within limits, the
//! call recorded as it starts, the upstream asked (or the budget stop
//! answered), the answer recorded and returned in the dialect's shape.

use super::auth::api_key;
use super::body::read_body;
use super::finish::{FinishesAnyway, Panicked};
use super::record::{failure_status, CallIds};
use super::{clamp_max_tokens, error_response, now_ms, stream, ProxyState, BUDGET_EXHAUSTED};
use crate::sessions::Session;
use crate::upstream::{
    completion_request, read_response, rl_sampling, upstream_request, Sampled, TokenIn, Upstream,
};
use axum::body::{Body, Bytes};
use axum::extract::{Path, Request, State};
use axum::http::{header, HeaderMap, HeaderValue};
use axum::response::{IntoResponse, Response};
use forgelog_dialects::canonical::{ChatRequest, ChatResponse, FinishReason, Part};
use forgelog_dialects::dialect::*;
use forgelog_dialects::splice::{self, AnsweredCall, Made};
use forgelog_schemas::{CallFinished, CallStatus, PromptMade, SamplingParams, Usage};
use serde_json::Value;
use std::collections::{BTreeMap, HashMap};
use std::sync::atomic::Ordering;
use std::sync::{Arc, Mutex};
use std::time::Instant;

/// Calls recorded as started and not yet as finished. Whoever takes a call
/// out records how it ended: the call itself, or the proxy shutting down
/// (which records those left as interrupted), never both.
#[derive(Default)]
pub struct CallsInFlight(Mutex<InFlightTable>);

/// (session id, call index) → the session and when the call arrived.
type InFlightTable = BTreeMap<(String, i64), (Arc<Session>, Instant)>;

/// The error of a call the proxy shut down under.
pub const INTERRUPTED: &str = "interrupted: the proxy shut down with the call in flight";

impl CallsInFlight {
    fn calls(&self) -> std::sync::MutexGuard<'_, InFlightTable> {
        self.0.lock().unwrap_or_else(|p| p.into_inner())
    }

    fn start(&self, session: &Arc<Session>, index: i64, received: Instant) {
        self.calls()
            .insert((session.id.clone(), index), (session.clone(), received));
    }

    /// Takes the call out; false if it was no longer in (already recorded).
    fn end(&self, session: &str, index: i64) -> bool {
        self.calls().remove(&(session.to_string(), index)).is_some()
    }

    pub fn len(&self) -> usize {
        self.calls().len()
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Takes every call out: (its session, its index, how long it ran).
    pub(super) fn take_all(&self) -> Vec<(Arc<Session>, i64, std::time::Duration)> {
        let calls = std::mem::take(&mut *self.calls());
        calls
            .into_iter()
            .map(|((_, index), (session, received))| (session, index, received.elapsed()))
            .collect()
    }
}

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

fn messages_of(chat: &Value) -> &[Value] {
    chat["messages"].as_array().map_or(&[], Vec::as_slice)
}

fn tools_of(chat: &Value) -> Option<&Value> {
    chat.get("tools").filter(|t| !t.is_null())
}

/// How a prompt was made, as `CallFinished` records it.
fn made(made: &Made, token_in: &TokenIn) -> PromptMade {
    let (spliced_from, why_rendered) = match made {
        Made::Spliced { base_call } => (Some(*base_call), None),
        Made::Rendered { why } => (None, Some(why.clone())),
    };
    PromptMade {
        spliced_from,
        why_rendered,
        tokenizer_sha256: token_in.tokenizer_sha256.clone(),
        chat_template_sha256: token_in.chat_template_sha256.clone(),
    }
}

/// One recorded harness call, from arrival to the answer.
/// What an engine's answer came with, for its record.
struct EngineAnswer<'a> {
    req: &'a ChatRequest,
    sent: SamplingParams,
    upstream: &'a crate::upstream::UpstreamRequest,
    answer: &'a crate::upstream::UpstreamAnswer,
    resp: &'a ChatResponse,
    response_body: &'a Bytes,
}

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
        if !self.st.calls_in_flight.end(&self.session.id, self.index) {
            return; // recorded as interrupted by the shutdown
        }
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

    /// Asks the upstream, records the answer; returns it and the harness's response body.
    async fn complete<D: DialectAdapter>(
        self,
        req: &ChatRequest,
    ) -> Result<(ChatResponse, Bytes), DialectError> {
        let probe = self.st.probed().await;
        let sent = clamp_max_tokens(
            rl_sampling(&req.sampling),
            self.session.max_tokens,
            probe.context,
        );
        let adapter = match self.adapter(&probe.model).await {
            Ok(adapter) => adapter,
            Err(err) => {
                self.fail(&err, Some(&req.sampling));
                return Err(err);
            }
        };
        let model = adapter.as_ref().map_or(&probe.model, |(name, _)| name);
        let upstream = upstream_request(req, &sent, model);
        let asked = Instant::now();
        let token_in = match (&self.st.config.token_in, &self.st.upstream) {
            (Some(t), Upstream::Live(client)) => Some((t, client)),
            _ => None,
        };
        // An engine whose answers carry no version says it at /weight_info.
        let weight_info = match &self.st.upstream {
            Upstream::Live(client) if probe.weight_info && adapter.is_none() => Some(client),
            _ => None,
        };
        let served_before = match weight_info {
            Some(client) => client.weight_version().await.ok().flatten(),
            None => None,
        };
        let (answer, prompt) = match token_in {
            Some((token_in, client)) => match self.prompt(token_in, &upstream.body) {
                Ok(prompt) => {
                    let body = completion_request(&prompt.ids, &upstream.body, probe.context);
                    (client.complete_tokens(&body).await, Some(prompt))
                }
                Err(err) => {
                    self.fail(&err, Some(&req.sampling));
                    return Err(err);
                }
            },
            None => (
                self.st
                    .upstream
                    .chat(Some((&self.session.id, self.index)), &upstream)
                    .await,
                None,
            ),
        };
        metrics::histogram!("forgelog_proxy_upstream_seconds")
            .record(asked.elapsed().as_secs_f64());
        let mut answer = match answer {
            Ok(a) => a,
            Err(e) => {
                let err = e.dialect_error();
                self.fail(&err, Some(&req.sampling));
                return Err(err);
            }
        };
        let prefix = format!("call_{}_{}_", &self.session.id[..12], self.index);
        let (mut resp, mut sampled) = match read_response(&mut answer, &prefix) {
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
        if let Some((_, version)) = adapter {
            sampled.policy_version = Some(version);
        }
        if let (None, Some(client)) = (sampled.policy_version, weight_info) {
            let after = client.weight_version().await.ok().flatten();
            sampled.policy_version = crate::upstream::version_across(served_before, after);
            if served_before != after {
                metrics::counter!("forgelog_proxy_version_unknown_total").increment(1);
            }
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
        let answered = EngineAnswer {
            req,
            sent,
            upstream: &upstream,
            answer: &answer,
            resp: &resp,
            response_body: &response_body,
        };
        let e = self.finished_ok(
            answered,
            sampled,
            &probe.model,
            prompt,
            token_in.map(|(t, _)| t),
        );
        self.record(e);
        Ok((resp, response_body))
    }

    /// The call's prompt ids, spliced onto an earlier call of the session
    /// where it extends one; a template that cannot render it is the
    /// harness's bad request.
    /// An engine serving versions as adapters: the name of the newest for
    /// the call to ask for and its version (before any, the base model:
    /// version 0); none for any other engine.
    async fn adapter(&self, base: &str) -> Result<Option<(String, i64)>, DialectError> {
        match &self.st.upstream {
            Upstream::Live(client) if self.st.config.policy_adapters => {
                match client.newest_adapter().await {
                    Ok(Some(v)) => Ok(Some((forgelog_sync_core::adapter_name(v), v as i64))),
                    Ok(None) => Ok(Some((base.to_string(), 0))),
                    Err(e) => Err(e.dialect_error()),
                }
            }
            _ => Ok(None),
        }
    }

    /// The `CallFinished` of a call the engine answered: its ids and
    /// logprobs, what was asked and sent, the harness's answer, and (token
    /// in) how its prompt was made; an answer the next call may be spliced
    /// onto is remembered.
    fn finished_ok(
        &self,
        a: EngineAnswer<'_>,
        sampled: Sampled,
        served_model: &str,
        prompt: Option<splice::Prompt>,
        token_in: Option<&TokenIn>,
    ) -> CallFinished {
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
        e.model = a.answer["model"]
            .as_str()
            .unwrap_or(served_model)
            .to_string();
        e.trainable = untrainable_reason.is_none();
        e.untrainable_reason = untrainable_reason;
        e.prompt_token_ids = prompt_token_ids;
        e.completion_token_ids = completion_token_ids;
        e.completion_logprobs = completion_logprobs;
        e.finish_reason = finish_reason;
        e.sampling_requested = a.req.sampling.clone();
        e.sampling_sent = a.sent;
        e.policy_version = policy_version;
        e.usage = Usage {
            prompt_tokens: a.resp.usage.input as i64,
            completion_tokens: a.resp.usage.output as i64,
        };
        e.response_body = a.response_body.to_vec();
        // The call in OpenAI Chat form whatever the dialect (what SFT export writes):
        // the upstream request is already that form, and so is its answer.
        e.chat_request = a.upstream.chat_form_text();
        match (prompt, token_in) {
            (Some(prompt), Some(token_in)) => {
                // What the harness got, tool calls parsed: what it sends back.
                let message =
                    OpenAiChatDialect::encode_response(a.resp)["choices"][0]["message"].take();
                e.chat_response = message.to_string();
                e.prompt_made = Some(made(&prompt.made, token_in));
                // Spliced onto only if the engine read the ids it was asked with.
                if e.trainable && e.prompt_token_ids == prompt.ids {
                    self.session.remember_answer(AnsweredCall::new(
                        self.index,
                        prompt,
                        tools_of(&a.upstream.body).cloned(),
                        message,
                        e.completion_token_ids.clone(),
                    ));
                }
            }
            _ => e.chat_response = a.answer["choices"][0]["message"].to_string(),
        }
        e
    }

    fn prompt(&self, token_in: &TokenIn, chat: &Value) -> Result<splice::Prompt, DialectError> {
        let mut answered = self.session.answered();
        let prompt = splice::prompt(
            answered.make_contiguous(),
            messages_of(chat),
            tools_of(chat),
            token_in.renderer.as_ref(),
        )
        .map_err(|e| DialectError::invalid(format!("the model's chat template: {e}")))?;
        let kind = match prompt.made {
            Made::Spliced { .. } => "spliced",
            Made::Rendered { .. } => "rendered",
        };
        metrics::counter!("forgelog_proxy_prompts_total", "made" => kind).increment(1);
        Ok(prompt)
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
    if !st.send_call(&session, started.into()) {
        return error_response::<D>(&DialectError::new(
            ErrorKind::Internal,
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
