//! The upstream: a vLLM-compatible `POST /v1/chat/completions`, always
//! non-streaming, asked for token ids and logprobs. Request building and
//! response reading (`answer.rs`) are pure; [`UpstreamClient`] is the thin HTTP part.

mod answer;
#[cfg(test)]
mod arbitrary;
mod extra_body;
mod request;
mod token_in;

pub use answer::{read_response, ChoiceTokens, Sampled, TokenLogprob, UpstreamAnswer};
pub use extra_body::{ExtraBody, ExtraBodyError};
pub use request::UpstreamRequest;
pub use token_in::{check_rendering, completion_request, TokenIn};

use forgelog_dialects::canonical::*;
use forgelog_dialects::dialect::{DialectAdapter, DialectError, ErrorKind, OpenAiChatDialect};
use forgelog_schemas::SamplingParams;
use forgelog_sync_core::ModelList;
use serde_json::{json, Value};
use std::sync::Arc;
use std::time::Duration;

/// What the proxy sends upstream for `requested`: the harness's temperature,
/// length, seed and stops, everything else neutral, so the recorded logprobs
/// are those of the plain tempered distribution (what GRPO's ratio assumes).
pub fn rl_sampling(requested: &SamplingParams) -> SamplingParams {
    SamplingParams {
        temperature: Some(requested.temperature.unwrap_or(1.0)),
        top_p: Some(1.0),
        top_k: Some(-1),
        min_p: Some(0.0),
        max_tokens: requested.max_tokens,
        seed: requested.seed,
        presence_penalty: Some(0.0),
        frequency_penalty: Some(0.0),
        stop: requested.stop.clone(),
    }
}

/// The upstream request for `req` with `sent` sampling and the operator's
/// `extra` fields.
pub fn upstream_request(
    req: &ChatRequest,
    sent: &SamplingParams,
    model: &str,
    extra: &ExtraBody,
) -> UpstreamRequest {
    let mut up = req.clone();
    up.sampling = sent.clone();
    up.stream = false;
    up.stream_usage = false;
    if up.model.is_empty() || !model.is_empty() {
        up.model = model.to_string();
    }
    let mut body = OpenAiChatDialect::encode_request(&up);
    body["logprobs"] = json!(true);
    body["top_logprobs"] = json!(0);
    body["return_token_ids"] = json!(true);
    body["stream"] = json!(false);
    UpstreamRequest::with_extra(body, extra)
}

#[derive(Debug, thiserror::Error)]
pub enum UpstreamError {
    #[error("upstream did not answer within {0:?}")]
    Timeout(Duration),
    #[error("upstream unreachable: {0}")]
    Connect(String),
    #[error("upstream answered HTTP {status}: {body}")]
    Status { status: u16, body: String },
    #[error("upstream answer is not JSON: {0}")]
    NotJson(String),
    #[error("upstream answer is over {0} bytes")]
    TooLarge(usize),
    /// `replay serve`: the recording has no answer for this request.
    #[error(transparent)]
    Replay(#[from] crate::replay::ReplayError),
}

impl UpstreamError {
    /// 4xx from the upstream is the harness's request being bad; a prompt over
    /// the context (vLLM's and the forgelog engine's `context_length_exceeded`,
    /// or their "maximum context length" wording) is told apart, with the
    /// upstream's own message, so each dialect can say it the way its clients
    /// recognise.
    pub fn dialect_error(&self) -> DialectError {
        use crate::replay::ReplayError;
        let kind = match self {
            UpstreamError::Timeout(_) => ErrorKind::Timeout,
            UpstreamError::Replay(ReplayError::RecordedFailure { status, .. })
                if *status != forgelog_schemas::CallStatus::ClientError =>
            {
                ErrorKind::Upstream
            }
            UpstreamError::Replay(ReplayError::UnknownSession { .. }) => ErrorKind::NotFound,
            UpstreamError::Replay(_) => ErrorKind::InvalidRequest,
            UpstreamError::Status { status, body } if (400..500).contains(status) => {
                let parsed: Value = serde_json::from_str(body).unwrap_or(Value::Null);
                let over_context = parsed["error"]["code"] == "context_length_exceeded"
                    || parsed["code"] == "context_length_exceeded"
                    || body.contains("maximum context length");
                if over_context {
                    let message = parsed["error"]["message"]
                        .as_str()
                        .or(parsed["message"].as_str())
                        .map_or_else(|| body.clone(), str::to_string);
                    return DialectError::new(ErrorKind::ContextLength, message);
                }
                ErrorKind::InvalidRequest
            }
            _ => ErrorKind::Upstream,
        };
        DialectError::new(kind, self.to_string())
    }
}

/// Where the proxy's answers come from: the live engine, or a recorded run
/// (`forgelog replay serve`). Everything around it (dialects, ids, streams) is the same code.
#[derive(Clone)]
pub enum Upstream {
    Live(UpstreamClient),
    Recorded(Arc<crate::replay::RecordedUpstream>),
}

impl Upstream {
    /// The answer to `request`; `call` is (session id, call index) of a session's
    /// model call, `None` for requests outside the session's calls (token counting).
    pub async fn chat(
        &self,
        call: Option<(&str, i64)>,
        request: &UpstreamRequest,
    ) -> Result<UpstreamAnswer, UpstreamError> {
        match (self, call) {
            (Upstream::Live(client), _) => client.chat(request).await,
            (Upstream::Recorded(rec), Some((session, index))) => {
                rec.answer(session, index, &request.body)
            }
            (Upstream::Recorded(_), None) => {
                Err(crate::replay::ReplayError::NotACall("token counting").into())
            }
        }
    }
}

/// What the start-up probe learned about the upstream.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Probe {
    /// Empty when the probe failed (the upstream was down, say).
    pub model: String,
    /// Prompt plus completion tokens at most, where the upstream says.
    pub context: Option<i64>,
    /// Why its answers would not be trainable (`None`: they would be).
    pub untrainable: Option<String>,
    /// Whether it says which weights it serves at `GET /weight_info` (vLLM's
    /// RL routes): its answers carry no version, so each call reads it there.
    pub weight_info: bool,
}

/// `base` and `path` as a URL, or why they are not one.
fn url(base: &str, path: &str) -> Result<reqwest::Url, String> {
    reqwest::Url::parse(&format!("{base}{path}")).map_err(|e| format!("{base}{path}: {e}"))
}

/// The routes a call asks, parsed once.
struct Urls {
    chat: Result<reqwest::Url, String>,
    /// Token in: a prompt of token ids.
    completions: Result<reqwest::Url, String>,
}

/// The HTTP client for one upstream base URL.
#[derive(Clone)]
pub struct UpstreamClient {
    http: reqwest::Client,
    base: String,
    /// Parsed once, not on every call (0.7% of a call's instructions).
    urls: Arc<Urls>,
    timeout: Duration,
    /// Bounds requests (so connections and fds) in flight to the upstream; calls beyond wait their turn.
    in_flight: Arc<tokio::sync::Semaphore>,
}

impl UpstreamClient {
    pub fn new(base: &str, timeout: Duration, max_in_flight: usize) -> UpstreamClient {
        let http = reqwest::Client::builder()
            .pool_idle_timeout(Duration::from_secs(90))
            .pool_max_idle_per_host(usize::MAX)
            .tcp_nodelay(true)
            .build()
            .expect("a plain HTTP client builds");
        let base = base.trim_end_matches('/').to_string();
        UpstreamClient {
            http,
            urls: Arc::new(Urls {
                chat: url(&base, "/v1/chat/completions"),
                completions: url(&base, "/v1/completions"),
            }),
            base,
            timeout,
            in_flight: Arc::new(tokio::sync::Semaphore::new(max_in_flight.max(1))),
        }
    }

    /// POSTs `body` to `path` and reads the answer with `read`, all within
    /// the timeout, the wait for a turn included: so every call ends within
    /// it (and `/finish`, which waits for the calls in flight, sees them all).
    async fn post<T>(
        &self,
        url: Result<reqwest::Url, String>,
        body: axum::body::Bytes,
        read: impl AsyncFnOnce(reqwest::Response) -> Result<T, UpstreamError>,
    ) -> Result<T, UpstreamError> {
        let url = url.map_err(UpstreamError::Connect)?;
        let answer = async {
            let _turn = self.in_flight.acquire().await.expect("never closed");
            let r = self
                .http
                .post(url)
                .header("content-type", "application/json")
                .body(body)
                .send()
                .await
                .map_err(|e| UpstreamError::Connect(e.to_string()))?;
            read(r).await
        };
        tokio::time::timeout(self.timeout, answer)
            .await
            .map_err(|_| UpstreamError::Timeout(self.timeout))?
    }

    /// One chat completion.
    pub async fn chat(&self, request: &UpstreamRequest) -> Result<UpstreamAnswer, UpstreamError> {
        self.post(
            self.urls.chat.clone(),
            request.text(),
            async |r: reqwest::Response| {
                UpstreamAnswer::from_json(&read_bytes(r).await?)
                    .map_err(|e| UpstreamError::NotJson(e.to_string()))
            },
        )
        .await
    }

    /// vLLM's `POST /tokenize` of a chat: its prompt's token count, no
    /// generation. `None` when the upstream has no such route.
    pub async fn tokenize(&self, body: &Value) -> Result<Option<u64>, UpstreamError> {
        Ok(self
            .tokenize_answer(body)
            .await?
            .and_then(|a| a["count"].as_u64()))
    }

    /// `POST /tokenize`'s answer (`count`, `tokens`, …); `None` when the
    /// upstream has no such route.
    async fn tokenize_answer(&self, body: &Value) -> Result<Option<Value>, UpstreamError> {
        let body = serde_json::to_vec(body).expect("a Value serializes").into();
        self.post(
            url(&self.base, "/tokenize"),
            body,
            async |r: reqwest::Response| {
                if matches!(r.status().as_u16(), 404 | 405) {
                    return Ok(None);
                }
                Ok(Some(read_json::<Value>(r).await?))
            },
        )
        .await
    }

    pub async fn models(&self) -> Result<ModelList, UpstreamError> {
        let r = self
            .http
            .get(url(&self.base, "/v1/models").map_err(UpstreamError::Connect)?)
            .timeout(self.timeout)
            .send()
            .await
            .map_err(|e| UpstreamError::Connect(e.to_string()))?;
        read_json(r).await
    }

    /// `GET /v1/models` and a 1-token request: the model name to use, its
    /// context length where the upstream reports it (vLLM's `max_model_len`), and
    /// why calls would not be trainable (`None`: they would be).
    pub async fn probe(&self) -> Result<Probe, UpstreamError> {
        let models = self.models().await?;
        let (model, context) = models
            .served()
            .map(|m| (m.id.clone(), m.max_model_len))
            .unwrap_or_default();
        let req = ChatRequest {
            model: model.clone(),
            messages: vec![Message::text(Role::User, "Hi")],
            ..Default::default()
        };
        let sent = SamplingParams {
            max_tokens: Some(1),
            ..rl_sampling(&req.sampling)
        };
        let mut answer = self
            .chat(&upstream_request(
                &req,
                &sent,
                &model,
                &ExtraBody::default(),
            ))
            .await?;
        let (untrainable, versioned) = match read_response(&mut answer, "probe_") {
            Ok((_, s)) => (s.untrainable_reason, s.policy_version.is_some()),
            Err(e) => (Some(e.message), false),
        };
        // Asked only of an engine whose answers do not say it themselves.
        let weight_info = !versioned && self.weight_version().await.is_ok();
        Ok(Probe {
            model,
            context,
            untrainable,
            weight_info,
        })
    }

    /// The newest policy version the upstream serves as an adapter (the
    /// `policy@N` its `/v1/models` lists), `None` when it lists none.
    pub async fn newest_adapter(&self) -> Result<Option<u64>, UpstreamError> {
        Ok(self.models().await?.newest_adapter())
    }

    /// The version of the weights the upstream serves, as its
    /// `GET /weight_info` says (`None`: it names none, or none of ours).
    pub async fn weight_version(&self) -> Result<Option<i64>, UpstreamError> {
        let r = self
            .http
            .get(url(&self.base, "/weight_info").map_err(UpstreamError::Connect)?)
            .timeout(self.timeout)
            .send()
            .await
            .map_err(|e| UpstreamError::Connect(e.to_string()))?;
        let info: Value = read_json(r).await?;
        match &info["weight_version"] {
            Value::String(v) => Ok(v.parse().ok()),
            Value::Null => Ok(None),
            other => Err(UpstreamError::NotJson(format!("weight_version {other}"))),
        }
    }
}

/// The version a call was sampled by, from the upstream's word before it was
/// sent and after it was answered: weights change only while the engine is
/// paused (`forgelog sync` pauses vLLM with `mode=wait`), so the same version
/// on both sides served the whole call; two different ones leave it unknown
/// (asked before the reload, or queued behind it).
pub fn version_across(before: Option<i64>, after: Option<i64>) -> Option<i64> {
    before.filter(|_| before == after)
}

/// The largest upstream answer read: far above any real completion (a
/// 100k-token prompt's ids and logprobs are about 2 MB of JSON), so that a
/// broken or hostile upstream cannot fill the proxy's memory.
pub const MAX_ANSWER_BYTES: usize = 64 << 20;

/// The JSON body of an upstream response; a non-2xx status is an error carrying
/// (the start of) the body.
async fn read_json<T: serde::de::DeserializeOwned>(
    r: reqwest::Response,
) -> Result<T, UpstreamError> {
    serde_json::from_slice(&read_bytes(r).await?).map_err(|e| UpstreamError::NotJson(e.to_string()))
}

/// The body of an upstream response, within [`MAX_ANSWER_BYTES`]; a non-2xx
/// status is an error carrying (the start of) the body.
async fn read_bytes(mut r: reqwest::Response) -> Result<Vec<u8>, UpstreamError> {
    let status = r.status().as_u16();
    // Room for what the upstream announces, up to a few MiB: a claim is not a body.
    let expected = r.content_length().unwrap_or(0) as usize;
    let mut bytes = Vec::with_capacity(expected.min(4 << 20));
    while let Some(chunk) = r
        .chunk()
        .await
        .map_err(|e| UpstreamError::Connect(e.to_string()))?
    {
        if bytes.len() + chunk.len() > MAX_ANSWER_BYTES {
            return Err(UpstreamError::TooLarge(MAX_ANSWER_BYTES));
        }
        bytes.extend_from_slice(&chunk);
    }
    if status >= 300 {
        return Err(UpstreamError::Status {
            status,
            body: String::from_utf8_lossy(&bytes[..bytes.len().min(2000)]).into_owned(),
        });
    }
    Ok(bytes)
}

#[cfg(test)]
mod tests;
