//! The stream consumers' pure cores: events in, events out; no I/O, no clock,
//! no randomness, no hash-map order in anything emitted. The Kafka shell that
//! gives them exactly-once output is `forgelog-consumers`.
//!
//! - [`TrajectoryBuilder`]: `forgelog.calls` + `forgelog.rollouts` → `forgelog.trajectories`
//! - [`RewardJoin`]: `forgelog.rollouts` + `forgelog.trajectories` + `forgelog.rewards` → `forgelog.batches`
//! - [`rebuild`]: both again over a recorded run, and the comparison with what was stored
//! - [`report`]: a run per policy version and harness (`forgelog report`)

pub mod clean;
mod processor;
pub mod rebuild;
pub mod recent;
pub mod report;
pub mod rewards;
pub mod show;
mod trajectories;
pub mod tree;

pub use processor::Processor;
pub use recent::RecentKeys;
pub use rewards::{RewardConfig, RewardJoin, RewardTransform};
pub use trajectories::TrajectoryBuilder;
pub use tree::TrajectoryTree;
