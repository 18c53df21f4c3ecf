//! Who is calling: a harness by its session key, the orchestrator by the admin token.

use super::ProxyState;
use axum::http::HeaderMap;

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

/// Whether the request carries the admin token (any request, when the proxy has none).
pub(super) fn is_admin(st: &ProxyState, headers: &HeaderMap) -> bool {
    match &st.config.admin_token {
        None => true,
        Some(t) => api_key(headers, None) == Some(t.as_str()),
    }
}
