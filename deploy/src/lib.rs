//! forgelog-deploy: rollout orchestration around `forgelog-deploy-core`,
//! whatever runs the sandboxes: `forgelog run`'s orchestrator
//! ([`orchestrator`], driving a [`orchestrator::SandboxBackend`]), the
//! harnesses a sandbox starts ([`harness`]), and the built-in demo that
//! drives rollouts through the capture proxy. The backends are crates of
//! their own: podman here (`forgelog-podman`), Kubernetes (`forgelog-kube`).

pub mod demo;
pub mod harness;
pub mod kit;
pub mod orchestrator;
