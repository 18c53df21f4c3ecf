//! The consumers of one process (`forgelog consume`, `forgelog up`): each
//! core in its shell, on a blocking thread, with its own state directory.

use crate::scale_out;
use crate::shell::{self, RunStats, ShellError, ShellOptions};
use crate::{Processor, RewardConfig, RewardJoin, TrajectoryBuilder};
use forgelog_stream::StreamConfig;

/// Which consumers a process runs.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Consumers {
    Trajectories,
    Rewards,
    All,
}

/// Runs `which` over the log until idle (`options.exit_when_idle`) or until
/// `options.stop`. Each keeps its state in `options.state_dir/<name>`. In
/// batch use the reward join starts when the trees are done, so that each
/// sees its whole input in one pass; otherwise both run at once. Returns each
/// one's stats, in that order. With `scale_out`, each shares its work with
/// the other instances on the same state directory ([`crate::scale_out`]).
pub async fn run_consumers(
    config: &StreamConfig,
    which: Consumers,
    options: &ShellOptions,
    rewards: RewardConfig,
    scale_out: bool,
) -> Result<Vec<(&'static str, RunStats)>, ShellError> {
    let own = |name: &str| ShellOptions {
        state_dir: options.state_dir.join(name),
        ..options.clone()
    };
    let trajectories = {
        let (config, options) = (config.clone(), own(TrajectoryBuilder::NAME));
        move || run_one(&config, TrajectoryBuilder::default, &options, scale_out)
    };
    let join = {
        let (config, options) = (config.clone(), own(RewardJoin::NAME));
        move || {
            run_one(
                &config,
                || RewardJoin::new(rewards.clone()),
                &options,
                scale_out,
            )
        }
    };
    let (t, r) = (TrajectoryBuilder::NAME, RewardJoin::NAME);
    Ok(match which {
        Consumers::Trajectories => vec![(t, on_own_thread(trajectories).await?)],
        Consumers::Rewards => vec![(r, on_own_thread(join).await?)],
        Consumers::All if options.exit_when_idle => {
            let first = on_own_thread(trajectories).await?;
            vec![(t, first), (r, on_own_thread(join).await?)]
        }
        Consumers::All => {
            let (a, b) = tokio::join!(on_own_thread(trajectories), on_own_thread(join));
            vec![(t, a?), (r, b?)]
        }
    })
}

fn run_one<P: Processor>(
    config: &StreamConfig,
    fresh: impl Fn() -> P,
    options: &ShellOptions,
    scale_out: bool,
) -> Result<RunStats, ShellError> {
    if scale_out {
        scale_out::run_scaled(config, fresh, options)
    } else {
        shell::run(config, fresh(), options)
    }
}

/// A shell runs blocking: on a thread of tokio's blocking pool.
async fn on_own_thread(
    run: impl FnOnce() -> Result<RunStats, ShellError> + Send + 'static,
) -> Result<RunStats, ShellError> {
    tokio::task::spawn_blocking(run)
        .await
        .map_err(|e| ShellError::Thread(e.to_string()))?
}
