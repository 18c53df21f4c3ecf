//! forgelog-podman: the local backend. Each task's image built once with
//! podman, each attempt in a container of its own, the verifier in a clean
//! step after the agent (it runs even after an agent timeout; `tests/` is
//! copied in only then); a run's directory ([`run_dir`]) and `forgelog tasks
//! check` ([`check`]).

pub mod check;
mod clock;
mod network;
mod podman;
pub mod record;
pub mod resolver;
pub mod run_dir;

pub use clock::PinnedClocks;
pub use network::{remove_slot, NetworkError, SandboxNetwork};
pub use podman::{Exec, ExecEnd, Mount, Podman, Sandbox, SandboxError, SandboxSpec, RUN_LABEL};

use forgelog_deploy::harness::{Harness, Launch};
use std::path::PathBuf;

use forgelog_deploy_core::outcome::{infra, AgentEnd, Stage, VerifierEnd};
use forgelog_deploy_core::reward::read_reward;
use forgelog_deploy_core::Task;
use std::time::Duration;

impl forgelog_deploy::orchestrator::ImageBuilder for Podman {
    fn image<'a>(&'a self, task: &'a Task) -> forgelog_deploy::orchestrator::ImageFuture<'a> {
        Box::pin(task_image(self, task))
    }
}

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
        Ok(Exec {
            end: ExecEnd::Exited(code),
            ..
        }) => code,
        Ok(Exec {
            end: ExecEnd::TimedOut,
            ..
        }) => return VerifierEnd::TimedOut,
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

/// What one attempt runs: a task with a harness, the sandbox it runs in,
/// and the harness's environment (the session's proxy URL and key).
#[derive(Debug, Clone)]
pub struct AttemptSpec<'a> {
    pub task: &'a Task,
    pub harness: &'a Harness,
    pub sandbox: SandboxSpec,
    pub env: Vec<(String, String)>,
    /// Where the harness's stdout and stderr are kept, if anywhere.
    pub logs: Option<PathBuf>,
}

/// Where the instruction is put in the sandbox for the launch script.
const INSTRUCTION: &str = "/forgelog/instruction.md";

/// Runs one attempt in a sandbox of `image`: the harness within the task's
/// agent timeout, then the verifier in a clean step (after a timeout too),
/// then the sandbox is removed.
pub async fn run_attempt(
    podman: &Podman,
    image: &str,
    spec: &AttemptSpec<'_>,
) -> (AgentEnd, VerifierEnd) {
    let sandbox = match podman.start(image, &spec.sandbox).await {
        Ok(s) => s,
        Err(e) => return infra(Stage::Sandbox, e.to_string()),
    };
    let agent = run_agent(&sandbox, spec).await;
    let verifier = match agent {
        AgentEnd::Failed { .. } => VerifierEnd::Failed {
            stage: Stage::Verifier,
            why: "not run: the harness did not start".into(),
        },
        _ => verify(&sandbox, spec.task).await,
    };
    let _ = sandbox.remove().await;
    (agent, verifier)
}

async fn run_agent(sandbox: &Sandbox, spec: &AttemptSpec<'_>) -> AgentEnd {
    let failed = |why: String| AgentEnd::Failed {
        stage: Stage::Harness,
        why,
    };
    let task = spec.task;
    let script = match &spec.harness.launch {
        Launch::Script(script) => {
            let file = task.dir.join("instruction.md");
            if let Err(e) = sandbox.copy_in(&file, INSTRUCTION).await {
                return failed(e.to_string());
            }
            script.as_str()
        }
        Launch::Solution => {
            let Some(solution) = task.solution() else {
                return failed("the task has no solution/solve.sh".into());
            };
            if let Err(e) = sandbox.copy_in(&solution, "/solution/solve.sh").await {
                return failed(e.to_string());
            }
            "bash /solution/solve.sh"
        }
    };
    let mut env = vec![
        ("HOME".to_string(), "/tmp/forgelog-home".to_string()),
        ("FORGELOG_INSTRUCTION".into(), INSTRUCTION.into()),
        ("FORGELOG_AGENT_LOGS".into(), "/logs/agent".into()),
    ];
    env.extend(spec.env.iter().cloned());
    // With a pinned clock (`run --replay`) each program keeps libfaketime's
    // state to itself: one a shell hands down breaks some programs (Claude
    // Code's binary cannot open it and exits).
    let prepare = "unset FAKETIME_SHARED; mkdir -p \"$HOME\" /logs/agent /app && ";
    let timeout = Duration::from_secs_f64(task.config.agent.timeout_sec);
    let exec = sandbox
        .exec(&format!("{prepare}{script}"), "/app", &env, timeout)
        .await;
    if let (Some(dir), Ok(out)) = (&spec.logs, &exec) {
        let _ = std::fs::create_dir_all(dir)
            .and_then(|()| std::fs::write(dir.join("stdout"), &out.stdout))
            .and_then(|()| std::fs::write(dir.join("stderr"), &out.stderr));
    }
    match exec.map(|e| e.end) {
        Ok(ExecEnd::Exited(Some(code))) => AgentEnd::Exited(code),
        Ok(ExecEnd::Exited(None)) => AgentEnd::Exited(-1),
        Ok(ExecEnd::TimedOut) => AgentEnd::TimedOut,
        Err(e) => failed(e.to_string()),
    }
}

/// `forgelog run`'s local backend: each attempt in a podman sandbox in a
/// network namespace of its own whose only way out is a relay to the proxy,
/// the harness bundles mounted read-only.
pub struct LocalBackend {
    pub podman: Podman,
    /// The harness bundles, mounted read-only into every sandbox.
    pub bundles: PathBuf,
    /// The proxy as this host reaches it: each sandbox's relay forwards here.
    pub proxy: std::net::SocketAddr,
    /// Notes the network slots in use, for reaping after a crash.
    pub dir: crate::run_dir::RunDir,
    /// Where the next network slot search starts.
    next_slot: std::sync::atomic::AtomicU32,
    /// Attempts whose clock starts at a recorded time (`run --replay`).
    pub clocks: Option<PinnedClocks>,
}

/// A podman container name for attempt `id`.
fn container_name(id: &str) -> String {
    let clean: String = id
        .chars()
        .map(|c| {
            if c.is_ascii_alphanumeric() || "_.-".contains(c) {
                c
            } else {
                '.'
            }
        })
        .collect();
    format!("forgelog-{clean}")
}

impl LocalBackend {
    pub fn new(
        podman: Podman,
        bundles: PathBuf,
        proxy: std::net::SocketAddr,
        dir: crate::run_dir::RunDir,
    ) -> LocalBackend {
        // Spread concurrent orchestrators over the slot space.
        let hint = (std::process::id() % 1024) * 16;
        LocalBackend {
            podman,
            bundles,
            proxy,
            dir,
            next_slot: hint.into(),
            clocks: None,
        }
    }

    /// Starts the listed attempts' clocks at their recorded starts.
    pub fn with_clocks(self, clocks: PinnedClocks) -> LocalBackend {
        LocalBackend {
            clocks: Some(clocks),
            ..self
        }
    }

    /// Fails when sandbox networks cannot be made here (not root, no `ip`),
    /// before any rollout would fail for it.
    pub async fn check(&self) -> Result<(), NetworkError> {
        let probe = SandboxNetwork::create(
            self.proxy,
            self.next_slot.load(std::sync::atomic::Ordering::Relaxed),
        )
        .await?;
        probe.remove().await;
        Ok(())
    }
}

impl forgelog_deploy::orchestrator::SandboxBackend for LocalBackend {
    async fn prepare(&self, task: &Task) -> Result<String, (Stage, String)> {
        task_image(&self.podman, task).await
    }

    async fn clean_up(&self) {
        let _ = self.dir.clean_up(&self.podman).await;
    }

    async fn run(&self, a: forgelog_deploy::orchestrator::Attempt<'_>) -> (AgentEnd, VerifierEnd) {
        let hint = self
            .next_slot
            .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        let network = match SandboxNetwork::create(self.proxy, hint).await {
            Ok(n) => n,
            Err(e) => return infra(Stage::Sandbox, e.to_string()),
        };
        self.dir.slot_taken(network.slot);
        let task = a.task;
        let timeouts = task.config.agent.timeout_sec + task.config.verifier.timeout_sec;
        let mut mounts = vec![Mount::same_path(&self.bundles)];
        let mut env = harness_env(
            &format!("http://{}:{}", network.host_ip, network.port),
            a.api_key,
            &self.bundles,
        );
        let now_ms = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.as_millis() as i64);
        let pinned = self
            .clocks
            .as_ref()
            .and_then(|c| c.for_attempt(a.id, now_ms));
        if let Some((mount, pinned)) = pinned {
            mounts.push(mount);
            env.extend(pinned);
        }
        let spec = AttemptSpec {
            task,
            harness: a.harness,
            sandbox: SandboxSpec {
                name: container_name(a.id),
                labels: vec![
                    ("forgelog.rollout".into(), a.rollout.id.clone()),
                    ("forgelog.attempt".into(), a.id.to_string()),
                    ("forgelog.task".into(), a.rollout.task.clone()),
                    ("forgelog.harness".into(), a.rollout.harness.clone()),
                ],
                // The run whose directory's lock guards this sandbox (a
                // replay's own, not the recorded run's).
                run_id: self.dir.run.clone(),
                cpus: task.config.environment.cpus,
                memory_mb: task.config.environment.memory_mb,
                netns: Some(network.namespace.clone()),
                dns: Some(network.host_ip),
                mounts,
                hosts: Vec::new(),
                // Setup and copies are seconds; a margin of two minutes.
                lifetime: Some(Duration::from_secs_f64(timeouts + 120.0)),
            },
            env,
            logs: Some(self.dir.attempt_logs(a.id)),
        };
        let ends = run_attempt(&self.podman, a.image, &spec).await;
        if let Some(dir) = &spec.logs {
            record::write(dir, &ends.0, &network.dns_asked());
        }
        let slot = network.slot;
        network.remove().await;
        self.dir.slot_freed(slot);
        ends
    }
}

/// The environment a launch script gets besides `HOME`, the instruction and
/// the agent logs' place: where the proxy is, the session's key, the bundles.
pub fn harness_env(
    base_url: &str,
    api_key: &str,
    bundles: &std::path::Path,
) -> Vec<(String, String)> {
    vec![
        ("FORGELOG_BASE_URL".into(), base_url.into()),
        ("FORGELOG_API_KEY".into(), api_key.into()),
        (
            "FORGELOG_BUNDLES".into(),
            bundles.to_string_lossy().into_owned(),
        ),
        (
            "PATH".into(),
            format!(
                "{}/node/bin:/usr/local/bin:/usr/bin:/bin",
                bundles.display()
            ),
        ),
    ]
}
