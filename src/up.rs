//! `forgelog up`: the whole loop on one machine — broker, engine, capture proxy
//! and consumers — with a session key per dialect and a live status line.

use crate::broker::start_local_broker;
use anyhow::Result;
use forgelog_api::{NewSession, SessionClient};
use forgelog_consumers::RewardConfig;
use forgelog_schemas::Topic;
use forgelog_stack::{LearningConfig, RunStack, ServingConfig};
use forgelog_stream::admin::{self, TopicLayout};
use forgelog_stream::StreamConfig;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::time::Duration;

#[derive(Debug, Clone, clap::Args)]
pub struct UpArgs {
    /// Where forgelog keeps its local state (broker data, spools, consumer checkpoints)
    #[arg(long, default_value = ".forgelog")]
    pub home: PathBuf,
    /// Use these Kafka brokers instead of starting the local one
    #[arg(long, env = "FORGELOG_BROKERS")]
    pub brokers: Option<String>,
    #[command(flatten)]
    pub serving: crate::upstream::ServingArgs,
    /// Where the local engine listens (its OpenAI-compatible API)
    #[arg(long, default_value = "127.0.0.1:8000")]
    pub engine_listen: SocketAddr,
    /// Where the capture proxy listens: harnesses point here
    #[arg(long, default_value = "127.0.0.1:8100")]
    pub proxy_listen: SocketAddr,
    /// Run id of the sessions `up` creates (default: "interactive", or demo-<unix time> with --demo)
    #[arg(long, env = "FORGELOG_RUN")]
    pub run: Option<String>,
    /// Drive the built-in demo (GRPO groups of tool-using agent rollouts in two
    /// dialects), print a summary, export it as SFT data, then stop
    #[arg(long)]
    pub demo: bool,
    /// Where --demo writes its SFT export (a folder per run)
    #[arg(long, default_value = "forgelog-data")]
    pub export_to: PathBuf,
    /// Score correct answers with the efficiency bonus in the reward join
    #[arg(long)]
    pub efficiency_bonus: bool,
    /// Start the GRPO learner too: it trains on this run's groups and
    /// publishes versions the engine reloads (checkpoints under --home)
    #[arg(long)]
    pub train: bool,
    /// With --demo: the summary as one JSON object on stdout (rows per harness,
    /// the report per version, the export's manifest); the words go to stderr
    #[arg(long, requires = "demo")]
    pub json: bool,
    /// With --demo --train: run demo rounds until this many versions are published
    #[arg(long, default_value_t = 30)]
    pub steps: u64,
    /// The learner's rate (with --train)
    #[arg(long, default_value_t = 1e-5, value_parser = forgelog_config::value::above_zero)]
    pub learning_rate: f64,
    /// With --train: train a LoRA adapter of this rank on frozen weights
    /// (`forgelog train --lora-rank`); each version also holds the adapter
    /// as PEFT's files
    #[arg(long, requires = "train", value_parser = forgelog_config::value::one_or_more)]
    pub lora_rank: Option<usize>,
    /// Tokens per training step (with --train; with --demo one step per round, whatever this is)
    #[arg(long, default_value_t = 4096, value_parser = forgelog_config::value::one_or_more)]
    pub tokens_per_step: usize,
    /// Where the local engine and the learner run: cpu, or cuda (a build
    /// with `--features cuda`)
    #[arg(long, default_value_t = forgelog_engine::DeviceKind::Cpu)]
    pub device: forgelog_engine::DeviceKind,
}

/// The learner for `up --train`: run `run`'s groups, checkpoints under `home`.
fn train_args(
    args: &UpArgs,
    config: &StreamConfig,
    run: &str,
) -> Result<forgelog_trainer::TrainArgs> {
    let train = forgelog_trainer::TrainArgs {
        learning_rate: args.learning_rate,
        device: args.device,
        lora_rank: args.lora_rank,
        lora_publish: args.serving.lora_publish(),
        tokens_per_step: args.tokens_per_step,
        idle_flush: 5.0,
        ..forgelog_stack::learner_settings(&args.serving.model, config, run, &args.home)?
    };
    Ok(if args.demo {
        forgelog_stack::demo_learner(train, run, args.steps)
    } else {
        train
    })
}

const DIALECTS: [(&str, &str); 4] = [
    (
        "openai-chat",
        "OpenAI Chat Completions: OPENAI_BASE_URL={base}/v1 OPENAI_API_KEY={key}",
    ),
    (
        "openai-responses",
        "OpenAI Responses (Codex): base_url={base}/v1, key {key}",
    ),
    (
        "anthropic",
        "Anthropic Messages (Claude Code): ANTHROPIC_BASE_URL={base} ANTHROPIC_API_KEY={key}",
    ),
    (
        "gemini",
        "Gemini: GOOGLE_GEMINI_BASE_URL={base} GEMINI_API_KEY={key}",
    ),
];

pub fn up(rt: &tokio::runtime::Runtime, args: UpArgs) -> Result<()> {
    let (config, local) = match &args.brokers {
        Some(b) => (StreamConfig::new(b), None),
        None => {
            let listen: SocketAddr = forgelog_stream::DEFAULT_BROKERS.parse()?;
            let data = args.home.join("broker");
            let b = start_local_broker(&data, listen)?;
            eprintln!("broker    tansu on {listen}, data in {}", data.display());
            (StreamConfig::new(listen.to_string()), Some(b))
        }
    };
    let result = rt.block_on(run(&config, &args));
    if let Some(b) = local {
        b.stop();
        eprintln!("broker stopped");
    }
    result
}

async fn run(config: &StreamConfig, args: &UpArgs) -> Result<()> {
    let stop = forgelog_stream::shutdown_signal()?;
    let stamp = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)?
        .as_secs();
    let run = match (&args.run, args.demo) {
        (Some(r), _) => r.clone(),
        (None, false) => "interactive".to_string(),
        (None, true) => format!("demo-{stamp}"),
    };
    admin::create_topics(config, &TopicLayout::default()).await?;

    // An external engine is kept serving what the learner publishes.
    let serving_config = ServingConfig {
        device: args.device,
        engine_listen: args.engine_listen,
        proxy_listen: args.proxy_listen,
        ..args.serving.config(
            &run,
            args.train,
            args.home.join("proxy-spool"),
            args.home.clone(),
        )
    };
    let learning = LearningConfig {
        state: args.home.join("consumers"),
        rewards: RewardConfig::with_efficiency_bonus(args.efficiency_bonus),
        train: match args.train {
            true => Some(train_args(args, config, &run)?),
            false => None,
        },
    };
    let said = learning.clone();
    let mut stack = RunStack::start(config, serving_config, Some(learning)).await?;
    let serving = &stack.serving;
    if let Some(engine) = &serving.engine {
        eprintln!("engine    {} on {}", args.serving.model, engine.url);
    }
    let (upstream, admin_token) = (serving.upstream.clone(), serving.admin_token.clone());
    let base = format!("http://{}", serving.proxy.addr);
    eprintln!("proxy     {base} → {upstream}  (session API admin token: {admin_token})");
    eprintln!(
        "claims    events over {} bytes → {} (--claims, --max-record-bytes; lower where the broker's topics say so)",
        serving.proxy.max_record_bytes().unwrap_or(config.claims.max_record_bytes),
        config.claims.location
    );
    say_learning(&run, Some(&said));
    let sync_times = serving.sync.as_ref().map(|s| s.times.clone());
    let engine = stack.reader();
    // A failed sync (nothing more may be sampled by a version the engine
    // did not load) or learner (it publishes no more versions) stops the
    // loop with why, rather than wait for one.
    let result = if args.demo {
        tokio::select! {
            r = crate::demo::run(config, &base, &admin_token, engine, &run, args, sync_times) => r,
            e = stack.ended() => Err(e.into()),
            _ = stop => Err(anyhow::anyhow!("demo interrupted")),
        }
    } else {
        tokio::select! {
            r = serve(config, &base, &admin_token, &run, stamp, stop) => r,
            e = stack.ended() => Err(e.into()),
        }
    };
    eprintln!("\nstopping: flushing the proxy's events, checkpointing the consumers");
    stack.stop(Duration::from_secs(10)).await?;
    result
}

/// What learns from `run` in this process, as the terminal is told.
pub fn say_learning(run: &str, learning: Option<&LearningConfig>) {
    let Some(learning) = learning else { return };
    eprintln!(
        "consumers trajectories, rewards of run {run} (state in {})",
        learning.state.display()
    );
    if let Some(train) = &learning.train {
        eprintln!(
            "trainer   GRPO on {}'s groups, checkpoints in {}",
            train.run,
            train.checkpoints.as_deref().unwrap_or("?")
        );
    }
}

/// Prints a session key per dialect and a live status line until `stop`.
async fn serve(
    config: &StreamConfig,
    base: &str,
    admin_token: &str,
    run: &str,
    stamp: u64,
    stop: impl std::future::Future<Output = ()>,
) -> Result<()> {
    println!(
        "\nforgelog is up. Point a harness at the proxy with one of these session keys (run {run}):"
    );
    let sessions = SessionClient::new(base, Some(admin_token.to_string()));
    for (dialect, how) in DIALECTS {
        let new = NewSession::new(
            format!("{dialect}-{stamp}"),
            "interactive",
            dialect,
            format!("interactive-{dialect}-{stamp}"),
        )
        .in_run(run)
        .group_size(1);
        let session = sessions.create(&new).await?;
        println!(
            "  {}",
            how.replace("{base}", base)
                .replace("{key}", &session.api_key)
        );
    }
    println!("(Ctrl-C to stop)\n");

    let status = async {
        loop {
            tokio::time::sleep(Duration::from_secs(2)).await;
            let Ok(topics) = admin::list_topics(config) else {
                continue;
            };
            let count = |t: Topic| {
                topics
                    .iter()
                    .find(|i| i.name == t.name())
                    .map_or(0, |i| i.messages)
            };
            eprint!(
                "\rcalls {}  rollouts {}  trajectories {}  groups {}  policies {}   ",
                count(Topic::Calls) / 2,
                count(Topic::Rollouts) / 2,
                count(Topic::Trajectories),
                count(Topic::Batches),
                count(Topic::Policy)
            );
        }
    };
    tokio::select! {
        _ = stop => {}
        _ = status => {}
    }
    Ok(())
}
