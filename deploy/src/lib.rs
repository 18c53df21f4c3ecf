//! forgelog-deploy: rollout orchestration: task format, local process runner,
//! Kubernetes runner, and the built-in demo that drives rollouts through the
//! capture proxy.

pub mod demo;
