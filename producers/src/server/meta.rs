//! What is not a model call: the model list, Anthropic's token counter, the
//! metrics, and the answer to anything else.

use super::auth::{api_key, request_key};
use super::body::read_body;
use super::{admin_error, error_response, ProxyState};
use crate::upstream::{rl_sampling, upstream_request, Upstream};
use axum::extract::{Request, State};
use axum::http::{HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::Json;
use forgelog_dialects::dialect::*;
use forgelog_schemas::SamplingParams;
use serde_json::{json, Value};
use std::sync::Arc;

/// Anthropic's token counter: the upstream's prompt token count for the
/// request. It holds one of the session's in-flight slots, as a call does.
/// vLLM's `/tokenize` counts without generating; an upstream without one is
/// asked for a 1-token completion instead, which is model work: it takes a
/// model call from the session's budget (refused once spent). Not a turn of
/// the conversation, so not an event of the log:
/// `forgelog_proxy_token_counts_total` counts them.
pub(super) async fn count_tokens(
    State(st): State<Arc<ProxyState>>,
    headers: HeaderMap,
    req: Request,
) -> Response {
    type D = AnthropicDialect;
    // Who asks, before a byte of the body is read.
    let Some(session) = api_key(&headers, None).and_then(|k| st.sessions.by_key(k)) else {
        return error_response::<D>(&DialectError::new(
            ErrorKind::Authentication,
            "unknown or ended session key",
        ));
    };
    let Ok(_slot) = session.in_flight.clone().try_acquire_owned() else {
        return error_response::<D>(&DialectError::new(
            ErrorKind::RateLimited,
            format!(
                "more than {} calls in flight in this session",
                session.max_in_flight
            ),
        ));
    };
    let body = match read_body(&headers, req.into_body(), st.config.body_limit).await {
        Ok(b) => b,
        Err(e) => return error_response::<D>(&e),
    };
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
    let upstream = upstream_request(&req, &sent, &st.probed().await.model, &Default::default());
    let tokenized = match &st.upstream {
        Upstream::Live(client) => {
            let body = &upstream.body;
            let ask = json!({"model": body["model"], "messages": body["messages"], "tools": body.get("tools")});
            client.tokenize(&ask).await
        }
        Upstream::Recorded(_) => Ok(None),
    };
    let counted = match tokenized {
        Ok(Some(n)) => Ok(n),
        Ok(None) if !session.take_model_call() => {
            return error_response::<D>(&DialectError::new(
                ErrorKind::RateLimited,
                "this session's model calls are used up (counting tokens here takes one)",
            ))
        }
        Ok(None) => st.upstream.chat(None, &upstream).await.map(|a| {
            a["usage"]["prompt_tokens"]
                .as_u64()
                .or_else(|| a.prompt_token_ids.as_ref().map(|v| v.len() as u64))
                .unwrap_or(0)
        }),
        Err(e) => Err(e),
    };
    match counted {
        Ok(n) => {
            metrics::counter!("forgelog_proxy_token_counts_total").increment(1);
            Json(json!({"input_tokens": n})).into_response()
        }
        Err(e) => error_response::<D>(&e.dialect_error()),
    }
}

/// Anything else. Clients probe their base URL for reachability before they
/// call it (Claude Code: `HEAD /api/hello`): a HEAD anywhere is answered 200,
/// the rest 404 with the path named, logged, and kept on the session whose
/// key it carries (its finish names them: what a harness expected).
pub(super) async fn unrouted(State(st): State<Arc<ProxyState>>, req: Request) -> Response {
    if req.method() == axum::http::Method::HEAD {
        tracing::debug!(path = %req.uri().path(), "HEAD probe");
        return StatusCode::OK.into_response();
    }
    tracing::warn!(method = %req.method(), path = %req.uri().path(), "no such route");
    if let Some(session) = request_key(&req).and_then(|k| st.sessions.by_key(k)) {
        session.note_unrouted(&format!("{} {}", req.method(), req.uri().path()));
    }
    admin_error(
        StatusCode::NOT_FOUND,
        format!("no route {} {}", req.method(), req.uri().path()),
    )
}

pub(super) async fn models(State(st): State<Arc<ProxyState>>) -> Response {
    let probe = st.probed().await;
    let id = if probe.model.is_empty() {
        "forgelog"
    } else {
        &probe.model
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

pub(super) async fn prometheus(State(st): State<Arc<ProxyState>>) -> String {
    metrics::gauge!("forgelog_proxy_sessions").set(st.sessions.len() as f64);
    st.metrics.render()
}
