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
use forgelog_api::{AbandonAttempt, ClientError, Finish, NewSession, SessionClient};
use forgelog_deploy_core::outcome::{infra, judge, AgentEnd, Stage, VerifierEnd};
use forgelog_deploy_core::plan::may_retry;
use forgelog_deploy_core::{Outcome, Resume, Rollout, RunHistory, RunPlan, StalenessBound, Task};
use futures::{StreamExt, TryStreamExt};
use std::collections::BTreeMap;
use std::future::Future;

#[derive(Debug, thiserror::Error)]
pub enum OrchestratorError {
    #[error("the session API: {0}")]
    Sessions(#[from] ClientError),
    #[error("task {0} is in the plan but was not loaded")]
    NoTask(String),
    #[error("harness {0} is in the plan but was not resolved")]
    NoHarness(String),
    #[error("group {group} waits for policy version {waits_for}, which will not come: {why}")]
    NoNewerPolicy {
        group: usize,
        waits_for: u64,
        why: String,
    },
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
    /// Whether an attempt that never reached the model is tried again under
    /// a new id (not in a replay: only the recorded attempts have answers).
    pub retry: bool,
}

/// One attempt as a backend runs it.
#[derive(Debug, Clone, Copy)]
pub struct Attempt<'a> {
    pub run_id: &'a str,
    pub rollout: &'a Rollout,
    /// The attempt's id (its session's rollout id).
    pub id: &'a str,
    pub task: &'a Task,
    pub harness: &'a Harness,
    /// What [`SandboxBackend::prepare`] made of the task.
    pub image: &'a str,
    /// The session's key: the harness's only credential.
    pub api_key: &'a str,
}

/// Where attempts run: one sandbox each, the harness and then the verifier
/// in it, the sandbox gone when the attempt returns. The local podman
/// backend is one; the Kubernetes backend another.
pub trait SandboxBackend: Send + Sync {
    /// The task's image, made or found once per run.
    fn prepare(&self, task: &Task) -> impl Future<Output = Result<String, (Stage, String)>> + Send;

    /// Runs one attempt to its end.
    fn run(&self, attempt: Attempt<'_>) -> impl Future<Output = (AgentEnd, VerifierEnd)> + Send;

    /// Removes whatever of the run is left (after an interrupted run: what
    /// was in flight when it stopped).
    fn clean_up(&self) -> impl Future<Output = ()> + Send {
        async {}
    }
}

/// Makes a task's image where sandboxes can run it, or says at which stage
/// it could not: the local backend's podman (whose storage a single-node
/// cluster's kubelet sees too).
pub trait ImageBuilder: Send + Sync + std::fmt::Debug {
    fn image<'a>(&'a self, task: &'a Task) -> ImageFuture<'a>;
}

/// What [`ImageBuilder::image`] answers.
pub type ImageFuture<'a> = futures::future::BoxFuture<'a, Result<String, (Stage, String)>>;

/// The newest policy version of the run (what a training run's admission
/// waits on); the command line reads it from the log.
pub trait PolicyClock: Send + Sync {
    fn newest_version(&self) -> std::pin::Pin<Box<dyn Future<Output = u64> + Send + '_>>;

    /// Why no newer version will come (the learner stopped), if so: a
    /// paused admission then fails the run instead of waiting for ever.
    fn stopped(&self) -> Option<String> {
        None
    }
}

/// A training run's admission: groups start under the staleness bound.
pub struct Admission {
    pub bound: StalenessBound,
    pub clock: Box<dyn PolicyClock>,
}

impl Admission {
    /// Waits until group `group` (its plan index) may start: the policy that
    /// will sample it is recent enough. Fails when that version will not
    /// come (the clock says the learner stopped).
    pub async fn admitted(&self, group: usize) -> Result<(), OrchestratorError> {
        let mut said = false;
        loop {
            let version = self.clock.newest_version().await;
            if self.bound.admits(group, version) {
                return Ok(());
            }
            if let Some(why) = self.clock.stopped() {
                return Err(OrchestratorError::NoNewerPolicy {
                    group,
                    waits_for: self.bound.version_for(group),
                    why,
                });
            }
            if !said {
                tracing::info!(
                    group,
                    version,
                    waits_for = self.bound.version_for(group),
                    "admission paused: the group waits for a newer policy"
                );
                said = true;
            }
            tokio::time::sleep(ADMISSION_POLL).await;
        }
    }
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

pub struct Orchestrator<B> {
    pub backend: B,
    pub sessions: SessionClient,
    pub plan: RunPlan,
    pub tasks: BTreeMap<String, Task>,
    pub harnesses: BTreeMap<String, Harness>,
    pub options: RunOptions,
    /// When training: groups start only under the staleness bound.
    pub admission: Option<Admission>,
}

/// How often a paused admission reads the newest version.
const ADMISSION_POLL: std::time::Duration = std::time::Duration::from_secs(1);

/// How one attempt ended.
struct Ended {
    outcome: Outcome,
    abandoned: bool,
}

impl<B: SandboxBackend> Orchestrator<B> {
    pub fn new(
        backend: B,
        sessions: SessionClient,
        plan: RunPlan,
        tasks: BTreeMap<String, Task>,
        harnesses: BTreeMap<String, Harness>,
        options: RunOptions,
    ) -> Orchestrator<B> {
        Orchestrator {
            backend,
            sessions,
            plan,
            tasks,
            harnesses,
            options,
            admission: None,
        }
    }

    /// Starts groups only under `admission`'s staleness bound (when training).
    pub fn with_admission(self, admission: Option<Admission>) -> Orchestrator<B> {
        Orchestrator { admission, ..self }
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
            images.insert(id.clone(), self.backend.prepare(task).await);
        }
        let rollouts: Vec<Rollout> = self.plan.rollouts().collect();
        let group_index: BTreeMap<&str, usize> = self
            .plan
            .groups
            .iter()
            .enumerate()
            .map(|(i, g)| (g.id.as_str(), i))
            .collect();
        let order: BTreeMap<String, usize> = rollouts
            .iter()
            .enumerate()
            .map(|(i, r)| (r.id.clone(), i))
            .collect();
        let mut outcomes: Vec<Outcome> = futures::stream::iter(rollouts)
            .map(|r| {
                let image = images[&r.task].clone();
                let group = group_index[r.group.as_str()];
                async move { self.rollout(r, group, image, history, progress).await }
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
        group: usize,
        image: Result<String, (Stage, String)>,
        history: &RunHistory,
        progress: &dyn Progress,
    ) -> Result<Outcome, OrchestratorError> {
        let done = |attempt: String, reward| Outcome {
            rollout_id: rollout.id.clone(),
            harness: rollout.harness.clone(),
            attempt,
            status: None,
            exit_status: None,
            reward,
            model_calls: 0,
            sampled_tokens: 0,
            retries: 0,
            unrouted: Vec::new(),
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
        if let Some(admission) = &self.admission {
            admission.admitted(group).await?;
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
    ) -> Result<Ended, OrchestratorError> {
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
                let attempt = Attempt {
                    run_id: &self.plan.run_id,
                    rollout,
                    id: &id,
                    task,
                    harness,
                    image,
                    api_key: &session.api_key,
                };
                self.backend.run(attempt).await
            }
        };
        let (status, verdict) = judge(&agent, &verifier);
        let exit_status = match agent {
            AgentEnd::Exited(code) => Some(code as i64),
            _ => None,
        };
        let finish = Finish {
            exit_status,
            verifier: Some(verdict.clone()),
            abandon_if_unused: self.options.retry && may_retry(status, tries),
        };
        let finished = self.sessions.finish(&session.session_id, &finish).await?;
        Ok(Ended {
            abandoned: finished.abandoned,
            outcome: Outcome {
                rollout_id: rollout.id.clone(),
                harness: rollout.harness.clone(),
                attempt: id,
                status: Some(status),
                exit_status,
                reward: verdict.reward,
                model_calls: finished.model_calls,
                sampled_tokens: finished.sampled_tokens,
                retries: tries,
                unrouted: finished.unrouted,
            },
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::{AtomicU64, Ordering};
    use std::sync::Mutex;

    /// A learner that publishes `version` and may have stopped.
    #[derive(Default)]
    struct Learner {
        version: AtomicU64,
        stopped: Mutex<Option<String>>,
    }

    impl PolicyClock for std::sync::Arc<Learner> {
        fn newest_version(&self) -> std::pin::Pin<Box<dyn Future<Output = u64> + Send + '_>> {
            Box::pin(async { self.version.load(Ordering::SeqCst) })
        }
        fn stopped(&self) -> Option<String> {
            self.stopped.lock().unwrap().clone()
        }
    }

    fn admission(learner: &std::sync::Arc<Learner>) -> Admission {
        Admission {
            bound: StalenessBound {
                groups_per_step: 1,
                max_staleness: 0,
            },
            clock: Box::new(learner.clone()),
        }
    }

    #[tokio::test]
    async fn a_group_starts_once_the_version_it_needs_is_published() {
        let learner = std::sync::Arc::new(Learner::default());
        admission(&learner).admitted(0).await.unwrap();
        let waiting = tokio::spawn({
            let learner = learner.clone();
            async move { admission(&learner).admitted(2).await }
        });
        tokio::time::sleep(std::time::Duration::from_millis(300)).await;
        assert!(!waiting.is_finished(), "group 2 started on version 0");
        learner.version.store(2, Ordering::SeqCst);
        waiting.await.unwrap().unwrap();
    }

    #[tokio::test]
    async fn a_stopped_learner_fails_a_waiting_group_with_its_reason() {
        let learner = std::sync::Arc::new(Learner::default());
        learner.version.store(1, Ordering::SeqCst);
        let waiting = tokio::spawn({
            let learner = learner.clone();
            async move { admission(&learner).admitted(3).await }
        });
        tokio::time::sleep(std::time::Duration::from_millis(300)).await;
        assert!(!waiting.is_finished());
        *learner.stopped.lock().unwrap() = Some("the learner failed: out of memory".into());
        let err = tokio::time::timeout(std::time::Duration::from_secs(5), waiting)
            .await
            .expect("the wait ends")
            .unwrap()
            .unwrap_err();
        let text = err.to_string();
        assert!(
            text.contains("group 3 waits for policy version 3"),
            "{text}"
        );
        assert!(text.contains("out of memory"), "{text}");
    }
}
