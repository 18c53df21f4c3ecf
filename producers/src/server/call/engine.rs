//! A call the engine answers: the engine (or adapter) asked, the prompt
//! made by the proxy where it renders (token in), the policy version found
//! out, and the answer recorded.

use super::token_in::{made, tools_of};
use super::Call;
use crate::server::{clamp_max_tokens, now_ms};
use crate::upstream::{
    completion_request, read_response, rl_sampling, upstream_request, Sampled, TokenIn, Upstream,
};
use axum::body::Bytes;
use forgelog_dialects::canonical::{ChatRequest, ChatResponse};
use forgelog_dialects::dialect::*;
use forgelog_dialects::splice::{self, AnsweredCall};
use forgelog_schemas::{CallFinished, CallStatus, SamplingParams, Usage};
use std::sync::atomic::Ordering;
use std::time::Instant;

/// What an engine's answer came with, for its record.
struct EngineAnswer<'a> {
    req: &'a ChatRequest,
    sent: SamplingParams,
    upstream: &'a crate::upstream::UpstreamRequest,
    answer: &'a crate::upstream::UpstreamAnswer,
    resp: &'a ChatResponse,
    response_body: &'a Bytes,
}

impl Call {
    /// Asks the upstream, records the answer; returns it and the harness's response body.
    pub(super) async fn complete<D: DialectAdapter>(
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
        let extra = &self.st.config.extra_body;
        let upstream = upstream_request(req, &sent, model, extra);
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
                    let body =
                        completion_request(&prompt.ids, &upstream.body, probe.context, extra);
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
}
