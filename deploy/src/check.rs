//! `forgelog tasks check DIR`: every task's reference solution, in its own
//! sandbox, through its own verifier. A task passes when the verifier scores
//! its solution 1.

use crate::local::{run_agent, task_image, verify, Podman, SandboxSpec};
use forgelog_deploy_core::outcome::{judge, AgentEnd, RolloutStatus, VerifierEnd};
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
    let infra = |stage, why: String| {
        (
            AgentEnd::Failed {
                stage,
                why: why.clone(),
            },
            VerifierEnd::Failed { stage, why },
        )
    };
    let Some(solution) = task.solution() else {
        let (a, v) = infra(
            forgelog_deploy_core::outcome::Stage::Harness,
            "no solution/solve.sh".into(),
        );
        return done(a, v);
    };
    let image = match task_image(podman, task).await {
        Ok(image) => image,
        Err((stage, why)) => {
            let (a, v) = infra(stage, why);
            return done(a, v);
        }
    };
    let spec = SandboxSpec {
        name: format!("forgelog-check-{run_id}-{}", task.id),
        labels: vec![("forgelog.task".into(), task.id.clone())],
        run_id: run_id.to_string(),
        cpus: task.config.environment.cpus,
        memory_mb: task.config.environment.memory_mb,
    };
    let sandbox = match podman.start(&image, &spec).await {
        Ok(s) => s,
        Err(e) => {
            let (a, v) = infra(forgelog_deploy_core::outcome::Stage::Sandbox, e.to_string());
            return done(a, v);
        }
    };
    let agent = match sandbox.copy_in(&solution, "/solution/solve.sh").await {
        Ok(()) => run_agent(&sandbox, task, "bash /solution/solve.sh").await,
        Err(e) => AgentEnd::Failed {
            stage: forgelog_deploy_core::outcome::Stage::Harness,
            why: e.to_string(),
        },
    };
    let verifier = verify(&sandbox, task).await;
    let _ = sandbox.remove().await;
    done(agent, verifier)
}
