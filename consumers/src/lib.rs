//! Stream consumers: the pure cores of [`forgelog_consumers_core`] (events in,
//! events out; no I/O, no clock, no randomness) inside one thin Kafka shell
//! that gives them exactly-once output, plus the exports.
//!
//! - [`TrajectoryBuilder`]: `forgelog.calls` + `forgelog.rollouts` → `forgelog.trajectories`
//! - [`RewardJoin`]: `forgelog.rollouts` + `forgelog.trajectories` + `forgelog.rewards` → `forgelog.batches`

pub use forgelog_consumers_core as core;
pub use forgelog_consumers_core::{
    rewards, show, tree, Processor, RewardConfig, RewardJoin, RewardTransform, TrajectoryBuilder,
    TrajectoryTree,
};

pub mod export;
mod process;
pub mod rebuild;
pub mod scale_out;
pub mod shell;

pub use process::{run_consumers, Consumers};
pub use shell::{RunStats, ShellOptions};
