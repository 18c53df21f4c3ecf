//! An external engine (`--upstream`) in a training loop, for `up --train`
//! and `run --train`: what it is, keeping it serving each version the
//! learner publishes, and reading back the version it serves.

use anyhow::Result;
use forgelog_sync::{EngineSync, Kind, Mode, SyncArgs};
use std::path::Path;
use std::pin::Pin;

/// What `--upstream` is, and how a trained version reaches it.
#[derive(Debug, Clone, clap::Args)]
pub struct UpstreamArgs {
    /// What --upstream is, with --train: forgelog (an engine that follows the
    /// log itself), vllm or sglang (`forgelog sync` runs in this process and
    /// makes it serve each published version); --model is the folder it serves
    #[arg(long, value_enum, default_value_t = UpstreamKind::Forgelog, requires = "upstream")]
    pub engine: UpstreamKind,
    /// With --train and --engine vllm|sglang: whether it loads full weights or a LoRA adapter per version
    #[arg(long, value_enum, default_value_t = Mode::Weights)]
    pub sync_mode: Mode,
}

/// The engine behind `--upstream`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum UpstreamKind {
    Forgelog,
    Vllm,
    Sglang,
}

impl UpstreamKind {
    /// The engine `forgelog sync` keeps in sync (`None`: forgelog's own
    /// engine follows the log itself).
    pub fn synced(self) -> Option<Kind> {
        match self {
            UpstreamKind::Forgelog => None,
            UpstreamKind::Vllm => Some(Kind::Vllm),
            UpstreamKind::Sglang => Some(Kind::Sglang),
        }
    }
}

impl UpstreamArgs {
    /// Whether the proxy names the newest adapter on each call.
    pub fn policy_adapters(&self) -> bool {
        self.engine.synced().is_some() && self.sync_mode == Mode::Adapter
    }

    /// What a LoRA version publishes: an engine synced with whole weights
    /// needs the merged weights beside the adapter.
    pub fn lora_publish(&self) -> forgelog_trainer::LoraPublish {
        match self.engine.synced().is_some() && self.sync_mode == Mode::Weights {
            true => forgelog_trainer::LoraPublish::Merged,
            false => forgelog_trainer::LoraPublish::Adapter,
        }
    }

    /// Reads what the engine at `url` serves, as a sync reads it back:
    /// vLLM's (and forgelog's engine's) `/weight_info`, or the newest
    /// adapter it lists.
    pub fn reader(&self, url: &str) -> EngineSync {
        // forgelog's engine says its version at `/weight_info`, as vLLM does.
        let (kind, mode) = match self.engine.synced() {
            Some(kind) => (kind, self.sync_mode),
            None => (Kind::Vllm, Mode::Weights),
        };
        EngineSync::new(SyncArgs {
            step_timeout: 10,
            ..SyncArgs::new(url, kind, mode)
        })
    }

    /// For `--train`: makes the engine at `url` serve each version `run`
    /// publishes (staging checkpoints under `home`), from the one it serves
    /// now; an engine that follows the log itself is only checked. The
    /// sync's task, whose end (it runs until it fails) stops the loop.
    pub async fn follow(
        &self,
        url: &str,
        brokers: &str,
        run: &str,
        home: &Path,
    ) -> Result<Option<SyncTask>> {
        let Some(kind) = self.engine.synced() else {
            serves_policy_versions(url).await?;
            return Ok(None);
        };
        let sync = EngineSync::new(SyncArgs {
            stage_dir: Some(home.join("checkpoints-staged")),
            run: Some(run.to_string()),
            ..SyncArgs::new(url, kind, self.sync_mode)
        });
        // Before any call: the engine names the version it serves first.
        let served = sync.start().await?;
        let brokers = brokers.to_string();
        let times = sync.times();
        let task =
            tokio::spawn(async move { forgelog_sync::follow_from(&sync, &brokers, served).await });
        Ok(Some(SyncTask { task, times }))
    }
}

/// Until `engine` says it serves `version` or a newer one (unreachable for
/// a moment: asked again). False at once when it refuses the question (it
/// reports no version at all): nothing to wait for. Unbounded: the caller
/// bounds it.
pub async fn until_served(engine: &EngineSync, version: u64) -> bool {
    loop {
        match engine.served().await {
            Ok(Some(v)) if v >= version => return true,
            Err(forgelog_sync::SyncError::Refused { .. }) => return false,
            _ => tokio::time::sleep(std::time::Duration::from_millis(500)).await,
        }
    }
}

/// A running sync: it ends only by failing.
pub struct SyncTask {
    task: tokio::task::JoinHandle<Result<(), forgelog_sync::SyncError>>,
    /// How long each version took to serve, for the run's summary.
    pub times: forgelog_sync::SyncTimes,
}

/// Resolves when `sync` ends, with why (and leaves `None` in its place);
/// never without one.
pub async fn ended(sync: &mut Option<SyncTask>) -> anyhow::Error {
    let Some(task) = sync.as_mut() else {
        return std::future::pending().await;
    };
    let why = match (&mut task.task).await {
        Ok(Ok(())) => anyhow::anyhow!("the engine's sync stopped"),
        Ok(Err(e)) => anyhow::Error::from(e).context("the engine's sync failed"),
        Err(e) => anyhow::Error::from(e).context("the engine's sync"),
    };
    *sync = None;
    why
}

/// The version an engine serves, as admission reads it: the engine's own
/// word, 0 while it cannot be read.
pub struct ServedClock {
    pub engine: EngineSync,
    /// The learner that publishes the versions: no newer one once it stopped.
    pub learner: crate::learn::LearnerEnd,
}

impl forgelog_deploy::orchestrator::PolicyClock for ServedClock {
    fn newest_version(&self) -> Pin<Box<dyn std::future::Future<Output = u64> + Send + '_>> {
        Box::pin(async move { self.engine.served().await.ok().flatten().unwrap_or(0) })
    }

    fn stopped(&self) -> Option<String> {
        self.learner.get()
    }
}

/// Whether the engine at `upstream` loads the versions the learner
/// publishes: it says which it serves (`policy_version` in `/v1/models`), as
/// `forgelog engine --brokers … --run RUN` does. One that does not (vLLM)
/// would sample every round with its first weights while the learner took
/// them for on-policy: refused, with what to do.
async fn serves_policy_versions(upstream: &str) -> Result<()> {
    let url = format!("{}/v1/models", upstream.trim_end_matches('/'));
    let models: serde_json::Value = reqwest::get(&url)
        .await
        .and_then(|r| r.error_for_status())
        .map_err(|e| anyhow::anyhow!("--upstream: {url}: {e}"))?
        .json()
        .await
        .map_err(|e| anyhow::anyhow!("--upstream: {url}: not JSON: {e}"))?;
    if models["policy_version"].is_u64() || models["data"][0]["policy_version"].is_u64() {
        return Ok(());
    }
    anyhow::bail!(
        "--train with --upstream {upstream}: that engine does not report the policy version it serves \
         ({url} has no policy_version), so it would not load what the learner publishes. \
         Use --engine vllm or --engine sglang (this process then makes it serve each version), \
         an engine that follows the log (forgelog engine --brokers BROKERS --run RUN), \
         or leave out --upstream for the embedded one."
    )
}
