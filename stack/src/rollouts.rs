//! A plan's rollouts driven to their end in this process, whatever the
//! backend runs them in.

use crate::StackError;
use forgelog_deploy::orchestrator::{Orchestrator, Progress, SandboxBackend};
use forgelog_deploy_core::{Outcome, RunHistory};
use std::future::Future;

/// Runs the plan (what `history` holds already done) until it ends or
/// `stop` resolves; whatever ended it, the backend removes what is left of
/// the run.
pub async fn drive<B: SandboxBackend>(
    orchestrator: &Orchestrator<B>,
    history: &RunHistory,
    progress: &dyn Progress,
    stop: impl Future<Output = ()>,
) -> Result<Vec<Outcome>, StackError> {
    let result = tokio::select! {
        r = orchestrator.run(history, progress) => r.map_err(StackError::from),
        _ = stop => Err(StackError::Interrupted(orchestrator.plan.run_id.clone())),
    };
    orchestrator.backend.clean_up().await;
    result
}
