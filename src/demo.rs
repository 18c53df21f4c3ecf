//! `forgelog up --demo`: drives the built-in demo through the proxy `up`
//! started, waits for the consumers to derive its trees and groups, prints the
//! summary table from the log and exports the run as an SFT dataset.

use anyhow::{bail, Context, Result};
use forgelog_consumers::core::report::Report;
use forgelog_consumers::export;
use forgelog_deploy::demo::{self, summary::RunSummary, DemoPlan, ProxyClient};
use forgelog_schemas::{Event, Topic};
use forgelog_stream::{ReplayReader, StreamConfig};
use indicatif::{ProgressBar, ProgressStyle};
use std::time::Duration;

/// The demo once; with `--train`, rounds of it until the learner has
/// published `--steps` versions (each round sampled by the version the
/// engine serves then), ending with the report per version.
pub async fn run(
    config: &StreamConfig,
    base: &str,
    admin_token: &str,
    engine: &str,
    run_id: &str,
    args: &crate::up::UpArgs,
    sync: Option<forgelog_sync::SyncTimes>,
) -> Result<()> {
    let say = Say { json: args.json };
    let train_steps = args.train.then_some(args.steps);
    let plan = DemoPlan::new(run_id);
    say.line(format!(
        "\ndemo run {run_id}: {} GRPO groups of {} rollouts (OpenAI Chat and Anthropic Messages), a calculator tool, a verifier{}",
        plan.groups.len(),
        plan.group_size,
        train_steps.map_or(String::new(), |s| format!(", rounds until {s} versions are trained"))
    ));
    let proxy = ProxyClient::new(base, Some(admin_token.to_string()));
    let rounds = rounds(config, &proxy, engine, plan, args, &say).await?;
    finish(config, run_id, args, &say, rounds, sync).await
}

/// Where `--json` sends the words: stdout carries only the JSON summary then.
struct Say {
    json: bool,
}

impl Say {
    fn line(&self, line: String) {
        if self.json {
            eprintln!("{line}");
        } else {
            println!("{line}");
        }
    }
}

/// What the rounds did.
struct Rounds {
    rollouts: usize,
    failed: usize,
    /// Wall time per training round, from its start to its version served
    /// (this is the driver, not a consumer: the clock is its to read): what
    /// a step of the closed loop costs on this machine.
    seconds: Vec<f64>,
}

/// The demo's rounds: each sampled, its groups derived, and (training) its
/// version published and served before the next.
async fn rounds(
    config: &StreamConfig,
    proxy: &ProxyClient,
    engine: &str,
    mut plan: DemoPlan,
    args: &crate::up::UpArgs,
    say: &Say,
) -> Result<Rounds> {
    let run_id = plan.run_id.clone();
    let run_id = run_id.as_str();
    let train_steps = args.train.then_some(args.steps);

    let mut failed = 0;
    let mut rollouts = 0;
    let mut round_seconds: Vec<f64> = Vec::new();
    loop {
        let round_started = std::time::Instant::now();
        let bar = ProgressBar::new(plan.rollouts() as u64).with_style(
            ProgressStyle::with_template("{msg:<12} [{bar:30}] {pos}/{len} rollouts  {elapsed}")?
                .progress_chars("=> "),
        );
        bar.set_message(format!("round {}", plan.round));
        bar.enable_steady_tick(Duration::from_millis(200));
        let outcomes = demo::run(proxy, &plan, |o| {
            if let Some(e) = &o.error {
                bar.println(format!("rollout {} failed: {e}", o.rollout_id));
            }
            bar.inc(1);
        })
        .await;
        bar.finish();
        let sampled = round_started.elapsed();
        failed += outcomes.iter().filter(|o| o.error.is_some()).count();
        rollouts += outcomes.len();
        let groups = plan.groups.len() * (plan.round + 1);
        let spinner = crate::spinner("consumers: building trees and groups".into());
        forgelog_stack::events_at_least(
            config,
            run_id,
            Topic::Batches,
            groups,
            Duration::from_secs(150),
        )
        .await?
        .with_context(|| {
            format!("the consumers did not emit the demo's {groups} groups within 150 s")
        })?;
        spinner.finish_with_message("consumers: done");
        let Some(steps) = train_steps else {
            break;
        };
        // Round k makes version k + 1 (one step per round: `--groups-per-step`).
        let target = plan.round as u64 + 1;
        if target > steps {
            break;
        }
        // The next round waits for that version, so it samples from it; a
        // learner that makes none within 10 minutes leaves it to the version
        // there is. Waiting for that count (not for "one more than now")
        // cannot miss a version published before we looked.
        let spinner = crate::spinner(format!("trainer: version {target} of {steps}"));
        let newest = forgelog_stack::events_at_least(
            config,
            run_id,
            Topic::Policy,
            target as usize,
            Duration::from_secs(600),
        )
        .await?
        .unwrap_or_default()
        .iter()
        .filter_map(|e| match e {
            Event::PolicyPublished(p) => Some(p.version),
            _ => None,
        })
        .max();
        // And for the engine to serve it (it reloads once it reads the event).
        if let Some(version) = newest {
            wait_until_served(engine, version, args).await;
        }
        spinner.finish_and_clear();
        let seconds = round_started.elapsed().as_secs_f64();
        say.line(format!(
            "round {}: rollouts sampled in {:.1} s; version {target} served {seconds:.1} s after the round began",
            plan.round,
            sampled.as_secs_f64()
        ));
        round_seconds.push(seconds);
        plan.round += 1;
    }
    Ok(Rounds {
        rollouts,
        failed,
        seconds: round_seconds,
    })
}

/// After the rounds: the summary and report from the log, the SFT export,
/// the JSON summary with `--json`; an error when rollouts failed.
async fn finish(
    config: &StreamConfig,
    run_id: &str,
    args: &crate::up::UpArgs,
    say: &Say,
    rounds: Rounds,
    sync: Option<forgelog_sync::SyncTimes>,
) -> Result<()> {
    let (export_to, json) = (args.export_to.as_path(), args.json);
    let train_steps = args.train.then_some(args.steps);
    let Rounds {
        rollouts,
        failed,
        seconds: round_seconds,
    } = rounds;
    let events = crate::report::events_of(config, run_id).await?;
    if !round_seconds.is_empty() {
        let mean = round_seconds.iter().sum::<f64>() / round_seconds.len() as f64;
        say.line(format!(
            "seconds per training step (round to served version): mean {mean:.1} over {} steps",
            round_seconds.len()
        ));
    }
    if let Some(line) = sync.and_then(|s| s.summary()) {
        say.line(line);
    }

    let summary = RunSummary::of(&events);
    say.line(format!("\n{summary}"));
    let report = Report::of(&events);
    let first_and_last = report.first_and_last(5);
    if train_steps.is_some() {
        say.line(format!("{report}"));
    }

    std::fs::create_dir_all(export_to)
        .with_context(|| format!("creating {}", export_to.display()))?;
    let dir = export_to.canonicalize()?.join(run_id);
    let url = format!("file://{}", dir.display());
    let reader = ReplayReader::new(config)?;
    let (manifest, written) = export::export_run(
        &reader,
        run_id,
        &url,
        export::ExportKind::Sft,
        export::ExportFilter::default(),
    )
    .await
    .map_err(|e| anyhow::anyhow!(e))?;
    say.line(format!(
        "SFT export: {} rows in {}",
        manifest.rows.values().sum::<usize>(),
        dir.display()
    ));
    for path in &written {
        say.line(format!("  {path}"));
    }
    say.line(format!(
        "\nnext: forgelog view --run {run_id}   |   forgelog report --run {run_id}"
    ));
    // The loop's outcome in one line, the last of the words.
    if let (Some(_), Some((first, last))) = (train_steps, first_and_last) {
        say.line(format!(
            "reward first 5 versions: {first:.3}, last 5 versions: {last:.3}"
        ));
    }
    if json {
        let out = serde_json::json!({
            "run": run_id,
            "rollouts": rollouts,
            "failed": failed,
            "by_harness": summary.by_harness,
            "report": report,
            "reward_first_and_last_5_versions": first_and_last,
            "export": {"manifest": manifest, "files": written},
        });
        println!("{}", serde_json::to_string_pretty(&out)?);
    }
    if failed > 0 {
        bail!("{failed} of {rollouts} rollouts failed (see above)");
    }
    Ok(())
}

/// Until `engine` reports serving `version` (as `forgelog sync` reads it
/// back: vLLM's and forgelog's engine's `/weight_info`, or the newest adapter
/// it lists), for ten minutes at most; an engine that refuses the question
/// (reports no version at all) is not waited for.
async fn wait_until_served(engine: &str, version: i64, args: &crate::up::UpArgs) {
    let engine = args.sync.reader(engine);
    let served = forgelog_stack::until_served(&engine, version.max(0) as u64);
    let _ = tokio::time::timeout(Duration::from_secs(600), served).await;
}
