//! forgelog-deploy: rollout orchestration around `forgelog-deploy-core`: the
//! local podman backend ([`local`]), `forgelog tasks check` ([`check`]), and
//! the built-in demo that drives rollouts through the capture proxy.

pub mod check;
pub mod demo;
pub mod local;
