//! Several proxy replicas behind one Service. Each session lives on one
//! replica, its owner; a request that reaches another replica is passed on to
//! the owner, in one hop, body and answer streamed.
//!
//! Who owns what is a function of the session id (the session API names it,
//! or names the run and rollout it derives from) and of the session key (a
//! harness's calls carry only that): a replica creates only the sessions
//! whose id it owns, and draws their keys until one hashes to itself, so both
//! rules agree without a shared table. A restarted replica takes over, from
//! the log, the open sessions it owns. The replica list is fixed for a run: a
//! replica that is down makes its sessions answer 503 (clients retry) until
//! it is back.

use super::{admin_error, auth, ProxyState, SESSION_BODY_LIMIT};
use crate::sessions::{key_sha256, session_id};
use axum::body::Body;
use axum::extract::{Request, State};
use axum::http::{header, HeaderMap, HeaderName, HeaderValue, StatusCode};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use futures::TryStreamExt;
use sha2::{Digest, Sha256};
use std::sync::Arc;

/// Marks a request passed on by a replica: its receiver serves it, whatever
/// it thinks of ownership (a loop is impossible).
pub const HOP: &str = "x-forgelog-replica-hop";

/// The proxy replicas of one deployment (their base URLs, in a fixed order)
/// and which one this is.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Replicas {
    pub urls: Vec<String>,
    pub index: usize,
}

impl Replicas {
    pub fn new(urls: Vec<String>, index: usize) -> Result<Replicas, String> {
        if index >= urls.len() {
            return Err(format!(
                "replica index {index} is not one of the {} replicas listed",
                urls.len()
            ));
        }
        Ok(Replicas { urls, index })
    }

    /// The replica that holds session `id`.
    pub fn owner_of_session(&self, id: &str) -> usize {
        self.bucket(id.as_bytes())
    }

    /// The replica that holds the session whose key hashes to `key_sha256`.
    pub fn owner_of_key(&self, key_sha256: &str) -> usize {
        self.bucket(key_sha256.as_bytes())
    }

    pub fn owns_session(&self, id: &str) -> bool {
        self.owner_of_session(id) == self.index
    }

    pub fn owns_key(&self, key_sha256: &str) -> bool {
        self.owner_of_key(key_sha256) == self.index
    }

    fn bucket(&self, what: &[u8]) -> usize {
        let digest = Sha256::digest(what);
        let head = u64::from_be_bytes(digest[..8].try_into().expect("8 bytes"));
        (head % self.urls.len() as u64) as usize
    }
}

/// The rollout a session-API body names (`POST /sessions`, `/sessions/abandon`).
#[derive(serde::Deserialize)]
struct RolloutRef {
    run_id: Option<String>,
    rollout_id: String,
}

/// Passes a request on to the replica that owns its session; serves it here
/// when this replica does, or when it names no session.
pub(super) async fn to_owner(
    State(st): State<Arc<ProxyState>>,
    req: Request,
    next: Next,
) -> Response {
    let Some(replicas) = st.config.replicas.as_ref().filter(|r| r.urls.len() > 1) else {
        return next.run(req).await;
    };
    if req.headers().contains_key(HOP) {
        return next.run(req).await;
    }
    let path = req.uri().path().to_string();
    let (owner, req) = if path.starts_with("/sessions") {
        // The admin token before any body is read, as on a single proxy.
        if !auth::is_admin(&st, req.headers()) {
            return admin_error(StatusCode::UNAUTHORIZED, "admin token required");
        }
        match path
            .strip_prefix("/sessions/")
            .and_then(|p| p.strip_suffix("/finish"))
        {
            Some(id) => (replicas.owner_of_session(id), req),
            None => {
                let (parts, body) = req.into_parts();
                let Ok(bytes) = axum::body::to_bytes(body, SESSION_BODY_LIMIT).await else {
                    return admin_error(StatusCode::PAYLOAD_TOO_LARGE, "session request too large");
                };
                let owner = serde_json::from_slice::<RolloutRef>(&bytes)
                    .ok()
                    .and_then(|r| {
                        let run = r.run_id.or_else(|| st.config.run_id.clone())?;
                        Some(replicas.owner_of_session(&session_id(&run, &r.rollout_id)))
                    });
                let req = Request::from_parts(parts, Body::from(bytes));
                match owner {
                    Some(owner) => (owner, req),
                    // Malformed: the handler here says what is wrong.
                    None => return next.run(req).await,
                }
            }
        }
    } else {
        match auth::request_key(&req) {
            Some(key) => (replicas.owner_of_key(&key_sha256(key)), req),
            None => return next.run(req).await,
        }
    };
    if owner == replicas.index {
        return next.run(req).await;
    }
    forward(&st, replicas, owner, req).await
}

/// Headers that belong to one connection, not to the request.
fn hop_by_hop(name: &HeaderName) -> bool {
    matches!(
        name.as_str(),
        "connection"
            | "keep-alive"
            | "proxy-authenticate"
            | "proxy-authorization"
            | "te"
            | "trailer"
            | "transfer-encoding"
            | "upgrade"
            | "host"
    )
}

fn end_to_end(headers: &HeaderMap) -> HeaderMap {
    headers
        .iter()
        .filter(|(name, _)| !hop_by_hop(name))
        .map(|(n, v)| (n.clone(), v.clone()))
        .collect()
}

async fn forward(st: &ProxyState, replicas: &Replicas, owner: usize, req: Request) -> Response {
    let base = replicas.urls[owner].trim_end_matches('/');
    let url = format!(
        "{base}{}",
        req.uri().path_and_query().map_or("/", |p| p.as_str())
    );
    let (parts, body) = req.into_parts();
    let mut headers = end_to_end(&parts.headers);
    headers.remove(header::CONTENT_LENGTH);
    headers.insert(HOP, HeaderValue::from(replicas.index));
    let sent = st
        .replica_client
        .request(parts.method, &url)
        .headers(headers)
        .body(reqwest::Body::wrap_stream(body.into_data_stream()))
        .send()
        .await;
    match sent {
        Ok(answer) => {
            metrics::counter!("forgelog_proxy_forwarded_total", "replica" => owner.to_string())
                .increment(1);
            let status = answer.status();
            let headers = end_to_end(answer.headers());
            let body = Body::from_stream(answer.bytes_stream().map_err(std::io::Error::other));
            let mut response = (status, body).into_response();
            *response.headers_mut() = headers;
            response
        }
        Err(e) => {
            metrics::counter!("forgelog_proxy_forward_failures_total", "replica" => owner.to_string())
                .increment(1);
            tracing::warn!(replica = owner, %url, error = %e, "the replica that holds this session is unreachable");
            let mut response = (
                StatusCode::SERVICE_UNAVAILABLE,
                axum::Json(serde_json::json!({"error": {
                    "type": "replica_unavailable",
                    "message": format!("proxy replica {owner} ({base}), which holds this session, is unreachable: {e}; retry"),
                }})),
            )
                .into_response();
            response
                .headers_mut()
                .insert(header::RETRY_AFTER, HeaderValue::from_static("1"));
            response
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ownership_is_spread_and_the_same_on_every_replica() {
        let urls: Vec<String> = (0..3).map(|i| format!("http://proxy-{i}:8100")).collect();
        let replicas: Vec<Replicas> = (0..3)
            .map(|i| Replicas::new(urls.clone(), i).unwrap())
            .collect();
        let mut owned = [0usize; 3];
        for n in 0..3000 {
            let id = session_id("run", &format!("rollout-{n}"));
            let owners: Vec<usize> = replicas.iter().map(|r| r.owner_of_session(&id)).collect();
            assert!(
                owners.iter().all(|o| *o == owners[0]),
                "replicas disagree on {id}"
            );
            assert_eq!(
                replicas.iter().filter(|r| r.owns_session(&id)).count(),
                1,
                "exactly one replica owns {id}"
            );
            owned[owners[0]] += 1;
        }
        assert!(owned.iter().all(|&n| (800..1200).contains(&n)), "{owned:?}");
        assert!(Replicas::new(urls, 3).is_err());
    }
}
