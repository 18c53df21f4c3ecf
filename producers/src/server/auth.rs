//! Who is calling: a harness by its session key, the orchestrator by the admin token.

use super::{admin_error, ProxyState};
use axum::extract::{Request, State};
use axum::http::{HeaderMap, StatusCode};
use axum::middleware::Next;
use axum::response::Response;
use std::sync::Arc;

/// The session key from `Authorization: Bearer`, `x-api-key`, `x-goog-api-key` or Gemini's `?key=`.
pub(super) fn api_key<'a>(headers: &'a HeaderMap, query: Option<&'a str>) -> Option<&'a str> {
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

/// The session key request `req` carries: in its headers, or Gemini's `?key=`
/// in its query (before the body is read, so any handler or layer may ask).
pub(super) fn request_key(req: &Request) -> Option<&str> {
    let query_key = req
        .uri()
        .query()
        .and_then(|q| q.split('&').find_map(|kv| kv.strip_prefix("key=")));
    api_key(req.headers(), query_key)
}

/// Lets through only requests with the admin token (all, when the proxy has
/// none), before their body is read.
pub(super) async fn admin_only(
    State(st): State<Arc<ProxyState>>,
    req: Request,
    next: Next,
) -> Response {
    if !is_admin(&st, req.headers()) {
        return admin_error(StatusCode::UNAUTHORIZED, "admin token required");
    }
    next.run(req).await
}

/// Whether the request carries the admin token (any request, when the proxy has none).
pub(super) fn is_admin(st: &ProxyState, headers: &HeaderMap) -> bool {
    match &st.config.admin_token {
        None => true,
        Some(t) => api_key(headers, None).is_some_and(|k| forgelog_http::token_matches(k, t)),
    }
}
