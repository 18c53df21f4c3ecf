//! The `forgelog` command line: wires the component crates together.

use anyhow::{bail, Context, Result};
use clap::{Args, Parser, Subcommand};
use forgelog_consumers::{
    export, rebuild, shell, show, Processor, RewardConfig, RewardJoin, RewardTransform, RunStats,
    ShellOptions, TrajectoryBuilder,
};
use forgelog_schemas::{Event, GroupMember, Topic};
use forgelog_stream::admin::{self, TopicLayout};
use forgelog_stream::broker::{self, LocalBroker};
use forgelog_stream::{EventProducer, ReplayReader, SpoolOptions, StartAt, StreamConfig};
// The proxy and engine allocate per call (JSON, events); mimalloc costs less
// CPU per call than glibc's allocator (proxy-load: about 30% less).
#[global_allocator]
static ALLOCATOR: mimalloc::MiMalloc = mimalloc::MiMalloc;

mod demo;
mod up;

use std::io::Write;
use std::ops::ControlFlow;
use std::path::PathBuf;
use std::time::Duration;

#[derive(Parser)]
#[command(
    name = "forgelog",
    version,
    about = "Capture, log and train LLM agents inside their real harnesses"
)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Args, Clone)]
struct BrokerArgs {
    /// Kafka bootstrap servers (comma-separated host:port)
    #[arg(long, env = "FORGELOG_BROKERS", default_value = "127.0.0.1:9092")]
    brokers: String,
}

impl BrokerArgs {
    fn config(&self) -> StreamConfig {
        StreamConfig::new(&self.brokers)
    }
}

#[derive(Subcommand)]
enum Command {
    /// Start forgelog on the embedded default: local broker, engine (SmolLM2), capture proxy and consumers, with a session key per dialect and a status line until Ctrl-C
    Up(up::UpArgs),
    /// Run the local Kafka-protocol broker (tansu) in the foreground, installing it if missing
    Broker {
        /// Data directory (SQLite database and log)
        #[arg(long, default_value = ".forgelog/broker")]
        data: PathBuf,
        #[arg(long, default_value = "127.0.0.1:9092")]
        listen: std::net::SocketAddr,
    },
    /// Create or list the log's topics
    Topics {
        #[command(subcommand)]
        action: TopicsAction,
    },
    /// Print a topic's events as JSON lines
    Tail {
        /// Topic name, e.g. forgelog.calls
        topic: String,
        /// Print the topic's history up to now and exit (default: follow new events)
        #[arg(long)]
        from_beginning: bool,
        /// Only events of this run
        #[arg(long)]
        run: Option<String>,
        /// Stop after this many events
        #[arg(long)]
        limit: Option<usize>,
        #[command(flatten)]
        broker: BrokerArgs,
    },
    /// Run the stream consumers: trajectory trees, and the reward join into GRPO groups
    Consume {
        /// Which consumer: trajectories, rewards, or all (both)
        #[arg(value_enum)]
        which: Consumers,
        /// State directory (checkpoints and output spool), one subdirectory per consumer
        #[arg(long, default_value = ".forgelog/consumers")]
        state: PathBuf,
        /// Exit after a sweep that finds nothing new (batch processing of a recorded run)
        #[arg(long)]
        exit_when_idle: bool,
        /// Input events between checkpoints
        #[arg(long, default_value_t = 1000)]
        checkpoint_every: usize,
        /// Reward correct answers (reward >= 1) with 1 + 1.5/(15 + tool_calls)
        #[arg(long)]
        efficiency_bonus: bool,
        #[command(flatten)]
        broker: BrokerArgs,
    },
    /// The candle inference server: sampled token ids and logprobs the way vLLM returns them
    Engine(forgelog_engine::EngineArgs),
    /// The capture proxy: harness dialects in, engine out, every call recorded
    Proxy(forgelog_producers::ProxyArgs),
    /// The GRPO learner: trains on forgelog.batches, publishes policies the engine reloads
    Train(forgelog_trainer::TrainArgs),
    /// Re-derive a run from the log and compare, or show its trajectory trees
    Replay {
        #[command(subcommand)]
        action: ReplayAction,
    },
    /// Export a run as a supervised fine-tuning dataset
    Export {
        #[command(subcommand)]
        action: ExportAction,
    },
    /// Inspect or drain a local spool (events a producer could not hand to the broker yet)
    Spool {
        #[command(subcommand)]
        action: SpoolAction,
    },
}

#[derive(Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
enum Consumers {
    Trajectories,
    Rewards,
    All,
}

#[derive(Subcommand)]
enum ReplayAction {
    /// Re-derive trajectories and batches from calls, rollouts and rewards; compare with the output topics
    Rebuild {
        #[arg(long)]
        run: String,
        /// The reward join ran with --efficiency-bonus
        #[arg(long)]
        efficiency_bonus: bool,
        #[command(flatten)]
        broker: BrokerArgs,
    },
    /// A proxy answering from a recorded run instead of the engine: a re-running harness gets the recorded responses call by call
    Serve(forgelog_producers::ReplayServeArgs),
    /// Print a run's trajectory trees: branches, discarded retries, sub-agent roots, mask spans, rewards
    Show {
        #[arg(long)]
        run: String,
        /// Only this rollout
        #[arg(long)]
        rollout: Option<String>,
        #[command(flatten)]
        broker: BrokerArgs,
    },
}

#[derive(Subcommand)]
enum ExportAction {
    /// JSONL (OpenAI Chat `messages`) and Parquet (`input_ids`, `loss_mask`, `labels`) per harness, plus a manifest
    Sft {
        #[arg(long)]
        run: String,
        /// Destination URL: file:///abs/dir, s3://bucket/prefix (AWS_* variables configure S3)
        #[arg(long)]
        to: String,
        /// Only rollouts whose verifier ran and gave a reward above 0
        #[arg(long)]
        only_successful: bool,
        /// Only rollouts with at least this reward
        #[arg(long)]
        min_reward: Option<f64>,
        #[command(flatten)]
        broker: BrokerArgs,
    },
}

#[derive(Subcommand)]
enum TopicsAction {
    /// Create every forgelog topic that is missing (infinite retention)
    Create {
        #[arg(long, default_value_t = 3)]
        partitions: i32,
        #[arg(long, default_value_t = 1)]
        replication: i32,
        #[command(flatten)]
        broker: BrokerArgs,
    },
    /// List topics with their partition and message counts
    List {
        #[command(flatten)]
        broker: BrokerArgs,
    },
}

#[derive(Subcommand)]
enum SpoolAction {
    /// Send everything in the spool to the broker, then exit
    Drain {
        #[arg(long)]
        dir: PathBuf,
        /// Give up after this many seconds (what is left stays in the spool)
        #[arg(long, default_value_t = 600)]
        timeout_secs: u64,
        #[command(flatten)]
        broker: BrokerArgs,
    },
    /// Show how many events wait in the spool
    Status {
        #[arg(long)]
        dir: PathBuf,
    },
}

fn main() -> Result<()> {
    tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_default_env().unwrap_or_else(|_| "warn".into()),
        )
        .with_writer(std::io::stderr)
        .init();
    let cli = Cli::parse();
    // A broken properties file is refused before anything connects without it.
    forgelog_stream::env_properties()?;
    let rt = tokio::runtime::Runtime::new()?;
    match cli.command {
        Command::Broker { data, listen } => run_broker(&rt, &data, listen),
        Command::Up(args) => up::up(&rt, args),
        Command::Topics {
            action:
                TopicsAction::Create {
                    partitions,
                    replication,
                    broker,
                },
        } => {
            let created = rt.block_on(admin::create_topics(
                &broker.config(),
                &TopicLayout {
                    partitions,
                    replication,
                },
            ))?;
            for t in Topic::ALL {
                let state = if created.iter().any(|c| c == t.name()) {
                    "created"
                } else {
                    "exists"
                };
                println!("{:<24} {state}", t.name());
            }
            Ok(())
        }
        Command::Topics {
            action: TopicsAction::List { broker },
        } => print_topics(&broker.config()),
        Command::Tail {
            topic,
            from_beginning,
            run,
            limit,
            broker,
        } => tail(
            &broker.config(),
            &topic,
            from_beginning,
            run.as_deref(),
            limit,
        ),
        Command::Spool {
            action:
                SpoolAction::Drain {
                    dir,
                    timeout_secs,
                    broker,
                },
        } => rt.block_on(async {
            let producer = EventProducer::start(&broker.config(), &dir, SpoolOptions::default())?;
            let pending = producer.spool().pending();
            eprintln!("draining {pending} events from {}", dir.display());
            producer.close(Duration::from_secs(timeout_secs)).await?;
            eprintln!("spool {} is empty", dir.display());
            Ok(())
        }),
        Command::Replay {
            action:
                ReplayAction::Rebuild {
                    run,
                    efficiency_bonus,
                    broker,
                },
        } => {
            let reader = ReplayReader::new(&broker.config())?;
            let working = spinner(format!("rebuilding run {run} from the log"));
            let (rebuilt, diff) =
                rebuild::rebuild_and_compare(&reader, &run, reward_config(efficiency_bonus))?;
            working.finish_and_clear();
            match diff {
                None => {
                    println!(
                        "identical: {} trajectories, {} batches of run {run}",
                        rebuilt.trajectories.len(),
                        rebuilt.batches.len()
                    );
                    Ok(())
                }
                Some(d) => bail!("differs: {d}"),
            }
        }
        Command::Replay {
            action:
                ReplayAction::Show {
                    run,
                    rollout,
                    broker,
                },
        } => {
            let reader = ReplayReader::new(&broker.config())?;
            let members: Vec<GroupMember> = rebuild::read_run(&reader, Topic::Batches, &run)?
                .into_iter()
                .filter_map(|r| match r.event {
                    Ok(Event::TrainingBatch(b)) => Some(b.members),
                    _ => None,
                })
                .flatten()
                .collect();
            let mut shown = 0;
            for r in rebuild::read_run(&reader, Topic::Trajectories, &run)? {
                let Ok(Event::TrajectoryBuilt(t)) = r.event else {
                    continue;
                };
                if rollout.as_ref().is_some_and(|x| *x != t.rollout_id) {
                    continue;
                }
                print!(
                    "{}",
                    show::render(&t, members.iter().find(|m| m.rollout_id == t.rollout_id))
                );
                shown += 1;
            }
            if shown == 0 {
                bail!(
                    "no trajectories for run {run}{}",
                    rollout
                        .map(|r| format!(", rollout {r}"))
                        .unwrap_or_default()
                );
            }
            Ok(())
        }
        Command::Export {
            action:
                ExportAction::Sft {
                    run,
                    to,
                    only_successful,
                    min_reward,
                    broker,
                },
        } => {
            let reader = ReplayReader::new(&broker.config())?;
            let filter = export::ExportFilter {
                only_successful,
                min_reward,
            };
            let working = spinner(format!("exporting run {run} to {to}"));
            let (manifest, written) = rt
                .block_on(export::export_run(&reader, &run, &to, filter))
                .map_err(|e| anyhow::anyhow!(e))?;
            working.finish_and_clear();
            for path in written {
                println!("{path}");
            }
            eprintln!(
                "exported {} rows ({} filtered out)",
                manifest.rows.values().sum::<usize>(),
                manifest.filtered_out
            );
            Ok(())
        }
        Command::Engine(args) => Ok(rt.block_on(forgelog_engine::run(args))?),
        Command::Proxy(args) => Ok(rt.block_on(forgelog_producers::run(args))?),
        Command::Replay {
            action: ReplayAction::Serve(args),
        } => Ok(rt.block_on(forgelog_producers::run_replay(args))?),
        Command::Train(args) => Ok(rt.block_on(forgelog_trainer::run(args))?),
        Command::Consume {
            which,
            state,
            exit_when_idle,
            checkpoint_every,
            efficiency_bonus,
            broker,
        } => {
            let config = broker.config();
            let options = |name: &str| ShellOptions {
                checkpoint_every,
                exit_when_idle,
                ..ShellOptions::new(state.join(name))
            };
            let rewards = reward_config(efficiency_bonus);
            rt.block_on(async move {
                let (c1, c2) = (config.clone(), config.clone());
                let (o1, o2) = (options(TrajectoryBuilder::NAME), options(RewardJoin::NAME));
                let trajectories = move || shell::run(&c1, TrajectoryBuilder::default(), &o1);
                let join = move || shell::run(&c2, RewardJoin::new(rewards), &o2);
                let report = |name: &str, stats: RunStats| eprintln!("{name}: {stats:?}");
                match which {
                    Consumers::Trajectories => report(
                        "trajectories",
                        tokio::task::spawn_blocking(trajectories).await??,
                    ),
                    Consumers::Rewards => {
                        report("rewards", tokio::task::spawn_blocking(join).await??)
                    }
                    // In batch mode the join runs after the trees are done, so each sees its whole input.
                    Consumers::All if exit_when_idle => {
                        report(
                            "trajectories",
                            tokio::task::spawn_blocking(trajectories).await??,
                        );
                        report("rewards", tokio::task::spawn_blocking(join).await??);
                    }
                    Consumers::All => {
                        let (a, b) = tokio::join!(
                            tokio::task::spawn_blocking(trajectories),
                            tokio::task::spawn_blocking(join)
                        );
                        report("trajectories", a??);
                        report("rewards", b??);
                    }
                }
                anyhow::Ok(())
            })
        }
        Command::Spool {
            action: SpoolAction::Status { dir },
        } => {
            let spool = forgelog_stream::Spool::open(&dir, SpoolOptions::default())?;
            println!(
                "pending events: {}\nacknowledged through seq: {}\nbytes on disk: {}",
                spool.pending(),
                spool.acked(),
                spool.bytes()
            );
            Ok(())
        }
    }
}

/// A spinner on stderr for work that may take a while (hidden when stderr is not a terminal).
fn spinner(message: String) -> indicatif::ProgressBar {
    let bar = indicatif::ProgressBar::new_spinner().with_message(message);
    bar.enable_steady_tick(std::time::Duration::from_millis(120));
    bar
}

fn reward_config(efficiency_bonus: bool) -> RewardConfig {
    let transforms = if efficiency_bonus {
        vec![RewardTransform::EfficiencyBonus { correct_at: 1.0 }]
    } else {
        Vec::new()
    };
    RewardConfig {
        transforms,
        ..Default::default()
    }
}

/// Installs the Ctrl-C and SIGTERM handlers now; the future resolves on either.
fn shutdown_signal() -> Result<impl std::future::Future<Output = ()>> {
    use tokio::signal::unix::{signal, SignalKind};
    let mut int = signal(SignalKind::interrupt())?;
    let mut term = signal(SignalKind::terminate())?;
    Ok(async move {
        tokio::select! {
            _ = int.recv() => {}
            _ = term.recv() => {}
        }
    })
}

fn start_local_broker(data: &std::path::Path, listen: std::net::SocketAddr) -> Result<LocalBroker> {
    let binary = broker::find_or_install_tansu()?;
    LocalBroker::start(&binary, data, listen)
        .with_context(|| format!("starting {}", binary.display()))
}

fn run_broker(
    rt: &tokio::runtime::Runtime,
    data: &std::path::Path,
    listen: std::net::SocketAddr,
) -> Result<()> {
    let mut b = start_local_broker(data, listen)?;
    eprintln!(
        "forgelog broker: tansu on {listen}, data in {} (Ctrl-C to stop)",
        data.display()
    );
    let pid = b.pid();
    let status = std::thread::scope(|s| {
        let waiter = s.spawn(|| b.wait());
        rt.block_on(async {
            let stop = shutdown_signal()?;
            tokio::select! {
                _ = stop => {}
                _ = async { while !waiter.is_finished() { tokio::time::sleep(Duration::from_millis(200)).await } } => {}
            }
            anyhow::Ok(())
        })?;
        broker::terminate(pid);
        waiter
            .join()
            .map_err(|_| anyhow::anyhow!("broker waiter panicked"))?
            .map_err(anyhow::Error::from)
    })?;
    eprintln!("forgelog broker: stopped ({status})");
    Ok(())
}

fn print_topics(config: &StreamConfig) -> Result<()> {
    println!("{:<24} {:>10} {:>10}", "topic", "partitions", "messages");
    for t in admin::list_topics(config)? {
        println!("{:<24} {:>10} {:>10}", t.name, t.partitions, t.messages);
    }
    Ok(())
}

fn tail(
    config: &StreamConfig,
    topic: &str,
    from_beginning: bool,
    run: Option<&str>,
    limit: Option<usize>,
) -> Result<()> {
    if Topic::from_name(topic).is_none() {
        bail!(
            "unknown topic {topic:?}; forgelog's topics are: {}",
            Topic::ALL.map(|t| t.name()).join(", ")
        );
    }
    let reader = ReplayReader::new(config)?;
    let mut out = std::io::stdout().lock();
    let mut printed = 0usize;
    let mut write_err = None;
    let print = |rec: forgelog_stream::Received| {
        if limit.is_some_and(|l| printed >= l) || write_err.is_some() {
            return ControlFlow::Break(());
        }
        let line = match &rec.event {
            Ok(e) => serde_json::to_string(e).expect("events serialize to JSON"),
            Err(err) => {
                serde_json::json!({"error": err, "partition": rec.partition, "offset": rec.offset})
                    .to_string()
            }
        };
        if let Err(e) = writeln!(out, "{line}") {
            write_err = Some(e);
        }
        printed += 1;
        ControlFlow::Continue(())
    };
    if from_beginning {
        reader.for_each(topic, StartAt::Beginning, run, print)?;
    } else {
        reader.follow(topic, run, print)?;
    }
    match write_err {
        Some(e) if e.kind() == std::io::ErrorKind::BrokenPipe => Ok(()),
        Some(e) => Err(e.into()),
        None => Ok(()),
    }
}
