//! An external engine (`--upstream`) in a training loop, for `up --train`
//! and `run --train`: what it is, keeping it serving each version the
//! learner publishes, and reading back the version it serves.

use forgelog_sync::{EngineSync, Kind, Mode, SyncArgs};

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
    #[command(flatten)]
    pub extra_body: forgelog_producers::ExtraBodyArg,
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

    /// How an external engine is made to serve a version (none: it follows
    /// the log itself).
    pub fn synced(&self) -> Option<(Kind, Mode)> {
        self.engine.synced().map(|kind| (kind, self.sync_mode))
    }
}
