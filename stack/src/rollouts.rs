//! A plan's rollouts driven to their end in this process, whatever the
//! backend runs them in.

use crate::StackError;
use forgelog_deploy::orchestrator::{Orchestrator, Progress, SandboxBackend};
use forgelog_deploy_core::{Outcome, RunHistory};
use std::future::Future;

/// Runs the plan (what `history` holds already done) until it ends or
/// `stop` resolves with why it must (a signal, an engine's sync that ended);
/// whatever ended it, the backend removes what is left of the run.
pub async fn drive<B: SandboxBackend>(
    orchestrator: &Orchestrator<B>,
    history: &RunHistory,
    progress: &dyn Progress,
    stop: impl Future<Output = StackError>,
) -> Result<Vec<Outcome>, StackError> {
    let result = tokio::select! {
        r = orchestrator.run(history, progress) => r.map_err(StackError::from),
        why = stop => Err(why),
    };
    orchestrator.backend.clean_up().await;
    result
}

/// What stops a run's rollouts: `signal` (resume with `--run`), or an
/// external engine's `sync` ending (nothing more may be sampled by a version
/// it did not load).
pub async fn stopped(
    run: &str,
    signal: impl Future<Output = ()>,
    sync: &mut Option<crate::SyncTask>,
) -> StackError {
    tokio::select! {
        _ = signal => StackError::Interrupted(run.to_string()),
        why = crate::ended(sync) => StackError::SyncEnded(why),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use forgelog_api::SessionClient;
    use forgelog_deploy::orchestrator::{Attempt, RunOptions, Silent};
    use forgelog_deploy_core::outcome::{AgentEnd, Stage, VerifierEnd};
    use forgelog_deploy_core::{RunPlan, Task};
    use std::sync::atomic::{AtomicBool, Ordering};

    /// A backend whose sandboxes never finish: only a stop ends its run.
    #[derive(Default)]
    struct Stuck {
        cleaned_up: AtomicBool,
    }

    impl SandboxBackend for Stuck {
        fn prepare(
            &self,
            _: &Task,
        ) -> impl Future<Output = Result<String, (Stage, String)>> + Send {
            std::future::pending()
        }

        fn run(&self, _: Attempt<'_>) -> impl Future<Output = (AgentEnd, VerifierEnd)> + Send {
            std::future::pending()
        }

        async fn clean_up(&self) {
            self.cleaned_up.store(true, Ordering::SeqCst);
        }
    }

    /// Found by reading `forgelog run`: an engine's sync that ended dropped
    /// the rollouts mid-flight, so their sandboxes stayed until the next
    /// run reaped them. It is now a stop like a signal: the run says why
    /// and its sandboxes are removed.
    #[tokio::test]
    async fn a_stopped_run_says_why_and_what_it_left_is_removed() {
        let tasks = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../deploy/tasks");
        let task = Task::load(&tasks.join("hello-file")).unwrap();
        let plan = RunPlan::new("run-stopped", std::slice::from_ref(&task.id), &[], 1);
        let options = RunOptions {
            concurrency: 1,
            max_model_calls: None,
            max_tokens: None,
            retry: false,
        };
        let tasks = [(task.id.clone(), task)].into();
        // Never asked: the run stops while its task's image is prepared.
        let sessions = SessionClient::new("http://127.0.0.1:9", None);
        let orchestrator =
            Orchestrator::new(Stuck::default(), sessions, plan, tasks, [].into(), options);
        let refused = forgelog_sync::SyncError::Refused {
            engine: "vllm".into(),
            route: "/update_weights_from_disk".into(),
            status: 400,
            answer: "no version 3".into(),
        };
        let mut sync = Some(crate::SyncTask::ended_with(refused));
        let stop = stopped("run-stopped", std::future::pending(), &mut sync);
        let why = drive(&orchestrator, &RunHistory::default(), &Silent, stop)
            .await
            .unwrap_err();
        assert_eq!(
            why.to_string(),
            "the engine's sync failed: vllm /update_weights_from_disk refused (HTTP 400): no version 3"
        );
        assert!(orchestrator.backend.cleaned_up.load(Ordering::SeqCst));
        assert!(sync.is_none(), "the ended sync is taken");

        let stop = stopped("run-stopped", async {}, &mut sync);
        let why = drive(&orchestrator, &RunHistory::default(), &Silent, stop)
            .await
            .unwrap_err();
        assert_eq!(
            why.to_string(),
            "interrupted: resume with --run run-stopped"
        );
    }
}
