//! Where `run --train` reads what the learner published: the log. (What the
//! engine serves is its own word: [`crate::upstream::ServedClock`].)

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
