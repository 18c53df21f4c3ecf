//! The `forgelog` command line: one module per subcommand, each only wiring
//! the component crates together.

use anyhow::Result;
use clap::{Args, Parser, Subcommand};
use forgelog_stream::StreamConfig;

// The proxy and engine allocate per call (JSON, events); mimalloc costs less
// CPU per call than glibc's allocator (proxy-load: about 30% less).
#[global_allocator]
static ALLOCATOR: mimalloc::MiMalloc = mimalloc::MiMalloc;

mod broker;
mod consume;
mod demo;
mod export;
mod replay;
mod report;
mod run;
mod source;
mod spool;
mod sync;
mod tail;
mod tasks;
mod topics;
mod up;
mod upstream;
mod view;

#[derive(Parser)]
#[command(
    name = "forgelog",
    version,
    about = "Capture, log and train LLM agents inside their real harnesses"
)]
struct Cli {
    #[command(subcommand)]
    command: Command,
    /// More log output: -v info, -vv debug, -vvv trace (RUST_LOG, when set, says exactly what)
    #[arg(short, long, action = clap::ArgAction::Count, global = true)]
    verbose: u8,
    /// Only errors in the log output
    #[arg(short, long, global = true, conflicts_with = "verbose")]
    quiet: bool,
    /// Defaults for train, run and up from this TOML file (default: ./forgelog.toml when present); flags and their environment variables win
    #[arg(long, global = true, env = "FORGELOG_CONFIG")]
    config: Option<std::path::PathBuf>,
}

/// Where the log is: every subcommand that reads or writes it takes these.
#[derive(Args, Clone, Debug)]
pub struct BrokerArgs {
    /// Kafka bootstrap servers (comma-separated host:port)
    #[arg(long, env = "FORGELOG_BROKERS", default_value = forgelog_stream::DEFAULT_BROKERS)]
    pub brokers: String,
    /// Where events too large for one record of the log go, as claim checks (an object_store URL or a path; default: claims/ under FORGELOG_HOME)
    #[arg(long, env = forgelog_stream::claims::CLAIMS_ENV, value_parser = nonblank)]
    pub claims: Option<String>,
    /// The largest record (key and value, bytes) the log holds inline; larger events become claim checks (a stock Kafka broker serves 1 MiB, tansu 0.6 about 4.75 MiB)
    #[arg(long, env = forgelog_stream::claims::MAX_RECORD_BYTES_ENV, default_value_t = forgelog_stream::claims::DEFAULT_MAX_RECORD_BYTES as u64, value_parser = clap::value_parser!(u64).range(1024..=15 << 20))]
    pub max_record_bytes: u64,
}

fn nonblank(value: &str) -> Result<String, String> {
    match value.trim() {
        "" => Err("must not be blank".into()),
        v => Ok(v.to_string()),
    }
}

impl BrokerArgs {
    fn config(&self) -> StreamConfig {
        let mut config = StreamConfig::new(&self.brokers);
        if let Some(location) = &self.claims {
            config.claims.location = location.clone();
        }
        config.claims.max_record_bytes = self.max_record_bytes as usize;
        config
    }
}

#[derive(Subcommand)]
enum Command {
    /// Start forgelog on the embedded default: local broker, engine (SmolLM2), capture proxy and consumers, with a session key per dialect and a status line until Ctrl-C
    #[command(
        after_help = "Examples:\n  forgelog up                              # serve the embedded default until Ctrl-C\n  forgelog up --demo                       # the built-in demo: rollouts, trees, groups, an SFT export\n  forgelog up --demo --train --steps 30    # the closed loop, learning, on CPU"
    )]
    Up(up::UpArgs),
    /// Run the local Kafka-protocol broker (tansu) in the foreground, installing it if missing
    #[command(
        after_help = "Example:\n  forgelog broker --data .forgelog/broker --listen 127.0.0.1:9092"
    )]
    Broker(broker::BrokerCmd),
    /// Create or list the log's topics
    Topics {
        #[command(subcommand)]
        action: topics::TopicsAction,
    },
    /// Print a topic's events as JSON lines
    #[command(
        after_help = "Example:\n  forgelog tail forgelog.calls --from-beginning --run demo-1"
    )]
    Tail(tail::TailArgs),
    /// Run the stream consumers: trajectory trees, and the reward join into GRPO groups
    #[command(
        after_help = "Example:\n  forgelog consume all --state .forgelog/consumers --metrics-listen 127.0.0.1:9464"
    )]
    Consume(consume::ConsumeArgs),
    /// The candle inference server: sampled token ids and logprobs the way vLLM returns them
    #[command(after_help = "Example:\n  forgelog engine --model smollm2 --listen 127.0.0.1:8000")]
    Engine(forgelog_engine::EngineArgs),
    /// The capture proxy: harness dialects in, engine out, every call recorded
    #[command(
        after_help = "Example:\n  forgelog proxy --upstream http://127.0.0.1:8000 --run my-run"
    )]
    Proxy(forgelog_producers::ProxyArgs),
    /// The GRPO learner: trains on forgelog.batches, publishes policies the engine reloads
    #[command(
        after_help = "Example:\n  forgelog train --run my-run --model smollm2 --learning-rate 1e-6 --metrics-listen 127.0.0.1:9465"
    )]
    Train(forgelog_trainer::TrainArgs),
    /// Keep an engine (vLLM, SGLang, forgelog's) serving each policy version the learner publishes, read back from the engine
    #[command(
        after_help = "Example:\n  forgelog sync --upstream http://127.0.0.1:8000 --engine vllm --sync-mode weights --run my-run"
    )]
    Sync(sync::SyncCmd),
    /// Re-derive a run from the log and compare, or show its trajectory trees
    Replay {
        #[command(subcommand)]
        action: replay::ReplayAction,
    },
    /// Export a run as a supervised fine-tuning dataset
    Export {
        #[command(subcommand)]
        action: export::ExportAction,
    },
    /// Run every task with every harness in GRPO groups, one sandbox per rollout, through the capture proxy; resumes an existing --run
    #[command(
        after_help = "Examples:\n  forgelog run deploy/tasks --harness mini-swe-agent --group-size 8\n  forgelog run deploy/tasks --harness claude-code,codex --train\n  forgelog run deploy/tasks --replay run-1 --report replay.json   # re-run run-1 against its recording"
    )]
    Run(Box<run::RunArgs>),
    /// What happened in a run, per policy version and harness, and each published version's training step
    #[command(
        after_help = "Examples:\n  forgelog report --run demo-1\n  forgelog report --run demo-1 --html demo-1.html"
    )]
    Report(report::ReportArgs),
    /// Check Harbor-style tasks: each reference solution through its verifier, in a sandbox
    Tasks {
        #[command(subcommand)]
        action: tasks::TasksAction,
    },
    /// Browse runs in a web page: groups, rollouts, trajectory trees, messages, and sampled tokens coloured by logprob; pages update live
    View(view::ViewArgs),
    /// Print a shell completion script
    #[command(
        after_help = "Example:\n  forgelog completions bash > ~/.local/share/bash-completion/completions/forgelog"
    )]
    Completions {
        /// The shell
        shell: clap_complete::Shell,
    },
    /// Inspect or drain a local spool (events a producer could not hand to the broker yet)
    Spool {
        #[command(subcommand)]
        action: spool::SpoolAction,
    },
}

/// What a command found that is not trouble: a difference, a failed check.
/// It exits 1, like `diff`; trouble (no broker, bad input) exits 2.
#[derive(Debug, thiserror::Error)]
#[error("{0}")]
pub struct Found(pub String);

/// An error and its causes on one line, each cause once (a cause whose text
/// the line already has says nothing new).
fn describe(e: &anyhow::Error) -> String {
    let mut line = String::new();
    for cause in e.chain().map(|c| c.to_string()) {
        if !line.contains(&cause) {
            if !line.is_empty() {
                line.push_str(": ");
            }
            line.push_str(&cause);
        }
    }
    line
}

/// Logs at the level `-v`/`-q` ask for, or as `RUST_LOG` says.
fn init_logs(verbose: u8, quiet: bool, command: &Command) {
    let level = match (quiet, verbose) {
        (true, _) => "error",
        (false, 0) => "warn",
        (false, 1) => "info",
        (false, 2) => "debug",
        _ => "trace",
    };
    // `train` says each step by default: a run of it is hours of nothing otherwise.
    let level = match (level, command) {
        ("warn", Command::Train(_)) => "warn,forgelog_trainer=info",
        (level, _) => level,
    };
    forgelog_http::init_logs(level);
}

/// The command line, with `forgelog.toml`'s defaults where there is one.
fn parse() -> Result<Cli, forgelog_config::ConfigError> {
    use clap::{CommandFactory, FromArgMatches};
    let args: Vec<String> = std::env::args().collect();
    let mut command = Cli::command();
    if let Some((path, _)) = forgelog_config::locate(&args) {
        command = forgelog_config::apply(command, &path)?;
    }
    let matches = command.get_matches_from(&args);
    Ok(Cli::from_arg_matches(&matches).unwrap_or_else(|e| e.exit()))
}

fn main() -> std::process::ExitCode {
    use std::process::ExitCode;
    let cli = match parse() {
        Ok(cli) => cli,
        Err(e) => {
            eprintln!("forgelog: {e}");
            return ExitCode::from(2);
        }
    };
    init_logs(cli.verbose, cli.quiet, &cli.command);
    match dispatch(cli.command) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => match e.downcast_ref::<Found>() {
            Some(found) => {
                eprintln!("{found}");
                ExitCode::from(1)
            }
            None => {
                eprintln!("forgelog: {}", describe(&e));
                ExitCode::from(2)
            }
        },
    }
}

fn dispatch(command: Command) -> Result<()> {
    // A broken properties file is refused before anything connects without it.
    forgelog_stream::env_properties()?;
    let rt = tokio::runtime::Runtime::new()?;
    let result = match command {
        Command::Up(args) => up::up(&rt, args),
        Command::Broker(cmd) => broker::run(&rt, cmd),
        Command::Topics { action } => topics::run(&rt, action),
        Command::Tail(args) => tail::run(args),
        Command::Consume(args) => consume::run(&rt, args),
        Command::Engine(args) => Ok(rt.block_on(forgelog_engine::run(args))?),
        Command::Proxy(args) => {
            let token_in = forgelog_stack::token_in(args.tokenizer.as_deref())?;
            Ok(rt.block_on(forgelog_producers::run(args, token_in))?)
        }
        Command::Train(args) => Ok(rt.block_on(forgelog_trainer::run(args))?),
        Command::Sync(cmd) => sync::run(&rt, cmd),
        Command::Replay { action } => replay::run(&rt, action),
        Command::Export { action } => export::run(&rt, action),
        Command::Spool { action } => spool::run(&rt, action),
        Command::Tasks { action } => tasks::run(&rt, action),
        Command::Run(args) => run::run(&rt, *args),
        Command::Report(args) => report::run(args),
        Command::View(args) => view::run(&rt, args),
        Command::Completions { shell } => {
            use clap::CommandFactory;
            let mut command = Cli::command();
            clap_complete::generate(shell, &mut command, "forgelog", &mut std::io::stdout());
            Ok(())
        }
    };
    // A task that ignores its stop signal must not keep a finished command
    // alive (the runtime's drop would wait for it forever).
    rt.shutdown_timeout(std::time::Duration::from_secs(10));
    result
}

/// A spinner on stderr for work that may take a while (hidden when stderr is not a terminal).
fn spinner(message: String) -> indicatif::ProgressBar {
    let bar = indicatif::ProgressBar::new_spinner().with_message(message);
    bar.enable_steady_tick(std::time::Duration::from_millis(120));
    bar
}

#[cfg(test)]
mod tests {
    use super::Cli;
    use clap::CommandFactory;

    /// Every option and argument of every subcommand says what it is, and
    /// `--run` and `--brokers` read one environment variable each in every
    /// subcommand but `engine --brokers` (`engine --run` and `replay serve
    /// --run` read none before).
    #[test]
    fn every_option_has_help() {
        fn walk(cmd: &clap::Command, path: &str, missing: &mut Vec<String>) {
            for arg in cmd.get_arguments() {
                let id = arg.get_id().as_str();
                let builtin = matches!(id, "help" | "version");
                if !builtin && arg.get_help().is_none() && arg.get_long_help().is_none() {
                    missing.push(format!("{path} {id}: no help"));
                }
                let env = arg.get_env().and_then(|e| e.to_str());
                let wanted = match id {
                    "run" | "run_id" => Some("FORGELOG_RUN"),
                    // The engine follows the log only when told by flag.
                    "brokers" if path == "forgelog engine" => None,
                    "brokers" => Some("FORGELOG_BROKERS"),
                    _ => None,
                };
                // A concept reads the environment everywhere, by one name.
                if wanted.is_some() && env != wanted {
                    missing.push(format!("{path} {id}: env {env:?}, not {wanted:?}"));
                }
            }
            for sub in cmd.get_subcommands() {
                walk(sub, &format!("{path} {}", sub.get_name()), missing);
            }
        }
        let mut missing = Vec::new();
        walk(&Cli::command(), "forgelog", &mut missing);
        assert!(missing.is_empty(), "{}", missing.join("\n"));
    }

    /// Every subcommand a user runs shows an example in its `--help`.
    #[test]
    fn every_subcommand_has_an_example() {
        fn walk(cmd: &clap::Command, path: &str, missing: &mut Vec<String>) {
            let subs: Vec<&clap::Command> = cmd
                .get_subcommands()
                .filter(|s| s.get_name() != "help")
                .collect();
            if subs.is_empty() {
                let mut cmd = cmd.clone();
                let help = cmd.render_long_help().to_string();
                if !help.contains("Example") {
                    missing.push(path.to_string());
                }
            }
            for sub in subs {
                walk(sub, &format!("{path} {}", sub.get_name()), missing);
            }
        }
        let mut missing = Vec::new();
        walk(&Cli::command(), "forgelog", &mut missing);
        assert!(missing.is_empty(), "no example in: {}", missing.join(", "));
    }
}
