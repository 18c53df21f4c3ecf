//! What a training run's admission reads: the newest version the log says
//! was published ([`LogClock`]), or the version the engine says it serves
//! ([`ServedClock`]).

use crate::LearnerEnd;
use forgelog_deploy::orchestrator::PolicyClock;
use forgelog_stream::{ReplayReader, StreamConfig};
use forgelog_sync::EngineSync;
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

/// The version an engine serves, as admission reads it: the engine's own
/// word, 0 while it cannot be read.
pub struct ServedClock {
    pub engine: EngineSync,
    /// The learner that publishes the versions: no newer one once it stopped.
    pub learner: LearnerEnd,
}

impl PolicyClock for ServedClock {
    fn newest_version(&self) -> Pin<Box<dyn Future<Output = u64> + Send + '_>> {
        Box::pin(async move { self.engine.served().await.ok().flatten().unwrap_or(0) })
    }

    fn stopped(&self) -> Option<String> {
        self.learner.get()
    }
}
