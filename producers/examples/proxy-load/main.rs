//! Load bench for the capture proxy.
//!
//! `proxy-load fake-upstream --listen ADDR --delay-ms 50`: a vLLM-compatible
//! fake engine (token ids, logprobs, fixed delay).
//! `proxy-load run [--sessions 100,1000,10000]`: starts a fake upstream and a
//! proxy as child processes (so the proxy's CPU and RSS are its own, read
//! from /proc/PID), then for each N runs N concurrent sessions of 4
//! multi-turn calls whose prompts extend the previous turn: first straight
//! against the upstream (the baseline), then through the proxy. With
//! `--upstream URL --proxy URL [--proxy-pid PID] [--no-sessions]` the same load
//! goes to servers already running: forgelog's or any other proxy, for comparison.
//!
//! `--token-in`: the proxy renders the prompts itself with the fake model's
//! tokenizer and template and splices each follow-up call onto the ids of the
//! one before (token in, as it runs for the embedded engine and vLLM).
//!
//! A real harness runs tools between its calls. `--think-ms` models that
//! pause: with it, the N sessions start spread over one call-and-think cycle
//! and N / (delay + think) calls per second are offered; with 0 every session
//! calls back to back, which saturates the machine from a few hundred
//! sessions on, and the added latency is then queueing for CPU.

use clap::{Parser, Subcommand};

mod load;
mod servers;

// The proxy allocates per call (JSON, events); mimalloc costs about 30% less CPU per call here.
#[global_allocator]
static ALLOCATOR: mimalloc::MiMalloc = mimalloc::MiMalloc;

use forgelog_producers::fake_upstream::{self, FakeOptions};
use forgelog_producers::{raise_fd_limit, ProxyArgs};
use std::net::SocketAddr;
use std::time::Duration;

#[derive(Parser)]
#[command(about = "forgelog capture proxy load bench")]
struct Cli {
    #[command(subcommand)]
    command: Cmd,
}

#[derive(Subcommand)]
enum Cmd {
    /// Serve a fake vLLM-compatible upstream
    FakeUpstream {
        #[arg(long, default_value = "127.0.0.1:8000")]
        listen: SocketAddr,
        #[arg(long, default_value_t = 50)]
        delay_ms: u64,
        /// Answer without token ids and logprobs (an untrainable backend)
        #[arg(long)]
        without_ids: bool,
    },
    /// Serve the proxy (what `forgelog proxy` runs)
    Proxy(ProxyArgs),
    /// Run the load test
    Run(RunArgs),
}

fn main() -> anyhow::Result<()> {
    tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_default_env().unwrap_or_else(|_| "warn".into()),
        )
        .with_writer(std::io::stderr)
        .init();
    raise_fd_limit();
    let rt = tokio::runtime::Runtime::new()?;
    match Cli::parse().command {
        Cmd::FakeUpstream {
            listen,
            delay_ms,
            without_ids,
        } => rt.block_on(async {
            let options = FakeOptions {
                delay: Duration::from_millis(delay_ms),
                without_ids,
                ..Default::default()
            };
            let (addr, _) = fake_upstream::spawn(listen, options).await?;
            eprintln!("fake upstream on http://{addr} ({delay_ms} ms per call)");
            std::future::pending::<()>().await;
            Ok(())
        }),
        Cmd::Proxy(args) => {
            let token_in = args.tokenizer.as_deref().map(token_in).transpose()?;
            rt.block_on(async { Ok(forgelog_producers::run(args, token_in).await?) })
        }
        Cmd::Run(args) => rt.block_on(servers::run(args)),
    }
}

/// The tokenizer and template of the model folder `dir` (the fake model's).
fn token_in(dir: &str) -> anyhow::Result<forgelog_producers::upstream::TokenIn> {
    let codec = forgelog_model::load_chat_codec(dir, std::path::Path::new(dir))?;
    let (tokenizer_sha256, chat_template_sha256) = codec.sha256s();
    Ok(forgelog_producers::upstream::TokenIn {
        renderer: std::sync::Arc::new(codec),
        tokenizer_sha256,
        chat_template_sha256,
    })
}

#[derive(clap::Args)]
pub(crate) struct RunArgs {
    /// Concurrent sessions per round
    #[arg(long, value_delimiter = ',', default_value = "100,1000,10000")]
    pub(crate) sessions: Vec<usize>,
    #[arg(long, default_value_t = 4)]
    pub(crate) calls: usize,
    /// Tokens of task text in each session's first message, re-sent with the
    /// growing history on every call (the fake upstream's tokens are bytes)
    #[arg(long, default_value_t = 0)]
    pub(crate) prompt_tokens: usize,
    /// Sessions per GRPO group, which share their task as a group's rollouts
    /// do (1: every session its own task)
    #[arg(long, default_value_t = 8)]
    pub(crate) group_size: usize,
    /// Pause between a session's calls (its harness running tools), per round
    #[arg(long, value_delimiter = ',', default_value = "1000,0")]
    pub(crate) think_ms: Vec<u64>,
    /// Delay of the fake upstream started here
    #[arg(long, default_value_t = 50)]
    pub(crate) delay_ms: u64,
    /// The proxy started here renders prompts and splices follow-up calls
    /// (token in), with the fake model's tokenizer and template
    #[arg(long, conflicts_with = "proxy")]
    pub(crate) token_in: bool,
    /// Load this upstream instead of starting a fake one
    #[arg(long)]
    pub(crate) upstream: Option<String>,
    /// Load this proxy (in front of `--upstream`) instead of starting one
    #[arg(long, requires = "upstream")]
    pub(crate) proxy: Option<String>,
    /// With `--proxy`: it is not forgelog, so open no forgelog sessions
    #[arg(long, requires = "proxy")]
    pub(crate) no_sessions: bool,
    /// The session API's admin token of `--proxy`
    #[arg(long, env = "FORGELOG_ADMIN_TOKEN", requires = "proxy")]
    pub(crate) admin_token: Option<String>,
    /// The process to measure CPU and memory of, with `--proxy`
    #[arg(long, requires = "proxy")]
    pub(crate) proxy_pid: Option<u32>,
    #[arg(long, env = "FORGELOG_BROKERS", default_value = forgelog_stream::DEFAULT_BROKERS)]
    pub(crate) brokers: String,
}

/// The session API token of the proxy started here.
pub(crate) const ADMIN: &str = "proxy-load-admin";
