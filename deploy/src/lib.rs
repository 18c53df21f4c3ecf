//! forgelog-deploy: rollout orchestration around `forgelog-deploy-core`: the
//! local podman backend ([`local`]), the harnesses it starts ([`harness`]),
//! `forgelog run`'s orchestrator ([`orchestrator`]) and its run directory
//! ([`run_dir`]), `forgelog tasks check` ([`check`]), and the built-in demo
//! that drives rollouts through the capture proxy.

pub mod check;
pub mod demo;
pub mod harness;
pub mod local;
pub mod orchestrator;
pub mod run_dir;
