//! `forgelog up --demo`: drives the built-in demo through the proxy `up`
//! started, waits for the consumers to derive its trees and groups, prints the
//! summary table from the log and exports the run as an SFT dataset.

use anyhow::{bail, Result};
use forgelog_deploy::demo::{DemoPlan, ProxyClient, RolloutOutcome};
use forgelog_stack::{demo_rounds, DemoOutcome, DemoRounds, RoundWatch};
use forgelog_stream::StreamConfig;
use indicatif::{ProgressBar, ProgressStyle};
use std::sync::Mutex;
use std::time::Duration;

/// The demo once; with `--train`, rounds of it until the learner has
/// published `--steps` versions (each round sampled by the version the
/// engine serves then), ending with the report per version.
pub async fn run(
    config: &StreamConfig,
    base: &str,
    admin_token: &str,
    engine: forgelog_sync::EngineSync,
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
    let terminal = Terminal {
        say: &say,
        bar: Mutex::new(None),
    };
    let rounds = demo_rounds(config, &proxy, &engine, plan, train_steps, &terminal).await?;
    finish(config, run_id, args, &say, rounds, sync).await
}

/// The rounds on the terminal: a bar while a round samples, a spinner while
/// they wait.
struct Terminal<'a> {
    say: &'a Say,
    bar: Mutex<Option<ProgressBar>>,
}

impl Terminal<'_> {
    fn show(&self, bar: ProgressBar) {
        bar.enable_steady_tick(Duration::from_millis(200));
        if let Some(before) = self.bar.lock().unwrap().replace(bar) {
            before.finish();
        }
    }
}

impl RoundWatch for Terminal<'_> {
    fn sampling(&self, round: usize, rollouts: usize) {
        let style =
            ProgressStyle::with_template("{msg:<12} [{bar:30}] {pos}/{len} rollouts  {elapsed}")
                .expect("a valid template")
                .progress_chars("=> ");
        let bar = ProgressBar::new(rollouts as u64).with_style(style);
        bar.set_message(format!("round {round}"));
        self.show(bar);
    }

    fn rollout(&self, o: &RolloutOutcome) {
        if let Some(bar) = &*self.bar.lock().unwrap() {
            if let Some(e) = &o.error {
                bar.println(format!("rollout {} failed: {e}", o.rollout_id));
            }
            bar.inc(1);
        }
    }

    fn waiting(&self, what: String) {
        self.show(ProgressBar::new_spinner().with_message(what));
    }

    fn waited(&self) {
        if let Some(bar) = self.bar.lock().unwrap().take() {
            bar.finish_and_clear();
        }
    }

    fn trained(&self, round: usize, version: u64, sampled: Duration, took: Duration) {
        self.say.line(format!(
            "round {round}: rollouts sampled in {:.1} s; version {version} served {:.1} s after the round began",
            sampled.as_secs_f64(),
            took.as_secs_f64()
        ));
    }
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

/// After the rounds: the summary and report from the log, the SFT export,
/// the JSON summary with `--json`; an error when rollouts failed.
async fn finish(
    config: &StreamConfig,
    run_id: &str,
    args: &crate::up::UpArgs,
    say: &Say,
    rounds: DemoRounds,
    sync: Option<forgelog_sync::SyncTimes>,
) -> Result<()> {
    let json = args.json;
    let train_steps = args.train.then_some(args.steps);
    let DemoRounds {
        rollouts,
        failed,
        seconds: round_seconds,
    } = rounds;
    let outcome = forgelog_stack::demo_outcome(config, run_id, &args.export_to).await?;
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
    let DemoOutcome {
        summary,
        report,
        export_dir,
        manifest,
        written,
    } = outcome;
    say.line(format!("\n{summary}"));
    let first_and_last = report.first_and_last(5);
    if train_steps.is_some() {
        say.line(format!("{report}"));
    }
    say.line(format!(
        "SFT export: {} rows in {}",
        manifest.rows.values().sum::<usize>(),
        export_dir.display()
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
