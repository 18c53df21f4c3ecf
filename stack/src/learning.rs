//! The learning side of a run in this process (`up`, `run --train`): the
//! consumers (trajectories, the reward join) and, when training, the GRPO
//! learner, whose published versions the engine follows.

use forgelog_consumers::{run_consumers, Consumers, RewardConfig, ShellOptions};
use forgelog_stream::StreamConfig;
use std::path::Path;
use std::sync::atomic::Ordering;

/// The learner of `run` on `model`: checkpoints (`home/checkpoints/{run}`,
/// the five newest versions) and its spool under `home`; every other
/// setting at `forgelog train`'s default, for the caller to set by field.
pub fn learner_settings(
    model: &str,
    config: &StreamConfig,
    run: &str,
    home: &Path,
) -> std::io::Result<forgelog_trainer::TrainArgs> {
    std::fs::create_dir_all(home)?;
    let home = std::fs::canonicalize(home)?;
    Ok(forgelog_trainer::TrainArgs {
        model: model.to_string(),
        brokers: config.brokers.clone(),
        run: run.to_string(),
        // The learner keeps each run's versions in a folder of the run's name.
        checkpoints: Some(format!("file://{}/checkpoints", home.display())),
        spool: Some(home.join("trainer-spool").join(run)),
        // A version with its moments is 1.6 GB for SmolLM2: a 30-step demo
        // kept whole filled a 40 GB disk. The loops keep the newest five.
        keep_versions: Some(5),
        ..Default::default()
    })
}

/// Why the learner stopped, once it has (it runs until told to stop, or to
/// its `--max-steps`), and whether it failed.
#[derive(Clone)]
pub struct LearnerEnd(std::sync::Arc<tokio::sync::watch::Sender<Option<(String, bool)>>>);

impl Default for LearnerEnd {
    fn default() -> LearnerEnd {
        LearnerEnd(std::sync::Arc::new(tokio::sync::watch::Sender::new(None)))
    }
}

impl LearnerEnd {
    pub fn get(&self) -> Option<String> {
        self.0.borrow().as_ref().map(|(why, _)| why.clone())
    }

    fn set(&self, why: String, failed: bool) {
        self.0.send_replace(Some((why, failed)));
    }

    /// Resolves once the learner has failed (an error, a panic), with why;
    /// never while it runs or after it reached its last step. A loop that
    /// waits for versions waits on this beside them: a failed learner
    /// publishes none (found by CI, where a full disk failed a checkpoint
    /// and `up --demo --train` waited on).
    pub async fn failed(&self) -> String {
        let mut seen = self.0.subscribe();
        let why = seen
            .wait_for(|end| end.as_ref().is_some_and(|(_, failed)| *failed))
            .await
            .map(|end| end.as_ref().map(|(why, _)| why.clone()).unwrap_or_default());
        match why {
            Ok(why) => why,
            // The sender lives in `self`: it cannot be dropped while we wait.
            Err(_) => std::future::pending().await,
        }
    }
}

/// The consumers and (when training) the learner, running until [`stop`](Learning::stop).
pub struct Learning {
    stop_consumers: std::sync::Arc<std::sync::atomic::AtomicBool>,
    consumers: tokio::task::JoinHandle<()>,
    /// The learner's task and the task that records how it ended.
    trainer: Option<(tokio::task::AbortHandle, tokio::task::JoinHandle<()>)>,
    /// Set when the learner stops on its own (an error, a panic).
    pub learner_end: LearnerEnd,
}

impl Learning {
    /// Starts the consumers of `run` (state in `state`) and, with `train`,
    /// the learner.
    pub fn start(
        config: &StreamConfig,
        run: &str,
        state: &Path,
        rewards: RewardConfig,
        train: Option<forgelog_trainer::TrainArgs>,
    ) -> Learning {
        let options = ShellOptions {
            run: Some(run.to_string()),
            ..ShellOptions::new(state)
        };
        let stop_consumers = options.stop.clone();
        let consumers = {
            let config = config.clone();
            tokio::spawn(async move {
                if let Err(e) =
                    run_consumers(&config, Consumers::All, &options, rewards, false).await
                {
                    tracing::error!("consumers stopped: {e}");
                }
            })
        };
        let learner_end = LearnerEnd::default();
        let trainer = train.map(|train| {
            let end = learner_end.clone();
            let learner = tokio::spawn(forgelog_trainer::run(train));
            let abort = learner.abort_handle();
            let watch = tokio::spawn(async move {
                let (why, failed) = match learner.await {
                    Ok(Ok(())) => ("the learner exited".to_string(), false),
                    Ok(Err(e)) => (format!("the learner failed: {e}"), true),
                    Err(e) if e.is_cancelled() => return, // stopped by `stop`
                    Err(_) => ("the learner panicked".to_string(), true),
                };
                match failed {
                    true => tracing::error!("trainer stopped: {why}"),
                    false => tracing::info!("trainer stopped: {why}"),
                }
                end.set(why, failed);
            });
            (abort, watch)
        });
        Learning {
            stop_consumers,
            consumers,
            trainer,
            learner_end,
        }
    }

    /// Stops the learner (what it published is in the log; a restart
    /// resumes from its last checkpoint), then the consumers at a checkpoint.
    pub async fn stop(self) {
        if let Some((learner, watch)) = self.trainer {
            learner.abort();
            let _ = tokio::time::timeout(std::time::Duration::from_secs(5), watch).await;
        }
        self.stop_consumers.store(true, Ordering::Relaxed);
        let _ = self.consumers.await;
    }
}

#[cfg(test)]
mod tests {
    use super::LearnerEnd;
    use std::time::Duration;

    /// A loop waits on `failed` beside the versions: it resolves for a
    /// learner that failed, with why, and never for one that exited.
    #[tokio::test]
    async fn a_failed_learner_is_told_and_one_that_exited_is_not() {
        let exited = LearnerEnd::default();
        exited.set("the learner exited".into(), false);
        assert_eq!(exited.get().as_deref(), Some("the learner exited"));
        let waited = tokio::time::timeout(Duration::from_millis(200), exited.failed()).await;
        assert!(waited.is_err(), "an exit is not a failure");

        let failed = LearnerEnd::default();
        let waiting = tokio::spawn({
            let failed = failed.clone();
            async move { failed.failed().await }
        });
        failed.set("the learner failed: disk full".into(), true);
        assert_eq!(waiting.await.unwrap(), "the learner failed: disk full");
    }
}
