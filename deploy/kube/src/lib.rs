//! forgelog-kube: `forgelog run --backend kube`. One `batch/v1` Job per
//! rollout attempt through `kube` (no kubectl), all of a run's objects owned
//! by one lease object the orchestrator renews, so a dead orchestrator's
//! run is garbage-collected whole; the attempt's runner reports through the
//! pod's termination message and the proxy's session API (no exec).
//!
//! - [`names`]: deterministic object names and labels;
//! - [`job`]: an attempt's Job, Secret and task-files ConfigMap (pure);
//! - [`termination`]: the in-pod runner and its report;
//! - [`lease`]: the run's lease, and deleting dead runs;
//! - [`backend`]: the `SandboxBackend` the orchestrator drives;
//! - `watch`: what the run's Jobs and Pods say, by attempt.
//!
//! `forgelog run --backend kube`'s tests (`tests/kube.rs`) and bench run it
//! against `forgelog-kube-fake` (an in-repo API server and a kubelet that
//! runs pods through the podman backend) on a machine with no cluster.

pub mod backend;
pub mod job;
pub mod lease;
pub mod names;
pub mod retry;
pub mod termination;
mod watch;

pub use backend::{KubeBackend, KubeOptions, TaskImages};
pub use job::BundleSource;
pub use retry::KubeError;
