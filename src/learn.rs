//! The learning side of a run in this process (`up`, `run --train`): the
//! consumers (trajectories, the reward join) and, when training, the GRPO
//! learner, whose published versions the engine follows.

use anyhow::Result;
use forgelog_consumers::{run_consumers, Consumers, RewardConfig, ShellOptions};
use forgelog_stream::StreamConfig;
use std::path::Path;
use std::sync::atomic::Ordering;

/// `forgelog train`'s arguments, parsed as its command line would be.
#[derive(clap::Parser)]
struct TrainCli {
    #[command(flatten)]
    train: forgelog_trainer::TrainArgs,
}

/// The learner of `run` on `model`: checkpoints and its spool under `home`,
/// then `extra` flags as `forgelog train` takes them.
pub fn trainer_args(
    model: &str,
    config: &StreamConfig,
    run: &str,
    home: &Path,
    extra: &[String],
) -> Result<forgelog_trainer::TrainArgs> {
    use clap::Parser;
    std::fs::create_dir_all(home)?;
    let home = std::fs::canonicalize(home)?;
    let mut argv = vec![
        "train".to_string(),
        "--model".into(),
        model.into(),
        "--brokers".into(),
        config.brokers.clone(),
        "--run".into(),
        run.into(),
        "--checkpoints".into(),
        format!("file://{}/checkpoints/{run}", home.display()),
        "--spool".into(),
        home.join("trainer-spool").join(run).display().to_string(),
    ];
    argv.extend(extra.iter().cloned());
    Ok(TrainCli::try_parse_from(argv)?.train)
}

/// The consumers and (when training) the learner, running until [`stop`](Learning::stop).
pub struct Learning {
    stop_consumers: std::sync::Arc<std::sync::atomic::AtomicBool>,
    consumers: tokio::task::JoinHandle<()>,
    trainer: Option<tokio::task::JoinHandle<Result<(), forgelog_trainer::TrainError>>>,
}

impl Learning {
    /// Starts the consumers (state in `state`) and, with `train`, the learner.
    pub fn start(
        config: &StreamConfig,
        state: &Path,
        rewards: RewardConfig,
        train: Option<forgelog_trainer::TrainArgs>,
    ) -> Learning {
        let options = ShellOptions::new(state);
        let stop_consumers = options.stop.clone();
        let consumers = {
            let config = config.clone();
            tokio::spawn(async move {
                if let Err(e) = run_consumers(&config, Consumers::All, &options, rewards).await {
                    eprintln!("consumers stopped: {e}");
                }
            })
        };
        eprintln!(
            "consumers trajectories, rewards (state in {})",
            state.display()
        );
        let trainer = train.map(|train| {
            eprintln!(
                "trainer   GRPO on {}'s groups, checkpoints in {}",
                train.run,
                train.checkpoints.as_deref().unwrap_or("?")
            );
            tokio::spawn(forgelog_trainer::run(train))
        });
        Learning {
            stop_consumers,
            consumers,
            trainer,
        }
    }

    /// Stops the learner (what it published is in the log; a restart
    /// resumes from its last checkpoint), then the consumers at a checkpoint.
    pub async fn stop(self) {
        if let Some(t) = self.trainer {
            t.abort();
            if let Ok(Ok(Err(e))) = tokio::time::timeout(std::time::Duration::from_secs(5), t).await
            {
                eprintln!("trainer stopped: {e}");
            }
        }
        self.stop_consumers.store(true, Ordering::Relaxed);
        let _ = self.consumers.await;
    }
}
