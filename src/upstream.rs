//! What answers the calls of `up` and `run`: the embedded engine or an
//! external one (`--upstream`), how the proxy renders prompts, and, in a
//! training loop, how the external engine is kept serving each version the
//! learner publishes and how the version it serves is read back.

use forgelog_stack::ServingConfig;
use forgelog_sync::{Kind, Mode};
use std::path::PathBuf;

/// The engine and the proxy's rendering, as `up` and `run` take them.
#[derive(Debug, Clone, clap::Args)]
pub struct ServingArgs {
    /// Use this vLLM-compatible engine instead of starting the embedded one
    /// (`forgelog engine`)
    #[arg(long, value_parser = forgelog_http::http_url_arg)]
    pub upstream: Option<String>,
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
    /// The model the embedded engine serves and the learner trains
    #[arg(long, default_value = "smollm2")]
    pub model: String,
    /// The model whose tokenizer and chat template the proxy renders prompts
    /// with (token in: a session's calls spliced into one sequence; default:
    /// --model when the embedded engine serves it or --train trains it, which
    /// an --upstream engine (not SGLang) must then serve, checked at start;
    /// `none`: the engine renders)
    #[arg(long)]
    pub tokenizer: Option<String>,
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

impl ServingArgs {
    /// How run `run`'s calls are served: the embedded engine on the CPU and
    /// both servers on free local ports unless the caller says otherwise;
    /// the proxy's spool in `spool`, a sync's staged checkpoints in `home`.
    pub fn config(&self, run: &str, train: bool, spool: PathBuf, home: PathBuf) -> ServingConfig {
        let free_local = std::net::SocketAddr::from(([127, 0, 0, 1], 0));
        ServingConfig {
            run: run.to_string(),
            upstream: self.upstream.clone(),
            model: self.model.clone(),
            device: forgelog_engine::DeviceKind::Cpu,
            engine_listen: free_local,
            train,
            synced: self.synced(),
            tokenizer: self.tokenizer.clone(),
            policy_adapters: self.policy_adapters(),
            extra_body: self.extra_body.fields(),
            proxy_listen: free_local,
            spool,
            home,
        }
    }

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

    /// How an external engine is made to serve a version (none: it follows
    /// the log itself).
    pub fn synced(&self) -> Option<(Kind, Mode)> {
        self.engine.synced().map(|kind| (kind, self.sync_mode))
    }
}
