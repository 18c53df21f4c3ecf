//! Where `run --train` reads the policy version: the log (what the learner
//! published) and the embedded engine (what it serves).

use forgelog_deploy::orchestrator::PolicyClock;
use forgelog_stream::{ReplayReader, StreamConfig};
use std::future::Future;
use std::pin::Pin;

/// The newest version a run published, read from the log (0 before any, or
/// while the log cannot be read).
pub struct LogClock {
    pub config: StreamConfig,
    pub run: String,
}

impl PolicyClock for LogClock {
    fn newest_version(&self) -> Pin<Box<dyn Future<Output = u64> + Send + '_>> {
        let (config, run) = (self.config.clone(), self.run.clone());
        Box::pin(async move {
            let newest = tokio::task::spawn_blocking(move || {
                let reader = ReplayReader::new(&config).ok()?;
                forgelog_stream::newest_policy(&reader, Some(&run)).ok()?
            })
            .await;
            newest.ok().flatten().map_or(0, |p| p.version.max(0) as u64)
        })
    }
}

/// The version the embedded engine serves (its `/v1/models`): what samples
/// the rollouts admission lets start, a moment after it is published.
pub struct EngineClock {
    pub models: String,
    pub http: reqwest::Client,
    /// The learner that publishes the versions: no newer one once it stopped.
    pub learner: crate::learn::LearnerEnd,
}

impl PolicyClock for EngineClock {
    fn newest_version(&self) -> Pin<Box<dyn Future<Output = u64> + Send + '_>> {
        Box::pin(async move {
            let models: Option<serde_json::Value> = match self.http.get(&self.models).send().await {
                Ok(r) => r.json().await.ok(),
                Err(_) => None,
            };
            models
                .and_then(|m| m["data"][0]["policy_version"].as_u64())
                .unwrap_or(0)
        })
    }

    fn stopped(&self) -> Option<String> {
        self.learner.get()
    }
}
