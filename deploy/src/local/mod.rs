//! The local backend: each task's image built once with podman, each attempt
//! in a container of its own, the verifier in a clean step after the agent
//! (it runs even after an agent timeout; `tests/` is copied in only then).

mod podman;

pub use podman::{ExecEnd, Podman, Sandbox, SandboxError, SandboxSpec, RUN_LABEL};

use forgelog_deploy_core::outcome::{AgentEnd, Stage, VerifierEnd};
use forgelog_deploy_core::reward::read_reward;
use forgelog_deploy_core::Task;
use std::time::Duration;

/// The image a task's rollouts run in: its `docker_image`, or
/// `environment/` built as `localhost/forgelog-task-<id>` (podman's layer
/// cache makes a rebuild of an unchanged task nearly free).
pub async fn task_image(podman: &Podman, task: &Task) -> Result<String, (Stage, String)> {
    if let Some(image) = &task.config.environment.docker_image {
        return match podman.has_image(image).await {
            Ok(true) => Ok(image.clone()),
            Ok(false) => Err((
                Stage::Image,
                format!("image {image} is not in local storage"),
            )),
            Err(e) => Err((Stage::Image, e.to_string())),
        };
    }
    let tag = format!("localhost/forgelog-task-{}", task.id);
    podman
        .build(&task.dir.join("environment"), &tag)
        .await
        .map(|()| tag)
        .map_err(|e| (Stage::Image, e.to_string()))
}

/// Runs the task's verifier in `sandbox`: `tests/` copied to `/tests`, then
/// `bash /tests/test.sh` within the verifier timeout, then the reward files.
pub async fn verify(sandbox: &Sandbox, task: &Task) -> VerifierEnd {
    let failed = |why: String| VerifierEnd::Failed {
        stage: Stage::Verifier,
        why,
    };
    if let Err(e) = sandbox.copy_in(&task.dir.join("tests"), "/tests").await {
        return failed(e.to_string());
    }
    let env: Vec<(String, String)> = task
        .config
        .verifier
        .env
        .iter()
        .map(|(k, v)| (k.clone(), v.clone()))
        .collect();
    let timeout = Duration::from_secs_f64(task.config.verifier.timeout_sec);
    let code = match sandbox
        .exec(
            "mkdir -p /logs/verifier && bash /tests/test.sh",
            "/",
            &env,
            timeout,
        )
        .await
    {
        Ok(ExecEnd::Exited(code)) => code,
        Ok(ExecEnd::TimedOut) => return VerifierEnd::TimedOut,
        Err(e) => return failed(e.to_string()),
    };
    let (json, txt) = match (
        sandbox.read("/logs/verifier/reward.json").await,
        sandbox.read("/logs/verifier/reward.txt").await,
    ) {
        (Ok(json), Ok(txt)) => (json, txt),
        (Err(e), _) | (_, Err(e)) => return failed(e.to_string()),
    };
    VerifierEnd::Ran {
        code,
        reward: read_reward(json.as_deref(), txt.as_deref()),
    }
}

/// Runs `script` as the agent in `sandbox`, in `/app`, within the task's agent timeout.
pub async fn run_agent(sandbox: &Sandbox, task: &Task, script: &str) -> AgentEnd {
    let timeout = Duration::from_secs_f64(task.config.agent.timeout_sec);
    match sandbox.exec(script, "/app", &[], timeout).await {
        Ok(ExecEnd::Exited(Some(code))) => AgentEnd::Exited(code),
        Ok(ExecEnd::Exited(None)) => AgentEnd::Exited(-1),
        Ok(ExecEnd::TimedOut) => AgentEnd::TimedOut,
        Err(e) => AgentEnd::Failed {
            stage: Stage::Harness,
            why: e.to_string(),
        },
    }
}
