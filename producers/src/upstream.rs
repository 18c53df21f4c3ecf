//! The upstream: a vLLM-compatible `POST /v1/chat/completions`, always
//! non-streaming, asked for token ids and logprobs. Request building and
//! response reading are pure; [`UpstreamClient`] is the thin HTTP part.

use forgelog_dialects::canonical::*;
use forgelog_dialects::dialect::{DialectAdapter, DialectError, ErrorKind, OpenAiChatDialect};
use forgelog_dialects::hermes;
use forgelog_schemas::SamplingParams;
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

/// The upstream request body for `req` with `sent` sampling.
pub fn upstream_body(req: &ChatRequest, sent: &SamplingParams, model: &str) -> Value {
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
    body
}

/// The training data of one upstream answer.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct Sampled {
    pub prompt_token_ids: Vec<u32>,
    pub completion_token_ids: Vec<u32>,
    pub completion_logprobs: Vec<f32>,
    pub finish_reason: Option<String>,
    pub policy_version: Option<i64>,
    /// `None` when the answer is usable for training.
    pub untrainable_reason: Option<String>,
    /// Hermes tool-call text the proxy could not parse (left as text).
    pub unparsed_tool_calls: usize,
}

/// An upstream chat completion: its JSON less the prompt's token ids, which
/// are read straight into numbers. A long prompt's ids are most of an answer,
/// and read as JSON values they were the largest part of the proxy's CPU per call.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct UpstreamAnswer {
    pub body: Value,
    pub prompt_token_ids: Option<Vec<u32>>,
}

impl From<Value> for UpstreamAnswer {
    fn from(mut body: Value) -> UpstreamAnswer {
        let ids_value = body
            .as_object_mut()
            .and_then(|m| m.remove("prompt_token_ids"));
        UpstreamAnswer {
            prompt_token_ids: ids(ids_value.as_ref()),
            body,
        }
    }
}

impl std::ops::Index<&str> for UpstreamAnswer {
    type Output = Value;
    fn index(&self, key: &str) -> &Value {
        &self.body[key]
    }
}

impl<'de> serde::Deserialize<'de> for UpstreamAnswer {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct Visitor;
        impl<'de> serde::de::Visitor<'de> for Visitor {
            type Value = UpstreamAnswer;
            fn expecting(&self, f: &mut std::fmt::Formatter) -> std::fmt::Result {
                f.write_str("a chat completion object")
            }
            fn visit_map<A: serde::de::MapAccess<'de>>(
                self,
                mut map: A,
            ) -> Result<UpstreamAnswer, A::Error> {
                use serde::de::Error as _;
                let mut answer = UpstreamAnswer::default();
                let mut body = serde_json::Map::new();
                while let Some(key) = map.next_key::<String>()? {
                    if key == "prompt_token_ids" {
                        // Taken raw and split here: through serde's per-element
                        // visitor a long prompt's ids cost ~200 instructions
                        // each, most of the proxy's instructions per call.
                        let raw: Box<serde_json::value::RawValue> = map.next_value()?;
                        answer.prompt_token_ids = token_ids(raw.get()).ok_or_else(|| {
                            A::Error::custom("prompt_token_ids: not an array of token ids")
                        })?;
                    } else {
                        body.insert(key, map.next_value()?);
                    }
                }
                answer.body = Value::Object(body);
                Ok(answer)
            }
        }
        d.deserialize_map(Visitor)
    }
}

/// The ids of a JSON array of token ids (`[1,2,3]`, whitespace allowed);
/// `Some(None)` for `null`; `None` for anything else. One pass over the bytes:
/// `str::split` and `u32::from_str` cost ~180 instructions an id.
fn token_ids(json: &str) -> Option<Option<Vec<u32>>> {
    let json = json.trim_ascii();
    if json == "null" {
        return Some(None);
    }
    let items = json.strip_prefix('[')?.strip_suffix(']')?.as_bytes();
    let mut ids = Vec::with_capacity(items.len() / 4 + 1);
    let mut at = 0;
    let skip_space = |at: &mut usize| {
        while items.get(*at).is_some_and(|b| b.is_ascii_whitespace()) {
            *at += 1;
        }
    };
    skip_space(&mut at);
    if at == items.len() {
        return Some(Some(ids));
    }
    loop {
        let start = at;
        let mut id: u64 = 0;
        while let Some(&b @ b'0'..=b'9') = items.get(at) {
            id = id * 10 + u64::from(b - b'0');
            if id > u64::from(u32::MAX) {
                return None;
            }
            at += 1;
        }
        if at == start {
            return None;
        }
        ids.push(id as u32);
        skip_space(&mut at);
        match items.get(at) {
            None => return Some(Some(ids)),
            Some(b',') => {
                at += 1;
                skip_space(&mut at);
            }
            Some(_) => return None,
        }
    }
}

fn ids(v: Option<&Value>) -> Option<Vec<u32>> {
    v?.as_array()?
        .iter()
        .map(|x| x.as_u64().and_then(|n| u32::try_from(n).ok()))
        .collect()
}

/// Reads a vLLM (or forgelog engine) chat completion. `call_id_prefix` names
/// the tool calls the proxy itself parses from Hermes text.
pub fn read_response(
    answer: &UpstreamAnswer,
    call_id_prefix: &str,
) -> Result<(ChatResponse, Sampled), DialectError> {
    let bad = |m: &str| DialectError::new(ErrorKind::Upstream, format!("upstream answer: {m}"));
    let body = &answer.body;
    let mut resp = OpenAiChatDialect::decode_response(body).map_err(|e| bad(&e.message))?;
    let choice = &body["choices"][0];
    let mut sampled = Sampled {
        prompt_token_ids: answer
            .prompt_token_ids
            .clone()
            .or_else(|| ids(choice.get("prompt_token_ids")))
            .unwrap_or_default(),
        completion_token_ids: ids(choice.get("token_ids")).unwrap_or_default(),
        finish_reason: choice["finish_reason"].as_str().map(str::to_string),
        policy_version: body["policy_version"].as_i64(),
        ..Default::default()
    };
    let content = choice["logprobs"]["content"].as_array();
    if let Some(content) = content {
        sampled.completion_logprobs = content
            .iter()
            .map(|t| t["logprob"].as_f64().unwrap_or(f64::NAN) as f32)
            .collect();
        // Without return_token_ids, `--return-tokens-as-token-ids` still names each token.
        if sampled.completion_token_ids.is_empty() {
            sampled.completion_token_ids = content
                .iter()
                .filter_map(|t| t["token"].as_str()?.strip_prefix("token_id:")?.parse().ok())
                .collect();
        }
    }
    sampled.untrainable_reason = if sampled.prompt_token_ids.is_empty() {
        Some("upstream returned no prompt token ids".into())
    } else if sampled.completion_token_ids.is_empty() && resp.usage.output > 0 {
        Some("upstream returned no completion token ids".into())
    } else if content.is_none() {
        Some("upstream returned no logprobs".into())
    } else if sampled.completion_logprobs.len() != sampled.completion_token_ids.len() {
        Some(format!(
            "{} logprobs for {} completion tokens",
            sampled.completion_logprobs.len(),
            sampled.completion_token_ids.len()
        ))
    } else if sampled.completion_logprobs.iter().any(|l| !l.is_finite()) {
        Some("upstream returned a non-finite logprob".into())
    } else {
        None
    };
    if resp.usage.input == 0 {
        resp.usage.input = sampled.prompt_token_ids.len() as u64;
    }
    if resp.usage.output == 0 {
        resp.usage.output = sampled.completion_token_ids.len() as u64;
    }
    sampled.unparsed_tool_calls = hermes::parse_parts(&mut resp.parts, call_id_prefix);
    if resp.parts.iter().any(|p| matches!(p, Part::ToolCall(_)))
        && resp.finish == FinishReason::Stop
    {
        resp.finish = FinishReason::ToolCalls;
    }
    Ok((resp, sampled))
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
    /// The answer to `body`; `call` is (session id, call index) of a session's
    /// model call, `None` for requests outside the session's calls (token counting).
    pub async fn chat(
        &self,
        call: Option<(&str, i64)>,
        body: &Value,
    ) -> Result<UpstreamAnswer, UpstreamError> {
        match (self, call) {
            (Upstream::Live(client), _) => client.chat(body).await,
            (Upstream::Recorded(rec), Some((session, index))) => rec.answer(session, index, body),
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
}

/// The HTTP client for one upstream base URL.
#[derive(Clone)]
pub struct UpstreamClient {
    http: reqwest::Client,
    base: String,
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
        UpstreamClient {
            http,
            base: base.trim_end_matches('/').to_string(),
            timeout,
            in_flight: Arc::new(tokio::sync::Semaphore::new(max_in_flight.max(1))),
        }
    }

    /// POSTs `body` to `path` and reads the answer with `read`, all within
    /// the timeout, the wait for a turn included: so every call ends within
    /// it (and `/finish`, which waits for the calls in flight, sees them all).
    async fn post<T>(
        &self,
        path: &str,
        body: &Value,
        read: impl AsyncFnOnce(reqwest::Response) -> Result<T, UpstreamError>,
    ) -> Result<T, UpstreamError> {
        let answer = async {
            let _turn = self.in_flight.acquire().await.expect("never closed");
            let r = self
                .http
                .post(format!("{}{path}", self.base))
                .header("content-type", "application/json")
                .body(serde_json::to_vec(body).expect("JSON"))
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
    pub async fn chat(&self, body: &Value) -> Result<UpstreamAnswer, UpstreamError> {
        self.post("/v1/chat/completions", body, read_json).await
    }

    /// vLLM's `POST /tokenize` of a chat: its prompt's token count, no
    /// generation. `None` when the upstream has no such route.
    pub async fn tokenize(&self, body: &Value) -> Result<Option<u64>, UpstreamError> {
        self.post("/tokenize", body, async |r: reqwest::Response| {
            if matches!(r.status().as_u16(), 404 | 405) {
                return Ok(None);
            }
            Ok(read_json::<Value>(r).await?["count"].as_u64())
        })
        .await
    }

    pub async fn models(&self) -> Result<Value, UpstreamError> {
        let r = self
            .http
            .get(format!("{}/v1/models", self.base))
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
        let model = models["data"][0]["id"]
            .as_str()
            .unwrap_or_default()
            .to_string();
        let context = models["data"][0]["max_model_len"].as_i64();
        let req = ChatRequest {
            model: model.clone(),
            messages: vec![Message::text(Role::User, "Hi")],
            ..Default::default()
        };
        let sent = SamplingParams {
            max_tokens: Some(1),
            ..rl_sampling(&req.sampling)
        };
        let answer = self.chat(&upstream_body(&req, &sent, &model)).await?;
        let untrainable = match read_response(&answer, "probe_") {
            Ok((_, s)) => s.untrainable_reason,
            Err(e) => Some(e.message),
        };
        Ok(Probe {
            model,
            context,
            untrainable,
        })
    }
}

/// The largest upstream answer read: far above any real completion (a
/// 100k-token prompt's ids and logprobs are about 2 MB of JSON), so that a
/// broken or hostile upstream cannot fill the proxy's memory.
pub const MAX_ANSWER_BYTES: usize = 64 << 20;

/// The JSON body of an upstream response; a non-2xx status is an error carrying
/// (the start of) the body.
async fn read_json<T: serde::de::DeserializeOwned>(
    mut r: reqwest::Response,
) -> Result<T, UpstreamError> {
    let status = r.status().as_u16();
    let mut bytes = Vec::new();
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
    serde_json::from_slice(&bytes).map_err(|e| UpstreamError::NotJson(e.to_string()))
}

#[cfg(test)]
mod tests {
    use super::*;
    use forgelog_dialects::dialect::*;

    /// A context-length refusal from the engine (ours or vLLM) becomes each
    /// dialect's own: OpenAI's `context_length_exceeded` code, Anthropic's
    /// "prompt is too long", Gemini's INVALID_ARGUMENT; all 400.
    #[test]
    fn context_length_errors_in_each_dialect() {
        let ours = json!({"error": {"message": "This model's maximum context length is 8192 tokens. However, you requested 9000 tokens (8990 in the messages, 10 in the completion).", "type": "invalid_request_error", "code": "context_length_exceeded"}});
        let vllm = json!({"object": "error", "message": "This model's maximum context length is 8192 tokens. However, you requested 9000 tokens.", "type": "BadRequestError", "param": null, "code": 400});
        for body in [ours, vllm] {
            let err = UpstreamError::Status {
                status: 400,
                body: body.to_string(),
            }
            .dialect_error();
            assert_eq!(err.kind, ErrorKind::ContextLength);
            assert_eq!(err.kind.status(), 400);
            assert!(err
                .message
                .starts_with("This model's maximum context length is 8192 tokens."));
            let chat = OpenAiChatDialect::error_body(&err);
            assert_eq!(chat["error"]["code"], "context_length_exceeded");
            assert_eq!(chat["error"]["type"], "invalid_request_error");
            assert_eq!(OpenAiResponsesDialect::error_body(&err), chat);
            assert_eq!(
                OpenAiResponsesDialect::stream_error(&err).json()["code"],
                "context_length_exceeded"
            );
            let anthropic = AnthropicDialect::error_body(&err);
            assert_eq!(anthropic["error"]["type"], "invalid_request_error");
            assert!(anthropic["error"]["message"]
                .as_str()
                .unwrap()
                .starts_with("prompt is too long: This model's maximum context length"));
            assert_eq!(
                GeminiDialect::error_body(&err)["error"]["status"],
                "INVALID_ARGUMENT"
            );
        }
        // Other 4xx stay plain invalid requests, with no code.
        let other = UpstreamError::Status {
            status: 400,
            body: json!({"error": {"message": "top_p must be in (0, 1]"}}).to_string(),
        }
        .dialect_error();
        assert_eq!(other.kind, ErrorKind::InvalidRequest);
        assert_eq!(
            OpenAiChatDialect::error_body(&other)["error"]["code"],
            Value::Null
        );
    }

    /// A completion's prompt ids read from its text are the ids the JSON holds,
    /// however it is spaced; anything but an array of u32 (or null) is refused.
    #[test]
    fn prompt_ids_are_read_from_the_answer_text() {
        let read = |text: &str| serde_json::from_str::<UpstreamAnswer>(text);
        for (text, ids) in [
            (
                r#"{"prompt_token_ids": [1,2,3], "id": "x"}"#,
                Some(vec![1, 2, 3]),
            ),
            (
                r#"{"prompt_token_ids":[ 0 , 4294967295 ]}"#,
                Some(vec![0, u32::MAX]),
            ),
            ("{\"prompt_token_ids\":[\n7\t]}", Some(vec![7])),
            (r#"{"prompt_token_ids": []}"#, Some(vec![])),
            (r#"{"prompt_token_ids": [ ]}"#, Some(vec![])),
            (r#"{"prompt_token_ids": null}"#, None),
            (r#"{"id": "x"}"#, None),
        ] {
            let answer = read(text).unwrap_or_else(|e| panic!("{text}: {e}"));
            assert_eq!(answer.prompt_token_ids, ids, "{text}");
            assert_eq!(
                answer,
                UpstreamAnswer::from(serde_json::from_str::<Value>(text).unwrap())
            );
        }
        assert_eq!(
            read(r#"{"id": "x", "prompt_token_ids": [5]}"#).unwrap()["id"],
            "x"
        );
        for bad in [
            "[-1]",
            "[4294967296]",
            "[1.0]",
            "[1e3]",
            r#"["1"]"#,
            "[[1,2]]",
            "[1,null]",
            "{}",
            r#""1,2""#,
            "7",
        ] {
            let text = format!(r#"{{"prompt_token_ids": {bad}}}"#);
            let err = read(&text).expect_err(&text).to_string();
            assert!(err.contains("prompt_token_ids"), "{text}: {err}");
        }
    }

    proptest::proptest! {
        #[test]
        fn any_ids_in_any_spacing_read_back(
            ids in proptest::collection::vec(proptest::prelude::any::<u32>(), 0..200),
            spaces in proptest::collection::vec("[ \t\n\r]{0,2}", 0..400),
        ) {
            let mut text = String::from("{\"prompt_token_ids\":[");
            for (i, id) in ids.iter().enumerate() {
                let space = |k: usize| spaces.get(k).map(String::as_str).unwrap_or("");
                if i > 0 {
                    text.push(',');
                }
                text.push_str(space(2 * i));
                text.push_str(&id.to_string());
                text.push_str(space(2 * i + 1));
            }
            text.push_str("]}");
            let answer: UpstreamAnswer = serde_json::from_str(&text).unwrap();
            proptest::prop_assert_eq!(answer.prompt_token_ids, Some(ids));
        }
    }
}
