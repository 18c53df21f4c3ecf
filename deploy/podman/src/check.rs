//! `forgelog tasks check DIR`: every task's reference solution, in its own
//! sandbox, through its own verifier. A task passes when the verifier scores
//! its solution 1.

use crate::{run_attempt, task_image, AttemptSpec, Podman, SandboxSpec};
use forgelog_deploy::harness::{Harness, SOLVE};
use forgelog_deploy_core::outcome::{infra, judge, AgentEnd, RolloutStatus, VerifierEnd};
use forgelog_deploy_core::Task;

/// How one task's check went.
#[derive(Debug, Clone, PartialEq)]
pub struct TaskCheck {
    pub task: String,
    pub status: RolloutStatus,
    pub reward: Option<f64>,
    /// Why it failed, when it did.
    pub why: Option<String>,
}

impl TaskCheck {
    pub fn passed(&self) -> bool {
        self.status == RolloutStatus::Scored && self.reward == Some(1.0)
    }
}

/// Checks `task`'s solution; `run_id` labels its sandbox (reaped by run).
pub async fn check_task(podman: &Podman, task: &Task, run_id: &str) -> TaskCheck {
    let done = |agent: AgentEnd, verifier: VerifierEnd| {
        let (status, verdict) = judge(&agent, &verifier);
        let why = verdict.details["why"]
            .as_str()
            .filter(|w| !w.is_empty())
            .map(str::to_string);
        TaskCheck {
            task: task.id.clone(),
            status,
            reward: verdict.reward,
            why,
        }
    };
    let harness = Harness::resolve(SOLVE).expect("solve is built in");
    let image = match task_image(podman, task).await {
        Ok(image) => image,
        Err((stage, why)) => {
            let (a, v) = infra(stage, why);
            return done(a, v);
        }
    };
    let spec = AttemptSpec {
        task,
        harness: &harness,
        sandbox: SandboxSpec {
            name: format!("forgelog-check-{run_id}-{}", task.id),
            labels: vec![("forgelog.task".into(), task.id.clone())],
            run_id: run_id.to_string(),
            cpus: task.config.environment.cpus,
            memory_mb: task.config.environment.memory_mb,
            ..Default::default()
        },
        env: Vec::new(),
        logs: None,
    };
    let (agent, verifier) = run_attempt(podman, &image, &spec).await;
    done(agent, verifier)
}
