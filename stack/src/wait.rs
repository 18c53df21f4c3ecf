//! The waits of a loop that drives a run: for the consumers' outputs, and
//! for the learner's versions.

use crate::{LearnerEnd, LogClock, StackError};
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

/// Until the run has published `versions` (or the learner stopped, or
/// `deadline` passed): the newest version published then.
pub async fn versions_published(
    clock: &LogClock,
    versions: u64,
    learner: &LearnerEnd,
    deadline: Instant,
) -> u64 {
    let mut newest = clock.newest_version().await;
    while newest < versions && Instant::now() < deadline && learner.get().is_none() {
        tokio::time::sleep(Duration::from_secs(1)).await;
        newest = clock.newest_version().await;
    }
    newest
}
