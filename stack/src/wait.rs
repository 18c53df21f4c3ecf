//! The waits of a loop that drives a run: for the consumers' outputs, and
//! for the learner's versions.

use crate::{LearnerEnd, StackError};
use forgelog_deploy::orchestrator::PolicyClock;
use forgelog_schemas::{Event, Topic};
use forgelog_stream::{LogReader, ReplayReader, StreamConfig};
use std::time::{Duration, Instant};

/// The run's events on `topic` once there are at least `count` (read every
/// half second, through one reader, off the runtime that serves the engine
/// and proxy); `None` after `patience`. Only that topic is read: the
/// learner shares the CPU with these polls.
pub async fn events_at_least(
    config: &StreamConfig,
    run: &str,
    topic: Topic,
    count: usize,
    patience: Duration,
) -> Result<Option<Vec<Event>>, StackError> {
    let (config, run) = (config.clone(), run.to_string());
    tokio::task::spawn_blocking(move || {
        let reader = ReplayReader::new(&config)?;
        let started = Instant::now();
        loop {
            let events = reader.run_events(&run, &[topic])?;
            if events.len() >= count {
                return Ok(Some(events));
            }
            if started.elapsed() >= patience {
                return Ok(None);
            }
            std::thread::sleep(Duration::from_millis(500));
        }
    })
    .await
    .map_err(|e| StackError::Io(std::io::Error::other(e)))?
}

/// Until the run has published `versions`, or the learner stopped, or no
/// new version came for `patience` (a step that long is a hung learner; a
/// slow one that keeps publishing is waited for): the newest version
/// published then.
pub async fn versions_published(
    clock: &dyn PolicyClock,
    versions: u64,
    learner: &LearnerEnd,
    patience: Duration,
) -> u64 {
    let mut newest = clock.newest_version().await;
    let mut since = tokio::time::Instant::now();
    while newest < versions && since.elapsed() < patience && learner.get().is_none() {
        tokio::time::sleep(Duration::from_secs(1)).await;
        let now = clock.newest_version().await;
        if now > newest {
            (newest, since) = (now, tokio::time::Instant::now());
        }
    }
    newest
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::future::Future;
    use std::pin::Pin;

    /// A learner publishing a version at each of `at` after `start`.
    struct Publishing {
        start: tokio::time::Instant,
        at: Vec<Duration>,
    }

    impl PolicyClock for Publishing {
        fn newest_version(&self) -> Pin<Box<dyn Future<Output = u64> + Send + '_>> {
            let now = self.start.elapsed();
            Box::pin(async move { self.at.iter().filter(|&&t| t <= now).count() as u64 })
        }
    }

    #[tokio::test(start_paused = true)]
    async fn a_slow_learner_is_waited_for_and_a_stalled_one_is_not() {
        let minutes = |m: u64| Duration::from_secs(60 * m);
        let patience = minutes(10);
        let learner = LearnerEnd::default();
        // A version every 8 minutes: 24 minutes in all, longer than the
        // patience, and every version arrives.
        let slow = Publishing {
            start: tokio::time::Instant::now(),
            at: vec![minutes(8), minutes(16), minutes(24)],
        };
        assert_eq!(versions_published(&slow, 3, &learner, patience).await, 3);
        // One version, then nothing: the wait ends the patience after it.
        let start = tokio::time::Instant::now();
        let stalled = Publishing {
            start,
            at: vec![minutes(2)],
        };
        assert_eq!(versions_published(&stalled, 3, &learner, patience).await, 1);
        let waited = start.elapsed();
        assert!(
            waited >= minutes(12) && waited < minutes(12) + Duration::from_secs(3),
            "{waited:?}"
        );
    }
}
