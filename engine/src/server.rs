//! The HTTP shell: axum routes over the [`Engine`].

use crate::access::ReloadAccess;
use crate::api::{self, ApiError, ChatCompletionRequest, CompletionRequest, Include, Meta, Prompt};
use crate::{Engine, EngineError};
use axum::body::Bytes;
use axum::extract::State;
use axum::http::{HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::{Json, Router};
use serde::Deserialize;
use serde_json::{json, Value};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        let status = StatusCode::from_u16(self.status).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR);
        (status, Json(self.body())).into_response()
    }
}

pub fn router(engine: Engine, access: ReloadAccess) -> Router {
    let access = Arc::new(access);
    forgelog_http::telemetry::recorder();
    forgelog_http::telemetry::routes()
        .route("/healthz", get(|| async { "ok" }))
        // vLLM's health check: 200 with an empty body once the model serves.
        .route("/health", get(|| async { "" }))
        .route("/v1/models", get(models))
        .route("/weight_info", get(weight_info))
        .route("/v1/chat/completions", post(chat_completions))
        .route("/v1/completions", post(completions))
        .route("/tokenize", post(tokenize))
        .route(
            "/admin/reload",
            post(move |state, headers, body| reload(state, access.clone(), headers, body)),
        )
        .with_state(engine)
}

async fn models(State(engine): State<Engine>) -> Json<Value> {
    let version = engine.policy_version();
    Json(json!({
        "object": "list",
        "policy_version": version,
        "data": [{
            "id": engine.model_name(),
            "object": "model",
            "owned_by": "forgelog",
            "max_model_len": engine.context_length(),
            "policy_version": version,
        }],
    }))
}

fn meta<'a>(engine: &'a Engine, prefix: &str) -> Meta<'a> {
    static NEXT_ID: AtomicU64 = AtomicU64::new(0);
    let created = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap_or_default()
        .as_secs();
    Meta {
        id: format!("{prefix}-{}", NEXT_ID.fetch_add(1, Ordering::Relaxed)),
        created,
        model: engine.model_name(),
    }
}

/// The version of the weights served, as vLLM's RL routes say it: what a
/// caller that also drives vLLM reads the same way.
async fn weight_info(State(engine): State<Engine>) -> Json<Value> {
    Json(serde_json::json!({"weight_version": engine.policy_version().to_string()}))
}

async fn chat_completions(
    State(engine): State<Engine>,
    body: Bytes,
) -> Result<Json<Value>, ApiError> {
    let request: ChatCompletionRequest = api::parse(&body)?;
    let prompt = engine.chat_prompt(&request.messages, request.tools.as_ref())?;
    let (generation_request, include) = api::generation_request(
        &request.fields,
        prompt.clone(),
        engine.context_length(),
        || engine.vocabulary(),
    )?;
    let generation = engine.generate(generation_request).await?;
    let parse_tools = request
        .tools
        .as_ref()
        .and_then(Value::as_array)
        .is_some_and(|t| !t.is_empty());
    Ok(Json(api::chat_response(
        &meta(&engine, "chatcmpl"),
        &prompt,
        &generation,
        include,
        parse_tools,
    )))
}

/// vLLM's `/tokenize`: the prompt's token ids, no generation.
async fn tokenize(State(engine): State<Engine>, body: Bytes) -> Result<Json<Value>, ApiError> {
    let tokens = match api::parse::<api::TokenizeRequest>(&body)? {
        api::TokenizeRequest::Chat { messages, tools } => {
            engine.chat_prompt(&messages, tools.as_ref())?
        }
        api::TokenizeRequest::Prompt { prompt } => engine.encode(&prompt)?,
    };
    Ok(Json(json!({
        "count": tokens.len(),
        "max_model_len": engine.context_length(),
        "tokens": tokens,
    })))
}

async fn completions(State(engine): State<Engine>, body: Bytes) -> Result<Json<Value>, ApiError> {
    let request: CompletionRequest = api::parse(&body)?;
    let prompt = match request.prompt {
        Prompt::Tokens(ids) => {
            let vocab = engine.vocab_size();
            if let Some(bad) = ids.iter().find(|&&id| id as usize >= vocab) {
                return Err(ApiError::invalid(format!(
                    "token id {bad} is outside the vocabulary of {vocab}"
                )));
            }
            ids
        }
        Prompt::Text(text) => engine.encode(&text)?,
    };
    let (generation_request, include): (_, Include) = api::generation_request(
        &request.fields,
        prompt.clone(),
        engine.context_length(),
        || engine.vocabulary(),
    )?;
    let generation = engine.generate(generation_request).await?;
    Ok(Json(api::completion_response(
        &meta(&engine, "cmpl"),
        &prompt,
        &generation,
        include,
    )))
}

#[derive(Deserialize)]
struct ReloadRequest {
    checkpoint_uri: String,
    version: u64,
}

async fn reload(
    State(engine): State<Engine>,
    access: Arc<ReloadAccess>,
    headers: HeaderMap,
    body: Bytes,
) -> Result<Json<Value>, ApiError> {
    access.check_token(&headers)?;
    let request: ReloadRequest = api::parse(&body)?;
    ReloadAccess::check_version(request.version, engine.policy_version())?;
    let uri = access.check_uri(&request.checkpoint_uri)?;
    engine
        .reload(uri.as_str(), request.version, access.max_checkpoint_bytes)
        .await?;
    Ok(Json(json!({"policy_version": engine.policy_version()})))
}

impl From<EngineError> for ApiError {
    fn from(e: EngineError) -> ApiError {
        match e {
            EngineError::Template(_) | EngineError::Tokenize(_) | EngineError::Checkpoint(_) => {
                ApiError::invalid(e.to_string())
            }
            EngineError::StaleVersion { .. } => ApiError {
                status: 409,
                message: e.to_string(),
                kind: "conflict_error",
                code: None,
            },
            _ => ApiError::internal(e.to_string()),
        }
    }
}
