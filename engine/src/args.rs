//! The `forgelog engine` command line.

use crate::access;
use crate::{DeviceKind, EngineError, DEFAULT_MAX_CHECKPOINT_BYTES};
use std::net::SocketAddr;

/// `forgelog engine`: serve a policy over the OpenAI/vLLM API.
#[derive(Debug, Clone, clap::Args)]
pub struct EngineArgs {
    /// `smollm2` (the default GGUF from scripts/fetch-model.sh), a .gguf file,
    /// or a Hugging Face llama/qwen2/qwen3 directory.
    #[arg(long, default_value = "smollm2")]
    pub model: String,
    /// Where the engine serves its OpenAI-compatible API
    #[arg(long, default_value = "127.0.0.1:8000")]
    pub listen: SocketAddr,
    /// Where the model runs: cpu, or cuda (a build with `--features cuda`)
    #[arg(long, default_value_t = DeviceKind::Cpu)]
    pub device: DeviceKind,
    /// Follow `PolicyPublished` on `forgelog.policy` at these brokers and load each new policy.
    // A flag only: following the log is the engine's choice, not the
    // environment's (FORGELOG_BROKERS is set wherever a broker is).
    #[arg(long)]
    pub brokers: Option<String>,
    /// Only follow policies of this run.
    #[arg(long, env = "FORGELOG_RUN")]
    pub run: Option<String>,
    /// Bearer token for `POST /admin/reload`; none given: a random one, printed
    #[arg(long, env = "FORGELOG_ENGINE_ADMIN_TOKEN", value_parser = forgelog_http::admin_token_arg)]
    pub admin_token: Option<String>,
    /// `/admin/reload` loads checkpoints from under this URL only
    /// (`file:///…/checkpoints/`, `s3://bucket/prefix/`); none: reload over HTTP is off
    #[arg(long, env = "FORGELOG_CHECKPOINT_ROOT")]
    pub checkpoint_root: Option<String>,
    /// Larger checkpoints are refused before they are read
    #[arg(long, default_value_t = DEFAULT_MAX_CHECKPOINT_BYTES >> 20, value_parser = clap::value_parser!(u64).range(1..))]
    pub max_checkpoint_mib: u64,
    /// Memory for the keys and values of recent sequences, reused by
    /// requests that begin the same way (0: off)
    #[arg(long, default_value_t = DEFAULT_PREFIX_CACHE_MIB)]
    pub prefix_cache_mib: u64,
}

/// The prefix cache's memory by default.
pub const DEFAULT_PREFIX_CACHE_MIB: u64 = 512;

impl EngineArgs {
    /// Who may reload over HTTP: the token given (or a new one), the root.
    pub fn reload_access(&self) -> Result<access::ReloadAccess, EngineError> {
        let checkpoint_root = self
            .checkpoint_root
            .as_deref()
            .map(access::ReloadAccess::root)
            .transpose()
            .map_err(|e| EngineError::Checkpoint(format!("--checkpoint-root: {e}")))?;
        Ok(access::ReloadAccess {
            admin_token: self
                .admin_token
                .clone()
                .unwrap_or_else(forgelog_http::random_token),
            checkpoint_root,
            max_checkpoint_bytes: self.max_checkpoint_mib.saturating_mul(1 << 20),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::Parser;

    /// How the `forgelog` CLI embeds the arguments.
    #[derive(Parser)]
    struct Cli {
        #[command(subcommand)]
        command: Command,
    }

    #[derive(clap::Subcommand)]
    enum Command {
        Engine(EngineArgs),
    }

    #[test]
    fn arguments_parse_as_a_subcommand() {
        let Command::Engine(args) = Cli::parse_from(["forgelog", "engine"]).command;
        assert_eq!(
            (args.model.as_str(), args.listen.to_string()),
            ("smollm2", "127.0.0.1:8000".into())
        );
        assert_eq!((args.device, args.brokers), (DeviceKind::Cpu, None));
        let Command::Engine(args) = Cli::parse_from([
            "forgelog",
            "engine",
            "--model",
            "/models/qwen",
            "--listen",
            "0.0.0.0:9000",
            "--device",
            "cuda",
            "--brokers",
            "kafka:9092",
        ])
        .command;
        assert_eq!(args.device, DeviceKind::Cuda);
        assert_eq!(args.brokers.as_deref(), Some("kafka:9092"));
    }
}
