//! forgelog-stack: one run's processes in this process. The embedded engine
//! ([`LocalEngine`]), the consumers and the learner ([`Learning`], whose end
//! [`LearnerEnd`] says), an external engine kept serving each version the
//! learner publishes ([`follow`], [`SyncTask`]), and the clocks a training
//! run's admission reads ([`LogClock`]: what the log says was published;
//! [`ServedClock`]: what the engine says it serves), the engine and proxy
//! that answer a run's calls ([`Serving`]) and the waits of the loop that
//! drives it ([`events_at_least`], [`versions_published`], the demo's
//! [`demo_rounds`]). `forgelog up`, `up
//! --demo`, `run` and `run --train` start them as one [`RunStack`] and
//! print; nothing here prints.

mod clock;
mod demo;
mod engine;
mod history;
mod learning;
mod replay;
mod rollouts;
mod run;
mod serving;
mod sync;
mod wait;

pub use clock::{LogClock, ServedClock};
pub use demo::{demo_learner, demo_outcome, demo_rounds, DemoOutcome, DemoRounds, RoundWatch};
pub use engine::LocalEngine;
pub use history::{run_events, run_history};
pub use learning::{learner_settings, LearnerEnd, Learning};
pub use replay::{Replay, ReplayConfig, Replayed};
pub use rollouts::{drive, stopped};
pub use run::{engine_reader, proxy_addr, LearningConfig, RunStack};
pub use serving::{token_in, Serving, ServingConfig};
pub use sync::{ended, follow, serves_policy_versions, until_served, SyncTask};
pub use wait::{events_at_least, last_versions, versions_published, LastVersions, Served};

#[derive(Debug, thiserror::Error)]
pub enum StackError {
    #[error(transparent)]
    Io(#[from] std::io::Error),
    /// The embedded engine did not come up.
    #[error("the engine {0}")]
    Engine(String),
    #[error("--upstream: {url}: {why}")]
    Upstream { url: String, why: String },
    /// An engine that cannot be made to serve the learner's versions.
    #[error(
        "--train with --upstream {upstream}: that engine does not report the policy version it \
         serves ({url} has no policy_version), so it would not load what the learner publishes. \
         Use --engine vllm or --engine sglang (this process then makes it serve each version), \
         an engine that follows the log (forgelog engine --brokers BROKERS --run RUN), or leave \
         out --upstream for the embedded one."
    )]
    NoPolicyVersions { upstream: String, url: String },
    #[error(transparent)]
    Sync(#[from] forgelog_sync::SyncError),
    #[error("the capture proxy: {0}")]
    Proxy(String),
    #[error("cannot load the tokenizer and chat template of {spec:?}: {why}")]
    TokenIn { spec: String, why: String },
    #[error(transparent)]
    Log(#[from] forgelog_stream::ConsumeError),
    /// What a wait waited for did not come in time.
    #[error("{0}")]
    Late(String),
    #[error(transparent)]
    Orchestrator(#[from] forgelog_deploy::orchestrator::OrchestratorError),
    /// A signal stopped a run's rollouts.
    #[error("interrupted: resume with --run {0}")]
    Interrupted(String),
    /// An external engine's sync ended (nothing more may be sampled by a
    /// version it did not load): why.
    #[error("{0}")]
    SyncEnded(String),
    /// The learner failed (it publishes no more versions): why.
    #[error("{0}")]
    LearnerFailed(String),
    #[error(transparent)]
    Kit(#[from] forgelog_deploy::kit::KitError),
    #[error(transparent)]
    RunDir(#[from] forgelog_podman::run_dir::RunDirError),
    #[error("sandbox networks (forgelog run needs root for network namespaces): {0}")]
    Network(#[from] forgelog_podman::NetworkError),
    #[error(transparent)]
    Replay(#[from] forgelog_deploy_core::replay::ReplayPlanError),
    #[error("the SFT export: {0}")]
    Export(String),
    #[error(
        "--pin-clock needs libfaketime (apt-get install libfaketime, or FORGELOG_LIBFAKETIME=FILE)"
    )]
    NoLibfaketime,
}
