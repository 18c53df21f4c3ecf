//! `forgelog run TASKS_DIR`: every task with every harness, in GRPO groups,
//! each rollout in a sandbox of its own through the capture proxy (one in
//! this process, or `--proxy`), verifiers run, everything in the log. A
//! restarted `--run R` resumes where the log says R stopped.

mod args;
mod cluster;
mod progress;
mod replay;

use anyhow::{bail, Context, Result};
pub use args::RunArgs;
use cluster::kube_backend;
use forgelog_api::SessionClient;
use forgelog_deploy::kit::Kit;
use forgelog_deploy::orchestrator::{Admission, Orchestrator, RunOptions, SandboxBackend};
use forgelog_deploy_core::{Outcome, OutcomeSummary, RunHistory, RunPlan};
use forgelog_podman::record::silent_hint;
use forgelog_podman::run_dir::{reap_dead_runs, RunDir};
use forgelog_podman::{LocalBackend, Podman};
use forgelog_stack::{LearningConfig, RunStack, Served, ServingConfig};
use forgelog_stream::admin::{self, TopicLayout};
use forgelog_stream::StreamConfig;
use progress::Bar;
use std::path::PathBuf;
use std::time::Duration;

pub fn run(rt: &tokio::runtime::Runtime, args: RunArgs) -> Result<()> {
    if let Some(recorded) = &args.replay {
        return replay::replay(rt, &args, recorded);
    }
    // Refused before anything is read or taken.
    let external = match args.proxy {
        Some(_) => Some(external_proxy(&args)?),
        None => None,
    };
    let home = forgelog_stream::forgelog_home();
    let bundles = home.join("harnesses");
    let kit = Kit::for_run(&args.tasks_dir, &args.tasks, &args.harness, &bundles)?;
    for t in kit.tasks.values() {
        for w in &t.warnings {
            eprintln!("{}: {w}", t.id);
        }
    }
    let run_id = match &args.run {
        Some(r) => r.clone(),
        None => format!(
            "run-{}",
            std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)?
                .as_secs()
        ),
    };
    let names: Vec<String> = kit.harnesses.keys().cloned().collect();
    let ids: Vec<String> = kit.tasks.keys().cloned().collect();
    let plan = RunPlan::new(&run_id, &ids, &names, args.group_size).epochs(args.epochs as usize);
    let dir = RunDir::acquire(&home, &run_id)?;
    let podman = Podman::default();
    // Leftovers of dead runs are removed again at the next start if this fails.
    match rt.block_on(reap_dead_runs(&podman, &home)) {
        Ok(reaped) if !reaped.is_empty() => {
            eprintln!("reaped the sandboxes of dead runs: {}", reaped.join(", "))
        }
        Ok(_) => {}
        Err(e @ forgelog_podman::SandboxError::NoPodman(_)) => return Err(e.into()),
        Err(e) => eprintln!("warning: reaping the sandboxes of dead runs: {e}"),
    }
    // Before anything starts: an image no registry serves must be here.
    rt.block_on(podman.check_base_images(kit.tasks.values()))?;
    let config = args.broker.config();
    rt.block_on(admin::create_topics(&config, &TopicLayout::default()))?;
    rt.block_on(orchestrate(
        &args, &config, plan, kit, external, dir, podman, bundles,
    ))
}

/// Runs the plan through the proxy at `--proxy` (`external`: its URL,
/// token and address) or the stack this process starts, in sandboxes made from `dir`,
/// `podman` and the harness `bundles`.
#[allow(clippy::too_many_arguments)]
async fn orchestrate(
    args: &RunArgs,
    config: &StreamConfig,
    plan: RunPlan,
    kit: Kit,
    external: Option<RunProxy>,
    dir: RunDir,
    podman: Podman,
    bundles: PathBuf,
) -> Result<()> {
    let run_id = plan.run_id.clone();
    // Where a local sandbox's harness output is kept, per attempt.
    let attempt_logs = (args.backend != "kube").then(|| dir.attempt_logs(""));
    let (mut stack, proxy) = match external {
        Some(proxy) => (None, proxy),
        None => {
            let stack = start_stack(args, config, &run_id, &dir).await?;
            let proxy = RunProxy {
                url: stack.serving.proxy.url(),
                token: stack.serving.admin_token.clone(),
                addr: stack.proxy_addr()?,
            };
            (Some(stack), proxy)
        }
    };
    let history = forgelog_stack::run_history(config, &run_id).await?;
    let total = plan.rollouts().count();
    let groups = plan.groups.len();
    eprintln!(
        "run {run_id}: {} tasks × {} harnesses × {}{} = {total} rollouts, {} at a time, proxy {}{}",
        kit.tasks.len(),
        kit.harnesses.len(),
        args.group_size,
        match args.epochs {
            1 => String::new(),
            n => format!(" × {n} epochs"),
        },
        args.concurrency,
        proxy.url,
        if history.is_empty() {
            String::new()
        } else {
            format!(", resuming ({} rollouts in the log)", history.len())
        }
    );
    let context = stack
        .as_ref()
        .and_then(|s| s.serving.proxy.state.probe().context);
    let rollouts = Rollouts {
        sessions: SessionClient::new(&proxy.url, Some(proxy.token)),
        plan,
        kit,
        options: run_options(args, context),
        // Admission reads the version the engine serves, in its own word.
        admission: stack.as_ref().and_then(RunStack::admission),
        history: &history,
    };
    // Whatever ends the rollouts (a signal; a failed sync: nothing more is
    // sampled by a version the engine did not load), what is left of them is
    // removed, and the learner and the consumers are stopped below: their
    // blocking tasks would otherwise keep the process alive.
    let signal = forgelog_stream::shutdown_signal()?;
    let result = async {
        let stop = async {
            match stack.as_mut() {
                Some(stack) => stack.stopped(signal).await,
                None => forgelog_stack::stopped(&run_id, signal, &mut None).await,
            }
        };
        if args.backend == "kube" {
            let backend = kube_backend(&args.kube, &run_id, proxy.addr, &bundles, podman).await?;
            rollouts.drive(backend, stop).await
        } else {
            let backend = LocalBackend::new(podman, bundles, proxy.addr, dir);
            backend
                .check()
                .await
                .map_err(forgelog_stack::StackError::from)?;
            rollouts.drive(backend, stop).await
        }
    }
    .await;
    let mut learned = Ok(());
    if let Some(mut stack) = stack {
        if result.is_ok() {
            learned = last_versions(&mut stack, config, groups).await;
        }
        stack.stop(Duration::from_secs(30)).await?;
    }
    print_outcomes(&run_id, &result?, attempt_logs.as_deref());
    learned
}

/// The run's limits per rollout and per call, as the terminal is told: a
/// call's tokens by default a quarter of the engine's `context`.
fn run_options(args: &RunArgs, context: Option<i64>) -> RunOptions {
    let options = RunOptions {
        concurrency: args.concurrency,
        max_model_calls: (args.max_model_calls > 0).then_some(args.max_model_calls),
        max_tokens: args.max_tokens.or_else(|| context.map(|c| (c / 4).max(1))),
        retry: true,
    };
    eprintln!(
        "limits: {} model calls per rollout, {} per call{}",
        options
            .max_model_calls
            .map_or("no limit on".into(), |n| n.to_string()),
        options
            .max_tokens
            .map_or("the tokens the harness asks for".into(), |n| {
                format!("at most {n} tokens")
            }),
        match (args.max_tokens, options.max_tokens) {
            (None, Some(_)) => " (a quarter of the engine's context)",
            _ => "",
        }
    );
    options
}

/// The proxy a run's sandboxes reach, as the orchestrator uses it.
struct RunProxy {
    url: String,
    /// Its session API's admin token.
    token: String,
    /// Where sandboxes reach it (plain HTTP).
    addr: std::net::SocketAddr,
}

/// The proxy at `--proxy`, checked.
fn external_proxy(args: &RunArgs) -> Result<RunProxy> {
    let (Some(url), Some(token)) = (&args.proxy, &args.admin_token) else {
        bail!("--proxy needs the proxy's --admin-token (or FORGELOG_ADMIN_TOKEN): sandboxes reach the proxy, the session API must refuse them");
    };
    let url = url.trim_end_matches('/').to_string();
    let addr = forgelog_stack::proxy_addr(&url)?;
    Ok(RunProxy {
        url,
        token: token.clone(),
        addr,
    })
}

/// The engine and the proxy this process starts for the run and, with
/// `--train`, its consumers and learner. Sandboxes reach the proxy: its
/// session API refuses them (they have no token). The embedded engine's
/// model renders prompts (token in); an external engine is kept serving
/// each version the learner publishes.
async fn start_stack(
    args: &RunArgs,
    config: &StreamConfig,
    run_id: &str,
    dir: &RunDir,
) -> Result<RunStack> {
    let serving = ServingConfig {
        proxy_listen: args.proxy_listen,
        ..args
            .serving
            .config(run_id, args.train, dir.spool(), dir.path.clone())
    };
    let learning = match args.train {
        true => Some(LearningConfig {
            state: dir.path.join("consumers"),
            rewards: Default::default(),
            train: Some(forgelog_trainer::TrainArgs {
                learning_rate: args.learning_rate,
                micro_batch_tokens: args.micro_batch_tokens,
                groups_per_step: Some(args.groups_per_step),
                max_staleness: args.max_staleness,
                idle_flush: 10.0,
                lora_rank: args.lora_rank,
                lora_publish: args.serving.lora_publish(),
                ..forgelog_stack::learner_settings(&args.serving.model, config, run_id, &dir.path)?
            }),
        }),
        false => None,
    };
    let said = learning.clone();
    let stack =
        RunStack::start(config, serving, learning)
            .await
            .context(match args.serving.upstream {
                Some(_) => "the engine at --upstream",
                None => "starting the engine and the proxy (or pass --upstream)",
            })?;
    if let Some(engine) = &stack.serving.engine {
        eprintln!("engine    {} on {}", args.serving.model, engine.url);
    }
    crate::up::say_learning(run_id, said.as_ref());
    // What a killed predecessor left in the spool goes to the log first.
    stack.serving.proxy.flush(Duration::from_secs(60)).await?;
    Ok(stack)
}

/// The last groups' step, once the learner has them, and an external
/// engine serving the last version, as the terminal is told. A learner
/// that failed before its last step fails the run, with why (its rollouts
/// are recorded; `run --run` resumes the learner from its last version).
async fn last_versions(stack: &mut RunStack, config: &StreamConfig, groups: usize) -> Result<()> {
    let patience = Duration::from_secs(600);
    let last = stack
        .last_versions(config, groups, patience)
        .await
        .map_err(|e| {
            anyhow::anyhow!(
                "{e} (`forgelog run --run {}` goes on from the last)",
                stack.run
            )
        })?;
    let Some(last) = last else { return Ok(()) };
    let newest = last.newest;
    eprintln!("trainer   {newest} versions published for {groups} groups");
    match last.served {
        None => {}
        Some(Served::Yes(times)) => {
            eprintln!("engine    serves version {newest}");
            if let Some(times) = times {
                eprintln!("engine    {times}");
            }
        }
        Some(Served::SyncEnded(e)) => eprintln!("engine    does not serve version {newest}: {e}"),
        Some(Served::Late(after)) => {
            let minutes = after.as_secs() / 60;
            eprintln!("engine    does not serve version {newest} after {minutes} minutes")
        }
    }
    Ok(())
}

/// The run's summary per harness, and what orchestrating it cost.
fn print_outcomes(run_id: &str, outcomes: &[Outcome], attempt_logs: Option<&std::path::Path>) {
    let summary = OutcomeSummary::of(outcomes);
    println!("\nrun {run_id}\n{summary}");
    // `solve` never asks the model; any other harness that did not is broken.
    let silent = summary.silent_harnesses(outcomes);
    for (harness, attempt) in silent.filter(|(h, _)| *h != forgelog_deploy::harness::SOLVE) {
        println!("{}", silent_hint(harness, attempt, attempt_logs));
    }
    let ran = outcomes
        .iter()
        .filter(|o| o.status.is_some())
        .count()
        .max(1);
    let (own, tools) = (
        cpu_seconds(libc::RUSAGE_SELF),
        cpu_seconds(libc::RUSAGE_CHILDREN),
    );
    println!(
        "orchestrator CPU per rollout: {:.0} ms in this process (the proxy included), {:.0} ms in podman and ip ({own:.1} s and {tools:.1} s in all)",
        own * 1000.0 / ran as f64,
        tools * 1000.0 / ran as f64
    );
}

/// A run's orchestrator but for its backend.
struct Rollouts<'a> {
    sessions: SessionClient,
    plan: RunPlan,
    kit: Kit,
    options: RunOptions,
    admission: Option<Admission>,
    history: &'a RunHistory,
}

impl Rollouts<'_> {
    /// Runs the plan on `backend` with a progress bar until it ends or
    /// `stop` says why not.
    async fn drive<B: SandboxBackend>(
        self,
        backend: B,
        stop: impl std::future::Future<Output = forgelog_stack::StackError>,
    ) -> Result<Vec<Outcome>> {
        let bar = Bar::new(self.plan.rollouts().count());
        let Kit { tasks, harnesses } = self.kit;
        let orchestrator = Orchestrator::new(
            backend,
            self.sessions,
            self.plan,
            tasks,
            harnesses,
            self.options,
        )
        .with_admission(self.admission);
        let result = forgelog_stack::drive(&orchestrator, self.history, &bar, stop).await;
        bar.bar.finish();
        Ok(result?)
    }
}

/// User + system CPU seconds of this process (`RUSAGE_SELF`) or of its
/// waited-for children (`RUSAGE_CHILDREN`).
fn cpu_seconds(who: libc::c_int) -> f64 {
    // SAFETY: getrusage fills the struct it is given; all-zero is a valid rusage.
    let usage = unsafe {
        let mut u: libc::rusage = std::mem::zeroed();
        libc::getrusage(who, &mut u);
        u
    };
    let secs = |t: libc::timeval| t.tv_sec as f64 + t.tv_usec as f64 / 1e6;
    secs(usage.ru_utime) + secs(usage.ru_stime)
}
