//! A recorded run re-run (`forgelog run --replay R`): its rollouts in local
//! sandboxes, each in the same task image with the same harness bundle,
//! paths and home (and, pinned, its clock at the recorded start), a proxy
//! answering every call from the recording; then how each re-run ended
//! against its recording, and every call that differed.

use crate::{drive, StackError};
use forgelog_api::SessionClient;
use forgelog_deploy::kit::Kit;
use forgelog_deploy::orchestrator::{Orchestrator, Progress, RunOptions};
use forgelog_deploy_core::replay::ReplayedAttempt;
use forgelog_deploy_core::{RecordedRun, RunHistory};
use forgelog_podman::run_dir::RunDir;
use forgelog_podman::{LocalBackend, PinnedClocks, Podman};
use forgelog_producers::replay::{Matching, RecordedUpstream, Recording, ReportEntry};
use forgelog_producers::server::ProxyConfig;
use forgelog_producers::RunningProxy;
use forgelog_schemas::Topic;
use forgelog_stream::{LogReader, RunLog};
use std::future::Future;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

/// What a replay re-runs, and how.
#[derive(Debug, Clone)]
pub struct ReplayConfig {
    pub run: String,
    /// The task directories the run ran.
    pub tasks_dir: PathBuf,
    /// Only these recorded rollouts (every finished one when empty).
    pub rollouts: Vec<String>,
    /// How a re-run call is matched to its recorded one.
    pub matching: Matching,
    /// Each sandbox's clock at its recorded start (libfaketime).
    pub pin_clock: bool,
    pub concurrency: usize,
    pub proxy_listen: SocketAddr,
    /// forgelog's home: the harness bundles, and the replay's run folder
    /// (`runs/R.replay`, beside the recorded run's).
    pub home: PathBuf,
}

/// A replay read from the log and ready to start.
pub struct Replay {
    config: ReplayConfig,
    recorded: RecordedRun,
    calls: Recording,
    kit: Kit,
    clocks: Option<PinnedClocks>,
    /// How the tasks and harnesses here differ from the bundle's (a bundle
    /// only), in words.
    pub warnings: Vec<String>,
}

/// How the replay went.
pub struct Replayed {
    pub rollouts: usize,
    /// Each recorded attempt against its re-run.
    pub attempts: Vec<ReplayedAttempt>,
    /// Every call that differed from its recorded one.
    pub divergences: Vec<ReportEntry>,
    /// Calls that had no recorded answer.
    pub refused: Vec<String>,
}

impl Replay {
    /// Reads the recorded run from `log` (one read: its rollouts, verdicts
    /// and calls) and the kit it ran.
    pub fn read(log: &RunLog, config: ReplayConfig) -> Result<Replay, StackError> {
        let run = &config.run;
        let events = log.run_events(run, &[Topic::Rollouts, Topic::Rewards, Topic::Calls])?;
        let recorded = RecordedRun::from_events(run, &events, &config.rollouts)?;
        let calls = Recording::from_events(run, &events);
        drop(events);
        let bundles = config.home.join("harnesses");
        let kit = Kit::of_recorded(&recorded.plan, &config.tasks_dir, &bundles)?;
        let warnings = match log {
            RunLog::Bundle(b) => kit.differences_from(&b.manifest.hashes)?,
            _ => Vec::new(),
        };
        let clocks = match config.pin_clock {
            false => None,
            true => Some(PinnedClocks {
                libfaketime: PinnedClocks::find_libfaketime().ok_or(StackError::NoLibfaketime)?,
                starts: recorded
                    .attempts
                    .iter()
                    .map(|a| (a.rollout.id.clone(), a.started_at_ms))
                    .collect(),
            }),
        };
        Ok(Replay {
            config,
            recorded,
            calls,
            kit,
            clocks,
            warnings,
        })
    }

    /// The rollouts it re-runs.
    pub fn rollouts(&self) -> usize {
        self.recorded.plan.rollouts.len()
    }

    /// Whether the sandboxes' clocks are pinned.
    pub fn pinned(&self) -> bool {
        self.clocks.is_some()
    }

    /// Re-runs the rollouts through a proxy answering from the recording
    /// (`started` is told its URL), until they end or `stop` resolves.
    pub async fn run(
        self,
        progress: &dyn Progress,
        started: impl FnOnce(&str),
        stop: impl Future<Output = ()>,
    ) -> Result<Replayed, StackError> {
        let Replay {
            config,
            recorded,
            calls,
            kit,
            clocks,
            ..
        } = self;
        let run = &config.run;
        // The replay's own folder: its sandboxes, network slots and harness
        // output, beside (not over) the recorded run's.
        let dir = RunDir::acquire(&config.home, &format!("{run}.replay"))?;
        let upstream = Arc::new(RecordedUpstream::new(calls, config.matching.clone()));
        let token = forgelog_http::random_token();
        let proxy_config = ProxyConfig {
            run_id: Some(run.clone()),
            admin_token: Some(token.clone()),
            upstream_timeout: Duration::from_secs(60),
            ..ProxyConfig::new(format!("recorded run {run}"))
        };
        let proxy = RunningProxy::replay_from(proxy_config, upstream.clone(), config.proxy_listen)
            .await
            .map_err(|e| StackError::Proxy(e.to_string()))?;
        started(&proxy.url());
        let bundles = config.home.join("harnesses");
        let mut backend = LocalBackend::new(Podman::default(), bundles, proxy.addr, dir);
        if let Some(clocks) = clocks {
            backend = backend.with_clocks(clocks);
        }
        backend.check().await?;
        // Only the recorded attempts have answers: none is tried again.
        let options = RunOptions {
            concurrency: config.concurrency,
            max_model_calls: None,
            max_tokens: None,
            retry: false,
        };
        let sessions = SessionClient::new(proxy.url(), Some(token));
        let (tasks, harnesses) = (kit.tasks, kit.harnesses);
        let plan = recorded.plan.clone();
        let orchestrator = Orchestrator::new(backend, sessions, plan, tasks, harnesses, options);
        let mut no_sync = None;
        let stop = crate::stopped(&recorded.plan.run_id, stop, &mut no_sync);
        let outcomes = drive(&orchestrator, &RunHistory::default(), progress, stop).await;
        proxy
            .shutdown(Duration::from_secs(1))
            .await
            .map_err(|e| StackError::Proxy(e.to_string()))?;
        Ok(Replayed {
            rollouts: recorded.plan.rollouts.len(),
            attempts: recorded.compare(&outcomes?),
            divergences: upstream.report(),
            refused: upstream.refused(),
        })
    }
}

impl Replayed {
    /// Re-runs that ended otherwise than their recording.
    pub fn differing(&self) -> usize {
        let differs = |a: &&ReplayedAttempt| !a.differences().is_empty();
        self.attempts.iter().filter(differs).count()
    }

    /// Calls that differed in more than volatile fields.
    pub fn unexplained(&self) -> usize {
        self.divergences.iter().filter(|e| !e.explained).count()
    }

    /// Whether the replay did what the recording did.
    pub fn same(&self) -> bool {
        self.differing() + self.unexplained() + self.refused.len() == 0
    }

    /// The comparison and the divergences as JSON (`--report`).
    pub fn to_json(&self, run: &str) -> serde_json::Value {
        let attempts: Vec<serde_json::Value> = self
            .attempts
            .iter()
            .map(|r| {
                serde_json::json!({
                    "attempt": r.attempt,
                    "harness": r.harness,
                    "recorded": r.recorded,
                    "replayed": r.replayed,
                    "differences": r.differences(),
                })
            })
            .collect();
        serde_json::json!({
            "run": run,
            "attempts": attempts,
            "divergences": self.divergences,
            "refused": self.refused,
        })
    }
}
