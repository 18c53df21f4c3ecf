//! The rollout orchestrator's core, with no I/O beyond reading task files:
//!
//! - [`task`]: Harbor-style task directories (`instruction.md`, `task.toml`,
//!   `environment/`, `tests/test.sh`, optional `solution/solve.sh`), as
//!   Terminal-Bench 2 and many RL task sets ship them;
//! - [`reward`]: what a verifier wrote (`reward.json` or `reward.txt`);
//! - [`outcome`]: how a rollout ended, as a typed status and the verdict the
//!   log records: a reward only when the verifier exited and wrote a valid
//!   finite number, anything else a null reward with its reason, never a 0;
//! - [`plan`]: a run's groups and rollouts, their deterministic ids, and which
//!   failures are retried;
//! - [`history`]: what the log holds of a run, so a restarted run resumes;
//! - [`summary`]: the per-harness table a run ends with;
//! - [`admission`]: the staleness bound a training run starts groups under;
//! - [`replay`]: the recorded attempts `run --replay` re-runs, and how each
//!   re-run ended against its recording.

pub mod admission;
pub mod history;
pub mod outcome;
pub mod plan;
pub mod replay;
pub mod reward;
pub mod summary;
pub mod task;

pub use admission::StalenessBound;
pub use history::{Resume, RunHistory};
pub use outcome::{AgentEnd, RolloutStatus, VerifierEnd};
pub use plan::{Group, Rollout, RunPlan};
pub use replay::{RecordedRun, ReplayPlanError, ReplayTable, ReplayedAttempt};
pub use reward::{Reward, RewardError};
pub use summary::{Outcome, OutcomeSummary};
pub use task::{Task, TaskConfig, TaskError};
