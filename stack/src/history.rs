//! What the log holds of a run, read off the async runtime (the reads block).

use crate::StackError;
use forgelog_deploy_core::RunHistory;
use forgelog_schemas::{Event, Topic};
use forgelog_stream::{LogReader, ReplayReader, StreamConfig};

/// `run`'s events on `topics`, as far as the log holds them.
pub async fn run_events(
    config: &StreamConfig,
    run: &str,
    topics: &'static [Topic],
) -> Result<Vec<Event>, StackError> {
    let (config, run) = (config.clone(), run.to_string());
    let read = move || Ok(ReplayReader::new(&config)?.run_events(&run, topics)?);
    tokio::task::spawn_blocking(read)
        .await
        .map_err(|e| StackError::Io(std::io::Error::other(e)))?
}

/// The run's rollouts and verdicts already in the log: where a restarted
/// `forgelog run --run R` resumes.
pub async fn run_history(config: &StreamConfig, run: &str) -> Result<RunHistory, StackError> {
    let mut history = RunHistory::default();
    for e in run_events(config, run, &[Topic::Rollouts, Topic::Rewards]).await? {
        history.observe(&e);
    }
    Ok(history)
}
