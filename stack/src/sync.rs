//! An external engine (`--upstream`) in a training loop: kept serving each
//! version the learner publishes (vLLM, SGLang: `forgelog sync` in this
//! process), or checked to follow the log itself (forgelog's engine).

use crate::StackError;
use forgelog_sync::{EngineSync, Kind, Mode, ModelList, SyncArgs};
use std::path::Path;

/// Makes the engine at `url` (`synced`: vLLM or SGLang; `None`: an engine
/// that follows the log itself, only checked) serve each version `run`
/// publishes, staging checkpoints under `home`, from the one it serves
/// now. The sync's task, whose end (it runs until it fails) stops the loop.
pub async fn follow(
    url: &str,
    synced: Option<(Kind, Mode)>,
    brokers: &str,
    run: &str,
    home: &Path,
) -> Result<Option<SyncTask>, StackError> {
    let Some((kind, mode)) = synced else {
        serves_policy_versions(url).await?;
        return Ok(None);
    };
    let sync = EngineSync::new(SyncArgs {
        stage_dir: Some(home.join("checkpoints-staged")),
        run: Some(run.to_string()),
        ..SyncArgs::new(url, kind, mode)
    });
    // Before any call: the engine names the version it serves first.
    let served = sync.start().await?;
    let brokers = brokers.to_string();
    let times = sync.times();
    let task =
        tokio::spawn(async move { forgelog_sync::follow_from(&sync, &brokers, served).await });
    Ok(Some(SyncTask { task, times }))
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

#[cfg(test)]
impl SyncTask {
    /// A sync that ended with `error` (no engine asked).
    pub(crate) fn ended_with(error: forgelog_sync::SyncError) -> SyncTask {
        let args = SyncArgs::new("http://127.0.0.1:9", Kind::Vllm, Mode::Weights);
        SyncTask {
            task: tokio::spawn(async { Err(error) }),
            times: EngineSync::new(args).times(),
        }
    }
}

/// Resolves when `sync` ends, with why (and leaves `None` in its place);
/// never without one.
pub async fn ended(sync: &mut Option<SyncTask>) -> String {
    let Some(task) = sync.as_mut() else {
        return std::future::pending().await;
    };
    let why = match (&mut task.task).await {
        Ok(Ok(())) => "the engine's sync stopped".to_string(),
        Ok(Err(e)) => format!("the engine's sync failed: {e}"),
        Err(e) => format!("the engine's sync: {e}"),
    };
    *sync = None;
    why
}

/// Whether the engine at `upstream` loads the versions the learner
/// publishes: it says which it serves (`policy_version` in `/v1/models`), as
/// `forgelog engine --brokers … --run RUN` does. One that does not (vLLM)
/// would sample every round with its first weights while the learner took
/// them for on-policy: refused, with what to do.
pub async fn serves_policy_versions(upstream: &str) -> Result<(), StackError> {
    let url = format!("{}/v1/models", upstream.trim_end_matches('/'));
    let failed = |why: String| StackError::Upstream {
        url: url.clone(),
        why,
    };
    let models: ModelList = reqwest::get(&url)
        .await
        .and_then(|r| r.error_for_status())
        .map_err(|e| failed(e.to_string()))?
        .json()
        .await
        .map_err(|e| failed(format!("not JSON: {e}")))?;
    if models.policy_version().is_some() {
        return Ok(());
    }
    Err(StackError::NoPolicyVersions {
        upstream: upstream.to_string(),
        url,
    })
}
