//! `forgelog up --demo`: drives the built-in demo through the proxy `up`
//! started, waits for the consumers to derive its trees and groups, prints the
//! summary table from the log and exports the run as an SFT dataset.

use anyhow::{bail, Context, Result};
use forgelog_consumers::{export, rebuild::read_run};
use forgelog_deploy::demo::{self, summary::RunSummary, DemoPlan, ProxyClient};
use forgelog_schemas::{Event, Topic};
use forgelog_stream::{ReplayReader, StreamConfig};
use indicatif::{ProgressBar, ProgressStyle};
use std::path::Path;
use std::time::Duration;

pub async fn run(config: &StreamConfig, base: &str, run_id: &str, export_to: &Path) -> Result<()> {
    let plan = DemoPlan::new(run_id);
    println!(
        "\ndemo run {run_id}: {} GRPO groups of {} rollouts (OpenAI Chat and Anthropic Messages), a calculator tool, a verifier",
        plan.groups.len(),
        plan.group_size
    );
    let bar = ProgressBar::new(plan.rollouts() as u64).with_style(
        ProgressStyle::with_template("{msg:<12} [{bar:30}] {pos}/{len} rollouts  {elapsed}")?
            .progress_chars("=> "),
    );
    bar.set_message("rollouts");
    bar.enable_steady_tick(Duration::from_millis(200));
    let proxy = ProxyClient::new(base, None);
    let outcomes = demo::run(&proxy, &plan, |o| {
        if let Some(e) = &o.error {
            bar.println(format!("rollout {} failed: {e}", o.rollout_id));
        }
        bar.inc(1);
    })
    .await;
    bar.finish();
    let failed = outcomes.iter().filter(|o| o.error.is_some()).count();

    let spinner = crate::spinner("consumers: building trees and groups".into());
    let events = wait_for_groups(config, run_id, plan.groups.len()).await?;
    spinner.finish_with_message("consumers: done");

    let summary = RunSummary::of(&events);
    println!("\n{summary}");

    std::fs::create_dir_all(export_to)
        .with_context(|| format!("creating {}", export_to.display()))?;
    let dir = export_to.canonicalize()?.join(run_id);
    let url = format!("file://{}", dir.display());
    let reader = ReplayReader::new(config)?;
    let (manifest, written) =
        export::export_run(&reader, run_id, &url, export::ExportFilter::default())
            .await
            .map_err(|e| anyhow::anyhow!(e))?;
    println!(
        "SFT export: {} rows in {}",
        manifest.rows.values().sum::<usize>(),
        dir.display()
    );
    for path in written {
        println!("  {path}");
    }
    println!(
        "\nnext: forgelog replay show --run {run_id}   |   forgelog replay rebuild --run {run_id}"
    );
    if failed > 0 {
        bail!("{failed} of {} rollouts failed (see above)", outcomes.len());
    }
    Ok(())
}

/// The run's events on every topic, once the consumers have emitted all its
/// groups (blocking reads, off the runtime that serves the engine and proxy).
async fn wait_for_groups(config: &StreamConfig, run_id: &str, groups: usize) -> Result<Vec<Event>> {
    let (config, run_id) = (config.clone(), run_id.to_string());
    tokio::task::spawn_blocking(move || {
        let reader = ReplayReader::new(&config)?;
        let read = |topic: Topic| -> Result<Vec<Event>> {
            Ok(read_run(&reader, topic, &run_id)?
                .into_iter()
                .filter_map(|r| r.event.ok())
                .collect())
        };
        for _ in 0..300 {
            if read(Topic::Batches)?.len() >= groups {
                let mut events = Vec::new();
                for topic in Topic::ALL {
                    events.extend(read(topic)?);
                }
                return Ok(events);
            }
            std::thread::sleep(Duration::from_millis(500));
        }
        bail!("the consumers did not emit the demo's {groups} groups within 150 s")
    })
    .await?
}
