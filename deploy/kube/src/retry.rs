//! Calls to the API server, retried while the server is overloaded or
//! failing (429, 5xx, transport), never on an answer that will not change.

use std::future::Future;
use std::time::Duration;

#[derive(Debug, thiserror::Error)]
pub enum KubeError {
    #[error("the API server answered {code} {reason}: {message}")]
    Api {
        code: u16,
        reason: String,
        message: String,
    },
    #[error("the API server: {0}")]
    Client(String),
    #[error("run {0} has a live orchestrator (its lease is being renewed)")]
    Busy(String),
}

impl From<kube::Error> for KubeError {
    fn from(e: kube::Error) -> KubeError {
        match e {
            kube::Error::Api(s) => KubeError::Api {
                code: s.code,
                reason: s.reason.clone(),
                message: s.message.clone(),
            },
            other => KubeError::Client(other.to_string()),
        }
    }
}

impl KubeError {
    fn transient(&self) -> bool {
        match self {
            KubeError::Api { code, .. } => *code == 429 || *code >= 500,
            KubeError::Client(_) => true,
            KubeError::Busy(_) => false,
        }
    }
}

/// Tries `call` until it succeeds or fails for good: up to 10 times, from
/// 100 ms apart doubling to 5 s (about 25 s in all).
pub async fn retrying<T, F, Fut>(mut call: F) -> Result<T, KubeError>
where
    F: FnMut() -> Fut,
    Fut: Future<Output = Result<T, kube::Error>>,
{
    let mut wait = Duration::from_millis(100);
    let mut tries = 0;
    loop {
        match call().await.map_err(KubeError::from) {
            Ok(v) => return Ok(v),
            Err(e) if e.transient() && tries < 9 => {
                tries += 1;
                tracing::debug!(error = %e, tries, "API server call retried");
                tokio::time::sleep(wait).await;
                wait = (wait * 2).min(Duration::from_secs(5));
            }
            Err(e) => return Err(e),
        }
    }
}
