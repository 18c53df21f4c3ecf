//! `forgelog run`'s orchestrator: every rollout of a plan through the
//! capture proxy's session API, each attempt in a sandbox of its own on the
//! local podman backend, with its verifier, its typed outcome and its retries
//! recorded in the log.
//!
//! Per attempt: `POST /sessions` (RolloutStarted) → a network namespace whose
//! only way out is the proxy → the sandbox with the harness bundle mounted
//! read-only → the harness within the agent timeout → the verifier → `/finish`
//! (RolloutFinished, VerifierResult). An attempt that did not score and never
//! reached the model is recorded as abandoned and tried again (twice at most);
//! nothing else is. A resumed run skips rollouts finished in the log and gives
//! up attempts its dead predecessor left open.

use crate::harness::Harness;
use crate::local::{
    infra, run_attempt, task_image, AttemptSpec, Podman, SandboxNetwork, SandboxSpec,
};
use crate::run_dir::RunDir;
use forgelog_api::{AbandonAttempt, ClientError, Finish, NewSession, SessionClient};
use forgelog_deploy_core::outcome::{judge, AgentEnd, Stage};
use forgelog_deploy_core::plan::may_retry;
use forgelog_deploy_core::{Outcome, Resume, Rollout, RunHistory, RunPlan, Task};
use futures::{StreamExt, TryStreamExt};
use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::Duration;

#[derive(Debug, thiserror::Error)]
pub enum OrchestratorError {
    #[error("the session API: {0}")]
    Sessions(#[from] ClientError),
    #[error("task {0} is in the plan but was not loaded")]
    NoTask(String),
    #[error("harness {0} is in the plan but was not resolved")]
    NoHarness(String),
}

/// What the run is given besides its plan.
#[derive(Debug, Clone)]
pub struct RunOptions {
    /// Rollouts running at once.
    pub concurrency: usize,
    /// Model calls per session (past it the proxy stops the harness).
    pub max_model_calls: Option<u32>,
    /// Completion tokens per call.
    pub max_tokens: Option<i64>,
    /// The harness bundles, mounted read-only into every sandbox.
    pub bundles: PathBuf,
    /// The proxy as this host reaches it: each sandbox's relay forwards here.
    pub proxy: SocketAddr,
}

/// Told as rollouts start and end (the command line draws a progress bar).
pub trait Progress: Send + Sync {
    fn started(&self, rollout: &Rollout);
    fn finished(&self, outcome: &Outcome);
}

/// A progress that says nothing.
pub struct Silent;

impl Progress for Silent {
    fn started(&self, _: &Rollout) {}
    fn finished(&self, _: &Outcome) {}
}

pub struct Orchestrator {
    pub podman: Podman,
    pub sessions: SessionClient,
    pub plan: RunPlan,
    pub tasks: BTreeMap<String, Task>,
    pub harnesses: BTreeMap<String, Harness>,
    pub options: RunOptions,
    pub dir: RunDir,
    /// Where the next network slot search starts.
    next_slot: AtomicU32,
}

/// How one attempt ended.
struct Attempt {
    outcome: Outcome,
    abandoned: bool,
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

impl Orchestrator {
    pub fn new(
        podman: Podman,
        sessions: SessionClient,
        plan: RunPlan,
        tasks: BTreeMap<String, Task>,
        harnesses: BTreeMap<String, Harness>,
        options: RunOptions,
        dir: RunDir,
    ) -> Orchestrator {
        // Spread concurrent orchestrators over the slot space.
        let hint = (std::process::id() % 1024) * 16;
        Orchestrator {
            podman,
            sessions,
            plan,
            tasks,
            harnesses,
            options,
            dir,
            next_slot: AtomicU32::new(hint),
        }
    }

    /// Builds each task's image once, then runs every rollout the log does
    /// not hold finished. Outcomes come back in plan order.
    pub async fn run(
        &self,
        history: &RunHistory,
        progress: &dyn Progress,
    ) -> Result<Vec<Outcome>, OrchestratorError> {
        for g in &self.plan.groups {
            self.tasks
                .get(&g.task)
                .ok_or_else(|| OrchestratorError::NoTask(g.task.clone()))?;
            self.harnesses
                .get(&g.harness)
                .ok_or_else(|| OrchestratorError::NoHarness(g.harness.clone()))?;
        }
        let mut images = BTreeMap::new();
        for (id, task) in &self.tasks {
            images.insert(id.clone(), task_image(&self.podman, task).await);
        }
        let rollouts: Vec<Rollout> = self.plan.rollouts().collect();
        let order: BTreeMap<String, usize> = rollouts
            .iter()
            .enumerate()
            .map(|(i, r)| (r.id.clone(), i))
            .collect();
        let mut outcomes: Vec<Outcome> = futures::stream::iter(rollouts)
            .map(|r| {
                let image = images[&r.task].clone();
                async move { self.rollout(r, image, history, progress).await }
            })
            .buffer_unordered(self.options.concurrency.max(1))
            .try_collect()
            .await?;
        outcomes.sort_by_key(|o| order[&o.rollout_id]);
        Ok(outcomes)
    }

    async fn rollout(
        &self,
        rollout: Rollout,
        image: Result<String, (Stage, String)>,
        history: &RunHistory,
        progress: &dyn Progress,
    ) -> Result<Outcome, OrchestratorError> {
        let done = |attempt: String, reward| Outcome {
            rollout_id: rollout.id.clone(),
            harness: rollout.harness.clone(),
            attempt,
            status: None,
            reward,
            model_calls: 0,
            sampled_tokens: 0,
            retries: 0,
        };
        let (mut n, dangling) = match history.resume(&rollout) {
            Resume::Done { attempt, reward } => {
                let o = done(attempt, reward);
                progress.finished(&o);
                return Ok(o);
            }
            Resume::Run { next, dangling } => (next, dangling),
        };
        for id in dangling {
            let gone = AbandonAttempt {
                run_id: Some(self.plan.run_id.clone()),
                rollout_id: id.clone(),
                why: format!("its orchestrator died; the rollout runs again as attempt {n}"),
            };
            if !self.sessions.abandon(&gone).await?.abandoned {
                // Its session was still live and had reached the model: it
                // stands, finished as it was.
                let o = done(id, None);
                progress.finished(&o);
                return Ok(o);
            }
        }
        progress.started(&rollout);
        let mut tries = 0;
        loop {
            let attempt = self.attempt(&rollout, n, tries, &image).await?;
            if attempt.abandoned {
                tries += 1;
                n += 1;
                continue;
            }
            progress.finished(&attempt.outcome);
            return Ok(attempt.outcome);
        }
    }

    async fn attempt(
        &self,
        rollout: &Rollout,
        n: u32,
        tries: u32,
        image: &Result<String, (Stage, String)>,
    ) -> Result<Attempt, OrchestratorError> {
        let id = rollout.attempt_id(n);
        let task = &self.tasks[&rollout.task];
        let harness = &self.harnesses[&rollout.harness];
        let group_size = self
            .plan
            .groups
            .iter()
            .find(|g| g.id == rollout.group)
            .map_or(1, |g| g.size);
        let mut new = NewSession::new(&id, &rollout.task, &rollout.harness, &rollout.group)
            .in_run(&self.plan.run_id)
            .group_size(group_size as i64);
        if let Some(m) = self.options.max_model_calls {
            new = new.max_model_calls(m);
        }
        if let Some(t) = self.options.max_tokens {
            new = new.max_tokens(t);
        }
        let session = self.sessions.create(&new).await?;
        let (agent, verifier) = match image {
            Err((stage, why)) => infra(*stage, why.clone()),
            Ok(image) => {
                self.in_sandbox(rollout, &id, task, harness, image, &session.api_key)
                    .await
            }
        };
        let (status, verdict) = judge(&agent, &verifier);
        let finish = Finish {
            exit_status: match agent {
                AgentEnd::Exited(code) => Some(code as i64),
                _ => None,
            },
            verifier: Some(verdict.clone()),
            abandon_if_unused: may_retry(status, tries),
        };
        let finished = self.sessions.finish(&session.session_id, &finish).await?;
        Ok(Attempt {
            abandoned: finished.abandoned,
            outcome: Outcome {
                rollout_id: rollout.id.clone(),
                harness: rollout.harness.clone(),
                attempt: id,
                status: Some(status),
                reward: verdict.reward,
                model_calls: finished.model_calls,
                sampled_tokens: finished.sampled_tokens,
                retries: tries,
            },
        })
    }

    async fn in_sandbox(
        &self,
        rollout: &Rollout,
        id: &str,
        task: &Task,
        harness: &Harness,
        image: &str,
        api_key: &str,
    ) -> (AgentEnd, forgelog_deploy_core::VerifierEnd) {
        let hint = self.next_slot.fetch_add(1, Ordering::Relaxed);
        let network = match SandboxNetwork::create(self.options.proxy, hint).await {
            Ok(n) => n,
            Err(e) => return infra(Stage::Sandbox, e.to_string()),
        };
        self.dir.slot_taken(network.slot);
        let timeouts = task.config.agent.timeout_sec + task.config.verifier.timeout_sec;
        let bundles = self.options.bundles.to_string_lossy().into_owned();
        let spec = AttemptSpec {
            task,
            harness,
            sandbox: SandboxSpec {
                name: container_name(id),
                labels: vec![
                    ("forgelog.rollout".into(), rollout.id.clone()),
                    ("forgelog.attempt".into(), id.to_string()),
                    ("forgelog.task".into(), rollout.task.clone()),
                    ("forgelog.harness".into(), rollout.harness.clone()),
                ],
                run_id: self.plan.run_id.clone(),
                cpus: task.config.environment.cpus,
                memory_mb: task.config.environment.memory_mb,
                netns: Some(network.namespace.clone()),
                read_only: vec![self.options.bundles.clone()],
                // Setup and copies are seconds; a margin of two minutes.
                lifetime: Some(Duration::from_secs_f64(timeouts + 120.0)),
            },
            env: vec![
                (
                    "FORGELOG_BASE_URL".into(),
                    format!("http://{}:{}", network.host_ip, network.port),
                ),
                ("FORGELOG_API_KEY".into(), api_key.into()),
                ("FORGELOG_BUNDLES".into(), bundles),
                (
                    "PATH".into(),
                    format!(
                        "{}/node/bin:/usr/local/bin:/usr/bin:/bin",
                        self.options.bundles.display()
                    ),
                ),
            ],
            logs: Some(self.dir.attempt_logs(id)),
        };
        let ends = run_attempt(&self.podman, image, &spec).await;
        let slot = network.slot;
        network.remove().await;
        self.dir.slot_freed(slot);
        ends
    }
}
