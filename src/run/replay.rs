//! `forgelog run TASKS_DIR --replay R`: re-runs the recorded rollouts of run
//! R through the orchestrator, each in the same task image with the same
//! harness bundle, paths and home (and, with `--pin-clock`, its clock at the
//! recorded start); the proxy answers every call from the recording. Ends with how each
//! re-run ended against its recording and the replay report of every call
//! that differed. Exit 1 when anything differs unexplained.

use super::{drive, RunArgs};
use crate::source::{RunLog, SourceArgs};
use crate::Found;
use anyhow::{bail, Context, Result};
use forgelog_api::SessionClient;
use forgelog_deploy::harness::Harness;
use forgelog_deploy::orchestrator::{Orchestrator, RunOptions};
use forgelog_deploy_core::{RecordedRun, ReplayTable, RunHistory, Task};
use forgelog_podman::run_dir::RunDir;
use forgelog_podman::{LocalBackend, PinnedClocks, Podman};
use forgelog_producers::replay::{report_text, Matching, Normaliser, RecordedUpstream, Recording};
use forgelog_producers::server::ProxyConfig;
use forgelog_producers::RunningProxy;
use forgelog_schemas::Topic;
use forgelog_stream::LogReader;
use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

pub fn replay(rt: &tokio::runtime::Runtime, args: &RunArgs, run: &str) -> Result<()> {
    if args.backend != "local" {
        bail!("--replay re-runs rollouts in local sandboxes (--backend local)");
    }
    let source = SourceArgs {
        bundle: args.bundle.clone(),
        broker: args.broker.clone(),
    };
    let log = source.open(run)?;
    // One read of the log: the rollouts, their verdicts and their calls.
    let events = log.run_events(run, &[Topic::Rollouts, Topic::Rewards, Topic::Calls])?;
    let recorded = RecordedRun::from_events(run, &events, &args.rollouts)?;
    let calls = Recording::from_events(run, &events);
    drop(events);
    let home = forgelog_stream::forgelog_home();
    let bundles = home.join("harnesses");
    let (tasks, harnesses) = environment(args, run, &recorded, &bundles)?;
    if let RunLog::Bundle(b) = &log {
        for line in differences_from(&b.manifest.hashes, &tasks, &harnesses)? {
            eprintln!("warning: {line}");
        }
    }
    let matching = if args.strict {
        Matching::Strict
    } else {
        Matching::Lenient(Normaliser::with_volatile(&args.volatile).context("--volatile")?)
    };
    let clocks = if args.pin_clock {
        let Some(libfaketime) = PinnedClocks::find_libfaketime() else {
            bail!("--pin-clock needs libfaketime (apt-get install libfaketime, or FORGELOG_LIBFAKETIME=FILE)");
        };
        Some(PinnedClocks {
            libfaketime,
            starts: recorded
                .attempts
                .iter()
                .map(|a| (a.rollout.id.clone(), a.started_at_ms))
                .collect(),
        })
    } else {
        None
    };
    // The replay's own directory: its sandboxes, network slots and harness
    // output, beside (not over) the recorded run's.
    let dir = RunDir::acquire(&home, &format!("{run}.replay"))?;
    rt.block_on(async {
        let upstream = Arc::new(RecordedUpstream::new(calls, matching));
        let token = forgelog_http::random_token();
        let proxy_config = ProxyConfig {
            run_id: Some(run.to_string()),
            admin_token: Some(token.clone()),
            upstream_timeout: Duration::from_secs(60),
            ..ProxyConfig::new(format!("recorded run {run}"))
        };
        let proxy =
            RunningProxy::replay_from(proxy_config, upstream.clone(), args.proxy_listen).await?;
        let total = recorded.plan.rollouts.len();
        eprintln!(
            "replaying run {run}: {total} rollouts, {} at a time, from the recording at {}{}",
            args.concurrency,
            proxy.url(),
            if clocks.is_some() { ", clocks pinned at each recorded start" } else { "" }
        );
        let mut backend =
            LocalBackend::new(Podman::default(), bundles, proxy.addr, dir);
        if let Some(clocks) = clocks {
            backend = backend.with_clocks(clocks);
        }
        backend
            .check()
            .await
            .context("sandbox networks (forgelog run needs root for network namespaces)")?;
        let options = RunOptions {
            concurrency: args.concurrency,
            max_model_calls: None,
            max_tokens: None,
            retry: false,
        };
        let orchestrator = Orchestrator::new(
            backend,
            SessionClient::new(proxy.url(), Some(token)),
            recorded.plan.clone(),
            tasks,
            harnesses,
            options,
        );
        let outcomes = drive(orchestrator, &RunHistory::default(), total).await;
        proxy.shutdown(Duration::from_secs(1)).await?;
        let rows = recorded.compare(&outcomes?);
        let (report, refused) = (upstream.report(), upstream.refused());
        println!("\nreplay of run {run}\n{}", ReplayTable(&rows));
        print!("{}", report_text(&report));
        println!("{} calls had no recorded answer", refused.len());
        for r in &refused {
            println!("  {r}");
        }
        if let Some(path) = &args.report {
            write_report(path, run, &rows, &report, &refused)?;
        }
        let differing = rows.iter().filter(|r| !r.differences().is_empty()).count();
        let unexplained = report.iter().filter(|e| !e.explained).count();
        if differing + unexplained + refused.len() > 0 {
            return Err(Found(format!(
                "the replay of run {run} differs: {differing} rollouts ended differently, {unexplained} calls differed unexplained, {} had no recorded answer",
                refused.len()
            ))
            .into());
        }
        println!("the replay of run {run} did what the recording did: {total} rollouts");
        Ok(())
    })
}

/// The tasks (from `TASKS_DIR`) and the kit's harnesses (their bundles
/// installed under `bundles`) the recorded run ran.
fn environment(
    args: &RunArgs,
    run: &str,
    recorded: &RecordedRun,
    bundles: &std::path::Path,
) -> Result<(BTreeMap<String, Task>, BTreeMap<String, Harness>)> {
    let mut tasks = BTreeMap::new();
    let mut harnesses = BTreeMap::new();
    let all: BTreeMap<String, Task> = Task::load_all(&args.tasks_dir)?
        .into_iter()
        .map(|t| (t.id.clone(), t))
        .collect();
    for g in &recorded.plan.groups {
        let Some(task) = all.get(&g.task) else {
            bail!(
                "run {run} ran task {}, which is not in {}",
                g.task,
                args.tasks_dir.display()
            );
        };
        tasks.insert(g.task.clone(), task.clone());
        let harness = Harness::resolve(&g.harness).with_context(|| {
            format!(
                "run {run} ran harness {}, which is not a built-in one",
                g.harness
            )
        })?;
        harness.check_bundle(bundles)?;
        harnesses.insert(g.harness.clone(), harness);
    }
    Ok((tasks, harnesses))
}

/// The comparison and the replay report as JSON (`--report`).
fn write_report(
    path: &std::path::Path,
    run: &str,
    rows: &[forgelog_deploy_core::replay::ReplayedAttempt],
    report: &[forgelog_producers::replay::ReportEntry],
    refused: &[String],
) -> Result<()> {
    let attempts: Vec<serde_json::Value> = rows
        .iter()
        .map(|r| {
            serde_json::json!({
                "attempt": r.attempt,
                "harness": r.harness,
                "recorded": r.recorded,
                "replayed": r.replayed,
                "differences": r.differences(),
            })
        })
        .collect();
    let json = serde_json::json!({
        "run": run,
        "attempts": attempts,
        "divergences": report,
        "refused": refused,
    });
    std::fs::write(path, serde_json::to_vec_pretty(&json)?)
        .with_context(|| format!("writing {}", path.display()))?;
    Ok(())
}

/// How the tasks and the kit's launch scripts here differ from those a
/// bundled run was made with (`task/ID`, `harness/NAME` in its manifest), in
/// words: a replay of a changed task or script is a different experiment.
fn differences_from(
    recorded: &BTreeMap<String, Vec<String>>,
    tasks: &BTreeMap<String, Task>,
    harnesses: &BTreeMap<String, Harness>,
) -> Result<Vec<String>> {
    let mut here = BTreeMap::new();
    for (id, task) in tasks {
        here.insert(format!("task/{id}"), Some(task.sha256()?));
    }
    for (name, h) in harnesses {
        here.insert(format!("harness/{name}"), h.launch_script_sha256());
    }
    let mut said = Vec::new();
    for (what, sha) in here {
        let Some(theirs) = recorded.get(&what) else {
            continue;
        };
        let short = |s: &str| s.chars().take(12).collect::<String>();
        match sha {
            Some(ours) if theirs.contains(&ours) => {}
            Some(ours) => said.push(format!(
                "{what} differs from the one the bundle's run used (sha256 {} there, {} here)",
                theirs.first().map_or(String::new(), |s| short(s)),
                short(&ours)
            )),
            None => said.push(format!("{what} has no launch script here to compare")),
        }
    }
    Ok(said)
}
