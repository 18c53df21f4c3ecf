//! `forgelog run TASKS_DIR --replay R`: re-runs the recorded rollouts of run
//! R through the orchestrator, each in the same task image with the same
//! harness bundle, paths and home (and, with `--pin-clock`, its clock at the
//! recorded start); the proxy answers every call from the recording. Ends with how each
//! re-run ended against its recording and the replay report of every call
//! that differed. Exit 1 when anything differs unexplained.

use super::{drive, RunArgs};
use crate::source::SourceArgs;
use crate::Found;
use anyhow::{bail, Context, Result};
use forgelog_api::SessionClient;
use forgelog_deploy::kit::Kit;
use forgelog_deploy::orchestrator::{Orchestrator, RunOptions};
use forgelog_deploy_core::{RecordedRun, ReplayTable, RunHistory};
use forgelog_podman::run_dir::RunDir;
use forgelog_podman::{LocalBackend, PinnedClocks, Podman};
use forgelog_producers::replay::{report_text, Matching, Normaliser, RecordedUpstream, Recording};
use forgelog_producers::server::ProxyConfig;
use forgelog_producers::RunningProxy;
use forgelog_schemas::Topic;
use forgelog_stream::{LogReader, RunLog};
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
    let kit = Kit::of_recorded(&recorded.plan, &args.tasks_dir, &bundles)?;
    if let RunLog::Bundle(b) = &log {
        for line in kit.differences_from(&b.manifest.hashes)? {
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
            kit.tasks,
            kit.harnesses,
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
