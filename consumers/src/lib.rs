//! Stream consumers: pure cores (events in, events out; no I/O, no clock, no
//! randomness) inside one thin Kafka shell that gives them exactly-once output.
//!
//! - [`TrajectoryBuilder`]: `forgelog.calls` + `forgelog.rollouts` → `forgelog.trajectories`
//! - [`RewardJoin`]: `forgelog.rollouts` + `forgelog.trajectories` + `forgelog.rewards` → `forgelog.batches`

pub mod tree;

pub use tree::TrajectoryTree;
