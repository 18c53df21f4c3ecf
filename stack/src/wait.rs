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

/// How a training run's learner and engine ended: the newest version the
/// learner published, and whether the engine (an external one, kept in
/// sync) serves it.
#[derive(Debug, Clone, PartialEq)]
pub struct LastVersions {
    pub newest: u64,
    pub served: Option<Served>,
}

/// Whether an engine kept in sync serves the newest version.
#[derive(Debug, Clone, PartialEq)]
pub enum Served {
    /// It does; how long its syncs took, when any ran.
    Yes(Option<String>),
    /// Its sync ended, with why.
    SyncEnded(String),
    /// Not after the patience.
    Late(Duration),
}

/// The run's last versions once the learner has them (an idle flush takes
/// a last short step), before the engine stops serving; and an external
/// engine serving the last one, as it says. A learner that published fewer
/// than `steps` versions (it failed, or none came for `patience`) is an
/// error with why.
pub async fn last_versions(
    clock: &dyn PolicyClock,
    steps: u64,
    learner: &LearnerEnd,
    engine: Option<&forgelog_sync::EngineSync>,
    sync: &mut Option<crate::SyncTask>,
    patience: Duration,
) -> Result<LastVersions, StackError> {
    let newest = versions_published(clock, steps, learner, patience).await;
    if newest < steps {
        let why = learner.get().unwrap_or_else(|| {
            format!(
                "the learner published no version for {} minutes",
                patience.as_secs() / 60
            )
        });
        return Err(StackError::Late(format!(
            "{why}: {newest} of {steps} versions published"
        )));
    }
    let (Some(engine), Some(times)) = (engine, sync.as_ref().map(|s| s.times.clone())) else {
        return Ok(LastVersions {
            newest,
            served: None,
        });
    };
    let served = tokio::select! {
        true = crate::until_served(engine, newest) => Served::Yes(times.summary()),
        e = crate::ended(sync) => Served::SyncEnded(e),
        _ = tokio::time::sleep(patience) => Served::Late(patience),
    };
    Ok(LastVersions {
        newest,
        served: Some(served),
    })
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

    #[tokio::test(start_paused = true)]
    async fn the_last_versions_are_waited_for_and_too_few_are_an_error() {
        let minutes = |m: u64| Duration::from_secs(60 * m);
        let learner = LearnerEnd::default();
        let all = Publishing {
            start: tokio::time::Instant::now(),
            at: vec![minutes(1), minutes(3)],
        };
        let last = last_versions(&all, 2, &learner, None, &mut None, minutes(10)).await;
        let expected = LastVersions {
            newest: 2,
            served: None,
        };
        assert_eq!(last.unwrap(), expected);
        let short = Publishing {
            start: tokio::time::Instant::now(),
            at: vec![minutes(1)],
        };
        let err = last_versions(&short, 2, &learner, None, &mut None, minutes(10))
            .await
            .unwrap_err()
            .to_string();
        let said = "the learner published no version for 10 minutes: 1 of 2 versions published";
        assert_eq!(err, said);
    }
}
