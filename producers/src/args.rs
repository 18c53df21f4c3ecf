//! The command lines of `forgelog proxy` and `forgelog replay serve`, and
//! the proxy configurations they make.

use crate::server::{ProxyConfig, Replicas};
use crate::ProxyError;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::time::Duration;

/// What `forgelog proxy` and `forgelog replay serve` both take: where to listen
/// and read/write the log, who may create sessions, how large a body may be.
#[derive(Debug, Clone, clap::Args)]
pub struct ServeArgs {
    /// Where the proxy listens: harnesses point their base URL here
    #[arg(long, default_value = "127.0.0.1:8100")]
    pub listen: SocketAddr,
    /// Kafka bootstrap servers (comma-separated host:port)
    #[arg(long, env = "FORGELOG_BROKERS", default_value = forgelog_stream::DEFAULT_BROKERS)]
    pub brokers: String,
    /// Bearer token for the session API (POST /sessions, /sessions/{id}/finish);
    /// none given: a random one, printed at start
    #[arg(long, env = "FORGELOG_ADMIN_TOKEN", value_parser = forgelog_http::admin_token_arg)]
    pub admin_token: Option<String>,
    /// Largest request body accepted, in MiB (at most 7: a call's events must
    /// fit the log's 16 MiB messages)
    #[arg(long, default_value_t = (ProxyConfig::BODY_LIMIT >> 20) as u64,
          value_parser = clap::value_parser!(u64).range(1..=(ProxyConfig::BODY_LIMIT >> 20) as u64))]
    pub body_limit_mib: u64,
}

/// `forgelog proxy`: the capture proxy.
#[derive(Debug, Clone, clap::Args)]
pub struct ProxyArgs {
    /// Base URL of the vLLM-compatible inference engine, e.g. http://127.0.0.1:8000
    #[arg(long, env = "FORGELOG_UPSTREAM", value_parser = forgelog_http::http_url_arg)]
    pub upstream: String,
    #[command(flatten)]
    pub serve: ServeArgs,
    /// Local spool directory: events wait here while the broker is away
    #[arg(long, default_value = ".forgelog/proxy-spool")]
    pub spool: PathBuf,
    /// Run id for sessions created without one (`--run`, as every command
    /// names a run; `--run-id` is its older name)
    #[arg(long = "run", alias = "run-id", env = "FORGELOG_RUN")]
    pub run_id: Option<String>,
    /// Calls one session may have in flight at once, i.e. concurrent, not in
    /// total (more get 429; the total is the session's `max_model_calls`)
    #[arg(long, alias = "max-calls-per-session", default_value_t = ProxyConfig::MAX_CALLS_IN_FLIGHT, value_parser = clap::value_parser!(u32).range(1..))]
    pub max_calls_in_flight: u32,
    /// Give up on the upstream after this many seconds
    #[arg(long, default_value_t = ProxyConfig::UPSTREAM_TIMEOUT.as_secs(), value_parser = clap::value_parser!(u64).range(1..))]
    pub upstream_timeout_secs: u64,
    /// SSE keep-alive interval while the upstream works, in seconds
    #[arg(long, default_value_t = ProxyConfig::KEEP_ALIVE.as_secs(), value_parser = clap::value_parser!(u64).range(1..))]
    pub keep_alive_secs: u64,
    /// Requests in flight to the upstream at most (more wait for a turn)
    #[arg(long, default_value_t = ProxyConfig::MAX_UPSTREAM_REQUESTS, value_parser = forgelog_config::value::one_or_more)]
    pub max_upstream_requests: usize,
    /// Every replica's base URL, in the same order for all (comma-separated),
    /// when several serve one address: each holds the sessions it owns and
    /// passes the others' requests on
    #[arg(long, env = "FORGELOG_REPLICAS", value_delimiter = ',', value_parser = forgelog_http::http_url_arg)]
    pub replicas: Vec<String>,
    /// Which of --replicas this one is (default: the number that ends
    /// $HOSTNAME, as a StatefulSet names its pods)
    #[arg(long, env = "FORGELOG_REPLICA_INDEX")]
    pub replica_index: Option<usize>,
    /// The model whose tokenizer and chat template the proxy renders prompts
    /// with (`smollm2`, a .gguf file or a Hugging Face folder): follow-up
    /// calls are spliced onto the ids the model sampled and the engine is
    /// asked with token ids. Without it the engine renders each chat
    #[arg(long, env = "FORGELOG_TOKENIZER")]
    pub tokenizer: Option<String>,
    /// The engine serves each policy version as a LoRA adapter named
    /// policy@N (`forgelog sync --sync-mode adapter`): every call asks for
    /// the newest one it lists and is stamped with its version
    #[arg(long)]
    pub policy_adapters: bool,
    #[command(flatten)]
    pub extra_body: ExtraBodyArg,
}

/// `--extra-body`, for every command that starts a proxy.
#[derive(Debug, Clone, Default, clap::Args)]
pub struct ExtraBodyArg {
    /// A JSON object whose fields go on every request to the engine, as the
    /// OpenAI SDK's extra_body (vLLM: '{"structured_outputs": {"regex": ...}}',
    /// repetition_penalty, priority); each call records them. The proxy's own
    /// fields (messages, how it samples, logprobs) are refused. A grammar or
    /// penalty changes the distribution the recorded logprobs come from
    #[arg(long = "extra-body", env = "FORGELOG_EXTRA_BODY")]
    pub extra_body: Option<crate::upstream::ExtraBody>,
}

impl ExtraBodyArg {
    pub fn fields(&self) -> crate::upstream::ExtraBody {
        self.extra_body.clone().unwrap_or_default()
    }
}

impl ServeArgs {
    /// The admin token given, or a new random one (a server on a port is never open).
    fn admin_token(&self) -> String {
        self.admin_token
            .clone()
            .unwrap_or_else(forgelog_http::random_token)
    }
}

impl ProxyArgs {
    /// The replica set, if several were listed.
    fn replicas(&self) -> Result<Option<Replicas>, ProxyError> {
        if self.replicas.is_empty() {
            return Ok(None);
        }
        let index = match self.replica_index {
            Some(i) => i,
            None => std::env::var("HOSTNAME")
                .ok()
                .and_then(|h| h.rsplit('-').next()?.parse().ok())
                .ok_or_else(|| {
                    ProxyError::Replicas(
                        "--replicas without --replica-index, and $HOSTNAME does not end in -N"
                            .into(),
                    )
                })?,
        };
        Replicas::new(self.replicas.clone(), index)
            .map(Some)
            .map_err(ProxyError::Replicas)
    }

    /// The proxy's configuration; its admin token is the one given or a new one.
    pub fn config(&self) -> Result<ProxyConfig, ProxyError> {
        Ok(ProxyConfig {
            upstream: self.upstream.clone(),
            run_id: self.run_id.clone(),
            admin_token: Some(self.serve.admin_token()),
            body_limit: (self.serve.body_limit_mib as usize) << 20,
            max_calls_in_flight: self.max_calls_in_flight,
            upstream_timeout: Duration::from_secs(self.upstream_timeout_secs),
            keep_alive: Duration::from_secs(self.keep_alive_secs),
            max_upstream_requests: self.max_upstream_requests,
            shutdown_grace: ProxyConfig::SHUTDOWN_GRACE,
            replicas: self.replicas()?,
            token_in: None,
            policy_adapters: self.policy_adapters,
            extra_body: self.extra_body.fields(),
        })
    }
}

/// `forgelog replay serve`: the proxy answering from a recorded run instead of the engine.
#[derive(Debug, Clone, clap::Args)]
pub struct ReplayServeArgs {
    /// The recorded run to answer from
    #[arg(long, env = "FORGELOG_RUN")]
    pub run: String,
    /// Answer every call from the recording, even one that differs, and report
    /// how it differed: explained where only volatile fields did (dates, UUIDs,
    /// temporary paths, versions, hashes, --volatile)
    #[arg(long)]
    pub lenient: bool,
    /// A regular expression for more volatile text (with --lenient; repeatable)
    #[arg(long, requires = "lenient")]
    pub volatile: Vec<String>,
    /// Write the replay report (every call that differed) here as JSON on exit
    #[arg(long)]
    pub report: Option<PathBuf>,
    /// Answer from this bundle of the run (`forgelog export bundle`) instead of the log
    #[arg(long)]
    pub bundle: Option<PathBuf>,
    #[command(flatten)]
    pub serve: ServeArgs,
}

impl ReplayServeArgs {
    pub fn config(&self) -> ProxyConfig {
        ProxyConfig {
            run_id: Some(self.run.clone()),
            admin_token: Some(self.serve.admin_token()),
            body_limit: (self.serve.body_limit_mib as usize) << 20,
            upstream_timeout: Duration::from_secs(60),
            ..ProxyConfig::new(format!("recorded run {}", self.run))
        }
    }
}
