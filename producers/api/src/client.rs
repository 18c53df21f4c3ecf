//! A typed client of the session API.

use crate::{
    AbandonAttempt, ApiError, Finish, Finished, NewSession, ReplaySession, SessionCreated,
};
use serde::de::DeserializeOwned;
use serde::Serialize;

#[derive(Debug, thiserror::Error)]
pub enum ClientError {
    #[error("{what}: cannot reach the proxy at {url}: {source}")]
    Transport {
        what: &'static str,
        url: String,
        source: reqwest::Error,
    },
    #[error("{what}: the proxy answered {status}: {message}")]
    Refused {
        what: &'static str,
        status: u16,
        message: String,
    },
    #[error("{what}: the proxy's answer is not the expected JSON ({reason}): {body}")]
    Decode {
        what: &'static str,
        reason: String,
        body: String,
    },
}

impl ClientError {
    /// The HTTP status the proxy answered, when it answered.
    pub fn status(&self) -> Option<u16> {
        match self {
            ClientError::Refused { status, .. } => Some(*status),
            _ => None,
        }
    }
}

/// Creates and finishes sessions on a proxy (live or `replay serve`).
#[derive(Debug, Clone)]
pub struct SessionClient {
    base: String,
    admin_token: Option<String>,
    http: reqwest::Client,
}

impl SessionClient {
    /// `base` is the proxy's base URL, e.g. `http://127.0.0.1:8100`.
    pub fn new(base: impl Into<String>, admin_token: Option<String>) -> SessionClient {
        SessionClient::with_http(base, admin_token, reqwest::Client::new())
    }

    pub fn with_http(
        base: impl Into<String>,
        admin_token: Option<String>,
        http: reqwest::Client,
    ) -> SessionClient {
        SessionClient {
            base: base.into().trim_end_matches('/').to_string(),
            admin_token,
            http,
        }
    }

    pub fn base_url(&self) -> &str {
        &self.base
    }

    /// `POST /sessions`.
    pub async fn create(&self, session: &NewSession) -> Result<SessionCreated, ClientError> {
        self.post("creating a session", "/sessions".into(), session)
            .await
    }

    /// `POST /sessions` on `replay serve`: a session that re-runs a recorded one.
    pub async fn replay(&self, request: &ReplaySession) -> Result<SessionCreated, ClientError> {
        self.post("creating a replay session", "/sessions".into(), request)
            .await
    }

    /// [`SessionClient::replay`] of recorded session or rollout `id`.
    pub async fn replay_of(&self, id: &str) -> Result<SessionCreated, ClientError> {
        self.replay(&ReplaySession::Of {
            replay_of: id.to_string(),
        })
        .await
    }

    /// `POST /sessions/{id}/finish`.
    pub async fn finish(&self, session_id: &str, finish: &Finish) -> Result<Finished, ClientError> {
        self.post(
            "finishing a session",
            format!("/sessions/{session_id}/finish"),
            finish,
        )
        .await
    }

    /// `POST /sessions/abandon`.
    pub async fn abandon(&self, attempt: &AbandonAttempt) -> Result<Finished, ClientError> {
        self.post("abandoning an attempt", "/sessions/abandon".into(), attempt)
            .await
    }

    async fn post<T: DeserializeOwned>(
        &self,
        what: &'static str,
        path: String,
        body: &impl Serialize,
    ) -> Result<T, ClientError> {
        let url = format!("{}{path}", self.base);
        let transport = |source| ClientError::Transport {
            what,
            url: url.clone(),
            source,
        };
        let mut req = self.http.post(&url).json(body);
        if let Some(token) = &self.admin_token {
            req = req.bearer_auth(token);
        }
        let resp = req.send().await.map_err(transport)?;
        let status = resp.status();
        let text = resp.text().await.map_err(transport)?;
        if !status.is_success() {
            let message = serde_json::from_str::<ApiError>(&text)
                .map(|e| e.error)
                .unwrap_or(text);
            return Err(ClientError::Refused {
                what,
                status: status.as_u16(),
                message,
            });
        }
        serde_json::from_str(&text).map_err(|e| ClientError::Decode {
            what,
            reason: e.to_string(),
            body: text,
        })
    }
}
