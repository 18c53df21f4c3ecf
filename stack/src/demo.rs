//! `up --demo`'s rounds: the demo sampled through the proxy, its groups
//! derived by the consumers, and, training, each round's version published
//! and served before the next round samples. Whoever shows them (the
//! terminal) watches through [`RoundWatch`].

use crate::{events_at_least, until_served, StackError};
use forgelog_consumers::core::report::Report;
use forgelog_consumers::export::{self, Manifest};
use forgelog_deploy::demo::summary::RunSummary;
use forgelog_deploy::demo::{self, DemoPlan, ProxyClient, RolloutOutcome};
use forgelog_schemas::{Event, Topic};
use forgelog_stream::{ReplayReader, StreamConfig};
use forgelog_sync::EngineSync;
use forgelog_trainer::TrainArgs;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

/// What the rounds tell whoever shows them.
pub trait RoundWatch {
    /// Round `round` starts sampling its `rollouts` rollouts.
    fn sampling(&self, round: usize, rollouts: usize);
    /// One rollout ended (failed, when it says why).
    fn rollout(&self, outcome: &RolloutOutcome);
    /// The rounds wait for `what`, until [`RoundWatch::waited`].
    fn waiting(&self, what: String);
    fn waited(&self);
    /// Training round `round` sampled in `sampled` and its version `version`
    /// was served `took` after the round began.
    fn trained(&self, round: usize, version: u64, sampled: Duration, took: Duration);
}

/// What the rounds did.
#[derive(Debug, Default)]
pub struct DemoRounds {
    pub rollouts: usize,
    pub failed: usize,
    /// Wall time per training round, from its start to its version served
    /// (this is the driver, not a consumer: the clock is its to read): what
    /// a step of the closed loop costs on this machine.
    pub seconds: Vec<f64>,
}

/// The demo once; with `train_steps`, rounds of it until the learner has
/// published that many versions, each round sampled by the version `engine`
/// serves then.
pub async fn demo_rounds(
    config: &StreamConfig,
    proxy: &ProxyClient,
    engine: &EngineSync,
    mut plan: DemoPlan,
    train_steps: Option<u64>,
    watch: &impl RoundWatch,
) -> Result<DemoRounds, StackError> {
    let run = plan.run_id.clone();
    let mut done = DemoRounds::default();
    loop {
        let started = Instant::now();
        watch.sampling(plan.round, plan.rollouts());
        let outcomes = demo::run(proxy, &plan, |o| watch.rollout(o)).await;
        let sampled = started.elapsed();
        done.failed += outcomes.iter().filter(|o| o.error.is_some()).count();
        done.rollouts += outcomes.len();
        let groups = plan.groups.len() * (plan.round + 1);
        watch.waiting("consumers: building trees and groups".into());
        events_at_least(config, &run, Topic::Batches, groups, WAIT_GROUPS)
            .await?
            .ok_or_else(|| {
                StackError::Late(format!(
                    "the consumers did not emit the demo's {groups} groups within {} s",
                    WAIT_GROUPS.as_secs()
                ))
            })?;
        watch.waited();
        // Round k makes version k + 1 (one step per round: `--groups-per-step`).
        let target = plan.round as u64 + 1;
        let Some(steps) = train_steps.filter(|&steps| target <= steps) else {
            return Ok(done);
        };
        watch.waiting(format!("trainer: version {target} of {steps}"));
        served(config, &run, target, engine).await?;
        watch.waited();
        watch.trained(plan.round, target, sampled, started.elapsed());
        done.seconds.push(started.elapsed().as_secs_f64());
        plan.round += 1;
    }
}

/// `train` made the demo's learner: one step per round, a step being a
/// round's groups however long the engine takes between them (an idle flush
/// of seconds split a round in two under load: found by CI), so each round
/// is sampled by the version the one before made; `steps` of them. The
/// learner scores tokens at the temperature they were sampled at.
pub fn demo_learner(train: TrainArgs, run: &str, steps: u64) -> TrainArgs {
    let plan = DemoPlan::new(run);
    TrainArgs {
        max_steps: Some(steps),
        tokens_per_step: usize::MAX,
        groups_per_step: Some(plan.groups.len()),
        idle_flush: 600.0,
        temperature: plan.sampling.temperature.unwrap_or(1.0),
        ..train
    }
}

const WAIT_GROUPS: Duration = Duration::from_secs(150);
const WAIT_VERSION: Duration = Duration::from_secs(600);

/// Until `target` versions of `run` are published and the engine serves the
/// newest (it reloads once it reads the event), so the next round samples
/// from it. Waiting for that count (not for "one more than now") cannot miss
/// a version published before it looked. A learner that makes none within
/// ten minutes, or an engine that names no version it serves, leaves the
/// next round to the version there is.
async fn served(
    config: &StreamConfig,
    run: &str,
    target: u64,
    engine: &EngineSync,
) -> Result<(), StackError> {
    let newest = events_at_least(config, run, Topic::Policy, target as usize, WAIT_VERSION)
        .await?
        .unwrap_or_default()
        .iter()
        .filter_map(|e| match e {
            Event::PolicyPublished(p) => Some(p.version),
            _ => None,
        })
        .max();
    if let Some(version) = newest {
        let served = until_served(engine, version.max(0) as u64);
        let _ = tokio::time::timeout(WAIT_VERSION, served).await;
    }
    Ok(())
}

/// What a demo run left in the log, read back: its summary per harness,
/// the report per version, and its SFT export (written to `export_to/RUN`).
pub struct DemoOutcome {
    pub summary: RunSummary,
    pub report: Report,
    pub export_dir: PathBuf,
    pub manifest: Manifest,
    /// The export's files.
    pub written: Vec<String>,
}

/// Reads run `run` back from the log and exports it as SFT data under
/// `export_to`.
pub async fn demo_outcome(
    config: &StreamConfig,
    run: &str,
    export_to: &Path,
) -> Result<DemoOutcome, StackError> {
    let events = crate::run_events(config, run, &Topic::ALL).await?;
    let (summary, report) = (RunSummary::of(&events), Report::of(&events));
    drop(events);
    let named = |e: std::io::Error| {
        let why = format!("{}: {e}", export_to.display());
        StackError::Io(std::io::Error::new(e.kind(), why))
    };
    std::fs::create_dir_all(export_to).map_err(named)?;
    let export_dir = export_to.canonicalize().map_err(named)?.join(run);
    let url = format!("file://{}", export_dir.display());
    let reader = ReplayReader::new(config)?;
    let (manifest, written) = export::export_run(
        &reader,
        run,
        &url,
        export::ExportKind::Sft,
        export::ExportFilter::default(),
    )
    .await
    .map_err(|e| StackError::Export(e.to_string()))?;
    Ok(DemoOutcome {
        summary,
        report,
        export_dir,
        manifest,
        written,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_demo_learner_steps_once_per_round_at_the_sampling_temperature() {
        let asked = TrainArgs {
            learning_rate: 3e-6,
            idle_flush: 5.0,
            tokens_per_step: 4096,
            ..TrainArgs::default()
        };
        let plan = DemoPlan::new("demo-1");
        let demo = demo_learner(asked, "demo-1", 12);
        assert_eq!(demo.max_steps, Some(12));
        // A round's groups are a step, whatever their tokens or the time between them.
        assert_eq!(demo.groups_per_step, Some(plan.groups.len()));
        assert_eq!(demo.tokens_per_step, usize::MAX);
        assert!(demo.idle_flush >= 600.0, "{}", demo.idle_flush);
        assert_eq!(Some(demo.temperature), plan.sampling.temperature);
        // What the user asked for that the demo does not set is kept.
        assert_eq!(demo.learning_rate, 3e-6);
    }
}
