//! Stream consumers: pure cores (events in, events out; no I/O, no clock, no
//! randomness) inside one thin Kafka shell that gives them exactly-once output.
//!
//! - [`TrajectoryBuilder`]: `forgelog.calls` + `forgelog.rollouts` → `forgelog.trajectories`
//! - [`RewardJoin`]: `forgelog.rollouts` + `forgelog.trajectories` + `forgelog.rewards` → `forgelog.batches`

pub mod export;
mod processor;
pub mod rebuild;
pub mod rewards;
pub mod shell;
pub mod show;
mod trajectories;
pub mod tree;

pub use processor::Processor;
pub use rewards::{RewardConfig, RewardJoin, RewardTransform};
pub use shell::{RunStats, ShellOptions};
pub use trajectories::TrajectoryBuilder;
pub use tree::TrajectoryTree;
